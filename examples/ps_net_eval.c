/* SPDX-License-Identifier: MIT */
/*  ps_net_eval.c: shard 0's book-keeping of the trainers (start, finish,
    samples: the aggregate throughput) and the final evaluation they all
    share. */
#include "examples/fault.h"
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"
#include "examples/train_common.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>

/*  What a failed trainer said of its failure, at most this long. */
#define WHY_MAX 400

/*  Shard 0: throughput book-keeping and the shared final evaluation. */
static struct {
    pthread_mutex_t stats_lock;
    int started, finished;
    double first_start, last_finish; /* train_now() */
    double last_batch;               /* train_now() of the last training forward */
    int64_t samples;                 /* of every training forward, lost trainers' too */
    char data_dir[1024];
    zd_future_t *waiting[64]; /* evaluations waiting for the last trainer */
    int n_waiting;
    int64_t eval_samples;
    /* Per rank (allocated at the first call, world-sized): what shard 0
       knows of each trainer: TR_* flags, training forwards (its batch),
       and the gates of --max_staleness parked until the slowest catches
       up. */
    int world;
    unsigned char *state;
    int64_t *batches, *progress;
    zd_future_t **gate;
    int64_t *gate_done, *gate_bound;
    double *lost_at;        /* train_now() when each was lost */
    char (*why)[WHY_MAX];   /* why each failed trainer failed (TR_FAILED) */
    int64_t *failed_at;     /* the batch it was at, by its own count */
    pthread_cond_t changed; /* a trainer finished, failed, was lost or came back */
} ev = {.stats_lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

/*  TR_FAILED: the trainer's run failed and it said so (ps_trainer_failed):
    nobody waits for it any more, as for a finished one, but it does not
    count as finished. */
enum { TR_FINISHED = 1, TR_LOST = 2, TR_WAITING = 4, TR_REJOINED = 8, TR_FAILED = 16 };

/*  Under stats_lock: the per-rank tables, made at first use. false (error
    set) when out of memory or rank is outside the world. */
static bool tables_ready(int rank)
{
    if (!ev.state) {
        int w = zd_rpc_world_size();
        if (w < 1)
            return zd_error_set("RPC is not running"), false;
        ev.state = calloc((size_t)w, 1);
        ev.batches = calloc((size_t)w, sizeof *ev.batches);
        ev.progress = calloc((size_t)w, sizeof *ev.progress);
        ev.gate = calloc((size_t)w, sizeof *ev.gate);
        ev.gate_done = calloc((size_t)w, sizeof *ev.gate_done);
        ev.gate_bound = calloc((size_t)w, sizeof *ev.gate_bound);
        ev.lost_at = calloc((size_t)w, sizeof *ev.lost_at);
        ev.why = calloc((size_t)w, sizeof *ev.why);
        ev.failed_at = calloc((size_t)w, sizeof *ev.failed_at);
        if (!ev.state || !ev.batches || !ev.progress || !ev.gate || !ev.gate_done ||
            !ev.gate_bound || !ev.lost_at || !ev.why || !ev.failed_at) {
            free(ev.state), free(ev.batches), free(ev.progress), free(ev.gate);
            free(ev.gate_done), free(ev.gate_bound), free(ev.lost_at);
            free(ev.why), free(ev.failed_at);
            ev.state = NULL;
            return zd_error_set("out of memory"), false;
        }
        ev.world = w;
    }
    if (rank < ps_shard.num_shards || rank >= ev.world)
        return zd_error_set("rank %d is not a trainer", rank), false;
    return true;
}

/*  Test images per forward. The activations of a forward are what the
    evaluation holds, per thread: 1000 images made conv1's output alone
    86 MB, the server's peak at the end of every run; 128 keep the layers'
    matrix products as fast. */
#define EVAL_CHUNK 128

/*  One evaluation thread's share of the test set. */
typedef struct {
    const zd_dataset_t *test;
    int64_t start, end, correct;
    int rc;
    char error[256];
} eval_part_t;

static void *evaluate_part(void *arg)
{
    eval_part_t *e = arg;
    bool prev = zd_autograd_set_grad_enabled(false);
    for (int64_t at = e->start; at < e->end && e->rc == 0; at += EVAL_CHUNK) {
        zd_tensor_t *x, *y, *out = NULL;
        int64_t n = e->end - at < EVAL_CHUNK ? e->end - at : EVAL_CHUNK;
        e->rc = zd_dataset_batch(e->test, NULL, at, n, &x, &y);
        if (e->rc == 0 && (e->rc = ps_net_forward(x, false, &out)) == 0) {
            int64_t c = zd_nn_accuracy(out, y);
            e->rc = c < 0 ? -1 : 0;
            e->correct += c;
        }
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_autograd_set_grad_enabled(prev);
    if (e->rc < 0)
        snprintf(e->error, sizeof e->error, "%s", zd_error_last());
    return NULL;
}

/*  Accuracy of the current weights on the first `limit` test images (0: all),
    in evaluation mode, split over the cores: with several trainers the
    layers run on one thread per pass, and the evaluation is one pass. */
static int evaluate(int64_t limit, double *acc, int64_t *images)
{
    const char *dir = ev.data_dir[0] ? ev.data_dir : NULL;
    zd_dataset_t *test = zd_dataset_load(dir, ZD_DATASET_TEST);
    if (!test)
        return -1;
    int64_t n = zd_dataset_len(test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = zd_nn_get_num_threads() > 1 || cores < 2 ? 1 : cores > 8 ? 8 : (int)cores;
    eval_part_t e[8];
    pthread_t th[8];
    bool started[8] = {false};
    int rc = 0;
    for (int i = 0; i < parts; i++) {
        e[i] = (eval_part_t){test, n * i / parts, n * (i + 1) / parts, 0, 0, ""};
        if (i > 0)
            started[i] = pthread_create(&th[i], NULL, evaluate_part, &e[i]) == 0;
        if (i > 0 && !started[i])
            evaluate_part(&e[i]); /* no thread: do it here */
    }
    evaluate_part(&e[0]);
    for (int i = 1; i < parts; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    for (int i = 0; i < parts; i++) {
        if (e[i].rc < 0 && rc == 0)
            rc = zd_error_set("%s", e[i].error);
        correct += e[i].correct;
    }
    zd_dataset_free(test);
    *acc = n ? (double)correct / (double)n : 0;
    *images = n;
    return rc;
}

/*  Answers every waiting evaluation once the last trainer has finished:
    all trainers then share one evaluation of the final weights. Called with
    stats_lock held; the evaluation itself runs outside it. */
static void finish_evaluations(void)
{
    /* Every trainer is either waiting here, lost or failed: a dead or
       failed trainer does not hold up the survivors' evaluation. */
    if (!ev.state || ev.n_waiting == 0)
        return;
    for (int r = ps_shard.num_shards; r < ev.world; r++)
        if (!(ev.state[r] & (TR_LOST | TR_FAILED | TR_WAITING)))
            return;
    zd_future_t *fs[64];
    int n = ev.n_waiting;
    memcpy(fs, ev.waiting, sizeof fs[0] * (size_t)n);
    ev.n_waiting = 0;
    int64_t step = 0; /* training batches served: the optimizer's steps */
    for (int r = ps_shard.num_shards; r < ev.world; r++)
        step += ev.batches[r];
    pthread_mutex_unlock(&ev.stats_lock);
    double acc;
    int64_t images;
    int rc = evaluate(ev.eval_samples, &acc, &images);
    char err[512];
    snprintf(err, sizeof err, "%s", rc < 0 ? zd_error_last() : "");
    /* before the trainers hear the accuracy: the file is there when they
       finish */
    if (rc == 0 && ps_net_save_model_wanted())
        ps_net_save_model(step, acc, images);
    for (int i = 0; i < n; i++) {
        zd_value_t *v = rc == 0 ? zd_value_float(acc) : NULL;
        if (v)
            zd_future_set_value(fs[i], v);
        else
            zd_future_set_error(fs[i], "evaluation failed: %s", err);
        zd_value_unref(v);
        zd_future_unref(fs[i]);
    }
    pthread_mutex_lock(&ev.stats_lock);
}

/*  ps_evaluate(server, samples) -> accuracy: answered when every trainer
    has finished (a trainer whose call times out evaluates by itself). */
static zd_future_t *fn_evaluate(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t samples;
    if (zd_rpc_arg_int(args, 1, &samples) < 0)
        return NULL;
    zd_future_t *f = zd_future_new();
    if (!f)
        return NULL;
    int src = zd_rpc_call_caller_rank(call);
    fault_point(zd_rpc_rank(), "evaluation"); /* tests only (fault.h) */
    pthread_mutex_lock(&ev.stats_lock);
    if (!tables_ready(src)) {
        pthread_mutex_unlock(&ev.stats_lock);
        zd_future_unref(f);
        return NULL;
    }
    ev.state[src] |= TR_WAITING;
    if (ev.n_waiting == 64) {
        pthread_mutex_unlock(&ev.stats_lock);
        zd_future_unref(f);
        zd_error_set("too many trainers waiting for the evaluation");
        return NULL;
    }
    ev.eval_samples = samples;
    ev.waiting[ev.n_waiting++] = zd_future_ref(f);
    finish_evaluations();
    pthread_mutex_unlock(&ev.stats_lock);
    return f;
}

static zd_value_t *fn_trainer_started(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    double now = train_now();
    pthread_mutex_lock(&ev.stats_lock);
    if (ev.started++ == 0)
        ev.first_start = now;
    pthread_mutex_unlock(&ev.stats_lock);
    return zd_value_none();
}

static void open_gates(void);

static zd_value_t *fn_trainer_finished(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t samples; /* the trainer's count; the server counts its forwards */
    int src = zd_rpc_call_caller_rank(call);
    if (zd_rpc_arg_int(args, 1, &samples) < 0)
        return NULL;
    double now = train_now();
    pthread_mutex_lock(&ev.stats_lock);
    if (!tables_ready(src)) {
        pthread_mutex_unlock(&ev.stats_lock);
        return NULL;
    }
    ev.state[src] |= TR_FINISHED;
    pthread_cond_broadcast(&ev.changed);
    open_gates(); /* a finished trainer holds nobody back */
    ev.finished++;
    ev.last_finish = now;
    finish_evaluations();
    pthread_mutex_unlock(&ev.stats_lock);
    return zd_value_none();
}

/*  ps_trainer_failed(batches, why): the caller's run failed (its error
    in why): the servers stop waiting for it and name it, and the world
    ends as soon as the others are done, instead of waiting for a trainer
    that will never finish (issue 24 point 7). */
static zd_value_t *fn_trainer_failed(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t batches;
    const char *text;
    int src = zd_rpc_call_caller_rank(call);
    if (ZD_UNPACK(args, &batches, &text) < 0)
        return NULL;
    pthread_mutex_lock(&ev.stats_lock);
    if (!tables_ready(src)) {
        pthread_mutex_unlock(&ev.stats_lock);
        return NULL;
    }
    /* A peer's text goes to this server's terminal: printable bytes only. */
    char *why = ev.why[src];
    snprintf(why, WHY_MAX, "%s", text);
    for (char *c = why; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    ev.state[src] |= TR_FAILED;
    ev.failed_at[src] = batches;
    pthread_cond_broadcast(&ev.changed);
    printf("trainer \"%s\" (rank %d) failed at batch %lld: %s\n", zd_rpc_call_caller_name(call),
           src, (long long)batches, why);
    fflush(stdout);
    open_gates();
    finish_evaluations();
    pthread_mutex_unlock(&ev.stats_lock);
    return zd_value_none();
}

void ps_net_throughput(int64_t *samples, double *seconds)
{
    pthread_mutex_lock(&ev.stats_lock);
    *samples = ev.samples;
    double end = ev.last_finish > ev.last_batch ? ev.last_finish : ev.last_batch;
    *seconds = ev.started && end > ev.first_start ? end - ev.first_start : 0.0;
    pthread_mutex_unlock(&ev.stats_lock);
}

/*  ---- lost trainers, and --max_staleness ---- */

/*  The slowest trainer still training (not finished, not lost): its
    batches done, or INT64_MAX when none is. Under stats_lock. */
static int64_t slowest_live(void)
{
    int64_t low = INT64_MAX;
    for (int r = ps_shard.num_shards; r < ev.world; r++)
        if (!(ev.state[r] & (TR_FINISHED | TR_LOST | TR_FAILED)) && ev.progress[r] < low)
            low = ev.progress[r];
    return low;
}

/*  Answers the parked gates that are within their bound now. Under
    stats_lock (completing a gate's future only sends its answer). */
static void open_gates(void)
{
    if (!ev.state)
        return;
    int64_t low = slowest_live();
    for (int r = ps_shard.num_shards; r < ev.world; r++)
        if (ev.gate[r] && (low == INT64_MAX || ev.gate_done[r] - low <= ev.gate_bound[r])) {
            zd_value_t *v =
                zd_value_int(ev.gate_done[r] - (low == INT64_MAX ? ev.gate_done[r] : low));
            if (v)
                zd_future_set_value(ev.gate[r], v);
            else
                zd_future_set_error(ev.gate[r], "out of memory");
            zd_value_unref(v);
            zd_future_unref(ev.gate[r]);
            ev.gate[r] = NULL;
        }
}

/*  ps_staleness_gate(server, done, bound) -> lead: answered once the
    caller, having done `done` batches, is at most `bound` batches ahead
    of the slowest trainer still training (finished and lost trainers do
    not count; the caller counts with its own `done`). */
static zd_future_t *fn_staleness_gate(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t done, bound;
    int src = zd_rpc_call_caller_rank(call);
    if (zd_rpc_arg_int(args, 1, &done) < 0 || zd_rpc_arg_int(args, 2, &bound) < 0)
        return NULL;
    if (done < 0 || bound < 1)
        return zd_error_set("ps_staleness_gate: done %lld, bound %lld", (long long)done,
                            (long long)bound),
               NULL;
    zd_future_t *f = zd_future_new();
    if (!f)
        return NULL;
    pthread_mutex_lock(&ev.stats_lock);
    if (!tables_ready(src) || ev.gate[src]) {
        if (ev.state && src < ev.world && ev.gate[src])
            zd_error_set("ps_staleness_gate: rank %d already waits", src);
        pthread_mutex_unlock(&ev.stats_lock);
        zd_future_unref(f);
        return NULL;
    }
    ev.progress[src] = done;
    ev.gate[src] = zd_future_ref(f);
    ev.gate_done[src] = done;
    ev.gate_bound[src] = bound;
    open_gates(); /* this one, and those this trainer held back */
    pthread_mutex_unlock(&ev.stats_lock);
    return f;
}

void ps_net_eval_note_batch(int rank, int64_t samples)
{
    double now = train_now();
    pthread_mutex_lock(&ev.stats_lock);
    if (tables_ready(rank)) {
        ev.batches[rank]++;
        ev.samples += samples;
        ev.last_batch = now;
    }
    pthread_mutex_unlock(&ev.stats_lock);
}

/*  RPC declared a peer lost (a pool thread): the evaluation and the gates
    stop waiting for it. */
static void trainer_lost(void *arg, int peer, const char *name)
{
    (void)arg;
    pthread_mutex_lock(&ev.stats_lock);
    if (!tables_ready(peer)) {
        pthread_mutex_unlock(&ev.stats_lock);
        return;
    }
    ev.state[peer] |= TR_LOST;
    ev.lost_at[peer] = train_now();
    pthread_cond_broadcast(&ev.changed);
    printf("trainer \"%s\" (rank %d) lost at batch %lld%s; the others go on\n", name, peer,
           (long long)ev.batches[peer], ev.state[peer] & TR_FINISHED ? ", having finished" : "");
    fflush(stdout);
    if (ev.gate[peer]) {
        zd_future_set_error(ev.gate[peer], "lost");
        zd_future_unref(ev.gate[peer]);
        ev.gate[peer] = NULL;
    }
    open_gates();
    finish_evaluations();
    pthread_mutex_unlock(&ev.stats_lock);
}

/*  RPC saw a lost peer rejoin (a pool thread): a trainer restarted with
    the same rank trains again from its checkpoint; it counts again for
    the shared evaluation, the staleness gates and --min_trainers. */
static void trainer_joined(void *arg, int peer, const char *name)
{
    (void)arg;
    pthread_mutex_lock(&ev.stats_lock);
    if (peer >= ps_shard.num_shards && tables_ready(peer)) {
        printf("trainer \"%s\" (rank %d), lost at batch %lld, rejoined; counted again\n", name,
               peer, (long long)ev.batches[peer]);
        fflush(stdout);
        ev.state[peer] = TR_REJOINED; /* not failed any more either: it tries again */
        pthread_cond_broadcast(&ev.changed);
        ev.batches[peer] = 0;
        ev.progress[peer] = 0;
    }
    pthread_mutex_unlock(&ev.stats_lock);
}

void ps_net_wait_trainers(double wait_s)
{
    /* Another shard lost for longer than the wait: the trainers gave up on
       it (they fail, so they never say they finished). */
    enum { MAX_SHARDS = 16 }; /* rpc_ps's limit on --num_servers */
    double shard_lost_at[MAX_SHARDS] = {0};
    pthread_mutex_lock(&ev.stats_lock);
    for (;;) {
        bool gave_up = false;
        double now = train_now();
        for (int s = 1; s < ps_shard.num_shards && s < MAX_SHARDS; s++) {
            if (!zd_rpc_peer_is_lost(s))
                shard_lost_at[s] = 0;
            else if (!shard_lost_at[s])
                shard_lost_at[s] = now;
            else if (now - shard_lost_at[s] > wait_s + 1)
                gave_up = true;
        }
        if (gave_up)
            break;
        /* A failed trainer is done with, lost or not: it said so. */
        bool done = ev.state != NULL;
        for (int r = ps_shard.num_shards; done && r < ev.world; r++)
            if (ev.state[r] & TR_FAILED)
                continue;
            else if (ev.state[r] & TR_LOST ? now - ev.lost_at[r] < wait_s
                                           : !(ev.state[r] & TR_FINISHED))
                done = false;
        if (done)
            break;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 200000000;
        if (until.tv_nsec >= 1000000000)
            until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&ev.changed, &ev.stats_lock, &until);
    }
    pthread_mutex_unlock(&ev.stats_lock);
}

int ps_net_trainers_report(FILE *out)
{
    int finished = 0;
    pthread_mutex_lock(&ev.stats_lock);
    for (int r = ps_shard.num_shards; ev.state && r < ev.world; r++) {
        if (ev.state[r] & TR_FINISHED)
            finished++;
        if (ev.state[r] & TR_FAILED)
            fprintf(out, "trainer rank %d failed at batch %lld: %s\n", r,
                    (long long)ev.failed_at[r], ev.why[r]);
        else if (ev.state[r] & TR_LOST)
            fprintf(out, "trainer rank %d was lost at batch %lld%s\n", r, (long long)ev.batches[r],
                    ev.state[r] & TR_FINISHED ? " (after finishing its batches)" : "");
        else if (ev.state[r] & TR_REJOINED)
            fprintf(out, "trainer rank %d was lost and rejoined%s\n", r,
                    ev.state[r] & TR_FINISHED ? "; it finished its batches" : "");
    }
    pthread_mutex_unlock(&ev.stats_lock);
    return finished;
}

int ps_net_trainers_failed(char *first, size_t size)
{
    int failed = 0;
    if (size)
        first[0] = 0;
    pthread_mutex_lock(&ev.stats_lock);
    for (int r = ps_shard.num_shards; ev.state && r < ev.world; r++)
        if ((ev.state[r] & TR_FAILED) && failed++ == 0 && size)
            snprintf(first, size, "trainer rank %d failed at batch %lld: %s", r,
                     (long long)ev.failed_at[r], ev.why[r]);
    pthread_mutex_unlock(&ev.stats_lock);
    return failed;
}

int ps_net_eval_register(const char *data_dir)
{
    snprintf(ev.data_dir, sizeof ev.data_dir, "%s", data_dir ? data_dir : "");
    if (zd_rpc_register_peer_lost(trainer_lost, NULL) < 0 ||
        zd_rpc_register_peer_joined(trainer_joined, NULL) < 0 ||
        zd_rpc_register_async("ps_staleness_gate", fn_staleness_gate, NULL) < 0)
        return -1;
    if (zd_rpc_register("ps_trainer_started", fn_trainer_started, NULL) < 0 ||
        zd_rpc_register("ps_trainer_finished", fn_trainer_finished, NULL) < 0 ||
        zd_rpc_register("ps_trainer_failed", fn_trainer_failed, NULL) < 0)
        return -1;
    return zd_rpc_register_async("ps_evaluate", fn_evaluate, NULL);
}

void ps_net_eval_free(void)
{
    pthread_mutex_lock(&ev.stats_lock);
    for (int r = 0; ev.state && r < ev.world; r++)
        if (ev.gate[r]) {
            zd_future_set_error(ev.gate[r], "the server stopped");
            zd_future_unref(ev.gate[r]);
        }
    free(ev.state), free(ev.batches), free(ev.progress), free(ev.gate);
    free(ev.gate_done), free(ev.gate_bound), free(ev.lost_at);
    free(ev.why), free(ev.failed_at);
    ev.state = NULL;
    ev.world = 0;
    pthread_mutex_unlock(&ev.stats_lock);
}
