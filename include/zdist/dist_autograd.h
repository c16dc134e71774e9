/* SPDX-License-Identifier: MIT */
/*  dist_autograd.h: distributed autograd over the RPC layer,
    in the image of torch.distributed.autograd.

        zd_dist_autograd_init();               // once, before zd_rpc_init
        zd_rpc_init(...);
        int64_t ctx;
        zd_dist_autograd_context_begin(&ctx);
        zd_rpc_sync(...)   // tensors that require grad record send/recv functions
        ...loss...
        zd_dist_autograd_backward(ctx, &loss, 1, false);
        zd_dist_autograd_get_gradient(ctx, param, &g);   // on any process
        zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT);   // frees it everywhere

    or, scoped like PyTorch's `with dist_autograd.context() as ctx:`,
    ZD_DIST_AUTOGRAD_CONTEXT(ctx) { ... } (below).

    Recording. Under a context (the calling thread's current one), every RPC
    carries the context id. When its arguments hold tensors that require
    grad, the sender records a send function over them and the receiver a
    receive function that becomes their history; when the reply holds such
    tensors, the same happens in the other direction. Handlers run with the
    caller's context as their current one, so nested calls are recorded
    too. Both sides remember each other as participants of the context.

    Backward. The process that calls backward runs its local graph from the
    roots; a receive function reached sends its gradients to the process
    that sent the tensors, which continues from the matching send function,
    and so on. A process answers a gradient message only when the work that
    message set off, including everything it sent further, is done; so
    backward returns exactly when the whole distributed pass has finished.
    Gradients of a process's leaves go to the context's map, never to
    .grad, so concurrent contexts over the same parameters stay apart.
    If some RPC's output was never used by the loss, its send function gets
    no gradient; the nodes that wait for it are found once the pass has
    quiesced and are run with zeros for the missing part, in the order of a
    Lamport clock carried by every message, so no gradient is lost or
    counted twice and nothing hangs.

    Errors anywhere reach the caller of backward, naming the failing
    process. Gradient messages are bounded by the RPC timeout
    (zd_rpc_get_timeout). Every process taking part must have called
    zd_dist_autograd_init(): a call that reaches one that did not fails,
    naming it, rather than lose its gradients. */
#ifndef ZDIST_DIST_AUTOGRAD_H
#define ZDIST_DIST_AUTOGRAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <string.h>

#include <zdist/error.h>
#include <zdist/named_tensors.h>
#include <zdist/tensor.h>
#include <zdist/value.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  Installs the RPC hooks and internal functions of distributed autograd.
    Call it in every process before zd_rpc_init (the hooks cannot change
    while RPC runs); calling it again does nothing. Returns 0, or -1. */
ZD_API int zd_dist_autograd_init(void);

/*  ---- contexts ---- */

/*  Starts a context and makes it the calling thread's current one. Its id
    is unique across the world: the rank in the high 16 bits, a counter
    below. 0 and *context_id, or -1 when the thread already has a current
    context, or (ZD_ERR_NOT_INITIALIZED)
    zd_dist_autograd_init was not called or RPC is not running. */
ZD_API int zd_dist_autograd_context_begin(int64_t *context_id);

/*  Ends a context: releases it here and on every process that took part
    (each passes the release on to the peers it knows; duplicates are
    ignored; failed sends are retried), and waits until all have released
    it, up to timeout_ms (default: zd_rpc_get_timeout(); 0: no limit).
    Clears the thread's current context if it was this one. Returns 0, or
    -1 naming the processes that did not confirm (the local context is
    freed regardless). */
ZD_API int zd_dist_autograd_context_end(int64_t context_id, int64_t timeout_ms);

/*  Ends a context without waiting for the other processes to confirm: the
    release goes out at once (here the context is freed at once), and is
    waited for later — by zd_dist_autograd_wait_releases, or by this function
    itself when 16 releases are already in flight, so that contexts never
    pile up on the peers (PyTorch's context exit does not wait at all; that
    wait is bounded by zd_rpc_get_timeout()). Returns 0, or -1 when an older
    release that it had to wait for failed. */
ZD_API int zd_dist_autograd_context_release(int64_t context_id);

/*  Waits until every release started by zd_dist_autograd_context_release has
    been confirmed, up to timeout_ms each (default: zd_rpc_get_timeout();
    0: no limit). Returns 0, or -1 with the first failure. */
ZD_API int zd_dist_autograd_wait_releases(int64_t timeout_ms);

/*  The calling thread's current context id, or -1. */
ZD_API int64_t zd_dist_autograd_current_context(void);

/*  Makes context_id the calling thread's current context (-1: none), for
    threads that work on behalf of a context begun elsewhere. Returns 0, or
    -1 when the id is not a live context here. */
ZD_API int zd_dist_autograd_set_current_context(int64_t context_id);

/*  True when a context with that id lives in this process. */
ZD_API bool zd_dist_autograd_context_exists(int64_t context_id);

/*  Number of live contexts in this process. */
ZD_API int64_t zd_dist_autograd_num_contexts(void);

/*  Bounds on the contexts other processes can make here. A request under a
    context this process does not know creates it; a peer (or a hostile
    process posing as one) could otherwise fill memory with them. Start
    from zd_dist_autograd_limits_default(). */
typedef struct {
    size_t size;                   /* set by zd_dist_autograd_limits_default() */
    int64_t max_contexts;          /* all contexts made by peers (0: 4096) */
    int64_t max_contexts_per_peer; /* made by one peer (0: 256) */
    int64_t idle_timeout_ms;       /* a peer's context unused this long is released,
                                       with a log line; ZD_TIMEOUT_DEFAULT: 10x the RPC
                                       timeout, 10 min when that is none;
                                       ZD_TIMEOUT_NONE: never */
} zd_dist_autograd_limits_t;

/*  The defaults, with size set (inline: this program's size). Returns the
    struct. */
static inline zd_dist_autograd_limits_t zd_dist_autograd_limits_default(void)
{
    zd_dist_autograd_limits_t l;
    memset(&l, 0, sizeof l);
    l.size = sizeof l;
    l.idle_timeout_ms = ZD_TIMEOUT_DEFAULT;
    return l;
}

/*  Sets the bounds (copied; NULL: the defaults), for the whole process.
    Contexts begun here (zd_dist_autograd_context_begin) are never counted
    nor expired. 0, or -1 (ZD_ERR_ARGUMENT: a size that no
    zd_dist_autograd_limits_default() set; the bounds are then unchanged). */
ZD_API int zd_dist_autograd_set_limits(const zd_dist_autograd_limits_t *limits);

/*  Brackets every run of backward functions in this process (a pass begun
    here, gradients from a peer, a flush), and every
    zd_dist_autograd_run_guarded call (a RemoteModule's forward on its
    owner), with enter() and leave(), both called on the running thread: a
    layer that writes parameters while these read them holds its writes
    off this way. zd_dist_optim_init() installs the DistributedOptimizer's
    step lock (a read hold, which a thread may take again inside). enter()
    must not wait on this process's backward work, and must allow a
    nested enter() on the same thread. Both NULL clears it; one guard per
    process. Returns 0, or -1 (ZD_ERR_ARGUMENT: one of the two NULL). */
ZD_API int zd_dist_autograd_set_backward_guard(void (*enter)(void), void (*leave)(void));

/*  Work run inside the backward guard: 0, or -1 with the error set. */
typedef int(zd_dist_autograd_guarded_fn)(void *arg);

/*  Runs fn(arg) inside the backward guard, as the engine runs backward
    functions (without a guard it only calls fn): for a forward that reads
    the parameters on their owner while a trainer's step may write them,
    such as a RemoteModule's (dist_nn.h). Steps here wait until fn
    returns: fn must not wait on a call that this process serves (a cycle
    back to it), and it is no work for the I/O thread (an inline handler,
    a future's callback). Nested calls on one thread are fine. Returns
    fn's result, or -1 (ZD_ERR_ARGUMENT) for a NULL fn. */
ZD_API int zd_dist_autograd_run_guarded(zd_dist_autograd_guarded_fn *fn, void *arg);

/*  ---- a scoped context: PyTorch's `with dist_autograd.context() as cid:` ----

        ZD_DIST_AUTOGRAD_CONTEXT(cid) {
            ...forward, zd_dist_autograd_backward(cid, ...), optimizer step...
        }

    runs the block once with `int64_t cid` a new context, current on this
    thread, and releases it on every way out of the block (its end, break,
    continue, return, goto) like zd_dist_autograd_context_release: here at
    once, on the peers without waiting for them, as PyTorch's context exit.
    It is a for statement whose variable has __attribute__((cleanup)), so:
    GCC and clang only; break and continue inside leave the block itself,
    not a loop around it; longjmp out of it skips the release. A context
    the block ended itself (zd_dist_autograd_context_end) is left alone,
    and the release leaves zd_error_last() and zd_error_code() as the block
    left them.

    When the context cannot begin (RPC not running, or the thread already
    has a current context: scopes do not nest), the block is skipped and
    zd_error_last() says why. Tell it by a variable the block sets:

        int rc = -1;
        ZD_DIST_AUTOGRAD_CONTEXT(cid) {
            rc = train_step(cid);
        }
        if (rc < 0)
            fprintf(stderr, "%s\n", zd_error_last());
*/
#if defined(__GNUC__) || defined(__clang__)
#define ZD_DIST_AUTOGRAD_CONTEXT(cid)                                                              \
    for (int64_t cid                                                                               \
         __attribute__((cleanup(zd__dist_autograd_scope_end))) = zd__dist_autograd_scope_begin(),  \
         ZD__DIST_SCOPE_ONCE = cid != -1;                                                          \
         ZD__DIST_SCOPE_ONCE; ZD__DIST_SCOPE_ONCE = 0)
#define ZD__DIST_SCOPE_ONCE       ZD__DIST_SCOPE_CAT(zd__dist_scope_once_, __LINE__)
#define ZD__DIST_SCOPE_CAT(a, b)  ZD__DIST_SCOPE_CAT_(a, b)
#define ZD__DIST_SCOPE_CAT_(a, b) a##b

static inline int64_t zd__dist_autograd_scope_begin(void)
{
    int64_t id;
    return zd_dist_autograd_context_begin(&id) < 0 ? -1 : id;
}

static inline void zd__dist_autograd_scope_end(int64_t *cid)
{
    if (*cid == -1 || !zd_dist_autograd_context_exists(*cid))
        return;
    char saved[1024];
    zd_error_code_t code = zd_error_code();
    strncpy(saved, zd_error_last(), sizeof saved - 1);
    saved[sizeof saved - 1] = '\0';
    zd_dist_autograd_context_release(*cid);
    if (code == ZD_OK)
        zd_error_clear();
    else
        zd_error_set_code(code, "%s", saved);
}
#endif

/*  ---- backward ---- */

/*  Runs the distributed backward pass of context_id from the given roots
    (scalars of this process, gradient 1) and returns when every process
    has finished its part. retain_graph keeps the graphs for another
    backward in the same context. Returns 0, or -1 with the error of the
    failing process ("backward on worker \"ps\" (rank 0): ..."). */
ZD_API int zd_dist_autograd_backward(int64_t context_id, zd_tensor_t *const *roots, int n_roots,
                                     bool retain_graph);

/*  PyTorch's RRef.backward(context_id, retain_graph): runs backward from
    the loss held by r (a one-element tensor, gradient 1) on r's owner: here
    when this process owns it, otherwise by a call to the owner, which then
    runs the distributed pass of context_id (the owner must know the
    context: the loss was made under it). context_id -1 runs local autograd
    on the owner instead (.grad). Returns 0 once the whole pass is done, or
    -1 with the owner's error. */
ZD_API int zd_rref_backward(zd_rref_t *r, int64_t context_id, bool retain_graph);

/*  ---- gradients ---- */

/*  The gradient this process accumulated for tensor t in the context: 0 and
    *grad (a new reference, or NULL when t got none), or -1
    (ZD_ERR_ARGUMENT) for an unknown context. */
ZD_API int zd_dist_autograd_get_gradient(int64_t context_id, zd_tensor_t *t, zd_tensor_t **grad);

/*  This process's gradients in the context (PyTorch's
    dist_autograd.get_gradients): a new object (zd_named_tensors_free)
    holding each gradient under its tensor's name (zd_tensor_set_name),
    or "tensor<i>" (i its place in the context's order) when the tensor
    has no name or an earlier one took it. NULL (ZD_ERR_ARGUMENT) for an
    unknown context, or out of memory. */
ZD_API zd_named_tensors_t *zd_dist_autograd_get_gradients(int64_t context_id);

/*  ---- counters ---- */

typedef struct {
    int64_t contexts;        /* live contexts */
    int64_t backward_passes; /* gradient messages being processed */
    int64_t send_functions;  /* recorded, over all live contexts */
    int64_t recv_functions;
    int64_t flushed_nodes; /* nodes run with missing gradients as zeros */
    /* running totals since the process started */
    int64_t total_contexts;       /* contexts created here or for calls from peers */
    int64_t total_backward;       /* zd_dist_autograd_backward calls */
    int64_t total_grad_messages;  /* gradient messages from peers processed */
    int64_t total_send_functions; /* send functions recorded */
} zd_dist_autograd_stats_t;

/*  This process's counters into *out, a struct of size bytes (sizeof
    *out), written no further than size:
    zd_dist_autograd_stats(&s, sizeof s). 0, or -1 (ZD_ERR_ARGUMENT: out
    NULL or size below the 1.0 struct's; out is then left alone). */
ZD_API int zd_dist_autograd_stats(zd_dist_autograd_stats_t *out, size_t size);

ZD_END_DECLS

#endif
