/* SPDX-License-Identifier: MIT */
/*  trainers.c: the trainers' registry (ps.h): which trainers started,
    finished, failed or were lost, the gate that bounds how far one runs
    ahead of the slowest, and the one result they all wait for at the end.

    A server cannot tell a trainer that will still come from one that is
    gone without this book-keeping: a graceful shutdown alone waits for a
    dead trainer until its timeout, and an evaluation "when everyone is
    done" waits for it for ever. */
#include <zdist/ps.h>

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include <zdist/future.h>

#include "core/fault_point.h"
#include "core/sized.h"

#define FN_STARTED  "__zd_pst_started"
#define FN_FINISHED "__zd_pst_finished"
#define FN_FAILED   "__zd_pst_failed"
#define FN_GATE     "__zd_pst_gate"
#define FN_WAIT_ALL "__zd_pst_wait_all"

enum { T_STARTED = 1, T_FINISHED = 2, T_LOST = 4, T_WAITING = 8, T_REJOINED = 16, T_FAILED = 32 };

typedef struct {
    unsigned state;
    int64_t batches;      /* noted since it (re)joined */
    int64_t progress;     /* its last gate's batches */
    int64_t failed_at;    /* the batch it said it failed at */
    double lost_at;       /* now_s() */
    zd_future_t *gate;    /* parked until the slowest catches up */
    zd_future_t *waiting; /* its wait for the shared result */
    int64_t gate_done, gate_bound;
    char why[sizeof(((zd_ps_trainer_info_t *)0)->why)];
} trainer_t;

struct zd_ps_trainers {
    zd_ps_trainers_options_t o;
    pthread_mutex_t lock;
    pthread_cond_t changed; /* a trainer finished, failed, was lost or came back */
    int world;              /* 0 until the first call makes the table */
    trainer_t *t;           /* world entries; ranks below first_trainer unused */
    zd_future_t **answer;   /* world entries: finish_waiting's, made with t */
    int busy;               /* peer hooks at work on it: zd_ps_trainers_free waits */
    int started;
    double first_start, last_finish, last_batch;
    int64_t samples;
    zd_value_t *request; /* the last waiting trainer's, for shared_result */
};

/*  The registry of this process, for the peer hooks, which live as long
    as the process. Lock order: g.lock, then the registry's. */
static struct {
    pthread_mutex_t lock;
    zd_ps_trainers_t *current;
    bool hooked;
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*  Under the lock: the table, made at first use; false (error set) when
    out of memory or rank is not a trainer's. */
static bool table_ready(zd_ps_trainers_t *r, int rank)
{
    if (!r->t) {
        int w = zd_rpc_world_size();
        if (w < 1)
            return zd_error_set_code(ZD_ERR_NOT_INITIALIZED, "RPC is not running"), false;
        r->t = calloc((size_t)w, sizeof *r->t);
        r->answer = calloc((size_t)w, sizeof *r->answer);
        if (!r->t || !r->answer) {
            free(r->t), free(r->answer);
            r->t = NULL, r->answer = NULL;
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory"), false;
        }
        r->world = w;
    }
    if (rank < r->o.first_trainer || rank >= r->world)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "rank %d is not a trainer", rank), false;
    return true;
}

static void info_of(const zd_ps_trainers_t *r, int rank, zd_ps_trainer_info_t *info)
{
    const trainer_t *t = &r->t[rank];
    memset(info, 0, sizeof *info);
    info->rank = rank;
    info->started = t->state & T_STARTED;
    info->finished = t->state & T_FINISHED;
    info->failed = t->state & T_FAILED;
    info->lost = t->state & T_LOST;
    info->rejoined = t->state & T_REJOINED;
    info->batches = t->batches;
    info->failed_at = t->failed_at;
    memcpy(info->why, t->why, sizeof info->why);
}

/*  Under the lock. */
static void tell(zd_ps_trainers_t *r, int rank, const char *name, zd_ps_trainer_event_t ev)
{
    if (!r->o.on_event)
        return;
    zd_ps_trainer_info_t info;
    info_of(r, rank, &info);
    r->o.on_event(r->o.on_event_arg, &info, name, ev);
}

/*  The slowest trainer still training (not finished, failed or lost):
    its batches, or INT64_MAX when none is. Under the lock. */
static int64_t slowest_live(const zd_ps_trainers_t *r)
{
    int64_t low = INT64_MAX;
    for (int k = r->o.first_trainer; k < r->world; k++)
        if (!(r->t[k].state & (T_FINISHED | T_LOST | T_FAILED)) && r->t[k].progress < low)
            low = r->t[k].progress;
    return low;
}

/*  Answers the parked gates within their bound now (completing a future
    only sends its answer). Under the lock. */
static void open_gates(zd_ps_trainers_t *r)
{
    if (!r->t)
        return;
    int64_t low = slowest_live(r);
    for (int k = r->o.first_trainer; k < r->world; k++) {
        trainer_t *t = &r->t[k];
        if (!t->gate || (low != INT64_MAX && t->gate_done - low > t->gate_bound))
            continue;
        zd_value_t *v = zd_value_int(low == INT64_MAX ? 0 : t->gate_done - low);
        if (v)
            zd_future_set_value(t->gate, v);
        else
            zd_future_set_error(t->gate, "out of memory");
        zd_value_unref(v);
        zd_future_unref(t->gate);
        t->gate = NULL;
    }
}

/*  Answers every waiting trainer once each trainer is waiting, failed or
    lost: one shared result. Called with the lock held, which it lets go
    of while the result is computed. */
static void finish_waiting(zd_ps_trainers_t *r)
{
    if (!r->t)
        return;
    int n = 0;
    for (int k = r->o.first_trainer; k < r->world; k++)
        if (!(r->t[k].state & (T_LOST | T_FAILED | T_WAITING)))
            return;
        else if (r->t[k].waiting)
            n++;
    if (n == 0)
        return;
    /* r->answer: no allocation here, where a failure would leave the
       waiting trainers to their timeouts */
    zd_future_t **fs = r->answer;
    n = 0;
    for (int k = r->o.first_trainer; k < r->world; k++)
        if (r->t[k].waiting) {
            fs[n++] = r->t[k].waiting;
            r->t[k].waiting = NULL;
        }
    r->busy++; /* fs is r's: zd_ps_trainers_free waits */
    zd_value_t *request = r->request;
    r->request = NULL;
    pthread_mutex_unlock(&r->lock);
    zd_value_t *v =
        r->o.shared_result ? r->o.shared_result(r->o.shared_result_arg, request) : zd_value_none();
    char why[512];
    snprintf(why, sizeof why, "%s", v ? "" : zd_error_last());
    for (int i = 0; i < n; i++) {
        if (v)
            zd_future_set_value(fs[i], v);
        else
            zd_future_set_error(fs[i], "%s", why);
        zd_future_unref(fs[i]);
    }
    zd_value_unref(v);
    zd_value_unref(request);
    pthread_mutex_lock(&r->lock);
    r->busy--;
    pthread_cond_broadcast(&r->changed);
}

static zd_value_t *serve_started(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    zd_ps_trainers_t *r = arg;
    int src = zd_rpc_call_caller_rank(call);
    double now = now_s();
    pthread_mutex_lock(&r->lock);
    bool ok = table_ready(r, src);
    if (ok) {
        if (r->started++ == 0)
            r->first_start = now;
        r->t[src].state |= T_STARTED;
        tell(r, src, zd_rpc_call_caller_name(call), ZD_PS_TRAINER_STARTED);
    }
    pthread_mutex_unlock(&r->lock);
    return ok ? zd_value_none() : NULL;
}

static zd_value_t *serve_finished(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    zd_ps_trainers_t *r = arg;
    int src = zd_rpc_call_caller_rank(call);
    double now = now_s();
    pthread_mutex_lock(&r->lock);
    bool ok = table_ready(r, src);
    if (ok) {
        r->t[src].state |= T_FINISHED;
        r->last_finish = now;
        pthread_cond_broadcast(&r->changed);
        tell(r, src, zd_rpc_call_caller_name(call), ZD_PS_TRAINER_FINISHED);
        open_gates(r); /* a finished trainer holds nobody back */
        finish_waiting(r);
    }
    pthread_mutex_unlock(&r->lock);
    return ok ? zd_value_none() : NULL;
}

static zd_value_t *serve_failed(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_trainers_t *r = arg;
    int64_t batches;
    const char *text;
    int src = zd_rpc_call_caller_rank(call);
    if (ZD_UNPACK(args, &batches, &text) < 0)
        return NULL;
    pthread_mutex_lock(&r->lock);
    bool ok = table_ready(r, src);
    if (ok) {
        trainer_t *t = &r->t[src];
        /* A peer's text goes to this server's terminal: printable bytes only. */
        snprintf(t->why, sizeof t->why, "%s", text);
        for (char *c = t->why; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
        t->state |= T_FAILED;
        t->failed_at = batches;
        pthread_cond_broadcast(&r->changed);
        tell(r, src, zd_rpc_call_caller_name(call), ZD_PS_TRAINER_FAILED);
        open_gates(r);
        finish_waiting(r);
    }
    pthread_mutex_unlock(&r->lock);
    return ok ? zd_value_none() : NULL;
}

static zd_future_t *serve_gate(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_trainers_t *r = arg;
    int64_t done, bound;
    int src = zd_rpc_call_caller_rank(call);
    if (ZD_UNPACK(args, &done, &bound) < 0)
        return NULL;
    if (done < 0 || bound < 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "the trainers' gate: done %lld, bound %lld",
                          (long long)done, (long long)bound);
        return NULL;
    }
    zd_future_t *f = zd_future_new();
    if (!f)
        return NULL;
    pthread_mutex_lock(&r->lock);
    bool ok = table_ready(r, src);
    if (ok) {
        trainer_t *t = &r->t[src];
        if (t->gate) { /* its caller gave up on it (a timeout) and went on */
            zd_future_set_error(t->gate, "superseded by the same rank's next gate call");
            zd_future_unref(t->gate);
        }
        t->progress = done;
        t->gate = zd_future_ref(f);
        t->gate_done = done;
        t->gate_bound = bound;
        open_gates(r); /* this one, and those this trainer held back */
    }
    pthread_mutex_unlock(&r->lock);
    if (!ok)
        zd_future_unref(f), f = NULL;
    return f;
}

static zd_future_t *serve_wait_all(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_trainers_t *r = arg;
    zd_value_t *request;
    int src = zd_rpc_call_caller_rank(call);
    if (ZD_UNPACK(args, &request) < 0)
        return NULL;
    zd_future_t *f = zd_future_new();
    if (!f)
        return NULL;
    pthread_mutex_lock(&r->lock);
    bool ok = table_ready(r, src);
    if (ok) {
        trainer_t *t = &r->t[src];
        /* one wait per rank: a peer cannot pile them up */
        if (t->waiting) {
            zd_future_set_error(t->waiting, "superseded by the same rank's next wait");
            zd_future_unref(t->waiting);
        }
        t->state |= T_WAITING;
        /* (before the event, under the lock, where rpc_ps's own point
           on it was) */
        zd__fault_point(zd_rpc_rank(), "evaluation"); /* tests only (core/fault_point.h) */
        tell(r, src, zd_rpc_call_caller_name(call), ZD_PS_TRAINER_WAITING);
        zd_value_unref(r->request);
        r->request = zd_value_ref(request);
        t->waiting = zd_future_ref(f);
        finish_waiting(r);
    }
    pthread_mutex_unlock(&r->lock);
    if (!ok)
        zd_future_unref(f), f = NULL;
    return f;
}

/*  The registry, locked and pinned for a peer hook (NULL when there is
    none): g.lock is let go at once, since a shared result computed on a
    loss may take long, and zd_ps_trainers_free waits for the pin. */
static zd_ps_trainers_t *pin(void)
{
    pthread_mutex_lock(&g.lock);
    zd_ps_trainers_t *r = g.current;
    if (r) {
        pthread_mutex_lock(&r->lock);
        r->busy++;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static void unpin(zd_ps_trainers_t *r)
{
    r->busy--;
    pthread_cond_broadcast(&r->changed);
    pthread_mutex_unlock(&r->lock);
}

/*  A peer declared lost (an RPC pool thread): the gates and the shared
    result stop waiting for it. */
static void on_lost(void *arg, int peer, const char *name)
{
    (void)arg;
    zd_ps_trainers_t *r = pin();
    if (!r)
        return;
    if (peer >= r->o.first_trainer && table_ready(r, peer)) {
        trainer_t *t = &r->t[peer];
        t->state |= T_LOST;
        t->lost_at = now_s();
        tell(r, peer, name, ZD_PS_TRAINER_LOST);
        if (t->gate) {
            zd_future_set_error(t->gate, "lost");
            zd_future_unref(t->gate);
            t->gate = NULL;
        }
        open_gates(r);
        finish_waiting(r);
    }
    unpin(r);
}

/*  A lost peer rejoined: a trainer started again with its rank trains
    again (from its checkpoint): it counts again for the gates and the
    shared result, and is no longer failed either. Its new process may
    have called before this news: a gate it parked keeps its place. */
static void on_joined(void *arg, int peer, const char *name)
{
    (void)arg;
    zd_ps_trainers_t *r = pin();
    if (!r)
        return;
    if (peer >= r->o.first_trainer && table_ready(r, peer)) {
        trainer_t *t = &r->t[peer];
        tell(r, peer, name, ZD_PS_TRAINER_REJOINED); /* the state it was lost in */
        if (t->waiting) {                            /* the old process's, answered to nobody */
            zd_future_set_error(t->waiting, "the trainer was started again");
            zd_future_unref(t->waiting);
            t->waiting = NULL;
        }
        t->state = T_REJOINED;
        t->batches = 0;
        t->progress = t->gate ? t->gate_done : 0;
        open_gates(r);
    }
    unpin(r);
}

zd_ps_trainers_t *zd_ps_trainers_new(const zd_ps_trainers_options_t *opts)
{
    zd_ps_trainers_options_t o = zd_ps_trainers_options_default();
    if (opts &&
        zd__sized_read(&o, sizeof o, opts,
                       ZD__SIZE_THROUGH(zd_ps_trainers_options_t, shared_result_arg),
                       "zd_ps_trainers_options_t", "zd_ps_trainers_options_default()") < 0)
        return NULL;
    if (o.first_trainer < 0 || o.first_trainer == INT_MAX) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_trainers_new: first_trainer %d", o.first_trainer);
        return NULL;
    }
    zd_ps_trainers_t *r = calloc(1, sizeof *r);
    if (!r) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    r->o = o;
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->changed, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_lock(&g.lock);
    int rc = 0;
    if (g.current)
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "zd_ps_trainers_new: this process has a registry already");
    if (rc == 0 && !g.hooked) {
        rc = zd_rpc_register_peer_lost(on_lost, NULL) < 0 ||
                zd_rpc_register_peer_joined(on_joined, NULL) < 0
            ? -1
            : 0;
        g.hooked = rc == 0;
    }
    if (rc == 0 &&
        (zd_rpc_register(FN_STARTED, serve_started, r) < 0 ||
         zd_rpc_register(FN_FINISHED, serve_finished, r) < 0 ||
         zd_rpc_register(FN_FAILED, serve_failed, r) < 0 ||
         zd_rpc_register_async(FN_GATE, serve_gate, r) < 0 ||
         zd_rpc_register_async(FN_WAIT_ALL, serve_wait_all, r) < 0)) {
        zd_error_wrap("zd_ps_trainers_new");
        zd_rpc_unregister(FN_STARTED);
        zd_rpc_unregister(FN_FINISHED);
        zd_rpc_unregister(FN_FAILED);
        zd_rpc_unregister(FN_GATE);
        zd_rpc_unregister(FN_WAIT_ALL);
        rc = -1;
    }
    if (rc == 0)
        g.current = r;
    pthread_mutex_unlock(&g.lock);
    if (rc < 0) {
        pthread_cond_destroy(&r->changed);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return NULL;
    }
    return r;
}

void zd_ps_trainers_note_batch(zd_ps_trainers_t *r, int rank, int64_t samples)
{
    if (!r)
        return;
    double now = now_s();
    pthread_mutex_lock(&r->lock);
    if (table_ready(r, rank)) {
        r->t[rank].batches++;
        r->samples += samples;
        r->last_batch = now;
    }
    pthread_mutex_unlock(&r->lock);
}

int zd_ps_trainers_wait(zd_ps_trainers_t *r, int64_t lost_wait_ms, int64_t timeout_ms)
{
    if (!r)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_trainers_wait: NULL");
    double wait_s = lost_wait_ms < 0 ? 0 : (double)lost_wait_ms / 1000;
    double t0 = now_s();
    int self = zd_rpc_rank(), rc = 0;
    /* when each server rank was seen lost (0: not lost) */
    double *server_lost = calloc((size_t)(r->o.first_trainer + 1), sizeof *server_lost);
    if (!server_lost)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    pthread_mutex_lock(&r->lock);
    for (;;) {
        double now = now_s();
        /* Another server lost for longer than the wait: its trainers gave
           up on it (they fail, so they never say they finished). */
        for (int s = 0; rc == 0 && s < r->o.first_trainer; s++) {
            if (s == self || !zd_rpc_peer_is_lost(s))
                server_lost[s] = 0;
            else if (!server_lost[s])
                server_lost[s] = now;
            else if (now - server_lost[s] > wait_s + 1)
                rc = zd_error_set_code(ZD_ERR_PEER,
                                       "zd_ps_trainers_wait: server rank %d lost for %.1f s", s,
                                       now - server_lost[s]);
        }
        if (rc < 0)
            break;
        /* A failed trainer is done with, lost or not: it said so. */
        bool done = r->t != NULL || r->o.first_trainer >= zd_rpc_world_size();
        for (int k = r->o.first_trainer; r->t && k < r->world; k++) {
            unsigned st = r->t[k].state;
            if (st & T_FAILED)
                continue;
            if (st & T_LOST ? now - r->t[k].lost_at < wait_s : !(st & T_FINISHED))
                done = false;
        }
        if (done)
            break;
        if (timeout_ms > 0 && now - t0 > (double)timeout_ms / 1000) {
            rc = zd_error_set_code(ZD_ERR_TIMEOUT,
                                   "zd_ps_trainers_wait: trainers still at work after %lld ms",
                                   (long long)timeout_ms);
            break;
        }
        /* The losses of server ranks and the lost trainers' waits end by
           time, not by news: look again at least every 200 ms. */
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += 200000000;
        if (until.tv_nsec >= 1000000000)
            until.tv_sec++, until.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&r->changed, &r->lock, &until);
    }
    pthread_mutex_unlock(&r->lock);
    free(server_lost);
    return rc;
}

int zd_ps_trainers_get(zd_ps_trainers_t *r, int rank, zd_ps_trainer_info_t *info)
{
    if (!r || !info)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_trainers_get: NULL");
    pthread_mutex_lock(&r->lock);
    bool ok = table_ready(r, rank);
    if (ok)
        info_of(r, rank, info);
    pthread_mutex_unlock(&r->lock);
    return ok ? 0 : -1;
}

void zd_ps_trainers_throughput(zd_ps_trainers_t *r, int64_t *samples, double *seconds)
{
    *samples = 0;
    *seconds = 0;
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    *samples = r->samples;
    double end = r->last_finish > r->last_batch ? r->last_finish : r->last_batch;
    *seconds = r->started && end > r->first_start ? end - r->first_start : 0.0;
    pthread_mutex_unlock(&r->lock);
}

void zd_ps_trainers_free(zd_ps_trainers_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&g.lock);
    if (g.current == r)
        g.current = NULL;
    pthread_mutex_unlock(&g.lock);
    pthread_mutex_lock(&r->lock);
    while (r->busy > 0) /* a peer hook, or a shared result being computed */
        pthread_cond_wait(&r->changed, &r->lock);
    pthread_mutex_unlock(&r->lock);
    zd_rpc_unregister(FN_STARTED);
    zd_rpc_unregister(FN_FINISHED);
    zd_rpc_unregister(FN_FAILED);
    zd_rpc_unregister(FN_GATE);
    zd_rpc_unregister(FN_WAIT_ALL);
    for (int k = 0; r->t && k < r->world; k++) {
        zd_future_t *f[2] = {r->t[k].gate, r->t[k].waiting};
        for (int i = 0; i < 2; i++)
            if (f[i]) {
                zd_future_set_error(f[i], "the server stopped");
                zd_future_unref(f[i]);
            }
    }
    zd_value_unref(r->request);
    free(r->t);
    free(r->answer);
    pthread_cond_destroy(&r->changed);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

/*  ---- a trainer's calls ---- */

/*  The host of this process's last zd_ps_trainer_started, and its
    zd_rpc_peer_joins then: a host started again since has a book that
    never heard of this trainer. */
static atomic_int started_host = -1, started_joins;

/*  0, or -1 (ZD_ERR_PEER) when host is the started one and was replaced
    since. */
static int host_same(const char *what, int host)
{
    int joins = zd_rpc_peer_joins(host); /* (-1 without RPC: the call says so) */
    if (host != atomic_load(&started_host) || joins < 0 || joins == atomic_load(&started_joins))
        return 0;
    return zd_error_set_code(ZD_ERR_PEER,
                             "%s: the registry's host (rank %d) was lost and started again "
                             "since this trainer's zd_ps_trainer_started",
                             what, host);
}

static int call_host(const char *what, int host, const char *fn, zd_value_t *args,
                     int64_t timeout_ms, zd_value_t **result)
{
    zd_value_t *r = NULL;
    int rc = zd_rpc_sync_take(host, fn, args, timeout_ms, &r);
    if (rc < 0) /* the caller's words, not the internal function's name */
        zd_error_set_code(zd_error_code(), "%s: %s", what, zd_error_last());
    if (rc == 0 && result)
        *result = r;
    else
        zd_value_unref(r);
    return rc;
}

int zd_ps_trainer_started(int host, int64_t timeout_ms)
{
    /* noted before the call: a host started again during it is met next */
    int joins = zd_rpc_peer_joins(host);
    int rc = call_host("zd_ps_trainer_started", host, FN_STARTED, ZD_ARGS(), timeout_ms, NULL);
    if (rc == 0) {
        atomic_store(&started_joins, joins);
        atomic_store(&started_host, host);
    }
    return rc;
}

int zd_ps_trainer_finished(int host, int64_t timeout_ms)
{
    if (host_same("zd_ps_trainer_finished", host) < 0)
        return -1;
    return call_host("zd_ps_trainer_finished", host, FN_FINISHED, ZD_ARGS(), timeout_ms, NULL);
}

int zd_ps_trainer_failed(int host, int64_t batches, const char *why, int64_t timeout_ms)
{
    return call_host("zd_ps_trainer_failed", host, FN_FAILED, ZD_ARGS(batches, why ? why : ""),
                     timeout_ms, NULL);
}

int zd_ps_trainer_gate(int host, int64_t done, int64_t bound, int64_t timeout_ms, int64_t *lead)
{
    zd_value_t *v = NULL;
    int64_t l = 0;
    if (host_same("zd_ps_trainer_gate", host) < 0) {
        if (lead)
            *lead = 0;
        return -1;
    }
    int rc = call_host("zd_ps_trainer_gate", host, FN_GATE, ZD_ARGS(done, bound), timeout_ms, &v);
    if (rc == 0 && (rc = zd_value_get_int(v, &l)) < 0)
        zd_error_set_code(ZD_ERR_REMOTE, "the trainers' gate: answered %s, not an int",
                          zd_value_kind_name(zd_value_kind(v)));
    zd_value_unref(v);
    if (lead)
        *lead = rc == 0 ? l : 0;
    return rc;
}

int zd_ps_trainer_wait_all(int host, zd_value_t *request, int64_t timeout_ms, zd_value_t **result)
{
    if (result)
        *result = NULL;
    zd__fault_point(zd_rpc_rank(), "evaluation"); /* tests only (core/fault_point.h) */
    if (host_same("zd_ps_trainer_wait_all", host) < 0)
        return -1;
    zd_value_t *req = request ? zd_value_ref(request) : zd_value_none();
    return call_host("zd_ps_trainer_wait_all", host, FN_WAIT_ALL, ZD_ARGS(req), timeout_ms, result);
}
