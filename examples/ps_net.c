/*  ps_net.c: the sharded parameter server of rpc_ps (see ps_net.h). */
#include "examples/ps_net.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/checkpoint.h>
#include <zdist/dataset.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/dist_optim.h>
#include <zdist/rpc.h>

#define FC1_IN 9216
#define FC1_OUT 128
#define MAX_PARAMS 8

/*  This process's slice of the Net: parameters by PyTorch name; fc1 rows
    [fc1_first, fc1_first + fc1_count). */
static struct {
    int shard, num_shards;
    uint64_t seed;
    bool dropout;
    int n;
    char names[MAX_PARAMS][32];
    zd_tensor_t *params[MAX_PARAMS];
    int fc1_first, fc1_count;
    pthread_mutex_t rng_lock;
    zd_nn_rng_t rng;

    /* shard 0: throughput book-keeping and the shared final evaluation */
    pthread_mutex_t stats_lock;
    int started, finished;
    struct timespec first_start, last_finish;
    int64_t samples;
    char data_dir[1024];
    zd_future_t *waiting[64];     /* evaluations waiting for the last trainer */
    int n_waiting;
    int64_t eval_samples;
    double accuracy;               /* < 0: not evaluated yet */
} ps;

static zd_tensor_t *param(const char *name)
{
    for (int i = 0; i < ps.n; i++)
        if (!strcmp(ps.names[i], name))
            return ps.params[i];
    return NULL;
}

void ps_net_fc1_rows(int shard, int num_shards, int *first, int *count)
{
    /* Bytes per fc1 row: 9216 weights + 1 bias. Shard 0 also holds the
       convolutions and fc2; give it that much fewer rows. */
    const double row = FC1_IN + 1;
    const double fixed = 32 * 9 + 32 + 64 * 32 * 9 + 64 + 10 * FC1_OUT + 10;
    double share = (FC1_OUT * row + fixed) / num_shards;
    int rows0 = num_shards == 1 ? FC1_OUT : (int)((share - fixed) / row + 0.5);
    if (rows0 < 0)
        rows0 = 0;
    int rest = FC1_OUT - rows0, others = num_shards - 1;
    if (shard == 0) {
        *first = 0;
        *count = rows0;
        return;
    }
    int base = rest / others, extra = rest % others;
    *first = rows0 + (shard - 1) * base + (shard - 1 < extra ? shard - 1 : extra);
    *count = base + (shard - 1 < extra ? 1 : 0);
}

static int add_param(const char *name, zd_tensor_t *t)
{
    if (!t)
        return -1;
    snprintf(ps.names[ps.n], sizeof ps.names[0], "%s", name);
    zd_tensor_set_name(t, name);
    if (zd_tensor_set_requires_grad(t, true) < 0)
        return -1;
    ps.params[ps.n++] = t;
    return 0;
}

/*  Rows [first, first+count) of a (rows, cols) tensor as a new leaf. */
static zd_tensor_t *rows_of(zd_tensor_t *t, int first, int count)
{
    int64_t cols = zd_tensor_ndim(t) > 1 ? zd_tensor_size(t, 1) : 1;
    int64_t shape[2] = {count, cols};
    zd_tensor_t *r = zd_tensor_empty(ZD_FLOAT32, zd_tensor_ndim(t), shape);
    if (r)
        memcpy(zd_tensor_data(r), zd_tensor_data(t) + (int64_t)first * cols,
               sizeof(float) * (size_t)(count * cols));
    return r;
}

/*  Private copies of the named parameters, recorded so that gradients flow
    back to the shared ones, taken while no step is writing them. */
static int snapshot(const char *const *names, int n, zd_tensor_t **out)
{
    int rc = 0;
    memset(out, 0, sizeof *out * (size_t)n);
    zd_dist_optim_read_lock();
    for (int i = 0; i < n && rc == 0; i++) {
        zd_tensor_t *p = param(names[i]);
        rc = p ? zd_tensor_copy(p, &out[i]) : zd_error_set("no parameter %s on this shard", names[i]);
    }
    zd_dist_optim_read_unlock();
    if (rc < 0)
        for (int i = 0; i < n; i++)
            zd_tensor_unref_p(&out[i]);
    return rc;
}

static int dropout(zd_tensor_t *x, float p, bool training, bool channels, zd_tensor_t **out)
{
    if (!training || !ps.dropout) {
        *out = zd_tensor_ref(x);
        return 0;
    }
    pthread_mutex_lock(&ps.rng_lock);
    int rc = channels ? zd_nn_dropout2d(x, p, true, &ps.rng, out) : zd_nn_dropout(x, p, true, &ps.rng, out);
    pthread_mutex_unlock(&ps.rng_lock);
    return rc;
}

/*  relu(flat fc1_slice^T + b) then dropout: this shard's part of fc1. */
static int fc1_part(zd_tensor_t *flat, bool training, zd_tensor_t **out)
{
    static const char *const names[] = {"fc1.weight", "fc1.bias"};
    zd_tensor_t *p[2], *l = NULL, *r = NULL;
    *out = NULL;
    if (ps.fc1_count == 0)
        return zd_error_set("this shard holds no rows of fc1");
    if (snapshot(names, 2, p) < 0)
        return -1;
    int rc = zd_nn_linear(flat, p[0], p[1], &l);
    if (rc == 0)
        rc = zd_nn_relu(l, &r);
    if (rc == 0)
        rc = dropout(r, 0.5f, training, false, out);
    zd_tensor_unref(l);
    zd_tensor_unref(r);
    zd_tensor_unref(p[0]);
    zd_tensor_unref(p[1]);
    return rc;
}

/*  Shard 0: the whole forward pass. */
static int forward(zd_tensor_t *x, bool training, zd_tensor_t **out)
{
    static const char *const names[] = {"conv1.weight", "conv1.bias", "conv2.weight",
                                        "conv2.bias",   "fc2.weight", "fc2.bias"};
    zd_tensor_t *p[6], *h1 = NULL, *h2 = NULL, *h3 = NULL, *flat = NULL, *h = NULL, *f2 = NULL;
    zd_tensor_t *parts[64] = {0};
    zd_future_t *fs[64] = {0};
    int S = ps.num_shards, rc;
    *out = NULL;
    if (snapshot(names, 6, p) < 0)
        return -1;
    rc = zd_nn_conv2d_relu(x, p[0], p[1], 1, 0, &h1);
    if (rc == 0)
        rc = zd_nn_conv2d_max_pool2d(h1, p[2], p[3], 1, 0, 2, 2, &h2);
    if (rc == 0)
        rc = dropout(h2, 0.25f, training, true, &h3);
    if (rc == 0)
        rc = zd_nn_flatten(h3, &flat);
    /* The other shards compute their rows of fc1 while this one does its own. */
    for (int s = 1; rc == 0 && s < S; s++) {
        zd_value_t *args = zd_rpc_args("ti", flat, (int64_t)training);
        fs[s] = args ? zd_rpc_async(s, "ps_fc1_part", args, ZD_TIMEOUT_DEFAULT) : NULL;
        zd_value_unref(args);
        if (!fs[s])
            rc = -1;
    }
    if (rc == 0 && ps.fc1_count > 0)
        rc = fc1_part(flat, training, &parts[0]);
    int n_parts = ps.fc1_count > 0 ? 1 : 0;
    for (int s = 1; s < S; s++) {
        if (!fs[s])
            continue;
        zd_tensor_t *t;
        if (rc == 0 && (zd_future_wait(fs[s], ZD_TIMEOUT_NONE) < 0 ||
                        zd_value_get_tensor(zd_future_value(fs[s]), &t) < 0))
            rc = -1;
        else if (rc == 0)
            parts[n_parts++] = zd_tensor_ref(t);
        zd_future_unref(fs[s]);
    }
    if (rc == 0)
        rc = n_parts == 1 ? (h = zd_tensor_ref(parts[0]), 0) : zd_tensor_cat(parts, n_parts, 1, &h);
    if (rc == 0)
        rc = zd_nn_linear(h, p[4], p[5], &f2);
    if (rc == 0)
        rc = zd_nn_log_softmax(f2, 1, out);
    zd_tensor_t *all[] = {h1, h2, h3, flat, h, f2, p[0], p[1], p[2], p[3], p[4], p[5]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
    for (int i = 0; i < n_parts; i++)
        zd_tensor_unref(parts[i]);
    return rc;
}

/*  ---- RPC functions ---- */

static zd_value_t *tensor_result(int rc, zd_tensor_t *t)
{
    zd_value_t *v = rc == 0 ? zd_value_tensor(t) : NULL;
    zd_tensor_unref(t);
    return v;
}

static zd_value_t *fn_get_parameter_server(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_string("ParameterServer");
}

/*  ps_forward(server, x, training): no graph is recorded for evaluation. */
static zd_value_t *fn_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x, *out = NULL;
    int64_t training;
    if (zd_rpc_arg_tensor(args, 1, &x) < 0 || zd_rpc_arg_int(args, 2, &training) < 0)
        return NULL;
    bool prev = zd_autograd_set_grad_enabled(training != 0);
    int rc = forward(x, training != 0, &out);
    zd_autograd_set_grad_enabled(prev);
    return tensor_result(rc, out);
}

static zd_value_t *fn_fc1_part(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *flat, *out = NULL;
    int64_t training;
    if (zd_rpc_arg_tensor(args, 0, &flat) < 0 || zd_rpc_arg_int(args, 1, &training) < 0)
        return NULL;
    bool prev = zd_autograd_set_grad_enabled(training != 0);
    int rc = fc1_part(flat, training != 0, &out);
    zd_autograd_set_grad_enabled(prev);
    return tensor_result(rc, out);
}

/*  RRefs to this shard's parameters, owned here. */
static int append_local_rrefs(zd_value_t *list)
{
    for (int i = 0; i < ps.n; i++) {
        zd_value_t *tv = zd_value_tensor(ps.params[i]);
        zd_rref_t *r = tv ? zd_rref_new(tv) : NULL;
        zd_value_unref(tv);
        if (!r || zd_list_append(list, zd_value_rref(r)) < 0) {
            zd_rref_unref(r);
            return -1;
        }
        zd_rref_unref(r);
    }
    return 0;
}

static zd_value_t *fn_local_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *list = zd_value_list((size_t)ps.n);
    if (list && append_local_rrefs(list) < 0) {
        zd_value_unref(list);
        return NULL;
    }
    return list;
}

/*  Appends every item of the list returned by fn(args) on each other shard. */
static int gather_from_shards(zd_value_t *list, const char *fn, zd_value_t *args)
{
    for (int s = 1; s < ps.num_shards; s++) {
        zd_value_t *r;
        if (zd_rpc_sync(s, fn, args, ZD_TIMEOUT_DEFAULT, &r) < 0)
            return -1;
        for (size_t i = 0; i < zd_list_len(r); i++)
            if (zd_list_append(list, zd_value_ref(zd_list_get(r, i))) < 0) {
                zd_value_unref(r);
                return -1;
            }
        zd_value_unref(r);
    }
    return 0;
}

static zd_value_t *fn_get_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_value_t *list = fn_local_param_rrefs(call, args, arg);
    if (list && gather_from_shards(list, "ps_local_param_rrefs", NULL) < 0) {
        zd_value_unref(list);
        return NULL;
    }
    return list;
}

static zd_value_t *fn_local_dist_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t cid;
    size_t at = zd_list_len(args) == 2 ? 1 : 0;   /* (server, cid) or (cid) */
    if (zd_rpc_arg_int(args, at, &cid) < 0)
        return NULL;
    zd_value_t *list = zd_value_list((size_t)ps.n);
    for (int i = 0; list && i < ps.n; i++) {
        zd_tensor_t *g;
        if (zd_dist_autograd_get_gradient(cid, ps.params[i], &g) < 0) {
            zd_value_unref(list);
            return NULL;
        }
        if (g && zd_list_append(list, zd_rpc_args("st", ps.names[i], g)) < 0)
            zd_value_unref(list), list = NULL;
        zd_tensor_unref(g);
    }
    return list;
}

static zd_value_t *fn_get_dist_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    int64_t cid;
    if (zd_rpc_arg_int(args, 1, &cid) < 0)
        return NULL;
    zd_value_t *list = fn_local_dist_gradients(call, args, arg);
    zd_value_t *cargs = zd_rpc_args("i", cid);
    if (list && (!cargs || gather_from_shards(list, "ps_local_dist_gradients", cargs) < 0)) {
        zd_value_unref(list);
        list = NULL;
    }
    zd_value_unref(cargs);
    return list;
}

/*  One evaluation thread's share of the test set. */
typedef struct {
    const zd_dataset_t *test;
    int64_t start, end, correct;
    int rc;
    char error[256];
} eval_part_t;

static void *evaluate_part(void *arg)
{
    eval_part_t *e = arg;
    bool prev = zd_autograd_set_grad_enabled(false);
    for (int64_t at = e->start; at < e->end && e->rc == 0; at += 1000) {
        zd_tensor_t *x, *y, *out = NULL;
        int64_t n = e->end - at < 1000 ? e->end - at : 1000;
        e->rc = zd_dataset_batch(e->test, NULL, at, n, &x, &y);
        if (e->rc == 0 && (e->rc = forward(x, false, &out)) == 0) {
            int64_t c = zd_nn_accuracy(out, y);
            e->rc = c < 0 ? -1 : 0;
            e->correct += c;
        }
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_autograd_set_grad_enabled(prev);
    if (e->rc < 0)
        snprintf(e->error, sizeof e->error, "%s", zd_error_last());
    return NULL;
}

/*  Accuracy of the current weights on the first `limit` test images (0: all),
    in evaluation mode, split over the cores: with several trainers the
    layers run on one thread per pass, and the evaluation is one pass. */
static int evaluate(int64_t limit, double *acc)
{
    zd_dataset_t *test = NULL;
    const char *dir = ps.data_dir[0] ? ps.data_dir : NULL;
    if (zd_dataset_load(dir, ZD_DATASET_TEST, &test) < 0)
        return -1;
    int64_t n = zd_dataset_size(test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = zd_nn_get_num_threads() > 1 || cores < 2 ? 1 : cores > 8 ? 8 : (int)cores;
    eval_part_t e[8];
    pthread_t th[8];
    bool started[8] = {false};
    int rc = 0;
    for (int i = 0; i < parts; i++) {
        e[i] = (eval_part_t){test, n * i / parts, n * (i + 1) / parts, 0, 0, ""};
        if (i > 0)
            started[i] = pthread_create(&th[i], NULL, evaluate_part, &e[i]) == 0;
        if (i > 0 && !started[i])
            evaluate_part(&e[i]);   /* no thread: do it here */
    }
    evaluate_part(&e[0]);
    for (int i = 1; i < parts; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    for (int i = 0; i < parts; i++) {
        if (e[i].rc < 0 && rc == 0)
            rc = zd_error_set("%s", e[i].error);
        correct += e[i].correct;
    }
    zd_dataset_free(test);
    *acc = n ? (double)correct / (double)n : 0;
    return rc;
}

/*  Answers every waiting evaluation once the last trainer has finished:
    all trainers then share one evaluation of the final weights. Called with
    stats_lock held; the evaluation itself runs outside it. */
static void finish_evaluations(void)
{
    int trainers = zd_rpc_world_size() - ps.num_shards;
    if (ps.finished < trainers || ps.n_waiting < ps.finished)
        return;
    zd_future_t *fs[64];
    int n = ps.n_waiting;
    memcpy(fs, ps.waiting, sizeof fs[0] * (size_t)n);
    ps.n_waiting = 0;
    pthread_mutex_unlock(&ps.stats_lock);
    double acc;
    int rc = evaluate(ps.eval_samples, &acc);
    char err[512];
    snprintf(err, sizeof err, "%s", rc < 0 ? zd_error_last() : "");
    for (int i = 0; i < n; i++) {
        zd_value_t *v = rc == 0 ? zd_value_float(acc) : NULL;
        if (v)
            zd_future_set_value(fs[i], v);
        else
            zd_future_set_error(fs[i], "evaluation failed: %s", err);
        zd_value_unref(v);
        zd_future_unref(fs[i]);
    }
    pthread_mutex_lock(&ps.stats_lock);
}

/*  ps_evaluate(server, samples) -> accuracy: answered when every trainer
    has finished (a trainer whose call times out evaluates by itself). */
static zd_future_t *fn_evaluate(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t samples;
    if (zd_rpc_arg_int(args, 1, &samples) < 0)
        return NULL;
    zd_future_t *f = zd_future_new();
    if (!f)
        return NULL;
    pthread_mutex_lock(&ps.stats_lock);
    if (ps.n_waiting == 64) {
        pthread_mutex_unlock(&ps.stats_lock);
        zd_future_unref(f);
        zd_error_set("too many trainers waiting for the evaluation");
        return NULL;
    }
    ps.eval_samples = samples;
    ps.waiting[ps.n_waiting++] = zd_future_ref(f);
    finish_evaluations();
    pthread_mutex_unlock(&ps.stats_lock);
    return f;
}

static zd_value_t *fn_trainer_started(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&ps.stats_lock);
    if (ps.started++ == 0)
        ps.first_start = now;
    pthread_mutex_unlock(&ps.stats_lock);
    return zd_value_none();
}

static zd_value_t *fn_trainer_finished(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t samples;
    if (zd_rpc_arg_int(args, 1, &samples) < 0)
        return NULL;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    pthread_mutex_lock(&ps.stats_lock);
    ps.finished++;
    ps.samples += samples;
    ps.last_finish = now;
    finish_evaluations();
    pthread_mutex_unlock(&ps.stats_lock);
    return zd_value_none();
}

/*  ---- checkpoints (SPEC B2) ---- */

static struct {
    char prefix[1024];          /* "": off */
    int64_t config[3];          /* batch_size, seed, trainers */
    pthread_mutex_t lock;
    int64_t progress[PS_NET_MAX_TRAINERS];   /* shard 0: batches each trainer reported */
} ck = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define PROGRESS_NAME "trainer_progress"
#define CONFIG_NAME "run_config"    /* batch_size, seed, trainers: must match on resume */

static void shard_path(char *buf, size_t size, int shard)
{
    snprintf(buf, size, "%s.shard%d", ck.prefix, shard);
}

/*  What a shard's file holds: its parameters, and on shard 0 also the
    trainers' progress and the run's configuration (tensors of its own). */
typedef struct {
    const char *names[MAX_PARAMS + 2];
    zd_tensor_t *tensors[MAX_PARAMS + 2];
    int n;
    zd_tensor_t *progress, *config;
} shard_file_t;

static void shard_file_clear(shard_file_t *f)
{
    zd_tensor_unref_p(&f->progress);
    zd_tensor_unref_p(&f->config);
}

static int shard_file_init(shard_file_t *f)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < ps.n; i++, f->n++)
        f->names[f->n] = ps.names[i], f->tensors[f->n] = ps.params[i];
    if (ps.shard != 0)
        return 0;
    f->progress = zd_tensor_new(ZD_INT64, 1, (int64_t[]){PS_NET_MAX_TRAINERS});
    f->config = zd_tensor_new(ZD_INT64, 1, (int64_t[]){3});
    if (!f->progress || !f->config) {
        shard_file_clear(f);
        return -1;
    }
    f->names[f->n] = PROGRESS_NAME, f->tensors[f->n++] = f->progress;
    f->names[f->n] = CONFIG_NAME, f->tensors[f->n++] = f->config;
    return 0;
}

/*  Writes this shard's parameters (shard 0: with the trainers' progress)
    under the parameters' read lock, so that no step is half applied. */
static int save_shard(void)
{
    char path[1100];
    shard_file_t f;
    if (shard_file_init(&f) < 0)
        return -1;
    if (f.progress) {
        pthread_mutex_lock(&ck.lock);
        memcpy(zd_tensor_data_i64(f.progress), ck.progress, sizeof ck.progress);
        pthread_mutex_unlock(&ck.lock);
        memcpy(zd_tensor_data_i64(f.config), ck.config, sizeof ck.config);
    }
    shard_path(path, sizeof path, ps.shard);
    /* Under the read lock to the rename: no step half applied, and an older
       save cannot replace a newer one. */
    zd_dist_optim_read_lock();
    int rc = zd_checkpoint_save(path, f.n, f.names, f.tensors);
    zd_dist_optim_read_unlock();
    shard_file_clear(&f);
    return rc;
}

/*  ps_checkpoint(server, trainer, batches): shard 0 notes the trainer's
    progress, has the other shards save theirs, then saves its own (last,
    so that the progress it records is never ahead of any shard's
    weights). */
static zd_value_t *fn_checkpoint(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t trainer, batches;
    if (zd_rpc_arg_int(args, 1, &trainer) < 0 || zd_rpc_arg_int(args, 2, &batches) < 0)
        return NULL;
    if (!ck.prefix[0]) {
        zd_error_set("ps_checkpoint: this server runs without --checkpoint");
        return NULL;
    }
    if (trainer < 0 || trainer >= PS_NET_MAX_TRAINERS || batches < 0) {
        zd_error_set("ps_checkpoint: trainer %lld with %lld batches (trainers 0 to %d)",
                  (long long)trainer, (long long)batches, PS_NET_MAX_TRAINERS - 1);
        return NULL;
    }
    /* The other shards first, all at once: once they hold this trainer's
       steps, its position may be recorded (and saved with shard 0). */
    zd_future_t *fs[64];
    int n = 0, rc = 0;
    for (int s = 1; s < ps.num_shards; s++)
        if ((fs[n] = zd_rpc_async(s, "ps_save_shard", NULL, ZD_TIMEOUT_DEFAULT)))
            n++;
        else
            rc = -1;
    if (n && zd_future_wait_all(fs, n, -1) < 0)
        rc = -1;
    for (int i = 0; i < n; i++)
        zd_future_unref(fs[i]);
    if (rc < 0)
        return NULL;
    pthread_mutex_lock(&ck.lock);
    ck.progress[trainer] = batches;
    pthread_mutex_unlock(&ck.lock);
    return save_shard() == 0 ? zd_value_none() : NULL;
}

static zd_value_t *fn_save_shard(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    if (!ck.prefix[0]) {
        zd_error_set("ps_save_shard: shard %d runs without --checkpoint", ps.shard);
        return NULL;
    }
    return save_shard() == 0 ? zd_value_none() : NULL;
}

/*  ps_resume_point(server, trainer) -> batches the trainer had done. */
static zd_value_t *fn_resume_point(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t trainer;
    if (zd_rpc_arg_int(args, 1, &trainer) < 0)
        return NULL;
    if (!ck.prefix[0]) {
        zd_error_set("ps_resume_point: this server runs without --checkpoint: nothing to resume");
        return NULL;
    }
    if (trainer < 0 || trainer >= PS_NET_MAX_TRAINERS) {
        zd_error_set("ps_resume_point: no trainer %lld (trainers 0 to %d)", (long long)trainer,
                  PS_NET_MAX_TRAINERS - 1);
        return NULL;
    }
    pthread_mutex_lock(&ck.lock);
    int64_t batches = ck.progress[trainer];
    pthread_mutex_unlock(&ck.lock);
    return zd_value_int(batches);
}

int ps_net_checkpoint_enable(const char *prefix, bool resume, int64_t batch_size,
                             int num_trainers)
{
    if (!prefix || !prefix[0] || strlen(prefix) >= sizeof ck.prefix - 16)
        return zd_error_set("ps_net: checkpoint prefix empty or over %zu bytes",
                         sizeof ck.prefix - 16);
    if (num_trainers < 1 || num_trainers > PS_NET_MAX_TRAINERS)
        return zd_error_set("ps_net: checkpoints handle 1 to %d trainers, not %d",
                         PS_NET_MAX_TRAINERS, num_trainers);
    snprintf(ck.prefix, sizeof ck.prefix, "%s", prefix);
    ck.config[0] = batch_size;
    ck.config[1] = (int64_t)ps.seed;
    ck.config[2] = num_trainers;
    if (!resume)
        return 0;
    char path[1100];
    shard_path(path, sizeof path, ps.shard);
    shard_file_t f;
    int rc = shard_file_init(&f) < 0 ? -1 : zd_checkpoint_load(path, f.n, f.names, f.tensors);
    const int64_t *got = f.config && rc == 0 ? zd_tensor_data_i64(f.config) : NULL;
    if (got && memcmp(got, ck.config, sizeof ck.config) != 0)
        rc = zd_error_set("%s was written by a run with --batch_size=%lld --seed=%lld and %lld "
                       "trainer(s); this one has %lld, %lld and %lld", path, (long long)got[0],
                       (long long)got[1], (long long)got[2], (long long)ck.config[0],
                       (long long)ck.config[1], (long long)ck.config[2]);
    for (int t = 0; rc == 0 && f.progress && t < PS_NET_MAX_TRAINERS; t++)
        if ((ck.progress[t] = zd_tensor_data_i64(f.progress)[t]) < 0)
            rc = zd_error_set("%s: trainer %d at batch %lld", path, t,
                           (long long)ck.progress[t]);
    shard_file_clear(&f);
    return rc < 0 ? zd_error_wrap("resuming shard %d", ps.shard) : 0;
}

void ps_net_throughput(int64_t *samples, double *seconds)
{
    pthread_mutex_lock(&ps.stats_lock);
    *samples = ps.samples;
    *seconds = ps.finished ? (double)(ps.last_finish.tv_sec - ps.first_start.tv_sec) +
                                 (double)(ps.last_finish.tv_nsec - ps.first_start.tv_nsec) * 1e-9
                           : 0.0;
    pthread_mutex_unlock(&ps.stats_lock);
}

int ps_net_serve(int shard, int num_shards, uint64_t seed, bool use_dropout,
                 const char *data_dir, FILE *out)
{
    if (num_shards < 1 || num_shards > 64 || shard < 0 || shard >= num_shards)
        return zd_error_set("ps_net: shard %d of %d", shard, num_shards);
    zd_nn_model_t *net = zd_nn_net_new(seed);
    if (!net)
        return -1;
    ps.shard = shard;
    ps.num_shards = num_shards;
    ps.seed = seed;
    ps.dropout = use_dropout;
    snprintf(ps.data_dir, sizeof ps.data_dir, "%s", data_dir ? data_dir : "");
    pthread_mutex_init(&ps.rng_lock, NULL);
    pthread_mutex_init(&ps.stats_lock, NULL);
    zd_nn_rng_seed(&ps.rng, seed * 1000003u + (uint64_t)shard);
    ps_net_fc1_rows(shard, num_shards, &ps.fc1_first, &ps.fc1_count);
    int rc = 0;
    if (shard == 0) {
        const char *own[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"};
        for (int i = 0; i < 4 && rc == 0; i++)
            rc = add_param(own[i], zd_tensor_clone(zd_nn_model_find_param(net, own[i])));
    }
    if (rc == 0 && ps.fc1_count > 0) {
        rc = add_param("fc1.weight", rows_of(zd_nn_model_find_param(net, "fc1.weight"),
                                             ps.fc1_first, ps.fc1_count));
        if (rc == 0)
            rc = add_param("fc1.bias", rows_of(zd_nn_model_find_param(net, "fc1.bias"),
                                               ps.fc1_first, ps.fc1_count));
    }
    if (rc == 0 && shard == 0) {
        const char *own[] = {"fc2.weight", "fc2.bias"};
        for (int i = 0; i < 2 && rc == 0; i++)
            rc = add_param(own[i], zd_tensor_clone(zd_nn_model_find_param(net, own[i])));
    }
    zd_nn_model_free(net);
    if (rc < 0)
        return -1;

    int64_t numel = 0;
    for (int i = 0; i < ps.n; i++)
        numel += zd_tensor_numel(ps.params[i]);
    fprintf(out, "parameter server shard %d of %d: %lld parameters (%.2f MB): ", shard, num_shards,
            (long long)numel, (double)numel * 4 / 1e6);
    for (int i = 0; i < ps.n; i++) {
        char buf[64];
        fprintf(out, "%s%s %s", i ? ", " : "", ps.names[i],
                zd_tensor_shape_str(ps.params[i], buf, sizeof buf));
    }
    if (ps.fc1_count > 0)
        fprintf(out, " (fc1 rows %d-%d)", ps.fc1_first, ps.fc1_first + ps.fc1_count - 1);
    fprintf(out, "\n");

    struct {
        const char *name;
        zd_rpc_handler_fn *fn;
    } fns[] = {
        {"get_parameter_server", fn_get_parameter_server},
        {"ps_forward", fn_forward},
        {"ps_fc1_part", fn_fc1_part},
        {"ps_get_param_rrefs", fn_get_param_rrefs},
        {"ps_local_param_rrefs", fn_local_param_rrefs},
        {"ps_get_dist_gradients", fn_get_dist_gradients},
        {"ps_local_dist_gradients", fn_local_dist_gradients},
        {"ps_trainer_started", fn_trainer_started},
        {"ps_trainer_finished", fn_trainer_finished},
        {"ps_checkpoint", fn_checkpoint},
        {"ps_save_shard", fn_save_shard},
        {"ps_resume_point", fn_resume_point},
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (zd_rpc_register(fns[i].name, fns[i].fn, NULL) < 0)
            return -1;
    return zd_rpc_register_async("ps_evaluate", fn_evaluate, NULL);
}

void ps_net_free(void)
{
    for (int i = 0; i < ps.n; i++)
        zd_tensor_unref_p(&ps.params[i]);
    ps.n = 0;
}
