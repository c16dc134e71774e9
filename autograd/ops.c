/* SPDX-License-Identifier: MIT */
/*  ops.c: elementwise arithmetic, reductions and matmul with gradients
    (operands of different shapes: broadcast.c). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "autograd/ops_private.h"

static int check_f32(const char *op, const zd_tensor_t *t)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL tensor", op);
    if (zd_tensor_dtype(t) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: expected float32, got %s", op,
                                 zd_tensor_dtype_name(zd_tensor_dtype(t)));
    return 0;
}

/*  Float32 operands; 1 when their shapes differ (broadcast.c's job). */
static int check_pair(const char *op, const zd_tensor_t *a, const zd_tensor_t *b)
{
    if (!a || !b)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL tensor", op);
    if (check_f32(op, a) < 0 || check_f32(op, b) < 0)
        return -1;
    return zd_tensor_same_shape(a, b) ? 0 : 1;
}

/*  zd_autograd_record with up to two saved tensors. */
static int record(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *in, int n_in,
                  zd_tensor_t *y, zd_tensor_t *save0, zd_tensor_t *save1, void *ctx)
{
    zd_tensor_t *saved[2] = {save0, save1};
    return zd_autograd_record(ops, in, n_in, y, saved, 2, ctx);
}

static void free_ctx(zd_autograd_node_t *n)
{
    free(zd_autograd_node_ctx(n));
}

/*  ---- add / sub ---- */

static int add_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    float sign = *(float *)zd_autograd_node_ctx(n);
    if (zd_autograd_node_needs_grad(n, 0))
        gin[0] = zd_tensor_ref(gout[0]);
    if (zd_autograd_node_needs_grad(n, 1)) {
        if (sign == 1.0f) {
            gin[1] = zd_tensor_ref(gout[0]);
        } else {
            gin[1] = zd_tensor_detach_copy(gout[0]);
            if (!gin[1])
                return -1;
            float *d = zd_tensor_data(gin[1]);
            for (int64_t i = 0; i < zd_tensor_numel(gin[1]); i++)
                d[i] = -d[i];
        }
    }
    return 0;
}

static const zd_autograd_node_ops_t add_ops =
    ZD_AUTOGRAD_NODE_OPS("AddBackward", add_backward, free_ctx);

static int add_sub(zd_tensor_t *a, zd_tensor_t *b, float sign, zd_tensor_t **out)
{
    *out = NULL;
    int rc = check_pair(sign > 0 ? "add" : "sub", a, b);
    if (rc != 0)
        return rc < 0 ? -1 : zd__tensor_binary(sign > 0 ? ZD__BIN_ADD : ZD__BIN_SUB, a, b, out);
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(a), zd_tensor_ndim(a));
    if (!y)
        return -1;
    const float *pa = zd_tensor_data(a), *pb = zd_tensor_data(b);
    float *py = zd_tensor_data(y);
    for (int64_t i = 0; i < zd_tensor_numel(a); i++)
        py[i] = pa[i] + sign * pb[i];
    float *ctx = malloc(sizeof *ctx);
    if (!ctx) {
        zd_tensor_unref(y);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "add: out of memory");
    }
    *ctx = sign;
    zd_tensor_t *in[2] = {a, b};
    if (record(&add_ops, in, 2, y, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

int zd_tensor_add(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_add: NULL out");
    return add_sub(a, b, 1.0f, out);
}
int zd_tensor_sub(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_sub: NULL out");
    return add_sub(a, b, -1.0f, out);
}

/*  ---- mul ---- */

static int mul_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    for (int j = 0; j < 2; j++) {
        if (!zd_autograd_node_needs_grad(n, j))
            continue;
        zd_tensor_t *other = zd_autograd_node_saved(n, 1 - j);
        gin[j] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(other), zd_tensor_ndim(other));
        if (!gin[j])
            return -1;
        const float *g = zd_tensor_data(gout[0]), *o = zd_tensor_data(other);
        float *d = zd_tensor_data(gin[j]);
        for (int64_t i = 0; i < zd_tensor_numel(other); i++)
            d[i] = g[i] * o[i];
    }
    return 0;
}

static const zd_autograd_node_ops_t mul_ops =
    ZD_AUTOGRAD_NODE_OPS("MulBackward", mul_backward, NULL);

int zd_tensor_mul(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_mul: NULL out");
    *out = NULL;
    int rc = check_pair("mul", a, b);
    if (rc != 0)
        return rc < 0 ? -1 : zd__tensor_binary(ZD__BIN_MUL, a, b, out);
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(a), zd_tensor_ndim(a));
    if (!y)
        return -1;
    const float *pa = zd_tensor_data(a), *pb = zd_tensor_data(b);
    float *py = zd_tensor_data(y);
    for (int64_t i = 0; i < zd_tensor_numel(a); i++)
        py[i] = pa[i] * pb[i];
    zd_tensor_t *in[2] = {a, b};
    if (record(&mul_ops, in, 2, y, a, b, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- scale ---- */

static int scale_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    float s = *(float *)zd_autograd_node_ctx(n);
    gin[0] = zd_tensor_detach_copy(gout[0]);
    if (!gin[0])
        return -1;
    float *d = zd_tensor_data(gin[0]);
    for (int64_t i = 0; i < zd_tensor_numel(gin[0]); i++)
        d[i] *= s;
    return 0;
}

static const zd_autograd_node_ops_t scale_ops =
    ZD_AUTOGRAD_NODE_OPS("MulScalarBackward", scale_backward, free_ctx);

int zd_tensor_scale(zd_tensor_t *a, float s, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_scale: NULL out");
    *out = NULL;
    if (check_f32("scale", a) < 0)
        return -1;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(a), zd_tensor_ndim(a));
    float *ctx = malloc(sizeof *ctx);
    if (!y || !ctx) {
        zd_tensor_unref(y);
        free(ctx);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "scale: out of memory");
    }
    const float *pa = zd_tensor_data(a);
    float *py = zd_tensor_data(y);
    for (int64_t i = 0; i < zd_tensor_numel(a); i++)
        py[i] = pa[i] * s;
    *ctx = s;
    if (record(&scale_ops, &a, 1, y, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- sum / mean ---- */

static int sum_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const int64_t *in = zd_autograd_node_ctx(n); /* factor bits, ndim, dims */
    float factor;
    memcpy(&factor, &in[0], sizeof factor);
    gin[0] = zd_tensor_empty(ZD_FLOAT32, in + 2, (int)in[1]);
    if (!gin[0])
        return -1;
    zd_tensor_fill_(gin[0], zd_tensor_data(gout[0])[0] * factor);
    return 0;
}

static const zd_autograd_node_ops_t sum_ops =
    ZD_AUTOGRAD_NODE_OPS("SumBackward", sum_backward, free_ctx);

static int reduce(zd_tensor_t *a, bool mean, zd_tensor_t **out)
{
    *out = NULL;
    if (check_f32(mean ? "mean" : "sum", a) < 0)
        return -1;
    zd_tensor_t *y = zd_tensor_new(ZD_FLOAT32, NULL, 0);
    int64_t *ctx = calloc(ZD_TENSOR_MAX_DIMS + 2, sizeof *ctx);
    if (!y || !ctx) {
        zd_tensor_unref(y);
        free(ctx);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "sum: out of memory");
    }
    double acc = 0;
    const float *pa = zd_tensor_data(a);
    for (int64_t i = 0; i < zd_tensor_numel(a); i++)
        acc += pa[i];
    float factor = mean && zd_tensor_numel(a) ? 1.0f / (float)zd_tensor_numel(a) : 1.0f;
    zd_tensor_data(y)[0] =
        (float)(mean && zd_tensor_numel(a) ? acc / (double)zd_tensor_numel(a) : acc);
    memcpy(&ctx[0], &factor, sizeof factor);
    ctx[1] = zd_tensor_ndim(a);
    memcpy(ctx + 2, zd_tensor_shape(a), sizeof(int64_t) * (size_t)zd_tensor_ndim(a));
    if (record(&sum_ops, &a, 1, y, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

int zd_tensor_sum(zd_tensor_t *a, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_sum: NULL out");
    return reduce(a, false, out);
}
int zd_tensor_mean(zd_tensor_t *a, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_mean: NULL out");
    return reduce(a, true, out);
}

/*  ---- matmul ---- */

static int matmul_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *a = zd_autograd_node_saved(n, 0), *b = zd_autograd_node_saved(n, 1);
    int m = (int)zd_tensor_size(a, 0), k = (int)zd_tensor_size(a, 1),
        nn = (int)zd_tensor_size(b, 1);
    const float *g = zd_tensor_data(gout[0]);
    if (zd_autograd_node_needs_grad(n, 0)) { /* dA = dY B^T */
        if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(a), 2)))
            return -1;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, k, nn, 1.0f, g, nn,
                    zd_tensor_data(b), nn, 0.0f, zd_tensor_data(gin[0]), k);
    }
    if (zd_autograd_node_needs_grad(n, 1)) { /* dB = A^T dY */
        if (!(gin[1] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(b), 2)))
            return -1;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, nn, m, 1.0f, zd_tensor_data(a), k,
                    g, nn, 0.0f, zd_tensor_data(gin[1]), nn);
    }
    return 0;
}

static const zd_autograd_node_ops_t matmul_ops =
    ZD_AUTOGRAD_NODE_OPS("MmBackward", matmul_backward, NULL);

int zd_tensor_matmul(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_matmul: NULL out");
    *out = NULL;
    if (check_f32("matmul", a) < 0 || check_f32("matmul", b) < 0)
        return -1;
    if (zd_tensor_ndim(a) != 2 || zd_tensor_ndim(b) != 2 ||
        zd_tensor_size(a, 1) != zd_tensor_size(b, 0)) {
        char sa[96], sb[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT, "matmul: cannot multiply %s by %s",
                                 zd_tensor_shape_str(a, sa, sizeof sa),
                                 zd_tensor_shape_str(b, sb, sizeof sb));
    }
    int m = (int)zd_tensor_size(a, 0), k = (int)zd_tensor_size(a, 1),
        nn = (int)zd_tensor_size(b, 1);
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){m, nn}, 2);
    if (!y)
        return -1;
    if (m && nn)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, nn, k, 1.0f, zd_tensor_data(a), k,
                    zd_tensor_data(b), nn, 0.0f, zd_tensor_data(y), nn);
    if (k == 0)
        zd_tensor_zero_(y);
    zd_tensor_t *in[2] = {a, b};
    if (record(&matmul_ops, in, 2, y, a, b, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- copy ---- */

static int copy_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    (void)n;
    gin[0] = zd_tensor_ref(gout[0]);
    return 0;
}

static const zd_autograd_node_ops_t copy_ops =
    ZD_AUTOGRAD_NODE_OPS("CloneBackward", copy_backward, NULL);

int zd_tensor_clone(zd_tensor_t *a, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_clone: NULL out");
    *out = NULL;
    if (check_f32("copy", a) < 0)
        return -1;
    zd_tensor_t *y = zd_tensor_detach_copy(a);
    if (!y)
        return -1;
    if (record(&copy_ops, &a, 1, y, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- cat ---- */

/*  A tensor viewed as (outer, size along dim, inner). */
static void split_dims(const zd_tensor_t *t, int dim, int64_t *outer, int64_t *inner)
{
    *outer = *inner = 1;
    for (int d = 0; d < dim; d++)
        *outer *= zd_tensor_size(t, d);
    for (int d = dim + 1; d < zd_tensor_ndim(t); d++)
        *inner *= zd_tensor_size(t, d);
}

/*  Both tensors viewed as (outer, size along dim, inner) with the same
    outer and inner: copies positions [src_at, src_at + len) of src along
    dim to [dst_at, dst_at + len) of dst. */
static void copy_along(zd_tensor_t *dst, int64_t dst_at, const zd_tensor_t *src, int64_t src_at,
                       int dim, int64_t len)
{
    int64_t outer, inner;
    split_dims(src, dim, &outer, &inner);
    size_t es = zd_tensor_dtype_size(zd_tensor_dtype(src));
    int64_t nd = zd_tensor_size(dst, dim), ns = zd_tensor_size(src, dim);
    char *d = zd_tensor_raw(dst);
    const char *s = zd_tensor_raw(src);
    for (int64_t o = 0; o < outer; o++)
        memcpy(d + (size_t)((o * nd + dst_at) * inner) * es,
               s + (size_t)((o * ns + src_at) * inner) * es, (size_t)(len * inner) * es);
}

typedef struct {
    int dim;
    int n;
    int64_t sizes[]; /* each input's size along dim */
} cat_ctx_t;

static int cat_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const cat_ctx_t *c = zd_autograd_node_ctx(n);
    int64_t offset = 0;
    for (int j = 0; j < c->n; j++) {
        int64_t sz = c->sizes[j];
        if (zd_autograd_node_needs_grad(n, j)) {
            int64_t shape[ZD_TENSOR_MAX_DIMS];
            memcpy(shape, zd_tensor_shape(gout[0]),
                   sizeof(int64_t) * (size_t)zd_tensor_ndim(gout[0]));
            shape[c->dim] = sz;
            if (!(gin[j] = zd_tensor_empty(ZD_FLOAT32, shape, zd_tensor_ndim(gout[0]))))
                return -1;
            copy_along(gin[j], 0, gout[0], offset, c->dim, sz);
        }
        offset += sz;
    }
    return 0;
}

static const zd_autograd_node_ops_t cat_ops =
    ZD_AUTOGRAD_NODE_OPS("CatBackward", cat_backward, free_ctx);

int zd_tensor_cat(zd_tensor_t *const *ts, int n, int dim, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_cat: NULL out");
    *out = NULL;
    if (n < 1 || !ts)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "cat: no tensors");
    if (check_f32("cat", ts[0]) < 0)
        return -1;
    int ndim = zd_tensor_ndim(ts[0]);
    if (dim < 0)
        dim += ndim;
    if (dim < 0 || dim >= ndim)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "cat: dimension %d out of range for %d-D tensors",
                                 dim, ndim);
    int64_t shape[ZD_TENSOR_MAX_DIMS], total = 0;
    memcpy(shape, zd_tensor_shape(ts[0]), sizeof(int64_t) * (size_t)ndim);
    for (int j = 0; j < n; j++) {
        if (check_f32("cat", ts[j]) < 0)
            return -1;
        bool ok = zd_tensor_ndim(ts[j]) == ndim;
        for (int d = 0; ok && d < ndim; d++)
            ok = d == dim || zd_tensor_size(ts[j], d) == shape[d];
        if (!ok) {
            char sa[96], sb[96];
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "cat: tensor %d has shape %s, which does not fit %s along %d",
                                     j, zd_tensor_shape_str(ts[j], sa, sizeof sa),
                                     zd_tensor_shape_str(ts[0], sb, sizeof sb), dim);
        }
        total += zd_tensor_size(ts[j], dim);
    }
    shape[dim] = total;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    cat_ctx_t *c = malloc(sizeof *c + sizeof(int64_t) * (size_t)n);
    if (!y || !c) {
        zd_tensor_unref(y);
        free(c);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "cat: out of memory");
    }
    c->dim = dim;
    c->n = n;
    int64_t offset = 0;
    for (int j = 0; j < n; j++) {
        int64_t sz = zd_tensor_size(ts[j], dim);
        c->sizes[j] = sz;
        copy_along(y, offset, ts[j], 0, dim, sz);
        offset += sz;
    }
    zd_autograd_node_t *node;
    if (zd_autograd_node_new(&cat_ops, ts, n, 1, &node) < 0) {
        free(c);
        zd_tensor_unref(y);
        return -1;
    }
    if (node) {
        zd_autograd_node_set_ctx(node, c);
        zd_autograd_node_set_output(node, y);
        zd_autograd_node_unref(node);
    } else {
        free(c);
    }
    *out = y;
    return 0;
}

/*  ---- narrow ---- */

typedef struct {
    int dim;
    int64_t start;
    int ndim;
    int64_t shape[ZD_TENSOR_MAX_DIMS]; /* the input's */
} narrow_ctx_t;

static int narrow_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const narrow_ctx_t *c = zd_autograd_node_ctx(n);
    if (!(gin[0] = zd_tensor_new(ZD_FLOAT32, c->shape, c->ndim)))
        return -1;
    copy_along(gin[0], c->start, gout[0], 0, c->dim, zd_tensor_size(gout[0], c->dim));
    return 0;
}

static const zd_autograd_node_ops_t narrow_ops =
    ZD_AUTOGRAD_NODE_OPS("NarrowBackward", narrow_backward, free_ctx);

static void release_base(void *data, void *arg)
{
    (void)data;
    zd_tensor_unref(arg);
}

/*  Positions [start, start + length) along dim of t as a tensor of its own
    memory: a view when they are one contiguous block (nothing before dim
    but sizes of 1), else a copy. */
static zd_tensor_t *narrow_data(zd_tensor_t *t, int dim, int64_t start, int64_t length)
{
    int64_t shape[ZD_TENSOR_MAX_DIMS], outer, inner;
    int ndim = zd_tensor_ndim(t);
    memcpy(shape, zd_tensor_shape(t), sizeof(int64_t) * (size_t)ndim);
    shape[dim] = length;
    split_dims(t, dim, &outer, &inner);
    if (outer != 1) {
        zd_tensor_t *y = zd_tensor_empty(zd_tensor_dtype(t), shape, ndim);
        if (y)
            copy_along(y, 0, t, start, dim, length);
        return y;
    }
    /* The view keeps the storage alive through a history-free view of t,
       not t itself, so that it does not hold on to t's graph. */
    zd_tensor_t *base = zd_tensor_detach(t);
    if (!base)
        return NULL;
    size_t es = zd_tensor_dtype_size(zd_tensor_dtype(t));
    return zd_tensor_wrap(zd_tensor_dtype(t), shape, ndim,
                          (char *)zd_tensor_raw(t) + (size_t)(start * inner) * es,
                          (size_t)(length * inner) * es, release_base, base);
}

int zd_tensor_narrow(zd_tensor_t *t, int dim, int64_t start, int64_t length, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_narrow: NULL out");
    *out = NULL;
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "narrow: NULL tensor");
    int ndim = zd_tensor_ndim(t);
    if (ndim == 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "narrow: a scalar has no dimension to narrow");
    if (dim < -ndim || dim >= ndim)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "narrow: dimension %d out of range for a %d-D tensor", dim, ndim);
    if (dim < 0)
        dim += ndim;
    int64_t size = zd_tensor_size(t, dim);
    if (start < 0 && start >= -size)
        start += size;
    if (start < 0 || start > size || length < 0 || length > size - start) {
        char s[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "narrow: start %lld and length %lld do not fit dimension %d of "
                                 "shape %s",
                                 (long long)start, (long long)length, dim,
                                 zd_tensor_shape_str(t, s, sizeof s));
    }
    zd_tensor_t *y = narrow_data(t, dim, start, length);
    narrow_ctx_t *c = malloc(sizeof *c);
    if (!y || !c) {
        zd_tensor_unref(y);
        free(c);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "narrow: out of memory");
    }
    c->dim = dim;
    c->start = start;
    c->ndim = ndim;
    memcpy(c->shape, zd_tensor_shape(t), sizeof(int64_t) * (size_t)ndim);
    if (record(&narrow_ops, &t, 1, y, NULL, NULL, c) < 0)
        return -1;
    *out = y;
    return 0;
}
