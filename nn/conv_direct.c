/* SPDX-License-Identifier: MIT */
/*  conv_direct.c: the GEMMs of a stride-1 convolution without unfolding.

    With stride 1, output pixel (oh, ow) of a plane of width Wp reads input
    pixel (oh + ki, ow + kj) for tap (ki, kj). Numbering the outputs as
    q = oh*Wp + ow (as if the output plane were Wp wide; the kw-1 columns
    past Wo are junk), that pixel is src[q + ki*Wp + kj]: for each tap, the
    whole output plane reads one contiguous, shifted run of the input. So
    the convolution is a GEMM whose B operand is the input plane itself at
    K shifts, and no im2col copy is made; the junk columns cost
    (kw-1)/Wp of the work. The same product, on the output gradient padded
    by the kernel size and with the kernel flipped, gives the input
    gradient; and the weight gradient (transposed) is the shifted input
    runs times the output gradient transposed to positions x channels (its
    junk positions zeroed).

    The AVX-512 kernels keep a block of the result in registers (8 rows x
    48 positions; for the weight gradient, 6 taps x 64 channels) and run at
    the FMA units' peak when the operands are in L1/L2. CPUs without
    AVX-512 (or ZDIST_CPU=generic) get plain loops with the same results up
    to rounding (conv.c then keeps to im2col and OpenBLAS, which are faster
    there). */
#include <stdatomic.h>
#include <string.h>
#include <immintrin.h>

#include "nn/conv_private.h"
#include "nn/nn_private.h"

static atomic_bool taps_off;

void zd__nn_use_taps(bool on)
{
    atomic_store(&taps_off, !on);
}

bool zd__nn_taps_enabled(void)
{
    return zd__nn_conv_direct_available() && !atomic_load(&taps_off);
}

#define MR 8              /* rows of A per block (zd__nn_taps_pack's panels) */

void zd__nn_taps_pack(const float *a, int M, int K, int64_t m_stride, const int32_t *k_offs,
                  float *packed)
{
    for (int m0 = 0; m0 < M; m0 += MR) {
        float *p = packed + (size_t)m0 * K;
        for (int k = 0; k < K; k++) {
            const float *ak = a + (k_offs ? k_offs[k] : k);
            for (int i = 0; i < MR; i++)
                p[(size_t)k * MR + i] = m0 + i < M ? ak[(m0 + i) * m_stride] : 0.0f;
        }
    }
}

size_t zd__nn_taps_packed_floats(int M, int K)
{
    return (size_t)((M + MR - 1) / MR) * MR * (size_t)K;
}

NN_AVX512_BEGIN

static inline __mmask16 tail_mask(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
}

/*  The 8 biases of a block (zeros past its rows, or without bias). */
static inline void block_bias(const float *bias, int rows, float b[MR])
{
    for (int i = 0; i < MR; i++)
        b[i] = bias && i < rows ? bias[i] : 0.0f;
}

/*  Row i of a block's accumulators, NV vectors: written out by name so
    that they stay in registers (GCC keeps an array of vectors in memory). */
#define ROW3(i) __m512 c##i##0 = _mm512_set1_ps(b[i]), c##i##1 = c##i##0, c##i##2 = c##i##0
#define FMA3(i)                                                  \
    do {                                                         \
        __m512 av = _mm512_set1_ps(a[i]);                        \
        c##i##0 = _mm512_fmadd_ps(av, b0, c##i##0);              \
        c##i##1 = _mm512_fmadd_ps(av, b1, c##i##1);              \
        c##i##2 = _mm512_fmadd_ps(av, b2, c##i##2);              \
    } while (0)
#define STORE3(i)                                                \
    do {                                                         \
        if (i < rows) {                                          \
            float *d = c + (size_t)(i) * ldc;                    \
            _mm512_storeu_ps(d, c##i##0);                        \
            _mm512_storeu_ps(d + 16, c##i##1);                   \
            _mm512_storeu_ps(d + 32, c##i##2);                   \
        }                                                        \
    } while (0)

/*  One 8 x 48 block: c[i][q] = bias[i] + sum_k ap[k][i] * src[offs[k] + q]. */
static void taps_block3(const float *restrict ap, int K, const int32_t *restrict offs,
                        const float *restrict src, const float *bias, int rows,
                        float *restrict c, int ldc)
{
    float b[MR];
    block_bias(bias, rows, b);
    ROW3(0); ROW3(1); ROW3(2); ROW3(3); ROW3(4); ROW3(5); ROW3(6); ROW3(7);
    for (int k = 0; k < K; k++) {
        const float *s = src + offs[k], *a = ap + (size_t)k * MR;
        __m512 b0 = _mm512_loadu_ps(s), b1 = _mm512_loadu_ps(s + 16);
        __m512 b2 = _mm512_loadu_ps(s + 32);
        FMA3(0); FMA3(1); FMA3(2); FMA3(3); FMA3(4); FMA3(5); FMA3(6); FMA3(7);
    }
    STORE3(0); STORE3(1); STORE3(2); STORE3(3); STORE3(4); STORE3(5); STORE3(6); STORE3(7);
}

#define ROW1(i) __m512 c##i = _mm512_set1_ps(b[i])
#define FMA1(i) c##i = _mm512_fmadd_ps(_mm512_set1_ps(a[i]), b0, c##i)
#define STORE1(i)                                                \
    do {                                                         \
        if (i < rows)                                            \
            _mm512_mask_storeu_ps(c + (size_t)(i) * ldc, m, c##i); \
    } while (0)

/*  One 8 x 16 block, the lanes of m only. */
static void taps_block1(const float *restrict ap, int K, const int32_t *restrict offs,
                        const float *restrict src, __mmask16 m, const float *bias, int rows,
                        float *restrict c, int ldc)
{
    float b[MR];
    block_bias(bias, rows, b);
    ROW1(0); ROW1(1); ROW1(2); ROW1(3); ROW1(4); ROW1(5); ROW1(6); ROW1(7);
    for (int k = 0; k < K; k++) {
        const float *a = ap + (size_t)k * MR;
        __m512 b0 = _mm512_maskz_loadu_ps(m, src + offs[k]);
        FMA1(0); FMA1(1); FMA1(2); FMA1(3); FMA1(4); FMA1(5); FMA1(6); FMA1(7);
    }
    STORE1(0); STORE1(1); STORE1(2); STORE1(3); STORE1(4); STORE1(5); STORE1(6); STORE1(7);
}

static void taps_gemm_avx512(const float *packed, int M, int K, const int32_t *offs,
                             const float *src, int L, const float *bias, float *c, int ldc)
{
    const int full = L / 48 * 48;
    for (int q = 0; q < full; q += 48)
        for (int m0 = 0; m0 < M; m0 += MR)
            taps_block3(packed + (size_t)m0 * K, K, offs, src + q, bias ? bias + m0 : NULL,
                        M - m0, c + (size_t)m0 * ldc + q, ldc);
    for (int q = full; q < L; q += 16)
        for (int m0 = 0; m0 < M; m0 += MR)
            taps_block1(packed + (size_t)m0 * K, K, offs, src + q, tail_mask(L - q),
                        bias ? bias + m0 : NULL, M - m0, c + (size_t)m0 * ldc + q, ldc);
}

/*  A block of taps x 16*NV columns of c += taps(src) b, the accumulators
    written out by name (see ROW3): row i broadcasts tap i's float at q, the
    NV vectors of b's row q are shared by all rows. */
#define TROW2(i) __m512 e##i##0 = _mm512_setzero_ps(), e##i##1 = e##i##0
#define TROW4(i) TROW2(i), e##i##2 = e##i##0, e##i##3 = e##i##0
#define TFMA4(i)                                                 \
    do {                                                         \
        __m512 sv = _mm512_set1_ps(s##i[q]);                     \
        e##i##0 = _mm512_fmadd_ps(sv, b0, e##i##0);              \
        e##i##1 = _mm512_fmadd_ps(sv, b1, e##i##1);              \
        e##i##2 = _mm512_fmadd_ps(sv, b2, e##i##2);              \
        e##i##3 = _mm512_fmadd_ps(sv, b3, e##i##3);              \
    } while (0)
#define TFMA2(i)                                                 \
    do {                                                         \
        __m512 sv = _mm512_set1_ps(s##i[q]);                     \
        e##i##0 = _mm512_fmadd_ps(sv, b0, e##i##0);              \
        e##i##1 = _mm512_fmadd_ps(sv, b1, e##i##1);              \
    } while (0)
#define TADD(i, v)                                                             \
    do {                                                                       \
        float *d = c + (size_t)(i) * ldc + 16 * (v);                           \
        _mm512_mask_storeu_ps(d, m##v, _mm512_add_ps(_mm512_maskz_loadu_ps(m##v, d), \
                                                     e##i##v));                \
    } while (0)
#define TSTORE4(i)                                                              \
    do {                                                                        \
        if (i < rows) {                                                         \
            TADD(i, 0); TADD(i, 1); TADD(i, 2); TADD(i, 3);                     \
        }                                                                       \
    } while (0)
#define TSTORE2(i)                                                              \
    do {                                                                        \
        if (i < rows) {                                                         \
            TADD(i, 0); TADD(i, 1);                                             \
        }                                                                       \
    } while (0)

/*  The 16*NV columns from b's column 0 that a block covers: lane masks. */
static inline void block_masks(int cols, __mmask16 m[4])
{
    for (int v = 0; v < 4; v++)
        m[v] = tail_mask(cols - 16 * v < 0 ? 0 : cols - 16 * v);
}

/*  The positions a block sums over: runs of `run` positions, `stride`
    apart (the good columns of the output rows). */
#define FOR_POSITIONS(nrun, run, stride)                       \
    for (int r_ = 0; r_ < (nrun); r_++)                        \
        for (int q = r_ * (stride); q < r_ * (stride) + (run); q++)

/*  6 taps x 64 columns; taps past `rows` repeat tap 0 and are not stored. */
static void taps_bt_block4(const float *const s[6], const float *restrict b, int ldb,
                           int cols, int nrun, int run, int stride, int rows,
                           float *restrict c, int ldc)
{
    const float *restrict s0 = s[0], *restrict s1 = s[1], *restrict s2 = s[2];
    const float *restrict s3 = s[3], *restrict s4 = s[4], *restrict s5 = s[5];
    __mmask16 mk[4];
    block_masks(cols, mk);
    const __mmask16 m0 = mk[0], m1 = mk[1], m2 = mk[2], m3 = mk[3];
    TROW4(0); TROW4(1); TROW4(2); TROW4(3); TROW4(4); TROW4(5);
    FOR_POSITIONS(nrun, run, stride) {
        const float *bq = b + (size_t)q * ldb;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bq), b1 = _mm512_maskz_loadu_ps(m1, bq + 16);
        __m512 b2 = _mm512_maskz_loadu_ps(m2, bq + 32), b3 = _mm512_maskz_loadu_ps(m3, bq + 48);
        TFMA4(0); TFMA4(1); TFMA4(2); TFMA4(3); TFMA4(4); TFMA4(5);
    }
    TSTORE4(0); TSTORE4(1); TSTORE4(2); TSTORE4(3); TSTORE4(4); TSTORE4(5);
}

/*  12 taps x 32 columns, for narrow b. */
static void taps_bt_block2(const float *const s[12], const float *restrict b, int ldb,
                           int cols, int nrun, int run, int stride, int rows,
                           float *restrict c, int ldc)
{
    const float *restrict s0 = s[0], *restrict s1 = s[1], *restrict s2 = s[2];
    const float *restrict s3 = s[3], *restrict s4 = s[4], *restrict s5 = s[5];
    const float *restrict s6 = s[6], *restrict s7 = s[7], *restrict s8 = s[8];
    const float *restrict s9 = s[9], *restrict s10 = s[10], *restrict s11 = s[11];
    __mmask16 mk[4];
    block_masks(cols, mk);
    const __mmask16 m0 = mk[0], m1 = mk[1];
    TROW2(0); TROW2(1); TROW2(2); TROW2(3); TROW2(4); TROW2(5);
    TROW2(6); TROW2(7); TROW2(8); TROW2(9); TROW2(10); TROW2(11);
    FOR_POSITIONS(nrun, run, stride) {
        const float *bq = b + (size_t)q * ldb;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bq), b1 = _mm512_maskz_loadu_ps(m1, bq + 16);
        TFMA2(0); TFMA2(1); TFMA2(2); TFMA2(3); TFMA2(4); TFMA2(5);
        TFMA2(6); TFMA2(7); TFMA2(8); TFMA2(9); TFMA2(10); TFMA2(11);
    }
    TSTORE2(0); TSTORE2(1); TSTORE2(2); TSTORE2(3); TSTORE2(4); TSTORE2(5);
    TSTORE2(6); TSTORE2(7); TSTORE2(8); TSTORE2(9); TSTORE2(10); TSTORE2(11);
}

/*  Positions per pass over the taps (about): b's rows for them (32 KB at
    64 columns) stay in L1 while every block of taps reads them. */
#define BT_Q_CHUNK 128

static void taps_gemm_bt_avx512(const int32_t *offs, int K, const float *src, const float *b,
                                int ldb, int N, int nrun, int run, int stride, float *c, int ldc)
{
    const bool narrow = N <= 32;
    const int rows = narrow ? 12 : 6, width = narrow ? 32 : 64;
    const int runs_per_pass = stride >= BT_Q_CHUNK ? 1 : BT_Q_CHUNK / stride;
    for (int r0 = 0; r0 < nrun; r0 += runs_per_pass) {
        const int n_runs = nrun - r0 < runs_per_pass ? nrun - r0 : runs_per_pass;
        const size_t q0 = (size_t)r0 * stride;
        for (int n0 = 0; n0 < N; n0 += width)
            for (int k0 = 0; k0 < K; k0 += rows) {
                const float *s[12];
                for (int i = 0; i < rows; i++)
                    s[i] = src + offs[k0 + i < K ? k0 + i : k0] + q0;
                const float *bq = b + q0 * ldb + n0;
                float *cb = c + (size_t)k0 * ldc + n0;
                if (narrow)
                    taps_bt_block2(s, bq, ldb, N - n0, n_runs, run, stride, K - k0, cb, ldc);
                else
                    taps_bt_block4(s, bq, ldb, N - n0, n_runs, run, stride, K - k0, cb, ldc);
            }
    }
}

static void transpose_avx512(const float *src, int rows, int cols, int lds, float *dst, int ldd)
{
    for (int r0 = 0; r0 < rows; r0 += 16)
        for (int c0 = 0; c0 < cols; c0 += 16) {
            const int nr = rows - r0 < 16 ? rows - r0 : 16, nc = cols - c0 < 16 ? cols - c0 : 16;
            const __mmask16 mr = tail_mask(nr), mc = tail_mask(nc);
            __m512 v[16];
            for (int i = 0; i < 16; i++)
                v[i] = i < nr ? _mm512_maskz_loadu_ps(mc, src + (size_t)(r0 + i) * lds + c0)
                              : _mm512_setzero_ps();
            conv_transpose16(v);
            for (int j = 0; j < nc; j++)
                _mm512_mask_storeu_ps(dst + (size_t)(c0 + j) * ldd + r0, mr, v[j]);
        }
}

NN_AVX512_END

/* ---- portable loops ---- */

static void taps_gemm_generic(const float *packed, int M, int K, const int32_t *offs,
                              const float *src, int L, const float *bias, float *c, int ldc)
{
    for (int m = 0; m < M; m++) {
        float *cm = c + (size_t)m * ldc;
        for (int q = 0; q < L; q++)
            cm[q] = bias ? bias[m] : 0.0f;
        const float *ap = packed + (size_t)(m / MR * MR) * K + m % MR;
        for (int k = 0; k < K; k++) {
            const float av = ap[(size_t)k * MR], *s = src + offs[k];
            for (int q = 0; q < L; q++)
                cm[q] += av * s[q];
        }
    }
}

static void taps_gemm_bt_generic(const int32_t *offs, int K, const float *src, const float *b,
                                 int ldb, int N, int nrun, int run, int stride, float *c, int ldc)
{
    for (int k = 0; k < K; k++) {
        const float *s = src + offs[k];
        float *ck = c + (size_t)k * ldc;
        for (int r = 0; r < nrun; r++)
            for (int q = r * stride; q < r * stride + run; q++)
                for (int n = 0; n < N; n++)
                    ck[n] += s[q] * b[(size_t)q * ldb + n];
    }
}

static void transpose_generic(const float *src, int rows, int cols, int lds, float *dst,
                              int ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

/* ---- the CPU's choice ---- */

bool zd__nn_conv_direct_available(void)
{
    return zd__nn_cpu_avx512();
}

void zd__nn_taps_gemm(const float *packed, int M, int K, const int32_t *offs, const float *src,
                  int L, const float *bias, float *c, int ldc)
{
    if (zd__nn_cpu_avx512())
        taps_gemm_avx512(packed, M, K, offs, src, L, bias, c, ldc);
    else
        taps_gemm_generic(packed, M, K, offs, src, L, bias, c, ldc);
}

void zd__nn_taps_gemm_bt(const int32_t *offs, int K, const float *src, const float *b, int ldb,
                     int N, int nrun, int run, int stride, float *c, int ldc)
{
    if (zd__nn_cpu_avx512())
        taps_gemm_bt_avx512(offs, K, src, b, ldb, N, nrun, run, stride, c, ldc);
    else
        taps_gemm_bt_generic(offs, K, src, b, ldb, N, nrun, run, stride, c, ldc);
}

void zd__nn_transpose(const float *src, int rows, int cols, int lds, float *dst, int ldd)
{
    if (zd__nn_cpu_avx512())
        transpose_avx512(src, rows, cols, lds, dst, ldd);
    else
        transpose_generic(src, rows, cols, lds, dst, ldd);
}
