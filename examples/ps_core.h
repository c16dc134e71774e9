/* SPDX-License-Identifier: MIT */
/*  ps_core.h: Ray's parameter-server example (synchronous and
    asynchronous) on the parameter-server layer (<zdist/ps.h>).

    Rank 0 is the driver, ranks 1..S the parameter servers, ranks
    S+1..S+W the data workers: world_size = 1 + S + W.

    The parameter servers are push/pull shards of the layer
    (ps_server_new): the model split over them by size, each stepping
    its part with SGD. The driver is their one trainer, holding the model
    as its replica: Ray's ps.apply_gradients(*gradients) is a push of the
    gradients' sum (one step of every shard) answered with the new
    parameters, ps.get_weights() a pull.

    The data workers are actors (actor.h) the driver creates with
    zd_rpc_remote() and calls through their RRefs:
      "DataWorker"(model, index, seed, batch_size, data_dir or none,
                   train_size [, delay_ms]): its own model and its own
          shuffled copy of the training set (delay_ms: a straggler);
      "DataWorker.compute_gradients"(weights) -> gradient: loads the
          weights, takes its next batch, returns the gradient.
    Weights and gradients travel flat: the parameters in PyTorch's order,
    concatenated. */
#ifndef ZDIST_EXAMPLES_PS_CORE_H
#define ZDIST_EXAMPLES_PS_CORE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/model.h>
#include <zdist/ps.h>
#include <zdist/tensor.h>

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
    int64_t eval_interval; /* 10: print the test accuracy every N iterations; 0: never */
    int64_t test_size;     /* 0: the whole test set; else its first N images */
    int64_t train_size;    /* 0: the whole training set; else its first N images */
    int64_t max_staleness; /* async: a worker runs at most this many updates ahead of the
                              slowest (0: no bound) */
    int64_t straggler_ms;  /* worker 0 takes this much longer per gradient */
    double progress_s;     /* > 0: a progress line every N s (progress.h) */
    bool quiet;            /* print nothing */
} ps_options_t;

typedef struct {
    double final_accuracy;                /* in [0, 1] */
    int64_t updates;                      /* pushes: steps of every shard */
    double iters_per_s;                   /* sync: rounds/s; async: updates/s (no evaluations) */
    zd_tensor_t *weights;                 /* the final flat weights (ps_result_free) */
    int64_t server_steps[PS_MAX_SERVERS]; /* each shard's version at the last pull */
    int64_t applied[PS_MAX_WORKERS];      /* gradients applied from each worker */
    int64_t max_lead;                     /* async: most updates a worker was ahead */
} ps_result_t;

/*  Ray's example's defaults. */
ps_options_t ps_options_default(void);

/*  Checks the options, and the world size against the layout above; 0,
    or -1 with an error that says which world size the flags need. */
int ps_options_check(const ps_options_t *o, int world_size);

/*  Registers the DataWorker's functions: every rank, before zd_rpc_init. 0, or -1. */
int ps_register(void);

/*  Rank `rank`'s parameter server when it is one (1..S), else *srv NULL:
    shard rank - 1 of the model (from o->seed), SGD at o->lr, its "step"
    fault point on each step (fault.h). Before zd_rpc_init;
    zd_ps_server_free after zd_rpc_shutdown. 0, or -1. */
int ps_server_new(const ps_options_t *o, int rank, zd_ps_server_t **srv);

/*  The driver: creates the workers, trains through the servers, prints
    as Ray's example does ("Iter 10: accuracy is 61.3", "Final accuracy
    is 70.2."). res may be NULL. 0, or -1. */
int ps_run_driver(const ps_options_t *o, ps_result_t *res);

void ps_result_free(ps_result_t *r);

/*  A data worker in this process (what a "DataWorker" actor holds), for
    tests computing the same gradients locally. NULL with an error. */
typedef struct ps_worker ps_worker_t;
ps_worker_t *ps_worker_new(const char *model, int index, uint64_t seed, int64_t batch_size,
                           const char *data_dir, int64_t train_size);
void ps_worker_free(ps_worker_t *w);

/*  compute_gradients: loads the flat weights, runs the next batch; *grad
    a new flat tensor of the weights' size. 0, or -1. */
int ps_worker_compute(ps_worker_t *w, const zd_tensor_t *weights, zd_tensor_t **grad);

#endif
