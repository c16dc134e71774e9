/*  ops.c: elementwise arithmetic, reductions and matmul with gradients. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/error.h"

static int check_f32(const char *op, const tensor_t *t)
{
    if (tensor_dtype(t) != TENSOR_F32)
        return error_set("%s: expected float32, got %s", op, tensor_dtype_name(tensor_dtype(t)));
    return 0;
}

static int check_same(const char *op, const tensor_t *a, const tensor_t *b)
{
    if (check_f32(op, a) < 0 || check_f32(op, b) < 0)
        return -1;
    if (!tensor_same_shape(a, b)) {
        char sa[96], sb[96];
        return error_set("%s: shapes %s and %s differ", op, tensor_shape_str(a, sa, sizeof sa),
                         tensor_shape_str(b, sb, sizeof sb));
    }
    return 0;
}

/*  autograd_record with up to two saved tensors. */
static int record(const autograd_node_ops_t *ops, int n_in, tensor_t *const *in, tensor_t *y,
                  tensor_t *save0, tensor_t *save1, void *ctx)
{
    tensor_t *saved[2] = {save0, save1};
    return autograd_record(ops, n_in, in, y, saved, 2, ctx);
}

static void free_ctx(autograd_node_t *n)
{
    free(autograd_node_ctx(n));
}

/* ---- add / sub ---- */

static int add_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    float sign = *(float *)autograd_node_ctx(n);
    if (autograd_node_needs_grad(n, 0))
        gin[0] = tensor_ref(gout[0]);
    if (autograd_node_needs_grad(n, 1)) {
        if (sign == 1.0f) {
            gin[1] = tensor_ref(gout[0]);
        } else {
            gin[1] = tensor_clone(gout[0]);
            if (!gin[1])
                return -1;
            float *d = tensor_data(gin[1]);
            for (int64_t i = 0; i < tensor_numel(gin[1]); i++)
                d[i] = -d[i];
        }
    }
    return 0;
}

static const autograd_node_ops_t add_ops = {"AddBackward", add_backward, free_ctx};

static int add_sub(tensor_t *a, tensor_t *b, float sign, tensor_t **out)
{
    *out = NULL;
    if (check_same(sign > 0 ? "add" : "sub", a, b) < 0)
        return -1;
    tensor_t *y = tensor_empty(TENSOR_F32, tensor_ndim(a), tensor_shape(a));
    if (!y)
        return -1;
    const float *pa = tensor_data(a), *pb = tensor_data(b);
    float *py = tensor_data(y);
    for (int64_t i = 0; i < tensor_numel(a); i++)
        py[i] = pa[i] + sign * pb[i];
    float *ctx = malloc(sizeof *ctx);
    if (!ctx) {
        tensor_unref(y);
        return error_set("add: out of memory");
    }
    *ctx = sign;
    tensor_t *in[2] = {a, b};
    if (record(&add_ops, 2, in, y, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

int tensor_add(tensor_t *a, tensor_t *b, tensor_t **out) { return add_sub(a, b, 1.0f, out); }
int tensor_sub(tensor_t *a, tensor_t *b, tensor_t **out) { return add_sub(a, b, -1.0f, out); }

/* ---- mul ---- */

static int mul_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    for (int j = 0; j < 2; j++) {
        if (!autograd_node_needs_grad(n, j))
            continue;
        tensor_t *other = autograd_node_saved(n, 1 - j);
        gin[j] = tensor_empty(TENSOR_F32, tensor_ndim(other), tensor_shape(other));
        if (!gin[j])
            return -1;
        const float *g = tensor_data(gout[0]), *o = tensor_data(other);
        float *d = tensor_data(gin[j]);
        for (int64_t i = 0; i < tensor_numel(other); i++)
            d[i] = g[i] * o[i];
    }
    return 0;
}

static const autograd_node_ops_t mul_ops = {"MulBackward", mul_backward, NULL};

int tensor_mul(tensor_t *a, tensor_t *b, tensor_t **out)
{
    *out = NULL;
    if (check_same("mul", a, b) < 0)
        return -1;
    tensor_t *y = tensor_empty(TENSOR_F32, tensor_ndim(a), tensor_shape(a));
    if (!y)
        return -1;
    const float *pa = tensor_data(a), *pb = tensor_data(b);
    float *py = tensor_data(y);
    for (int64_t i = 0; i < tensor_numel(a); i++)
        py[i] = pa[i] * pb[i];
    tensor_t *in[2] = {a, b};
    if (record(&mul_ops, 2, in, y, a, b, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- scale ---- */

static int scale_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    float s = *(float *)autograd_node_ctx(n);
    gin[0] = tensor_clone(gout[0]);
    if (!gin[0])
        return -1;
    float *d = tensor_data(gin[0]);
    for (int64_t i = 0; i < tensor_numel(gin[0]); i++)
        d[i] *= s;
    return 0;
}

static const autograd_node_ops_t scale_ops = {"MulScalarBackward", scale_backward, free_ctx};

int tensor_scale(tensor_t *a, float s, tensor_t **out)
{
    *out = NULL;
    if (check_f32("scale", a) < 0)
        return -1;
    tensor_t *y = tensor_empty(TENSOR_F32, tensor_ndim(a), tensor_shape(a));
    float *ctx = malloc(sizeof *ctx);
    if (!y || !ctx) {
        tensor_unref(y);
        free(ctx);
        return error_set("scale: out of memory");
    }
    const float *pa = tensor_data(a);
    float *py = tensor_data(y);
    for (int64_t i = 0; i < tensor_numel(a); i++)
        py[i] = pa[i] * s;
    *ctx = s;
    if (record(&scale_ops, 1, &a, y, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- sum / mean ---- */

static int sum_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const int64_t *in = autograd_node_ctx(n);   /* factor bits, ndim, dims */
    float factor;
    memcpy(&factor, &in[0], sizeof factor);
    gin[0] = tensor_empty(TENSOR_F32, (int)in[1], in + 2);
    if (!gin[0])
        return -1;
    tensor_fill_(gin[0], tensor_data(gout[0])[0] * factor);
    return 0;
}

static const autograd_node_ops_t sum_ops = {"SumBackward", sum_backward, free_ctx};

static int reduce(tensor_t *a, bool mean, tensor_t **out)
{
    *out = NULL;
    if (check_f32(mean ? "mean" : "sum", a) < 0)
        return -1;
    tensor_t *y = tensor_new(TENSOR_F32, 0, NULL);
    int64_t *ctx = calloc(TENSOR_MAX_DIMS + 2, sizeof *ctx);
    if (!y || !ctx) {
        tensor_unref(y);
        free(ctx);
        return error_set("sum: out of memory");
    }
    double acc = 0;
    const float *pa = tensor_data(a);
    for (int64_t i = 0; i < tensor_numel(a); i++)
        acc += pa[i];
    float factor = mean && tensor_numel(a) ? 1.0f / (float)tensor_numel(a) : 1.0f;
    tensor_data(y)[0] = (float)(mean && tensor_numel(a) ? acc / (double)tensor_numel(a) : acc);
    memcpy(&ctx[0], &factor, sizeof factor);
    ctx[1] = tensor_ndim(a);
    memcpy(ctx + 2, tensor_shape(a), sizeof(int64_t) * (size_t)tensor_ndim(a));
    if (record(&sum_ops, 1, &a, y, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

int tensor_sum(tensor_t *a, tensor_t **out) { return reduce(a, false, out); }
int tensor_mean(tensor_t *a, tensor_t **out) { return reduce(a, true, out); }

/* ---- matmul ---- */

static int matmul_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    tensor_t *a = autograd_node_saved(n, 0), *b = autograd_node_saved(n, 1);
    int m = (int)tensor_size(a, 0), k = (int)tensor_size(a, 1), nn = (int)tensor_size(b, 1);
    const float *g = tensor_data(gout[0]);
    if (autograd_node_needs_grad(n, 0)) {   /* dA = dY B^T */
        if (!(gin[0] = tensor_empty(TENSOR_F32, 2, tensor_shape(a))))
            return -1;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, k, nn, 1.0f, g, nn,
                    tensor_data(b), nn, 0.0f, tensor_data(gin[0]), k);
    }
    if (autograd_node_needs_grad(n, 1)) {   /* dB = A^T dY */
        if (!(gin[1] = tensor_empty(TENSOR_F32, 2, tensor_shape(b))))
            return -1;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, nn, m, 1.0f, tensor_data(a), k,
                    g, nn, 0.0f, tensor_data(gin[1]), nn);
    }
    return 0;
}

static const autograd_node_ops_t matmul_ops = {"MmBackward", matmul_backward, NULL};

int tensor_matmul(tensor_t *a, tensor_t *b, tensor_t **out)
{
    *out = NULL;
    if (check_f32("matmul", a) < 0 || check_f32("matmul", b) < 0)
        return -1;
    if (tensor_ndim(a) != 2 || tensor_ndim(b) != 2 || tensor_size(a, 1) != tensor_size(b, 0)) {
        char sa[96], sb[96];
        return error_set("matmul: cannot multiply %s by %s", tensor_shape_str(a, sa, sizeof sa),
                         tensor_shape_str(b, sb, sizeof sb));
    }
    int m = (int)tensor_size(a, 0), k = (int)tensor_size(a, 1), nn = (int)tensor_size(b, 1);
    tensor_t *y = tensor_empty(TENSOR_F32, 2, (int64_t[]){m, nn});
    if (!y)
        return -1;
    if (m && nn)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, nn, k, 1.0f, tensor_data(a), k,
                    tensor_data(b), nn, 0.0f, tensor_data(y), nn);
    if (k == 0)
        tensor_zero_(y);
    tensor_t *in[2] = {a, b};
    if (record(&matmul_ops, 2, in, y, a, b, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- copy ---- */

static int copy_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    (void)n;
    gin[0] = tensor_ref(gout[0]);
    return 0;
}

static const autograd_node_ops_t copy_ops = {"CloneBackward", copy_backward, NULL};

int tensor_copy(tensor_t *a, tensor_t **out)
{
    *out = NULL;
    if (check_f32("copy", a) < 0)
        return -1;
    tensor_t *y = tensor_clone(a);
    if (!y)
        return -1;
    if (record(&copy_ops, 1, &a, y, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- cat ---- */

/*  A tensor viewed as (outer, size along dim, inner). */
static void split_dims(const tensor_t *t, int dim, int64_t *outer, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < dim; d++)
        *outer *= tensor_size(t, d);
    for (int d = dim + 1; d < tensor_ndim(t); d++)
        *inner *= tensor_size(t, d);
}

/*  Both tensors viewed as (outer, size along dim, inner) with the same
    outer and inner: copies positions [src_at, src_at + len) of src along
    dim to [dst_at, dst_at + len) of dst. */
static void copy_along(tensor_t *dst, int64_t dst_at, const tensor_t *src, int64_t src_at,
                       int dim, int64_t len)
{
    int64_t outer, inner;
    split_dims(src, dim, &outer, &inner);
    size_t es = tensor_dtype_size(tensor_dtype(src));
    int64_t nd = tensor_size(dst, dim), ns = tensor_size(src, dim);
    char *d = tensor_raw(dst);
    const char *s = tensor_raw(src);
    for (int64_t o = 0; o < outer; o++)
        memcpy(d + (size_t)((o * nd + dst_at) * inner) * es,
               s + (size_t)((o * ns + src_at) * inner) * es, (size_t)(len * inner) * es);
}

typedef struct {
    int dim;
    int n;
    int64_t sizes[];   /* each input's size along dim */
} cat_ctx_t;

static int cat_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const cat_ctx_t *c = autograd_node_ctx(n);
    int64_t offset = 0;
    for (int j = 0; j < c->n; j++) {
        int64_t sz = c->sizes[j];
        if (autograd_node_needs_grad(n, j)) {
            int64_t shape[TENSOR_MAX_DIMS];
            memcpy(shape, tensor_shape(gout[0]), sizeof(int64_t) * (size_t)tensor_ndim(gout[0]));
            shape[c->dim] = sz;
            if (!(gin[j] = tensor_empty(TENSOR_F32, tensor_ndim(gout[0]), shape)))
                return -1;
            copy_along(gin[j], 0, gout[0], offset, c->dim, sz);
        }
        offset += sz;
    }
    return 0;
}

static const autograd_node_ops_t cat_ops = {"CatBackward", cat_backward, free_ctx};

int tensor_cat(tensor_t *const *ts, int n, int dim, tensor_t **out)
{
    *out = NULL;
    if (n < 1)
        return error_set("cat: no tensors");
    int ndim = tensor_ndim(ts[0]);
    if (dim < 0)
        dim += ndim;
    if (dim < 0 || dim >= ndim)
        return error_set("cat: dimension %d out of range for %d-D tensors", dim, ndim);
    int64_t shape[TENSOR_MAX_DIMS], total = 0;
    memcpy(shape, tensor_shape(ts[0]), sizeof(int64_t) * (size_t)ndim);
    for (int j = 0; j < n; j++) {
        if (check_f32("cat", ts[j]) < 0)
            return -1;
        bool ok = tensor_ndim(ts[j]) == ndim;
        for (int d = 0; ok && d < ndim; d++)
            ok = d == dim || tensor_size(ts[j], d) == shape[d];
        if (!ok) {
            char sa[96], sb[96];
            return error_set("cat: tensor %d has shape %s, which does not fit %s along %d", j,
                             tensor_shape_str(ts[j], sa, sizeof sa),
                             tensor_shape_str(ts[0], sb, sizeof sb), dim);
        }
        total += tensor_size(ts[j], dim);
    }
    shape[dim] = total;
    tensor_t *y = tensor_empty(TENSOR_F32, ndim, shape);
    cat_ctx_t *c = malloc(sizeof *c + sizeof(int64_t) * (size_t)n);
    if (!y || !c) {
        tensor_unref(y);
        free(c);
        return error_set("cat: out of memory");
    }
    c->dim = dim;
    c->n = n;
    int64_t offset = 0;
    for (int j = 0; j < n; j++) {
        int64_t sz = tensor_size(ts[j], dim);
        c->sizes[j] = sz;
        copy_along(y, offset, ts[j], 0, dim, sz);
        offset += sz;
    }
    autograd_node_t *node;
    if (autograd_node_new(&cat_ops, n, ts, 1, &node) < 0) {
        free(c);
        tensor_unref(y);
        return -1;
    }
    if (node) {
        autograd_node_set_ctx(node, c);
        autograd_node_set_output(node, y);
        autograd_node_unref(node);
    } else {
        free(c);
    }
    *out = y;
    return 0;
}

/* ---- narrow ---- */

typedef struct {
    int dim;
    int64_t start;
    int ndim;
    int64_t shape[TENSOR_MAX_DIMS];     /* the input's */
} narrow_ctx_t;

static int narrow_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const narrow_ctx_t *c = autograd_node_ctx(n);
    if (!(gin[0] = tensor_new(TENSOR_F32, c->ndim, c->shape)))
        return -1;
    copy_along(gin[0], c->start, gout[0], 0, c->dim, tensor_size(gout[0], c->dim));
    return 0;
}

static const autograd_node_ops_t narrow_ops = {"NarrowBackward", narrow_backward, free_ctx};

static void release_base(void *data, void *arg)
{
    (void)data;
    tensor_unref(arg);
}

/*  Positions [start, start + length) along dim of t as a tensor of its own
    memory: a view when they are one contiguous block (nothing before dim
    but sizes of 1), else a copy. */
static tensor_t *narrow_data(tensor_t *t, int dim, int64_t start, int64_t length)
{
    int64_t shape[TENSOR_MAX_DIMS], outer, inner;
    int ndim = tensor_ndim(t);
    memcpy(shape, tensor_shape(t), sizeof(int64_t) * (size_t)ndim);
    shape[dim] = length;
    split_dims(t, dim, &outer, &inner);
    if (outer != 1) {
        tensor_t *y = tensor_empty(tensor_dtype(t), ndim, shape);
        if (y)
            copy_along(y, 0, t, start, dim, length);
        return y;
    }
    /* The view keeps the storage alive through a history-free view of t,
       not t itself, so that it does not hold on to t's graph. */
    tensor_t *base = tensor_detach(t);
    if (!base)
        return NULL;
    size_t es = tensor_dtype_size(tensor_dtype(t));
    return tensor_wrap(tensor_dtype(t), ndim, shape, (char *)tensor_raw(t) +
                       (size_t)(start * inner) * es, (size_t)(length * inner) * es,
                       release_base, base);
}

int tensor_narrow(tensor_t *t, int dim, int64_t start, int64_t length, tensor_t **out)
{
    *out = NULL;
    if (!t)
        return error_set("narrow: NULL tensor");
    int ndim = tensor_ndim(t);
    if (ndim == 0)
        return error_set("narrow: a scalar has no dimension to narrow");
    if (dim < -ndim || dim >= ndim)
        return error_set("narrow: dimension %d out of range for a %d-D tensor", dim, ndim);
    if (dim < 0)
        dim += ndim;
    int64_t size = tensor_size(t, dim);
    if (start < 0 && start >= -size)
        start += size;
    if (start < 0 || start > size || length < 0 || length > size - start) {
        char s[96];
        return error_set("narrow: start %lld and length %lld do not fit dimension %d of "
                         "shape %s", (long long)start, (long long)length, dim,
                         tensor_shape_str(t, s, sizeof s));
    }
    tensor_t *y = narrow_data(t, dim, start, length);
    narrow_ctx_t *c = malloc(sizeof *c);
    if (!y || !c) {
        tensor_unref(y);
        free(c);
        return error_set("narrow: out of memory");
    }
    c->dim = dim;
    c->start = start;
    c->ndim = ndim;
    memcpy(c->shape, tensor_shape(t), sizeof(int64_t) * (size_t)ndim);
    if (record(&narrow_ops, 1, &t, y, NULL, NULL, c) < 0)
        return -1;
    *out = y;
    return 0;
}
