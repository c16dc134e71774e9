/* SPDX-License-Identifier: MIT */
/*  The pipeline program's driver (rank 0): the tutorial's run_master with
    Fashion-MNIST batches, timed for 1 micro-batch and for several. */
#include "examples/pipeline_core.h"
#include "examples/fault.h"
#include "examples/train_common.h"

#include <stdio.h>
#include <stdlib.h>

#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/dataset.h>
#include <zdist/nn.h>
#include <zdist/dist_optim.h>

pipeline_options_t pipeline_options_default(void)
{
    return (pipeline_options_t){.batch_size = 128,
                                .num_split = 4,
                                .baseline = true,
                                .iterations = 20,
                                .lr = 0.05,
                                .seed = 1,
                                .dropout = true,
                                .test_size = 1000,
                                .log_interval = 5};
}

int pipeline_options_check(const pipeline_options_t *o, int world_size)
{
    if (o->batch_size < 1 || o->num_split < 1 || o->num_split > o->batch_size)
        return zd_error_set("--batch_size must be >= 1 and --num_split in 1..batch_size "
                            "(got %lld and %lld)",
                            (long long)o->batch_size, (long long)o->num_split);
    if (o->iterations < 1 || !(o->lr > 0) || o->test_size < 0 || o->log_interval < 0)
        return zd_error_set("--iterations must be >= 1, --lr > 0, --test_size and "
                            "--log_interval >= 0");
    if (world_size != PIPELINE_WORLD_SIZE)
        return zd_error_set("world size %d: the pipeline needs %d processes (rank 0 the "
                            "driver, ranks 1 and 2 the two shards of the Net)",
                            world_size, PIPELINE_WORLD_SIZE);
    return 0;
}

/*  One batch: forward in micro-batches, loss, distributed backward and a
    step of both shards, in a context of its own. */
static int train_batch(pipeline_net_t *net, zd_dist_optim_t *opt, zd_tensor_t *x, zd_tensor_t *y,
                       int split, double *loss, double *forward_s)
{
    int64_t ctx;
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        return -1;
    zd_tensor_t *logprobs = NULL, *l = NULL;
    double t0 = train_now();
    fault_point(zd_rpc_rank(), "forward"); /* tests only (fault.h) */
    int rc = pipeline_net_forward(net, x, split, &logprobs);
    *forward_s += train_now() - t0;
    if (rc == 0)
        rc = zd_nn_nll_loss(logprobs, y, &l);
    if (rc == 0)
        rc = zd_dist_autograd_backward(ctx, &l, 1, false);
    if (rc == 0)
        rc = zd_dist_optim_step(opt, ctx);
    if (rc == 0)
        *loss = zd_tensor_data(l)[0];
    zd_tensor_unref(l);
    zd_tensor_unref(logprobs);
    if (rc < 0) {
        char err[1024];
        snprintf(err, sizeof err, "%s", zd_error_last());
        zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT);
        return zd_error_set("%s", err);
    }
    return zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT);
}

static int evaluate(pipeline_net_t *net, const zd_dataset_t *test, int64_t batch, int split,
                    double *accuracy)
{
    int64_t correct = 0, n = zd_dataset_len(test);
    fault_point(zd_rpc_rank(), "evaluation"); /* tests only (fault.h) */
    int rc = pipeline_net_train(net, false);
    for (int64_t start = 0; rc == 0 && start < n; start += batch) {
        zd_tensor_t *x = NULL, *y = NULL, *lp = NULL;
        rc = zd_dataset_batch(test, NULL, start, batch, &x, &y);
        if (rc == 0) {
            int s = split < zd_tensor_size(x, 0) ? split : (int)zd_tensor_size(x, 0);
            rc = pipeline_net_forward(net, x, s, &lp);
        }
        int64_t c = rc == 0 ? zd_nn_accuracy(lp, y) : -1;
        if (c < 0)
            rc = -1;
        else
            correct += c;
        zd_tensor_unref(lp);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    if (rc == 0)
        rc = pipeline_net_train(net, true);
    if (rc == 0)
        *accuracy = (double)correct / (double)n;
    return rc;
}

typedef struct {
    const pipeline_options_t *o;
    zd_dataset_t *train, *test;
    pipeline_result_t *res;
} driver_t;

/*  Trains a fresh Net for o->iterations batches with `split` micro-batches
    each; evaluates it when `last`. */
static int run_once(driver_t *d, int run, int split, bool last)
{
    const pipeline_options_t *o = d->o;
    pipeline_net_t *net = pipeline_net_new(1, 2, (uint64_t)o->seed, o->dropout);
    zd_dist_optim_t *opt = NULL;
    int64_t *order = NULL;
    const zd_rref_list_t *params;
    int rc = -1;
    zd_optim_config_t cfg = zd_optim_sgd_defaults(o->lr);
    if (!net || !(params = pipeline_net_parameter_rrefs(net)) ||
        !(opt = zd_dist_optim_new(&cfg, params)))
        goto out;
    int64_t nb = zd_dataset_num_batches(d->train, o->batch_size);
    double t0 = train_now(), t1 = t0, loss = 0, fwd = 0, busy[2];
    for (int64_t b = 0; b < o->iterations; b++) {
        if (b % nb == 0) {
            free(order);
            if (!(order = zd_dataset_order(d->train, (uint64_t)(o->seed + b / nb)))) {
                zd_error_set("out of memory");
                goto out;
            }
        }
        zd_tensor_t *x, *y;
        if (zd_dataset_batch(d->train, order, (b % nb) * o->batch_size, o->batch_size, &x, &y) < 0)
            goto out;
        int s = split < zd_tensor_size(x, 0) ? split : (int)zd_tensor_size(x, 0);
        int brc = train_batch(net, opt, x, y, s, &loss, &fwd);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
        if (brc < 0)
            goto out;
        if (b == 0) {
            /* The first batch warms up threads and caches: not timed. */
            if (pipeline_net_busy(net, busy) < 0)
                goto out;
            fwd = 0;
            t1 = train_now();
        }
        if (!o->quiet && o->log_interval > 0 && b % o->log_interval == 0)
            printf("  batch %lld loss %.4f\n", (long long)b, loss);
    }
    double t2 = train_now(), timed = o->iterations > 1 ? t2 - t1 : t2 - t0;
    int64_t timed_batches = o->iterations > 1 ? o->iterations - 1 : 1;
    int64_t samples = timed_batches * o->batch_size;
    if (pipeline_net_busy(net, busy) < 0)
        goto out;
    double *st = d->res->stage_ms[run], shorter;
    d->res->forward_ms[run] = 1e3 * fwd / (double)timed_batches;
    st[0] = 1e3 * busy[0] / (double)timed_batches;
    st[1] = 1e3 * busy[1] / (double)timed_batches;
    shorter = st[0] < st[1] ? st[0] : st[1];
    double ov = shorter > 0 ? (st[0] + st[1] - d->res->forward_ms[run]) / shorter : 0;
    d->res->overlap[run] = ov < 0 ? 0 : ov > 1 ? 1 : ov;
    d->res->num_split[run] = split;
    d->res->seconds[run] = t2 - t0;
    d->res->samples_per_s[run] = timed > 0 ? (double)samples / timed : 0;
    d->res->last_loss = loss;
    d->res->runs = run + 1;
    if (!o->quiet) {
        printf("number of splits = %d, execution time = %.2f s, throughput = %.0f samples/s\n"
               "  forward %.1f ms per batch: stage 1 computes %.1f ms, stage 2 %.1f ms, "
               "%.1f ms of them at the same time\n",
               split, t2 - t0, d->res->samples_per_s[run], d->res->forward_ms[run], st[0], st[1],
               d->res->overlap[run] * shorter);
        fflush(stdout);
    }
    if (last && d->test) {
        if (evaluate(net, d->test, o->batch_size, split, &d->res->accuracy) < 0)
            goto out;
        if (!o->quiet)
            printf("Test accuracy: %.2f %% (%lld images)\n", 100.0 * d->res->accuracy,
                   (long long)zd_dataset_len(d->test));
    }
    rc = 0;
out:
    free(order);
    zd_dist_optim_free(opt);
    pipeline_net_free(net);
    return rc;
}

int pipeline_run_driver(const pipeline_options_t *o, pipeline_result_t *res)
{
    pipeline_result_t local;
    driver_t d = {.o = o, .res = res ? res : &local};
    *d.res = (pipeline_result_t){0};
    if (pipeline_options_check(o, zd_rpc_world_size()) < 0)
        return -1;
    int rc = -1;
    if (!(d.train = zd_dataset_load(o->data_dir, ZD_DATASET_TRAIN)) ||
        (o->test_size > 0 &&
         (!(d.test = zd_dataset_load(o->data_dir, ZD_DATASET_TEST)) ||
          zd_dataset_limit(d.test, o->test_size) < 0)))
        goto out;
    if (!o->quiet) {
        printf("pipeline: the Net in 2 shards (ranks 1 and 2), batches of %lld, %lld "
               "batches per run\n",
               (long long)o->batch_size, (long long)o->iterations);
        fflush(stdout);
    }
    int run = 0;
    if (o->baseline && o->num_split != 1 && run_once(&d, run++, 1, false) < 0)
        goto out;
    rc = run_once(&d, run, (int)o->num_split, true);
out:
    zd_dataset_free(d.train);
    zd_dataset_free(d.test);
    return rc;
}
