/* SPDX-License-Identifier: MIT */
/*  rpc_ps_server.c: rpc_ps's server ranks (rpc_ps.h), the tutorial's
    ParameterServer: a stage of the Net served by the layer's remote model
    (zd_ps_model_server_new), and on rank 0 the book of the run: the
    trainers' registry, their shared final evaluation on the Net gathered
    from every shard, --save_model, and the report at the end. */
#include "examples/rpc_ps.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/zdist.h>

#include "examples/ps_stages.h"

/*  Rank 0's book of the run: the trainers' registry and --save_model's
    outcome (0: not written, 1: written, -1: failed, save_error says why). */
static struct {
    const rpc_ps_options_t *o;
    zd_ps_trainers_t *trainers;
    pthread_mutex_t lock; /* the final evaluation's */
    int saved;
    char save_error[1024];
} book = {.lock = PTHREAD_MUTEX_INITIALIZER};

/*  Every training forward through stage 0 is one batch of its trainer:
    the registry's count ("lost at batch N") and the aggregate throughput. */
static void note_forward(void *arg, int shard, int caller, bool training, zd_tensor_t *const *in,
                         int n_in)
{
    (void)arg, (void)shard;
    if (training && n_in > 0)
        zd_ps_trainers_note_batch(book.trainers, caller, zd_tensor_size(in[0], 0));
}

static void save_model(zd_nn_module_t *net, int64_t step, double acc, int64_t images)
{
    const rpc_ps_options_t *o = book.o;
    char s_step[32], s_acc[32], s_images[32];
    snprintf(s_step, sizeof s_step, "%lld", (long long)step);
    snprintf(s_acc, sizeof s_acc, "%.6f", acc);
    snprintf(s_images, sizeof s_images, "%lld", (long long)images);
    const char *meta[] = {"format",        "pt",  "step",        s_step,
                          "test_accuracy", s_acc, "test_images", s_images};
    zd_strings_t *kv = zd_strings_from(meta, 8);
    if (kv && zd_nn_module_save_safetensors(net, o->save_model, kv) == 0) {
        book.saved = 1;
        printf("saved model %s (safetensors, PyTorch's names; step %lld, test accuracy %.2f %% "
               "on %lld images)\n",
               o->save_model, (long long)step, 100 * acc, (long long)images);
    } else {
        book.saved = -1;
        snprintf(book.save_error, sizeof book.save_error, "%s", zd_error_last());
    }
    zd_strings_free(kv);
}

/*  The result every trainer's last call shares, once each finished,
    failed or was lost: the final weights' accuracy on `request` test
    images, gathered from every shard onto this one (and saved there with
    --save_model before the trainers hear it). */
static zd_value_t *shared_accuracy(void *arg, const zd_value_t *request)
{
    (void)arg;
    const rpc_ps_options_t *o = book.o;
    int64_t limit, step = 0, images = 0; /* step: training batches served */
    if (zd_value_get_int(request, &limit) < 0)
        return NULL;
    /* one at a time: a trainer that asks again may start another while
       one runs, and both would write the file */
    pthread_mutex_lock(&book.lock);
    zd_ps_trainer_info_t info;
    for (int r = (int)o->num_servers; zd_ps_trainers_get(book.trainers, r, &info) == 0; r++)
        step += info.batches;
    zd_dataset_t *test = zd_dataset_load(o->data_dir, ZD_DATASET_TEST);
    zd_nn_module_t *net = test ? ps_stages_gather((int)o->num_servers, (uint64_t)o->seed) : NULL;
    double acc = 0;
    int rc = net ? ps_stages_evaluate(net, test, limit, &acc, &images) : -1;
    if (rc == 0 && o->save_model)
        save_model(net, step, acc, images);
    zd_nn_module_free(net);
    zd_dataset_free(test);
    pthread_mutex_unlock(&book.lock);
    if (rc < 0) {
        zd_error_wrap("evaluation failed");
        return NULL;
    }
    return zd_value_float(acc);
}

int rpc_ps_shared_accuracy(const rpc_ps_options_t *o, double *acc)
{
    zd_value_t *req = zd_value_int(o->eval_samples), *res = NULL;
    int rc = req ? zd_ps_trainer_wait_all(0, req, ZD_TIMEOUT_DEFAULT, &res) : -1;
    if (rc == 0)
        rc = zd_value_get_float(res, acc);
    zd_value_unref(req);
    zd_value_unref(res);
    return rc;
}

/*  The registry's news, on this server's terminal. */
static void on_trainer(void *arg, const zd_ps_trainer_info_t *t, const char *name,
                       zd_ps_trainer_event_t event)
{
    (void)arg;
    if (event == ZD_PS_TRAINER_FAILED)
        printf("trainer \"%s\" (rank %d) failed at batch %lld: %s\n", name, t->rank,
               (long long)t->failed_at, t->why);
    else if (event == ZD_PS_TRAINER_LOST)
        printf("trainer \"%s\" (rank %d) lost at batch %lld%s; the others go on\n", name, t->rank,
               (long long)t->batches, t->finished ? ", having finished" : "");
    else if (event == ZD_PS_TRAINER_REJOINED)
        printf("trainer \"%s\" (rank %d), lost at batch %lld, rejoined; counted again\n", name,
               t->rank, (long long)t->batches);
    fflush(stdout);
}

/*  After the world ended, on rank 0: each trainer that failed or was
    lost, the throughput, and whether enough finished. 0, or -1. */
static int report(const rpc_ps_options_t *o, const char *name)
{
    int64_t samples;
    double secs;
    zd_ps_trainers_throughput(book.trainers, &samples, &secs);
    if (secs > 0)
        printf("aggregate throughput %.0f samples/s (%lld samples in %.2f s)\n",
               (double)samples / secs, (long long)samples, secs);
    int finished = 0, failed = 0, rc = 0;
    char first[600] = "";
    zd_ps_trainer_info_t t;
    for (int r = (int)o->num_servers; zd_ps_trainers_get(book.trainers, r, &t) == 0; r++) {
        finished += t.finished;
        if (t.failed && failed++ == 0)
            snprintf(first, sizeof first, "; trainer rank %d failed at batch %lld: %s", r,
                     (long long)t.failed_at, t.why);
        if (t.failed)
            printf("trainer rank %d failed at batch %lld: %s\n", r, (long long)t.failed_at, t.why);
        else if (t.lost)
            printf("trainer rank %d was lost at batch %lld%s\n", r, (long long)t.batches,
                   t.finished ? " (after finishing its batches)" : "");
        else if (t.rejoined)
            printf("trainer rank %d was lost and rejoined%s\n", r,
                   t.finished ? "; it finished its batches" : "");
    }
    printf("%d of %lld trainers finished\n", finished,
           (long long)(o->world.world_size - o->num_servers));
    if (finished < o->min_trainers) {
        fprintf(stderr, "rpc_ps %s: only %d trainer(s) finished, fewer than --min_trainers=%lld%s",
                name, finished, (long long)o->min_trainers, first);
        if (failed > 1)
            fprintf(stderr, " (and %d more failed)", failed - 1);
        fprintf(stderr, "\n");
        rc = -1;
    }
    if (o->save_model && book.saved != 1) {
        fprintf(stderr, "rpc_ps %s: --save_model=%s: not written: %s\n", name, o->save_model,
                book.saved < 0 ? book.save_error
                               : "no final evaluation ran on the server (no trainer finished "
                                 "its batches)");
        rc = -1;
    }
    return rc;
}

/*  The largest batch a stage takes (--max_batch_size; 0: 4 batches, at
    least 1024): a peer cannot make the server allocate without bound. */
static int64_t max_batch(const rpc_ps_options_t *o)
{
    if (o->max_batch_size > 0)
        return o->max_batch_size;
    return 4 * o->batch_size > 1024 ? 4 * o->batch_size : 1024;
}

/*  This shard's stage of the Net, built from the seed (or --init_from)
    as on every shard. A new module, or NULL. */
static zd_nn_module_t *server_stage(const rpc_ps_options_t *o, int shard)
{
    zd_nn_module_t *net = zd_nn_net_new((uint64_t)o->seed), *stage = NULL;
    int rc = net ? 0 : -1;
    if (rc == 0 && o->init_from &&
        (rc = zd_nn_module_load_safetensors(net, o->init_from, true, NULL)) < 0)
        zd_error_wrap("--init_from");
    else if (rc == 0 && o->init_from)
        printf("parameter server shard %d: initial weights from %s\n", shard, o->init_from);
    if (rc == 0)
        stage = ps_stage_new(net, shard, (int)o->num_servers, max_batch(o), (uint64_t)o->seed,
                             !o->no_dropout);
    zd_nn_module_free(net);
    char line[512];
    if (stage)
        printf("parameter server shard %d of %lld: %s\n", shard, (long long)o->num_servers,
               ps_stage_describe(stage, line, sizeof line));
    return stage;
}

/*  The stage's options: rpc_ps's defaults and flags. */
static zd_ps_options_t server_options(const rpc_ps_options_t *o, int shard, const char *tag)
{
    zd_ps_options_t po = zd_ps_options_default();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    po.stage_outputs = ps_stage_outputs(shard, (int)o->num_servers);
    po.max_input_numel = ps_stage_max_input(shard, max_batch(o));
    /* rpc_ps's 0 is 2 per core and -1 none; the layer's 0 is none */
    po.max_inflight = o->max_inflight < 0 ? 0
        : o->max_inflight == 0            ? 2 * (int)(cores < 1 ? 1 : cores)
                                          : (int)o->max_inflight;
    po.checkpoint_path = o->checkpoint;
    po.resume = o->resume;
    po.run_tag = tag;
    po.stage_locks_reads = true; /* (ps_stages.c) */
    if (shard == 0)
        po.on_forward = note_forward;
    return po;
}

/*  With --resume, shard's file or its .prev must be there: resuming
    from nothing would be a new run under the operator's nose. 0, or -1. */
static int check_resume_file(const rpc_ps_options_t *o, int shard)
{
    char path[4200];
    if (!o->resume)
        return 0;
    snprintf(path, sizeof path, "%s.shard%d", o->checkpoint, shard);
    if (access(path, R_OK) == 0)
        return 0;
    int err = errno;
    snprintf(path, sizeof path, "%s.shard%d.prev", o->checkpoint, shard);
    if (access(path, R_OK) == 0)
        return 0;
    return zd_error_set("--resume: no checkpoint %s.shard%d to resume from (%s)", o->checkpoint,
                        shard, strerror(err));
}

/*  The stage served, with the servers' optimizer limits and functions,
    and on rank 0 the trainers' book. 0, or -1. */
static int serve(const rpc_ps_options_t *o, zd_nn_module_t *stage, const char *tag,
                 zd_ps_model_server_t **srv)
{
    int shard = (int)o->world.rank;
    zd_ps_options_t po = server_options(o, shard, tag);
    if (check_resume_file(o, shard) < 0 ||
        !(*srv = zd_ps_model_server_new(stage, shard, (int)o->num_servers, &po)))
        return -1;
    if (o->resume)
        printf("parameter server shard %d: resumed from %s.shard%d at version %lld\n", shard,
               o->checkpoint, shard, (long long)zd_ps_model_server_version(*srv));
    /* The servers take only their own optimizer (this --lr): a trainer
       started with another is refused by name, instead of its steps
       ruining the weights every trainer shares. */
    zd_optim_config_t sgd = zd_optim_sgd_defaults(o->lr);
    zd_dist_optim_owner_limits_t limits = zd_dist_optim_owner_limits_default();
    limits.config = &sgd;
    if (zd_dist_optim_set_owner_limits(&limits) < 0 || ps_stages_register(*srv, stage) < 0)
        return -1;
    zd_ps_trainers_options_t to = zd_ps_trainers_options_default();
    to.first_trainer = (int)o->num_servers;
    to.on_event = on_trainer;
    to.shared_result = shared_accuracy;
    book.o = o;
    if (shard == 0 && !(book.trainers = zd_ps_trainers_new(&to)))
        return -1;
    return 0;
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

int rpc_ps_serve(const rpc_ps_options_t *o)
{
    const char *name = o->name;
    int shard = (int)o->world.rank, rc = -1;
    server_arenas();
    char tag[160];
    snprintf(tag, sizeof tag, "--batch_size=%lld --seed=%lld, %lld trainer(s)",
             (long long)o->batch_size, (long long)o->seed,
             (long long)(o->world.world_size - o->num_servers));
    zd_nn_module_t *stage = server_stage(o, shard);
    zd_ps_model_server_t *srv = NULL;
    if (!stage || serve(o, stage, tag, &srv) < 0) {
        fprintf(stderr, "rpc_ps %s: %s\n", name, zd_error_last());
    } else {
        printf("PS master initializing RPC\n");
        rc = rpc_ps_join(o);
    }
    if (rc == 0) {
        printf("RPC initialized! Running parameter server...\n");
        fflush(stdout);
        /* A graceful shutdown stops taking back restarted processes: with
           checkpoints, rank 0 first waits for every trainer, lost ones for
           --server_wait_s to come back. */
        if (shard == 0 && o->checkpoint)
            zd_ps_trainers_wait(book.trainers, o->server_wait_s * 1000, ZD_TIMEOUT_NONE);
        if ((rc = zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT)) < 0)
            fprintf(stderr, "rpc_ps %s: shutdown: %s\n", name, zd_error_last());
        if (shard == 0 && report(o, name) < 0)
            rc = -1;
    }
    zd_ps_trainers_free(book.trainers);
    zd_ps_model_server_free(srv);
    zd_nn_module_free(stage);
    return rc;
}
