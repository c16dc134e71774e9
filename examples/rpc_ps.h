/* SPDX-License-Identifier: MIT */
/*  rpc_ps.h: rpc_ps's options, which its server side (rpc_ps_server.c)
    and its trainers (rpc_ps.c) share. */
#ifndef ZDIST_EXAMPLES_RPC_PS_H
#define ZDIST_EXAMPLES_RPC_PS_H

#include <stdbool.h>
#include <stdint.h>

#include "examples/flags.h"

typedef struct {
    flags_world_t world; /* rank, world_size, master_addr, master_port */
    int64_t num_gpus, num_servers;
    const char *data_dir;
    const char *curves;       /* prefix of each trainer's curve files, or NULL */
    int64_t eval_every;       /* batches of a trainer between its evaluations (0: at the end) */
    double progress_s;        /* seconds between progress lines (0: none) */
    const char *checkpoint;   /* prefix of the servers' checkpoint files, or NULL */
    int64_t checkpoint_every; /* batches of a trainer between checkpoints */
    bool resume;              /* start from the checkpoint */
    const char *save_model;   /* rank 0 writes the trained Net there (safetensors), or NULL */
    const char *init_from;    /* the servers start from the Net there (safetensors), or NULL */
    int64_t batch_size, epochs, max_batches, seed, log_interval, eval_samples, check_interval;
    int64_t threads, init_timeout_s;
    double lr;
    bool no_dropout;
    int64_t min_trainers;   /* servers: fail when fewer trainers finished */
    int64_t max_staleness;  /* trainers: at most this many batches ahead (0: no bound) */
    int64_t max_batch_size; /* servers: the largest batch a stage takes (0: default) */
    int64_t max_inflight;   /* servers: training forwards held at once (0: 2 per core) */
    int64_t server_wait_s;  /* trainers: how long a lost server shard may take to come back */
    char name[64];          /* the worker's name: parameter_server[_K], trainer_N */
} rpc_ps_options_t;

/*  The test images of one evaluation forward. */
#define RPC_PS_EVAL_BATCH 500

/*  Parses and checks the flags into *o, with the worker's name, sets its
    compute threads (--threads 0 resolved), and sets ZDIST_MASTER_WAIT_S from
    --server_wait_s with --checkpoint (rpc_ps_flags.c). 0, 1 (--help
    printed: exit 0), or 2 (a bad flag, the message printed: exit 2). */
int rpc_ps_options_parse(int argc, char **argv, rpc_ps_options_t *o);

/*  Says so and joins the world the flags describe (rpc_ps_flags.c). 0,
    or -1 (the error printed). */
int rpc_ps_join(const rpc_ps_options_t *o);

/*  A server rank: serves its stage of the Net (and on rank 0 the
    trainers' book: their events, the shared final evaluation,
    --save_model, the report at the end) until every trainer is done,
    then leaves the world. 0, or -1 (the error printed). */
int rpc_ps_serve(const rpc_ps_options_t *o);

/*  A trainer's last call: waits until every trainer is done, then gives
    the accuracy of the final weights on --eval_samples test images, which
    rank 0 computes once for all. 0, or -1 (the RPC timeout passed, rank 0
    failed or is gone). */
int rpc_ps_shared_accuracy(const rpc_ps_options_t *o, double *acc);

#endif
