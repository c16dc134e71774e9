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

#include "autograd/autograd.h"
#include "autograd/dist_autograd.h"
#include "autograd/error.h"
#include "optim/dist_optim.h"
#include "rpc/rpc.h"
#include "tests/support/dist_fixtures.h"
#include "tests/support/world.h"

#define N 4
#define LR 0.125f   /* a power of two keeps the expected values exact */

static tensor_t *w_param;

static float w0(int rank, int i) { return (float)rank + 1.0f + 0.5f * (float)i; }

static rpc_value_t *fn_mul_w(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return dist_mul_by(args, w_param);
}

/*  [RRef(w)], as the tutorial's get_param_rrefs. */
static rpc_value_t *fn_param_rrefs(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    rpc_value_t *tv = rpc_value_tensor(w_param);
    rpc_rref_t *r = rpc_rref_new(tv);
    rpc_value_unref(tv);
    rpc_value_t *list = rpc_value_list(1);
    rpc_list_append(list, rpc_value_rref(r));
    rpc_rref_unref(r);
    return list;
}

static rpc_value_t *fn_get_w(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    tensor_t *copy = tensor_clone(w_param);
    rpc_value_t *v = rpc_value_tensor(copy);
    tensor_unref(copy);
    return v;
}

/*  Values this process owns for RRefs (the local optimizers among them). */
static rpc_value_t *fn_owned(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return rpc_value_int(rpc_debug_owner_rrefs());
}

static rpc_value_t *fn_drain(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return rpc_rref_drain(10000) < 0 ? NULL : rpc_value_none();
}

static int setup(const world_t *w)
{
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = w0(w->rank, i);
    int64_t n = N;
    w_param = tensor_from_data(TENSOR_F32, 1, &n, v);
    tensor_set_requires_grad(w_param, true);
    if (dist_optim_init() < 0)
        return -1;
    return rpc_register("mul_w", fn_mul_w, NULL) |
           rpc_register("param_rrefs", fn_param_rrefs, NULL) |
           rpc_register("get_w", fn_get_w, NULL) | rpc_register("owned", fn_owned, NULL) |
           rpc_register("drain", fn_drain, NULL);
}

static rpc_rref_t *param_rref_of(int rank)
{
    rpc_value_t *r;
    rpc_rref_t *ref = NULL;
    if (rpc_sync(rank, "param_rrefs", NULL, -1, &r) == 0) {
        if (rpc_arg_rref(r, 0, &ref) == 0)
            rpc_rref_ref(ref);
        rpc_value_unref(r);
    }
    return ref;
}

/*  One iteration: loss = sum over owners k of sum(x * w_k), so each w_k's
    gradient is x. */
static int iteration(dist_optim_t *opt, int owners_from, int owners_to, const float *xv)
{
    int64_t ctx, n = N;
    if (dist_autograd_context_begin(&ctx) < 0)
        return -1;
    tensor_t *x = tensor_from_data(TENSOR_F32, 1, &n, xv), *total = NULL;
    int rc = 0;
    for (int k = owners_from; rc == 0 && k <= owners_to; k++) {
        rpc_value_t *a = rpc_args("t", x), *r;
        tensor_t *y, *s, *t2;
        if (rpc_sync(k, "mul_w", a, -1, &r) < 0 || rpc_value_get_tensor(r, &y) < 0 ||
            tensor_sum(y, &s) < 0)
            rc = -1;
        rpc_value_unref(a);
        if (rc == 0 && total) {
            rc = tensor_add(total, s, &t2);
            tensor_unref(total);
            tensor_unref(s);
            total = t2;
        } else if (rc == 0) {
            total = s;
        }
        if (rc == 0)
            rpc_value_unref(r);
    }
    if (rc == 0)
        rc = dist_autograd_backward(ctx, &total, 1, false);
    if (rc == 0)
        rc = dist_optim_step(opt, ctx);
    tensor_unref(total);
    tensor_unref(x);
    if (dist_autograd_context_end(ctx, -1) < 0)
        rc = -1;
    return rc;
}

static int check_w(const world_t *w, int rank, const float *expect)
{
    rpc_value_t *r;
    tensor_t *t;
    if (rpc_sync(rank, "get_w", NULL, -1, &r) < 0 || rpc_value_get_tensor(r, &t) < 0)
        return world_fail(w, "get_w: %s", error_last());
    int ok = 1;
    for (int i = 0; i < N; i++)
        ok &= fabsf(tensor_data(t)[i] - expect[i]) < 1e-5f;
    if (!ok)
        world_fail(w, "w on rank %d: %g %g %g %g, expected %g %g %g %g", rank, tensor_data(t)[0],
                   tensor_data(t)[1], tensor_data(t)[2], tensor_data(t)[3], expect[0], expect[1],
                   expect[2], expect[3]);
    rpc_value_unref(r);
    return ok ? 0 : -1;
}

/*  The number of RRef values each of ranks 0..2 owns, once no RRef
    message is in flight anywhere (twice round: a release may wait for
    another). 0, or -1. */
static int owned_counts(int64_t *owned)
{
    rpc_value_t *r;
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < 3; k++) {
            if (rpc_sync(k, "drain", NULL, -1, &r) < 0)
                return -1;
            rpc_value_unref(r);
        }
    for (int k = 0; k < 3; k++) {
        if (rpc_sync(k, "owned", NULL, -1, &r) < 0)
            return -1;
        int rc = rpc_value_get_int(r, &owned[k]);
        rpc_value_unref(r);
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
    rpc_rref_t *refs[3] = {param_rref_of(0), param_rref_of(1), param_rref_of(2)};
    if (!refs[0] || !refs[1] || !refs[2])
        return world_fail(w, "param rrefs: %s", error_last());
    optim_config_t cfg = optim_sgd_defaults(LR);
    dist_optim_t *opt;
    int64_t before[3], during[3], after[3];
    if (owned_counts(before) < 0)
        return world_fail(w, "owned: %s", error_last());
    if (dist_optim_new(&cfg, refs, 3, &opt) < 0)
        return world_fail(w, "dist_optim_new: %s", error_last());
    if (dist_optim_num_owners(opt) != 3)
        return world_fail(w, "%d owners", dist_optim_num_owners(opt));
    /* Each owner holds its local optimizer as the value of one RRef. */
    if (owned_counts(during) < 0)
        return world_fail(w, "owned: %s", error_last());
    for (int k = 0; k < 3; k++)
        if (during[k] != before[k] + 1)
            return world_fail(w, "rank %d owns %lld values, %lld before dist_optim_new", k,
                              (long long)during[k], (long long)before[k]);
    float x[N] = {1, 2, 3, 4};
    if (iteration(opt, 0, 2, x) < 0)
        return world_fail(w, "iteration: %s", error_last());
    for (int k = 0; k < 3; k++) {
        float e[N];
        for (int i = 0; i < N; i++)
            e[i] = w0(k, i) - LR * x[i];
        if (check_w(w, k, e) < 0)
            return -1;
    }
    /* A context this owner never saw: the error names the owner. */
    int64_t ctx;
    dist_autograd_context_begin(&ctx);
    int64_t bogus = ctx + 12345;
    if (dist_optim_step(opt, bogus) == 0 || !strstr(error_last(), "step on \"worker") ||
        !strstr(error_last(), "no context"))
        return world_fail(w, "a step with an unknown context: %s", error_last());
    dist_autograd_context_end(ctx, -1);
    dist_optim_free(opt);
    /* Released: every owner freed its optimizer. */
    if (owned_counts(after) < 0)
        return world_fail(w, "owned: %s", error_last());
    for (int k = 0; k < 3; k++)
        if (after[k] != before[k])
            return world_fail(w, "rank %d still owns %lld values after dist_optim_free, "
                              "%lld before dist_optim_new", k, (long long)after[k],
                              (long long)before[k]);

    /* Bad hyper-parameters are refused before anything is created. */
    cfg.lr = -1;
    if (dist_optim_new(&cfg, refs, 3, &opt) == 0 || !strstr(error_last(), "learning rate"))
        return world_fail(w, "a negative lr was accepted: %s", error_last());
    for (int k = 0; k < 3; k++)
        rpc_rref_unref(refs[k]);
    return 0;
}

static void test_steps_every_owner(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = setup, .fn = basic_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  Three trainers step rank 0's parameter concurrently, 50 times each:
    plain SGD updates commute, so the end value is exact. */
#define STEPS 50

static int concurrent_body(const world_t *w)
{
    if (w->rank == 0)
        return 0;
    rpc_rref_t *ref = param_rref_of(0);
    optim_config_t cfg = optim_sgd_defaults(LR);
    dist_optim_t *opt;
    if (!ref || dist_optim_new(&cfg, &ref, 1, &opt) < 0)
        return world_fail(w, "dist_optim_new: %s", error_last());
    for (int s = 0; s < STEPS; s++) {
        float x[N] = {(float)w->rank, 0.5f, 0.25f, 1};
        if (iteration(opt, 0, 0, x) < 0)
            return world_fail(w, "step %d: %s", s, error_last());
    }
    dist_optim_free(opt);
    rpc_rref_unref(ref);
    return 0;
}

/*  Rank 0 counts finished trainers, then checks its parameter. */
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static int trainers_done;

static rpc_value_t *fn_done(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&done_lock);
    trainers_done++;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
    return rpc_value_none();
}

static int concurrent_setup(const world_t *w)
{
    return setup(w) | rpc_register("done", fn_done, NULL);
}

static int concurrent_check(const world_t *w)
{
    if (w->rank != 0) {
        rpc_value_t *r = NULL;
        int rc = concurrent_body(w);
        if (rc == 0 && rpc_sync(0, "done", NULL, -1, &r) < 0)
            rc = world_fail(w, "done: %s", error_last());
        rpc_value_unref(r);
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
    world_options_t o = {.world_size = 4, .setup = concurrent_setup, .fn = concurrent_check,
                         .dist_autograd = true, .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_every_owner),
        cmocka_unit_test(test_concurrent_trainers_step_whole_updates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
