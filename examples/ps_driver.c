/* SPDX-License-Identifier: MIT */
/*  The driver of the parameter-server example (rank 0): Ray's synchronous
    and asynchronous training loops, over the data workers of ps_objects.c
    and the parameter-server layer's shards, whose trainer the driver is. */
#include "examples/ps_core.h"
#include "examples/fault.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "examples/actor.h"
#include "examples/progress.h"
#include "examples/train_common.h"
#include <zdist/dataset.h>
#include <zdist/rpc.h>

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

/*  Whether the model's tensors leave no server without one: the layer's
    shards hold whole tensors (zd_ps_split). 0, or -1 naming the limit. */
static int servers_fit(const ps_options_t *o)
{
    zd_nn_module_t *m = zd_nn_tutorial_model_new(o->model, 0);
    /* each tensor once, as the servers count them (a tied one is one) */
    zd_named_tensors_t *params = m ? zd_named_tensors_new() : NULL;
    for (int i = 0; params && i < zd_nn_module_n_params(m); i++)
        if (zd_named_tensors_add(params, zd_nn_module_param_name(m, i), zd_nn_module_param(m, i)) <
            0) {
            zd_named_tensors_free(params);
            params = NULL;
        }
    int n = params ? (int)zd_named_tensors_len(params) : 0, rc = params ? 0 : -1;
    int *shard_of = n > 0 ? calloc((size_t)n, sizeof *shard_of) : NULL;
    bool *used = calloc((size_t)o->num_servers, sizeof *used);
    if (rc == 0 && (!shard_of || !used))
        rc = zd_error_set("out of memory");
    if (rc == 0)
        rc = zd_ps_split(params, o->num_servers, shard_of, n);
    for (int i = 0; rc == 0 && i < n; i++)
        used[shard_of[i]] = true;
    for (int s = 0; rc == 0 && s < o->num_servers; s++)
        if (!used[s])
            rc = zd_error_set("--num_servers=%d: the %s's %d parameter tensors leave server %d "
                              "without one (each server holds whole tensors)",
                              o->num_servers, o->model, n, s);
    free(used);
    free(shard_of);
    zd_named_tensors_free(params);
    zd_nn_module_free(m);
    return rc;
}

int ps_options_check(const ps_options_t *o, int world_size)
{
    if (o->num_workers < 1 || o->num_workers > PS_MAX_WORKERS)
        return zd_error_set("--num_workers must be in 1..%d, got %d", PS_MAX_WORKERS,
                            o->num_workers);
    if (o->num_servers < 1 || o->num_servers > PS_MAX_SERVERS)
        return zd_error_set("--num_servers must be in 1..%d, got %d", PS_MAX_SERVERS,
                            o->num_servers);
    if (o->iterations < 0 || o->batch_size < 1 || !(o->lr > 0) || o->eval_interval < 0 ||
        o->test_size < 0 || o->train_size < 0 || o->max_staleness < 0)
        return zd_error_set("--iterations, --eval_interval, --test_size, --train_size and "
                            "--max_staleness must be >= 0, --batch_size >= 1 and --lr > 0");
    if (o->straggler_ms < 0 || o->straggler_ms > 10000) /* well within a call's timeout */
        return zd_error_set("--straggler_ms must be in 0..10000, got %lld",
                            (long long)o->straggler_ms);
    if (servers_fit(o) < 0)
        return -1;
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
    zd_tensor_unref_p(&r->weights);
    free(r->pushed.hashes);
    for (int i = 0; i < PS_MAX_WORKERS; i++)
        free(r->workers[i].hashes);
    memset(r, 0, sizeof *r);
}

typedef struct {
    const ps_options_t *o;
    int S, W;
    zd_ps_client_t *servers; /* the shards on ranks 1..S */
    zd_rref_t *workers[PS_MAX_WORKERS];
    zd_nn_module_t *model; /* the replica: the weights last pulled */
    zd_tensor_t *weights;  /* the same, flat: what the workers get */
    zd_dataset_t *test;
    ps_stats_t pushed; /* with o->track */
    double eval_seconds;
    double accuracy;
    progress_t progress; /* off unless o->progress_s > 0 and not quiet */
} driver_t;

/*  Waits until every actor exists (a DataWorker loads its data first), so
    that a failed creation is reported as such and the timing starts with
    everyone ready. */
static int wait_created(zd_rref_t *const *rrefs, int n)
{
    for (int i = 0; i < n; i++)
        if (actor_wait(rrefs[i]) < 0)
            return zd_error_wrap("creating the actor on %s", zd_rref_owner_name(rrefs[i]));
    return 0;
}

static int create_workers(driver_t *d)
{
    const ps_options_t *o = d->o;
    for (int w = 0; w < d->W; w++) {
        int64_t delay = w == 0 ? o->straggler_ms : 0;
        zd_value_t *a = o->data_dir ? ZD_ARGS(o->model, w, o->seed, o->batch_size, o->data_dir,
                                              o->train_size, o->track, delay)
                                    : ZD_ARGS(o->model, w, o->seed, o->batch_size, zd_value_none(),
                                              o->train_size, o->track, delay);
        d->workers[w] = a ? zd_rpc_remote(1 + d->S + w, "DataWorker", a, ZD_TIMEOUT_DEFAULT) : NULL;
        zd_value_unref(a);
        if (!d->workers[w])
            return -1;
    }
    return 0;
}

/*  The replica's weights, flat, for the workers. */
static int flatten(driver_t *d)
{
    zd_tensor_t *flat;
    if (zd_nn_module_params_to_vector(d->model, &flat) < 0)
        return -1;
    zd_tensor_unref(d->weights);
    d->weights = flat;
    return 0;
}

/*  Ray's ps.get_weights(): the shards' parameters into the replica. */
static int pull(driver_t *d)
{
    return zd_ps_client_pull(d->servers, ZD_TIMEOUT_DEFAULT) < 0 ? -1 : flatten(d);
}

static int evaluate(driver_t *d, double *acc)
{
    fault_point(zd_rpc_rank(), "evaluation"); /* tests only (fault.h) */
    double t0 = train_now();
    int rc = train_evaluate(d->model, d->test, acc);
    double dt = train_now() - t0;
    d->eval_seconds += dt;
    progress_skip(&d->progress, dt);
    return rc;
}

static int maybe_evaluate(driver_t *d, int64_t i)
{
    if (d->o->eval_interval == 0 || i % d->o->eval_interval != 0)
        return 0;
    if (evaluate(d, &d->accuracy) < 0)
        return -1;
    if (!d->o->quiet) {
        progress_clear(&d->progress);
        printf("Iter %lld: accuracy is %.1f\n", (long long)i, 100.0 * d->accuracy);
    }
    return 0;
}

/*  Adds the flat gradient g into the replica's .grad, parameter by
    parameter (zd_tensor_accumulate_grad: the first one copied, the next
    ones added in order). */
static int add_grads(driver_t *d, zd_tensor_t *g)
{
    int64_t off = 0;
    int rc = 0;
    for (int i = 0; i < zd_nn_module_n_params(d->model) && rc == 0; i++) {
        zd_tensor_t *p = zd_nn_module_param(d->model, i), *part = NULL, *view = NULL;
        rc = zd_tensor_narrow(g, 0, off, zd_tensor_numel(p), &part);
        if (rc == 0)
            rc = zd_tensor_reshape(part, zd_tensor_shape(p), zd_tensor_ndim(p), &view);
        if (rc == 0)
            rc = zd_tensor_accumulate_grad(p, view);
        off += zd_tensor_numel(p);
        zd_tensor_unref(view);
        zd_tensor_unref(part);
    }
    return rc;
}

/*  Ray's ps.apply_gradients(*gradients): the n gradients (flat, each as
    compute_gradients returns it) summed in order and pushed, one step on
    every shard, whose answers bring the new weights (push_pull). */
static int apply(driver_t *d, zd_value_t *const *grads, int n)
{
    fault_point(zd_rpc_rank(), "step"); /* tests only (fault.h) */
    int rc = 0;
    zd_nn_module_zero_grad(d->model);
    for (int k = 0; k < n && rc == 0; k++) {
        zd_tensor_t *g;
        if (zd_value_get_tensor(grads[k], &g) < 0 || zd_tensor_dtype(g) != ZD_FLOAT32 ||
            zd_tensor_numel(g) != zd_tensor_numel(d->weights))
            rc = zd_error_set("compute_gradients returned no float32 gradient of %lld values",
                              (long long)zd_tensor_numel(d->weights));
        else
            rc = add_grads(d, g);
        if (rc == 0 && d->o->track)
            rc = ps_stats_add(&d->pushed, ps_hash(g));
    }
    if (rc == 0 && n > 0)
        rc = zd_ps_client_push_pull(d->servers, ZD_TIMEOUT_DEFAULT);
    if (rc == 0 && n > 0) {
        d->pushed.count++;
        rc = flatten(d);
    }
    zd_nn_module_zero_grad(d->model);
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

/*  Sync mode: a worker whose process is gone (RPC declared it lost) is
    left out of the rounds from then on, and the driver says so; any other
    failure, or no worker left, ends the training. Returns 1 when worker w
    was lost (the future's error is then consumed), 0 otherwise. */
static int sync_worker_lost(driver_t *d, zd_future_t *f, int w, int64_t i, bool *gone, int *live)
{
    if (f ? zd_future_error_code(f) != ZD_ERR_PEER : zd_error_code() != ZD_ERR_PEER)
        return 0;
    /* A send can fail before RPC has declared the peer lost (about 1 s
       after its connection went down): wait that long for the verdict. */
    int rank = zd_rref_owner(d->workers[w]);
    double until = train_now() + 5;
    while (!zd_rpc_peer_is_lost(rank) && train_now() < until) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (!zd_rpc_peer_is_lost(rank))
        return 0;
    gone[w] = true;
    --*live;
    progress_clear(&d->progress);
    printf("worker %d (rank %d) lost at iteration %lld: %s; going on with the %d worker(s) "
           "left\n",
           w, zd_rref_owner(d->workers[w]), (long long)i, f ? zd_future_error(f) : zd_error_last(),
           *live);
    fflush(stdout);
    return 1;
}

static int train_sync(driver_t *d, int64_t *updates)
{
    zd_future_t *f[PS_MAX_WORKERS];
    zd_value_t *grads[PS_MAX_WORKERS];
    bool gone[PS_MAX_WORKERS] = {false};
    int live = d->W;
    for (int64_t i = 0; i < d->o->iterations; i++) {
        int rc = 0, n = 0, who[PS_MAX_WORKERS];
        for (int w = 0; w < d->W && rc == 0; w++) {
            if (gone[w])
                continue;
            if ((f[n] = compute(d, w)))
                who[n++] = w;
            else if (!sync_worker_lost(d, NULL, w, i, gone, &live))
                rc = -1;
        }
        /* Each wait ends: with the gradient, or once its worker is lost. */
        int k = 0;
        for (int j = 0; j < n; j++) {
            if (zd_future_wait(f[j], ZD_TIMEOUT_DEFAULT) == 0)
                grads[k++] = zd_future_value(f[j]);
            else if (rc == 0 && !sync_worker_lost(d, f[j], who[j], i, gone, &live))
                rc = -1;
        }
        if (rc == 0 && live == 0)
            rc = zd_error_set("every worker was lost");
        if (rc == 0 && k > 0)
            rc = apply(d, grads, k);
        for (int j = 0; j < n; j++)
            zd_future_unref(f[j]);
        if (rc < 0)
            return -1;
        ++*updates;
        progress_step(&d->progress, train_now(), NAN);
        if (maybe_evaluate(d, i) < 0)
            return -1;
    }
    return 0;
}

/*  The lowest count of applied updates over all workers. */
static int64_t slowest(const driver_t *d, const int64_t *applied)
{
    int64_t m = applied[0];
    for (int w = 1; w < d->W; w++)
        if (applied[w] < m)
            m = applied[w];
    return m;
}

/*  Every worker has one computation in flight; the first to finish is
    applied and that worker starts again from the new weights. No more
    computations start than iterations x workers, so each one is applied
    exactly once.
    With --max_staleness=K (stale synchronous parallel), a worker that is K
    updates ahead of the slowest waits, parked, until the slowest catches
    up: its next gradient is then computed on weights that miss at most K
    of the slowest worker's updates. The slowest worker is never parked,
    so the loop always has a computation to wait for. */
static int train_async(driver_t *d, int64_t *updates, int64_t *applied, int64_t *max_lead)
{
    zd_future_t *f[PS_MAX_WORKERS];
    int who[PS_MAX_WORKERS], n = 0, rc = 0;
    bool parked[PS_MAX_WORKERS] = {false};
    const int64_t total = d->o->iterations * d->W, bound = d->o->max_staleness;
    int64_t launched = 0;
    for (int w = 0; w < d->W && launched < total; w++, launched++) {
        if (!(f[n] = compute(d, w))) {
            rc = -1;
            break;
        }
        who[n++] = w;
    }
    for (int64_t i = 0; rc == 0 && i < total; i++) {
        int k;
        if ((rc = zd_future_wait_any(f, n, ZD_TIMEOUT_DEFAULT, &k)) < 0)
            break;
        zd_future_t *done = f[k];
        int w = who[k];
        f[k] = f[n - 1];
        who[k] = who[--n];
        zd_value_t *g = zd_future_value(done);
        if (!g) {
            rc = zd_error_set("%s", zd_future_error(done));
        } else {
            rc = apply(d, &g, 1);
        }
        zd_future_unref(done);
        if (rc < 0)
            break;
        ++*updates;
        progress_step(&d->progress, train_now(), NAN);
        applied[w]++;
        int64_t low = slowest(d, applied);
        if (applied[w] - low > *max_lead)
            *max_lead = applied[w] - low;
        parked[w] = true;
        /* Start again every parked worker within the bound (w among them). */
        for (int v = 0; v < d->W && launched < total; v++) {
            if (!parked[v] || (bound > 0 && applied[v] - low >= bound))
                continue;
            if (!(f[n] = compute(d, v))) {
                rc = -1;
                break;
            }
            who[n++] = v;
            parked[v] = false;
            launched++;
        }
        if (rc == 0)
            rc = maybe_evaluate(d, i);
    }
    /* On failure the others' replies are still coming: wait, then drop them. */
    for (int k = 0; k < n; k++) {
        zd_future_wait(f[k], ZD_TIMEOUT_DEFAULT);
        zd_future_unref(f[k]);
    }
    return rc;
}

static int fetch_stats(zd_rref_t *r, ps_stats_t *st)
{
    zd_value_t *v;
    if (zd_rref_rpc_sync(r, "PS.stats", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
        return -1;
    size_t n = zd_list_len(v);
    int rc = n >= 1 ? zd_rpc_arg_int(v, 0, &st->count) : zd_error_set("PS.stats: empty reply");
    if (rc == 0 && n > 1 && !(st->hashes = malloc((n - 1) * sizeof *st->hashes)))
        rc = zd_error_set("out of memory");
    for (size_t i = 1; rc == 0 && i < n; i++) {
        int64_t h;
        rc = zd_rpc_arg_int(v, i, &h);
        st->hashes[i - 1] = (uint64_t)h;
        st->n_hashes = (int64_t)i;
    }
    zd_value_unref(v);
    return rc;
}

static int run(driver_t *d, ps_result_t *res)
{
    const ps_options_t *o = d->o;
    int ranks[PS_MAX_SERVERS];
    for (int s = 0; s < d->S; s++)
        ranks[s] = 1 + s;
    if (!(d->model = zd_nn_tutorial_model_new(o->model, (uint64_t)o->seed)) ||
        !(d->servers = zd_ps_client_new_module(d->model, ranks, d->S, NULL)) ||
        !(d->test = zd_dataset_load(o->data_dir, ZD_DATASET_TEST)) ||
        (o->test_size > 0 && zd_dataset_limit(d->test, o->test_size) < 0) ||
        create_workers(d) < 0 || wait_created(d->workers, d->W) < 0 || pull(d) < 0)
        return -1;
    if (!o->quiet) {
        printf(o->async ? "Running Asynchronous Parameter Server Training.\n"
                        : "Running synchronous parameter server training.\n");
        fflush(stdout);
    }
    int64_t updates = 0, applied[PS_MAX_WORKERS] = {0}, max_lead = 0;
    double t0 = train_now();
    /* a sync iteration is a round of every worker's gradient, an async one
       a single gradient applied */
    progress_init(&d->progress, stdout, isatty(STDOUT_FILENO),
                  &(progress_config_t){.label = "driver",
                                       .unit = o->async ? "update" : "iteration",
                                       .total = o->async ? o->iterations * d->W : o->iterations,
                                       .samples_per_step = o->batch_size * (o->async ? 1 : d->W),
                                       .every_s = o->quiet ? 0 : o->progress_s},
                  t0);
    if ((o->async ? train_async(d, &updates, applied, &max_lead) : train_sync(d, &updates)) < 0)
        return -1;
    progress_end(&d->progress, train_now());
    double secs = train_now() - t0 - d->eval_seconds;
    if (evaluate(d, &d->accuracy) < 0)
        return -1;
    if (!o->quiet) {
        printf("Final accuracy is %.1f.\n", 100.0 * d->accuracy);
        if (o->async && (o->max_staleness > 0 || o->straggler_ms > 0)) {
            /* (only then: by default the output is Ray's example's) */
            printf("Updates applied per worker:");
            for (int w = 0; w < d->W; w++)
                printf(" %lld", (long long)applied[w]);
            printf(" (a worker was at most %lld ahead of the slowest)\n", (long long)max_lead);
        }
        fflush(stdout);
    }
    if (!res)
        return 0;
    res->final_accuracy = d->accuracy;
    res->updates = updates;
    res->train_seconds = secs;
    res->iters_per_s = secs > 0 ? (double)updates / secs : 0;
    memcpy(res->applied, applied, sizeof res->applied);
    res->max_lead = max_lead;
    if (!o->async) /* every round applies one gradient of each */
        for (int w = 0; w < d->W; w++)
            res->applied[w] = updates;
    res->weights = zd_tensor_ref(d->weights);
    for (int s = 0; s < d->S; s++)
        res->server_steps[s] = zd_ps_client_version(d->servers, s);
    res->pushed = d->pushed;
    d->pushed = (ps_stats_t){0};
    for (int w = 0; o->track && w < d->W; w++)
        if (fetch_stats(d->workers[w], &res->workers[w]) < 0)
            return -1;
    return 0;
}

int ps_run_driver(const ps_options_t *o, ps_result_t *res)
{
    if (res)
        memset(res, 0, sizeof *res);
    if (ps_options_check(o, zd_rpc_world_size()) < 0)
        return -1;
    driver_t d = {.o = o, .S = o->num_servers, .W = o->num_workers};
    int rc = run(&d, res);
    char err[1024]; /* kept through the cleanup */
    snprintf(err, sizeof err, "%s", zd_error_last());
    /* Releasing the RRefs frees the actors on their workers. */
    zd_ps_client_free(d.servers);
    zd_tensor_unref(d.weights);
    free(d.pushed.hashes);
    for (int w = 0; w < d.W; w++)
        zd_rref_unref(d.workers[w]);
    zd_nn_module_free(d.model);
    zd_dataset_free(d.test);
    if (rc < 0) {
        zd_error_set("%s", err);
        if (res)
            ps_result_free(res);
    }
    return rc;
}
