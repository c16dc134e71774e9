/* SPDX-License-Identifier: MIT */
/*  conv_sparse.c: the backward pass of a stride-1 convolution fused with a
    max pool, over the pool's winners only (AVX-512).

    Through a max pool, a window's gradient reaches one convolution output,
    its argmax; the other outputs get zero. With 2x2 windows, three in four
    entries of the convolution's output gradient are zeros, and a dense
    product multiplies them all. Here each window's winner q (channel o,
    gradient g) adds, for every tap t of the kernel (input position
    p = q + off(t)) and every input channel c:

        dW[o][c][t] += g * x[c][p]          dx[c][p] += g * W[o][c][t]

    a quarter of the dense products' work. The input and its gradient are
    kept position-major (xt[p][c], one sample, channels padded to whole
    vectors), so both updates are whole vectors. For dW, a block of 9
    vectors (taps x channel blocks) of dW[o] stays in registers while a row
    of o's windows is summed. For dx, the channels of a window that won at
    the same position (found with vector compares of the window's winners,
    a vector of channels at a time) form a group, and each group's sum of
    g * W[o] (9 tap vectors of a channel block, in registers) is added to
    dx once: one read-modify-write of dx per group instead of per channel.
    Windows and channels are taken in a fixed order, so the sums do not
    depend on threads. This runs with the AVX-512 or AVX2 kernels only
    (zd__conv_taps_plan), those the plan chose; the vectors of the layouts
    are theirs (16 floats or 8: with AVX2, a 1-channel input, the
    ConvNet's, is padded to 8 channels, not 16), the sums the same. */
#include <immintrin.h>
#include <string.h>

#include "nn/conv_private.h"
#include "nn/simd_avx2.h"

/*  Floats per vector of the plan's kernels. */
static int vw(const conv_ctx_t *ctx)
{
    return ctx->isa == NN_ISA_AVX512 ? 16 : 8;
}

/*  Channels per position row, padded to whole vectors. */
static int ldc(const conv_ctx_t *ctx)
{
    return (ctx->g.C + vw(ctx) - 1) / vw(ctx) * vw(ctx);
}

/*  Vectors per (tap, channel block): the rows of one output channel's
    weight gradient. */
static int n_vec(const conv_ctx_t *ctx)
{
    return ctx->g.kh * ctx->g.kw * (ldc(ctx) / vw(ctx));
}

static size_t plane_rows(const conv_ctx_t *ctx)
{
    return (size_t)ctx->t.Hp * ctx->t.Wp;
}

static int n_windows(const conv_ctx_t *ctx)
{
    return ctx->Hp * ctx->Wp;
}

/*  Rows of windows the weight gradient sums at a time, every channel's:
    as many as keep the input rows their winners reach ((n - 1) * pool_s
    + pool_k + kh - 1 of them) within 32 KB, an L1 cache; at least one.
    Each call of winners_dw adds its sums into one channel's
    accumulators (73 KB in all for the Net's conv2, so from L2): a row of
    12 windows a call, as first written, spent much of its time there;
    with three rows the Net's conv2 backward took 7.3 ms a batch of 32
    instead of 8.3 (one thread, AVX2 EPYC, best of six). */
static int dw_window_rows(const conv_ctx_t *ctx)
{
    const int row = ctx->t.Wp * ldc(ctx) * (int)sizeof(float);
    const int fit = 32 * 1024 / (row > 0 ? row : 1);
    const int first = ctx->pool_k + ctx->g.kh - 1, s = ctx->pool_s > 0 ? ctx->pool_s : 1;
    const int n = fit >= first ? (fit - first) / s + 1 : 1;
    return n > ctx->Hp ? ctx->Hp : n;
}

size_t zd__conv_sparse_scratch(const conv_ctx_t *ctx, bool need_w, bool need_x)
{
    size_t rows = plane_rows(ctx) * (size_t)ldc(ctx);
    return (need_w ? rows + (size_t)ctx->O * n_vec(ctx) * vw(ctx) : 0) + (need_x ? rows : 0);
}

size_t zd__conv_sparse_ints(const conv_ctx_t *ctx)
{
    return (size_t)n_vec(ctx);
}

size_t zd__conv_sparse_wfloats(const conv_ctx_t *ctx)
{
    return (size_t)ctx->O * n_vec(ctx) * vw(ctx);
}

void zd__conv_sparse_prepare(conv_bwd_job_t *job, const float *w, int32_t *ints, float *wr)
{
    const conv_ctx_t *ctx = job->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const int kk = g->kh * g->kw, n = vw(ctx), cv = ldc(ctx) / n;
    /* vector v = (tap t, channel block b): offset of its floats from a
       winner's row in xt / dxt */
    for (int t = 0; t < kk; t++)
        for (int b = 0; b < cv; b++)
            ints[t * cv + b] = ((t / g->kw) * ctx->t.Wp + t % g->kw) * ldc(ctx) + n * b;
    job->toff = ints;
    if (!wr)
        return;
    /* wr[b][o][t][l] = w[o][n*b + l][t] (zero past C), n floats a vector:
       one channel block's weights together */
    for (int b = 0; b < cv; b++)
        for (int o = 0; o < ctx->O; o++)
            for (int t = 0; t < kk; t++)
                for (int l = 0; l < n; l++) {
                    int c = n * b + l;
                    wr[(((size_t)b * ctx->O + o) * kk + t) * n + l] =
                        c < g->C ? w[((size_t)o * g->C + c) * kk + t] : 0.0f;
                }
    job->wr = wr;
}

/*  Zeroes the rows of xt (or dxt) in the padding around the plane: the
    transposes below write every other row, all ldc channels of it. */
static void zero_border_rows(const conv_ctx_t *ctx, float *xt)
{
    const nn_conv_geom_t *g = &ctx->g;
    const size_t ld = (size_t)ldc(ctx), Wp = (size_t)ctx->t.Wp, p = (size_t)g->padding;
    const size_t ends = (p * Wp + p) * ld * sizeof(float), sides = 2 * p * ld * sizeof(float);
    /* the top rows and the first row's left border, then each row's right
       border with the next one's left, then the last one's and the bottom
       rows */
    memset(xt, 0, ends);
    for (size_t ih = 0; ih + 1 < (size_t)g->H; ih++)
        memset(xt + ((ih + p) * Wp + p + (size_t)g->W) * ld, 0, sides);
    memset(xt + ((g->H - 1 + p) * Wp + p + (size_t)g->W) * ld, 0, ends);
}

/*  The weights of channel block b from tap t0 on: w[o] at + o*kk*vw. */
static const float *wr_block(const conv_bwd_job_t *j, int b, int t0)
{
    const int kk = j->ctx->g.kh * j->ctx->g.kw;
    return j->wr + ((size_t)b * j->ctx->O * kk + t0) * vw(j->ctx);
}

NN_AVX512_BEGIN
static inline __mmask16 lanes(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
}

/*  The channel planes of one sample (C x H x W) as position rows of the
    padded plane: xt[(ih + pad)*Wp + iw + pad][c], 16 x 16 tiles through
    conv_transpose16; rows in the border are left as they are. */
static void planes_to_rows_avx512(const conv_ctx_t *ctx, const float *x, float *xt)
{
    const nn_conv_geom_t *g = &ctx->g;
    const int ld = ldc(ctx), Wp = ctx->t.Wp, p = g->padding;
    for (int c0 = 0; c0 < ld; c0 += 16)
        for (int ih = 0; ih < g->H; ih++)
            for (int iw0 = 0; iw0 < g->W; iw0 += 16) {
                const int n = g->W - iw0 < 16 ? g->W - iw0 : 16;
                __m512 v[16];
                for (int i = 0; i < 16; i++)
                    v[i] = c0 + i < g->C
                        ? _mm512_maskz_loadu_ps(lanes(n),
                                                x + ((size_t)(c0 + i) * g->H + ih) * g->W + iw0)
                        : _mm512_setzero_ps();
                conv_transpose16(v);
                float *d = xt + ((size_t)(ih + p) * Wp + iw0 + p) * ld + c0;
                for (int l = 0; l < n; l++)
                    _mm512_storeu_ps(d + (size_t)l * ld, v[l]);
            }
}

/*  The inverse, for the input gradient: dx[c][ih][iw] = dxt[(ih + pad)*Wp
    + iw + pad][c]. */
static void rows_to_planes_avx512(const conv_ctx_t *ctx, const float *dxt, float *dx)
{
    const nn_conv_geom_t *g = &ctx->g;
    const int ld = ldc(ctx), Wp = ctx->t.Wp, p = g->padding;
    for (int c0 = 0; c0 < g->C; c0 += 16)
        for (int ih = 0; ih < g->H; ih++)
            for (int iw0 = 0; iw0 < g->W; iw0 += 16) {
                const int n = g->W - iw0 < 16 ? g->W - iw0 : 16;
                const float *src = dxt + ((size_t)(ih + p) * Wp + iw0 + p) * ld + c0;
                __m512 v[16];
                for (int l = 0; l < 16; l++)
                    v[l] = l < n ? _mm512_loadu_ps(src + (size_t)l * ld) : _mm512_setzero_ps();
                conv_transpose16(v);
                for (int i = 0; i < 16 && c0 + i < g->C; i++)
                    _mm512_mask_storeu_ps(dx + ((size_t)(c0 + i) * g->H + ih) * g->W + iw0,
                                          lanes(n), v[i]);
            }
}

#define A9(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8)

/*  acc[v] += sum over the pp windows of g[w] * xt[am[w]*ld + toff[v]], for
    the nv vectors v of one output channel: 9 at a time in registers (not
    inlined: in its caller the 9 tap offsets would not keep registers). */
__attribute__((noinline)) static void winners_dw_avx512(const float *xt, int ld, const int32_t *am,
                                                        const float *g, int pp, const int32_t *toff,
                                                        int nv, float *acc)
{
    int v0 = 0;
    for (; v0 + 9 <= nv; v0 += 9) {
#define DECL(i)                                                                                    \
    __m512 a##i = _mm512_setzero_ps();                                                             \
    const int32_t t##i = toff[v0 + i];
        A9(DECL)
#undef DECL
        for (int w = 0; w < pp; w++) {
            const float *x = xt + (size_t)am[w] * ld;
            const __m512 gv = _mm512_set1_ps(g[w]);
#define FMA(i) a##i = _mm512_fmadd_ps(gv, _mm512_loadu_ps(x + t##i), a##i);
            A9(FMA)
#undef FMA
        }
#define ADD(i)                                                                                     \
    _mm512_storeu_ps(acc + 16 * (v0 + i),                                                          \
                     _mm512_add_ps(_mm512_loadu_ps(acc + 16 * (v0 + i)), a##i));
        A9(ADD)
#undef ADD
    }
    for (; v0 < nv; v0++) { /* the rest, a vector at a time */
        __m512 a = _mm512_setzero_ps();
        for (int w = 0; w < pp; w++)
            a = _mm512_fmadd_ps(_mm512_set1_ps(g[w]),
                                _mm512_loadu_ps(xt + (size_t)am[w] * ld + toff[v0]), a);
        _mm512_storeu_ps(acc + 16 * v0, _mm512_add_ps(_mm512_loadu_ps(acc + 16 * v0), a));
    }
}

/*  d[to[i*cv]] += sum over the channels o0 + bit of grp of g[o*pp] *
    wb[o*kk*16 + 16i..], i < nt: one group's input gradient. */
static inline void group_dx_avx512(const float *wb, int kk, const float *g, int pp, int o0,
                                   uint64_t grp, int nt, const int32_t *to, int cv, float *d)
{
    if (nt == 9) {
#define DECL(i) __m512 a##i = _mm512_setzero_ps();
        A9(DECL)
#undef DECL
        for (uint64_t m = grp; m; m &= m - 1) {
            const int o = o0 + __builtin_ctzll(m);
            const float *wo = wb + (size_t)o * kk * 16;
            const __m512 gv = _mm512_set1_ps(g[(size_t)o * pp]);
#define FMA(i) a##i = _mm512_fmadd_ps(gv, _mm512_loadu_ps(wo + 16 * i), a##i);
            A9(FMA)
#undef FMA
        }
#define ADD(i)                                                                                     \
    _mm512_storeu_ps(d + to[i * cv], _mm512_add_ps(_mm512_loadu_ps(d + to[i * cv]), a##i));
        A9(ADD)
#undef ADD
        return;
    }
    for (int tt = 0; tt < nt; tt++) { /* the last taps, one at a time */
        __m512 a = _mm512_setzero_ps();
        for (uint64_t m = grp; m; m &= m - 1) {
            const int o = o0 + __builtin_ctzll(m);
            a = _mm512_fmadd_ps(_mm512_set1_ps(g[(size_t)o * pp]),
                                _mm512_loadu_ps(wb + ((size_t)o * kk + tt) * 16), a);
        }
        _mm512_storeu_ps(d + to[tt * cv], _mm512_add_ps(_mm512_loadu_ps(d + to[tt * cv]), a));
    }
}

/*  dxt[q + off(t)][16b..] += sum over the channels o whose winner in
    window w is q of g * w[o][16b..][t], for sample s, every window and
    group: taps 9 at a time in registers, channels 64 at a time as bits. */
static void groups_dx_avx512(const conv_bwd_job_t *j, int64_t s, float *dxt)
{
    const conv_ctx_t *ctx = j->ctx;
    const int O = ctx->O, kk = ctx->g.kh * ctx->g.kw, ld = ldc(ctx), cv = ld / 16;
    const int pp = n_windows(ctx);
    const int32_t *ams = ctx->argmax + s * conv_out_per_sample(ctx);
    const float *dys = j->dy + s * conv_out_per_sample(ctx);
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int b = 0; b < cv; b++)
        for (int t0 = 0; t0 < kk; t0 += 9) {
            const int nt = kk - t0 < 9 ? kk - t0 : 9;
            const float *wb = wr_block(j, b, t0);
            const int32_t *to = j->toff + (size_t)t0 * cv + b;
            for (int w = 0; w < pp; w++)
                for (int o0 = 0; o0 < O; o0 += 64) {
                    /* the window's winners, channels o0.. as 4 vectors */
                    const int n = O - o0 < 64 ? O - o0 : 64;
                    __m512i key[4];
                    for (int v = 0; v < 4; v++) {
                        __m512i idx = _mm512_mullo_epi32(
                            _mm512_add_epi32(lane, _mm512_set1_epi32(o0 + 16 * v)),
                            _mm512_set1_epi32(pp));
                        key[v] = _mm512_mask_i32gather_epi32(_mm512_set1_epi32(-1),
                                                             lanes(n - 16 * v), idx, ams + w, 4);
                    }
                    uint64_t rem = n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
                    while (rem) {
                        const int q = ams[(size_t)(o0 + __builtin_ctzll(rem)) * pp + w];
                        const __m512i qv = _mm512_set1_epi32(q);
                        uint64_t grp = 0;
                        for (int v = 0; v < 4; v++)
                            grp |= (uint64_t)_mm512_cmpeq_epi32_mask(key[v], qv) << (16 * v);
                        grp &= rem;
                        rem &= ~grp;
                        float *d = dxt + (size_t)q * ld;
                        group_dx_avx512(wb, kk, dys + w, pp, o0, grp, nt, to, cv, d);
                    }
                }
        }
}

NN_AVX512_END

NN_AVX2_BEGIN
/*  planes_to_rows_avx512 in 8 x 8 tiles. */
static void planes_to_rows_avx2(const conv_ctx_t *ctx, const float *x, float *xt)
{
    const nn_conv_geom_t *g = &ctx->g;
    const int ld = ldc(ctx), Wp = ctx->t.Wp, p = g->padding;
    for (int c0 = 0; c0 < ld; c0 += 8)
        for (int ih = 0; ih < g->H; ih++)
            for (int iw0 = 0; iw0 < g->W; iw0 += 8) {
                const int n = g->W - iw0 < 8 ? g->W - iw0 : 8;
                __m256 v[8];
                for (int i = 0; i < 8; i++)
                    v[i] = c0 + i < g->C
                        ? avx2_loadn(x + ((size_t)(c0 + i) * g->H + ih) * g->W + iw0, n)
                        : _mm256_setzero_ps();
                avx2_transpose8(v);
                float *d = xt + ((size_t)(ih + p) * Wp + iw0 + p) * ld + c0;
                for (int l = 0; l < n; l++)
                    _mm256_storeu_ps(d + (size_t)l * ld, v[l]);
            }
}

/*  rows_to_planes_avx512 in 8 x 8 tiles. */
static void rows_to_planes_avx2(const conv_ctx_t *ctx, const float *dxt, float *dx)
{
    const nn_conv_geom_t *g = &ctx->g;
    const int ld = ldc(ctx), Wp = ctx->t.Wp, p = g->padding;
    for (int c0 = 0; c0 < g->C; c0 += 8)
        for (int ih = 0; ih < g->H; ih++)
            for (int iw0 = 0; iw0 < g->W; iw0 += 8) {
                const int n = g->W - iw0 < 8 ? g->W - iw0 : 8;
                const float *src = dxt + ((size_t)(ih + p) * Wp + iw0 + p) * ld + c0;
                __m256 v[8];
                for (int l = 0; l < 8; l++)
                    v[l] = l < n ? _mm256_loadu_ps(src + (size_t)l * ld) : _mm256_setzero_ps();
                avx2_transpose8(v);
                for (int i = 0; i < 8 && c0 + i < g->C; i++)
                    avx2_storen(dx + ((size_t)(c0 + i) * g->H + ih) * g->W + iw0, n, v[i]);
            }
}

/*  winners_dw_avx512 with vectors of 8. */
__attribute__((noinline)) static void winners_dw_avx2(const float *xt, int ld, const int32_t *am,
                                                      const float *g, int pp, const int32_t *toff,
                                                      int nv, float *acc)
{
    int v0 = 0;
    for (; v0 + 9 <= nv; v0 += 9) {
#define DECL(i)                                                                                    \
    __m256 a##i = _mm256_setzero_ps();                                                             \
    const int32_t t##i = toff[v0 + i];
        A9(DECL)
#undef DECL
        for (int w = 0; w < pp; w++) {
            const float *x = xt + (size_t)am[w] * ld;
            const __m256 gv = _mm256_broadcast_ss(g + w);
#define FMA(i) a##i = _mm256_fmadd_ps(gv, _mm256_loadu_ps(x + t##i), a##i);
            A9(FMA)
#undef FMA
        }
#define ADD(i)                                                                                     \
    _mm256_storeu_ps(acc + 8 * (v0 + i), _mm256_add_ps(_mm256_loadu_ps(acc + 8 * (v0 + i)), a##i));
        A9(ADD)
#undef ADD
    }
    for (; v0 < nv; v0++) { /* the rest, a vector at a time */
        __m256 a = _mm256_setzero_ps();
        for (int w = 0; w < pp; w++)
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(g + w),
                                _mm256_loadu_ps(xt + (size_t)am[w] * ld + toff[v0]), a);
        _mm256_storeu_ps(acc + 8 * v0, _mm256_add_ps(_mm256_loadu_ps(acc + 8 * v0), a));
    }
}

/*  group_dx_avx512 with vectors of 8: wb[o*kk*8 + 8i..]. */
static inline void group_dx_avx2(const float *wb, int kk, const float *g, int pp, int o0,
                                 uint64_t grp, int nt, const int32_t *to, int cv, float *d)
{
    if (nt == 9) {
#define DECL(i) __m256 a##i = _mm256_setzero_ps();
        A9(DECL)
#undef DECL
        for (uint64_t m = grp; m; m &= m - 1) {
            const int o = o0 + __builtin_ctzll(m);
            const float *wo = wb + (size_t)o * kk * 8;
            const __m256 gv = _mm256_broadcast_ss(g + (size_t)o * pp);
#define FMA(i) a##i = _mm256_fmadd_ps(gv, _mm256_loadu_ps(wo + 8 * i), a##i);
            A9(FMA)
#undef FMA
        }
#define ADD(i)                                                                                     \
    _mm256_storeu_ps(d + to[i * cv], _mm256_add_ps(_mm256_loadu_ps(d + to[i * cv]), a##i));
        A9(ADD)
#undef ADD
        return;
    }
    for (int tt = 0; tt < nt; tt++) { /* the last taps, one at a time */
        __m256 a = _mm256_setzero_ps();
        for (uint64_t m = grp; m; m &= m - 1) {
            const int o = o0 + __builtin_ctzll(m);
            a = _mm256_fmadd_ps(_mm256_broadcast_ss(g + (size_t)o * pp),
                                _mm256_loadu_ps(wb + ((size_t)o * kk + tt) * 8), a);
        }
        _mm256_storeu_ps(d + to[tt * cv], _mm256_add_ps(_mm256_loadu_ps(d + to[tt * cv]), a));
    }
}

/*  The groups of a run of (window, block of 64 output channels) pairs:
    the channels that won at one position (a mask of the block) and that
    position. A window has at most pool_k^2 positions, so a pair has at
    most that many groups. */
#define DX_PAIRS   64
#define DX_ENTRIES 1024

typedef struct {
    int q[DX_ENTRIES];
    uint64_t grp[DX_ENTRIES];
    int first[DX_PAIRS + 1]; /* pair i's groups: first[i] .. first[i + 1] */
} dx_groups_t;

/*  groups_dx_avx512 with the window's winners as 8 vectors of 8 channels,
    the groups of a run of windows found once (gathers and compares) for
    every channel block and tap block, not once each. Each dx row gets its
    windows' sums in the same order (window, then channel block) as one
    window at a time. */
static void groups_dx_avx2(const conv_bwd_job_t *j, int64_t s, float *dxt)
{
    const conv_ctx_t *ctx = j->ctx;
    const int O = ctx->O, kk = ctx->g.kh * ctx->g.kw, ld = ldc(ctx), cv = ld / 8;
    const int pp = n_windows(ctx), nblk = (O + 63) / 64;
    const int per_pair = ctx->pool_k * ctx->pool_k < 64 ? ctx->pool_k * ctx->pool_k : 64;
    const int64_t pairs = (int64_t)pp * nblk;
    const int32_t *ams = ctx->argmax + s * conv_out_per_sample(ctx);
    const float *dys = j->dy + s * conv_out_per_sample(ctx);
    /* where channel 8v + lane's winners start, relative to channel o0's */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256i idx[8];
    for (int v = 0; v < 8; v++)
        idx[v] = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(8 * v)),
                                    _mm256_set1_epi32(pp));
    dx_groups_t gs;
    for (int64_t k0 = 0; k0 < pairs;) {
        int ng = 0, np = 0;
        for (; k0 + np < pairs && np < DX_PAIRS && ng + per_pair <= DX_ENTRIES; np++) {
            const int w = (int)((k0 + np) / nblk), o0 = 64 * (int)((k0 + np) % nblk);
            gs.first[np] = ng;
            /* the window's winners, channels o0.. as 8 vectors */
            const int n = O - o0 < 64 ? O - o0 : 64;
            const int32_t *am = ams + (size_t)o0 * pp + w;
            __m256i key[8];
            for (int v = 0; v < 8; v++)
                key[v] = _mm256_mask_i32gather_epi32(_mm256_set1_epi32(-1), am, idx[v],
                                                     avx2_lanes(n - 8 * v), 4);
            uint64_t rem = n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
            while (rem && ng < DX_ENTRIES) {
                const int q = ams[(size_t)(o0 + __builtin_ctzll(rem)) * pp + w];
                const __m256i qv = _mm256_set1_epi32(q);
                uint64_t grp = 0;
                for (int v = 0; v < 8; v++)
                    grp |= (uint64_t)(unsigned)_mm256_movemask_ps(
                               _mm256_castsi256_ps(_mm256_cmpeq_epi32(key[v], qv)))
                        << (8 * v);
                grp &= rem;
                rem &= ~grp;
                gs.q[ng] = q;
                gs.grp[ng++] = grp;
            }
        }
        gs.first[np] = ng;
        for (int b = 0; b < cv; b++)
            for (int t0 = 0; t0 < kk; t0 += 9) {
                const int nt = kk - t0 < 9 ? kk - t0 : 9;
                const float *wb = wr_block(j, b, t0);
                const int32_t *to = j->toff + (size_t)t0 * cv + b;
                for (int i = 0; i < np; i++) {
                    const int w = (int)((k0 + i) / nblk), o0 = 64 * (int)((k0 + i) % nblk);
                    for (int g = gs.first[i]; g < gs.first[i + 1]; g++)
                        group_dx_avx2(wb, kk, dys + w, pp, o0, gs.grp[g], nt, to, cv,
                                      dxt + (size_t)gs.q[g] * ld);
                }
            }
        k0 += np;
    }
}
NN_AVX2_END

/*  The chunk is written once: `isa` (a constant in each copy below) picks
    the kernels. */
#define NN_BODY static inline __attribute__((always_inline))

NN_BODY void sparse_bwd_chunk(void *arg, int c, float *scratch, nn_isa_t isa)
{
    const conv_bwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const int O = ctx->O, C = g->C, kk = g->kh * g->kw;
    const int n = vw(ctx), ld = ldc(ctx), nv = n_vec(ctx), cv = ld / n, pp = ctx->Hp * ctx->Wp;
    const size_t rows = plane_rows(ctx) * (size_t)ld;
    float *xt = j->dw_part ? scratch : NULL;
    float *acc = j->dw_part ? scratch + rows : NULL;
    float *dxt = j->dx ? scratch + (j->dw_part ? rows + (size_t)O * nv * n : 0) : NULL;
    float *db = j->db_part ? j->db_part + (size_t)c * O : NULL;
    int64_t lo, hi;
    nn_chunk_range(ctx->N, j->n_chunks, c, &lo, &hi);
    if (acc)
        memset(acc, 0, sizeof(float) * (size_t)O * nv * n);
    if (db)
        memset(db, 0, sizeof(float) * (size_t)O);
    for (int64_t s = lo; s < hi; s++) {
        zd__conv_out_grads(j, s, NULL, NULL, db);
        const float *dys = j->dy + s * conv_out_per_sample(ctx);
        const int32_t *ams = ctx->argmax + s * conv_out_per_sample(ctx);
        /* a few rows of windows at a time (dw_window_rows), every
           channel's: the input rows their winners reach stay in L1 */
        if (xt) {
            if (g->padding)
                zero_border_rows(ctx, xt);
            const float *xs = j->x + (size_t)s * C * g->H * g->W;
            if (isa == NN_ISA_AVX512)
                planes_to_rows_avx512(ctx, xs, xt);
            else
                planes_to_rows_avx2(ctx, xs, xt);
            const int step = dw_window_rows(ctx) * ctx->Wp;
            for (int r = 0; r < pp; r += step)
                for (int o = 0; o < O; o++) {
                    const int32_t *am = ams + (size_t)o * pp + r;
                    const float *gw = dys + (size_t)o * pp + r;
                    float *ao = acc + (size_t)o * nv * n;
                    const int nw = pp - r < step ? pp - r : step;
                    if (isa == NN_ISA_AVX512)
                        winners_dw_avx512(xt, ld, am, gw, nw, j->toff, nv, ao);
                    else
                        winners_dw_avx2(xt, ld, am, gw, nw, j->toff, nv, ao);
                }
        }
        if (dxt) {
            float *dxs = j->dx + (size_t)s * C * g->H * g->W;
            memset(dxt, 0, sizeof(float) * rows);
            if (isa == NN_ISA_AVX512) {
                groups_dx_avx512(j, s, dxt);
                rows_to_planes_avx512(ctx, dxt, dxs);
            } else {
                groups_dx_avx2(j, s, dxt);
                rows_to_planes_avx2(ctx, dxt, dxs);
            }
        }
    }
    if (!acc)
        return;
    /* the chunk's partial, in the taps path's layout: dwT[c*kk + t][o] */
    float *part = j->dw_part[c];
    for (int o = 0; o < O; o++)
        for (int v = 0; v < nv; v++)
            for (int l = 0; l < n; l++) {
                int t = v / cv, ch = (v % cv) * n + l;
                if (ch < C)
                    part[((size_t)ch * kk + t) * O + o] = acc[((size_t)o * nv + v) * n + l];
            }
}

NN_AVX512_BEGIN
static void sparse_bwd_chunk_avx512(void *arg, int c, float *scratch)
{
    sparse_bwd_chunk(arg, c, scratch, NN_ISA_AVX512);
}
NN_AVX512_END

NN_AVX2_BEGIN
static void sparse_bwd_chunk_avx2(void *arg, int c, float *scratch)
{
    sparse_bwd_chunk(arg, c, scratch, NN_ISA_AVX2);
}
NN_AVX2_END

void zd__conv_sparse_bwd_chunk(void *arg, int c, float *scratch)
{
    const conv_bwd_job_t *j = arg;
    if (j->ctx->isa == NN_ISA_AVX512)
        sparse_bwd_chunk_avx512(arg, c, scratch);
    else
        sparse_bwd_chunk_avx2(arg, c, scratch);
}
