/* SPDX-License-Identifier: MIT */
/*  dist_engine.c: the distributed backward pass and context release.

    Each process keeps, per context, one autograd task for the current pass
    (autograd.h), whose start nodes are every send function recorded here
    (plus the roots on the process that called backward). A gradient
    message feeds one send function and runs what became ready; receive
    functions reached send their gradients on with zd_rpc_async. The message
    is answered when every message it set off has been answered, so the
    answer to the initiator's own messages means the whole pass is done.

    Answers carry how many nodes still wait for gradients (a send function
    whose output was unused never gets one). When any do, the initiator
    repeatedly asks all participants for their highest pending node (by
    Lamport sequence number) and has that process flush it, until none is
    left: see zd_autograd_task_flush_one for why the order matters.

    Internal functions (all async: no pool thread waits):
      __dist_backward(ctx, msg, pass, retain, grads...) -> pending count
      __dist_pending(ctx, pass, query)                  -> [seq, rank]
      __dist_flush(ctx, pass)                           -> pending count
      __dist_release(ctx)                               -> none */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fault_inject.h"
#include "core/fault_point.h"
#include "dist_autograd/dist_private.h"
#include <zdist/error.h>
#include "core/log_private.h"
#include <zdist/value.h>

/*  ---- joining futures ---- */

/*  Completes `out` once all futures completed (zd_future_collect_all): with
    the sum (or, for max_mode, the [seq, rank] pair with the largest seq)
    of their results plus `local`, or with the first error. */
typedef struct {
    zd_future_t *out;
    bool max_mode;
    int64_t local, local_rank;
} join_t;

static void join_done(zd_future_t *all, void *arg)
{
    join_t *j = arg;
    zd_value_t *list = zd_future_value(all);
    if (!list) {
        zd_future_set_error_code(j->out, zd_future_error_code(all), "%s", zd_future_error(all));
    } else {
        int64_t sum = j->local, best_seq = j->local, best_rank = j->local_rank;
        for (size_t i = 0; i < zd_list_len(list); i++) {
            zd_value_t *v = zd_list_get(list, i);
            int64_t n, seq, rank;
            if (!j->max_mode && zd_value_get_int(v, &n) == 0)
                sum += n;
            else if (j->max_mode && zd_rpc_arg_int(v, 0, &seq) == 0 &&
                     zd_rpc_arg_int(v, 1, &rank) == 0 && seq > best_seq) {
                best_seq = seq;
                best_rank = rank;
            }
        }
        zd_value_t *v = j->max_mode ? ZD_ARGS(best_seq, best_rank) : zd_value_int(sum);
        if (v)
            zd_future_set_value(j->out, v);
        else
            zd_future_set_error_code(j->out, ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
        zd_value_unref(v);
    }
    zd_future_unref(j->out);
    free(j);
}

/*  A future joining fs (references borrowed). NULL when out of memory. */
static zd_future_t *join_futures(zd_future_t *const *fs, int n, bool max_mode, int64_t local,
                                 int64_t local_rank)
{
    join_t *j = malloc(sizeof *j);
    zd_future_t *out = zd_future_new();
    zd_future_t *all = zd_future_collect_all(fs, n);
    if (!j || !out || !all) {
        free(j);
        zd_future_unref(out);
        zd_future_unref(all);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
        return NULL;
    }
    *j = (join_t){zd_future_ref(out), max_mode, local, local_rank};
    if (zd_future_then(all, join_done, j) < 0) {
        zd_future_unref(j->out);
        free(j);
        zd_future_unref(out);
        out = NULL;
    }
    zd_future_unref(all);
    return out;
}

/*  ---- the futures a feed sets off (thread-local while a feed runs) ---- */

typedef struct {
    int64_t ctx_id;
    int64_t pass_id;
    bool retain;
    zd_future_t **fs;
    int n, cap;
} feed_t;

static _Thread_local feed_t *current_feed;

static int feed_add(feed_t *fd, zd_future_t *f)
{
    if (fd->n == fd->cap) {
        int ncap = fd->cap ? fd->cap * 2 : 8;
        zd_future_t **p = realloc(fd->fs, sizeof *p * (size_t)ncap);
        if (!p)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
        fd->fs = p;
        fd->cap = ncap;
    }
    fd->fs[fd->n++] = f;
    return 0;
}

static void feed_clear(feed_t *fd)
{
    for (int i = 0; i < fd->n; i++)
        zd_future_unref(fd->fs[i]);
    free(fd->fs);
    fd->fs = NULL;
    fd->n = fd->cap = 0;
}

/*  ---- the two node kinds ---- */

static int send_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    for (int i = 0; i < zd_autograd_node_n_inputs(n); i++)
        gin[i] = zd_tensor_ref(gout[i]);
    return 0;
}

static int recv_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    (void)gin;
    const dist_recv_info_t *info = zd_autograd_node_ctx(n);
    feed_t *fd = current_feed;
    if (!fd)
        return zd_error_set("dist_autograd: a receive function ran outside a distributed "
                            "backward pass (use zd_dist_autograd_backward)");
    zd_value_t *args =
        ZD_ARGS(info->ctx_id, (int64_t)info->msg_id, fd->pass_id, (int64_t)fd->retain);
    for (int i = 0; args && i < zd_autograd_node_n_outputs(n); i++)
        if (zd_list_append(args, zd_value_tensor(gout[i])) < 0) {
            zd_value_unref(args);
            args = NULL;
        }
    if (!args)
        return -1;
    zd_future_t *f = zd_rpc_async(info->peer, "__dist_backward", args, ZD_TIMEOUT_DEFAULT);
    zd_value_unref(args);
    if (!f)
        return -1;
    return feed_add(fd, f) < 0 ? (zd_future_unref(f), -1) : 0;
}

static void recv_release(zd_autograd_node_t *n)
{
    free(zd_autograd_node_ctx(n));
}

const zd_autograd_node_ops_t zd__dist_send_ops =
    ZD_AUTOGRAD_NODE_OPS("SendRpcBackward", send_backward, NULL);
const zd_autograd_node_ops_t zd__dist_recv_ops =
    ZD_AUTOGRAD_NODE_OPS("RecvRpcBackward", recv_backward, recv_release);

/*  ---- the guard around local backward work ---- */

/*  Backward functions read the parameters (a linear layer's weight for its
    input's gradient) that another trainer's optimizer step may be writing
    on this process: the layer doing the writes brackets every local run.
    Set before RPC starts, read by pool threads: atomics for TSan. */
typedef void (*guard_fn_t)(void);
static _Atomic(guard_fn_t) guard_enter, guard_leave;

int zd_dist_autograd_set_backward_guard(void (*enter)(void), void (*leave)(void))
{
    if (!enter != !leave)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dist_autograd_set_backward_guard: %s is NULL",
                                 enter ? "leave" : "enter");
    atomic_store(&guard_enter, NULL);
    atomic_store(&guard_leave, leave);
    atomic_store(&guard_enter, enter);
    return 0;
}

/*  Returns what guard_done must call (NULL: nothing was entered). */
static guard_fn_t guard_begin(void)
{
    guard_fn_t enter = atomic_load(&guard_enter);
    guard_fn_t leave = enter ? atomic_load(&guard_leave) : NULL;
    if (leave)
        enter();
    return leave;
}

static void guard_done(guard_fn_t leave)
{
    if (leave)
        leave();
}

int zd_dist_autograd_run_guarded(zd_dist_autograd_guarded_fn *fn, void *arg)
{
    if (!fn)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dist_autograd_run_guarded: NULL fn");
    guard_fn_t leave = guard_begin();
    int rc = fn(arg);
    guard_done(leave);
    return rc;
}

/*  ---- passes ---- */

/*  Makes sure the context's task belongs to pass_id, building it over
    every send function (and the extra starts) when the pass is new.
    Called with pass_lock held. */
static int ensure_task(dist_context_t *c, int64_t pass_id, bool retain,
                       zd_autograd_node_t *const *extra, int n_extra)
{
    if (c->task && c->pass_id == pass_id)
        return 0;
    pthread_mutex_lock(&c->lock);
    int n = c->n_sends + n_extra;
    zd_autograd_node_t **starts = malloc(sizeof *starts * (size_t)(n ? n : 1));
    if (starts) {
        for (int i = 0; i < c->n_sends; i++)
            starts[i] = c->sends[i].node;
        for (int i = 0; i < n_extra; i++)
            starts[c->n_sends + i] = extra[i];
    }
    pthread_mutex_unlock(&c->lock);
    if (!starts)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    zd_autograd_options_t o = zd_autograd_options_default();
    o.retain_graph = retain;
    o.accumulate = zd__dist_context_accumulate;
    o.accumulate_arg = c;
    zd_autograd_task_t *t = zd_autograd_task_new(starts, n, &o);
    free(starts);
    if (!t)
        return -1;
    zd_autograd_task_free(c->task);
    c->task = t;
    c->pass_id = pass_id;
    return 0;
}

static const char *self_desc(char *buf, size_t size)
{
    snprintf(buf, size, "worker \"%s\" (rank %d)", zd_rpc_name(), zd_rpc_rank());
    return buf;
}

/*  ---- __dist_backward ---- */

/*  The gradients of a __dist_backward must be what the send function
    sent: float32 tensors of exactly its tensors' shapes (backward
    functions read as many elements as their output had). */
static int check_grads(zd_autograd_node_t *send, zd_tensor_t *const *grads, int n, int from,
                       uint64_t msg_id)
{
    for (int i = 0; i < n; i++) {
        int ndim;
        const int64_t *shape = zd_autograd_node_output_shape(send, i, &ndim);
        bool ok = zd_tensor_dtype(grads[i]) == ZD_FLOAT32 && zd_tensor_ndim(grads[i]) == ndim;
        for (int d = 0; ok && d < ndim; d++)
            ok = zd_tensor_shape(grads[i])[d] == shape[d];
        if (ok)
            continue;
        char who[160], want[96] = "[", got[96] = "[";
        for (int d = 0; d < ndim; d++)
            snprintf(want + strlen(want), sizeof want - strlen(want), d ? ",%lld" : "%lld",
                     (long long)shape[d]);
        for (int d = 0; d < zd_tensor_ndim(grads[i]); d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), d ? ",%lld" : "%lld",
                     (long long)zd_tensor_shape(grads[i])[d]);
        zd__dist_peer_desc(from, who, sizeof who);
        zd__log(ZD_LOG_WARN,
                "dist_autograd: gradient %d from %s for message %llu is %s %s]; "
                "the tensor sent was float32 %s]: refused",
                i, who, (unsigned long long)msg_id, zd_tensor_dtype_name(zd_tensor_dtype(grads[i])),
                got, want);
        return zd_error_set("gradient %d from %s for message %llu is %s %s], the tensor sent "
                            "was float32 %s]",
                            i, who, (unsigned long long)msg_id,
                            zd_tensor_dtype_name(zd_tensor_dtype(grads[i])), got, want);
    }
    return 0;
}

/*  A __dist_* message about a context from a rank that did not take part
    in it: refused, with a line naming the peer. */
static int not_participant(const char *what, int64_t ctx_id, int from)
{
    char who[160];
    zd__dist_peer_desc(from, who, sizeof who);
    zd__log(ZD_LOG_WARN,
            "dist_autograd: %s for context %lld from %s, which took no part in it: "
            "refused",
            what, (long long)ctx_id, who);
    return zd_error_set("%s for context %lld from %s, which took no part in it", what,
                        (long long)ctx_id, who);
}

static zd_future_t *handle_backward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t ctx_id, msg_id, pass_id, retain;
    char me[200];
    if (zd_rpc_arg_int(args, 0, &ctx_id) < 0 || zd_rpc_arg_int(args, 1, &msg_id) < 0 ||
        zd_rpc_arg_int(args, 2, &pass_id) < 0 || zd_rpc_arg_int(args, 3, &retain) < 0)
        return NULL;
    dist_context_t *c = zd__dist_context_get(ctx_id);
    if (!c) {
        zd_error_set("backward on %s: no context %lld here (already released?)",
                     self_desc(me, sizeof me), (long long)ctx_id);
        return NULL;
    }
    int n = (int)zd_list_len(args) - 4;
    int from = call ? zd_rpc_call_caller_rank(call) : zd_rpc_rank();
    zd_tensor_t **grads = calloc((size_t)(n > 0 ? n : 1), sizeof *grads);
    feed_t fd = {.ctx_id = ctx_id, .pass_id = pass_id, .retain = retain != 0};
    zd_future_t *out = NULL;
    int rc = grads ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++)
        rc = zd_rpc_arg_tensor(args, (size_t)(4 + i), &grads[i]);
    /* Only the peer the tensors went to sends their gradients. */
    if (rc == 0 && call && zd__dist_context_send_peer(c, (uint64_t)msg_id) >= 0 &&
        zd__dist_context_send_peer(c, (uint64_t)msg_id) != from)
        rc = not_participant("gradients of another peer's message", ctx_id, from);

    atomic_fetch_add(&zd__dist_stat_passes, 1);
    atomic_fetch_add(&zd__dist_total_grad_messages, 1);
    /* The guard before pass_lock: a feed waiting for a step must not hold
       pass_lock, which the I/O thread's pending queries take. */
    guard_fn_t leave = rc == 0 ? guard_begin() : NULL;
    pthread_mutex_lock(&c->pass_lock);
    zd_autograd_node_t *send = rc == 0 ? zd__dist_context_find_send(c, (uint64_t)msg_id) : NULL;
    if (rc == 0 && !send)
        rc = zd_error_set("no send function for message %llu in context %lld",
                          (unsigned long long)msg_id, (long long)ctx_id);
    if (rc == 0 && zd_autograd_node_n_outputs(send) != n)
        rc = zd_error_set("message %llu carries %d gradients for a send function of %d tensors",
                          (unsigned long long)msg_id, n, zd_autograd_node_n_outputs(send));
    if (rc == 0)
        rc = check_grads(send, grads, n, from, (uint64_t)msg_id);
    if (rc == 0)
        rc = ensure_task(c, pass_id, fd.retain, NULL, 0);
    if (rc == 0) {
        current_feed = &fd;
        rc = zd_autograd_task_feed(c->task, send, grads);
        current_feed = NULL;
    }
    int pending = rc == 0 ? zd_autograd_task_pending(c->task, NULL) : 0;
    pthread_mutex_unlock(&c->pass_lock);
    guard_done(leave);
    atomic_fetch_sub(&zd__dist_stat_passes, 1);

    if (rc < 0)
        zd_error_wrap("backward on %s", self_desc(me, sizeof me));
    else
        out = join_futures(fd.fs, fd.n, false, pending, 0);
    feed_clear(&fd);
    free(grads);
    zd__dist_context_unref(c);
    return out;
}

/*  Queries and flushes come from participants, or from the process that
    started the current pass (its rank is in the pass id), which may never
    have talked to this one directly. */
static bool may_drive(dist_context_t *c, int from)
{
    if (zd__dist_context_is_participant(c, from))
        return true;
    pthread_mutex_lock(&c->pass_lock);
    bool starter = c->task && (int)((uint64_t)c->pass_id >> 48) == from;
    pthread_mutex_unlock(&c->pass_lock);
    return starter;
}

/*  ---- __dist_pending: flooded query for the highest pending node ---- */

static zd_future_t *handle_pending(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t ctx_id, pass_id, query;
    if (zd_rpc_arg_int(args, 0, &ctx_id) < 0 || zd_rpc_arg_int(args, 1, &pass_id) < 0 ||
        zd_rpc_arg_int(args, 2, &query) < 0)
        return NULL;
    int from = call ? zd_rpc_call_caller_rank(call) : -1;
    dist_context_t *c = zd__dist_context_get(ctx_id);
    if (c && call && !may_drive(c, from)) {
        not_participant("a query for pending nodes", ctx_id, from);
        zd__dist_context_unref(c);
        return NULL;
    }
    int64_t seq = 0;
    int *peers = NULL, n_peers = 0, n_fs = 0;
    zd_future_t **fs = NULL;
    bool seen = true;
    if (c) {
        pthread_mutex_lock(&c->lock);
        seen = c->last_query == query;
        c->last_query = query;
        pthread_mutex_unlock(&c->lock);
    }
    if (c && !seen) {
        pthread_mutex_lock(&c->pass_lock);
        uint64_t s = 0;
        if (c->task && c->pass_id == pass_id && zd_autograd_task_pending(c->task, &s) > 0)
            seq = (int64_t)s;
        pthread_mutex_unlock(&c->pass_lock);
        if (zd__dist_context_peers(c, &peers, &n_peers) == 0)
            fs = calloc((size_t)(n_peers ? n_peers : 1), sizeof *fs);
        for (int i = 0; fs && i < n_peers; i++) {
            if (peers[i] == from)
                continue;
            zd_future_t *f = zd_rpc_async(peers[i], "__dist_pending", args, ZD_TIMEOUT_DEFAULT);
            if (f)
                fs[n_fs++] = f;
        }
    }
    zd_future_t *out = join_futures(fs, n_fs, true, seq, zd_rpc_rank());
    for (int i = 0; i < n_fs; i++)
        zd_future_unref(fs[i]);
    free(fs);
    free(peers);
    zd__dist_context_unref(c);
    return out;
}

/*  ---- __dist_flush: run the highest pending node here ---- */

static zd_future_t *handle_flush(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t ctx_id, pass_id;
    char me[200];
    if (zd_rpc_arg_int(args, 0, &ctx_id) < 0 || zd_rpc_arg_int(args, 1, &pass_id) < 0)
        return NULL;
    dist_context_t *c = zd__dist_context_get(ctx_id);
    if (!c) {
        zd_error_set("backward on %s: no context %lld here", self_desc(me, sizeof me),
                     (long long)ctx_id);
        return NULL;
    }
    if (call && !may_drive(c, zd_rpc_call_caller_rank(call))) {
        not_participant("a flush", ctx_id, zd_rpc_call_caller_rank(call));
        zd__dist_context_unref(c);
        return NULL;
    }
    feed_t fd = {.ctx_id = ctx_id, .pass_id = pass_id};
    int rc = 0, pending = 0;
    guard_fn_t leave = guard_begin(); /* before pass_lock, as in handle_backward */
    pthread_mutex_lock(&c->pass_lock);
    if (c->task && c->pass_id == pass_id) {
        current_feed = &fd;
        rc = zd_autograd_task_flush_one(c->task);
        current_feed = NULL;
        if (rc > 0)
            atomic_fetch_add(&zd__dist_stat_flushed, 1);
        pending = zd_autograd_task_pending(c->task, NULL);
    }
    pthread_mutex_unlock(&c->pass_lock);
    guard_done(leave);
    zd_future_t *out = NULL;
    if (rc < 0)
        zd_error_wrap("backward on %s", self_desc(me, sizeof me));
    else
        out = join_futures(fd.fs, fd.n, false, pending, 0);
    feed_clear(&fd);
    zd__dist_context_unref(c);
    return out;
}

/*  Waits for a future from a user thread or a pool thread alike. */
static int wait_value(zd_future_t *f, int64_t *out)
{
    int rc = zd_future_wait(f, ZD_TIMEOUT_NONE); /* every message below it has its own timeout */
    if (rc == 0 && out && zd_value_get_int(zd_future_value(f), out) < 0)
        rc = -1;
    return rc;
}

/*  Finds and flushes pending nodes, highest Lamport number first, until
    none is left anywhere. */
/*  Each round flushes one pending node somewhere: a graph has far fewer
    than this many, so more rounds mean a peer that keeps reporting work. */
#define FLUSH_MAX_ROUNDS 65536

static int flush_all(dist_context_t *c, int64_t pass_id)
{
    for (int round = 0;; round++) {
        if (round == FLUSH_MAX_ROUNDS)
            return zd_error_set("dist_autograd: context %lld still has pending nodes after %d "
                                "flush rounds (a peer keeps reporting work)",
                                (long long)c->id, FLUSH_MAX_ROUNDS);
        int64_t query = (int64_t)zd__dist_next_id();
        zd_value_t *args = ZD_ARGS(c->id, pass_id, query);
        if (!args)
            return -1;
        zd_future_t *f = handle_pending(NULL, args, NULL);
        zd_value_unref(args);
        if (!f)
            return -1;
        int rc = wait_value(f, NULL);
        int64_t seq = 0, rank = -1;
        if (rc == 0) {
            zd_value_t *v = zd_future_value(f);
            zd_rpc_arg_int(v, 0, &seq);
            zd_rpc_arg_int(v, 1, &rank);
        }
        zd_future_unref(f);
        if (rc < 0)
            return zd_error_wrap("dist_autograd: looking for pending nodes");
        if (seq == 0)
            return 0;
        args = ZD_ARGS(c->id, pass_id);
        f = args ? (rank == zd_rpc_rank()
                        ? handle_flush(NULL, args, NULL)
                        : zd_rpc_async((int)rank, "__dist_flush", args, ZD_TIMEOUT_DEFAULT))
                 : NULL;
        zd_value_unref(args);
        if (!f)
            return -1;
        rc = wait_value(f, NULL);
        zd_future_unref(f);
        if (rc < 0)
            return -1;
    }
}

/*  ---- zd_dist_autograd_backward ---- */

int zd_dist_autograd_backward(int64_t context_id, zd_tensor_t *const *roots, int n_roots,
                              bool retain_graph)
{
    zd__fault_point(zd_rpc_rank(), "backward"); /* tests only (core/fault_point.h) */
    dist_context_t *c = zd__dist_context_get(context_id);
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dist_autograd: no context %lld in this process",
                                 (long long)context_id);
    atomic_fetch_add(&zd__dist_total_backward, 1);
    zd_autograd_node_t **starts = calloc((size_t)(n_roots > 0 ? n_roots : 1), sizeof *starts);
    feed_t fd = {
        .ctx_id = context_id, .pass_id = (int64_t)zd__dist_next_id(), .retain = retain_graph};
    int rc = starts ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    int n_starts = 0;
    for (int i = 0; rc == 0 && i < n_roots; i++) {
        if (!zd_tensor_requires_grad(roots[i]))
            rc = zd_error_set_code(ZD_ERR_ARGUMENT, "dist_autograd: root %d does not require grad",
                                   i);
        else if (zd_tensor_numel(roots[i]) != 1)
            rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                                   "dist_autograd: root %d is not a scalar (%lld elements)", i,
                                   (long long)zd_tensor_numel(roots[i]));
        else if (zd_tensor_grad_fn(roots[i]))
            starts[n_starts++] = zd_tensor_grad_fn(roots[i]);
    }
    zd_tensor_t *one = rc == 0 ? zd_tensor_new(ZD_FLOAT32, NULL, 0) : NULL;
    if (one)
        zd_tensor_fill_(one, 1.0f);
    else if (rc == 0)
        rc = -1;

    int64_t pending = 0;
    guard_fn_t leave = guard_begin(); /* before pass_lock, as in handle_backward */
    pthread_mutex_lock(&c->pass_lock);
    if (rc == 0)
        rc = ensure_task(c, fd.pass_id, retain_graph, starts, n_starts);
    current_feed = &fd;
    for (int i = 0; rc == 0 && i < n_roots; i++) {
        zd_autograd_node_t *node = zd_tensor_grad_fn(roots[i]);
        if (!node) {
            rc = zd__dist_context_accumulate(c, roots[i], one);
            continue;
        }
        int k = zd_autograd_node_n_outputs(node);
        zd_tensor_t **grads = calloc((size_t)k, sizeof *grads);
        if (!grads) {
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
            break;
        }
        /* The seed has the root's own shape ([] or [1], ...): the engine
           takes only gradients shaped as the outputs they are for. */
        zd_tensor_t *seed =
            zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(roots[i]), zd_tensor_ndim(roots[i]));
        if (seed)
            zd_tensor_fill_(seed, 1.0f);
        grads[zd_tensor_output_nr(roots[i])] = seed;
        rc = seed ? zd_autograd_task_feed(c->task, node, grads) : -1;
        zd_tensor_unref(seed);
        free(grads);
    }
    current_feed = NULL;
    if (rc == 0)
        pending = zd_autograd_task_pending(c->task, NULL);
    pthread_mutex_unlock(&c->pass_lock);
    guard_done(leave);

    if (rc == 0) {
        zd_future_t *all = join_futures(fd.fs, fd.n, false, pending, 0);
        int64_t total = 0;
        rc = all ? wait_value(all, &total) : -1;
        zd_future_unref(all);
        if (rc == 0 && total > 0)
            rc = flush_all(c, fd.pass_id);
    }
    feed_clear(&fd);
    zd_tensor_unref(one);
    free(starts);
    zd__dist_context_unref(c);
    return rc;
}

/*  ---- release ---- */

#define RELEASE_TRIES 3

/*  Sends __dist_release to every peer but `except`; returns the futures.
    0, or -1 when a peer could not be told (out of memory; the others
    were). */
static int release_peers(dist_context_t *c, int except, zd_future_t ***fs, int *n_fs)
{
    int *peers, n;
    *fs = NULL;
    *n_fs = 0;
    if (zd__dist_context_peers(c, &peers, &n) < 0)
        return -1;
    zd_future_t **out = calloc((size_t)(n ? n : 1), sizeof *out);
    zd_value_t *args = ZD_ARGS(c->id);
    if (!out || !args) {
        free(out);
        zd_value_unref(args);
        free(peers);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (peers[i] == except || peers[i] == zd_rpc_rank())
            continue;
        zd_future_t *f = NULL;
        /* A call that could not be made or sent (out of memory here) is
           tried again: a release is idempotent. */
        ZD_FAULT_BENIGN(true);
        for (int t = 0; t < RELEASE_TRIES && !f; t++) {
            f = zd_rpc_async(peers[i], "__dist_release", args, ZD_TIMEOUT_DEFAULT);
            if (f && t + 1 < RELEASE_TRIES && zd_future_done(f) &&
                zd_future_error_code(f) == ZD_ERR_NO_MEMORY)
                zd_future_unref(f), f = NULL;
        }
        ZD_FAULT_BENIGN(false);
        if (f)
            out[(*n_fs)++] = f;
        else if (rc == 0)
            rc = zd_error_wrap("dist_autograd: releasing context %lld", (long long)c->id);
    }
    zd_value_unref(args);
    free(peers);
    *fs = out;
    return rc;
}

static zd_future_t *handle_release(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t ctx_id;
    if (zd_rpc_arg_int(args, 0, &ctx_id) < 0)
        return NULL;
    int from = zd_rpc_call_caller_rank(call);
    dist_context_t *c = zd__dist_context_get(ctx_id);
    if (c && !zd__dist_context_is_participant(c, from)) {
        not_participant("a release", ctx_id, from);
        zd__dist_context_unref(c);
        return NULL;
    }
    /* A participant other than the context's owner here (a server that
       forwarded it, say) is answered but changes nothing: the owner's own
       release, or the idle expiry, frees it. */
    bool may = c && zd__dist_context_may_release(c, from);
    zd__dist_context_unref(c);
    c = may ? zd__dist_context_remove(ctx_id) : NULL;
    zd_future_t **fs = NULL;
    int n_fs = 0;
    if (c)
        release_peers(c, zd_rpc_call_caller_rank(call), &fs, &n_fs);
    zd_future_t *out = join_futures(fs, n_fs, false, 0, 0);
    for (int i = 0; i < n_fs; i++)
        zd_future_unref(fs[i]);
    free(fs);
    zd__dist_context_unref(c);
    return out;
}

/*  Starts the release of a context here and everywhere it took part;
    returns a future (or NULL when no peer needs telling). */
static int release_start(int64_t context_id, zd_future_t **out)
{
    *out = NULL;
    if (zd__dist_current_ctx == context_id)
        zd__dist_current_ctx = -1;
    dist_context_t *c = zd__dist_context_get(context_id);
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dist_autograd: no context %lld in this process",
                                 (long long)context_id);
    zd_future_t **fs;
    int n_fs, rc = release_peers(c, -1, &fs, &n_fs);
    zd__dist_context_unref(c);
    if (rc < 0) { /* a peer not told (out of memory): the context stays, to be ended again */
        for (int i = 0; i < n_fs; i++)
            zd_future_unref(fs[i]);
        free(fs);
        return rc;
    }
    zd__dist_context_unref(zd__dist_context_remove(context_id));
    if (rc == 0 && n_fs > 0 && !(*out = join_futures(fs, n_fs, false, 0, 0)))
        rc = -1;
    for (int i = 0; i < n_fs; i++)
        zd_future_unref(fs[i]);
    free(fs);
    return rc;
}

/*  timeout_ms: ZD_TIMEOUT_DEFAULT is the RPC default (zd_rpc_get_timeout),
    which the release messages carry too. */
static int release_wait(zd_future_t *f, int64_t context_id, int64_t timeout_ms)
{
    int rc = zd_future_wait(f, timeout_ms < 0 ? zd_rpc_get_timeout() : timeout_ms);
    if (rc < 0)
        zd_error_wrap("dist_autograd: releasing context %lld", (long long)context_id);
    zd_future_unref(f);
    return rc;
}

int zd_dist_autograd_context_end(int64_t context_id, int64_t timeout_ms)
{
    zd_future_t *f;
    int rc = release_start(context_id, &f);
    return rc == 0 && f ? release_wait(f, context_id, timeout_ms) : rc;
}

/*  Releases in flight, oldest first: a bounded ring, so that a trainer
    ending contexts faster than its peers free them waits instead of
    letting contexts pile up on the servers. */
#define RELEASES_IN_FLIGHT 16

static pthread_mutex_t releases_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    zd_future_t *f;
    int64_t ctx;
} releases[RELEASES_IN_FLIGHT];
static int releases_head, releases_n;

int zd_dist_autograd_context_release(int64_t context_id)
{
    zd_future_t *f;
    int rc = release_start(context_id, &f);
    if (rc < 0 || !f)
        return rc;
    pthread_mutex_lock(&releases_lock);
    while (releases_n == RELEASES_IN_FLIGHT) {
        zd_future_t *old = releases[releases_head].f;
        int64_t old_ctx = releases[releases_head].ctx;
        releases_head = (releases_head + 1) % RELEASES_IN_FLIGHT;
        releases_n--;
        pthread_mutex_unlock(&releases_lock);
        if (release_wait(old, old_ctx, ZD_TIMEOUT_DEFAULT) < 0)
            rc = -1;
        pthread_mutex_lock(&releases_lock);
    }
    int at = (releases_head + releases_n++) % RELEASES_IN_FLIGHT;
    releases[at].f = f;
    releases[at].ctx = context_id;
    pthread_mutex_unlock(&releases_lock);
    return rc;
}

int zd_dist_autograd_wait_releases(int64_t timeout_ms)
{
    int rc = 0;
    char first[512] = "";
    pthread_mutex_lock(&releases_lock);
    while (releases_n > 0) {
        zd_future_t *f = releases[releases_head].f;
        int64_t ctx = releases[releases_head].ctx;
        releases_head = (releases_head + 1) % RELEASES_IN_FLIGHT;
        releases_n--;
        pthread_mutex_unlock(&releases_lock);
        if (release_wait(f, ctx, timeout_ms) < 0 && rc == 0) {
            rc = -1;
            snprintf(first, sizeof first, "%s", zd_error_last());
        }
        pthread_mutex_lock(&releases_lock);
    }
    pthread_mutex_unlock(&releases_lock);
    if (rc < 0)
        zd_error_set("%s", first);
    return rc;
}

/*  ---- init ---- */

static atomic_bool installed;

bool zd__dist_installed(void)
{
    return atomic_load(&installed);
}

int zd__dist_engine_register(void)
{
    /* Backward and flush run graph nodes: the pool. Queries and releases
       only look things up and send messages on: the I/O thread runs them
       at once, saving two thread wake-ups per message. */
    const zd_rpc_function_t inline_pending = {
        .size = sizeof(zd_rpc_function_t), .async_fn = handle_pending, .flags = ZD_RPC_FN_INLINE};
    const zd_rpc_function_t inline_release = {
        .size = sizeof(zd_rpc_function_t), .async_fn = handle_release, .flags = ZD_RPC_FN_INLINE};
    if (zd_rpc_register_async("__dist_backward", handle_backward, NULL) < 0 ||
        zd_rpc_register_function("__dist_pending", &inline_pending) < 0 ||
        zd_rpc_register_async("__dist_flush", handle_flush, NULL) < 0 ||
        zd_rpc_register_function("__dist_release", &inline_release) < 0)
        return -1;
    return 0;
}

int zd_dist_autograd_init(void)
{
    if (atomic_load(&installed))
        return 0;
    zd_rpc_hooks_t hooks = zd__dist_record_hooks();
    if (zd_rpc_set_hooks(&hooks) < 0 || zd__dist_engine_register() < 0 ||
        zd__dist_rref_backward_register() < 0)
        return -1;
    atomic_store(&installed, true);
    return 0;
}
