/* SPDX-License-Identifier: MIT */
/*  rnn_lstm.c: the LSTM: one cell step, and a multi-layer LSTM over a
    sequence, whose every layer is one autograd node.

    A layer over T steps computes x w_ih^T for all steps in one GEMM (T*N
    rows), then per step adds h w_hh^T and runs the gates. Backward through
    time runs inside the node: per step one elementwise pass and one GEMM
    (dh = dG w_hh); then dx, dw_ih and dw_hh are one GEMM each over all
    steps. One node per layer instead of one per step saves the engine's
    per-node work and, more, lets those three products run at T*N rows
    instead of N. The cell is the same node with T = 1.

    With the AVX-512 kernels the per-step products use w_hh
    packed once per layer (rnn_gemm.c) instead of OpenBLAS packing it
    again every step, and each runs with its step's gates as one job on
    the layers' pool. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rnn.h>
#include "nn/nn_private.h"
#include "nn/rnn_private.h"
#include "nn/simd_avx2.h"

typedef struct {
    rnn_dims_t d;
    int64_t T;
    zd_tensor_t *x, *h0, *c0, *w_ih, *w_hh; /* h0, c0 may be NULL (zeros) */
    zd_tensor_t *y;                         /* output 0 without history: the h of every step */
    float *gates;                           /* (T, N, 4H): i, f, g, o after their nonlinearities */
    float *c;                               /* (T, N, H): the cell state after each step */
    float *tc;                              /* (T, N, H): tanh of it */
} lstm_ctx_t;

static void lstm_ctx_free(lstm_ctx_t *c)
{
    if (!c)
        return;
    zd_tensor_unref(c->x);
    zd_tensor_unref(c->h0);
    zd_tensor_unref(c->c0);
    zd_tensor_unref(c->w_ih);
    zd_tensor_unref(c->w_hh);
    zd_tensor_unref(c->y);
    free(c->gates);
    free(c);
}

static void lstm_release(zd_autograd_node_t *n)
{
    lstm_ctx_free(zd_autograd_node_ctx(n));
}

/*  The gate loops for each kind of kernels (nn/cpu.c): the portable ones
    vectorize 4 floats wide; the backward loop is the same C compiled for
    AVX2 and AVX-512 (8 and 16 wide), the forward one is written out for
    them below. */
#define NN_BODY static inline __attribute__((always_inline))

/*  One row of one step's gradients: from dh (the h output's gradient,
    this step's output gradient included) and dc (the c output's), the
    pre-activation gradients of the four gates, and dc turned into the
    gradient of the previous cell state. Separate restrict pointers per
    gate, so that GCC vectorizes the loop. */
NN_BODY void row_backward(const float *restrict i_, const float *restrict f_,
                          const float *restrict g_, const float *restrict o_,
                          const float *restrict tc, const float *restrict cp,
                          const float *restrict dh, float *restrict dc, float *restrict di,
                          float *restrict df, float *restrict dg, float *restrict do_, int64_t H)
{
    for (int64_t j = 0; j < H; j++) {
        const float i = i_[j], f = f_[j], g = g_[j], o = o_[j], t = tc[j];
        const float dcv = dc[j] + dh[j] * o * (1.0f - t * t);
        di[j] = dcv * g * i * (1.0f - i);
        df[j] = dcv * cp[j] * f * (1.0f - f);
        dg[j] = dcv * i * (1.0f - g * g);
        do_[j] = dh[j] * t * o * (1.0f - o);
        dc[j] = dcv * f;
    }
}

/*  One row of one step: the gates' pre-activations i, f, g, o become
    their activations in place; c, tanh(c) and h = o tanh(c) from the
    previous cell state cp. */
NN_BODY void row_forward(float *restrict i_, float *restrict f_, float *restrict g_,
                         float *restrict o_, const float *restrict cp, float *restrict c,
                         float *restrict tc, float *restrict h, int64_t H)
{
    for (int64_t j = 0; j < H; j++) {
        const float i = rnn_sigmoid(i_[j]), f = rnn_sigmoid(f_[j]);
        const float g = rnn_tanh(g_[j]), o = rnn_sigmoid(o_[j]);
        const float cv = f * cp[j] + i * g, t = rnn_tanh(cv);
        i_[j] = i;
        f_[j] = f;
        g_[j] = g;
        o_[j] = o;
        c[j] = cv;
        tc[j] = t;
        h[j] = o * t;
    }
}

#define FORWARD_ARGS                                                                               \
    float *restrict i_, float *restrict f_, float *restrict g_, float *restrict o_,                \
        const float *restrict cp, float *restrict c, float *restrict tc, float *restrict h,        \
        int64_t H
#define BACKWARD_ARGS                                                                              \
    const float *restrict i_, const float *restrict f_, const float *restrict g_,                  \
        const float *restrict o_, const float *restrict tc, const float *restrict cp,              \
        const float *restrict dh, float *restrict dc, float *restrict di, float *restrict df,      \
        float *restrict dg, float *restrict do_, int64_t H

typedef void(row_forward_fn)(FORWARD_ARGS);
typedef void(row_backward_fn)(BACKWARD_ARGS);

static void row_forward_generic(FORWARD_ARGS)
{
    row_forward(i_, f_, g_, o_, cp, c, tc, h, H);
}

static void row_backward_generic(BACKWARD_ARGS)
{
    row_backward(i_, f_, g_, o_, tc, cp, dh, dc, di, df, dg, do_, H);
}

/*  The forward rows with AVX2 and AVX-512: rnn_exp's steps on vectors (GCC
    does not vectorize it for these targets: it splits the loop at the
    clamps), with FMA, so the last bit may differ from the portable loop's. */
NN_AVX2_BEGIN
static inline __m256 exp_avx2(__m256 v)
{
    const __m256 x = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 fn = _mm256_floor_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    const __m256 r = _mm256_fmadd_ps(fn, _mm256_set1_ps(2.12194440e-4f),
                                     _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), x));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(fn), _mm256_set1_epi32(127));
    const __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(e, 23)));
    return _mm256_blendv_ps(v, y, _mm256_cmp_ps(v, v, _CMP_ORD_Q)); /* NaN stays NaN */
}

static inline __m256 sigmoid_avx2(__m256 v)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), v));
    return _mm256_div_ps(one, _mm256_add_ps(one, e));
}

static inline __m256 tanh_avx2(__m256 v)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 e = exp_avx2(_mm256_mul_ps(v, _mm256_set1_ps(-2.0f)));
    return _mm256_sub_ps(_mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)), one);
}

static void row_forward_avx2(FORWARD_ARGS)
{
    for (int64_t j = 0; j < H; j += 8) {
        const int n = H - j < 8 ? (int)(H - j) : 8;
        const __m256 i = sigmoid_avx2(avx2_loadn(i_ + j, n));
        const __m256 f = sigmoid_avx2(avx2_loadn(f_ + j, n));
        const __m256 g = tanh_avx2(avx2_loadn(g_ + j, n));
        const __m256 o = sigmoid_avx2(avx2_loadn(o_ + j, n));
        const __m256 cv = _mm256_fmadd_ps(f, avx2_loadn(cp + j, n), _mm256_mul_ps(i, g));
        const __m256 t = tanh_avx2(cv);
        avx2_storen(i_ + j, n, i);
        avx2_storen(f_ + j, n, f);
        avx2_storen(g_ + j, n, g);
        avx2_storen(o_ + j, n, o);
        avx2_storen(c + j, n, cv);
        avx2_storen(tc + j, n, t);
        avx2_storen(h + j, n, _mm256_mul_ps(o, t));
    }
}

static void row_backward_avx2(BACKWARD_ARGS)
{
    row_backward(i_, f_, g_, o_, tc, cp, dh, dc, di, df, dg, do_, H);
}
NN_AVX2_END

NN_AVX512_BEGIN
static inline __m512 exp_avx512(__m512 v)
{
    const __m512 x = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 fn = _mm512_roundscale_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fmadd_ps(fn, _mm512_set1_ps(2.12194440e-4f),
                                     _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(fn), _mm512_set1_epi32(127));
    const __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32(e, 23)));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v, y);
}

static inline __m512 sigmoid_avx512(__m512 v)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), v));
    return _mm512_div_ps(one, _mm512_add_ps(one, e));
}

static inline __m512 tanh_avx512(__m512 v)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 e = exp_avx512(_mm512_mul_ps(v, _mm512_set1_ps(-2.0f)));
    return _mm512_sub_ps(_mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(one, e)), one);
}

static void row_forward_avx512(FORWARD_ARGS)
{
    for (int64_t j = 0; j < H; j += 16) {
        const __mmask16 m = (__mmask16)(H - j >= 16 ? 0xffff : (1u << (H - j)) - 1);
        const __m512 i = sigmoid_avx512(_mm512_maskz_loadu_ps(m, i_ + j));
        const __m512 f = sigmoid_avx512(_mm512_maskz_loadu_ps(m, f_ + j));
        const __m512 g = tanh_avx512(_mm512_maskz_loadu_ps(m, g_ + j));
        const __m512 o = sigmoid_avx512(_mm512_maskz_loadu_ps(m, o_ + j));
        const __m512 cv = _mm512_fmadd_ps(f, _mm512_maskz_loadu_ps(m, cp + j), _mm512_mul_ps(i, g));
        const __m512 t = tanh_avx512(cv);
        _mm512_mask_storeu_ps(i_ + j, m, i);
        _mm512_mask_storeu_ps(f_ + j, m, f);
        _mm512_mask_storeu_ps(g_ + j, m, g);
        _mm512_mask_storeu_ps(o_ + j, m, o);
        _mm512_mask_storeu_ps(c + j, m, cv);
        _mm512_mask_storeu_ps(tc + j, m, t);
        _mm512_mask_storeu_ps(h + j, m, _mm512_mul_ps(o, t));
    }
}

static void row_backward_avx512(BACKWARD_ARGS)
{
    row_backward(i_, f_, g_, o_, tc, cp, dh, dc, di, df, dg, do_, H);
}
NN_AVX512_END

static row_forward_fn *forward_kernel(void)
{
    nn_isa_t isa = zd__nn_cpu_isa();
    return isa == NN_ISA_AVX512 ? row_forward_avx512
        : isa == NN_ISA_AVX2    ? row_forward_avx2
                                : row_forward_generic;
}

static row_backward_fn *backward_kernel(void)
{
    nn_isa_t isa = zd__nn_cpu_isa();
    return isa == NN_ISA_AVX512 ? row_backward_avx512
        : isa == NN_ISA_AVX2    ? row_backward_avx2
                                : row_backward_generic;
}

/*  One step's gradients, hidden units [lo, hi) of every row. */
typedef struct {
    const lstm_ctx_t *c;
    row_backward_fn *kernel;
    int64_t t;
    const float *dy;    /* the step's output gradient (N, H) */
    float *dh;          /* in: the gradient from the step after; dy is added in place */
    float *dc;          /* in: the c output's gradient; out: the previous c's */
    float *dgt;         /* out: the gates' pre-activation gradients (N, 4H) */
    const float *zeros; /* H zeros: the previous cell state of step 0 without c0 */
} back_t;

static void step_backward(void *arg, int lo, int hi)
{
    const back_t *b = arg;
    const lstm_ctx_t *c = b->c;
    const int64_t t = b->t, N = c->d.N, H = c->d.H, G = 4 * H;
    const float *gates = c->gates + t * N * G, *tc = c->tc + t * N * H;
    const float *cprev = t > 0 ? c->c + (t - 1) * N * H : c->c0 ? zd_tensor_data(c->c0) : NULL;
    for (int64_t r = 0; r < N; r++) {
        float *dh = b->dh + r * H;
        const float *dy = b->dy + r * H;
        for (int k = lo; k < hi; k++)
            dh[k] += dy[k];
        const float *g = gates + r * G + lo;
        float *d = b->dgt + r * G + lo;
        b->kernel(g, g + H, g + 2 * H, g + 3 * H, tc + r * H + lo,
                  (cprev ? cprev + r * H : b->zeros) + lo, dh + lo, b->dc + r * H + lo, d, d + H,
                  d + 2 * H, d + 3 * H, hi - lo);
    }
}

/*  Inputs: x, h0, c0, w_ih, w_hh, b_ih, b_hh. Outputs: y, then h_T (for a
    layer, not a cell: its last step), then c_T. */
static int lstm_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const lstm_ctx_t *c = zd_autograd_node_ctx(n);
    const int64_t T = c->T, N = c->d.N, I = c->d.I, H = c->d.H, G = 4 * H;
    const bool cell = zd_autograd_node_n_outputs(n) == 2;
    const float *dy = zd_tensor_data(gout[0]);
    const float *dhT = cell ? NULL : zd_tensor_data(gout[1]);
    const float *dcT = zd_tensor_data(gout[cell ? 1 : 2]);
    float *dg = malloc(sizeof(float) * (size_t)(T * N * G + 2 * N * H + H));
    if (!dg)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "LstmBackward: out of memory");
    float *dc = dg + T * N * G, *dh = dc + N * H, *zeros = dh + N * H;
    memset(zeros, 0, sizeof(float) * (size_t)H);
    memcpy(dc, dcT, sizeof(float) * (size_t)(N * H));
    if (dhT)
        memcpy(dh, dhT, sizeof(float) * (size_t)(N * H));
    else
        memset(dh, 0, sizeof(float) * (size_t)(N * H));
    const float *w_ih = zd_tensor_data(c->w_ih), *w_hh = zd_tensor_data(c->w_hh);
    const bool want_h0 = zd_autograd_node_needs_grad(n, 1);
    rnn_packed_t pk = {0};
    const bool packed =
        T > 1 && zd__rnn_packed_wanted() && zd__rnn_pack(&pk, w_hh, (int)G, (int)H, 1, false) == 0;
    back_t b = {.c = c,
                .kernel = backward_kernel(),
                .t = T - 1,
                .dy = dy + (T - 1) * N * H,
                .dh = dh,
                .dc = dc,
                .dgt = dg + (T - 1) * N * G,
                .zeros = zeros};
    step_backward(&b, 0, (int)H);
    /* dh = dG_t w_hh, the gradient of the previous step's h; with w_hh
       packed, step t - 1's gates follow in the same job, per hidden unit */
    for (int64_t t = T - 1; t > 0 || (t == 0 && want_h0); t--) {
        const float *dgt = dg + t * N * G;
        back_t prev = b;
        prev.t = t - 1;
        prev.dy = dy + (t - 1) * N * H;
        prev.dgt = dg + (t - 1) * N * G;
        rnn_cols_fn *then = t > 0 ? step_backward : NULL;
        if (packed) {
            zd__rnn_gemm_packed((int)N, dgt, (int)G, &pk, false, dh, (int)H, then, &prev);
        } else {
            zd__nn_sgemm(false, false, (int)N, (int)H, (int)G, 1.0f, dgt, (int)G, w_hh, (int)H,
                         0.0f, dh, (int)H);
            if (then)
                then(&prev, 0, (int)H);
        }
    }
    zd__rnn_packed_free(&pk);
    int rc = 0;
    zd_tensor_t *in_x = c->x, *in_h0 = c->h0, *in_c0 = c->c0;
    if (zd_autograd_node_needs_grad(n, 0)) {
        if ((gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(in_x), zd_tensor_ndim(in_x))))
            zd__nn_sgemm(false, false, (int)(T * N), (int)I, (int)G, 1.0f, dg, (int)G, w_ih, (int)I,
                         0.0f, zd_tensor_data(gin[0]), (int)I);
        else
            rc = -1;
    }
    if (rc == 0 && want_h0) {
        if ((gin[1] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(in_h0), zd_tensor_ndim(in_h0))))
            memcpy(zd_tensor_data(gin[1]), dh, sizeof(float) * (size_t)(N * H));
        else
            rc = -1;
    }
    if (rc == 0 && zd_autograd_node_needs_grad(n, 2)) {
        if ((gin[2] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(in_c0), zd_tensor_ndim(in_c0))))
            memcpy(zd_tensor_data(gin[2]), dc, sizeof(float) * (size_t)(N * H));
        else
            rc = -1;
    }
    if (rc == 0 && zd_autograd_node_needs_grad(n, 3)) {
        if ((gin[3] = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){G, I}, 2)))
            zd__nn_sgemm(true, false, (int)G, (int)I, (int)(T * N), 1.0f, dg, (int)G,
                         zd_tensor_data(in_x), (int)I, 0.0f, zd_tensor_data(gin[3]), (int)I);
        else
            rc = -1;
    }
    if (rc == 0 && zd_autograd_node_needs_grad(n, 4)) {
        /* dw_hh = sum_t dG_t^T h_{t-1}: h_{-1} = h0, then the outputs */
        const bool written = c->h0 || T > 1; /* else the gradient is zero */
        if ((gin[4] = written ? zd_tensor_empty(ZD_FLOAT32, (int64_t[]){G, H}, 2)
                              : zd_tensor_new(ZD_FLOAT32, (int64_t[]){G, H}, 2))) {
            float *dw = zd_tensor_data(gin[4]);
            float beta = 0.0f;
            if (c->h0) {
                zd__nn_sgemm(true, false, (int)G, (int)H, (int)N, 1.0f, dg, (int)G,
                             zd_tensor_data(c->h0), (int)H, 0.0f, dw, (int)H);
                beta = 1.0f;
            }
            if (T > 1)
                zd__nn_sgemm(true, false, (int)G, (int)H, (int)((T - 1) * N), 1.0f, dg + N * G,
                             (int)G, zd_tensor_data(c->y), (int)H, beta, dw, (int)H);
        } else {
            rc = -1;
        }
    }
    /* both biases get the same gradient: sum once, copy once */
    for (int k = 5; rc == 0 && k < 7; k++) {
        if (!zd_autograd_node_needs_grad(n, k))
            continue;
        if (k == 6 && gin[5])
            gin[6] = zd_tensor_detach_copy(gin[5]);
        else
            gin[k] = zd__rnn_bias_grad(dg, T * N, G);
        if (!gin[k])
            rc = -1;
    }
    free(dg);
    return rc;
}

static const zd_autograd_node_ops_t lstm_ops =
    ZD_AUTOGRAD_NODE_OPS("LstmBackward", lstm_backward, lstm_release);

/*  One step's gates and states: rows of N, hidden units [lo, hi). */
typedef struct {
    row_forward_fn *kernel;
    int64_t N, H;
    float *gt, *ct, *tct, *yt;
    const float *cprev, *zeros;
} step_t;

static void step_gates(void *arg, int lo, int hi)
{
    const step_t *s = arg;
    const int64_t H = s->H, G = 4 * H;
    for (int64_t r = 0; r < s->N; r++) {
        float *g = s->gt + r * G + lo;
        s->kernel(g, g + H, g + 2 * H, g + 3 * H, (s->cprev ? s->cprev + r * H : s->zeros) + lo,
                  s->ct + r * H + lo, s->tct + r * H + lo, s->yt + r * H + lo, hi - lo);
    }
}

/*  The forward pass over T steps into y (T*N, H) and the ctx's buffers;
    c_T goes to cT. zeros: H zeros (the previous cell state without c0).
    With w_hh packed, each step's product and its gates are one job on the
    pool: the product's columns are split by hidden units, all four gates
    of a unit on the same thread, which runs their gates right after. */
static void lstm_run(lstm_ctx_t *c, const zd_tensor_t *b_ih, const zd_tensor_t *b_hh, float *y,
                     float *cT, const float *zeros)
{
    const int64_t T = c->T, N = c->d.N, I = c->d.I, H = c->d.H, G = 4 * H;
    const float *w_hh = zd_tensor_data(c->w_hh);
    zd__nn_sgemm(false, true, (int)(T * N), (int)G, (int)I, 1.0f, zd_tensor_data(c->x), (int)I,
                 zd_tensor_data(c->w_ih), (int)I, 0.0f, c->gates, (int)G);
    zd__rnn_add_bias(c->gates, T * N, G, b_ih, b_hh);
    rnn_packed_t pk = {0};
    const bool packed =
        T > 1 && zd__rnn_packed_wanted() && zd__rnn_pack(&pk, w_hh, (int)H, (int)G, 4, true) == 0;
    for (int64_t t = 0; t < T; t++) {
        step_t s = {.kernel = forward_kernel(),
                    .N = N,
                    .H = H,
                    .gt = c->gates + t * N * G,
                    .ct = c->c + t * N * H,
                    .tct = c->tc + t * N * H,
                    .yt = y + t * N * H,
                    .zeros = zeros};
        const float *hprev = t > 0 ? s.yt - N * H : c->h0 ? zd_tensor_data(c->h0) : NULL;
        s.cprev = t > 0 ? s.ct - N * H : c->c0 ? zd_tensor_data(c->c0) : NULL;
        if (hprev && packed) {
            zd__rnn_gemm_packed((int)N, hprev, (int)H, &pk, true, s.gt, (int)G, step_gates, &s);
            continue;
        }
        if (hprev)
            zd__nn_sgemm(false, true, (int)N, (int)G, (int)H, 1.0f, hprev, (int)H, w_hh, (int)H,
                         1.0f, s.gt, (int)G);
        step_gates(&s, 0, (int)H);
    }
    zd__rnn_packed_free(&pk);
    memcpy(cT, c->c + (T - 1) * N * H, sizeof(float) * (size_t)(N * H));
}

/*  One layer: x (T, N, I), or (N, I) for a cell; h0, c0 of N*H elements
    (their shapes checked by the caller) or NULL. A layer gives y (T, N, H)
    and h_T, c_T (1, N, H); a cell (hT NULL) gives y = h' and c' (N, H). */
static int lstm_layer(zd_tensor_t *x, zd_tensor_t *h0, zd_tensor_t *c0, zd_tensor_t *w_ih,
                      zd_tensor_t *w_hh, zd_tensor_t *b_ih, zd_tensor_t *b_hh, const rnn_dims_t *d,
                      zd_tensor_t **y_out, zd_tensor_t **hT_out, zd_tensor_t **cT_out)
{
    const bool cell = hT_out == NULL;
    const int64_t N = d->N, H = d->H, T = cell ? 1 : zd_tensor_size(x, 0);
    const int64_t yshape[3] = {T, N, H}, sshape[3] = {1, N, H};
    /* BLAS takes int sizes: every matrix handed to it must fit */
    if (T * N > INT32_MAX / (4 * H) || T * N > INT32_MAX / d->I)
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "lstm: %lld steps of batch %lld, hidden %lld, input %lld: too large",
            (long long)T, (long long)N, (long long)H, (long long)d->I);
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, cell ? yshape + 1 : yshape, cell ? 2 : 3);
    zd_tensor_t *hT = cell ? NULL : zd_tensor_empty(ZD_FLOAT32, sshape, 3);
    zd_tensor_t *cT = zd_tensor_empty(ZD_FLOAT32, cell ? sshape + 1 : sshape, cell ? 2 : 3);
    lstm_ctx_t *c = calloc(1, sizeof *c);
    if (c) {
        c->gates = malloc(sizeof(float) * (size_t)(T * N * (4 * H + 2 * H) + H));
        c->c = c->gates ? c->gates + T * N * 4 * H : NULL;
        c->tc = c->gates ? c->c + T * N * H : NULL;
    }
    if (!y || (!cell && !hT) || !cT || !c || !c->gates) {
        zd_tensor_unref(y);
        zd_tensor_unref(hT);
        zd_tensor_unref(cT);
        lstm_ctx_free(c);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "lstm: out of memory");
    }
    c->d = *d;
    c->T = T;
    c->x = zd_tensor_ref(x);
    c->h0 = zd_tensor_ref(h0);
    c->c0 = zd_tensor_ref(c0);
    c->w_ih = zd_tensor_ref(w_ih);
    c->w_hh = zd_tensor_ref(w_hh);
    float *zeros = c->tc + T * N * H;
    memset(zeros, 0, sizeof(float) * (size_t)H);
    lstm_run(c, b_ih, b_hh, zd_tensor_data(y), zd_tensor_data(cT), zeros);
    if (hT)
        memcpy(zd_tensor_data(hT), zd_tensor_data(y) + (T - 1) * N * H,
               sizeof(float) * (size_t)(N * H));

    zd_tensor_t *in[7] = {x, h0, c0, w_ih, w_hh, b_ih, b_hh};
    zd_autograd_node_t *n;
    if (zd_autograd_node_new(&lstm_ops, in, 7, cell ? 2 : 3, &n) < 0 ||
        (n && !(c->y = zd_tensor_detach(y)))) {
        zd_autograd_node_unref(n);
        zd_tensor_unref(y);
        zd_tensor_unref(hT);
        zd_tensor_unref(cT);
        lstm_ctx_free(c);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "lstm: out of memory");
    }
    if (n) {
        zd_autograd_node_set_ctx(n, c);
        zd_autograd_node_set_output(n, y);
        if (hT)
            zd_autograd_node_set_output(n, hT);
        zd_autograd_node_set_output(n, cT);
        zd_autograd_node_unref(n);
    } else {
        lstm_ctx_free(c);
    }
    *y_out = y;
    if (hT_out)
        *hT_out = hT;
    *cT_out = cT;
    return 0;
}

int zd_nn_lstm_cell(zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *c, zd_tensor_t *w_ih,
                    zd_tensor_t *w_hh, zd_tensor_t *b_ih, zd_tensor_t *b_hh, zd_tensor_t **h_out,
                    zd_tensor_t **c_out)
{
    if (!h_out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_lstm_cell: NULL h_out");
    if (!c_out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_lstm_cell: NULL c_out");
    *h_out = NULL;
    *c_out = NULL;
    rnn_dims_t d;
    if (zd__rnn_check_weights("lstm_cell", 4, x, 2, w_ih, w_hh, b_ih, b_hh, &d) < 0 ||
        zd__rnn_check_state("lstm_cell: h", h, 2, &d) < 0 ||
        zd__rnn_check_state("lstm_cell: c", c, 2, &d) < 0)
        return -1;
    return lstm_layer(x, h, c, w_ih, w_hh, b_ih, b_hh, &d, h_out, NULL, c_out);
}

/*  ---- several layers over a sequence ---- */

/*  Layer l's slice (1, N, H) of a state (L, N, H), or NULL for NULL. */
static int state_slice(zd_tensor_t *s, int l, zd_tensor_t **out)
{
    *out = NULL;
    return s ? zd_tensor_narrow(s, 0, l, 1, out) : 0;
}

/*  Checks what zd_nn_lstm can before it runs: the layer count, layer 0's
    weights against x, and h0, c0. Layers above are checked as they run,
    against their actual input. */
static int check_lstm_args(zd_tensor_t *x, zd_tensor_t *h0, zd_tensor_t *c0,
                           zd_tensor_t *const *params, int num_layers, rnn_dims_t *d)
{
    if (num_layers < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "lstm: num_layers is %d, expected at least 1",
                                 num_layers);
    if (!params)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "lstm: params is NULL");
    if (zd__rnn_check_weights("lstm: layer 0", 4, x, 3, params[0], params[1], params[2], params[3],
                              d) < 0)
        return -1;
    const zd_tensor_t *st[2] = {h0, c0};
    for (int k = 0; k < 2; k++) {
        const char *what = k ? "lstm: c0" : "lstm: h0";
        if (!st[k])
            continue;
        if (zd__nn_check_f32(what, st[k]) < 0 || zd__nn_check_ndim(what, st[k], 3) < 0)
            return -1;
        if (zd_tensor_size(st[k], 0) != num_layers || zd_tensor_size(st[k], 1) != d->N ||
            zd_tensor_size(st[k], 2) != d->H) {
            char s[64];
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: shape %s, expected (%d, %lld, %lld)",
                                     what, zd_tensor_shape_str(st[k], s, sizeof s), num_layers,
                                     (long long)d->N, (long long)d->H);
        }
    }
    return 0;
}

int zd_nn_lstm(zd_tensor_t *x, zd_tensor_t *h0, zd_tensor_t *c0, zd_tensor_t *const *params,
               int num_layers, float dropout, bool training, zd_rng_t *rng, zd_tensor_t **out,
               zd_tensor_t **h_n, zd_tensor_t **c_n)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_lstm: NULL out");
    *out = NULL;
    if (h_n)
        *h_n = NULL;
    if (c_n)
        *c_n = NULL;
    rnn_dims_t d0;
    if (check_lstm_args(x, h0, c0, params, num_layers, &d0) < 0)
        return -1;
    if (!(dropout >= 0.0f && dropout <= 1.0f))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "lstm: dropout %g is not in [0, 1]",
                                 (double)dropout);
    if (training && dropout > 0.0f && num_layers > 1 && !rng)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "lstm: dropout in training needs a random generator");
    zd_tensor_t **states = calloc(2 * (size_t)num_layers, sizeof *states);
    if (!states)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "lstm: out of memory");
    zd_tensor_t **hs = states, **cs = states + num_layers;
    zd_tensor_t *input = zd_tensor_ref(x), *y = NULL;
    int rc = 0;
    for (int l = 0; l < num_layers && rc == 0; l++) {
        zd_tensor_t *const *p = params + 4 * l;
        zd_tensor_t *hl = NULL, *cl = NULL;
        rnn_dims_t d;
        char op[32];
        snprintf(op, sizeof op, "lstm: layer %d", l);
        rc = zd__rnn_check_weights(op, 4, input, 3, p[0], p[1], p[2], p[3], &d);
        if (rc == 0 && d.H != d0.H) {
            char s[64];
            rc = zd_error_set_code(
                ZD_ERR_ARGUMENT, "%s: weight_hh has shape %s, expected (%lld, %lld) as layer 0's",
                op, zd_tensor_shape_str(p[1], s, sizeof s), (long long)(4 * d0.H), (long long)d0.H);
        }
        if (rc == 0)
            rc = state_slice(h0, l, &hl);
        if (rc == 0)
            rc = state_slice(c0, l, &cl);
        if (rc == 0)
            rc = lstm_layer(input, hl, cl, p[0], p[1], p[2], p[3], &d, &y, &hs[l], &cs[l]);
        zd_tensor_unref(hl);
        zd_tensor_unref(cl);
        zd_tensor_unref_p(&input);
        if (rc == 0 && l + 1 < num_layers) {
            rc = zd_nn_dropout(y, dropout, training && dropout > 0.0f, rng, &input);
            zd_tensor_unref_p(&y);
        }
    }
    zd_tensor_unref(input);
    if (rc == 0 && h_n)
        rc = zd_tensor_cat(hs, num_layers, 0, h_n);
    if (rc == 0 && c_n)
        rc = zd_tensor_cat(cs, num_layers, 0, c_n);
    for (int k = 0; k < 2 * num_layers; k++)
        zd_tensor_unref(states[k]);
    free(states);
    if (rc < 0) {
        zd_tensor_unref(y);
        if (h_n)
            zd_tensor_unref_p(h_n);
        if (c_n)
            zd_tensor_unref_p(c_n);
        return -1;
    }
    *out = y;
    return 0;
}
