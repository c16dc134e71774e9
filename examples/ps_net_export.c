/* SPDX-License-Identifier: MIT */
/*  ps_net_export.c: the servers' Net in and out of safetensors files under
    PyTorch's names (--init_from, --save_model).

    --init_from: every shard loads the whole file into the Net it builds
    (strictly: the tutorial Net's 8 tensors, their shapes) and keeps its
    slice, as it does with the seed's weights; the file must be readable
    where each shard runs.
    --save_model: once the trainers are done, shard 0 asks every other
    shard for a copy of its parameters (ps_local_params), puts fc1's rows
    back together in shard order and writes the whole Net, checked against
    the Net's shapes: what a shard sends is not trusted. */
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"

#include <stdio.h>
#include <string.h>

#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/rpc.h>
#include <zdist/safetensors.h>

#define NET_PARAMS 8
#define MAX_PIECES 64

static char init_path[4096], save_path[4096];
static int save_state; /* 0: not written (yet), 1: written, -1: failed */
static char save_error[1024];

void ps_net_set_init_from(const char *path)
{
    snprintf(init_path, sizeof init_path, "%s", path ? path : "");
}

const char *ps_net_init_from(void)
{
    return init_path[0] ? init_path : NULL;
}

void ps_net_set_save_model(const char *path)
{
    snprintf(save_path, sizeof save_path, "%s", path ? path : "");
}

bool ps_net_save_model_wanted(void)
{
    return save_path[0] && ps_shard.shard == 0;
}

int ps_net_save_model_result(const char **why)
{
    *why = save_state < 0
        ? save_error
        : "no final evaluation ran on the server (no trainer finished its batches)";
    return save_state;
}

/*  ps_local_params() -> [[name, tensor], ...]: copies of this shard's
    parameters, taken between optimizer steps; asked by shard 0 only (call
    NULL: shard 0's own). */
static zd_value_t *fn_local_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args, (void)arg;
    if (call && ps_net_guard_shard0(call, "the shard's parameters") < 0)
        return NULL;
    zd_value_t *list = zd_value_list((size_t)ps_shard.n);
    zd_dist_optim_read_lock();
    for (int i = 0; list && i < ps_shard.n; i++) {
        zd_tensor_t *copy = zd_tensor_detach_copy(ps_shard.params[i]);
        zd_value_t *item = copy ? ZD_ARGS(ps_shard.names[i], copy) : NULL;
        if (!item || zd_list_append(list, item) < 0) {
            zd_value_unref(list);
            list = NULL;
        }
        zd_tensor_unref(copy);
    }
    zd_dist_optim_read_unlock();
    return list;
}

int ps_net_export_register(void)
{
    return zd_rpc_register("ps_local_params", fn_local_params, NULL);
}

typedef struct {
    const char *name;
    zd_tensor_t *piece[MAX_PIECES]; /* borrowed from the shards' answers */
    int n;
} gathered_t;

/*  Files each [name, tensor] of list under its name in g. */
static int take_pieces(gathered_t *g, zd_value_t *list, int shard)
{
    for (size_t i = 0; i < zd_list_len(list); i++) {
        zd_value_t *item = zd_list_get(list, i);
        const char *name;
        zd_tensor_t *t;
        if (zd_list_len(item) != 2 || zd_value_get_string(zd_list_get(item, 0), &name) < 0 ||
            zd_value_get_tensor(zd_list_get(item, 1), &t) < 0)
            return zd_error_set("shard %d sent a parameter list of another form", shard);
        int k = 0;
        while (k < NET_PARAMS && strcmp(g[k].name, name) != 0)
            k++;
        if (k == NET_PARAMS || g[k].n == MAX_PIECES || zd_tensor_dtype(t) != ZD_FLOAT32)
            return zd_error_set("shard %d sent an unexpected parameter \"%.64s\"", shard, name);
        g[k].piece[g[k].n++] = t;
    }
    return 0;
}

static int save(int64_t step, double accuracy, int64_t images)
{
    zd_nn_module_t *net = zd_nn_net_new(0); /* the shapes to check against */
    zd_value_t *answers[MAX_PIECES] = {0};
    zd_named_tensors_t *nt = zd_named_tensors_new();
    gathered_t g[NET_PARAMS] = {{0}};
    int rc = net && nt ? 0 : -1, S = ps_shard.num_shards;
    for (int k = 0; net && k < NET_PARAMS; k++)
        g[k] = (gathered_t){.name = zd_nn_module_param_name(net, k)};
    /* shard 0's own, then the others' in shard order: fc1's rows in order */
    if (rc == 0)
        rc = (answers[0] = fn_local_params(NULL, NULL, NULL)) ? 0 : -1;
    for (int s = 1; rc == 0 && s < S && s < MAX_PIECES; s++)
        rc = zd_rpc_sync(s, "ps_local_params", NULL, ZD_TIMEOUT_DEFAULT, &answers[s]);
    for (int s = 0; rc == 0 && s < S && s < MAX_PIECES; s++)
        rc = take_pieces(g, answers[s], s);
    for (int k = 0; rc == 0 && k < NET_PARAMS; k++) {
        zd_tensor_t *whole = NULL, *want = zd_nn_module_param(net, k);
        if (g[k].n == 1)
            whole = zd_tensor_ref(g[k].piece[0]);
        else if (g[k].n > 1 && zd_tensor_cat(g[k].piece, g[k].n, 0, &whole) < 0)
            whole = NULL;
        if (!whole || !zd_tensor_same_shape(whole, want)) {
            char a[96], b[96];
            rc = zd_error_set("the shards' \"%s\" is %s, the Net's %s", g[k].name,
                              whole ? zd_tensor_shape_str(whole, a, sizeof a) : "missing",
                              zd_tensor_shape_str(want, b, sizeof b));
        }
        if (rc == 0)
            rc = zd_named_tensors_add(nt, g[k].name, whole);
        zd_tensor_unref(whole);
    }
    char s_step[32], s_acc[32], s_images[32];
    snprintf(s_step, sizeof s_step, "%lld", (long long)step);
    snprintf(s_acc, sizeof s_acc, "%.6f", accuracy);
    snprintf(s_images, sizeof s_images, "%lld", (long long)images);
    const char *meta[] = {"format",        "pt",  "step",        s_step,
                          "test_accuracy", s_acc, "test_images", s_images};
    zd_strings_t *kv = zd_strings_from(meta, 8);
    if (rc == 0)
        rc = kv ? zd_safetensors_write(nt, save_path, kv) : -1;
    zd_strings_free(kv);
    for (int s = 0; s < MAX_PIECES; s++)
        zd_value_unref(answers[s]);
    zd_named_tensors_free(nt);
    zd_nn_module_free(net);
    return rc;
}

void ps_net_save_model(int64_t step, double accuracy, int64_t images)
{
    bool prev = zd_autograd_set_grad_enabled(false);
    int rc = save(step, accuracy, images);
    zd_autograd_set_grad_enabled(prev);
    if (rc == 0) {
        save_state = 1;
        printf("saved model %s (safetensors, PyTorch's names; step %lld, test accuracy %.2f %% "
               "on %lld images)\n",
               save_path, (long long)step, 100 * accuracy, (long long)images);
        fflush(stdout);
    } else {
        save_state = -1;
        snprintf(save_error, sizeof save_error, "%s", zd_error_last());
        fprintf(stderr, "rpc_ps: --save_model=%s: %s\n", save_path, save_error);
    }
}
