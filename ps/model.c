/* SPDX-License-Identifier: MIT */
/*  model.c: the remote model (ps.h): stages of a model served by shards,
    run by trainers through RPC under distributed autograd and stepped by
    a DistributedOptimizer, as PyTorch's parameter-server tutorial does
    with one server.

    Shard K serves "__zd_psm_forward_<K>", "__zd_psm_params_<K>",
    "__zd_psm_where_<K>" (a trainer's position), "__zd_psm_back_<K>" and
    "__zd_psm_ckpt_<K>" (a checkpoint a trainer asks for). Each answers a list
    [code, text, instance, ...] rather than an RPC error, as push and
    pull do (shard.c): an RPC error reaches the caller as ZD_ERR_REMOTE, and
    a trainer must tell refused inputs from a stopped shard. The forward's
    tensors travel inside that list; distributed autograd records every
    tensor of a message, so the answer's outputs carry the backward to the
    stage all the same. */
#include <zdist/ps.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_nn.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include "core/clock.h"
#include "core/fault_point.h"
#include "core/log_private.h"
#include "ps/ps_private.h"

#define FN_FORWARD "__zd_psm_forward_"
#define FN_PARAMS  "__zd_psm_params_"
#define FN_WHERE   "__zd_psm_where_"
#define FN_BACK    "__zd_psm_back_"
#define FN_CKPT    "__zd_psm_ckpt_"

struct zd_ps_model_server {
    zd_nn_module_t *stage; /* the caller's */
    int shard, n_shards;
    zd_ps_options_t opts;
    char fn_forward[40], fn_params[40], fn_where[40], fn_back[40], fn_ckpt[40];

    /* The stage's mode is the module's own: forwards in one mode run
       together; a forward in the other mode waits until they are done,
       and new ones of the first mode wait behind it, so that neither mode
       starves the other. */
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool training;  /* the stage's mode */
    int running;    /* forwards between their start and their end */
    int waiting[2]; /* forwards waiting, by mode (1: training) */
    bool stopped;
    int64_t forwards;
    /* checkpoints: the stage's parameters at a version, the steps
       distributed optimizers took here (zd_dist_optim_version) on top of
       the version it resumed from */
    zd__ps_ckpt_t ckpt; /* ckpt.path NULL: none */
    char **names;       /* the stage's parameters' names (copies), for ckpt */
    zd_tensor_t **params;
    int64_t base_version; /* resumed from (0: a new run) */
    /* where each trainer was in its data at its last training forward
       here (zd_ps_model_set_position), by rank; -1: none. Checkpointed. */
    int64_t *positions;
    int n_positions;
    /* the newest generation on disk (written or resumed from), its
       version, and the generation before it on disk (-1: none) */
    int64_t ckpt_gen, ckpt_version, ckpt_before;
    bool have_ckpt; /* ckpt_gen is on disk */
    bool writing;
    zd__ps_gate_t *gate; /* max_inflight's slots; NULL: no limit */
    /* A number drawn at random when the process starts and whenever the
       stage goes back to a checkpoint: a trainer that sees another one
       from the same shard knows the stage is not the one its batches went
       to (and, for a new process, that the RRefs of its parameters it
       holds are the dead process's). */
    _Atomic int64_t instance;
    /* One generation across the stages (serve_back): the generation the
       stage resumed or went back to (-1: none), the instance of the
       stage whose resume chose it (`origin`: the stages that went back
       with it share it), and the version it was taken at (fresh while
       the stage is still there: no step since). */
    int64_t resumed_gen, origin, resumed_version;
    /* until then (zd__now_ns) no checkpoint is written: a dry run of
       serve_back found the generation to go back to, and a new file now
       would push it out of the two kept before the real run comes */
    int64_t hold_writes_until;
    bool hold_logged; /* a write skipped for it was logged */
    /* positions recorded that changed one, and how many of those the
       last write held: a trainer's checkpoint of a version on disk is
       written again only when a position moved since */
    int64_t moved, moved_written;
};

/*  ---- the shard ---- */

/*  [code, text, instance, tensors...]: a new value, or NULL (out of
    memory). */
static zd_value_t *answer_new(const zd_ps_model_server_t *s, zd_error_code_t code, const char *text,
                              zd_tensor_t *const *ts, int n)
{
    zd_value_t *v = zd_value_list(3 + (size_t)n);
    if (v &&
        (zd_list_append(v, zd_value_int(code)) < 0 ||
         zd_list_append(v, zd_value_string(text)) < 0 ||
         zd_list_append(v, zd_value_int(s->instance)) < 0)) {
        zd_value_unref(v);
        return NULL;
    }
    for (int i = 0; v && i < n; i++)
        if (zd_list_append(v, zd_value_tensor(ts[i])) < 0) {
            zd_value_unref(v);
            v = NULL;
        }
    if (!v)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    return v;
}

/*  The inputs of a forward, items `from` on of args, into in (borrowed
    from args), checked before the stage sees them. *n: how many. */
static int read_inputs(const zd_ps_model_server_t *s, const zd_value_t *args, size_t from,
                       zd_tensor_t **in, int *n)
{
    size_t count = zd_list_len(args) - from;
    if (count < 1 || count > ZD__PS_MAX_TENSORS)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%zu inputs (1 to %d)", count,
                                 ZD__PS_MAX_TENSORS);
    int64_t total = 0;
    for (size_t i = 0; i < count; i++) {
        zd_tensor_t *t;
        if (zd_rpc_arg_tensor(args, from + i, &t) < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "input %zu is not a tensor", i);
        zd_tensor_dtype_t dtype = zd_tensor_dtype(t);
        if (dtype != ZD_FLOAT32 && dtype != ZD_INT64)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "input %zu is %s, not float32 or int64", i,
                                     zd_tensor_dtype_name(dtype));
        total += zd_tensor_numel(t);
        if (total > s->opts.max_input_numel)
            return zd_error_set_code(
                ZD_ERR_ARGUMENT, "the inputs hold more than max_input_numel = %" PRId64 " elements",
                s->opts.max_input_numel);
        int64_t bad = dtype == ZD_FLOAT32 ? zd__ps_first_not_finite(t) : -1;
        if (bad >= 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "input %zu element %" PRId64 " is %g, not finite", i, bad,
                                     (double)zd_tensor_data(t)[bad]);
        in[i] = t;
    }
    *n = (int)count;
    return 0;
}

/*  Waits until the stage may run in mode `training`, and counts this
    forward in: it may flip the mode when nothing runs, or join the
    forwards of its mode while none of the other mode waits. False when
    the shard stopped. */
static bool enter(zd_ps_model_server_t *s, bool training)
{
    pthread_mutex_lock(&s->lock);
    s->waiting[training]++;
    while (!s->stopped && !(s->running == 0 && s->training != training) &&
           !(s->training == training && s->waiting[!training] == 0))
        pthread_cond_wait(&s->changed, &s->lock);
    s->waiting[training]--;
    bool ok = !s->stopped;
    if (ok) {
        if (s->training != training) {
            zd_nn_module_train(s->stage, training);
            s->training = training;
        }
        s->running++;
        s->forwards++;
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
}

static void leave(zd_ps_model_server_t *s)
{
    pthread_mutex_lock(&s->lock);
    if (--s->running == 0)
        pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
}

/*  Records that the trainer of rank `rank` is at `position` (under the
    lock), counting a change. */
static void record_position(zd_ps_model_server_t *s, int rank, int64_t position)
{
    int64_t was = rank >= 0 && rank < s->n_positions ? s->positions[rank] : -1;
    zd__ps_positions_record(&s->positions, &s->n_positions, rank, position);
    s->moved += rank >= 0 && rank < s->n_positions && s->positions[rank] != was;
}

static int64_t version_of(const zd_ps_model_server_t *s)
{
    return s->base_version + (int64_t)zd_dist_optim_version();
}

/*  The generation of a checkpoint the stage writes by itself at version
    v: the checkpoint_every interval it is in. Each step of a trainer
    steps every stage, so the stages' versions go nearly together and
    their checkpoints of one interval hold nearly the same batches. With
    checkpoints taken only when asked (checkpoint_every 0), the trainer
    numbers them (zd_ps_model_checkpoint), and one the program writes
    (zd_ps_model_server_checkpoint) is the next. */
static int64_t gen_of(const zd_ps_model_server_t *s, int64_t v)
{
    int64_t every = s->opts.checkpoint_every;
    return every > 0 ? v / every : s->have_ckpt ? s->ckpt_gen + 1 : 0;
}

/*  Writes the stage's checkpoint of generation gen at version v, with
    the steps held off by the caller (zd_dist_optim_read_lock), unless
    another thread is writing one. A generation on disk already is
    written again in place when the version or a position moved since
    (another trainer's checkpoint of the same generation: the stages'
    versions in one generation may differ). Asked by a trainer
    (zd_ps_model_checkpoint), it waits for the other write, then writes,
    and fails with ZD_ERR_STALE for a generation older than the one on
    disk (another trainer's newer checkpoint) or while a trainer brings
    the stages to one generation. gen -1: the stage's own next
    (gen_of). 0, or -1. */
static int write_checkpoint(zd_ps_model_server_t *s, int64_t v, int64_t gen, bool asked)
{
    pthread_mutex_lock(&s->lock);
    while (asked && s->writing)
        pthread_cond_wait(&s->changed, &s->lock);
    if (gen < 0)
        gen = gen_of(s, v);
    bool replace = s->have_ckpt && gen == s->ckpt_gen;
    bool older = s->have_ckpt && gen < s->ckpt_gen;
    bool same = s->have_ckpt && v == s->ckpt_version && s->moved == s->moved_written;
    if ((same && (replace || !asked)) || (older && !asked)) { /* the file holds all of it */
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    bool held = zd__now_ns() < s->hold_writes_until;
    if (asked && (held || older)) {
        int64_t on_disk = s->ckpt_gen;
        pthread_mutex_unlock(&s->lock);
        if (older)
            return zd_error_set_code(ZD_ERR_STALE,
                                     "stage %d holds generation %" PRId64 ", newer than %" PRId64
                                     " (a newer checkpoint's)",
                                     s->shard, on_disk, gen);
        return zd_error_set_code(ZD_ERR_STALE, "stage %d is being brought to another generation",
                                 s->shard);
    }
    if (!asked && (s->writing || held)) {
        bool tell = held && !s->hold_logged;
        s->hold_logged = s->hold_logged || held;
        pthread_mutex_unlock(&s->lock);
        if (tell)
            zd__log(ZD_LOG_WARN,
                    "ps: stage %d: the checkpoint of version %" PRId64
                    " waits: a trainer is bringing the stages to one generation",
                    s->shard, v);
        return 0;
    }
    /* the positions as they are now: forwards go on recording them */
    int n_pos = s->n_positions;
    int64_t *pos = n_pos > 0 ? malloc((size_t)n_pos * sizeof *pos) : NULL;
    if (n_pos > 0 && !pos) {
        pthread_mutex_unlock(&s->lock);
        /* a generation without the positions would send every trainer
           back to its first batch: the last whole one stays instead */
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: stage %d: checkpoint: out of memory",
                                 s->shard);
    }
    if (pos)
        memcpy(pos, s->positions, (size_t)n_pos * sizeof *pos);
    int64_t moved = s->moved;
    s->writing = true;
    pthread_mutex_unlock(&s->lock);
    zd__fault_point(zd_rpc_rank(), "checkpoint"); /* tests only (core/fault_point.h) */
    zd__ps_ckpt_t c = s->ckpt;
    c.gen = gen;
    c.positions = &pos;
    c.n_positions = &n_pos;
    int rc = zd__ps_checkpoint_write(&c, v, replace);
    free(pos);
    pthread_mutex_lock(&s->lock);
    s->writing = false;
    pthread_cond_broadcast(&s->changed); /* (a trainer's checkpoint may wait) */
    if (rc == 0) {
        s->moved_written = moved;
        if (!replace)
            s->ckpt_before = s->have_ckpt ? s->ckpt_gen : -1;
        s->ckpt_gen = gen;
        s->ckpt_version = v;
        s->have_ckpt = true;
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/*  Before a forward, with the steps held off: the checkpoint due once
    the version reached the next multiple of checkpoint_every (so that
    the stages write theirs at the same versions). A failure is
    logged; the stage goes on, its last whole generation on disk. */
static void checkpoint_due(zd_ps_model_server_t *s)
{
    int64_t every = s->opts.checkpoint_every, v = version_of(s);
    pthread_mutex_lock(&s->lock);
    bool due = s->ckpt.path && every > 0 && gen_of(s, v) > s->ckpt_gen;
    int64_t last = s->ckpt_version;
    pthread_mutex_unlock(&s->lock);
    if (due && write_checkpoint(s, v, v / every, false) < 0)
        zd__log(ZD_LOG_WARN,
                "%s (the stage goes on; the last checkpoint is of version %" PRId64 ")",
                zd_error_last(), last);
}

/*  [training, n_out, position, instance, inputs...] -> [code, text,
    instance, outputs...]; n_out 0: the stage's stage_outputs (a stage
    before the last); position -1: the trainer set none; instance: the
    one the trainer's optimizer was made with (0: none; a trainer of 1.0
    sends none, its inputs start at item 3). A forward for another
    instance is refused with ZD_ERR_STALE before anything is recorded:
    its position belongs to batches this stage no longer holds. */
static zd_value_t *serve_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_model_server_t *s = arg;
    zd_tensor_t *in[ZD__PS_MAX_TENSORS], *out[ZD__PS_MAX_TENSORS] = {0};
    int64_t training, n_out, position, expected = 0;
    int n_in = 0;
    char text[512];
    size_t first = zd_value_get_int(zd_list_get(args, 3), &expected) == 0 ? 4 : 3;
    if (zd_rpc_arg_int(args, 0, &training) < 0 || zd_rpc_arg_int(args, 1, &n_out) < 0 ||
        zd_rpc_arg_int(args, 2, &position) < 0 || read_inputs(s, args, first, in, &n_in) < 0) {
        snprintf(text, sizeof text, "stage %d refused the forward: %s", s->shard, zd_error_last());
        return answer_new(s, ZD_ERR_ARGUMENT, text, NULL, 0);
    }
    if (position < -1) {
        snprintf(text, sizeof text, "stage %d refused the forward: position %" PRId64, s->shard,
                 position);
        return answer_new(s, ZD_ERR_ARGUMENT, text, NULL, 0);
    }
    if (n_out == 0)
        n_out = s->opts.stage_outputs;
    if (n_out < 1 || n_out > ZD__PS_MAX_TENSORS) {
        snprintf(text, sizeof text, "stage %d refused the forward: %" PRId64 " outputs (1 to %d)",
                 s->shard, n_out, ZD__PS_MAX_TENSORS);
        return answer_new(s, ZD_ERR_ARGUMENT, text, NULL, 0);
    }
    zd__fault_point(zd_rpc_rank(), "forward"); /* tests only (core/fault_point.h) */
    /* A slot first: a forward waiting for one holds only its inputs. */
    bool slot = training && s->gate && zd__ps_gate_enter(s->gate, s->shard);
    if (!enter(s, training != 0)) {
        if (slot)
            zd__ps_gate_leave(s->gate);
        snprintf(text, sizeof text, "stage %d stopped", s->shard);
        return answer_new(s, ZD_ERR_STOPPED, text, NULL, 0);
    }
    /* The trainer steps a batch before it sends the next one's forward:
       the weights here hold every batch before `position`, and a
       checkpoint written from now on may say so. Under the read lock, so
       that no going back (serve_back) comes between the instance's check,
       the record and the forward. */
    zd_dist_optim_read_lock();
    pthread_mutex_lock(&s->lock);
    bool stale = expected != 0 && expected != s->instance;
    if (!stale && training && position >= 0)
        record_position(s, zd_rpc_call_caller_rank(call), position);
    pthread_mutex_unlock(&s->lock);
    if (stale) {
        zd_dist_optim_read_unlock();
        leave(s);
        if (slot)
            zd__ps_gate_leave(s->gate);
        snprintf(text, sizeof text,
                 "stage %d was started again, or went back to a checkpoint, since this "
                 "trainer's last step",
                 s->shard);
        return answer_new(s, ZD_ERR_STALE, text, NULL, 0);
    }
    /* An evaluation records no graph here (PyTorch's no_grad()): nothing
       will go back through it. */
    bool grad_was = zd_autograd_set_grad_enabled(training != 0);
    checkpoint_due(s);
    /* a stage that locks its own reads lets the steps run beside it */
    bool own = s->opts.stage_locks_reads;
    if (own)
        zd_dist_optim_read_unlock();
    int rc = zd_nn_module_forward(s->stage, in, n_in, out, (int)n_out);
    if (!own)
        zd_dist_optim_read_unlock();
    zd_autograd_set_grad_enabled(grad_was);
    leave(s);
    /* the slot goes to a node over the outputs, or back now */
    if (slot && rc == 0)
        rc = zd__ps_gate_hold(s->gate, out, (int)n_out);
    else if (slot)
        zd__ps_gate_leave(s->gate);
    if (rc == 0 && s->opts.on_forward)
        s->opts.on_forward(s->opts.on_forward_arg, s->shard, zd_rpc_call_caller_rank(call),
                           training != 0, in, n_in);
    zd_value_t *v;
    if (rc < 0) {
        snprintf(text, sizeof text, "stage %d: %s", s->shard, zd_error_last());
        v = answer_new(s, ZD_ERR_REMOTE, text, NULL, 0);
    } else {
        v = answer_new(s, ZD_OK, "", out, (int)n_out);
    }
    for (int i = 0; i < n_out; i++)
        zd_tensor_unref(out[i]);
    return v;
}

/*  [] -> [code, text, instance, RRef(parameter)...], owned here. */
static zd_value_t *serve_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args;
    zd_ps_model_server_t *s = arg;
    zd_rref_list_t *rrefs = zd_dist_nn_parameter_rrefs(s->stage);
    if (!rrefs)
        return zd_error_wrap("ps: stage %d", s->shard), NULL;
    /* the instance under the read lock: one read after a going back comes
       with the step epoch it moved to, so the optimizer the trainer makes
       now is not refused */
    zd_dist_optim_read_lock();
    zd_value_t *v = answer_new(s, ZD_OK, "", NULL, 0);
    zd_dist_optim_read_unlock();
    for (int i = 0; v && i < zd_rref_list_len(rrefs); i++)
        if (zd_list_append(v, zd_value_rref(zd_rref_list_get(rrefs, i))) < 0) {
            zd_value_unref(v);
            v = NULL;
        }
    zd_rref_list_free(rrefs);
    return v;
}

/*  [] -> [code, text, instance, position, version, generation, origin,
    fresh, checkpoint_every]: where the caller was in its data at its
    last training forward here (-1: none), kept through checkpoints; the
    stage's version; the generation it resumed or went back to (-1:
    none), the instance of the stage whose resume chose it, whether it
    took no step since, and what its generations are counted in. */
static zd_value_t *serve_where(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)args;
    zd_ps_model_server_t *s = arg;
    int caller = zd_rpc_call_caller_rank(call);
    /* (the read lock: no step, nor a going back, moves the version while
       it is read) */
    zd_dist_optim_read_lock();
    pthread_mutex_lock(&s->lock);
    int64_t position = caller >= 0 && caller < s->n_positions ? s->positions[caller] : -1;
    int64_t version = version_of(s), gen = s->resumed_gen, origin = s->origin;
    bool fresh = gen >= 0 && version == s->resumed_version;
    zd_value_t *v = answer_new(s, ZD_OK, "", NULL, 0);
    pthread_mutex_unlock(&s->lock);
    zd_dist_optim_read_unlock();
    if (v &&
        (zd_list_append(v, zd_value_int(position)) < 0 ||
         zd_list_append(v, zd_value_int(version)) < 0 || zd_list_append(v, zd_value_int(gen)) < 0 ||
         zd_list_append(v, zd_value_int(origin)) < 0 ||
         zd_list_append(v, zd_value_int(fresh)) < 0 ||
         zd_list_append(v, zd_value_int(s->ckpt.path ? s->opts.checkpoint_every : -1)) < 0)) {
        zd_value_unref(v);
        v = NULL;
    }
    if (!v)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: stage %d: out of memory", s->shard);
    return v;
}

/*  [position, instance, dry, gen] -> [code, text, instance, version,
    gen]: the
    caller is at `position` of its data, and the stage writes its
    checkpoint now (zd_ps_model_checkpoint), of generation gen, answering
    the version and the generation on disk; dry: only whether it would
    (gen is not read). Refused: by a stage that writes its
    own every checkpoint_every versions (a trainer's would break "one
    generation, one version"), a stopped one, and one started again, or
    gone back, since the caller's optimizer was made (instance) with
    ZD_ERR_STALE, as a forward is: the position would claim batches the
    stage no longer holds. */
static zd_value_t *serve_checkpoint(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_ps_model_server_t *s = arg;
    int64_t position = -1, expected = 0, dry = 0, gen = -1;
    char text[512];
    const char *bad = ZD_UNPACK(args, &position, &expected, &dry, &gen) < 0 ? zd_error_last()
        : !s->ckpt.path                ? "it has no checkpoint_path"
        : s->opts.checkpoint_every > 0 ? "it writes its own every checkpoint_every versions"
        : position < 0 || expected == 0 || (!dry && (gen < 0 || gen > INT64_MAX / 2))
        ? "no position, instance or generation"
        : NULL;
    if (bad) {
        snprintf(text, sizeof text, "stage %d refused the checkpoint: %s", s->shard, bad);
        return answer_new(s, ZD_ERR_ARGUMENT, text, NULL, 0);
    }
    /* under the read lock, as a forward: no step or going back between
       the instance's check, the record and the write */
    zd_dist_optim_read_lock();
    pthread_mutex_lock(&s->lock);
    bool other = expected != s->instance, held = zd__now_ns() < s->hold_writes_until;
    zd_error_code_t code = s->stopped ? ZD_ERR_STOPPED : other || held ? ZD_ERR_STALE : ZD_OK;
    if (code == ZD_OK && !dry)
        record_position(s, zd_rpc_call_caller_rank(call), position);
    pthread_mutex_unlock(&s->lock);
    if (code == ZD_OK && !dry && write_checkpoint(s, version_of(s), gen, true) < 0)
        code = zd_error_code() == ZD_ERR_STALE ? ZD_ERR_STALE : ZD_ERR_REMOTE;
    zd_dist_optim_read_unlock();
    if (code == ZD_ERR_STOPPED)
        snprintf(text, sizeof text, "stage %d stopped", s->shard);
    else if (code == ZD_ERR_STALE && (other || held))
        snprintf(text, sizeof text,
                 "stage %d was started again, or went back to a checkpoint, since this "
                 "trainer's last step%s",
                 s->shard, other ? "" : " (it is going back now)");
    else if (code != ZD_OK) /* (the write's error names the shard) */
        snprintf(text, sizeof text, "%s", zd_error_last());
    if (code != ZD_OK)
        return answer_new(s, code, text, NULL, 0);
    pthread_mutex_lock(&s->lock);
    int64_t on_disk = s->ckpt_version, gen_on_disk = s->have_ckpt ? s->ckpt_gen : -1;
    pthread_mutex_unlock(&s->lock);
    zd_value_t *v = answer_new(s, ZD_OK, "", NULL, 0);
    if (v &&
        (zd_list_append(v, zd_value_int(on_disk)) < 0 ||
         zd_list_append(v, zd_value_int(gen_on_disk)) < 0)) {
        zd_value_unref(v);
        v = NULL;
    }
    return v;
}

static int64_t new_instance(void);

/*  The longest a dry run of serve_back may hold the stage's checkpoint
    writes off (the caller asks for the time its real call may take). */
#define MAX_HOLD_MS (30 * 60 * (int64_t)1000)

/*  A request to go back (serve_back), and what came of it. */
typedef struct {
    zd_ps_model_server_t *s;
    int64_t instance, gen, origin, hold_ms;
    bool dry;
    zd_error_code_t code;
    char text[300];
    int64_t from, to;   /* a version, a generation (-1: nothing to take back) */
    int64_t to_version; /* the version gone back to */
    zd_value_t *answer;
} back_t;

/*  Under the stage's lock: whether the stage can go back as b asks, and
    from and to which version (to -1: it is there already); else b's code
    and text say why not. */
static void back_decide(back_t *b)
{
    zd_ps_model_server_t *s = b->s;
    b->from = version_of(s);
    b->to = -1;
    if (s->stopped) {
        b->code = ZD_ERR_STOPPED;
        snprintf(b->text, sizeof b->text, "stage %d stopped", s->shard);
    } else if (!s->ckpt.path || b->gen < 0 || b->origin <= 0) {
        b->code = ZD_ERR_ARGUMENT;
        snprintf(b->text, sizeof b->text,
                 "stage %d: going back to generation %" PRId64
                 " needs checkpoints there, and the instance of a stage that resumed",
                 s->shard, b->gen);
    } else if (b->instance != s->instance || (b->dry && s->writing)) {
        /* (a write in progress may move the generation out: look again) */
        b->code = ZD_ERR_STALE;
        snprintf(b->text, sizeof b->text, "stage %d changed since it was asked", s->shard);
    } else if (b->gen == s->resumed_gen && b->from == s->resumed_version) {
        /* there already */
    } else if (s->have_ckpt && s->ckpt_gen == b->gen) {
        b->to = s->ckpt_gen;
    } else if (s->ckpt_before >= 0 && s->ckpt_before == b->gen) {
        b->to = s->ckpt_before;
    } else {
        b->code = ZD_ERR_ARGUMENT;
        char held[64] = "none";
        if (s->have_ckpt && s->ckpt_before >= 0)
            snprintf(held, sizeof held, "generations %" PRId64 " and %" PRId64, s->ckpt_gen,
                     s->ckpt_before);
        else if (s->have_ckpt)
            snprintf(held, sizeof held, "generation %" PRId64 " only", s->ckpt_gen);
        snprintf(b->text, sizeof b->text,
                 "stage %d has no checkpoint of generation %" PRId64
                 " (it holds %s, checkpoint_every %" PRId64 ")",
                 s->shard, b->gen, held, s->opts.checkpoint_every);
    }
}

static void cannot_read(back_t *b)
{
    zd__log(ZD_LOG_WARN, "%s", zd_error_last()); /* the path stays in this log */
    b->code = ZD_ERR_ARGUMENT;
    snprintf(b->text, sizeof b->text,
             "stage %d cannot read its checkpoint of generation %" PRId64 " (its log says why)",
             b->s->shard, b->to);
}

/*  The dry run: the decision, the file read as the real run will read it
    (outside the lock: forwards go on meanwhile), and the stage's
    checkpoint writes held off until the real run, so that no new file
    pushes the generation out of the two kept. */
static void back_dry(back_t *b)
{
    zd_ps_model_server_t *s = b->s;
    pthread_mutex_lock(&s->lock);
    back_decide(b);
    int64_t to = b->to;
    pthread_mutex_unlock(&s->lock);
    if (b->code == ZD_OK && to >= 0 && zd__ps_checkpoint_check(&s->ckpt, to) < 0) {
        /* Another trainer's going back, run meanwhile, moves the files
           under the reading (the newer generation removed, the older
           made the current file): the stage changed, and the caller
           looks again; only a stage unchanged has a file it cannot read. */
        pthread_mutex_lock(&s->lock);
        back_decide(b);
        bool changed = b->code != ZD_OK || b->to != to;
        pthread_mutex_unlock(&s->lock);
        if (!changed)
            cannot_read(b);
    }
    pthread_mutex_lock(&s->lock);
    if (b->code == ZD_OK && to >= 0) {
        back_decide(b); /* (changed meanwhile: look again) */
        if (b->code == ZD_OK && b->to == to) {
            int64_t hold = b->hold_ms < 1 ? 1 : b->hold_ms > MAX_HOLD_MS ? MAX_HOLD_MS : b->hold_ms;
            s->hold_writes_until = zd__now_ns() + hold * 1000000;
            s->hold_logged = false;
        } else if (b->code == ZD_OK) {
            b->code = ZD_ERR_STALE;
            snprintf(b->text, sizeof b->text, "stage %d changed since it was asked", s->shard);
        }
    }
    b->answer = answer_new(s, b->code, b->text, NULL, 0);
    pthread_mutex_unlock(&s->lock);
}

/*  The real run, the parameters held as a step holds them: 1 when the
    checkpoint was taken back, else 0. */
static int back_real(void *arg)
{
    back_t *b = arg;
    zd_ps_model_server_t *s = b->s;
    int changed = 0;
    pthread_mutex_lock(&s->lock);
    back_decide(b);
    s->hold_writes_until = 0;
    if (b->code == ZD_OK && b->to >= 0) {
        int64_t got, older;
        if (zd__ps_checkpoint_load(&s->ckpt, b->to, &got, NULL, &older) < 0) {
            cannot_read(b);
        } else {
            /* the step count moves on by one when this returns */
            s->base_version = got - (int64_t)zd_dist_optim_version() - 1;
            s->ckpt_version = s->resumed_version = b->to_version = got;
            s->ckpt_gen = b->to;
            s->ckpt_before = older;
            s->have_ckpt = true;
            s->resumed_gen = b->gen;
            s->instance = new_instance();
            changed = 1;
        }
    }
    if (b->code == ZD_OK)
        s->origin = b->origin;
    if (!changed)
        b->to = -1;
    b->answer = answer_new(s, b->code, b->text, NULL, 0);
    pthread_mutex_unlock(&s->lock);
    return changed;
}

/*  "__zd_psm_back_<K>"(instance, gen, origin, dry, hold_ms) -> [code,
    text, instance]: the stage, if it is still the one of `instance` (as
    its "where" answered: a compare-and-set, else ZD_ERR_STALE and the
    caller looks again), takes its checkpoint of generation `gen` back
    into its parameters and positions: the generation another stage (of
    instance `origin`) resumed from after a restart, so that the stages
    hold one generation. A stage that resumed there and took no step
    since only takes the origin. dry: only whether it could, holding its
    checkpoint writes off for hold_ms (until the real call). The stage's
    instance changes, so that every trainer learns that its batches since
    are gone. Any member may ask, as any may step the stage. */
static zd_value_t *serve_back(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    back_t b = {.s = arg, .to = -1};
    int64_t dry;
    if (ZD_UNPACK(args, &b.instance, &b.gen, &b.origin, &dry, &b.hold_ms) < 0)
        return NULL;
    b.dry = dry != 0;
    if (b.dry)
        back_dry(&b);
    else /* every reader of the parameters and every step held off */
        zd_dist_optim_update_params(back_real, &b);
    if (b.to >= 0 && !b.dry)
        zd__log(ZD_LOG_INFO,
                "ps: stage %d went back from version %" PRId64 " to %" PRId64
                " (generation %" PRId64 "), that of a stage resumed after a restart",
                b.s->shard, b.from, b.to_version, b.gen);
    return b.answer;
}

/*  The stage's checkpoint description, and with opts.resume the newest
    generation there is taken into the stage. 0, or -1. */
static int setup_checkpoints(zd_ps_model_server_t *s, const char *prefix, const char *tag)
{
    int n = zd_nn_module_n_params(s->stage);
    s->names = calloc((size_t)n + 1, sizeof *s->names);
    s->params = calloc((size_t)n + 1, sizeof *s->params);
    if (!s->names || !s->params)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    for (int i = 0; i < n; i++) {
        s->params[i] = zd_nn_module_param(s->stage, i);
        if (!(s->names[i] = strdup(zd_nn_module_param_name(s->stage, i))))
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    }
    s->ckpt = (zd__ps_ckpt_t){.shard = s->shard,
                              .n_shards = s->n_shards,
                              .n = n,
                              .names = s->names,
                              .params = s->params,
                              .positions = &s->positions,
                              .n_positions = &s->n_positions,
                              .by_gen = true,
                              .every = s->opts.checkpoint_every};
    if (tag && *tag && !(s->ckpt.tag = strdup(tag)))
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    if (!(s->ckpt.path = zd__ps_checkpoint_path(prefix, s->shard)) ||
        zd__ps_checkpoint_prepare(&s->ckpt) < 0)
        return -1;
    int64_t v = 0, gen = 0, older = -1;
    int r = s->opts.resume ? zd__ps_checkpoint_load(&s->ckpt, -1, &v, &gen, &older) : -1;
    if (r == -2)
        return -1;
    /* Nothing taken: the stage's first parameters are version 0 on disk,
       so that a stage started again before the first checkpoint, and
       the others with it, can go back to them. */
    if (r == -1 && !s->opts.resume)
        zd__ps_checkpoint_set_aside(&s->ckpt);
    if (r == -1 && zd__ps_checkpoint_write(&s->ckpt, 0, false) < 0)
        return -1;
    s->base_version = s->ckpt_version = v;
    s->ckpt_gen = gen;
    s->ckpt_before = older;
    s->have_ckpt = true;
    if (s->opts.resume) { /* (resumed, at 0 when nothing was there) */
        s->resumed_gen = gen;
        s->resumed_version = v;
        s->origin = s->instance;
    }
    return 0;
}

/*  A random instance number; the clock and the process id where the
    kernel gives no random bytes (a restarted process differs in both),
    never 0 (a trainer's "not seen yet"). */
static int64_t new_instance(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = (uint64_t)zd__now_ns() ^ (uint64_t)getpid() << 40;
    return (int64_t)(v >> 1) | 1;
}

zd_ps_model_server_t *zd_ps_model_server_new(zd_nn_module_t *stage, int shard, int n_shards,
                                             const zd_ps_options_t *opts)
{
    zd_ps_options_t o;
    if (!stage || n_shards < 1 || shard < 0 || shard >= n_shards) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_server_new: %s",
                          !stage ? "NULL stage" : "bad shard");
        return NULL;
    }
    if (zd__ps_options_read(&o, opts) < 0)
        return NULL;
    if (zd_dist_autograd_init() < 0 || zd_dist_optim_init() < 0) {
        zd_error_wrap("zd_ps_model_server_new");
        return NULL;
    }
    zd_ps_model_server_t *s = calloc(1, sizeof *s);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_model_server_new: out of memory");
        return NULL;
    }
    s->stage = stage;
    s->shard = shard;
    s->n_shards = n_shards;
    s->opts = o;
    s->opts.run_tag = NULL; /* (the caller's: setup_checkpoints copies it) */
    s->training = zd_nn_module_is_training(stage);
    s->instance = new_instance();
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    s->ckpt_version = s->ckpt_gen = 0;
    s->ckpt_before = s->resumed_gen = s->resumed_version = -1;
    if (o.max_inflight > 0 && !(s->gate = zd__ps_gate_new(o.max_inflight))) {
        zd_ps_model_server_free(s);
        return NULL;
    }
    if (o.checkpoint_path && setup_checkpoints(s, o.checkpoint_path, o.run_tag) < 0) {
        zd_ps_model_server_free(s);
        return NULL;
    }
    snprintf(s->fn_forward, sizeof s->fn_forward, FN_FORWARD "%d", shard);
    snprintf(s->fn_params, sizeof s->fn_params, FN_PARAMS "%d", shard);
    snprintf(s->fn_where, sizeof s->fn_where, FN_WHERE "%d", shard);
    snprintf(s->fn_back, sizeof s->fn_back, FN_BACK "%d", shard);
    snprintf(s->fn_ckpt, sizeof s->fn_ckpt, FN_CKPT "%d", shard);
    if (zd_rpc_register(s->fn_forward, serve_forward, s) < 0 ||
        zd_rpc_register(s->fn_params, serve_params, s) < 0 ||
        zd_rpc_register(s->fn_where, serve_where, s) < 0 ||
        zd_rpc_register(s->fn_back, serve_back, s) < 0 ||
        zd_rpc_register(s->fn_ckpt, serve_checkpoint, s) < 0) {
        zd_error_wrap("zd_ps_model_server_new: stage %d", shard);
        zd_ps_model_server_free(s);
        return NULL;
    }
    return s;
}

int zd_ps_model_server_stop(zd_ps_model_server_t *s)
{
    if (!s)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_server_stop: NULL");
    pthread_mutex_lock(&s->lock);
    s->stopped = true;
    pthread_cond_broadcast(&s->changed);
    pthread_mutex_unlock(&s->lock);
    if (s->gate)
        zd__ps_gate_stop(s->gate);
    return 0;
}

int64_t zd_ps_model_server_forwards(zd_ps_model_server_t *s)
{
    if (!s)
        return -1;
    pthread_mutex_lock(&s->lock);
    int64_t n = s->forwards;
    pthread_mutex_unlock(&s->lock);
    return n;
}

zd_named_tensors_t *zd_ps_model_server_params(zd_ps_model_server_t *s)
{
    if (!s) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_server_params: NULL");
        return NULL;
    }
    zd_named_tensors_t *nt = zd_named_tensors_new();
    /* under the read lock: no step half taken in the copy */
    zd_dist_optim_read_lock();
    for (int i = 0; nt && i < zd_nn_module_n_params(s->stage); i++) {
        zd_tensor_t *copy = zd_tensor_detach_copy(zd_nn_module_param(s->stage, i));
        int rc = copy ? zd_named_tensors_add(nt, zd_nn_module_param_name(s->stage, i), copy) : -1;
        zd_tensor_unref(copy);
        if (rc < 0) {
            zd_named_tensors_free(nt);
            nt = NULL;
        }
    }
    zd_dist_optim_read_unlock();
    return nt;
}

int zd_ps_model_server_checkpoint(zd_ps_model_server_t *s)
{
    if (!s || !s->ckpt.path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_server_checkpoint: %s",
                                 s ? "no checkpoint_path" : "NULL");
    zd_dist_optim_read_lock();
    int rc = write_checkpoint(s, version_of(s), -1, false);
    zd_dist_optim_read_unlock();
    return rc;
}

int64_t zd_ps_model_server_version(zd_ps_model_server_t *s)
{
    if (!s)
        return -1;
    zd_dist_optim_read_lock(); /* (a going back changes both counts) */
    int64_t v = version_of(s);
    zd_dist_optim_read_unlock();
    return v;
}

int zd_ps_model_server_inflight(zd_ps_model_server_t *s, int *waiting)
{
    if (waiting)
        *waiting = 0;
    return s && s->gate ? zd__ps_gate_used(s->gate, waiting) : 0;
}

void zd_ps_model_server_free(zd_ps_model_server_t *s)
{
    if (!s)
        return;
    if (s->fn_forward[0]) {
        zd_rpc_unregister(s->fn_forward);
        zd_rpc_unregister(s->fn_params);
        zd_rpc_unregister(s->fn_where);
        zd_rpc_unregister(s->fn_back);
        zd_rpc_unregister(s->fn_ckpt);
    }
    free(s->positions);
    for (int i = 0; s->names && i < s->ckpt.n; i++)
        free(s->names[i]);
    free(s->names);
    free(s->params);
    free((char *)s->ckpt.path);
    free((char *)s->ckpt.tag);
    /* nodes still holding slots keep the gate */
    zd__ps_gate_unref(s->gate);
    pthread_cond_destroy(&s->changed);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/*  ---- the trainer ---- */

/*  A shard restarted into the running world serves its stage anew: the
    RRefs of its old parameters, and the optimizer over them, are gone with
    the old process. Every answer of a shard carries its process's
    instance number; the trainer keeps those the optimizer's RRefs came
    from, and makes the optimizer again when a shard answers with another
    (whether or not the trainer saw it lost in between). */
struct zd_ps_model {
    int n_shards;
    int *ranks;
    int64_t *instance; /* of each shard, when opt was made */
    bool stale;        /* a shard answered with another instance */
    /* each shard's instance when the stages were last brought to one
       generation (0: not looked at yet), and agree's scratch */
    int64_t *agreed, *scratch;
    int *joins, *joins_before; /* zd_rpc_peer_joins of each shard's rank then; agree's */
    /* the stages are to be brought to one generation before the next
       forward or step: at the first, and after a stage was lost or
       changed (a trainer that runs its batch again without
       zd_ps_model_wait_shards must not step a stage still apart) */
    bool must_agree;
    zd_optim_config_t optim;
    zd_dist_optim_t *opt; /* made at the first forward or step */
    bool training;
    int64_t position; /* training forwards carry it (zd_ps_model_set_position); -1: none */
    bool stepped;     /* a step over the stages as they are (a checkpoint may follow) */
};

/*  Drops the optimizer after a call failed with ZD_ERR_PEER (a shard
    lost): the next forward or step fetches the parameters' RRefs again,
    from the shard started again. The error stays as it was. */
static void forget_lost(zd_ps_model_t *m)
{
    if (zd_error_code() != ZD_ERR_PEER)
        return;
    m->must_agree = true;
    m->stepped = false;
    if (!m->opt)
        return;
    char text[512];
    snprintf(text, sizeof text, "%s", zd_error_last());
    zd_dist_optim_free(m->opt);
    m->opt = NULL;
    zd_error_set_code(ZD_ERR_PEER, "%s", text);
}

zd_ps_model_t *zd_ps_model_new(const int *shard_ranks, int n_shards, const zd_optim_config_t *optim,
                               const zd_ps_options_t *opts)
{
    zd_ps_options_t o;
    if (n_shards < 1 || !optim) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_new: n_shards >= 1 and optim are required");
        return NULL;
    }
    if (zd_optim_config_check(optim) < 0) {
        zd_error_wrap("zd_ps_model_new");
        return NULL;
    }
    if (zd__ps_options_read(&o, opts) < 0)
        return NULL;
    for (int i = 0; shard_ranks && i < n_shards; i++)
        if (shard_ranks[i] < 0) {
            zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_new: shard %d has rank %d", i,
                              shard_ranks[i]);
            return NULL;
        }
    if (zd_dist_autograd_init() < 0) {
        zd_error_wrap("zd_ps_model_new");
        return NULL;
    }
    zd_ps_model_t *m = calloc(1, sizeof *m);
    if (m &&
        (!(m->ranks = malloc((size_t)n_shards * sizeof *m->ranks)) ||
         !(m->instance = calloc((size_t)n_shards, sizeof *m->instance)) ||
         !(m->agreed = calloc((size_t)n_shards, sizeof *m->agreed)) ||
         !(m->joins = calloc((size_t)n_shards, sizeof *m->joins)) ||
         !(m->joins_before = calloc((size_t)n_shards, sizeof *m->joins_before)) ||
         !(m->scratch = calloc(5 * (size_t)n_shards, sizeof *m->scratch)))) {
        zd_ps_model_free(m);
        m = NULL;
    }
    if (!m) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_model_new: out of memory");
        return NULL;
    }
    for (int i = 0; i < n_shards; i++)
        m->ranks[i] = shard_ranks ? shard_ranks[i] : i;
    m->n_shards = n_shards;
    m->optim = *optim;
    m->training = true;
    m->position = -1;
    m->must_agree = true;
    return m;
}

/*  The error of a call to stage s that failed: a lost shard is
    ZD_ERR_PEER whatever the call saw first. */
static int call_failed(const zd_ps_model_t *m, int s, const char *what)
{
    zd_error_code_t code = zd_error_code();
    char text[512];
    snprintf(text, sizeof text, "%s", zd_error_last());
    if (code == ZD_ERR_PEER || zd_rpc_peer_is_lost(m->ranks[s]))
        return zd_error_set_code(ZD_ERR_PEER, "ps: %s: stage %d (rank %d) lost: %s", what, s,
                                 m->ranks[s], text);
    return zd_error_set_code(code == ZD_OK ? ZD_ERR_OTHER : code, "ps: %s: stage %d (rank %d): %s",
                             what, s, m->ranks[s], text);
}

/*  Calls fn_prefix<s> on stage s with args (taken) and reads the answer's
    head: 0 with *v (a new reference), or -1 with the code the shard
    answered (a code it may not answer reads as a bad answer). */
static int call_stage(zd_ps_model_t *m, int s, const char *what, const char *fn_prefix,
                      zd_value_t *args, int64_t timeout_ms, zd_value_t **v)
{
    char fn[40];
    snprintf(fn, sizeof fn, "%s%d", fn_prefix, s);
    *v = NULL;
    if (zd_rpc_sync_take(m->ranks[s], fn, args, timeout_ms, v) < 0)
        return call_failed(m, s, what);
    int64_t code, instance;
    const char *text;
    if (zd_rpc_arg_int(*v, 0, &code) < 0 || zd_rpc_arg_string(*v, 1, &text) < 0 ||
        zd_rpc_arg_int(*v, 2, &instance) < 0) {
        zd_value_unref(*v);
        *v = NULL;
        return zd_error_set_code(ZD_ERR_REMOTE, "ps: %s: stage %d (rank %d) answered badly: %s",
                                 what, s, m->ranks[s], zd_error_last());
    }
    if (code == ZD_OK) {
        if (m->opt && instance != m->instance[s])
            m->stale = true;
        m->instance[s] = instance;
        return 0;
    }
    zd_error_code_t c = code == ZD_ERR_ARGUMENT || code == ZD_ERR_STOPPED ||
            code == ZD_ERR_REMOTE || code == ZD_ERR_NO_MEMORY || code == ZD_ERR_STALE
        ? (zd_error_code_t)code
        : ZD_ERR_REMOTE;
    zd_error_set_code(c, "ps: %s: stage %d (rank %d): %.400s", what, s, m->ranks[s], text);
    zd_value_unref(*v);
    *v = NULL;
    return -1;
}

/*  The first forward or step: RRefs to every stage's parameters, and the
    DistributedOptimizer over all of them. */
static int agree(zd_ps_model_t *m, int64_t timeout_ms);

static int ensure_optimizer(zd_ps_model_t *m)
{
    if (m->must_agree && agree(m, ZD_TIMEOUT_DEFAULT) < 0)
        return -1;
    if (m->opt && !m->stale)
        return 0;
    zd_dist_optim_free(m->opt);
    m->opt = NULL;
    m->stale = false;
    m->stepped = false;
    zd_rref_list_t *all = zd_rref_list_new();
    if (!all)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    int rc = 0;
    for (int s = 0; rc == 0 && s < m->n_shards; s++) {
        zd_value_t *v;
        rc = call_stage(m, s, "parameters", FN_PARAMS, zd_value_list(0), ZD_TIMEOUT_DEFAULT, &v);
        for (size_t i = 3; rc == 0 && i < zd_list_len(v); i++) {
            zd_rref_t *r;
            if (zd_rpc_arg_rref(v, i, &r) < 0 || zd_rref_list_append(all, r) < 0)
                rc = zd_error_wrap("ps: parameters of stage %d (rank %d)", s, m->ranks[s]);
        }
        zd_value_unref(v);
    }
    if (rc == 0 && !(m->opt = zd_dist_optim_new(&m->optim, all)))
        rc = zd_error_wrap("ps: the model's optimizer");
    zd_rref_list_free(all);
    return rc;
}

/*  [training, n_out, position, instance, in...] for stage s: a new
    value, or NULL. */
static zd_value_t *forward_args(const zd_ps_model_t *m, int s, int n_out, zd_tensor_t *const *in,
                                int n_in)
{
    zd_value_t *args = zd_value_list(4 + (size_t)n_in);
    if (args &&
        (zd_list_append(args, zd_value_int(m->training)) < 0 ||
         zd_list_append(args, zd_value_int(n_out)) < 0 ||
         zd_list_append(args, zd_value_int(m->training ? m->position : -1)) < 0 ||
         zd_list_append(args, zd_value_int(m->opt ? m->instance[s] : 0)) < 0)) {
        zd_value_unref(args);
        return NULL;
    }
    for (int i = 0; args && i < n_in; i++)
        if (zd_list_append(args, zd_value_tensor(in[i])) < 0) {
            zd_value_unref(args);
            args = NULL;
        }
    return args;
}

static void unref_all(zd_tensor_t **ts, int n)
{
    for (int i = 0; i < n; i++)
        zd_tensor_unref_p(&ts[i]);
}

int zd_ps_model_forward(zd_ps_model_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                        int n_out, int64_t timeout_ms)
{
    for (int i = 0; out && i < n_out && i < ZD__PS_MAX_TENSORS; i++)
        out[i] = NULL;
    if (!m || !in || n_in < 1 || n_in > ZD__PS_MAX_TENSORS || !out || n_out < 1 ||
        n_out > ZD__PS_MAX_TENSORS)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_ps_model_forward: a model, 1 to %d inputs and 1 to %d "
                                 "outputs are required",
                                 ZD__PS_MAX_TENSORS, ZD__PS_MAX_TENSORS);
    if (m->training)
        zd__fault_point(zd_rpc_rank(), "forward"); /* tests only (core/fault_point.h) */
    if (ensure_optimizer(m) < 0)
        return -1;
    /* Each stage's outputs are the next one's inputs. */
    zd_tensor_t *cur[ZD__PS_MAX_TENSORS] = {0};
    int n_cur = n_in;
    for (int i = 0; i < n_in; i++)
        cur[i] = zd_tensor_ref(in[i]);
    int rc = 0;
    for (int s = 0; rc == 0 && s < m->n_shards; s++) {
        bool last = s == m->n_shards - 1;
        zd_value_t *args = forward_args(m, s, last ? n_out : 0, cur, n_cur), *v = NULL;
        unref_all(cur, n_cur);
        if (!args) {
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: forward: out of memory");
            break;
        }
        if (call_stage(m, s, "forward", FN_FORWARD, args, timeout_ms, &v) < 0) {
            if (zd_error_code() == ZD_ERR_STALE) /* (the stage's text says why) */
                zd_error_set_code(ZD_ERR_PEER, "%s", zd_error_last());
            forget_lost(m);
            rc = -1;
            break;
        }
        if (m->stale) { /* a stage of 1.0 does not check */
            /* the batches this trainer sent it since its last look are
               gone from it: the trainer goes back (wait_shards, then
               resume_position), as after a loss */
            zd_value_unref(v);
            rc = zd_error_set_code(ZD_ERR_PEER,
                                   "ps: forward: stage %d (rank %d) was started again, or "
                                   "went back to a checkpoint, since this trainer's last step",
                                   s, m->ranks[s]);
            forget_lost(m);
            break;
        }
        size_t got = zd_list_len(v) - 3;
        n_cur = 0;
        if (got < 1 || got > ZD__PS_MAX_TENSORS || (last && got != (size_t)n_out))
            rc = zd_error_set_code(ZD_ERR_REMOTE,
                                   "ps: forward: stage %d (rank %d) gave %zu outputs%s", s,
                                   m->ranks[s], got, last ? ", not the ones asked for" : "");
        for (size_t i = 0; rc == 0 && i < got; i++) {
            zd_tensor_t *t;
            if (zd_rpc_arg_tensor(v, 3 + i, &t) < 0)
                rc = zd_error_set_code(ZD_ERR_REMOTE, "ps: forward: stage %d (rank %d): %s", s,
                                       m->ranks[s], zd_error_last());
            else
                cur[n_cur++] = zd_tensor_ref(t);
        }
        zd_value_unref(v);
    }
    if (rc < 0) {
        unref_all(cur, ZD__PS_MAX_TENSORS);
        return -1;
    }
    for (int i = 0; i < n_out; i++)
        out[i] = cur[i];
    return 0;
}

int zd_ps_model_backward(zd_ps_model_t *m, int64_t context_id, zd_tensor_t *loss)
{
    if (!m || !loss)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_ps_model_backward: a model and a loss are required");
    if (zd_dist_autograd_backward(context_id, &loss, 1, false) == 0) /* (a fault point) */
        return 0;
    /* the stages' part of the graph went with a lost one: the trainer
       recovers as after a forward's loss */
    char text[512];
    snprintf(text, sizeof text, "%s", zd_error_last());
    for (int s = 0; s < m->n_shards; s++)
        if (zd_rpc_peer_is_lost(m->ranks[s])) {
            zd_error_set_code(ZD_ERR_PEER, "ps: backward: stage %d (rank %d) lost: %s", s,
                              m->ranks[s], text);
            forget_lost(m);
            return -1;
        }
    return zd_error_wrap("ps: backward");
}

int zd_ps_model_step(zd_ps_model_t *m, int64_t context_id)
{
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_step: NULL");
    if (ensure_optimizer(m) < 0)
        return -1;
    if (zd_dist_optim_step(m->opt, context_id) < 0) {
        char text[512];
        snprintf(text, sizeof text, "%s", zd_error_last());
        zd_error_code_t code = zd_error_code();
        /* A stage that went back refuses the optimizers made before (its
           refusal reaches here as a remote error): its new number tells,
           and the trainer recovers as from a stage lost. */
        for (int s = 0; s < m->n_shards && !m->stale && code != ZD_ERR_PEER; s++) {
            zd_value_t *v = NULL;
            if (call_stage(m, s, "after a failed step", FN_WHERE, zd_value_list(0),
                           ZD_TIMEOUT_DEFAULT, &v) == 0)
                zd_value_unref(v);
        }
        zd_error_set_code(m->stale ? ZD_ERR_PEER : code, "%s%s",
                          m->stale ? "a stage went back to a checkpoint since this batch's "
                                     "forward: "
                                   : "",
                          text);
        for (int s = 0; s < m->n_shards; s++)
            if (zd_rpc_peer_is_lost(m->ranks[s]))
                zd_error_set_code(ZD_ERR_PEER, "stage %d (rank %d) lost: %s", s, m->ranks[s], text);
        zd_error_wrap("ps: step");
        forget_lost(m);
        return -1;
    }
    m->stepped = true;
    return 0;
}

/*  "__zd_psm_back_<s>"(instance, gen, origin, dry) on stage s, with
    *instance its instance after it: 0; 1 when the stage had changed
    (look again); -1 with the error set. */
static int send_back(zd_ps_model_t *m, int s, int64_t *instance, int64_t gen, int64_t origin,
                     bool dry, int64_t timeout_ms)
{
    /* a dry run holds the stage's checkpoint writes off until the real
       call, which comes within the calls left: two a stage */
    int64_t per = timeout_ms > 0 ? timeout_ms : zd_rpc_get_timeout();
    int64_t hold = !dry ? 0 : per > 0 ? per * (2 * (int64_t)m->n_shards + 1) : INT64_MAX / 2;
    zd_value_t *v;
    if (call_stage(m, s, "going back", FN_BACK, ZD_ARGS(*instance, gen, origin, dry, hold),
                   timeout_ms, &v) < 0)
        return zd_error_code() == ZD_ERR_STALE ? 1 : -1;
    *instance = m->instance[s];
    zd_value_unref(v);
    return 0;
}

/*  One look of agree, the stages' "where" answers read into the
    scratch: 0 (done, or nothing to do), 1 (a stage changed: look
    again), or -1. */
static int agree_once(zd_ps_model_t *m, int64_t timeout_ms)
{
    int n = m->n_shards, chooser = -1;
    int64_t *inst = m->scratch, *gen = inst + n, *origin = gen + n, *fresh = origin + n,
            *every = fresh + n;
    for (int s = 0; s < n; s++) {
        zd_value_t *v;
        if (call_stage(m, s, "the stages' generations", FN_WHERE, zd_value_list(0), timeout_ms,
                       &v) < 0)
            return -1;
        inst[s] = m->instance[s];
        gen[s] = zd_list_len(v) > 8 ? -1 : -2; /* -2: a stage of 1.0, which says none */
        origin[s] = fresh[s] = every[s] = 0;
        int bad = gen[s] == -1 &&
            (zd_rpc_arg_int(v, 5, &gen[s]) < 0 || zd_rpc_arg_int(v, 6, &origin[s]) < 0 ||
             zd_rpc_arg_int(v, 7, &fresh[s]) < 0 || zd_rpc_arg_int(v, 8, &every[s]) < 0);
        zd_value_unref(v);
        if (bad)
            return zd_error_set_code(ZD_ERR_REMOTE,
                                     "ps: generations: stage %d (rank %d) answered badly", s,
                                     m->ranks[s]);
        /* a stage that resumed by itself (its origin its own), new since
           this trainer looked, and untouched since */
        if (inst[s] != m->agreed[s] && gen[s] >= 0 && fresh[s] && origin[s] == inst[s] &&
            (chooser < 0 || gen[s] < gen[chooser]))
            chooser = s;
    }
    /* a generation is a checkpoint_every interval: of one length on
       every stage with checkpoints, or the intervals do not match (told
       at the first look, not at a restart) */
    for (int s = 0, first = -1; s < n; s++) {
        if (gen[s] == -2 || every[s] < 0)
            continue;
        if (first < 0)
            first = s;
        else if (every[s] != every[first])
            return zd_error_set_code(
                ZD_ERR_ARGUMENT,
                "ps: stages %d and %d (ranks %d and %d) write checkpoints every %" PRId64
                " and %" PRId64 " steps: their generations cannot be matched",
                first, s, m->ranks[first], m->ranks[s], every[first], every[s]);
    }
    /* first whether every stage can, so that none goes back alone */
    for (int dry = 1; chooser >= 0 && dry >= 0; dry--)
        for (int s = 0; s < n; s++) {
            if (origin[s] == origin[chooser])
                continue;
            if (gen[s] == -2)
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "ps: stage %d (rank %d) is of a release that cannot go "
                                         "back to generation %" PRId64,
                                         s, m->ranks[s], gen[chooser]);
            int64_t at = inst[s];
            int rc = send_back(m, s, &at, gen[chooser], origin[chooser], dry, timeout_ms);
            if (rc != 0)
                return rc;
            if (!dry)
                inst[s] = at;
        }
    memcpy(m->agreed, inst, (size_t)n * sizeof *inst);
    return 0;
}

/*  One generation across the stages. A stage started again with resume
    took its newest generation back while the others went on (or a
    resumed run found one stage's newest generation damaged): the others
    go back to their checkpoint of that generation (their newest or the
    one before), so that the model is one checkpoint's again and the
    trainers' positions, the smallest of the stages', hold on every
    stage. The stage that chooses is one new since this trainer last
    looked (another instance) that resumed at a generation and took no
    step since; of several, the one of the oldest generation. The stages
    that went back with it take its instance as their origin, so that a
    trainer looking later leaves them alone. 0, or -1 (ZD_ERR_ARGUMENT: a
    stage without that generation, named; the calls' errors). */
static int agree(zd_ps_model_t *m, int64_t timeout_ms)
{
    /* stages that change meanwhile (another trainer sent them back) are
       looked at again */
    for (int attempt = 0; attempt < 10; attempt++) {
        /* counted before the stages are asked: a shard started again
           after it answered is one zd_ps_model_lost_shard still names */
        for (int s = 0; s < m->n_shards; s++)
            m->joins_before[s] = zd_rpc_peer_joins(m->ranks[s]);
        int rc = agree_once(m, timeout_ms);
        if (rc < 0)
            return zd_error_wrap("ps: bringing the stages to one generation");
        if (rc == 0) {
            m->must_agree = false;
            memcpy(m->joins, m->joins_before, (size_t)m->n_shards * sizeof *m->joins);
            return 0;
        }
        nanosleep(&(struct timespec){0, 20000000 * (attempt + 1)}, NULL);
    }
    return zd_error_set_code(ZD_ERR_TIMEOUT,
                             "ps: the stages kept changing while they were brought to one "
                             "generation");
}

static int agree_arg(void *m)
{
    return agree(m, ZD_TIMEOUT_DEFAULT);
}

int zd_ps_model_wait_shards(zd_ps_model_t *m, int64_t timeout_ms)
{
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_wait_shards: NULL");
    return zd__ps_wait_shards(m->ranks, m->n_shards, timeout_ms, agree_arg, m);
}

int zd_ps_model_set_position(zd_ps_model_t *m, int64_t position)
{
    if (!m || position < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_set_position: %s",
                                 m ? "a position >= 0 is required" : "NULL");
    m->position = position;
    return 0;
}

/*  One try of zd_ps_model_checkpoint: 0, or -1 with *again set when a
    stage's write met another trainer's newer generation (asked again,
    the stages write that one). */
static int checkpoint_once(zd_ps_model_t *m, int64_t position, int64_t timeout_ms, bool *again)
{
    *again = false;
    /* The position claims the batches before it on every stage: only
       after a step over stages that have not changed since. */
    if (!m->stepped || m->stale || m->must_agree)
        return zd_error_set_code(ZD_ERR_STALE,
                                 "zd_ps_model_checkpoint: no step yet over the stages as they "
                                 "are (a new handle, or a stage lost, started again or gone "
                                 "back: zd_ps_model_wait_shards, zd_ps_model_resume_position, "
                                 "a batch from there, then a checkpoint)");
    /* Every stage asked first whether it would: none is written when one
       would refuse. Their answers give the generation: one after the
       newest when all hold it, so that the files of one call are one
       generation whatever versions other trainers' steps left each stage
       at; else the newest, which a call that failed on a stage, or
       another trainer's now, left incomplete: the stages there write it
       again in place, keeping the older generation the others hold. */
    int64_t gen = 0, lo = INT64_MAX, hi = -1;
    for (int dry = 1; dry >= 0; dry--)
        for (int s = 0; s < m->n_shards; s++) {
            zd_value_t *v, *args = ZD_ARGS(position, m->instance[s], dry, gen);
            if (!args)
                return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_model_checkpoint: out of memory");
            if (call_stage(m, s, "checkpoint", FN_CKPT, args, timeout_ms, &v) < 0) {
                /* (a dry run's ZD_ERR_STALE is the stage's own change) */
                *again = !dry && zd_error_code() == ZD_ERR_STALE;
                forget_lost(m);
                return -1;
            }
            int64_t on_disk = -1;
            int bad = dry && zd_rpc_arg_int(v, 4, &on_disk) < 0;
            zd_value_unref(v);
            if (bad || on_disk < -1 || on_disk >= INT64_MAX / 2)
                return zd_error_set_code(ZD_ERR_REMOTE,
                                         "ps: checkpoint: stage %d (rank %d) answered badly (its "
                                         "generation on disk: %" PRId64 ")",
                                         s, m->ranks[s], on_disk);
            lo = dry && on_disk < lo ? on_disk : lo;
            hi = dry && on_disk > hi ? on_disk : hi;
            if (dry && s == m->n_shards - 1)
                gen = lo == hi ? hi + 1 : hi;
        }
    m->position = position;
    return 0;
}

int zd_ps_model_checkpoint(zd_ps_model_t *m, int64_t position, int64_t timeout_ms)
{
    if (!m || position < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_checkpoint: %s",
                                 m ? "a position >= 0 is required" : "NULL");
    zd__fault_point(zd_rpc_rank(), "checkpoint"); /* tests only (core/fault_point.h) */
    bool again = true;
    int rc = -1;
    for (int tries = 0; rc < 0 && again && tries < 3; tries++)
        rc = checkpoint_once(m, position, timeout_ms, &again);
    return rc;
}

int zd_ps_model_resume_position(zd_ps_model_t *m, int64_t timeout_ms, int64_t *position)
{
    if (position)
        *position = -1;
    if (!m || !position)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_resume_position: NULL");
    /* first one generation everywhere: the positions are then of it */
    if (agree(m, timeout_ms) < 0)
        return -1;
    /* The earliest: every stage holds the batches before it. A stage
       with none for this trainer (it never served a training forward of
       it, or its checkpoint is older) means the beginning. */
    int64_t least = INT64_MAX;
    for (int s = 0; s < m->n_shards; s++) {
        zd_value_t *v;
        int64_t p;
        if (call_stage(m, s, "position", FN_WHERE, zd_value_list(0), timeout_ms, &v) < 0)
            return -1;
        int rc = zd_rpc_arg_int(v, 3, &p);
        zd_value_unref(v);
        if (rc < 0 || p < -1)
            return zd_error_set_code(
                ZD_ERR_REMOTE, "ps: position: stage %d (rank %d) answered badly", s, m->ranks[s]);
        least = p < least ? p : least;
    }
    *position = least;
    return 0;
}

int zd_ps_model_lost_shard(zd_ps_model_t *m, int64_t timeout_ms)
{
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_lost_shard: NULL");
    /* RPC declares a peer lost about 1 s after its connection dropped: a
       call may fail first */
    int64_t deadline = zd__deadline_after(zd__now_ns(), timeout_ms);
    for (;;) {
        for (int s = 0; s < m->n_shards; s++)
            if (zd_rpc_peer_is_lost(m->ranks[s]) || zd_rpc_peer_joins(m->ranks[s]) != m->joins[s])
                return s;
        if (deadline != ZD__NEVER && zd__ms_left(zd__now_ns(), deadline) <= 0)
            return zd_error_set_code(ZD_ERR_TIMEOUT,
                                     "zd_ps_model_lost_shard: no shard lost or started again");
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
}

int zd_ps_model_recover(zd_ps_model_t *m, int64_t timeout_ms, int64_t *position)
{
    if (position)
        *position = -1;
    if (!m || !position)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_recover: NULL");
    int64_t deadline = zd__deadline_after(zd__now_ns(), timeout_ms);
    for (;;) {
        /* without a limit, each call of resume_position has the RPC's */
        bool never = deadline == ZD__NEVER;
        int64_t left = never ? ZD_TIMEOUT_NONE : zd__ms_left(zd__now_ns(), deadline);
        if (left <= 0 && !never)
            return zd_error_set_code(ZD_ERR_TIMEOUT, "zd_ps_model_recover: %s", zd_error_last());
        if (zd_ps_model_wait_shards(m, left) == 0 &&
            zd_ps_model_resume_position(m, never ? ZD_TIMEOUT_DEFAULT : left, position) == 0) {
            if (*position < 0)
                *position = 0;
            return 0;
        }
        /* a shard just back may not take calls from everyone yet, or
           was lost again: asked again while the time lasts */
        if (zd_error_code() != ZD_ERR_PEER && zd_error_code() != ZD_ERR_TIMEOUT)
            return -1;
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
}

int zd__ps_model_rank(const zd_ps_model_t *m, int s)
{
    return m && s >= 0 && s < m->n_shards ? m->ranks[s] : -1;
}

bool zd_ps_model_train(zd_ps_model_t *m, bool training)
{
    if (!m)
        return false;
    bool was = m->training;
    m->training = training;
    return was;
}

void zd_ps_model_free(zd_ps_model_t *m)
{
    if (!m)
        return;
    zd_dist_optim_free(m->opt);
    free(m->scratch);
    free(m->agreed);
    free(m->joins);
    free(m->joins_before);
    free(m->instance);
    free(m->ranks);
    free(m);
}
