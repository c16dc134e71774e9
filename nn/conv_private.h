/* SPDX-License-Identifier: MIT */
/*  conv_private.h: what conv.c (the op, and the im2col path) shares with
    conv_taps.c (the stride-1 path without unfolding). */
#ifndef ZDIST_NN_CONV_PRIVATE_H
#define ZDIST_NN_CONV_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include "nn/nn_private.h"

#include <immintrin.h>

NN_AVX512_BEGIN
/*  r[j] = column j of the 16 x 16 tile whose rows are r[0..15]. */
static inline void conv_transpose16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++)
        for (int h = 0; h < 2; h++) {
            __m512d a = _mm512_castps_pd(t[4 * i + h]), b = _mm512_castps_pd(t[4 * i + h + 2]);
            r[4 * i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
            r[4 * i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        }
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + k + 4], 0x88);
            t[8 * i + k + 4] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + k + 4], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        r[k] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0x88);
        r[k + 8] = _mm512_shuffle_f32x4(t[k], t[k + 8], 0xdd);
    }
}
NN_AVX512_END

typedef enum { EPI_NONE, EPI_RELU, EPI_POOL } conv_epilogue_t;

/*  The stride-1 path's layout (conv_taps.c): the input padded to Hp x Wp,
    the output numbered q = oh*Wp + ow for q < L (junk where ow >= Wo) in
    rows ldy floats apart; for the input gradient, the output gradient
    padded by the kernel to Hq x Wq and the padded input's gradient numbered
    r = ih*Wq + iw, r < Lx, in rows ldx apart. */
typedef struct {
    int Hp, Wp, L, ldy;
    int Hq, Wq, Lx, ldx;
} conv_taps_geom_t;

typedef struct {
    nn_conv_geom_t g;
    int N, O;
    conv_epilogue_t epi;
    int pool_k, pool_s, Hp, Wp; /* EPI_POOL: window, stride, pooled plane */
    int32_t *argmax;            /* EPI_POOL: N*O*Hp*Wp winners in the conv plane (taps
                                     path: in its numbering, rows t.Wp apart) */
    bool taps;                  /* the stride-1 path (conv_taps.c) */
    nn_isa_t isa;               /* taps path: its kernels (AVX-512 or AVX2), as planned */
    bool sparse;                /* taps path through a pool: backward over the winners
                                     (conv_sparse.c) */
    conv_taps_geom_t t;
} conv_ctx_t;

/*  Floats of the layer's output per sample (after the epilogue). */
static inline int64_t conv_out_per_sample(const conv_ctx_t *c)
{
    return (int64_t)c->O * (c->epi == EPI_POOL ? c->Hp * c->Wp : c->g.Ho * c->g.Wo);
}

/*  Sum in 16 independent lanes (vectorisable; float addition order is
    otherwise fixed by the language). */
static inline float conv_sum_row(const float *restrict d, int n)
{
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            acc[k] += d[i + k];
    float total = 0.0f;
    for (; i < n; i++)
        total += d[i];
    for (int k = 0; k < 16; k++)
        total += acc[k];
    return total;
}

/*  The forward pass over the samples of chunk c of n_chunks. */
typedef struct {
    const conv_ctx_t *ctx;
    int n_chunks;
    const float *x, *w, *b;
    float *y;
    const float *wpack;  /* taps path: weight packed by zd__nn_taps_pack */
    const int32_t *offs; /* taps path: the K taps into the padded input */
} conv_fwd_job_t;

/*  One backward pass, split by samples: chunk c handles its own samples
    with its own partial dW and db, summed in chunk order afterwards (so the
    result does not depend on thread timing). */
typedef struct {
    const conv_ctx_t *ctx;
    int n_chunks;
    const float *x, *dy;
    const float *y;         /* EPI_RELU: the layer's output */
    const float *wt;        /* im2col path: weight transposed, K x O */
    const float *wflip;     /* taps path: flipped, transposed weight packed (C x O*kh*kw) */
    const int32_t *offs;    /* taps path: the K taps into the padded input */
    const int32_t *offs_dx; /* taps path: the O*kh*kw taps into the padded gradient */
    const int32_t *toff;    /* sparse: each weight-gradient vector's offset in a row */
    const float *wr;        /* sparse: the weight as (channel block, O, tap) vectors */
    float *dx;              /* NULL: no input gradient */
    float **dw_part;        /* per chunk, O x K (taps path: K x O); NULL: no weight gradient */
    float *db_part;         /* n_chunks x O; NULL: no bias gradient */
} conv_bwd_job_t;

/*  ---- the stride-1 path (conv_taps.c) ---- */

/*  Whether ctx (geometry filled in) takes the stride-1 path; if so, fills
    ctx->t and sets ctx->taps and ctx->isa (the kernels chosen now: the
    backward pass runs on the same ones). */
void zd__conv_taps_plan(conv_ctx_t *ctx);

/*  Scratch floats per chunk of the forward / backward pass. */
size_t zd__conv_taps_fwd_scratch(const conv_ctx_t *ctx);
size_t zd__conv_taps_bwd_scratch(const conv_ctx_t *ctx, bool need_w, bool need_x);

/*  The taps of the forward pass (and of dW): K = C*kh*kw offsets. */
void zd__conv_taps_offsets(const conv_ctx_t *ctx, int32_t *offs);

/*  Ints of the backward pass's tables (zd__conv_taps_bwd_prepare). */
size_t zd__conv_taps_bwd_ints(const conv_ctx_t *ctx);

/*  Fills job's taps tables from `ints` (zd__conv_taps_bwd_ints of them) and,
    when job->dx is set, wflip (zd__nn_taps_packed_floats(C, O*kh*kw) floats)
    from the weight w. 0, or -1 (zd_error_set) out of memory. */
int zd__conv_taps_bwd_prepare(conv_bwd_job_t *job, const float *w, int32_t *ints, float *wflip);

/*  Floats of the weight as the backward pass needs it (conv.c allocates
    them for zd__conv_taps_bwd_prepare's wflip). */
size_t zd__conv_taps_bwd_wfloats(const conv_ctx_t *ctx);

/*  ---- the pooled backward over the winners (conv_sparse.c) ----
    The same four steps, for a ctx with sparse set (conv_taps.c dispatches
    to them); the chunk's partial weight gradient comes out in the taps
    path's layout (K x O). */
size_t zd__conv_sparse_scratch(const conv_ctx_t *ctx, bool need_w, bool need_x);
size_t zd__conv_sparse_ints(const conv_ctx_t *ctx);
size_t zd__conv_sparse_wfloats(const conv_ctx_t *ctx);
void zd__conv_sparse_prepare(conv_bwd_job_t *job, const float *w, int32_t *ints, float *wr);
void zd__conv_sparse_bwd_chunk(void *arg, int c, float *scratch);

/*  Row stride of the output gradient transposed (positions x channels). */
static inline int conv_taps_ldt(const conv_ctx_t *ctx)
{
    return (ctx->O + 15) / 16 * 16;
}

/*  Sample s's output gradient taken back through the relu or pool, into
    dyt (positions x channels, row stride conv_taps_ldt; rows of junk
    columns left as they are) and dyp (the planes padded by the kernel),
    each when non-NULL; adds its bias gradient to db when non-NULL
    (conv_outgrad.c). */
void zd__conv_out_grads(const conv_bwd_job_t *j, int64_t s, float *dyt, float *dyp, float *db);

void zd__conv_taps_fwd_chunk(void *arg, int c, float *scratch);
void zd__conv_taps_bwd_chunk(void *arg, int c, float *scratch);

#endif
