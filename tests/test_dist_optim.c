/* SPDX-License-Identifier: MIT */
/*  DistributedOptimizer (SPEC O2): one local optimizer per owner, stepped
    with a context's gradients; concurrent trainers; errors naming owners;
    the owners free their optimizers once the client lets go of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/dist_optim.h>
#include <zdist/rpc.h>
#include "tests/support/dist_fixtures.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define N  4
#define LR 0.125f /* a power of two keeps the expected values exact */

static zd_tensor_t *w_param;

static float w0(int rank, int i)
{
    return (float)rank + 1.0f + 0.5f * (float)i;
}

static zd_value_t *fn_mul_w(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    /* As a parameter server's forward: never while a step writes w. */
    zd_dist_optim_read_lock();
    zd_value_t *v = dist_mul_by(args, w_param);
    zd_dist_optim_read_unlock();
    return v;
}

/*  [RRef(w)], as the tutorial's get_param_rrefs; arg: which parameter
    (NULL: w). */
static zd_value_t *fn_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args;
    zd_value_t *tv = zd_value_tensor(arg ? *(zd_tensor_t **)arg : w_param);
    zd_rref_t *r = zd_rref_new(tv);
    zd_value_unref(tv);
    zd_value_t *list = zd_value_list(1);
    zd_list_append(list, zd_value_rref(r));
    zd_rref_unref(r);
    return list;
}

static zd_value_t *fn_get_w(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_tensor_t *copy = zd_tensor_detach_copy(w_param);
    zd_value_t *v = zd_value_tensor(copy);
    zd_tensor_unref(copy);
    return v;
}

/*  Values this process owns for RRefs (the local optimizers among them). */
static zd_value_t *fn_owned(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(zd_rpc_debug_owner_rrefs());
}

static zd_value_t *fn_drain(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_rref_drain(10000) < 0 ? NULL : zd_value_none();
}

static int setup(const world_t *w)
{
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = w0(w->rank, i);
    int64_t n = N;
    w_param = zd_tensor_from_data(ZD_FLOAT32, &n, 1, v);
    zd_tensor_set_requires_grad(w_param, true);
    if (zd_dist_optim_init() < 0)
        return -1;
    return zd_rpc_register("mul_w", fn_mul_w, NULL) |
        zd_rpc_register("param_rrefs", fn_param_rrefs, NULL) |
        zd_rpc_register("get_w", fn_get_w, NULL) | zd_rpc_register("owned", fn_owned, NULL) |
        zd_rpc_register("drain", fn_drain, NULL);
}

static zd_rref_t *rref_by(int rank, const char *fn)
{
    zd_value_t *r;
    zd_rref_t *ref = NULL;
    if (zd_rpc_sync(rank, fn, NULL, -1, &r) == 0) {
        if (zd_rpc_arg_rref(r, 0, &ref) == 0)
            zd_rref_ref(ref);
        zd_value_unref(r);
    }
    return ref;
}

static zd_rref_t *param_rref_of(int rank)
{
    return rref_by(rank, "param_rrefs");
}

/*  One iteration: loss = sum over owners k of sum(x * w_k), so each w_k's
    gradient is x. */
static int iteration(zd_dist_optim_t *opt, int owners_from, int owners_to, const float *xv)
{
    int64_t ctx, n = N;
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        return -1;
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, &n, 1, xv), *total = NULL;
    int rc = 0;
    for (int k = owners_from; rc == 0 && k <= owners_to; k++) {
        zd_value_t *a = zd__rpc_args("t", x), *r;
        zd_tensor_t *y, *s, *t2;
        if (zd_rpc_sync(k, "mul_w", a, -1, &r) < 0 || zd_value_get_tensor(r, &y) < 0 ||
            zd_tensor_sum(y, &s) < 0)
            rc = -1;
        zd_value_unref(a);
        if (rc == 0 && total) {
            rc = zd_tensor_add(total, s, &t2);
            zd_tensor_unref(total);
            zd_tensor_unref(s);
            total = t2;
        } else if (rc == 0) {
            total = s;
        }
        if (rc == 0)
            zd_value_unref(r);
    }
    if (rc == 0)
        rc = zd_dist_autograd_backward(ctx, &total, 1, false);
    if (rc == 0)
        rc = zd_dist_optim_step(opt, ctx);
    zd_tensor_unref(total);
    zd_tensor_unref(x);
    if (zd_dist_autograd_context_end(ctx, -1) < 0)
        rc = -1;
    return rc;
}

static int check_w(const world_t *w, int rank, const float *expect)
{
    zd_value_t *r;
    zd_tensor_t *t;
    if (zd_rpc_sync(rank, "get_w", NULL, -1, &r) < 0 || zd_value_get_tensor(r, &t) < 0)
        return world_fail(w, "get_w: %s", zd_error_last());
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= fabsf(zd_tensor_data(t)[i] - expect[i]) < 1e-5f;
    if (!ok)
        world_fail(w, "w on rank %d: %g %g %g %g, expected %g %g %g %g", rank, zd_tensor_data(t)[0],
                   zd_tensor_data(t)[1], zd_tensor_data(t)[2], zd_tensor_data(t)[3], expect[0],
                   expect[1], expect[2], expect[3]);
    zd_value_unref(r);
    return ok ? 0 : -1;
}

/*  The number of RRef values each of ranks 0..2 owns, once no RRef
    message is in flight anywhere (twice round: a release may wait for
    another). 0, or -1. */
static int owned_counts(int64_t *owned)
{
    zd_value_t *r;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 3; k++) {
            if (zd_rpc_sync(k, "drain", NULL, -1, &r) < 0)
                return -1;
            zd_value_unref(r);
        }
    for (int k = 0; k < 3; k++) {
        if (zd_rpc_sync(k, "owned", NULL, -1, &r) < 0)
            return -1;
        int rc = zd_value_get_int(r, &owned[k]);
        zd_value_unref(r);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/*  Rank 0 owns a parameter too (the local path); ranks 1 and 2 remote. */
static int basic_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    zd_rref_t *refs[3] = {param_rref_of(0), param_rref_of(1), param_rref_of(2)};
    if (!refs[0] || !refs[1] || !refs[2])
        return world_fail(w, "param rrefs: %s", zd_error_last());
    zd_optim_config_t cfg = zd_optim_sgd_defaults(LR);
    zd_dist_optim_t *opt;
    int64_t before[3], during[3], after[3];
    if (owned_counts(before) < 0)
        return world_fail(w, "owned: %s", zd_error_last());
    if (!(opt = dist_optim_over(&cfg, refs, 3)))
        return world_fail(w, "zd_dist_optim_new: %s", zd_error_last());
    if (zd_dist_optim_num_owners(opt) != 3)
        return world_fail(w, "%d owners", zd_dist_optim_num_owners(opt));
    /* Each owner holds its local optimizer as the value of one RRef. */
    if (owned_counts(during) < 0)
        return world_fail(w, "owned: %s", zd_error_last());
    for (int k = 0; k < 3; k++)
        if (during[k] != before[k] + 1)
            return world_fail(w, "rank %d owns %lld values, %lld before zd_dist_optim_new", k,
                              (long long)during[k], (long long)before[k]);
    float x[N] = {1, 2, 3, 4};
    if (iteration(opt, 0, 2, x) < 0)
        return world_fail(w, "iteration: %s", zd_error_last());
    for (int k = 0; k < 3; k++) {
        float e[N];
        for (int i = 0; i < N; i++)
            e[i] = w0(k, i) - LR * x[i];
        if (check_w(w, k, e) < 0)
            return -1;
    }
    /* A context this owner never saw: the error names the owner. */
    int64_t ctx;
    zd_dist_autograd_context_begin(&ctx);
    int64_t bogus = ctx + 12345;
    if (zd_dist_optim_step(opt, bogus) == 0 || !strstr(zd_error_last(), "step on \"worker") ||
        !strstr(zd_error_last(), "no context"))
        return world_fail(w, "a step with an unknown context: %s", zd_error_last());
    zd_dist_autograd_context_end(ctx, -1);
    zd_dist_optim_free(opt);
    /* Released: every owner freed its optimizer. */
    if (owned_counts(after) < 0)
        return world_fail(w, "owned: %s", zd_error_last());
    for (int k = 0; k < 3; k++)
        if (after[k] != before[k])
            return world_fail(w,
                              "rank %d still owns %lld values after zd_dist_optim_free, "
                              "%lld before zd_dist_optim_new",
                              k, (long long)after[k], (long long)before[k]);

    /* Bad hyper-parameters are refused before anything is created. */
    cfg.lr = -1;
    if ((opt = dist_optim_over(&cfg, refs, 3)) || !strstr(zd_error_last(), "learning rate"))
        return world_fail(w, "a negative lr was accepted: %s", zd_error_last());
    for (int k = 0; k < 3; k++)
        zd_rref_unref(refs[k]);
    return 0;
}

static void test_steps_every_owner(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = setup, .fn = basic_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  "update_w"(): the owner says it changed w (a checkpoint taken back),
    without changing it. */
static int say_changed(void *arg)
{
    (void)arg;
    return 1;
}

static zd_value_t *fn_update_w(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_dist_optim_update_params(say_changed, NULL) < 0 ? NULL : zd_value_none();
}

/*  After its owner changed w outside a step, the optimizer made before
    refuses to step it, saying why, and leaves w as it was; one made
    after steps it. */
static int update_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    zd_rref_t *ref = param_rref_of(1);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(LR);
    zd_dist_optim_t *old = ref ? dist_optim_over(&cfg, &ref, 1) : NULL, *made_after = NULL;
    if (!old)
        return world_fail(w, "zd_dist_optim_new: %s", zd_error_last());
    float x[N] = {1, 2, 3, 4}, e[N];
    for (int i = 0; i < N; i++)
        e[i] = w0(1, i) - LR * x[i];
    zd_value_t *r = NULL;
    int rc = iteration(old, 1, 1, x) < 0 ? world_fail(w, "iteration: %s", zd_error_last()) : 0;
    if (rc == 0 && zd_rpc_sync(1, "update_w", NULL, -1, &r) < 0)
        rc = world_fail(w, "update_w: %s", zd_error_last());
    zd_value_unref(r);
    if (rc == 0 && (iteration(old, 1, 1, x) == 0 || !strstr(zd_error_last(), "taken back")))
        rc = world_fail(w, "a step of the optimizer made before: %s, not refused", zd_error_last());
    if (rc == 0)
        rc = check_w(w, 1, e);
    if (rc == 0 && !(made_after = dist_optim_over(&cfg, &ref, 1)))
        rc = world_fail(w, "zd_dist_optim_new: %s", zd_error_last());
    if (rc == 0 && iteration(made_after, 1, 1, x) < 0)
        rc = world_fail(w, "a step of the optimizer made after: %s", zd_error_last());
    for (int i = 0; i < N; i++)
        e[i] -= LR * x[i];
    if (rc == 0)
        rc = check_w(w, 1, e);
    zd_dist_optim_free(made_after);
    zd_dist_optim_free(old);
    zd_rref_unref(ref);
    return rc;
}

static int update_setup(const world_t *w)
{
    return setup(w) | zd_rpc_register("update_w", fn_update_w, NULL);
}

static void test_update_refuses_older_optimizers(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = update_setup, .fn = update_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  Three trainers step rank 0's parameter concurrently, 50 times each:
    plain SGD updates commute, so the end value is exact. */
#define STEPS 50

static int concurrent_body(const world_t *w)
{
    if (w->rank == 0)
        return 0;
    zd_rref_t *ref = param_rref_of(0);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(LR);
    zd_dist_optim_t *opt;
    if (!ref || !(opt = dist_optim_over(&cfg, &ref, 1)))
        return world_fail(w, "zd_dist_optim_new: %s", zd_error_last());
    for (int s = 0; s < STEPS; s++) {
        float x[N] = {(float)w->rank, 0.5f, 0.25f, 1};
        if (iteration(opt, 0, 0, x) < 0)
            return world_fail(w, "step %d: %s", s, zd_error_last());
    }
    zd_dist_optim_free(opt);
    zd_rref_unref(ref);
    return 0;
}

/*  Rank 0 counts finished trainers, then checks its parameter. */
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static int trainers_done;

static zd_value_t *fn_done(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&done_lock);
    trainers_done++;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
    return zd_value_none();
}

static int concurrent_setup(const world_t *w)
{
    return setup(w) | zd_rpc_register("done", fn_done, NULL);
}

/*  A trainer runs body, then tells rank 0; rank 0 waits for them all. */
static int trainers_then_done(const world_t *w, int (*body)(const world_t *))
{
    if (w->rank != 0) {
        zd_value_t *r = NULL;
        int rc = body(w);
        if (rc == 0 && zd_rpc_sync(0, "done", NULL, -1, &r) < 0)
            rc = world_fail(w, "done: %s", zd_error_last());
        zd_value_unref(r);
        return rc;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 90;
    pthread_mutex_lock(&done_lock);
    int wrc = 0;
    while (trainers_done < w->world_size - 1 && wrc == 0)
        wrc = pthread_cond_timedwait(&done_cond, &done_lock, &deadline);
    pthread_mutex_unlock(&done_lock);
    if (wrc != 0)
        return world_fail(w, "only %d trainers finished", trainers_done);
    return 0;
}

static int concurrent_check(const world_t *w)
{
    if (trainers_then_done(w, concurrent_body) < 0 || w->rank != 0)
        return w->rank != 0 ? 0 : -1;
    /* Every trainer applied STEPS updates of lr * x: x[0] = rank, rest fixed. */
    float e[N], xsum[N] = {0, 0.5f, 0.25f, 1};
    for (int i = 0; i < N; i++) {
        float total = 0;
        for (int t = 1; t < w->world_size; t++)
            total += i == 0 ? (float)t : xsum[i];
        e[i] = w0(0, i) - LR * STEPS * total;
    }
    return check_w(w, 0, e);
}

static void test_concurrent_trainers_step_whole_updates(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 4,
                         .setup = concurrent_setup,
                         .fn = concurrent_check,
                         .dist_autograd = true,
                         .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

/*  The gradient of x in x * w is w: a backward on the owner reads the
    weights another trainer's step writes. The guard zd_dist_optim_init
    installs (zd_dist_autograd_set_backward_guard) holds the step off; the
    weights are large so that without it the two overlap, and a
    ThreadSanitizer build reports the race (checked by removing the guard).
    Every build checks the arithmetic: the updates do not depend on w. */
#define BIG       65536
#define BIG_STEPS 40
static zd_tensor_t *big_w;

static zd_value_t *fn_mul_big(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_dist_optim_read_lock();
    zd_value_t *v = dist_mul_by(args, big_w);
    zd_dist_optim_read_unlock();
    return v;
}

static int big_setup(const world_t *w)
{
    int64_t n = BIG;
    big_w = zd_tensor_new(ZD_FLOAT32, &n, 1);
    if (!big_w)
        return -1;
    zd_tensor_fill_(big_w, 1.0f);
    zd_tensor_set_requires_grad(big_w, true);
    return concurrent_setup(w) | zd_rpc_register("mul_big", fn_mul_big, NULL) |
        zd_rpc_register("big_rrefs", fn_param_rrefs, &big_w);
}

static int big_trainer(const world_t *w)
{
    zd_rref_t *ref = rref_by(0, "big_rrefs");
    zd_optim_config_t cfg = zd_optim_sgd_defaults(LR);
    zd_dist_optim_t *opt;
    if (!ref || !(opt = dist_optim_over(&cfg, &ref, 1)))
        return world_fail(w, "zd_dist_optim_new: %s", zd_error_last());
    int64_t n = BIG;
    int rc = 0;
    for (int s = 0; rc == 0 && s < BIG_STEPS; s++) {
        int64_t ctx;
        zd_tensor_t *x = zd_tensor_new(ZD_FLOAT32, &n, 1), *y = NULL, *sum = NULL;
        zd_value_t *r = NULL;
        rc = x && zd_dist_autograd_context_begin(&ctx) == 0 ? 0 : -1;
        if (rc == 0) {
            zd_tensor_fill_(x, (float)w->rank);
            zd_tensor_set_requires_grad(x, true);
            rc = zd_rpc_sync_take(0, "mul_big", ZD_ARGS(x), -1, &r) == 0 &&
                    zd_value_get_tensor(r, &y) == 0 && zd_tensor_sum(y, &sum) == 0 &&
                    zd_dist_autograd_backward(ctx, &sum, 1, false) == 0 &&
                    zd_dist_optim_step(opt, ctx) == 0
                ? 0
                : -1;
            if (zd_dist_autograd_context_end(ctx, -1) < 0)
                rc = -1;
        }
        if (rc < 0)
            world_fail(w, "step %d: %s", s, zd_error_last());
        zd_tensor_unref(sum);
        zd_value_unref(r);
        zd_tensor_unref(x);
    }
    zd_dist_optim_free(opt);
    zd_rref_unref(ref);
    return rc;
}

static int big_check(const world_t *w)
{
    if (trainers_then_done(w, big_trainer) < 0 || w->rank != 0)
        return w->rank != 0 ? 0 : -1;
    /* Each step subtracts lr * x = lr * rank, from every element. */
    float expect = 1.0f - LR * BIG_STEPS * (1 + 2);
    for (int64_t i = 0; i < BIG; i++)
        if (zd_tensor_data(big_w)[i] != expect)
            return world_fail(w, "w[%lld] = %g, expected %g", (long long)i,
                              zd_tensor_data(big_w)[i], expect);
    return 0;
}

static void test_backward_on_owner_holds_steps_off(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3,
                         .setup = big_setup,
                         .fn = big_check,
                         .dist_autograd = true,
                         .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

/*  zd_dist_optim_update_params: what update returns comes back, and only
    a change moves the step count; refused with NULL, and on a thread
    holding the read lock (the write would wait for it). */
static int update_calls;

static int update_ret(void *arg)
{
    update_calls++;
    return *(int *)arg;
}

static void test_update_params(void **state)
{
    (void)state;
    int ret = 0;
    uint64_t v0 = zd_dist_optim_version();
    assert_int_equal(zd_dist_optim_update_params(update_ret, &ret), 0);
    assert_true(zd_dist_optim_version() == v0);
    ret = 1;
    assert_int_equal(zd_dist_optim_update_params(update_ret, &ret), 1);
    assert_true(zd_dist_optim_version() == v0 + 1);
    ret = -1;
    assert_int_equal(zd_dist_optim_update_params(update_ret, &ret), -1);
    assert_true(zd_dist_optim_version() == v0 + 1);
    assert_int_equal(update_calls, 3);
    assert_int_equal(zd_dist_optim_update_params(NULL, NULL), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_dist_optim_read_lock();
    ret = 1;
    assert_int_equal(zd_dist_optim_update_params(update_ret, &ret), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_dist_optim_read_unlock();
    assert_int_equal(update_calls, 3);
    /* the lock is free again: a writer gets it */
    assert_int_equal(zd_dist_optim_update_params(update_ret, &ret), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_update_params),
        cmocka_unit_test(test_steps_every_owner),
        cmocka_unit_test(test_update_refuses_older_optimizers),
        cmocka_unit_test(test_concurrent_trainers_step_whole_updates),
        cmocka_unit_test(test_backward_on_owner_holds_steps_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
