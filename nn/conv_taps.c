/* SPDX-License-Identifier: MIT */
/*  conv_taps.c: stride-1 convolutions without im2col (the GEMMs over
    shifted planes of conv_direct.c), per sample, for conv.c's chunks.

    Forward: the output, numbered q = oh*Wp + ow over the padded input's
    width, goes to per-thread scratch in one product; the epilogue (copy,
    relu or pool) then reads its Wo good columns of each row. Backward
    (conv_outgrad.c makes its inputs): the weight gradient multiplies the
    shifted input runs by the output gradient transposed, over the good
    columns only; the input gradient sweeps the flipped kernel over the
    output gradient padded by kh-1 rows and kw-1 columns on each side, like
    a forward pass. Through a fused pool, the backward pass runs over the
    pool's winners instead (conv_sparse.c).

    zd__conv_taps_plan takes this path only with the AVX-512 or AVX2
    kernels (zd__nn_cpu_isa): the chunks below are compiled for each, and
    run those the plan chose. */
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include <zdist/error.h>
#include "nn/conv_private.h"
#include "nn/simd_avx2.h"

static int round16(int n)
{
    return (n + 15) / 16 * 16;
}

/*  Runs of a few dozen floats (rows of a plane): a vector at a time, the
    last one under a mask, instead of a memcpy call per row. */
NN_AVX512_BEGIN
static inline __mmask16 run_mask(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
}

static inline void copy_run(float *dst, const float *src, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = run_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
}

/*  dst = src where keep > 0, else 0 (relu, or relu's gradient with
    keep = the relu's output). */
static inline void relu_run(float *dst, const float *src, const float *keep, int n)
{
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = run_mask(n - i);
        __mmask16 pos = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, keep + i),
                                                _mm512_setzero_ps(), _CMP_GT_OQ);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(pos, src + i));
    }
}
NN_AVX512_END

NN_AVX2_BEGIN
static inline void copy_run_avx2(float *dst, const float *src, int n)
{
    for (int i = 0; i < n; i += 8)
        avx2_storen(dst + i, n - i, avx2_loadn(src + i, n - i));
}

static inline void relu_run_avx2(float *dst, const float *src, const float *keep, int n)
{
    for (int i = 0; i < n; i += 8) {
        __m256 pos = _mm256_cmp_ps(avx2_loadn(keep + i, n - i), _mm256_setzero_ps(), _CMP_GT_OQ);
        avx2_storen(dst + i, n - i, _mm256_and_ps(pos, avx2_loadn(src + i, n - i)));
    }
}
NN_AVX2_END

/*  The chunks below are written once: `isa` (a constant in each copy)
    picks the runs' kernels. */
#define NN_BODY static inline __attribute__((always_inline))

NN_BODY void copy_run_isa(float *dst, const float *src, int n, nn_isa_t isa)
{
    if (isa == NN_ISA_AVX512)
        copy_run(dst, src, n);
    else
        copy_run_avx2(dst, src, n);
}

NN_BODY void relu_run_isa(float *dst, const float *src, const float *keep, int n, nn_isa_t isa)
{
    if (isa == NN_ISA_AVX512)
        relu_run(dst, src, keep, n);
    else
        relu_run_avx2(dst, src, keep, n);
}

void zd__conv_taps_plan(conv_ctx_t *ctx)
{
    const nn_conv_geom_t *g = &ctx->g;
    ctx->taps = false;
    if (!zd__nn_taps_enabled() || g->stride != 1)
        return;
    conv_taps_geom_t t;
    t.Hp = g->H + 2 * g->padding;
    t.Wp = g->W + 2 * g->padding;
    /* Junk columns are (kw-1) of every Wp: past a third, im2col wins. */
    if (3 * (g->kw - 1) > t.Wp)
        return;
    t.Hq = g->Ho + 2 * (g->kh - 1);
    t.Wq = g->Wo + 2 * (g->kw - 1);
    int64_t L = (int64_t)(g->Ho - 1) * t.Wp + g->Wo;
    int64_t Lx = (int64_t)(t.Hp - 1) * t.Wq + t.Wp;
    const int64_t lim = INT32_MAX / 2;
    if ((int64_t)g->C * t.Hp * t.Wp > lim || (int64_t)ctx->O * t.Hq * t.Wq > lim ||
        (int64_t)ctx->O * (L + 16) > lim || (int64_t)g->C * (Lx + 16) > lim)
        return;
    t.L = (int)L;
    t.ldy = round16(t.L);
    t.Lx = (int)Lx;
    t.ldx = round16(t.Lx);
    ctx->t = t;
    ctx->taps = true;
    ctx->isa = zd__nn_cpu_isa();
    ctx->sparse = ctx->epi == EPI_POOL;
}

static size_t padded_input_floats(const conv_ctx_t *ctx)
{
    return ctx->g.padding ? (size_t)ctx->g.C * ctx->t.Hp * ctx->t.Wp : 0;
}

size_t zd__conv_taps_fwd_scratch(const conv_ctx_t *ctx)
{
    return (size_t)ctx->O * ctx->t.ldy + padded_input_floats(ctx);
}

void zd__conv_taps_offsets(const conv_ctx_t *ctx, int32_t *offs)
{
    const nn_conv_geom_t *g = &ctx->g;
    for (int c = 0; c < g->C; c++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++)
                *offs++ = (c * ctx->t.Hp + ki) * ctx->t.Wp + kj;
}

/*  dst (rows x Wp-wide planes) = the C planes of xs (H x W) inside a
    border of `pad` zeros. */
static void pad_input(const conv_ctx_t *ctx, const float *xs, float *dst)
{
    const nn_conv_geom_t *g = &ctx->g;
    const int p = g->padding, Wp = ctx->t.Wp;
    for (int c = 0; c < g->C; c++) {
        const float *src = xs + (size_t)c * g->H * g->W;
        float *d = dst + (size_t)c * ctx->t.Hp * Wp;
        memset(d, 0, sizeof(float) * (size_t)p * Wp);
        d += (size_t)p * Wp;
        for (int i = 0; i < g->H; i++, d += Wp) {
            for (int j = 0; j < p; j++)
                d[j] = d[p + g->W + j] = 0.0f;
            memcpy(d + p, src + (size_t)i * g->W, sizeof(float) * (size_t)g->W);
        }
        memset(d, 0, sizeof(float) * (size_t)p * Wp);
    }
}

/*  The input the taps read for sample s: x itself, or its padded copy. */
static const float *sample_input(const conv_ctx_t *ctx, const float *x, int64_t s, float *pad)
{
    const float *xs = x + (size_t)s * ctx->g.C * ctx->g.H * ctx->g.W;
    if (!ctx->g.padding)
        return xs;
    pad_input(ctx, xs, pad);
    return pad;
}

NN_BODY void taps_fwd_chunk(void *arg, int c, float *scratch, nn_isa_t isa)
{
    const conv_fwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const conv_taps_geom_t *t = &ctx->t;
    const int O = ctx->O, Ho = g->Ho, Wo = g->Wo, K = g->C * g->kh * g->kw;
    float *yext = scratch, *pad = scratch + (size_t)O * t->ldy;
    const int64_t per_out = conv_out_per_sample(ctx);
    int64_t lo, hi;
    nn_chunk_range(ctx->N, j->n_chunks, c, &lo, &hi);
    for (int64_t s = lo; s < hi; s++) {
        zd__nn_taps_gemm(j->wpack, O, K, j->offs, sample_input(ctx, j->x, s, pad), t->L, j->b, yext,
                         t->ldy);
        float *ys = j->y + s * per_out;
        if (ctx->epi == EPI_POOL) {
            const int pp = ctx->Hp * ctx->Wp;
            for (int o = 0; o < O; o++)
                zd__nn_pool_plane(yext + (size_t)o * t->ldy, Ho, Wo, t->Wp, t->Wp, ctx->pool_k,
                                  ctx->pool_s, ys + (size_t)o * pp, ctx->argmax + (s * O + o) * pp);
            continue;
        }
        for (int o = 0; o < O; o++)
            for (int oh = 0; oh < Ho; oh++) {
                const float *src = yext + (size_t)o * t->ldy + (size_t)oh * t->Wp;
                float *dst = ys + ((size_t)o * Ho + oh) * Wo;
                if (ctx->epi == EPI_RELU)
                    relu_run_isa(dst, src, src, Wo, isa);
                else
                    copy_run_isa(dst, src, Wo, isa);
            }
    }
}

NN_AVX512_BEGIN
static void taps_fwd_chunk_avx512(void *arg, int c, float *scratch)
{
    taps_fwd_chunk(arg, c, scratch, NN_ISA_AVX512);
}
NN_AVX512_END

NN_AVX2_BEGIN
static void taps_fwd_chunk_avx2(void *arg, int c, float *scratch)
{
    taps_fwd_chunk(arg, c, scratch, NN_ISA_AVX2);
}
NN_AVX2_END

void zd__conv_taps_fwd_chunk(void *arg, int c, float *scratch)
{
    const conv_fwd_job_t *j = arg;
    if (j->ctx->isa == NN_ISA_AVX512)
        taps_fwd_chunk_avx512(arg, c, scratch);
    else
        taps_fwd_chunk_avx2(arg, c, scratch);
}

/*  ---- backward ---- */

/*  The per-sample buffers of the backward pass, carved from scratch at
    multiples of 16 floats (64 bytes, so aligned like scratch); NULL when
    not needed. */
typedef struct {
    float *pad;   /* padded input (padding > 0 and a weight gradient) */
    float *dyt;   /* L x ldt: the output gradient, positions x channels (dW) */
    float *dyp;   /* O planes Hq x Wq: the same, padded by the kernel (dx) */
    float *dxext; /* C x ldx: the padded input's gradient */
} bwd_bufs_t;

static size_t bwd_layout(const conv_ctx_t *ctx, bool need_w, bool need_x, float *base,
                         bwd_bufs_t *b)
{
    const conv_taps_geom_t *t = &ctx->t;
    size_t n = 0;
#define CARVE(field, floats)                                                                       \
    do {                                                                                           \
        size_t f_ = ((floats) + 15) / 16 * 16;                                                     \
        if (b)                                                                                     \
            b->field = base && f_ ? base + n : NULL;                                               \
        n += f_;                                                                                   \
    } while (0)
    CARVE(pad, need_w ? padded_input_floats(ctx) : 0);
    CARVE(dyt, need_w ? (size_t)t->L * conv_taps_ldt(ctx) : 0);
    CARVE(dyp, need_x ? (size_t)ctx->O * t->Hq * t->Wq : 0);
    CARVE(dxext, need_x ? (size_t)ctx->g.C * t->ldx : 0);
#undef CARVE
    return n;
}

size_t zd__conv_taps_bwd_scratch(const conv_ctx_t *ctx, bool need_w, bool need_x)
{
    if (ctx->sparse)
        return zd__conv_sparse_scratch(ctx, need_w, need_x);
    return bwd_layout(ctx, need_w, need_x, NULL, NULL);
}

size_t zd__conv_taps_bwd_wfloats(const conv_ctx_t *ctx)
{
    if (ctx->sparse)
        return zd__conv_sparse_wfloats(ctx);
    return zd__nn_taps_packed_floats(ctx->g.C, ctx->O * ctx->g.kh * ctx->g.kw);
}

size_t zd__conv_taps_bwd_ints(const conv_ctx_t *ctx)
{
    if (ctx->sparse)
        return zd__conv_sparse_ints(ctx);
    return (size_t)ctx->g.C * ctx->g.kh * ctx->g.kw + (size_t)ctx->O * ctx->g.kh * ctx->g.kw;
}

int zd__conv_taps_bwd_prepare(conv_bwd_job_t *job, const float *w, int32_t *ints, float *wflip)
{
    const conv_ctx_t *ctx = job->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const conv_taps_geom_t *t = &ctx->t;
    const int kk = g->kh * g->kw, Kx = ctx->O * kk;
    if (ctx->sparse) {
        zd__conv_sparse_prepare(job, w, ints, job->dx ? wflip : NULL);
        return 0;
    }
    int32_t *offs = ints, *offs_dx = ints + (size_t)g->C * kk;
    zd__conv_taps_offsets(ctx, offs);
    job->offs = offs;
    if (!job->dx)
        return 0;
    /* Row c, column (o, tap) of the flipped kernel is w[o][c][kk-1-tap]. */
    int32_t *koff = malloc(sizeof(int32_t) * (size_t)Kx);
    if (!koff)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "conv2d backward: out of memory");
    for (int o = 0; o < ctx->O; o++)
        for (int k = 0; k < kk; k++)
            koff[o * kk + k] = o * g->C * kk + kk - 1 - k;
    zd__nn_taps_pack(w, g->C, Kx, kk, koff, wflip);
    free(koff);
    for (int o = 0; o < ctx->O; o++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++)
                offs_dx[(o * g->kh + ki) * g->kw + kj] = (o * t->Hq + ki) * t->Wq + kj;
    job->wflip = wflip;
    job->offs_dx = offs_dx;
    return 0;
}

NN_BODY void taps_bwd_chunk(void *arg, int c, float *scratch, nn_isa_t isa)
{
    const conv_bwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const conv_taps_geom_t *t = &ctx->t;
    const int O = ctx->O, C = g->C, K = C * g->kh * g->kw, Kx = O * g->kh * g->kw;
    bwd_bufs_t b;
    bwd_layout(ctx, j->dw_part != NULL, j->dx != NULL, scratch, &b);
    float *db = j->db_part ? j->db_part + (size_t)c * O : NULL;
    int64_t lo, hi;
    nn_chunk_range(ctx->N, j->n_chunks, c, &lo, &hi);
    if (j->dw_part)
        memset(j->dw_part[c], 0, sizeof(float) * (size_t)O * K);
    if (db)
        memset(db, 0, sizeof(float) * (size_t)O);
    for (int64_t s = lo; s < hi; s++) {
        zd__conv_out_grads(j, s, b.dyt, b.dyp, db);
        if (j->dw_part)
            zd__nn_taps_gemm_bt(j->offs, K, sample_input(ctx, j->x, s, b.pad), b.dyt,
                                conv_taps_ldt(ctx), O, g->Ho, g->Wo, t->Wp, j->dw_part[c], O);
        if (j->dx) {
            zd__nn_taps_gemm(j->wflip, C, Kx, j->offs_dx, b.dyp, t->Lx, NULL, b.dxext, t->ldx);
            const int p = g->padding;
            float *dxs = j->dx + (size_t)s * C * g->H * g->W;
            for (int ch = 0; ch < C; ch++)
                for (int i = 0; i < g->H; i++)
                    copy_run_isa(dxs + ((size_t)ch * g->H + i) * g->W,
                                 b.dxext + (size_t)ch * t->ldx + (size_t)(i + p) * t->Wq + p, g->W,
                                 isa);
        }
    }
}

NN_AVX512_BEGIN
static void taps_bwd_chunk_avx512(void *arg, int c, float *scratch)
{
    taps_bwd_chunk(arg, c, scratch, NN_ISA_AVX512);
}
NN_AVX512_END

NN_AVX2_BEGIN
static void taps_bwd_chunk_avx2(void *arg, int c, float *scratch)
{
    taps_bwd_chunk(arg, c, scratch, NN_ISA_AVX2);
}
NN_AVX2_END

void zd__conv_taps_bwd_chunk(void *arg, int c, float *scratch)
{
    const conv_bwd_job_t *j = arg;
    if (j->ctx->sparse)
        zd__conv_sparse_bwd_chunk(arg, c, scratch);
    else if (j->ctx->isa == NN_ISA_AVX512)
        taps_bwd_chunk_avx512(arg, c, scratch);
    else
        taps_bwd_chunk_avx2(arg, c, scratch);
}
