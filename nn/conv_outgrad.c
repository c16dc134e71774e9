/* SPDX-License-Identifier: MIT */
/*  conv_outgrad.c: the stride-1 path's backward inputs (conv_taps.c): the
    gradient of one sample's convolution output, taken back through the
    fused relu if any, written in the two layouts the products read (a fused
    pool's backward runs over its winners instead, conv_sparse.c):

      dyt  positions x channels (row q = oh*Wp + ow, ldt floats apart): the
           weight gradient's operand; rows of junk columns are not written
           (zd__nn_taps_gemm_bt skips them);
      dyp  per channel, the plane padded by kh-1 rows and kw-1 columns of
           zeros on each side: the input gradient's operand.

    With AVX-512, 16 channels x 16 columns of an output row are loaded at a
    time (through the relu's mask), stored into dyp as they are and into dyt
    through a 16 x 16 transpose: every element is written once; with AVX2,
    8 x 8. Like the rest of the stride-1 path, this runs with the AVX-512 or
    AVX2 kernels only (zd__conv_taps_plan), those the plan chose. */
#include <immintrin.h>
#include <string.h>

#include "nn/conv_private.h"
#include "nn/simd_avx2.h"

/*  Zeroes dyp's borders (the interior is written elsewhere). */
static void zero_borders(const conv_ctx_t *ctx, float *dyp)
{
    const conv_taps_geom_t *t = &ctx->t;
    const int Ho = ctx->g.Ho, Wo = ctx->g.Wo, ph = ctx->g.kh - 1, pw = ctx->g.kw - 1;
    for (int o = 0; o < ctx->O; o++) {
        float *d = dyp + (size_t)o * t->Hq * t->Wq;
        memset(d, 0, sizeof(float) * ((size_t)ph * t->Wq + pw));
        d += (size_t)ph * t->Wq + pw;
        /* each row's right border, then the next row's left one */
        for (int oh = 0; oh + 1 < Ho; oh++, d += t->Wq)
            for (int i = 0; i < 2 * pw; i++)
                d[Wo + i] = 0.0f;
        memset(d + Wo, 0, sizeof(float) * ((size_t)ph * t->Wq + pw));
    }
}

/*  Where sample s's gradient of output channel o0, row oh, column ow0
    starts in dy (and y), and the step between channels. */
static inline size_t grad_at(const conv_ctx_t *ctx, int64_t s, int o0, int oh, int ow0)
{
    const int Ho = ctx->g.Ho, Wo = ctx->g.Wo;
    return (size_t)s * conv_out_per_sample(ctx) + ((size_t)o0 * Ho + oh) * Wo + ow0;
}

NN_AVX512_BEGIN

/*  Sum of g[0..n), or of g where y > 0 (relu's gradient) when y is
    non-NULL, in double: the fused ops (relu, pool) and their compositions
    sum the same values in different orders (a pool's zeros, relu's mask),
    and a channel's sum often cancels to a small number, so float sums
    would differ in their last digits. Without branches: the signs of y are
    random. */
static float grad_sum_avx512(const float *g, const float *y, int64_t n)
{
    int64_t i = 0;
    double total = 0.0;
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (; i < n; i += 16) {
        __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffff : (1u << (n - i)) - 1);
        if (y)
            m = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, y + i), _mm512_setzero_ps(),
                                        _CMP_GT_OQ);
        __m512 v = _mm512_maskz_loadu_ps(m, g + i);
        acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
        acc1 = _mm512_add_pd(
            acc1,
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
    }
    total = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
    for (; i < n; i++)
        total += !y || y[i] > 0.0f ? (double)g[i] : 0.0;
    return (float)total;
}

static inline __mmask16 lanes(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
}

/*  v[i] = columns ow0.. (n of them) of output row oh of channel o0 + i's
    gradient (through the relu, if any), i < no; zeros past no. */
static inline void grad_rows(const conv_bwd_job_t *j, int64_t s, int o0, int no, int oh, int ow0,
                             int n, __m512 v[16])
{
    const conv_ctx_t *ctx = j->ctx;
    const __mmask16 m = lanes(n);
    const size_t at = grad_at(ctx, s, o0, oh, ow0), step = (size_t)ctx->g.Ho * ctx->g.Wo;
    for (int i = no; i < 16; i++)
        v[i] = _mm512_setzero_ps();
    for (int i = 0; i < no; i++) {
        __m512 g = _mm512_maskz_loadu_ps(m, j->dy + at + i * step);
        if (ctx->epi == EPI_RELU) {
            __mmask16 pos = _mm512_mask_cmp_ps_mask(
                m, _mm512_maskz_loadu_ps(m, j->y + at + i * step), _mm512_setzero_ps(), _CMP_GT_OQ);
            g = _mm512_maskz_mov_ps(pos, g);
        }
        v[i] = g;
    }
}

static void plain_grads_avx512(const conv_bwd_job_t *j, int64_t s, float *dyt, float *dyp)
{
    const conv_ctx_t *ctx = j->ctx;
    const conv_taps_geom_t *t = &ctx->t;
    const int O = ctx->O, Ho = ctx->g.Ho, Wo = ctx->g.Wo, lt = conv_taps_ldt(ctx);
    const size_t plane = (size_t)t->Hq * t->Wq;
    const size_t inner = (size_t)(ctx->g.kh - 1) * t->Wq + ctx->g.kw - 1;
    for (int o0 = 0; o0 < O; o0 += 16) {
        const int no = O - o0 < 16 ? O - o0 : 16;
        for (int oh = 0; oh < Ho; oh++)
            for (int ow0 = 0; ow0 < Wo; ow0 += 16) {
                const int n = Wo - ow0 < 16 ? Wo - ow0 : 16;
                __m512 v[16];
                grad_rows(j, s, o0, no, oh, ow0, n, v);
                float *dp = dyp ? dyp + o0 * plane + inner + (size_t)oh * t->Wq + ow0 : NULL;
                for (int i = 0; dp && i < no; i++)
                    _mm512_mask_storeu_ps(dp + i * plane, lanes(n), v[i]);
                if (!dyt)
                    continue;
                conv_transpose16(v);
                float *d = dyt + ((size_t)oh * t->Wp + ow0) * lt + o0;
                for (int l = 0; l < n; l++)
                    _mm512_storeu_ps(d + (size_t)l * lt, v[l]);
            }
    }
    if (dyp)
        zero_borders(ctx, dyp);
}
NN_AVX512_END

NN_AVX2_BEGIN
/*  grad_sum_avx512, 8 floats at a time. */
static float grad_sum_avx2(const float *g, const float *y, int64_t n)
{
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    for (int64_t i = 0; i < n; i += 8) {
        const int k = n - i < 8 ? (int)(n - i) : 8;
        __m256 v = avx2_loadn(g + i, k);
        if (y)
            v = _mm256_and_ps(v,
                              _mm256_cmp_ps(avx2_loadn(y + i, k), _mm256_setzero_ps(), _CMP_GT_OQ));
        acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
        acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
    }
    __m256d a = _mm256_add_pd(acc0, acc1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    return (float)_mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/*  grad_rows, 8 channels x 8 columns. */
static inline void grad_rows_avx2(const conv_bwd_job_t *j, int64_t s, int o0, int no, int oh,
                                  int ow0, int n, __m256 v[8])
{
    const conv_ctx_t *ctx = j->ctx;
    const size_t at = grad_at(ctx, s, o0, oh, ow0), step = (size_t)ctx->g.Ho * ctx->g.Wo;
    for (int i = no; i < 8; i++)
        v[i] = _mm256_setzero_ps();
    for (int i = 0; i < no; i++) {
        __m256 g = avx2_loadn(j->dy + at + i * step, n);
        if (ctx->epi == EPI_RELU)
            g = _mm256_and_ps(g,
                              _mm256_cmp_ps(avx2_loadn(j->y + at + i * step, n),
                                            _mm256_setzero_ps(), _CMP_GT_OQ));
        v[i] = g;
    }
}

static void plain_grads_avx2(const conv_bwd_job_t *j, int64_t s, float *dyt, float *dyp)
{
    const conv_ctx_t *ctx = j->ctx;
    const conv_taps_geom_t *t = &ctx->t;
    const int O = ctx->O, Ho = ctx->g.Ho, Wo = ctx->g.Wo, lt = conv_taps_ldt(ctx);
    const size_t plane = (size_t)t->Hq * t->Wq;
    const size_t inner = (size_t)(ctx->g.kh - 1) * t->Wq + ctx->g.kw - 1;
    for (int o0 = 0; o0 < O; o0 += 8) {
        const int no = O - o0 < 8 ? O - o0 : 8;
        for (int oh = 0; oh < Ho; oh++)
            for (int ow0 = 0; ow0 < Wo; ow0 += 8) {
                const int n = Wo - ow0 < 8 ? Wo - ow0 : 8;
                __m256 v[8];
                grad_rows_avx2(j, s, o0, no, oh, ow0, n, v);
                float *dp = dyp ? dyp + o0 * plane + inner + (size_t)oh * t->Wq + ow0 : NULL;
                for (int i = 0; dp && i < no; i++)
                    avx2_storen(dp + i * plane, n, v[i]);
                if (!dyt)
                    continue;
                /* 8 channels of each position: within the row's ldt */
                avx2_transpose8(v);
                float *d = dyt + ((size_t)oh * t->Wp + ow0) * lt + o0;
                for (int l = 0; l < n; l++)
                    _mm256_storeu_ps(d + (size_t)l * lt, v[l]);
            }
    }
    if (dyp)
        zero_borders(ctx, dyp);
}
NN_AVX2_END

/*  Adds sample s's bias gradient (the sums of its output gradient) to db. */
static void bias_grad(const conv_bwd_job_t *j, int64_t s, float *db)
{
    const conv_ctx_t *ctx = j->ctx;
    const int O = ctx->O;
    const int64_t per = conv_out_per_sample(ctx) / O;
    const float *dys = j->dy + s * conv_out_per_sample(ctx);
    const float *ys = ctx->epi == EPI_RELU ? j->y + s * conv_out_per_sample(ctx) : NULL;
    for (int o = 0; o < O; o++) {
        const float *g = dys + o * per, *y = ys ? ys + o * per : NULL;
        db[o] += ctx->isa == NN_ISA_AVX512 ? grad_sum_avx512(g, y, per) : grad_sum_avx2(g, y, per);
    }
}

void zd__conv_out_grads(const conv_bwd_job_t *j, int64_t s, float *dyt, float *dyp, float *db)
{
    if (db)
        bias_grad(j, s, db);
    if (!dyt && !dyp)
        return;
    if (j->ctx->isa == NN_ISA_AVX512)
        plain_grads_avx512(j, s, dyt, dyp);
    else
        plain_grads_avx2(j, s, dyt, dyp);
}
