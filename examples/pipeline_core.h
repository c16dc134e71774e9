/* SPDX-License-Identifier: MIT */
/*  pipeline_core.h: pipeline parallelism over RPC, in the style of
    PyTorch's tutorial "Distributed Pipeline Parallelism Using RPC", with
    the parameter-server tutorial's Net cut in two.

    Two shard actors (actor.h), each created with zd_rpc_remote() on its
    own process:
      "NetShard"(stage, seed, dropout): the Net built from seed; stage 1
          runs conv1 .. flatten (zd_nn_net_forward_conv), stage 2 fc1 ..
          log_softmax (zd_nn_net_forward_fc).
        "NetShard.forward"(x_rref): fetches the input from its RRef and runs
            its stage, one micro-batch at a time (a lock, as the tutorial's).
        "NetShard.parameter_rrefs"(): [RRef(param), ...] of its stage.
        "NetShard.train"(on): dropout on or off.
        "NetShard.gradients"(context_id): [grad or none, ...] of its stage's
            parameters in that distributed autograd context.
        "NetShard.stats"(): [seconds spent in forward, forwards] since the
            previous call.

    The driver cuts each batch into micro-batches (views of its rows,
    zd_tensor_narrow); for each one it wraps the input in an RRef, asks stage
    1 to keep its output remotely (zd_rref_remote) and stage 2 to continue
    from that RRef (zd_rref_rpc_async), so while stage 2 works on
    micro-batch i, stage 1 already works on i + 1. The outputs are concatenated (zd_tensor_cat), the
    loss is one nll_loss over the batch, zd_dist_autograd_backward runs back
    through both shards, and a DistributedOptimizer steps both.

    World layout: rank 0 the driver, ranks 1 and 2 the shards. */
#ifndef ZDIST_EXAMPLES_PIPELINE_CORE_H
#define ZDIST_EXAMPLES_PIPELINE_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/rpc.h>

#define PIPELINE_WORLD_SIZE   3
#define PIPELINE_STAGE_PARAMS 4 /* parameters per stage */

/*  Registers the shard functions, and initialises distributed autograd and
    the DistributedOptimizer's functions: every rank, before zd_rpc_init.
    0, or -1. */
int pipeline_register(void);

/*  ---- the Net split over two shards, seen from the driver ---- */

typedef struct pipeline_net pipeline_net_t;

/*  Creates the shards on ranks rank1 and rank2 (both from seed, so that
    together they hold exactly zd_nn_net_new(seed)'s weights). NULL, with an
    error, when the call cannot be made; a shard that failed to build
    fails the first call that uses it. Free with pipeline_net_free. */
pipeline_net_t *pipeline_net_new(int rank1, int rank2, uint64_t seed, bool dropout);

/*  Releases the shards' RRefs, the last ones to them, so that their
    processes free them, and frees the handle. NULL-safe. */
void pipeline_net_free(pipeline_net_t *n);

/*  Forward of x (N,1,28,28) in num_split micro-batches of
    ceil(N / num_split) rows (the last one smaller): 0 and *logprobs (N,10)
    (a new reference), or -1. Under the calling thread's distributed
    autograd context when it has one (recorded for backward); without one
    the shards do not record anything (evaluation). */
int pipeline_net_forward(pipeline_net_t *n, zd_tensor_t *x, int num_split, zd_tensor_t **logprobs);

/*  The eight parameter RRefs, stage 1's then stage 2's: borrowed, valid
    while n lives; NULL on failure. */
const zd_rref_list_t *pipeline_net_parameter_rrefs(pipeline_net_t *n);

/*  Dropout on (training) or off on both shards. 0, or -1. */
int pipeline_net_train(pipeline_net_t *n, bool training);

/*  The gradients of the eight parameters in context_id (zd_nn_net_new's
    order): grads[i] a new reference, or NULL when the parameter got none.
    0, or -1. */
int pipeline_net_gradients(pipeline_net_t *n, int64_t context_id, zd_tensor_t **grads);

/*  Seconds each shard spent computing forwards since the previous call
    (seconds[0] stage 1, seconds[1] stage 2). 0, or -1. */
int pipeline_net_busy(pipeline_net_t *n, double *seconds);

/*  ---- the program ---- */

typedef struct {
    int64_t batch_size;   /* 128 */
    int64_t num_split;    /* 4 micro-batches per batch */
    bool baseline;        /* first run with 1 micro-batch too (true) */
    int64_t iterations;   /* 20 batches per run */
    double lr;            /* 0.05, as the tutorial */
    int64_t seed;         /* 1 */
    const char *data_dir; /* NULL: zd_dataset_find_dir() */
    bool dropout;         /* true */
    int64_t test_size;    /* test images evaluated at the end (1000; 0: none) */
    int64_t log_interval; /* print the loss every N batches (5; 0: never) */
    bool quiet;
} pipeline_options_t;

pipeline_options_t pipeline_options_default(void);

typedef struct {
    int runs;                /* 1 or 2 */
    int64_t num_split[2];    /* per run */
    double samples_per_s[2]; /* after the first (warm-up) batch of each run */
    double seconds[2];       /* whole run */
    /* Per batch, after the first: the forward's wall time and each stage's
       compute time in it. Without overlap forward >= stage1 + stage2; the
       overlap is the share of the shorter stage hidden behind the other:
       (stage1 + stage2 - forward) / min(stage1, stage2), clamped to [0, 1]. */
    double forward_ms[2], stage_ms[2][2], overlap[2];
    double last_loss;
    double accuracy; /* of the last run, when test_size > 0 */
} pipeline_result_t;

/*  Checks the options and that the world has 3 processes. 0, or -1. */
int pipeline_options_check(const pipeline_options_t *o, int world_size);

/*  The driver: for 1 micro-batch (with baseline) and for num_split,
    trains a fresh Net for `iterations` batches and prints the throughput,
    as the tutorial does ("number of splits = 4, execution time = ..."),
    then the test accuracy. res may be NULL. 0, or -1. */
int pipeline_run_driver(const pipeline_options_t *o, pipeline_result_t *res);

#endif
