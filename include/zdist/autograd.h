/* SPDX-License-Identifier: MIT */
/*  autograd.h: the local autograd engine and a few differentiable basics.

    backward() walks the graph recorded by operations (see function.h) from
    one or more roots, in dependency order: a node runs once every node that
    feeds it a gradient has run, and receives the sum of those gradients.
    Leaf gradients go to an accumulate hook: by default into the leaf's .grad
    (zd_tensor_accumulate_grad); distributed autograd installs its own to keep
    gradients per context.

    Without retain_graph the tensors saved by the graph are released as each
    node runs, and a second backward through the same nodes fails with a
    clear error, as in PyTorch. */
#ifndef ZDIST_AUTOGRAD_H
#define ZDIST_AUTOGRAD_H

#include <stddef.h>
#include <string.h>

#include <zdist/function.h>
#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  ---- grad mode (per thread) ---- */

/*  Enables or disables recording on the calling thread; returns the previous
    setting so that callers can restore it (PyTorch's no_grad()). */
ZD_API bool zd_autograd_set_grad_enabled(bool enabled);
ZD_API bool zd_autograd_is_grad_enabled(void);

/*  ---- node order ----
    Nodes are numbered in creation order by a process-wide counter. Across
    processes the numbers form a Lamport clock when every message carries
    the sender's zd_autograd_seq_current() and the receiver calls
    zd_autograd_seq_observe() with it: a node created after receiving a
    message then numbers higher than every node its sender had made. */
ZD_API uint64_t zd_autograd_seq_current(void);
/*  Moves the clock past remote_seq, but never more than 2^32 ahead of where
    it was nor past 2^62 (the clock never wraps, whatever a peer sends). */
ZD_API void zd_autograd_seq_observe(uint64_t remote_seq);
/*  Whether remote_seq is at most 2^32 ahead of this process's clock and
    below 2^62: a peer whose number is not is broken or hostile. */
ZD_API bool zd_autograd_seq_plausible(uint64_t remote_seq);

/*  ---- the engine ---- */

/*  Receives a leaf's gradient. Return 0, or -1 with zd_error_set(). */
typedef int(zd_autograd_accumulate_fn)(void *arg, zd_tensor_t *leaf, zd_tensor_t *grad);

/*  A starting point of a backward pass: either a tensor with the gradient of
    the objective with respect to it (NULL grad = ones, for a scalar), or a
    node with the gradients of all its outputs (distributed autograd starts
    from send functions that way). Borrowed. */
typedef struct {
    zd_tensor_t *tensor;
    zd_tensor_t *grad;
    zd_autograd_node_t *node;
    zd_tensor_t *const *node_grads;
} zd_autograd_root_t;

/*  How a pass runs. Start from zd_autograd_options_default(). */
typedef struct {
    size_t size; /* set by zd_autograd_options_default() */
    bool retain_graph;
    zd_autograd_accumulate_fn *accumulate; /* NULL: into .grad */
    void *accumulate_arg;
} zd_autograd_options_t;

/*  The defaults (free the graph, gradients into .grad), with size set
    (inline: this program's size). Returns the struct. */
static inline zd_autograd_options_t zd_autograd_options_default(void)
{
    zd_autograd_options_t o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    return o;
}

/*  Runs the backward pass from the given roots on the calling thread (opts
    borrowed; NULL: the defaults). Returns 0, or -1 with zd_error_last()
    naming the failing node (ZD_ERR_ARGUMENT: opts' size not set by
    zd_autograd_options_default()). */
ZD_API int zd_autograd_run(const zd_autograd_root_t *roots, int n_roots,
                           const zd_autograd_options_t *opts);

/*  ---- tasks: a backward pass fed from outside ----

    Distributed autograd receives the gradients of a process's send
    functions in separate messages, possibly on several threads. A task
    counts dependencies once over everything reachable from all its start
    nodes; each feed adds the gradients of one start node and runs whatever
    became ready, on the calling thread, under the task's lock. */
typedef struct zd_autograd_task zd_autograd_task_t;

/*  A task over the graph below starts (borrowed; the task keeps its own
    references to every node it reaches; opts copied, NULL: the defaults).
    A new object (zd_autograd_task_free), or NULL (out of memory; opts'
    size not set by zd_autograd_options_default()). */
ZD_API zd_autograd_task_t *zd_autograd_task_new(zd_autograd_node_t *const *starts, int n_starts,
                                                const zd_autograd_options_t *opts);

/*  Gives start node `node` the gradients of its outputs (grads[k] may be
    NULL: zeros) and runs every node that became ready. Returns 0, or -1 when
    a node failed (the task is then poisoned) or node is not a start. */
ZD_API int zd_autograd_task_feed(zd_autograd_task_t *t, zd_autograd_node_t *node,
                                 zd_tensor_t *const *grads);

/*  Nodes that hold some gradients but still wait for producers that have
    not run: returns how many, and the highest sequence number among them
    in *max_seq (0 when none). After a distributed pass has quiesced, such
    nodes wait for send functions whose outputs were never used. */
ZD_API int zd_autograd_task_pending(zd_autograd_task_t *t, uint64_t *max_seq);

/*  Runs the pending node with the highest sequence number as if its
    missing gradients were zeros, then everything that became ready.
    Returns 1 when a node ran, 0 when none was pending, -1 on failure.
    Sequence numbers follow creation order (and, across processes, the
    Lamport order of zd_autograd_seq_observe), so the highest pending node can
    never receive more gradients from another pending node. */
ZD_API int zd_autograd_task_flush_one(zd_autograd_task_t *t);

/*  zd_autograd_task_flush_one until nothing is pending; *ran counts them.
    0, or -1 when a node's backward failed (its error). */
ZD_API int zd_autograd_task_flush(zd_autograd_task_t *t, int *ran);

/*  Frees a task (NULL-safe), with what it still holds. */
ZD_API void zd_autograd_task_free(zd_autograd_task_t *t);

/*  PyTorch's tensor.backward(grad, retain_graph): gradient defaults to ones
    for a one-element tensor (else it is required). 0, or -1 when a node's
    backward failed or grad does not fit (its error; gradients accumulated
    so far stay). */
ZD_API int zd_autograd_backward(zd_tensor_t *root, zd_tensor_t *grad, bool retain_graph);

/*  ---- differentiable basics (float32), each: 0 and *out (a new reference), or -1 ----
    add, sub, mul and div broadcast as NumPy and PyTorch do (shapes aligned
    at the last dimension, sizes equal or 1; the gradient of a broadcast
    input is summed back to its shape); they fail naming both shapes when
    those do not broadcast. Other shapes must match as noted. */
ZD_API int zd_tensor_add(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out);
ZD_API int zd_tensor_sub(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out);
ZD_API int zd_tensor_mul(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out);
ZD_API int zd_tensor_div(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out); /* a / b */
ZD_API int zd_tensor_scale(zd_tensor_t *a, float s, zd_tensor_t **out);      /* a * s */
ZD_API int zd_tensor_sum(zd_tensor_t *a, zd_tensor_t **out);                 /* scalar, shape () */
ZD_API int zd_tensor_mean(zd_tensor_t *a, zd_tensor_t **out);                /* scalar, shape () */
ZD_API int zd_tensor_matmul(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out); /* (m,k)x(k,n) */

/*  A copy of a's data whose gradient flows back to a (PyTorch's clone()), in
    *out (a new reference): later in-place changes of a do not reach it. 0,
    or -1. */
ZD_API int zd_tensor_clone(zd_tensor_t *a, zd_tensor_t **out);

/*  Concatenation of n tensors along dim (the other sizes must agree): *out,
    a new reference, and 0; or -1. */
ZD_API int zd_tensor_cat(zd_tensor_t *const *ts, int n, int dim, zd_tensor_t **out);

/*  Positions [start, start + length) of t along dim (PyTorch's narrow; a
    negative dim or start counts from the end), of any dtype; the gradient
    flows back into those positions of t's. When they are one contiguous
    block of t (dim 0, or only sizes of 1 before dim) *out (a new reference)
    is a view sharing t's memory, as PyTorch's is: changing t in place
    changes it. Otherwise it is a copy. Fails on a scalar, a dim out of
    range, or a range that does not fit. */
ZD_API int zd_tensor_narrow(zd_tensor_t *t, int dim, int64_t start, int64_t length,
                            zd_tensor_t **out);

/*  Element-wise, any shape, as torch.tanh, sigmoid, exp and log (log: NaN below 0, -inf at 0);
    *out is a new reference. 0, or -1. */
ZD_API int zd_tensor_tanh(zd_tensor_t *x, zd_tensor_t **out);
ZD_API int zd_tensor_sigmoid(zd_tensor_t *x, zd_tensor_t **out);
ZD_API int zd_tensor_exp(zd_tensor_t *x, zd_tensor_t **out);
ZD_API int zd_tensor_log(zd_tensor_t *x, zd_tensor_t **out);

/*  PyTorch's t.permute(dims) (ndims = t's ndim; negative dims from the end): *out, a new
    reference to a copy, of any dtype. 0, or -1 (dims not a permutation). */
ZD_API int zd_tensor_permute(zd_tensor_t *t, const int *dims, int ndims, zd_tensor_t **out);

/*  PyTorch's t.transpose(dim0, dim1): *out, a new reference to a copy with dimensions dim0
    and dim1 swapped. 0, or -1 (a dim out of range). */
ZD_API int zd_tensor_transpose(zd_tensor_t *t, int dim0, int dim1, zd_tensor_t **out);

ZD_END_DECLS

#endif
