/* SPDX-License-Identifier: MIT */
/*  rnn_cells.c: the GRU and tanh cells, each one autograd node, and the
    shape checks every recurrent layer shares. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/rnn.h>
#include "nn/nn_private.h"
#include "nn/rnn_private.h"

/*  ---- shared checks and helpers ---- */

static int check_arg(const char *op, const char *name, const zd_tensor_t *t, int ndim)
{
    char what[96];
    snprintf(what, sizeof what, "%s: %s", op, name);
    if (zd__nn_check_f32(what, t) < 0 || zd__nn_check_ndim(what, t, ndim) < 0)
        return -1;
    return 0;
}

static int shape_error(const char *op, const char *name, const zd_tensor_t *t, const char *want)
{
    char s[96];
    return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: %s has shape %s, expected %s", op, name,
                             zd_tensor_shape_str(t, s, sizeof s), want);
}

int zd__rnn_check_weights(const char *op, int gates, const zd_tensor_t *x, int x_ndim,
                          const zd_tensor_t *w_ih, const zd_tensor_t *w_hh, const zd_tensor_t *b_ih,
                          const zd_tensor_t *b_hh, rnn_dims_t *d)
{
    char want[96];
    if (check_arg(op, "x", x, x_ndim) < 0 || check_arg(op, "w_ih", w_ih, 2) < 0 ||
        check_arg(op, "w_hh", w_hh, 2) < 0)
        return -1;
    const int64_t G = zd_tensor_size(w_hh, 0), H = zd_tensor_size(w_hh, 1);
    if (H < 1 || G != gates * H) {
        snprintf(want, sizeof want, "(%d*H, H) with H >= 1", gates);
        return shape_error(op, "w_hh", w_hh, want);
    }
    d->N = zd_tensor_size(x, -2);
    d->I = zd_tensor_size(x, -1);
    d->H = H;
    if (d->N < 1 || d->I < 1 || zd_tensor_numel(x) < 1)
        return shape_error(op, "x", x, "no empty dimension");
    if (G > INT32_MAX / H || G > INT32_MAX / d->I || d->N > INT32_MAX / G ||
        d->N > INT32_MAX / d->I)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: sizes too large (batch %lld, input %lld, hidden %lld)", op,
                                 (long long)d->N, (long long)d->I, (long long)H);
    if (zd_tensor_size(w_ih, 0) != G || zd_tensor_size(w_ih, 1) != d->I) {
        snprintf(want, sizeof want, "(%lld, %lld) for x's %lld features", (long long)G,
                 (long long)d->I, (long long)d->I);
        return shape_error(op, "w_ih", w_ih, want);
    }
    const zd_tensor_t *b[2] = {b_ih, b_hh};
    for (int k = 0; k < 2; k++) {
        const char *name = k ? "b_hh" : "b_ih";
        if (!b[k])
            continue;
        if (check_arg(op, name, b[k], 1) < 0)
            return -1;
        if (zd_tensor_size(b[k], 0) != G) {
            snprintf(want, sizeof want, "(%lld)", (long long)G);
            return shape_error(op, name, b[k], want);
        }
    }
    return 0;
}

int zd__rnn_check_state(const char *what, const zd_tensor_t *s, int ndim, const rnn_dims_t *d)
{
    if (!s)
        return 0;
    if (zd__nn_check_f32(what, s) < 0 || zd__nn_check_ndim(what, s, ndim) < 0)
        return -1;
    bool ok = zd_tensor_size(s, -2) == d->N && zd_tensor_size(s, -1) == d->H;
    for (int k = 0; k + 2 < ndim; k++)
        ok = ok && zd_tensor_size(s, k) == 1;
    if (!ok) {
        char sh[96];
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "%s: shape %s, expected batch %lld and hidden size %lld", what,
            zd_tensor_shape_str(s, sh, sizeof sh), (long long)d->N, (long long)d->H);
    }
    return 0;
}

void zd__rnn_col_sum(const float *g, int64_t rows, int64_t cols, float *out)
{
    memset(out, 0, sizeof(float) * (size_t)cols);
    for (int64_t r = 0; r < rows; r++) {
        const float *gr = g + r * cols;
        for (int64_t j = 0; j < cols; j++)
            out[j] += gr[j];
    }
}

void zd__rnn_add_bias(float *g, int64_t rows, int64_t cols, const zd_tensor_t *b_ih,
                      const zd_tensor_t *b_hh)
{
    const zd_tensor_t *b[2] = {b_ih, b_hh};
    for (int k = 0; k < 2; k++) {
        if (!b[k])
            continue;
        const float *bk = zd_tensor_data(b[k]);
        for (int64_t r = 0; r < rows; r++) {
            float *gr = g + r * cols;
            for (int64_t j = 0; j < cols; j++)
                gr[j] += bk[j];
        }
    }
}

zd_tensor_t *zd__rnn_bias_grad(const float *g, int64_t rows, int64_t cols)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, &cols, 1);
    if (t)
        zd__rnn_col_sum(g, rows, cols, zd_tensor_data(t));
    return t;
}

/*  x (N, I) and h (N, H) or NULL: the gradients of a cell's inputs from the
    gradient of its pre-activations. gi (N, G) feeds x w_ih^T and the
    b_ih; gh (N, G) feeds h w_hh^T and b_hh (gh may be gi). Inputs are
    x, h, w_ih, w_hh, b_ih, b_hh in that order; gin[1] is left to the caller
    (it has a direct term as well). */
static int cell_input_grads(zd_autograd_node_t *n, const rnn_dims_t *d, int64_t G, const float *gi,
                            const float *gh, zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *w_ih,
                            zd_tensor_t **gin)
{
    const int N = (int)d->N, I = (int)d->I, H = (int)d->H;
    if (zd_autograd_node_needs_grad(n, 0)) {
        if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){N, I}, 2)))
            return -1;
        zd__nn_sgemm(false, false, N, I, (int)G, 1.0f, gi, (int)G, zd_tensor_data(w_ih), I, 0.0f,
                     zd_tensor_data(gin[0]), I);
    }
    if (zd_autograd_node_needs_grad(n, 2)) {
        if (!(gin[2] = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){G, I}, 2)))
            return -1;
        zd__nn_sgemm(true, false, (int)G, I, N, 1.0f, gi, (int)G, zd_tensor_data(x), I, 0.0f,
                     zd_tensor_data(gin[2]), I);
    }
    if (zd_autograd_node_needs_grad(n, 3)) {
        if (!(gin[3] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){G, H}, 2)))
            return -1;
        if (h)
            zd__nn_sgemm(true, false, (int)G, H, N, 1.0f, gh, (int)G, zd_tensor_data(h), H, 0.0f,
                         zd_tensor_data(gin[3]), H);
    }
    if (zd_autograd_node_needs_grad(n, 4) && !(gin[4] = zd__rnn_bias_grad(gi, N, G)))
        return -1;
    if (zd_autograd_node_needs_grad(n, 5) && !(gin[5] = zd__rnn_bias_grad(gh, N, G)))
        return -1;
    return 0;
}

/*  What a GRU or tanh cell's node keeps. */
typedef struct {
    rnn_dims_t d;
    zd_tensor_t *x, *h, *w_ih, *w_hh;
    float *buf; /* tanh: h' (N,H); GRU: r, z, n, h w_hn^T + b_hn (N, 4H) */
} cell_ctx_t;

static void cell_release(zd_autograd_node_t *n)
{
    cell_ctx_t *c = zd_autograd_node_ctx(n);
    zd_tensor_unref(c->x);
    zd_tensor_unref(c->h);
    zd_tensor_unref(c->w_ih);
    zd_tensor_unref(c->w_hh);
    free(c->buf);
    free(c);
}

/*  Records node ops over (x, h, w_ih, w_hh, b_ih, b_hh) with output y,
    handing it buf (which it frees in every case). */
static int cell_record(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *in,
                       const rnn_dims_t *d, float *buf, zd_tensor_t *y)
{
    zd_autograd_node_t *n;
    if (zd_autograd_node_new(ops, in, 6, 1, &n) < 0) {
        free(buf);
        return -1;
    }
    if (!n) {
        free(buf);
        return 0;
    }
    cell_ctx_t *c = calloc(1, sizeof *c);
    if (!c) {
        free(buf);
        zd_autograd_node_unref(n);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", ops->name);
    }
    c->d = *d;
    c->x = zd_tensor_ref(in[0]);
    c->h = zd_tensor_ref(in[1]);
    c->w_ih = zd_tensor_ref(in[2]);
    c->w_hh = zd_tensor_ref(in[3]);
    c->buf = buf;
    zd_autograd_node_set_ctx(n, c);
    zd_autograd_node_set_output(n, y);
    zd_autograd_node_unref(n);
    return 0;
}

/*  ---- tanh cell ---- */

static int rnn_tanh_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const cell_ctx_t *c = zd_autograd_node_ctx(n);
    const int64_t N = c->d.N, H = c->d.H;
    float *da = malloc(sizeof(float) * (size_t)(N * H));
    if (!da)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "RnnTanhCellBackward: out of memory");
    const float *dy = zd_tensor_data(gout[0]), *y = c->buf;
    for (int64_t k = 0; k < N * H; k++)
        da[k] = dy[k] * (1.0f - y[k] * y[k]);
    int rc = cell_input_grads(n, &c->d, H, da, da, c->x, c->h, c->w_ih, gin);
    if (rc == 0 && zd_autograd_node_needs_grad(n, 1)) {
        if (!(gin[1] = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){N, H}, 2)))
            rc = -1;
        else
            zd__nn_sgemm(false, false, (int)N, (int)H, (int)H, 1.0f, da, (int)H,
                         zd_tensor_data(c->w_hh), (int)H, 0.0f, zd_tensor_data(gin[1]), (int)H);
    }
    free(da);
    return rc;
}

static const zd_autograd_node_ops_t rnn_tanh_ops =
    ZD_AUTOGRAD_NODE_OPS("RnnTanhCellBackward", rnn_tanh_backward, cell_release);

int zd_nn_rnn_tanh_cell(zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *w_ih, zd_tensor_t *w_hh,
                        zd_tensor_t *b_ih, zd_tensor_t *b_hh, zd_tensor_t **h_out)
{
    if (!h_out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_rnn_tanh_cell: NULL h_out");
    *h_out = NULL;
    rnn_dims_t d;
    if (zd__rnn_check_weights("rnn_tanh_cell", 1, x, 2, w_ih, w_hh, b_ih, b_hh, &d) < 0 ||
        zd__rnn_check_state("rnn_tanh_cell: h", h, 2, &d) < 0)
        return -1;
    const int N = (int)d.N, I = (int)d.I, H = (int)d.H;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){N, H}, 2);
    float *keep = malloc(sizeof(float) * (size_t)N * (size_t)H);
    if (!y || !keep) {
        zd_tensor_unref(y);
        free(keep);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "rnn_tanh_cell: out of memory");
    }
    float *py = zd_tensor_data(y);
    zd__nn_sgemm(false, true, N, H, I, 1.0f, zd_tensor_data(x), I, zd_tensor_data(w_ih), I, 0.0f,
                 py, H);
    if (h)
        zd__nn_sgemm(false, true, N, H, H, 1.0f, zd_tensor_data(h), H, zd_tensor_data(w_hh), H,
                     1.0f, py, H);
    zd__rnn_add_bias(py, N, H, b_ih, b_hh);
    for (int64_t k = 0; k < (int64_t)N * H; k++)
        keep[k] = py[k] = rnn_tanh(py[k]);
    zd_tensor_t *in[6] = {x, h, w_ih, w_hh, b_ih, b_hh};
    if (cell_record(&rnn_tanh_ops, in, &d, keep, y) < 0) {
        zd_tensor_unref(y);
        return -1;
    }
    *h_out = y;
    return 0;
}

/*  ---- GRU cell ---- */

static int gru_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const cell_ctx_t *c = zd_autograd_node_ctx(n);
    const int64_t N = c->d.N, H = c->d.H, G = 3 * H;
    float *gi = malloc(sizeof(float) * (size_t)(2 * N * G));
    if (!gi)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "GruCellBackward: out of memory");
    float *gh = gi + N * G;
    const float *dy = zd_tensor_data(gout[0]);
    const float *hp = c->h ? zd_tensor_data(c->h) : NULL;
    for (int64_t r = 0; r < N; r++) {
        const float *s = c->buf + r * 4 * H; /* r, z, n, hn */
        float *a = gi + r * G, *b = gh + r * G;
        for (int64_t j = 0; j < H; j++) {
            const float rg = s[j], z = s[H + j], nn = s[2 * H + j], hn = s[3 * H + j];
            const float g = dy[r * H + j], hv = hp ? hp[r * H + j] : 0.0f;
            const float dn = g * (1.0f - z) * (1.0f - nn * nn);
            const float dz = g * (hv - nn) * z * (1.0f - z);
            const float dr = dn * hn * rg * (1.0f - rg);
            a[j] = b[j] = dr;
            a[H + j] = b[H + j] = dz;
            a[2 * H + j] = dn;
            b[2 * H + j] = dn * rg;
        }
    }
    int rc = cell_input_grads(n, &c->d, G, gi, gh, c->x, c->h, c->w_ih, gin);
    if (rc == 0 && zd_autograd_node_needs_grad(n, 1)) {
        if (!(gin[1] = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){N, H}, 2))) {
            rc = -1;
        } else {
            float *dh = zd_tensor_data(gin[1]);
            for (int64_t r = 0; r < N; r++)
                for (int64_t j = 0; j < H; j++)
                    dh[r * H + j] = dy[r * H + j] * c->buf[r * 4 * H + H + j];
            zd__nn_sgemm(false, false, (int)N, (int)H, (int)G, 1.0f, gh, (int)G,
                         zd_tensor_data(c->w_hh), (int)H, 1.0f, dh, (int)H);
        }
    }
    free(gi);
    return rc;
}

static const zd_autograd_node_ops_t gru_ops =
    ZD_AUTOGRAD_NODE_OPS("GruCellBackward", gru_backward, cell_release);

int zd_nn_gru_cell(zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *w_ih, zd_tensor_t *w_hh,
                   zd_tensor_t *b_ih, zd_tensor_t *b_hh, zd_tensor_t **h_out)
{
    if (!h_out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_gru_cell: NULL h_out");
    *h_out = NULL;
    rnn_dims_t d;
    if (zd__rnn_check_weights("gru_cell", 3, x, 2, w_ih, w_hh, b_ih, b_hh, &d) < 0 ||
        zd__rnn_check_state("gru_cell: h", h, 2, &d) < 0)
        return -1;
    const int N = (int)d.N, I = (int)d.I, H = (int)d.H, G = 3 * H;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){N, H}, 2);
    /* gi and gh (N, G) each, then what backward keeps (N, 4H) */
    float *tmp = malloc(sizeof(float) * 2 * (size_t)N * (size_t)G);
    float *keep = malloc(sizeof(float) * 4 * (size_t)N * (size_t)H);
    if (!y || !tmp || !keep) {
        zd_tensor_unref(y);
        free(tmp);
        free(keep);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "gru_cell: out of memory");
    }
    float *gi = tmp, *gh = tmp + (size_t)N * G;
    zd__nn_sgemm(false, true, N, G, I, 1.0f, zd_tensor_data(x), I, zd_tensor_data(w_ih), I, 0.0f,
                 gi, G);
    zd__rnn_add_bias(gi, N, G, b_ih, NULL);
    if (h)
        zd__nn_sgemm(false, true, N, G, H, 1.0f, zd_tensor_data(h), H, zd_tensor_data(w_hh), H,
                     0.0f, gh, G);
    else
        memset(gh, 0, sizeof(float) * (size_t)N * G);
    zd__rnn_add_bias(gh, N, G, NULL, b_hh);
    const float *hp = h ? zd_tensor_data(h) : NULL;
    float *py = zd_tensor_data(y);
    for (int r = 0; r < N; r++) {
        const float *a = gi + (size_t)r * G, *b = gh + (size_t)r * G;
        float *s = keep + (size_t)r * 4 * H;
        for (int j = 0; j < H; j++) {
            const float rg = rnn_sigmoid(a[j] + b[j]);
            const float z = rnn_sigmoid(a[H + j] + b[H + j]);
            const float nn = rnn_tanh(a[2 * H + j] + rg * b[2 * H + j]);
            s[j] = rg;
            s[H + j] = z;
            s[2 * H + j] = nn;
            s[3 * H + j] = b[2 * H + j];
            py[(size_t)r * H + j] = (1.0f - z) * nn + z * (hp ? hp[(size_t)r * H + j] : 0.0f);
        }
    }
    free(tmp);
    zd_tensor_t *in[6] = {x, h, w_ih, w_hh, b_ih, b_hh};
    if (cell_record(&gru_ops, in, &d, keep, y) < 0) {
        zd_tensor_unref(y);
        return -1;
    }
    *h_out = y;
    return 0;
}
