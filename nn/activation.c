/* SPDX-License-Identifier: MIT */
/*  activation.c: softmax along any dimension and the exact GELU. */
#include <math.h>
#include <stdlib.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

/*  ---- softmax ---- */

/*  x viewed as (outer, n, inner) around dimension dim. */
typedef struct {
    int64_t outer, n, inner;
} dim_view_t;

static dim_view_t view_around(const zd_tensor_t *x, int dim)
{
    dim_view_t v = {1, zd_tensor_size(x, dim), 1};
    for (int d = 0; d < dim; d++)
        v.outer *= zd_tensor_size(x, d);
    for (int d = dim + 1; d < zd_tensor_ndim(x); d++)
        v.inner *= zd_tensor_size(x, d);
    return v;
}

/*  dx = y * (dy - sum_k dy_k y_k) along the dimension. */
static int softmax_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *y = zd_autograd_node_saved(n, 0);
    const dim_view_t *v = zd_autograd_node_ctx(n);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(y), zd_tensor_ndim(y))))
        return -1;
    const float *py = zd_tensor_data(y), *g = zd_tensor_data(gout[0]);
    float *dx = zd_tensor_data(gin[0]);
    for (int64_t o = 0; o < v->outer; o++)
        for (int64_t i = 0; i < v->inner; i++) {
            const int64_t base = o * v->n * v->inner + i;
            double dot = 0.0;
            for (int64_t k = 0; k < v->n; k++)
                dot += (double)g[base + k * v->inner] * py[base + k * v->inner];
            for (int64_t k = 0; k < v->n; k++) {
                const int64_t at = base + k * v->inner;
                dx[at] = py[at] * (float)((double)g[at] - dot);
            }
        }
    return 0;
}

static const zd_autograd_node_ops_t softmax_ops =
    ZD_AUTOGRAD_NODE_OPS("SoftmaxBackward", softmax_backward, zd__nn_free_ctx);

int zd_nn_softmax(zd_tensor_t *x, int dim, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_softmax: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("softmax: input", x) < 0)
        return -1;
    const int nd = zd_tensor_ndim(x);
    /* a scalar has one dimension to softmax over, as in PyTorch */
    if (nd == 0 ? dim != 0 && dim != -1 : dim < -nd || dim >= nd) {
        char s[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT, "softmax: dimension %d out of range for input %s",
                                 dim, zd_tensor_shape_str(x, s, sizeof s));
    }
    if (dim < 0)
        dim += nd;
    dim_view_t *v = malloc(sizeof *v);
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), nd);
    if (!v || !y) {
        free(v);
        zd_tensor_unref(y);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "softmax: out of memory");
    }
    *v = nd ? view_around(x, dim) : (dim_view_t){1, 1, 1};
    const float *px = zd_tensor_data(x);
    float *py = zd_tensor_data(y);
    for (int64_t o = 0; o < v->outer; o++)
        for (int64_t i = 0; i < v->inner; i++) {
            const int64_t base = o * v->n * v->inner + i;
            float max = -INFINITY;
            for (int64_t k = 0; k < v->n; k++)
                max = fmaxf(max, px[base + k * v->inner]);
            double sum = 0.0;
            for (int64_t k = 0; k < v->n; k++) {
                const int64_t at = base + k * v->inner;
                py[at] = expf(px[at] - max);
                sum += py[at];
            }
            const float inv = (float)(1.0 / sum);
            for (int64_t k = 0; k < v->n; k++)
                py[base + k * v->inner] *= inv;
        }
    if (zd__nn_record(&softmax_ops, &x, 1, y, y, NULL, NULL, v) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- gelu ---- */

/*  d/dx x Phi(x) = Phi(x) + x phi(x). */
static int gelu_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *x = zd_autograd_node_saved(n, 0);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x))))
        return -1;
    const float *px = zd_tensor_data(x), *g = zd_tensor_data(gout[0]);
    float *dx = zd_tensor_data(gin[0]);
    const float inv_sqrt2 = 0.70710678118654752f, inv_sqrt_2pi = 0.39894228040143268f;
    for (int64_t i = 0; i < zd_tensor_numel(x); i++) {
        const float v = px[i];
        const float cdf = 0.5f * (1.0f + erff(v * inv_sqrt2));
        const float pdf = inv_sqrt_2pi * expf(-0.5f * v * v);
        dx[i] = g[i] * (cdf + v * pdf);
    }
    return 0;
}

static const zd_autograd_node_ops_t gelu_ops =
    ZD_AUTOGRAD_NODE_OPS("GeluBackward", gelu_backward, NULL);

int zd_nn_gelu(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_gelu: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("gelu: input", x) < 0)
        return -1;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x));
    if (!y)
        return -1;
    const float *px = zd_tensor_data(x);
    float *py = zd_tensor_data(y);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        py[i] = 0.5f * px[i] * (1.0f + erff(px[i] * 0.70710678118654752f));
    if (zd__nn_record(&gelu_ops, &x, 1, y, x, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}
