/* SPDX-License-Identifier: MIT */
/*  tensor.h: reference-counted, contiguous n-dimensional tensors.

    A tensor is a shape, a dtype and a view (offset) into a storage. Storages
    are reference counted separately, so reshape/flatten views share memory,
    and a storage can wrap memory the tensor does not own (a received ZeroMQ
    message, for instance) with a release callback.

    Ownership: each function says whether what it hands back is a new
    reference (the caller drops it with zd_tensor_unref()) or borrowed, as
    the library's one ownership rule (conventions.md, in its documentation)
    words it. Arguments are borrowed unless a
    comment says otherwise. All reference counts are atomic, so
    tensors may be shared between threads; their *contents* are not locked
    (except .grad, see zd_tensor_accumulate_grad).

    Autograd state (requires_grad, .grad, grad_fn) lives here too; the engine
    and the extension interface for new differentiable operations are in
    <zdist/function.h> and <zdist/autograd.h>. */
#ifndef ZDIST_TENSOR_H
#define ZDIST_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_TENSOR_MAX_DIMS 8

typedef enum {
    ZD_FLOAT32 = 1, /* IEEE binary32: every differentiable op works on this */
    ZD_INT64 = 2,   /* class indices (nll_loss targets), counters */
    ZD_UINT8 = 3,   /* raw image bytes */
} zd_tensor_dtype_t;

typedef struct zd_tensor zd_tensor_t;
typedef struct zd_autograd_node zd_autograd_node_t;

/*  Called when the last reference to a wrapped storage goes away. */
typedef void(zd_tensor_release_fn)(void *data, void *arg);

/*  Size in bytes of one element of dtype; 0 for an unknown dtype. */
ZD_API size_t zd_tensor_dtype_size(zd_tensor_dtype_t dtype);

/*  Name of a dtype ("float32", "int64", "uint8"; "?" when unknown): static. */
ZD_API const char *zd_tensor_dtype_name(zd_tensor_dtype_t dtype);

/*  New zero-filled tensor (a new reference); ndim may be 0 (a scalar with
    one element). NULL (zd_error_last() says why) on a bad shape or out of memory. */
ZD_API zd_tensor_t *zd_tensor_new(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim);

/*  New uninitialised tensor (a new reference): for outputs the caller
    fully overwrites. NULL on a bad shape or out of memory. */
ZD_API zd_tensor_t *zd_tensor_empty(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim);

/*  Shorthands for float32 tensors of 1 to 4 dimensions, zero filled: each a
    new reference, or NULL on a bad size or out of memory. */
ZD_API zd_tensor_t *zd_tensor_zeros1(int64_t d0);
ZD_API zd_tensor_t *zd_tensor_zeros2(int64_t d0, int64_t d1);
ZD_API zd_tensor_t *zd_tensor_zeros4(int64_t d0, int64_t d1, int64_t d2, int64_t d3);

/*  New tensor (a new reference) holding a copy of `data` (numel elements
    of dtype), or NULL on a bad shape or out of memory. */
ZD_API zd_tensor_t *zd_tensor_from_data(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim,
                                        const void *data);

/*  New tensor (a new reference) over memory it does not own, without
    copying: `release(data,
    arg)` is called once when the last tensor viewing it is gone. `data` must
    be aligned for dtype and hold `bytes` bytes, exactly numel*elemsize.
    On failure returns NULL and calls release itself, so the caller never
    has to clean up twice. */
ZD_API zd_tensor_t *zd_tensor_wrap(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim,
                                   void *data, size_t bytes, zd_tensor_release_fn *release,
                                   void *arg);

/*  Takes one more reference and returns t: the new reference (NULL-safe). */
ZD_API zd_tensor_t *zd_tensor_ref(zd_tensor_t *t);

/*  Drops one reference; frees the tensor (and its storage, when it was the
    storage's last view) when none is left. NULL-safe. */
ZD_API void zd_tensor_unref(zd_tensor_t *t);

/*  Drops the reference in *t_p and sets it to NULL. */
ZD_API void zd_tensor_unref_p(zd_tensor_t **t_p);

/*  Shape accessors. zd_tensor_size(t, d) accepts negative d (from the end);
    zd_tensor_shape's array is borrowed: valid while t lives. */
ZD_API int zd_tensor_ndim(const zd_tensor_t *t);
ZD_API int64_t zd_tensor_size(const zd_tensor_t *t, int dim);
ZD_API const int64_t *zd_tensor_shape(const zd_tensor_t *t);
ZD_API int64_t zd_tensor_numel(const zd_tensor_t *t);
ZD_API size_t zd_tensor_nbytes(const zd_tensor_t *t);
ZD_API zd_tensor_dtype_t zd_tensor_dtype(const zd_tensor_t *t);
ZD_API bool zd_tensor_same_shape(const zd_tensor_t *a, const zd_tensor_t *b);

/*  Formats the shape as "(4, 1, 28, 28)" into buf; returns buf (borrowed:
    the caller's own buffer). */
ZD_API char *zd_tensor_shape_str(const zd_tensor_t *t, char *buf, size_t size);

/*  Pointers to the first element. zd_tensor_data() is for float32 tensors,
    zd_tensor_data_i64() for int64 ones, zd_tensor_raw() for any dtype. Borrowed:
    valid while the caller holds a reference. */
ZD_API float *zd_tensor_data(const zd_tensor_t *t);
ZD_API int64_t *zd_tensor_data_i64(const zd_tensor_t *t);
ZD_API void *zd_tensor_raw(const zd_tensor_t *t);

/*  A new tensor (a new reference) with a copy of t's data and shape, no
    autograd history, requires_grad false; NULL when out of memory. */
ZD_API zd_tensor_t *zd_tensor_detach_copy(const zd_tensor_t *t);

/*  Copies src's elements into dst (same dtype and numel). Not recorded by
    autograd. Returns 0, or -1 on a mismatch. */
ZD_API int zd_tensor_copy_(zd_tensor_t *dst, const zd_tensor_t *src);

/*  Fills t with value / zeros. Not recorded by autograd. */
ZD_API void zd_tensor_fill_(zd_tensor_t *t, float value);
ZD_API void zd_tensor_zero_(zd_tensor_t *t);

/*  A view of t with another shape and the same storage (numel must match;
    one dimension may be -1). Recorded by autograd when t requires grad.
    Returns 0 and sets *out (a new reference), or -1. */
ZD_API int zd_tensor_reshape(zd_tensor_t *t, const int64_t *shape, int ndim, zd_tensor_t **out);

/*  The same data without history: a new reference to a view sharing t's
    storage, requires_grad false (PyTorch's detach()); NULL when out of
    memory. */
ZD_API zd_tensor_t *zd_tensor_detach(zd_tensor_t *t);

/*  ---- autograd state ---- */

/*  Marks a leaf as needing gradients (PyTorch's requires_grad_()). 0, or
    -1 (ZD_ERR_ARGUMENT) on a non-float tensor or a non-leaf. */
ZD_API int zd_tensor_set_requires_grad(zd_tensor_t *t, bool requires_grad);
ZD_API bool zd_tensor_requires_grad(const zd_tensor_t *t);

/*  True for tensors without history (created by the user, not by an op). */
ZD_API bool zd_tensor_is_leaf(const zd_tensor_t *t);

/*  The leaf's accumulated gradient, or NULL: a new reference, not borrowed,
    since another thread may drop or replace .grad meanwhile. */
ZD_API zd_tensor_t *zd_tensor_grad(zd_tensor_t *t);

/*  Adds g into t's .grad (creating it), under t's lock, so several threads
    running backward passes over the same parameter do not race. 0, or -1
    on a shape or dtype mismatch or out of memory (.grad unchanged). */
ZD_API int zd_tensor_accumulate_grad(zd_tensor_t *t, const zd_tensor_t *g);

/*  Drops t's .grad (PyTorch's zero_grad(set_to_none=True)). */
ZD_API void zd_tensor_clear_grad(zd_tensor_t *t);

/*  The node that produced t (borrowed: valid while t lives), or NULL for
    leaves. */
ZD_API zd_autograd_node_t *zd_tensor_grad_fn(const zd_tensor_t *t);

/*  Which output of its grad_fn t is. */
ZD_API int zd_tensor_output_nr(const zd_tensor_t *t);

/*  Names t ("fc1.weight"; copied; NULL: no name), for messages and for
    the gradients of distributed autograd (zd_dist_autograd_get_gradients).
    0, or -1 (ZD_ERR_NO_MEMORY: t then has no name; ZD_ERR_ARGUMENT: t
    NULL). */
ZD_API int zd_tensor_set_name(zd_tensor_t *t, const char *name);

/*  t's name: borrowed, valid until t is renamed or freed; "" when it has
    none. */
ZD_API const char *zd_tensor_name(const zd_tensor_t *t);

/*  Process-unique id assigned at creation: a stable key for maps keyed by
    tensor (pointer values are reused after free). */
ZD_API uint64_t zd_tensor_id(const zd_tensor_t *t);

/*  True when the caller's reference is the only one to t and to its
    storage, and the storage is ordinary memory: t may then be adopted (kept
    and later summed into) instead of copied. */
ZD_API bool zd_tensor_is_exclusive(const zd_tensor_t *t);

/*  Number of live tensors in this process: tests use it to prove that
    nothing leaked. */
ZD_API int64_t zd_tensor_live_count(void);

ZD_END_DECLS

#endif
