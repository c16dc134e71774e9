/* SPDX-License-Identifier: MIT */
/*  ps_core.h: synchronous and asynchronous parameter servers,
    the design of Ray's parameter-server example, on the RPC API.

    Actors (actor.h), created with zd_rpc_remote() and called through their
    RRefs:

      "ParameterServer"(model, seed, lr, index, num_servers, track)
          holds slice `index` of num_servers of the model's parameters
          (initialised from seed) and an SGD optimizer over it.
        "ParameterServer.apply_gradients"(g_1, ..., g_k): sums the k
          gradients of its slice, steps SGD, returns the new slice.
        "ParameterServer.get_weights"(): the slice.
      "DataWorker"(model, index, seed, batch_size, data_dir, train_size, track
                   [, delay_ms])
          its own model and its own shuffled copy of the training set;
          delay_ms makes it a straggler, that long slower per gradient.
        "DataWorker.compute_gradients"(w_1, ..., w_S): loads the weights
          given as S slices, takes the next batch (a new epoch, newly
          shuffled, when one ends), and returns the gradients as a list of
          S slices of the same sizes.
      "PS.stats"(actor): [count, hash...] for tests (see ps_stats_t).

    Weights and gradients travel flat: the model's parameters in PyTorch's
    order, concatenated, cut into num_servers contiguous slices of nearly
    equal size (ps_slice_range), so any number of servers splits the work
    evenly. With one server it is one tensor of all the weights.

    World layout: rank 0 is the driver, ranks 1..S the servers, ranks
    S+1..S+W the workers: world_size = 1 + S + W. */
#ifndef ZDIST_EXAMPLES_PS_CORE_H
#define ZDIST_EXAMPLES_PS_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/model.h>

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

/*  Counters an actor keeps: gradients computed (worker) or applied
    (server), and with track, one FNV-1a hash per gradient slice: a worker
    lists for each computation its S slice hashes, a server the hash of
    every gradient it summed, in order. */
typedef struct {
    int64_t count;
    int64_t n_hashes;
    uint64_t *hashes; /* malloc'ed */
} ps_stats_t;

typedef struct {
    double final_accuracy;              /* in [0, 1] */
    int64_t updates;                    /* apply_gradients rounds (per server) */
    double train_seconds;               /* the training loop without evaluations */
    double iters_per_s;                 /* sync: rounds/s; async: updates/s */
    zd_tensor_t *weights;               /* the final flat weights (caller unrefs) */
    ps_stats_t servers[PS_MAX_SERVERS]; /* with o->track */
    ps_stats_t workers[PS_MAX_WORKERS];
    int64_t applied[PS_MAX_WORKERS]; /* updates applied from each worker */
    int64_t max_lead;                /* async: most updates a worker ever was ahead */
} ps_result_t;

void ps_result_free(ps_result_t *r);

/*  Registers the actors' functions in this process: every rank, before
    zd_rpc_init. 0, or -1. */
int ps_register(void);

/*  The driver: creates the servers and workers on their ranks, trains,
    prints as Ray's example does ("Iter 10: accuracy is 61.3", "Final
    accuracy is 70.2."), frees the actors. res may be NULL. 0, or -1. */
int ps_run_driver(const ps_options_t *o, ps_result_t *res);

/*  ---- pieces, also used by tests to compute the same things locally ---- */

/*  The flat range [lo, hi) of slice s of n over numel elements. */
void ps_slice_range(int64_t numel, int s, int n, int64_t *lo, int64_t *hi);

/*  A new flat float32 tensor with elements [lo, hi) of m's parameters. */
zd_tensor_t *ps_model_slice(zd_nn_module_t *m, int64_t lo, int64_t hi);

/*  Copies n flat slices, in order, into m's parameters; their sizes must
    add up to zd_nn_module_numel(m). 0, or -1. */
int ps_model_load(zd_nn_module_t *m, zd_tensor_t *const *slices, int n);

/*  FNV-1a over a tensor's bytes. */
uint64_t ps_hash(const zd_tensor_t *t);

/*  A data worker in this process (what the "DataWorker" actor holds). */
typedef struct ps_worker ps_worker_t;

ps_worker_t *ps_worker_new(const char *model, int index, uint64_t seed, int64_t batch_size,
                           const char *data_dir, int64_t train_size, bool track);
void ps_worker_free(ps_worker_t *w);

/*  compute_gradients: loads the n weight slices, runs the next batch and
    returns in grads[0..n) new flat tensors of the same sizes. 0, or -1. */
int ps_worker_compute(ps_worker_t *w, zd_tensor_t *const *weights, int n, zd_tensor_t **grads);

#endif
