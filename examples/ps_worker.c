/* SPDX-License-Identifier: MIT */
/*  Ray's DataWorker, an actor on its own rank, and the parameter servers,
    shards of the parameter-server layer (ps_core.h). */
#include "examples/ps_core.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include <zdist/autograd.h>
#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/rpc.h>
#include "examples/actor.h"
#include "examples/fault.h"

struct ps_worker {
    zd_nn_module_t *model;
    zd_dataset_t *train;
    int index;
    uint64_t seed;
    int64_t batch_size, delay_ms;
    int64_t *order;      /* this epoch's */
    int64_t epoch, next; /* epochs begun; the next sample's position */
};

ps_worker_t *ps_worker_new(const char *model, int index, uint64_t seed, int64_t batch_size,
                           const char *data_dir, int64_t train_size)
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
    *w = (ps_worker_t){.index = index, .seed = seed, .batch_size = batch_size};
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
    free(w);
}

/*  Each worker reads the data in its own order, a new one each epoch. */
static int next_batch(ps_worker_t *w, zd_tensor_t **x, zd_tensor_t **y)
{
    if (!w->order || w->next >= zd_dataset_len(w->train)) {
        uint64_t z = w->seed * 0x9e3779b97f4a7c15ull + (uint64_t)w->index * 0xbf58476d1ce4e5b9ull +
            (uint64_t)w->epoch++ * 0x94d049bb133111ebull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        free(w->order);
        if (!(w->order = zd_dataset_order(w->train, z ^ (z >> 31))))
            return zd_error_set("out of memory");
        w->next = 0;
    }
    w->next += w->batch_size;
    return zd_dataset_batch(w->train, w->order, w->next - w->batch_size, w->batch_size, x, y);
}

int ps_worker_compute(ps_worker_t *w, const zd_tensor_t *weights, zd_tensor_t **grad)
{
    zd_tensor_t *x = NULL, *y = NULL, *logprobs = NULL, *loss = NULL;
    *grad = NULL;
    zd_nn_module_zero_grad(w->model);
    int rc = zd_nn_module_vector_to_params(w->model, weights) < 0 || next_batch(w, &x, &y) < 0 ||
            zd_nn_module_forward(w->model, &x, 1, &logprobs, 1) < 0 ||
            zd_nn_nll_loss(logprobs, y, &loss) < 0 || zd_autograd_backward(loss, NULL, false) < 0 ||
            zd_nn_module_grads_to_vector(w->model, grad) < 0
        ? -1
        : 0;
    zd_nn_module_zero_grad(w->model);
    zd_tensor_unref(loss);
    zd_tensor_unref(logprobs);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

int ps_server_new(const ps_options_t *o, int rank, zd_ps_server_t **srv)
{
    *srv = NULL;
    if (rank < 1 || rank > o->num_servers)
        return 0;
    zd_nn_module_t *m = zd_nn_tutorial_model_new(o->model, (uint64_t)o->seed);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(o->lr);
    zd_ps_options_t po = zd_ps_options_default();
    *srv = m ? zd_ps_server_new_module(m, rank - 1, o->num_servers, &sgd, &po) : NULL;
    zd_nn_module_free(m);
    return *srv ? 0 : -1;
}

/*  ---- the actor ---- */

static void worker_free(void *obj)
{
    ps_worker_free(obj);
}

static const actor_class_t worker_class = {"DataWorker", worker_free};

static zd_value_t *fn_worker_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *model, *dir = NULL;
    int64_t index, seed, batch, train_size, delay = 0;
    if (zd_rpc_arg_string(args, 0, &model) < 0 || zd_rpc_arg_int(args, 1, &index) < 0 ||
        zd_rpc_arg_int(args, 2, &seed) < 0 || zd_rpc_arg_int(args, 3, &batch) < 0 ||
        (zd_value_kind(zd_list_get(args, 4)) != ZD_VALUE_NONE &&
         zd_rpc_arg_string(args, 4, &dir) < 0) ||
        zd_rpc_arg_int(args, 5, &train_size) < 0 ||
        (zd_list_len(args) > 6 && zd_rpc_arg_int(args, 6, &delay) < 0))
        return NULL;
    if (delay < 0 || delay > 10000) {
        zd_error_set("DataWorker: delay_ms must be in 0..10000, got %lld", (long long)delay);
        return NULL;
    }
    ps_worker_t *w = ps_worker_new(model, (int)index, (uint64_t)seed, batch, dir, train_size);
    if (w)
        w->delay_ms = delay;
    return w ? actor_new(&worker_class, w) : NULL;
}

static zd_value_t *fn_compute_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    fault_point(zd_rpc_rank(), "backward"); /* tests only (fault.h) */
    actor_t *a = actor_get(args, &worker_class);
    zd_tensor_t *weights, *grad = NULL;
    if (!a || zd_rpc_arg_tensor(args, 1, &weights) < 0)
        return NULL;
    actor_lock(a);
    ps_worker_t *w = actor_object(a);
    int rc = ps_worker_compute(w, weights, &grad);
    struct timespec ts = {w->delay_ms / 1000, w->delay_ms % 1000 * 1000000};
    actor_unlock(a);
    /* A straggler: a slower machine, as far as the driver can tell. */
    while (rc == 0 && nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
    zd_value_t *v = rc == 0 ? zd_value_tensor(grad) : NULL;
    if (rc < 0)
        zd_error_wrap("DataWorker.compute_gradients");
    zd_tensor_unref(grad);
    return v;
}

int ps_register(void)
{
    return actor_register() < 0 || zd_rpc_register("DataWorker", fn_worker_new, NULL) < 0 ||
            zd_rpc_register("DataWorker.compute_gradients", fn_compute_gradients, NULL) < 0
        ? -1
        : 0;
}
