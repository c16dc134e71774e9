/* SPDX-License-Identifier: MIT */
/*  The parameter-server example's parameter servers (shards of the
    parameter-server layer) and its DataWorker actor (see ps_core.h). */
#include "examples/ps_core.h"
#include "examples/fault.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "examples/actor.h"
#include <zdist/dataset.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/rpc.h>

uint64_t ps_hash(const zd_tensor_t *t)
{
    const unsigned char *p = zd_tensor_raw(t);
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < zd_tensor_nbytes(t); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/*  ---- the stats of workers and of the driver's pushes ---- */

int ps_stats_add(ps_stats_t *st, uint64_t h)
{
    if ((st->n_hashes & (st->n_hashes - 1)) == 0) { /* 0, 1, 2, 4, ...: grow */
        size_t cap = st->n_hashes ? 2 * (size_t)st->n_hashes : 1;
        uint64_t *p = realloc(st->hashes, cap * sizeof *p);
        if (!p)
            return zd_error_set("out of memory");
        st->hashes = p;
    }
    st->hashes[st->n_hashes++] = h;
    return 0;
}

static zd_value_t *stats_value(const ps_stats_t *st)
{
    zd_value_t *v = zd_value_list((size_t)st->n_hashes + 1);
    if (!v || zd_list_append(v, zd_value_int(st->count)) < 0)
        goto fail;
    for (int64_t i = 0; i < st->n_hashes; i++)
        if (zd_list_append(v, zd_value_int((int64_t)st->hashes[i])) < 0)
            goto fail;
    return v;
fail:
    zd_value_unref(v);
    return NULL;
}

/*  ---- DataWorker ---- */

struct ps_worker {
    zd_nn_module_t *model;
    zd_dataset_t *train;
    int index;
    uint64_t seed;
    int64_t batch_size;
    int64_t *order;      /* this epoch's order */
    int64_t epoch, next; /* epochs begun; next sample position */
    bool track;
    int64_t delay_ms; /* a straggler: this much slower per gradient */
    ps_stats_t stats;
};

/*  Each worker reads its own order, different per worker and per epoch. */
static uint64_t order_seed(uint64_t seed, int index, int64_t epoch)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + (uint64_t)index * 0xbf58476d1ce4e5b9ull +
        (uint64_t)epoch * 0x94d049bb133111ebull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 31);
}

ps_worker_t *ps_worker_new(const char *model, int index, uint64_t seed, int64_t batch_size,
                           const char *data_dir, int64_t train_size, bool track)
{
    if (batch_size < 1) {
        zd_error_set("DataWorker: batch_size must be >= 1, got %lld", (long long)batch_size);
        return NULL;
    }
    ps_worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        zd_error_set("out of memory");
        return NULL;
    }
    w->index = index;
    w->seed = seed;
    w->batch_size = batch_size;
    w->track = track;
    if (!(w->model = zd_nn_tutorial_model_new(model, seed)) ||
        !(w->train = zd_dataset_load(data_dir, ZD_DATASET_TRAIN)) ||
        (train_size > 0 && zd_dataset_limit(w->train, train_size) < 0)) {
        ps_worker_free(w);
        return NULL;
    }
    return w;
}

void ps_worker_free(ps_worker_t *w)
{
    if (!w)
        return;
    zd_nn_module_free(w->model);
    zd_dataset_free(w->train);
    free(w->order);
    free(w->stats.hashes);
    free(w);
}

static int next_batch(ps_worker_t *w, zd_tensor_t **x, zd_tensor_t **y)
{
    if (!w->order || w->next >= zd_dataset_len(w->train)) {
        free(w->order);
        w->order = zd_dataset_order(w->train, order_seed(w->seed, w->index, w->epoch));
        if (!w->order)
            return zd_error_set("out of memory");
        w->epoch++;
        w->next = 0;
    }
    if (zd_dataset_batch(w->train, w->order, w->next, w->batch_size, x, y) < 0)
        return -1;
    w->next += w->batch_size;
    return 0;
}

int ps_worker_compute(ps_worker_t *w, const zd_tensor_t *weights, zd_tensor_t **grad)
{
    zd_tensor_t *x = NULL, *y = NULL, *logprobs = NULL, *loss = NULL;
    *grad = NULL;
    int rc = -1;
    zd_nn_module_zero_grad(w->model);
    if (zd_nn_module_vector_to_params(w->model, weights) < 0 || next_batch(w, &x, &y) < 0 ||
        zd_nn_module_forward(w->model, &x, 1, &logprobs, 1) < 0 ||
        zd_nn_nll_loss(logprobs, y, &loss) < 0 || zd_autograd_backward(loss, NULL, false) < 0 ||
        zd_nn_module_grads_to_vector(w->model, grad) < 0)
        goto out;
    if (w->track && ps_stats_add(&w->stats, ps_hash(*grad)) < 0)
        goto out;
    w->stats.count++;
    rc = 0;
out:
    zd_nn_module_zero_grad(w->model);
    zd_tensor_unref(loss);
    zd_tensor_unref(logprobs);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    if (rc < 0)
        zd_tensor_unref_p(grad);
    return rc;
}

/*  ---- the parameter servers ---- */

/*  The shard's on_step: the parameter server's "step" fault point. */
static void step_point(void *arg, int shard, int64_t version)
{
    (void)arg, (void)shard, (void)version;
    fault_point(zd_rpc_rank(), "step"); /* tests only (fault.h) */
}

int ps_server_new(const ps_options_t *o, int rank, zd_ps_server_t **srv)
{
    *srv = NULL;
    if (rank < 1 || rank > o->num_servers)
        return 0;
    zd_nn_module_t *m = zd_nn_tutorial_model_new(o->model, (uint64_t)o->seed);
    if (!m)
        return -1;
    zd_optim_config_t sgd = zd_optim_sgd_defaults(o->lr);
    zd_ps_options_t po = zd_ps_options_default();
    po.on_step = step_point;
    *srv = zd_ps_server_new_module(m, rank - 1, o->num_servers, &sgd, &po);
    zd_nn_module_free(m);
    return *srv ? 0 : -1;
}

/*  ---- DataWorker ---- */

static void worker_free(void *obj)
{
    ps_worker_free(obj);
}

static const actor_class_t worker_class = {"DataWorker", worker_free};

/*  "DataWorker"(model, index, seed, batch_size, data_dir or none, train_size, track
                 [, delay_ms]) */
static zd_value_t *fn_worker_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *model, *dir = NULL;
    int64_t index, seed, batch, train_size, track, delay = 0;
    if (zd_rpc_arg_string(args, 0, &model) < 0 || zd_rpc_arg_int(args, 1, &index) < 0 ||
        zd_rpc_arg_int(args, 2, &seed) < 0 || zd_rpc_arg_int(args, 3, &batch) < 0 ||
        (zd_value_kind(zd_list_get(args, 4)) != ZD_VALUE_NONE &&
         zd_rpc_arg_string(args, 4, &dir) < 0) ||
        zd_rpc_arg_int(args, 5, &train_size) < 0 || zd_rpc_arg_int(args, 6, &track) < 0 ||
        (zd_list_len(args) > 7 && zd_rpc_arg_int(args, 7, &delay) < 0))
        return NULL;
    if (delay < 0 || delay > 10000) {
        zd_error_set("DataWorker: delay_ms must be in 0..10000, got %lld", (long long)delay);
        return NULL;
    }
    ps_worker_t *w =
        ps_worker_new(model, (int)index, (uint64_t)seed, batch, dir, train_size, track != 0);
    if (w)
        w->delay_ms = delay;
    return w ? actor_new(&worker_class, w) : NULL;
}

/*  "DataWorker.compute_gradients"(actor, weights) -> gradient */
static zd_value_t *fn_compute_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    fault_point(zd_rpc_rank(), "backward"); /* tests only (fault.h) */
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &worker_class);
    zd_tensor_t *weights, *grad = NULL;
    if (!a || zd_rpc_arg_tensor(args, 1, &weights) < 0)
        return NULL;
    actor_lock(a);
    ps_worker_t *w = actor_object(a);
    int rc = ps_worker_compute(w, weights, &grad);
    int64_t delay = w->delay_ms;
    actor_unlock(a);
    if (rc == 0 && delay > 0) {
        /* A straggler: a slower machine, as far as the driver can tell. */
        struct timespec ts = {delay / 1000, delay % 1000 * 1000000};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
    }
    if (rc < 0) {
        zd_error_wrap("DataWorker.compute_gradients");
        return NULL;
    }
    zd_value_t *v = zd_value_tensor(grad);
    zd_tensor_unref(grad);
    return v;
}

/*  "PS.stats"(actor) -> [count, hash...] of a worker. */
static zd_value_t *fn_stats(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &worker_class);
    if (!a)
        return NULL;
    ps_stats_t *st = &((ps_worker_t *)actor_object(a))->stats;
    actor_lock(a);
    zd_value_t *v = stats_value(st);
    actor_unlock(a);
    return v;
}

int ps_register(void)
{
    if (actor_register() < 0 || zd_rpc_register("DataWorker", fn_worker_new, NULL) < 0 ||
        zd_rpc_register("DataWorker.compute_gradients", fn_compute_gradients, NULL) < 0 ||
        zd_rpc_register("PS.stats", fn_stats, NULL) < 0)
        return -1;
    return 0;
}
