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

NN_AVX512_BEGIN
/*  Later candidates win when strictly larger, or NaN. */
static inline __mmask16 wins(__m512 v, __m512 best)
{
    return _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}

/*  One output row of 2x2/2 pooling, 16 outputs at a time: the even and odd
    columns of both input rows are split apart with permutes, then compared
    in PyTorch's order (row-major in the window). Input rows are ld apart;
    winners are numbered base + column (+ W for the second row). */
static inline void pool_row_2x2_avx512(const float *restrict r0, int ld, int W, int32_t base,
                                       float *restrict y, int32_t *restrict am, int Wo)
{
    const float *restrict r1 = r0 + ld;
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,
                                          2, 0);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i step = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4,
                                          2, 0);
    for (int ow = 0; ow < Wo; ow += 16) {
        int n = Wo - ow < 16 ? Wo - ow : 16;          /* outputs in this block */
        int m_in = 2 * n;                             /* input columns read */
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
NN_AVX512_END

/*  One output row of 2x2/2 pooling, branch-free so that it vectorises:
    candidates in PyTorch's order (row-major in the window), a later one
    winning only when strictly larger, or NaN. Numbering as above. */
static void pool_row_2x2(const float *restrict r0, int ld, int W, int32_t base,
                         float *restrict y, int32_t *restrict am, int Wo)
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
    compiled twice, for AVX-512 below). */
static inline __attribute__((always_inline)) void pool_any(const float *x, int ld, int idx_ld,
                                                           int k, int s, int Ho, int Wo,
                                                           float *y, int32_t *argmax)
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

void zd__nn_pool_plane(const float *x, int H, int W, int ld, int idx_ld, int k, int s, float *y,
                   int32_t *argmax)
{
    const int Ho = (H - k) / s + 1, Wo = (W - k) / s + 1;
    if (k == 2 && s == 2) {
        if (zd__nn_cpu_avx512()) {
            pool_2x2_avx512(x, ld, idx_ld, Ho, Wo, y, argmax);
            return;
        }
        for (int oh = 0; oh < Ho; oh++)
            pool_row_2x2(x + 2 * oh * ld, ld, idx_ld, 2 * oh * idx_ld, y + oh * Wo,
                         argmax + oh * Wo, Wo);
        return;
    }
    if (zd__nn_cpu_avx512())
        pool_any_avx512(x, ld, idx_ld, k, s, Ho, Wo, y, argmax);
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

/* ---- the op ---- */

typedef struct {
    int64_t shape[4];     /* input (N,C,H,W) */
    int kernel, stride;
    int32_t argmax[];     /* per output: index inside its input plane */
} pool_ctx_t;

typedef struct {
    const pool_ctx_t *ctx;
    int64_t planes;
    int n_chunks;
    const float *in;      /* forward: x; backward: dy */
    float *out;           /* forward: y; backward: dx */
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
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, 4, ctx->shape)))
        return -1;
    pool_job_t job = {.ctx = ctx, .planes = ctx->shape[0] * ctx->shape[1],
                      .in = zd_tensor_data(gout[0]), .out = zd_tensor_data(gin[0])};
    job.n_chunks = nn_elem_chunks(zd_tensor_numel(gin[0]));
    return zd__nn_parallel_run(job.n_chunks, 0, pool_backward_chunk, &job);
}

static const zd_autograd_node_ops_t pool_ops = {"MaxPool2DBackward", pool_backward, zd__nn_free_ctx};

int zd__nn_pool_check(const char *op, const zd_tensor_t *x, int kernel, int stride)
{
    char sx[96];
    if (kernel < 1 || stride < 1)
        return zd_error_set("%s: kernel %d and stride %d must be >= 1", op, kernel, stride);
    if (zd_tensor_size(x, 2) < kernel || zd_tensor_size(x, 3) < kernel)
        return zd_error_set("%s: kernel %d larger than input %s", op, kernel,
                         zd_tensor_shape_str(x, sx, sizeof sx));
    if (zd_tensor_size(x, 2) * zd_tensor_size(x, 3) > INT32_MAX)
        return zd_error_set("%s: input planes of %s too large", op,
                         zd_tensor_shape_str(x, sx, sizeof sx));
    return 0;
}

int zd_nn_max_pool2d(zd_tensor_t *x, int kernel, int stride, zd_tensor_t **out)
{
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
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, 4, (int64_t[]){s[0], s[1], Ho, Wo});
    pool_ctx_t *ctx = malloc(sizeof *ctx + sizeof(int32_t) * (size_t)(planes * per));
    if (!y || !ctx) {
        zd_tensor_unref(y);
        free(ctx);
        return zd_error_set("max_pool2d: out of memory");
    }
    memcpy(ctx->shape, s, sizeof ctx->shape);
    ctx->kernel = kernel;
    ctx->stride = stride;
    pool_job_t job = {.ctx = ctx, .planes = planes, .in = zd_tensor_data(x),
                      .out = zd_tensor_data(y), .argmax = ctx->argmax};
    job.n_chunks = nn_elem_chunks(zd_tensor_numel(x));
    if (zd__nn_parallel_run(job.n_chunks, 0, pool_chunk, &job) < 0) {
        zd_tensor_unref(y);
        free(ctx);
        return -1;
    }
    if (zd__nn_record(&pool_ops, 1, &x, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}
