/* SPDX-License-Identifier: MIT */
/*  Shutdown (SPEC R8): graceful waits for every worker and drains calls and
    RRef deletions, keeps serving meanwhile; not graceful stops at once and
    fails what is pending; a worker that never comes makes graceful shutdown
    fail after its timeout, naming it. Real processes over loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

static zd_value_t *h_make(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(42);
}

/*  "slow" answers 99 when "release_slow" comes; slow.arrived says it is here. */
static world_hold_t slow = {.answer = 99};

static zd_value_t *h_has_arrived(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(zd_future_done(slow.arrived));
}

/*  Entering shutdown: rank 0 counts the others. */
static atomic_int entered;
static zd_future_t *all_entered;
static int expected_entries;

static zd_value_t *h_entering(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    if (atomic_fetch_add(&entered, 1) + 1 == expected_entries)
        zd_future_set_value(all_entered, NULL);
    return zd_value_none();
}

static zd_rref_t *kept;

static zd_value_t *h_keep(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rref_t *r;
    if (zd_rpc_arg_rref(args, 0, &r) < 0)
        return NULL;
    kept = zd_rref_ref(r);
    return zd_value_none();
}

static int start(int rank, int world, int port)
{
    slow.arrived = zd_future_new();
    all_entered = zd_future_new();
    expected_entries = world - 1;
    if (zd_rpc_register("add", world_h_add, NULL) < 0 ||
        zd_rpc_register("make", h_make, NULL) < 0 ||
        zd_rpc_register_async("slow", world_h_hold, &slow) < 0 ||
        zd_rpc_register_inline("release_slow", world_h_release, &slow) < 0 ||
        zd_rpc_register_inline("entering", h_entering, NULL) < 0 ||
        zd_rpc_register_inline("has_arrived", h_has_arrived, NULL) < 0 ||
        zd_rpc_register("keep", h_keep, NULL) < 0)
        return -1;
    zd_rpc_options_t o = world_rpc_options(port);
    return zd_rpc_init(NULL, rank, world, &o);
}

static void finish(void)
{
    world_hold_release(&slow);
    zd_future_unref(slow.arrived);
    zd_future_unref(all_entered);
}

/*  ---- graceful: waits for all, serves meanwhile, drains ---- */

static void *releaser(void *arg)
{
    (void)arg;
    zd_value_t *r;
    int64_t done = 0;
    while (!done && zd_rpc_sync(1, "release_slow", NULL, -1, &r) == 0) {
        zd_value_get_int(r, &done);
        zd_value_unref(r);
    }
    return NULL;
}

static int world_graceful(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port) == 0);
    zd_value_t *r;
    if (w->rank != 0) {
        WCHECK(zd_rpc_sync(0, "entering", NULL, -1, &r) == 0);
        zd_value_unref(r);
        if (w->rank == 2) {
            /* A user RRef that nobody releases before shutdown. */
            zd_rref_t *leak = zd_rpc_remote(1, "make", NULL, -1);
            WCHECK(zd_rref_to_here(leak, -1, &r) == 0);
            zd_value_unref(r);
            WCHECK(zd_rpc_shutdown(true, 20000) == 0);
            zd_rref_unref(leak); /* after shutdown: released quietly */
        } else {
            WCHECK(zd_rpc_shutdown(true, 20000) == 0);
            WCHECK(zd_rpc_debug_owner_rrefs_leaked() == 1); /* rank 2's */
        }
        finish();
        return 0;
    }
    /* Everyone else is inside zd_rpc_shutdown now: they still serve. */
    WCHECK(zd_future_wait(all_entered, 20000) == 0);
    zd_value_t *args = zd__rpc_args("ii", (int64_t)1, (int64_t)2);
    for (int to = 1; to < w->world_size; to++) {
        WCHECK(zd_rpc_sync(to, "add", args, -1, &r) == 0);
        zd_value_unref(r);
    }
    zd_value_unref(args);
    /* An RRef released right before shutdown: the deletion is drained. */
    zd_rref_t *rr = zd_rpc_remote(1, "make", NULL, -1);
    WCHECK(zd_rref_to_here(rr, -1, &r) == 0);
    zd_value_unref(r);
    zd_rref_unref(rr);
    /* A call still running when shutdown starts completes before it ends:
       another thread releases it while this one is in zd_rpc_shutdown. */
    zd_future_t *f = zd_rpc_async(1, "slow", NULL, -1);
    pthread_t t;
    WCHECK(pthread_create(&t, NULL, releaser, NULL) == 0);
    WCHECK(zd_rpc_shutdown(true, 20000) == 0);
    pthread_join(t, NULL);
    WCHECK(zd_future_done(f));
    int64_t v;
    WCHECK(zd_value_get_int(zd_future_value(f), &v) == 0 && v == 99);
    zd_future_unref(f);
    WCHECK(zd_rpc_debug_owner_rrefs_leaked() == 0);
    finish();
    return 0;
}

static void test_graceful_waits_serves_and_drains(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 60, world_graceful, NULL), 0);
}

/*  ---- not graceful: stops now ---- */

static void *blocked_caller(void *arg)
{
    zd_value_t *r = NULL;
    int *ok = arg;
    *ok = zd_rpc_sync(1, "slow", NULL, 0, &r) == -1 && strstr(zd_error_last(), "RPC shut down");
    zd_value_unref(r);
    return NULL;
}

static int world_abrupt(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port) == 0);
    if (w->rank == 1) {
        /* Serves until rank 0 is gone, then stops too. */
        WCHECK(zd_future_wait(slow.arrived, 10000) == 0);
        zd_value_t *r;
        int rc = zd_rpc_sync(0, "slow", NULL, 0, &r); /* never answered */
        WCHECK(rc == -1 &&
               (strstr(zd_error_last(), "peer \"worker0\" (rank 0) lost") ||
                strstr(zd_error_last(), "RPC shut down")));
        WCHECK(zd_rpc_shutdown(false, 0) == 0);
        finish(); /* completes our held call: freed without an answer */
        return 0;
    }
    int ok = 0;
    pthread_t t;
    WCHECK(pthread_create(&t, NULL, blocked_caller, &ok) == 0);
    zd_value_t *r;
    int64_t n = 0;
    while (n == 0) { /* until the blocked call is at rank 1 */
        WCHECK(zd_rpc_sync(1, "has_arrived", NULL, -1, &r) == 0);
        zd_value_get_int(r, &n);
        zd_value_unref(r);
    }
    /* Rank 1 calls us only once its init is over: a non-graceful stop
       drops what the network has not delivered yet, its init's answer too. */
    WCHECK(zd_future_wait(slow.arrived, 10000) == 0);
    zd_future_t *f = zd_rpc_async_take(1, "add", ZD_ARGS(1, 2), -1);
    int64_t t0 = world_now_ms();
    WCHECK(zd_rpc_shutdown(false, 0) == 0);
    WCHECK(world_now_ms() - t0 < 2000);
    pthread_join(t, NULL);
    WCHECK(zd_future_wait(f, 1000) == 0 || strstr(zd_future_error(f), "shut down"));
    zd_future_unref(f);
    WCHECK(ok);
    finish();
    return 0;
}

static void test_not_graceful_stops_now(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_abrupt, NULL), 0);
}

/*  ---- a worker that never arrives ---- */

static int world_missing(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port) == 0);
    zd_value_t *r;
    if (w->rank == 1) {
        /* Busy (waiting for an answer that never comes) until rank 0 leaves. */
        WCHECK(zd_rpc_sync(0, "slow", NULL, 0, &r) == -1);
        WCHECK(strstr(zd_error_last(), "peer \"worker0\" (rank 0) lost") != NULL);
        WCHECK(zd_rpc_shutdown(true, 500) == -1); /* rank 0 is gone */
        finish();
        return 0;
    }
    WCHECK(zd_future_wait(slow.arrived, 10000) == 0);
    int64_t t0 = world_now_ms();
    WCHECK(zd_rpc_shutdown(true, 500) == -1);
    int64_t took = world_now_ms() - t0;
    WCHECK(took >= 300 && took < 3000);
    WCHECK(strstr(zd_error_last(), "missing \"worker1\" (rank 1)") != NULL);
    WCHECK(!zd_rpc_is_running());
    finish();
    return 0;
}

static void test_missing_worker_times_out(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_missing, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_graceful_waits_serves_and_drains),
        cmocka_unit_test(test_not_graceful_stops_now),
        cmocka_unit_test(test_missing_worker_times_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
