/*  tensor.c: storage, shape and reference counting of tensors. */
#include "autograd/autograd_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/error.h"

/* 64-byte alignment keeps sgemm on its fast path and suits AVX-512 loads. */
#define TENSOR_ALIGN 64

static atomic_uint_fast64_t next_tensor_id = 1;
static atomic_int_fast64_t live_tensors = 0;

size_t tensor_dtype_size(tensor_dtype_t dtype)
{
    switch (dtype) {
    case TENSOR_F32: return 4;
    case TENSOR_I64: return 8;
    case TENSOR_U8:  return 1;
    }
    return 0;
}

const char *tensor_dtype_name(tensor_dtype_t dtype)
{
    switch (dtype) {
    case TENSOR_F32: return "float32";
    case TENSOR_I64: return "int64";
    case TENSOR_U8:  return "uint8";
    }
    return "?";
}

static int shape_check(tensor_dtype_t dtype, int ndim, const int64_t *shape, int64_t *numel)
{
    if (tensor_dtype_size(dtype) == 0)
        return error_set("tensor: unknown dtype %d", (int)dtype);
    if (ndim < 0 || ndim > TENSOR_MAX_DIMS)
        return error_set("tensor: %d dimensions (0 to %d allowed)", ndim, TENSOR_MAX_DIMS);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return error_set("tensor: negative size %lld in dimension %d",
                             (long long)shape[i], i);
        if (shape[i] > 0 && n > INT64_MAX / 16 / shape[i])
            return error_set("tensor: shape too large");
        n *= shape[i];
    }
    *numel = n;
    return 0;
}

static tensor_t *tensor_alloc_header(tensor_dtype_t dtype, int ndim, const int64_t *shape,
                                     int64_t numel)
{
    tensor_t *t = calloc(1, sizeof *t);
    if (!t) {
        error_set("tensor: out of memory");
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
    s->data = aligned_alloc(TENSOR_ALIGN, alloc ? alloc : TENSOR_ALIGN);
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
    else
        free(s->data);
    free(s);
}

static tensor_t *tensor_make(tensor_dtype_t dtype, int ndim, const int64_t *shape, bool zero)
{
    int64_t numel;
    if (shape_check(dtype, ndim, shape, &numel) < 0)
        return NULL;
    tensor_t *t = tensor_alloc_header(dtype, ndim, shape, numel);
    if (!t)
        return NULL;
    t->storage = storage_new((size_t)numel * tensor_dtype_size(dtype), zero);
    if (!t->storage) {
        tensor_unref(t);
        error_set("tensor: out of memory for %lld elements", (long long)numel);
        return NULL;
    }
    return t;
}

tensor_t *tensor_new(tensor_dtype_t dtype, int ndim, const int64_t *shape)
{
    return tensor_make(dtype, ndim, shape, true);
}

tensor_t *tensor_empty(tensor_dtype_t dtype, int ndim, const int64_t *shape)
{
    return tensor_make(dtype, ndim, shape, false);
}

tensor_t *tensor_zeros1(int64_t d0)
{
    return tensor_new(TENSOR_F32, 1, (int64_t[]){d0});
}

tensor_t *tensor_zeros2(int64_t d0, int64_t d1)
{
    return tensor_new(TENSOR_F32, 2, (int64_t[]){d0, d1});
}

tensor_t *tensor_zeros4(int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    return tensor_new(TENSOR_F32, 4, (int64_t[]){d0, d1, d2, d3});
}

tensor_t *tensor_from_data(tensor_dtype_t dtype, int ndim, const int64_t *shape,
                           const void *data)
{
    tensor_t *t = tensor_make(dtype, ndim, shape, false);
    if (t)
        memcpy(tensor_raw(t), data, tensor_nbytes(t));
    return t;
}

tensor_t *tensor_wrap(tensor_dtype_t dtype, int ndim, const int64_t *shape,
                      void *data, size_t bytes, tensor_release_fn *release, void *arg)
{
    int64_t numel;
    tensor_t *t = NULL;
    tensor_storage_t *s = NULL;
    if (shape_check(dtype, ndim, shape, &numel) < 0)
        goto fail;
    if ((size_t)numel * tensor_dtype_size(dtype) != bytes) {
        error_set("tensor: %zu bytes do not hold %lld elements of %s", bytes,
                  (long long)numel, tensor_dtype_name(dtype));
        goto fail;
    }
    if (bytes && ((uintptr_t)data % tensor_dtype_size(dtype)) != 0) {
        error_set("tensor: buffer not aligned for %s", tensor_dtype_name(dtype));
        goto fail;
    }
    s = malloc(sizeof *s);
    t = s ? tensor_alloc_header(dtype, ndim, shape, numel) : NULL;
    if (!t) {
        free(s);
        error_set("tensor: out of memory");
        goto fail;
    }
    atomic_init(&s->refcount, 1);
    s->data = data;
    s->bytes = bytes;
    s->release = release;
    s->release_arg = arg;
    t->storage = s;
    return t;
fail:
    if (release)
        release(data, arg);
    return NULL;
}

tensor_t *tensor_ref(tensor_t *t)
{
    if (t)
        atomic_fetch_add(&t->refcount, 1);
    return t;
}

void tensor_unref(tensor_t *t)
{
    if (!t || atomic_fetch_sub(&t->refcount, 1) != 1)
        return;
    storage_unref(t->storage);
    autograd_node_unref(t->grad_fn);
    tensor_unref(t->grad);
    pthread_mutex_destroy(&t->grad_lock);
    free(t->name);
    free(t);
    atomic_fetch_sub(&live_tensors, 1);
}

void tensor_unref_p(tensor_t **t_p)
{
    if (t_p) {
        tensor_unref(*t_p);
        *t_p = NULL;
    }
}

int tensor_ndim(const tensor_t *t) { return t->ndim; }
const int64_t *tensor_shape(const tensor_t *t) { return t->shape; }
int64_t tensor_numel(const tensor_t *t) { return t->numel; }
tensor_dtype_t tensor_dtype(const tensor_t *t) { return t->dtype; }

size_t tensor_nbytes(const tensor_t *t)
{
    return (size_t)t->numel * tensor_dtype_size(t->dtype);
}

int64_t tensor_size(const tensor_t *t, int dim)
{
    if (dim < 0)
        dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->shape[dim] : 1;
}

bool tensor_same_shape(const tensor_t *a, const tensor_t *b)
{
    if (a->ndim != b->ndim)
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

char *tensor_shape_str(const tensor_t *t, char *buf, size_t size)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "(");
    for (int i = 0; i < t->ndim; i++)
        n += (size_t)snprintf(buf + n, n < size ? size - n : 0, "%s%lld", i ? ", " : "",
                              (long long)t->shape[i]);
    snprintf(buf + n, n < size ? size - n : 0, ")");
    return buf;
}

void *tensor_raw(const tensor_t *t)
{
    return (char *)t->storage->data + t->offset;
}

float *tensor_data(const tensor_t *t) { return (float *)tensor_raw(t); }
int64_t *tensor_data_i64(const tensor_t *t) { return (int64_t *)tensor_raw(t); }

tensor_t *tensor_clone(const tensor_t *t)
{
    return tensor_from_data(t->dtype, t->ndim, t->shape, tensor_raw(t));
}

int tensor_copy_(tensor_t *dst, const tensor_t *src)
{
    if (dst->dtype != src->dtype || dst->numel != src->numel)
        return error_set("tensor_copy_: %lld %s elements into %lld %s elements",
                         (long long)src->numel, tensor_dtype_name(src->dtype),
                         (long long)dst->numel, tensor_dtype_name(dst->dtype));
    memmove(tensor_raw(dst), tensor_raw(src), tensor_nbytes(src));
    return 0;
}

void tensor_fill_(tensor_t *t, float value)
{
    float *d = tensor_data(t);
    for (int64_t i = 0; i < t->numel; i++)
        d[i] = value;
}

void tensor_zero_(tensor_t *t)
{
    memset(tensor_raw(t), 0, tensor_nbytes(t));
}

/*  A view: same storage, new header. */
static tensor_t *tensor_view(tensor_t *t, int ndim, const int64_t *shape)
{
    tensor_t *v = tensor_alloc_header(t->dtype, ndim, shape, t->numel);
    if (!v)
        return NULL;
    atomic_fetch_add(&t->storage->refcount, 1);
    v->storage = t->storage;
    v->offset = t->offset;
    return v;
}

tensor_t *tensor_detach(tensor_t *t)
{
    return tensor_view(t, t->ndim, t->shape);
}

static int reshape_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    /* ctx holds the input's ndim, then its dims. */
    const int64_t *in = autograd_node_ctx(n);
    gin[0] = tensor_view(gout[0], (int)in[0], in + 1);
    return gin[0] ? 0 : -1;
}

static void reshape_release(autograd_node_t *n)
{
    free(autograd_node_ctx(n));
}

static const autograd_node_ops_t reshape_ops = {"ReshapeBackward", reshape_backward,
                                                reshape_release};

int tensor_reshape(tensor_t *t, int ndim, const int64_t *shape, tensor_t **out)
{
    int64_t s[TENSOR_MAX_DIMS];
    int infer = -1;
    int64_t known = 1;
    *out = NULL;
    if (ndim < 0 || ndim > TENSOR_MAX_DIMS)
        return error_set("reshape: %d dimensions", ndim);
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1) {
            if (infer >= 0)
                return error_set("reshape: only one dimension can be -1");
            infer = i;
        } else if (s[i] < 0) {
            return error_set("reshape: negative size %lld", (long long)s[i]);
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
        return error_set("reshape: cannot view %s (%lld elements) with %lld elements",
                         tensor_shape_str(t, buf, sizeof buf), (long long)t->numel,
                         (long long)numel);
    }
    tensor_t *v = tensor_view(t, ndim, s);
    if (!v)
        return -1;
    autograd_node_t *n;
    if (autograd_node_new(&reshape_ops, 1, &t, 1, &n) < 0) {
        tensor_unref(v);
        return -1;
    }
    if (n) {
        int64_t *in = malloc(sizeof(int64_t) * (TENSOR_MAX_DIMS + 1));
        if (!in) {
            autograd_node_unref(n);
            tensor_unref(v);
            return error_set("reshape: out of memory");
        }
        in[0] = t->ndim;
        memcpy(in + 1, t->shape, sizeof(int64_t) * (size_t)t->ndim);
        autograd_node_set_ctx(n, in);
        autograd_node_set_output(n, v);
        autograd_node_unref(n);
    }
    *out = v;
    return 0;
}

int tensor_set_requires_grad(tensor_t *t, bool requires_grad)
{
    if (t->dtype != TENSOR_F32)
        return error_set("requires_grad: only float32 tensors can require gradients (this is %s)",
                         tensor_dtype_name(t->dtype));
    if (t->grad_fn)
        return error_set("requires_grad: can only be changed on leaf tensors");
    t->requires_grad = requires_grad;
    return 0;
}

bool tensor_requires_grad(const tensor_t *t) { return t->requires_grad; }
bool tensor_is_leaf(const tensor_t *t) { return t->grad_fn == NULL; }
autograd_node_t *tensor_grad_fn(const tensor_t *t) { return t->grad_fn; }
int tensor_output_nr(const tensor_t *t) { return t->output_nr; }
uint64_t tensor_id(const tensor_t *t) { return t->id; }
int64_t tensor_live_count(void) { return atomic_load(&live_tensors); }

bool tensor_is_exclusive(const tensor_t *t)
{
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1 &&
           !t->storage->release && !t->grad_fn;
}

tensor_t *tensor_grad(tensor_t *t)
{
    pthread_mutex_lock(&t->grad_lock);
    tensor_t *g = tensor_ref(t->grad);
    pthread_mutex_unlock(&t->grad_lock);
    return g;
}

int tensor_accumulate_grad(tensor_t *t, const tensor_t *g)
{
    if (g->numel != t->numel || g->dtype != TENSOR_F32)
        return error_set("accumulate_grad: gradient of %lld elements for a tensor of %lld",
                         (long long)g->numel, (long long)t->numel);
    pthread_mutex_lock(&t->grad_lock);
    if (!t->grad && tensor_is_exclusive(g) && tensor_same_shape(g, t)) {
        /* Nobody else can see g: keep it rather than copy 4.8 MB a step. */
        t->grad = tensor_ref((tensor_t *)g);
    } else if (!t->grad) {
        t->grad = tensor_empty(TENSOR_F32, t->ndim, t->shape);
        if (!t->grad) {
            pthread_mutex_unlock(&t->grad_lock);
            return -1;
        }
        memcpy(tensor_data(t->grad), tensor_data(g), tensor_nbytes(g));
    } else {
        float *d = tensor_data(t->grad);
        const float *s = tensor_data(g);
        for (int64_t i = 0; i < t->numel; i++)
            d[i] += s[i];
    }
    pthread_mutex_unlock(&t->grad_lock);
    return 0;
}

void tensor_clear_grad(tensor_t *t)
{
    pthread_mutex_lock(&t->grad_lock);
    tensor_t *g = t->grad;
    t->grad = NULL;
    pthread_mutex_unlock(&t->grad_lock);
    tensor_unref(g);
}

void tensor_set_name(tensor_t *t, const char *name)
{
    free(t->name);
    t->name = name ? strdup(name) : NULL;
}

const char *tensor_name(const tensor_t *t)
{
    return t->name ? t->name : "";
}
