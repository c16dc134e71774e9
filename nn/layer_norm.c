/* SPDX-License-Identifier: MIT */
/*  layer_norm.c: layer normalisation over the last dimensions. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

/*  Each of the `rows` groups of m normalised elements keeps its mean and
    1/sqrt(var + eps) for the backward pass. */
typedef struct {
    int64_t rows, m;
    int norm_ndim;
    double stats[]; /* mean, rstd per row */
} ln_ctx_t;

/*  With xhat = (x - mean) rstd and dxhat = dy * weight:
    dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
    dweight = sum over rows of dy xhat, dbias = sum over rows of dy. */
static int ln_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const ln_ctx_t *c = zd_autograd_node_ctx(n);
    zd_tensor_t *x = zd_autograd_node_saved(n, 0), *w = zd_autograd_node_saved(n, 1);
    const float *px = zd_tensor_data(x), *g = zd_tensor_data(gout[0]);
    const float *pw = w ? zd_tensor_data(w) : NULL;
    const int64_t m = c->m;
    const bool need_x = zd_autograd_node_needs_grad(n, 0);
    const bool need_w = zd_autograd_node_needs_grad(n, 1),
               need_b = zd_autograd_node_needs_grad(n, 2);
    double *acc = calloc((size_t)(2 * m + 1), sizeof *acc); /* dweight, dbias */
    if (!acc)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "layer_norm: out of memory");
    if (need_x && !(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x)))) {
        free(acc);
        return -1;
    }
    for (int64_t r = 0; r < c->rows; r++) {
        const float *xr = px + r * m, *gr = g + r * m;
        const double mean = c->stats[2 * r], rstd = c->stats[2 * r + 1];
        double s1 = 0.0, s2 = 0.0;
        for (int64_t k = 0; k < m; k++) {
            const double xhat = ((double)xr[k] - mean) * rstd;
            const double dxhat = (double)gr[k] * (pw ? pw[k] : 1.0f);
            s1 += dxhat;
            s2 += dxhat * xhat;
            acc[k] += (double)gr[k] * xhat;
            acc[m + k] += gr[k];
        }
        if (!need_x)
            continue;
        float *dx = zd_tensor_data(gin[0]) + r * m;
        s1 /= (double)m;
        s2 /= (double)m;
        for (int64_t k = 0; k < m; k++) {
            const double xhat = ((double)xr[k] - mean) * rstd;
            const double dxhat = (double)gr[k] * (pw ? pw[k] : 1.0f);
            dx[k] = (float)(rstd * (dxhat - s1 - xhat * s2));
        }
    }
    int rc = 0;
    for (int j = 1; j <= 2 && rc == 0; j++) {
        if (!(j == 1 ? need_w : need_b))
            continue;
        const int nd = zd_tensor_ndim(x); /* weight and bias: x's last norm_ndim sizes */
        if (!(gin[j] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x) + nd - c->norm_ndim,
                                       c->norm_ndim))) {
            rc = -1;
            break;
        }
        float *d = zd_tensor_data(gin[j]);
        for (int64_t k = 0; k < m; k++)
            d[k] = (float)acc[(j - 1) * m + k];
    }
    free(acc);
    return rc;
}

static const zd_autograd_node_ops_t ln_ops =
    ZD_AUTOGRAD_NODE_OPS("NativeLayerNormBackward", ln_backward, zd__nn_free_ctx);

/*  weight or bias: NULL, or float32 with x's last norm_ndim sizes. */
static int check_affine(const char *what, const zd_tensor_t *t, const zd_tensor_t *x, int norm_ndim)
{
    if (!t)
        return 0;
    if (zd__nn_check_f32(what, t) < 0)
        return -1;
    bool ok = zd_tensor_ndim(t) == norm_ndim;
    for (int d = 0; ok && d < norm_ndim; d++)
        ok = zd_tensor_size(t, d) == zd_tensor_size(x, zd_tensor_ndim(x) - norm_ndim + d);
    if (!ok) {
        char st[96], sx[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s %s does not match the last %d dimensions of input %s", what,
                                 zd_tensor_shape_str(t, st, sizeof st), norm_ndim,
                                 zd_tensor_shape_str(x, sx, sizeof sx));
    }
    return 0;
}

int zd_nn_layer_norm(zd_tensor_t *x, int norm_ndim, zd_tensor_t *weight, zd_tensor_t *bias,
                     float eps, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_layer_norm: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("layer_norm: input", x) < 0)
        return -1;
    const int nd = zd_tensor_ndim(x);
    if (norm_ndim < 1 || norm_ndim > nd) {
        char s[96];
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "layer_norm: cannot normalise over the last %d dimensions of input %s",
            norm_ndim, zd_tensor_shape_str(x, s, sizeof s));
    }
    if (check_affine("layer_norm: weight", weight, x, norm_ndim) < 0 ||
        check_affine("layer_norm: bias", bias, x, norm_ndim) < 0)
        return -1;
    if (!(eps >= 0.0f))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "layer_norm: eps %g is negative", (double)eps);
    int64_t m = 1;
    for (int d = nd - norm_ndim; d < nd; d++)
        m *= zd_tensor_size(x, d);
    const int64_t rows = m ? zd_tensor_numel(x) / m : 0;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), nd);
    ln_ctx_t *c = malloc(sizeof *c + sizeof(double) * 2 * (size_t)rows);
    if (!y || !c) {
        zd_tensor_unref(y);
        free(c);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "layer_norm: out of memory");
    }
    c->rows = rows;
    c->m = m;
    c->norm_ndim = norm_ndim;
    const float *px = zd_tensor_data(x);
    const float *pw = weight ? zd_tensor_data(weight) : NULL,
                *pb = bias ? zd_tensor_data(bias) : NULL;
    float *py = zd_tensor_data(y);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = px + r * m;
        double sum = 0.0, sq = 0.0;
        for (int64_t k = 0; k < m; k++)
            sum += xr[k];
        const double mean = sum / (double)m;
        for (int64_t k = 0; k < m; k++)
            sq += ((double)xr[k] - mean) * ((double)xr[k] - mean);
        const double rstd = 1.0 / sqrt(sq / (double)m + (double)eps); /* biased variance */
        c->stats[2 * r] = mean;
        c->stats[2 * r + 1] = rstd;
        for (int64_t k = 0; k < m; k++) {
            float v = (float)(((double)xr[k] - mean) * rstd);
            py[r * m + k] = v * (pw ? pw[k] : 1.0f) + (pb ? pb[k] : 0.0f);
        }
    }
    zd_tensor_t *in[3] = {x, weight, bias};
    if (zd__nn_record(&ln_ops, in, 3, y, x, weight, NULL, c) < 0)
        return -1;
    *out = y;
    return 0;
}
