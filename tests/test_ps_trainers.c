/* SPDX-License-Identifier: MIT */
/*  The trainers' registry (ps.h) in worlds of real processes, rank 0 its
    host:
    - three trainers: one fast, one that says it failed (its text, with a
      control byte, comes back printable), one killed. The fast one's gate
      (bound 1) holds it until the killed one is declared lost, not
      sooner; the host's wait ends once each is finished, failed or lost;
      the shared result is computed once, from the fast trainer's request
      and every trainer's batch count, and reaches it; the events and the
      throughput add up;
    - refusals: a second registry in a process, a call from a rank that is
      not a trainer, a gate with a negative bound; a wait that times out
      while a trainer is at work; no shared_result gives none;
    - the shared result started by a loss (the last trainer killed while
      the other waits for it): its error reaches the waiting trainer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>

#include "tests/support/world.h"

#define FAST_BATCHES 6
#define SAMPLES      8

/*  The host's record: events by kind, and the order of two of them. */
static atomic_int events[ZD_PS_TRAINER_WAITING + 1];
static atomic_int seq, lost3_at, fast_batch3_at, shared_calls;
static zd_ps_trainers_t *reg;

static void on_event(void *arg, const zd_ps_trainer_info_t *info, const char *name,
                     zd_ps_trainer_event_t ev)
{
    (void)arg, (void)name;
    atomic_fetch_add(&events[ev], 1);
    if (ev == ZD_PS_TRAINER_LOST && info->rank == 3)
        atomic_store(&lost3_at, atomic_fetch_add(&seq, 1) + 1);
}

/*  request * 1000 + every trainer's batches. */
static zd_value_t *shared(void *arg, const zd_value_t *request)
{
    (void)arg;
    atomic_fetch_add(&shared_calls, 1);
    int64_t q, sum = 0;
    if (zd_value_get_int(request, &q) < 0)
        return NULL;
    for (int r = 1; r < 4; r++) {
        zd_ps_trainer_info_t info;
        if (zd_ps_trainers_get(reg, r, &info) < 0)
            return NULL;
        sum += info.batches;
    }
    return zd_value_int(q * 1000 + sum);
}

/*  "batch"(done): the host serves a trainer's batch. */
static zd_value_t *serve_batch(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t done;
    if (ZD_UNPACK(args, &done) < 0)
        return NULL;
    int src = zd_rpc_call_caller_rank(call);
    if (src == 1 && done == 3)
        atomic_store(&fast_batch3_at, atomic_fetch_add(&seq, 1) + 1);
    zd_ps_trainers_note_batch(reg, src, SAMPLES);
    return zd_value_none();
}

/*  Gate, then one batch on the host, for batches [0, n). */
static int run_batches(int64_t n)
{
    for (int64_t b = 0; b < n; b++) {
        int64_t lead;
        if (zd_ps_trainer_gate(0, b, 1, world_scaled_ms(30000), &lead) < 0 || lead > 1 ||
            zd_rpc_sync_take(0, "batch", ZD_ARGS(b), ZD_TIMEOUT_DEFAULT, NULL) < 0)
            return -1;
    }
    return 0;
}

static int host(const world_t *w)
{
    zd_ps_trainers_options_t o = zd_ps_trainers_options_default();
    o.on_event = on_event;
    o.shared_result = shared;
    WCHECK((reg = zd_ps_trainers_new(&o)) != NULL);
    WTRY(zd_rpc_register("batch", serve_batch, NULL));
    WTRY(world_join(w));
    /* no limit: rank 1 cannot finish before rank 3 is lost (the world's
       timeout bounds the test) */
    WTRY(zd_ps_trainers_wait(reg, 500, ZD_TIMEOUT_NONE));
    zd_ps_trainer_info_t fast, failed, killed;
    WTRY(zd_ps_trainers_get(reg, 1, &fast));
    WTRY(zd_ps_trainers_get(reg, 2, &failed));
    WTRY(zd_ps_trainers_get(reg, 3, &killed));
    WCHECK(fast.started && fast.finished && !fast.failed && !fast.lost);
    WCHECK(fast.batches == FAST_BATCHES);
    WCHECK(failed.failed && !failed.finished && failed.failed_at == 2 && failed.batches == 2);
    WCHECK(strcmp(failed.why, "boom? at batch 2") == 0);
    WCHECK(killed.lost && !killed.finished && killed.batches == 2);
    /* the gate held the fast trainer until the killed one was lost */
    WCHECK(atomic_load(&lost3_at) > 0 && atomic_load(&fast_batch3_at) > atomic_load(&lost3_at));
    WCHECK(atomic_load(&events[ZD_PS_TRAINER_STARTED]) == 3);
    WCHECK(atomic_load(&events[ZD_PS_TRAINER_FINISHED]) == 1);
    WCHECK(atomic_load(&events[ZD_PS_TRAINER_FAILED]) == 1);
    WCHECK(atomic_load(&events[ZD_PS_TRAINER_LOST]) == 1);
    int64_t samples;
    double seconds;
    zd_ps_trainers_throughput(reg, &samples, &seconds);
    WCHECK(samples == (FAST_BATCHES + 2 + 2) * SAMPLES && seconds > 0);
    /* a member died: the shutdown may say so */
    zd_rpc_shutdown(true, world_scaled_ms(30000));
    WCHECK(atomic_load(&events[ZD_PS_TRAINER_WAITING]) == 1);
    WCHECK(atomic_load(&shared_calls) == 1);
    zd_ps_trainers_free(reg);
    return 0;
}

static int trainer(const world_t *w)
{
    WTRY(world_join(w));
    int rc = 0;
    WTRY(zd_ps_trainer_started(0, ZD_TIMEOUT_DEFAULT));
    if (w->rank == 1) {
        zd_value_t *res = NULL;
        int64_t v = 0;
        WTRY(run_batches(FAST_BATCHES));
        WTRY(zd_ps_trainer_finished(0, ZD_TIMEOUT_DEFAULT));
        zd_value_t *req = zd_value_int(7);
        rc = zd_ps_trainer_wait_all(0, req, world_scaled_ms(30000), &res);
        zd_value_unref(req);
        WCHECK(rc == 0 && zd_value_get_int(res, &v) == 0);
        zd_value_unref(res);
        WCHECK(v == 7000 + FAST_BATCHES + 2 + 2);
    } else if (w->rank == 2) {
        WTRY(run_batches(2));
        WTRY(zd_ps_trainer_failed(0, 2, "boom\x01 at batch 2", ZD_TIMEOUT_DEFAULT));
    } else {
        WTRY(run_batches(2));
        raise(SIGKILL);
    }
    zd_rpc_shutdown(true, world_scaled_ms(30000));
    return rc;
}

static int book_world(const world_t *w)
{
    return w->rank == 0 ? host(w) : trainer(w);
}

static void test_registry_follows_trainers(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 4,
                         .fn = book_world,
                         .own_init = true,
                         .timeout_s = 90,
                         .expect_exit = {0, 0, 0, 128 + SIGKILL}};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- refusals ---- */

static atomic_int may_finish;

static zd_value_t *serve_go(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(atomic_load(&may_finish));
}

static int refusals(const world_t *w)
{
    if (w->rank == 1) {
        WTRY(world_join(w));
        /* a negative bound */
        WCHECK(zd_ps_trainer_gate(0, 0, -1, ZD_TIMEOUT_DEFAULT, NULL) < 0);
        WCHECK(strstr(zd_error_last(), "bound -1") != NULL);
        int64_t go = 0;
        while (go == 0) {
            zd_value_t *r = NULL;
            WTRY(zd_rpc_sync_take(0, "go", ZD_ARGS(), ZD_TIMEOUT_DEFAULT, &r));
            WTRY(zd_value_get_int(r, &go));
            zd_value_unref(r);
            if (go == 0)
                nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
        WTRY(zd_ps_trainer_finished(0, ZD_TIMEOUT_DEFAULT));
        zd_value_t *res = NULL;
        WTRY(zd_ps_trainer_wait_all(0, NULL, ZD_TIMEOUT_DEFAULT, &res));
        WCHECK(zd_value_kind(res) == ZD_VALUE_NONE);
        zd_value_unref(res);
        WTRY(zd_rpc_shutdown(true, world_scaled_ms(30000)));
        return 0;
    }
    zd_ps_trainers_t *r = zd_ps_trainers_new(NULL);
    WCHECK(r != NULL);
    WCHECK(zd_ps_trainers_new(NULL) == NULL && zd_error_code() == ZD_ERR_ARGUMENT);
    zd_ps_trainers_options_t bad = zd_ps_trainers_options_default();
    bad.size = 4;
    WTRY(zd_rpc_register("go", serve_go, NULL));
    WTRY(world_join(w));
    /* rank 0 is a server here, not a trainer */
    WCHECK(zd_ps_trainer_started(0, ZD_TIMEOUT_DEFAULT) < 0);
    WCHECK(strstr(zd_error_last(), "rank 0 is not a trainer") != NULL);
    zd_ps_trainer_info_t info;
    WCHECK(zd_ps_trainers_get(r, 0, &info) < 0 && zd_error_code() == ZD_ERR_ARGUMENT);
    /* the trainer waits for "go": still at work */
    WCHECK(zd_ps_trainers_wait(r, 0, 200) < 0 && zd_error_code() == ZD_ERR_TIMEOUT);
    atomic_store(&may_finish, 1);
    WTRY(zd_ps_trainers_wait(r, 0, world_scaled_ms(30000)));
    WTRY(zd_ps_trainers_get(r, 1, &info));
    WCHECK(info.finished && !info.started && info.batches == 0);
    WTRY(zd_rpc_shutdown(true, world_scaled_ms(30000)));
    zd_ps_trainers_free(r);
    /* a registry again once the last is gone; old-sized options refused */
    WCHECK(zd_ps_trainers_new(&bad) == NULL && zd_error_code() == ZD_ERR_ARGUMENT);
    WCHECK((r = zd_ps_trainers_new(NULL)) != NULL);
    zd_ps_trainers_free(r);
    return 0;
}

static void test_refusals(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2, .fn = refusals, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- the shared result, started by a loss ---- */

static zd_value_t *no_result(void *arg, const zd_value_t *request)
{
    (void)arg, (void)request;
    atomic_fetch_add(&shared_calls, 1);
    zd_error_set("no result: the test's");
    return NULL;
}

/*  "waiting"(): how many trainers have asked for the shared result. */
static zd_value_t *serve_waiting(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(atomic_load(&events[ZD_PS_TRAINER_WAITING]));
}

static int loss_world(const world_t *w)
{
    if (w->rank == 0) {
        zd_ps_trainers_options_t o = zd_ps_trainers_options_default();
        o.on_event = on_event;
        o.shared_result = no_result;
        WCHECK((reg = zd_ps_trainers_new(&o)) != NULL);
        WTRY(zd_rpc_register("waiting", serve_waiting, NULL));
        WTRY(world_join(w));
        WTRY(zd_ps_trainers_wait(reg, 0, ZD_TIMEOUT_NONE));
        zd_rpc_shutdown(true, world_scaled_ms(30000));
        WCHECK(atomic_load(&shared_calls) == 1);
        zd_ps_trainers_free(reg);
        return 0;
    }
    WTRY(world_join(w));
    if (w->rank == 2) { /* dies once rank 1 waits for the result */
        for (int64_t n = 0; n == 0;) {
            zd_value_t *r = NULL;
            WTRY(zd_rpc_sync_take(0, "waiting", ZD_ARGS(), ZD_TIMEOUT_DEFAULT, &r));
            WTRY(zd_value_get_int(r, &n));
            zd_value_unref(r);
            if (n == 0)
                nanosleep(&(struct timespec){0, 10000000}, NULL);
        }
        raise(SIGKILL);
    }
    WTRY(zd_ps_trainer_finished(0, ZD_TIMEOUT_DEFAULT));
    zd_value_t *res = NULL;
    WCHECK(zd_ps_trainer_wait_all(0, NULL, world_scaled_ms(30000), &res) < 0 && res == NULL);
    WCHECK(zd_error_code() == ZD_ERR_REMOTE);
    WCHECK(strstr(zd_error_last(), "zd_ps_trainer_wait_all") != NULL);
    WCHECK(strstr(zd_error_last(), "no result: the test's") != NULL);
    zd_rpc_shutdown(true, world_scaled_ms(30000));
    return 0;
}

static void test_loss_completes_the_shared_result(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3,
                         .fn = loss_world,
                         .own_init = true,
                         .timeout_s = 60,
                         .expect_exit = {0, 0, 128 + SIGKILL}};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_follows_trainers),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_loss_completes_the_shared_result),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
