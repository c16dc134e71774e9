/*  conv_taps.c: stride-1 convolutions without im2col (the GEMMs over
    shifted planes of conv_direct.c), per sample, for conv.c's chunks.

    Forward: the output, numbered q = oh*Wp + ow over the padded input's
    width, goes to per-thread scratch in one product; the epilogue (copy,
    relu or pool) then reads its Wo good columns of each row. Backward:
    the output gradient is spread back into that numbering with zeros in
    the junk columns (so it adds nothing to the weight gradient), and, for
    the input gradient, into a plane padded by kh-1 rows and kw-1 columns
    on each side, which the flipped kernel sweeps like a forward pass. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/error.h"
#include "nn/conv_private.h"

static int round16(int n)
{
    return (n + 15) / 16 * 16;
}

static atomic_bool taps_off;

void nn_conv_use_taps(bool on)
{
    atomic_store(&taps_off, !on);
}

void conv_taps_plan(conv_ctx_t *ctx)
{
    const nn_conv_geom_t *g = &ctx->g;
    ctx->taps = false;
    if (!nn_conv_direct_available() || g->stride != 1 || atomic_load(&taps_off))
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
}

static size_t padded_input_floats(const conv_ctx_t *ctx)
{
    return ctx->g.padding ? (size_t)ctx->g.C * ctx->t.Hp * ctx->t.Wp : 0;
}

size_t conv_taps_fwd_scratch(const conv_ctx_t *ctx)
{
    return (size_t)ctx->O * ctx->t.ldy + padded_input_floats(ctx);
}

size_t conv_taps_bwd_scratch(const conv_ctx_t *ctx, bool need_x)
{
    size_t n = (size_t)ctx->O * ctx->t.ldy + padded_input_floats(ctx);
    if (need_x)
        n += (size_t)ctx->O * ctx->t.Hq * ctx->t.Wq + (size_t)ctx->g.C * ctx->t.ldx;
    return n;
}

void conv_taps_offsets(const conv_ctx_t *ctx, int32_t *offs)
{
    const nn_conv_geom_t *g = &ctx->g;
    for (int c = 0; c < g->C; c++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++)
                *offs++ = (c * ctx->t.Hp + ki) * ctx->t.Wp + kj;
}

int conv_taps_dx_prepare(const conv_ctx_t *ctx, const float *w, float *wflip,
                         int32_t *offs_dx)
{
    const nn_conv_geom_t *g = &ctx->g;
    const int kk = g->kh * g->kw, Kx = ctx->O * kk;
    /* Row c, column (o, t) of the flipped kernel is w[o][c][kk-1-t]. */
    int32_t *koff = malloc(sizeof(int32_t) * (size_t)Kx);
    if (!koff)
        return error_set("conv2d backward: out of memory");
    for (int o = 0; o < ctx->O; o++)
        for (int t = 0; t < kk; t++)
            koff[o * kk + t] = o * g->C * kk + kk - 1 - t;
    nn_taps_pack(w, g->C, Kx, kk, koff, wflip);
    free(koff);
    for (int o = 0; o < ctx->O; o++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++)
                *offs_dx++ = (o * ctx->t.Hq + ki) * ctx->t.Wq + kj;
    return 0;
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

void conv_taps_fwd_chunk(void *arg, int c, float *scratch)
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
        nn_taps_gemm(j->wpack, O, K, j->offs, sample_input(ctx, j->x, s, pad), t->L, j->b,
                     yext, t->ldy);
        float *ys = j->y + s * per_out;
        if (ctx->epi == EPI_POOL) {
            const int pp = ctx->Hp * ctx->Wp;
            for (int o = 0; o < O; o++)
                nn_pool_plane(yext + (size_t)o * t->ldy, Ho, Wo, t->Wp, ctx->pool_k,
                              ctx->pool_s, ys + (size_t)o * pp, ctx->argmax + (s * O + o) * pp);
            continue;
        }
        for (int o = 0; o < O; o++)
            for (int oh = 0; oh < Ho; oh++) {
                const float *restrict src = yext + (size_t)o * t->ldy + (size_t)oh * t->Wp;
                float *restrict dst = ys + ((size_t)o * Ho + oh) * Wo;
                if (ctx->epi == EPI_RELU)
                    for (int ow = 0; ow < Wo; ow++)
                        dst[ow] = src[ow] > 0.0f ? src[ow] : 0.0f;
                else
                    memcpy(dst, src, sizeof(float) * (size_t)Wo);
            }
    }
}

/*  The gradient of sample s's convolution output in the taps numbering
    (rows Wp apart, zeros in the junk columns): dy itself, or through the
    relu or the pool. */
static void spread_out_grad(const conv_bwd_job_t *j, int64_t s, float *dyext)
{
    const conv_ctx_t *ctx = j->ctx;
    const conv_taps_geom_t *t = &ctx->t;
    const int O = ctx->O, Ho = ctx->g.Ho, Wo = ctx->g.Wo;
    const float *dys = j->dy + s * conv_out_per_sample(ctx);
    if (ctx->epi == EPI_POOL) {
        const int pp = ctx->Hp * ctx->Wp;
        for (int o = 0; o < O; o++) {
            float *d = dyext + (size_t)o * t->ldy;
            const int32_t *am = ctx->argmax + (s * O + o) * pp;
            const float *g = dys + (size_t)o * pp;
            memset(d, 0, sizeof(float) * (size_t)t->L);
            for (int i = 0; i < pp; i++)
                d[am[i]] += g[i];
        }
        return;
    }
    const float *ys = ctx->epi == EPI_RELU ? j->y + s * conv_out_per_sample(ctx) : NULL;
    for (int o = 0; o < O; o++)
        for (int oh = 0; oh < Ho; oh++) {
            size_t at = ((size_t)o * Ho + oh) * Wo;
            const float *restrict g = dys + at;
            float *restrict d = dyext + (size_t)o * t->ldy + (size_t)oh * t->Wp;
            if (ys)
                for (int ow = 0; ow < Wo; ow++) {
                    float v = g[ow];
                    d[ow] = ys[at + ow] > 0.0f ? v : 0.0f;
                }
            else
                memcpy(d, g, sizeof(float) * (size_t)Wo);
            if (oh + 1 < Ho)
                for (int ow = Wo; ow < t->Wp; ow++)
                    d[ow] = 0.0f;
        }
}

/*  dyp (O planes Hq x Wq) = dyext's good columns inside a border of kh-1
    rows and kw-1 columns of zeros. */
static void pad_out_grad(const conv_ctx_t *ctx, const float *dyext, float *dyp)
{
    const conv_taps_geom_t *t = &ctx->t;
    const int Ho = ctx->g.Ho, Wo = ctx->g.Wo, ph = ctx->g.kh - 1, pw = ctx->g.kw - 1;
    for (int o = 0; o < ctx->O; o++) {
        float *d = dyp + (size_t)o * t->Hq * t->Wq;
        const float *src = dyext + (size_t)o * t->ldy;
        memset(d, 0, sizeof(float) * (size_t)ph * t->Wq);
        d += (size_t)ph * t->Wq;
        for (int oh = 0; oh < Ho; oh++, d += t->Wq) {
            for (int k = 0; k < pw; k++)
                d[k] = d[pw + Wo + k] = 0.0f;
            memcpy(d + pw, src + (size_t)oh * t->Wp, sizeof(float) * (size_t)Wo);
        }
        memset(d, 0, sizeof(float) * (size_t)ph * t->Wq);
    }
}

void conv_taps_bwd_chunk(void *arg, int c, float *scratch)
{
    const conv_bwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const conv_taps_geom_t *t = &ctx->t;
    const int O = ctx->O, C = g->C, K = C * g->kh * g->kw, Kx = O * g->kh * g->kw;
    float *dyext = scratch, *pad = dyext + (size_t)O * t->ldy;
    float *dyp = pad + padded_input_floats(ctx);
    float *dxext = dyp + (size_t)O * t->Hq * t->Wq;
    int64_t lo, hi;
    nn_chunk_range(ctx->N, j->n_chunks, c, &lo, &hi);
    if (j->dw_part)
        memset(j->dw_part[c], 0, sizeof(float) * (size_t)O * K);
    if (j->db_part)
        memset(j->db_part + (size_t)c * O, 0, sizeof(float) * (size_t)O);
    for (int64_t s = lo; s < hi; s++) {
        spread_out_grad(j, s, dyext);
        if (j->db_part) {
            float *db = j->db_part + (size_t)c * O;
            for (int o = 0; o < O; o++)
                db[o] += conv_sum_row(dyext + (size_t)o * t->ldy, t->L);
        }
        if (j->dw_part)
            nn_taps_gemm_nt(dyext, O, t->ldy, K, j->offs, sample_input(ctx, j->x, s, pad),
                            t->L, j->dw_part[c], K);
        if (j->dx) {
            pad_out_grad(ctx, dyext, dyp);
            nn_taps_gemm(j->wflip, C, Kx, j->offs_dx, dyp, t->Lx, NULL, dxext, t->ldx);
            const int p = g->padding;
            float *dxs = j->dx + (size_t)s * C * g->H * g->W;
            for (int ch = 0; ch < C; ch++)
                for (int i = 0; i < g->H; i++)
                    memcpy(dxs + ((size_t)ch * g->H + i) * g->W,
                           dxext + (size_t)ch * t->ldx + (size_t)(i + p) * t->Wq + p,
                           sizeof(float) * (size_t)g->W);
        }
    }
}
