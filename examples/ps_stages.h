/* SPDX-License-Identifier: MIT */
/*  ps_stages.h: the tutorial's Net as the stages of the parameter-server
    layer's remote model (<zdist/ps.h>, zd_ps_model_*), over S server
    shards, and what the servers do with it beyond serving: the whole Net
    gathered back (the final evaluation, --save_model) and the tutorial's
    check that the servers hold a batch's gradients.

    Stage k of S holds a slice of fc1's rows (96 % of the bytes, split so
    that every shard holds about as many); stage 0 also the convolutions,
    the last stage fc2. A forward runs through them in turn, as the layer
    chains stages: stage 0 takes the images and hands on the features and
    its rows' activations [flat, h]; a stage in the middle appends its
    rows to h; the last one finishes with fc2 and log_softmax. The math is
    the Net's, so S does not change a loss (up to float rounding); every
    shard builds the whole Net from the same seed and keeps its slice. */
#ifndef ZDIST_EXAMPLES_PS_STAGES_H
#define ZDIST_EXAMPLES_PS_STAGES_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/dataset.h>
#include <zdist/module.h>
#include <zdist/ps.h>

#define PS_STAGES_MAX 16

/*  Stage `shard` of num_shards of net (borrowed; its weights are copied),
    refusing batches of more than max_batch samples, with dropout on its
    own stream (seeded by seed and shard) when dropout is set. A new
    module (zd_nn_module_free), or NULL. */
zd_nn_module_t *ps_stage_new(const zd_nn_module_t *net, int shard, int num_shards,
                             int64_t max_batch, uint64_t seed, bool dropout);

/*  The tensors stage `shard` of num_shards hands to the next stage (2, or
    1 for the last), and the most elements a forward's inputs hold for a
    batch of max_batch. */
int ps_stage_outputs(int shard, int num_shards);
int64_t ps_stage_max_input(int shard, int64_t max_batch);

/*  One line on the stage's parameters and fc1 rows into buf. Returns buf. */
const char *ps_stage_describe(const zd_nn_module_t *stage, char *buf, size_t size);

/*  Registers this shard's two functions (before zd_rpc_init, after
    zd_ps_model_server_new) and lets distributed autograd's backwards run
    beside the steps (zd_dist_autograd_set_backward_guard(NULL, NULL)): a
    training forward computes with a copy of the stage's parameters, one
    per step, through which the gradients reach them, so a backward reads
    nothing a step writes and its gradients are exact for the weights
    its forward saw:
      rpc_ps_params()              -> [[name, tensor], ...]: a copy of the
                                      stage's parameters, for rank 0 only
      rpc_ps_gradient_sizes(cid)   -> [[name, elements], ...]: the
                                      stage's gradients in context cid
    0, or -1. */
int ps_stages_register(zd_ps_model_server_t *srv, zd_nn_module_t *stage);

/*  On rank 0, shard 0 (after ps_stages_register): the whole Net at this
    moment, gathered from every shard (theirs checked against the Net's
    shapes: what a shard sends is not trusted), in evaluation mode. A new
    module, or NULL. */
zd_nn_module_t *ps_stages_gather(int num_shards, uint64_t seed);

/*  The accuracy of net (a gathered Net) on the first `limit` images of
    test (0: all) into *acc, the images into *images, split over the
    cores (a server's layers run on one thread each, and this is one
    pass). 0, or -1. */
int ps_stages_evaluate(zd_nn_module_t *net, const zd_dataset_t *test, int64_t limit, double *acc,
                       int64_t *images);

/*  On a trainer: asks every shard whether it holds gradients of context
    cid for each of its parameters (the tutorial fetches them; their sizes
    tell as much). 0, or -1 naming the shard. */
int ps_stages_check_gradients(int num_shards, int64_t cid);

#endif
