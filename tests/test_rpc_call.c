/* SPDX-License-Identifier: MIT */
/*  zd_rpc_sync / zd_rpc_async, futures, errors and timeouts (SPEC R2, R3, R9,
    R10 on the wire), with real processes over loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/agent/agent.h"
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

/*  ---- handlers served by every process ---- */

static zd_value_t *h_divide(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    double a, b;
    if (zd_rpc_arg_float(args, 0, &a) < 0 || zd_rpc_arg_float(args, 1, &b) < 0)
        return NULL;
    if (b == 0) {
        zd_error_set("division by zero");
        return NULL;
    }
    return zd_value_float(a / b);
}

static zd_value_t *h_whoami(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    (void)arg;
    char buf[256];
    snprintf(buf, sizeof buf, "%s/%d called %s on %s", zd_rpc_call_caller_name(call),
             zd_rpc_call_caller_rank(call), zd_rpc_call_function(call), zd_rpc_name());
    return zd_value_string(buf);
}

/*  Doubles a float tensor into a new one. */
static zd_value_t *h_double(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_tensor_t *x, *y;
    if (zd_rpc_arg_tensor(args, 0, &x) < 0 || zd_tensor_scale(x, 2.0f, &y) < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(y);
    zd_tensor_unref(y);
    return v;
}

/*  "hold" answers only when "release" is called: timeouts without sleeping. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static zd_future_t *held[64];
static int n_held;

static zd_future_t *h_hold(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    zd_future_t *f = zd_future_new();
    pthread_mutex_lock(&held_lock);
    held[n_held++] = zd_future_ref(f);
    pthread_mutex_unlock(&held_lock);
    return f;
}

static zd_value_t *h_release(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    pthread_mutex_lock(&held_lock);
    int n = n_held;
    for (int i = 0; i < n_held; i++) {
        zd_value_t *v = zd_value_int(7);
        zd_future_set_value(held[i], v);
        zd_value_unref(v);
        zd_future_unref(held[i]);
    }
    n_held = 0;
    pthread_mutex_unlock(&held_lock);
    return zd_value_int(n);
}

/*  The number of holds waiting, so a test can wait until its call arrived. */
static zd_value_t *h_n_held(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    pthread_mutex_lock(&held_lock);
    int n = n_held;
    pthread_mutex_unlock(&held_lock);
    return zd_value_int(n);
}

static int register_all(void)
{
    if (zd_rpc_register("add", world_h_add, NULL) < 0 ||
        zd_rpc_register("echo", world_h_echo, NULL) < 0 ||
        zd_rpc_register_inline("echo_inline", world_h_echo, NULL) < 0 ||
        zd_rpc_register("divide", h_divide, NULL) < 0 ||
        zd_rpc_register("whoami", h_whoami, NULL) < 0 ||
        zd_rpc_register("double", h_double, NULL) < 0 ||
        zd_rpc_register_async("hold", h_hold, NULL) < 0 ||
        zd_rpc_register_inline("release", h_release, NULL) < 0 ||
        zd_rpc_register_inline("n_held", h_n_held, NULL) < 0)
        return -1;
    return 0;
}

static int start(int rank, int world, int port, int64_t timeout_ms)
{
    zd_rpc_options_t o = world_rpc_options(port);
    o.rpc_timeout_ms = timeout_ms;
    char name[32];
    snprintf(name, sizeof name, "w%d", rank);
    if (register_all() < 0)
        return -1;
    return zd_rpc_init(name, rank, world, &o);
}

/*  ---- values travel both ways, to peers and to oneself ---- */

static int check_echo(int to, zd_value_t *v, const char *fn)
{
    zd_value_t *args = zd_value_list(1), *r = NULL;
    zd_list_append(args, zd_value_ref(v));
    int rc = zd_rpc_sync(to, fn, args, -1, &r);
    zd_value_unref(args);
    bool same = rc == 0 && zd_value_equal(v, r);
    if (!same) {
        char a[256], b[256];
        fprintf(stderr, "echo via %s to %d: sent %s got %s (%s)\n", fn, to,
                zd_value_format(v, a, sizeof a), r ? zd_value_format(r, b, sizeof b) : "-",
                zd_error_last());
    }
    zd_value_unref(r);
    return same ? 0 : -1;
}

static int world_values(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port, 10000) == 0);
    if (w->rank == 0) {
        zd_value_t *r, *add_args = zd__rpc_args("ii", (int64_t)2, (int64_t)40);
        WCHECK(zd_rpc_sync(1, "add", add_args, -1, &r) == 0);
        zd_value_unref(add_args);
        int64_t i;
        WCHECK(zd_value_get_int(r, &i) == 0 && i == 42);
        zd_value_unref(r);
        float data[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        zd_tensor_t *t = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){1, 10}, 2, data);
        int64_t big_n = 1 << 18;
        zd_tensor_t *big = zd_tensor_new(ZD_FLOAT32, &big_n, 1);
        for (int64_t k = 0; k < big_n; k++)
            zd_tensor_data(big)[k] = (float)k;
        int64_t ints[3] = {-1, 0, 1LL << 40};
        zd_tensor_t *ti = zd_tensor_from_data(ZD_INT64, (int64_t[]){3}, 1, ints);
        zd_tensor_t *empty = zd_tensor_new(ZD_UINT8, (int64_t[]){0, 5}, 2);
        zd_value_t *values[] = {
            zd_value_none(),
            zd_value_int(-123456789012LL),
            zd_value_float(3.25),
            zd_value_string("héllo"),
            zd_value_bytes("\0\1\2", 3),
            zd_value_tensor(t),
            zd_value_tensor(big),
            zd_value_tensor(ti),
            zd_value_tensor(empty),
            zd__rpc_args("its", (int64_t)1, t, "x"),
        };
        zd_tensor_unref(t);
        zd_tensor_unref(big);
        zd_tensor_unref(ti);
        zd_tensor_unref(empty);
        size_t n = sizeof values / sizeof values[0];
        zd_value_t *nested = zd_value_list(2);
        zd_list_append(nested, zd_value_ref(values[9]));
        zd_list_append(nested, zd_value_list(0));
        for (int to = 0; to < w->world_size; to++) {
            for (size_t k = 0; k < n; k++) {
                WCHECK(check_echo(to, values[k], "echo") == 0);
                WCHECK(check_echo(to, values[k], "echo_inline") == 0);
            }
            WCHECK(check_echo(to, nested, "echo") == 0);
        }
        zd_value_unref(nested);
        for (size_t k = 0; k < n; k++)
            zd_value_unref(values[k]);
        /* A computed tensor comes back. */
        zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){3}, 1, (float[]){1, -2, 3});
        zd_value_t *args = zd__rpc_args("t", x);
        WCHECK(zd_rpc_sync(1, "double", args, -1, &r) == 0);
        zd_tensor_t *y;
        WCHECK(zd_value_get_tensor(r, &y) == 0 && zd_tensor_numel(y) == 3);
        WCHECK(zd_tensor_data(y)[0] == 2 && zd_tensor_data(y)[1] == -4 &&
               zd_tensor_data(y)[2] == 6);
        zd_value_unref(r);
        zd_value_unref(args);
        zd_tensor_unref(x);
        /* Who called. */
        WCHECK(zd_rpc_sync(1, "whoami", NULL, -1, &r) == 0);
        const char *s;
        WCHECK(zd_value_get_string(r, &s) == 0);
        WCHECK(strcmp(s, "w0/0 called whoami on w1") == 0);
        zd_value_unref(r);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_values_round_trip(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_values, NULL), 0);
}

/*  ---- futures ---- */

static atomic_int then_ran;

static void on_done(zd_future_t *f, void *arg)
{
    int64_t v;
    if (zd_future_value(f) && zd_value_get_int(zd_future_value(f), &v) == 0 &&
        v == (int64_t)(intptr_t)arg)
        atomic_fetch_add(&then_ran, 1);
}

static int world_futures(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port, 10000) == 0);
    if (w->rank == 0) {
        enum { N = 32 };
        zd_future_t *fs[N];
        for (int i = 0; i < N; i++) {
            zd_value_t *args = zd__rpc_args("ii", (int64_t)i, (int64_t)1000);
            fs[i] = zd_rpc_async(1 + i % (w->world_size - 1), "add", args, -1);
            zd_value_unref(args);
            WCHECK(fs[i] != NULL);
            WCHECK(zd_future_then(fs[i], on_done, (void *)(intptr_t)(i + 1000)) == 0);
        }
        WCHECK(zd_future_wait_all(fs, N, 10000) == 0);
        for (int i = 0; i < N; i++) {
            int64_t v;
            WCHECK(zd_future_done(fs[i]));
            WCHECK(zd_value_get_int(zd_future_value(fs[i]), &v) == 0 && v == i + 1000);
            zd_future_unref(fs[i]);
        }
        WCHECK(atomic_load(&then_ran) == N);
        /* wait_any: the held call stays pending, the other completes. */
        zd_future_t *two[2];
        two[0] = zd_rpc_async(1, "hold", NULL, -1);
        zd_value_t *one_one = zd__rpc_args("ii", (int64_t)1, (int64_t)1);
        two[1] = zd_rpc_async(2, "add", one_one, -1);
        zd_value_unref(one_one);
        int index = -1;
        WCHECK(zd_future_wait_any(two, 2, 10000, &index) == 0 && index == 1);
        WCHECK(!zd_future_done(two[0]));
        zd_value_t *r;
        int64_t n = 0;
        while (n < 1) { /* until the hold arrived at rank 1 */
            WCHECK(zd_rpc_sync(1, "n_held", NULL, -1, &r) == 0);
            zd_value_get_int(r, &n);
            zd_value_unref(r);
        }
        WCHECK(zd_rpc_sync(1, "release", NULL, -1, &r) == 0);
        zd_value_unref(r);
        WCHECK(zd_future_wait(two[0], 10000) == 0);
        zd_future_unref(two[0]);
        zd_future_unref(two[1]);
        /* A failing async call fails its future with the remote text. */
        zd_value_t *by_zero = zd__rpc_args("ff", 1.0, 0.0);
        zd_future_t *f = zd_rpc_async(2, "divide", by_zero, -1);
        zd_value_unref(by_zero);
        WCHECK(zd_future_wait(f, 10000) == -1);
        WCHECK(strstr(zd_future_error(f), "division by zero") != NULL);
        WCHECK(strstr(zd_future_error(f),
                      "zd_rpc_async to \"w2\" (rank 2) calling \"divide\": remote error") != NULL);
        zd_future_unref(f);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_async_futures(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 60, world_futures, NULL), 0);
}

/*  ---- many threads waiting for futures at once ---- */

#define WAITERS 6
#define WAITS   300

/*  Each waiter adds its own numbers on rank 1 and checks every sum. */
static void *waiter_main(void *arg)
{
    intptr_t me = (intptr_t)arg;
    for (int64_t i = 0; i < WAITS; i++) {
        zd_value_t *args = zd__rpc_args("ii", (int64_t)me * 1000000, i);
        zd_future_t *f = zd_rpc_async(1, "add", args, -1);
        zd_value_unref(args);
        int64_t v = -1;
        int rc = f ? zd_future_wait(f, 20000) : -1;
        if (rc == 0)
            zd_value_get_int(zd_future_value(f), &v);
        zd_future_unref(f);
        if (v != me * 1000000 + i) {
            fprintf(stderr, "waiter %d, call %lld: %s\n", (int)me, (long long)i,
                    rc ? zd_error_last() : "wrong sum");
            return (void *)1;
        }
    }
    return NULL;
}

static int world_waiters(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port, 20000) == 0);
    if (w->rank == 0) {
        /* One of them polls (with the I/O thread), the others sleep: all
           get their answers, and the I/O thread is left polling for none. */
        pthread_t th[WAITERS];
        for (intptr_t i = 0; i < WAITERS; i++)
            WCHECK(pthread_create(&th[i], NULL, waiter_main, (void *)i) == 0);
        int failed = 0;
        for (int i = 0; i < WAITERS; i++) {
            void *r;
            pthread_join(th[i], &r);
            failed += r != NULL;
        }
        WCHECK(failed == 0);
        agent_t *a = zd__agent_acquire();
        WCHECK(a && atomic_load(&a->net.io_poll_waiters) == 0);
        zd__agent_release(a);
        int64_t v = -1;
        WCHECK(zd_rpc_get_debug_value("num_pending_requests", &v) == 0 && v == 0);
    }
    WCHECK(zd_rpc_shutdown(true, 20000) == 0);
    return 0;
}

static void test_concurrent_future_waiters(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_waiters, NULL), 0);
}

/*  ---- errors name the peer and the function; the process keeps serving ---- */

static int expect_error(int to, const char *fn, zd_value_t *args, int64_t timeout,
                        const char *part1, const char *part2)
{
    zd_value_t *r = (zd_value_t *)1;
    int rc = zd_rpc_sync(to, fn, args, timeout, &r);
    zd_value_unref(args);
    if (rc != -1 || r != NULL || !strstr(zd_error_last(), part1) ||
        (part2 && !strstr(zd_error_last(), part2))) {
        fprintf(stderr, "calling %s: rc %d, error \"%s\", expected \"%s\" and \"%s\"\n", fn, rc,
                zd_error_last(), part1, part2 ? part2 : "");
        return -1;
    }
    return 0;
}

static int world_errors(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port, 10000) == 0);
    if (w->rank == 0) {
        WCHECK(expect_error(1, "divide", zd__rpc_args("ff", 1.0, 0.0), -1,
                            "zd_rpc_sync to \"w1\" (rank 1) calling \"divide\": remote error: "
                            "division by zero",
                            NULL) == 0);
        WCHECK(expect_error(1, "nosuch", NULL, -1,
                            "zd_rpc_sync to \"w1\" (rank 1) calling \"nosuch\"",
                            "unknown function \"nosuch\"") == 0);
        WCHECK(expect_error(1, "add", zd__rpc_args("si", "two", (int64_t)2), -1,
                            "calling \"add\": remote error: argument 0: expected int", NULL) == 0);
        WCHECK(expect_error(1, "add", zd__rpc_args("i", (int64_t)2), -1, "calling \"add\"",
                            "argument 1") == 0);
        WCHECK(expect_error(7, "add", NULL, -1, "no worker with rank 7", NULL) == 0);
        WCHECK(expect_error(1, "bad name", NULL, -1, "bad function name", NULL) == 0);
        WCHECK(expect_error(1, "add", zd_value_int(3), -1, "arguments must be a list", NULL) == 0);
        /* After all that, both sides still serve. */
        zd_value_t *r, *args = zd__rpc_args("ii", (int64_t)20, (int64_t)22);
        int64_t v;
        WCHECK(zd_rpc_sync(1, "add", args, -1, &r) == 0);
        WCHECK(zd_value_get_int(r, &v) == 0 && v == 42);
        zd_value_unref(r);
        zd_value_unref(args);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    /* Calls after shutdown fail clearly. */
    zd_value_t *r;
    WCHECK(zd_rpc_sync(0, "add", NULL, -1, &r) == -1);
    WCHECK(strstr(zd_error_last(), "not running") != NULL);
    WCHECK(zd_rpc_async(0, "add", NULL, -1) == NULL);
    WCHECK(strstr(zd_error_last(), "not running") != NULL);
    return 0;
}

static void test_errors_name_peer_and_function(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_errors, NULL), 0);
}

/*  ---- timeouts ---- */

static int world_timeouts(const world_t *w)
{
    /* A default timeout of 400 ms for this world. */
    WCHECK(start(w->rank, w->world_size, w->port, 400) == 0);
    if (w->rank == 0) {
        int64_t t0 = world_now_ms();
        WCHECK(expect_error(1, "hold", NULL, 300, "zd_rpc_sync to \"w1\" (rank 1) calling \"hold\"",
                            "timed out after 300 ms") == 0);
        int64_t took = world_now_ms() - t0;
        WCHECK(took >= 300 && took < 2000);
        /* The default applies when the call gives none. */
        t0 = world_now_ms();
        WCHECK(expect_error(1, "hold", NULL, -1, "timed out after 400 ms", NULL) == 0);
        took = world_now_ms() - t0;
        WCHECK(took >= 400 && took < 2000);
        /* Futures time out too, without anyone waiting on them. */
        zd_future_t *f = zd_rpc_async(1, "hold", NULL, 200);
        WCHECK(zd_future_wait(f, 5000) == -1);
        WCHECK(strstr(zd_future_error(f), "timed out after 200 ms") != NULL);
        zd_future_unref(f);
        /* 0 = no timeout: the call waits for the release. */
        f = zd_rpc_async(1, "hold", NULL, 0);
        zd_value_t *r;
        int64_t n = 0;
        while (n < 4) { /* until all four holds arrived at rank 1 */
            WCHECK(zd_rpc_sync(1, "n_held", NULL, -1, &r) == 0);
            zd_value_get_int(r, &n);
            zd_value_unref(r);
        }
        WCHECK(!zd_future_done(f));
        WCHECK(zd_rpc_sync(1, "release", NULL, -1, &r) == 0);
        zd_value_unref(r);
        WCHECK(zd_future_wait(f, 5000) == 0);
        zd_future_unref(f);
        /* The late answers to the timed-out calls were dropped quietly. */
        zd_rpc_metrics_t m;
        WCHECK(zd_rpc_metrics_get(1, &m, sizeof m) == 0);
        WCHECK(m.errors == 3 && m.in_flight == 0);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_timeouts(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_timeouts, NULL), 0);
}

/*  ---- a peer that died ---- */

static zd_future_t *ready, *finished;
static int64_t victim_pid;

static zd_value_t *h_finished(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    zd_future_set_value(finished, NULL);
    return zd_value_none();
}

static zd_value_t *h_ready(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rpc_arg_int(args, 0, &victim_pid);
    zd_future_set_value(ready, NULL);
    return zd_value_none();
}

static int world_dead_peer(const world_t *w)
{
    ready = zd_future_new();
    finished = zd_future_new();
    WCHECK(zd_rpc_register_inline("ready", h_ready, NULL) == 0);
    WCHECK(zd_rpc_register_inline("finished", h_finished, NULL) == 0);
    WCHECK(start(w->rank, w->world_size, w->port, 10000) == 0);
    zd_value_t *r;
    if (w->rank == 2) {
        zd_value_t *args = zd__rpc_args("i", (int64_t)getpid());
        WCHECK(zd_rpc_sync(0, "ready", args, -1, &r) == 0);
        for (;;)
            pause(); /* until rank 0 kills it */
    }
    if (w->rank == 0) {
        /* Kill the peer, then call it. */
        WCHECK(zd_future_wait(ready, 10000) == 0);
        WCHECK(kill((pid_t)victim_pid, SIGKILL) == 0);
        int64_t t0 = world_now_ms();
        zd_value_t *args = zd__rpc_args("ii", (int64_t)1, (int64_t)2);
        int rc = zd_rpc_sync(2, "add", args, 3000, &r);
        zd_value_unref(args);
        int64_t took = world_now_ms() - t0;
        WCHECK(rc == -1 && took < 3500);
        WCHECK(strstr(zd_error_last(), "zd_rpc_sync to \"w2\" (rank 2) calling \"add\"") != NULL);
        WCHECK(strstr(zd_error_last(), "peer \"w2\" (rank 2) lost") ||
               strstr(zd_error_last(), "timed out"));
        /* Still serving the living. */
        args = zd__rpc_args("ii", (int64_t)1, (int64_t)2);
        WCHECK(zd_rpc_sync(1, "add", args, -1, &r) == 0);
        zd_value_unref(r);
        zd_value_unref(args);
        WCHECK(zd_rpc_sync(1, "finished", NULL, -1, &r) == 0);
        zd_value_unref(r);
    }
    if (w->rank == 1)
        WCHECK(zd_future_wait(finished, 10000) == 0);
    /* The survivors shut down without the dead one (declared lost: calls to
       it fail at once), and rank 0 logs that it went on without it. Each
       declares it lost on its own, 1 s after its own connection went down:
       rank 1 may be a few ms behind rank 0. */
    int64_t until = world_now_ms() + world_scaled_ms(5000);
    while (!zd_rpc_peer_is_lost(2) && world_now_ms() < until) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    int64_t t0 = world_now_ms();
    WCHECK(zd_rpc_peer_is_lost(2));
    WCHECK(zd_rpc_shutdown(true, 1000) == 0);
    WCHECK(world_now_ms() - t0 < 3000);
    WCHECK(!zd_rpc_is_running());
    zd_future_unref(ready);
    zd_future_unref(finished);
    return 0;
}

static void test_dead_peer(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3,
                         .fn = world_dead_peer,
                         .timeout_s = 60,
                         .own_init = true,
                         .expect_exit = {0, 0, 128 + SIGKILL}};
    assert_int_equal(world_run(&o), 0); /* rank 2 killed, the others fine */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_round_trip),
        cmocka_unit_test(test_async_futures),
        cmocka_unit_test(test_concurrent_future_waiters),
        cmocka_unit_test(test_errors_name_peer_and_function),
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_dead_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
