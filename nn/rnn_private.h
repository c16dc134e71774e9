/* SPDX-License-Identifier: MIT */
/*  rnn_private.h: what the recurrent cells (rnn_lstm.c, rnn_cells.c) share. */
#ifndef ZDIST_NN_RNN_PRIVATE_H
#define ZDIST_NN_RNN_PRIVATE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>

/*  e^x in plain arithmetic (Cephes' expf: x = n ln2 + r, |r| <= ln2/2, a
    degree-6 polynomial for e^r, 2^n from the exponent bits), about 1 ulp,
    so that GCC vectorizes the gate loops around it: libm's expf and tanhf
    are calls it cannot, and they took a fifth of an LSTM's time. Inputs
    are clamped to [-87, 88], where e^x stays a normal float; a NaN gives
    NaN. */
static inline float rnn_exp(float v)
{
    const float x = v > -87.0f ? (v < 88.0f ? v : 88.0f) : -87.0f; /* NaN: -87 */
    const float t = x * 1.44269504088896341f + 0.5f;
    int n = (int)t;
    n -= (float)n > t; /* floor, for negative t too */
    const float fn = (float)n;
    const float r = x - fn * 0.693359375f + fn * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } scale = {.i = (n + 127) * (1 << 23)};
    return v == v ? p * scale.f : v; /* NaN stays NaN */
}

static inline float rnn_sigmoid(float v)
{
    return 1.0f / (1.0f + rnn_exp(-v));
}

/*  tanh(v) = 2 sigmoid(2v) - 1: near 0 its relative error grows, its
    absolute error stays about 1e-7. */
static inline float rnn_tanh(float v)
{
    return 2.0f / (1.0f + rnn_exp(-2.0f * v)) - 1.0f;
}

/*  The sizes of a recurrent layer's weights, after zd__rnn_check_weights. */
typedef struct {
    int64_t N, I, H;
} rnn_dims_t;

/*  Checks w_ih (gates*H, I), w_hh (gates*H, H), the biases (gates*H) or
    NULL, and x (..., N, I) whose last two dimensions are the batch and
    the features (x_ndim dimensions in all), filling *d. `op` names the
    function in the message. 0, or -1 with zd_error_set. */
int zd__rnn_check_weights(const char *op, int gates, const zd_tensor_t *x, int x_ndim,
                          const zd_tensor_t *w_ih, const zd_tensor_t *w_hh, const zd_tensor_t *b_ih,
                          const zd_tensor_t *b_hh, rnn_dims_t *d);

/*  Checks that a state (h or c) is NULL or float32 of shape (lead..., N, H)
    with `ndim` dimensions, the leading ones of size 1. */
int zd__rnn_check_state(const char *what, const zd_tensor_t *s, int ndim, const rnn_dims_t *d);

/*  rows x cols matrix g: out[j] = sum_r g[r][j]. */
void zd__rnn_col_sum(const float *g, int64_t rows, int64_t cols, float *out);

/*  Adds b_ih + b_hh (either may be NULL) to every row of g (rows x cols). */
void zd__rnn_add_bias(float *g, int64_t rows, int64_t cols, const zd_tensor_t *b_ih,
                      const zd_tensor_t *b_hh);

/*  New tensor with the data of col_sum(g) for bias gradients, or NULL
    (zd_error_set). */
zd_tensor_t *zd__rnn_bias_grad(const float *g, int64_t rows, int64_t cols);

/*  ---- per-step products with a packed weight (rnn_gemm.c) ---- */

/*  A K x N matrix B whose columns form `groups` equal groups (an LSTM's
    four gates), each group in panels of 16 columns (zeros past its end):
    panel per_group * g + q holds B(k, g N/groups + 16 q + c) at
    p[(panel K + k) 16 + c]. */
typedef struct {
    int K, N, groups, per_group;
    float *p;
} rnn_packed_t;

/*  Whether this CPU's kernels (zd__nn_cpu_isa) have the packed products;
    without them the callers use zd__nn_sgemm. */
bool zd__rnn_packed_wanted(void);

/*  Packs B = w^T (trans: w is N x K, row-major) or B = w (w is K x N);
    groups divides N. 0, or -1 out of memory (no error set: the callers
    fall back to zd__nn_sgemm). */
int zd__rnn_pack(rnn_packed_t *pk, const float *w, int K, int N, int groups, bool trans);

void zd__rnn_packed_free(rnn_packed_t *pk);

/*  Called when columns [lo, hi) of every group of C are final, on the
    thread that computed them; calls for different ranges run in parallel. */
typedef void(rnn_cols_fn)(void *arg, int lo, int hi);

/*  C (M x N, row stride ldc) = A B, or += with acc; A is M x K (row stride
    lda). Runs on the layers' pool, split by column ranges of the groups;
    then(then_arg, lo, hi) follows each range when `then` is not NULL. */
void zd__rnn_gemm_packed(int M, const float *a, int lda, const rnn_packed_t *pk, bool acc, float *c,
                         int ldc, rnn_cols_fn *then, void *then_arg);

#endif
