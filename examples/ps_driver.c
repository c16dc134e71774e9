/* SPDX-License-Identifier: MIT */
/*  The driver of Ray's parameter-server example (rank 0): the synchronous
    and asynchronous training loops over the DataWorker actors, pushing
    through the parameter servers as their trainer (ps_core.h). */
#include "examples/ps_core.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include "examples/actor.h"
#include "examples/fault.h"
#include "examples/progress.h"
#include "examples/train_common.h"

ps_options_t ps_options_default(void)
{
    return (ps_options_t){.num_workers = 2,
                          .num_servers = 1,
                          .iterations = 200,
                          .lr = 0.01,
                          .batch_size = 128,
                          .model = "convnet",
                          .eval_interval = 10};
}

int ps_options_check(const ps_options_t *o, int world_size)
{
    if (o->num_workers < 1 || o->num_workers > PS_MAX_WORKERS || o->num_servers < 1 ||
        o->num_servers > PS_MAX_SERVERS)
        return zd_error_set("--num_workers and --num_servers must be in 1..%d, got %d and %d",
                            PS_MAX_WORKERS, o->num_workers, o->num_servers);
    if (o->iterations < 0 || o->batch_size < 1 || !(o->lr > 0) || o->eval_interval < 0 ||
        o->test_size < 0 || o->train_size < 0 || o->max_staleness < 0 || o->straggler_ms < 0 ||
        o->straggler_ms > 10000) /* a straggler well within a call's timeout */
        return zd_error_set("--iterations, --eval_interval, --test_size, --train_size and "
                            "--max_staleness must be >= 0, --batch_size >= 1, --lr > 0 and "
                            "--straggler_ms in 0..10000");
    int want = 1 + o->num_servers + o->num_workers;
    if (world_size != want)
        return zd_error_set("world size %d does not fit --num_servers=%d --num_workers=%d: "
                            "rank 0 is the driver, then come %d parameter server rank(s) and "
                            "%d data worker rank(s), so the world size must be 1 + %d + %d = %d",
                            world_size, o->num_servers, o->num_workers, o->num_servers,
                            o->num_workers, o->num_servers, o->num_workers, want);
    return 0;
}

void ps_result_free(ps_result_t *r)
{
    zd_tensor_unref(r->weights);
    memset(r, 0, sizeof *r);
}

typedef struct {
    const ps_options_t *o;
    int W;
    zd_ps_client_t *servers;
    zd_rref_t *workers[PS_MAX_WORKERS];
    zd_nn_module_t *model; /* the replica: the weights last pulled */
    zd_tensor_t *weights;  /* the same, flat: what the workers get */
    zd_dataset_t *test;
    double eval_seconds, accuracy;
    int64_t updates, applied[PS_MAX_WORKERS], max_lead;
    progress_t progress;
} driver_t;

static int create_workers(driver_t *d)
{
    const ps_options_t *o = d->o;
    for (int w = 0; w < d->W; w++) {
        zd_value_t *dir = o->data_dir ? zd_value_string(o->data_dir) : zd_value_none(); /* taken */
        zd_value_t *a = ZD_ARGS(o->model, w, o->seed, o->batch_size, dir, o->train_size,
                                w == 0 ? o->straggler_ms : 0);
        d->workers[w] =
            a ? zd_rpc_remote(1 + o->num_servers + w, "DataWorker", a, ZD_TIMEOUT_DEFAULT) : NULL;
        zd_value_unref(a);
    }
    /* every worker loaded its data: a failed one is named, the clock starts with all ready */
    for (int w = 0; w < d->W; w++)
        if (!d->workers[w] || actor_wait(d->workers[w]) < 0)
            return zd_error_wrap("creating DataWorker %d", w);
    return 0;
}

/*  The replica's weights, flat, for the workers. */
static int flatten(driver_t *d)
{
    zd_tensor_unref_p(&d->weights);
    return zd_nn_module_params_to_vector(d->model, &d->weights);
}

static int evaluate(driver_t *d, int64_t i)
{
    if (i >= 0 && (d->o->eval_interval == 0 || i % d->o->eval_interval != 0))
        return 0;
    fault_point(zd_rpc_rank(), "evaluation"); /* tests only (fault.h) */
    double t0 = train_now();
    if (train_evaluate(d->model, d->test, &d->accuracy) < 0)
        return -1;
    d->eval_seconds += train_now() - t0;
    progress_skip(&d->progress, train_now() - t0);
    progress_clear(&d->progress);
    if (!d->o->quiet && i >= 0)
        printf("Iter %lld: accuracy is %.1f\n", (long long)i, 100.0 * d->accuracy);
    return 0;
}

/*  Ray's ps.apply_gradients(*gradients): the flat gradients summed, in
    order, into the replica's .grad and pushed, one step of every shard,
    whose answers bring the new weights. */
static int apply(driver_t *d, zd_value_t *const *grads, const int *who, int n)
{
    int rc = 0;
    for (int k = 0; k < n && rc == 0; k++) {
        zd_tensor_t *g;
        if (zd_value_get_tensor(grads[k], &g) < 0 || zd_tensor_dtype(g) != ZD_FLOAT32 ||
            zd_tensor_numel(g) != zd_tensor_numel(d->weights))
            rc = zd_error_set("compute_gradients returned no float32 gradient of %lld values",
                              (long long)zd_tensor_numel(d->weights));
        int64_t off = 0;
        for (int i = 0; rc == 0 && i < zd_nn_module_n_params(d->model); i++) {
            zd_tensor_t *p = zd_nn_module_param(d->model, i), *part = NULL, *view = NULL;
            rc = zd_tensor_narrow(g, 0, off, zd_tensor_numel(p), &part) < 0 ||
                    zd_tensor_reshape(part, zd_tensor_shape(p), zd_tensor_ndim(p), &view) < 0 ||
                    zd_tensor_accumulate_grad(p, view) < 0
                ? -1
                : 0;
            off += zd_tensor_numel(p);
            zd_tensor_unref(view);
            zd_tensor_unref(part);
        }
        d->applied[who[k]]++;
    }
    if (rc == 0 && (rc = zd_ps_client_push_pull(d->servers, ZD_TIMEOUT_DEFAULT)) == 0)
        rc = flatten(d);
    zd_nn_module_zero_grad(d->model);
    d->updates += rc == 0;
    progress_step(&d->progress, train_now(), NAN);
    return rc;
}

static zd_future_t *compute(driver_t *d, int w)
{
    zd_value_t *a = ZD_ARGS(d->weights);
    zd_future_t *f = a
        ? zd_rref_rpc_async(d->workers[w], "DataWorker.compute_gradients", a, ZD_TIMEOUT_DEFAULT)
        : NULL;
    zd_value_unref(a);
    return f;
}

/*  Sync mode leaves a worker whose process RPC declared lost out of the
    rounds, saying so; 1 then, 0 for any other failure. A send can fail
    before that verdict (about 1 s after the connection went down): it
    waits up to 5 s for it. */
static int worker_lost(driver_t *d, zd_future_t *f, int w, int64_t i, int *live)
{
    if ((f ? zd_future_error_code(f) : zd_error_code()) != ZD_ERR_PEER)
        return 0;
    int rank = zd_rref_owner(d->workers[w]);
    for (double until = train_now() + 5; !zd_rpc_peer_is_lost(rank) && train_now() < until;)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    if (!zd_rpc_peer_is_lost(rank))
        return 0;
    progress_clear(&d->progress);
    printf("worker %d (rank %d) lost at iteration %lld: %s; going on with the %d worker(s) "
           "left\n",
           w, rank, (long long)i, f ? zd_future_error(f) : zd_error_last(), --*live);
    return 1;
}

static int train_sync(driver_t *d)
{
    bool gone[PS_MAX_WORKERS] = {false};
    int live = d->W;
    for (int64_t i = 0; i < d->o->iterations; i++) {
        zd_future_t *f[PS_MAX_WORKERS];
        zd_value_t *grads[PS_MAX_WORKERS];
        int rc = 0, n = 0, k = 0, who[PS_MAX_WORKERS], from[PS_MAX_WORKERS];
        for (int w = 0; w < d->W && rc == 0; w++)
            if (!gone[w] && (f[n] = compute(d, w)))
                who[n++] = w;
            else if (!gone[w] && !(gone[w] = worker_lost(d, NULL, w, i, &live)))
                rc = -1;
        /* each wait ends with the gradient, or once its worker is lost */
        for (int j = 0; j < n; j++)
            if (zd_future_wait(f[j], ZD_TIMEOUT_DEFAULT) == 0) {
                from[k] = who[j];
                grads[k++] = zd_future_value(f[j]);
            } else if (rc == 0 && !(gone[who[j]] = worker_lost(d, f[j], who[j], i, &live))) {
                rc = -1;
            }
        if (rc == 0 && live == 0)
            rc = zd_error_set("every worker was lost");
        if (rc == 0)
            rc = apply(d, grads, from, k);
        for (int j = 0; j < n; j++)
            zd_future_unref(f[j]);
        if (rc < 0 || evaluate(d, i) < 0)
            return -1;
    }
    return 0;
}

/*  Every worker has one gradient in flight; the first to come is applied
    and its worker starts again on the new weights, until iterations x
    workers are. With --max_staleness=K (stale synchronous parallel) a
    worker K updates ahead of the slowest is parked until the slowest
    catches up; the slowest never is, so there is always a gradient to
    wait for. */
static int train_async(driver_t *d)
{
    zd_future_t *f[PS_MAX_WORKERS];
    int who[PS_MAX_WORKERS], n = 0, rc = 0;
    bool parked[PS_MAX_WORKERS];
    const int64_t total = d->o->iterations * d->W, bound = d->o->max_staleness;
    int64_t launched = 0;
    for (int w = 0; w < d->W; w++)
        parked[w] = true;
    for (int64_t i = -1; rc == 0 && i < total; i++) {
        if (i >= 0) { /* the next gradient in */
            int k, w;
            if ((rc = zd_future_wait_any(f, n, ZD_TIMEOUT_DEFAULT, &k)) < 0)
                break;
            zd_future_t *done = f[k];
            zd_value_t *g = zd_future_value(done);
            parked[w = who[k]] = true;
            f[k] = f[--n];
            who[k] = who[n];
            rc = g ? apply(d, &g, &w, 1) : zd_error_set("%s", zd_future_error(done));
            zd_future_unref(done);
        }
        int64_t low = d->applied[0];
        for (int w = 1; w < d->W; w++)
            low = d->applied[w] < low ? d->applied[w] : low;
        for (int w = 0; w < d->W; w++)
            d->max_lead = d->applied[w] - low > d->max_lead ? d->applied[w] - low : d->max_lead;
        /* start again every parked worker within the bound */
        for (int w = 0; rc == 0 && w < d->W && launched < total; w++) {
            if (!parked[w] || (bound > 0 && d->applied[w] - low >= bound))
                continue;
            rc = (f[n] = compute(d, w)) ? 0 : -1;
            who[n] = w;
            n += rc == 0;
            parked[w] = rc < 0;
            launched += rc == 0;
        }
        if (rc == 0 && i >= 0)
            rc = evaluate(d, i);
    }
    /* on failure the others' replies are still coming: wait, then drop them */
    for (int k = 0; k < n; k++) {
        zd_future_wait(f[k], ZD_TIMEOUT_DEFAULT);
        zd_future_unref(f[k]);
    }
    return rc;
}

static int run(driver_t *d, ps_result_t *res)
{
    const ps_options_t *o = d->o;
    int ranks[PS_MAX_SERVERS];
    for (int s = 0; s < o->num_servers; s++)
        ranks[s] = 1 + s;
    if (!(d->model = zd_nn_tutorial_model_new(o->model, (uint64_t)o->seed)) ||
        !(d->servers = zd_ps_client_new_module(d->model, ranks, o->num_servers, NULL)) ||
        !(d->test = zd_dataset_load(o->data_dir, ZD_DATASET_TEST)) ||
        (o->test_size > 0 && zd_dataset_limit(d->test, o->test_size) < 0) ||
        create_workers(d) < 0 || zd_ps_client_pull(d->servers, ZD_TIMEOUT_DEFAULT) < 0 ||
        flatten(d) < 0)
        return -1;
    if (!o->quiet)
        printf(o->async ? "Running Asynchronous Parameter Server Training.\n"
                        : "Running synchronous parameter server training.\n");
    /* a sync iteration is a round of every worker's gradient, an async one one gradient */
    double t0 = train_now();
    progress_init(&d->progress, stdout, isatty(STDOUT_FILENO),
                  &(progress_config_t){.label = "driver",
                                       .unit = o->async ? "update" : "iteration",
                                       .total = o->iterations * (o->async ? d->W : 1),
                                       .samples_per_step = o->batch_size * (o->async ? 1 : d->W),
                                       .every_s = o->quiet ? 0 : o->progress_s},
                  t0);
    if ((o->async ? train_async(d) : train_sync(d)) < 0)
        return -1;
    progress_end(&d->progress, train_now());
    double secs = train_now() - t0 - d->eval_seconds;
    if (evaluate(d, -1) < 0)
        return -1;
    if (!o->quiet)
        printf("Final accuracy is %.1f.\n", 100.0 * d->accuracy);
    if (!o->quiet && o->async && (o->max_staleness > 0 || o->straggler_ms > 0)) {
        /* (only then: by default the output is Ray's example's) */
        printf("Updates applied per worker:");
        for (int w = 0; w < d->W; w++)
            printf(" %lld", (long long)d->applied[w]);
        printf(" (a worker was at most %lld ahead of the slowest)\n", (long long)d->max_lead);
    }
    if (res) {
        *res = (ps_result_t){.final_accuracy = d->accuracy,
                             .updates = d->updates,
                             .iters_per_s = secs > 0 ? (double)d->updates / secs : 0,
                             .weights = zd_tensor_ref(d->weights),
                             .max_lead = d->max_lead};
        memcpy(res->applied, d->applied, sizeof res->applied);
        for (int s = 0; s < o->num_servers; s++)
            res->server_steps[s] = zd_ps_client_version(d->servers, s);
    }
    return 0;
}

int ps_run_driver(const ps_options_t *o, ps_result_t *res)
{
    if (res)
        memset(res, 0, sizeof *res);
    if (ps_options_check(o, zd_rpc_world_size()) < 0)
        return -1;
    driver_t d = {.o = o, .W = o->num_workers};
    int rc = run(&d, res);
    char err[1024]; /* kept through the cleanup */
    snprintf(err, sizeof err, "%s", zd_error_last());
    /* releasing the RRefs frees the actors on their workers */
    zd_ps_client_free(d.servers);
    zd_tensor_unref(d.weights);
    for (int w = 0; w < d.W; w++)
        zd_rref_unref(d.workers[w]);
    zd_nn_module_free(d.model);
    zd_dataset_free(d.test);
    if (rc < 0)
        zd_error_set("%s", err);
    return rc;
}
