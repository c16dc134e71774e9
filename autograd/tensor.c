/* SPDX-License-Identifier: MIT */
/*  tensor.c: storage, shape and reference counting of tensors. */
#include "autograd/autograd_private.h"
#include "core/fault_inject.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>

/*  64-byte alignment keeps sgemm on its fast path and suits AVX-512 loads. */
#define TENSOR_ALIGN 64

static atomic_uint_fast64_t next_tensor_id = 1;
static atomic_int_fast64_t live_tensors = 0;

size_t zd_tensor_dtype_size(zd_tensor_dtype_t dtype)
{
    switch (dtype) {
    case ZD_FLOAT32:
        return 4;
    case ZD_INT64:
        return 8;
    case ZD_UINT8:
        return 1;
    }
    return 0;
}

const char *zd_tensor_dtype_name(zd_tensor_dtype_t dtype)
{
    switch (dtype) {
    case ZD_FLOAT32:
        return "float32";
    case ZD_INT64:
        return "int64";
    case ZD_UINT8:
        return "uint8";
    }
    return "?";
}

static int shape_check(zd_tensor_dtype_t dtype, int ndim, const int64_t *shape, int64_t *numel)
{
    if (zd_tensor_dtype_size(dtype) == 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "tensor: unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > ZD_TENSOR_MAX_DIMS)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "tensor: %d dimensions (0 to %d allowed)", ndim,
                                 ZD_TENSOR_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "tensor: negative size %lld in dimension %d",
                                     (long long)shape[i], i);
        if (shape[i] > 0 && n > INT64_MAX / 16 / shape[i])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "tensor: shape too large");
        n *= shape[i];
    }
    *numel = n;
    return 0;
}

static zd_tensor_t *tensor_alloc_header(zd_tensor_dtype_t dtype, int ndim, const int64_t *shape,
                                        int64_t numel)
{
    zd_tensor_t *t = calloc(1, sizeof *t);
    if (!t) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "tensor: out of memory");
        return NULL;
    }
    atomic_init(&t->refcount, 1);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->numel = numel;
    t->id = atomic_fetch_add(&next_tensor_id, 1);
    pthread_mutex_init(&t->grad_lock, NULL);
    atomic_fetch_add(&live_tensors, 1);
    return t;
}

static tensor_storage_t *storage_new(size_t bytes, bool zero)
{
    tensor_storage_t *s = malloc(sizeof *s);
    if (!s)
        return NULL;
    size_t alloc = (bytes + TENSOR_ALIGN - 1) / TENSOR_ALIGN * TENSOR_ALIGN;
    s->block = 0;
    s->data = bytes >= ZD_BLOCK_MIN ? zd__block_alloc(bytes, &s->block)
                                    : aligned_alloc(TENSOR_ALIGN, alloc ? alloc : TENSOR_ALIGN);
    if (!s->data) {
        free(s);
        return NULL;
    }
    if (zero)
        memset(s->data, 0, bytes);
    atomic_init(&s->refcount, 1);
    s->bytes = bytes;
    s->release = NULL;
    s->release_arg = NULL;
    return s;
}

static void storage_unref(tensor_storage_t *s)
{
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1)
        return;
    if (s->release)
        s->release(s->data, s->release_arg);
    else if (s->block)
        zd__block_free(s->data, s->block);
    else
        free(s->data);
    free(s);
}

static zd_tensor_t *tensor_make(zd_tensor_dtype_t dtype, int ndim, const int64_t *shape, bool zero)
{
    int64_t numel;
    if (shape_check(dtype, ndim, shape, &numel) < 0)
        return NULL;
    zd_tensor_t *t = tensor_alloc_header(dtype, ndim, shape, numel);
    if (!t)
        return NULL;
    t->storage = storage_new((size_t)numel * zd_tensor_dtype_size(dtype), zero);
    if (!t->storage) {
        zd_tensor_unref(t);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "tensor: out of memory for %lld elements",
                          (long long)numel);
        return NULL;
    }
    return t;
}

zd_tensor_t *zd_tensor_new(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim)
{
    if (!shape && ndim > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_new: NULL shape");
        return NULL;
    }
    return tensor_make(dtype, ndim, shape, true);
}

zd_tensor_t *zd_tensor_empty(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim)
{
    if (!shape && ndim > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_empty: NULL shape");
        return NULL;
    }
    return tensor_make(dtype, ndim, shape, false);
}

zd_tensor_t *zd_tensor_zeros1(int64_t d0)
{
    return zd_tensor_new(ZD_FLOAT32, (int64_t[]){d0}, 1);
}

zd_tensor_t *zd_tensor_zeros2(int64_t d0, int64_t d1)
{
    return zd_tensor_new(ZD_FLOAT32, (int64_t[]){d0, d1}, 2);
}

zd_tensor_t *zd_tensor_zeros4(int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    return zd_tensor_new(ZD_FLOAT32, (int64_t[]){d0, d1, d2, d3}, 4);
}

zd_tensor_t *zd_tensor_from_data(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim,
                                 const void *data)
{
    if (!shape && ndim > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_from_data: NULL shape");
        return NULL;
    }
    if (!data) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_from_data: NULL data");
        return NULL;
    }
    zd_tensor_t *t = tensor_make(dtype, ndim, shape, false);
    if (t)
        memcpy(zd_tensor_raw(t), data, zd_tensor_nbytes(t));
    return t;
}

zd_tensor_t *zd_tensor_wrap(zd_tensor_dtype_t dtype, const int64_t *shape, int ndim, void *data,
                            size_t bytes, zd_tensor_release_fn *release, void *arg)
{
    if (!shape && ndim > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_wrap: NULL shape");
        return NULL;
    }
    int64_t numel;
    zd_tensor_t *t = NULL;
    tensor_storage_t *s = NULL;
    if (shape_check(dtype, ndim, shape, &numel) < 0)
        goto fail;
    if ((size_t)numel * zd_tensor_dtype_size(dtype) != bytes) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "tensor: %zu bytes do not hold %lld elements of %s",
                          bytes, (long long)numel, zd_tensor_dtype_name(dtype));
        goto fail;
    }
    if (bytes && !data) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_wrap: NULL data");
        goto fail;
    }
    if (bytes && ((uintptr_t)data % zd_tensor_dtype_size(dtype)) != 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "tensor: buffer not aligned for %s",
                          zd_tensor_dtype_name(dtype));
        goto fail;
    }
    s = malloc(sizeof *s);
    t = s ? tensor_alloc_header(dtype, ndim, shape, numel) : NULL;
    if (!t) {
        free(s);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "tensor: out of memory");
        goto fail;
    }
    atomic_init(&s->refcount, 1);
    s->data = data;
    s->bytes = bytes;
    s->release = release;
    s->release_arg = arg;
    s->block = 0;
    t->storage = s;
    return t;
fail:
    if (release)
        release(data, arg);
    return NULL;
}

zd_tensor_t *zd_tensor_ref(zd_tensor_t *t)
{
    if (t)
        atomic_fetch_add(&t->refcount, 1);
    return t;
}

void zd_tensor_unref(zd_tensor_t *t)
{
    if (!t || atomic_fetch_sub(&t->refcount, 1) != 1)
        return;
    storage_unref(t->storage);
    zd_autograd_node_unref(t->grad_fn);
    zd_tensor_unref(t->grad);
    pthread_mutex_destroy(&t->grad_lock);
    free(t->name);
    free(t);
    atomic_fetch_sub(&live_tensors, 1);
}

void zd_tensor_unref_p(zd_tensor_t **t_p)
{
    if (t_p) {
        zd_tensor_unref(*t_p);
        *t_p = NULL;
    }
}

int zd_tensor_ndim(const zd_tensor_t *t)
{
    return t->ndim;
}
const int64_t *zd_tensor_shape(const zd_tensor_t *t)
{
    return t->shape;
}
int64_t zd_tensor_numel(const zd_tensor_t *t)
{
    return t->numel;
}
zd_tensor_dtype_t zd_tensor_dtype(const zd_tensor_t *t)
{
    return t->dtype;
}

size_t zd_tensor_nbytes(const zd_tensor_t *t)
{
    return (size_t)t->numel * zd_tensor_dtype_size(t->dtype);
}

int64_t zd_tensor_size(const zd_tensor_t *t, int dim)
{
    if (dim < 0)
        dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->shape[dim] : 1;
}

bool zd_tensor_same_shape(const zd_tensor_t *a, const zd_tensor_t *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

char *zd_tensor_shape_str(const zd_tensor_t *t, char *buf, size_t size)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "(");
    for (int i = 0; i < t->ndim; i++)
        n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    snprintf(buf + n, n < size ? size - n : 0, ")");
    return buf;
}

void *zd_tensor_raw(const zd_tensor_t *t)
{
    return (char *)t->storage->data + t->offset;
}

float *zd_tensor_data(const zd_tensor_t *t)
{
    return (float *)zd_tensor_raw(t);
}
int64_t *zd_tensor_data_i64(const zd_tensor_t *t)
{
    return (int64_t *)zd_tensor_raw(t);
}

zd_tensor_t *zd_tensor_detach_copy(const zd_tensor_t *t)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_detach_copy: NULL tensor"), NULL;
    return zd_tensor_from_data(t->dtype, t->shape, t->ndim, zd_tensor_raw(t));
}

int zd_tensor_copy_(zd_tensor_t *dst, const zd_tensor_t *src)
{
    if (!dst || !src)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_copy_: NULL tensor");
    if (dst->dtype != src->dtype || dst->numel != src->numel)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_tensor_copy_: %lld %s elements into %lld %s elements",
                                 (long long)src->numel, zd_tensor_dtype_name(src->dtype),
                                 (long long)dst->numel, zd_tensor_dtype_name(dst->dtype));
    memmove(zd_tensor_raw(dst), zd_tensor_raw(src), zd_tensor_nbytes(src));
    return 0;
}

void zd_tensor_fill_(zd_tensor_t *t, float value)
{
    float *d = zd_tensor_data(t);
    for (int64_t i = 0; i < t->numel; i++)
        d[i] = value;
}

void zd_tensor_zero_(zd_tensor_t *t)
{
    memset(zd_tensor_raw(t), 0, zd_tensor_nbytes(t));
}

/*  A view: same storage, new header. */
static zd_tensor_t *tensor_view(zd_tensor_t *t, int ndim, const int64_t *shape)
{
    zd_tensor_t *v = tensor_alloc_header(t->dtype, ndim, shape, t->numel);
    if (!v)
        return NULL;
    atomic_fetch_add(&t->storage->refcount, 1);
    v->storage = t->storage;
    v->offset = t->offset;
    return v;
}

zd_tensor_t *zd_tensor_detach(zd_tensor_t *t)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_detach: NULL tensor"), NULL;
    return tensor_view(t, t->ndim, t->shape);
}

static int reshape_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    /* ctx holds the input's ndim, then its dims. */
    const int64_t *in = zd_autograd_node_ctx(n);
    gin[0] = tensor_view(gout[0], (int)in[0], in + 1);
    return gin[0] ? 0 : -1;
}

static void reshape_release(zd_autograd_node_t *n)
{
    free(zd_autograd_node_ctx(n));
}

static const zd_autograd_node_ops_t reshape_ops =
    ZD_AUTOGRAD_NODE_OPS("ReshapeBackward", reshape_backward, reshape_release);

int zd_tensor_reshape(zd_tensor_t *t, const int64_t *shape, int ndim, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_reshape: NULL out");
    *out = NULL;
    if (!shape && ndim > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_reshape: NULL shape");
    int64_t s[ZD_TENSOR_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    *out = NULL;
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "reshape: NULL tensor");
    if (ndim < 0 || ndim > ZD_TENSOR_MAX_DIMS)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "reshape: %d dimensions", ndim);
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1) {
            if (infer >= 0)
                return zd_error_set_code(ZD_ERR_ARGUMENT, "reshape: only one dimension can be -1");
            infer = i;
        } else if (s[i] < 0) {
            return zd_error_set_code(ZD_ERR_ARGUMENT, "reshape: negative size %lld",
                                     (long long)s[i]);
        } else {
            known *= s[i];
        }
    }
    if (infer >= 0)
        s[infer] = known ? t->numel / known : 0;
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= s[i];
    if (numel != t->numel) {
        char buf[128];
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "reshape: cannot view %s (%lld elements) with %lld elements",
            zd_tensor_shape_str(t, buf, sizeof buf), (long long)t->numel, (long long)numel);
    }
    zd_tensor_t *v = tensor_view(t, ndim, s);
    if (!v)
        return -1;
    zd_autograd_node_t *n;
    if (zd_autograd_node_new(&reshape_ops, &t, 1, 1, &n) < 0) {
        zd_tensor_unref(v);
        return -1;
    }
    if (n) {
        int64_t *in = malloc(sizeof(int64_t) * (ZD_TENSOR_MAX_DIMS + 1));
        if (!in) {
            zd_autograd_node_unref(n);
            zd_tensor_unref(v);
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "reshape: out of memory");
        }
        in[0] = t->ndim;
        memcpy(in + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        zd_autograd_node_set_ctx(n, in);
        zd_autograd_node_set_output(n, v);
        zd_autograd_node_unref(n);
    }
    *out = v;
    return 0;
}

int zd_tensor_set_requires_grad(zd_tensor_t *t, bool requires_grad)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "requires_grad: NULL tensor");
    if (t->dtype != ZD_FLOAT32)
        return zd_error_set_code(
            ZD_ERR_ARGUMENT,
            "requires_grad: only float32 tensors can require gradients (this is %s)",
            zd_tensor_dtype_name(t->dtype));
    if (t->grad_fn)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "requires_grad: can only be changed on leaf tensors");
    t->requires_grad = requires_grad;
    return 0;
}

bool zd_tensor_requires_grad(const zd_tensor_t *t)
{
    return t->requires_grad;
}
bool zd_tensor_is_leaf(const zd_tensor_t *t)
{
    return t->grad_fn == NULL;
}
zd_autograd_node_t *zd_tensor_grad_fn(const zd_tensor_t *t)
{
    return t->grad_fn;
}
int zd_tensor_output_nr(const zd_tensor_t *t)
{
    return t->output_nr;
}
uint64_t zd_tensor_id(const zd_tensor_t *t)
{
    return t->id;
}
int64_t zd_tensor_live_count(void)
{
    return atomic_load(&live_tensors);
}

bool zd_tensor_is_exclusive(const zd_tensor_t *t)
{
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1 &&
        !t->storage->release && !t->grad_fn;
}

zd_tensor_t *zd_tensor_grad(zd_tensor_t *t)
{
    pthread_mutex_lock(&t->grad_lock);
    zd_tensor_t *g = zd_tensor_ref(t->grad);
    pthread_mutex_unlock(&t->grad_lock);
    return g;
}

int zd_tensor_accumulate_grad(zd_tensor_t *t, const zd_tensor_t *g)
{
    if (!t || !g)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "accumulate_grad: NULL %s",
                                 t ? "gradient" : "tensor");
    if (g->numel != t->numel || g->dtype != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "accumulate_grad: gradient of %lld elements for a tensor of %lld",
                                 (long long)g->numel, (long long)t->numel);
    pthread_mutex_lock(&t->grad_lock);
    if (!t->grad && zd_tensor_is_exclusive(g) && zd_tensor_same_shape(g, t)) {
        /* Nobody else can see g: keep it rather than copy 4.8 MB a step. */
        t->grad = zd_tensor_ref((zd_tensor_t *)g);
    } else if (!t->grad) {
        t->grad = zd_tensor_empty(ZD_FLOAT32, t->shape, t->ndim);
        if (!t->grad) {
            pthread_mutex_unlock(&t->grad_lock);
            return -1;
        }
        memcpy(zd_tensor_data(t->grad), zd_tensor_data(g), zd_tensor_nbytes(g));
    } else {
        float *d = zd_tensor_data(t->grad);
        const float *s = zd_tensor_data(g);
        for (int64_t i = 0; i < t->numel; i++)
            d[i] += s[i];
    }
    pthread_mutex_unlock(&t->grad_lock);
    return 0;
}

void zd_tensor_clear_grad(zd_tensor_t *t)
{
    pthread_mutex_lock(&t->grad_lock);
    zd_tensor_t *g = t->grad;
    t->grad = NULL;
    pthread_mutex_unlock(&t->grad_lock);
    zd_tensor_unref(g);
}

int zd_tensor_set_name(zd_tensor_t *t, const char *name)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_set_name: NULL tensor");
    free(t->name);
    /* Callers that name tensors only for messages may go on without one. */
    ZD_FAULT_BENIGN(true);
    t->name = name ? strdup(name) : NULL;
    ZD_FAULT_BENIGN(false);
    if (name && !t->name)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "zd_tensor_set_name: out of memory for "
                                 "the name \"%.64s\"",
                                 name);
    return 0;
}

const char *zd_tensor_name(const zd_tensor_t *t)
{
    return t->name ? t->name : "";
}
