/* SPDX-License-Identifier: MIT */
/*  Metrics per peer (SPEC R12): calls sent and served, errors, bytes each
    way, latency, calls in flight and being served; readable and printable. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

/*  "hold" answers nothing until "release". */
static world_hold_t held = {.answer_none = true};

static zd_value_t *h_metrics_of(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    (void)arg;
    zd_rpc_metrics_t m;
    if (zd_rpc_metrics_get(zd_rpc_call_caller_rank(call), &m, sizeof m) < 0)
        return NULL;
    return zd__rpc_args("iiiii", m.calls_served, m.bytes_received, m.bytes_sent, m.serving,
                        m.calls_sent);
}

#define N_CALLS      50
#define TENSOR_BYTES (1000 * 4)

static int world_metrics(const world_t *w)
{
    WCHECK(zd_rpc_register("echo", world_h_echo, NULL) == 0);
    WCHECK(zd_rpc_register("fail", world_h_fail, "failing") == 0);
    WCHECK(zd_rpc_register_async("hold", world_h_hold, &held) == 0);
    WCHECK(zd_rpc_register_inline("release", world_h_release, &held) == 0);
    WCHECK(zd_rpc_register_inline("metrics_of", h_metrics_of, NULL) == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    if (w->rank == 0) {
        zd_rpc_metrics_t m;
        WCHECK(zd_rpc_metrics_get(1, &m, sizeof m) == 0);
        WCHECK(m.calls_sent == 0 && m.calls_served == 0 && m.in_flight == 0);
        int64_t n = 1000;
        zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, &n, 1);
        zd_value_t *args = zd__rpc_args("t", t), *r;
        zd_tensor_unref(t);
        for (int i = 0; i < N_CALLS; i++) {
            WCHECK(zd_rpc_sync(1, "echo", args, -1, &r) == 0);
            zd_value_unref(r);
        }
        zd_value_unref(args);
        WCHECK(zd_rpc_sync(1, "fail", NULL, -1, &r) == -1);
        WCHECK(zd_rpc_metrics_get(1, &m, sizeof m) == 0);
        WCHECK(m.calls_sent == N_CALLS + 1);
        WCHECK(m.errors == 1);
        WCHECK(m.in_flight == 0);
        WCHECK(m.bytes_sent >= N_CALLS * TENSOR_BYTES);
        WCHECK(m.bytes_received >= N_CALLS * TENSOR_BYTES); /* echoed back */
        WCHECK(m.latency_mean_us > 0 && m.latency_p50_us > 0);
        WCHECK(m.latency_p50_us <= m.latency_p99_us);
        WCHECK(m.latency_mean_us < 1e6);
        /* A call in flight shows on both sides. */
        zd_future_t *f = zd_rpc_async(1, "hold", NULL, -1);
        WCHECK(zd_rpc_metrics_get(1, &m, sizeof m) == 0 && m.in_flight == 1);
        int64_t v = -1;
        WCHECK(zd_rpc_get_debug_value("num_pending_requests", &v) == 0 && v == 1);
        zd_value_t *seen = NULL;
        int64_t serving = 0;
        while (serving == 0) { /* until the hold arrived */
            zd_value_unref(seen);
            WCHECK(zd_rpc_sync(1, "metrics_of", NULL, -1, &seen) == 0);
            WCHECK(zd_rpc_arg_int(seen, 3, &serving) == 0);
        }
        int64_t served, in_bytes, out_bytes, their_sent;
        WCHECK(zd_rpc_arg_int(seen, 0, &served) == 0 && served >= N_CALLS + 1);
        WCHECK(zd_rpc_arg_int(seen, 1, &in_bytes) == 0 && in_bytes >= N_CALLS * TENSOR_BYTES);
        WCHECK(zd_rpc_arg_int(seen, 2, &out_bytes) == 0 && out_bytes >= N_CALLS * TENSOR_BYTES);
        WCHECK(zd_rpc_arg_int(seen, 4, &their_sent) == 0 && their_sent == 0);
        zd_value_unref(seen);
        while (zd_rpc_sync(1, "release", NULL, -1, &r) == 0) {
            int64_t done = 0;
            zd_value_get_int(r, &done);
            zd_value_unref(r);
            if (done)
                break;
        }
        WCHECK(zd_future_wait(f, 10000) == 0);
        zd_future_unref(f);
        WCHECK(zd_rpc_metrics_get(1, &m, sizeof m) == 0 && m.in_flight == 0);
        WCHECK(zd_rpc_get_debug_value("num_pending_requests", &v) == 0 && v == 0);
        /* The agent's other counters (this rank ran no handler on the pool,
           whose threads start on demand). */
        WCHECK(zd_rpc_get_debug_value("thread_pool_size", &v) == 0 && v == o.num_worker_threads);
        WCHECK(zd_rpc_get_debug_value("num_pool_threads", &v) == 0 && v == 0);
        WCHECK(zd_rpc_get_debug_value("thread_pool_size", NULL) == -1);
        WCHECK(zd_rpc_get_debug_value("num_owner_rrefs", &v) == 0 && v == 0);
        WCHECK(zd_rpc_get_debug_value("num_pending_streams", &v) == 0 && v == 0);
        WCHECK(zd_rpc_get_debug_value("no_such_counter", &v) == -1);
        WCHECK(strstr(zd_error_last(), "no_such_counter") != NULL);
        /* All peers together, and errors of the reader. */
        zd_rpc_metrics_t all;
        WCHECK(zd_rpc_metrics_get(-1, &all, sizeof all) == 0 && all.calls_sent >= m.calls_sent);
        WCHECK(zd_rpc_metrics_get(5, &all, sizeof all) == -1);
        WCHECK(strstr(zd_error_last(), "rank 5") != NULL);
        /* Written no further than the caller's size: a newer caller's
           fields beyond this library's struct are zeroed; a size below
           the struct's is refused, the struct left alone. */
        struct {
            zd_rpc_metrics_t m;
            int64_t newer;
        } big = {.newer = 7};
        WCHECK(zd_rpc_metrics_get(1, &big.m, sizeof big) == 0 && big.newer == 0 &&
               big.m.calls_sent >= m.calls_sent);
        all.calls_sent = -7;
        WCHECK(zd_rpc_metrics_get(1, &all, sizeof all - 1) == -1 &&
               zd_error_code() == ZD_ERR_ARGUMENT && all.calls_sent == -7);
        /* Printed: one line per peer plus the total. */
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        zd_rpc_metrics_print(mem);
        fclose(mem);
        WCHECK(strstr(text, "worker0") && strstr(text, "worker1") && strstr(text, "(all)"));
        WCHECK(strstr(text, "p99_us") != NULL);
        WCHECK(strstr(text, "debug: num_pending_requests=0 ") != NULL);
        free(text);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    WCHECK(zd_rpc_metrics_get(0, &(zd_rpc_metrics_t){0}, sizeof(zd_rpc_metrics_t)) == -1);
    WCHECK(zd_rpc_get_debug_info(NULL, 0) == -1);
    return 0;
}

static void test_metrics_per_peer(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_metrics, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_per_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
