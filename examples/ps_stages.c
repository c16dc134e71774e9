/* SPDX-License-Identifier: MIT */
/*  ps_stages.c: the Net cut into the remote model's stages, and the
    servers' functions around them (ps_stages.h). */
#include "examples/ps_stages.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/function.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>

#define FC1_IN  9216
#define FC1_OUT 128

/*  The Net's parameters in its order, and each one's name in a stage (a
    module's own names have no dots). */
enum { CONV1_W, CONV1_B, CONV2_W, CONV2_B, FC1_W, FC1_B, FC2_W, FC2_B, NET_PARAMS };
static const char *const stage_name[NET_PARAMS] = {"conv1_weight", "conv1_bias", "conv2_weight",
                                                   "conv2_bias",   "fc1_weight", "fc1_bias",
                                                   "fc2_weight",   "fc2_bias"};

typedef struct {
    int shard, num_shards, fc1_first, fc1_count;
    int64_t max_batch;
    bool dropout;
    pthread_mutex_t rng_lock;
    zd_rng_t rng;
    zd_tensor_t *p[NET_PARAMS]; /* borrowed from the module; NULL: not this stage's */
    /* the parameters as the training forwards since the last step saw
       them (ps_stages.h: what a backward reads) */
    pthread_mutex_t copy_lock;
    zd_tensor_t *copy[NET_PARAMS];
    uint64_t copy_version;
} stage_t;

/*  fc1 rows of shard s of S: shard 0 holds the convolutions (about two
    rows' worth of bytes) and so that many rows fewer. */
static void fc1_rows(int s, int S, int *first, int *count)
{
    const double row = FC1_IN + 1, conv = 32 * 9 + 32 + 64 * 32 * 9 + 64;
    int rows0 = FC1_OUT;
    if (S > 1) {
        rows0 = (int)(((FC1_OUT * row + conv) / S - conv) / row + 0.5);
        rows0 = rows0 < 1 ? 1 : rows0;
    }
    if (s == 0) {
        *first = 0;
        *count = rows0;
        return;
    }
    int rest = FC1_OUT - rows0, base = rest / (S - 1), extra = rest % (S - 1);
    *first = rows0 + (s - 1) * base + (s - 1 < extra ? s - 1 : extra);
    *count = base + (s - 1 < extra ? 1 : 0);
}

int ps_stage_outputs(int shard, int num_shards)
{
    return shard == num_shards - 1 ? 1 : 2;
}

int64_t ps_stage_max_input(int shard, int64_t max_batch)
{
    return max_batch * (shard == 0 ? 28 * 28 : FC1_IN + FC1_OUT);
}

static int check_input(const stage_t *s, zd_tensor_t *const *in, int n_in)
{
    char sh[96], want[64];
    if (n_in != (s->shard == 0 ? 1 : 2))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "stage %d takes %d input(s), got %d", s->shard,
                                 s->shard == 0 ? 1 : 2, n_in);
    for (int i = 0; i < n_in; i++) {
        zd_tensor_t *t = in[i];
        int64_t n = zd_tensor_ndim(t) > 0 ? zd_tensor_size(t, 0) : 0;
        bool ok = zd_tensor_dtype(t) == ZD_FLOAT32 && n >= 1 && n <= s->max_batch &&
            (n_in == 1 || zd_tensor_size(in[0], 0) == n);
        if (s->shard == 0) {
            ok = ok && zd_tensor_ndim(t) == 4 && zd_tensor_size(t, 1) == 1 &&
                zd_tensor_size(t, 2) == 28 && zd_tensor_size(t, 3) == 28;
            snprintf(want, sizeof want, "(N, 1, 28, 28)");
        } else {
            int64_t cols = i == 0 ? FC1_IN : s->fc1_first;
            ok = ok && zd_tensor_ndim(t) == 2 && zd_tensor_size(t, 1) == cols;
            snprintf(want, sizeof want, "(N, %lld)", (long long)cols);
        }
        if (!ok)
            return zd_error_set_code(
                ZD_ERR_ARGUMENT,
                "stage %d: input %d must be float32 %s with N from 1 to %lld (--max_batch_size), "
                "got %s %s",
                s->shard, i, want, (long long)s->max_batch,
                zd_tensor_dtype_name(zd_tensor_dtype(t)), zd_tensor_shape_str(t, sh, sizeof sh));
    }
    return 0;
}

/*  ---- the parameters a training forward uses ----

    A step of another trainer must not change the weights a backward
    reads (its gradients would be of weights no forward saw, and the
    read would race the write), and holding steps off while backwards
    run left a core idle: rpc_ps's server lets the backwards run beside
    the steps (ps_stages_register). So a training forward computes with
    a copy of the parameters taken under the layer's read lock, one copy
    shared by the forwards between two steps (zd_dist_optim_version
    tells), and a node hands each copy's gradient on to its parameter:
    the gradients are exact for the weights the forward saw. */

static int pass_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    for (int i = 0; i < zd_autograd_node_n_inputs(n); i++)
        if (zd_autograd_node_needs_grad(n, i))
            gin[i] = zd_tensor_ref(gout[i]);
    return 0;
}

static const zd_autograd_node_ops_t pass_ops =
    ZD_AUTOGRAD_NODE_OPS("ParameterCopyBackward", pass_backward, NULL);

/*  Into use[], what this forward computes with: with grad mode off (an
    evaluation: no backward) the parameters themselves (the caller holds
    the steps off while it reads them), else views of the current copies
    recorded as outputs of a node over the parameters (new references),
    a copy taken under the steps' read lock. 0, or -1. */
static int params_for_forward(stage_t *s, zd_tensor_t **use)
{
    zd_tensor_t *params[NET_PARAMS], *copies[NET_PARAMS];
    int n = 0, rc = 0;
    for (int i = 0; i < NET_PARAMS; i++)
        use[i] = NULL;
    if (!zd_autograd_is_grad_enabled()) {
        for (int i = 0; i < NET_PARAMS; i++)
            use[i] = s->p[i] ? zd_tensor_ref(s->p[i]) : NULL;
        return 0;
    }
    /* (the stage locks its own reads: zd_ps_options_t.stage_locks_reads) */
    zd_dist_optim_read_lock();
    uint64_t version = zd_dist_optim_version();
    pthread_mutex_lock(&s->copy_lock);
    for (int i = 0; i < NET_PARAMS && rc == 0; i++) {
        if (!s->p[i])
            continue;
        if (!s->copy[i] || s->copy_version != version) {
            zd_tensor_t *c = zd_tensor_detach_copy(s->p[i]);
            if (!c) {
                rc = -1;
                break;
            }
            zd_tensor_unref(s->copy[i]);
            s->copy[i] = c;
        }
        params[n] = s->p[i];
        copies[n++] = zd_tensor_ref(s->copy[i]);
    }
    if (rc == 0)
        s->copy_version = version;
    pthread_mutex_unlock(&s->copy_lock);
    zd_dist_optim_read_unlock();
    /* each forward its own views of the copies, recorded as the outputs
       of one node over the parameters */
    zd_autograd_node_t *node = NULL;
    if (rc == 0)
        rc = zd_autograd_node_new(&pass_ops, params, n, n, &node);
    for (int i = 0, k = 0; i < NET_PARAMS; i++) {
        if (!s->p[i])
            continue;
        if (rc == 0 && !(use[i] = zd_tensor_detach(copies[k])))
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "stage %d: out of memory", s->shard);
        if (rc == 0 && node)
            zd_autograd_node_set_output(node, use[i]);
        zd_tensor_unref(copies[k++]);
    }
    zd_autograd_node_unref(node);
    if (rc < 0)
        for (int i = 0; i < NET_PARAMS; i++)
            zd_tensor_unref_p(&use[i]);
    return rc;
}

/*  h = f(h), keeping h's reference count right: each step of the forward. */
#define STEP(call)                                                                                 \
    do {                                                                                           \
        zd_tensor_t *next = NULL;                                                                  \
        rc = rc == 0 ? (call) : rc;                                                                \
        zd_tensor_unref(h);                                                                        \
        h = next;                                                                                  \
    } while (0)

static int stage_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                         int n_out)
{
    stage_t *s = zd_nn_module_state(m);
    bool last = s->shard == s->num_shards - 1, training = zd_nn_module_is_training(m);
    zd_tensor_t *p[NET_PARAMS], *h = NULL, *flat = NULL, *rows = NULL;
    if (n_out != ps_stage_outputs(s->shard, s->num_shards))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "stage %d gives %d output(s), asked for %d",
                                 s->shard, ps_stage_outputs(s->shard, s->num_shards), n_out);
    if (check_input(s, in, n_in) < 0)
        return -1;
    /* an evaluation reads the parameters themselves: steps held off all
       along (a training forward's copy holds them off while it is taken) */
    bool eval = !zd_autograd_is_grad_enabled();
    if (eval)
        zd_dist_optim_read_lock();
    if (params_for_forward(s, p) < 0) {
        if (eval)
            zd_dist_optim_read_unlock();
        return -1;
    }
    zd_rng_t rng; /* this forward's dropout masks */
    pthread_mutex_lock(&s->rng_lock);
    zd_rng_seed(&rng, zd_rng_u64(&s->rng));
    pthread_mutex_unlock(&s->rng_lock);
    training = training && s->dropout;
    int rc = 0;
    h = zd_tensor_ref(in[0]);
    if (s->shard == 0) {
        STEP(zd_nn_conv2d_relu(h, p[CONV1_W], p[CONV1_B], 1, 0, &next));
        STEP(zd_nn_conv2d_max_pool2d(h, p[CONV2_W], p[CONV2_B], 1, 0, 2, 2, &next));
        STEP(zd_nn_dropout2d(h, 0.25f, training, &rng, &next));
        STEP(zd_nn_flatten(h, &next));
    }
    flat = h ? zd_tensor_ref(h) : NULL;
    STEP(zd_nn_linear(h, p[FC1_W], p[FC1_B], &next));
    STEP(zd_nn_relu(h, &next));
    STEP(zd_nn_dropout(h, 0.5f, training, &rng, &next));
    rows = h, h = NULL;
    if (rc == 0 && s->shard > 0)
        rc = zd_tensor_cat((zd_tensor_t *[]){in[1], rows}, 2, 1, &h);
    else if (rc == 0)
        h = zd_tensor_ref(rows);
    if (last) {
        STEP(zd_nn_linear(h, p[FC2_W], p[FC2_B], &next));
        STEP(zd_nn_log_softmax(h, 1, &next));
        out[0] = rc == 0 ? zd_tensor_ref(h) : NULL;
    } else {
        out[0] = rc == 0 ? zd_tensor_ref(flat) : NULL;
        out[1] = rc == 0 ? zd_tensor_ref(h) : NULL;
    }
    if (eval)
        zd_dist_optim_read_unlock();
    zd_tensor_unref(h);
    zd_tensor_unref(flat);
    zd_tensor_unref(rows);
    for (int i = 0; i < NET_PARAMS; i++)
        zd_tensor_unref(p[i]);
    return rc;
}

static void stage_free(void *arg)
{
    stage_t *s = arg;
    for (int i = 0; i < NET_PARAMS; i++)
        zd_tensor_unref(s->copy[i]);
    pthread_mutex_destroy(&s->copy_lock);
    pthread_mutex_destroy(&s->rng_lock);
    free(s);
}

/*  Rows [first, first + count) of t as a new tensor. */
static zd_tensor_t *rows_of(const zd_tensor_t *t, int first, int count)
{
    int64_t cols = zd_tensor_ndim(t) > 1 ? zd_tensor_size(t, 1) : 1;
    int64_t shape[2] = {count, cols};
    zd_tensor_t *r = zd_tensor_empty(ZD_FLOAT32, shape, zd_tensor_ndim(t));
    if (r)
        memcpy(zd_tensor_data(r), zd_tensor_data((zd_tensor_t *)t) + (int64_t)first * cols,
               sizeof(float) * (size_t)(count * cols));
    return r;
}

zd_nn_module_t *ps_stage_new(const zd_nn_module_t *net, int shard, int num_shards,
                             int64_t max_batch, uint64_t seed, bool dropout)
{
    if (num_shards < 1 || num_shards > PS_STAGES_MAX || shard < 0 || shard >= num_shards ||
        zd_nn_module_n_params(net) != NET_PARAMS) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "stage %d of %d of a Net", shard, num_shards);
        return NULL;
    }
    stage_t *s = calloc(1, sizeof *s);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "stage %d: out of memory", shard);
        return NULL;
    }
    *s = (stage_t){
        .shard = shard, .num_shards = num_shards, .max_batch = max_batch, .dropout = dropout};
    pthread_mutex_init(&s->rng_lock, NULL);
    pthread_mutex_init(&s->copy_lock, NULL);
    /* (a module that cannot be made frees its state: s) */
    zd_nn_module_t *m = zd_nn_module_new("NetStage", stage_forward, s, stage_free);
    if (!m)
        return NULL;
    zd_rng_seed(&s->rng, seed * 1000003u + (uint64_t)shard);
    fc1_rows(shard, num_shards, &s->fc1_first, &s->fc1_count);
    for (int i = 0; i < NET_PARAMS; i++) {
        const zd_tensor_t *w = zd_nn_module_param(net, i);
        bool fc1 = i == FC1_W || i == FC1_B;
        if ((i < FC1_W && shard != 0) || (i > FC1_B && shard != num_shards - 1))
            continue;
        zd_tensor_t *t = fc1 ? rows_of(w, s->fc1_first, s->fc1_count) : zd_tensor_detach_copy(w);
        int rc = t ? zd_nn_module_register_parameter(m, stage_name[i], t) : -1;
        zd_tensor_unref(t);
        if (rc < 0) {
            zd_nn_module_free(m);
            return NULL;
        }
        s->p[i] = zd_nn_module_find(m, stage_name[i]);
    }
    return m;
}

const char *ps_stage_describe(const zd_nn_module_t *stage, char *buf, size_t size)
{
    const stage_t *s = zd_nn_module_state(stage);
    int64_t numel = 0;
    size_t at = 0;
    for (int i = 0; i < zd_nn_module_n_params(stage); i++)
        numel += zd_tensor_numel(zd_nn_module_param(stage, i));
    at += (size_t)snprintf(buf, size, "%lld parameters (%.2f MB): ", (long long)numel,
                           (double)numel * 4 / 1e6);
    for (int i = 0; i < zd_nn_module_n_params(stage) && at < size; i++) {
        char sh[64];
        at += (size_t)snprintf(buf + at, size - at, "%s%s %s", i ? ", " : "",
                               zd_nn_module_param_name(stage, i),
                               zd_tensor_shape_str(zd_nn_module_param(stage, i), sh, sizeof sh));
    }
    if (at < size)
        snprintf(buf + at, size - at, " (fc1 rows %d-%d)", s->fc1_first,
                 s->fc1_first + s->fc1_count - 1);
    return buf;
}

/*  ---- the servers' functions ---- */

static struct {
    zd_ps_model_server_t *srv;
    zd_nn_module_t *stage;
} here;

/*  [[name, tensor], ...] of this shard's stage now (call NULL: rank 0's
    own). The whole stage, 4.7 MB with one shard: rank 0's alone to ask. */
static zd_value_t *fn_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args, (void)arg;
    if (call && zd_rpc_call_caller_rank(call) != 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "rpc_ps_params: for rank 0 only, not \"%s\" (rank %d)",
                          zd_rpc_call_caller_name(call), zd_rpc_call_caller_rank(call));
        return NULL;
    }
    zd_named_tensors_t *nt = zd_ps_model_server_params(here.srv);
    int n = nt ? zd_named_tensors_len(nt) : 0;
    zd_value_t *list = nt ? zd_value_list((size_t)n) : NULL;
    for (int i = 0; list && i < n; i++) {
        const char *name = zd_named_tensors_name(nt, i);
        zd_value_t *item = ZD_ARGS(name, zd_named_tensors_find(nt, name));
        if (!item || zd_list_append(list, item) < 0)
            zd_value_unref(list), list = NULL;
    }
    zd_named_tensors_free(nt);
    return list;
}

static zd_value_t *fn_gradient_sizes(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t cid;
    if (zd_rpc_arg_int(args, 0, &cid) < 0)
        return NULL;
    int n = zd_nn_module_n_params(here.stage);
    zd_value_t *list = zd_value_list((size_t)n);
    for (int i = 0; list && i < n; i++) {
        zd_tensor_t *g = NULL;
        if (zd_dist_autograd_get_gradient(cid, zd_nn_module_param(here.stage, i), &g) < 0) {
            zd_value_unref(list);
            return NULL;
        }
        zd_value_t *item =
            g ? ZD_ARGS(zd_nn_module_param_name(here.stage, i), zd_tensor_numel(g)) : NULL;
        if (g && (!item || zd_list_append(list, item) < 0))
            zd_value_unref(list), list = NULL;
        zd_tensor_unref(g);
    }
    return list;
}

int ps_stages_register(zd_ps_model_server_t *srv, zd_nn_module_t *stage)
{
    here.srv = srv;
    here.stage = stage;
    if (zd_rpc_register("rpc_ps_params", fn_params, NULL) < 0 ||
        zd_rpc_register("rpc_ps_gradient_sizes", fn_gradient_sizes, NULL) < 0)
        return -1;
    /* The backwards read the forwards' copies, not the parameters: they
       need not hold the steps off, as the guard zd_dist_optim_init
       installed (through zd_ps_model_server_new) has them do. */
    return zd_dist_autograd_set_backward_guard(NULL, NULL);
}

/*  Files each [name, tensor] of shard's list into the Net's pieces. */
static int take_pieces(zd_value_t *list, int shard, zd_tensor_t *piece[NET_PARAMS][PS_STAGES_MAX],
                       int n_pieces[NET_PARAMS])
{
    for (size_t i = 0; i < zd_list_len(list); i++) {
        zd_value_t *item = zd_list_get(list, i);
        const char *name;
        zd_tensor_t *t;
        if (zd_list_len(item) != 2 || zd_value_get_string(zd_list_get(item, 0), &name) < 0 ||
            zd_value_get_tensor(zd_list_get(item, 1), &t) < 0)
            return zd_error_set("shard %d sent a parameter list of another form", shard);
        int k = 0;
        while (k < NET_PARAMS && strcmp(stage_name[k], name) != 0)
            k++;
        if (k == NET_PARAMS || n_pieces[k] == PS_STAGES_MAX || zd_tensor_dtype(t) != ZD_FLOAT32)
            return zd_error_set("shard %d sent an unexpected parameter \"%.64s\"", shard, name);
        piece[k][n_pieces[k]++] = t;
    }
    return 0;
}

zd_nn_module_t *ps_stages_gather(int num_shards, uint64_t seed)
{
    zd_value_t *answers[PS_STAGES_MAX] = {0};
    zd_tensor_t *piece[NET_PARAMS][PS_STAGES_MAX];
    int n_pieces[NET_PARAMS] = {0}, rc = 0;
    zd_nn_module_t *net = NULL;
    if (num_shards > PS_STAGES_MAX)
        rc = zd_error_set("%d shards: at most %d", num_shards, PS_STAGES_MAX);
    else if (!(net = zd_nn_net_new(seed)))
        rc = -1;
    /* shard 0's own, then the others' in shard order: fc1's rows in order */
    if (rc == 0)
        rc = (answers[0] = fn_params(NULL, NULL, NULL)) ? 0 : -1;
    for (int s = 1; rc == 0 && s < num_shards; s++)
        rc = zd_rpc_sync(s, "rpc_ps_params", NULL, ZD_TIMEOUT_DEFAULT, &answers[s]);
    for (int s = 0; rc == 0 && s < num_shards; s++)
        rc = take_pieces(answers[s], s, piece, n_pieces);
    bool prev = zd_autograd_set_grad_enabled(false);
    for (int k = 0; rc == 0 && k < NET_PARAMS; k++) {
        zd_tensor_t *whole = NULL, *want = zd_nn_module_param(net, k);
        if (n_pieces[k] == 1)
            whole = zd_tensor_ref(piece[k][0]);
        else if (n_pieces[k] > 1 && zd_tensor_cat(piece[k], n_pieces[k], 0, &whole) < 0)
            whole = NULL;
        if (!whole || !zd_tensor_same_shape(whole, want)) {
            char a[96], b[96];
            rc = zd_error_set("the shards' \"%s\" is %s, the Net's %s",
                              zd_nn_module_param_name(net, k),
                              whole ? zd_tensor_shape_str(whole, a, sizeof a) : "missing",
                              zd_tensor_shape_str(want, b, sizeof b));
        }
        if (rc == 0)
            rc = zd_tensor_copy_(want, whole);
        zd_tensor_unref(whole);
    }
    zd_autograd_set_grad_enabled(prev);
    for (int s = 0; s < PS_STAGES_MAX; s++)
        zd_value_unref(answers[s]);
    if (rc < 0) {
        zd_nn_module_free(net);
        return NULL;
    }
    zd_nn_module_train(net, false);
    return net;
}

int ps_stages_check_gradients(int num_shards, int64_t cid)
{
    for (int s = 0; s < num_shards; s++) {
        zd_value_t *sizes = NULL, *a = ZD_ARGS(cid);
        int rc = a ? zd_rpc_sync(s, "rpc_ps_gradient_sizes", a, ZD_TIMEOUT_DEFAULT, &sizes) : -1;
        zd_value_unref(a);
        if (rc == 0 && zd_list_len(sizes) == 0)
            rc = zd_error_set("server shard %d has no gradients for context %lld", s,
                              (long long)cid);
        for (size_t i = 0; rc == 0 && i < zd_list_len(sizes); i++) {
            int64_t numel;
            if (zd_rpc_arg_int(zd_list_get(sizes, i), 1, &numel) < 0 || numel < 1)
                rc = zd_error_set("server shard %d's gradient %zu for context %lld is empty", s, i,
                                  (long long)cid);
        }
        zd_value_unref(sizes);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/*  Test images per forward: the activations of 128 are what a thread
    holds (conv1's output of 1000 images alone was 86 MB), with the
    layers' products as fast. */
#define EVAL_CHUNK 128

typedef struct {
    zd_nn_module_t *net;
    const zd_dataset_t *test;
    int64_t start, end, correct;
    int rc;
    char error[256];
} eval_part_t;

static void *evaluate_part(void *arg)
{
    eval_part_t *e = arg;
    bool prev = zd_autograd_set_grad_enabled(false);
    for (int64_t at = e->start; at < e->end && e->rc == 0; at += EVAL_CHUNK) {
        zd_tensor_t *x, *y, *out = NULL;
        int64_t n = e->end - at < EVAL_CHUNK ? e->end - at : EVAL_CHUNK;
        e->rc = zd_dataset_batch(e->test, NULL, at, n, &x, &y);
        if (e->rc == 0 && (e->rc = zd_nn_module_forward(e->net, &x, 1, &out, 1)) == 0) {
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

int ps_stages_evaluate(zd_nn_module_t *net, const zd_dataset_t *test, int64_t limit, double *acc,
                       int64_t *images)
{
    int64_t n = zd_dataset_len(test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = zd_nn_get_num_threads() > 1 || cores < 2 ? 1 : cores > 8 ? 8 : (int)cores, rc = 0;
    eval_part_t e[8];
    pthread_t th[8];
    bool started[8] = {false};
    for (int i = 0; i < parts; i++) {
        e[i] = (eval_part_t){net, test, n * i / parts, n * (i + 1) / parts, 0, 0, ""};
        if (i > 0)
            started[i] = pthread_create(&th[i], NULL, evaluate_part, &e[i]) == 0;
        if (i > 0 && !started[i])
            evaluate_part(&e[i]); /* no thread: here */
    }
    evaluate_part(&e[0]);
    for (int i = 0; i < parts; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        if (e[i].rc < 0 && rc == 0)
            rc = zd_error_set("%s", e[i].error);
        correct += e[i].correct;
    }
    *acc = n ? (double)correct / (double)n : 0;
    *images = n;
    return rc;
}
