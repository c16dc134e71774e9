/* SPDX-License-Identifier: MIT */
/*  bench_examples: throughput of the programs built on the public API, each
    in a world of real processes on this machine (loopback).

      ps_sync_iters_per_s_wN    ps_sync_async --mode=sync, 1 server, N workers:
                                rounds (N gradients + 1 update) per second
      ps_async_iters_per_s_wN   --mode=async: updates (1 gradient each) per second
      pipeline_samples_per_s_splitK   pipeline, batch 128 in K micro-batches
      ps64_start_s              rpc_ps, 1 server + 64 trainers started at once:
                                seconds from the start to every trainer's first
                                batch done (then the world is stopped)
      ps_pushpull_samples_per_s the ps layer (ps.h), the tutorial Net, 1 shard and
                                3 trainers, push/pull asynchronous: samples per
                                second of the three together (batch 32)
      ps_batch_update_samples_per_s   the same in synchronous rounds (PyTorch's
                                batch-update parameter server; each push takes
                                the round's model back: zd_ps_client_push_pull)
      ps_remote_samples_per_s   the remote model (ps.h), PyTorch's parameter-server
                                tutorial: the Net on 1 shard, 3 trainers running
                                its forward and backward through RPC (batch 32)
      ps_start_s_N              with --scale: the same for worlds of N = 64, 256
                                and 512 processes (1 server + N - 1 trainers)
      trainer_rss_mb            rpc_ps's default world (1 server + 3 trainers,
                                200 batches each): the largest trainer's peak
                                resident set
      server_rss_mb_per_trainer the server's peak resident set in worlds of 1 + 4
                                and 1 + 16 trainers (50 batches each, lr 0.003):
                                its growth per added trainer

        bench_examples [--csv] [--iterations N] [--batches N]
                       [--only ps|pushpull|remote|pipeline|start|memory]
                       [--rpc_ps PATH] [--scale]

    The PS figures time the training loop only (actors created, no test
    evaluation); the pipeline's skip each run's first batch. The rpc_ps
    figures run the rpc_ps program itself, one process per rank
    (bench_worlds.h). --csv prints `name,value,unit` lines. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include <zdist/ps.h>
#include "examples/pipeline_core.h"
#include "examples/ps_core.h"
#include "bench/bench_worlds.h"
#include "tests/support/world.h"

#define MAX_FIGURES       24
#define PUSHPULL_TRAINERS 3
#define PUSHPULL_BATCH    32

typedef struct {
    int n;
    char name[MAX_FIGURES][48];
    double value[MAX_FIGURES];
    char unit[MAX_FIGURES][16];
    double trainer_s[PUSHPULL_TRAINERS]; /* ps layer: each trainer's loop time */
} figures_t;

/*  Shared with the children: rank 0 of each world writes its figures here. */
static figures_t *figs;

typedef struct {
    bool async;
    int workers;
    int64_t iterations;
} ps_bench_t;

static void add(const char *name, double value, const char *unit)
{
    if (figs->n < MAX_FIGURES) {
        snprintf(figs->name[figs->n], sizeof figs->name[0], "%s", name);
        figs->value[figs->n] = value;
        snprintf(figs->unit[figs->n], sizeof figs->unit[0], "%s", unit);
        figs->n++;
    }
}

static ps_options_t ps_bench_options(const ps_bench_t *b)
{
    ps_options_t o = ps_options_default();
    o.async = b->async;
    o.num_workers = b->workers;
    o.iterations = b->iterations;
    o.eval_interval = 0;
    o.test_size = 100;
    o.quiet = true;
    return o;
}

static zd_ps_server_t *ps_server; /* rank 1's (ps_setup) */

/*  Every rank: the workers' actors, and rank 1's parameter server, made
    before joining as the layer has it (freed by ps_teardown). */
static int ps_setup(const world_t *w)
{
    ps_options_t o = ps_bench_options(w->arg);
    return ps_register() < 0 || ps_server_new(&o, w->rank, &ps_server) < 0 ? -1 : 0;
}

static int ps_teardown(const world_t *w)
{
    (void)w;
    zd_ps_server_free(ps_server);
    ps_server = NULL;
    return 0;
}

static int ps_fn(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    ps_options_t o = ps_bench_options(w->arg);
    ps_result_t res;
    if (ps_run_driver(&o, &res) < 0)
        return world_fail(w, "%s", zd_error_last());
    char name[48];
    snprintf(name, sizeof name, "ps_%s_iters_per_s_w%d", o.async ? "async" : "sync", o.num_workers);
    add(name, res.iters_per_s, "iters/s");
    ps_result_free(&res);
    return 0;
}

static int pipe_setup(const world_t *w)
{
    (void)w;
    return pipeline_register();
}

static int pipe_fn(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    pipeline_options_t o = pipeline_options_default();
    o.iterations = *(const int64_t *)w->arg;
    o.num_split = 4;
    o.test_size = 0;
    o.quiet = true;
    pipeline_result_t res;
    if (pipeline_run_driver(&o, &res) < 0)
        return world_fail(w, "%s", zd_error_last());
    for (int r = 0; r < res.runs; r++) {
        char name[48];
        snprintf(name, sizeof name, "pipeline_samples_per_s_split%lld",
                 (long long)res.num_split[r]);
        add(name, res.samples_per_s[r], "samples/s");
    }
    return 0;
}

/*  ---- the ps layer's trainers: the same batch, timed the same way ---- */

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/*  A batch of random images and labels, seeded by the trainer's rank
    (NULL tensors when out of memory; the caller checks). */
static void random_batch(int rank, zd_tensor_t **x, zd_tensor_t **y)
{
    *x = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){PUSHPULL_BATCH, 1, 28, 28}, 4);
    *y = zd_tensor_empty(ZD_INT64, (int64_t[]){PUSHPULL_BATCH}, 1);
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)rank);
    for (int64_t i = 0; *x && i < zd_tensor_numel(*x); i++)
        zd_tensor_data(*x)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    for (int64_t i = 0; *y && i < PUSHPULL_BATCH; i++)
        zd_tensor_data_i64(*y)[i] = (int64_t)zd_rng_below(&rng, 10);
}

/*  The trainers' samples together over the slowest trainer's time. */
static double trainers_samples_per_s(int64_t batches)
{
    double slowest = 0;
    for (int t = 0; t < PUSHPULL_TRAINERS; t++)
        slowest = figs->trainer_s[t] > slowest ? figs->trainer_s[t] : slowest;
    return slowest > 0 ? (double)(PUSHPULL_TRAINERS * PUSHPULL_BATCH * batches) / slowest : 0;
}

/*  The ps layer (ps.h): rank 0 serves the Net's parameters as one shard,
    ranks 1..3 train replicas on random batches (pushpull_step). Each
    trainer times its loop after a first pull. */
typedef struct {
    zd_ps_mode_t mode;
    int64_t batches;
} pushpull_bench_t;

static zd_ps_options_t pushpull_options(const pushpull_bench_t *b)
{
    zd_ps_options_t o = zd_ps_options_default();
    o.mode = b->mode;
    o.num_trainers = PUSHPULL_TRAINERS;
    return o;
}

static int pushpull_shard(const world_t *w, const pushpull_bench_t *b)
{
    zd_ps_options_t o = pushpull_options(b);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(0.01);
    zd_nn_module_t *net = zd_nn_net_new(1);
    zd_ps_server_t *srv = net ? zd_ps_server_new_module(net, 0, 1, &sgd, &o) : NULL;
    zd_nn_module_free(net);
    zd_rpc_options_t ro = world_rpc_options(w->port);
    if (!srv || zd_rpc_init("shard", 0, w->world_size, &ro) < 0) {
        zd_ps_server_free(srv);
        return world_fail(w, "shard: %s", zd_error_last());
    }
    int rc = zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT);
    zd_ps_server_free(srv);
    return rc < 0 ? world_fail(w, "shard: %s", zd_error_last()) : 0;
}

/*  One batch. Asynchronous: pull, compute, push. Synchronous (the
    batch-update tutorial): compute, then push and take the round's model
    in one exchange (zd_ps_client_push_pull, its update_and_fetch_model);
    the replica holds the model from the last round already. */
static int pushpull_step(zd_ps_client_t *ps, bool sync, zd_nn_module_t *net, zd_tensor_t *x,
                         zd_tensor_t *y)
{
    zd_tensor_t *lp = NULL, *loss = NULL;
    int rc = sync ? 0 : zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT);
    if (rc == 0)
        rc = zd_nn_module_forward(net, &x, 1, &lp, 1);
    if (rc == 0)
        rc = zd_nn_nll_loss(lp, y, &loss);
    if (rc == 0)
        rc = zd_autograd_backward(loss, NULL, false);
    if (rc == 0)
        rc = sync ? zd_ps_client_push_pull(ps, ZD_TIMEOUT_DEFAULT)
                  : zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT);
    zd_nn_module_zero_grad(net);
    zd_tensor_unref(loss);
    zd_tensor_unref(lp);
    return rc;
}

static int pushpull_trainer(const world_t *w, const pushpull_bench_t *b)
{
    zd_ps_options_t o = pushpull_options(b);
    zd_nn_module_t *net = zd_nn_net_new(1);
    int shard = 0;
    zd_ps_client_t *ps = net ? zd_ps_client_new_module(net, &shard, 1, &o) : NULL;
    zd_tensor_t *x, *y;
    random_batch(w->rank, &x, &y);
    zd_rpc_options_t ro = world_rpc_options(w->port);
    char name[16];
    snprintf(name, sizeof name, "trainer%d", w->rank);
    int rc = ps && x && y ? zd_rpc_init(name, w->rank, w->world_size, &ro) : -1;
    if (rc == 0) {
        rc = zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT); /* connections made, first copy */
        double t0 = now_s();
        for (int64_t i = 0; rc == 0 && i < b->batches; i++)
            rc = pushpull_step(ps, b->mode == ZD_PS_SYNC, net, x, y);
        figs->trainer_s[w->rank - 1] = now_s() - t0;
        if (rc < 0)
            world_fail(w, "trainer %d: %s", w->rank, zd_error_last());
        if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0 && rc == 0)
            rc = world_fail(w, "trainer %d: %s", w->rank, zd_error_last());
    } else {
        world_fail(w, "trainer %d: %s", w->rank, zd_error_last());
    }
    zd_ps_client_free(ps);
    zd_nn_module_free(net);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

static int pushpull_fn(const world_t *w)
{
    const pushpull_bench_t *b = w->arg;
    zd_nn_set_num_threads(1); /* four processes on this machine's cores */
    return w->rank == 0 ? pushpull_shard(w, b) : pushpull_trainer(w, b);
}

static int pushpull(int64_t batches)
{
    const zd_ps_mode_t modes[2] = {ZD_PS_ASYNC, ZD_PS_SYNC};
    const char *names[2] = {"ps_pushpull_samples_per_s", "ps_batch_update_samples_per_s"};
    for (int m = 0; m < 2; m++) {
        pushpull_bench_t b = {modes[m], batches};
        world_options_t o = {.world_size = 1 + PUSHPULL_TRAINERS,
                             .fn = pushpull_fn,
                             .arg = &b,
                             .timeout_s = 600,
                             .own_init = true};
        if (world_run(&o) < 0)
            return -1;
        add(names[m], trainers_samples_per_s(batches), "samples/s");
    }
    return 0;
}

/*  The remote model (ps.h, zd_ps_model_*): rank 0 serves the Net as one
    stage, ranks 1..3 train it through RPC as PyTorch's parameter-server
    tutorial does (forward on the shard, loss here, distributed backward,
    a DistributedOptimizer step), on the same random batches. Each trainer
    times its loop after a first forward. */
static int remote_shard(const world_t *w)
{
    zd_nn_module_t *net = zd_nn_net_new(1);
    zd_ps_model_server_t *srv = net ? zd_ps_model_server_new(net, 0, 1, NULL) : NULL;
    zd_rpc_options_t ro = world_rpc_options(w->port);
    int rc = srv && zd_rpc_init("shard", 0, w->world_size, &ro) == 0 ? 0 : -1;
    if (rc < 0)
        world_fail(w, "shard: %s", zd_error_last());
    else if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "shard: %s", zd_error_last());
    zd_ps_model_server_free(srv);
    zd_nn_module_free(net);
    return rc;
}

static int remote_step(zd_ps_model_t *model, zd_tensor_t *x, zd_tensor_t *y)
{
    int rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        zd_tensor_t *lp = NULL, *loss = NULL;
        if (zd_ps_model_forward(model, &x, 1, &lp, 1, ZD_TIMEOUT_DEFAULT) == 0 &&
            zd_nn_nll_loss(lp, y, &loss) == 0 &&
            zd_dist_autograd_backward(ctx, &loss, 1, false) == 0)
            rc = zd_ps_model_step(model, ctx);
        zd_tensor_unref(loss);
        zd_tensor_unref(lp);
    }
    return rc;
}

static int remote_trainer(const world_t *w, int64_t batches)
{
    zd_optim_config_t sgd = zd_optim_sgd_defaults(0.01);
    zd_ps_model_t *model = zd_ps_model_new((const int[]){0}, 1, &sgd, NULL);
    zd_tensor_t *x, *y;
    random_batch(w->rank, &x, &y);
    zd_rpc_options_t ro = world_rpc_options(w->port);
    char name[16];
    snprintf(name, sizeof name, "trainer%d", w->rank);
    int rc = model && x && y ? zd_rpc_init(name, w->rank, w->world_size, &ro) : -1;
    if (rc == 0) {
        rc = remote_step(model, x, y); /* connections made, the optimizer made */
        double t0 = now_s();
        for (int64_t i = 0; rc == 0 && i < batches; i++)
            rc = remote_step(model, x, y);
        figs->trainer_s[w->rank - 1] = now_s() - t0;
        if (rc < 0)
            world_fail(w, "trainer %d: %s", w->rank, zd_error_last());
        zd_ps_model_free(model);
        model = NULL;
        if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0 && rc == 0)
            rc = world_fail(w, "trainer %d: %s", w->rank, zd_error_last());
    } else {
        world_fail(w, "trainer %d: %s", w->rank, zd_error_last());
    }
    zd_ps_model_free(model);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

static int remote_fn(const world_t *w)
{
    zd_nn_set_num_threads(1); /* four processes on this machine's cores */
    return w->rank == 0 ? remote_shard(w) : remote_trainer(w, *(const int64_t *)w->arg);
}

static int remote_model(int64_t batches)
{
    world_options_t o = {.world_size = 1 + PUSHPULL_TRAINERS,
                         .fn = remote_fn,
                         .arg = &batches,
                         .timeout_s = 600,
                         .own_init = true};
    if (world_run(&o) < 0)
        return -1;
    add("ps_remote_samples_per_s", trainers_samples_per_s(batches), "samples/s");
    return 0;
}

#ifndef BENCH_RPC_PS
#define BENCH_RPC_PS "rpc_ps"
#endif

/*  The rpc_ps figures: start time of a world of 65, memory of a trainer and
    of the server. */
static int world_start(const char *rpc_ps)
{
    bench_world_t w;
    /* 64 trainers' stale updates need a smaller step than 3 trainers' */
    bench_world_options_t o = {
        .world_size = 65, .max_batches = 10, .lr = 0.003, .start_only = true, .timeout_s = 600};
    if (bench_rpc_ps_world(rpc_ps, &o, &w) < 0)
        return -1;
    add("ps64_start_s", w.first_batch_s, "s");
    if (getenv("BENCH_VERBOSE")) {
        double trainers = 0;
        for (int r = 1; r < o.world_size; r++)
            trainers += w.cpu_s[r];
        fprintf(stderr, "ps64: server %.1f s CPU, trainers %.2f s CPU each on average\n",
                w.cpu_s[0], trainers / (o.world_size - 1));
    }
    return 0;
}

/*  ps_start_s_N: the start of worlds of hundreds of processes (issue 28's
    figure). The step is smaller than ps64's: the first batches of 511
    trainers land on one model before any of them pulls it again. */
static int world_start_scale(const char *rpc_ps)
{
    static const int sizes[] = {64, 256, 512};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        bench_world_t w;
        bench_world_options_t o = {.world_size = sizes[i],
                                   .max_batches = 10,
                                   .lr = 0.0005,
                                   .start_only = true,
                                   .timeout_s = 900};
        if (bench_rpc_ps_world(rpc_ps, &o, &w) < 0)
            return -1;
        char name[32];
        snprintf(name, sizeof name, "ps_start_s_N%d", sizes[i]);
        add(name, w.first_batch_s, "s");
    }
    return 0;
}

static int world_memory(const char *rpc_ps)
{
    bench_world_t w;
    bench_world_options_t o = {.world_size = 4, .max_batches = 200, .timeout_s = 600};
    if (bench_rpc_ps_world(rpc_ps, &o, &w) < 0)
        return -1;
    int64_t trainer = 0;
    for (int r = 1; r < 4; r++)
        trainer = w.peak_rss_kb[r] > trainer ? w.peak_rss_kb[r] : trainer;
    add("trainer_rss_mb", (double)trainer / 1024.0, "MB");
    int64_t server[2];
    const int trainers[2] = {4, 16};
    for (int i = 0; i < 2; i++) {
        /* the step of ps64_start_s: 16 trainers diverge at the default */
        o = (bench_world_options_t){
            .world_size = 1 + trainers[i], .max_batches = 50, .lr = 0.003, .timeout_s = 600};
        if (bench_rpc_ps_world(rpc_ps, &o, &w) < 0)
            return -1;
        server[i] = w.peak_rss_kb[0];
        if (getenv("BENCH_VERBOSE"))
            fprintf(stderr, "server of 1 + %d trainers: peak RSS %.1f MB\n", trainers[i],
                    (double)server[i] / 1024.0);
    }
    add("server_rss_mb_per_trainer",
        (double)(server[1] - server[0]) / 1024.0 / (trainers[1] - trainers[0]), "MB");
    return 0;
}

static int run(int size, world_setup_fn *setup, world_fn *fn, void *arg, bool dist)
{
    world_options_t o = {.world_size = size,
                         .setup = setup,
                         .fn = fn,
                         .arg = arg,
                         .timeout_s = 600,
                         .dist_autograd = dist};
    return world_run(&o);
}

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    bool csv = false, scale = false;
    int64_t iterations = 200, batches = 10;
    const char *only = NULL, *rpc_ps = BENCH_RPC_PS;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0)
            csv = true;
        else if (strcmp(argv[i], "--iterations") == 0 && i + 1 < argc)
            iterations = atoll(argv[++i]);
        else if (strcmp(argv[i], "--batches") == 0 && i + 1 < argc)
            batches = atoll(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--rpc_ps") == 0 && i + 1 < argc)
            rpc_ps = argv[++i];
        else if (strcmp(argv[i], "--scale") == 0)
            scale = true;
        else {
            fprintf(stderr,
                    "usage: %s [--csv] [--iterations N] [--batches N] "
                    "[--only ps|pushpull|remote|pipeline|start|memory] [--rpc_ps PATH] [--scale]\n",
                    argv[0]);
            return 2;
        }
    }
    if (iterations < 1 || batches < 2) {
        fprintf(stderr, "bench_examples: --iterations must be >= 1 and --batches >= 2\n");
        return 2;
    }
    figs = mmap(NULL, sizeof *figs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (figs == MAP_FAILED) {
        perror("bench_examples: mmap");
        return 1;
    }
    memset(figs, 0, sizeof *figs);
    int rc = 0;
    if (!only || strcmp(only, "ps") == 0) {
        for (int a = 0; a < 2 && rc == 0; a++) {
            for (int w = 1; w <= 3 && rc == 0; w++) {
                /* async does iterations x workers updates: the same work per worker */
                ps_bench_t b = {a == 1, w, a == 1 ? iterations / w + 1 : iterations};
                world_options_t o = {.world_size = 2 + w,
                                     .setup = ps_setup,
                                     .fn = ps_fn,
                                     .teardown = ps_teardown,
                                     .arg = &b,
                                     .timeout_s = 600};
                rc = world_run(&o) < 0 ? -1 : 0;
            }
        }
    }
    if (rc == 0 && (!only || strcmp(only, "pushpull") == 0))
        rc = pushpull(iterations);
    if (rc == 0 && (!only || strcmp(only, "remote") == 0))
        rc = remote_model(iterations);
    if (rc == 0 && (!only || strcmp(only, "pipeline") == 0))
        rc = run(PIPELINE_WORLD_SIZE, pipe_setup, pipe_fn, &batches, true);
    if (rc == 0 && (!only || strcmp(only, "start") == 0))
        rc = world_start(rpc_ps);
    if (rc == 0 && scale && (!only || strcmp(only, "start") == 0))
        rc = world_start_scale(rpc_ps);
    if (rc == 0 && (!only || strcmp(only, "memory") == 0))
        rc = world_memory(rpc_ps);
    if (rc < 0) {
        fprintf(stderr, "bench_examples: a world failed\n");
        return 1;
    }
    if (!csv)
        printf("%-36s %12s  %s\n", "figure", "value", "unit");
    for (int i = 0; i < figs->n; i++) {
        if (csv)
            printf("%s,%.1f,%s\n", figs->name[i], figs->value[i], figs->unit[i]);
        else
            printf("%-36s %12.1f  %s\n", figs->name[i], figs->value[i], figs->unit[i]);
    }
    return 0;
}
