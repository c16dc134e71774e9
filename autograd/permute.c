/* SPDX-License-Identifier: MIT */
/*  permute.c: permute and transpose with gradients. Tensors are always
    contiguous here, so the result is a reordered copy (PyTorch returns a
    strided view; the values are the same). */
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>

/*  dst (the permuted shape) = src with dst's dimension i being src's
    dimension perm[i]; elements of es bytes. */
static void permute_copy(const zd_tensor_t *src, const int *perm, zd_tensor_t *dst)
{
    const int nd = zd_tensor_ndim(src);
    const size_t es = zd_tensor_dtype_size(zd_tensor_dtype(src));
    int64_t sstride[ZD_TENSOR_MAX_DIMS], st[ZD_TENSOR_MAX_DIMS], shape[ZD_TENSOR_MAX_DIMS];
    int64_t s = 1;
    for (int d = nd - 1; d >= 0; d--) {
        sstride[d] = s;
        s *= zd_tensor_size(src, d);
    }
    for (int i = 0; i < nd; i++) {
        st[i] = sstride[perm[i]];
        shape[i] = zd_tensor_size(src, perm[i]);
    }
    const int64_t numel = zd_tensor_numel(src);
    if (numel == 0)
        return;
    const char *in = zd_tensor_raw(src);
    char *o = zd_tensor_raw(dst);
    if (nd == 0) {
        memcpy(o, in, es);
        return;
    }
    const int64_t n = shape[nd - 1], step = st[nd - 1];
    int64_t idx[ZD_TENSOR_MAX_DIMS] = {0}, off = 0;
    for (int64_t i0 = 0; i0 < numel; i0 += n) {
        switch (es) { /* the common sizes as typed loops, which the compiler can unroll */
        case 4:
            for (int64_t j = 0; j < n; j++)
                memcpy(o + (size_t)(i0 + j) * 4, in + (size_t)(off + j * step) * 4, 4);
            break;
        case 8:
            for (int64_t j = 0; j < n; j++)
                memcpy(o + (size_t)(i0 + j) * 8, in + (size_t)(off + j * step) * 8, 8);
            break;
        default:
            for (int64_t j = 0; j < n; j++)
                memcpy(o + (size_t)(i0 + j) * es, in + (size_t)(off + j * step) * es, es);
            break;
        }
        for (int d = nd - 2; d >= 0; d--) {
            off += st[d];
            if (++idx[d] < shape[d])
                break;
            off -= st[d] * shape[d];
            idx[d] = 0;
        }
    }
}

typedef struct {
    int inverse[ZD_TENSOR_MAX_DIMS];
} permute_ctx_t;

static int permute_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const permute_ctx_t *c = zd_autograd_node_ctx(n);
    const int nd = zd_tensor_ndim(gout[0]);
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        shape[i] = zd_tensor_size(gout[0], c->inverse[i]);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, shape, nd)))
        return -1;
    permute_copy(gout[0], c->inverse, gin[0]);
    return 0;
}

static void free_ctx(zd_autograd_node_t *n)
{
    free(zd_autograd_node_ctx(n));
}

static const zd_autograd_node_ops_t permute_ops =
    ZD_AUTOGRAD_NODE_OPS("PermuteBackward", permute_backward, free_ctx);

/*  perm: ndim entries, negative ones counting from the end. */
static int permute_impl(const char *op, zd_tensor_t *t, const int *dims, int ndims,
                        zd_tensor_t **out)
{
    *out = NULL;
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL tensor", op);
    const int nd = zd_tensor_ndim(t);
    char s[96];
    if (ndims != nd)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: %d dimensions given for a tensor of shape %s", op, ndims,
                                 zd_tensor_shape_str(t, s, sizeof s));
    if (nd > 0 && !dims)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL dimensions", op);
    int perm[ZD_TENSOR_MAX_DIMS] = {0};
    bool seen[ZD_TENSOR_MAX_DIMS] = {false};
    for (int i = 0; i < nd; i++) {
        int d = dims[i] < 0 ? dims[i] + nd : dims[i];
        if (d < 0 || d >= nd)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: dimension %d out of range for shape %s",
                                     op, dims[i], zd_tensor_shape_str(t, s, sizeof s));
        if (seen[d])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: dimension %d repeats: not a permutation",
                                     op, d);
        seen[d] = true;
        perm[i] = d;
    }
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        shape[i] = zd_tensor_size(t, perm[i]);
    zd_tensor_t *y = zd_tensor_empty(zd_tensor_dtype(t), shape, nd);
    permute_ctx_t *c = malloc(sizeof *c);
    if (!y || !c) {
        zd_tensor_unref(y);
        free(c);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", op);
    }
    permute_copy(t, perm, y);
    for (int i = 0; i < nd; i++)
        c->inverse[perm[i]] = i;
    if (zd_autograd_record(&permute_ops, &t, 1, y, NULL, 0, c) < 0)
        return -1;
    *out = y;
    return 0;
}

int zd_tensor_permute(zd_tensor_t *t, const int *dims, int ndims, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_permute: NULL out");
    return permute_impl("permute", t, dims, ndims, out);
}

int zd_tensor_transpose(zd_tensor_t *t, int dim0, int dim1, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_transpose: NULL out");
    *out = NULL;
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "transpose: NULL tensor");
    const int nd = zd_tensor_ndim(t);
    int d0 = dim0 < 0 ? dim0 + nd : dim0, d1 = dim1 < 0 ? dim1 + nd : dim1;
    if (d0 < 0 || d0 >= nd || d1 < 0 || d1 >= nd) {
        char s[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "transpose: dimensions %d and %d out of range for shape %s", dim0,
                                 dim1, zd_tensor_shape_str(t, s, sizeof s));
    }
    int perm[ZD_TENSOR_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        perm[i] = i;
    perm[d0] = d1;
    perm[d1] = d0;
    return permute_impl("transpose", t, perm, nd, out);
}
