/* SPDX-License-Identifier: MIT */
/*  The two actors of the parameter-server example: ParameterServer and
    DataWorker (see ps_core.h), and the flat weight slices they exchange. */
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

/*  ---- flat slices ---- */

void ps_slice_range(int64_t numel, int s, int n, int64_t *lo, int64_t *hi)
{
    *lo = numel * s / n;
    *hi = numel * (s + 1) / n;
}

/*  Elements [lo, hi) of the flat vector v, as a tensor of their own. */
static zd_tensor_t *flat_range(zd_tensor_t *v, int64_t lo, int64_t hi)
{
    zd_tensor_t *view = NULL, *copy = NULL;
    if (zd_tensor_narrow(v, 0, lo, hi - lo, &view) == 0)
        copy = zd_tensor_detach_copy(view);
    zd_tensor_unref(view);
    return copy;
}

zd_tensor_t *ps_model_slice(zd_nn_module_t *m, int64_t lo, int64_t hi)
{
    if (lo < 0 || hi > zd_nn_module_numel(m) || lo >= hi) {
        zd_error_set("slice [%lld, %lld) outside the model's %lld weights", (long long)lo,
                     (long long)hi, (long long)zd_nn_module_numel(m));
        return NULL;
    }
    zd_tensor_t *all;
    if (zd_nn_module_params_to_vector(m, &all) < 0)
        return NULL;
    zd_tensor_t *t =
        lo == 0 && hi == zd_tensor_numel(all) ? zd_tensor_ref(all) : flat_range(all, lo, hi);
    zd_tensor_unref(all);
    return t;
}

static int check_slices(zd_nn_module_t *m, zd_tensor_t *const *slices, int n)
{
    int64_t total = 0;
    for (int s = 0; s < n; s++) {
        if (zd_tensor_dtype(slices[s]) != ZD_FLOAT32)
            return zd_error_set("weight slice %d is %s, not float32", s,
                                zd_tensor_dtype_name(zd_tensor_dtype(slices[s])));
        total += zd_tensor_numel(slices[s]);
    }
    if (total != zd_nn_module_numel(m))
        return zd_error_set("%d weight slices hold %lld values; the %s has %lld", n,
                            (long long)total, zd_nn_module_type(m),
                            (long long)zd_nn_module_numel(m));
    return 0;
}

int ps_model_load(zd_nn_module_t *m, zd_tensor_t *const *slices, int n)
{
    if (check_slices(m, slices, n) < 0)
        return -1;
    if (n == 1)
        return zd_nn_module_vector_to_params(m, slices[0]);
    zd_tensor_t *all;
    if (zd_tensor_cat(slices, n, 0, &all) < 0)
        return -1;
    int rc = zd_nn_module_vector_to_params(m, all);
    zd_tensor_unref(all);
    return rc;
}

uint64_t ps_hash(const zd_tensor_t *t)
{
    const unsigned char *p = zd_tensor_raw(t);
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < zd_tensor_nbytes(t); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/*  ---- stats kept by both actors ---- */

static int stats_add(ps_stats_t *st, uint64_t h)
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

int ps_worker_compute(ps_worker_t *w, zd_tensor_t *const *weights, int n, zd_tensor_t **grads)
{
    zd_tensor_t *x = NULL, *y = NULL, *logprobs = NULL, *loss = NULL, *all = NULL;
    for (int s = 0; s < n; s++)
        grads[s] = NULL;
    int rc = -1;
    zd_nn_module_zero_grad(w->model);
    if (ps_model_load(w->model, weights, n) < 0 || next_batch(w, &x, &y) < 0 ||
        zd_nn_module_forward(w->model, &x, 1, &logprobs, 1) < 0 ||
        zd_nn_nll_loss(logprobs, y, &loss) < 0 || zd_autograd_backward(loss, NULL, false) < 0)
        goto out;
    /* The slices are views of one vector of every gradient. */
    if (zd_nn_module_grads_to_vector(w->model, &all) < 0)
        goto out;
    int64_t off = 0;
    for (int s = 0; s < n; s++) {
        int64_t len = zd_tensor_numel(weights[s]);
        if (zd_tensor_narrow(all, 0, off, len, &grads[s]) < 0)
            goto out;
        off += len;
        if (w->track && stats_add(&w->stats, ps_hash(grads[s])) < 0)
            goto out;
    }
    w->stats.count++;
    rc = 0;
out:
    zd_nn_module_zero_grad(w->model);
    zd_tensor_unref(all);
    zd_tensor_unref(loss);
    zd_tensor_unref(logprobs);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    if (rc < 0)
        for (int s = 0; s < n; s++)
            zd_tensor_unref_p(&grads[s]);
    return rc;
}

/*  ---- ParameterServer ---- */

typedef struct {
    zd_tensor_t *weights; /* the flat slice, a leaf stepped by opt */
    zd_optim_t *opt;
    bool track;
    ps_stats_t stats;
} ps_server_t;

static void server_free(void *obj)
{
    ps_server_t *ps = obj;
    zd_optim_free(ps->opt);
    zd_tensor_unref(ps->weights);
    free(ps->stats.hashes);
    free(ps);
}

static void worker_free(void *obj)
{
    ps_worker_free(obj);
}

static const actor_class_t server_class = {"ParameterServer", server_free};
static const actor_class_t worker_class = {"DataWorker", worker_free};

/*  "ParameterServer"(model, seed, lr, index, num_servers, track) */
static zd_value_t *fn_server_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *model;
    int64_t seed, index, n, track;
    double lr;
    if (ZD_UNPACK(args, &model, &seed, &lr, &index, &n, &track) < 0)
        return NULL;
    if (n < 1 || index < 0 || index >= n) {
        zd_error_set("ParameterServer: slice %lld of %lld does not exist", (long long)index,
                     (long long)n);
        return NULL;
    }
    ps_server_t *ps = calloc(1, sizeof *ps);
    zd_nn_module_t *m = zd_nn_tutorial_model_new(model, (uint64_t)seed);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(lr);
    int64_t lo, hi;
    if (!ps || !m)
        goto fail;
    ps_slice_range(zd_nn_module_numel(m), (int)index, (int)n, &lo, &hi);
    if (!(ps->weights = ps_model_slice(m, lo, hi)) ||
        zd_tensor_set_requires_grad(ps->weights, true) < 0 ||
        !(ps->opt = zd_optim_new(&cfg, &ps->weights, 1)))
        goto fail;
    ps->track = track != 0;
    zd_nn_module_free(m);
    return actor_new(&server_class, ps);
fail:
    if (!ps)
        zd_error_set("out of memory");
    zd_nn_module_free(m);
    if (ps)
        server_free(ps);
    return NULL;
}

/*  A copy of the weights: the reply must not change under the next step. */
static zd_value_t *weights_value(ps_server_t *ps)
{
    zd_tensor_t *w = zd_tensor_detach_copy(ps->weights);
    zd_value_t *v = w ? zd_value_tensor(w) : NULL;
    zd_tensor_unref(w);
    return v;
}

/*  "ParameterServer.apply_gradients"(actor, g_1, ..., g_k) */
static zd_value_t *fn_apply_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &server_class);
    if (!a)
        return NULL;
    fault_point(zd_rpc_rank(), "step"); /* tests only (fault.h) */
    ps_server_t *ps = actor_object(a);
    size_t k = zd_list_len(args);
    int64_t n = zd_tensor_numel(ps->weights);
    zd_value_t *v = NULL;
    zd_tensor_t *sum = zd_tensor_zeros1(n);
    if (!sum)
        goto out;
    if (k < 2) {
        zd_error_set("ParameterServer.apply_gradients: no gradients given");
        goto out;
    }
    float *sd = zd_tensor_data(sum);
    for (size_t i = 1; i < k; i++) {
        zd_tensor_t *g;
        if (zd_rpc_arg_tensor(args, i, &g) < 0)
            goto out;
        if (zd_tensor_dtype(g) != ZD_FLOAT32 || zd_tensor_numel(g) != n) {
            char shape[64];
            zd_error_set("ParameterServer.apply_gradients: gradient %zu is %s %s; this "
                         "server's slice is float32 (%lld)",
                         i - 1, zd_tensor_dtype_name(zd_tensor_dtype(g)),
                         zd_tensor_shape_str(g, shape, sizeof shape), (long long)n);
            goto out;
        }
        const float *gd = zd_tensor_data(g);
        for (int64_t j = 0; j < n; j++)
            sd[j] += gd[j];
    }
    actor_lock(a);
    int rc = zd_optim_step(ps->opt, &sum);
    for (size_t i = 1; rc == 0 && ps->track && i < k; i++) {
        zd_tensor_t *g;
        zd_rpc_arg_tensor(args, i, &g);
        rc = stats_add(&ps->stats, ps_hash(g));
    }
    if (rc == 0) {
        ps->stats.count++;
        v = weights_value(ps);
    }
    actor_unlock(a);
out:
    zd_tensor_unref(sum);
    return v;
}

/*  "ParameterServer.get_weights"(actor) */
static zd_value_t *fn_get_weights(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &server_class);
    if (!a)
        return NULL;
    actor_lock(a);
    zd_value_t *v = weights_value(actor_object(a));
    actor_unlock(a);
    return v;
}

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

/*  "DataWorker.compute_gradients"(actor, w_1, ..., w_S) -> [g_1, ..., g_S] */
static zd_value_t *fn_compute_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    fault_point(zd_rpc_rank(), "backward"); /* tests only (fault.h) */
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &worker_class);
    if (!a)
        return NULL;
    int n = (int)zd_list_len(args) - 1;
    zd_value_t *v = NULL;
    zd_tensor_t *weights[PS_MAX_SERVERS], *grads[PS_MAX_SERVERS];
    if (n < 1 || n > PS_MAX_SERVERS) {
        zd_error_set("DataWorker.compute_gradients: %d weight slices given (1 to %d)", n,
                     PS_MAX_SERVERS);
        goto out;
    }
    for (int s = 0; s < n; s++)
        if (zd_rpc_arg_tensor(args, (size_t)s + 1, &weights[s]) < 0)
            goto out;
    actor_lock(a);
    ps_worker_t *w = actor_object(a);
    int rc = ps_worker_compute(w, weights, n, grads);
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
        goto out;
    }
    v = zd_value_list((size_t)n);
    for (int s = 0; s < n; s++) {
        if (v && zd_list_append(v, zd_value_tensor(grads[s])) < 0) {
            zd_value_unref(v);
            v = NULL;
        }
        zd_tensor_unref(grads[s]);
    }
out:
    return v;
}

/*  "PS.stats"(actor) -> [count, hash...], for either kind of actor. */
static zd_value_t *fn_stats(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *type = zd_value_object_type(zd_list_get(args, 0));
    bool worker = type && strcmp(type, worker_class.name) == 0;
    actor_t *a = actor_get(args, worker ? &worker_class : &server_class);
    if (!a)
        return NULL;
    ps_stats_t *st = worker ? &((ps_worker_t *)actor_object(a))->stats
                            : &((ps_server_t *)actor_object(a))->stats;
    actor_lock(a);
    zd_value_t *v = stats_value(st);
    actor_unlock(a);
    return v;
}

int ps_register(void)
{
    if (actor_register() < 0 || zd_rpc_register("ParameterServer", fn_server_new, NULL) < 0 ||
        zd_rpc_register("ParameterServer.apply_gradients", fn_apply_gradients, NULL) < 0 ||
        zd_rpc_register("ParameterServer.get_weights", fn_get_weights, NULL) < 0 ||
        zd_rpc_register("DataWorker", fn_worker_new, NULL) < 0 ||
        zd_rpc_register("DataWorker.compute_gradients", fn_compute_gradients, NULL) < 0 ||
        zd_rpc_register("PS.stats", fn_stats, NULL) < 0)
        return -1;
    return 0;
}
