/* SPDX-License-Identifier: MIT */
/*  rpc_ps: the PyTorch tutorial "Implementing a Parameter Server Using
    Distributed RPC Framework", on the parameter-server layer's remote
    model (<zdist/ps.h>), with what an operator's run needs around it.

        ./rpc_ps --world_size=4 --rank=0                       the server
        ./rpc_ps --world_size=4 --rank=N --master_addr=HOST    trainer N

    Ranks below --num_servers serve the Net's stages (ps_stages.h), the
    others train. Read it beside the tutorial:
      ParameterServer     rpc_ps_serve (rpc_ps_server.c): a stage of the
                          Net served by zd_ps_model_server_new; rank 0
                          also keeps the trainers' book and their shared
                          final evaluation
      TrainerNet          zd_ps_model_new: the stages' parameter RRefs and
                          a DistributedOptimizer (SGD) over them
      run_training_loop   run_training_loop, its body train_batch
      get_accuracy        get_accuracy (dropout off)
      run_worker          main: the servers leave only after every
                          trainer has finished (graceful shutdown)
    The layer keeps the checkpoints (a trainer asks for one every
    --checkpoint_every of its batches), brings a restarted shard and the
    others back to one generation, and holds the fault points tests use;
    around it, this program adds --resume, a lost shard waited for
    (recover), --max_staleness, a diverging loss stopped, progress lines,
    curves, and --save_model / --init_from under PyTorch's names. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/zdist.h>

#include "examples/flags.h"
#include "examples/rpc_ps.h"
#include "examples/ps_stages.h"
#include "examples/train_common.h"
#include "examples/train_log.h"

#define EVAL_BATCH 500
#define TEXT_(x)   #x
#define TEXT(x)    TEXT_(x) /* a macro's value as a string */

/*  A loss this large, or this many times the first one, means the model is
    diverging even while it is still finite. */
#define LOSS_EXPLODED 1e4
#define LOSS_GROWTH   100

/*  ---- TrainerNet, run_training_loop, get_accuracy ---- */

/*  A trainer: its handle on the model (the tutorial's TrainerNet), its
    data, where it is, and what it reports. */
typedef struct {
    const rpc_ps_options_t *o;
    int rank;
    zd_ps_model_t *model;
    zd_dataset_t *train, *test;
    int64_t per_epoch, total; /* batches in an epoch; to train in all */
    int64_t done, trained;    /* position (batches done); batches trained by this process */
    float first_loss;
    train_log_t log; /* progress line, curves */
} trainer_t;

/*  One batch: the tutorial's loop body, under a distributed autograd
    context. A loss that is not finite is refused before the backward: a
    model that diverged must not spread nan to every trainer through the
    shared weights. */
static int train_batch(trainer_t *t, zd_tensor_t *x, zd_tensor_t *y, bool check, float *loss_out)
{
    zd_tensor_t *out = NULL, *loss = NULL;
    int64_t cid;
    if (zd_dist_autograd_context_begin(&cid) < 0)
        return -1;
    int rc = zd_ps_model_set_position(t->model, t->done);
    if (rc == 0)
        rc = zd_ps_model_forward(t->model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT);
    if (rc == 0)
        rc = zd_nn_nll_loss(out, y, &loss);
    if (rc == 0 && !isfinite(zd_tensor_data(loss)[0])) {
        *loss_out = zd_tensor_data(loss)[0];
        rc = zd_error_set_code(ZD_ERR_ARGUMENT, "the loss is %g", (double)*loss_out);
    }
    if (rc == 0)
        rc = zd_ps_model_backward(t->model, cid, loss);
    if (rc == 0 && check) /* the tutorial's look at the servers' gradients */
        rc = ps_stages_check_gradients((int)t->o->num_servers, cid);
    if (rc == 0)
        rc = zd_ps_model_step(t->model, cid);
    if (rc == 0)
        *loss_out = zd_tensor_data(loss)[0];
    zd_tensor_unref(loss);
    zd_tensor_unref(out);
    /* The peers free the context while the next batch starts; a batch
       that failed keeps its own error, not the release's. */
    zd_error_code_t code = zd_error_code();
    char why[512];
    snprintf(why, sizeof why, "%s", zd_error_last());
    if (zd_dist_autograd_context_release(cid) < 0 && rc == 0)
        return -1;
    return rc < 0 ? zd_error_set_code(code, "%s", why) : 0;
}

/*  The tutorial's get_accuracy: the first `limit` test images (0: all)
    through the servers' model, dropout off. */
static int get_accuracy(trainer_t *t, int64_t limit, double *acc)
{
    int64_t n = zd_dataset_len(t->test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    bool was = zd_ps_model_train(t->model, false);
    int rc = 0;
    for (int64_t start = 0; rc == 0 && start < n; start += EVAL_BATCH) {
        zd_tensor_t *x, *y, *out = NULL;
        int64_t bs = n - start < EVAL_BATCH ? n - start : EVAL_BATCH;
        if ((rc = zd_dataset_batch(t->test, NULL, start, bs, &x, &y)) < 0)
            break;
        rc = zd_ps_model_forward(t->model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT);
        int64_t c = rc == 0 ? zd_nn_accuracy(out, y) : -1;
        rc = c < 0 ? -1 : 0;
        correct += c;
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_ps_model_train(t->model, was);
    *acc = n ? (double)correct / (double)n : 0;
    return rc;
}

/*  A call to the servers failed. With --checkpoint, when a shard was
    lost or started again: waits for it (restarted with --resume), for the
    layer to bring the stages to its checkpoint, and for rank 0 to take
    this trainer back; then 1, t->done moved to where the stages say this
    trainer was. Else -1 with the error set. */
static int recover(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    train_log_clear(&t->log);
    if (!o->checkpoint)
        return -1;
    zd_error_code_t code = zd_error_code();
    char why[1024], who[32] = "a server shard", rank[24] = "";
    snprintf(why, sizeof why, "%s", zd_error_last());
    /* ZD_ERR_PEER naming no shard: rank 0 started again after the model's
       last look (between the registry's started and the first forward) */
    int shard = zd_ps_model_lost_shard(t->model, 5000);
    if (shard < 0 && code != ZD_ERR_PEER)
        return zd_error_set_code(code, "%s", why);
    if (shard >= 0) {
        snprintf(who, sizeof who, "server shard %d", shard);
        snprintf(rank, sizeof rank, " (rank %d)", shard);
    }
    double t0 = train_now();
    printf("Rank %d: %s lost at batch %lld (%s); waiting up to %lld s (--server_wait_s) for it "
           "to come back\n",
           t->rank, who, (long long)t->done, why, (long long)o->server_wait_s);
    /* The releases of contexts the old process held fail: it is gone. */
    if (zd_dist_autograd_wait_releases(1000) < 0)
        printf("Rank %d: contexts of the lost server's process not released: %s\n", t->rank,
               zd_error_last());
    int64_t start = 0;
    for (;;) {
        int64_t left = (int64_t)((t0 + (double)o->server_wait_s - train_now()) * 1000);
        if (left <= 0)
            return zd_error_set("%s%s lost (%s) and not back within --server_wait_s=%lld s: %s",
                                who, rank, why, (long long)o->server_wait_s, zd_error_last());
        /* rank 0, just back, may not take the registry's calls yet */
        if (zd_ps_model_recover(t->model, left, &start) == 0 && zd_ps_trainer_started(0, left) == 0)
            break;
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    printf("Rank %d: the servers are back after %.2f s; going on from batch %lld (the last "
           "checkpoint; %lld batch(es) of this trainer to take again)\n",
           t->rank, train_now() - t0, (long long)start, (long long)(t->done - start));
    t->done = start;
    return 1;
}

/*  What follows a trained batch: the divergence check, progress and the
    tutorial's loss line, curves, and --eval_every's evaluation. 0, or -1. */
static int after_batch(trainer_t *t, int64_t epoch, int64_t b, float loss)
{
    const rpc_ps_options_t *o = t->o;
    if (++t->trained == 1)
        t->first_loss = loss;
    if (loss > LOSS_EXPLODED || (t->first_loss > 0 && loss > LOSS_GROWTH * t->first_loss)) {
        train_log_clear(&t->log);
        return zd_error_set("batch %lld (epoch %lld): the loss is %g (the first batch's was %g): "
                            "the model is diverging. Remedies: a lower --lr (now %g), or "
                            "--max_staleness=K (fewer stale updates from the other trainers)",
                            (long long)t->done, (long long)epoch + 1, (double)loss,
                            (double)t->first_loss, o->lr);
    }
    double now = train_now();
    if (train_log_batch(&t->log, t->done, loss, now) < 0)
        return -1;
    if (o->log_interval > 0 && b % o->log_interval == 0) {
        /* the tutorial's line (its batch restarts each epoch) */
        train_log_clear(&t->log);
        printf("Rank %d training batch %lld loss %.6f (epoch %lld)\n", t->rank, (long long)b, loss,
               (long long)epoch + 1);
    }
    /* (the last batch's evaluation is the final one) */
    if (o->eval_every == 0 || t->done % o->eval_every != 0 || t->done >= t->total)
        return 0;
    /* this trainer's own look at the weights as they are now, while the
       other trainers go on */
    double acc;
    if (get_accuracy(t, o->eval_samples, &acc) < 0)
        return -1;
    train_log_clear(&t->log);
    printf("Rank %d after batch %lld (epoch %lld): accuracy %.2f %%\n", t->rank, (long long)t->done,
           (long long)epoch + 1, 100 * acc);
    return train_log_accuracy(&t->log, t->done, acc, now);
}

/*  The staleness bound, then one batch: 0, 1 (a shard was lost and is
    back: t->done moved, call again), or -1. */
static int next_batch(trainer_t *t, const int64_t *order, int64_t epoch, int64_t b)
{
    const rpc_ps_options_t *o = t->o;
    zd_tensor_t *x, *y;
    float loss = 0;
    if (o->max_staleness > 0) {
        int rc = zd_ps_trainer_gate(0, t->done, o->max_staleness, ZD_TIMEOUT_DEFAULT, NULL);
        if (rc < 0 && zd_error_code() == ZD_ERR_TIMEOUT)
            fprintf(stderr,
                    "rpc_ps trainer %d: waited the RPC timeout for the slowest trainer "
                    "(--max_staleness=%lld); going on\n",
                    t->rank, (long long)o->max_staleness);
        else if (rc < 0)
            return recover(t);
    }
    if (zd_dataset_batch(t->train, order, b * o->batch_size, o->batch_size, &x, &y) < 0)
        return -1;
    bool check = o->check_interval > 0 && t->done % o->check_interval == 0;
    int rc = train_batch(t, x, y, check, &loss);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    if (rc < 0 && !isfinite(loss)) {
        train_log_clear(&t->log);
        return zd_error_set("batch %lld (epoch %lld): the loss is %g: the model diverged, and "
                            "this batch's gradients were not applied. Remedies: a lower --lr "
                            "(now %g), or fewer trainers per server (their updates arrive stale)",
                            (long long)t->done + 1, (long long)epoch + 1, (double)loss, o->lr);
    }
    if (rc < 0)
        return recover(t);
    t->done++;
    if (after_batch(t, epoch, b, loss) < 0)
        return -1;
    if (!o->checkpoint || t->done % o->checkpoint_every != 0 ||
        zd_ps_model_checkpoint(t->model, t->done, ZD_TIMEOUT_DEFAULT) == 0)
        return 0;
    return recover(t);
}

/*  The tutorial's run_training_loop, from batch t->done: 0 when this
    trainer's batches are done, 1 when a server shard was lost and is back
    (t->done moved: call again), -1 on failure. */
static int run_training_loop(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    int64_t first_epoch, first_batch;
    train_resume_position(t->done, t->per_epoch, &first_epoch, &first_batch);
    for (int64_t epoch = first_epoch; epoch < o->epochs; epoch++) {
        /* The first trainer shuffles as train_local does with the same seed. */
        int64_t *order = zd_dataset_order(
            t->train, (uint64_t)(o->seed + epoch + 1000 * (t->rank - o->num_servers)));
        if (!order)
            return zd_error_set("out of memory");
        int rc = 0;
        for (int64_t b = epoch == first_epoch ? first_batch : 0;
             rc == 0 && b < t->per_epoch && t->done < t->total; b++)
            rc = next_batch(t, order, epoch, b);
        free(order);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/*  Loads the data and finds where to start: with --resume, or when this
    trainer rejoined the world, where the servers say it was. 0, or -1. */
static int trainer_start(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    if (!(t->train = zd_dataset_load(o->data_dir, ZD_DATASET_TRAIN)) ||
        !(t->test = zd_dataset_load(o->data_dir, ZD_DATASET_TEST)))
        return -1;
    t->per_epoch = zd_dataset_num_batches(t->train, o->batch_size);
    t->total = o->epochs * t->per_epoch;
    if (o->max_batches > 0 && o->max_batches < t->total)
        t->total = o->max_batches;
    if (zd_ps_trainer_started(0, ZD_TIMEOUT_DEFAULT) < 0)
        return -1;
    bool rejoined = zd_rpc_rejoined();
    if (rejoined && !o->checkpoint)
        printf("Rank %d rejoined the world; without --checkpoint it starts from its first "
               "batch\n",
               t->rank);
    if (o->checkpoint && (o->resume || rejoined)) {
        /* the same batches in the same order follow (the order depends on
           seed and epoch) */
        if (zd_ps_model_resume_position(t->model, ZD_TIMEOUT_DEFAULT, &t->done) < 0)
            return -1;
        if (t->done > o->epochs * t->per_epoch)
            return zd_error_set("checkpoint %s: this trainer had done %lld batches, more than "
                                "%lld (%lld epoch(s))",
                                o->checkpoint, (long long)t->done,
                                (long long)(o->epochs * t->per_epoch), (long long)o->epochs);
        t->done = t->done < 0 ? 0 : t->done;
        printf("Rank %d %s at batch %lld (%lld batches done)\n", t->rank,
               rejoined ? "rejoined the world; resuming" : "resuming", (long long)t->done,
               (long long)t->done);
    }
    char label[32], prefix[4096], title[64];
    snprintf(label, sizeof label, "Rank %d", t->rank);
    snprintf(title, sizeof title, "rpc_ps rank %d", t->rank);
    if (o->curves &&
        snprintf(prefix, sizeof prefix, "%s.rank%d", o->curves, t->rank) >= (int)sizeof prefix)
        return zd_error_set("--curves: prefix too long");
    /* a curve point every --log_interval batches, or 10 without loss lines */
    return train_log_open(&t->log,
                          &(train_log_config_t){label, o->curves ? prefix : NULL, title, t->done,
                                                t->total, t->per_epoch, o->epochs, o->batch_size,
                                                o->log_interval > 0 ? o->log_interval : 10,
                                                o->progress_s},
                          train_now());
}

/*  After the last batch: tells rank 0, and prints the test accuracy of
    the final weights, which the trainers share (one evaluation on rank
    0, when the last is done); one that waits longer than the RPC timeout
    evaluates by itself. 0, 1 (a shard came back: train from t->done
    again), or -1. */
static int trainer_finish(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    double secs = train_log_end(&t->log, train_now());
    if (zd_dist_autograd_wait_releases(-1) < 0)
        return -1;
    if (zd_ps_trainer_finished(0, ZD_TIMEOUT_DEFAULT) < 0)
        return recover(t);
    printf("Training complete!\nGetting accuracy....\n");
    double acc;
    zd_value_t *req = zd_value_int(o->eval_samples), *res = NULL;
    int rc = req ? zd_ps_trainer_wait_all(0, req, ZD_TIMEOUT_DEFAULT, &res) : -1;
    if (rc == 0)
        rc = zd_value_get_float(res, &acc);
    zd_value_unref(req);
    zd_value_unref(res);
    if (rc < 0) {
        fprintf(stderr, "rpc_ps trainer %d: shared evaluation failed (%s); evaluating alone\n",
                t->rank, zd_error_last());
        if (get_accuracy(t, o->eval_samples, &acc) < 0)
            return -1;
    }
    printf("Rank %d test accuracy %.2f %%\n", t->rank, 100 * acc);
    printf("Rank %d throughput %.0f samples/s\n", t->rank,
           (double)(t->trained * o->batch_size) / secs);
    if (!t->log.curves)
        return 0;
    if (train_log_accuracy(&t->log, t->done, acc, train_now()) < 0)
        return -1;
    printf("Rank %d curves in %s.rank%d.csv and %s\n", t->rank, o->curves, t->rank,
           curves_png_path(t->log.curves));
    return 0;
}

/*  A trainer rank: trains until its batches are done, going back to the
    servers' checkpoint as often as a shard is lost and comes back. 0, or
    -1 (the error printed, and told to rank 0). */
static int run_trainer(const rpc_ps_options_t *o, const char *name)
{
    trainer_t t = {.o = o, .rank = (int)o->world.rank};
    zd_optim_config_t sgd = zd_optim_sgd_defaults(o->lr);
    /* (before zd_rpc_init: the handle installs distributed autograd) */
    if (!(t.model = zd_ps_model_new(NULL, (int)o->num_servers, &sgd, NULL))) {
        fprintf(stderr, "rpc_ps %s: %s\n", name, zd_error_last());
        return -1;
    }
    printf("%s: joining a world of %lld at %s:%lld\n", name, (long long)o->world.world_size,
           o->world.master_addr ? o->world.master_addr : "*", (long long)o->world.master_port);
    if (flags_world_init(&o->world, name, o->init_timeout_s * 1000, "rpc_ps") < 0) {
        zd_ps_model_free(t.model);
        return -1;
    }
    int rc = trainer_start(&t);
    while (rc == 0) {
        rc = run_training_loop(&t);
        if (rc == 0)
            rc = trainer_finish(&t);
        if (rc == 1) /* the servers are back: on from where they say */
            rc = 0;
        else
            break;
    }
    if (rc < 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", zd_error_last());
        fprintf(stderr, "rpc_ps trainer %d: %s\n", t.rank, why);
        /* rank 0 stops waiting for this trainer and names its error */
        if (!zd_rpc_peer_is_lost(0) && zd_ps_trainer_failed(0, t.done, why, ZD_TIMEOUT_DEFAULT) < 0)
            fprintf(stderr,
                    "rpc_ps trainer %d: could not tell the server that this run failed: %s\n",
                    t.rank, zd_error_last());
    }
    train_log_close(&t.log, rc < 0); /* (a failed run's plot: what there is) */
    /* The model's RRefs go before the world does. */
    zd_ps_model_free(t.model);
    fflush(stdout);
    /* Everyone waits here until every trainer is done: no limit (the
       default), since training takes as long as it takes; a trainer that
       dies or freezes is declared lost by the RPC layer, and the others
       finish without it. A trainer whose run failed leaves with the
       others when they are done within the RPC timeout, else alone. */
    int64_t shutdown_ms = ZD_TIMEOUT_DEFAULT;
    if (rc < 0)
        shutdown_ms = zd_rpc_get_timeout() > 0 ? zd_rpc_get_timeout() : 60000;
    if (zd_rpc_shutdown(true, shutdown_ms) < 0) {
        fprintf(stderr, "rpc_ps %s: shutdown: %s\n", name, zd_error_last());
        rc = -1;
    }
    zd_dataset_free(t.train);
    zd_dataset_free(t.test);
    return rc;
}
/*  What the flags' types leave: ranges and flags that go together. 0, or
    -1 with the message printed. */
static int check_options(const rpc_ps_options_t *o)
{
    int64_t trainers = o->world.world_size - o->num_servers;
    const char *bad = o->num_gpus != 0 ? "--num_gpus: this build is CPU-only; use --num_gpus=0"
        : trainers < 1 ? "--world_size and --num_servers leave no trainer (need world_size > "
                         "num_servers >= 1)"
        : o->num_servers > PS_STAGES_MAX ? "--num_servers: at most " TEXT(PS_STAGES_MAX) " shards"
        : o->max_batch_size < 0 || (o->max_batch_size > 0 && o->max_batch_size < EVAL_BATCH)
        ? "--max_batch_size: 0 (the default) or at least " TEXT(EVAL_BATCH) " (the evaluation's "
                                                                            "batches)"
        : o->max_inflight < -1 || o->max_inflight > 1000000
        ? "--max_inflight: -1 (no limit), 0 (2 per core) or a number of batches"
        : o->resume && !o->checkpoint
        ? "--resume needs --checkpoint=PREFIX (the files to resume from)"
        : o->progress_s < 0          ? "--progress_s must be >= 0"
        : o->server_wait_s > 86400   ? "--server_wait_s: at most 86400"
        : o->min_trainers > trainers ? "--min_trainers: at most the trainers"
        : o->lr <= 0                 ? "--lr must be > 0"
        : (o->save_model && !o->save_model[0]) || (o->init_from && !o->init_from[0])
        ? "--save_model and --init_from take a file name"
        : NULL;
    if (bad) {
        fprintf(stderr, "rpc_ps: %s\n", bad);
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
    char path[2048];
    if (o->data_dir && o->world.rank >= o->num_servers &&
        zd_dataset_find_file(o->data_dir, ZD_DATASET_TRAIN, "images", path, sizeof path) < 0) {
        fprintf(stderr, "rpc_ps: %s\n", zd_error_last());
        return -1;
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
    rpc_ps_options_t o = {.world = flags_world_default(),
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
        {"num_servers", FLAG_COUNT, &o.num_servers, "parameter-server shards"},
        {"data_dir", FLAG_STRING, &o.data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"batch_size", FLAG_COUNT, &o.batch_size, "samples per batch"},
        {"lr", FLAG_DOUBLE, &o.lr, "SGD learning rate"},
        {"epochs", FLAG_COUNT, &o.epochs, "passes over the training set"},
        {"max_batches", FLAG_INDEX, &o.max_batches, "stop each trainer after N batches (0: none)"},
        {"seed", FLAG_INT, &o.seed, "seed of the weights, shuffling and dropout"},
        {"log_interval", FLAG_INDEX, &o.log_interval,
         "print the tutorial's loss line every N batches of an epoch (0: none; the tutorial "
         "has 5)"},
        {"progress_s", FLAG_DOUBLE, &o.progress_s,
         "print a progress line (batch, samples/s, mean loss, time left) every N seconds "
         "(0: none)"},
        {"checkpoint", FLAG_STRING, &o.checkpoint,
         "servers save their parameters to PREFIX.shardK every --checkpoint_every batches of a "
         "trainer"},
        {"checkpoint_every", FLAG_COUNT, &o.checkpoint_every, "batches between checkpoints"},
        {"resume", FLAG_BOOL, &o.resume,
         "start from the --checkpoint files: weights, and each trainer's position (a server "
         "shard restarted with it into the running world serves from its checkpoint)"},
        {"server_wait_s", FLAG_COUNT, &o.server_wait_s,
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
        {"eval_every", FLAG_INDEX, &o.eval_every,
         "each trainer evaluates the weights every N of its batches (0: only at the end)"},
        {"eval_samples", FLAG_INDEX, &o.eval_samples, "test images to evaluate (0: all)"},
        {"check_interval", FLAG_INDEX, &o.check_interval,
         "fetch the server's gradients to check them every N batches (0: never)"},
        {"no_dropout", FLAG_BOOL, &o.no_dropout, "train with dropout off"},
        {"min_trainers", FLAG_INDEX, &o.min_trainers,
         "the server exits with an error when fewer trainers finished their batches (a lost "
         "trainer does not stop the others)"},
        {"max_staleness", FLAG_INDEX, &o.max_staleness,
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
    if (threads > 0 && zd_nn_set_num_threads((int)threads) < 0) {
        fprintf(stderr, "rpc_ps %s: %s\n", name, zd_error_last());
        return 1;
    }
    /* With checkpoints a lost rank 0 may come back: the others keep
       registering with the rendezvous address while trainers wait for it
       (set for every rank: rank 0 hands it to its members). */
    char wait_s[32];
    snprintf(wait_s, sizeof wait_s, "%lld", (long long)o.server_wait_s);
    if (o.checkpoint && !getenv("ZDIST_MASTER_WAIT_S"))
        setenv("ZDIST_MASTER_WAIT_S", wait_s, 1);
    int rc = server ? rpc_ps_serve(&o, name) : run_trainer(&o, name);
    return rc == 0 ? 0 : 1;
}
