/* SPDX-License-Identifier: MIT */
/*  ps_core.h: synchronous and asynchronous parameter servers,
    the design of Ray's parameter-server example, on the parameter-server
    layer (<zdist/ps.h>).

    The parameter servers are push/pull shards of the layer
    (ps_server_new): the model's parameters split over them by size, each
    shard stepping its part with SGD, every gradient checked before it is
    taken. The driver is their trainer, with the model as its replica:
    Ray's ps.apply_gradients(*gradients) is the sum of the gradients
    pushed (one step on every shard) and a pull, ps.get_weights() a pull.

    The data workers are actors (actor.h), created by the driver with
    zd_rpc_remote() and called through their RRefs:

      "DataWorker"(model, index, seed, batch_size, data_dir, train_size, track
                   [, delay_ms])
          its own model and its own shuffled copy of the training set;
          delay_ms makes it a straggler, that long slower per gradient.
        "DataWorker.compute_gradients"(weights): loads the weights, takes
          the next batch (a new epoch, newly shuffled, when one ends), and
          returns the gradient.
      "PS.stats"(actor): [count, hash...] for tests (see ps_stats_t).

    Weights and gradients travel to and from the workers flat: the
    model's parameters in PyTorch's order, concatenated.

    World layout: rank 0 is the driver, ranks 1..S the servers, ranks
    S+1..S+W the workers: world_size = 1 + S + W. */
#ifndef ZDIST_EXAMPLES_PS_CORE_H
#define ZDIST_EXAMPLES_PS_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/model.h>
#include <zdist/ps.h>

#define PS_MAX_WORKERS 64
#define PS_MAX_SERVERS 64

typedef struct {
    bool async;            /* --mode=async */
    int num_workers;       /* 2 */
    int num_servers;       /* 1 */
    int64_t iterations;    /* 200: sync rounds; async does iterations x workers updates */
    double lr;             /* 0.01 */
    int64_t batch_size;    /* 128 */
    const char *data_dir;  /* NULL: zd_dataset_find_dir() */
    int64_t seed;          /* 0: initial weights, data orders */
    const char *model;     /* "convnet" */
    int64_t eval_interval; /* 10: print test accuracy every N iterations; 0: never */
    int64_t test_size;     /* 0: the whole test set; else its first N images */
    int64_t train_size;    /* 0: the whole training set; else its first N images */
    int64_t max_staleness; /* async: a worker runs at most this many updates
                                   ahead of the slowest (0: no bound) */
    int64_t straggler_ms;  /* worker 0 takes this much longer per gradient */
    double progress_s;     /* > 0: the driver prints a progress line every N s (progress.h) */
    bool quiet;            /* print nothing */
    bool track;            /* actors record gradient hashes (tests) */
} ps_options_t;

/*  Ray's example's defaults. */
ps_options_t ps_options_default(void);

/*  Checks the options and the world size against the layout above; 0, or
    -1 with an error that says which world size the flags need. */
int ps_options_check(const ps_options_t *o, int world_size);

/*  Gradients counted, and with track one FNV-1a hash per gradient: those
    a worker computed, or those the driver pushed (each gradient of a
    round, not their sum), in order. */
typedef struct {
    int64_t count;
    int64_t n_hashes;
    uint64_t *hashes; /* malloc'ed */
} ps_stats_t;

typedef struct {
    double final_accuracy;                /* in [0, 1] */
    int64_t updates;                      /* pushes: steps of every shard */
    double train_seconds;                 /* the training loop without evaluations */
    double iters_per_s;                   /* sync: rounds/s; async: updates/s */
    zd_tensor_t *weights;                 /* the final flat weights (caller unrefs) */
    int64_t server_steps[PS_MAX_SERVERS]; /* each shard's version at the last pull */
    ps_stats_t pushed;                    /* with o->track: the gradients pushed */
    ps_stats_t workers[PS_MAX_WORKERS];   /* with o->track */
    int64_t applied[PS_MAX_WORKERS];      /* updates applied from each worker */
    int64_t max_lead;                     /* async: most updates a worker ever was ahead */
} ps_result_t;

void ps_result_free(ps_result_t *r);

/*  Registers the actors' functions in this process: every rank, before
    zd_rpc_init. 0, or -1. */
int ps_register(void);

/*  The parameter server of rank `rank` when it is one (1..S), else NULL
    with *srv NULL: shard rank - 1 of the model's parameters (from
    o->seed), SGD at o->lr, asynchronous (the driver's sums are the
    rounds), its "step" fault point on each step (fault.h). Before
    zd_rpc_init; zd_ps_server_free after zd_rpc_shutdown. 0, or -1. */
int ps_server_new(const ps_options_t *o, int rank, zd_ps_server_t **srv);

/*  The driver: creates the workers on their ranks, trains through the
    servers, prints as Ray's example does ("Iter 10: accuracy is 61.3",
    "Final accuracy is 70.2."), frees the workers. res may be NULL. 0, or
    -1. */
int ps_run_driver(const ps_options_t *o, ps_result_t *res);

/*  ---- pieces, also used by tests to compute the same things locally ---- */

/*  FNV-1a over a tensor's bytes. */
uint64_t ps_hash(const zd_tensor_t *t);

/*  Appends h to st's hashes. 0, or -1 (out of memory). */
int ps_stats_add(ps_stats_t *st, uint64_t h);

/*  A data worker in this process (what the "DataWorker" actor holds). */
typedef struct ps_worker ps_worker_t;

ps_worker_t *ps_worker_new(const char *model, int index, uint64_t seed, int64_t batch_size,
                           const char *data_dir, int64_t train_size, bool track);
void ps_worker_free(ps_worker_t *w);

/*  compute_gradients: loads the flat weights, runs the next batch and
    returns in *grad a new flat tensor of the same size. 0, or -1. */
int ps_worker_compute(ps_worker_t *w, const zd_tensor_t *weights, zd_tensor_t **grad);

#endif
