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
    gradient; and the weight gradient is the transposed product, a dot
    product of each output-gradient row (junk columns zeroed) with each
    shifted input run.

    The AVX-512 kernels keep an 8 x 48 block of the result (or a 4 x 4
    block of dot products) in registers; builds without AVX-512 get plain
    loops with the same results up to rounding (conv.c then keeps to im2col
    and OpenBLAS, which are faster there). */
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "nn/nn_private.h"

#define MR 8              /* rows of A per block (nn_taps_pack's panels) */

void nn_taps_pack(const float *a, int M, int K, int64_t m_stride, const int32_t *k_offs,
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

size_t nn_taps_packed_floats(int M, int K)
{
    return (size_t)((M + MR - 1) / MR) * MR * (size_t)K;
}

#ifdef __AVX512F__

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

void nn_taps_gemm(const float *packed, int M, int K, const int32_t *offs, const float *src,
                  int L, const float *bias, float *c, int ldc)
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

/*  Sums of 16 vectors: lane j of the result is the sum of the lanes of
    v[perm[j]] (a fixed tree of shuffles, so the order never changes). */
static inline __m512 sum16(const __m512 v[16])
{
    __m512 s1[8], s2[4], s3[2];
    for (int i = 0; i < 8; i++)    /* lanes 0-7: v[2i]'s halves folded, 8-15: v[2i+1]'s */
        s1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                              _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
    for (int i = 0; i < 4; i++)    /* each 128-bit lane: one vector's four partial sums */
        s2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], 0x88),
                              _mm512_shuffle_f32x4(s1[2 * i], s1[2 * i + 1], 0xdd));
    for (int i = 0; i < 2; i++)    /* pairs of partial sums, two vectors interleaved */
        s3[i] = _mm512_add_ps(_mm512_unpacklo_ps(s2[2 * i], s2[2 * i + 1]),
                              _mm512_unpackhi_ps(s2[2 * i], s2[2 * i + 1]));
    return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x44),
                         _mm512_shuffle_ps(s3[0], s3[1], 0xee));
}

/*  Which vector's sum lands in each lane of sum16 (worked out from the
    shuffles above; the kernel tests check it). */
static const int sum16_perm[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};

/*  One step of a 4 x 4 block of dot products: 16 lanes of q (masked). */
#define DOT_ROW(i)                                                   \
    do {                                                             \
        __m512 av = _mm512_maskz_loadu_ps(m, a##i + q);              \
        d##i##0 = _mm512_fmadd_ps(av, s0, d##i##0);                  \
        d##i##1 = _mm512_fmadd_ps(av, s1, d##i##1);                  \
        d##i##2 = _mm512_fmadd_ps(av, s2, d##i##2);                  \
        d##i##3 = _mm512_fmadd_ps(av, s3, d##i##3);                  \
    } while (0)
#define DOT_STEP()                                                   \
    do {                                                             \
        __m512 s0 = _mm512_maskz_loadu_ps(m, t0 + q);                \
        __m512 s1 = _mm512_maskz_loadu_ps(m, t1 + q);                \
        __m512 s2 = _mm512_maskz_loadu_ps(m, t2 + q);                \
        __m512 s3 = _mm512_maskz_loadu_ps(m, t3 + q);                \
        DOT_ROW(0); DOT_ROW(1); DOT_ROW(2); DOT_ROW(3);              \
    } while (0)
#define DOT_ZERO(i) __m512 d##i##0 = _mm512_setzero_ps(), d##i##1 = d##i##0, \
                           d##i##2 = d##i##0, d##i##3 = d##i##0

/*  A 4 x 4 block of dot products over q < L: c[i][j] += sum_q a_i[q] * t_j[q].
    Rows or taps past the block's end (rows, cols < 4) repeat row or tap 0
    and are not stored. */
static void dot_block(const float *const a[4], const float *const t[4], int L, float *c,
                      int ldc, int rows, int cols)
{
    const float *restrict a0 = a[0], *restrict a1 = a[1], *restrict a2 = a[2];
    const float *restrict a3 = a[3];
    const float *restrict t0 = t[0], *restrict t1 = t[1], *restrict t2 = t[2];
    const float *restrict t3 = t[3];
    DOT_ZERO(0); DOT_ZERO(1); DOT_ZERO(2); DOT_ZERO(3);
    int q = 0;
    __mmask16 m = 0xffff;
    for (; q + 16 <= L; q += 16)
        DOT_STEP();
    if (q < L) {
        m = tail_mask(L - q);
        DOT_STEP();
    }
    const __m512 v[16] = {d00, d01, d02, d03, d10, d11, d12, d13,
                          d20, d21, d22, d23, d30, d31, d32, d33};
    float sums[16];
    _mm512_storeu_ps(sums, sum16(v));
    for (int l = 0; l < 16; l++) {
        int k = sum16_perm[l], i = k / 4, j = k % 4;
        if (i < rows && j < cols)
            c[(size_t)i * ldc + j] += sums[l];
    }
}

void nn_taps_gemm_nt(const float *a, int M, int lda, int K, const int32_t *offs,
                     const float *src, int L, float *c, int ldc)
{
    for (int m0 = 0; m0 < M; m0 += 4) {
        const float *ar[4];
        for (int i = 0; i < 4; i++)
            ar[i] = a + (size_t)(m0 + (m0 + i < M ? i : 0)) * lda;
        for (int k0 = 0; k0 < K; k0 += 4) {
            const float *sr[4];
            for (int j = 0; j < 4; j++)
                sr[j] = src + offs[k0 + (k0 + j < K ? j : 0)];
            dot_block(ar, sr, L, c + (size_t)m0 * ldc + k0, ldc, M - m0, K - k0);
        }
    }
}

bool nn_conv_direct_available(void)
{
    return true;
}

#else /* portable loops */

void nn_taps_gemm(const float *packed, int M, int K, const int32_t *offs, const float *src,
                  int L, const float *bias, float *c, int ldc)
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

void nn_taps_gemm_nt(const float *a, int M, int lda, int K, const int32_t *offs,
                     const float *src, int L, float *c, int ldc)
{
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            const float *am = a + (size_t)m * lda, *s = src + offs[k];
            float acc = 0.0f;
            for (int q = 0; q < L; q++)
                acc += am[q] * s[q];
            c[(size_t)m * ldc + k] += acc;
        }
}

bool nn_conv_direct_available(void)
{
    return false;
}

#endif
