/* SPDX-License-Identifier: MIT */
/*  ps_net_internal.h: what the files of rpc_ps's parameter server share
    (ps_net.h is their interface): the shard this process serves, and the
    pieces each file offers the others.

    ps_net_model.c       the Net's slice and its forward pass
    ps_net_snapshot.c    the parameters a forward computes with, and the
                         bound on training forwards in flight
    ps_net_serve.c       ps_net_serve and the forward/parameter/gradient RPCs
    ps_net_eval.c        trainers' start/finish, throughput, the shared final
                         evaluation
    ps_net_checkpoint.c  checkpoints and resume
    ps_net_export.c      the Net in and out of safetensors files */
#ifndef ZDIST_EXAMPLES_PS_NET_INTERNAL_H
#define ZDIST_EXAMPLES_PS_NET_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <zdist/autograd.h>
#include <zdist/rpc.h>

#define PS_NET_MAX_PARAMS 8

/*  This process's slice of the Net: parameters by PyTorch name. Set by
    ps_net_model_build before zd_rpc_init and not changed until
    ps_net_free, so the handlers read it without a lock (the tensors'
    values change under zd_dist_optim's lock). */
typedef struct {
    int shard, num_shards;
    uint64_t seed;
    int n;
    char names[PS_NET_MAX_PARAMS][32];
    zd_tensor_t *params[PS_NET_MAX_PARAMS];
} ps_net_shard_t;

extern ps_net_shard_t ps_shard;

/*  Builds this process's slice (ps_shard) from the Net made with seed and
    prints the split to out. 0, or -1. */
int ps_net_model_build(int shard, int num_shards, uint64_t seed, bool dropout, FILE *out);

/*  Shard 0: the whole forward pass, asking the other shards for their
    rows of fc1. 0 with *out a new tensor, or -1. */
int ps_net_forward(zd_tensor_t *x, bool training, zd_tensor_t **out);

/*  Views of the named parameters as they are now, for a forward: recorded
    so that gradients flow back to the shared parameters, unchanged by the
    steps that follow. With training, first waits for one of the slots of
    batches in flight (ps_net_set_max_inflight), held until the backward
    has gone through the views (or their graph is dropped). 0 with out[0..n)
    new references, or -1. */
int ps_net_snapshot(const char *const *names, int n, bool training, zd_tensor_t **out);
/*  Drops the shared copies (ps_net_free). */
void ps_net_snapshot_free(void);
/*  Forgets the shared copies, the parameters having changed without a
    step (a checkpoint loaded into them): the next forward copies them
    again. Called under the parameters' write lock. */
void ps_net_snapshot_drop(void);

/*  relu(flat fc1_slice^T + b) then dropout: this shard's part of fc1. */
int ps_net_fc1_part(zd_tensor_t *flat, bool training, zd_tensor_t **out);

/*  Register the RPC functions of ps_net_eval.c (the test set is read from
    data_dir, NULL: the default place) and of ps_net_checkpoint.c. 0, or -1. */
int ps_net_eval_register(const char *data_dir);
/*  Shard 0: a training forward of trainer rank began, of `samples` images
    (its batch count, and the aggregate throughput). */
void ps_net_eval_note_batch(int rank, int64_t samples);
/*  Frees ps_net_eval.c's tables (ps_net_free). */
void ps_net_eval_free(void);
int ps_net_checkpoint_register(void);

/*  ps_net_export.c: the --init_from path (NULL: none); whether this shard
    writes a --save_model file; ps_net_save_model writes it (shard 0, once
    the trainers are done: errors are printed and kept for
    ps_net_save_model_result); ps_local_params, registered by
    ps_net_export_register, gives it each shard's parameters. */
const char *ps_net_init_from(void);
bool ps_net_save_model_wanted(void);
void ps_net_save_model(int64_t step, double accuracy, int64_t images);
int ps_net_export_register(void);

/*  The caller checks of ps_net_guard.c; each returns 0, or -1 with the
    error set for the caller (and a line on stderr naming it). */
int ps_net_guard_batch(const zd_rpc_call_t *call, const zd_tensor_t *x);
int ps_net_guard_shard0(const zd_rpc_call_t *call, const char *what);
int ps_net_guard_features(const zd_rpc_call_t *call, const zd_tensor_t *flat);
int ps_net_guard_trainer(const zd_rpc_call_t *call, int64_t trainer);

#endif
