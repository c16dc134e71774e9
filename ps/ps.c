/* SPDX-License-Identifier: MIT */
/*  ps.c: the push/pull parameter server (ps.h).

    A shard serves two functions of its own, "__zd_ps_pull_<shard>" and
    "__zd_ps_push_<shard>", so that one process may serve several shards.
    Every answer is a list [code, version, text, ...] rather than an RPC
    error: an RPC error reaches the caller as ZD_ERR_REMOTE whatever its
    code, and a trainer must tell a stale push from a refused one. The
    codes a shard may answer are a fixed few; the client reads any other
    as a bad answer. */
#include <zdist/ps.h>

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "core/sized.h"
#include "ps/ps_private.h"

#define FN_PULL  "__zd_ps_pull_"
#define FN_PUSH  "__zd_ps_push_"
#define FN_WHERE "__zd_ps_where_"
#define FN_BACK  "__zd_ps_back_"

int zd__ps_options_read(zd_ps_options_t *o, const zd_ps_options_t *in)
{
    *o = zd_ps_options_default();
    if (in &&
        zd__sized_read(o, sizeof *o, in, ZD__SIZE_THROUGH(zd_ps_options_t, max_staleness),
                       "zd_ps_options_t", "zd_ps_options_default()") < 0)
        return -1;
    if (o->mode != ZD_PS_ASYNC && o->mode != ZD_PS_SYNC)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: unknown mode %d", (int)o->mode);
    if (o->mode == ZD_PS_SYNC && o->num_trainers < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: num_trainers must be >= 1, got %d",
                                 o->num_trainers);
    if (o->checkpoint_every < 0 || ((o->resume || o->checkpoint_every) && !o->checkpoint_path))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: checkpoint_every (%" PRId64 ") must be >= 0, and it and "
                                 "resume need a checkpoint_path",
                                 o->checkpoint_every);
    if (o->mode == ZD_PS_SYNC && (o->min_trainers < 1 || o->min_trainers > o->num_trainers))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: min_trainers must be in [1, num_trainers = %d], got %d",
                                 o->num_trainers, o->min_trainers);
    if (o->stage_outputs < 1 || o->stage_outputs > ZD__PS_MAX_TENSORS || o->max_input_numel < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: stage_outputs must be in [1, %d] and max_input_numel >= 1, "
                                 "got %d and %" PRId64,
                                 ZD__PS_MAX_TENSORS, o->stage_outputs, o->max_input_numel);
    if (o->max_inflight < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: max_inflight must be >= 0, got %d",
                                 o->max_inflight);
    return 0;
}

/*  ---- the split ---- */

typedef struct {
    const char *name;
    int64_t numel;
    int index;
} split_item_t;

static int by_size_then_name(const void *a, const void *b)
{
    const split_item_t *x = a, *y = b;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1;
    return strcmp(x->name, y->name);
}

int zd_ps_split(const zd_named_tensors_t *params, int n_shards, int *shard_of, int n)
{
    if (!params || !shard_of || n_shards < 1 || n != zd_named_tensors_len(params))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_ps_split: give the tensors, n_shards >= 1 (got %d) and an "
                                 "array of their number (%d, got %d)",
                                 n_shards, params ? zd_named_tensors_len(params) : 0, n);
    if (n == 0)
        return 0;
    split_item_t *items = malloc((size_t)n * sizeof *items);
    int64_t *load = calloc((size_t)n_shards, sizeof *load);
    if (!items || !load) {
        free(items);
        free(load);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_split: out of memory");
    }
    for (int i = 0; i < n; i++)
        items[i] = (split_item_t){zd_named_tensors_name(params, i),
                                  zd_tensor_numel(zd_named_tensors_tensor(params, i)), i};
    /* Largest first onto the lightest shard: sorted by size and name, so
       that the order the process listed them in does not matter. */
    qsort(items, (size_t)n, sizeof *items, by_size_then_name);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int s = 1; s < n_shards; s++)
            if (load[s] < load[best])
                best = s;
        load[best] += items[i].numel;
        shard_of[items[i].index] = best;
    }
    free(items);
    free(load);
    return 0;
}

/*  The tensors a process gives must be float32, and each tensor once:
    a tied tensor under two names would be stepped twice. */
static int check_params(const zd_named_tensors_t *params, const char *who)
{
    int n = zd_named_tensors_len(params);
    if (n < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no tensors to serve", who);
    for (int i = 0; i < n; i++) {
        zd_tensor_t *t = zd_named_tensors_tensor(params, i);
        if (zd_tensor_dtype(t) != ZD_FLOAT32)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: \"%s\" is %s, not float32", who,
                                     zd_named_tensors_name(params, i),
                                     zd_tensor_dtype_name(zd_tensor_dtype(t)));
        for (int j = 0; j < i; j++)
            if (zd_named_tensors_tensor(params, j) == t)
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "%s: \"%s\" and \"%s\" are the same tensor (tied): give "
                                         "it once",
                                         who, zd_named_tensors_name(params, j),
                                         zd_named_tensors_name(params, i));
    }
    return 0;
}

/*  The split of params, checked to leave no shard empty: caller frees. */
static int *split_checked(const zd_named_tensors_t *params, int n_shards, const char *who)
{
    int n = zd_named_tensors_len(params);
    int *shard_of = malloc((size_t)n * sizeof *shard_of);
    int *count = calloc((size_t)(n_shards > 0 ? n_shards : 1), sizeof *count);
    if (!shard_of || !count) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", who);
        goto fail;
    }
    if (zd_ps_split(params, n_shards, shard_of, n) < 0) {
        zd_error_wrap("%s", who);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        count[shard_of[i]]++;
    for (int s = 0; s < n_shards; s++)
        if (count[s] == 0) {
            zd_error_set_code(ZD_ERR_ARGUMENT, "%s: %d tensors leave shard %d of %d empty", who, n,
                              s, n_shards);
            goto fail;
        }
    free(count);
    return shard_of;
fail:
    free(shard_of);
    free(count);
    return NULL;
}

/*  A module's parameters, each tensor once: a new object. */
static zd_named_tensors_t *module_params(const zd_nn_module_t *m)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    for (int i = 0; nt && m && i < zd_nn_module_n_params(m); i++)
        if (zd_named_tensors_add(nt, zd_nn_module_param_name(m, i), zd_nn_module_param(m, i)) < 0) {
            zd_named_tensors_free(nt);
            return NULL;
        }
    if (!m) {
        zd_named_tensors_free(nt);
        zd_error_set_code(ZD_ERR_ARGUMENT, "ps: the module is NULL");
        return NULL;
    }
    return nt;
}

/*  The first element of t that is not finite, or -1. */
int64_t zd__ps_first_not_finite(const zd_tensor_t *t)
{
    const float *p = zd_tensor_data(t);
    int64_t n = zd_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(p[i]))
            return i;
    return -1;
}

/*  t, checked against the served tensor like: dtype, shape, finite. */
static int check_tensor(const zd_tensor_t *t, const zd_tensor_t *like, const char *name)
{
    char want[96], got[96];
    if (zd_tensor_dtype(t) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" is %s, not float32", name,
                                 zd_tensor_dtype_name(zd_tensor_dtype(t)));
    if (!zd_tensor_same_shape(t, like))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" has shape %s, not %s", name,
                                 zd_tensor_shape_str(t, got, sizeof got),
                                 zd_tensor_shape_str(like, want, sizeof want));
    int64_t bad = zd__ps_first_not_finite(t);
    if (bad >= 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" element %" PRId64 " is %g, not finite",
                                 name, bad, (double)zd_tensor_data(t)[bad]);
    return 0;
}

/*  Reads the (name, tensor) pairs of list from item `from` on, for the
    n tensors `names`/`like` (want[i] false: not expected here, as an
    unknown name): got[i] borrowed from list. Each expected name exactly
    once. */
static int read_pairs(const zd_value_t *list, size_t from, char *const *names,
                      zd_tensor_t *const *like, const bool *want, int n, zd_tensor_t **got)
{
    size_t len = zd_list_len(list);
    if (len < from || (len - from) % 2 != 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected (name, tensor) pairs, got %zu items",
                                 len - from);
    for (int i = 0; i < n; i++)
        got[i] = NULL;
    for (size_t k = from; k < len; k += 2) {
        const char *name;
        zd_tensor_t *t;
        if (zd_value_get_string(zd_list_get(list, k), &name) < 0 ||
            zd_value_get_tensor(zd_list_get(list, k + 1), &t) < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "item %zu: %s", k, zd_error_last());
        int i = 0;
        while (i < n && !(want[i] && strcmp(names[i], name) == 0))
            i++;
        if (i == n)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "no tensor \"%.80s\" here", name);
        if (got[i])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" given twice", names[i]);
        if (check_tensor(t, like[i], names[i]) < 0)
            return -1;
        got[i] = t;
    }
    for (int i = 0; i < n; i++)
        if (want[i] && !got[i])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" missing", names[i]);
    return 0;
}

/*  ---- server side ---- */

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

/*  Takes the round's waiting answers out (under the lock): the caller
    completes them once it let the lock go, since completing one sends it. */
static zd_future_t **take_waiting_into(zd_ps_server_t *s, zd_future_t **out, int *n);

static zd_future_t **take_waiting(zd_ps_server_t *s, int *n)
{
    *n = 0;
    zd_future_t **out = malloc((size_t)(s->n_pushed ? s->n_pushed : 1) * sizeof *out);
    return out ? take_waiting_into(s, out, n) : NULL;
}

/*  take_waiting into out, room for 2 num_trainers answers: cannot fail. */
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
    return (zd__ps_ckpt_t){
        s->ckpt_path,  s->shard,        s->n_shards, s->n,       s->names,  s->params,  s->opt,
        &s->positions, &s->n_positions, s->trainer,  s->n_ranks, &s->known, &s->n_known};
}

/*  The shard's checkpoint now (under the lock). 0, or -1. */
static int write_checkpoint(zd_ps_server_t *s)
{
    zd__ps_ckpt_t c = ckpt_of(s);
    if (zd__ps_checkpoint_write(&c, s->version) < 0)
        return -1;
    s->ckpt_before = s->ckpt_version;
    s->ckpt_version = s->version;
    return 0;
}

/*  One step with grads (under the lock), and the checkpoint it is due
    for. A checkpoint that fails is logged, not the step's failure: the
    step happened, and the last whole generation stays on disk. */
static int step(zd_ps_server_t *s, zd_tensor_t *const *grads)
{
    if (zd_optim_step(s->opt, grads) < 0)
        return -1;
    s->version++;
    s->fresh = false;
    if (s->opts.on_step)
        s->opts.on_step(s->opts.on_step_arg, s->shard, s->version);
    int64_t every = s->opts.checkpoint_every;
    if (every > 0 && s->version % every == 0 && write_checkpoint(s) < 0)
        zd__log(ZD_LOG_WARN,
                "%s (the shard goes on; the last checkpoint is of version %" PRId64 ")",
                zd_error_last(), s->ckpt_version);
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

/*  Steps with the mean of the round (under the lock). *done: the answers
    to send. */
static int finish_round(zd_ps_server_t *s, zd_future_t ***done, int *n_done)
{
    float count = (float)s->n_pushed;
    for (int i = 0; i < s->n; i++) {
        float *sum = zd_tensor_data(s->sums[i]);
        for (int64_t k = 0; k < zd_tensor_numel(s->sums[i]); k++)
            sum[k] /= count;
    }
    int rc = step(s, s->sums);
    *done = take_waiting(s, n_done);
    if (!*done) {
        /* Out of memory: the answers are lost with the list; their
           callers time out rather than hang. */
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    }
    return rc;
}

/*  Adds grads to the round (under the lock); when the round is complete,
    steps with their mean. *done: the answers to send, else NULL. */
static int sync_push(zd_ps_server_t *s, zd_future_t *f, int caller, zd_tensor_t *const *grads,
                     zd_future_t ***done, int *n_done)
{
    *done = NULL;
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
    s->waiting[s->n_pushed++] = zd_future_ref(f);
    return round_complete(s) ? finish_round(s, done, n_done) : 0;
}

static zd_future_t *serve_push(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_server_t *s = arg;
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
    zd_future_t **done = NULL;
    int n_done = 0;
    bool reply = true; /* false: f waits for the round */
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
               read_pairs(args, pairs, s->names, s->params, s->all, s->n, grads) < 0) {
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
            code = ZD_ERR_OTHER;
            snprintf(text, sizeof text, "shard %d: %s", s->shard, zd_error_last());
            if (position >= 0 && caller < s->n_positions)
                s->positions[caller] = was;
        }
    } else {
        /* a push taken into the round counts; the round's step writes it */
        int64_t was = caller >= 0 && caller < s->n_positions ? s->positions[caller] : -1;
        zd__ps_positions_record(&s->positions, &s->n_positions, caller, position);
        int rc = sync_push(s, f, caller, grads, &done, &n_done);
        if (rc < 0) {
            code = zd_error_code() == ZD_ERR_ARGUMENT ? ZD_ERR_ARGUMENT : ZD_ERR_OTHER;
            snprintf(text, sizeof text, "shard %d: %s", s->shard, zd_error_last());
            if (position >= 0 && caller < s->n_positions && !done)
                s->positions[caller] = was;
        } else if (!done) {
            reply = false;
        }
    }
    now = s->version;
    pthread_mutex_unlock(&s->lock);
    free(grads);
    if (done) {
        /* f is among them when the round is complete (or failed at its step). */
        answer_all(done, n_done, code, now, text);
    } else if (reply) {
        answer(f, code, now, text);
    }
    return f;
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
    v = answer_new(ZD_OK, s->version, "");
    for (int i = 0; v && i < s->n; i++) {
        zd_tensor_t *copy = zd_tensor_detach_copy(s->params[i]);
        zd_value_t *t = copy ? zd_value_tensor(copy) : NULL;
        zd_tensor_unref(copy);
        if (!t || zd_list_append(v, zd_value_string(s->names[i])) < 0 || zd_list_append(v, t) < 0) {
            zd_value_unref(v);
            v = NULL;
        }
    }
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
        if (zd__ps_checkpoint_load(&c, to, &v, &older) < 0) {
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
    zd_future_t **done = NULL;
    int n_done = 0;
    zd_error_code_t code = ZD_OK;
    char text[256] = "";
    pthread_mutex_lock(&s->lock);
    if (s->trainer && peer < s->n_ranks && s->trainer[peer] == TRAINER_LIVE) {
        s->trainer[peer] = TRAINER_LOST;
        s->n_lost++;
        for (int i = 0; i < s->n_pushed; i++)
            if (s->pushed_by[i] == peer)
                s->pushed_by[i] = -1;
        if (!s->stopped && round_complete(s) && finish_round(s, &done, &n_done) < 0) {
            code = ZD_ERR_OTHER;
            snprintf(text, sizeof text, "shard %d: %s", s->shard, zd_error_last());
        }
    }
    int64_t now = s->version;
    pthread_mutex_unlock(&s->lock);
    if (done)
        answer_all(done, n_done, code, now, text);
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
    if (zd__ps_options_read(&o, opts) < 0 || check_params(params, "zd_ps_server_new") < 0)
        return NULL;
    int *shard_of = split_checked(params, n_shards, "zd_ps_server_new");
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
    snprintf(s->fn_pull, sizeof s->fn_pull, FN_PULL "%d", shard);
    snprintf(s->fn_push, sizeof s->fn_push, FN_PUSH "%d", shard);
    snprintf(s->fn_where, sizeof s->fn_where, FN_WHERE "%d", shard);
    snprintf(s->fn_back, sizeof s->fn_back, FN_BACK "%d", shard);
    s->names = calloc((size_t)mine, sizeof *s->names);
    s->params = calloc((size_t)mine, sizeof *s->params);
    s->sums = calloc((size_t)mine, sizeof *s->sums);
    s->all = malloc((size_t)mine * sizeof *s->all);
    /* A trainer lost after its push and back in the same round pushes
       twice: room for each trainer's two. */
    s->pushed_by = calloc(2 * (size_t)o.num_trainers, sizeof *s->pushed_by);
    s->waiting = calloc(2 * (size_t)o.num_trainers, sizeof *s->waiting);
    if (!s->names || !s->params || !s->sums || !s->all || !s->pushed_by || !s->waiting)
        goto oom;
    for (int i = 0; i < n; i++) {
        if (shard_of[i] != shard)
            continue;
        zd_tensor_t *t = zd_named_tensors_tensor(params, i);
        int k = s->n++;
        s->all[k] = true;
        if (!(s->names[k] = strdup(zd_named_tensors_name(params, i))) ||
            !(s->params[k] = zd_tensor_detach_copy(t)) ||
            !(s->sums[k] = zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(t), zd_tensor_ndim(t))))
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
    if (o.resume) {
        zd__ps_ckpt_t c = ckpt_of(s);
        int r = zd__ps_checkpoint_load(&c, -1, &s->version, &s->ckpt_before);
        if (r == -2)
            goto fail;
        if (r == 0)
            s->ckpt_version = s->version;
        /* a resumed run's shard without a file is fresh at 0 too: the
           others cannot then be of a later generation unnoticed */
        s->fresh = true;
        s->epoch = 1;
        /* A synchronous shard of a new run writes its version 0: one
           started again before the first checkpoint can then be joined
           by the others going back to it. */
        if (r == -1 && o.mode == ZD_PS_SYNC && write_checkpoint(s) < 0) {
            zd_error_wrap("zd_ps_server_new: shard %d", shard);
            goto fail;
        }
    }
    zd_rpc_function_t push = zd_rpc_function_default();
    push.async_fn = serve_push;
    push.arg = s;
    if (zd_rpc_register_function(s->fn_push, &push) < 0 ||
        zd_rpc_register(s->fn_pull, serve_pull, s) < 0 ||
        zd_rpc_register(s->fn_where, serve_where, s) < 0 ||
        zd_rpc_register(s->fn_back, serve_back, s) < 0) {
        zd_rpc_unregister(s->fn_push);
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
        s->fn_pull[0] = s->fn_push[0] = s->fn_where[0] = s->fn_back[0] = '\0';
        zd_ps_server_free(s);
    }
    return NULL;
}

zd_ps_server_t *zd_ps_server_new_module(const zd_nn_module_t *m, int shard, int n_shards,
                                        const zd_optim_config_t *optim, const zd_ps_options_t *opts)
{
    zd_named_tensors_t *params = module_params(m);
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
    pthread_mutex_lock(&s->lock);
    s->stopped = true;
    int n = 0;
    zd_future_t **fs = take_waiting(s, &n);
    int64_t version = s->version;
    pthread_mutex_unlock(&s->lock);
    char text[64];
    snprintf(text, sizeof text, "shard %d stopped", s->shard);
    answer_all(fs, n, ZD_ERR_STOPPED, version, text);
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
    }
    zd_optim_free(s->opt);
    free(s->names);
    free(s->params);
    free(s->sums);
    free(s->all);
    free(s->pushed_by);
    free(s->waiting);
    free(s->trainer);
    free(s->positions);
    free(s->known);
    free(s->ckpt_path);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/*  ---- trainer side ---- */

/*  How often each rank rejoined as a new process, seen from this one: a
    synchronous client knows a shard started again by it even when none
    of its own calls failed meanwhile (the shard died and came back while
    it computed), and brings the shards to one version before its next
    pull. Grown as ranks rejoin; out of memory, a join goes uncounted. */
static struct {
    pthread_mutex_t lock;
    int64_t *count;
    int n;
    bool hooked;
} g_joins = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void on_peer_joined(void *arg, int peer, const char *name)
{
    (void)arg, (void)name;
    pthread_mutex_lock(&g_joins.lock);
    if (peer >= g_joins.n) {
        int64_t *grown = realloc(g_joins.count, (size_t)(peer + 1) * sizeof *grown);
        if (grown) {
            memset(grown + g_joins.n, 0, (size_t)(peer + 1 - g_joins.n) * sizeof *grown);
            g_joins.count = grown;
            g_joins.n = peer + 1;
        }
    }
    if (peer >= 0 && peer < g_joins.n)
        g_joins.count[peer]++;
    pthread_mutex_unlock(&g_joins.lock);
}

static int64_t join_count(int rank)
{
    pthread_mutex_lock(&g_joins.lock);
    int64_t n = rank >= 0 && rank < g_joins.n ? g_joins.count[rank] : 0;
    pthread_mutex_unlock(&g_joins.lock);
    return n;
}

static int listen_joins(void)
{
    pthread_mutex_lock(&g_joins.lock);
    int rc = 0;
    if (!g_joins.hooked) {
        rc = zd_rpc_register_peer_joined(on_peer_joined, NULL);
        g_joins.hooked = rc == 0;
    }
    pthread_mutex_unlock(&g_joins.lock);
    return rc;
}

struct zd_ps_client {
    zd_ps_options_t opts;
    int n_shards;
    int *ranks;        /* of each shard */
    int64_t *version;  /* of each shard's parameters in the replica */
    int n;             /* tensors */
    char **names;      /* theirs */
    zd_tensor_t **ts;  /* the replica's tensors (references) */
    int *shard_of;     /* of each tensor */
    bool *of_shard;    /* scratch: n flags, the tensors of one shard */
    zd_tensor_t **got; /* scratch: n tensors of an answer */
    int64_t stale;     /* pushes zd_ps_client_step computed again */
    int64_t rollbacks; /* pulls that found a shard's version lower than before */
    int64_t *seen;     /* the highest version of each shard a pull or push answered */
    /* ZD_PS_SYNC with several shards: each shard's rank's joins when last
       brought to one version (join_count), and agree_versions' scratch */
    int64_t *joins, *scratch_joins, *scratch_epoch;
    int64_t position; /* the pushes carry it (zd_ps_client_set_position); -1: none */
};

/*  A shard's process is new since the client last looked. */
static bool shard_rejoined(const zd_ps_client_t *c)
{
    for (int s = 0; c->joins && s < c->n_shards; s++)
        if (join_count(c->ranks[s]) != c->joins[s])
            return true;
    return false;
}

zd_ps_client_t *zd_ps_client_new(const zd_named_tensors_t *params, const int *shard_ranks,
                                 int n_shards, const zd_ps_options_t *opts)
{
    zd_ps_options_t o;
    if (!params || n_shards < 1) {
        zd_error_set_code(ZD_ERR_ARGUMENT,
                          "zd_ps_client_new: give the replica's tensors and n_shards >= 1 "
                          "(got %d)",
                          n_shards);
        return NULL;
    }
    if (zd__ps_options_read(&o, opts) < 0 || check_params(params, "zd_ps_client_new") < 0)
        return NULL;
    zd_ps_client_t *c = calloc(1, sizeof *c);
    int n = zd_named_tensors_len(params);
    if (!c)
        goto oom;
    c->opts = o;
    c->n_shards = n_shards;
    c->position = -1;
    c->ranks = malloc((size_t)n_shards * sizeof *c->ranks);
    c->version = malloc((size_t)n_shards * sizeof *c->version);
    c->seen = malloc((size_t)n_shards * sizeof *c->seen);
    c->names = calloc((size_t)n, sizeof *c->names);
    c->ts = calloc((size_t)n, sizeof *c->ts);
    c->of_shard = calloc((size_t)n, sizeof *c->of_shard);
    c->got = calloc((size_t)n, sizeof *c->got);
    if (!c->ranks || !c->version || !c->seen || !c->names || !c->ts || !c->of_shard || !c->got)
        goto oom;
    for (int s = 0; s < n_shards; s++) {
        c->ranks[s] = shard_ranks ? shard_ranks[s] : s;
        c->version[s] = c->seen[s] = -1;
    }
    for (int i = 0; i < n; i++) {
        c->n++;
        c->ts[i] = zd_tensor_ref(zd_named_tensors_tensor(params, i));
        if (!(c->names[i] = strdup(zd_named_tensors_name(params, i))))
            goto oom;
    }
    if (!(c->shard_of = split_checked(params, n_shards, "zd_ps_client_new")))
        goto fail;
    if (o.mode == ZD_PS_SYNC && n_shards > 1) {
        c->joins = calloc((size_t)n_shards, sizeof *c->joins);
        c->scratch_joins = calloc((size_t)n_shards, sizeof *c->scratch_joins);
        c->scratch_epoch = calloc((size_t)n_shards, sizeof *c->scratch_epoch);
        if (!c->joins || !c->scratch_joins || !c->scratch_epoch)
            goto oom;
        if (listen_joins() < 0) {
            zd_error_wrap("zd_ps_client_new");
            goto fail;
        }
        for (int s = 0; s < n_shards; s++)
            c->joins[s] = join_count(c->ranks[s]);
    }
    return c;
oom:
    zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_client_new: out of memory");
fail:
    zd_ps_client_free(c);
    return NULL;
}

zd_ps_client_t *zd_ps_client_new_module(zd_nn_module_t *m, const int *shard_ranks, int n_shards,
                                        const zd_ps_options_t *opts)
{
    zd_named_tensors_t *params = module_params(m);
    if (!params)
        return NULL;
    zd_ps_client_t *c = zd_ps_client_new(params, shard_ranks, n_shards, opts);
    zd_named_tensors_free(params);
    return c;
}

void zd_ps_client_free(zd_ps_client_t *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n; i++) {
        free(c->names[i]);
        zd_tensor_unref(c->ts[i]);
    }
    free(c->ranks);
    free(c->joins);
    free(c->scratch_joins);
    free(c->scratch_epoch);
    free(c->version);
    free(c->seen);
    free(c->names);
    free(c->ts);
    free(c->shard_of);
    free(c->of_shard);
    free(c->got);
    free(c);
}

int zd__ps_wait_ranks(const int *ranks, int n, int64_t timeout_ms)
{
    int64_t deadline = zd__deadline_after(zd__now_ns(), timeout_ms);
    for (int s = 0; s < n; s++) {
        int64_t left = ZD_TIMEOUT_NONE;
        if (deadline != ZD__NEVER) {
            left = zd__ms_left(zd__now_ns(), deadline);
            if (left < 1)
                left = 1;
        }
        if (zd_rpc_wait_peer(ranks[s], left) < 0)
            return zd_error_wrap("ps: shard %d (rank %d) not back", s, ranks[s]);
    }
    return 0;
}

static int agree_versions(zd_ps_client_t *c, int64_t timeout_ms, bool after_loss);

int zd__ps_wait_shards(const int *ranks, int n, int64_t timeout_ms, int (*agree)(void *), void *arg)
{
    int64_t deadline = zd__deadline_after(zd__now_ns(), timeout_ms);
    for (;;) {
        int64_t left =
            deadline == ZD__NEVER ? ZD_TIMEOUT_NONE : zd__ms_left(zd__now_ns(), deadline);
        if (zd__ps_wait_ranks(ranks, n, left > 0 || deadline == ZD__NEVER ? left : 1) < 0)
            return -1;
        if (agree(arg) == 0)
            return 0;
        /* A shard just back may not take calls from everyone yet (its
           connections are being made), or was lost again: wait again
           while the time lasts. */
        if (zd_error_code() != ZD_ERR_PEER ||
            (deadline != ZD__NEVER && zd__ms_left(zd__now_ns(), deadline) <= 0))
            return -1;
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}

static int agree_after_loss(void *c)
{
    return agree_versions(c, ZD_TIMEOUT_DEFAULT, true);
}

int zd_ps_client_wait_shards(zd_ps_client_t *c, int64_t timeout_ms)
{
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_client_wait_shards: NULL");
    return zd__ps_wait_shards(c->ranks, c->n_shards, timeout_ms, agree_after_loss, c);
}

/*  Stale pushes in a row after which a step gives up: the trainer is
    slower than max_staleness allows, and would otherwise spin. */
#define MAX_STALE_IN_A_ROW 100

int zd_ps_client_step(zd_ps_client_t *c, zd_ps_compute_fn *compute, void *arg, int64_t timeout_ms)
{
    if (!c || !compute)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_client_step: NULL %s",
                                 c ? "compute" : "client");
    for (int stale = 0;;) {
        for (int i = 0; i < c->n; i++)
            zd_tensor_clear_grad(c->ts[i]);
        if (zd_ps_client_pull(c, timeout_ms) == 0) {
            if (compute(arg) < 0)
                return zd_error_wrap("ps: step");
            if (zd_ps_client_push(c, timeout_ms) == 0)
                return 0;
        }
        zd_error_code_t code = zd_error_code();
        if (code == ZD_ERR_STALE && ++stale < MAX_STALE_IN_A_ROW) {
            c->stale++;
            continue;
        }
        if (code != ZD_ERR_PEER || c->opts.server_wait_ms < 0)
            return -1;
        if (c->opts.server_wait_ms > 0)
            zd__log(ZD_LOG_WARN, "%s; waiting up to %" PRId64 " s for it", zd_error_last(),
                    (c->opts.server_wait_ms + ZD__MS_PER_S - 1) / ZD__MS_PER_S);
        else
            zd__log(ZD_LOG_WARN, "%s; waiting for it", zd_error_last());
        if (zd_ps_client_wait_shards(c, c->opts.server_wait_ms) < 0)
            return -1;
    }
}

int64_t zd_ps_client_stale_pushes(const zd_ps_client_t *c)
{
    return c ? c->stale : 0;
}

int64_t zd_ps_client_rollbacks(const zd_ps_client_t *c)
{
    return c ? c->rollbacks : 0;
}

int64_t zd_ps_client_version(const zd_ps_client_t *c, int shard)
{
    if (!c || shard < 0 || shard >= c->n_shards)
        return -1;
    return c->version[shard];
}

static int64_t call_timeout(int64_t timeout_ms)
{
    return timeout_ms < 0 ? zd_rpc_get_timeout() : timeout_ms;
}

/*  Sets the error of a call to shard s that failed (f NULL: it could not
    start; the error is the thread's): a lost shard is ZD_ERR_PEER whatever
    the call saw first. */
static int call_failed(const zd_ps_client_t *c, int s, const char *what, zd_future_t *f)
{
    zd_error_code_t code = f ? zd_future_error_code(f) : zd_error_code();
    char text[512];
    snprintf(text, sizeof text, "%s", f ? zd_future_error(f) : zd_error_last());
    if (code == ZD_ERR_PEER || zd_rpc_peer_is_lost(c->ranks[s]))
        return zd_error_set_code(ZD_ERR_PEER, "ps: %s: shard %d (rank %d) lost: %s", what, s,
                                 c->ranks[s], text);
    return zd_error_set_code(code == ZD_OK ? ZD_ERR_OTHER : code, "ps: %s: shard %d (rank %d): %s",
                             what, s, c->ranks[s], text);
}

/*  Reads the head [code, version, text] of shard s's answer v; 0 with
    *version for ZD_OK, else -1 with the shard's code. */
static int read_head(const zd_ps_client_t *c, int s, const char *what, const zd_value_t *v,
                     int64_t *version)
{
    int64_t code;
    const char *text;
    if (zd_rpc_arg_int(v, 0, &code) < 0 || zd_rpc_arg_int(v, 1, version) < 0 ||
        zd_rpc_arg_string(v, 2, &text) < 0 || *version < 0)
        return zd_error_set_code(ZD_ERR_REMOTE, "ps: %s: shard %d (rank %d) answered badly: %s",
                                 what, s, c->ranks[s], zd_error_last());
    switch (code) {
    case ZD_OK:
        return 0;
    case ZD_ERR_STALE:
    case ZD_ERR_STOPPED:
    case ZD_ERR_ARGUMENT:
    case ZD_ERR_OTHER:
    case ZD_ERR_NO_MEMORY:
        return zd_error_set_code((zd_error_code_t)code, "ps: %s: %.400s", what, text);
    default:
        return zd_error_set_code(ZD_ERR_REMOTE,
                                 "ps: %s: shard %d (rank %d) answered with code %" PRId64, what, s,
                                 c->ranks[s], code);
    }
}

/*  Waits for the n_shards futures (each up to timeout_ms) and checks each
    answer's head; versions[s] gets shard s's version. The first failure
    in shard order is the error. */
static int wait_answers(const zd_ps_client_t *c, const char *what, zd_future_t **fs,
                        int64_t timeout_ms, int64_t *versions)
{
    int rc = 0;
    for (int s = 0; s < c->n_shards; s++) {
        if (zd_future_wait(fs[s], timeout_ms) < 0) {
            if (rc == 0)
                rc = zd_future_done(fs[s])
                    ? call_failed(c, s, what, fs[s])
                    : zd_error_wrap("ps: %s: shard %d (rank %d)", what, s, c->ranks[s]);
            continue;
        }
        if (rc == 0 && read_head(c, s, what, zd_future_value(fs[s]), &versions[s]) < 0)
            rc = -1;
    }
    return rc;
}

/*  Starts fn_prefix<s> on every shard with args[s] (borrowed; NULL: no
    arguments); fs[s]: the futures, NULL where the call failed at once
    (the error is then set and -1 returned, the others still started). */
static int start_calls(const zd_ps_client_t *c, const char *what, const char *fn_prefix,
                       zd_value_t *const *args, int64_t timeout_ms, zd_future_t **fs)
{
    int rc = 0;
    for (int s = 0; s < c->n_shards; s++) {
        char fn[32];
        snprintf(fn, sizeof fn, "%s%d", fn_prefix, s);
        fs[s] = zd_rpc_async(c->ranks[s], fn, args[s], timeout_ms);
        if (!fs[s] && rc == 0)
            rc = call_failed(c, s, what, NULL);
    }
    return rc;
}

/*  A call to every shard: its arguments (NULL: none), its futures and the
    versions its answers carry. */
typedef struct {
    zd_future_t **fs;
    zd_value_t **args;
    int64_t *versions;
} shard_calls_t;

/*  Room for a call to every shard: 0, or -1 (ZD_ERR_NO_MEMORY, naming
    who; shard_calls_free frees what was made). */
static int shard_calls_new(const zd_ps_client_t *c, const char *who, shard_calls_t *k)
{
    k->fs = calloc((size_t)c->n_shards, sizeof *k->fs);
    k->args = calloc((size_t)c->n_shards, sizeof *k->args);
    k->versions = malloc((size_t)c->n_shards * sizeof *k->versions);
    if (!k->fs || !k->args || !k->versions)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", who);
    return 0;
}

/*  Starts fn_prefix<s> on every shard with k->args and waits for every
    answer (each up to timeout_ms), checking their heads: 0, or -1. */
static int shard_calls_run(const zd_ps_client_t *c, const char *what, const char *fn_prefix,
                           int64_t timeout_ms, shard_calls_t *k)
{
    if (start_calls(c, what, fn_prefix, k->args, timeout_ms, k->fs) < 0)
        return -1;
    return wait_answers(c, what, k->fs, timeout_ms, k->versions);
}

static void shard_calls_free(const zd_ps_client_t *c, shard_calls_t *k)
{
    for (int s = 0; s < c->n_shards; s++) {
        if (k->args)
            zd_value_unref(k->args[s]);
        if (k->fs)
            zd_future_unref(k->fs[s]);
    }
    free(k->fs);
    free(k->args);
    free(k->versions);
}

/*  One pull; *unequal: synchronous shards answered different versions. */
static int pull_once(zd_ps_client_t *c, int64_t timeout_ms, bool *unequal)
{
    shard_calls_t k;
    int rc = -1;
    if (shard_calls_new(c, "zd_ps_client_pull", &k) < 0 ||
        shard_calls_run(c, "pull", FN_PULL, call_timeout(timeout_ms), &k) < 0)
        goto out;
    /* Everything checked before the replica changes. */
    for (int s = 0; s < c->n_shards; s++) {
        for (int i = 0; i < c->n; i++)
            c->of_shard[i] = c->shard_of[i] == s;
        zd_tensor_t **got = calloc((size_t)c->n, sizeof *got);
        if (!got) {
            zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_client_pull: out of memory");
            goto out;
        }
        int bad = read_pairs(zd_future_value(k.fs[s]), 3, c->names, c->ts, c->of_shard, c->n, got);
        for (int i = 0; i < c->n; i++)
            if (c->of_shard[i])
                c->got[i] = got[i];
        free(got);
        if (bad < 0) {
            zd_error_set_code(ZD_ERR_REMOTE, "ps: pull: shard %d (rank %d) answered badly: %s", s,
                              c->ranks[s], zd_error_last());
            goto out;
        }
    }
    for (int i = 0; i < c->n; i++)
        if (zd_tensor_copy_(c->ts[i], c->got[i]) < 0)
            goto out;
    bool back = false;
    for (int s = 0; s < c->n_shards; s++) {
        back = back || k.versions[s] < c->seen[s];
        *unequal = *unequal || k.versions[s] != k.versions[0];
        c->version[s] = c->seen[s] = k.versions[s];
    }
    c->rollbacks += back;
    rc = 0;
out:
    shard_calls_free(c, &k);
    return rc;
}

int zd_ps_client_pull(zd_ps_client_t *c, int64_t timeout_ms)
{
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_client_pull: NULL");
    bool sync = c->opts.mode == ZD_PS_SYNC && c->n_shards > 1, unequal = false;
    if (sync && shard_rejoined(c) && agree_versions(c, timeout_ms, true) < 0)
        return -1;
    if (pull_once(c, timeout_ms, &unequal) < 0)
        return -1;
    /* Synchronous shards at different versions: one may have resumed
       from its checkpoint unseen (its rejoin not yet told to this
       process), or they are in the middle of a round; the look finds out
       (and does nothing in the second case), then the pull again. */
    if (!sync || !unequal)
        return 0;
    if (agree_versions(c, timeout_ms, true) < 0)
        return -1;
    unequal = false;
    return pull_once(c, timeout_ms, &unequal);
}

/*  The push to shard s: [version, position (when set), name, grad, ...],
    a new reference. */
static zd_value_t *push_args(zd_ps_client_t *c, int s)
{
    zd_value_t *v = zd_value_list(1);
    if (!v || zd_list_append(v, zd_value_int(c->version[s])) < 0 ||
        (c->position >= 0 && zd_list_append(v, zd_value_int(c->position)) < 0))
        goto oom;
    for (int i = 0; i < c->n; i++) {
        if (c->shard_of[i] != s)
            continue;
        zd_tensor_t *g = zd_tensor_grad(c->ts[i]);
        if (!g) {
            zd_value_unref(v);
            zd_error_set_code(ZD_ERR_ARGUMENT, "ps: push: \"%s\" has no gradient", c->names[i]);
            return NULL;
        }
        int rc = zd_list_append(v, zd_value_string(c->names[i])) < 0 ||
            zd_list_append(v, zd_value_tensor(g)) < 0;
        zd_tensor_unref(g);
        if (rc)
            goto oom;
    }
    return v;
oom:
    zd_value_unref(v);
    zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: push: out of memory");
    return NULL;
}

int zd_ps_client_push(zd_ps_client_t *c, int64_t timeout_ms)
{
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_client_push: NULL");
    for (int s = 0; s < c->n_shards; s++)
        if (c->version[s] < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "zd_ps_client_push: pull first (shard %d's version is "
                                     "unknown)",
                                     s);
    shard_calls_t k;
    int rc = -1;
    if (shard_calls_new(c, "zd_ps_client_push", &k) < 0)
        goto out;
    /* Every gradient is read before anything is sent: a missing one
       sends nothing. */
    for (int s = 0; s < c->n_shards; s++)
        if (!(k.args[s] = push_args(c, s)))
            goto out;
    rc = shard_calls_run(c, "push", FN_PUSH, call_timeout(timeout_ms), &k);
    for (int s = 0; rc == 0 && s < c->n_shards; s++)
        c->seen[s] = k.versions[s] > c->seen[s] ? k.versions[s] : c->seen[s];
out:
    shard_calls_free(c, &k);
    return rc;
}

int zd_ps_client_set_position(zd_ps_client_t *c, int64_t position)
{
    if (!c || position < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_client_set_position: %s",
                                 c ? "a position >= 0 is required" : "NULL");
    c->position = position;
    return 0;
}

int zd_ps_client_resume_position(zd_ps_client_t *c, int64_t timeout_ms, int64_t *position)
{
    if (position)
        *position = -1;
    if (!c || !position)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_client_resume_position: NULL");
    /* first one version everywhere: the positions are then of one
       generation */
    if (agree_versions(c, timeout_ms, false) < 0)
        return -1;
    shard_calls_t k;
    int rc = -1;
    if (shard_calls_new(c, "zd_ps_client_resume_position", &k) < 0 ||
        shard_calls_run(c, "position", FN_WHERE, call_timeout(timeout_ms), &k) < 0)
        goto out;
    /* The earliest: no shard missed a batch from there on. A shard that
       has none for this trainer (it never took a push of it, or its
       checkpoint is older than them all) means the beginning. */
    int64_t least = INT64_MAX;
    for (int s = 0; s < c->n_shards; s++) {
        int64_t p;
        if (zd_rpc_arg_int(zd_future_value(k.fs[s]), 3, &p) < 0 || p < -1) {
            zd_error_set_code(ZD_ERR_REMOTE, "ps: position: shard %d (rank %d) answered badly", s,
                              c->ranks[s]);
            goto out;
        }
        least = p < least ? p : least;
    }
    *position = least;
    rc = 0;
out:
    shard_calls_free(c, &k);
    return rc;
}

/*  "__zd_ps_back_<s>"(from, to, epoch, dry) on shard s. 0; 1 when the
    shard had moved on (look again); -1 with the error set. */
static int send_back(zd_ps_client_t *c, int s, int64_t from, int64_t to, int64_t epoch, bool dry,
                     int64_t timeout_ms)
{
    char fn[32];
    snprintf(fn, sizeof fn, FN_BACK "%d", s);
    zd_value_t *r = NULL;
    int64_t now;
    int rc = zd_rpc_sync_take(c->ranks[s], fn, ZD_ARGS(from, to, epoch, dry),
                              call_timeout(timeout_ms), &r);
    if (rc < 0)
        rc = call_failed(c, s, "going back", NULL);
    else if ((rc = read_head(c, s, "going back", r, &now)) < 0 && zd_error_code() == ZD_ERR_STALE)
        rc = 1;
    zd_value_unref(r);
    if (rc == 0 && !dry && from > to)
        zd__log(ZD_LOG_INFO,
                "ps: shard %d went back from version %" PRId64 " to %" PRId64
                ", the version another shard resumed from",
                s, from, to);
    return rc;
}

/*  One pass of agree_versions over the answers in k: 0 (nothing to do, or
    done; *moved counts the shards sent back), 1 (a shard moved on: look
    again), or -1. */
static int agree_once(zd_ps_client_t *c, const shard_calls_t *k, bool restarted, int64_t timeout_ms,
                      int *moved)
{
    int64_t low = INT64_MAX;
    bool low_fresh = false, all_fresh = true;
    for (int s = 0; s < c->n_shards; s++) {
        const zd_value_t *v = zd_future_value(k->fs[s]);
        int64_t fresh = 0, epoch = -1; /* a shard of 1.0 says neither */
        if (zd_list_len(v) > 5 &&
            (zd_rpc_arg_int(v, 4, &fresh) < 0 || zd_rpc_arg_int(v, 5, &epoch) < 0 || epoch < 0))
            return zd_error_set_code(
                ZD_ERR_REMOTE, "ps: version: shard %d (rank %d) answered badly", s, c->ranks[s]);
        c->scratch_epoch[s] = epoch;
        all_fresh = all_fresh && fresh;
        if (k->versions[s] < low)
            low = k->versions[s], low_fresh = fresh != 0;
        else if (k->versions[s] == low)
            low_fresh = low_fresh || fresh != 0;
    }
    /* the oldest shard resumed there, and a shard's process is new (or
       nobody stepped yet): otherwise the others may merely be a round
       ahead of it */
    if (!low_fresh || !(restarted || all_fresh))
        return 0;
    /* first whether every shard ahead can, so that none goes back alone */
    for (int dry = 1; dry >= 0; dry--)
        for (int s = 0; s < c->n_shards; s++) {
            if (k->versions[s] == low)
                continue;
            if (c->scratch_epoch[s] < 0)
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "ps: shard %d (rank %d), at version %" PRId64
                                         ", is of a release that cannot go back to %" PRId64,
                                         s, c->ranks[s], k->versions[s], low);
            int rc = send_back(c, s, k->versions[s], low, c->scratch_epoch[s], dry, timeout_ms);
            if (rc != 0)
                return rc;
            *moved += !dry;
        }
    /* the oldest shards' rounds hold pushes computed with the parameters
       given up: let them go */
    for (int s = 0; *moved && s < c->n_shards; s++) {
        int rc = k->versions[s] == low && c->scratch_epoch[s] >= 0
            ? send_back(c, s, low, low, c->scratch_epoch[s], false, timeout_ms)
            : 0;
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*  Synchronous shards at one version. A shard that came back from its
    checkpoint while the others went on, or a run resumed where one
    shard's newest generation was lost, leaves a shard resumed at an older
    version than the others: they go back to that version's generation
    (their own newest or the one before), so that a round is one round on
    every shard and the positions are of one checkpoint. That is after a
    shard was lost and came back (after_loss, or its rank rejoined since
    this client last looked), or before anyone stepped (every shard
    resumed and untouched): otherwise a shard ahead may be one a round
    completed on while the oldest still waits for a push of it, and it is
    left alone, as are shards merely in the middle of a round. 0, or -1
    (ZD_ERR_ARGUMENT: a shard without that generation, naming it and the
    versions it has; the call's errors). */
static int agree_versions(zd_ps_client_t *c, int64_t timeout_ms, bool after_loss)
{
    if (c->opts.mode != ZD_PS_SYNC || c->n_shards < 2)
        return 0;
    /* the shards' join counts as this look starts: a join during it is
       looked at next time */
    for (int s = 0; s < c->n_shards; s++)
        c->scratch_joins[s] = join_count(c->ranks[s]);
    bool restarted = after_loss || shard_rejoined(c);
    /* shards that move on meanwhile (another trainer sent them back, a
       round completed) are looked at again */
    for (int attempt = 0; attempt < 10; attempt++) {
        shard_calls_t k;
        int rc = -1, moved = 0; /* (how many went back: for the log) */
        if (shard_calls_new(c, "ps: the shards' versions", &k) == 0 &&
            shard_calls_run(c, "version", FN_WHERE, call_timeout(timeout_ms), &k) == 0)
            rc = agree_once(c, &k, restarted, timeout_ms, &moved);
        shard_calls_free(c, &k);
        if (rc < 0)
            return zd_error_wrap("ps: bringing the shards to one version");
        if (rc == 0) {
            memcpy(c->joins, c->scratch_joins, (size_t)c->n_shards * sizeof *c->joins);
            return 0;
        }
    }
    return zd_error_set_code(ZD_ERR_TIMEOUT,
                             "ps: the shards' versions kept moving while they were brought to one");
}
