/* SPDX-License-Identifier: MIT */
/*  Nested calls never deadlock (SPEC R11): chains of calls through four
    processes with two worker threads each and 64 concurrent callers, both
    with handlers that block in zd_rpc_sync and with async handlers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define WORLD   4
#define CALLERS 64
#define DEPTH   7 /* 8 handlers: around the ring twice, back through the caller */

/*  Sum of the ranks of the handlers a chain of `depth` starting at rank
    `first` runs on. */
static int64_t expected_sum(int first, int depth)
{
    int64_t s = 0;
    for (int k = 0; k <= depth; k++)
        s += (first + k) % WORLD;
    return s;
}

/*  Blocking: holds its pool thread while the next hop runs. */
static zd_value_t *h_chain(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t depth;
    if (zd_rpc_arg_int(args, 0, &depth) < 0)
        return NULL;
    if (depth == 0)
        return zd_value_int(zd_rpc_rank());
    zd_value_t *next = zd__rpc_args("i", depth - 1), *r = NULL;
    int rc = zd_rpc_sync((zd_rpc_rank() + 1) % WORLD, "chain", next, -1, &r);
    zd_value_unref(next);
    int64_t sum;
    if (rc < 0 || zd_value_get_int(r, &sum) < 0) {
        zd_value_unref(r);
        return NULL;
    }
    zd_value_unref(r);
    return zd_value_int(sum + zd_rpc_rank());
}

/*  Async: returns at once; the reply goes out when the next hop answers. */
static void chain_next_done(zd_future_t *f, void *arg)
{
    zd_future_t *out = arg;
    int64_t sum;
    if (zd_future_value(f) && zd_value_get_int(zd_future_value(f), &sum) == 0) {
        zd_value_t *v = zd_value_int(sum + zd_rpc_rank());
        zd_future_set_value(out, v);
        zd_value_unref(v);
    } else {
        zd_future_set_error(out, "next hop: %s", zd_future_error(f));
    }
    zd_future_unref(out);
}

static zd_future_t *h_chain_async(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t depth;
    if (zd_rpc_arg_int(args, 0, &depth) < 0)
        return NULL;
    zd_future_t *out = zd_future_new();
    if (depth == 0) {
        zd_value_t *v = zd_value_int(zd_rpc_rank());
        zd_future_set_value(out, v);
        zd_value_unref(v);
        return out;
    }
    zd_value_t *next = zd__rpc_args("i", depth - 1);
    zd_future_t *inner = zd_rpc_async((zd_rpc_rank() + 1) % WORLD, "chain_async", next, -1);
    zd_value_unref(next);
    if (!inner) {
        zd_future_unref(out);
        return NULL;
    }
    zd_future_then(inner, chain_next_done, zd_future_ref(out));
    zd_future_unref(inner);
    return out;
}

/*  An inline handler must not wait: zd_rpc_sync refuses on the I/O thread. */
static zd_value_t *h_bad_inline(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    zd_value_t *r;
    if (zd_rpc_sync(0, "chain", NULL, -1, &r) == 0) {
        zd_value_unref(r);
        return zd_value_string("zd_rpc_sync worked on the I/O thread");
    }
    return zd_value_string(zd_error_last());
}

typedef struct {
    const char *fn;
    int index;
    int failed;
} caller_t;

static void *caller_main(void *arg)
{
    caller_t *c = arg;
    int first = 1 + c->index % (WORLD - 1);
    zd_value_t *args = zd__rpc_args("i", (int64_t)DEPTH), *r = NULL;
    int64_t sum = -1;
    if (zd_rpc_sync(first, c->fn, args, world_scaled_ms(30000), &r) < 0 ||
        zd_value_get_int(r, &sum) < 0 || sum != expected_sum(first, DEPTH)) {
        fprintf(stderr, "caller %d via %s: sum %lld, expected %lld (%s)\n", c->index, c->fn,
                (long long)sum, (long long)expected_sum(first, DEPTH), zd_error_last());
        c->failed = 1;
    }
    zd_value_unref(r);
    zd_value_unref(args);
    return NULL;
}

static int run_callers(const char *fn)
{
    pthread_t threads[CALLERS];
    caller_t callers[CALLERS];
    for (int i = 0; i < CALLERS; i++) {
        callers[i] = (caller_t){fn, i, 0};
        if (pthread_create(&threads[i], NULL, caller_main, &callers[i]) != 0)
            return -1;
    }
    int failed = 0;
    for (int i = 0; i < CALLERS; i++) {
        pthread_join(threads[i], NULL);
        failed += callers[i].failed;
    }
    return failed ? -1 : 0;
}

static int world_nested(const world_t *w)
{
    WCHECK(zd_rpc_register("chain", h_chain, NULL) == 0);
    WCHECK(zd_rpc_register_async("chain_async", h_chain_async, NULL) == 0);
    WCHECK(zd_rpc_register_inline("bad_inline", h_bad_inline, NULL) == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.num_worker_threads = 2;
    o.rpc_timeout_ms = world_scaled_ms(30000);
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    if (w->rank == 0) {
        WCHECK(run_callers("chain_async") == 0);
        WCHECK(run_callers("chain") == 0);
        zd_value_t *r;
        const char *s;
        WCHECK(zd_rpc_sync(1, "bad_inline", NULL, -1, &r) == 0);
        WCHECK(zd_value_get_string(r, &s) == 0);
        WCHECK(strstr(s, "I/O thread") != NULL);
        zd_value_unref(r);
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(30000)) == 0);
    return 0;
}

static void test_nested_chains_through_four_processes(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(WORLD, 120, world_nested, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_chains_through_four_processes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
