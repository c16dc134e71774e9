/* SPDX-License-Identifier: MIT */
/*  broadcast.c: element-wise add, sub, mul and div between tensors of
    different shapes (NumPy's broadcasting), and div itself. ops.c keeps the
    plain loops for equal shapes and comes here for the rest.

    Each input is read through strides over the result's index, 0 along the
    dimensions it is broadcast on; the backward pass walks the same index
    and adds into the input's gradient through the same strides, which sums
    the gradient over the broadcast dimensions (PyTorch's sum_to_size). */
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "autograd/ops_private.h"

typedef struct {
    zd__bin_op_t op;
    int ndim; /* the result's */
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    int64_t sa[ZD_TENSOR_MAX_DIMS]; /* a's stride per result dimension */
    int64_t sb[ZD_TENSOR_MAX_DIMS];
    int a_ndim, b_ndim;
    int64_t a_shape[ZD_TENSOR_MAX_DIMS], b_shape[ZD_TENSOR_MAX_DIMS];
} bcast_t;

static const char *op_name(zd__bin_op_t op)
{
    static const char *names[] = {"add", "sub", "mul", "div"};
    return names[op];
}

/*  Strides of t (ndim, shape) over a result of nd dimensions: t's
    dimensions align with the result's last ones; size-1 ones repeat. */
static void strides_for(int nd, const int64_t *out_shape, int ndim, const int64_t *shape,
                        int64_t *strides)
{
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int k = d - (nd - ndim);
        if (k < 0) {
            strides[d] = 0;
            continue;
        }
        strides[d] = shape[k] == 1 && out_shape[d] != 1 ? 0 : s;
        s *= shape[k];
    }
}

static int bcast_plan(zd__bin_op_t op, const zd_tensor_t *a, const zd_tensor_t *b, bcast_t *bc)
{
    memset(bc, 0, sizeof *bc);
    bc->op = op;
    bc->a_ndim = zd_tensor_ndim(a);
    bc->b_ndim = zd_tensor_ndim(b);
    memcpy(bc->a_shape, zd_tensor_shape(a), sizeof(int64_t) * (size_t)bc->a_ndim);
    memcpy(bc->b_shape, zd_tensor_shape(b), sizeof(int64_t) * (size_t)bc->b_ndim);
    bc->ndim = bc->a_ndim > bc->b_ndim ? bc->a_ndim : bc->b_ndim;
    for (int d = 0; d < bc->ndim; d++) {
        int ka = d - (bc->ndim - bc->a_ndim), kb = d - (bc->ndim - bc->b_ndim);
        int64_t sa = ka >= 0 ? bc->a_shape[ka] : 1, sb = kb >= 0 ? bc->b_shape[kb] : 1;
        if (sa != sb && sa != 1 && sb != 1) {
            char s1[96], s2[96];
            return zd_error_set_code(
                ZD_ERR_ARGUMENT,
                "%s: shapes %s and %s do not broadcast (dimension %d: %lld and "
                "%lld)",
                op_name(op), zd_tensor_shape_str(a, s1, sizeof s1),
                zd_tensor_shape_str(b, s2, sizeof s2), d, (long long)sa, (long long)sb);
        }
        bc->shape[d] = sa == 1 ? sb : sa;
    }
    strides_for(bc->ndim, bc->shape, bc->a_ndim, bc->a_shape, bc->sa);
    strides_for(bc->ndim, bc->shape, bc->b_ndim, bc->b_shape, bc->sb);
    return 0;
}

/*  What one walk over the result's index does at each position i (a and b
    at their broadcast positions ia, ib; g the result's gradient). */
typedef enum {
    K_ADD,
    K_SUB,
    K_MUL,
    K_DIV, /* o[i] = a[ia] op b[ib] */
    K_GA,
    K_GA_MUL,
    K_GA_DIV, /* o[ia] += g[i] * d(result)/da */
    K_GB,
    K_GB_NEG,
    K_GB_MUL,
    K_GB_DIV, /* o[ib] += g[i] * d(result)/db */
} kernel_t;

static void walk(const bcast_t *bc, kernel_t k, const float *a, const float *b, const float *g,
                 float *o)
{
    const int nd = bc->ndim;
    const int64_t n = nd ? bc->shape[nd - 1] : 1;
    const int64_t da = nd ? bc->sa[nd - 1] : 0, db = nd ? bc->sb[nd - 1] : 0;
    int64_t rows = 1;
    for (int d = 0; d + 1 < nd; d++)
        rows *= bc->shape[d];
    if (n == 0)
        return;
    int64_t idx[ZD_TENSOR_MAX_DIMS] = {0}, oa = 0, ob = 0;
    for (int64_t r = 0; r < rows; r++) {
        const int64_t i0 = r * n;
        switch (k) {
        case K_ADD:
            for (int64_t j = 0; j < n; j++)
                o[i0 + j] = a[oa + j * da] + b[ob + j * db];
            break;
        case K_SUB:
            for (int64_t j = 0; j < n; j++)
                o[i0 + j] = a[oa + j * da] - b[ob + j * db];
            break;
        case K_MUL:
            for (int64_t j = 0; j < n; j++)
                o[i0 + j] = a[oa + j * da] * b[ob + j * db];
            break;
        case K_DIV:
            for (int64_t j = 0; j < n; j++)
                o[i0 + j] = a[oa + j * da] / b[ob + j * db];
            break;
        case K_GA:
            for (int64_t j = 0; j < n; j++)
                o[oa + j * da] += g[i0 + j];
            break;
        case K_GA_MUL:
            for (int64_t j = 0; j < n; j++)
                o[oa + j * da] += g[i0 + j] * b[ob + j * db];
            break;
        case K_GA_DIV:
            for (int64_t j = 0; j < n; j++)
                o[oa + j * da] += g[i0 + j] / b[ob + j * db];
            break;
        case K_GB:
            for (int64_t j = 0; j < n; j++)
                o[ob + j * db] += g[i0 + j];
            break;
        case K_GB_NEG:
            for (int64_t j = 0; j < n; j++)
                o[ob + j * db] -= g[i0 + j];
            break;
        case K_GB_MUL:
            for (int64_t j = 0; j < n; j++)
                o[ob + j * db] += g[i0 + j] * a[oa + j * da];
            break;
        case K_GB_DIV:
            for (int64_t j = 0; j < n; j++) {
                float bv = b[ob + j * db];
                o[ob + j * db] -= g[i0 + j] * a[oa + j * da] / (bv * bv);
            }
            break;
        }
        for (int d = nd - 2; d >= 0; d--) { /* next row: an odometer over the outer dims */
            oa += bc->sa[d];
            ob += bc->sb[d];
            if (++idx[d] < bc->shape[d])
                break;
            oa -= bc->sa[d] * bc->shape[d];
            ob -= bc->sb[d] * bc->shape[d];
            idx[d] = 0;
        }
    }
}

static int binary_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const bcast_t *bc = zd_autograd_node_ctx(n);
    zd_tensor_t *a = zd_autograd_node_saved(n, 0), *b = zd_autograd_node_saved(n, 1);
    const float *pa = a ? zd_tensor_data(a) : NULL, *pb = b ? zd_tensor_data(b) : NULL;
    const float *g = zd_tensor_data(gout[0]);
    static const kernel_t ka[] = {K_GA, K_GA, K_GA_MUL, K_GA_DIV};
    static const kernel_t kb[] = {K_GB, K_GB_NEG, K_GB_MUL, K_GB_DIV};
    if (zd_autograd_node_needs_grad(n, 0)) {
        if (!(gin[0] = zd_tensor_new(ZD_FLOAT32, bc->a_shape, bc->a_ndim)))
            return -1;
        walk(bc, ka[bc->op], pa, pb, g, zd_tensor_data(gin[0]));
    }
    if (zd_autograd_node_needs_grad(n, 1)) {
        if (!(gin[1] = zd_tensor_new(ZD_FLOAT32, bc->b_shape, bc->b_ndim)))
            return -1;
        walk(bc, kb[bc->op], pa, pb, g, zd_tensor_data(gin[1]));
    }
    return 0;
}

static void free_ctx(zd_autograd_node_t *n)
{
    free(zd_autograd_node_ctx(n));
}

static const zd_autograd_node_ops_t binary_ops[] = {
    ZD_AUTOGRAD_NODE_OPS("AddBackward", binary_backward, free_ctx),
    ZD_AUTOGRAD_NODE_OPS("SubBackward", binary_backward, free_ctx),
    ZD_AUTOGRAD_NODE_OPS("MulBackward", binary_backward, free_ctx),
    ZD_AUTOGRAD_NODE_OPS("DivBackward", binary_backward, free_ctx),
};

int zd__tensor_binary(zd__bin_op_t op, zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out)
{
    *out = NULL;
    if (!a || !b)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL tensor", op_name(op));
    if (zd_tensor_dtype(a) != ZD_FLOAT32 || zd_tensor_dtype(b) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: expected float32, got %s and %s",
                                 op_name(op), zd_tensor_dtype_name(zd_tensor_dtype(a)),
                                 zd_tensor_dtype_name(zd_tensor_dtype(b)));
    bcast_t *bc = malloc(sizeof *bc);
    if (!bc)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", op_name(op));
    if (bcast_plan(op, a, b, bc) < 0) {
        free(bc);
        return -1;
    }
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, bc->shape, bc->ndim);
    if (!y) {
        free(bc);
        return -1;
    }
    static const kernel_t fwd[] = {K_ADD, K_SUB, K_MUL, K_DIV};
    walk(bc, fwd[op], zd_tensor_data(a), zd_tensor_data(b), NULL, zd_tensor_data(y));
    /* add and sub need no operands to go backward; mul and div need both */
    bool keep = op == ZD__BIN_MUL || op == ZD__BIN_DIV;
    zd_tensor_t *in[2] = {a, b}, *saved[2] = {keep ? a : NULL, keep ? b : NULL};
    if (zd_autograd_record(&binary_ops[op], in, 2, y, saved, 2, bc) < 0)
        return -1;
    *out = y;
    return 0;
}

int zd_tensor_div(zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_div: NULL out");
    return zd__tensor_binary(ZD__BIN_DIV, a, b, out);
}
