/*  rpc_sync / rpc_async, futures, errors and timeouts (SPEC R2, R3, R9,
    R10 on the wire), with real processes over loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>

#include "autograd/autograd.h"
#include "rpc/agent.h"
#include "test_rpc_world.h"

/* ---- handlers served by every process ---- */

static rpc_value_t *h_divide(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    double a, b;
    if (rpc_arg_float(args, 0, &a) < 0 || rpc_arg_float(args, 1, &b) < 0)
        return NULL;
    if (b == 0) {
        error_set("division by zero");
        return NULL;
    }
    return rpc_value_float(a / b);
}

static rpc_value_t *h_whoami(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)args;
    (void)arg;
    char buf[256];
    snprintf(buf, sizeof buf, "%s/%d called %s on %s", rpc_call_caller_name(call),
             rpc_call_caller_rank(call), rpc_call_function(call), rpc_name());
    return rpc_value_string(buf);
}

/* Doubles a float tensor into a new one. */
static rpc_value_t *h_double(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    tensor_t *x, *y;
    if (rpc_arg_tensor(args, 0, &x) < 0 || tensor_scale(x, 2.0f, &y) < 0)
        return NULL;
    rpc_value_t *v = rpc_value_tensor(y);
    tensor_unref(y);
    return v;
}

/* "hold" answers only when "release" is called: timeouts without sleeping. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static rpc_future_t *held[64];
static int n_held;

static rpc_future_t *h_hold(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    rpc_future_t *f = rpc_future_new();
    pthread_mutex_lock(&held_lock);
    held[n_held++] = rpc_future_ref(f);
    pthread_mutex_unlock(&held_lock);
    return f;
}

static rpc_value_t *h_release(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    pthread_mutex_lock(&held_lock);
    int n = n_held;
    for (int i = 0; i < n_held; i++) {
        rpc_value_t *v = rpc_value_int(7);
        rpc_future_set_value(held[i], v);
        rpc_value_unref(v);
        rpc_future_unref(held[i]);
    }
    n_held = 0;
    pthread_mutex_unlock(&held_lock);
    return rpc_value_int(n);
}

/* The number of holds waiting, so a test can wait until its call arrived. */
static rpc_value_t *h_n_held(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    pthread_mutex_lock(&held_lock);
    int n = n_held;
    pthread_mutex_unlock(&held_lock);
    return rpc_value_int(n);
}

static int register_all(void)
{
    if (rpc_register("add", world_h_add, NULL) < 0 ||
        rpc_register("echo", world_h_echo, NULL) < 0 ||
        rpc_register_inline("echo_inline", world_h_echo, NULL) < 0 ||
        rpc_register("divide", h_divide, NULL) < 0 ||
        rpc_register("whoami", h_whoami, NULL) < 0 || rpc_register("double", h_double, NULL) < 0 ||
        rpc_register_async("hold", h_hold, NULL) < 0 ||
        rpc_register_inline("release", h_release, NULL) < 0 ||
        rpc_register_inline("n_held", h_n_held, NULL) < 0)
        return -1;
    return 0;
}

static int start(int rank, int world, int port, int64_t timeout_ms)
{
    rpc_options_t o = world_options(port);
    o.rpc_timeout_ms = timeout_ms;
    char name[32];
    snprintf(name, sizeof name, "w%d", rank);
    if (register_all() < 0)
        return -1;
    return rpc_init(name, rank, world, &o);
}

/* ---- values travel both ways, to peers and to oneself ---- */

static int check_echo(int to, rpc_value_t *v, const char *fn)
{
    rpc_value_t *args = rpc_value_list(1), *r = NULL;
    rpc_list_append(args, rpc_value_ref(v));
    int rc = rpc_sync(to, fn, args, -1, &r);
    rpc_value_unref(args);
    bool same = rc == 0 && rpc_value_equal(v, r);
    if (!same) {
        char a[256], b[256];
        fprintf(stderr, "echo via %s to %d: sent %s got %s (%s)\n", fn, to,
                rpc_value_format(v, a, sizeof a), r ? rpc_value_format(r, b, sizeof b) : "-",
                error_last());
    }
    rpc_value_unref(r);
    return same ? 0 : -1;
}

static int world_values(int rank, int world, int port, void *arg)
{
    (void)arg;
    WCHECK(start(rank, world, port, 10000) == 0);
    if (rank == 0) {
        rpc_value_t *r, *add_args = rpc_args("ii", (int64_t)2, (int64_t)40);
        WCHECK(rpc_sync(1, "add", add_args, -1, &r) == 0);
        rpc_value_unref(add_args);
        int64_t i;
        WCHECK(rpc_value_get_int(r, &i) == 0 && i == 42);
        rpc_value_unref(r);
        float data[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
        tensor_t *t = tensor_from_data(TENSOR_F32, 2, (int64_t[]){1, 10}, data);
        int64_t big_n = 1 << 18;
        tensor_t *big = tensor_new(TENSOR_F32, 1, &big_n);
        for (int64_t k = 0; k < big_n; k++)
            tensor_data(big)[k] = (float)k;
        int64_t ints[3] = {-1, 0, 1LL << 40};
        tensor_t *ti = tensor_from_data(TENSOR_I64, 1, (int64_t[]){3}, ints);
        tensor_t *empty = tensor_new(TENSOR_U8, 2, (int64_t[]){0, 5});
        rpc_value_t *values[] = {
            rpc_value_none(), rpc_value_int(-123456789012LL), rpc_value_float(3.25),
            rpc_value_string("héllo"), rpc_value_bytes("\0\1\2", 3), rpc_value_tensor(t),
            rpc_value_tensor(big), rpc_value_tensor(ti), rpc_value_tensor(empty),
            rpc_args("its", (int64_t)1, t, "x"),
        };
        tensor_unref(t);
        tensor_unref(big);
        tensor_unref(ti);
        tensor_unref(empty);
        size_t n = sizeof values / sizeof values[0];
        rpc_value_t *nested = rpc_value_list(2);
        rpc_list_append(nested, rpc_value_ref(values[9]));
        rpc_list_append(nested, rpc_value_list(0));
        for (int to = 0; to < world; to++) {
            for (size_t k = 0; k < n; k++) {
                WCHECK(check_echo(to, values[k], "echo") == 0);
                WCHECK(check_echo(to, values[k], "echo_inline") == 0);
            }
            WCHECK(check_echo(to, nested, "echo") == 0);
        }
        rpc_value_unref(nested);
        for (size_t k = 0; k < n; k++)
            rpc_value_unref(values[k]);
        /* A computed tensor comes back. */
        tensor_t *x = tensor_from_data(TENSOR_F32, 1, (int64_t[]){3}, (float[]){1, -2, 3});
        rpc_value_t *args = rpc_args("t", x);
        WCHECK(rpc_sync(1, "double", args, -1, &r) == 0);
        tensor_t *y;
        WCHECK(rpc_value_get_tensor(r, &y) == 0 && tensor_numel(y) == 3);
        WCHECK(tensor_data(y)[0] == 2 && tensor_data(y)[1] == -4 && tensor_data(y)[2] == 6);
        rpc_value_unref(r);
        rpc_value_unref(args);
        tensor_unref(x);
        /* Who called. */
        WCHECK(rpc_sync(1, "whoami", NULL, -1, &r) == 0);
        const char *s;
        WCHECK(rpc_value_get_string(r, &s) == 0);
        WCHECK(strcmp(s, "w0/0 called whoami on w1") == 0);
        rpc_value_unref(r);
    }
    WCHECK(rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_values_round_trip(void **state)
{
    (void)state;
    assert_int_equal(run_world(2, 60, world_values, NULL), 0);
}

/* ---- futures ---- */

static atomic_int then_ran;

static void on_done(rpc_future_t *f, void *arg)
{
    int64_t v;
    if (rpc_future_value(f) && rpc_value_get_int(rpc_future_value(f), &v) == 0 &&
        v == (int64_t)(intptr_t)arg)
        atomic_fetch_add(&then_ran, 1);
}

static int world_futures(int rank, int world, int port, void *arg)
{
    (void)arg;
    WCHECK(start(rank, world, port, 10000) == 0);
    if (rank == 0) {
        enum { N = 32 };
        rpc_future_t *fs[N];
        for (int i = 0; i < N; i++) {
            rpc_value_t *args = rpc_args("ii", (int64_t)i, (int64_t)1000);
            fs[i] = rpc_async(1 + i % (world - 1), "add", args, -1);
            rpc_value_unref(args);
            WCHECK(fs[i] != NULL);
            WCHECK(rpc_future_then(fs[i], on_done, (void *)(intptr_t)(i + 1000)) == 0);
        }
        WCHECK(rpc_future_wait_all(fs, N, 10000) == 0);
        for (int i = 0; i < N; i++) {
            int64_t v;
            WCHECK(rpc_future_done(fs[i]));
            WCHECK(rpc_value_get_int(rpc_future_value(fs[i]), &v) == 0 && v == i + 1000);
            rpc_future_unref(fs[i]);
        }
        WCHECK(atomic_load(&then_ran) == N);
        /* wait_any: the held call stays pending, the other completes. */
        rpc_future_t *two[2];
        two[0] = rpc_async(1, "hold", NULL, -1);
        rpc_value_t *one_one = rpc_args("ii", (int64_t)1, (int64_t)1);
        two[1] = rpc_async(2, "add", one_one, -1);
        rpc_value_unref(one_one);
        int index = -1;
        WCHECK(rpc_future_wait_any(two, 2, 10000, &index) == 0 && index == 1);
        WCHECK(!rpc_future_done(two[0]));
        rpc_value_t *r;
        int64_t n = 0;
        while (n < 1) {   /* until the hold arrived at rank 1 */
            WCHECK(rpc_sync(1, "n_held", NULL, -1, &r) == 0);
            rpc_value_get_int(r, &n);
            rpc_value_unref(r);
        }
        WCHECK(rpc_sync(1, "release", NULL, -1, &r) == 0);
        rpc_value_unref(r);
        WCHECK(rpc_wait(two[0], 10000) == 0);
        rpc_future_unref(two[0]);
        rpc_future_unref(two[1]);
        /* A failing async call fails its future with the remote text. */
        rpc_value_t *by_zero = rpc_args("ff", 1.0, 0.0);
        rpc_future_t *f = rpc_async(2, "divide", by_zero, -1);
        rpc_value_unref(by_zero);
        WCHECK(rpc_wait(f, 10000) == -1);
        WCHECK(strstr(rpc_future_error(f), "division by zero") != NULL);
        WCHECK(strstr(rpc_future_error(f),
                      "rpc_async to \"w2\" (rank 2) calling \"divide\": remote error") != NULL);
        rpc_future_unref(f);
    }
    WCHECK(rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_async_futures(void **state)
{
    (void)state;
    assert_int_equal(run_world(3, 60, world_futures, NULL), 0);
}

/* ---- many threads waiting for futures at once ---- */

#define WAITERS 6
#define WAITS 300

/* Each waiter adds its own numbers on rank 1 and checks every sum. */
static void *waiter_main(void *arg)
{
    intptr_t me = (intptr_t)arg;
    for (int64_t i = 0; i < WAITS; i++) {
        rpc_value_t *args = rpc_args("ii", (int64_t)me * 1000000, i);
        rpc_future_t *f = rpc_async(1, "add", args, -1);
        rpc_value_unref(args);
        int64_t v = -1;
        int rc = f ? rpc_wait(f, 20000) : -1;
        if (rc == 0)
            rpc_value_get_int(rpc_future_value(f), &v);
        rpc_future_unref(f);
        if (v != me * 1000000 + i) {
            fprintf(stderr, "waiter %d, call %lld: %s\n", (int)me, (long long)i,
                    rc ? error_last() : "wrong sum");
            return (void *)1;
        }
    }
    return NULL;
}

static int world_waiters(int rank, int world, int port, void *arg)
{
    (void)arg;
    WCHECK(start(rank, world, port, 20000) == 0);
    if (rank == 0) {
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
        agent_t *a = agent_acquire();
        WCHECK(a && atomic_load(&a->io_poll_waiters) == 0);
        agent_release(a);
        int64_t v = -1;
        WCHECK(rpc_get_debug_value("num_pending_requests", &v) == 0 && v == 0);
    }
    WCHECK(rpc_shutdown(true, 20000) == 0);
    return 0;
}

static void test_concurrent_future_waiters(void **state)
{
    (void)state;
    assert_int_equal(run_world(2, 60, world_waiters, NULL), 0);
}

/* ---- errors name the peer and the function; the process keeps serving ---- */

static int expect_error(int to, const char *fn, rpc_value_t *args, int64_t timeout,
                        const char *part1, const char *part2)
{
    rpc_value_t *r = (rpc_value_t *)1;
    int rc = rpc_sync(to, fn, args, timeout, &r);
    rpc_value_unref(args);
    if (rc != -1 || r != NULL || !strstr(error_last(), part1) ||
        (part2 && !strstr(error_last(), part2))) {
        fprintf(stderr, "calling %s: rc %d, error \"%s\", expected \"%s\" and \"%s\"\n", fn,
                rc, error_last(), part1, part2 ? part2 : "");
        return -1;
    }
    return 0;
}

static int world_errors(int rank, int world, int port, void *arg)
{
    (void)arg;
    WCHECK(start(rank, world, port, 10000) == 0);
    if (rank == 0) {
        WCHECK(expect_error(1, "divide", rpc_args("ff", 1.0, 0.0), -1,
                            "rpc_sync to \"w1\" (rank 1) calling \"divide\": remote error: "
                            "division by zero", NULL) == 0);
        WCHECK(expect_error(1, "nosuch", NULL, -1,
                            "rpc_sync to \"w1\" (rank 1) calling \"nosuch\"",
                            "unknown function \"nosuch\"") == 0);
        WCHECK(expect_error(1, "add", rpc_args("si", "two", (int64_t)2), -1,
                            "calling \"add\": remote error: argument 0: expected int",
                            NULL) == 0);
        WCHECK(expect_error(1, "add", rpc_args("i", (int64_t)2), -1, "calling \"add\"",
                            "argument 1") == 0);
        WCHECK(expect_error(7, "add", NULL, -1, "no worker with rank 7", NULL) == 0);
        WCHECK(expect_error(1, "bad name", NULL, -1, "bad function name", NULL) == 0);
        WCHECK(expect_error(1, "add", rpc_value_int(3), -1, "arguments must be a list",
                            NULL) == 0);
        /* After all that, both sides still serve. */
        rpc_value_t *r, *args = rpc_args("ii", (int64_t)20, (int64_t)22);
        int64_t v;
        WCHECK(rpc_sync(1, "add", args, -1, &r) == 0);
        WCHECK(rpc_value_get_int(r, &v) == 0 && v == 42);
        rpc_value_unref(r);
        rpc_value_unref(args);
    }
    WCHECK(rpc_shutdown(true, 10000) == 0);
    /* Calls after shutdown fail clearly. */
    rpc_value_t *r;
    WCHECK(rpc_sync(0, "add", NULL, -1, &r) == -1);
    WCHECK(strstr(error_last(), "not running") != NULL);
    WCHECK(rpc_async(0, "add", NULL, -1) == NULL);
    WCHECK(strstr(error_last(), "not running") != NULL);
    return 0;
}

static void test_errors_name_peer_and_function(void **state)
{
    (void)state;
    assert_int_equal(run_world(2, 60, world_errors, NULL), 0);
}

/* ---- timeouts ---- */

static int world_timeouts(int rank, int world, int port, void *arg)
{
    (void)arg;
    /* A default timeout of 400 ms for this world. */
    WCHECK(start(rank, world, port, 400) == 0);
    if (rank == 0) {
        int64_t t0 = world_now_ms();
        WCHECK(expect_error(1, "hold", NULL, 300, "rpc_sync to \"w1\" (rank 1) calling \"hold\"",
                            "timed out after 300 ms") == 0);
        int64_t took = world_now_ms() - t0;
        WCHECK(took >= 300 && took < 2000);
        /* The default applies when the call gives none. */
        t0 = world_now_ms();
        WCHECK(expect_error(1, "hold", NULL, -1, "timed out after 400 ms", NULL) == 0);
        took = world_now_ms() - t0;
        WCHECK(took >= 400 && took < 2000);
        /* Futures time out too, without anyone waiting on them. */
        rpc_future_t *f = rpc_async(1, "hold", NULL, 200);
        WCHECK(rpc_future_wait(f, 5000) == -1);
        WCHECK(strstr(rpc_future_error(f), "timed out after 200 ms") != NULL);
        rpc_future_unref(f);
        /* 0 = no timeout: the call waits for the release. */
        f = rpc_async(1, "hold", NULL, 0);
        rpc_value_t *r;
        int64_t n = 0;
        while (n < 4) {   /* until all four holds arrived at rank 1 */
            WCHECK(rpc_sync(1, "n_held", NULL, -1, &r) == 0);
            rpc_value_get_int(r, &n);
            rpc_value_unref(r);
        }
        WCHECK(!rpc_future_done(f));
        WCHECK(rpc_sync(1, "release", NULL, -1, &r) == 0);
        rpc_value_unref(r);
        WCHECK(rpc_wait(f, 5000) == 0);
        rpc_future_unref(f);
        /* The late answers to the timed-out calls were dropped quietly. */
        rpc_metrics_t m;
        WCHECK(rpc_metrics_get(1, &m) == 0);
        WCHECK(m.errors == 3 && m.in_flight == 0);
    }
    WCHECK(rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_timeouts(void **state)
{
    (void)state;
    assert_int_equal(run_world(2, 60, world_timeouts, NULL), 0);
}

/* ---- a peer that died ---- */

static rpc_future_t *ready, *finished;
static int64_t victim_pid;

static rpc_value_t *h_finished(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    rpc_future_set_value(finished, NULL);
    return rpc_value_none();
}

static rpc_value_t *h_ready(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    rpc_arg_int(args, 0, &victim_pid);
    rpc_future_set_value(ready, NULL);
    return rpc_value_none();
}

static int world_dead_peer(int rank, int world, int port, void *arg)
{
    (void)arg;
    ready = rpc_future_new();
    finished = rpc_future_new();
    WCHECK(rpc_register_inline("ready", h_ready, NULL) == 0);
    WCHECK(rpc_register_inline("finished", h_finished, NULL) == 0);
    WCHECK(start(rank, world, port, 10000) == 0);
    rpc_value_t *r;
    if (rank == 2) {
        rpc_value_t *args = rpc_args("i", (int64_t)getpid());
        WCHECK(rpc_sync(0, "ready", args, -1, &r) == 0);
        for (;;)
            pause();   /* until rank 0 kills it */
    }
    if (rank == 0) {
        /* Kill the peer, then call it. */
        WCHECK(rpc_wait(ready, 10000) == 0);
        WCHECK(kill((pid_t)victim_pid, SIGKILL) == 0);
        int64_t t0 = world_now_ms();
        rpc_value_t *args = rpc_args("ii", (int64_t)1, (int64_t)2);
        int rc = rpc_sync(2, "add", args, 3000, &r);
        rpc_value_unref(args);
        int64_t took = world_now_ms() - t0;
        WCHECK(rc == -1 && took < 3500);
        WCHECK(strstr(error_last(), "rpc_sync to \"w2\" (rank 2) calling \"add\"") != NULL);
        WCHECK(strstr(error_last(), "unreachable") || strstr(error_last(), "timed out"));
        /* Still serving the living. */
        args = rpc_args("ii", (int64_t)1, (int64_t)2);
        WCHECK(rpc_sync(1, "add", args, -1, &r) == 0);
        rpc_value_unref(r);
        rpc_value_unref(args);
        WCHECK(rpc_sync(1, "finished", NULL, -1, &r) == 0);
        rpc_value_unref(r);
    }
    if (rank == 1)
        WCHECK(rpc_wait(finished, 10000) == 0);
    /* Shutdown returns anyway, with an error naming the dead one. */
    int64_t t0 = world_now_ms();
    WCHECK(rpc_shutdown(true, 1000) == -1);
    WCHECK(world_now_ms() - t0 < 3000);
    WCHECK(strstr(error_last(), "\"w2\" (rank 2)") != NULL);
    WCHECK(!rpc_is_running());
    rpc_future_unref(ready);
    rpc_future_unref(finished);
    return 0;
}

static void test_dead_peer(void **state)
{
    (void)state;
    int status[3];
    run_world_status(3, 60, world_dead_peer, NULL, status);
    assert_int_equal(status[0], 0);
    assert_int_equal(status[1], 0);
    assert_int_equal(status[2], -1);   /* killed */
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
