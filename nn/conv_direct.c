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
    the FMA units' peak when the operands are in L1/L2. The AVX2 ones do
    the same with half as many registers of half the width (4 rows x 24
    positions, half of a packed panel of 8 rows; 6 taps x 16 channels).
    Without either (or with ZDIST_CPU=generic) come plain loops with the
    same results up to rounding (conv.c then keeps to im2col and OpenBLAS,
    which are faster there). */
#include <stdatomic.h>
#include <string.h>
#include <immintrin.h>

#include "nn/conv_private.h"
#include "nn/nn_private.h"
#include "nn/simd_avx2.h"

static atomic_bool taps_off;

void zd__nn_use_taps(bool on)
{
    atomic_store(&taps_off, !on);
}

bool zd__nn_taps_enabled(void)
{
    return zd__nn_conv_direct_available() && !atomic_load(&taps_off);
}

#define MR 8 /* rows of A per block (zd__nn_taps_pack's panels) */

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

/*  The 8 biases of a block (zeros past its rows, or without bias). Not
    as one conditional loop: GCC makes that a masked load for AVX2, which
    AMD's CPUs run as a slow microcode assist when the masked-off lanes
    point at nothing (bias NULL), hundreds of cycles per block. */
static inline void block_bias(const float *bias, int rows, float b[MR])
{
    for (int i = 0; i < MR; i++)
        b[i] = 0.0f;
    for (int i = 0; bias && i < rows && i < MR; i++)
        b[i] = bias[i];
}

NN_AVX512_BEGIN

static inline __mmask16 tail_mask(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
}

/*  Row i of a block's accumulators, NV vectors: written out by name so
    that they stay in registers (GCC keeps an array of vectors in memory). */
#define ROW3(i) __m512 c##i##0 = _mm512_set1_ps(b[i]), c##i##1 = c##i##0, c##i##2 = c##i##0
#define FMA3(i)                                                                                    \
    do {                                                                                           \
        __m512 av = _mm512_set1_ps(a[i]);                                                          \
        c##i##0 = _mm512_fmadd_ps(av, b0, c##i##0);                                                \
        c##i##1 = _mm512_fmadd_ps(av, b1, c##i##1);                                                \
        c##i##2 = _mm512_fmadd_ps(av, b2, c##i##2);                                                \
    } while (0)
#define STORE3(i)                                                                                  \
    do {                                                                                           \
        if (i < rows) {                                                                            \
            float *d = c + (size_t)(i)*ldc;                                                        \
            _mm512_storeu_ps(d, c##i##0);                                                          \
            _mm512_storeu_ps(d + 16, c##i##1);                                                     \
            _mm512_storeu_ps(d + 32, c##i##2);                                                     \
        }                                                                                          \
    } while (0)

/*  One 8 x 48 block: c[i][q] = bias[i] + sum_k ap[k][i] * src[offs[k] + q]. */
static void taps_block3(const float *restrict ap, int K, const int32_t *restrict offs,
                        const float *restrict src, const float *bias, int rows, float *restrict c,
                        int ldc)
{
    float b[MR];
    block_bias(bias, rows, b);
    ROW3(0);
    ROW3(1);
    ROW3(2);
    ROW3(3);
    ROW3(4);
    ROW3(5);
    ROW3(6);
    ROW3(7);
    for (int k = 0; k < K; k++) {
        const float *s = src + offs[k], *a = ap + (size_t)k * MR;
        __m512 b0 = _mm512_loadu_ps(s), b1 = _mm512_loadu_ps(s + 16);
        __m512 b2 = _mm512_loadu_ps(s + 32);
        FMA3(0);
        FMA3(1);
        FMA3(2);
        FMA3(3);
        FMA3(4);
        FMA3(5);
        FMA3(6);
        FMA3(7);
    }
    STORE3(0);
    STORE3(1);
    STORE3(2);
    STORE3(3);
    STORE3(4);
    STORE3(5);
    STORE3(6);
    STORE3(7);
}

#define ROW1(i) __m512 c##i = _mm512_set1_ps(b[i])
#define FMA1(i) c##i = _mm512_fmadd_ps(_mm512_set1_ps(a[i]), b0, c##i)
#define STORE1(i)                                                                                  \
    do {                                                                                           \
        if (i < rows)                                                                              \
            _mm512_mask_storeu_ps(c + (size_t)(i)*ldc, m, c##i);                                   \
    } while (0)

/*  One 8 x 16 block, the lanes of m only. */
static void taps_block1(const float *restrict ap, int K, const int32_t *restrict offs,
                        const float *restrict src, __mmask16 m, const float *bias, int rows,
                        float *restrict c, int ldc)
{
    float b[MR];
    block_bias(bias, rows, b);
    ROW1(0);
    ROW1(1);
    ROW1(2);
    ROW1(3);
    ROW1(4);
    ROW1(5);
    ROW1(6);
    ROW1(7);
    for (int k = 0; k < K; k++) {
        const float *a = ap + (size_t)k * MR;
        __m512 b0 = _mm512_maskz_loadu_ps(m, src + offs[k]);
        FMA1(0);
        FMA1(1);
        FMA1(2);
        FMA1(3);
        FMA1(4);
        FMA1(5);
        FMA1(6);
        FMA1(7);
    }
    STORE1(0);
    STORE1(1);
    STORE1(2);
    STORE1(3);
    STORE1(4);
    STORE1(5);
    STORE1(6);
    STORE1(7);
}

static void taps_gemm_avx512(const float *packed, int M, int K, const int32_t *offs,
                             const float *src, int L, const float *bias, float *c, int ldc)
{
    const int full = L / 48 * 48;
    for (int q = 0; q < full; q += 48)
        for (int m0 = 0; m0 < M; m0 += MR)
            taps_block3(packed + (size_t)m0 * K, K, offs, src + q, bias ? bias + m0 : NULL, M - m0,
                        c + (size_t)m0 * ldc + q, ldc);
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
#define TFMA4(i)                                                                                   \
    do {                                                                                           \
        __m512 sv = _mm512_set1_ps(s##i[q]);                                                       \
        e##i##0 = _mm512_fmadd_ps(sv, b0, e##i##0);                                                \
        e##i##1 = _mm512_fmadd_ps(sv, b1, e##i##1);                                                \
        e##i##2 = _mm512_fmadd_ps(sv, b2, e##i##2);                                                \
        e##i##3 = _mm512_fmadd_ps(sv, b3, e##i##3);                                                \
    } while (0)
#define TFMA2(i)                                                                                   \
    do {                                                                                           \
        __m512 sv = _mm512_set1_ps(s##i[q]);                                                       \
        e##i##0 = _mm512_fmadd_ps(sv, b0, e##i##0);                                                \
        e##i##1 = _mm512_fmadd_ps(sv, b1, e##i##1);                                                \
    } while (0)
#define TADD(i, v)                                                                                 \
    do {                                                                                           \
        float *d = c + (size_t)(i)*ldc + 16 * (v);                                                 \
        _mm512_mask_storeu_ps(d, m##v, _mm512_add_ps(_mm512_maskz_loadu_ps(m##v, d), e##i##v));    \
    } while (0)
#define TSTORE4(i)                                                                                 \
    do {                                                                                           \
        if (i < rows) {                                                                            \
            TADD(i, 0);                                                                            \
            TADD(i, 1);                                                                            \
            TADD(i, 2);                                                                            \
            TADD(i, 3);                                                                            \
        }                                                                                          \
    } while (0)
#define TSTORE2(i)                                                                                 \
    do {                                                                                           \
        if (i < rows) {                                                                            \
            TADD(i, 0);                                                                            \
            TADD(i, 1);                                                                            \
        }                                                                                          \
    } while (0)

/*  The 16*NV columns from b's column 0 that a block covers: lane masks. */
static inline void block_masks(int cols, __mmask16 m[4])
{
    for (int v = 0; v < 4; v++)
        m[v] = tail_mask(cols - 16 * v < 0 ? 0 : cols - 16 * v);
}

/*  The positions a block sums over: runs of `run` positions, `stride`
    apart (the good columns of the output rows). */
#define FOR_POSITIONS(nrun, run, stride)                                                           \
    for (int r_ = 0; r_ < (nrun); r_++)                                                            \
        for (int q = r_ * (stride); q < r_ * (stride) + (run); q++)

/*  6 taps x 64 columns; taps past `rows` repeat tap 0 and are not stored. */
static void taps_bt_block4(const float *const s[6], const float *restrict b, int ldb, int cols,
                           int nrun, int run, int stride, int rows, float *restrict c, int ldc)
{
    const float *restrict s0 = s[0], *restrict s1 = s[1], *restrict s2 = s[2];
    const float *restrict s3 = s[3], *restrict s4 = s[4], *restrict s5 = s[5];
    __mmask16 mk[4];
    block_masks(cols, mk);
    const __mmask16 m0 = mk[0], m1 = mk[1], m2 = mk[2], m3 = mk[3];
    TROW4(0);
    TROW4(1);
    TROW4(2);
    TROW4(3);
    TROW4(4);
    TROW4(5);
    FOR_POSITIONS(nrun, run, stride)
    {
        const float *bq = b + (size_t)q * ldb;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bq), b1 = _mm512_maskz_loadu_ps(m1, bq + 16);
        __m512 b2 = _mm512_maskz_loadu_ps(m2, bq + 32), b3 = _mm512_maskz_loadu_ps(m3, bq + 48);
        TFMA4(0);
        TFMA4(1);
        TFMA4(2);
        TFMA4(3);
        TFMA4(4);
        TFMA4(5);
    }
    TSTORE4(0);
    TSTORE4(1);
    TSTORE4(2);
    TSTORE4(3);
    TSTORE4(4);
    TSTORE4(5);
}

/*  12 taps x 32 columns, for narrow b. */
static void taps_bt_block2(const float *const s[12], const float *restrict b, int ldb, int cols,
                           int nrun, int run, int stride, int rows, float *restrict c, int ldc)
{
    const float *restrict s0 = s[0], *restrict s1 = s[1], *restrict s2 = s[2];
    const float *restrict s3 = s[3], *restrict s4 = s[4], *restrict s5 = s[5];
    const float *restrict s6 = s[6], *restrict s7 = s[7], *restrict s8 = s[8];
    const float *restrict s9 = s[9], *restrict s10 = s[10], *restrict s11 = s[11];
    __mmask16 mk[4];
    block_masks(cols, mk);
    const __mmask16 m0 = mk[0], m1 = mk[1];
    TROW2(0);
    TROW2(1);
    TROW2(2);
    TROW2(3);
    TROW2(4);
    TROW2(5);
    TROW2(6);
    TROW2(7);
    TROW2(8);
    TROW2(9);
    TROW2(10);
    TROW2(11);
    FOR_POSITIONS(nrun, run, stride)
    {
        const float *bq = b + (size_t)q * ldb;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bq), b1 = _mm512_maskz_loadu_ps(m1, bq + 16);
        TFMA2(0);
        TFMA2(1);
        TFMA2(2);
        TFMA2(3);
        TFMA2(4);
        TFMA2(5);
        TFMA2(6);
        TFMA2(7);
        TFMA2(8);
        TFMA2(9);
        TFMA2(10);
        TFMA2(11);
    }
    TSTORE2(0);
    TSTORE2(1);
    TSTORE2(2);
    TSTORE2(3);
    TSTORE2(4);
    TSTORE2(5);
    TSTORE2(6);
    TSTORE2(7);
    TSTORE2(8);
    TSTORE2(9);
    TSTORE2(10);
    TSTORE2(11);
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

NN_AVX2_BEGIN

/*  Row i of a block's accumulators (see ROW3), 3 vectors of 8. */
#define AROW3(i) __m256 c##i##0 = _mm256_set1_ps(b[i]), c##i##1 = c##i##0, c##i##2 = c##i##0
#define AFMA3(i)                                                                                   \
    do {                                                                                           \
        __m256 av = _mm256_broadcast_ss(a + (i));                                                  \
        c##i##0 = _mm256_fmadd_ps(av, b0, c##i##0);                                                \
        c##i##1 = _mm256_fmadd_ps(av, b1, c##i##1);                                                \
        c##i##2 = _mm256_fmadd_ps(av, b2, c##i##2);                                                \
    } while (0)
#define AFROM3(i)                                                                                  \
    do {                                                                                           \
        if (i < rows) {                                                                            \
            const float *d = c + (size_t)(i)*ldc;                                                  \
            c##i##0 = _mm256_loadu_ps(d);                                                          \
            c##i##1 = _mm256_loadu_ps(d + 8);                                                      \
            c##i##2 = _mm256_loadu_ps(d + 16);                                                     \
        }                                                                                          \
    } while (0)
#define ASTORE3(i)                                                                                 \
    do {                                                                                           \
        if (i < rows) {                                                                            \
            float *d = c + (size_t)(i)*ldc;                                                        \
            _mm256_storeu_ps(d, c##i##0);                                                          \
            _mm256_storeu_ps(d + 8, c##i##1);                                                      \
            _mm256_storeu_ps(d + 16, c##i##2);                                                     \
        }                                                                                          \
    } while (0)

/*  One 4 x 24 block: c[i][q] = bias[i] + sum_k ap[k*MR + i] * src[offs[k] + q]
    (ap: half of a packed panel), or c[i][q] += the sum when `add`. 12
    accumulators, 3 vectors of src and a broadcast: the 16 registers. */
static void taps_block3_avx2(const float *restrict ap, int K, const int32_t *restrict offs,
                             const float *restrict src, const float *bias, bool add, int rows,
                             float *restrict c, int ldc)
{
    float b[MR];
    block_bias(bias, rows, b);
    AROW3(0);
    AROW3(1);
    AROW3(2);
    AROW3(3);
    if (add) {
        AFROM3(0);
        AFROM3(1);
        AFROM3(2);
        AFROM3(3);
    }
    for (int k = 0; k < K; k++) {
        const float *s = src + offs[k], *a = ap + (size_t)k * MR;
        __m256 b0 = _mm256_loadu_ps(s), b1 = _mm256_loadu_ps(s + 8);
        __m256 b2 = _mm256_loadu_ps(s + 16);
        AFMA3(0);
        AFMA3(1);
        AFMA3(2);
        AFMA3(3);
    }
    ASTORE3(0);
    ASTORE3(1);
    ASTORE3(2);
    ASTORE3(3);
}

#define AROW1(i) __m256 c##i = _mm256_set1_ps(b[i])
#define AFMA1(i) c##i = _mm256_fmadd_ps(_mm256_broadcast_ss(a + (i)), b0, c##i)
#define ASTORE1(i)                                                                                 \
    do {                                                                                           \
        if (i < rows)                                                                              \
            avx2_storen(c + (size_t)(i)*ldc, n, c##i);                                             \
    } while (0)

/*  One 8 x 8 block, the first n lanes only. */
static void taps_block1_avx2(const float *restrict ap, int K, const int32_t *restrict offs,
                             const float *restrict src, int n, const float *bias, int rows,
                             float *restrict c, int ldc)
{
    float b[MR];
    block_bias(bias, rows, b);
    AROW1(0);
    AROW1(1);
    AROW1(2);
    AROW1(3);
    AROW1(4);
    AROW1(5);
    AROW1(6);
    AROW1(7);
    const __m256i m = avx2_lanes(n);
    for (int k = 0; k < K; k++) {
        const float *a = ap + (size_t)k * MR;
        __m256 b0 = _mm256_maskload_ps(src + offs[k], m);
        AFMA1(0);
        AFMA1(1);
        AFMA1(2);
        AFMA1(3);
        AFMA1(4);
        AFMA1(5);
        AFMA1(6);
        AFMA1(7);
    }
    ASTORE1(0);
    ASTORE1(1);
    ASTORE1(2);
    ASTORE1(3);
    ASTORE1(4);
    ASTORE1(5);
    ASTORE1(6);
    ASTORE1(7);
}

/*  Taps per chunk of the copy below. */
#define KC 256

/*  With half panels, every block of 24 positions is read by M/4 blocks of
    the result. The taps' runs are rows of a plane or a matrix, often a
    multiple of 4 KB apart (a linear layer of 1024 or 9216 inputs): then
    they all fall into the same few sets of the L1 cache, and each of the
    M/4 passes reads them from L2 again. So the 24 positions of up to KC
    taps are first copied next to each other (as BLAS packs its operand). */
static void taps_gemm_avx2(const float *packed, int M, int K, const int32_t *offs, const float *src,
                           int L, const float *bias, float *c, int ldc)
{
    const int full = L / 24 * 24;
    float run[KC * 24] __attribute__((aligned(32)));
    int32_t run_offs[KC];
    for (int k = 0; k < KC; k++)
        run_offs[k] = 24 * k;
    for (int q = 0; q < full; q += 24) {
        if (M <= 4) {
            taps_block3_avx2(packed, K, offs, src + q, bias, false, M, c + q, ldc);
            continue;
        }
        for (int k0 = 0; k0 < K; k0 += KC) {
            const int kc = K - k0 < KC ? K - k0 : KC;
            for (int k = 0; k < kc; k++) {
                const float *s = src + offs[k0 + k] + q;
                _mm256_store_ps(run + 24 * k, _mm256_loadu_ps(s));
                _mm256_store_ps(run + 24 * k + 8, _mm256_loadu_ps(s + 8));
                _mm256_store_ps(run + 24 * k + 16, _mm256_loadu_ps(s + 16));
            }
            for (int m0 = 0; m0 < M; m0 += 4)
                taps_block3_avx2(packed + (size_t)(m0 / MR * MR) * K + (size_t)k0 * MR + m0 % MR,
                                 kc, run_offs, run, bias ? bias + m0 : NULL, k0 > 0, M - m0,
                                 c + (size_t)m0 * ldc + q, ldc);
        }
    }
    for (int q = full; q < L; q += 8)
        for (int m0 = 0; m0 < M; m0 += MR)
            taps_block1_avx2(packed + (size_t)m0 * K, K, offs, src + q, L - q,
                             bias ? bias + m0 : NULL, M - m0, c + (size_t)m0 * ldc + q, ldc);
}

/*  6 taps x 16 columns of c += taps(src) b (see taps_bt_block4): 12
    accumulators, b's 2 vectors and a broadcast. `full`: all 16 columns
    (a constant in each copy: loads and stores without masks). */
#define BROW(i) __m256 e##i##0 = _mm256_setzero_ps(), e##i##1 = e##i##0
#define BFMA(i)                                                                                    \
    do {                                                                                           \
        __m256 sv = _mm256_broadcast_ss(s##i + q);                                                 \
        e##i##0 = _mm256_fmadd_ps(sv, b0, e##i##0);                                                \
        e##i##1 = _mm256_fmadd_ps(sv, b1, e##i##1);                                                \
    } while (0)
#define BSTORE(i)                                                                                  \
    do {                                                                                           \
        if (i < rows) {                                                                            \
            float *d = c + (size_t)(i)*ldc;                                                        \
            if (full) {                                                                            \
                _mm256_storeu_ps(d, _mm256_add_ps(_mm256_loadu_ps(d), e##i##0));                   \
                _mm256_storeu_ps(d + 8, _mm256_add_ps(_mm256_loadu_ps(d + 8), e##i##1));           \
            } else {                                                                               \
                _mm256_maskstore_ps(d, m0, _mm256_add_ps(_mm256_maskload_ps(d, m0), e##i##0));     \
                _mm256_maskstore_ps(d + 8, m1,                                                     \
                                    _mm256_add_ps(_mm256_maskload_ps(d + 8, m1), e##i##1));        \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static inline __attribute__((always_inline)) void taps_bt_block_avx2(
    const float *const s[6], const float *restrict b, int ldb, int cols, int nrun, int run,
    int stride, int rows, float *restrict c, int ldc, bool full)
{
    const float *restrict s0 = s[0], *restrict s1 = s[1], *restrict s2 = s[2];
    const float *restrict s3 = s[3], *restrict s4 = s[4], *restrict s5 = s[5];
    const __m256i m0 = avx2_lanes(cols), m1 = avx2_lanes(cols - 8);
    BROW(0);
    BROW(1);
    BROW(2);
    BROW(3);
    BROW(4);
    BROW(5);
    FOR_POSITIONS(nrun, run, stride)
    {
        const float *bq = b + (size_t)q * ldb;
        __m256 b0 = full ? _mm256_loadu_ps(bq) : _mm256_maskload_ps(bq, m0);
        __m256 b1 = full ? _mm256_loadu_ps(bq + 8) : _mm256_maskload_ps(bq + 8, m1);
        BFMA(0);
        BFMA(1);
        BFMA(2);
        BFMA(3);
        BFMA(4);
        BFMA(5);
    }
    BSTORE(0);
    BSTORE(1);
    BSTORE(2);
    BSTORE(3);
    BSTORE(4);
    BSTORE(5);
}

static void taps_bt_block_full_avx2(const float *const s[6], const float *b, int ldb, int nrun,
                                    int run, int stride, int rows, float *c, int ldc)
{
    taps_bt_block_avx2(s, b, ldb, 16, nrun, run, stride, rows, c, ldc, true);
}

static void taps_bt_block_part_avx2(const float *const s[6], const float *b, int ldb, int cols,
                                    int nrun, int run, int stride, int rows, float *c, int ldc)
{
    taps_bt_block_avx2(s, b, ldb, cols, nrun, run, stride, rows, c, ldc, false);
}

static void taps_gemm_bt_avx2(const int32_t *offs, int K, const float *src, const float *b, int ldb,
                              int N, int nrun, int run, int stride, float *c, int ldc)
{
    const int runs_per_pass = stride >= BT_Q_CHUNK ? 1 : BT_Q_CHUNK / stride;
    for (int r0 = 0; r0 < nrun; r0 += runs_per_pass) {
        const int n_runs = nrun - r0 < runs_per_pass ? nrun - r0 : runs_per_pass;
        const size_t q0 = (size_t)r0 * stride;
        for (int n0 = 0; n0 < N; n0 += 16)
            for (int k0 = 0; k0 < K; k0 += 6) {
                const float *s[6];
                for (int i = 0; i < 6; i++)
                    s[i] = src + offs[k0 + i < K ? k0 + i : k0] + q0;
                const float *bq = b + q0 * ldb + n0;
                float *cb = c + (size_t)k0 * ldc + n0;
                if (N - n0 >= 16)
                    taps_bt_block_full_avx2(s, bq, ldb, n_runs, run, stride, K - k0, cb, ldc);
                else
                    taps_bt_block_part_avx2(s, bq, ldb, N - n0, n_runs, run, stride, K - k0, cb,
                                            ldc);
            }
    }
}

static void transpose_avx2(const float *src, int rows, int cols, int lds, float *dst, int ldd)
{
    for (int r0 = 0; r0 < rows; r0 += 8)
        for (int c0 = 0; c0 < cols; c0 += 8) {
            const int nr = rows - r0 < 8 ? rows - r0 : 8, nc = cols - c0 < 8 ? cols - c0 : 8;
            __m256 v[8];
            for (int i = 0; i < 8; i++)
                v[i] = i < nr ? avx2_loadn(src + (size_t)(r0 + i) * lds + c0, nc)
                              : _mm256_setzero_ps();
            avx2_transpose8(v);
            for (int j = 0; j < nc; j++)
                avx2_storen(dst + (size_t)(c0 + j) * ldd + r0, nr, v[j]);
        }
}

NN_AVX2_END

/*  ---- portable loops ---- */

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

static void transpose_generic(const float *src, int rows, int cols, int lds, float *dst, int ldd)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            dst[(size_t)c * ldd + r] = src[(size_t)r * lds + c];
}

/*  ---- the CPU's choice ---- */

bool zd__nn_conv_direct_available(void)
{
    return zd__nn_cpu_isa() != NN_ISA_GENERIC;
}

void zd__nn_taps_gemm(const float *packed, int M, int K, const int32_t *offs, const float *src,
                      int L, const float *bias, float *c, int ldc)
{
    switch (zd__nn_cpu_isa()) {
    case NN_ISA_AVX512:
        taps_gemm_avx512(packed, M, K, offs, src, L, bias, c, ldc);
        break;
    case NN_ISA_AVX2:
        taps_gemm_avx2(packed, M, K, offs, src, L, bias, c, ldc);
        break;
    default:
        taps_gemm_generic(packed, M, K, offs, src, L, bias, c, ldc);
    }
}

void zd__nn_taps_gemm_bt(const int32_t *offs, int K, const float *src, const float *b, int ldb,
                         int N, int nrun, int run, int stride, float *c, int ldc)
{
    switch (zd__nn_cpu_isa()) {
    case NN_ISA_AVX512:
        taps_gemm_bt_avx512(offs, K, src, b, ldb, N, nrun, run, stride, c, ldc);
        break;
    case NN_ISA_AVX2:
        taps_gemm_bt_avx2(offs, K, src, b, ldb, N, nrun, run, stride, c, ldc);
        break;
    default:
        taps_gemm_bt_generic(offs, K, src, b, ldb, N, nrun, run, stride, c, ldc);
    }
}

void zd__nn_transpose(const float *src, int rows, int cols, int lds, float *dst, int ldd)
{
    switch (zd__nn_cpu_isa()) {
    case NN_ISA_AVX512:
        transpose_avx512(src, rows, cols, lds, dst, ldd);
        break;
    case NN_ISA_AVX2:
        transpose_avx2(src, rows, cols, lds, dst, ldd);
        break;
    default:
        transpose_generic(src, rows, cols, lds, dst, ldd);
    }
}
