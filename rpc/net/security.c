/* SPDX-License-Identifier: MIT */
/*  security.c: CURVE on every socket, the ZAP handler that tells which
    rank a connection is, the key file, and the policy for worlds without a
    key (security.h; docs/security.md).

    The ZAP handler is ours rather than czmq's zauth: zauth runs in czmq's
    global context, while the agent's sockets live in a zmq_ctx_new of
    their own (the ZAP endpoint is per context), and zauth's CURVE mode
    only says yes or no to a key, while every connection here has to be
    named by its rank (User-Id) for io.c to bind routing ids to keys. It is
    an inproc ROUTER on its own thread, so that it can hold back the answer
    to a peer that connects before this process has the table (the peers
    get the table at about the same time, not at the same time): those
    answers go out as soon as the table is known, or are refusals once the
    init deadline has passed. A key the table lacks is held 3 s too before
    it is refused: a restarted peer's new key may reach this process a
    moment after the peer itself. */
#include "rpc/net/security.h"

#include <arpa/inet.h>
#include <czmq.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/net/address.h"

#ifndef ZMQ_ZAP_ENFORCE_DOMAIN
#define ZMQ_ZAP_ENFORCE_DOMAIN 93 /* libzmq >= 4.3 (a draft option in its header) */
#endif

#define ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define MAX_WATCH    4
#define MAX_HELD     4096 /* handshakes waiting for the table */
/*  A key the table does not have is held this long before it is refused: a
    restarted peer may connect a moment before this process has taken its
    new key (membership.c), and libzmq does not reconnect after a refusal. */
#define UNKNOWN_HOLD_NS 3000000000LL
#define KEY_FILE_MAX    4096

/*  At most one line a second per kind of refusal, with a count of the
    others: a peer hammering a port must not drown the log. */
typedef struct {
    pthread_mutex_t lock;
    int64_t next_ns;
    long suppressed;
} limit_t;

typedef struct {
    uint8_t key[32];
    int rank;
} key_rank_t;

struct security {
    bool curve, insecure;
    char world_pub[SECURITY_KEY_TXT], world_sec[SECURITY_KEY_TXT];
    uint8_t world_pub_bin[32];
    char pub[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT];
    char domain[64], rdv_domain[64];
    key_rank_t *keys; /* sorted by key, once ready */
    int n_keys;
    atomic_bool ready, stop;
    int64_t deadline_ns;

    void *zap; /* the handler's ROUTER (its thread's) */
    pthread_t thread;
    bool started;
    pthread_mutex_t lock; /* guards the watches handed to the thread */
    void *watch[MAX_WATCH];
    char watch_what[MAX_WATCH][32];
    int n_watch;
    zmsg_t *held[MAX_HELD];
    int64_t held_at[MAX_HELD]; /* when each came */
    int n_held;
    limit_t lim_rdv, lim_zap, lim_nocurve, lim_crypto, lim_other, lim_spoof;
    atomic_int_fast64_t spoofs; /* messages dropped by zd__security_sender_ok */
};

static void limit_init(limit_t *l)
{
    pthread_mutex_init(&l->lock, NULL);
    l->next_ns = 0;
    l->suppressed = 0;
}

static void warn_limited(limit_t *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warn_limited(limit_t *l, const char *fmt, ...)
{
    int64_t now = zd__net_now_ns();
    pthread_mutex_lock(&l->lock);
    if (now < l->next_ns) {
        l->suppressed++;
        pthread_mutex_unlock(&l->lock);
        return;
    }
    long more = l->suppressed;
    l->suppressed = 0;
    l->next_ns = now + ZD__NS_PER_S;
    pthread_mutex_unlock(&l->lock);
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (more)
        zd__log_as(ZD_LOG_WARN, fmt, "%s (and %ld more like it since the last such line)", text,
                   more);
    else
        zd__log_as(ZD_LOG_WARN, fmt, "%s", text);
}

/*  ---- addresses ---- */

static bool ip_is_loopback(const char *ip)
{
    char buf[64];
    size_t n = strlen(ip);
    if (n >= 2 && ip[0] == '[' && ip[n - 1] == ']') {
        snprintf(buf, sizeof buf, "%.*s", (int)(n - 2), ip + 1);
        ip = buf;
    }
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, ip, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, ip, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return false;
}

/*  A host name or address all of whose addresses are loopback. */
static bool host_is_loopback(const char *host)
{
    if (ip_is_loopback(host))
        return true;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res, *r;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return false;
    bool all = res != NULL;
    for (r = res; r && all; r = r->ai_next) {
        char ip[INET6_ADDRSTRLEN] = "";
        const void *src = r->ai_family == AF_INET
            ? (const void *)&((struct sockaddr_in *)r->ai_addr)->sin_addr
            : (const void *)&((struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
        inet_ntop(r->ai_family, src, ip, sizeof ip);
        all = ip_is_loopback(ip);
    }
    freeaddrinfo(res);
    return all;
}

/*  "tcp://HOST:PORT" with a loopback HOST. */
static bool endpoint_is_loopback(const char *ep)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return false;
    const char *host = ep + 6, *colon = strrchr(host, ':');
    if (!colon)
        return false;
    char buf[128];
    snprintf(buf, sizeof buf, "%.*s", (int)(colon - host), host);
    return ip_is_loopback(buf);
}

/*  ---- key files ---- */

int zd__security_default_path(char *path, size_t size)
{
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg)
        n = snprintf(path, size, "%s/zdist/world.key", xdg);
    else if (home && *home)
        n = snprintf(path, size, "%s/.config/zdist/world.key", home);
    else
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "no default key file: neither XDG_CONFIG_HOME "
                                 "nor HOME is set");
    if (n < 0 || (size_t)n >= size)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "the default key file's path is too long");
    return 0;
}

/*  Makes every missing folder of path's parent, mode 0700. */
static int make_parents(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "key file path too long");
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    for (char *p = dir + 1;; p++) {
        bool end = *p == 0;
        if (*p == '/' || end) {
            char c = *p;
            *p = 0;
            if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return zd_error_set_code(ZD_ERR_OTHER, "cannot make the folder %s: %s", dir,
                                         strerror(errno));
            *p = c;
        }
        if (end)
            break;
    }
    return 0;
}

/*  Writes text to fd (mode 0600) and closes it: 0, or -1 naming path. */
static int key_write(int fd, const char *path, const char *text)
{
    size_t len = strlen(text);
    int rc = 0;
    if (fchmod(fd, 0600) < 0 || write(fd, text, len) != (ssize_t)len || fsync(fd) < 0)
        rc = zd_error_set_code(ZD_ERR_OTHER, "cannot write %s: %s", path, strerror(errno));
    if (close(fd) < 0 && rc == 0)
        rc = zd_error_set_code(ZD_ERR_OTHER, "cannot write %s: %s", path, strerror(errno));
    return rc;
}

/*  A new key file at path, which must not exist. */
static int key_create(const char *path, const char *text)
{
    /* Created 0600 (never a moment more open), not following a link. */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno == EEXIST
            ? zd_error_set_code(ZD_ERR_ARGUMENT,
                                "%s already exists (pass --force to "
                                "replace it: every process of its world needs the new "
                                "one)",
                                path)
            : zd_error_set_code(ZD_ERR_OTHER, "cannot create %s: %s", path, strerror(errno));
    return key_write(fd, path, text);
}

/*  --force: a new file beside path, renamed over it. Whatever path was (a
    hard link to a file something else uses, a symbolic link) is replaced as
    a name, never written through: truncating it in place gave the linked
    file the key and mode 0600 (issue 24 point 11). */
static int key_replace(const char *path, const char *text)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= (int)sizeof tmp)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "key file path too long");
    int fd = mkstemp(tmp); /* 0600, a name nobody else has */
    if (fd < 0)
        return zd_error_set_code(ZD_ERR_OTHER, "cannot create a file beside %s: %s", path,
                                 strerror(errno));
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    int rc = key_write(fd, tmp, text);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = zd_error_set_code(ZD_ERR_OTHER, "cannot replace %s: %s", path, strerror(errno));
    if (rc < 0)
        unlink(tmp);
    return rc;
}

int zd__security_keygen(const char *path, bool force)
{
    if (make_parents(path) < 0)
        return -1;
    zcert_t *cert = zcert_new();
    if (!cert)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "cannot make a CURVE keypair");
    zconfig_t *root = zconfig_new("root", NULL);
    zconfig_set_comment(
        root, "   zdist world key (a ZeroMQ CURVE secret certificate, czmq's zcert format)");
    zconfig_set_comment(root,
                        "   Every process of the world reads it; keep it mode 0600, share it only");
    zconfig_set_comment(root, "   with the hosts of the world.");
    zconfig_put(root, "/metadata/created-by", "zdist keygen");
    zconfig_put(root, "/curve/public-key", zcert_public_txt(cert));
    zconfig_put(root, "/curve/secret-key", zcert_secret_txt(cert));
    char *text = zconfig_str_save(root);
    zconfig_destroy(&root);
    zcert_destroy(&cert);
    if (!text)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "cannot write the key");
    int rc = force ? key_replace(path, text) : key_create(path, text);
    zstr_free(&text);
    return rc;
}

static bool z85_key(const char *txt, uint8_t bin[32])
{
    return txt && strlen(txt) == 40 && zmq_z85_decode(bin, txt) != NULL;
}

int zd__security_key_load(const char *path, char pub[SECURITY_KEY_TXT], char sec[SECURITY_KEY_TXT])
{
    /* Read through one descriptor: what is checked is what is read.
       Non-blocking, so that a FIFO (or a device) in the key file's place
       is refused by the check below instead of blocking zd_rpc_init past
       its init timeout, for ever when no writer comes; it changes nothing
       for a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return zd_error_set_code(ZD_ERR_OTHER, "cannot read the key file %s: %s", path,
                                 strerror(errno));
    struct stat st;
    char buf[KEY_FILE_MAX + 1];
    ssize_t n = 0;
    int rc = 0;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        rc = zd_error_set_code(ZD_ERR_ARGUMENT, "the key file %s is not a regular file", path);
    } else if (st.st_mode & 077) {
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "the key file %s is readable by others (mode %03o): anyone who "
                               "reads it can join the world; chmod 600 %s",
                               path, (unsigned)(st.st_mode & 0777), path);
    } else if ((n = read(fd, buf, KEY_FILE_MAX)) < 0 || n == KEY_FILE_MAX) {
        rc = zd_error_set_code(ZD_ERR_OTHER, "cannot read the key file %s: %s", path,
                               n < 0 ? strerror(errno) : "too large");
    }
    close(fd);
    if (rc < 0)
        return rc;
    buf[n] = 0;
    zconfig_t *root = zconfig_str_load(buf);
    const char *p = root ? zconfig_get(root, "/curve/public-key", NULL) : NULL;
    const char *s = root ? zconfig_get(root, "/curve/secret-key", NULL) : NULL;
    uint8_t pb[32], sb[32], derived[32];
    char dtxt[SECURITY_KEY_TXT];
    if (!z85_key(p, pb) || !z85_key(s, sb)) {
        rc = zd_error_set_code(
            ZD_ERR_ARGUMENT,
            "%s is not a world key file (no curve public-key "
            "and secret-key; make one with zdist-keygen, tools/keygen in a build)",
            path);
    } else if (zmq_curve_public(dtxt, s) < 0 || !z85_key(dtxt, derived) ||
               memcmp(derived, pb, 32) != 0) {
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "the key file %s is damaged (its public key "
                               "does not match its secret key)",
                               path);
    } else {
        snprintf(pub, SECURITY_KEY_TXT, "%s", p);
        snprintf(sec, SECURITY_KEY_TXT, "%s", s);
    }
    zconfig_destroy(&root);
    return rc;
}

/*  ---- the policy ---- */

static bool env_true(const char *var)
{
    const char *v = getenv(var);
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

/*  Which key file: the option, $ZDIST_KEY_FILE (both must exist), else the
    default one if it exists. 1 and path, 0 (none), or -1. */
static int find_key_file(const zd_rpc_options_t *o, char *path, size_t size)
{
    const char *env = getenv("ZDIST_KEY_FILE");
    const char *given = o->key_file && *o->key_file ? o->key_file : env && *env ? env : NULL;
    if (given) {
        snprintf(path, size, "%s", given);
        return 1;
    }
    if (zd__security_default_path(path, size) < 0)
        return 0;
    return access(path, F_OK) == 0 ? 1 : 0;
}

static const char *remedies =
    "make a world key with zdist-keygen (tools/keygen in a build; it writes "
    "~/.config/zdist/world.key), give every "
    "process of the world the same file (a shared home folder, or copy it mode 0600) and "
    "pass it with --key_file / ZDIST_KEY_FILE / options.key_file; or run unauthenticated "
    "and unencrypted with --insecure / ZDIST_INSECURE=1 / options.insecure";

int zd__security_new(zd__net_t *n, const zd_rpc_options_t *o, const char *master,
                     const char *listen_ip)
{
    security_t *s = calloc(1, sizeof *s);
    if (!s)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_init(&s->lock, NULL);
    limit_t *lims[] = {&s->lim_rdv,    &s->lim_zap,   &s->lim_nocurve,
                       &s->lim_crypto, &s->lim_other, &s->lim_spoof};
    for (size_t i = 0; i < sizeof lims / sizeof *lims; i++)
        limit_init(lims[i]);
    s->deadline_ns = zd__deadline_after(zd__net_now_ns(), o->init_timeout_ms);
    n->sec = s;
    s->insecure = o->insecure || env_true("ZDIST_INSECURE");
    char path[4096];
    int found = s->insecure ? 0 : find_key_file(o, path, sizeof path);
    if (found < 0)
        return -1;
    if (found) {
        if (zd__security_key_load(path, s->world_pub, s->world_sec) < 0)
            return -1;
        s->curve = true;
        z85_key(s->world_pub, s->world_pub_bin);
        if (zmq_curve_keypair(s->pub, s->sec) < 0)
            return zd_error_set("cannot make a CURVE keypair: %s", zmq_strerror(errno));
        /* Per world: a process of another world on the same port (whose
           key differs) is refused by the handshake itself anyway. */
        snprintf(s->domain, sizeof s->domain, "zdist/%.8s/rpc", s->world_pub);
        snprintf(s->rdv_domain, sizeof s->rdv_domain, "zdist/%.8s/rendezvous", s->world_pub);
        zd__log(ZD_LOG_INFO, "rpc: CURVE on every connection, world key %s (public %.8s...)", path,
                s->world_pub);
        return 0;
    }
    /* Without a listen address rank 0 listens where its workers reach it,
       which is loopback exactly when its master address is. */
    bool loopback = host_is_loopback(master) && (!listen_ip || ip_is_loopback(listen_ip));
    if (s->insecure && !loopback) {
        zd__log(ZD_LOG_WARN,
                "rpc: insecure: no authentication and no encryption; anyone who "
                "reaches this world's ports can call, read and change everything");
        return 0;
    }
    if (!loopback && !s->insecure)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "no world key, and this world is not on loopback only (master "
                                 "\"%s\", this process at %s): refusing to run unauthenticated "
                                 "and unencrypted; %s",
                                 master[0] ? master : "none: every interface",
                                 listen_ip ? listen_ip : "where its workers reach it", remedies);
    if (n->rank == 0)
        zd__log(ZD_LOG_INFO,
                "rpc: no world key%s: this loopback-only world is unauthenticated "
                "(any local user can connect); zdist-keygen (tools/keygen in a build) makes a key",
                s->insecure ? " (insecure)" : "");
    return 0;
}

bool zd__security_curve(const zd__net_t *n)
{
    return n->sec && n->sec->curve;
}

const char *zd__security_public_key(const zd__net_t *n)
{
    return zd__security_curve(n) ? n->sec->pub : "";
}

bool zd__security_loopback_only(const zd__net_t *n)
{
    return n->sec && !n->sec->curve && !n->sec->insecure;
}

const char *zd__security_registration_refused(const zd__net_t *n, const char *peer,
                                              const char *endpoint)
{
    if (!zd__security_loopback_only(n))
        return NULL;
    if (!ip_is_loopback(peer))
        return "it comes from off this host, and this world has no key (loopback only)";
    if (!endpoint_is_loopback(endpoint))
        return "it advertises an endpoint off loopback, and this world has no key "
               "(loopback only)";
    return NULL;
}

bool zd__security_key_ok(const zd__net_t *n, const char *key)
{
    uint8_t bin[32];
    return zd__security_curve(n) ? z85_key(key, bin) : key && !*key;
}

/*  ---- socket options ---- */

static int opt(void *sock, int name, const void *value, size_t len)
{
    if (zmq_setsockopt(sock, name, value, len) < 0)
        return zd_error_set("cannot set CURVE option %d: %s", name, zmq_strerror(errno));
    return 0;
}

static int curve_server(void *sock, const char *secret, const char *domain)
{
    int one = 1;
    if (opt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) < 0 ||
        opt(sock, ZMQ_CURVE_SECRETKEY, secret, 40) < 0 ||
        opt(sock, ZMQ_ZAP_DOMAIN, domain, strlen(domain)) < 0)
        return -1;
    /* Without a handler, refuse rather than let everyone in. */
    zmq_setsockopt(sock, ZMQ_ZAP_ENFORCE_DOMAIN, &one, sizeof one);
    return 0;
}

static int curve_client(void *sock, const char *pub, const char *secret, const char *server)
{
    return opt(sock, ZMQ_CURVE_SERVERKEY, server, 40) < 0 ||
            opt(sock, ZMQ_CURVE_PUBLICKEY, pub, 40) < 0 ||
            opt(sock, ZMQ_CURVE_SECRETKEY, secret, 40) < 0
        ? -1
        : 0;
}

int zd__security_server(zd__net_t *n, void *sock)
{
    return zd__security_curve(n) ? curve_server(sock, n->sec->sec, n->sec->domain) : 0;
}

int zd__security_client(zd__net_t *n, void *sock, int peer)
{
    if (!zd__security_curve(n))
        return 0;
    return curve_client(sock, n->sec->pub, n->sec->sec, n->peers[peer].key);
}

int zd__security_rendezvous_server(zd__net_t *n, void *sock)
{
    return zd__security_curve(n) ? curve_server(sock, n->sec->world_sec, n->sec->rdv_domain) : 0;
}

int zd__security_rendezvous_client(zd__net_t *n, void *sock)
{
    security_t *s = n->sec;
    return zd__security_curve(n) ? curve_client(sock, s->world_pub, s->world_sec, s->world_pub) : 0;
}

void zd__security_watch(zd__net_t *n, void *sock, const char *what)
{
    security_t *s = n->sec;
    if (!zd__security_curve(n) || !n->ctx)
        return;
    pthread_mutex_lock(&s->lock);
    if (s->n_watch < MAX_WATCH) {
        char ep[64];
        snprintf(ep, sizeof ep, "inproc://zd-security-watch-%d", s->n_watch);
        void *pair = NULL;
        /* NO_DETAIL too: a peer without CURVE that sees our greeting first
           hangs up before we see its own, and we only see the hang-up. */
        if (zmq_socket_monitor(sock, ep,
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                   ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) == 0 &&
            (pair = zmq_socket(n->ctx, ZMQ_PAIR)) && zmq_connect(pair, ep) == 0) {
            snprintf(s->watch_what[s->n_watch], sizeof s->watch_what[0], "%s", what);
            s->watch[s->n_watch++] = pair;
        } else if (pair) {
            zmq_close(pair);
        }
    }
    pthread_mutex_unlock(&s->lock);
}

/*  ---- the ZAP handler ---- */

static int key_cmp(const void *x, const void *y)
{
    return memcmp(((const key_rank_t *)x)->key, ((const key_rank_t *)y)->key, 32);
}

int zd__security_table_ready(zd__net_t *n)
{
    security_t *s = n->sec;
    if (!s)
        return 0;
    if (!s->curve) {
        const char *last = NULL; /* ranks come in runs on one host: one look a run */
        for (int i = 0; i < n->world && !s->insecure; i++) {
            const char *ep = n->peers[i].endpoint;
            if (!ep[0] || (last && zd__addr_same_host(ep, last)))
                continue;
            last = ep;
            if (!endpoint_is_loopback(ep))
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "no world key, and \"%s\" (rank %d) is at %s, not on "
                                         "loopback: refusing to run unauthenticated and "
                                         "unencrypted; %s",
                                         n->peers[i].name, i, n->peers[i].endpoint, remedies);
        }
        return 0;
    }
    key_rank_t *k = malloc((size_t)n->world * sizeof *k);
    if (!k)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    static const uint8_t none[32];
    for (int i = 0; i < n->world; i++) {
        k[i].rank = i;
        /* A rank gone from the running world this process joined has no
           key until it rejoins (zd__security_renew_key): no key matches. */
        if (!n->peers[i].key[0] && atomic_load(&n->peers[i].lost_at_ns)) {
            memset(k[i].key, 0, 32);
        } else if (!z85_key(n->peers[i].key, k[i].key)) {
            free(k);
            return zd_error_set("rendezvous: rank %d has no valid public key", i);
        }
    }
    qsort(k, (size_t)n->world, sizeof *k, key_cmp);
    for (int i = 1; i < n->world; i++)
        if (key_cmp(&k[i - 1], &k[i]) == 0 && memcmp(k[i].key, none, 32) != 0) {
            int r1 = k[i - 1].rank, r2 = k[i].rank;
            free(k);
            return zd_error_set("rendezvous: ranks %d and %d registered the same public key", r1,
                                r2);
        }
    s->keys = k;
    s->n_keys = n->world;
    atomic_store(&s->ready, true); /* publishes keys to the handler's thread */
    return 0;
}

/*  A restarted process rejoins with a key of its own (membership.c): the
    handler's thread reads the table under s->lock from then on. */
int zd__security_renew_key(zd__net_t *n, int rank)
{
    security_t *s = n->sec;
    if (!s || !s->curve)
        return 0;
    uint8_t bin[32];
    if (!z85_key(n->peers[rank].key, bin))
        return zd_error_set("rank %d has no valid public key", rank);
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < s->n_keys; i++)
        if (s->keys[i].rank != rank && memcmp(s->keys[i].key, bin, 32) == 0) {
            int other = s->keys[i].rank;
            pthread_mutex_unlock(&s->lock);
            return zd_error_set("rank %d rejoined with the public key of rank %d", rank, other);
        }
    for (int i = 0; i < s->n_keys; i++)
        if (s->keys[i].rank == rank)
            memcpy(s->keys[i].key, bin, 32);
    qsort(s->keys, (size_t)s->n_keys, sizeof *s->keys, key_cmp);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static int rank_of_key(security_t *s, const uint8_t *key)
{
    key_rank_t probe;
    memcpy(probe.key, key, 32);
    pthread_mutex_lock(&s->lock);
    static const uint8_t none[32];
    key_rank_t *k = memcmp(key, none, 32)
        ? bsearch(&probe, s->keys, (size_t)s->n_keys, sizeof *k, key_cmp)
        : NULL;
    int rank = k ? k->rank : -1;
    pthread_mutex_unlock(&s->lock);
    return rank;
}

/*  Sends the answer to a ZAP request: [route][""] "1.0" id status text
    user-id metadata. */
static void zap_reply(security_t *s, zmsg_t *req, const char *status, const char *text,
                      const char *user)
{
    zframe_t *route = zmsg_first(req), *empty = zmsg_next(req);
    zmsg_next(req); /* version */
    zframe_t *id = zmsg_next(req);
    zmsg_t *r = zmsg_new();
    zmsg_append(r, &(zframe_t *){zframe_dup(route)});
    zmsg_append(r, &(zframe_t *){zframe_dup(empty)});
    zmsg_addstr(r, "1.0");
    zmsg_append(r, &(zframe_t *){zframe_dup(id)});
    zmsg_addstr(r, status);
    zmsg_addstr(r, text);
    zmsg_addstr(r, user);
    zmsg_addmem(r, "", 0);
    zmsg_send(&r, s->zap);
}

static char *frame_str(zframe_t *f, char *buf, size_t size)
{
    size_t n = f ? zframe_size(f) : 0;
    if (n >= size)
        n = size - 1;
    if (n)
        memcpy(buf, zframe_data(f), n);
    buf[n] = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] < 32 || buf[i] > 126)
            buf[i] = '?';
    return buf;
}

/*  Answers one request; false when it has to wait for the table. */
static bool zap_answer(security_t *s, zmsg_t *req, int64_t now, int64_t came)
{
    /* [route] [""] version request-id domain address identity mechanism key */
    if (zmsg_size(req) < 9) {
        if (zmsg_size(req) >= 4)
            zap_reply(s, req, "400", "malformed request", "");
        return true;
    }
    zframe_t *f = zmsg_first(req);
    for (int i = 0; i < 4; i++)
        f = zmsg_next(req);
    char domain[128], address[128], mech[16];
    frame_str(f, domain, sizeof domain);
    frame_str(zmsg_next(req), address, sizeof address);
    zmsg_next(req); /* our own socket's routing id */
    frame_str(zmsg_next(req), mech, sizeof mech);
    zframe_t *key = zmsg_next(req);
    char ktxt[SECURITY_KEY_TXT] = "?";
    if (strcmp(mech, "CURVE") != 0 || !key || zframe_size(key) != 32) {
        zap_reply(s, req, "400", "CURVE only", "");
        return true;
    }
    zmq_z85_encode(ktxt, zframe_data(key), 32);
    if (strcmp(domain, s->rdv_domain) == 0) {
        if (memcmp(zframe_data(key), s->world_pub_bin, 32) == 0) {
            zap_reply(s, req, "200", "OK", "rendezvous");
        } else {
            warn_limited(&s->lim_rdv,
                         "rpc: rendezvous: refused a registration from %s: "
                         "its key (%.8s...) is not the world key",
                         address, ktxt);
            zap_reply(s, req, "400", "not the world key", "");
        }
        return true;
    }
    if (strcmp(domain, s->domain) != 0) {
        zap_reply(s, req, "400", "unknown domain", "");
        return true;
    }
    if (!atomic_load(&s->ready)) {
        if (now < s->deadline_ns && !atomic_load(&s->stop))
            return false;
        zap_reply(s, req, "400", "no table", "");
        return true;
    }
    int rank = rank_of_key(s, zframe_data(key));
    if (rank < 0 && now - came < UNKNOWN_HOLD_NS && !atomic_load(&s->stop))
        return false;
    if (rank < 0) {
        warn_limited(&s->lim_zap,
                     "rpc: refused a connection from %s: its key (%.8s...) is not "
                     "one of this world's",
                     address, ktxt);
        zap_reply(s, req, "400", "not a member of this world", "");
        return true;
    }
    char user[16];
    snprintf(user, sizeof user, "%d", rank);
    zap_reply(s, req, "200", "OK", user);
    return true;
}

static void watch_event(security_t *s, void *pair, const char *what)
{
    zmsg_t *m = zmsg_recv(pair);
    if (!m)
        return;
    zframe_t *f = zmsg_first(m);
    uint16_t event = 0;
    uint32_t value = 0;
    if (f && zframe_size(f) >= 6) {
        memcpy(&event, zframe_data(f), 2);
        memcpy(&value, zframe_data(f) + 2, 4);
    }
    char ep[128];
    frame_str(zmsg_next(m), ep, sizeof ep);
    zmsg_destroy(&m);
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
        value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        warn_limited(&s->lim_nocurve,
                     "rpc: %s (%s) refused a connection that does not use CURVE "
                     "(a process without the world key?)",
                     what, ep);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
             value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
        warn_limited(&s->lim_crypto,
                     "rpc: %s (%s) refused a connection whose CURVE handshake "
                     "failed (another world's key?)",
                     what, ep);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
        warn_limited(&s->lim_other,
                     "rpc: %s (%s) refused a connection: handshake failed "
                     "(error 0x%x)",
                     what, ep, value);
    else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        warn_limited(&s->lim_other,
                     "rpc: %s (%s) lost a connection before its CURVE handshake "
                     "completed (%s: a process without the world key, or one that went away)",
                     what, ep, zmq_strerror((int)value));
}

static void *zap_main(void *arg)
{
    security_t *s = arg;
    zmq_pollitem_t items[1 + MAX_WATCH];
    char what[MAX_WATCH][32];
    while (!atomic_load(&s->stop)) {
        int n = 0;
        items[n++] = (zmq_pollitem_t){s->zap, 0, ZMQ_POLLIN, 0};
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < s->n_watch; i++) {
            memcpy(what[i], s->watch_what[i], sizeof what[i]);
            items[n++] = (zmq_pollitem_t){s->watch[i], 0, ZMQ_POLLIN, 0};
        }
        pthread_mutex_unlock(&s->lock);
        /* Short sleeps while answers are held, so that they go out soon
           after the table is set. */
        if (zmq_poll(items, n, s->n_held ? 5 : 50) < 0 && errno != EINTR)
            break;
        int64_t now = zd__net_now_ns();
        if (items[0].revents & ZMQ_POLLIN) {
            int events;
            size_t len = sizeof events;
            while (zmq_getsockopt(s->zap, ZMQ_EVENTS, &events, &len) == 0 &&
                   (events & ZMQ_POLLIN)) {
                zmsg_t *req = zmsg_recv(s->zap);
                if (!req)
                    break;
                if (zap_answer(s, req, now, now)) {
                    zmsg_destroy(&req);
                } else if (s->n_held < MAX_HELD) {
                    s->held_at[s->n_held] = now;
                    s->held[s->n_held++] = req;
                } else {
                    zap_reply(s, req, "400", "too many handshakes held", "");
                    zmsg_destroy(&req);
                }
            }
        }
        for (int i = 1; i < n; i++)
            if (items[i].revents & ZMQ_POLLIN)
                watch_event(s, items[i].socket, what[i - 1]);
        int kept = 0;
        for (int i = 0; i < s->n_held; i++) {
            if (zap_answer(s, s->held[i], now, s->held_at[i])) {
                zmsg_destroy(&s->held[i]);
            } else {
                s->held_at[kept] = s->held_at[i];
                s->held[kept++] = s->held[i];
            }
        }
        s->n_held = kept;
    }
    for (int i = 0; i < s->n_held; i++) {
        zap_reply(s, s->held[i], "400", "shutting down", "");
        zmsg_destroy(&s->held[i]);
    }
    s->n_held = 0;
    return NULL;
}

int zd__security_start(zd__net_t *n)
{
    security_t *s = n->sec;
    if (!zd__security_curve(n) || s->started)
        return 0;
    s->zap = zmq_socket(n->ctx, ZMQ_ROUTER);
    int zero = 0;
    if (!s->zap || zmq_setsockopt(s->zap, ZMQ_LINGER, &zero, sizeof zero) < 0 ||
        zmq_bind(s->zap, ZAP_ENDPOINT) < 0)
        return zd_error_set("cannot start the authentication handler: %s", zmq_strerror(errno));
    if (pthread_create(&s->thread, NULL, zap_main, s) != 0)
        return zd_error_set("cannot start the authentication handler's thread");
    s->started = true;
    return 0;
}

void zd__security_free(zd__net_t *n)
{
    security_t *s = n->sec;
    if (!s)
        return;
    if (s->started) {
        atomic_store(&s->stop, true);
        pthread_join(s->thread, NULL);
    }
    if (s->zap)
        zmq_close(s->zap);
    for (int i = 0; i < s->n_watch; i++)
        zmq_close(s->watch[i]);
    free(s->keys);
    pthread_mutex_destroy(&s->lock);
    limit_t *lims[] = {&s->lim_rdv,    &s->lim_zap,   &s->lim_nocurve,
                       &s->lim_crypto, &s->lim_other, &s->lim_spoof};
    for (size_t i = 0; i < sizeof lims / sizeof *lims; i++)
        pthread_mutex_destroy(&lims[i]->lock);
    /* The secrets do not outlive the world. */
    explicit_bzero(s->world_sec, sizeof s->world_sec);
    explicit_bzero(s->sec, sizeof s->sec);
    free(s);
    n->sec = NULL;
}

/*  ---- binding routing ids to keys ---- */

bool zd__security_sender_ok(zd__net_t *n, zmq_msg_t *msg, int src)
{
    if (!zd__security_curve(n))
        return true;
    const char *user = zmq_msg_gets(msg, "User-Id");
    char *end = NULL;
    long who = user ? strtol(user, &end, 10) : -1;
    if (user && *end == 0 && who == src)
        return true;
    atomic_fetch_add(&n->sec->spoofs, 1);
    if (user && *end == 0 && who >= 0 && who < n->world)
        warn_limited(&n->sec->lim_spoof,
                     "rpc: dropped a message claiming to be from \"%s\" "
                     "(rank %d) sent by \"%s\" (rank %ld), authenticated by its key",
                     n->peers[src].name, src, n->peers[who].name, who);
    else
        warn_limited(&n->sec->lim_spoof,
                     "rpc: dropped a message claiming to be from rank %d "
                     "on an unauthenticated connection",
                     src);
    return false;
}

int64_t zd__security_spoofs_dropped(const zd__net_t *n)
{
    return n->sec ? atomic_load(&n->sec->spoofs) : 0;
}
