/* SPDX-License-Identifier: MIT */
/*  rpc_ps: the PyTorch tutorial "Implementing a Parameter Server Using
    Distributed RPC Framework", on the parameter-server layer's remote
    model (<zdist/ps.h>), with what an operator's run needs around it.

        ./rpc_ps --world_size=4 --rank=0                       the server
        ./rpc_ps --world_size=4 --rank=N --master_addr=HOST    trainer N

    Ranks below --num_servers serve the Net's stages (ps_stages.h), the
    others train. Read it beside the tutorial:
      ParameterServer     rpc_ps_serve (rpc_ps_server.c): a stage of the
                          Net (zd_ps_model_server_new); rank 0 also keeps
                          the trainers' book and their final evaluation
      TrainerNet          zd_ps_model_new: the stages' parameter RRefs and
                          a DistributedOptimizer (SGD) over them
      run_training_loop   run_training_loop: the layer's zd_ps_model_run,
                          given each batch's loss by batch_loss
      get_accuracy        get_accuracy (dropout off)
      run_worker          main: the servers leave only after every
                          trainer has finished (graceful shutdown)
    The layer's loop keeps checkpoints, --max_staleness, divergence and a
    lost shard's return; this program reports (on_event). Its flags are in
    rpc_ps_flags.c. */
#include <stdio.h>
#include <stdlib.h>

#include <zdist/zdist.h>

#include "examples/rpc_ps.h"
#include "examples/ps_stages.h"
#include "examples/train_common.h"
#include "examples/train_log.h"

/*  A trainer: its handle on the model (the tutorial's TrainerNet), its
    data, where it is, and what it reports. */
typedef struct {
    const rpc_ps_options_t *o;
    int rank;
    zd_ps_model_t *model;
    zd_dataset_t *train, *test;
    int64_t per_epoch, total; /* batches in an epoch; to train in all */
    int64_t epoch;            /* the epoch `order` shuffles (-1: none yet) */
    int64_t *order;
    int64_t done, trained; /* position (batches done); batches trained by this process */
    bool resumed, rejoined;
    double secs;     /* from the first batch to the last */
    train_log_t log; /* progress line, curves */
} trainer_t;

/*  The tutorial's loop body up to the loss (the layer's loop runs the
    backward and the step): the batch at `position`, epochs shuffled by
    seed and epoch (the first trainer as train_local), through the model. */
static int batch_loss(void *arg, zd_ps_model_t *m, int64_t position, zd_tensor_t **loss)
{
    trainer_t *t = arg;
    const rpc_ps_options_t *o = t->o;
    int64_t epoch = position / t->per_epoch, b = position % t->per_epoch;
    if (epoch != t->epoch) {
        free(t->order);
        t->epoch = epoch;
        uint64_t seed = (uint64_t)(o->seed + epoch + 1000 * (t->rank - o->num_servers));
        if (!(t->order = zd_dataset_order(t->train, seed)))
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    }
    zd_tensor_t *x, *y, *out = NULL;
    if (zd_dataset_batch(t->train, t->order, b * o->batch_size, o->batch_size, &x, &y) < 0)
        return -1;
    int rc = zd_ps_model_forward(m, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT);
    if (rc == 0)
        rc = zd_nn_nll_loss(out, y, loss);
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

/*  The tutorial's look at the servers' gradients, every
    --check_interval batches, between the backward and the step. */
static int check_gradients(void *arg, int64_t position, int64_t context_id)
{
    trainer_t *t = arg;
    if (t->o->check_interval == 0 || position % t->o->check_interval != 0)
        return 0;
    return ps_stages_check_gradients((int)t->o->num_servers, context_id);
}

/*  The tutorial's get_accuracy: the first `limit` test images (0: all)
    through the servers' model, dropout off. */
static int get_accuracy(trainer_t *t, int64_t limit, double *acc)
{
    return train_ps_accuracy(t->model, t->test, limit, RPC_PS_EVAL_BATCH, acc);
}

/*  Where this trainer starts (resumed: where the servers say it was),
    and its progress line and curves from there. 0, or -1. */
static int on_start(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    if (t->resumed) /* (the same batches follow: batch_loss's order) */
        printf("Rank %d %s at batch %lld (%lld batches done)\n", t->rank,
               t->rejoined ? "rejoined the world; resuming" : "resuming", (long long)t->done,
               (long long)t->done);
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

/*  After a trained batch: progress, the tutorial's loss line, curves,
    --eval_every's evaluation. 0, or -1. */
static int on_batch(trainer_t *t, float loss)
{
    const rpc_ps_options_t *o = t->o;
    int64_t epoch = (t->done - 1) / t->per_epoch, b = (t->done - 1) % t->per_epoch;
    t->trained++;
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
    /* its own look at the weights, while the other trainers go on */
    double acc;
    if (get_accuracy(t, o->eval_samples, &acc) < 0)
        return -1;
    train_log_clear(&t->log);
    printf("Rank %d after batch %lld (epoch %lld): accuracy %.2f %%\n", t->rank, (long long)t->done,
           (long long)epoch + 1, 100 * acc);
    return train_log_accuracy(&t->log, t->done, acc, now);
}

/*  What the layer's loop reports: the start, each batch, a lost shard
    and its return, the end. 0, or -1 to stop the run. */
static int on_event(void *arg, const zd_ps_run_event_t *ev)
{
    trainer_t *t = arg;
    int64_t was = t->done;
    t->done = ev->position;
    switch (ev->kind) {
    case ZD_PS_RUN_START:
        return on_start(t);
    case ZD_PS_RUN_BATCH:
        return on_batch(t, ev->loss);
    case ZD_PS_RUN_LOST: {
        train_log_clear(&t->log);
        char who[32] = "a server shard";
        if (ev->shard >= 0)
            snprintf(who, sizeof who, "server shard %d", ev->shard);
        printf("Rank %d: %s lost at batch %lld (%s); waiting up to %lld s (--server_wait_s) for "
               "it to come back\n",
               t->rank, who, (long long)t->done, ev->why, (long long)t->o->server_wait_s);
        return 0;
    }
    case ZD_PS_RUN_BACK:
        printf("Rank %d: the servers are back after %.2f s; going on from batch %lld (the last "
               "checkpoint; %lld batch(es) of this trainer to take again)\n",
               t->rank, ev->seconds, (long long)t->done, (long long)(was - t->done));
        return 0;
    case ZD_PS_RUN_DONE:
        t->secs = train_log_end(&t->log, train_now());
        return 0;
    }
    return 0;
}

/*  The tutorial's run_training_loop on the layer's: from the first batch
    (resumed or rejoined: where the servers say this trainer was) to the
    last, back to the checkpoint whenever a lost shard returns. 0, or -1. */
static int run_training_loop(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    if (!(t->train = zd_dataset_load(o->data_dir, ZD_DATASET_TRAIN)) ||
        !(t->test = zd_dataset_load(o->data_dir, ZD_DATASET_TEST)))
        return -1;
    t->per_epoch = zd_dataset_num_batches(t->train, o->batch_size);
    t->total = o->epochs * t->per_epoch;
    if (o->max_batches > 0 && o->max_batches < t->total)
        t->total = o->max_batches;
    t->rejoined = zd_rpc_rejoined();
    if (t->rejoined && !o->checkpoint)
        printf("Rank %d rejoined; without --checkpoint it starts again at batch 0\n", t->rank);
    t->resumed = o->checkpoint && (o->resume || t->rejoined);
    zd_ps_run_options_t ro = zd_ps_run_options_default();
    ro.batches = t->total;
    ro.loss = batch_loss;
    ro.backward = check_gradients;
    ro.event = on_event;
    ro.arg = t;
    ro.registry = 0; /* rank 0 keeps the trainers' book */
    ro.max_staleness = o->max_staleness;
    ro.checkpoint_every = o->checkpoint ? o->checkpoint_every : 0;
    ro.resume = t->resumed;
    ro.recover = o->checkpoint != NULL;
    ro.recover_ms = o->server_wait_s * 1000;
    /* a loss this large, or this many times the first, is diverging */
    ro.loss_limit = 1e4;
    ro.loss_growth = 100;
    char hint[160];
    snprintf(hint, sizeof hint,
             "Remedies: a lower --lr (now %g), or --max_staleness=K (fewer stale updates from "
             "the other trainers)",
             o->lr);
    ro.diverging_hint = hint;
    return zd_ps_model_run(t->model, &ro, &t->done);
}

/*  Prints the final weights' accuracy, evaluated once on rank 0 when the
    last trainer is done (one kept waiting past the RPC timeout evaluates
    alone), and this trainer's throughput. 0, or -1. */
static int final_accuracy(trainer_t *t)
{
    const rpc_ps_options_t *o = t->o;
    printf("Training complete!\nGetting accuracy....\n");
    double acc;
    if (rpc_ps_shared_accuracy(o, &acc) < 0) {
        fprintf(stderr, "rpc_ps trainer %d: shared evaluation failed (%s); evaluating alone\n",
                t->rank, zd_error_last());
        if (get_accuracy(t, o->eval_samples, &acc) < 0)
            return -1;
    }
    printf("Rank %d test accuracy %.2f %%\nRank %d throughput %.0f samples/s\n", t->rank, 100 * acc,
           t->rank, (double)(t->trained * o->batch_size) / t->secs);
    if (!t->log.curves)
        return 0;
    if (train_log_accuracy(&t->log, t->done, acc, train_now()) < 0)
        return -1;
    printf("Rank %d curves in %s.rank%d.csv and %s\n", t->rank, o->curves, t->rank,
           curves_png_path(t->log.curves));
    return 0;
}

/*  A trainer rank: joins the world, trains, and leaves with the others.
    0, or -1 (the error printed; the layer told rank 0). */
static int run_trainer(const rpc_ps_options_t *o)
{
    trainer_t t = {.o = o, .rank = (int)o->world.rank, .epoch = -1};
    zd_optim_config_t sgd = zd_optim_sgd_defaults(o->lr);
    /* (before zd_rpc_init: the handle installs distributed autograd) */
    if (!(t.model = zd_ps_model_new(NULL, (int)o->num_servers, &sgd, NULL))) {
        fprintf(stderr, "rpc_ps %s: %s\n", o->name, zd_error_last());
        return -1;
    }
    if (rpc_ps_join(o) < 0) {
        zd_ps_model_free(t.model);
        return -1;
    }
    int rc = run_training_loop(&t);
    if (rc == 0)
        rc = final_accuracy(&t);
    if (rc < 0) {
        train_log_clear(&t.log);
        fprintf(stderr, "rpc_ps trainer %d: %s\n", t.rank, zd_error_last());
    }
    train_log_close(&t.log, rc < 0); /* (a failed run's plot: what there is) */
    /* The model's RRefs go before the world does. */
    zd_ps_model_free(t.model);
    fflush(stdout);
    /* Every trainer waits for all (a dead or frozen one is declared lost);
       a failed one waits the RPC timeout at most, then leaves alone. */
    int64_t shutdown_ms = ZD_TIMEOUT_DEFAULT;
    if (rc < 0)
        shutdown_ms = zd_rpc_get_timeout() > 0 ? zd_rpc_get_timeout() : 60000;
    if (zd_rpc_shutdown(true, shutdown_ms) < 0) {
        fprintf(stderr, "rpc_ps %s: shutdown: %s\n", o->name, zd_error_last());
        rc = -1;
    }
    free(t.order);
    zd_dataset_free(t.train);
    zd_dataset_free(t.test);
    return rc;
}

int main(int argc, char **argv)
{
    /* first, before any thread: the allocator and BLAS set-up (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    /* Line by line even into a pipe (the launcher labels lines as they come). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    rpc_ps_options_t o;
    int pr = rpc_ps_options_parse(argc, argv, &o);
    if (pr != 0)
        return pr == 1 ? 0 : 2;
    int rc = o.world.rank < o.num_servers ? rpc_ps_serve(&o) : run_trainer(&o);
    return rc == 0 ? 0 : 1;
}
