/*  dist_engine.c: the distributed backward pass and context release.

    Each process keeps, per context, one autograd task for the current pass
    (autograd.h), whose start nodes are every send function recorded here
    (plus the roots on the process that called backward). A gradient
    message feeds one send function and runs what became ready; receive
    functions reached send their gradients on with rpc_async. The message
    is answered when every message it set off has been answered, so the
    answer to the initiator's own messages means the whole pass is done.

    Answers carry how many nodes still wait for gradients (a send function
    whose output was unused never gets one). When any do, the initiator
    repeatedly asks all participants for their highest pending node (by
    Lamport sequence number) and has that process flush it, until none is
    left: see autograd_task_flush_one for why the order matters.

    Internal functions (all async: no pool thread waits):
      __dist_backward(ctx, msg, pass, retain, grads...) -> pending count
      __dist_pending(ctx, pass, query)                  -> [seq, rank]
      __dist_flush(ctx, pass)                           -> pending count
      __dist_release(ctx)                               -> none */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/dist_private.h"
#include "autograd/error.h"
#include "rpc/value.h"

/*  ---- joining futures ---- */

/*  Completes `out` once all n futures completed: with the sum (or, for
    max_mode, the [seq, rank] pair with the largest seq) of their results
    plus `local`, or with the first error. */
typedef struct {
    atomic_int left;
    pthread_mutex_t lock;
    rpc_future_t *out;
    bool max_mode;
    int64_t sum;
    int64_t best_seq, best_rank;
    char *error;
} join_t;

static void join_finish(join_t *j)
{
    if (j->error) {
        rpc_future_set_error(j->out, "%s", j->error);
    } else {
        rpc_value_t *v = j->max_mode ? rpc_args("ii", j->best_seq, j->best_rank)
                                     : rpc_value_int(j->sum);
        if (v)
            rpc_future_set_value(j->out, v);
        else
            rpc_future_set_error(j->out, "dist_autograd: out of memory");
        rpc_value_unref(v);
    }
    rpc_future_unref(j->out);
    free(j->error);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

static void join_one(rpc_future_t *f, void *arg)
{
    join_t *j = arg;
    pthread_mutex_lock(&j->lock);
    rpc_value_t *v = rpc_future_value(f);
    if (!v) {
        if (!j->error)
            j->error = strdup(rpc_future_error(f));
    } else if (j->max_mode) {
        int64_t seq, rank;
        if (rpc_arg_int(v, 0, &seq) == 0 && rpc_arg_int(v, 1, &rank) == 0 && seq > j->best_seq) {
            j->best_seq = seq;
            j->best_rank = rank;
        }
    } else {
        int64_t n;
        if (rpc_value_get_int(v, &n) == 0)
            j->sum += n;
    }
    pthread_mutex_unlock(&j->lock);
    if (atomic_fetch_sub(&j->left, 1) == 1)
        join_finish(j);
}

/*  A future joining fs (references borrowed). NULL when out of memory. */
static rpc_future_t *join_futures(rpc_future_t *const *fs, int n, bool max_mode, int64_t local,
                                  int64_t local_rank)
{
    join_t *j = calloc(1, sizeof *j);
    rpc_future_t *out = rpc_future_new();
    if (!j || !out) {
        free(j);
        rpc_future_unref(out);
        error_set("dist_autograd: out of memory");
        return NULL;
    }
    pthread_mutex_init(&j->lock, NULL);
    j->out = rpc_future_ref(out);
    j->max_mode = max_mode;
    j->sum = local;
    j->best_seq = local;
    j->best_rank = local_rank;
    atomic_init(&j->left, n + 1);
    for (int i = 0; i < n; i++)
        if (rpc_future_then(fs[i], join_one, j) < 0)
            join_one(fs[i], j);   /* counted as done; its value may be missing */
    if (atomic_fetch_sub(&j->left, 1) == 1)
        join_finish(j);
    return out;
}

/*  ---- the futures a feed sets off (thread-local while a feed runs) ---- */

typedef struct {
    int64_t ctx_id;
    int64_t pass_id;
    bool retain;
    rpc_future_t **fs;
    int n, cap;
} feed_t;

static _Thread_local feed_t *current_feed;

static int feed_add(feed_t *fd, rpc_future_t *f)
{
    if (fd->n == fd->cap) {
        int ncap = fd->cap ? fd->cap * 2 : 8;
        rpc_future_t **p = realloc(fd->fs, sizeof *p * (size_t)ncap);
        if (!p)
            return error_set("dist_autograd: out of memory");
        fd->fs = p;
        fd->cap = ncap;
    }
    fd->fs[fd->n++] = f;
    return 0;
}

static void feed_clear(feed_t *fd)
{
    for (int i = 0; i < fd->n; i++)
        rpc_future_unref(fd->fs[i]);
    free(fd->fs);
    fd->fs = NULL;
    fd->n = fd->cap = 0;
}

/*  ---- the two node kinds ---- */

static int send_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    for (int i = 0; i < autograd_node_n_inputs(n); i++)
        gin[i] = tensor_ref(gout[i]);
    return 0;
}

static int recv_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    (void)gin;
    const dist_recv_info_t *info = autograd_node_ctx(n);
    feed_t *fd = current_feed;
    if (!fd)
        return error_set("dist_autograd: a receive function ran outside a distributed "
                         "backward pass (use dist_autograd_backward)");
    rpc_value_t *args = rpc_args("iiii", info->ctx_id, (int64_t)info->msg_id, fd->pass_id,
                                 (int64_t)fd->retain);
    for (int i = 0; args && i < autograd_node_n_outputs(n); i++)
        if (rpc_list_append(args, rpc_value_tensor(gout[i])) < 0)
        {
            rpc_value_unref(args);
            args = NULL;
        }
    if (!args)
        return -1;
    rpc_future_t *f = rpc_async(info->peer, "__dist_backward", args, RPC_TIMEOUT_DEFAULT);
    rpc_value_unref(args);
    if (!f)
        return -1;
    return feed_add(fd, f) < 0 ? (rpc_future_unref(f), -1) : 0;
}

static void recv_release(autograd_node_t *n)
{
    free(autograd_node_ctx(n));
}

const autograd_node_ops_t dist_send_ops = {"SendRpcBackward", send_backward, NULL};
const autograd_node_ops_t dist_recv_ops = {"RecvRpcBackward", recv_backward, recv_release};

/*  ---- passes ---- */

/*  Makes sure the context's task belongs to pass_id, building it over
    every send function (and the extra starts) when the pass is new.
    Called with pass_lock held. */
static int ensure_task(dist_context_t *c, int64_t pass_id, bool retain,
                       autograd_node_t *const *extra, int n_extra)
{
    if (c->task && c->pass_id == pass_id)
        return 0;
    pthread_mutex_lock(&c->lock);
    int n = c->n_sends + n_extra;
    autograd_node_t **starts = malloc(sizeof *starts * (size_t)(n ? n : 1));
    if (starts) {
        for (int i = 0; i < c->n_sends; i++)
            starts[i] = c->sends[i].node;
        for (int i = 0; i < n_extra; i++)
            starts[c->n_sends + i] = extra[i];
    }
    pthread_mutex_unlock(&c->lock);
    if (!starts)
        return error_set("dist_autograd: out of memory");
    autograd_options_t o = {.retain_graph = retain, .accumulate = dist_context_accumulate,
                            .accumulate_arg = c};
    autograd_task_t *t = autograd_task_new(starts, n, &o);
    free(starts);
    if (!t)
        return -1;
    autograd_task_free(c->task);
    c->task = t;
    c->pass_id = pass_id;
    return 0;
}

static const char *self_desc(char *buf, size_t size)
{
    snprintf(buf, size, "worker \"%s\" (rank %d)", rpc_name(), rpc_rank());
    return buf;
}

/*  ---- __dist_backward ---- */

static rpc_future_t *handle_backward(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t ctx_id, msg_id, pass_id, retain;
    char me[200];
    if (rpc_arg_int(args, 0, &ctx_id) < 0 || rpc_arg_int(args, 1, &msg_id) < 0 ||
        rpc_arg_int(args, 2, &pass_id) < 0 || rpc_arg_int(args, 3, &retain) < 0)
        return NULL;
    dist_context_t *c = dist_context_get(ctx_id);
    if (!c) {
        error_set("backward on %s: no context %lld here (already released?)",
                  self_desc(me, sizeof me), (long long)ctx_id);
        return NULL;
    }
    int n = (int)rpc_list_len(args) - 4;
    tensor_t **grads = calloc((size_t)(n > 0 ? n : 1), sizeof *grads);
    feed_t fd = {.ctx_id = ctx_id, .pass_id = pass_id, .retain = retain != 0};
    rpc_future_t *out = NULL;
    int rc = grads ? 0 : error_set("out of memory");
    for (int i = 0; rc == 0 && i < n; i++)
        rc = rpc_arg_tensor(args, (size_t)(4 + i), &grads[i]);

    atomic_fetch_add(&dist_stat_passes, 1);
    pthread_mutex_lock(&c->pass_lock);
    autograd_node_t *send = rc == 0 ? dist_context_find_send(c, (uint64_t)msg_id) : NULL;
    if (rc == 0 && !send)
        rc = error_set("no send function for message %llu in context %lld",
                       (unsigned long long)msg_id, (long long)ctx_id);
    if (rc == 0 && autograd_node_n_outputs(send) != n)
        rc = error_set("message %llu carries %d gradients for a send function of %d tensors",
                       (unsigned long long)msg_id, n, autograd_node_n_outputs(send));
    if (rc == 0)
        rc = ensure_task(c, pass_id, fd.retain, NULL, 0);
    if (rc == 0) {
        current_feed = &fd;
        rc = autograd_task_feed(c->task, send, grads);
        current_feed = NULL;
    }
    int pending = rc == 0 ? autograd_task_pending(c->task, NULL) : 0;
    pthread_mutex_unlock(&c->pass_lock);
    atomic_fetch_sub(&dist_stat_passes, 1);

    if (rc < 0)
        error_wrap("backward on %s", self_desc(me, sizeof me));
    else
        out = join_futures(fd.fs, fd.n, false, pending, 0);
    feed_clear(&fd);
    free(grads);
    dist_context_unref(c);
    return out;
}

/*  ---- __dist_pending: flooded query for the highest pending node ---- */

static rpc_future_t *handle_pending(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)arg;
    int64_t ctx_id, pass_id, query;
    if (rpc_arg_int(args, 0, &ctx_id) < 0 || rpc_arg_int(args, 1, &pass_id) < 0 ||
        rpc_arg_int(args, 2, &query) < 0)
        return NULL;
    int from = call ? rpc_call_caller_rank(call) : -1;
    dist_context_t *c = dist_context_get(ctx_id);
    int64_t seq = 0;
    int *peers = NULL, n_peers = 0, n_fs = 0;
    rpc_future_t **fs = NULL;
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
        if (c->task && c->pass_id == pass_id && autograd_task_pending(c->task, &s) > 0)
            seq = (int64_t)s;
        pthread_mutex_unlock(&c->pass_lock);
        if (dist_context_peers(c, &peers, &n_peers) == 0)
            fs = calloc((size_t)(n_peers ? n_peers : 1), sizeof *fs);
        for (int i = 0; fs && i < n_peers; i++) {
            if (peers[i] == from)
                continue;
            rpc_future_t *f = rpc_async(peers[i], "__dist_pending", args, RPC_TIMEOUT_DEFAULT);
            if (f)
                fs[n_fs++] = f;
        }
    }
    rpc_future_t *out = join_futures(fs, n_fs, true, seq, rpc_rank());
    for (int i = 0; i < n_fs; i++)
        rpc_future_unref(fs[i]);
    free(fs);
    free(peers);
    dist_context_unref(c);
    return out;
}

/*  ---- __dist_flush: run the highest pending node here ---- */

static rpc_future_t *handle_flush(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t ctx_id, pass_id;
    char me[200];
    if (rpc_arg_int(args, 0, &ctx_id) < 0 || rpc_arg_int(args, 1, &pass_id) < 0)
        return NULL;
    dist_context_t *c = dist_context_get(ctx_id);
    if (!c) {
        error_set("backward on %s: no context %lld here", self_desc(me, sizeof me),
                  (long long)ctx_id);
        return NULL;
    }
    feed_t fd = {.ctx_id = ctx_id, .pass_id = pass_id};
    int rc = 0, pending = 0;
    pthread_mutex_lock(&c->pass_lock);
    if (c->task && c->pass_id == pass_id) {
        current_feed = &fd;
        rc = autograd_task_flush_one(c->task);
        current_feed = NULL;
        if (rc > 0)
            atomic_fetch_add(&dist_stat_flushed, 1);
        pending = autograd_task_pending(c->task, NULL);
    }
    pthread_mutex_unlock(&c->pass_lock);
    rpc_future_t *out = NULL;
    if (rc < 0)
        error_wrap("backward on %s", self_desc(me, sizeof me));
    else
        out = join_futures(fd.fs, fd.n, false, pending, 0);
    feed_clear(&fd);
    dist_context_unref(c);
    return out;
}

/*  Waits for a future from a user thread or a pool thread alike. */
static int wait_value(rpc_future_t *f, int64_t *out)
{
    int rc = rpc_wait(f, -1);   /* every message below it has its own timeout */
    if (rc == 0 && out && rpc_value_get_int(rpc_future_value(f), out) < 0)
        rc = -1;
    return rc;
}

/*  Finds and flushes pending nodes, highest Lamport number first, until
    none is left anywhere. */
static int flush_all(dist_context_t *c, int64_t pass_id)
{
    for (int round = 0;; round++) {
        int64_t query = (int64_t)dist_next_id();
        rpc_value_t *args = rpc_args("iii", c->id, pass_id, query);
        if (!args)
            return -1;
        rpc_future_t *f = handle_pending(NULL, args, NULL);
        rpc_value_unref(args);
        if (!f)
            return -1;
        int rc = wait_value(f, NULL);
        int64_t seq = 0, rank = -1;
        if (rc == 0) {
            rpc_value_t *v = rpc_future_value(f);
            rpc_arg_int(v, 0, &seq);
            rpc_arg_int(v, 1, &rank);
        }
        rpc_future_unref(f);
        if (rc < 0)
            return error_wrap("dist_autograd: looking for pending nodes");
        if (seq == 0)
            return 0;
        args = rpc_args("ii", c->id, pass_id);
        f = args ? (rank == rpc_rank() ? handle_flush(NULL, args, NULL)
                                       : rpc_async((int)rank, "__dist_flush", args,
                                                   RPC_TIMEOUT_DEFAULT))
                 : NULL;
        rpc_value_unref(args);
        if (!f)
            return -1;
        rc = wait_value(f, NULL);
        rpc_future_unref(f);
        if (rc < 0)
            return -1;
    }
}

/*  ---- dist_autograd_backward ---- */

int dist_autograd_backward(int64_t context_id, tensor_t *const *roots, int n_roots,
                           bool retain_graph)
{
    dist_context_t *c = dist_context_get(context_id);
    if (!c)
        return error_set("dist_autograd: no context %lld in this process",
                         (long long)context_id);
    autograd_node_t **starts = calloc((size_t)(n_roots > 0 ? n_roots : 1), sizeof *starts);
    feed_t fd = {.ctx_id = context_id, .pass_id = (int64_t)dist_next_id(),
                 .retain = retain_graph};
    int rc = starts ? 0 : error_set("dist_autograd: out of memory");
    int n_starts = 0;
    for (int i = 0; rc == 0 && i < n_roots; i++) {
        if (!tensor_requires_grad(roots[i]))
            rc = error_set("dist_autograd: root %d does not require grad", i);
        else if (tensor_numel(roots[i]) != 1)
            rc = error_set("dist_autograd: root %d is not a scalar (%lld elements)", i,
                           (long long)tensor_numel(roots[i]));
        else if (tensor_grad_fn(roots[i]))
            starts[n_starts++] = tensor_grad_fn(roots[i]);
    }
    tensor_t *one = rc == 0 ? tensor_new(TENSOR_F32, 0, NULL) : NULL;
    if (one)
        tensor_fill_(one, 1.0f);
    else if (rc == 0)
        rc = -1;

    int64_t pending = 0;
    pthread_mutex_lock(&c->pass_lock);
    if (rc == 0)
        rc = ensure_task(c, fd.pass_id, retain_graph, starts, n_starts);
    current_feed = &fd;
    for (int i = 0; rc == 0 && i < n_roots; i++) {
        autograd_node_t *node = tensor_grad_fn(roots[i]);
        if (!node) {
            rc = dist_context_accumulate(c, roots[i], one);
            continue;
        }
        int k = autograd_node_n_outputs(node);
        tensor_t **grads = calloc((size_t)k, sizeof *grads);
        if (!grads) {
            rc = error_set("dist_autograd: out of memory");
            break;
        }
        grads[tensor_output_nr(roots[i])] = one;
        rc = autograd_task_feed(c->task, node, grads);
        free(grads);
    }
    current_feed = NULL;
    if (rc == 0)
        pending = autograd_task_pending(c->task, NULL);
    pthread_mutex_unlock(&c->pass_lock);

    if (rc == 0) {
        rpc_future_t *all = join_futures(fd.fs, fd.n, false, pending, 0);
        int64_t total = 0;
        rc = all ? wait_value(all, &total) : -1;
        rpc_future_unref(all);
        if (rc == 0 && total > 0)
            rc = flush_all(c, fd.pass_id);
    }
    feed_clear(&fd);
    tensor_unref(one);
    free(starts);
    dist_context_unref(c);
    return rc;
}

/*  ---- release ---- */

#define RELEASE_TRIES 3

/*  Sends __dist_release to every peer but `except`; returns the futures. */
static int release_peers(dist_context_t *c, int except, rpc_future_t ***fs, int *n_fs)
{
    int *peers, n;
    *fs = NULL;
    *n_fs = 0;
    if (dist_context_peers(c, &peers, &n) < 0)
        return -1;
    *fs = calloc((size_t)(n ? n : 1), sizeof **fs);
    rpc_value_t *args = rpc_args("i", c->id);
    for (int i = 0; *fs && args && i < n; i++) {
        if (peers[i] == except || peers[i] == rpc_rank())
            continue;
        rpc_future_t *f = NULL;
        for (int t = 0; t < RELEASE_TRIES && !f; t++)
            f = rpc_async(peers[i], "__dist_release", args, RPC_TIMEOUT_DEFAULT);
        if (f)
            (*fs)[(*n_fs)++] = f;
    }
    rpc_value_unref(args);
    free(peers);
    return *fs ? 0 : error_set("dist_autograd: out of memory");
}

static rpc_future_t *handle_release(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)arg;
    int64_t ctx_id;
    if (rpc_arg_int(args, 0, &ctx_id) < 0)
        return NULL;
    dist_context_t *c = dist_context_remove(ctx_id);
    rpc_future_t **fs = NULL;
    int n_fs = 0;
    if (c)
        release_peers(c, rpc_call_caller_rank(call), &fs, &n_fs);
    rpc_future_t *out = join_futures(fs, n_fs, false, 0, 0);
    for (int i = 0; i < n_fs; i++)
        rpc_future_unref(fs[i]);
    free(fs);
    dist_context_unref(c);
    return out;
}

/*  Starts the release of a context here and everywhere it took part;
    returns a future (or NULL when no peer needs telling). */
static int release_start(int64_t context_id, rpc_future_t **out)
{
    *out = NULL;
    if (dist_current_ctx == context_id)
        dist_current_ctx = -1;
    dist_context_t *c = dist_context_remove(context_id);
    if (!c)
        return error_set("dist_autograd: no context %lld in this process",
                         (long long)context_id);
    rpc_future_t **fs;
    int n_fs, rc = release_peers(c, -1, &fs, &n_fs);
    dist_context_unref(c);
    if (rc == 0 && n_fs > 0 && !(*out = join_futures(fs, n_fs, false, 0, 0)))
        rc = -1;
    for (int i = 0; i < n_fs; i++)
        rpc_future_unref(fs[i]);
    free(fs);
    return rc;
}

static int release_wait(rpc_future_t *f, int64_t context_id, int64_t timeout_ms)
{
    int rc = rpc_wait(f, timeout_ms < 0 ? 60000 : timeout_ms);
    if (rc < 0)
        error_wrap("dist_autograd: releasing context %lld", (long long)context_id);
    rpc_future_unref(f);
    return rc;
}

int dist_autograd_context_end(int64_t context_id, int64_t timeout_ms)
{
    rpc_future_t *f;
    int rc = release_start(context_id, &f);
    return rc == 0 && f ? release_wait(f, context_id, timeout_ms) : rc;
}

/*  Releases in flight, oldest first: a bounded ring, so that a trainer
    ending contexts faster than its peers free them waits instead of
    letting contexts pile up on the servers. */
#define RELEASES_IN_FLIGHT 16

static pthread_mutex_t releases_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    rpc_future_t *f;
    int64_t ctx;
} releases[RELEASES_IN_FLIGHT];
static int releases_head, releases_n;

int dist_autograd_context_release(int64_t context_id)
{
    rpc_future_t *f;
    int rc = release_start(context_id, &f);
    if (rc < 0 || !f)
        return rc;
    pthread_mutex_lock(&releases_lock);
    while (releases_n == RELEASES_IN_FLIGHT) {
        rpc_future_t *old = releases[releases_head].f;
        int64_t old_ctx = releases[releases_head].ctx;
        releases_head = (releases_head + 1) % RELEASES_IN_FLIGHT;
        releases_n--;
        pthread_mutex_unlock(&releases_lock);
        if (release_wait(old, old_ctx, -1) < 0)
            rc = -1;
        pthread_mutex_lock(&releases_lock);
    }
    int at = (releases_head + releases_n++) % RELEASES_IN_FLIGHT;
    releases[at].f = f;
    releases[at].ctx = context_id;
    pthread_mutex_unlock(&releases_lock);
    return rc;
}

int dist_autograd_wait_releases(int64_t timeout_ms)
{
    int rc = 0;
    char first[512] = "";
    pthread_mutex_lock(&releases_lock);
    while (releases_n > 0) {
        rpc_future_t *f = releases[releases_head].f;
        int64_t ctx = releases[releases_head].ctx;
        releases_head = (releases_head + 1) % RELEASES_IN_FLIGHT;
        releases_n--;
        pthread_mutex_unlock(&releases_lock);
        if (release_wait(f, ctx, timeout_ms) < 0 && rc == 0) {
            rc = -1;
            snprintf(first, sizeof first, "%s", error_last());
        }
        pthread_mutex_lock(&releases_lock);
    }
    pthread_mutex_unlock(&releases_lock);
    if (rc < 0)
        error_set("%s", first);
    return rc;
}

/*  ---- init ---- */

static bool installed;

int dist_engine_register(void)
{
    /* Backward and flush run graph nodes: the pool. Queries and releases
       only look things up and send messages on: the I/O thread runs them
       at once, saving two thread wake-ups per message. */
    const rpc_function_t inline_pending = {.async_fn = handle_pending, .flags = RPC_FN_INLINE};
    const rpc_function_t inline_release = {.async_fn = handle_release, .flags = RPC_FN_INLINE};
    if (rpc_register_async("__dist_backward", handle_backward, NULL) < 0 ||
        rpc_register_function("__dist_pending", &inline_pending) < 0 ||
        rpc_register_async("__dist_flush", handle_flush, NULL) < 0 ||
        rpc_register_function("__dist_release", &inline_release) < 0)
        return -1;
    return 0;
}

int dist_autograd_init(void)
{
    if (installed)
        return 0;
    rpc_hooks_t hooks = dist_record_hooks();
    if (rpc_set_hooks(&hooks) < 0 || dist_engine_register() < 0)
        return -1;
    installed = true;
    return 0;
}
