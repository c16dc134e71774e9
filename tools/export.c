/* SPDX-License-Identifier: MIT */
/*  zdist-export: one safetensors file, under PyTorch's names, from the
    sharded checkpoint rpc_ps --checkpoint=PREFIX writes.

        build/tools/zdist-export PREFIX OUT.safetensors

    Reads PREFIX.shard0, then the other shards its file names, which
    must all be of one generation (one checkpoint), puts the
    tutorial Net back together (fc1's rows in shard order) and writes it
    to OUT, checked against the Net's shapes, with "generation" and "step"
    (the batches the trainers had done, summed) in its metadata: the file
    PyTorch's Net loads with load_state_dict, as rpc_ps --save_model
    writes it. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/checkpoint.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/safetensors.h>

#define MAX_SHARDS 16
#define NET_PARAMS 8

/*  The int64 vector called name in a shard's file (at least min
    entries), or NULL with the error set. */
static const int64_t *ints(const zd_named_tensors_t *s, const char *name, int64_t min,
                           const char *path)
{
    zd_tensor_t *t = zd_named_tensors_find(s, name);
    if (!t || zd_tensor_dtype(t) != ZD_INT64 || zd_tensor_ndim(t) != 1 ||
        zd_tensor_numel(t) < min) {
        zd_error_set("%s: no int64 \"%s\": not a checkpoint of rpc_ps", path, name);
        return NULL;
    }
    return zd_tensor_data_i64(t);
}

/*  The stage's name of the Net's parameter ("conv1.weight" is
    "param.conv1_weight": a stage's own names have no dots). */
static void stage_name(const char *name, char *out, size_t size)
{
    snprintf(out, size, "param.%s", name);
    char *dot = strchr(out + 6, '.');
    if (dot)
        *dot = '_';
}

static int export_net(const char *prefix, const char *out)
{
    zd_named_tensors_t *shards[MAX_SHARDS] = {0};
    int S = 0, rc = -1;
    bool prev;
    int64_t generation = -1, step = 0, n_shards = 0;
    zd_nn_module_t *net = zd_nn_net_new(0); /* names and shapes to check against */
    zd_named_tensors_t *nt = zd_named_tensors_new();
    if (!net || !nt)
        goto out;
    /* ps.meta: format 2, shard, shards, version, generation */
    for (; S < MAX_SHARDS && (S == 0 || S < n_shards); S++) {
        char path[4200];
        snprintf(path, sizeof path, "%s.shard%d", prefix, S);
        zd_named_tensors_t *s = shards[S] = zd_checkpoint_read(path);
        const int64_t *meta = s ? ints(s, "ps.meta", 5, path) : NULL;
        if (!meta)
            goto out;
        if (meta[0] != 2 || meta[1] != S || meta[2] < 1 || meta[2] > MAX_SHARDS ||
            (S > 0 && meta[2] != n_shards)) {
            zd_error_set("%s: shard %lld of %lld (format %lld): not shard %d of this "
                         "checkpoint of rpc_ps",
                         path, (long long)meta[1], (long long)meta[2], (long long)meta[0], S);
            goto out;
        }
        if (S > 0 && meta[4] != generation) {
            zd_error_set("%s is of generation %lld, %s.shard0 of %lld: the shards are not of "
                         "one checkpoint",
                         path, (long long)meta[4], prefix, (long long)generation);
            goto out;
        }
        n_shards = meta[2];
        generation = meta[4];
        /* the batches the trainers had done: their positions, summed (a
           damaged file's sum stops at INT64_MAX) */
        zd_tensor_t *pos = zd_named_tensors_find(s, "ps.positions");
        const int64_t *p = S == 0 && pos ? ints(s, "ps.positions", 0, path) : NULL;
        if (S == 0 && pos && !p)
            goto out;
        for (int64_t i = 0; p && i < zd_tensor_numel(pos); i++)
            step = p[i] <= 0 ? step : p[i] > INT64_MAX - step ? INT64_MAX : step + p[i];
    }
    prev = zd_autograd_set_grad_enabled(false);
    rc = 0;
    for (int k = 0; rc == 0 && k < NET_PARAMS; k++) {
        const char *name = zd_nn_module_param_name(net, k);
        char in_stage[64];
        stage_name(name, in_stage, sizeof in_stage);
        zd_tensor_t *pieces[MAX_SHARDS], *whole = NULL, *want = zd_nn_module_param(net, k);
        int n = 0;
        for (int s = 0; s < S; s++)
            if ((pieces[n] = zd_named_tensors_find(shards[s], in_stage)))
                n++;
        for (int i = 0; i < n; i++)
            if (zd_tensor_dtype(pieces[i]) != ZD_FLOAT32)
                n = 0;
        if (n == 1)
            whole = zd_tensor_ref(pieces[0]);
        else if (n > 1 && zd_tensor_cat(pieces, n, 0, &whole) < 0)
            whole = NULL;
        if (!whole || !zd_tensor_same_shape(whole, want)) {
            char a[96], b[96];
            rc = zd_error_set("%s.shard0-%d: \"%s\" is %s, the Net's %s", prefix, S - 1, name,
                              whole ? zd_tensor_shape_str(whole, a, sizeof a) : "missing",
                              zd_tensor_shape_str(want, b, sizeof b));
        }
        if (rc == 0)
            rc = zd_named_tensors_add(nt, name, whole);
        zd_tensor_unref(whole);
    }
    zd_autograd_set_grad_enabled(prev);
    char s_gen[32], s_step[32];
    snprintf(s_gen, sizeof s_gen, "%lld", (long long)generation);
    snprintf(s_step, sizeof s_step, "%lld", (long long)step);
    const char *meta[] = {"format", "pt", "generation", s_gen, "step", s_step};
    zd_strings_t *kv = zd_strings_from(meta, 6);
    if (rc == 0)
        rc = kv ? zd_safetensors_write(nt, out, kv) : -1;
    zd_strings_free(kv);
    if (rc == 0)
        printf("%s: the Net of %d shard(s), generation %lld, step %lld\n", out, S,
               (long long)generation, (long long)step);
out:
    for (int s = 0; s < MAX_SHARDS; s++)
        zd_named_tensors_free(shards[s]);
    zd_named_tensors_free(nt);
    zd_nn_module_free(net);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: %s PREFIX OUT.safetensors\n"
               "writes the Net of rpc_ps's checkpoint PREFIX.shard0, PREFIX.shard1, ... to one\n"
               "safetensors file under PyTorch's names\n",
               argv[0]);
        return 0;
    }
    if (argc != 3 || argv[1][0] == '-' || argv[2][0] == '-' || !argv[1][0] || !argv[2][0]) {
        fprintf(stderr, "usage: %s PREFIX OUT.safetensors (--help)\n", argv[0]);
        return 2;
    }
    if (export_net(argv[1], argv[2]) < 0) {
        fprintf(stderr, "zdist-export: %s\n", zd_error_last());
        return 1;
    }
    return 0;
}
