/*  The two actors of the parameter-server example: ParameterServer and
    DataWorker (see ps_core.h), and the flat weight slices they exchange. */
#include "examples/ps_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "examples/ps_actor.h"
#include "nn/dataset.h"
#include "nn/nn.h"
#include "optim/optim.h"
#include "rpc/rpc.h"

/*  ---- flat slices ---- */

void ps_slice_range(int64_t numel, int s, int n, int64_t *lo, int64_t *hi)
{
    *lo = numel * s / n;
    *hi = numel * (s + 1) / n;
}

/*  Elements [lo, hi) of the flat vector v, as a tensor of their own. */
static tensor_t *flat_range(tensor_t *v, int64_t lo, int64_t hi)
{
    tensor_t *view = NULL, *copy = NULL;
    if (tensor_narrow(v, 0, lo, hi - lo, &view) == 0)
        copy = tensor_clone(view);
    tensor_unref(view);
    return copy;
}

tensor_t *ps_model_slice(nn_model_t *m, int64_t lo, int64_t hi)
{
    if (lo < 0 || hi > nn_model_numel(m) || lo >= hi) {
        error_set("slice [%lld, %lld) outside the model's %lld weights", (long long)lo,
                  (long long)hi, (long long)nn_model_numel(m));
        return NULL;
    }
    tensor_t *all;
    if (nn_model_params_to_vector(m, &all) < 0)
        return NULL;
    tensor_t *t = lo == 0 && hi == tensor_numel(all) ? tensor_ref(all) : flat_range(all, lo, hi);
    tensor_unref(all);
    return t;
}

static int check_slices(nn_model_t *m, tensor_t *const *slices, int n)
{
    int64_t total = 0;
    for (int s = 0; s < n; s++) {
        if (tensor_dtype(slices[s]) != TENSOR_F32)
            return error_set("weight slice %d is %s, not float32", s,
                             tensor_dtype_name(tensor_dtype(slices[s])));
        total += tensor_numel(slices[s]);
    }
    if (total != nn_model_numel(m))
        return error_set("%d weight slices hold %lld values; the %s has %lld", n,
                         (long long)total, nn_model_name(m), (long long)nn_model_numel(m));
    return 0;
}

int ps_model_load(nn_model_t *m, tensor_t *const *slices, int n)
{
    if (check_slices(m, slices, n) < 0)
        return -1;
    if (n == 1)
        return nn_model_vector_to_params(m, slices[0]);
    tensor_t *all;
    if (tensor_cat(slices, n, 0, &all) < 0)
        return -1;
    int rc = nn_model_vector_to_params(m, all);
    tensor_unref(all);
    return rc;
}

uint64_t ps_hash(const tensor_t *t)
{
    const unsigned char *p = tensor_raw(t);
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < tensor_nbytes(t); i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/*  ---- stats kept by both actors ---- */

static int stats_add(ps_stats_t *st, uint64_t h)
{
    if ((st->n_hashes & (st->n_hashes - 1)) == 0) {   /* 0, 1, 2, 4, ...: grow */
        size_t cap = st->n_hashes ? 2 * (size_t)st->n_hashes : 1;
        uint64_t *p = realloc(st->hashes, cap * sizeof *p);
        if (!p)
            return error_set("out of memory");
        st->hashes = p;
    }
    st->hashes[st->n_hashes++] = h;
    return 0;
}

static rpc_value_t *stats_value(const ps_stats_t *st)
{
    rpc_value_t *v = rpc_value_list((size_t)st->n_hashes + 1);
    if (!v || rpc_list_append(v, rpc_value_int(st->count)) < 0)
        goto fail;
    for (int64_t i = 0; i < st->n_hashes; i++)
        if (rpc_list_append(v, rpc_value_int((int64_t)st->hashes[i])) < 0)
            goto fail;
    return v;
fail:
    rpc_value_unref(v);
    return NULL;
}

/*  ---- DataWorker ---- */

struct ps_worker {
    nn_model_t *model;
    dataset_t *train;
    int index;
    uint64_t seed;
    int64_t batch_size;
    int64_t *order;             /* this epoch's order */
    int64_t epoch, next;        /* epochs begun; next sample position */
    bool track;
    int64_t delay_ms;           /* a straggler: this much slower per gradient */
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
        error_set("DataWorker: batch_size must be >= 1, got %lld", (long long)batch_size);
        return NULL;
    }
    ps_worker_t *w = calloc(1, sizeof *w);
    if (!w) {
        error_set("out of memory");
        return NULL;
    }
    w->index = index;
    w->seed = seed;
    w->batch_size = batch_size;
    w->track = track;
    if (!(w->model = nn_model_new(model, seed)) ||
        dataset_load(data_dir, DATASET_TRAIN, &w->train) < 0 ||
        (train_size > 0 && dataset_limit(w->train, train_size) < 0)) {
        ps_worker_free(w);
        return NULL;
    }
    return w;
}

void ps_worker_free(ps_worker_t *w)
{
    if (!w)
        return;
    nn_model_free(w->model);
    dataset_free(w->train);
    free(w->order);
    free(w->stats.hashes);
    free(w);
}

static int next_batch(ps_worker_t *w, tensor_t **x, tensor_t **y)
{
    if (!w->order || w->next >= dataset_size(w->train)) {
        free(w->order);
        w->order = dataset_order(w->train, order_seed(w->seed, w->index, w->epoch));
        if (!w->order)
            return error_set("out of memory");
        w->epoch++;
        w->next = 0;
    }
    if (dataset_batch(w->train, w->order, w->next, w->batch_size, x, y) < 0)
        return -1;
    w->next += w->batch_size;
    return 0;
}

int ps_worker_compute(ps_worker_t *w, tensor_t *const *weights, int n, tensor_t **grads)
{
    tensor_t *x = NULL, *y = NULL, *logprobs = NULL, *loss = NULL, *all = NULL;
    for (int s = 0; s < n; s++)
        grads[s] = NULL;
    int rc = -1;
    nn_model_zero_grad(w->model);
    if (ps_model_load(w->model, weights, n) < 0 || next_batch(w, &x, &y) < 0 ||
        nn_model_forward(w->model, x, &logprobs) < 0 || nn_nll_loss(logprobs, y, &loss) < 0 ||
        autograd_backward(loss, NULL, false) < 0)
        goto out;
    /* The slices are views of one vector of every gradient. */
    if (nn_model_grads_to_vector(w->model, &all) < 0)
        goto out;
    int64_t off = 0;
    for (int s = 0; s < n; s++) {
        int64_t len = tensor_numel(weights[s]);
        if (tensor_narrow(all, 0, off, len, &grads[s]) < 0)
            goto out;
        off += len;
        if (w->track && stats_add(&w->stats, ps_hash(grads[s])) < 0)
            goto out;
    }
    w->stats.count++;
    rc = 0;
out:
    nn_model_zero_grad(w->model);
    tensor_unref(all);
    tensor_unref(loss);
    tensor_unref(logprobs);
    tensor_unref(x);
    tensor_unref(y);
    if (rc < 0)
        for (int s = 0; s < n; s++)
            tensor_unref_p(&grads[s]);
    return rc;
}

/*  ---- ParameterServer ---- */

typedef struct {
    tensor_t *weights;          /* the flat slice, a leaf stepped by opt */
    optim_t *opt;
    bool track;
    ps_stats_t stats;
} ps_server_t;

static void server_free(void *obj)
{
    ps_server_t *ps = obj;
    optim_free(ps->opt);
    tensor_unref(ps->weights);
    free(ps->stats.hashes);
    free(ps);
}

static void worker_free(void *obj) { ps_worker_free(obj); }

static const ps_actor_class_t server_class = {"ParameterServer", server_free};
static const ps_actor_class_t worker_class = {"DataWorker", worker_free};

/*  "ParameterServer"(model, seed, lr, index, num_servers, track) */
static rpc_value_t *fn_server_new(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *model;
    int64_t seed, index, n, track;
    double lr;
    if (rpc_arg_string(args, 0, &model) < 0 || rpc_arg_int(args, 1, &seed) < 0 ||
        rpc_arg_float(args, 2, &lr) < 0 || rpc_arg_int(args, 3, &index) < 0 ||
        rpc_arg_int(args, 4, &n) < 0 || rpc_arg_int(args, 5, &track) < 0)
        return NULL;
    if (n < 1 || index < 0 || index >= n) {
        error_set("ParameterServer: slice %lld of %lld does not exist", (long long)index,
                  (long long)n);
        return NULL;
    }
    ps_server_t *ps = calloc(1, sizeof *ps);
    nn_model_t *m = nn_model_new(model, (uint64_t)seed);
    optim_config_t cfg = optim_sgd_defaults(lr);
    int64_t lo, hi;
    if (!ps || !m)
        goto fail;
    ps_slice_range(nn_model_numel(m), (int)index, (int)n, &lo, &hi);
    if (!(ps->weights = ps_model_slice(m, lo, hi)) ||
        tensor_set_requires_grad(ps->weights, true) < 0 ||
        !(ps->opt = optim_new(&cfg, 1, &ps->weights)))
        goto fail;
    ps->track = track != 0;
    nn_model_free(m);
    return ps_actor_new(&server_class, ps);
fail:
    if (!ps)
        error_set("out of memory");
    nn_model_free(m);
    if (ps)
        server_free(ps);
    return NULL;
}

/*  A copy of the weights: the reply must not change under the next step. */
static rpc_value_t *weights_value(ps_server_t *ps)
{
    tensor_t *w = tensor_clone(ps->weights);
    rpc_value_t *v = w ? rpc_value_tensor(w) : NULL;
    tensor_unref(w);
    return v;
}

/*  "ParameterServer.apply_gradients"(actor, g_1, ..., g_k) */
static rpc_value_t *fn_apply_gradients(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    ps_actor_t *a = ps_actor_get(args, &server_class);
    if (!a)
        return NULL;
    ps_server_t *ps = ps_actor_object(a);
    size_t k = rpc_list_len(args);
    int64_t n = tensor_numel(ps->weights);
    rpc_value_t *v = NULL;
    tensor_t *sum = tensor_zeros1(n);
    if (!sum)
        goto out;
    if (k < 2) {
        error_set("ParameterServer.apply_gradients: no gradients given");
        goto out;
    }
    float *sd = tensor_data(sum);
    for (size_t i = 1; i < k; i++) {
        tensor_t *g;
        if (rpc_arg_tensor(args, i, &g) < 0)
            goto out;
        if (tensor_dtype(g) != TENSOR_F32 || tensor_numel(g) != n) {
            char shape[64];
            error_set("ParameterServer.apply_gradients: gradient %zu is %s %s; this "
                      "server's slice is float32 (%lld)", i - 1,
                      tensor_dtype_name(tensor_dtype(g)), tensor_shape_str(g, shape, sizeof shape),
                      (long long)n);
            goto out;
        }
        const float *gd = tensor_data(g);
        for (int64_t j = 0; j < n; j++)
            sd[j] += gd[j];
    }
    ps_actor_lock(a);
    int rc = optim_step(ps->opt, &sum);
    for (size_t i = 1; rc == 0 && ps->track && i < k; i++) {
        tensor_t *g;
        rpc_arg_tensor(args, i, &g);
        rc = stats_add(&ps->stats, ps_hash(g));
    }
    if (rc == 0) {
        ps->stats.count++;
        v = weights_value(ps);
    }
    ps_actor_unlock(a);
out:
    tensor_unref(sum);
    return v;
}

/*  "ParameterServer.get_weights"(actor) */
static rpc_value_t *fn_get_weights(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    ps_actor_t *a = ps_actor_get(args, &server_class);
    if (!a)
        return NULL;
    ps_actor_lock(a);
    rpc_value_t *v = weights_value(ps_actor_object(a));
    ps_actor_unlock(a);
    return v;
}

/*  "DataWorker"(model, index, seed, batch_size, data_dir or none, train_size, track
                 [, delay_ms]) */
static rpc_value_t *fn_worker_new(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *model, *dir = NULL;
    int64_t index, seed, batch, train_size, track, delay = 0;
    if (rpc_arg_string(args, 0, &model) < 0 || rpc_arg_int(args, 1, &index) < 0 ||
        rpc_arg_int(args, 2, &seed) < 0 || rpc_arg_int(args, 3, &batch) < 0 ||
        (rpc_value_kind(rpc_list_get(args, 4)) != RPC_NONE &&
         rpc_arg_string(args, 4, &dir) < 0) ||
        rpc_arg_int(args, 5, &train_size) < 0 || rpc_arg_int(args, 6, &track) < 0 ||
        (rpc_list_len(args) > 7 && rpc_arg_int(args, 7, &delay) < 0))
        return NULL;
    if (delay < 0 || delay > 10000) {
        error_set("DataWorker: delay_ms must be in 0..10000, got %lld", (long long)delay);
        return NULL;
    }
    ps_worker_t *w = ps_worker_new(model, (int)index, (uint64_t)seed, batch, dir, train_size,
                                   track != 0);
    if (w)
        w->delay_ms = delay;
    return w ? ps_actor_new(&worker_class, w) : NULL;
}

/*  "DataWorker.compute_gradients"(actor, w_1, ..., w_S) -> [g_1, ..., g_S] */
static rpc_value_t *fn_compute_gradients(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    ps_actor_t *a = ps_actor_get(args, &worker_class);
    if (!a)
        return NULL;
    int n = (int)rpc_list_len(args) - 1;
    rpc_value_t *v = NULL;
    tensor_t *weights[PS_MAX_SERVERS], *grads[PS_MAX_SERVERS];
    if (n < 1 || n > PS_MAX_SERVERS) {
        error_set("DataWorker.compute_gradients: %d weight slices given (1 to %d)", n,
                  PS_MAX_SERVERS);
        goto out;
    }
    for (int s = 0; s < n; s++)
        if (rpc_arg_tensor(args, (size_t)s + 1, &weights[s]) < 0)
            goto out;
    ps_actor_lock(a);
    ps_worker_t *w = ps_actor_object(a);
    int rc = ps_worker_compute(w, weights, n, grads);
    int64_t delay = w->delay_ms;
    ps_actor_unlock(a);
    if (rc == 0 && delay > 0) {
        /* A straggler: a slower machine, as far as the driver can tell. */
        struct timespec ts = {delay / 1000, delay % 1000 * 1000000};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
        }
    }
    if (rc < 0) {
        error_wrap("DataWorker.compute_gradients");
        goto out;
    }
    v = rpc_value_list((size_t)n);
    for (int s = 0; s < n; s++) {
        if (v && rpc_list_append(v, rpc_value_tensor(grads[s])) < 0) {
            rpc_value_unref(v);
            v = NULL;
        }
        tensor_unref(grads[s]);
    }
out:
    return v;
}

/*  "PS.stats"(actor) -> [count, hash...], for either kind of actor. */
static rpc_value_t *fn_stats(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *type = rpc_value_object_type(rpc_list_get(args, 0));
    bool worker = type && strcmp(type, worker_class.name) == 0;
    ps_actor_t *a = ps_actor_get(args, worker ? &worker_class : &server_class);
    if (!a)
        return NULL;
    ps_stats_t *st = worker ? &((ps_worker_t *)ps_actor_object(a))->stats
                            : &((ps_server_t *)ps_actor_object(a))->stats;
    ps_actor_lock(a);
    rpc_value_t *v = stats_value(st);
    ps_actor_unlock(a);
    return v;
}

int ps_register(void)
{
    if (ps_actor_register() < 0 ||
        rpc_register("ParameterServer", fn_server_new, NULL) < 0 ||
        rpc_register("ParameterServer.apply_gradients", fn_apply_gradients, NULL) < 0 ||
        rpc_register("ParameterServer.get_weights", fn_get_weights, NULL) < 0 ||
        rpc_register("DataWorker", fn_worker_new, NULL) < 0 ||
        rpc_register("DataWorker.compute_gradients", fn_compute_gradients, NULL) < 0 ||
        rpc_register("PS.stats", fn_stats, NULL) < 0)
        return -1;
    return 0;
}
