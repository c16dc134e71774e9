/* SPDX-License-Identifier: MIT */
/*  rpc_ps: the PyTorch tutorial "Implementing a Parameter Server Using
    Distributed RPC Framework", on this framework.

        ./rpc_ps --world_size=4 --rank=0                       the server
        ./rpc_ps --world_size=4 --rank=N --master_addr=HOST    trainer N

    With --num_servers=S, ranks 0..S-1 are parameter-server shards (see
    ps_net.h) and the others trainers. Each trainer gets an RRef to the
    server, builds a DistributedOptimizer (SGD) over the server's parameter
    RRefs, and for every batch: a distributed autograd context, the forward
    pass on the server, nll loss, distributed backward, the check that the
    server holds gradients for the context, and an optimizer step. Then it
    prints its test accuracy (dropout off). The servers leave only after
    every trainer has finished (graceful shutdown).

    While it trains, a trainer prints a progress line every --progress_s
    seconds (progress.h); the tutorial's per-batch loss lines come with
    --log_interval=5. --save_model=FILE.safetensors has rank 0 write the
    trained Net at the end, under PyTorch's names, for PyTorch's
    load_state_dict; --init_from=FILE.safetensors starts the servers from
    such a file, PyTorch's or a previous run's (ps_net.h). */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include "examples/curves.h"
#include "examples/fault.h"
#include "examples/flags.h"
#include "examples/progress.h"
#include "examples/ps_net.h"
#include "examples/train_common.h"
#include <zdist/dataset.h>
#include <zdist/nn.h>
#include <zdist/dist_optim.h>
#include <zdist/rpc.h>

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
/*  The trainer holds the parameters' RRefs in an array of this many: with S
    shards there are 2 S + 6 of them (ps_net.h), so S stays well below. */
#define MAX_PARAM_RREFS 64
#define MAX_SERVERS     16

/*  A loss this large, or this many times the first one, means the model is
    diverging even while it is still finite (issue 12 point 5). */
#define LOSS_EXPLODED 1e4
#define LOSS_GROWTH   100

/*  Sets the error and returns true when the loss of batch `done` has
    exploded: the run stops before the shared weights are ruined. */
static bool loss_exploded(const options_t *o, int64_t done, int64_t epoch, float first, float loss)
{
    if (loss <= LOSS_EXPLODED && !(first > 0 && loss > LOSS_GROWTH * first))
        return false;
    zd_error_set("batch %lld (epoch %lld): the loss is %g (the first batch's was %g): the model "
                 "is diverging. Remedies: a lower --lr (now %g), or --max_staleness=K (fewer "
                 "stale updates from the other trainers)",
                 (long long)done, (long long)epoch + 1, (double)loss, (double)first, o->lr);
    return true;
}

/*  The result of server.method(args) as a tensor (a new reference); args
    (from ZD_ARGS) is taken over, like call_none's. */
static int call_tensor(zd_rref_t *ps, const char *method, zd_value_t *args, zd_tensor_t **out)
{
    zd_value_t *r;
    *out = NULL;
    int rc = zd_rref_rpc_sync_take(ps, method, args, ZD_TIMEOUT_DEFAULT, &r);
    if (rc < 0)
        return -1;
    zd_tensor_t *t;
    rc = zd_value_get_tensor(r, &t);
    if (rc == 0)
        *out = zd_tensor_ref(t);
    zd_value_unref(r);
    return rc;
}

static int call_none(zd_rref_t *ps, const char *method, zd_value_t *args)
{
    zd_value_t *r = NULL;
    int rc = zd_rref_rpc_sync_take(ps, method, args, ZD_TIMEOUT_DEFAULT, &r);
    zd_value_unref(r);
    return rc;
}

/*  One batch: the tutorial's loop body. */
static int train_batch(zd_rref_t *ps, zd_dist_optim_t *opt, zd_tensor_t *x, zd_tensor_t *y,
                       bool check, float *loss_out)
{
    int rank = zd_rpc_rank();
    int64_t cid;
    zd_tensor_t *out = NULL, *loss = NULL;
    zd_value_t *grads = NULL;
    if (zd_dist_autograd_context_begin(&cid) < 0)
        return -1;
    fault_point(rank, "forward");
    int rc = call_tensor(ps, "ps_forward", ZD_ARGS(x, 1), &out);
    if (rc == 0)
        rc = zd_nn_nll_loss(out, y, &loss);
    /* A model that diverged must not take this batch's gradients: they
       would spread nan to every trainer through the shared weights. */
    if (rc == 0 && !isfinite(zd_tensor_data(loss)[0])) {
        *loss_out = zd_tensor_data(loss)[0];
        rc = zd_error_set_code(ZD_ERR_ARGUMENT, "the loss is %g", (double)*loss_out);
    }
    if (rc == 0)
        fault_point(rank, "backward");
    if (rc == 0)
        rc = zd_dist_autograd_backward(cid, &loss, 1, false);
    if (rc == 0 && check) {
        /* The tutorial's check: the server holds gradients for this context.
           The tutorial fetches them (ps_get_dist_gradients, 4.8 MB); their
           names and sizes tell as much, and leave the server no buffer of
           that size per trainer to send them through. */
        zd_value_t *a = ZD_ARGS(cid);
        rc = a ? zd_rref_rpc_sync(ps, "ps_dist_gradient_sizes", a, ZD_TIMEOUT_DEFAULT, &grads) : -1;
        zd_value_unref(a);
        if (rc == 0 && zd_list_len(grads) == 0)
            rc = zd_error_set("the server has no gradients for context %lld", (long long)cid);
        for (size_t i = 0; rc == 0 && i < zd_list_len(grads); i++) {
            int64_t numel;
            if (zd_rpc_arg_int(zd_list_get(grads, i), 1, &numel) < 0 || numel < 1)
                rc = zd_error_set("the server's gradient %zu for context %lld is empty", i,
                                  (long long)cid);
        }
    }
    if (rc == 0)
        fault_point(rank, "step");
    if (rc == 0)
        rc = zd_dist_optim_step(opt, cid);
    if (rc == 0)
        *loss_out = zd_tensor_data(loss)[0];
    zd_value_unref(grads);
    zd_tensor_unref(loss);
    zd_tensor_unref(out);
    /* The peers free the context while the next batch starts. */
    if (zd_dist_autograd_context_release(cid) < 0 && rc == 0)
        rc = -1;
    return rc;
}

static int evaluate(zd_rref_t *ps, const zd_dataset_t *test, int64_t limit, double *acc)
{
    int64_t n = zd_dataset_len(test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    for (int64_t start = 0; start < n; start += EVAL_BATCH) {
        zd_tensor_t *x, *y, *out;
        int64_t bs = n - start < EVAL_BATCH ? n - start : EVAL_BATCH;
        if (zd_dataset_batch(test, NULL, start, bs, &x, &y) < 0)
            return -1;
        int rc = call_tensor(ps, "ps_forward", ZD_ARGS(x, 0), &out);
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

/*  --max_staleness: waits until this trainer, with `done` batches, is at
    most K batches ahead of the slowest trainer still training (the server
    answers; finished and lost trainers do not count). Bounded by the RPC
    timeout: past it the trainer says so and goes on. */
static int staleness_gate(zd_rref_t *ps, const options_t *o, int64_t done)
{
    zd_value_t *a = ZD_ARGS(done, o->max_staleness), *r = NULL;
    int rc = a ? zd_rref_rpc_sync(ps, "ps_staleness_gate", a, ZD_TIMEOUT_DEFAULT, &r) : -1;
    zd_value_unref(a);
    zd_value_unref(r);
    if (rc < 0 && zd_error_code() == ZD_ERR_TIMEOUT) {
        fprintf(stderr,
                "rpc_ps trainer %lld: waited the RPC timeout for the slowest trainer "
                "(--max_staleness=%lld); going on\n",
                (long long)o->world.rank, (long long)o->max_staleness);
        return 0;
    }
    return rc;
}

/*  Times each rank rejoined the world (zd_rpc_register_peer_joined): a
    trainer whose server shard came back before it noticed the loss sees
    the count change. */
static atomic_int rank_joins[MAX_SERVERS];

static void peer_joined(void *arg, int rank, const char *name)
{
    (void)arg, (void)name;
    if (rank >= 0 && rank < MAX_SERVERS)
        atomic_fetch_add(&rank_joins[rank], 1);
}

/*  What a trainer holds of the servers: an RRef to the server, RRefs to
    the parameters, and the DistributedOptimizer over them; and the shards'
    join counts when it took them. */
typedef struct {
    zd_rref_t *ps;
    zd_value_t *param_list;
    zd_dist_optim_t *opt;
    int joins[MAX_SERVERS];
} server_t;

static void server_detach(server_t *s)
{
    zd_dist_optim_free(s->opt);
    zd_value_unref(s->param_list);
    zd_rref_unref(s->ps);
    memset(s, 0, sizeof *s);
}

/*  Takes what a trainer needs of the servers (at its start, and again
    when a server shard came back: what the old process owned is gone)
    and tells shard 0 that it trains. 0, or -1 with nothing held. */
static int server_attach(const options_t *o, server_t *s)
{
    memset(s, 0, sizeof *s);
    for (int i = 0; i < MAX_SERVERS; i++)
        s->joins[i] = atomic_load(&rank_joins[i]);
    zd_rref_list_t *params = NULL;
    if (!(s->ps = zd_rpc_remote(0, "get_parameter_server", NULL, ZD_TIMEOUT_DEFAULT)) ||
        zd_rref_rpc_sync(s->ps, "ps_get_param_rrefs", NULL, ZD_TIMEOUT_DEFAULT, &s->param_list) < 0)
        goto fail;
    int n = (int)zd_list_len(s->param_list);
    if (n > MAX_PARAM_RREFS) {
        zd_error_set("the server offers %d parameter RRefs; a trainer takes at most %d", n,
                     MAX_PARAM_RREFS);
        goto fail;
    }
    if (!(params = zd_rref_list_new()))
        goto fail;
    for (int i = 0; i < n; i++) {
        zd_rref_t *r;
        if (zd_rpc_arg_rref(s->param_list, (size_t)i, &r) < 0 || zd_rref_list_append(params, r) < 0)
            goto fail;
    }
    zd_optim_config_t cfg = zd_optim_sgd_defaults(o->lr);
    if (!(s->opt = zd_dist_optim_new(&cfg, params)) ||
        call_none(s->ps, "ps_trainer_started", ZD_ARGS()) < 0)
        goto fail;
    zd_rref_list_free(params);
    return 0;
fail:
    zd_rref_list_free(params);
    server_detach(s);
    return -1;
}

/*  Where trainer `trainer` was at the last checkpoint (shard 0 keeps it):
    its batches done, at most `most`. 0, or -1. */
static int server_resume_point(const options_t *o, server_t *s, int trainer, int64_t most,
                               int64_t *start)
{
    zd_value_t *r = NULL, *a = ZD_ARGS(trainer);
    int rc = a ? zd_rref_rpc_sync(s->ps, "ps_resume_point", a, ZD_TIMEOUT_DEFAULT, &r) : -1;
    if (rc == 0)
        rc = zd_value_get_int(r, start);
    zd_value_unref(a);
    zd_value_unref(r);
    if (rc == 0 && (*start < 0 || *start > most))
        rc = zd_error_set("checkpoint %s: trainer %d had done %lld batches, outside 0 to %lld "
                          "(%lld epoch(s))",
                          o->checkpoint, trainer, (long long)*start, (long long)most,
                          (long long)o->epochs);
    return rc;
}

/*  A call to the servers failed. With --checkpoint, when a server shard
    was lost (or came back since the trainer took its RRefs), waits up to
    --server_wait_s for every shard to be a member again, takes what it
    needs of the servers anew (what the old process owned is gone) and
    sets *start to this trainer's checkpointed position: returns 1. 0:
    no server went away (the error is the call's, for the caller to
    report); -1: a shard did not come back (the error names it). */
static int server_came_back(const options_t *o, server_t *srv, int trainer, int64_t done,
                            int64_t most, int64_t *start)
{
    if (!o->checkpoint)
        return 0;
    char why[512];
    snprintf(why, sizeof why, "%s", zd_error_last());
    /* RPC declares a peer lost about 1 s after its connection dropped:
       wait that long for the verdict. */
    int shard = -1;
    for (double until = train_now() + 5; shard < 0;) {
        for (int s = 0; s < o->num_servers && shard < 0; s++)
            if (zd_rpc_peer_is_lost(s) || atomic_load(&rank_joins[s]) != srv->joins[s])
                shard = s;
        if (shard >= 0 || train_now() >= until)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    if (shard < 0) {
        zd_error_set("%s", why);
        return 0;
    }
    double t0 = train_now();
    printf("Rank %lld: server shard %d lost at batch %lld (%s); waiting up to %lld s "
           "(--server_wait_s) for it to come back\n",
           (long long)o->world.rank, shard, (long long)done, why, (long long)o->server_wait_s);
    fflush(stdout);
    /* What the old process owned is gone: let go of it while it is lost,
       and of the releases of contexts it held (they fail: it is gone), so
       that their failures do not stop the batches that follow. */
    server_detach(srv);
    if (zd_dist_autograd_wait_releases(1000) < 0)
        printf("Rank %lld: contexts of the lost server's process not released: %s\n",
               (long long)o->world.rank, zd_error_last());
    for (int s = 0; s < o->num_servers; s++) {
        int64_t left = (int64_t)((t0 + (double)o->server_wait_s - train_now()) * 1000);
        if (zd_rpc_wait_peer(s, left > 0 ? left : 1) < 0)
            return zd_error_set("server shard %d (rank %d) lost (%s) and not back within "
                                "--server_wait_s=%lld s: %s",
                                s, s, why, (long long)o->server_wait_s, zd_error_last());
    }
    /* Just back, a shard may not take calls from everyone yet (its new
       connections are being made): try again until the wait is up. */
    while (server_attach(o, srv) < 0 || server_resume_point(o, srv, trainer, most, start) < 0) {
        server_detach(srv);
        if (train_now() - t0 > (double)o->server_wait_s)
            return zd_error_wrap("server shard %d came back, but", shard);
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    printf("Rank %lld: the servers are back after %.2f s; going on from batch %lld (the last "
           "checkpoint; %lld batch(es) of this trainer to take again)\n",
           (long long)o->world.rank, train_now() - t0, (long long)*start,
           (long long)(done - *start));
    fflush(stdout);
    return 1;
}

/*  Tells shard 0 that this trainer's run failed, and why: the servers stop
    waiting for it (with --checkpoint rank 0 waits for every trainer to
    finish before its shutdown), name it with its error, and the world ends
    once the others are done, instead of waiting for a trainer that will
    never finish (issue 24 point 7). Best effort, within the RPC timeout: a
    server that is gone learns nothing, and the trainer fails all the same.
    The error stays set. */
static void report_failure(const options_t *o, int64_t done)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", zd_error_last());
    if (zd_rpc_peer_is_lost(0))
        return;
    zd_value_t *a = ZD_ARGS(done, why), *r = NULL;
    if (!a || zd_rpc_sync(0, "ps_trainer_failed", a, ZD_TIMEOUT_DEFAULT, &r) < 0)
        fprintf(stderr,
                "rpc_ps trainer %lld: could not tell the server that this run failed: "
                "%s\n",
                (long long)o->world.rank, zd_error_last());
    zd_value_unref(a);
    zd_value_unref(r);
    zd_error_set("%s", why);
}

static int run_trainer(const options_t *o)
{
    char dir[1024];
    zd_dataset_t *train = NULL, *test = NULL;
    server_t srv = {0};
    int64_t *order = NULL, done = 0, trained = 0; /* position; batches trained here */
    float first_loss = 0;
    int trainer = (int)(o->world.rank - o->num_servers), rc = -1;
    double t0 = 0, t1 = 0, eval_secs = 0;
    curves_t *curves = NULL;

    if (o->data_dir)
        snprintf(dir, sizeof dir, "%s", o->data_dir);
    else if (zd_dataset_find_dir(dir, sizeof dir) < 0)
        goto out;
    if (!(train = zd_dataset_load(dir, ZD_DATASET_TRAIN)) ||
        !(test = zd_dataset_load(dir, ZD_DATASET_TEST)))
        goto out;
    if (server_attach(o, &srv) < 0)
        goto out;
    int64_t start = 0, nb = zd_dataset_num_batches(train, o->batch_size);
    if (o->curves) {
        char prefix[4096], title[64];
        if (snprintf(prefix, sizeof prefix, "%s.rank%lld", o->curves, (long long)o->world.rank) >=
            (int)sizeof prefix) {
            zd_error_set("--curves: prefix too long");
            goto out;
        }
        snprintf(title, sizeof title, "rpc_ps rank %lld", (long long)o->world.rank);
        if (!(curves = curves_open(prefix, title, nb)))
            goto out;
    }
    /* A trainer restarted into the running world (it rejoined) goes on
       as one started with --resume: from its last checkpointed position,
       or from its first batch without checkpoints. */
    bool rejoined = zd_rpc_rejoined();
    if (rejoined && !o->checkpoint)
        printf("Rank %lld rejoined the world; without --checkpoint it starts from its first "
               "batch\n",
               (long long)o->world.rank);
    if (o->checkpoint && (o->resume || rejoined)) {
        /* Where this trainer was at the last checkpoint: the same batches
           in the same order follow (the order depends on seed and epoch). */
        if (server_resume_point(o, &srv, trainer, o->epochs * nb, &start) < 0)
            goto out;
        printf("Rank %lld %s at batch %lld (%lld batches done)\n", (long long)o->world.rank,
               rejoined ? "rejoined the world; resuming" : "resuming", (long long)start,
               (long long)start);
        done = start;
    }
    t0 = train_now();
    int64_t first_epoch, first_batch, total = o->epochs * nb;
    if (o->max_batches > 0 && o->max_batches < total)
        total = o->max_batches;
    char label[32];
    snprintf(label, sizeof label, "Rank %lld", (long long)o->world.rank);
    progress_t prog;
    progress_init(&prog, stdout, isatty(STDOUT_FILENO),
                  &(progress_config_t){.label = label,
                                       .first = start,
                                       .total = total,
                                       .per_epoch = nb,
                                       .epochs = o->epochs,
                                       .samples_per_step = o->batch_size,
                                       .every_s = o->progress_s},
                  t0);
    /* a curve point every --log_interval batches, or 10 without loss lines */
    curves_points_t points;
    curves_points_init(&points, o->log_interval > 0 ? o->log_interval : 10, t0);
again: /* from `start`, after a server shard came back */
    train_resume_position(start, nb, &first_epoch, &first_batch);
    for (int64_t epoch = first_epoch; epoch < o->epochs; epoch++) {
        free(order);
        /* The first trainer shuffles as train_local does with the same seed. */
        if (!(order = zd_dataset_order(train, (uint64_t)(o->seed + epoch + 1000 * trainer)))) {
            zd_error_set("out of memory");
            goto out;
        }
        int64_t first = epoch == first_epoch ? first_batch : 0;
        for (int64_t b = first; b < nb && (o->max_batches <= 0 || done < o->max_batches); b++) {
            zd_tensor_t *x, *y;
            float loss = 0;
            if (o->max_staleness > 0 && staleness_gate(srv.ps, o, done) < 0) {
                if (server_came_back(o, &srv, trainer, done, o->epochs * nb, &start) != 1)
                    goto out;
                done = start;
                goto again;
            }
            if (zd_dataset_batch(train, order, b * o->batch_size, o->batch_size, &x, &y) < 0)
                goto out;
            bool check = o->check_interval > 0 && done % o->check_interval == 0;
            int brc = train_batch(srv.ps, srv.opt, x, y, check, &loss);
            zd_tensor_unref(x);
            zd_tensor_unref(y);
            if (brc < 0 && !isfinite(loss)) {
                progress_clear(&prog);
                zd_error_set("batch %lld (epoch %lld): the loss is %g: the model diverged, and "
                             "this batch's gradients were not applied. Remedies: a lower --lr "
                             "(now %g), or fewer trainers per server (their updates arrive "
                             "stale)",
                             (long long)done + 1, (long long)epoch + 1, (double)loss, o->lr);
            }
            if (brc < 0 && isfinite(loss)) {
                int back = server_came_back(o, &srv, trainer, done, o->epochs * nb, &start);
                progress_clear(&prog);
                if (back != 1)
                    goto out;
                done = start;
                goto again;
            }
            if (brc < 0)
                goto out;
            done++;
            if (++trained == 1)
                first_loss = loss;
            if (loss_exploded(o, done, epoch, first_loss, loss)) {
                progress_clear(&prog);
                goto out;
            }
            double now = train_now();
            progress_step(&prog, now, loss);
            if (o->log_interval > 0 && b % o->log_interval == 0) {
                /* the tutorial's line (its batch restarts each epoch) */
                progress_clear(&prog);
                printf("Rank %lld training batch %lld loss %.6f (epoch %lld)\n",
                       (long long)o->world.rank, (long long)b, loss, (long long)epoch + 1);
            }
            if (curves_batch(curves, &points, done, loss, o->batch_size, now) < 0)
                goto out;
            /* (the last batch's evaluation is the final one, below) */
            if (o->eval_every > 0 && done % o->eval_every == 0 && done < total) {
                /* this trainer's own look at the weights as they are now,
                   while the other trainers go on */
                double acc;
                if (evaluate(srv.ps, test, o->eval_samples, &acc) < 0)
                    goto out;
                progress_clear(&prog);
                printf("Rank %lld after batch %lld (epoch %lld): accuracy %.2f %%\n",
                       (long long)o->world.rank, (long long)done, (long long)epoch + 1, 100 * acc);
                if (curves && curves_add_accuracy(curves, done, acc) < 0)
                    goto out;
                double after = train_now();
                eval_secs += after - now;
                curves_points_skip(&points, after - now); /* the training's rate */
                progress_skip(&prog, after - now);
            }
            if (o->checkpoint && done % o->checkpoint_every == 0)
                fault_point(o->world.rank, "checkpoint");
            if (o->checkpoint && done % o->checkpoint_every == 0 &&
                call_none(srv.ps, "ps_checkpoint", ZD_ARGS(trainer, done)) < 0) {
                if (server_came_back(o, &srv, trainer, done, o->epochs * nb, &start) != 1)
                    goto out;
                done = start;
                goto again;
            }
        }
    }
    t1 = train_now();
    progress_end(&prog, t1);
    if (zd_dist_autograd_wait_releases(-1) < 0)
        goto out;
    if (call_none(srv.ps, "ps_trainer_finished", ZD_ARGS(trained * o->batch_size)) < 0) {
        if (server_came_back(o, &srv, trainer, done, o->epochs * nb, &start) != 1)
            goto out;
        done = start;
        goto again;
    }
    printf("Training complete!\nGetting accuracy....\n");
    fault_point(o->world.rank, "evaluation");
    /* Trainers share one evaluation of the final weights on the server
       (it answers when the last trainer is done); one that waits longer
       than the RPC timeout evaluates by itself. */
    double acc;
    zd_value_t *a = ZD_ARGS(o->eval_samples), *r = NULL;
    int erc = a ? zd_rref_rpc_sync(srv.ps, "ps_evaluate", a, ZD_TIMEOUT_DEFAULT, &r) : -1;
    if (erc == 0)
        erc = zd_value_get_float(r, &acc);
    zd_value_unref(a);
    zd_value_unref(r);
    if (erc < 0) {
        fprintf(stderr, "rpc_ps trainer %lld: shared evaluation failed (%s); evaluating alone\n",
                (long long)o->world.rank, zd_error_last());
        if (evaluate(srv.ps, test, o->eval_samples, &acc) < 0)
            goto out;
    }
    printf("Rank %lld test accuracy %.2f %%\n", (long long)o->world.rank, 100 * acc);
    printf("Rank %lld throughput %.0f samples/s\n", (long long)o->world.rank,
           (double)(trained * o->batch_size) / (t1 - t0 - eval_secs));
    if (curves) {
        if (curves_add_accuracy(curves, done, acc) < 0)
            goto out;
        printf("Rank %lld curves in %s.rank%lld.csv and %s\n", (long long)o->world.rank, o->curves,
               (long long)o->world.rank, curves_png_path(curves));
    }
    rc = 0;
out:
    if (rc < 0) {
        fprintf(stderr, "rpc_ps trainer %lld: %s\n", (long long)o->world.rank, zd_error_last());
        report_failure(o, done);
    }
    if (rc < 0 && curves) /* the plot of what there is */
        curves_draw(curves);
    free(order);
    curves_close(curves);
    server_detach(&srv);
    zd_dataset_free(train);
    zd_dataset_free(test);
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
    if (o->num_servers > MAX_SERVERS) {
        fprintf(stderr, "rpc_ps: --num_servers=%lld: at most %d shards\n",
                (long long)o->num_servers, MAX_SERVERS);
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
    fault_point(rank, "rendezvous");
    /* With checkpoints a lost rank 0 may come back: the others keep
       registering with the rendezvous address while trainers wait for it
       (set for every rank: rank 0 hands it to its members). */
    char wait_s[32];
    snprintf(wait_s, sizeof wait_s, "%lld", (long long)o.server_wait_s);
    if (o.checkpoint && !getenv("ZDIST_MASTER_WAIT_S") &&
        setenv("ZDIST_MASTER_WAIT_S", wait_s, 1) < 0)
        goto fail;
    if (!server && zd_rpc_register_peer_joined(peer_joined, NULL) < 0)
        goto fail;
    if (flags_world_init(&o.world, name, o.init_timeout_s * 1000, "rpc_ps") < 0)
        return 1;
    if (server)
        printf("RPC initialized! Running parameter server...\n");
    int rc = server ? 0 : run_trainer(&o);
    if (server && rank == 0 && o.checkpoint)
        ps_net_wait_trainers((double)o.server_wait_s);
    fflush(stdout);
    fault_point(rank, "shutdown");
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
