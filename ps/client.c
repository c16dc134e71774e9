/* SPDX-License-Identifier: MIT */
/*  client.c: a trainer's client of the push/pull parameter server
    (ps.h): its replica's pulls and pushes, the step that recovers from a
    stale push or a lost shard, the trainer's position, and one
    generation across synchronous shards (agree_versions). */
#include <zdist/ps.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/fault_point.h"
#include "core/log_private.h"
#include "ps/ps_private.h"

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
    if (zd__ps_options_read(&o, opts) < 0 || zd__ps_check_params(params, "zd_ps_client_new") < 0)
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
    if (!(c->shard_of = zd__ps_split_checked(params, n_shards, "zd_ps_client_new")))
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
    zd_named_tensors_t *params = zd__ps_module_params(m);
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

static int agree_versions(zd_ps_client_t *c, int64_t timeout_ms, bool after_loss);

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

/*  The parameters every shard answered (a pull's, or a push_pull's) into
    the replica, and their versions; *unequal: synchronous shards answered
    different versions. Everything is checked before the replica changes:
    0, or -1 with it unchanged. */
static int take_params(zd_ps_client_t *c, const char *what, shard_calls_t *k, bool *unequal)
{
    for (int s = 0; s < c->n_shards; s++) {
        for (int i = 0; i < c->n; i++)
            c->of_shard[i] = c->shard_of[i] == s;
        zd_tensor_t **got = calloc((size_t)c->n, sizeof *got);
        if (!got)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: %s: out of memory", what);
        int bad = zd__ps_read_pairs(zd_future_value(k->fs[s]), 3, c->names, c->ts, c->of_shard,
                                    c->n, got);
        for (int i = 0; i < c->n; i++)
            if (c->of_shard[i])
                c->got[i] = got[i];
        free(got);
        if (bad < 0)
            return zd_error_set_code(ZD_ERR_REMOTE, "ps: %s: shard %d (rank %d) answered badly: %s",
                                     what, s, c->ranks[s], zd_error_last());
    }
    for (int i = 0; i < c->n; i++)
        if (zd_tensor_copy_(c->ts[i], c->got[i]) < 0)
            return -1;
    bool back = false;
    for (int s = 0; s < c->n_shards; s++) {
        back = back || k->versions[s] < c->seen[s];
        *unequal = *unequal || k->versions[s] != k->versions[0];
        c->version[s] = c->seen[s] = k->versions[s];
    }
    c->rollbacks += back;
    return 0;
}

/*  One pull; *unequal: synchronous shards answered different versions. */
static int pull_once(zd_ps_client_t *c, int64_t timeout_ms, bool *unequal)
{
    shard_calls_t k;
    int rc = -1;
    if (shard_calls_new(c, "zd_ps_client_pull", &k) == 0 &&
        shard_calls_run(c, "pull", ZD__PS_FN_PULL, call_timeout(timeout_ms), &k) == 0)
        rc = take_params(c, "pull", &k, unequal);
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

/*  The pushes to every shard, through fn_prefix: 0 with their answers in
    *k (shard_calls_free it in any case), or -1. */
static int push_calls(zd_ps_client_t *c, const char *who, const char *what, const char *fn_prefix,
                      int64_t timeout_ms, shard_calls_t *k)
{
    memset(k, 0, sizeof *k);
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL", who);
    for (int s = 0; s < c->n_shards; s++)
        if (c->version[s] < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "%s: pull first (shard %d's version is unknown)", who, s);
    if (shard_calls_new(c, who, k) < 0)
        return -1;
    /* Every gradient is read before anything is sent: a missing one
       sends nothing. */
    for (int s = 0; s < c->n_shards; s++)
        if (!(k->args[s] = push_args(c, s)))
            return -1;
    zd__fault_point(zd_rpc_rank(), "step"); /* tests only (core/fault_point.h) */
    return shard_calls_run(c, what, fn_prefix, call_timeout(timeout_ms), k);
}

int zd_ps_client_push(zd_ps_client_t *c, int64_t timeout_ms)
{
    shard_calls_t k;
    int rc = push_calls(c, "zd_ps_client_push", "push", ZD__PS_FN_PUSH, timeout_ms, &k);
    for (int s = 0; rc == 0 && s < c->n_shards; s++)
        c->seen[s] = k.versions[s] > c->seen[s] ? k.versions[s] : c->seen[s];
    if (c)
        shard_calls_free(c, &k);
    return rc;
}

int zd_ps_client_push_pull(zd_ps_client_t *c, int64_t timeout_ms)
{
    shard_calls_t k;
    bool unequal = false, bare = false;
    int rc =
        push_calls(c, "zd_ps_client_push_pull", "push_pull", ZD__PS_FN_PUSH_PULL, timeout_ms, &k);
    /* Every push was taken. A shard short of memory answers as to a push
       (without its parameters): they are pulled instead, after the
       versions are noted as a push notes them. */
    for (int s = 0; rc == 0 && s < c->n_shards; s++)
        bare = bare || zd_list_len(zd_future_value(k.fs[s])) <= 3;
    for (int s = 0; rc == 0 && bare && s < c->n_shards; s++)
        c->seen[s] = k.versions[s] > c->seen[s] ? k.versions[s] : c->seen[s];
    if (rc == 0 && !bare)
        rc = take_params(c, "push_pull", &k, &unequal);
    if (c)
        shard_calls_free(c, &k);
    /* Synchronous shards that answered from different rounds (one started
       again from a checkpoint) are brought to one version by a pull, as
       after a push. */
    if (rc == 0 && (bare || (unequal && c->opts.mode == ZD_PS_SYNC && c->n_shards > 1)))
        rc = zd_ps_client_pull(c, timeout_ms);
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
        shard_calls_run(c, "position", ZD__PS_FN_WHERE, call_timeout(timeout_ms), &k) < 0)
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
    snprintf(fn, sizeof fn, ZD__PS_FN_BACK "%d", s);
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
            shard_calls_run(c, "version", ZD__PS_FN_WHERE, call_timeout(timeout_ms), &k) == 0)
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
