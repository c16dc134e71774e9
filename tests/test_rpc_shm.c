/* SPDX-License-Identifier: MIT */
/*  Large tensors through shared memory between two processes of one host
    (rpc/net/shm.h): tensors of several sizes and dtypes come back exactly, both
    ways; a receiver keeps tensors alive while the sender sends more (each
    was copied out of its segment, so the segments serve again at once and
    the receiver sees the values at send time); many calls in
    flight; ZDIST_SHM=0 turns it off on either side; a process in another
    network namespace is refused and still gets the right values; no
    segment is left open after the world ends. Real processes over TCP. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/net/shm.h"
#include "tests/support/fixtures.h"
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

/*  A tensor of n elements whose bytes follow from seed. */
static zd_tensor_t *pattern(zd_tensor_dtype_t dtype, int64_t n, int seed)
{
    zd_tensor_t *t = zd_tensor_new(dtype, &n, 1);
    if (!t)
        return NULL;
    uint8_t *p = zd_tensor_raw(t);
    size_t nb = zd_tensor_nbytes(t);
    for (size_t i = 0; i < nb; i++)
        p[i] = (uint8_t)(i * 131 + (i >> 12) * 7 + (size_t)seed * 29);
    return t;
}

static bool same(zd_tensor_t *a, zd_tensor_t *b)
{
    return a && b && zd_tensor_dtype(a) == zd_tensor_dtype(b) &&
        zd_tensor_numel(a) == zd_tensor_numel(b) &&
        memcmp(zd_tensor_raw(a), zd_tensor_raw(b), zd_tensor_nbytes(a)) == 0;
}

/*  Waits (up to 60 s: sanitizers on a loaded machine) until this process's
    offer to peer got the answer want. */
static bool wait_state(int peer, int want)
{
    int64_t end = world_now_ms() + 60000;
    while (zd__shm_peer_state(peer) != want) {
        if (world_now_ms() > end)
            return false;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return true;
}

/*  Segments this process holds open (memfds named like ours). */
static int open_segments(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[300], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len > 0) {
            target[len] = 0;
            n += strncmp(target, "/memfd:zdist-shm", 16) == 0;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/*  Mappings of segments (ours or a peer's) in this process. */
static int mapped_segments(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, "/memfd:zdist-shm") != NULL;
    if (f)
        fclose(f);
    return n;
}

static long stat_sent(void)
{
    long v;
    zd__shm_stats(&v, NULL, NULL, NULL, NULL);
    return v;
}

static long stat_received(void)
{
    long v;
    zd__shm_stats(NULL, &v, NULL, NULL, NULL);
    return v;
}

static long stat_fallbacks(void)
{
    long v;
    zd__shm_stats(NULL, NULL, &v, NULL, NULL);
    return v;
}

/*  ---- the receiving filter refuses what it cannot trust ---- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/*  A CALL from rank 1 whose frames are [4 bytes] [empty] [table], the table
    naming frame `frame` in slot 0 with `bytes` of a 1 MiB segment; table_len
    other than the right size makes a malformed table. */
static void shm_call(inmsg_t *m, uint32_t frame, uint64_t bytes, size_t table_len)
{
    static uint8_t meta[] = {1, 0};
    rpc_wire_header_t h = {.type = RPC_MSG_CALL,
                           .flags = RPC_WIRE_F_SHM,
                           .src = 1,
                           .dst = 0,
                           .id = 77,
                           .fn = "f",
                           .fn_len = 1,
                           .meta = meta,
                           .meta_len = sizeof meta,
                           .n_tensors = 3};
    memset(m, 0, sizeof *m);
    zmq_msg_init_size(&m->hm, zd__rpc_wire_size(&h));
    zd__rpc_wire_write(&h, zmq_msg_data(&m->hm));
    assert_int_equal(zd__rpc_wire_parse(zmq_msg_data(&m->hm), zmq_msg_size(&m->hm), &m->h), 0);
    uint8_t table[8 + RPC_SHM_ENTRY] = {0};
    put_le(table, 1, 4);
    put_le(table + 8, frame, 4);
    put_le(table + 8 + 8, 3, 4);        /* fd */
    put_le(table + 8 + 16, 0x1234, 8);  /* token */
    put_le(table + 8 + 24, 1 << 20, 8); /* cap */
    put_le(table + 8 + 32, bytes, 8);
    m->frames = malloc(3 * sizeof *m->frames);
    assert_non_null(m->frames);
    m->frames[0] = frame_of("abcd", 4);
    m->frames[1] = frame_of(NULL, 0);
    m->frames[2] = frame_of(table, table_len ? table_len : sizeof table);
    m->n = m->cap = 3;
    m->src = 1;
}

/*  The agent above the filter: an answer dropped on the way in fails no
    call here (there are none). */
static void fake_fail_answer(void *arg, uint64_t id, int src, const char *text,
                             zd_error_code_t code)
{
    (void)arg, (void)id, (void)src, (void)code;
    assert_true(text && text[0]);
}

static void test_filter_refuses(void **state)
{
    (void)state;
    static int router_tag;
    zd__net_t fake;
    memset(&fake, 0, sizeof fake);
    fake.rank = 0;
    fake.world = 2;
    fake.router = &router_tag;
    fake.up.fail_answer = fake_fail_answer;
    zd__shm_start(&fake);
    struct {
        uint32_t frame;
        uint64_t bytes;
        size_t table_len;
        const char *why;
    } cases[] = {
        {1, 1000, 0, "whose offer was not accepted"}, /* well formed, no offer */
        {1, 1000, 20, "shared-memory table of 20 bytes"},
        {0, 1000, 0, "is not valid"},      /* a frame with bytes */
        {2, 1000, 0, "is not valid"},      /* the table itself */
        {1, 0, 0, "is not valid"},         /* empty */
        {1, (2 << 20), 0, "is not valid"}, /* more than the segment */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        inmsg_t m;
        shm_call(&m, cases[i].frame, cases[i].bytes, cases[i].table_len);
        assert_int_equal(zd__shm_filter(&fake, &router_tag, &m), -1);
        if (!strstr(zd_error_last(), cases[i].why))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, zd_error_last(), cases[i].why);
        assert_int_equal(m.reject_id, 77); /* the caller hears of it */
        assert_int_equal(m.n, 0);
        assert_int_equal(frames_live(), 0);
        free(m.frames);
    }
    /* A message without the flag goes through untouched. */
    inmsg_t m;
    shm_call(&m, 1, 1000, 0);
    m.h.flags = 0;
    assert_int_equal(zd__shm_filter(&fake, &router_tag, &m), 1);
    assert_int_equal(m.n, 3);
    for (int i = 0; i < 3; i++)
        m.frames[i].release(m.frames[i].data, m.frames[i].release_arg);
    zmq_msg_close(&m.hm);
    free(m.frames);
    zd__shm_stop();
}

/*  The flag only on messages with a value and a table, never with streaming. */
static void test_wire_flag(void **state)
{
    (void)state;
    uint8_t buf[256];
    rpc_wire_header_t p;
    rpc_wire_header_t hello = {.type = RPC_MSG_HELLO, .flags = RPC_WIRE_F_SHM};
    zd__rpc_wire_write(&hello, buf);
    assert_int_equal(zd__rpc_wire_parse(buf, zd__rpc_wire_size(&hello), &p), -1);
    static const uint8_t meta[] = {1, 0};
    rpc_wire_header_t r = {.type = RPC_MSG_REPLY,
                           .flags = RPC_WIRE_F_SHM,
                           .id = 3,
                           .meta = meta,
                           .meta_len = 2,
                           .n_tensors = 2};
    zd__rpc_wire_write(&r, buf);
    assert_int_equal(zd__rpc_wire_parse(buf, zd__rpc_wire_size(&r), &p), 0);
    r.flags |= RPC_WIRE_F_STREAMED;
    zd__rpc_wire_write(&r, buf);
    assert_int_equal(zd__rpc_wire_parse(buf, zd__rpc_wire_size(&r), &p), -1);
    r.flags = RPC_WIRE_F_SHM;
    r.n_tensors = 1;
    zd__rpc_wire_write(&r, buf);
    assert_int_equal(zd__rpc_wire_parse(buf, zd__rpc_wire_size(&r), &p), -1);
    rpc_wire_header_t offer = {.type = RPC_MSG_SHM_OFFER, .id = 9, .extra = meta, .extra_len = 2};
    zd__rpc_wire_write(&offer, buf);
    assert_int_equal(zd__rpc_wire_parse(buf, zd__rpc_wire_size(&offer), &p), 0);
    assert_string_equal(zd__rpc_wire_type_name(RPC_MSG_SHM_ACCEPT), "SHM_ACCEPT");
}

/*  ---- rank 1 keeps what it is sent ---- */

#define KEEP_MAX   32
#define KEEP_ELEMS ((int64_t)(1 << 20) / 4 + 16)
static zd_tensor_t *kept[KEEP_MAX];
static int n_kept;

static zd_value_t *h_keep(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_tensor_t *t;
    if (zd_rpc_arg_tensor(args, 0, &t) < 0 || n_kept == KEEP_MAX)
        return NULL;
    kept[n_kept++] = zd_tensor_ref(t);
    return zd_value_int(n_kept);
}

/*  Checks that kept tensor i still holds pattern(.., i), then lets all go. */
static zd_value_t *h_check(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    int good = 0;
    for (int i = 0; i < n_kept; i++) {
        zd_tensor_t *want = pattern(ZD_FLOAT32, KEEP_ELEMS, i);
        good += same(kept[i], want);
        zd_tensor_unref(want);
        zd_tensor_unref(kept[i]);
        kept[i] = NULL;
    }
    n_kept = 0;
    return zd_value_int(good);
}

static int setup_handlers(void)
{
    if (zd_rpc_register("echo", world_h_echo, NULL) < 0 ||
        zd_rpc_register_inline("keep", h_keep, NULL) < 0 ||
        zd_rpc_register_inline("check", h_check, NULL) < 0)
        return -1;
    return 0;
}

static int call_int(const char *fn, zd_value_t *args, int64_t *out)
{
    zd_value_t *r;
    if (zd_rpc_sync(1, fn, args, -1, &r) < 0)
        return -1;
    int rc = zd_value_get_int(r, out);
    zd_value_unref(r);
    return rc;
}

/*  ---- a world of two processes of this host ---- */

/*  Echoes tensors of several sizes and dtypes three times; with shm, every
    call and answer went through shared memory, else none. */
static int rank0_roundtrips(bool shm)
{
    /* Several sizes and dtypes in one message, small ones beside. */
    zd_tensor_t *t[5] = {pattern(ZD_FLOAT32, (1 << 20) / 4 + 5, 1), pattern(ZD_UINT8, 300001, 2),
                         pattern(ZD_INT64, (3 << 20) / 8, 3), pattern(ZD_INT64, 17, 4),
                         pattern(ZD_FLOAT32, (int64_t)RPC_SHM_OVER / 4, 5)}; /* not over */
    zd_value_t *args = zd__rpc_args("v", zd__rpc_args("ttttt", t[0], t[1], t[2], t[3], t[4]));
    WCHECK(args);
    if (shm) {
        /* Each side announces a segment per large tensor, and a message
           whose segments are not mapped yet goes the ZeroMQ way: rounds
           until one goes through shared memory both ways (a few). */
        int64_t end = world_now_ms() + world_scaled_ms(10000);
        for (;;) {
            long s0 = stat_sent(), r0 = stat_received();
            zd_value_t *res;
            WCHECK(zd_rpc_sync(1, "echo", args, -1, &res) == 0);
            zd_value_unref(res);
            if (stat_sent() == s0 + 1 && stat_received() == r0 + 1)
                break;
            WCHECK(world_now_ms() < end);
        }
    }
    long sent0 = stat_sent(), recv0 = stat_received();
    for (int round = 0; round < 3; round++) {
        zd_value_t *res;
        WCHECK(zd_rpc_sync(1, "echo", args, -1, &res) == 0);
        for (int k = 0; k < 5; k++) {
            zd_tensor_t *got;
            WCHECK(zd_rpc_arg_tensor(res, (size_t)k, &got) == 0 && same(got, t[k]));
        }
        zd_value_unref(res);
    }
    /* Both ways: the calls and their answers. */
    if (shm)
        WCHECK(stat_sent() - sent0 == 3 && stat_received() - recv0 == 3);
    else
        WCHECK(stat_sent() == 0 && stat_received() == 0);
    zd_value_unref(args);
    for (int k = 0; k < 5; k++)
        zd_tensor_unref(t[k]);
    return 0;
}

static int rank0_keep(void)
{
    /* Rank 1 keeps 12 tensors. Each was copied out of its segment when
       rank 1 decoded it, so keeping them holds no segment: all 12 but the
       first (whose segment was being announced) go through shared memory,
       in the same one or two segments, and each kept tensor is the value
       at send time. */
    long sent0 = stat_sent(), fb0 = stat_fallbacks();
    long made0;
    zd__shm_stats(NULL, NULL, NULL, &made0, NULL);
    for (int i = 0; i < 12; i++) {
        zd_tensor_t *x = pattern(ZD_FLOAT32, KEEP_ELEMS, i);
        zd_value_t *a = zd__rpc_args("t", x);
        int64_t n;
        WCHECK(call_int("keep", a, &n) == 0 && n == i + 1);
        /* The receiver holds the value at send time, not this one. */
        memset(zd_tensor_raw(x), 0xee, zd_tensor_nbytes(x));
        zd_value_unref(a);
        zd_tensor_unref(x);
    }
    long made1;
    zd__shm_stats(NULL, NULL, NULL, &made1, NULL);
    /* the first went the ZeroMQ way while its segment was announced */
    WCHECK(stat_sent() - sent0 >= 11 && stat_fallbacks() - fb0 <= 1);
    WCHECK(made1 - made0 <= 2);
    int64_t good;
    WCHECK(call_int("check", NULL, &good) == 0 && good == 12);
    return 0;
}

static int rank0_in_flight(void)
{
    enum { N = 24 };
    zd_tensor_t *x[N];
    zd_future_t *f[N];
    for (int i = 0; i < N; i++) {
        x[i] = pattern(i % 2 ? ZD_FLOAT32 : ZD_UINT8, (512 << 10) + i, 100 + i);
        zd_value_t *a = zd__rpc_args("t", x[i]);
        f[i] = zd_rpc_async(1, "echo", a, -1);
        zd_value_unref(a);
        WCHECK(f[i]);
    }
    for (int i = 0; i < N; i++) {
        WCHECK(zd_future_wait(f[i], ZD_TIMEOUT_NONE) == 0);
        zd_tensor_t *got;
        zd_value_t *v = zd_future_value(f[i]); /* borrowed */
        WCHECK(v && zd_value_get_tensor(v, &got) == 0 && same(got, x[i]));
        zd_future_unref(f[i]);
        zd_tensor_unref(x[i]);
    }
    return 0;
}

static int world_same_host(const world_t *w)
{
    WCHECK(setup_handlers() == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    int other = 1 - w->rank;
    WCHECK(wait_state(other, 1));
    if (w->rank == 0) {
        if (rank0_roundtrips(true) || rank0_keep() || rank0_in_flight())
            return 1;
    }
    WCHECK(open_segments() > 0 && mapped_segments() > 0);
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(30000)) == 0);
    /* Every segment closed and unmapped: its memory is gone. */
    WCHECK(open_segments() == 0 && mapped_segments() == 0);
    return 0;
}

static void test_same_host(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 120, world_same_host, NULL), 0);
}

/*  ---- ZDIST_SHM=0 on one side: both directions take ZeroMQ ---- */

static int world_off(const world_t *w)
{
    if (w->rank == 0)
        setenv("ZDIST_SHM", "0", 1);
    WCHECK(setup_handlers() == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    if (w->rank == 1) {
        WCHECK(wait_state(0, -1)); /* refused */
    } else {
        WCHECK(zd__shm_peer_state(1) == 0 && open_segments() == 0);
        if (rank0_roundtrips(false))
            return 1;
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(30000)) == 0);
    WCHECK(stat_sent() == 0 && stat_received() == 0);
    return 0;
}

static void test_turned_off(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 120, world_off, NULL), 0);
}

/*  ---- another network namespace: refused, values still right ---- */

typedef struct {
    char ns[32];
    char ip0[32], ip1[32];
} netns_t;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

static int world_netns(const world_t *w)
{
    const netns_t *n = w->arg;
    if (w->rank == 1) {
        char path[64];
        snprintf(path, sizeof path, "/run/netns/%s", n->ns);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        WCHECK(fd >= 0 && setns(fd, CLONE_NEWNET) == 0);
        close(fd);
    }
    WCHECK(setup_handlers() == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.master_addr = n->ip0;
    o.listen_addr = w->rank == 0 ? n->ip0 : n->ip1;
    o.insecure = true; /* off loopback, inside namespaces this test made */
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    WCHECK(wait_state(1 - w->rank, -1));
    if (w->rank == 0 && rank0_roundtrips(false))
        return 1;
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(30000)) == 0);
    return 0;
}

static void test_other_network_namespace(void **state)
{
    (void)state;
    netns_t n;
    int id = (int)getpid();
    snprintf(n.ns, sizeof n.ns, "zdshm%d", id);
    snprintf(n.ip0, sizeof n.ip0, "10.213.%d.%d", (id >> 6) & 255, (id & 63) * 4 + 1);
    snprintf(n.ip1, sizeof n.ip1, "10.213.%d.%d", (id >> 6) & 255, (id & 63) * 4 + 2);
    if (sh("ip netns add %s 2>/dev/null", n.ns) != 0) {
        print_message("no network namespaces here (not root, or not permitted): skipped\n");
        skip();
    }
    int rc = sh("ip link add zsa%d type veth peer name zsb%d && "
                "ip link set zsb%d netns %s && "
                "ip addr add %s/30 dev zsa%d && ip link set zsa%d up && "
                "ip netns exec %s ip addr add %s/30 dev zsb%d && "
                "ip netns exec %s ip link set zsb%d up && "
                "ip netns exec %s ip link set lo up",
                id, id, id, n.ns, n.ip0, id, id, n.ns, n.ip1, id, n.ns, id, n.ns);
    if (rc != 0) {
        sh("ip link del zsa%d 2>/dev/null; ip netns del %s", id, n.ns);
        print_message("cannot link a network namespace here: skipped\n");
        skip();
    }
    rc = world_run(&(world_options_t){.world_size = 2,
                                      .fn = world_netns,
                                      .arg = &n,
                                      .timeout_s = 120,
                                      .own_init = true,
                                      .port_addr = n.ip0});
    sh("ip link del zsa%d 2>/dev/null; ip netns del %s", id, n.ns);
    assert_int_equal(rc, 0);
}

int main(void)
{
    unsetenv("ZDIST_SHM");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_flag),
        cmocka_unit_test(test_filter_refuses),
        cmocka_unit_test(test_same_host),
        cmocka_unit_test(test_turned_off),
        cmocka_unit_test(test_other_network_namespace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
