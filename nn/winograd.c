/* SPDX-License-Identifier: MIT */
/*  winograd.c: F(2x2, 3x3) convolutions (see winograd.h for the method).

    Layout. A chunk of the pool's work is one sample. (Cutting samples
    into runs of tile rows would keep threads busy on batches smaller than
    the thread count, but OpenBLAS's rounding depends on a product's size,
    so a sample's result would depend on the batch it came in.) The
    sample's T tiles (t = tile row * tile columns + tile column) are
    transformed channel by channel into V[c][xi][t] (xi = 4*i + j, the
    position in the 4x4 transformed tile); GEMM xi multiplies the transformed
    filters U[xi] (O x C, stored transposed) by the C rows V[.][xi][.] (row
    stride 16*T) into M[o][xi][t]; the output transform then reads, for one
    output channel, 16 rows of T floats that sit next to each other. One
    sample's V and M (about 0.9 MB for the Net's conv2) stay within L2
    between the three steps, which is why the batch is not turned into 16
    large GEMMs (two samples per chunk already ran slower). Those 16
    GEMMs per sample are small (64 x 32 by 32 x 144 for the Net), and
    OpenBLAS spent as long around them as in them (a pass clearing M for
    beta 0, packing V for each): the vector paths run the taps kernel
    (zd__nn_taps_gemm) on U packed once per call instead, writing M
    directly; the portable path keeps BLAS.

    The AVX-512 transforms handle up to 16 tiles of one tile row at once,
    one tile per lane, reading the input planes in place (masked loads give
    the zeros of the padding and of the partial last tile of odd sizes);
    the AVX2 ones do the same 8 tiles at a time. The portable ones (CPUs
    without AVX2, or ZDIST_CPU=generic) go one tile at a time through a
    zero-padded copy of each input plane. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include <zdist/error.h>
#include "nn/nn_private.h"
#include "nn/simd_avx2.h"
#include "nn/winograd.h"

/*  The geometry of one call, as a forward convolution (the input gradient
    is described as the convolution that computes it). */
typedef struct {
    int N, C, H, W, O, pad;
    int Ho, Wo;
    int th, tw, tiles; /* tile rows, tile columns, tiles per sample */
    int hp, ldp;       /* portable path's staging plane: hp rows, ldp floats apart */
    nn_isa_t isa;      /* the transforms' kernels (zd__nn_cpu_isa when planned) */
} wg_plan_t;

typedef struct {
    const wg_plan_t *p;
    const float *x, *u, *bias;
    /* the vector paths: U[xi] packed for zd__nn_taps_gemm (16 of them,
       `packed_floats` apart), and the offsets of V's channel rows */
    const float *packed;
    size_t packed_floats;
    const int32_t *voffs;
    float *y;
    nn_winograd_prologue_fn *prologue;
    nn_winograd_epilogue_fn *epilogue;
    void *arg;
} wg_job_t;

/*  ---- filter transform: U[xi][c][o] = (G g G^T)[xi] for filter (o, c) ----
    G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1]. Sixteen filters at a
    time, one per lane (plain loops the compiler vectorises), so that U's
    rows are written 16 floats at a time. */

#define FB 16

/*  Filters f0 .. f0+n-1 of U's order, tap k of filter f0+i in g[k][i],
    into u[xi * xi_stride + i]. */
static void transform_block(const float g[9][FB], int n, float *u, size_t xi_stride)
{
    float t[4][3][FB], out[4][FB];
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < FB; i++) {
            t[0][j][i] = g[j][i];
            t[1][j][i] = 0.5f * (g[j][i] + g[3 + j][i] + g[6 + j][i]);
            t[2][j][i] = 0.5f * (g[j][i] - g[3 + j][i] + g[6 + j][i]);
            t[3][j][i] = g[6 + j][i];
        }
    for (int r = 0; r < 4; r++) {
        for (int i = 0; i < FB; i++) {
            out[0][i] = t[r][0][i];
            out[1][i] = 0.5f * (t[r][0][i] + t[r][1][i] + t[r][2][i]);
            out[2][i] = 0.5f * (t[r][0][i] - t[r][1][i] + t[r][2][i]);
            out[3][i] = t[r][2][i];
        }
        for (int k = 0; k < 4; k++)
            memcpy(u + (4 * r + k) * xi_stride, out[k], sizeof(float) * (size_t)n);
    }
}

/*  The transformed filters of a convolution with O output and C input
    channels into U [16][C][O] (U[xi] is the GEMM's A, stored transposed:
    OpenBLAS ran these products faster so). The filter of (o, c) is
    w[o,c] of w [O,C,3,3]; with `flip` (the input gradient), it is w[c,o]
    of w [C,O,3,3] turned by 180 degrees. */
static void transform_filters(const float *w, int O, int C, bool flip, float *u)
{
    const size_t F = (size_t)O * C;
    for (size_t f0 = 0; f0 < F; f0 += FB) {
        const int n = F - f0 < FB ? (int)(F - f0) : FB;
        float g[9][FB] = {{0}};
        size_t c = f0 / O, o = f0 % O;
        for (int i = 0; i < n; i++) {
            const float *src = w + (flip ? c * O + o : o * C + c) * 9;
            for (int k = 0; k < 9; k++)
                g[k][i] = src[flip ? 8 - k : k];
            if (++o == (size_t)O) {
                o = 0;
                c++;
            }
        }
        transform_block((const float(*)[FB])g, n, u + f0, F);
    }
}

/*  ---- input transform: V = B^T d B ----
    B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]. */

/*  Input row r of the plane x (H x W), or NULL outside it (padding). */
static inline const float *plane_row(const wg_plan_t *p, const float *x, int r)
{
    return r >= 0 && r < p->H ? x + (size_t)r * p->W : NULL;
}

NN_AVX512_BEGIN
static inline __mmask16 first_lanes(int n)
{
    return (__mmask16)(n >= 16 ? 0xffffu : n <= 0 ? 0u : (1u << n) - 1);
}

/*  Where a run of tiles reads its input rows: from column `start` on,
    with the lanes of masks m[] in the three vectors loaded, then shifted
    right by `shift` lanes (the left padding: zeros coming in). */
typedef struct {
    int start, shift;
    __mmask16 m[3];
} cols_t;

static inline __m512 shift_in(__m512 hi, __m512 lo, int shift)
{
    __m512i h = _mm512_castps_si512(hi), l = _mm512_castps_si512(lo);
    if (shift == 1)
        return _mm512_castsi512_ps(_mm512_alignr_epi32(h, l, 15));
    return _mm512_castsi512_ps(_mm512_alignr_epi32(h, l, 14));
}

/*  One input row (NULL: a row of padding) transformed along its columns:
    *t_j = (d B)[j] for the tiles of the run, one per lane. A tile's
    columns are the row's even and odd columns, split apart by permutes. */
static inline void input_row(const float *row, const cols_t *cc, __m512 *t0, __m512 *t1, __m512 *t2,
                             __m512 *t3)
{
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    if (!row) {
        *t0 = *t1 = *t2 = *t3 = _mm512_setzero_ps();
        return;
    }
    row += cc->start;
    __m512 c0 = _mm512_maskz_loadu_ps(cc->m[0], row);
    __m512 c1 = cc->m[1] ? _mm512_maskz_loadu_ps(cc->m[1], row + 16) : _mm512_setzero_ps();
    __m512 c2 = cc->m[2] ? _mm512_maskz_loadu_ps(cc->m[2], row + 32) : _mm512_setzero_ps();
    if (cc->shift) {
        c2 = shift_in(c2, c1, cc->shift);
        c1 = shift_in(c1, c0, cc->shift);
        c0 = shift_in(c0, _mm512_setzero_ps(), cc->shift);
    }
    __m512 a2 = _mm512_castsi512_ps(
        _mm512_alignr_epi32(_mm512_castps_si512(c1), _mm512_castps_si512(c0), 2));
    __m512 b2 = _mm512_castsi512_ps(
        _mm512_alignr_epi32(_mm512_castps_si512(c2), _mm512_castps_si512(c1), 2));
    __m512 d0 = _mm512_permutex2var_ps(c0, even, c1);
    __m512 d1 = _mm512_permutex2var_ps(c0, odd, c1);
    __m512 d2 = _mm512_permutex2var_ps(a2, even, b2);
    __m512 d3 = _mm512_permutex2var_ps(a2, odd, b2);
    *t0 = _mm512_sub_ps(d0, d2);
    *t1 = _mm512_add_ps(d1, d2);
    *t2 = _mm512_sub_ps(d2, d1);
    *t3 = _mm512_sub_ps(d1, d3);
}

/*  Every tile of the input plane x (read in place: rows and columns
    outside it are zeros) into v (tile t of the sample at v[t]), 16 tiles
    of a tile row at a time, one per lane. Tile row ty reads input rows
    2*ty - pad .. +3, the next one two of the same rows again: their
    column transforms are carried over. */
static void input_transform_avx512(const wg_plan_t *p, const float *x, float *v, size_t ldv)
{
    for (int tx0 = 0; tx0 < p->tw; tx0 += 16) {
        const __mmask16 mask = first_lanes(p->tw - tx0);
        const int c0 = 2 * tx0 - p->pad;
        cols_t cc = {.start = c0 < 0 ? 0 : c0, .shift = c0 < 0 ? -c0 : 0};
        for (int k = 0; k < 3; k++)
            cc.m[k] = first_lanes(p->W - cc.start - 16 * k);
        __m512 a0, a1, a2, a3, b0, b1, b2, b3, c0v, c1v, c2v, c3v, d0, d1, d2, d3;
        input_row(plane_row(p, x, -p->pad), &cc, &a0, &a1, &a2, &a3);
        input_row(plane_row(p, x, 1 - p->pad), &cc, &b0, &b1, &b2, &b3);
        for (int ty = 0; ty < p->th; ty++) {
            const int r2 = 2 * ty + 2 - p->pad;
            float *vt = v + (size_t)ty * p->tw + tx0;
            input_row(plane_row(p, x, r2), &cc, &c0v, &c1v, &c2v, &c3v);
            input_row(plane_row(p, x, r2 + 1), &cc, &d0, &d1, &d2, &d3);
#define STORE4(i, e0, e1, e2, e3)                                                                  \
    do {                                                                                           \
        _mm512_mask_storeu_ps(vt + (4 * (i) + 0) * ldv, mask, e0);                                 \
        _mm512_mask_storeu_ps(vt + (4 * (i) + 1) * ldv, mask, e1);                                 \
        _mm512_mask_storeu_ps(vt + (4 * (i) + 2) * ldv, mask, e2);                                 \
        _mm512_mask_storeu_ps(vt + (4 * (i) + 3) * ldv, mask, e3);                                 \
    } while (0)
            STORE4(0, _mm512_sub_ps(a0, c0v), _mm512_sub_ps(a1, c1v), _mm512_sub_ps(a2, c2v),
                   _mm512_sub_ps(a3, c3v));
            STORE4(1, _mm512_add_ps(b0, c0v), _mm512_add_ps(b1, c1v), _mm512_add_ps(b2, c2v),
                   _mm512_add_ps(b3, c3v));
            STORE4(2, _mm512_sub_ps(c0v, b0), _mm512_sub_ps(c1v, b1), _mm512_sub_ps(c2v, b2),
                   _mm512_sub_ps(c3v, b3));
            STORE4(3, _mm512_sub_ps(b0, d0), _mm512_sub_ps(b1, d1), _mm512_sub_ps(b2, d2),
                   _mm512_sub_ps(b3, d3));
#undef STORE4
            a0 = c0v, a1 = c1v, a2 = c2v, a3 = c3v;
            b0 = d0, b1 = d1, b2 = d2, b3 = d3;
        }
    }
}
NN_AVX512_END

NN_AVX2_BEGIN
/*  cols_t for runs of 8 tiles: lanes n[k] of the three vectors loaded (none
    when <= 0). */
typedef struct {
    int start, shift;
    int n[3];
} cols8_t;

/*  The 16 floats hi:lo shifted right by `shift` lanes: the low 8. */
static inline __m256 shift_in_avx2(__m256 hi, __m256 lo, int shift)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i idx =
        _mm256_and_si256(_mm256_sub_epi32(lane, _mm256_set1_epi32(shift)), _mm256_set1_epi32(7));
    const __m256i from_hi = _mm256_cmpgt_epi32(lane, _mm256_set1_epi32(shift - 1));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                            _mm256_castsi256_ps(from_hi));
}

/*  Lanes 2..9 of the 16 floats hi:lo. */
static inline __m256 skip2_avx2(__m256 hi, __m256 lo)
{
    __m256 mid = _mm256_permute2f128_ps(lo, hi, 0x21);
    return _mm256_castsi256_ps(
        _mm256_alignr_epi8(_mm256_castps_si256(mid), _mm256_castps_si256(lo), 8));
}

/*  The even and odd lanes of the 16 floats hi:lo. */
static inline void split_avx2(__m256 lo, __m256 hi, __m256 *even, __m256 *odd)
{
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256 a = _mm256_permutevar8x32_ps(lo, perm), b = _mm256_permutevar8x32_ps(hi, perm);
    *even = _mm256_permute2f128_ps(a, b, 0x20);
    *odd = _mm256_permute2f128_ps(a, b, 0x31);
}

/*  input_row for a run of 8 tiles. */
static inline void input_row_avx2(const float *row, const cols8_t *cc, __m256 *t0, __m256 *t1,
                                  __m256 *t2, __m256 *t3)
{
    if (!row) {
        *t0 = *t1 = *t2 = *t3 = _mm256_setzero_ps();
        return;
    }
    row += cc->start;
    __m256 c0 = avx2_loadn(row, cc->n[0]);
    __m256 c1 = cc->n[1] > 0 ? avx2_loadn(row + 8, cc->n[1]) : _mm256_setzero_ps();
    __m256 c2 = cc->n[2] > 0 ? avx2_loadn(row + 16, cc->n[2]) : _mm256_setzero_ps();
    if (cc->shift) {
        c2 = shift_in_avx2(c2, c1, cc->shift);
        c1 = shift_in_avx2(c1, c0, cc->shift);
        c0 = shift_in_avx2(c0, _mm256_setzero_ps(), cc->shift);
    }
    __m256 d0, d1, d2, d3;
    split_avx2(c0, c1, &d0, &d1);
    split_avx2(skip2_avx2(c1, c0), skip2_avx2(c2, c1), &d2, &d3);
    *t0 = _mm256_sub_ps(d0, d2);
    *t1 = _mm256_add_ps(d1, d2);
    *t2 = _mm256_sub_ps(d2, d1);
    *t3 = _mm256_sub_ps(d1, d3);
}

/*  input_transform_avx512, 8 tiles of a tile row at a time. */
static void input_transform_avx2(const wg_plan_t *p, const float *x, float *v, size_t ldv)
{
    for (int tx0 = 0; tx0 < p->tw; tx0 += 8) {
        const int nt = p->tw - tx0 < 8 ? p->tw - tx0 : 8;
        const int c0 = 2 * tx0 - p->pad;
        cols8_t cc = {.start = c0 < 0 ? 0 : c0, .shift = c0 < 0 ? -c0 : 0};
        for (int k = 0; k < 3; k++)
            cc.n[k] = p->W - cc.start - 8 * k;
        __m256 a0, a1, a2, a3, b0, b1, b2, b3, c0v, c1v, c2v, c3v, d0, d1, d2, d3;
        input_row_avx2(plane_row(p, x, -p->pad), &cc, &a0, &a1, &a2, &a3);
        input_row_avx2(plane_row(p, x, 1 - p->pad), &cc, &b0, &b1, &b2, &b3);
        for (int ty = 0; ty < p->th; ty++) {
            const int r2 = 2 * ty + 2 - p->pad;
            float *vt = v + (size_t)ty * p->tw + tx0;
            input_row_avx2(plane_row(p, x, r2), &cc, &c0v, &c1v, &c2v, &c3v);
            input_row_avx2(plane_row(p, x, r2 + 1), &cc, &d0, &d1, &d2, &d3);
#define STORE4(i, e0, e1, e2, e3)                                                                  \
    do {                                                                                           \
        avx2_storen(vt + (4 * (i) + 0) * ldv, nt, e0);                                             \
        avx2_storen(vt + (4 * (i) + 1) * ldv, nt, e1);                                             \
        avx2_storen(vt + (4 * (i) + 2) * ldv, nt, e2);                                             \
        avx2_storen(vt + (4 * (i) + 3) * ldv, nt, e3);                                             \
    } while (0)
            STORE4(0, _mm256_sub_ps(a0, c0v), _mm256_sub_ps(a1, c1v), _mm256_sub_ps(a2, c2v),
                   _mm256_sub_ps(a3, c3v));
            STORE4(1, _mm256_add_ps(b0, c0v), _mm256_add_ps(b1, c1v), _mm256_add_ps(b2, c2v),
                   _mm256_add_ps(b3, c3v));
            STORE4(2, _mm256_sub_ps(c0v, b0), _mm256_sub_ps(c1v, b1), _mm256_sub_ps(c2v, b2),
                   _mm256_sub_ps(c3v, b3));
            STORE4(3, _mm256_sub_ps(b0, d0), _mm256_sub_ps(b1, d1), _mm256_sub_ps(b2, d2),
                   _mm256_sub_ps(b3, d3));
#undef STORE4
            a0 = c0v, a1 = c1v, a2 = c2v, a3 = c3v;
            b0 = d0, b1 = d1, b2 = d2, b3 = d3;
        }
    }
}
NN_AVX2_END

/*  One tile at plane[0] (rows ldp apart) into v[xi * ldv]. */
static void input_tile(const float *plane, int ldp, float *v, size_t ldv)
{
    float t[4][4];
    for (int r = 0; r < 4; r++) {
        const float *d = plane + (size_t)r * ldp;
        t[r][0] = d[0] - d[2];
        t[r][1] = d[1] + d[2];
        t[r][2] = d[2] - d[1];
        t[r][3] = d[1] - d[3];
    }
    for (int j = 0; j < 4; j++) {
        v[(0 + j) * ldv] = t[0][j] - t[2][j];
        v[(4 + j) * ldv] = t[1][j] + t[2][j];
        v[(8 + j) * ldv] = t[2][j] - t[1][j];
        v[(12 + j) * ldv] = t[1][j] - t[3][j];
    }
}

/*  Every tile of the input plane x into v (tile t of the sample at v[t]),
    through the staging plane `stage`, whose borders are zero: only its
    interior is written here. */
static void input_transform_generic(const wg_plan_t *p, const float *x, float *stage, float *v,
                                    size_t ldv)
{
    for (int r = 0; r < p->H; r++)
        memcpy(stage + (size_t)(r + p->pad) * p->ldp + p->pad, x + (size_t)r * p->W,
               sizeof(float) * (size_t)p->W);
    for (int ty = 0; ty < p->th; ty++)
        for (int tx = 0; tx < p->tw; tx++)
            input_tile(stage + (size_t)2 * ty * p->ldp + 2 * tx, p->ldp,
                       v + (size_t)ty * p->tw + tx, ldv);
}

/*  The plane x into v, by the transforms planned (`stage`: the portable
    ones' staging plane, unused by the others). */
static void input_transform(const wg_plan_t *p, const float *x, float *stage, float *v, size_t ldv)
{
    if (p->isa == NN_ISA_AVX512)
        input_transform_avx512(p, x, v, ldv);
    else if (p->isa == NN_ISA_AVX2)
        input_transform_avx2(p, x, v, ldv);
    else
        input_transform_generic(p, x, stage, v, ldv);
}

/*  ---- output transform: y = A^T m A (+ bias) ----
    A^T = [1 1 1 0; 0 1 -1 -1]. */

NN_AVX512_BEGIN
/*  Tiles tx0 .. tx0+n-1 of tile row ty of one output plane y (Ho x Wo),
    from m[xi * ldm]: 2 rows (1 at the bottom of an odd Ho) of up to 2n
    columns (fewer at the right of an odd Wo). */
static inline void output_tiles_avx512(const float *m, size_t ldm, float bias, int ty, int tx0,
                                       int n, int Ho, int Wo, float *y)
{
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    const __mmask16 mask = first_lanes(n);
    __m512 s0[4], s1[4];
    for (int r = 0; r < 4; r++) {
        __m512 m0 = _mm512_maskz_loadu_ps(mask, m + (4 * r + 0) * ldm);
        __m512 m1 = _mm512_maskz_loadu_ps(mask, m + (4 * r + 1) * ldm);
        __m512 m2 = _mm512_maskz_loadu_ps(mask, m + (4 * r + 2) * ldm);
        __m512 m3 = _mm512_maskz_loadu_ps(mask, m + (4 * r + 3) * ldm);
        __m512 d12 = _mm512_sub_ps(m1, m2);
        s0[r] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
        s1[r] = _mm512_sub_ps(d12, m3);
    }
    const __m512 b = _mm512_set1_ps(bias);
    __m512 y00 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s0[0], s0[1]), s0[2]), b);
    __m512 y01 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s1[0], s1[1]), s1[2]), b);
    __m512 y10 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s0[1], s0[2]), s0[3]), b);
    __m512 y11 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s1[1], s1[2]), s1[3]), b);
    const int cols = 2 * n < Wo - 2 * tx0 ? 2 * n : Wo - 2 * tx0;
    const __mmask16 m_lo = first_lanes(cols), m_hi = first_lanes(cols - 16);
    float *row = y + (size_t)2 * ty * Wo + 2 * tx0;
    _mm512_mask_storeu_ps(row, m_lo, _mm512_permutex2var_ps(y00, lo, y01));
    if (m_hi)
        _mm512_mask_storeu_ps(row + 16, m_hi, _mm512_permutex2var_ps(y00, hi, y01));
    if (2 * ty + 1 < Ho) {
        row += Wo;
        _mm512_mask_storeu_ps(row, m_lo, _mm512_permutex2var_ps(y10, lo, y11));
        if (m_hi)
            _mm512_mask_storeu_ps(row + 16, m_hi, _mm512_permutex2var_ps(y10, hi, y11));
    }
}

/*  One output plane (Ho x Wo) from its sample's 16 rows m[xi * ldm]. */
static void output_transform_avx512(const wg_plan_t *p, const float *m, size_t ldm, float bias,
                                    float *y)
{
    for (int ty = 0; ty < p->th; ty++) {
        const float *mr = m + (size_t)ty * p->tw;
        for (int tx = 0; tx < p->tw; tx += 16) {
            int n = p->tw - tx < 16 ? p->tw - tx : 16;
            output_tiles_avx512(mr + tx, ldm, bias, ty, tx, n, p->Ho, p->Wo, y);
        }
    }
}
NN_AVX512_END

NN_AVX2_BEGIN
/*  output_tiles_avx512 for up to 8 tiles. */
static inline void output_tiles_avx2(const float *m, size_t ldm, float bias, int ty, int tx0, int n,
                                     int Ho, int Wo, float *y)
{
    __m256 s0[4], s1[4];
    for (int r = 0; r < 4; r++) {
        __m256 m0 = avx2_loadn(m + (4 * r + 0) * ldm, n);
        __m256 m1 = avx2_loadn(m + (4 * r + 1) * ldm, n);
        __m256 m2 = avx2_loadn(m + (4 * r + 2) * ldm, n);
        __m256 m3 = avx2_loadn(m + (4 * r + 3) * ldm, n);
        s0[r] = _mm256_add_ps(_mm256_add_ps(m0, m1), m2);
        s1[r] = _mm256_sub_ps(_mm256_sub_ps(m1, m2), m3);
    }
    const __m256 b = _mm256_set1_ps(bias);
    __m256 y00 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0[0], s0[1]), s0[2]), b);
    __m256 y01 = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s1[0], s1[1]), s1[2]), b);
    __m256 y10 = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s0[1], s0[2]), s0[3]), b);
    __m256 y11 = _mm256_add_ps(_mm256_sub_ps(_mm256_sub_ps(s1[1], s1[2]), s1[3]), b);
    const int cols = 2 * n < Wo - 2 * tx0 ? 2 * n : Wo - 2 * tx0;
    float *row = y + (size_t)2 * ty * Wo + 2 * tx0;
    for (int i = 0; i < 2 && 2 * ty + i < Ho; i++, row += Wo) {
        /* the tiles' two columns interleaved */
        __m256 e = i ? y10 : y00, o = i ? y11 : y01;
        __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
        avx2_storen(row, cols, _mm256_permute2f128_ps(lo, hi, 0x20));
        if (cols > 8)
            avx2_storen(row + 8, cols - 8, _mm256_permute2f128_ps(lo, hi, 0x31));
    }
}

/*  One output plane (Ho x Wo) from its sample's 16 rows m[xi * ldm]. */
static void output_transform_avx2(const wg_plan_t *p, const float *m, size_t ldm, float bias,
                                  float *y)
{
    for (int ty = 0; ty < p->th; ty++) {
        const float *mr = m + (size_t)ty * p->tw;
        for (int tx = 0; tx < p->tw; tx += 8) {
            int n = p->tw - tx < 8 ? p->tw - tx : 8;
            output_tiles_avx2(mr + tx, ldm, bias, ty, tx, n, p->Ho, p->Wo, y);
        }
    }
}
NN_AVX2_END

/*  One tile from m[xi * ldm] to the (up to) 2x2 outputs at y (rows Wo
    apart), rows and cols of them kept. */
static void output_tile(const float *m, size_t ldm, float bias, int rows, int cols, int Wo,
                        float *y)
{
    float s[4][2], out[2][2];
    for (int r = 0; r < 4; r++) {
        const float *mr = m + (size_t)4 * r * ldm;
        s[r][0] = mr[0] + mr[ldm] + mr[2 * ldm];
        s[r][1] = mr[ldm] - mr[2 * ldm] - mr[3 * ldm];
    }
    for (int j = 0; j < 2; j++) {
        out[0][j] = s[0][j] + s[1][j] + s[2][j] + bias;
        out[1][j] = s[1][j] - s[2][j] - s[3][j] + bias;
    }
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            y[(size_t)i * Wo + j] = out[i][j];
}

/*  One output plane (Ho x Wo) from its sample's 16 rows m[xi * ldm]. */
static void output_transform(const wg_plan_t *p, const float *m, size_t ldm, float bias, float *y)
{
    if (p->isa == NN_ISA_AVX512) {
        output_transform_avx512(p, m, ldm, bias, y);
        return;
    }
    if (p->isa == NN_ISA_AVX2) {
        output_transform_avx2(p, m, ldm, bias, y);
        return;
    }
    for (int ty = 0; ty < p->th; ty++) {
        const float *mr = m + (size_t)ty * p->tw;
        int rows = p->Ho - 2 * ty < 2 ? 1 : 2;
        for (int tx = 0; tx < p->tw; tx++) {
            int cols = p->Wo - 2 * tx < 2 ? 1 : 2;
            output_tile(mr + tx, ldm, bias, rows, cols, p->Wo, y + (size_t)2 * ty * p->Wo + 2 * tx);
        }
    }
}

/*  ---- the chunks ---- */

/*  Floats of one chunk's scratch: V, M, the portable path's staging plane,
    then a sample's input when a prologue may write it, and a sample's
    output when the caller gives no y. */
static size_t chunk_scratch(const wg_plan_t *p, bool own_in, bool own_out)
{
    size_t n = 16 * (size_t)p->tiles * ((size_t)p->C + p->O) + (size_t)p->hp * p->ldp;
    if (own_in)
        n += (size_t)p->C * p->H * p->W;
    if (own_out)
        n += (size_t)p->O * p->Ho * p->Wo;
    return n;
}

static void chunk_run(void *arg, int chunk, float *scratch)
{
    const wg_job_t *j = arg;
    const wg_plan_t *p = j->p;
    const int s = chunk;
    const size_t T = p->tiles, plane = (size_t)p->H * p->W, out_plane = (size_t)p->Ho * p->Wo;
    float *v = scratch;
    float *m = v + 16 * T * p->C;
    float *stage = m + 16 * T * p->O;
    float *in_buf = stage + (size_t)p->hp * p->ldp;
    float *out_buf = in_buf + (j->prologue ? (size_t)p->C * plane : 0);
    if (p->hp)
        memset(stage, 0, sizeof(float) * (size_t)p->hp * p->ldp);
    const float *xs =
        j->prologue ? j->prologue(j->arg, s, in_buf) : j->x + (size_t)s * p->C * plane;
    for (int c = 0; c < p->C; c++)
        input_transform(p, xs + c * plane, stage, v + (size_t)c * 16 * T, T);
    /* M[xi] = U[xi]^T V[xi] */
    for (int xi = 0; xi < 16; xi++)
        if (j->packed)
            zd__nn_taps_gemm(j->packed + xi * j->packed_floats, p->O, p->C, j->voffs, v + xi * T,
                             (int)T, NULL, m + xi * T, (int)(16 * T));
        else
            zd__nn_sgemm(true, false, p->O, (int)T, p->C, 1.0f, j->u + (size_t)xi * p->O * p->C,
                         p->O, v + xi * T, (int)(16 * T), 0.0f, m + xi * T, (int)(16 * T));
    float *ys = j->y ? j->y + (size_t)s * p->O * out_plane : out_buf;
    for (int o = 0; o < p->O; o++)
        output_transform(p, m + (size_t)o * 16 * T, T, j->bias ? j->bias[o] : 0.0f,
                         ys + o * out_plane);
    if (j->epilogue)
        j->epilogue(j->arg, s, ys);
}

/*  ---- entry points ---- */

/*  Fills p for a forward convolution; fails on sizes out of range. */
static int plan(const char *op, int N, int C, int H, int W, int O, int pad, wg_plan_t *p)
{
    if (N < 0 || C < 1 || O < 1 || H < 1 || W < 1 || pad < 0 || pad > 2)
        return zd_error_set("%s: bad geometry N=%d C=%d H=%d W=%d O=%d padding=%d (padding 0 to "
                            "2, the rest >= 1)",
                            op, N, C, H, W, O, pad);
    int64_t Ho = (int64_t)H + 2 * pad - 2, Wo = (int64_t)W + 2 * pad - 2;
    if (Ho < 1 || Wo < 1)
        return zd_error_set("%s: a 3x3 kernel does not fit the %dx%d input with padding %d", op, H,
                            W, pad);
    int64_t th = (Ho + 1) / 2, tw = (Wo + 1) / 2;
    const nn_isa_t isa = zd__nn_cpu_isa();
    /* the vector transforms read x in place, the portable one a padded copy */
    const bool stage = isa == NN_ISA_GENERIC;
    int64_t hp = stage ? 2 * th + 2 : 0, ldp = stage ? 2 * tw + 2 : 0;
    /* the largest sizes: one sample's V and M, and a sample of x or y */
    if (th * tw * 16 * ((int64_t)C + O) > INT32_MAX || hp * ldp > INT32_MAX ||
        (int64_t)H * W * C > INT32_MAX || Ho * Wo * O > INT32_MAX)
        return zd_error_set("%s: N=%d C=%d H=%d W=%d O=%d too large", op, N, C, H, W, O);
    *p = (wg_plan_t){
        .N = N,
        .C = C,
        .H = H,
        .W = W,
        .O = O,
        .pad = pad,
        .Ho = (int)Ho,
        .Wo = (int)Wo,
        .th = (int)th,
        .tw = (int)tw,
        .tiles = (int)(th * tw),
        .hp = (int)hp,
        .ldp = (int)ldp,
        .isa = isa,
    };
    return 0;
}

static int run(const char *op, const wg_plan_t *p, const float *w, bool flip, wg_job_t *job)
{
    if (p->N == 0)
        return 0;
    const bool vec = p->isa != NN_ISA_GENERIC;
    const size_t pf = vec ? zd__nn_taps_packed_floats(p->O, p->C) : 0;
    float *u = zd__nn_alloc_floats(16 * (size_t)p->O * p->C);
    float *packed = vec ? zd__nn_alloc_floats(16 * pf) : NULL;
    int32_t *offs = vec ? malloc(sizeof(int32_t) * 2 * (size_t)p->C) : NULL;
    if (!u || (vec && (!packed || !offs))) {
        zd__nn_free_floats(u);
        zd__nn_free_floats(packed);
        free(offs);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", op);
    }
    transform_filters(w, p->O, p->C, flip, u);
    if (vec) {
        /* U[xi] is C x O (element (o, c) at c * O + o); V's channel c
           starts 16 * tiles floats after channel c - 1 */
        int32_t *uoffs = offs + p->C;
        for (int c = 0; c < p->C; c++) {
            offs[c] = (int32_t)(c * 16 * p->tiles);
            uoffs[c] = c * p->O;
        }
        for (int xi = 0; xi < 16; xi++)
            zd__nn_taps_pack(u + (size_t)xi * p->O * p->C, p->O, p->C, 1, uoffs, packed + xi * pf);
    }
    job->p = p;
    job->u = u;
    job->packed = packed;
    job->packed_floats = pf;
    job->voffs = offs;
    int rc = zd__nn_parallel_run(p->N, chunk_scratch(p, job->prologue, !job->y), chunk_run, job);
    zd__nn_free_floats(u);
    zd__nn_free_floats(packed);
    free(offs);
    return rc < 0 ? zd_error_wrap("%s", op) : 0;
}

bool zd__nn_winograd_applies(int C, int O, int H, int W, int kh, int kw, int stride, int padding,
                             int dilation, bool input_grad)
{
    if (kh != 3 || kw != 3 || stride != 1 || dilation != 1 || (padding != 0 && padding != 1))
        return false;
    const int64_t Ho = (int64_t)H + 2 * padding - 2, Wo = (int64_t)W + 2 * padding - 2;
    if (Ho < 1 || Wo < 1)
        return false;
    if (input_grad)
        return C >= 4 && O >= 4;
    return C >= 16 && O >= 32 && Ho * Wo >= 64;
}

int zd__nn_winograd_forward(const float *x, int N, int C, int H, int W, const float *w, int O,
                            const float *bias, int padding, float *y,
                            nn_winograd_epilogue_fn *epilogue, void *arg)
{
    const char *op = "winograd forward";
    wg_plan_t p;
    if (!x || !w || (!y && !epilogue))
        return zd_error_set("%s: x, w, and y or an epilogue, are needed", op);
    if (plan(op, N, C, H, W, O, padding, &p) < 0)
        return -1;
    wg_job_t job = {.x = x, .bias = bias, .y = y, .epilogue = epilogue, .arg = arg};
    return run(op, &p, w, false, &job);
}

int zd__nn_winograd_backward_input(const float *dy, int N, int O, int Ho, int Wo, const float *w,
                                   int C, int padding, float *dx, nn_winograd_prologue_fn *prologue,
                                   void *arg)
{
    const char *op = "winograd input gradient";
    wg_plan_t p;
    if ((!dy && !prologue) || !w || !dx)
        return zd_error_set("%s: dy or a prologue, w and dx are needed", op);
    if (padding < 0 || padding > 2)
        return zd_error_set("%s: padding %d (0 to 2)", op, padding);
    /* dx = dy padded by 2 - padding, correlated with the turned filters */
    if (plan(op, N, O, Ho, Wo, C, 2 - padding, &p) < 0)
        return -1;
    wg_job_t job = {.x = dy, .y = dx, .prologue = prologue, .arg = arg};
    return run(op, &p, w, true, &job);
}
