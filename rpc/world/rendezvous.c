/* SPDX-License-Identifier: MIT */
/*  rendezvous.c: every process learns every other's name and endpoint.

    Rank 0 binds a ROUTER at master_addr:master_port: that address only
    when it is an IP literal, each of its addresses when it is a host name,
    and every interface when rank 0 was given no master address at all (as
    PyTorch's TCPStore does, so that the documented command line, rank 0
    without --master_addr, serves other hosts) or when the name resolves to
    loopback only on rank 0's host (Debian's /etc/hosts maps the host name
    to 127.0.1.1, which other hosts do not reach). Every other process
    sends, from a DEALER, a registration and waits for a table or an error
    (the client: register.c, which membership.c's members waiting for a
    restarted rank 0 use too; the messages: rendezvous.h, read in
    rendezvous_msg.c).

    Rank 0 learns where each registration came from (its connection's
    Peer-Address) and, unless told where to listen, binds its agent ROUTER
    only now, on the local address that routes to each worker (loopback
    when they are all on its host): the table a worker gets carries the
    rank-0 endpoint it can reach. Workers advertise the address that routes
    to the master, so a worker started with a loopback master address on
    rank 0's host is unreachable from other hosts: rank 0 says so, naming
    both, and fails the world.

    Nothing one message does aborts the world. A malformed registration,
    another world size, a rank outside the world, a rank or a name that is
    already taken are answered with an error to that sender alone, logged
    and remembered; the first registration of a rank stays, except that the
    same name from the same host replaces it (that process restarted).
    Genuine misconfiguration thus fails at once on the process that is
    wrong, and rank 0's timeout names what it turned away. A process whose
    master never answers fails at its init timeout, saying whether it
    reached the master at all.

    With a world key both rendezvous sockets are CURVE with the world
    keypair, so that only holders of the key can register at all, and each
    process's registration carries its own public key, which the table hands
    to every peer (security.h).

    It takes the net (the peers' table it fills, the context, the keys),
    not the agent: what membership, which the agent holds, keeps of it
    (the ranks a running world lost, rank 0's socket for processes that
    restart) goes there through the hooks the agent passes in
    (zd__rendezvous_up_t). */
#include "rpc/world/rendezvous_run.h"

#include <czmq.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/net/address.h"
#include "rpc/world/options.h"
#include "rpc/world/register.h"
#include "rpc/world/rendezvous.h"
#include "rpc/net/security.h"

#define MAX_BINDS RDV_MAX_BINDS
/*  zmq_poll waits at most this long at a time (1000 s; an int of ms). */
#define POLL_SLICE_MAX_MS INT64_C(1000000)

typedef struct {
    bool present;
    zframe_t *identity; /* NULL for rank 0 itself */
    char name[ZD_RPC_MAX_NAME + 1];
    char endpoint[ZD_RPC_MAX_ENDPOINT + 1];
    char peer[ZD_ADDR_MAX]; /* where the registration came from */
    int via;                /* rank 0's endpoint for it (index into bound[]) */
    char key[SECURITY_KEY_TXT];
} slot_t;

typedef struct {
    zd__net_t *n;
    const zd__rendezvous_up_t *up; /* what membership keeps */
    void *sock;
    slot_t *slots;
    char turned_away[512]; /* the last rejections, for the timeout's message */
    char bound[MAX_BINDS][ZD_RPC_MAX_ENDPOINT + 1]; /* rank 0's agent endpoints */
    char bound_ip[MAX_BINDS][ZD_ADDR_MAX];
    int n_bound;
    bool running; /* a member of a running world registered */
    bool *gone;   /* ranks lost to one of those members */
} host_t;

static int remaining_ms(int64_t deadline)
{
    int64_t left = zd__ms_left(zd__net_now_ns(), deadline);
    return left < 0 ? -1 : (int)(left > POLL_SLICE_MAX_MS ? POLL_SLICE_MAX_MS : left);
}

static void set_int(void *sock, int opt, int value)
{
    zmq_setsockopt(sock, opt, &value, sizeof value);
}

static void send_to(void *sock, zframe_t *identity, zmsg_t *body)
{
    zmsg_t *m = zmsg_dup(body);
    if (!m)
        return;
    zmsg_pushmem(m, zframe_data(identity), zframe_size(identity));
    zmsg_send(&m, sock);
}

static void send_error(void *sock, zframe_t *identity, const char *text)
{
    zmsg_t *body = zmsg_new();
    zmsg_addstr(body, RDV_ERR_TAG);
    zmsg_addstr(body, text);
    send_to(sock, identity, body);
    zmsg_destroy(&body);
}

static void broadcast_error(host_t *h, const char *text)
{
    for (int i = 0; i < h->n->world; i++)
        if (h->slots[i].present && h->slots[i].identity)
            send_error(h->sock, h->slots[i].identity, text);
}

/*  ---- rank 0: the rendezvous socket ---- */

static int bind_one(void *sock, const char *ip, int port, char *ep, size_t size)
{
    char p[8];
    snprintf(p, sizeof p, "%d", port);
    zd__addr_endpoint(ip, p, ep, size);
    set_int(sock, ZMQ_IPV6, zd__addr_family(ip) == AF_INET6);
    return zmq_bind(sock, ep);
}

/*  Every interface, IPv6 and IPv4 alike when the host has IPv6. */
static int bind_all(void *sock, int port)
{
    char ep[64];
    snprintf(ep, sizeof ep, "tcp://*:%d", port);
    set_int(sock, ZMQ_IPV6, 1);
    if (zmq_bind(sock, ep) == 0)
        return 0;
    set_int(sock, ZMQ_IPV6, 0);
    if (zmq_bind(sock, ep) == 0)
        return 0;
    return zd_error_set("rendezvous: rank 0 cannot listen on port %d: %s", port,
                        zmq_strerror(errno));
}

/*  Binds the rendezvous socket where master (see the top) says; a world
    without a key (loopback only) binds master's loopback addresses and
    nothing else, whatever the name. */
static int listen_rendezvous(void *sock, const char *master, int port, bool loopback_only)
{
    if (!*master) {
        zd__log(ZD_LOG_INFO,
                "rpc: rendezvous: no master address given: rank 0 listens on port "
                "%d of every interface",
                port);
        return bind_all(sock, port);
    }
    char addrs[MAX_BINDS][ZD_ADDR_MAX], ep[ZD_RPC_MAX_ENDPOINT + 1], tried[256] = "";
    int n = zd__addr_resolve(master, addrs, MAX_BINDS), bound = 0, loopback = 0;
    if (n < 0)
        return zd_error_wrap("rendezvous: master address");
    for (int i = 0; i < n; i++)
        loopback += zd__addr_is_loopback(addrs[i]);
    if (!zd__addr_family(master) && loopback == n && !loopback_only) {
        /* A name that means "this host" only here: other hosts resolve it to
           an address we cannot know, so listen everywhere. */
        zd__log(ZD_LOG_WARN,
                "rpc: rendezvous: master address \"%s\" resolves to %s on this "
                "host, which other hosts cannot reach: rank 0 listens on port %d of every "
                "interface (give rank 0 an IP address to listen on one)",
                master, addrs[0], port);
        return bind_all(sock, port);
    }
    for (int i = 0; i < n; i++) {
        if (loopback_only && !zd__addr_is_loopback(addrs[i]))
            continue;
        if (bind_one(sock, addrs[i], port, ep, sizeof ep) == 0) {
            bound++;
            continue;
        }
        size_t len = strlen(tried);
        snprintf(tried + len, sizeof tried - len, "%s%s (%s)", len ? ", " : "", ep,
                 zmq_strerror(errno));
    }
    if (bound)
        return 0;
    return zd_error_set("rendezvous: rank 0 cannot listen at %s: rank 0 must run on the host "
                        "that master address \"%s\" names (or be given no master address, and "
                        "then it listens on every interface)",
                        tried, master);
}

/*  ---- rank 0: registrations ---- */

/*  Logs a registration that is turned away, answers its sender alone and
    remembers it for the timeout's message. */
static void turn_away(host_t *h, zframe_t *id, const char *peer, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void turn_away(host_t *h, zframe_t *id, const char *peer, const char *fmt, ...)
{
    char why[400], text[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    snprintf(text, sizeof text,
             "rendezvous: rank 0 (\"%s\") turned away a registration from "
             "%s: %s",
             h->n->name, peer, why);
    zd__log(ZD_LOG_WARN, "rpc: %s", text);
    send_error(h->sock, id, text);
    size_t len = strlen(h->turned_away);
    if (len + 80 < sizeof h->turned_away)
        snprintf(h->turned_away + len, sizeof h->turned_away - len, "%s%s from %s", len ? "; " : "",
                 why, peer);
}

/*  Takes one registration (the frames after the routing id): 1 when it
    filled a new slot, 0 when it filled none. */
static int take_registration(host_t *h, zmsg_t *m, zframe_t *id)
{
    zd__net_t *n = h->n;
    char peer[ZD_ADDR_MAX] = "", why[160];
    /* The routing id frame is made by the ROUTER; the connection's
       properties ride on the frames that came over it. */
    zframe_t *first = zmsg_first(m);
    const char *pa = first ? zframe_meta(first, "Peer-Address") : NULL;
    if (!pa || zd__addr_normalize(pa, peer, sizeof peer) < 0)
        snprintf(peer, sizeof peer, "an unknown address");
    rdv_entry_t r;
    char lost_list[RDV_MAX_TEXT];
    if (zd__rdv_parse_registration(m, &r, lost_list, why, sizeof why) < 0) {
        turn_away(h, id, peer, "malformed (%s)", why);
        return 0;
    }
    const char *policy = zd__security_registration_refused(n, peer, r.endpoint);
    if (policy) {
        turn_away(h, id, peer, "\"%s\" (rank %d): %s", r.name, r.rank, policy);
        return 0;
    }
    if (!zd__security_key_ok(n, r.key)) {
        turn_away(h, id, peer, "\"%s\" (rank %d) %s", r.name, r.rank,
                  zd__security_curve(n) ? "has no valid public key"
                                        : "has a key and this world has none");
        return 0;
    }
    if (r.world != n->world) {
        turn_away(h, id, peer, "world size mismatch: \"%s\" (rank %d) says %d, rank 0 says %d",
                  r.name, r.rank, r.world, n->world);
        return 0;
    }
    if (r.rank == 0 || r.rank >= n->world) {
        turn_away(h, id, peer, "\"%s\" claims rank %d, which is %s", r.name, r.rank,
                  r.rank ? "outside the world" : "rank 0's own");
        return 0;
    }
    slot_t *s = &h->slots[r.rank];
    if (s->present && zframe_eq(s->identity, id))
        return 0; /* said twice on one connection */
    for (int i = 0; i < n->world; i++)
        if (i != r.rank && h->slots[i].present && !strcmp(h->slots[i].name, r.name)) {
            turn_away(h, id, peer, "\"%s\" (rank %d) has the name of rank %d", r.name, r.rank, i);
            return 0;
        }
    if (r.running) {
        /* A member of the world that ran before this process (a restarted
           rank 0): the world is waited for minus the ranks it lost. */
        h->running = true;
        if (zd__rdv_parse_ranks(lost_list, n->world, h->gone) < 0) {
            turn_away(h, id, peer, "a bad list of lost ranks");
            return 0;
        }
    }
    bool restarted = s->present && !strcmp(s->name, r.name) && !strcmp(s->peer, peer);
    if (s->present && !restarted) {
        turn_away(h, id, peer, "rank %d is taken by \"%s\" from %s (%s)", r.rank, s->name, s->peer,
                  s->endpoint);
        return 0;
    }
    if (restarted) {
        zd__log(ZD_LOG_WARN,
                "rpc: rendezvous: \"%s\" (rank %d) registered again from %s, at %s "
                "instead of %s: taking the new one",
                r.name, r.rank, peer, r.endpoint, s->endpoint);
        zframe_destroy(&s->identity);
    }
    s->present = true;
    s->identity = zframe_dup(id);
    snprintf(s->name, sizeof s->name, "%s", r.name);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", r.endpoint);
    snprintf(s->peer, sizeof s->peer, "%s", peer);
    snprintf(s->key, sizeof s->key, "%s", r.key);
    return !restarted;
}

static void missing_ranks(slot_t *slots, int world, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < world && n + 16 < size; i++)
        if (!slots[i].present)
            n += (size_t)snprintf(buf + n, size - n, "%s%d", n ? ", " : "", i);
}

/*  ---- rank 0: where it listens, and whether the world can form ---- */

static bool on_this_host(const char *ip)
{
    return zd__addr_is_loopback(ip) || zd__addr_is_local(ip);
}

/*  A worker that advertises a loopback address is reachable from rank 0's
    host only: fails (naming who cannot reach whom) when another process
    lives elsewhere. */
static int check_reachable(host_t *h)
{
    zd__net_t *n = h->n;
    char ip[ZD_ADDR_MAX];
    int port, far = -1;
    for (int i = 1; i < n->world && far < 0; i++)
        if (h->slots[i].present && !on_this_host(h->slots[i].peer))
            far = i;
    if (far < 0)
        return 0;
    slot_t *f = &h->slots[far];
    if (n->peers[0].endpoint[0] &&
        zd__addr_parse_endpoint(n->peers[0].endpoint, ip, sizeof ip, &port) == 0 &&
        zd__addr_is_loopback(ip))
        return zd_error_set("rendezvous: rank 0 (\"%s\") listens at %s (its listen address), "
                            "which \"%s\" (rank %d) on %s cannot reach: give rank 0 a listen "
                            "address that the other hosts reach",
                            n->name, n->peers[0].endpoint, f->name, far, f->peer);
    for (int i = 1; i < n->world; i++) {
        slot_t *s = &h->slots[i];
        if (s->present && zd__addr_parse_endpoint(s->endpoint, ip, sizeof ip, &port) == 0 &&
            zd__addr_is_loopback(ip))
            return zd_error_set("rendezvous: \"%s\" (rank %d, on %s) advertises %s, which "
                                "\"%s\" (rank %d) on %s cannot reach: start rank %d with a "
                                "--master_addr (or --listen_addr, ZDIST_LISTEN_ADDR) that the "
                                "other hosts reach, not a loopback one",
                                s->name, i, on_this_host(s->peer) ? "rank 0's host" : s->peer,
                                s->endpoint, i == far ? n->name : f->name, i == far ? 0 : far,
                                i == far ? "rank 0's host" : f->peer, i);
    }
    return 0;
}

/*  Rank 0's endpoint for an address: bound once per local address. */
static int endpoint_for(host_t *h, const char *ip)
{
    for (int k = 0; k < h->n_bound; k++)
        if (!strcmp(h->bound_ip[k], ip))
            return k;
    if (h->n_bound == MAX_BINDS)
        return zd_error_set("rendezvous: rank 0's workers need more than %d local addresses",
                            MAX_BINDS);
    int k = h->n_bound;
    if (zd__transport_listen(h->n, ip, h->bound[k], sizeof h->bound[k]) < 0)
        return zd_error_wrap("rendezvous: rank 0");
    snprintf(h->bound_ip[k], sizeof h->bound_ip[k], "%s", ip);
    h->n_bound++;
    return k;
}

/*  Binds rank 0's agent ROUTER where its workers reach it (unless it was
    bound already, on the listen address) and picks each worker's endpoint. */
static int listen_agent(host_t *h, const char *master)
{
    zd__net_t *n = h->n;
    char ip[ZD_ADDR_MAX];
    if (n->peers[0].endpoint[0]) {
        snprintf(h->bound[0], sizeof h->bound[0], "%s", n->peers[0].endpoint);
        h->n_bound = 1;
        return 0;
    }
    for (int i = 1; i < n->world; i++) {
        slot_t *s = &h->slots[i];
        int port;
        if (!s->present)
            continue;
        /* Where the registration came from; the advertised address when
           the connection does not say (it always does over TCP). */
        const char *to = s->peer;
        if (!zd__addr_family(to) && zd__addr_parse_endpoint(s->endpoint, ip, sizeof ip, &port) == 0)
            to = ip;
        char from[ZD_ADDR_MAX];
        if (zd__addr_route_from(to, from, sizeof from) < 0)
            return zd_error_wrap("rendezvous: rank 0 cannot reach \"%s\" (rank %d)", s->name, i);
        if ((s->via = endpoint_for(h, from)) < 0)
            return -1;
    }
    if (n->world == 1) {
        if (*master ? zd__agent_listen_ip(master, ip, sizeof ip) < 0
                    : snprintf(ip, sizeof ip, "127.0.0.1") < 0)
            return -1;
        if (endpoint_for(h, ip) < 0)
            return -1;
    }
    snprintf(n->peers[0].endpoint, sizeof n->peers[0].endpoint, "%s", h->bound[0]);
    char list[512] = "";
    for (int k = 0; k < h->n_bound; k++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", k ? ", " : "", h->bound[k]);
    }
    zd__log(ZD_LOG_INFO, "rpc: rank 0 listens at %s (where its workers reach it)", list);
    return 0;
}

/*  src into dst (size bytes), cut to fit. Not snprintf: every rank copies
    the whole world's table, three fields a rank, and printf's machinery
    showed in the profile of a 512-rank world's start. */
static void copy_text(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/*  Appends a field of the entries frame (rendezvous.h): a length byte and
    the text, cut at RDV_ENTRY_MAX's bounds (every field here is shorter). */
static uint8_t *put_field(uint8_t *at, const char *text, size_t max)
{
    size_t n = strnlen(text, max);
    *at++ = (uint8_t)n;
    memcpy(at, text, n);
    return at + n;
}

zmsg_t *zd__rendezvous_table(zd__net_t *n, const char *ep0, const char *status)
{
    uint8_t *entries = malloc((size_t)n->world * RDV_ENTRY_MAX), *at = entries;
    zmsg_t *table = entries ? zmsg_new() : NULL;
    if (!table) {
        free(entries);
        return NULL;
    }
    for (int i = 0; i < n->world; i++) {
        at = put_field(at, n->peers[i].name, ZD_RPC_MAX_NAME);
        at = put_field(at, i ? n->peers[i].endpoint : ep0, ZD_RPC_MAX_ENDPOINT);
        at = put_field(at, n->peers[i].key, RDV_KEY_LEN);
    }
    zmsg_addstr(table, RDV_TAB_TAG);
    zmsg_addstrf(table, "%d", n->world);
    zmsg_addmem(table, entries, (size_t)(at - entries));
    free(entries);
    if (status)
        zmsg_addstr(table, status);
    return table;
}

/*  Whether every rank the world needs has registered: all of them, or, in a
    world that was running, those its members did not lose. */
static bool complete(const host_t *h)
{
    for (int i = 1; i < h->n->world; i++)
        if (!h->slots[i].present && !(h->running && h->gone[i]))
            return false;
    return true;
}

static int send_tables(host_t *h)
{
    zd__net_t *n = h->n;
    for (int i = 0; i < n->world; i++) {
        snprintf(n->peers[i].name, sizeof n->peers[i].name, "%s", h->slots[i].name);
        snprintf(n->peers[i].key, sizeof n->peers[i].key, "%s", h->slots[i].key);
        if (i)
            snprintf(n->peers[i].endpoint, sizeof n->peers[i].endpoint, "%s", h->slots[i].endpoint);
    }
    char status[RDV_MAX_TEXT];
    if (h->running) {
        /* This process restarted: the ranks that did not come are gone. */
        n->rejoined = true;
        for (int i = 1; i < n->world; i++)
            h->gone[i] = !h->slots[i].present;
        zd__rdv_status(h->gone, n->world, status);
        for (int i = 1; i < n->world; i++)
            if (h->gone[i])
                h->up->mark_lost(h->up->arg, i);
        zd__log(ZD_LOG_WARN,
                "rpc: rank 0 (\"%s\") restarted and joined the running world "
                "(%s)",
                n->name, status);
    }
    /* One table per address of rank 0 that joiners came through. */
    zmsg_t *tables[MAX_BINDS] = {0};
    for (int j = 1; j < n->world; j++) {
        int via = h->slots[j].via;
        if (!h->slots[j].present)
            continue;
        if (!tables[via] &&
            !(tables[via] = zd__rendezvous_table(n, h->bound[via], h->running ? status : NULL)))
            break; /* out of memory: the joiners wait out their timeout */
        send_to(h->sock, h->slots[j].identity, tables[via]);
    }
    for (int k = 0; k < MAX_BINDS; k++)
        zmsg_destroy(&tables[k]);
    return 0;
}

static int host_rendezvous(zd__net_t *n, const char *addr, int port, int64_t deadline,
                           const zd__rendezvous_up_t *up)
{
    host_t h = {.n = n, .up = up};
    h.slots = calloc((size_t)n->world, sizeof *h.slots);
    h.gone = calloc((size_t)n->world, sizeof *h.gone);
    h.sock = zmq_socket(n->ctx, ZMQ_ROUTER);
    if (!h.slots || !h.gone || !h.sock) {
        free(h.slots);
        free(h.gone);
        if (h.sock)
            zmq_close(h.sock);
        return zd_error_set("rendezvous: cannot create the master socket");
    }
    set_int(h.sock, ZMQ_LINGER, 2000); /* lets the table reach everyone after we return */
    int64_t max = RDV_MAX_FRAME;       /* an int64_t option: an int is refused (EINVAL) */
    zmq_setsockopt(h.sock, ZMQ_MAXMSGSIZE, &max, sizeof max);
    set_int(h.sock, ZMQ_HANDSHAKE_IVL, RDV_HANDSHAKE_MS);
    /* Everyone registers at once: a connection past the backlog waits for
       its SYN to be sent again, a second later (transport.c). */
    set_int(h.sock, ZMQ_BACKLOG, n->world > 100 ? n->world : 100);
    int rc = -1;
    if (zd__security_start(n) < 0 || zd__security_rendezvous_server(n, h.sock) < 0)
        goto out;
    zd__security_watch(n, h.sock, "the rendezvous"); /* before the first connection */
    if (listen_rendezvous(h.sock, addr, port, zd__security_loopback_only(n)) < 0)
        goto out;
    h.slots[0].present = true;
    snprintf(h.slots[0].name, sizeof h.slots[0].name, "%s", n->name);
    snprintf(h.slots[0].key, sizeof h.slots[0].key, "%s", zd__security_public_key(n));
    int count = 1;
    while (!complete(&h)) {
        zmq_pollitem_t item = {h.sock, 0, ZMQ_POLLIN, 0};
        int ready = zmq_poll(&item, 1, remaining_ms(deadline));
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0) {
            char miss[256];
            missing_ranks(h.slots, n->world, miss, sizeof miss);
            zd_error_set("rendezvous: timed out with %d of %d workers registered (missing "
                         "ranks %s)%s%s",
                         count, n->world, miss, h.turned_away[0] ? "; turned away: " : "",
                         h.turned_away);
            broadcast_error(&h, zd_error_last());
            goto out;
        }
        zmsg_t *m = zmsg_recv(h.sock);
        if (!m)
            continue;
        zframe_t *id = zmsg_pop(m);
        if (id)
            count += take_registration(&h, m, id);
        zframe_destroy(&id);
        zmsg_destroy(&m);
    }
    if (check_reachable(&h) < 0 || listen_agent(&h, addr) < 0) {
        broadcast_error(&h, zd_error_last());
        goto out;
    }
    rc = send_tables(&h);
    /* The socket stays open for processes that restart (membership.c). */
    up->keep_desk(up->arg, h.sock, h.bound, h.bound_ip, h.n_bound);
    h.sock = NULL;
out:
    for (int i = 0; i < n->world; i++)
        zframe_destroy(&h.slots[i].identity);
    free(h.slots);
    free(h.gone);
    if (h.sock)
        zmq_close(h.sock);
    return rc;
}

/*  ---- the other ranks ---- */

zmsg_t *zd__rendezvous_registration(zd__net_t *n, const char *status)
{
    zmsg_t *reg = zmsg_new();
    zmsg_addstr(reg, RDV_REG_TAG);
    zmsg_addstrf(reg, "%d", n->rank);
    zmsg_addstrf(reg, "%d", n->world);
    zmsg_addstr(reg, n->name);
    zmsg_addstr(reg, n->peers[n->rank].endpoint);
    zmsg_addstr(reg, zd__security_public_key(n));
    if (status)
        zmsg_addstr(reg, status);
    return reg;
}

static int secure_client(void *arg, void *sock)
{
    return zd__security_rendezvous_client(arg, sock);
}

static zmsg_t *registration(void *arg)
{
    return zd__rendezvous_registration(arg, NULL);
}

void zd__rendezvous_client(zd__net_t *n, const char *ep, reg_client_t *c)
{
    *c = (reg_client_t){.ctx = n->ctx,
                        .endpoint = ep,
                        .world = n->world,
                        .rank = n->rank,
                        .name = n->name,
                        .curve = zd__security_curve(n),
                        .secure = secure_client,
                        .registration = registration,
                        .arg = n,
                        .deadline = ZD__NEVER};
}

static int join_rendezvous(zd__net_t *n, const char *addr, int port, int64_t deadline,
                           const zd__rendezvous_up_t *up)
{
    char ep[ZD_RPC_MAX_ENDPOINT + 1];
    if (zd__reg_master_endpoint(addr, port, ep, sizeof ep) < 0)
        return -1;
    rdv_entry_t *table = calloc((size_t)n->world, sizeof *table);
    if (!table)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "rendezvous: out of memory");
    reg_client_t c;
    zd__rendezvous_client(n, ep, &c);
    c.deadline = deadline;
    bool running;
    int rc = zd__reg_run(&c, table, &running);
    if (rc == 0) {
        for (int i = 0; i < n->world; i++) {
            copy_text(n->peers[i].name, sizeof n->peers[i].name, table[i].name);
            copy_text(n->peers[i].endpoint, sizeof n->peers[i].endpoint, table[i].endpoint);
            copy_text(n->peers[i].key, sizeof n->peers[i].key, table[i].key);
            if (table[i].lost)
                up->mark_lost(up->arg, i);
        }
        if (running) {
            n->rejoined = true;
            zd__log(ZD_LOG_WARN, "rpc: \"%s\" (rank %d) restarted and joins the running world",
                    n->name, n->rank);
        }
    }
    free(table);
    return rc;
}

int zd__rendezvous_run(zd__net_t *n, const char *addr, int port, int64_t timeout_ms,
                       const zd__rendezvous_up_t *up)
{
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), timeout_ms);
    snprintf(n->peers[n->rank].key, sizeof n->peers[n->rank].key, "%s", zd__security_public_key(n));
    int rc = n->rank == 0 ? host_rendezvous(n, addr, port, deadline, up)
                          : join_rendezvous(n, addr, port, deadline, up);
    /* The keys of the table are who may connect from now on. */
    return rc < 0 ? rc : zd__security_table_ready(n);
}
