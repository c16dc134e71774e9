/* SPDX-License-Identifier: MIT */
/*  pool.c: max pooling (PyTorch's max_pool2d, no padding, floor mode). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"
#include "nn/simd_avx2.h"

NN_AVX512_BEGIN
/*  Later candidates win when strictly larger, or NaN. */
static inline __mmask16 wins(__m512 v, __m512 best)
{
    return _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}

/*  The first n of 16 lanes (none for n <= 0). */
static inline __mmask16 tail16(int n)
{
    return (__mmask16)(n >= 16 ? 0xffff : n <= 0 ? 0 : (1u << n) - 1);
}

/*  One output row of 2x2/2 pooling, 16 outputs at a time: the even and odd
    columns of both input rows are split apart with permutes, then compared
    in PyTorch's order (row-major in the window). Input rows are ld apart;
    winners are numbered base + column (+ W for the second row). */
static inline void pool_row_2x2_avx512(const float *restrict r0, int ld, int W, int32_t base,
                                       float *restrict y, int32_t *restrict am, int Wo)
{
    const float *restrict r1 = r0 + ld;
    const __m512i even =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i step =
        _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    for (int ow = 0; ow < Wo; ow += 16) {
        int n = Wo - ow < 16 ? Wo - ow : 16; /* outputs in this block */
        int m_in = 2 * n;                    /* input columns read */
        __mmask16 lo = (__mmask16)(m_in >= 16 ? 0xffff : (1u << m_in) - 1);
        __mmask16 hi = (__mmask16)(m_in <= 16 ? 0 : (1u << (m_in - 16)) - 1);
        __mmask16 out = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
        const float *a = r0 + 2 * ow, *b = r1 + 2 * ow;
        __m512 a0 = _mm512_maskz_loadu_ps(lo, a), a1 = _mm512_maskz_loadu_ps(hi, a + 16);
        __m512 b0 = _mm512_maskz_loadu_ps(lo, b), b1 = _mm512_maskz_loadu_ps(hi, b + 16);
        __m512 best = _mm512_permutex2var_ps(a0, even, a1);
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + 2 * ow), step);
        __m512 v = _mm512_permutex2var_ps(a0, odd, a1);
        __mmask16 t = wins(v, best);
        best = _mm512_mask_mov_ps(best, t, v);
        __m512i bi = _mm512_mask_add_epi32(idx, t, idx, _mm512_set1_epi32(1));
        v = _mm512_permutex2var_ps(b0, even, b1);
        t = wins(v, best);
        best = _mm512_mask_mov_ps(best, t, v);
        bi = _mm512_mask_add_epi32(bi, t, idx, _mm512_set1_epi32(W));
        v = _mm512_permutex2var_ps(b0, odd, b1);
        t = wins(v, best);
        best = _mm512_mask_mov_ps(best, t, v);
        bi = _mm512_mask_add_epi32(bi, t, idx, _mm512_set1_epi32(W + 1));
        _mm512_mask_storeu_ps(y + ow, out, best);
        _mm512_mask_storeu_epi32(am + ow, out, bi);
    }
}

/*  Every output row of 2x2/2 pooling, Ho x Wo (arguments as in
    zd__nn_pool_plane). */
static void pool_2x2_avx512(const float *x, int ld, int idx_ld, int Ho, int Wo, float *y,
                            int32_t *argmax)
{
    for (int oh = 0; oh < Ho; oh++)
        pool_row_2x2_avx512(x + 2 * oh * ld, ld, idx_ld, 2 * oh * idx_ld, y + oh * Wo,
                            argmax + oh * Wo, Wo);
}

/*  Every output row of 3x3/3 pooling, 16 outputs at a time: the 48 input
    columns of a window row are split into the windows' first, second and
    third columns (lane l of x[j] = column 3l + j) with permutes; then the
    nine candidates in PyTorch's order, as for 2x2. Arguments as in
    zd__nn_pool_plane. */
static void pool_3x3_avx512(const float *x, int ld, int idx_ld, int Ho, int Wo, float *y,
                            int32_t *argmax)
{
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i step = _mm512_mullo_epi32(lane, _mm512_set1_epi32(3));
    __m512i col[3];
    __mmask16 from_c[3];
    for (int j = 0; j < 3; j++) {
        col[j] = _mm512_add_epi32(step, _mm512_set1_epi32(j));
        from_c[j] = _mm512_cmpge_epi32_mask(col[j], _mm512_set1_epi32(32));
    }
    for (int oh = 0; oh < Ho; oh++)
        for (int ow = 0; ow < Wo; ow += 16) {
            const int n = Wo - ow < 16 ? Wo - ow : 16, m = 3 * n;
            const __mmask16 out = (__mmask16)(n == 16 ? 0xffff : (1u << n) - 1);
            __m512 best = _mm512_setzero_ps();
            __m512i bi = _mm512_setzero_si512();
            for (int i = 0; i < 3; i++) {
                const float *r = x + (size_t)(3 * oh + i) * ld + 3 * ow;
                const __m512 a = _mm512_maskz_loadu_ps(tail16(m), r);
                const __m512 b = _mm512_maskz_loadu_ps(tail16(m - 16), r + 16);
                const __m512 c = _mm512_maskz_loadu_ps(tail16(m - 32), r + 32);
                const __m512i idx =
                    _mm512_add_epi32(_mm512_set1_epi32((3 * oh + i) * idx_ld + 3 * ow), step);
                for (int j = 0; j < 3; j++) {
                    __m512 v = _mm512_mask_permutexvar_ps(_mm512_permutex2var_ps(a, col[j], b),
                                                          from_c[j], col[j], c);
                    __m512i vi = _mm512_add_epi32(idx, _mm512_set1_epi32(j));
                    if (i == 0 && j == 0) {
                        best = v;
                        bi = vi;
                        continue;
                    }
                    __mmask16 t = wins(v, best);
                    best = _mm512_mask_mov_ps(best, t, v);
                    bi = _mm512_mask_mov_epi32(bi, t, vi);
                }
            }
            _mm512_mask_storeu_ps(y + (size_t)oh * Wo + ow, out, best);
            _mm512_mask_storeu_epi32(argmax + (size_t)oh * Wo + ow, out, bi);
        }
}
NN_AVX512_END

NN_AVX2_BEGIN
/*  The same as a mask vector: lanes where v wins over best. */
static inline __m256 wins_avx2(__m256 v, __m256 best)
{
    return _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

/*  The even and odd lanes of the 16 floats lo, hi (in order). */
static inline void split_avx2(__m256 lo, __m256 hi, __m256 *even, __m256 *odd)
{
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    __m256 a = _mm256_permutevar8x32_ps(lo, perm), b = _mm256_permutevar8x32_ps(hi, perm);
    *even = _mm256_permute2f128_ps(a, b, 0x20);
    *odd = _mm256_permute2f128_ps(a, b, 0x31);
}

/*  pool_row_2x2_avx512, 8 outputs at a time. */
static inline void pool_row_2x2_avx2(const float *restrict r0, int ld, int W, int32_t base,
                                     float *restrict y, int32_t *restrict am, int Wo)
{
    const float *restrict r1 = r0 + ld;
    const __m256i step = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    for (int ow = 0; ow < Wo; ow += 8) {
        const int n = Wo - ow < 8 ? Wo - ow : 8; /* outputs in this block */
        const float *a = r0 + 2 * ow, *b = r1 + 2 * ow;
        __m256 best, v, t, c, d;
        split_avx2(avx2_loadn(a, 2 * n), avx2_loadn(a + 8, 2 * n - 8), &best, &v);
        split_avx2(avx2_loadn(b, 2 * n), avx2_loadn(b + 8, 2 * n - 8), &c, &d);
        const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(base + 2 * ow), step);
        __m256 bi = _mm256_castsi256_ps(idx);
        t = wins_avx2(v, best);
        best = _mm256_blendv_ps(best, v, t);
        bi = _mm256_blendv_ps(bi, _mm256_castsi256_ps(_mm256_add_epi32(idx, _mm256_set1_epi32(1))),
                              t);
        t = wins_avx2(c, best);
        best = _mm256_blendv_ps(best, c, t);
        bi = _mm256_blendv_ps(bi, _mm256_castsi256_ps(_mm256_add_epi32(idx, _mm256_set1_epi32(W))),
                              t);
        t = wins_avx2(d, best);
        best = _mm256_blendv_ps(best, d, t);
        bi = _mm256_blendv_ps(
            bi, _mm256_castsi256_ps(_mm256_add_epi32(idx, _mm256_set1_epi32(W + 1))), t);
        avx2_storen(y + ow, n, best);
        avx2_storen_epi32(am + ow, n, _mm256_castps_si256(bi));
    }
}

static void pool_2x2_avx2(const float *x, int ld, int idx_ld, int Ho, int Wo, float *y,
                          int32_t *argmax)
{
    for (int oh = 0; oh < Ho; oh++)
        pool_row_2x2_avx2(x + 2 * oh * ld, ld, idx_ld, 2 * oh * idx_ld, y + oh * Wo,
                          argmax + oh * Wo, Wo);
}

/*  The 24 floats p[0 .. m) (zeros past m) as the windows' first, second
    and third columns: lane l of x[j] is p[3l + j]. Each x[j] takes its
    lanes from the three vectors by two blends, then one permute puts them
    in order. */
static inline void split3_avx2(const float *p, int m, __m256 x[3])
{
    const __m256 a = avx2_loadn(p, m), b = avx2_loadn(p + 8, m - 8);
    const __m256 c = avx2_loadn(p + 16, m - 16);
    x[0] = _mm256_permutevar8x32_ps(_mm256_blend_ps(_mm256_blend_ps(a, b, 0x92), c, 0x24),
                                    _mm256_setr_epi32(0, 3, 6, 1, 4, 7, 2, 5));
    x[1] = _mm256_permutevar8x32_ps(_mm256_blend_ps(_mm256_blend_ps(a, b, 0x24), c, 0x49),
                                    _mm256_setr_epi32(1, 4, 7, 2, 5, 0, 3, 6));
    x[2] = _mm256_permutevar8x32_ps(_mm256_blend_ps(_mm256_blend_ps(a, b, 0x49), c, 0x92),
                                    _mm256_setr_epi32(2, 5, 0, 3, 6, 1, 4, 7));
}

/*  pool_3x3_avx512, 8 outputs at a time. */
static void pool_3x3_avx2(const float *x, int ld, int idx_ld, int Ho, int Wo, float *y,
                          int32_t *argmax)
{
    const __m256i step = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    for (int oh = 0; oh < Ho; oh++)
        for (int ow = 0; ow < Wo; ow += 8) {
            const int n = Wo - ow < 8 ? Wo - ow : 8;
            __m256 best = _mm256_setzero_ps(), bi = _mm256_setzero_ps();
            for (int i = 0; i < 3; i++) {
                __m256 v[3];
                split3_avx2(x + (size_t)(3 * oh + i) * ld + 3 * ow, 3 * n, v);
                const __m256i idx =
                    _mm256_add_epi32(_mm256_set1_epi32((3 * oh + i) * idx_ld + 3 * ow), step);
                for (int j = 0; j < 3; j++) {
                    __m256 vi = _mm256_castsi256_ps(_mm256_add_epi32(idx, _mm256_set1_epi32(j)));
                    if (i == 0 && j == 0) {
                        best = v[0];
                        bi = vi;
                        continue;
                    }
                    __m256 t = wins_avx2(v[j], best);
                    best = _mm256_blendv_ps(best, v[j], t);
                    bi = _mm256_blendv_ps(bi, vi, t);
                }
            }
            avx2_storen(y + (size_t)oh * Wo + ow, n, best);
            avx2_storen_epi32(argmax + (size_t)oh * Wo + ow, n, _mm256_castps_si256(bi));
        }
}
NN_AVX2_END

/*  One output row of 2x2/2 pooling, branch-free so that it vectorises:
    candidates in PyTorch's order (row-major in the window), a later one
    winning only when strictly larger, or NaN. Numbering as above. */
static void pool_row_2x2(const float *restrict r0, int ld, int W, int32_t base, float *restrict y,
                         int32_t *restrict am, int Wo)
{
    const float *restrict r1 = r0 + ld;
    for (int ow = 0; ow < Wo; ow++) {
        float a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
        int32_t i = base + 2 * ow;
        float best = a;
        int32_t bi = i;
        bool t = b > best || b != b;
        best = t ? b : best;
        bi = t ? i + 1 : bi;
        t = c > best || c != c;
        best = t ? c : best;
        bi = t ? i + W : bi;
        t = d > best || d != d;
        best = t ? d : best;
        bi = t ? i + W + 1 : bi;
        y[ow] = best;
        am[ow] = bi;
    }
}

/*  Any window: running maxima over the window's rows, one output row at
    a time, so the inner loops run along contiguous memory (and vectorise:
    compiled again for AVX-512 and AVX2 below). */
static inline __attribute__((always_inline)) void pool_any(const float *x, int ld, int idx_ld,
                                                           int k, int s, int Ho, int Wo, float *y,
                                                           int32_t *argmax)
{
    for (int oh = 0; oh < Ho; oh++) {
        float *yr = y + oh * Wo;
        int32_t *ar = argmax + oh * Wo;
        for (int i = 0; i < k; i++) {
            const float *xr = x + (oh * s + i) * ld;
            for (int j = 0; j < k; j++) {
                for (int ow = 0; ow < Wo; ow++) {
                    int32_t idx = (oh * s + i) * idx_ld + ow * s + j;
                    float v = xr[ow * s + j];
                    bool first = i == 0 && j == 0;
                    bool t = first || v > yr[ow] || v != v;
                    yr[ow] = t ? v : yr[ow];
                    ar[ow] = t ? idx : ar[ow];
                }
            }
        }
    }
}

NN_AVX512_BEGIN
static void pool_any_avx512(const float *x, int ld, int idx_ld, int k, int s, int Ho, int Wo,
                            float *y, int32_t *argmax)
{
    pool_any(x, ld, idx_ld, k, s, Ho, Wo, y, argmax);
}
NN_AVX512_END

NN_AVX2_BEGIN
static void pool_any_avx2(const float *x, int ld, int idx_ld, int k, int s, int Ho, int Wo,
                          float *y, int32_t *argmax)
{
    pool_any(x, ld, idx_ld, k, s, Ho, Wo, y, argmax);
}
NN_AVX2_END

void zd__nn_pool_plane(const float *x, int H, int W, int ld, int idx_ld, int k, int s, float *y,
                       int32_t *argmax)
{
    const int Ho = (H - k) / s + 1, Wo = (W - k) / s + 1;
    const nn_isa_t isa = zd__nn_cpu_isa();
    if (k == 2 && s == 2) {
        if (isa == NN_ISA_AVX512) {
            pool_2x2_avx512(x, ld, idx_ld, Ho, Wo, y, argmax);
            return;
        }
        if (isa == NN_ISA_AVX2) {
            pool_2x2_avx2(x, ld, idx_ld, Ho, Wo, y, argmax);
            return;
        }
        for (int oh = 0; oh < Ho; oh++)
            pool_row_2x2(x + 2 * oh * ld, ld, idx_ld, 2 * oh * idx_ld, y + oh * Wo,
                         argmax + oh * Wo, Wo);
        return;
    }
    if (k == 3 && s == 3 && isa == NN_ISA_AVX512) {
        pool_3x3_avx512(x, ld, idx_ld, Ho, Wo, y, argmax);
        return;
    }
    if (k == 3 && s == 3 && isa == NN_ISA_AVX2) {
        pool_3x3_avx2(x, ld, idx_ld, Ho, Wo, y, argmax);
        return;
    }
    if (isa == NN_ISA_AVX512)
        pool_any_avx512(x, ld, idx_ld, k, s, Ho, Wo, y, argmax);
    else if (isa == NN_ISA_AVX2)
        pool_any_avx2(x, ld, idx_ld, k, s, Ho, Wo, y, argmax);
    else
        pool_any(x, ld, idx_ld, k, s, Ho, Wo, y, argmax);
}

void zd__nn_pool_plane_backward(const float *dy, const int32_t *argmax, int H, int W, int k, int s,
                                float *dx)
{
    const int Ho = (H - k) / s + 1, Wo = (W - k) / s + 1;
    memset(dx, 0, sizeof(float) * (size_t)H * W);
    for (int i = 0; i < Ho * Wo; i++)
        dx[argmax[i]] += dy[i];
}

/*  ---- the op ---- */

typedef struct {
    int64_t shape[4]; /* input (N,C,H,W) */
    int kernel, stride;
    int32_t argmax[]; /* per output: index inside its input plane */
} pool_ctx_t;

typedef struct {
    const pool_ctx_t *ctx;
    int64_t planes;
    int n_chunks;
    const float *in; /* forward: x; backward: dy */
    float *out;      /* forward: y; backward: dx */
    int32_t *argmax;
} pool_job_t;

static void pool_chunk(void *arg, int c, float *scratch)
{
    const pool_job_t *j = arg;
    const pool_ctx_t *ctx = j->ctx;
    (void)scratch;
    const int H = (int)ctx->shape[2], W = (int)ctx->shape[3], k = ctx->kernel, s = ctx->stride;
    const int64_t per = (int64_t)((H - k) / s + 1) * ((W - k) / s + 1);
    int64_t lo, hi;
    nn_chunk_range(j->planes, j->n_chunks, c, &lo, &hi);
    for (int64_t p = lo; p < hi; p++)
        zd__nn_pool_plane(j->in + p * H * W, H, W, W, W, k, s, j->out + p * per,
                          j->argmax + p * per);
}

static void pool_backward_chunk(void *arg, int c, float *scratch)
{
    const pool_job_t *j = arg;
    const pool_ctx_t *ctx = j->ctx;
    (void)scratch;
    const int H = (int)ctx->shape[2], W = (int)ctx->shape[3], k = ctx->kernel, s = ctx->stride;
    const int64_t per = (int64_t)((H - k) / s + 1) * ((W - k) / s + 1);
    int64_t lo, hi;
    nn_chunk_range(j->planes, j->n_chunks, c, &lo, &hi);
    for (int64_t p = lo; p < hi; p++)
        zd__nn_pool_plane_backward(j->in + p * per, ctx->argmax + p * per, H, W, k, s,
                                   j->out + p * H * W);
}

static int pool_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const pool_ctx_t *ctx = zd_autograd_node_ctx(n);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, ctx->shape, 4)))
        return -1;
    pool_job_t job = {.ctx = ctx,
                      .planes = ctx->shape[0] * ctx->shape[1],
                      .in = zd_tensor_data(gout[0]),
                      .out = zd_tensor_data(gin[0])};
    job.n_chunks = nn_elem_chunks(zd_tensor_numel(gin[0]));
    return zd__nn_parallel_run(job.n_chunks, 0, pool_backward_chunk, &job);
}

static const zd_autograd_node_ops_t pool_ops =
    ZD_AUTOGRAD_NODE_OPS("MaxPool2DBackward", pool_backward, zd__nn_free_ctx);

int zd__nn_pool_check(const char *op, const zd_tensor_t *x, int kernel, int stride)
{
    char sx[96];
    if (kernel < 1 || stride < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: kernel %d and stride %d must be >= 1", op,
                                 kernel, stride);
    if (zd_tensor_size(x, 2) < kernel || zd_tensor_size(x, 3) < kernel)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: kernel %d larger than input %s", op, kernel,
                                 zd_tensor_shape_str(x, sx, sizeof sx));
    if (zd_tensor_size(x, 2) * zd_tensor_size(x, 3) > INT32_MAX)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: input planes of %s too large", op,
                                 zd_tensor_shape_str(x, sx, sizeof sx));
    return 0;
}

int zd_nn_max_pool2d(zd_tensor_t *x, int kernel, int stride, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_max_pool2d: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("max_pool2d: input", x) < 0 ||
        zd__nn_check_ndim("max_pool2d: input", x, 4) < 0)
        return -1;
    if (stride == 0)
        stride = kernel;
    if (zd__nn_pool_check("max_pool2d", x, kernel, stride) < 0)
        return -1;
    const int64_t *s = zd_tensor_shape(x);
    const int64_t Ho = (s[2] - kernel) / stride + 1, Wo = (s[3] - kernel) / stride + 1;
    const int64_t planes = s[0] * s[1], per = Ho * Wo;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){s[0], s[1], Ho, Wo}, 4);
    pool_ctx_t *ctx = malloc(sizeof *ctx + sizeof(int32_t) * (size_t)(planes * per));
    if (!y || !ctx) {
        zd_tensor_unref(y);
        free(ctx);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "max_pool2d: out of memory");
    }
    memcpy(ctx->shape, s, sizeof ctx->shape);
    ctx->kernel = kernel;
    ctx->stride = stride;
    pool_job_t job = {.ctx = ctx,
                      .planes = planes,
                      .in = zd_tensor_data(x),
                      .out = zd_tensor_data(y),
                      .argmax = ctx->argmax};
    job.n_chunks = nn_elem_chunks(zd_tensor_numel(x));
    if (zd__nn_parallel_run(job.n_chunks, 0, pool_chunk, &job) < 0) {
        zd_tensor_unref(y);
        free(ctx);
        return -1;
    }
    if (zd__nn_record(&pool_ops, &x, 1, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}
