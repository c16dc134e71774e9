/*  autograd.h: the local autograd engine and a few differentiable basics.

    backward() walks the graph recorded by operations (see function.h) from
    one or more roots, in dependency order: a node runs once every node that
    feeds it a gradient has run, and receives the sum of those gradients.
    Leaf gradients go to an accumulate hook: by default into the leaf's .grad
    (tensor_accumulate_grad); distributed autograd installs its own to keep
    gradients per context.

    Without retain_graph the tensors saved by the graph are released as each
    node runs, and a second backward through the same nodes fails with a
    clear error, as in PyTorch. */
#ifndef ZDIST_AUTOGRAD_H
#define ZDIST_AUTOGRAD_H

#include "autograd/function.h"
#include "autograd/tensor.h"

/*  ---- grad mode (per thread) ---- */

/*  Enables or disables recording on the calling thread; returns the previous
    setting so that callers can restore it (PyTorch's no_grad()). */
bool autograd_set_grad_enabled(bool enabled);
bool autograd_is_grad_enabled(void);

/*  ---- node order ----
    Nodes are numbered in creation order by a process-wide counter. Across
    processes the numbers form a Lamport clock when every message carries
    the sender's autograd_seq_current() and the receiver calls
    autograd_seq_observe() with it: a node created after receiving a
    message then numbers higher than every node its sender had made. */
uint64_t autograd_seq_current(void);
void autograd_seq_observe(uint64_t remote_seq);

/*  ---- the engine ---- */

/*  Receives a leaf's gradient. Return 0, or -1 with error_set(). */
typedef int (autograd_accumulate_fn)(void *arg, tensor_t *leaf, tensor_t *grad);

/*  A starting point of a backward pass: either a tensor with the gradient of
    the objective with respect to it (NULL grad = ones, for a scalar), or a
    node with the gradients of all its outputs (distributed autograd starts
    from send functions that way). Borrowed. */
typedef struct {
    tensor_t *tensor;
    tensor_t *grad;
    autograd_node_t *node;
    tensor_t *const *node_grads;
} autograd_root_t;

typedef struct {
    bool retain_graph;
    autograd_accumulate_fn *accumulate;   /* NULL: into .grad */
    void *accumulate_arg;
} autograd_options_t;

/*  Runs the backward pass from the given roots on the calling thread.
    Returns 0, or -1 with error_last() naming the failing node. */
int autograd_run(const autograd_root_t *roots, int n_roots, const autograd_options_t *opts);

/*  ---- tasks: a backward pass fed from outside ----

    Distributed autograd receives the gradients of a process's send
    functions in separate messages, possibly on several threads. A task
    counts dependencies once over everything reachable from all its start
    nodes; each feed adds the gradients of one start node and runs whatever
    became ready, on the calling thread, under the task's lock. */
typedef struct autograd_task autograd_task_t;

/*  A task over the graph below starts (borrowed; the task keeps its own
    references to every node it reaches). NULL on out of memory. */
autograd_task_t *autograd_task_new(autograd_node_t *const *starts, int n_starts,
                                   const autograd_options_t *opts);

/*  Gives start node `node` the gradients of its outputs (grads[k] may be
    NULL: zeros) and runs every node that became ready. Returns 0, or -1 when
    a node failed (the task is then poisoned) or node is not a start. */
int autograd_task_feed(autograd_task_t *t, autograd_node_t *node, tensor_t *const *grads);

/*  Nodes that hold some gradients but still wait for producers that have
    not run: returns how many, and the highest sequence number among them
    in *max_seq (0 when none). After a distributed pass has quiesced, such
    nodes wait for send functions whose outputs were never used. */
int autograd_task_pending(autograd_task_t *t, uint64_t *max_seq);

/*  Runs the pending node with the highest sequence number as if its
    missing gradients were zeros, then everything that became ready.
    Returns 1 when a node ran, 0 when none was pending, -1 on failure.
    Sequence numbers follow creation order (and, across processes, the
    Lamport order of autograd_seq_observe), so the highest pending node can
    never receive more gradients from another pending node. */
int autograd_task_flush_one(autograd_task_t *t);

/*  autograd_task_flush_one until nothing is pending; *ran counts them. */
int autograd_task_flush(autograd_task_t *t, int *ran);

void autograd_task_free(autograd_task_t *t);

/*  PyTorch's tensor.backward(grad, retain_graph): gradient defaults to ones
    for a one-element tensor (else it is required). */
int autograd_backward(tensor_t *root, tensor_t *grad, bool retain_graph);

/*  ---- differentiable basics (float32), each: 0 and *out, or -1 ----
    Shapes must match exactly (no broadcasting), except where noted. */
int tensor_add(tensor_t *a, tensor_t *b, tensor_t **out);
int tensor_sub(tensor_t *a, tensor_t *b, tensor_t **out);
int tensor_mul(tensor_t *a, tensor_t *b, tensor_t **out);
int tensor_scale(tensor_t *a, float s, tensor_t **out);      /* a * s */
int tensor_sum(tensor_t *a, tensor_t **out);                 /* scalar, shape () */
int tensor_mean(tensor_t *a, tensor_t **out);                /* scalar, shape () */
int tensor_matmul(tensor_t *a, tensor_t *b, tensor_t **out); /* (m,k)x(k,n) */

/*  A copy of a's data whose gradient flows back to a (PyTorch's clone()):
    later in-place changes of a do not reach what the graph saved. */
int tensor_copy(tensor_t *a, tensor_t **out);

/*  Concatenation of n tensors along dim (the other sizes must agree). */
int tensor_cat(tensor_t *const *ts, int n, int dim, tensor_t **out);

/*  Positions [start, start + length) of t along dim (PyTorch's narrow; a
    negative dim or start counts from the end), of any dtype; the gradient
    flows back into those positions of t's. When they are one contiguous
    block of t (dim 0, or only sizes of 1 before dim) the result is a view
    sharing t's memory, as PyTorch's is: changing t in place changes it.
    Otherwise it is a copy. Fails on a scalar, a dim out of range, or a
    range that does not fit. */
int tensor_narrow(tensor_t *t, int dim, int64_t start, int64_t length, tensor_t **out);

#endif
