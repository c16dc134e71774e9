/* SPDX-License-Identifier: MIT */
/*  function.h: how to write a differentiable operation.

    An operation that supports autograd computes its result, then, when
    zd_autograd_node_new() says gradients are needed, records a node: the
    operation's backward function, the tensors it must keep, and one edge per
    input (to the input's own grad_fn, or to the input itself when it is a
    leaf that requires grad). The engine (autograd.h) later calls backward
    with the gradient of each output and expects the gradient of each input.

    Sketch of a unary op:

        static int exp_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout,
                                zd_tensor_t **gin)
        {
            zd_tensor_t *y = zd_autograd_node_saved(n, 0);
            ... gin[0] = gout[0] * y ...
            return 0;
        }
        static const zd_autograd_node_ops_t exp_ops =
            ZD_AUTOGRAD_NODE_OPS("ExpBackward", exp_backward, NULL);

        y = ...forward...;
        zd_autograd_node_t *n;
        if (zd_autograd_node_new(&exp_ops, &x, 1, 1, &n) < 0) ...fail...
        if (n) {
            zd_autograd_node_save(n, 0, y);
            zd_autograd_node_set_output(n, y);   // y now owns n; drop ours
            zd_autograd_node_unref(n);
        }

    Thread safety: nodes are built by one thread; their reference counts are
    atomic, and the engine may run them on another thread. */
#ifndef ZDIST_FUNCTION_H
#define ZDIST_FUNCTION_H

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_AUTOGRAD_MAX_SAVED 8

/*  Backward of an operation. gout[i] is the gradient of output i (never NULL:
    the engine passes zeros for outputs that received none). The function
    fills gin[j] with a new reference for every input j that needs a gradient
    (zd_autograd_node_needs_grad) and may leave the others NULL. Returns 0, or
    -1 with zd_error_set(). */
typedef int(zd_autograd_backward_fn)(zd_autograd_node_t *node, zd_tensor_t *const *gout,
                                     zd_tensor_t **gin);

/*  Frees the node's private state (`ctx`, see zd_autograd_node_ctx); NULL when
    it has none. Called once, when the graph is released. */
typedef void(zd_autograd_release_fn)(zd_autograd_node_t *node);

/*  An op's table, usually static const: build it with ZD_AUTOGRAD_NODE_OPS,
    which sets size (this program's); the library reads only the fields
    within size and refuses a table whose size nothing set. */
typedef struct {
    size_t size;      /* sizeof(zd_autograd_node_ops_t), set by ZD_AUTOGRAD_NODE_OPS */
    const char *name; /* "ConvolutionBackward", for errors */
    zd_autograd_backward_fn *backward;
    zd_autograd_release_fn *release;
} zd_autograd_node_ops_t;

/*  The initializer of a zd_autograd_node_ops_t, with size set:
    static const zd_autograd_node_ops_t ops = ZD_AUTOGRAD_NODE_OPS("ExpBackward", exp_backward, NULL); */
#define ZD_AUTOGRAD_NODE_OPS(name_, backward_, release_)                                           \
    {                                                                                              \
        .size = sizeof(zd_autograd_node_ops_t), .name = (name_), .backward = (backward_),          \
        .release = (release_)                                                                      \
    }

/*  The same table as a value, for C++ before C++20 (which has no designated
    initializers): static const zd_autograd_node_ops_t ops =
    zd_autograd_node_ops("ExpBackward", exp_backward, NULL); */
static inline zd_autograd_node_ops_t zd_autograd_node_ops(const char *name,
                                                          zd_autograd_backward_fn *backward,
                                                          zd_autograd_release_fn *release)
{
    zd_autograd_node_ops_t ops;
    ops.size = sizeof ops;
    ops.name = name;
    ops.backward = backward;
    ops.release = release;
    return ops;
}

/*  One input of a node: either another node's output, or a leaf tensor whose
    gradient is accumulated. Exactly one of node/leaf is set, or neither when
    the input does not need a gradient. */
typedef struct {
    zd_autograd_node_t *node;
    int output_nr;
    zd_tensor_t *leaf;
} zd_autograd_edge_t;

/*  New node for an op with n_inputs inputs and n_outputs outputs. Sets *out
    to NULL when no gradient is needed (grad mode off, or no input requires
    grad): then the op records nothing. inputs[j] may be NULL (an optional
    bias). Returns 0 (*out a new reference, or NULL), or -1 when out of
    memory. */
ZD_API int zd_autograd_node_new(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *inputs,
                                int n_inputs, int n_outputs, zd_autograd_node_t **out);

/*  The common case in one call: a node of ops over the n_in inputs with
    one output y, keeping the non-NULL saved[0..n_saved) in slots 0.. and
    taking ownership of ctx (malloc'ed; freed by ops->release later, or
    here at once when nothing is recorded). Returns 0 (recorded or not
    needed), or -1 out of memory, after freeing ctx and dropping y. */
ZD_API int zd_autograd_record(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *in, int n_in,
                              zd_tensor_t *y, zd_tensor_t *const *saved, int n_saved, void *ctx);

/*  zd_autograd_node_ref takes one more reference and returns n (the new
    reference); zd_autograd_node_unref drops one. Both NULL-safe. */
ZD_API zd_autograd_node_t *zd_autograd_node_ref(zd_autograd_node_t *n);
ZD_API void zd_autograd_node_unref(zd_autograd_node_t *n);

/*  Keeps a reference to t in slot i (0 <= i < ZD_AUTOGRAD_MAX_SAVED) until the
    graph is released. */
ZD_API void zd_autograd_node_save(zd_autograd_node_t *n, int i, zd_tensor_t *t);

/*  Slot i (borrowed: valid while n lives), or NULL. */
ZD_API zd_tensor_t *zd_autograd_node_saved(const zd_autograd_node_t *n, int i);

/*  Private state of the op (integers, a mask…), borrowed: the op allocates
    it and frees it in its release function. */
ZD_API void zd_autograd_node_set_ctx(zd_autograd_node_t *n, void *ctx);
ZD_API void *zd_autograd_node_ctx(const zd_autograd_node_t *n);

/*  Makes out the next output of n: out gets n as grad_fn (taking its own
    reference), its output number, and requires_grad. Call once per output,
    in order. */
ZD_API void zd_autograd_node_set_output(zd_autograd_node_t *n, zd_tensor_t *out);

/*  Records the shape of n's next output without attaching a tensor to it:
    for nodes whose outputs live elsewhere (a send function's outputs are
    the tensors sent). Gradients fed to that output must have this shape. */
ZD_API void zd_autograd_node_set_output_shape(zd_autograd_node_t *n, const zd_tensor_t *like);

/*  Whether input j gets a gradient at all (so backward can skip work). */
ZD_API bool zd_autograd_node_needs_grad(const zd_autograd_node_t *n, int j);

/*  Counts of inputs and outputs, the ops' name and input j's edge (NULL out
    of range): borrowed, valid while n lives (the name: while its ops do). */
ZD_API int zd_autograd_node_n_inputs(const zd_autograd_node_t *n);
ZD_API int zd_autograd_node_n_outputs(const zd_autograd_node_t *n);
ZD_API const char *zd_autograd_node_name(const zd_autograd_node_t *n);
ZD_API const zd_autograd_edge_t *zd_autograd_node_edge(const zd_autograd_node_t *n, int j);

/*  Shape of output i as recorded at set_output time (for zero gradients), and
    its ndim in *ndim: borrowed, valid while n lives; NULL out of range. */
ZD_API const int64_t *zd_autograd_node_output_shape(const zd_autograd_node_t *n, int i, int *ndim);

ZD_END_DECLS

#endif
