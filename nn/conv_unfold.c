/* SPDX-License-Identifier: MIT */
/*  conv_unfold.c: im2col and col2im, the unfolding of input patches into
    the matrix a convolution multiplies (and the folding of its gradient
    back onto the input). */
#include <string.h>
#include <immintrin.h>

#include "nn/nn_private.h"
#include "nn/simd_avx2.h"

/*  Output columns ow whose input column ow*stride - padding + kj lies in
    [0, W): [*lo, *hi). */
static void valid_range(const nn_conv_geom_t *g, int kj, int *lo, int *hi)
{
    int off = kj - g->padding; /* iw = ow*stride + off */
    int l = off >= 0 ? 0 : (-off + g->stride - 1) / g->stride;
    int last = g->W - 1 - off; /* need ow*stride <= last */
    int h = last < 0 ? 0 : last / g->stride + 1;
    if (h > g->Wo)
        h = g->Wo;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
}

/*  Rows of a few dozen floats (one output row of the convolution):
    copied and added a vector at a time, the last partial vector under a
    mask with AVX-512 and AVX2; no memcpy call per row. */
NN_AVX512_BEGIN
static inline void copy_row_avx512(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
}

static inline void add_row_avx512(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i,
                         _mm512_add_ps(_mm512_loadu_ps(dst + i), _mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512 v =
            _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + i), _mm512_maskz_loadu_ps(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, v);
    }
}
NN_AVX512_END

NN_AVX2_BEGIN
static inline void copy_row_avx2(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
    if (i < n)
        avx2_storen(dst + i, n - i, avx2_loadn(src + i, n - i));
}

static inline void add_row_avx2(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
    if (i < n)
        avx2_storen(dst + i, n - i,
                    _mm256_add_ps(avx2_loadn(dst + i, n - i), avx2_loadn(src + i, n - i)));
}
NN_AVX2_END

typedef float v8f __attribute__((vector_size(32), aligned(4), may_alias));

/*  GCC would turn this loop back into a memmove call per row. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
static inline void
copy_row(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        *(v8f *)(dst + i) = *(const v8f *)(src + i);
    for (; i < n; i++)
        dst[i] = src[i];
}

static inline void add_row(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        *(v8f *)(dst + i) += *(const v8f *)(src + i);
    for (; i < n; i++)
        dst[i] += src[i];
}

/*  im2col and col2im are written once, for every kind of rows: `isa` (a
    constant in each copy below) picks the AVX-512, AVX2 or portable ones. */
#define NN_BODY static inline __attribute__((always_inline))

NN_BODY void copy_row_isa(float *dst, const float *src, int n, nn_isa_t isa)
{
    if (isa == NN_ISA_AVX512)
        copy_row_avx512(dst, src, n);
    else if (isa == NN_ISA_AVX2)
        copy_row_avx2(dst, src, n);
    else
        copy_row(dst, src, n);
}

NN_BODY void add_row_isa(float *dst, const float *src, int n, nn_isa_t isa)
{
    if (isa == NN_ISA_AVX512)
        add_row_avx512(dst, src, n);
    else if (isa == NN_ISA_AVX2)
        add_row_avx2(dst, src, n);
    else
        add_row(dst, src, n);
}

NN_BODY void im2col(const nn_conv_geom_t *g, const float *x, float *col, nn_isa_t isa)
{
    const int P = g->Ho * g->Wo;
    for (int c = 0; c < g->C; c++) {
        const float *xc = x + (size_t)c * g->H * g->W;
        for (int ki = 0; ki < g->kh; ki++) {
            for (int kj = 0; kj < g->kw; kj++) {
                float *row = col + ((size_t)(c * g->kh + ki) * g->kw + kj) * P;
                int lo, hi;
                valid_range(g, kj, &lo, &hi);
                int off = kj - g->padding;
                for (int oh = 0; oh < g->Ho; oh++) {
                    float *dst = row + (size_t)oh * g->Wo;
                    int ih = oh * g->stride - g->padding + ki;
                    if (ih < 0 || ih >= g->H) {
                        memset(dst, 0, sizeof(float) * (size_t)g->Wo);
                        continue;
                    }
                    const float *src = xc + (size_t)ih * g->W;
                    for (int ow = 0; ow < lo; ow++)
                        dst[ow] = 0.0f;
                    if (g->stride == 1) {
                        copy_row_isa(dst + lo, src + lo + off, hi - lo, isa);
                    } else {
                        for (int ow = lo; ow < hi; ow++)
                            dst[ow] = src[ow * g->stride + off];
                    }
                    for (int ow = hi; ow < g->Wo; ow++)
                        dst[ow] = 0.0f;
                }
            }
        }
    }
}

/*  dx (C,H,W) += fold(dcol); dx must be initialised by the caller. */
NN_BODY void col2im(const nn_conv_geom_t *g, const float *dcol, float *dx, nn_isa_t isa)
{
    const int P = g->Ho * g->Wo;
    for (int c = 0; c < g->C; c++) {
        float *xc = dx + (size_t)c * g->H * g->W;
        for (int ki = 0; ki < g->kh; ki++) {
            for (int kj = 0; kj < g->kw; kj++) {
                const float *row = dcol + ((size_t)(c * g->kh + ki) * g->kw + kj) * P;
                int lo, hi;
                valid_range(g, kj, &lo, &hi);
                int off = kj - g->padding;
                for (int oh = 0; oh < g->Ho; oh++) {
                    int ih = oh * g->stride - g->padding + ki;
                    if (ih < 0 || ih >= g->H)
                        continue;
                    float *dst = xc + (size_t)ih * g->W + off;
                    const float *src = row + (size_t)oh * g->Wo;
                    if (g->stride == 1) {
                        add_row_isa(dst + lo, src + lo, hi - lo, isa);
                    } else {
                        for (int ow = lo; ow < hi; ow++)
                            dst[ow * g->stride] += src[ow];
                    }
                }
            }
        }
    }
}

NN_AVX512_BEGIN
static void im2col_avx512(const nn_conv_geom_t *g, const float *x, float *col)
{
    im2col(g, x, col, NN_ISA_AVX512);
}

static void col2im_avx512(const nn_conv_geom_t *g, const float *dcol, float *dx)
{
    col2im(g, dcol, dx, NN_ISA_AVX512);
}
NN_AVX512_END

NN_AVX2_BEGIN
static void im2col_avx2(const nn_conv_geom_t *g, const float *x, float *col)
{
    im2col(g, x, col, NN_ISA_AVX2);
}

static void col2im_avx2(const nn_conv_geom_t *g, const float *dcol, float *dx)
{
    col2im(g, dcol, dx, NN_ISA_AVX2);
}
NN_AVX2_END

void zd__nn_im2col(const nn_conv_geom_t *g, const float *x, float *col)
{
    switch (zd__nn_cpu_isa()) {
    case NN_ISA_AVX512:
        im2col_avx512(g, x, col);
        break;
    case NN_ISA_AVX2:
        im2col_avx2(g, x, col);
        break;
    default:
        im2col(g, x, col, NN_ISA_GENERIC);
    }
}

void zd__nn_col2im(const nn_conv_geom_t *g, const float *dcol, float *dx)
{
    switch (zd__nn_cpu_isa()) {
    case NN_ISA_AVX512:
        col2im_avx512(g, dcol, dx);
        break;
    case NN_ISA_AVX2:
        col2im_avx2(g, dcol, dx);
        break;
    default:
        col2im(g, dcol, dx, NN_ISA_GENERIC);
    }
}
