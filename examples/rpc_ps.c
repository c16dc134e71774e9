/* SPDX-License-Identifier: MIT */
/*  rpc_ps: the PyTorch tutorial "Implementing a Parameter Server Using
    Distributed RPC Framework", on this framework.

        ./rpc_ps --world_size=4 --rank=0                       the server
        ./rpc_ps --world_size=4 --rank=N --master_addr=HOST    trainer N

    With --num_servers=S, ranks 0..S-1 are parameter-server shards (see
    ps_net.h) and the others trainers. Read it beside the tutorial:
      ParameterServer          ps_net_serve (ps_net.h), on ranks below S
      TrainerNet               ps_net_client_attach: an RRef to the
                               server, RRefs to its parameters, and a
                               DistributedOptimizer (SGD) over them
      run_training_loop        run_training_loop, its body train_batch: a
                               distributed autograd context, the forward
                               on the server, nll loss, the distributed
                               backward, the check that the server holds
                               gradients for the context, a step
      get_accuracy             get_accuracy (dropout off)
      run_worker               main: the servers leave only after every
                               trainer has finished (graceful shutdown)
    Around it, what an operator's run needs: checkpoints and --resume, a
    lost server shard waited for (ps_net_client_recover: the loop goes on
    from the last checkpoint), --max_staleness, a diverging loss stopped,
    progress lines every --progress_s seconds (the tutorial's per-batch
    loss lines with --log_interval=5), curves, and --save_model /
    --init_from: the trained Net for PyTorch's load_state_dict, under
    PyTorch's names. */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dataset.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>

#include "examples/curves.h"
#include "examples/flags.h"
#include "examples/progress.h"
#include "examples/ps_net.h"
#include "examples/ps_net_client.h"
#include "examples/train_common.h"

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
    int64_t max_batch_size; /* servers: the largest batch ps_forward takes (0: default) */
    int64_t max_inflight;   /* servers: training forwards held at once (0: 2 per core) */
    int64_t server_wait_s;  /* trainers: how long a lost server shard may take to come back */
} options_t;

#define EVAL_BATCH 500

/*  A loss this large, or this many times the first one, means the model is
    diverging even while it is still finite. */
#define LOSS_EXPLODED 1e4
#define LOSS_GROWTH   100

/*  A trainer: its end of the server (the tutorial's TrainerNet), its data,
    where it is, and what it reports. */
typedef struct {
    const options_t *o;
    int rank;
    ps_net_client_t *ps;
    zd_dataset_t *train, *test;
    int64_t per_epoch, total; /* batches in an epoch; to train in all */
    int64_t done, trained;    /* position (batches done); batches trained by this process */
    float first_loss;
    double t0, t1, eval_secs;
    progress_t prog;
    curves_t *curves;
    curves_points_t points;
} trainer_t;

/*  The tutorial's check: the server holds gradients for this context. The
    tutorial fetches them (ps_get_dist_gradients, 4.8 MB); their names and
    sizes tell as much, and leave the server no buffer of that size per
    trainer to send them through. */
static int check_gradients(zd_rref_t *ps, int64_t cid)
{
    zd_value_t *grads = NULL, *a = ZD_ARGS(cid);
    int rc = a ? zd_rref_rpc_sync(ps, "ps_dist_gradient_sizes", a, ZD_TIMEOUT_DEFAULT, &grads) : -1;
    zd_value_unref(a);
    if (rc == 0 && zd_list_len(grads) == 0)
        rc = zd_error_set("the server has no gradients for context %lld", (long long)cid);
    for (size_t i = 0; rc == 0 && i < zd_list_len(grads); i++) {
        int64_t numel;
        if (zd_rpc_arg_int(zd_list_get(grads, i), 1, &numel) < 0 || numel < 1)
            rc = zd_error_set("the server's gradient %zu for context %lld is empty", i,
                              (long long)cid);
    }
    zd_value_unref(grads);
    return rc;
}

/*  One batch: the tutorial's loop body. A loss that is not finite is
    refused before the backward: a model that diverged must not spread nan
    to every trainer through the shared weights. */
static int train_batch(ps_net_client_t *c, zd_tensor_t *x, zd_tensor_t *y, bool check,
                       float *loss_out)
{
    zd_tensor_t *out = NULL, *loss = NULL;
    int64_t cid;
    if (zd_dist_autograd_context_begin(&cid) < 0)
        return -1;
    int rc = ps_net_client_forward(c, x, true, &out);
    if (rc == 0)
        rc = zd_nn_nll_loss(out, y, &loss);
    if (rc == 0 && !isfinite(zd_tensor_data(loss)[0])) {
        *loss_out = zd_tensor_data(loss)[0];
        rc = zd_error_set_code(ZD_ERR_ARGUMENT, "the loss is %g", (double)*loss_out);
    }
    if (rc == 0)
        rc = ps_net_client_backward(c, cid, loss);
    if (rc == 0 && check)
        rc = check_gradients(ps_net_client_server(c), cid);
    if (rc == 0)
        rc = ps_net_client_step(c, cid);
    if (rc == 0)
        *loss_out = zd_tensor_data(loss)[0];
    zd_tensor_unref(loss);
    zd_tensor_unref(out);
    /* The peers free the context while the next batch starts. */
    if (zd_dist_autograd_context_release(cid) < 0 && rc == 0)
        rc = -1;
    return rc;
}

/*  The tutorial's get_accuracy: the first `limit` test images (0: all)
    through the server's model, dropout off. */
static int get_accuracy(ps_net_client_t *ps, const zd_dataset_t *test, int64_t limit, double *acc)
{
    int64_t n = zd_dataset_len(test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    for (int64_t start = 0; start < n; start += EVAL_BATCH) {
        zd_tensor_t *x, *y, *out;
        int64_t bs = n - start < EVAL_BATCH ? n - start : EVAL_BATCH;
        if (zd_dataset_batch(test, NULL, start, bs, &x, &y) < 0)
            return -1;
        int rc = ps_net_client_forward(ps, x, false, &out);
        int64_t c = rc == 0 ? zd_nn_accuracy(out, y) : -1;
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
        if (c < 0)
            return -1;
        correct += c;
    }
    *acc = n ? (double)correct / (double)n : 0;
    return 0;
}

/*  A call to the servers failed: 1 when the servers are back and the
    trainer goes on from its last checkpoint (t->done moved there), else
    -1 with the error set. */
static int recover(trainer_t *t)
{
    int64_t start;
    progress_clear(&t->prog);
    int back = ps_net_client_recover(t->ps, t->done, &start);
    if (back == 1)
        t->done = start;
    return back;
}

/*  What follows a trained batch: the divergence check, progress and the
    tutorial's loss line, curves, and --eval_every's evaluation. 0, or -1. */
static int after_batch(trainer_t *t, int64_t epoch, int64_t b, float loss)
{
    const options_t *o = t->o;
    if (++t->trained == 1)
        t->first_loss = loss;
    if (loss > LOSS_EXPLODED || (t->first_loss > 0 && loss > LOSS_GROWTH * t->first_loss)) {
        progress_clear(&t->prog);
        return zd_error_set("batch %lld (epoch %lld): the loss is %g (the first batch's was %g): "
                            "the model is diverging. Remedies: a lower --lr (now %g), or "
                            "--max_staleness=K (fewer stale updates from the other trainers)",
                            (long long)t->done, (long long)epoch + 1, (double)loss,
                            (double)t->first_loss, o->lr);
    }
    double now = train_now();
    progress_step(&t->prog, now, loss);
    if (o->log_interval > 0 && b % o->log_interval == 0) {
        /* the tutorial's line (its batch restarts each epoch) */
        progress_clear(&t->prog);
        printf("Rank %d training batch %lld loss %.6f (epoch %lld)\n", t->rank, (long long)b, loss,
               (long long)epoch + 1);
    }
    if (curves_batch(t->curves, &t->points, t->done, loss, o->batch_size, now) < 0)
        return -1;
    /* (the last batch's evaluation is the final one) */
    if (o->eval_every == 0 || t->done % o->eval_every != 0 || t->done >= t->total)
        return 0;
    /* this trainer's own look at the weights as they are now, while the
       other trainers go on */
    double acc;
    if (get_accuracy(t->ps, t->test, o->eval_samples, &acc) < 0)
        return -1;
    progress_clear(&t->prog);
    printf("Rank %d after batch %lld (epoch %lld): accuracy %.2f %%\n", t->rank, (long long)t->done,
           (long long)epoch + 1, 100 * acc);
    if (t->curves && curves_add_accuracy(t->curves, t->done, acc) < 0)
        return -1;
    double after = train_now();
    t->eval_secs += after - now;
    curves_points_skip(&t->points, after - now); /* the training's rate */
    progress_skip(&t->prog, after - now);
    return 0;
}

/*  The tutorial's run_training_loop, from batch t->done: 0 when this
    trainer's batches are done, 1 when a server shard was lost and is back
    (t->done moved to the last checkpoint: call again), -1 on failure. */
static int run_training_loop(trainer_t *t)
{
    const options_t *o = t->o;
    int64_t first_epoch, first_batch;
    train_resume_position(t->done, t->per_epoch, &first_epoch, &first_batch);
    for (int64_t epoch = first_epoch; epoch < o->epochs; epoch++) {
        /* The first trainer shuffles as train_local does with the same seed. */
        int64_t *order = zd_dataset_order(
            t->train, (uint64_t)(o->seed + epoch + 1000 * (t->rank - o->num_servers)));
        if (!order)
            return zd_error_set("out of memory");
        for (int64_t b = epoch == first_epoch ? first_batch : 0;
             b < t->per_epoch && t->done < t->total; b++) {
            zd_tensor_t *x, *y;
            float loss = 0;
            int rc = 0;
            if (o->max_staleness > 0 &&
                ps_net_client_staleness_gate(t->ps, t->done, o->max_staleness) < 0)
                rc = recover(t);
            else if (zd_dataset_batch(t->train, order, b * o->batch_size, o->batch_size, &x, &y) <
                     0)
                rc = -1;
            else {
                bool check = o->check_interval > 0 && t->done % o->check_interval == 0;
                rc = train_batch(t->ps, x, y, check, &loss);
                zd_tensor_unref(x);
                zd_tensor_unref(y);
                if (rc < 0 && !isfinite(loss)) {
                    progress_clear(&t->prog);
                    rc = zd_error_set("batch %lld (epoch %lld): the loss is %g: the model "
                                      "diverged, and this batch's gradients were not applied. "
                                      "Remedies: a lower --lr (now %g), or fewer trainers per "
                                      "server (their updates arrive stale)",
                                      (long long)t->done + 1, (long long)epoch + 1, (double)loss,
                                      o->lr);
                } else if (rc < 0) {
                    rc = recover(t);
                }
            }
            if (rc == 0) {
                t->done++;
                rc = after_batch(t, epoch, b, loss);
            }
            if (rc == 0 && o->checkpoint && t->done % o->checkpoint_every == 0 &&
                ps_net_client_checkpoint(t->ps, t->done) < 0)
                rc = recover(t);
            if (rc != 0) {
                free(order);
                return rc;
            }
        }
        free(order);
    }
    return 0;
}

/*  Loads the data, attaches to the servers and finds where to start:
    with --resume, or when this trainer rejoined the world, from its last
    checkpointed position. 0, or -1. */
static int trainer_start(trainer_t *t)
{
    const options_t *o = t->o;
    char dir[1024];
    if (o->data_dir)
        snprintf(dir, sizeof dir, "%s", o->data_dir);
    else if (zd_dataset_find_dir(dir, sizeof dir) < 0)
        return -1;
    if (!(t->train = zd_dataset_load(dir, ZD_DATASET_TRAIN)) ||
        !(t->test = zd_dataset_load(dir, ZD_DATASET_TEST)))
        return -1;
    t->per_epoch = zd_dataset_num_batches(t->train, o->batch_size);
    t->total = o->epochs * t->per_epoch;
    if (o->max_batches > 0 && o->max_batches < t->total)
        t->total = o->max_batches;
    ps_net_client_config_t cfg = {.trainer = (int)(t->rank - o->num_servers),
                                  .num_servers = (int)o->num_servers,
                                  .lr = o->lr,
                                  .checkpoint = o->checkpoint,
                                  .server_wait_s = o->server_wait_s,
                                  .positions = o->epochs * t->per_epoch,
                                  .epochs = o->epochs};
    if (!(t->ps = ps_net_client_new(&cfg)) || ps_net_client_attach(t->ps) < 0)
        return -1;
    if (o->curves) {
        char prefix[4096], title[64];
        if (snprintf(prefix, sizeof prefix, "%s.rank%d", o->curves, t->rank) >= (int)sizeof prefix)
            return zd_error_set("--curves: prefix too long");
        snprintf(title, sizeof title, "rpc_ps rank %d", t->rank);
        if (!(t->curves = curves_open(prefix, title, t->per_epoch)))
            return -1;
    }
    bool rejoined = zd_rpc_rejoined();
    if (rejoined && !o->checkpoint)
        printf("Rank %d rejoined the world; without --checkpoint it starts from its first "
               "batch\n",
               t->rank);
    if (o->checkpoint && (o->resume || rejoined)) {
        /* the same batches in the same order follow (the order depends on
           seed and epoch) */
        if (ps_net_client_resume_point(t->ps, &t->done) < 0)
            return -1;
        printf("Rank %d %s at batch %lld (%lld batches done)\n", t->rank,
               rejoined ? "rejoined the world; resuming" : "resuming", (long long)t->done,
               (long long)t->done);
    }
    t->t0 = train_now();
    char label[32];
    snprintf(label, sizeof label, "Rank %d", t->rank);
    progress_init(&t->prog, stdout, isatty(STDOUT_FILENO),
                  &(progress_config_t){.label = label,
                                       .first = t->done,
                                       .total = t->total,
                                       .per_epoch = t->per_epoch,
                                       .epochs = o->epochs,
                                       .samples_per_step = o->batch_size,
                                       .every_s = o->progress_s},
                  t->t0);
    /* a curve point every --log_interval batches, or 10 without loss lines */
    curves_points_init(&t->points, o->log_interval > 0 ? o->log_interval : 10, t->t0);
    return 0;
}

/*  After the last batch: tells shard 0, and prints the test accuracy of
    the final weights. Trainers share one evaluation on the server (it
    answers when the last trainer is done); one that waits longer than the
    RPC timeout evaluates by itself. 0, 1 (a shard came back: train from
    t->done again), or -1. */
static int trainer_finish(trainer_t *t)
{
    const options_t *o = t->o;
    t->t1 = train_now();
    progress_end(&t->prog, t->t1);
    if (zd_dist_autograd_wait_releases(-1) < 0)
        return -1;
    if (ps_net_client_finished(t->ps) < 0)
        return recover(t);
    printf("Training complete!\nGetting accuracy....\n");
    double acc;
    if (ps_net_client_shared_accuracy(t->ps, o->eval_samples, &acc) < 0) {
        fprintf(stderr, "rpc_ps trainer %d: shared evaluation failed (%s); evaluating alone\n",
                t->rank, zd_error_last());
        if (get_accuracy(t->ps, t->test, o->eval_samples, &acc) < 0)
            return -1;
    }
    printf("Rank %d test accuracy %.2f %%\n", t->rank, 100 * acc);
    printf("Rank %d throughput %.0f samples/s\n", t->rank,
           (double)(t->trained * o->batch_size) / (t->t1 - t->t0 - t->eval_secs));
    if (!t->curves)
        return 0;
    if (curves_add_accuracy(t->curves, t->done, acc) < 0)
        return -1;
    printf("Rank %d curves in %s.rank%d.csv and %s\n", t->rank, o->curves, t->rank,
           curves_png_path(t->curves));
    return 0;
}

static int run_trainer(const options_t *o)
{
    trainer_t t = {.o = o, .rank = (int)o->world.rank};
    int rc = trainer_start(&t);
    while (rc == 0) {
        rc = run_training_loop(&t);
        if (rc == 0)
            rc = trainer_finish(&t);
        if (rc == 0)
            break;
        if (rc == 1) /* the servers are back: on from the last checkpoint */
            rc = 0;
    }
    if (rc < 0) {
        fprintf(stderr, "rpc_ps trainer %d: %s\n", t.rank, zd_error_last());
        ps_net_client_report_failure(t.ps, t.done);
        if (t.curves) /* the plot of what there is */
            curves_draw(t.curves);
    }
    curves_close(t.curves);
    ps_net_client_free(t.ps);
    zd_dataset_free(t.train);
    zd_dataset_free(t.test);
    return rc;
}

/*  A server runs a handler thread per trainer in flight, and glibc gives
    threads arenas of their own (up to 8 per core), each keeping the blocks
    its threads freed: with 16 trainers that cost the server 160 MB (peak
    572 MB, 412 MB with two arenas, measured on 2 cores). One arena per
    core serves threads that run no more than that many at once. Left alone
    when the user tuned malloc. */
static void server_arenas(void)
{
    if (getenv("MALLOC_ARENA_MAX") || getenv("GLIBC_TUNABLES"))
        return;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    mallopt(M_ARENA_MAX, cores < 1 ? 1 : (int)cores);
}

static int check_options(const options_t *o)
{
    if (o->num_gpus != 0) {
        fprintf(stderr, "rpc_ps: --num_gpus=%lld: this build is CPU-only; use --num_gpus=0\n",
                (long long)o->num_gpus);
        return -1;
    }
    int64_t world_size = o->world.world_size;
    if (world_size < 2 || o->num_servers < 1 || o->num_servers >= world_size) {
        fprintf(stderr,
                "rpc_ps: --world_size=%lld with --num_servers=%lld leaves no trainer "
                "(need world_size > num_servers >= 1)\n",
                (long long)world_size, (long long)o->num_servers);
        return -1;
    }
    if (o->num_servers > PS_NET_MAX_SERVERS) {
        fprintf(stderr, "rpc_ps: --num_servers=%lld: at most %d shards\n",
                (long long)o->num_servers, PS_NET_MAX_SERVERS);
        return -1;
    }
    if (o->max_batch_size < 0 || (o->max_batch_size > 0 && o->max_batch_size < EVAL_BATCH)) {
        fprintf(stderr,
                "rpc_ps: --max_batch_size=%lld: 0 (the default) or at least %d (the "
                "evaluation's batches)\n",
                (long long)o->max_batch_size, EVAL_BATCH);
        return -1;
    }
    if (o->max_inflight < -1 || o->max_inflight > 1000000) {
        fprintf(stderr,
                "rpc_ps: --max_inflight=%lld: -1 (no limit), 0 (2 per core) or a "
                "number of batches\n",
                (long long)o->max_inflight);
        return -1;
    }
    if (o->resume && !o->checkpoint) {
        fprintf(stderr, "rpc_ps: --resume needs --checkpoint=PREFIX (the files to resume from)\n");
        return -1;
    }
    if (o->checkpoint && world_size - o->num_servers > PS_NET_MAX_TRAINERS) {
        fprintf(stderr, "rpc_ps: --checkpoint handles up to %d trainers, this world has %lld\n",
                PS_NET_MAX_TRAINERS, (long long)(world_size - o->num_servers));
        return -1;
    }
    if (o->progress_s < 0 || o->eval_every < 0 || o->log_interval < 0) {
        fprintf(stderr, "rpc_ps: --progress_s, --eval_every and --log_interval must be >= 0\n");
        return -1;
    }
    if (o->checkpoint_every < 1 || o->server_wait_s < 1 || o->server_wait_s > 86400) {
        fprintf(stderr,
                "rpc_ps: --checkpoint_every must be >= 1, --server_wait_s in [1, "
                "86400]\n");
        return -1;
    }
    if (o->min_trainers < 0 || o->min_trainers > world_size - o->num_servers ||
        o->max_staleness < 0) {
        fprintf(stderr,
                "rpc_ps: --min_trainers must be in [0, %lld] (the trainers), "
                "--max_staleness >= 0\n",
                (long long)(world_size - o->num_servers));
        return -1;
    }
    if (o->batch_size < 1 || o->epochs < 1 || o->lr <= 0) {
        fprintf(stderr, "rpc_ps: --batch_size and --epochs must be >= 1, --lr > 0\n");
        return -1;
    }
    if ((o->save_model && !o->save_model[0]) || (o->init_from && !o->init_from[0])) {
        fprintf(stderr, "rpc_ps: --save_model and --init_from take a file name\n");
        return -1;
    }
    /* Refused now rather than after the training: a file rank 0 cannot
       write, one a server cannot read. */
    if (o->save_model && o->world.rank == 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o->save_model);
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[slash == dir ? 1 : 0] = 0;
        if (access(slash ? dir : ".", W_OK) < 0) {
            fprintf(stderr, "rpc_ps: --save_model=%s: cannot write in %s (%s)\n", o->save_model,
                    slash ? dir : ".", strerror(errno));
            return -1;
        }
    }
    if (o->init_from && o->world.rank < o->num_servers && access(o->init_from, R_OK) < 0) {
        fprintf(stderr, "rpc_ps: --init_from=%s: %s\n", o->init_from, strerror(errno));
        return -1;
    }
    if (o->data_dir && o->world.rank >= o->num_servers) {
        char path[2048];
        if (zd_dataset_find_file(o->data_dir, ZD_DATASET_TRAIN, "images", path, sizeof path) < 0) {
            fprintf(stderr, "rpc_ps: %s\n", zd_error_last());
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    /* Line by line even into a pipe (the launcher labels lines as they come). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    options_t o = {.world = flags_world_default(),
                   .num_servers = 1,
                   .batch_size = 32,
                   .epochs = 1,
                   .seed = 1,
                   .log_interval = 0,
                   .check_interval = 5,
                   .lr = 0.03,
                   .progress_s = 5,
                   .init_timeout_s = 60,
                   .checkpoint_every = 100,
                   .min_trainers = 1,
                   .server_wait_s = 120};
    const flag_t flags[] = {
        FLAGS_WORLD(o.world),
        {"num_gpus", FLAG_INT, &o.num_gpus, "must be 0: this build is CPU-only"},
        {"num_servers", FLAG_INT, &o.num_servers, "parameter-server shards"},
        {"data_dir", FLAG_STRING, &o.data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"batch_size", FLAG_INT, &o.batch_size, "samples per batch"},
        {"lr", FLAG_DOUBLE, &o.lr, "SGD learning rate"},
        {"epochs", FLAG_INT, &o.epochs, "passes over the training set"},
        {"max_batches", FLAG_INT, &o.max_batches, "stop each trainer after N batches (0: none)"},
        {"seed", FLAG_INT, &o.seed, "seed of the weights, shuffling and dropout"},
        {"log_interval", FLAG_INT, &o.log_interval,
         "print the tutorial's loss line every N batches of an epoch (0: none; the tutorial "
         "has 5)"},
        {"progress_s", FLAG_DOUBLE, &o.progress_s,
         "print a progress line (batch, samples/s, mean loss, time left) every N seconds "
         "(0: none)"},
        {"checkpoint", FLAG_STRING, &o.checkpoint,
         "servers save their parameters to PREFIX.shardK every --checkpoint_every batches of a "
         "trainer"},
        {"checkpoint_every", FLAG_INT, &o.checkpoint_every, "batches between checkpoints"},
        {"resume", FLAG_BOOL, &o.resume,
         "start from the --checkpoint files: weights, and each trainer's position (a server "
         "shard restarted with it into the running world serves from its checkpoint)"},
        {"server_wait_s", FLAG_INT, &o.server_wait_s,
         "with --checkpoint, a trainer whose server shard was lost waits this long for it to "
         "come back (restarted with --resume), then goes on from its last checkpoint"},
        {"save_model", FLAG_STRING, &o.save_model,
         "at the end rank 0 writes the trained Net, gathered from every server shard, to this "
         "safetensors file under PyTorch's state_dict() names (metadata: step, test_accuracy)"},
        {"init_from", FLAG_STRING, &o.init_from,
         "the servers start from the Net in this safetensors file (PyTorch's state_dict() "
         "names, e.g. saved by PyTorch or by --save_model) instead of the seed's weights"},
        {"curves", FLAG_STRING, &o.curves,
         "each trainer writes its loss, throughput and accuracy curves to PREFIX.rankN.csv "
         "(as they come) and .png (at each evaluation)"},
        {"eval_every", FLAG_INT, &o.eval_every,
         "each trainer evaluates the weights every N of its batches (0: only at the end)"},
        {"eval_samples", FLAG_INT, &o.eval_samples, "test images to evaluate (0: all)"},
        {"check_interval", FLAG_INT, &o.check_interval,
         "fetch the server's gradients to check them every N batches (0: never)"},
        {"no_dropout", FLAG_BOOL, &o.no_dropout, "train with dropout off"},
        {"min_trainers", FLAG_INT, &o.min_trainers,
         "the server exits with an error when fewer trainers finished their batches (a lost "
         "trainer does not stop the others)"},
        {"max_staleness", FLAG_INT, &o.max_staleness,
         "a trainer more than N batches ahead of the slowest trainer still training waits "
         "for it (0: no bound)"},
        {"init_timeout_s", FLAG_INT, &o.init_timeout_s,
         "give up when the world has not gathered after this long"},
        {"max_batch_size", FLAG_INT, &o.max_batch_size,
         "servers refuse a larger batch (0: 4 x --batch_size, at least 1024)"},
        {"max_inflight", FLAG_INT, &o.max_inflight,
         "a server holds the batches of at most N trainers between their forward and the end "
         "of their backward; the others wait their turn (0: 2 per core, -1: no limit)"},
        {"threads", FLAG_INT, &o.threads,
         "compute threads of this process (0: 1 for trainers and for servers of several "
         "trainers, which run their passes side by side; else every core)"},
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "The parameter-server tutorial: rank 0 serves, the others train.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    /* 4: one server and three trainers, the tutorial's world. */
    if (flags_world_resolve(&o.world, 4, "rpc_ps") < 0 || check_options(&o) < 0)
        return 2;

    int rank = (int)o.world.rank;
    bool server = rank < o.num_servers;
    if (server)
        server_arenas();
    char name[64];
    if (server && rank == 0)
        snprintf(name, sizeof name, "parameter_server");
    else if (server)
        snprintf(name, sizeof name, "parameter_server_%d", rank);
    else
        snprintf(name, sizeof name, "trainer_%d", rank);

    /* Trainers only compute losses; a server with several trainers runs
       their passes at once, one thread each, which beats splitting every
       pass over all cores while the passes wait for each other. */
    int64_t threads = o.threads;
    if (threads == 0 && (!server || o.world.world_size - o.num_servers >= 2))
        threads = 1;
    if (threads > 0 && zd_nn_set_num_threads((int)threads) < 0)
        goto fail;
    if (zd_dist_autograd_init() < 0 || zd_dist_optim_init() < 0)
        goto fail;
    if (server) {
        ps_net_set_init_from(o.init_from);
        ps_net_set_save_model(o.save_model);
    }
    if (server &&
        ps_net_serve(rank, (int)o.num_servers, (uint64_t)o.seed, !o.no_dropout, o.data_dir,
                     stdout) < 0)
        goto fail;
    /* The servers take only their own optimizer (this --lr): a trainer
       started with another is refused by name, instead of its steps
       ruining the weights every trainer shares (issue 24 point 6). */
    zd_optim_config_t server_cfg = zd_optim_sgd_defaults(o.lr);
    zd_dist_optim_owner_limits_t limits = zd_dist_optim_owner_limits_default();
    limits.config = &server_cfg;
    if (server && zd_dist_optim_set_owner_limits(&limits) < 0)
        goto fail;
    if (server)
        ps_net_set_max_batch(o.max_batch_size > 0          ? o.max_batch_size
                                 : 4 * o.batch_size > 1024 ? 4 * o.batch_size
                                                           : 1024);
    if (server)
        ps_net_set_max_inflight((int)o.max_inflight);
    if (server && o.checkpoint &&
        ps_net_checkpoint_enable(o.checkpoint, o.resume, o.batch_size,
                                 (int)(o.world.world_size - o.num_servers)) < 0)
        goto fail;
    printf("%s: joining a world of %lld at %s:%lld\n", name, (long long)o.world.world_size,
           o.world.master_addr ? o.world.master_addr : "*", (long long)o.world.master_port);
    if (server)
        printf("PS master initializing RPC\n");
    fflush(stdout);
    /* With checkpoints a lost rank 0 may come back: the others keep
       registering with the rendezvous address while trainers wait for it
       (set for every rank: rank 0 hands it to its members). */
    char wait_s[32];
    snprintf(wait_s, sizeof wait_s, "%lld", (long long)o.server_wait_s);
    if (o.checkpoint && !getenv("ZDIST_MASTER_WAIT_S") &&
        setenv("ZDIST_MASTER_WAIT_S", wait_s, 1) < 0)
        goto fail;
    if (!server && ps_net_client_hooks() < 0)
        goto fail;
    if (flags_world_init(&o.world, name, o.init_timeout_s * 1000, "rpc_ps") < 0)
        return 1;
    if (server)
        printf("RPC initialized! Running parameter server...\n");
    int rc = server ? 0 : run_trainer(&o);
    if (server && rank == 0 && o.checkpoint)
        ps_net_wait_trainers((double)o.server_wait_s);
    fflush(stdout);
    /* Everyone waits here until every trainer is done: no limit (the
       default), since training takes as long as it takes; a trainer that
       dies or freezes is declared lost by the RPC layer (the heartbeat:
       ZDIST_HEARTBEAT_S), and the others finish without it. A trainer
       whose run failed has nothing to wait for: it leaves with the others
       when they are done within the RPC timeout (--rpc_timeout_s), else
       alone (PyTorch's rpc.shutdown takes a timeout too). */
    int64_t shutdown_ms = ZD_TIMEOUT_DEFAULT;
    if (rc < 0)
        shutdown_ms = zd_rpc_get_timeout() > 0 ? zd_rpc_get_timeout() : 60000;
    if (zd_rpc_shutdown(true, shutdown_ms) < 0) {
        fprintf(stderr, "rpc_ps %s: shutdown: %s\n", name, zd_error_last());
        rc = -1;
    }
    if (server && rank == 0) {
        int64_t samples;
        double secs;
        ps_net_throughput(&samples, &secs);
        if (secs > 0)
            printf("aggregate throughput %.0f samples/s (%lld samples in %.2f s)\n",
                   (double)samples / secs, (long long)samples, secs);
        int finished = ps_net_trainers_report(stdout);
        printf("%d of %lld trainers finished\n", finished,
               (long long)(o.world.world_size - o.num_servers));
        if (finished < o.min_trainers) {
            /* Why, when a trainer said: the server's error names the cause. */
            char why[600];
            int failed = ps_net_trainers_failed(why, sizeof why);
            fprintf(stderr,
                    "rpc_ps %s: only %d trainer(s) finished, fewer than "
                    "--min_trainers=%lld%s%s",
                    name, finished, (long long)o.min_trainers, failed ? "; " : "", why);
            if (failed > 1)
                fprintf(stderr, " (and %d more failed)", failed - 1);
            fprintf(stderr, "\n");
            rc = -1;
        }
        const char *why;
        if (o.save_model && ps_net_save_model_result(&why) != 1) {
            fprintf(stderr, "rpc_ps %s: --save_model=%s: not written: %s\n", name, o.save_model,
                    why);
            rc = -1;
        }
    }
    if (server)
        ps_net_free();
    return rc == 0 ? 0 : 1;
fail:
    fprintf(stderr, "rpc_ps %s: %s\n", name, zd_error_last());
    return 1;
}
