/* SPDX-License-Identifier: MIT */
/*  A world of hundreds of processes on one host (issue 28): it forms,
    every rank calls rank 0 and two peers of its own choosing (one with
    zd_rpc_sync, on the thread's own socket, one with zd_rpc_async, on the
    shared one: both connect on first use), and it shuts down gracefully,
    all within a generous bound. $ZDIST_TEST_WORLD_N changes the size
    (256) for a run by hand. world.h's harness holds 16 processes: this
    one forks its own, each leaving through exit() like the harness's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"

#define WORLD_N_DEFAULT 256
#define WORLD_N_MAX     1024
#define BOUND_S         300 /* the whole run, times world_time_scale() */

/* Answers with its own rank times 1000 plus the argument. */
static zd_value_t *whoami(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t x;
    return ZD_UNPACK(args, &x) < 0 ? NULL : zd_value_int(zd_rpc_rank() * 1000 + x);
}

static int call_sync(int to, int64_t x)
{
    zd_value_t *args = ZD_ARGS(x);
    zd_value_t *r = NULL;
    int64_t v = -1;
    int rc = zd_rpc_sync(to, "whoami", args, ZD_TIMEOUT_DEFAULT, &r);
    zd_value_unref(args);
    if (rc == 0)
        rc = zd_value_get_int(r, &v);
    zd_value_unref(r);
    if (rc == 0 && v != (int64_t)to * 1000 + x)
        rc = zd_error_set("rank %d answered %lld", to, (long long)v);
    return rc;
}

static int call_async(int to, int64_t x)
{
    zd_value_t *args = ZD_ARGS(x);
    zd_future_t *f = zd_rpc_async(to, "whoami", args, ZD_TIMEOUT_DEFAULT);
    zd_value_unref(args);
    if (!f)
        return -1;
    int64_t v = -1;
    int rc =
        zd_future_wait(f, ZD_TIMEOUT_DEFAULT) < 0 ? -1 : zd_value_get_int(zd_future_value(f), &v);
    zd_future_unref(f);
    if (rc == 0 && v != (int64_t)to * 1000 + x)
        rc = zd_error_set("rank %d answered %lld", to, (long long)v);
    return rc;
}

static int rank_main(int rank, int n, int port)
{
    world_t w = {.world_size = n, .rank = rank, .port = port};
    WTRY(zd_rpc_register("whoami", whoami, NULL));
    zd_rpc_options_t o = world_rpc_options(port);
    o.init_timeout_ms = world_scaled_ms(BOUND_S * 1000);
    o.rpc_timeout_ms = world_scaled_ms(120000);
    char name[32];
    snprintf(name, sizeof name, "w%d", rank);
    WTRY(zd_rpc_init(name, rank, n, &o));
    unsigned seed = (unsigned)rank * 2654435761u + 12345;
    int p1 = (int)(rand_r(&seed) % (unsigned)n), p2 = (int)(rand_r(&seed) % (unsigned)n);
    if (call_sync(0, rank) < 0 || call_sync(p1, rank) < 0 || call_async(p2, rank) < 0)
        return world_fail(&w, "calls to 0, %d, %d: %s", p1, p2, zd_error_last()) < 0;
    WTRY(zd_rpc_shutdown(true, world_scaled_ms(BOUND_S * 1000)));
    return 0;
}

static void test_world_of_hundreds(void **state)
{
    (void)state;
    int n = WORLD_N_DEFAULT;
    const char *e = getenv("ZDIST_TEST_WORLD_N");
    if (e && atoi(e) >= 2 && atoi(e) <= WORLD_N_MAX)
        n = atoi(e);
    int port = world_free_port();
    assert_true(port > 0);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    assert_non_null(pids);
    fflush(NULL);
    int64_t t0 = world_now_ms();
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        assert_true(pids[r] >= 0);
        if (pids[r] == 0) {
            free(pids); /* the parent's: LeakSanitizer checks each child at exit */
            exit(rank_main(r, n, port));
        }
    }
    int64_t until = t0 + world_scaled_ms(BOUND_S * 1000);
    int left = n, failed = 0;
    while (left > 0 && world_now_ms() < until) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            struct timespec ts = {0, 20 * 1000000};
            nanosleep(&ts, NULL); /* the parent polls its children's exits */
            continue;
        }
        for (int r = 0; r < n; r++)
            if (pids[r] == pid) {
                pids[r] = 0;
                left--;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                    fprintf(stderr, "rank %d exited with status 0x%x\n", r, status);
                    failed++;
                }
            }
    }
    for (int r = 0; r < n; r++)
        if (pids[r] > 0) {
            fprintf(stderr, "rank %d still running after %d s: killed\n", r,
                    (int)(world_scaled_ms(BOUND_S * 1000) / 1000));
            kill(pids[r], SIGKILL);
            waitpid(pids[r], NULL, 0);
        }
    fprintf(stderr, "world of %d: %d failed, %d timed out, %.1f s\n", n, failed, left,
            (double)(world_now_ms() - t0) / 1000.0);
    free(pids);
    assert_int_equal(failed, 0);
    assert_int_equal(left, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_of_hundreds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
