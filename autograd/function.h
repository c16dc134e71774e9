/*  function.h: how to write a differentiable operation.

    An operation that supports autograd computes its result, then, when
    autograd_node_new() says gradients are needed, records a node: the
    operation's backward function, the tensors it must keep, and one edge per
    input (to the input's own grad_fn, or to the input itself when it is a
    leaf that requires grad). The engine (autograd.h) later calls backward
    with the gradient of each output and expects the gradient of each input.

    Sketch of a unary op:

        static int exp_backward(autograd_node_t *n, tensor_t *const *gout,
                                tensor_t **gin)
        {
            tensor_t *y = autograd_node_saved(n, 0);
            ... gin[0] = gout[0] * y ...
            return 0;
        }
        static const autograd_node_ops_t exp_ops = { "ExpBackward", exp_backward, NULL };

        y = ...forward...;
        autograd_node_t *n;
        if (autograd_node_new(&exp_ops, 1, &x, 1, &n) < 0) ...fail...
        if (n) {
            autograd_node_save(n, 0, y);
            autograd_node_set_output(n, y);   // y now owns n; drop ours
            autograd_node_unref(n);
        }

    Thread safety: nodes are built by one thread; their reference counts are
    atomic, and the engine may run them on another thread. */
#ifndef ZDIST_FUNCTION_H
#define ZDIST_FUNCTION_H

#include "autograd/tensor.h"

#define AUTOGRAD_MAX_SAVED 8

/*  Backward of an operation. gout[i] is the gradient of output i (never NULL:
    the engine passes zeros for outputs that received none). The function
    fills gin[j] with a new reference for every input j that needs a gradient
    (autograd_node_needs_grad) and may leave the others NULL. Returns 0, or
    -1 with error_set(). */
typedef int (autograd_backward_fn)(autograd_node_t *node, tensor_t *const *gout,
                                   tensor_t **gin);

/*  Frees the node's private state (`ctx`, see autograd_node_ctx); NULL when
    it has none. Called once, when the graph is released. */
typedef void (autograd_release_fn)(autograd_node_t *node);

typedef struct {
    const char *name;                  /* "ConvolutionBackward", for errors */
    autograd_backward_fn *backward;
    autograd_release_fn *release;
} autograd_node_ops_t;

/*  One input of a node: either another node's output, or a leaf tensor whose
    gradient is accumulated. Exactly one of node/leaf is set, or neither when
    the input does not need a gradient. */
typedef struct {
    autograd_node_t *node;
    int output_nr;
    tensor_t *leaf;
} autograd_edge_t;

/*  New node for an op with n_inputs inputs and n_outputs outputs. Sets *out
    to NULL when no gradient is needed (grad mode off, or no input requires
    grad): then the op records nothing. inputs[j] may be NULL (an optional
    bias). Returns 0 (the caller owns one reference to *out), or -1 when out
    of memory. */
int autograd_node_new(const autograd_node_ops_t *ops, int n_inputs,
                      tensor_t *const *inputs, int n_outputs, autograd_node_t **out);

/*  The common case in one call: a node of ops over the n_in inputs with
    one output y, keeping the non-NULL saved[0..n_saved) in slots 0.. and
    taking ownership of ctx (malloc'ed; freed by ops->release later, or
    here at once when nothing is recorded). Returns 0 (recorded or not
    needed), or -1 out of memory, after freeing ctx and dropping y. */
int autograd_record(const autograd_node_ops_t *ops, int n_in, tensor_t *const *in, tensor_t *y,
                    tensor_t *const *saved, int n_saved, void *ctx);

autograd_node_t *autograd_node_ref(autograd_node_t *n);
void autograd_node_unref(autograd_node_t *n);

/*  Keeps a reference to t in slot i (0 <= i < AUTOGRAD_MAX_SAVED) until the
    graph is released. */
void autograd_node_save(autograd_node_t *n, int i, tensor_t *t);

/*  Slot i (borrowed), or NULL. */
tensor_t *autograd_node_saved(const autograd_node_t *n, int i);

/*  Private state of the op (integers, a mask…). The op allocates it and
    frees it in its release function. */
void autograd_node_set_ctx(autograd_node_t *n, void *ctx);
void *autograd_node_ctx(const autograd_node_t *n);

/*  Makes out the next output of n: out gets n as grad_fn (taking its own
    reference), its output number, and requires_grad. Call once per output,
    in order. */
void autograd_node_set_output(autograd_node_t *n, tensor_t *out);

/*  Whether input j gets a gradient at all (so backward can skip work). */
bool autograd_node_needs_grad(const autograd_node_t *n, int j);

int autograd_node_n_inputs(const autograd_node_t *n);
int autograd_node_n_outputs(const autograd_node_t *n);
const char *autograd_node_name(const autograd_node_t *n);
const autograd_edge_t *autograd_node_edge(const autograd_node_t *n, int j);

/*  Shape of output i as recorded at set_output time (for zero gradients). */
const int64_t *autograd_node_output_shape(const autograd_node_t *n, int i, int *ndim);

#endif
