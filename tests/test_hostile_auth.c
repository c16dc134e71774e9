/* SPDX-License-Identifier: MIT */
/*  Hostile peers against a world with a key (issue 11, points 2 and 4, the
    identity half): no key, a wrong key, the world key without a place in
    the table, a member claiming another rank's routing id and forging
    answers, a rendezvous hijack. Each attack runs against a live world of
    real processes; each checks that the world's result is unchanged and
    that the attacked process logged a clear line. Then the policy: key file
    checks, no key off loopback refused, insecure accepted, the default
    key file found. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/error.h>
#include "core/log_private.h"
#include <zdist/rpc.h>
#include "rpc/agent/agent.h"
#include "rpc/value/codec.h"
#include "rpc/net/security.h"
#include "rpc/net/wire.h"
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

static char g_key[256]; /* the world key file of the test (made in the parent) */

/*  ---- log capture: each process keeps its lines, tests wait for one ---- */

static pthread_mutex_t g_log_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_log_cond = PTHREAD_COND_INITIALIZER;
static char g_log[1 << 16];
static size_t g_log_len;

static void sink(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level;
    (void)arg;
    fprintf(stderr, "[%s] %s\n", who, line);
    pthread_mutex_lock(&g_log_lock);
    int n = snprintf(g_log + g_log_len, sizeof g_log - g_log_len, "%s\n", line);
    if (n > 0 && g_log_len + (size_t)n < sizeof g_log)
        g_log_len += (size_t)n;
    pthread_cond_broadcast(&g_log_cond);
    pthread_mutex_unlock(&g_log_lock);
}

/*  Whether a line containing needle (or needle2) was logged within
    timeout_ms. */
static bool log_wait_any(const char *needle, const char *needle2, int timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&g_log_lock);
    bool found;
    while (!(found = strstr(g_log, needle) || (needle2 && strstr(g_log, needle2))))
        if (pthread_cond_timedwait(&g_log_cond, &g_log_lock, &dl) == ETIMEDOUT) {
            found = strstr(g_log, needle) || (needle2 && strstr(g_log, needle2));
            break;
        }
    pthread_mutex_unlock(&g_log_lock);
    if (!found)
        fprintf(stderr, "no log line with \"%s\" within %d ms\n", needle, timeout_ms);
    return found;
}

static bool log_wait(const char *needle, int timeout_ms)
{
    return log_wait_any(needle, NULL, timeout_ms);
}

/*  ---- what the world does: a counter only members may bump ---- */

static atomic_int_fast64_t g_bumps;

static zd_value_t *h_bump(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(atomic_fetch_add(&g_bumps, 1) + 1);
}

/*  Whether a log line with the string argument arrives within 10 s. */
static zd_value_t *h_saw(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    const char *needle;
    if (zd_rpc_arg_string(args, 0, &needle) < 0)
        return NULL;
    return zd_value_int(log_wait(needle, 10000));
}

/*  Asks rank `to` whether it logged a line with needle (within 10 s): 1,
    0, or -1 when the call failed. */
static int peer_saw(int to, const char *needle)
{
    zd_value_t *args = zd__rpc_args("s", needle), *r = NULL;
    int64_t v = 0;
    int rc = zd_rpc_sync(to, "saw", args, -1, &r);
    zd_value_unref(args);
    if (rc < 0 || zd_value_get_int(r, &v) < 0)
        v = -1;
    zd_value_unref(r);
    return (int)v;
}

/*  The legitimate work: bumps rank `to` n times (sync and async), 0 when
    every answer was right. */
static int legit_work(int to, int n)
{
    for (int i = 0; i < n; i++) {
        zd_value_t *r = NULL;
        int64_t v = 0;
        if (i % 2 == 0) {
            if (zd_rpc_sync(to, "bump", NULL, -1, &r) < 0)
                return -1;
        } else {
            zd_future_t *f = zd_rpc_async(to, "bump", NULL, -1);
            int rc = f ? zd_future_wait(f, 10000) : -1;
            r = rc == 0 ? zd_value_ref(zd_future_value(f)) : NULL;
            zd_future_unref(f);
            if (rc < 0)
                return -1;
        }
        int ok = r && zd_value_get_int(r, &v) == 0 && v == i + 1;
        zd_value_unref(r);
        if (!ok)
            return -1;
    }
    return 0;
}

static int setup_world(const world_t *w)
{
    (void)w;
    zd_log_set_sink(sink, NULL);
    if (zd_rpc_register("bump", h_bump, NULL) < 0 || zd_rpc_register("saw", h_saw, NULL) < 0)
        return -1;
    return 0;
}

static int init_with_key(const world_t *w, const char *key_file)
{
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.key_file = key_file;
    return zd_rpc_init(NULL, w->rank, w->world_size, &o);
}

/*  ---- raw sockets of an intruder ---- */

static const uint8_t meta_none[] = {RPC_CODEC_VERSION, ZD_VALUE_NONE};

/*  A DEALER in ctx claiming routing id id; CURVE client when server_key is
    set (with the keypair pub/sec), plain otherwise. */
static void *intruder(void *ctx, const uint8_t *id, size_t id_len, const char *server_key,
                      const char *pub, const char *sec)
{
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_ROUTING_ID, id, id_len);
    if (server_key) {
        zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key, 40);
        zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, pub, 40);
        zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, sec, 40);
    }
    return s;
}

static void send_header(void *sock, rpc_wire_header_t *h)
{
    uint8_t buf[512];
    zd__rpc_wire_write(h, buf);
    zmq_send(sock, buf, zd__rpc_wire_size(h), 0);
}

/*  A CALL of "bump" from rank src to rank dst. */
static void send_bump(void *sock, int src, int dst, uint64_t id)
{
    rpc_wire_header_t h = {.type = RPC_MSG_CALL,
                           .src = (uint16_t)src,
                           .dst = (uint16_t)dst,
                           .id = id,
                           .fn = "bump",
                           .fn_len = 4,
                           .meta = meta_none,
                           .meta_len = sizeof meta_none};
    send_header(sock, &h);
}

/*  Whether anything at all came back on sock within timeout_ms. */
static bool got_anything(void *sock, int timeout_ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&it, 1, timeout_ms) > 0;
}

/*  ---- outsiders against rank 0's RPC socket ---- */

/*  Four intruders take rank 1's routing id at rank 0 (the identity
    takeover of the audit's E5) and call "bump": one without CURVE, one
    with its own key, one with the world key (registered nowhere), one with
    a wrong server key. None gets an answer or bumps anything; rank 0 logs
    each kind; rank 1 keeps working. */
static int world_outsiders(const world_t *w)
{
    WTRY(init_with_key(w, g_key));
    if (w->rank == 1) {
        WCHECK(peer_saw(0, "attacked") == 1);
        WCHECK(legit_work(0, 6) == 0);
        WTRY(zd_rpc_shutdown(true, 10000));
        return 0;
    }
    char world_pub[SECURITY_KEY_TXT], world_sec[SECURITY_KEY_TXT];
    char pub[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT], other_pub[SECURITY_KEY_TXT],
        other_sec[SECURITY_KEY_TXT];
    WTRY(zd__security_key_load(g_key, world_pub, world_sec));
    WCHECK(zmq_curve_keypair(pub, sec) == 0 && zmq_curve_keypair(other_pub, other_sec) == 0);
    agent_t *a = zd__agent_acquire();
    WCHECK(a != NULL);
    char server_key[SECURITY_KEY_TXT], endpoint[ZD_RPC_MAX_ENDPOINT + 1];
    snprintf(server_key, sizeof server_key, "%s", a->net.peers[0].key);
    snprintf(endpoint, sizeof endpoint, "%s", a->net.peers[0].endpoint);
    zd__agent_release(a);

    void *ctx = zmq_ctx_new();
    uint8_t id[RPC_WIRE_ID_LEN];
    zd__rpc_wire_identity(1, id); /* rank 1's shared socket's id */
    void *s[4] = {
        intruder(ctx, id, sizeof id, NULL, NULL, NULL),
        intruder(ctx, id, sizeof id, server_key, pub, sec),
        intruder(ctx, id, sizeof id, server_key, world_pub, world_sec),
        intruder(ctx, id, sizeof id, other_pub, pub, sec),
    };
    for (int i = 0; i < 4; i++) {
        WCHECK(zmq_connect(s[i], endpoint) == 0);
        send_bump(s[i], 1, 0, ((uint64_t)1 << 48) | (uint64_t)(1000 + i));
    }
    /* Which side notices first is a race: we see its greeting, or its
       hang-up after it saw ours. */
    WCHECK(log_wait_any("refused a connection that does not use CURVE",
                        "before its CURVE handshake completed", 10000));
    WCHECK(log_wait("is not one of this world's", 10000));
    WCHECK(log_wait("CURVE handshake failed", 10000));
    zd__log(ZD_LOG_WARN, "test: attacked");
    /* Rank 1 does its work now; then nothing came back to the intruders
       and only its bumps counted. */
    int64_t t0 = world_now_ms();
    while (atomic_load(&g_bumps) < 6 && world_now_ms() - t0 < 20000)
        sched_yield();
    WCHECK(atomic_load(&g_bumps) == 6);
    for (int i = 0; i < 4; i++) {
        WCHECK(!got_anything(s[i], i == 0 ? 200 : 0));
        zmq_close(s[i]);
    }
    zmq_ctx_term(ctx);
    WTRY(zd_rpc_shutdown(true, 10000));
    WCHECK(atomic_load(&g_bumps) == 6);
    return 0;
}

static void test_outsiders_cannot_call_or_take_over(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2,
                         .setup = setup_world,
                         .fn = world_outsiders,
                         .own_init = true,
                         .timeout_s = 90};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a member claiming another rank ---- */

static world_hold_t g_hold = {.answer = 42};

static int setup_spoof(const world_t *w)
{
    if (setup_world(w) < 0)
        return -1;
    g_hold.arrived = zd_future_new();
    return zd_rpc_register_async("hold", world_h_hold, &g_hold);
}

/*  Rank 0 holds a key of the table, and uses it on a raw socket that
    claims rank 1's identity at rank 1: a call of "bump" and answers to
    every request id rank 1 may have pending (its call to itself, held).
    Rank 1 drops them all, logs the claimed and the authenticated rank, and
    its held call gets the real answer. */
static int world_spoof(const world_t *w)
{
    WTRY(init_with_key(w, g_key));
    if (w->rank == 1) {
        zd_future_t *held = zd_rpc_async(1, "hold", NULL, -1);
        WCHECK(held != NULL);
        WCHECK(zd_future_wait(g_hold.arrived, 10000) == 0);
        WCHECK(peer_saw(0, "spoofed") == 1);
        agent_t *a = zd__agent_acquire();
        WCHECK(a != NULL);
        int64_t t0 = world_now_ms();
        while (zd__security_spoofs_dropped(&a->net) < 257 && world_now_ms() - t0 < 20000)
            sched_yield();
        int64_t dropped = zd__security_spoofs_dropped(&a->net);
        zd__agent_release(a);
        WCHECK(dropped == 257);
        zd__log(ZD_LOG_WARN, "test: all dropped");
        WCHECK(log_wait("claiming to be from \"worker1\" (rank 1) sent by \"worker0\" (rank 0)",
                        5000));
        WCHECK(world_hold_release(&g_hold) == 1);
        WCHECK(zd_future_wait(held, 10000) == 0);
        int64_t v = 0;
        WCHECK(zd_value_get_int(zd_future_value(held), &v) == 0 && v == 42);
        zd_future_unref(held);
        WCHECK(atomic_load(&g_bumps) == 0);
        WCHECK(legit_work(0, 2) == 0);
        WTRY(zd_rpc_shutdown(true, 10000));
        return 0;
    }
    agent_t *a = zd__agent_acquire();
    WCHECK(a != NULL);
    void *sock = zmq_socket(a->net.ctx, ZMQ_DEALER);
    uint8_t id[RPC_WIRE_SYNC_ID_LEN];
    zd__rpc_wire_sync_identity(1, 65000, id); /* rank 1, a slot it never uses */
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, sizeof id);
    int rc = zd__security_client(&a->net, sock, 1); /* our own key: authenticated as rank 0 */
    rc = rc == 0 ? zmq_connect(sock, a->net.peers[1].endpoint) : rc;
    zd__agent_release(a);
    WCHECK(rc == 0);
    send_bump(sock, 1, 1, ((uint64_t)1 << 48) | 999999);
    static const uint8_t forged[] = {RPC_CODEC_VERSION, ZD_VALUE_INT, 7};
    for (uint64_t n = 1; n <= 256; n++) {
        rpc_wire_header_t h = {.type = RPC_MSG_REPLY,
                               .src = 1,
                               .dst = 1,
                               .id = ((uint64_t)1 << 48) | n,
                               .meta = forged,
                               .meta_len = sizeof forged};
        send_header(sock, &h);
    }
    zd__log(ZD_LOG_WARN, "test: spoofed");
    /* The socket stays open until rank 1 has seen everything. */
    WCHECK(peer_saw(1, "test: all dropped") == 1);
    WCHECK(!got_anything(sock, 0));
    zmq_close(sock);
    WTRY(zd_rpc_shutdown(true, 30000));
    WCHECK(atomic_load(&g_bumps) == 2);
    return 0;
}

static void test_member_cannot_claim_another_rank(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2,
                         .setup = setup_spoof,
                         .fn = world_spoof,
                         .own_init = true,
                         .timeout_s = 90};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- the rendezvous ---- */

/*  A monitor of sock's handshake failures, attached before sock connects
    (a failure that came before the monitor would never be seen). */
static void *watch_handshake(void *ctx, void *sock, const char *name)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://hostile-%s", name);
    if (zmq_socket_monitor(sock, ep,
                           ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) < 0)
        return NULL;
    void *mon = zmq_socket(ctx, ZMQ_PAIR);
    if (mon && zmq_connect(mon, ep) < 0) {
        zmq_close(mon);
        return NULL;
    }
    return mon;
}

/*  Waits for a handshake failure on a watch_handshake monitor (and closes
    it): true when one came. */
static bool handshake_refused(void *mon)
{
    bool got = mon != NULL && got_anything(mon, (int)world_scaled_ms(15000));
    if (mon)
        zmq_close(mon);
    return got;
}

static void send_registration(void *sock, int rank, int world, const char *name)
{
    char r[16], ws[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(ws, sizeof ws, "%d", world);
    zmq_send(sock, "ZDREG1", 6, ZMQ_SNDMORE);
    zmq_send(sock, r, strlen(r), ZMQ_SNDMORE);
    zmq_send(sock, ws, strlen(ws), ZMQ_SNDMORE);
    zmq_send(sock, name, strlen(name), ZMQ_SNDMORE);
    zmq_send(sock, "tcp://127.0.0.1:9", 17, ZMQ_SNDMORE);
    zmq_send(sock, "", 0, 0);
}

/*  Before it joins, rank 2 registers as rank 1 ("evil") at the master,
    once without CURVE and once with a key that is not the world's (but
    the right server key): both are refused during the handshake, rank 0
    logs them, and the world forms with the real rank 1. */
static int world_hijack(const world_t *w)
{
    void *ctx = NULL, *s[2] = {NULL, NULL};
    if (w->rank == 2) {
        char world_pub[SECURITY_KEY_TXT], world_sec[SECURITY_KEY_TXT];
        char pub[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT];
        WTRY(zd__security_key_load(g_key, world_pub, world_sec));
        WCHECK(zmq_curve_keypair(pub, sec) == 0);
        ctx = zmq_ctx_new();
        char master[64];
        snprintf(master, sizeof master, "tcp://127.0.0.1:%d", w->port);
        s[0] = intruder(ctx, (const uint8_t *)"x", 1, NULL, NULL, NULL);
        s[1] = intruder(ctx, (const uint8_t *)"y", 1, world_pub, pub, sec);
        void *mon[2] = {watch_handshake(ctx, s[0], "plain"), watch_handshake(ctx, s[1], "curve")};
        for (int i = 0; i < 2; i++) {
            WCHECK(mon[i] != NULL && zmq_connect(s[i], master) == 0);
            send_registration(s[i], 1, w->world_size, "evil");
        }
        WCHECK(handshake_refused(mon[0]));
        WCHECK(handshake_refused(mon[1]));
    }
    WTRY(init_with_key(w, g_key));
    zd_rpc_worker_info_t info;
    WTRY(zd_rpc_get_worker_info_by_rank(1, &info));
    WCHECK(strcmp(info.name, "worker1") == 0 && strcmp(info.endpoint, "tcp://127.0.0.1:9") != 0);
    if (w->rank == 2) {
        WCHECK(peer_saw(0, "the rendezvous (tcp") == 1);
        WCHECK(peer_saw(0, "is not the world key") == 1);
        for (int i = 0; i < 2; i++) {
            WCHECK(!got_anything(s[i], 0));
            zmq_close(s[i]);
        }
        zmq_ctx_term(ctx);
    }
    WCHECK(legit_work((w->rank + 1) % w->world_size, 2) == 0);
    WTRY(zd_rpc_shutdown(true, 10000));
    WCHECK(atomic_load(&g_bumps) == 2);
    return 0;
}

static void test_rendezvous_hijack_refused(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3,
                         .setup = setup_world,
                         .fn = world_hijack,
                         .own_init = true,
                         .timeout_s = 90};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- the policy ---- */

static char g_dir[128];

static int world_key_files(const world_t *w)
{
    (void)w;
    char path[256], pub[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT];
    snprintf(path, sizeof path, "%s/k/new.key", g_dir);
    WTRY(zd__security_keygen(path, false));
    struct stat st;
    WCHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    snprintf(path, sizeof path, "%s/k", g_dir);
    WCHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0700);
    snprintf(path, sizeof path, "%s/k/new.key", g_dir);
    WCHECK(zd__security_keygen(path, false) == -1 && strstr(zd_error_last(), "already exists"));
    WTRY(zd__security_keygen(path, true));
    WTRY(zd__security_key_load(path, pub, sec));
    /* Readable by the group: refused, by zd_rpc_init too. */
    WCHECK(chmod(path, 0640) == 0);
    WCHECK(zd__security_key_load(path, pub, sec) == -1 &&
           strstr(zd_error_last(), "readable by others (mode 640)"));
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.key_file = path;
    WCHECK(zd_rpc_init(NULL, 0, 1, &o) == -1 && strstr(zd_error_last(), "chmod 600"));
    /* Not a key file; a file that is not there. */
    snprintf(path, sizeof path, "%s/k/junk.key", g_dir);
    FILE *f = fopen(path, "w");
    WCHECK(f != NULL);
    fputs("curve\n    public-key = \"short\"\n", f);
    fclose(f);
    WCHECK(chmod(path, 0600) == 0);
    WCHECK(zd__security_key_load(path, pub, sec) == -1 &&
           strstr(zd_error_last(), "is not a world key file"));
    setenv("ZDIST_KEY_FILE", "/nonexistent/world.key", 1);
    o.key_file = NULL;
    WCHECK(zd_rpc_init(NULL, 0, 1, &o) == -1 &&
           strstr(zd_error_last(), "cannot read the key file /nonexistent/world.key"));
    unsetenv("ZDIST_KEY_FILE");
    return 0;
}

static void test_key_files(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 60, world_key_files, NULL), 0);
}

/*  A world whose address is not loopback (rank 0 given no master address
    listens on every interface) has to have a key, or be marked insecure. */
static int world_off_loopback(const world_t *w)
{
    zd_log_set_sink(sink, NULL);
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.master_addr = NULL;
    WCHECK(zd_rpc_init(NULL, 0, 1, &o) == -1);
    WCHECK(strstr(zd_error_last(), "not on loopback only") &&
           strstr(zd_error_last(), "tools/keygen") && strstr(zd_error_last(), "--insecure"));
    o.insecure = true;
    WTRY(zd_rpc_init(NULL, 0, 1, &o));
    WCHECK(log_wait("insecure: no authentication and no encryption", 1000));
    WTRY(zd_rpc_shutdown(true, 5000));
    o.insecure = false;
    setenv("ZDIST_INSECURE", "1", 1);
    WTRY(zd_rpc_init(NULL, 0, 1, &o));
    WTRY(zd_rpc_shutdown(true, 5000));
    unsetenv("ZDIST_INSECURE");
    /* With a key, the same world runs, authenticated. */
    o.key_file = g_key;
    WTRY(zd_rpc_init(NULL, 0, 1, &o));
    agent_t *a = zd__agent_acquire();
    bool curve = a && zd__security_curve(&a->net);
    zd__agent_release(a);
    WCHECK(curve);
    WTRY(zd_rpc_shutdown(true, 5000));
    return 0;
}

static void test_no_key_off_loopback_refused(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 60, world_off_loopback, NULL), 0);
}

/*  Without key_file or ZDIST_KEY_FILE, every process finds the default
    key (here under XDG_CONFIG_HOME) and the world runs CURVE. */
static int world_default_key(const world_t *w)
{
    WTRY(init_with_key(w, NULL));
    agent_t *a = zd__agent_acquire();
    bool curve = a && zd__security_curve(&a->net);
    zd__agent_release(a);
    WCHECK(curve);
    WCHECK(legit_work((w->rank + 1) % w->world_size, 3) == 0);
    WTRY(zd_rpc_shutdown(true, 10000));
    return 0;
}

static void test_default_key_file(void **state)
{
    (void)state;
    char xdg[160], path[256];
    snprintf(xdg, sizeof xdg, "%s/xdg", g_dir);
    setenv("XDG_CONFIG_HOME", xdg, 1);
    assert_int_equal(zd__security_default_path(path, sizeof path), 0);
    assert_non_null(strstr(path, "/xdg/zdist/world.key"));
    assert_int_equal(zd__security_keygen(path, false), 0);
    world_options_t o = {.world_size = 2,
                         .setup = setup_world,
                         .fn = world_default_key,
                         .own_init = true,
                         .timeout_s = 60};
    int rc = world_run(&o);
    unsetenv("XDG_CONFIG_HOME");
    assert_int_equal(rc, 0);
}

/*  A process without the key cannot join a world that has one: both sides
    fail at the init timeout, the joiner with a hint about the key. */
static int world_mixed(const world_t *w)
{
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.init_timeout_ms = 3000;
    o.key_file = w->rank == 0 ? g_key : NULL;
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == -1);
    if (w->rank == 1)
        WCHECK(strstr(zd_error_last(), "If the world uses a key, this process needs it too"));
    else
        WCHECK(strstr(zd_error_last(), "missing ranks 1"));
    return 0;
}

static void test_process_without_key_cannot_join(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_mixed, NULL), 0);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/zd-hostile-XXXXXX");
    if (!mkdtemp(g_dir))
        return 1;
    snprintf(g_key, sizeof g_key, "%s/world.key", g_dir);
    unsetenv("ZDIST_KEY_FILE");
    unsetenv("ZDIST_INSECURE");
    unsetenv("XDG_CONFIG_HOME");
    if (zd__security_keygen(g_key, false) < 0) {
        fprintf(stderr, "%s\n", zd_error_last());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_outsiders_cannot_call_or_take_over),
        cmocka_unit_test(test_member_cannot_claim_another_rank),
        cmocka_unit_test(test_rendezvous_hijack_refused),
        cmocka_unit_test(test_key_files),
        cmocka_unit_test(test_no_key_off_loopback_refused),
        cmocka_unit_test(test_default_key_file),
        cmocka_unit_test(test_process_without_key_cannot_join),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        rc = rc ? rc : 1;
    return rc;
}
