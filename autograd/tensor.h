/*  tensor.h: reference-counted, contiguous n-dimensional tensors.

    A tensor is a shape, a dtype and a view (offset) into a storage. Storages
    are reference counted separately, so reshape/flatten views share memory,
    and a storage can wrap memory the tensor does not own (a received ZeroMQ
    message, for instance) with a release callback.

    Ownership: every function that returns a tensor_t* gives the caller one
    reference, to be dropped with tensor_unref(). Arguments are borrowed
    unless a comment says otherwise. All reference counts are atomic, so
    tensors may be shared between threads; their *contents* are not locked
    (except .grad, see tensor_accumulate_grad).

    Autograd state (requires_grad, .grad, grad_fn) lives here too; the engine
    and the extension interface for new differentiable operations are in
    autograd/function.h and autograd/autograd.h. */
#ifndef ZDIST_TENSOR_H
#define ZDIST_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TENSOR_MAX_DIMS 8

typedef enum {
    TENSOR_F32 = 1,   /* IEEE binary32: every differentiable op works on this */
    TENSOR_I64 = 2,   /* class indices (nll_loss targets), counters */
    TENSOR_U8  = 3,   /* raw image bytes */
} tensor_dtype_t;

typedef struct tensor tensor_t;
typedef struct autograd_node autograd_node_t;

/*  Called when the last reference to a wrapped storage goes away. */
typedef void (tensor_release_fn)(void *data, void *arg);

/*  Size in bytes of one element of dtype; 0 for an unknown dtype. */
size_t tensor_dtype_size(tensor_dtype_t dtype);

/*  Name of a dtype ("float32", "int64", "uint8"), "?" when unknown. */
const char *tensor_dtype_name(tensor_dtype_t dtype);

/*  New zero-filled tensor. ndim may be 0 (a scalar with one element).
    Returns NULL (error_last() says why) on a bad shape or out of memory. */
tensor_t *tensor_new(tensor_dtype_t dtype, int ndim, const int64_t *shape);

/*  New uninitialised tensor: for outputs the caller fully overwrites. */
tensor_t *tensor_empty(tensor_dtype_t dtype, int ndim, const int64_t *shape);

/*  Shorthands for float32 tensors of 1 to 4 dimensions, zero filled. */
tensor_t *tensor_zeros1(int64_t d0);
tensor_t *tensor_zeros2(int64_t d0, int64_t d1);
tensor_t *tensor_zeros4(int64_t d0, int64_t d1, int64_t d2, int64_t d3);

/*  New tensor holding a copy of `data` (numel elements of dtype). */
tensor_t *tensor_from_data(tensor_dtype_t dtype, int ndim, const int64_t *shape,
                           const void *data);

/*  New tensor over memory it does not own, without copying: `release(data,
    arg)` is called once when the last tensor viewing it is gone. `data` must
    be aligned for dtype and hold `bytes` bytes, exactly numel*elemsize.
    On failure returns NULL and calls release itself, so the caller never
    has to clean up twice. */
tensor_t *tensor_wrap(tensor_dtype_t dtype, int ndim, const int64_t *shape,
                      void *data, size_t bytes, tensor_release_fn *release, void *arg);

/*  Takes one more reference; returns t (NULL-safe). */
tensor_t *tensor_ref(tensor_t *t);

/*  Drops one reference; frees the tensor (and its storage, when it was the
    storage's last view) when none is left. NULL-safe. */
void tensor_unref(tensor_t *t);

/*  Drops the reference in *t_p and sets it to NULL. */
void tensor_unref_p(tensor_t **t_p);

/*  Shape accessors. tensor_size(t, d) accepts negative d (from the end). */
int tensor_ndim(const tensor_t *t);
int64_t tensor_size(const tensor_t *t, int dim);
const int64_t *tensor_shape(const tensor_t *t);
int64_t tensor_numel(const tensor_t *t);
size_t tensor_nbytes(const tensor_t *t);
tensor_dtype_t tensor_dtype(const tensor_t *t);
bool tensor_same_shape(const tensor_t *a, const tensor_t *b);

/*  Formats the shape as "(4, 1, 28, 28)" into buf; returns buf. */
char *tensor_shape_str(const tensor_t *t, char *buf, size_t size);

/*  Pointers to the first element. tensor_data() is for float32 tensors,
    tensor_data_i64() for int64 ones, tensor_raw() for any dtype. Borrowed:
    valid while the caller holds a reference. */
float *tensor_data(const tensor_t *t);
int64_t *tensor_data_i64(const tensor_t *t);
void *tensor_raw(const tensor_t *t);

/*  A new tensor with a copy of t's data and shape, no autograd history,
    requires_grad false. */
tensor_t *tensor_clone(const tensor_t *t);

/*  Copies src's elements into dst (same dtype and numel). Not recorded by
    autograd. Returns 0, or -1 on a mismatch. */
int tensor_copy_(tensor_t *dst, const tensor_t *src);

/*  Fills t with value / zeros. Not recorded by autograd. */
void tensor_fill_(tensor_t *t, float value);
void tensor_zero_(tensor_t *t);

/*  A view of t with another shape and the same storage (numel must match;
    one dimension may be -1). Recorded by autograd when t requires grad.
    Returns 0 and sets *out, or -1. */
int tensor_reshape(tensor_t *t, int ndim, const int64_t *shape, tensor_t **out);

/*  The same data without history: a view sharing storage, requires_grad
    false (PyTorch's detach()). */
tensor_t *tensor_detach(tensor_t *t);

/*  ---- autograd state ---- */

/*  Marks a leaf as needing gradients (PyTorch's requires_grad_()). Fails on
    a non-float tensor or a non-leaf. */
int tensor_set_requires_grad(tensor_t *t, bool requires_grad);
bool tensor_requires_grad(const tensor_t *t);

/*  True for tensors without history (created by the user, not by an op). */
bool tensor_is_leaf(const tensor_t *t);

/*  The leaf's accumulated gradient, or NULL. Returns a new reference. */
tensor_t *tensor_grad(tensor_t *t);

/*  Adds g into t's .grad (creating it), under t's lock, so several threads
    running backward passes over the same parameter do not race. */
int tensor_accumulate_grad(tensor_t *t, const tensor_t *g);

/*  Drops t's .grad (PyTorch's zero_grad(set_to_none=True)). */
void tensor_clear_grad(tensor_t *t);

/*  The node that produced t (borrowed), or NULL for leaves. */
autograd_node_t *tensor_grad_fn(const tensor_t *t);

/*  Which output of its grad_fn t is. */
int tensor_output_nr(const tensor_t *t);

/*  A name for debugging and for the gradient map of distributed autograd
    ("fc1.weight"). Copied. */
void tensor_set_name(tensor_t *t, const char *name);
const char *tensor_name(const tensor_t *t);

/*  Process-unique id assigned at creation: a stable key for maps keyed by
    tensor (pointer values are reused after free). */
uint64_t tensor_id(const tensor_t *t);

/*  True when the caller's reference is the only one to t and to its
    storage, and the storage is ordinary memory: t may then be adopted (kept
    and later summed into) instead of copied. */
bool tensor_is_exclusive(const tensor_t *t);

/*  Number of live tensors in this process: tests use it to prove that
    nothing leaked. */
int64_t tensor_live_count(void);

#endif
