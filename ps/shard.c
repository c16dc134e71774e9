/* SPDX-License-Identifier: MIT */
/*  shard.c: a shard of the push/pull parameter server (ps.h).

    A shard serves functions of its own, "__zd_ps_pull_<shard>",
    "__zd_ps_push_<shard>", "__zd_ps_pushpull_<shard>",
    "__zd_ps_where_<shard>" and "__zd_ps_back_<shard>", so that one
    process may serve several shards.
    Every answer is a list [code, version, text, ...] rather than an RPC
    error: an RPC error reaches the caller as ZD_ERR_REMOTE whatever its
    code, and a trainer must tell a stale push from a refused one. The
    codes a shard may answer are a fixed few; the client (client.c) reads
    any other as a bad answer. */
#include <zdist/ps.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/fault_point.h"
#include "core/log_private.h"
#include "core/sized.h"
#include "ps/ps_private.h"

/*  The answer [code, version, text]: a new reference, or NULL. */
static zd_value_t *answer_new(zd_error_code_t code, int64_t version, const char *text)
{
    zd_value_t *v = zd_value_list(3);
    if (!v || zd_list_append(v, zd_value_int(code)) < 0 ||
        zd_list_append(v, zd_value_int(version)) < 0 ||
        zd_list_append(v, zd_value_string(text)) < 0) {
        zd_value_unref(v);
        return NULL;
    }
    return v;
}

/*  Completes f with an answer (or, out of memory, with an error). */
static void answer(zd_future_t *f, zd_error_code_t code, int64_t version, const char *text)
{
    zd_value_t *v = answer_new(code, version, text);
    if (v)
        zd_future_set_value(f, v);
    else
        zd_future_set_error_code(f, ZD_ERR_NO_MEMORY, "ps: out of memory answering");
    zd_value_unref(v);
}

/*  Copies of the shard's parameters (under the lock), for answers that
    leave after it is let go: a new array of n new references, or NULL
    (out of memory). */
static zd_tensor_t **params_copies(const zd_ps_server_t *s)
{
    zd_tensor_t **c = calloc((size_t)s->n, sizeof *c);
    for (int i = 0; c && i < s->n; i++)
        if (!(c[i] = zd_tensor_detach_copy(s->params[i]))) {
            for (int k = 0; k < i; k++)
                zd_tensor_unref(c[k]);
            free(c);
            c = NULL;
        }
    return c;
}

static void copies_free(const zd_ps_server_t *s, zd_tensor_t **c)
{
    for (int i = 0; c && i < s->n; i++)
        zd_tensor_unref(c[i]);
    free(c);
}

/*  The answer [code, version, text, name, tensor, ...] of a pull, or of a
    push_pull taken: a new reference, or NULL. */
static zd_value_t *params_answer_new(const zd_ps_server_t *s, int64_t version,
                                     zd_tensor_t *const *copies)
{
    zd_value_t *v = answer_new(ZD_OK, version, "");
    for (int i = 0; v && i < s->n; i++)
        if (zd_list_append(v, zd_value_string(s->names[i])) < 0 ||
            zd_list_append(v, zd_value_tensor(copies[i])) < 0) {
            zd_value_unref(v);
            v = NULL;
        }
    return v;
}

/*  Completes f, a push taken, with the parameters' answer; without them
    (out of memory) with a push's answer: the push was taken all the
    same, and the client pulls what it could not be given. */
static void answer_params(const zd_ps_server_t *s, zd_future_t *f, int64_t version,
                          zd_tensor_t *const *copies)
{
    zd_value_t *v = copies ? params_answer_new(s, version, copies) : NULL;
    if (v)
        zd_future_set_value(f, v);
    else
        answer(f, ZD_OK, version, "");
    zd_value_unref(v);
}

/*  Room for a round's answers (2 num_trainers), taken before the lock so
    that finishing a round under it cannot fail: a new array, or NULL. */
static zd_future_t **answers_room(const zd_ps_server_t *s)
{
    return malloc(2 * (size_t)s->opts.num_trainers * sizeof(zd_future_t *));
}

/*  Takes the round's waiting answers out (under the lock) into out, room
    for 2 num_trainers of them: the caller completes them once it let the
    lock go, since completing one sends it. */
static zd_future_t **take_waiting_into(zd_ps_server_t *s, zd_future_t **out, int *n)
{
    *n = 0;
    for (int i = 0; i < s->n_pushed; i++)
        out[(*n)++] = s->waiting[i];
    s->n_pushed = 0;
    for (int i = 0; i < s->n; i++)
        zd_tensor_zero_(s->sums[i]);
    return out;
}

static void answer_all(zd_future_t **fs, int n, zd_error_code_t code, int64_t version,
                       const char *text)
{
    for (int i = 0; i < n; i++) {
        answer(fs[i], code, version, text);
        zd_future_unref(fs[i]);
    }
    free(fs);
}

static zd__ps_ckpt_t ckpt_of(zd_ps_server_t *s)
{
    return (zd__ps_ckpt_t){s->ckpt_path,    s->shard,   s->n_shards, s->n,
                           s->names,        s->params,  s->opt,      &s->positions,
                           &s->n_positions, s->trainer, s->n_ranks,  &s->known,
                           &s->n_known,     false,      0,           0,
                           s->run_tag};
}

/*  The shard's checkpoint now (under the lock). 0, or -1. */
static int write_checkpoint(zd_ps_server_t *s)
{
    zd__ps_ckpt_t c = ckpt_of(s);
    if (zd__ps_checkpoint_write(&c, s->version, false) < 0)
        return -1;
    s->ckpt_before = s->ckpt_version;
    s->ckpt_version = s->version;
    return 0;
}

/*  Whether the step just taken left every parameter finite; if not, puts
    the parameters of before it back and fails naming the first element
    (ZD_ERR_ARGUMENT: the trainers' gradients were finite, checked as they
    came, but a learning rate too high for them diverges, and one inf or
    nan would reach every trainer with its next pull). The optimizer's own
    state (momentum, Adam's moments) keeps the refused step's gradients,
    as zd_dist_optim_step's does, so the steps after it may be refused
    too: the trainers are told to stop. */
static int check_step(zd_ps_server_t *s)
{
    int i = 0;
    int64_t bad = -1;
    while (i < s->n && (bad = zd__ps_first_not_finite(s->params[i])) < 0)
        i++;
    if (bad < 0)
        return 0;
    s->stats.diverged++;
    const double now = zd_tensor_data(s->params[i])[bad], was = zd_tensor_data(s->before[i])[bad];
    for (int k = 0; k < s->n; k++)
        memcpy(zd_tensor_data(s->params[k]), zd_tensor_data(s->before[k]),
               zd_tensor_nbytes(s->params[k]));
    zd__log(ZD_LOG_WARN,
            "ps: shard %d: the step from version %" PRId64 " made \"%s\" %g at element %" PRId64
            " (it was %g): refused and undone",
            s->shard, s->version, s->names[i], now, bad, was);
    return zd_error_set_code(ZD_ERR_ARGUMENT,
                             "the step from version %" PRId64 " made \"%s\" %g at element %" PRId64
                             " (it was %g): the model diverges (a learning rate too high?); the "
                             "step was refused and undone, the parameters are as they were",
                             s->version, s->names[i], now, bad, was);
}

/*  The next version (under the lock), and the checkpoint it is due for.
    A checkpoint that fails is logged, not the step's failure: the step
    happened, and the last whole generation stays on disk. */
static void advance(zd_ps_server_t *s)
{
    s->version++;
    s->fresh = false;
    zd__fault_point(zd_rpc_rank(), "step"); /* tests only (core/fault_point.h) */
    if (s->opts.on_step)
        s->opts.on_step(s->opts.on_step_arg, s->shard, s->version);
    int64_t every = s->opts.checkpoint_every;
    if (every > 0 && s->version % every == 0 && write_checkpoint(s) < 0)
        zd__log(ZD_LOG_WARN,
                "%s (the shard goes on; the last checkpoint is of version %" PRId64 ")",
                zd_error_last(), s->ckpt_version);
}

/*  One step with grads (under the lock), published only when it leaves
    the parameters finite (check_step). */
static int step(zd_ps_server_t *s, zd_tensor_t *const *grads)
{
    for (int i = 0; i < s->n; i++)
        memcpy(zd_tensor_data(s->before[i]), zd_tensor_data(s->params[i]),
               zd_tensor_nbytes(s->params[i]));
    if (zd_optim_step(s->opt, grads) < 0 || check_step(s) < 0)
        return -1;
    s->stats.steps++;
    advance(s);
    return 0;
}

/*  Marks the caller of a pull or a push a live trainer (under the lock): a
    lost one that called again (it rejoined) is waited for again. */
static void trainer_seen(zd_ps_server_t *s, int rank)
{
    if (s->opts.mode != ZD_PS_SYNC || rank < 0)
        return;
    if (!s->trainer) {
        int n = zd_rpc_world_size();
        if (n < 1 || !(s->trainer = calloc((size_t)n, sizeof *s->trainer)))
            return; /* no memory: lost trainers are waited for, as before */
        s->n_ranks = n;
        /* resumed: the trainers its checkpoint knew, those lost before
           this process joined lost */
        for (int i = 0; i < s->n_known; i++)
            if (s->known[i] < n && s->trainer[s->known[i]] == TRAINER_UNKNOWN) {
                bool lost = zd_rpc_peer_is_lost((int)s->known[i]);
                s->trainer[s->known[i]] = lost ? TRAINER_LOST : TRAINER_LIVE;
                s->n_lost += lost;
            }
    }
    if (rank >= s->n_ranks)
        return;
    if (s->trainer[rank] == TRAINER_LOST)
        s->n_lost--;
    s->trainer[rank] = TRAINER_LIVE;
}

/*  A round is complete when every trainer not lost pushed, and those are
    at least min_trainers: num_trainers - n_lost pushes from live ones. A
    lost trainer's push stays in the round (it was computed on the
    round's version), and counts in the mean. */
static bool round_complete(const zd_ps_server_t *s)
{
    int expected = s->opts.num_trainers - s->n_lost, live = 0;
    if (s->n_pushed == 0 || expected < s->opts.min_trainers)
        return false;
    for (int i = 0; i < s->n_pushed; i++)
        live += s->pushed_by[i] >= 0;
    return live >= expected;
}

/*  A finished round's answers, taken under the lock and sent once it is
    let go (send_round). */
typedef struct {
    zd_future_t **room; /* answers_room, taken before the lock */
    zd_future_t **fs;   /* the room once a round finished into it; NULL: none */
    int n;
    bool *fetch;          /* fetch[i]: fs[i] is a push_pull's (NULL: none is) */
    zd_tensor_t **copies; /* the parameters after the step, for them (or NULL) */
} round_t;

/*  Whether the round's mean (in s->sums) is finite: the trainers'
    gradients were, each checked as it came, but their sum may overflow a
    float, and an optimizer given an inf keeps it in its state (momentum,
    Adam's moments), which no undo of the parameters takes back. 0, or -1
    (ZD_ERR_ARGUMENT) naming the tensor and the element. */
static int check_mean(zd_ps_server_t *s)
{
    for (int i = 0; i < s->n; i++) {
        int64_t bad = zd__ps_first_not_finite(s->sums[i]);
        if (bad < 0)
            continue;
        s->stats.diverged++;
        zd__log(ZD_LOG_WARN,
                "ps: shard %d: the mean of round %" PRId64 "'s gradients of \"%s\" is %g at "
                "element %" PRId64 ": refused",
                s->shard, s->version, s->names[i], (double)zd_tensor_data(s->sums[i])[bad], bad);
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "the mean of round %" PRId64 "'s gradients of \"%s\" is %g at "
                                 "element %" PRId64 " (their sum overflows a float): the round "
                                 "was refused, the parameters are as they were",
                                 s->version, s->names[i], (double)zd_tensor_data(s->sums[i])[bad],
                                 bad);
    }
    return 0;
}

/*  A round whose step failed (under the lock): refused as diverged
    (check_mean, check_step), or the optimizer out of memory, with the
    parameters as they were either way. It still counts as a round here:
    the version moves on, since the other shards took their parts of it;
    the shards then keep one version per round, and their checkpoints one
    generation. Its pushes' positions go back (their batches were not
    taken here). The error stays the step's. */
static void refuse_round(zd_ps_server_t *s)
{
    char why[512];
    const zd_error_code_t code = zd_error_code();
    snprintf(why, sizeof why, "%s", zd_error_last());
    for (int i = s->n_pushed - 1; i >= 0; i--) {
        int rank = s->round_rank[i];
        if (rank >= 0 && rank < s->n_positions)
            s->positions[rank] = s->round_was[i];
    }
    advance(s);
    zd_error_set_code(code, "%s", why);
}

/*  Steps with the mean of the round (under the lock) and takes its
    answers into r's room, with the parameters the push_pulls among them
    get. */
static int finish_round(zd_ps_server_t *s, round_t *r)
{
    float count = (float)s->n_pushed;
    for (int i = 0; i < s->n; i++) {
        float *sum = zd_tensor_data(s->sums[i]);
        for (int64_t k = 0; k < zd_tensor_numel(s->sums[i]); k++)
            sum[k] /= count;
    }
    int rc = check_mean(s);
    if (rc == 0)
        rc = step(s, s->sums);
    if (rc == 0)
        s->stats.pushes += s->n_pushed;
    else
        refuse_round(s);
    bool any = false;
    for (int i = 0; i < s->n_pushed; i++)
        any = any || s->fetch[i];
    /* (without room for the flags, every answer is a push's: the
       clients pull) */
    if (rc == 0 && any && (r->fetch = malloc((size_t)s->n_pushed * sizeof *r->fetch))) {
        memcpy(r->fetch, s->fetch, (size_t)s->n_pushed * sizeof *r->fetch);
        r->copies = params_copies(s);
    }
    r->fs = take_waiting_into(s, r->room, &r->n);
    r->room = NULL;
    return rc;
}

/*  Sends a finished round's answers, if any (after the lock is let go),
    and frees what r holds. */
static void send_round(const zd_ps_server_t *s, round_t *r, zd_error_code_t code, int64_t version,
                       const char *text)
{
    int k = 0;
    for (int i = 0; i < r->n; i++) {
        if (code == ZD_OK && r->fetch && r->fetch[i]) {
            answer_params(s, r->fs[i], version, r->copies);
            zd_future_unref(r->fs[i]);
        } else {
            r->fs[k++] = r->fs[i];
        }
    }
    if (r->fs)
        answer_all(r->fs, k, code, version, text); /* frees r->fs */
    free(r->room);
    free(r->fetch);
    copies_free(s, r->copies);
    *r = (round_t){0};
}

/*  Adds grads to the round (under the lock), fetch: a push_pull's; when
    the round is complete, steps with their mean and takes its answers
    into *r. */
static int sync_push(zd_ps_server_t *s, zd_future_t *f, int caller, bool fetch, int64_t was,
                     zd_tensor_t *const *grads, round_t *r)
{
    for (int i = 0; i < s->n_pushed; i++)
        if (s->pushed_by[i] == caller)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "rank %d pushed twice in round %" PRId64 " of shard %d",
                                     caller, s->version, s->shard);
    if (s->n_pushed == 2 * s->opts.num_trainers)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "round %" PRId64 " of shard %d already has %d pushes, for %d "
                                 "trainers (num_trainers)",
                                 s->version, s->shard, s->n_pushed, s->opts.num_trainers);
    for (int i = 0; i < s->n; i++) {
        float *sum = zd_tensor_data(s->sums[i]);
        const float *g = zd_tensor_data(grads[i]);
        for (int64_t k = 0; k < zd_tensor_numel(grads[i]); k++)
            sum[k] += g[k];
    }
    s->pushed_by[s->n_pushed] = caller;
    s->round_rank[s->n_pushed] = caller;
    s->round_was[s->n_pushed] = was;
    s->fetch[s->n_pushed] = fetch;
    s->waiting[s->n_pushed++] = zd_future_ref(f);
    return round_complete(s) ? finish_round(s, r) : 0;
}

/*  A push: answered [code, version, text], or with fetch (push_pull),
    once taken, with the parameters after its step as a pull's answer. */
static zd_future_t *push(zd_rpc_call_t *call, zd_value_t *args, zd_ps_server_t *s, bool fetch)
{
    zd_future_t *f = zd_future_new();
    zd_tensor_t **grads = calloc((size_t)s->n, sizeof *grads);
    if (!f || !grads) {
        zd_future_unref(f);
        free(grads);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
        return NULL;
    }
    int64_t version = -1, position = -1;
    zd_error_code_t code = ZD_OK;
    char text[512] = "";
    round_t done = {0};          /* a round this push finished */
    bool undone = false;         /* the step this push made or finished failed: not a bad push */
    bool reply = true;           /* false: f waits for the round */
    zd_tensor_t **copies = NULL; /* asynchronous: the parameters f carries */
    if (s->opts.mode == ZD_PS_SYNC && !(done.room = answers_room(s))) {
        free(grads);
        answer(f, ZD_ERR_NO_MEMORY, 0, "ps: out of memory");
        return f;
    }
    int caller = zd_rpc_call_caller_rank(call);
    /* [version, position (when the trainer set one), name, grad, ...] */
    size_t pairs = zd_value_kind(zd_list_get(args, 1)) == ZD_VALUE_INT ? 2 : 1;
    pthread_mutex_lock(&s->lock);
    trainer_seen(s, caller);
    int64_t now = s->version;
    if (s->stopped) {
        code = ZD_ERR_STOPPED;
        snprintf(text, sizeof text, "shard %d stopped", s->shard);
    } else if (zd_rpc_arg_int(args, 0, &version) < 0 ||
               (pairs == 2 && zd_rpc_arg_int(args, 1, &position) < 0) ||
               zd__ps_read_pairs(args, pairs, s->names, s->params, s->all, s->n, grads) < 0) {
        code = ZD_ERR_ARGUMENT;
        snprintf(text, sizeof text, "refused by shard %d: %s", s->shard, zd_error_last());
    } else if (version < 0 || (pairs == 2 && position < 0)) {
        code = ZD_ERR_ARGUMENT;
        snprintf(text, sizeof text, "refused by shard %d: %s %" PRId64, s->shard,
                 version < 0 ? "version" : "position", version < 0 ? version : position);
    } else if (version > now) {
        /* The shard restarted from a checkpoint older than what the
           trainer pulled: pull again. */
        code = ZD_ERR_STALE;
        snprintf(text, sizeof text,
                 "refused by shard %d as stale: computed on version %" PRId64
                 ", which the shard (now at %" PRId64 ", resumed from a checkpoint) is past",
                 s->shard, version, now);
    } else if (s->opts.mode == ZD_PS_SYNC
                   ? version < now
                   : s->opts.max_staleness >= 0 && now - version > s->opts.max_staleness) {
        code = ZD_ERR_STALE;
        snprintf(text, sizeof text,
                 "refused by shard %d as stale: computed on version %" PRId64
                 ", the shard is at %" PRId64 " (max_staleness %" PRId64 ")",
                 s->shard, version, now, s->opts.mode == ZD_PS_SYNC ? 0 : s->opts.max_staleness);
    } else if (s->opts.mode == ZD_PS_ASYNC) {
        /* before the step, which may write the checkpoint that holds it */
        int64_t was = caller >= 0 && caller < s->n_positions ? s->positions[caller] : -1;
        zd__ps_positions_record(&s->positions, &s->n_positions, caller, position);
        if (step(s, grads) < 0) {
            code = zd_error_code() == ZD_ERR_ARGUMENT ? ZD_ERR_ARGUMENT : ZD_ERR_OTHER;
            snprintf(text, sizeof text, "shard %d: %s", s->shard, zd_error_last());
            if (position >= 0 && caller < s->n_positions)
                s->positions[caller] = was;
            undone = true;
        } else {
            s->stats.pushes++;
        }
    } else {
        /* a push taken into the round counts; the round's step writes it */
        int64_t was = caller >= 0 && caller < s->n_positions ? s->positions[caller] : -1;
        zd__ps_positions_record(&s->positions, &s->n_positions, caller, position);
        int rc = sync_push(s, f, caller, fetch, was, grads, &done);
        if (rc < 0) {
            code = zd_error_code() == ZD_ERR_ARGUMENT ? ZD_ERR_ARGUMENT : ZD_ERR_OTHER;
            snprintf(text, sizeof text, "shard %d: %s", s->shard, zd_error_last());
            if (position >= 0 && caller < s->n_positions && !done.fs)
                s->positions[caller] = was;
            undone = done.fs != NULL; /* the round's step, not this push */
        } else if (!done.fs) {
            reply = false;
        }
    }
    if (code == ZD_ERR_STALE)
        s->stats.stale++;
    else if (code == ZD_ERR_ARGUMENT && !undone)
        s->stats.refused++;
    now = s->version;
    if (reply && !done.fs && fetch && code == ZD_OK)
        copies = params_copies(s);
    pthread_mutex_unlock(&s->lock);
    free(grads);
    /* f is among a round's answers when it completed it (or the round
       failed at its step) */
    bool in_round = done.fs != NULL;
    send_round(s, &done, code, now, text);
    if (!in_round && reply && fetch && code == ZD_OK)
        answer_params(s, f, now, copies);
    else if (!in_round && reply)
        answer(f, code, now, text);
    copies_free(s, copies);
    return f;
}

static zd_future_t *serve_push(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    return push(call, args, arg, false);
}

static zd_future_t *serve_push_pull(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    return push(call, args, arg, true);
}

static zd_value_t *serve_pull(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    zd_ps_server_t *s = arg;
    zd_value_t *v = NULL;
    pthread_mutex_lock(&s->lock);
    trainer_seen(s, zd_rpc_call_caller_rank(call));
    if (s->stopped) {
        char text[64];
        snprintf(text, sizeof text, "shard %d stopped", s->shard);
        v = answer_new(ZD_ERR_STOPPED, s->version, text);
        goto out;
    }
    /* Copies taken under the lock: a step after the answer leaves cannot
       tear what it carries. */
    zd_tensor_t **copies = params_copies(s);
    v = copies ? params_answer_new(s, s->version, copies) : NULL;
    copies_free(s, copies);
    s->stats.pulls += v != NULL;
out:
    pthread_mutex_unlock(&s->lock);
    if (!v)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: shard %d: out of memory", s->shard);
    return v;
}

/*  [] -> [code, version, text, position]: where the caller was in its data
    at its last push taken (-1: none), kept through checkpoints. */
static zd_value_t *serve_where(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    zd_ps_server_t *s = arg;
    int caller = zd_rpc_call_caller_rank(call);
    pthread_mutex_lock(&s->lock);
    trainer_seen(s, caller); /* a trainer asks: one this shard knows, for serve_back */
    int64_t position = caller >= 0 && caller < s->n_positions ? s->positions[caller] : -1;
    int64_t fresh = s->fresh, epoch = s->epoch;
    zd_value_t *v = answer_new(ZD_OK, s->version, "");
    pthread_mutex_unlock(&s->lock);
    if (v &&
        (zd_list_append(v, zd_value_int(position)) < 0 ||
         zd_list_append(v, zd_value_int(fresh)) < 0 ||
         zd_list_append(v, zd_value_int(epoch)) < 0)) {
        zd_value_unref(v);
        v = NULL;
    }
    if (!v)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: shard %d: out of memory", s->shard);
    return v;
}

/*  "__zd_ps_back_<K>"(from, to, epoch, dry): a synchronous shard at
    version `from` of epoch `epoch` (as its "where" answered) goes back to
    its checkpoint of version `to`, the version another shard resumed
    from: a round is then one round on every shard. Compare-and-set: a
    shard that moved on since (a round, another trainer's call) is
    refused as stale, and the caller looks again. With from == to, a
    shard that took no step since it resumed lets go of the pushes
    waiting in its round (computed on parameters of other shards given
    up). The pushes waiting are answered stale: their trainers pull
    again. dry: only whether it could. Only trainers of this shard may
    ask, and only for the generations it holds. */
static zd_value_t *serve_back(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_server_t *s = arg;
    int caller = zd_rpc_call_caller_rank(call);
    int64_t from, to, epoch, dry;
    if (ZD_UNPACK(args, &from, &to, &epoch, &dry) < 0)
        return NULL;
    /* the answers' room first: once the parameters went back, the pushes
       of the round given up must go, whatever the memory */
    zd_future_t **room = malloc(2 * (size_t)s->opts.num_trainers * sizeof *room), **fs = NULL;
    int n = 0;
    zd_error_code_t code = ZD_OK;
    char text[300] = "";
    pthread_mutex_lock(&s->lock);
    if (!room) {
        code = ZD_ERR_NO_MEMORY;
        snprintf(text, sizeof text, "shard %d: out of memory", s->shard);
    } else if (s->stopped) {
        code = ZD_ERR_STOPPED;
        snprintf(text, sizeof text, "shard %d stopped", s->shard);
    } else if (s->opts.mode != ZD_PS_SYNC || !s->ckpt_path || to < 0 || from < to || !s->trainer ||
               caller < 0 || caller >= s->n_ranks || s->trainer[caller] != TRAINER_LIVE) {
        code = ZD_ERR_ARGUMENT;
        snprintf(text, sizeof text,
                 "shard %d: going back from version %" PRId64 " to %" PRId64
                 " is for its trainers, synchronous shards with checkpoints, to an older version",
                 s->shard, from, to);
    } else if (s->version != from || s->epoch != epoch) {
        code = ZD_ERR_STALE;
        snprintf(text, sizeof text,
                 "shard %d is at version %" PRId64 " of epoch %" PRId64 ", not %" PRId64
                 " of %" PRId64,
                 s->shard, s->version, s->epoch, from, epoch);
    } else if (from == to) {
        if (!dry && s->fresh)
            fs = take_waiting_into(s, room, &n);
    } else if (to != s->ckpt_version && to != s->ckpt_before) {
        code = ZD_ERR_ARGUMENT;
        char held[64];
        if (s->ckpt_before >= 0)
            snprintf(held, sizeof held, "%" PRId64 " and %" PRId64, s->ckpt_version,
                     s->ckpt_before);
        else
            snprintf(held, sizeof held, "%" PRId64 " only", s->ckpt_version);
        snprintf(text, sizeof text,
                 "shard %d has no checkpoint of version %" PRId64 " (it holds %s)", s->shard, to,
                 held);
    } else if (!dry) {
        zd__ps_ckpt_t c = ckpt_of(s);
        int64_t v, older;
        if (zd__ps_checkpoint_load(&c, to, &v, NULL, &older) < 0) {
            /* the path stays in this process's log */
            zd__log(ZD_LOG_WARN, "%s", zd_error_last());
            code = ZD_ERR_ARGUMENT;
            snprintf(text, sizeof text,
                     "shard %d cannot read its checkpoint of version %" PRId64
                     " (its log says why)",
                     s->shard, to);
        } else {
            s->version = v;
            s->ckpt_version = v;
            s->ckpt_before = older;
            s->fresh = true;
            s->epoch++;
            fs = take_waiting_into(s, room, &n);
        }
    }
    int64_t now = s->version;
    pthread_mutex_unlock(&s->lock);
    if (fs) {
        char why[128];
        snprintf(why, sizeof why, "refused by shard %d as stale: it went back to version %" PRId64,
                 s->shard, now);
        answer_all(fs, n, ZD_ERR_STALE, now, why); /* frees room */
    } else {
        free(room);
    }
    zd_value_t *v = answer_new(code, now, text);
    if (!v)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: shard %d: out of memory", s->shard);
    return v;
}

/*  The synchronous shards of this process, told of lost peers: the peer
    lost callbacks live as long as the process, the shards do not. Lock
    order: g_shards.lock, then a shard's. */
static struct {
    pthread_mutex_t lock;
    zd_ps_server_t *first;
    bool listening;
} g_shards = {.lock = PTHREAD_MUTEX_INITIALIZER};

/*  A trainer lost: its round is no longer waited on for it (a push it
    made stays), which may complete the round. */
static void shard_peer_lost(zd_ps_server_t *s, int peer)
{
    /* without room the round completes at its next push instead */
    round_t done = {.room = answers_room(s)};
    zd_error_code_t code = ZD_OK;
    char text[512] = "";
    pthread_mutex_lock(&s->lock);
    if (s->trainer && peer < s->n_ranks && s->trainer[peer] == TRAINER_LIVE) {
        s->trainer[peer] = TRAINER_LOST;
        s->n_lost++;
        for (int i = 0; i < s->n_pushed; i++)
            if (s->pushed_by[i] == peer)
                s->pushed_by[i] = -1;
        if (done.room && !s->stopped && round_complete(s) && finish_round(s, &done) < 0) {
            code = zd_error_code() == ZD_ERR_ARGUMENT ? ZD_ERR_ARGUMENT : ZD_ERR_OTHER;
            snprintf(text, sizeof text, "shard %d: %s", s->shard, zd_error_last());
        }
    }
    int64_t now = s->version;
    pthread_mutex_unlock(&s->lock);
    send_round(s, &done, code, now, text);
}

static void on_peer_lost(void *arg, int peer, const char *name)
{
    (void)arg;
    (void)name;
    pthread_mutex_lock(&g_shards.lock);
    for (zd_ps_server_t *s = g_shards.first; s; s = s->next)
        shard_peer_lost(s, peer);
    pthread_mutex_unlock(&g_shards.lock);
}

static int enlist(zd_ps_server_t *s)
{
    pthread_mutex_lock(&g_shards.lock);
    int rc = 0;
    if (!g_shards.listening) {
        rc = zd_rpc_register_peer_lost(on_peer_lost, NULL);
        g_shards.listening = rc == 0;
    }
    if (rc == 0) {
        s->next = g_shards.first;
        g_shards.first = s;
    }
    pthread_mutex_unlock(&g_shards.lock);
    return rc;
}

static void unlist(zd_ps_server_t *s)
{
    pthread_mutex_lock(&g_shards.lock);
    for (zd_ps_server_t **p = &g_shards.first; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&g_shards.lock);
}

zd_ps_server_t *zd_ps_server_new(const zd_named_tensors_t *params, int shard, int n_shards,
                                 const zd_optim_config_t *optim, const zd_ps_options_t *opts)
{
    zd_ps_options_t o;
    if (!params || !optim) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_server_new: params and optim are required");
        return NULL;
    }
    if (zd_optim_config_check(optim) < 0) {
        zd_error_wrap("zd_ps_server_new");
        return NULL;
    }
    if (n_shards < 1 || shard < 0 || shard >= n_shards) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_server_new: shard %d of %d", shard, n_shards);
        return NULL;
    }
    if (zd__ps_options_read(&o, opts) < 0 || zd__ps_check_params(params, "zd_ps_server_new") < 0)
        return NULL;
    int *shard_of = zd__ps_split_checked(params, n_shards, "zd_ps_server_new");
    if (!shard_of)
        return NULL;
    zd_ps_server_t *s = calloc(1, sizeof *s);
    int n = zd_named_tensors_len(params), mine = 0;
    for (int i = 0; i < n; i++)
        mine += shard_of[i] == shard;
    if (!s)
        goto oom;
    s->shard = shard;
    s->n_shards = n_shards;
    s->opts = o;
    pthread_mutex_init(&s->lock, NULL);
    snprintf(s->fn_pull, sizeof s->fn_pull, ZD__PS_FN_PULL "%d", shard);
    snprintf(s->fn_push, sizeof s->fn_push, ZD__PS_FN_PUSH "%d", shard);
    snprintf(s->fn_push_pull, sizeof s->fn_push_pull, ZD__PS_FN_PUSH_PULL "%d", shard);
    snprintf(s->fn_where, sizeof s->fn_where, ZD__PS_FN_WHERE "%d", shard);
    snprintf(s->fn_back, sizeof s->fn_back, ZD__PS_FN_BACK "%d", shard);
    s->names = calloc((size_t)mine, sizeof *s->names);
    s->params = calloc((size_t)mine, sizeof *s->params);
    s->sums = calloc((size_t)mine, sizeof *s->sums);
    s->before = calloc((size_t)mine, sizeof *s->before);
    s->all = malloc((size_t)mine * sizeof *s->all);
    /* A trainer lost after its push and back in the same round pushes
       twice: room for each trainer's two. */
    s->pushed_by = calloc(2 * (size_t)o.num_trainers, sizeof *s->pushed_by);
    s->waiting = calloc(2 * (size_t)o.num_trainers, sizeof *s->waiting);
    s->fetch = calloc(2 * (size_t)o.num_trainers, sizeof *s->fetch);
    s->round_rank = calloc(2 * (size_t)o.num_trainers, sizeof *s->round_rank);
    s->round_was = calloc(2 * (size_t)o.num_trainers, sizeof *s->round_was);
    if (!s->names || !s->params || !s->sums || !s->before || !s->all || !s->pushed_by ||
        !s->waiting || !s->fetch || !s->round_rank || !s->round_was)
        goto oom;
    for (int i = 0; i < n; i++) {
        if (shard_of[i] != shard)
            continue;
        zd_tensor_t *t = zd_named_tensors_tensor(params, i);
        int k = s->n++;
        s->all[k] = true;
        if (!(s->names[k] = strdup(zd_named_tensors_name(params, i))) ||
            !(s->params[k] = zd_tensor_detach_copy(t)) ||
            !(s->sums[k] = zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(t), zd_tensor_ndim(t))) ||
            !(s->before[k] = zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(t), zd_tensor_ndim(t))))
            goto oom;
    }
    free(shard_of);
    shard_of = NULL;
    if (!(s->opt = zd_optim_new(optim, s->params, s->n))) {
        zd_error_wrap("zd_ps_server_new: shard %d", shard);
        goto fail;
    }
    s->ckpt_version = s->ckpt_before = -1;
    s->opts.checkpoint_path = NULL; /* the caller's: ckpt_path is the shard's copy */
    if (o.checkpoint_path && !(s->ckpt_path = zd__ps_checkpoint_path(o.checkpoint_path, shard)))
        goto fail;
    s->opts.run_tag = NULL; /* (the caller's: run_tag is the shard's copy) */
    if (o.checkpoint_path && o.run_tag && *o.run_tag && !(s->run_tag = strdup(o.run_tag))) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_server_new: out of memory");
        goto fail;
    }
    zd__ps_ckpt_t prep = ckpt_of(s);
    if (s->ckpt_path && zd__ps_checkpoint_prepare(&prep) < 0)
        goto fail;
    if (o.resume) {
        zd__ps_ckpt_t c = ckpt_of(s);
        int r = zd__ps_checkpoint_load(&c, -1, &s->version, NULL, &s->ckpt_before);
        if (r == -2)
            goto fail;
        if (r == 0)
            s->ckpt_version = s->version;
        /* a resumed run's shard without a file is fresh at 0 too: the
           others cannot then be of a later generation unnoticed */
        s->fresh = true;
        s->epoch = 1;
    } else if (s->ckpt_path) {
        /* a new run: an earlier run's files there, newer than this run's
           first ones, must not be what a restart resumes from */
        zd__ps_ckpt_t c = ckpt_of(s);
        zd__ps_checkpoint_set_aside(&c);
    }
    /* A synchronous shard of a new run (made with resume or not: an
       operator's --resume comes with the restart) writes its version 0:
       one started again before the first checkpoint can then be joined
       by the others going back to it. */
    if (s->ckpt_path && s->ckpt_version < 0 && o.mode == ZD_PS_SYNC && write_checkpoint(s) < 0) {
        zd_error_wrap("zd_ps_server_new: shard %d", shard);
        goto fail;
    }
    zd_rpc_function_t push = zd_rpc_function_default(), push_pull = push;
    push.async_fn = serve_push;
    push.arg = s;
    push_pull.async_fn = serve_push_pull;
    push_pull.arg = s;
    if (zd_rpc_register_function(s->fn_push, &push) < 0 ||
        zd_rpc_register_function(s->fn_push_pull, &push_pull) < 0 ||
        zd_rpc_register(s->fn_pull, serve_pull, s) < 0 ||
        zd_rpc_register(s->fn_where, serve_where, s) < 0 ||
        zd_rpc_register(s->fn_back, serve_back, s) < 0) {
        zd_rpc_unregister(s->fn_push);
        zd_rpc_unregister(s->fn_push_pull);
        zd_rpc_unregister(s->fn_pull);
        zd_rpc_unregister(s->fn_where);
        goto fail;
    }
    if (o.mode == ZD_PS_SYNC && enlist(s) < 0) {
        zd_error_wrap("zd_ps_server_new: shard %d", shard);
        goto fail_registered;
    }
    return s;
fail_registered:
    zd_ps_server_free(s);
    return NULL;
oom:
    zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_server_new: out of memory");
fail:
    free(shard_of);
    if (s) {
        /* Nothing registered: free without unregistering. */
        s->fn_pull[0] = s->fn_push[0] = s->fn_push_pull[0] = s->fn_where[0] = s->fn_back[0] = '\0';
        zd_ps_server_free(s);
    }
    return NULL;
}

zd_ps_server_t *zd_ps_server_new_module(const zd_nn_module_t *m, int shard, int n_shards,
                                        const zd_optim_config_t *optim, const zd_ps_options_t *opts)
{
    zd_named_tensors_t *params = zd__ps_module_params(m);
    if (!params)
        return NULL;
    zd_ps_server_t *s = zd_ps_server_new(params, shard, n_shards, optim, opts);
    zd_named_tensors_free(params);
    return s;
}

int zd_ps_server_checkpoint(zd_ps_server_t *s)
{
    if (!s)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_server_checkpoint: NULL");
    pthread_mutex_lock(&s->lock);
    /* a second write of the version on disk would leave one generation,
       twice: none to go back to */
    int rc = s->version == s->ckpt_version && s->ckpt_path ? 0 : write_checkpoint(s);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int zd_ps_server_stop(zd_ps_server_t *s)
{
    if (!s)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_server_stop: NULL");
    char text[64];
    snprintf(text, sizeof text, "shard %d stopped", s->shard);
    /* the waiting pushes one at a time, each answered with the lock let
       go: no allocation that could fail (no push joins once stopped) */
    pthread_mutex_lock(&s->lock);
    s->stopped = true;
    while (s->n_pushed > 0) {
        zd_future_t *f = s->waiting[--s->n_pushed];
        int64_t version = s->version;
        pthread_mutex_unlock(&s->lock);
        answer(f, ZD_ERR_STOPPED, version, text);
        zd_future_unref(f);
        pthread_mutex_lock(&s->lock);
    }
    for (int i = 0; i < s->n; i++)
        zd_tensor_zero_(s->sums[i]);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int64_t zd_ps_server_version(zd_ps_server_t *s)
{
    if (!s)
        return -1;
    pthread_mutex_lock(&s->lock);
    int64_t v = s->version;
    pthread_mutex_unlock(&s->lock);
    return v;
}

int zd_ps_server_stats(zd_ps_server_t *s, zd_ps_server_stats_t *out, size_t size)
{
    if (!s)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_server_stats: NULL shard");
    pthread_mutex_lock(&s->lock);
    zd_ps_server_stats_t st = s->stats;
    st.version = s->version;
    st.waiting = s->n_pushed;
    pthread_mutex_unlock(&s->lock);
    return zd__sized_write(out, size, &st, sizeof st,
                           ZD__SIZE_THROUGH(zd_ps_server_stats_t, waiting), "zd_ps_server_stats");
}

zd_named_tensors_t *zd_ps_server_params(zd_ps_server_t *s)
{
    if (!s) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_server_params: NULL");
        return NULL;
    }
    zd_named_tensors_t *nt = zd_named_tensors_new();
    pthread_mutex_lock(&s->lock);
    for (int i = 0; nt && i < s->n; i++) {
        zd_tensor_t *copy = zd_tensor_detach_copy(s->params[i]);
        int rc = copy ? zd_named_tensors_add(nt, s->names[i], copy) : -1;
        zd_tensor_unref(copy);
        if (rc < 0) {
            zd_named_tensors_free(nt);
            nt = NULL;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return nt;
}

void zd_ps_server_free(zd_ps_server_t *s)
{
    if (!s)
        return;
    unlist(s);
    if (s->fn_push[0]) {
        zd_rpc_unregister(s->fn_push);
        zd_rpc_unregister(s->fn_push_pull);
        zd_rpc_unregister(s->fn_pull);
        zd_rpc_unregister(s->fn_where);
        zd_rpc_unregister(s->fn_back);
    }
    if (s->waiting)
        zd_ps_server_stop(s); /* answers a round left incomplete, so no future leaks */
    for (int i = 0; i < s->n; i++) {
        free(s->names[i]);
        zd_tensor_unref(s->params[i]);
        zd_tensor_unref(s->sums[i]);
        zd_tensor_unref(s->before[i]);
    }
    zd_optim_free(s->opt);
    free(s->names);
    free(s->params);
    free(s->sums);
    free(s->before);
    free(s->all);
    free(s->pushed_by);
    free(s->waiting);
    free(s->fetch);
    free(s->round_rank);
    free(s->round_was);
    free(s->trainer);
    free(s->positions);
    free(s->known);
    free(s->ckpt_path);
    free(s->run_tag);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
