/* SPDX-License-Identifier: MIT */
/*  ps_two_stages.h: the model of two stages the remote model's tests
    (test_ps_model.c, test_ps_run.c) train in worlds of real processes, its
    shards' side, and the same model trained locally to hold the shards'
    stages against.

    Stage 0, on rank 0, is a hidden layer, tanh(x W^T + b), of PS2_IN to
    PS2_HIDDEN features; stage 1, on rank 1, a head, h W^T + b, of
    PS2_HIDDEN to PS2_OUT, which gives the stage's mode (1 training, 0
    evaluation) as a second output when asked for two. Every copy of a
    stage starts from the same weights and every batch is a function of
    its trainer and position alone, so that a trainer knows what the
    shards must hold by training the same model locally.

    A shard process serves its stage through ps2_run_shard, which registers
    "test_stage_params", "test_version" and "test_die"; the trainer's
    helpers below call them. Nothing here uses cmocka: the shards and
    trainers run in world_run's children (world.h). */
#ifndef ZDIST_TESTS_PS_TWO_STAGES_H
#define ZDIST_TESTS_PS_TWO_STAGES_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/module.h>
#include <zdist/optim.h>
#include <zdist/ps.h>

#include "tests/support/world.h"

#define PS2_IN     4
#define PS2_HIDDEN 8
#define PS2_OUT    3
#define PS2_BATCH  5 /* samples in a batch */
#define PS2_LR     0.1

/*  ---- the model ---- */

/*  Stage `which` (0 or 1) with its starting weights: the caller's
    (zd_nn_module_free), NULL when out of memory. */
zd_nn_module_t *ps2_make_stage(int which);

/*  Trainer `trainer`'s batch at `position`: inputs into *x, regression
    targets into *y, each the caller's; either NULL when out of memory. */
void ps2_make_batch(int trainer, int64_t position, zd_tensor_t **x, zd_tensor_t **y);

/*  ---- the shards ---- */

/*  What a shard process does besides serving its stage. */
typedef struct {
    zd_ps_options_t options; /* its server's */
    world_fn *serving;       /* run once it has joined, before it leaves (may be NULL) */
    bool shutdown_may_fail;  /* a peer killed by the test may keep the world from ending well */
} ps2_shard_t;

/*  Serves stage w->rank with o->options until the world shuts down (a
    test registers its own handlers before): 0, or nonzero after a message
    on stderr. */
int ps2_run_shard(const world_t *w, const ps2_shard_t *o);

/*  This process's server while ps2_run_shard serves (borrowed), else NULL. */
zd_ps_model_server_t *ps2_server(void);

/*  Serves rank w->rank from `lives` child processes in turn, each through
    serve (resume after the first), each but the last killed, the next
    started when a byte comes on told_fd: 0, or world_fail's -1. */
int ps2_restarted_shard(const world_t *w, int lives, int told_fd,
                        int (*serve)(const world_t *w, bool resume));

/*  ---- the trainer's side ---- */

/*  A trainer's model over ranks 0 and 1 (SGD at PS2_LR), then world_join
    (the model first: it installs distributed autograd): the caller's
    (ps2_leave), NULL with the error set. */
zd_ps_model_t *ps2_trainer_join(const world_t *w);

/*  The model trained locally: both stages and one optimizer over their
    parameters. */
typedef struct {
    zd_nn_module_t *stage[2];
    zd_optim_t *opt;
} ps2_local_t;

/*  Makes *l, SGD at PS2_LR as the trainers': 0, or -1 with nothing held. */
int ps2_local_new(ps2_local_t *l);

/*  Frees what *l holds. */
void ps2_local_free(ps2_local_t *l);

/*  Trains *l on trainer 0's batch at `position` with autograd, its loss
    into *loss (unless NULL): 0, or -1 with the error set. */
int ps2_local_step(ps2_local_t *l, int64_t position, float *loss);

/*  Both stages' parameters, asked of their shards, against l's (within
    1e-6 relative): 0, or world_fail's -1 naming the first that differs. */
int ps2_same_params(const world_t *w, const ps2_local_t *l);

/*  Stage s's version (the steps it took), or -1 when the call fails. */
int64_t ps2_shard_version(int s);

/*  Kills shard 1's process: 0, or -1 when it answered instead. */
int ps2_kill_shard_1(void);

/*  Frees model (first, so that the shards free their optimizers) and
    leaves the world: rc, or world_fail's -1 when the shutdown failed. */
int ps2_leave(const world_t *w, zd_ps_model_t *model, int rc);

#endif
