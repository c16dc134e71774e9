/* SPDX-License-Identifier: MIT */
/*  The pipeline program (examples/pipeline_core.h) in a world of three real
    processes: rank 0 drives, ranks 1 and 2 hold the two halves of the Net.

    - with dropout off and the same weights, the gradients that distributed
      backward leaves on the shards equal the one-process gradients of the
      whole Net on the same batch, for 1 and for 4 (uneven) micro-batches;
    - a DistributedOptimizer step moves the shards' parameters as a local
      SGD step moves the whole Net's;
    - a forward without a context (evaluation) gives the Net's output and
      records nothing;
    - the driver's loop trains, times both runs and leaves no context behind. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include "examples/pipeline_core.h"
#include <zdist/dataset.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/dist_optim.h>
#include <zdist/optim.h>
#include <zdist/rpc.h>
#include "tests/support/fixtures.h"
#include "tests/support/world.h"

#define SEED    5
#define BATCH   30 /* 4 micro-batches of 8, 8, 8 and 6 rows */
#define NPARAMS (2 * PIPELINE_STAGE_PARAMS)

static zd_value_t *fn_num_contexts(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(zd_dist_autograd_num_contexts());
}

static int setup(const world_t *w)
{
    (void)w;
    if (pipeline_register() < 0)
        return -1;
    return zd_rpc_register("test.num_contexts", fn_num_contexts, NULL);
}

/*  The first BATCH test images. */
static int test_batch(zd_tensor_t **x, zd_tensor_t **y)
{
    zd_dataset_t *ds = zd_dataset_load(NULL, ZD_DATASET_TEST);
    if (!ds)
        return -1;
    int rc = zd_dataset_batch(ds, NULL, 0, BATCH, x, y);
    zd_dataset_free(ds);
    return rc;
}

static int close_to(const char *what, const zd_tensor_t *got, const zd_tensor_t *want)
{
    if (!got || !want || zd_tensor_numel(got) != zd_tensor_numel(want))
        return zd_error_set("%s: missing or of the wrong size", what);
    const float *a = zd_tensor_data(got), *e = zd_tensor_data(want);
    for (int64_t i = 0; i < zd_tensor_numel(want); i++)
        if (!(fabsf(a[i] - e[i]) <= 1e-5f + 1e-4f * fabsf(e[i])))
            return zd_error_set("%s[%lld] = %.9g, expected %.9g", what, (long long)i, a[i], e[i]);
    return 0;
}

static int64_t shard_contexts(int rank)
{
    zd_value_t *v;
    int64_t n = -1;
    if (zd_rpc_sync(rank, "test.num_contexts", NULL, -1, &v) == 0)
        zd_value_get_int(v, &n);
    zd_value_unref(v);
    return n;
}

/*  ---- gradients and one step equal the whole Net's in one process ---- */

/*  What fn_gradients makes; freed by it whatever gradients_match did. */
typedef struct {
    zd_tensor_t *x, *y, *lp, *loss, *dlp, *dloss;
    zd_tensor_t *grads[NPARAMS], *want[NPARAMS];
    zd_nn_module_t *net;
    pipeline_net_t *pn;
    zd_dist_optim_t *opt;
    zd_optim_t *local;
    int64_t ctx;
} gradients_run_t;

static int gradients_match(gradients_run_t *g, int split)
{
    const float lr = 0.05f;
    zd_tensor_t *ps[NPARAMS];
    zd_optim_config_t cfg = zd_optim_sgd_defaults(lr);
    const zd_rref_list_t *params;
    WTRY(g->net && g->pn ? 0 : -1);
    WTRY(test_batch(&g->x, &g->y));

    /* One process: the whole Net, dropout off. */
    zd_nn_module_train(g->net, false);
    WTRY(zd_nn_module_forward(g->net, &g->x, 1, &g->lp, 1));
    WTRY(zd_nn_nll_loss(g->lp, g->y, &g->loss));
    WTRY(zd_autograd_backward(g->loss, NULL, false));
    for (int i = 0; i < NPARAMS; i++)
        g->want[i] = zd_tensor_grad(ps[i] = zd_nn_module_param(g->net, i));

    /* The pipeline, in a context. */
    WTRY(zd_dist_autograd_context_begin(&g->ctx));
    WTRY(pipeline_net_forward(g->pn, g->x, split, &g->dlp));
    WTRY(zd_nn_nll_loss(g->dlp, g->y, &g->dloss));
    WTRY(zd_dist_autograd_backward(g->ctx, &g->dloss, 1, false));
    WTRY(pipeline_net_gradients(g->pn, g->ctx, g->grads));
    WTRY(close_to("loss", g->dloss, g->loss));
    for (int i = 0; i < NPARAMS; i++) {
        char what[128];
        snprintf(what, sizeof what, "%d micro-batches: gradient of %s", split,
                 zd_nn_module_param_name(g->net, i));
        WTRY(close_to(what, g->grads[i], g->want[i]));
    }

    /* One step of each: the shards' parameters move as the Net's. */
    WTRY((params = pipeline_net_parameter_rrefs(g->pn)) ? 0 : -1);
    WTRY(zd_rref_list_len(params) == NPARAMS ? 0 : -1);
    WTRY((g->opt = zd_dist_optim_new(&cfg, params)) ? 0 : -1);
    WTRY(zd_dist_optim_num_owners(g->opt) == 2 ? 0 : -1);
    WTRY(zd_dist_optim_step(g->opt, g->ctx));
    WTRY((g->local = zd_optim_new(&cfg, ps, NPARAMS)) ? 0 : -1);
    WTRY(zd_optim_step_grad(g->local));
    for (int i = 0; i < NPARAMS; i++) {
        zd_value_t *v = NULL;
        zd_tensor_t *t = NULL;
        char what[128];
        snprintf(what, sizeof what, "%s after one step", zd_nn_module_param_name(g->net, i));
        int r = zd_rref_to_here(zd_rref_list_get(params, i), -1, &v);
        if (r == 0)
            r = zd_value_get_tensor(v, &t);
        if (r == 0)
            r = close_to(what, t, ps[i]);
        zd_value_unref(v);
        WTRY(r);
    }
    return 0;
}

static int fn_gradients(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    gradients_run_t g = {
        .net = zd_nn_net_new(SEED), .pn = pipeline_net_new(1, 2, SEED, false), .ctx = -1};
    int rc = gradients_match(&g, *(const int *)w->arg);
    if (g.ctx >= 0 && zd_dist_autograd_context_end(g.ctx, -1) < 0)
        rc = world_fail(w, "context_end: %s", zd_error_last());
    if (rc == 0 && (shard_contexts(1) != 0 || shard_contexts(2) != 0))
        rc = world_fail(w, "the shards still hold contexts");
    for (int i = 0; i < NPARAMS; i++) {
        zd_tensor_unref(g.grads[i]);
        zd_tensor_unref(g.want[i]);
    }
    zd_optim_free(g.local);
    zd_dist_optim_free(g.opt);
    pipeline_net_free(g.pn);
    zd_nn_module_free(g.net);
    zd_tensor_unref(g.dloss);
    zd_tensor_unref(g.dlp);
    zd_tensor_unref(g.loss);
    zd_tensor_unref(g.lp);
    zd_tensor_unref(g.x);
    zd_tensor_unref(g.y);
    return rc;
}

static void test_gradients_one_micro_batch(void **state)
{
    (void)state;
    need_data();
    int split = 1;
    world_options_t o = {.world_size = PIPELINE_WORLD_SIZE,
                         .setup = setup,
                         .fn = fn_gradients,
                         .arg = &split,
                         .timeout_s = 120,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

static void test_gradients_four_micro_batches(void **state)
{
    (void)state;
    need_data();
    int split = 4;
    world_options_t o = {.world_size = PIPELINE_WORLD_SIZE,
                         .setup = setup,
                         .fn = fn_gradients,
                         .arg = &split,
                         .timeout_s = 120,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- evaluation: no context, dropout off ---- */

static int fn_eval(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    zd_tensor_t *x = NULL, *y = NULL, *lp = NULL, *dlp = NULL;
    zd_nn_module_t *net = zd_nn_net_new(SEED);
    pipeline_net_t *pn = pipeline_net_new(1, 2, SEED, true);
    int rc = -1;
    zd_nn_module_train(net, false);
    if (!net || !pn || test_batch(&x, &y) < 0 || zd_nn_module_forward(net, &x, 1, &lp, 1) < 0 ||
        pipeline_net_train(pn, false) < 0 || pipeline_net_forward(pn, x, 3, &dlp) < 0) {
        world_fail(w, "%s", zd_error_last());
        goto out;
    }
    if ((rc = close_to("evaluation output", dlp, lp)) < 0)
        world_fail(w, "%s", zd_error_last());
    if (rc == 0 && zd_tensor_requires_grad(dlp))
        rc = world_fail(w, "an evaluation forward was recorded for autograd");
    /* Bad input is refused before anything is sent. */
    zd_tensor_t *bad;
    if (rc == 0 && pipeline_net_forward(pn, x, BATCH + 1, &bad) == 0)
        rc = world_fail(w, "31 micro-batches of 30 rows accepted");
    if (rc == 0 && !strstr(zd_error_last(), "31 micro-batches of a batch of 30"))
        rc = world_fail(w, "unclear error: %s", zd_error_last());
out:
    pipeline_net_free(pn);
    zd_nn_module_free(net);
    zd_tensor_unref(dlp);
    zd_tensor_unref(lp);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

static void test_eval_forward(void **state)
{
    (void)state;
    need_data();
    world_options_t o = {.world_size = PIPELINE_WORLD_SIZE,
                         .setup = setup,
                         .fn = fn_eval,
                         .timeout_s = 120,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- the driver's loop ---- */

static int fn_driver(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    pipeline_options_t o = pipeline_options_default();
    o.batch_size = 32;
    o.iterations = 3;
    o.test_size = 64;
    o.quiet = true;
    pipeline_result_t res;
    if (pipeline_run_driver(&o, &res) < 0)
        return world_fail(w, "driver: %s", zd_error_last());
    int rc = 0;
    if (res.runs != 2 || res.num_split[0] != 1 || res.num_split[1] != 4)
        rc = world_fail(w, "runs: %d (%lld, %lld)", res.runs, (long long)res.num_split[0],
                        (long long)res.num_split[1]);
    for (int r = 0; r < 2; r++) {
        if (!(res.samples_per_s[r] > 0) || !(res.seconds[r] > 0))
            rc = world_fail(w, "run %d: %g samples/s in %g s", r, res.samples_per_s[r],
                            res.seconds[r]);
        /* Both stages computed during the forwards, which took longer than
           either; the overlap is a share (its size depends on timing). */
        const double *st = res.stage_ms[r];
        if (!(st[0] > 0 && st[1] > 0 && res.forward_ms[r] >= st[0] && res.forward_ms[r] >= st[1] &&
              res.overlap[r] >= 0 && res.overlap[r] <= 1))
            rc = world_fail(w, "run %d: forward %g ms, stages %g and %g ms, overlap %g", r,
                            res.forward_ms[r], st[0], st[1], res.overlap[r]);
    }
    if (!(res.last_loss > 0 && res.last_loss < 3) || res.accuracy < 0 || res.accuracy > 1)
        rc = world_fail(w, "loss %g, accuracy %g", res.last_loss, res.accuracy);
    if (shard_contexts(1) != 0 || shard_contexts(2) != 0 || zd_dist_autograd_num_contexts() != 0)
        rc = world_fail(w, "contexts left behind");
    return rc;
}

static void test_driver_runs(void **state)
{
    (void)state;
    need_data();
    world_options_t o = {.world_size = PIPELINE_WORLD_SIZE,
                         .setup = setup,
                         .fn = fn_driver,
                         .timeout_s = 120,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

static void test_options_checked(void **state)
{
    (void)state;
    pipeline_options_t o = pipeline_options_default();
    assert_int_equal(pipeline_options_check(&o, 3), 0);
    assert_int_equal(pipeline_options_check(&o, 4), -1);
    assert_non_null(strstr(zd_error_last(), "the pipeline needs 3 processes"));
    o.num_split = o.batch_size + 1;
    assert_int_equal(pipeline_options_check(&o, 3), -1);
    assert_non_null(strstr(zd_error_last(), "--num_split"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options_checked),
        cmocka_unit_test(test_gradients_one_micro_batch),
        cmocka_unit_test(test_gradients_four_micro_batches),
        cmocka_unit_test(test_eval_forward),
        cmocka_unit_test(test_driver_runs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
