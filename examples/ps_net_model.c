/* SPDX-License-Identifier: MIT */
/*  ps_net_model.c: this shard's slice of the Net and the forward pass
    over all shards (see ps_net.h for the layout). */
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"
#include "examples/train_common.h"

#include <pthread.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>

#define FC1_IN  9216
#define FC1_OUT 128

ps_net_shard_t ps_shard;

/*  What only the forward pass uses: fc1 rows [fc1_first, fc1_first +
    fc1_count), and dropout's generator. */
static struct {
    bool dropout;
    int fc1_first, fc1_count;
    pthread_mutex_t rng_lock;
    zd_rng_t rng;
} model = {.rng_lock = PTHREAD_MUTEX_INITIALIZER};

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
    snprintf(ps_shard.names[ps_shard.n], sizeof ps_shard.names[0], "%s", name);
    zd_tensor_set_name(t, name);
    if (zd_tensor_set_requires_grad(t, true) < 0)
        return -1;
    ps_shard.params[ps_shard.n++] = t;
    return 0;
}

/*  Rows [first, first+count) of a (rows, cols) tensor as a new leaf. */
static zd_tensor_t *rows_of(zd_tensor_t *t, int first, int count)
{
    int64_t cols = zd_tensor_ndim(t) > 1 ? zd_tensor_size(t, 1) : 1;
    int64_t shape[2] = {count, cols};
    zd_tensor_t *r = zd_tensor_empty(ZD_FLOAT32, shape, zd_tensor_ndim(t));
    if (r)
        memcpy(zd_tensor_data(r), zd_tensor_data(t) + (int64_t)first * cols,
               sizeof(float) * (size_t)(count * cols));
    return r;
}

static int dropout(zd_tensor_t *x, float p, bool training, bool channels, zd_tensor_t **out)
{
    if (!training || !model.dropout) {
        *out = zd_tensor_ref(x);
        return 0;
    }
    pthread_mutex_lock(&model.rng_lock);
    int rc = channels ? zd_nn_dropout2d(x, p, true, &model.rng, out)
                      : zd_nn_dropout(x, p, true, &model.rng, out);
    pthread_mutex_unlock(&model.rng_lock);
    return rc;
}

int ps_net_fc1_part(zd_tensor_t *flat, bool training, zd_tensor_t **out)
{
    static const char *const names[] = {"fc1.weight", "fc1.bias"};
    zd_tensor_t *p[2], *l = NULL, *r = NULL;
    *out = NULL;
    if (model.fc1_count == 0)
        return zd_error_set("this shard holds no rows of fc1");
    /* (part of a forward that holds its slot already) */
    if (ps_net_snapshot(names, 2, false, p) < 0)
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

int ps_net_forward(zd_tensor_t *x, bool training, zd_tensor_t **out)
{
    static const char *const names[] = {"conv1.weight", "conv1.bias", "conv2.weight",
                                        "conv2.bias",   "fc2.weight", "fc2.bias"};
    zd_tensor_t *p[6], *h1 = NULL, *h2 = NULL, *h3 = NULL, *flat = NULL, *h = NULL, *f2 = NULL;
    zd_tensor_t *parts[64] = {0};
    zd_future_t *fs[64] = {0};
    int S = ps_shard.num_shards, rc;
    *out = NULL;
    if (ps_net_snapshot(names, 6, training, p) < 0)
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
        zd_value_t *args = ZD_ARGS(flat, training);
        fs[s] = args ? zd_rpc_async(s, "ps_fc1_part", args, ZD_TIMEOUT_DEFAULT) : NULL;
        zd_value_unref(args);
        if (!fs[s])
            rc = -1;
    }
    if (rc == 0 && model.fc1_count > 0)
        rc = ps_net_fc1_part(flat, training, &parts[0]);
    int n_parts = model.fc1_count > 0 ? 1 : 0;
    for (int s = 1; s < S; s++) {
        if (!fs[s])
            continue;
        zd_tensor_t *t;
        if (rc == 0 &&
            (zd_future_wait(fs[s], ZD_TIMEOUT_NONE) < 0 ||
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

int ps_net_model_build(int shard, int num_shards, uint64_t seed, bool use_dropout, FILE *out)
{
    if (num_shards < 1 || num_shards > 64 || shard < 0 || shard >= num_shards)
        return zd_error_set("ps_net: shard %d of %d", shard, num_shards);
    zd_nn_module_t *net = zd_nn_net_new(seed);
    if (!net)
        return -1;
    if (ps_net_init_from() &&
        zd_nn_module_load_safetensors(net, ps_net_init_from(), true, NULL) < 0) {
        zd_nn_module_free(net);
        return zd_error_wrap("--init_from");
    }
    if (ps_net_init_from())
        fprintf(out, "parameter server shard %d: initial weights from %s\n", shard,
                ps_net_init_from());
    ps_shard.shard = shard;
    ps_shard.num_shards = num_shards;
    ps_shard.seed = seed;
    model.dropout = use_dropout;
    zd_rng_seed(&model.rng, seed * 1000003u + (uint64_t)shard);
    ps_net_fc1_rows(shard, num_shards, &model.fc1_first, &model.fc1_count);
    int rc = 0;
    if (shard == 0) {
        const char *own[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"};
        for (int i = 0; i < 4 && rc == 0; i++)
            rc = add_param(own[i], zd_tensor_detach_copy(zd_nn_module_find(net, own[i])));
    }
    if (rc == 0 && model.fc1_count > 0) {
        rc = add_param(
            "fc1.weight",
            rows_of(zd_nn_module_find(net, "fc1.weight"), model.fc1_first, model.fc1_count));
        if (rc == 0)
            rc = add_param(
                "fc1.bias",
                rows_of(zd_nn_module_find(net, "fc1.bias"), model.fc1_first, model.fc1_count));
    }
    if (rc == 0 && shard == 0) {
        const char *own[] = {"fc2.weight", "fc2.bias"};
        for (int i = 0; i < 2 && rc == 0; i++)
            rc = add_param(own[i], zd_tensor_detach_copy(zd_nn_module_find(net, own[i])));
    }
    zd_nn_module_free(net);
    if (rc < 0)
        return -1;

    int64_t numel = 0;
    for (int i = 0; i < ps_shard.n; i++)
        numel += zd_tensor_numel(ps_shard.params[i]);
    fprintf(out, "parameter server shard %d of %d: %lld parameters (%.2f MB): ", shard, num_shards,
            (long long)numel, (double)numel * 4 / 1e6);
    for (int i = 0; i < ps_shard.n; i++) {
        char buf[64];
        fprintf(out, "%s%s %s", i ? ", " : "", ps_shard.names[i],
                zd_tensor_shape_str(ps_shard.params[i], buf, sizeof buf));
    }
    if (model.fc1_count > 0)
        fprintf(out, " (fc1 rows %d-%d)", model.fc1_first, model.fc1_first + model.fc1_count - 1);
    fprintf(out, "\n");
    return 0;
}

void ps_net_free(void)
{
    ps_net_eval_free();
    ps_net_snapshot_free();
    for (int i = 0; i < ps_shard.n; i++)
        zd_tensor_unref_p(&ps_shard.params[i]);
    ps_shard.n = 0;
}
