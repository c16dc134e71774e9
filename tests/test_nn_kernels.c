/* SPDX-License-Identifier: MIT */
/*  The kernels whose results are exact (max pooling with its winners,
    im2col and col2im, the transpose) give the same bits on every path the
    CPU has (generic, AVX2, AVX-512; nn/cpu.c) as on the portable one, on
    sizes that exercise every block edge and tail mask: pooling with ties
    (the first maximum wins, in PyTorch's order) and NaN (a NaN wins, the
    last of them, as in PyTorch), which a wrong compare or blend would get
    wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/rng.h>
#include "nn/nn_private.h"

static zd_rng_t rng;

/*  The paths this CPU runs, the portable one first. */
static int paths(const char *names[3])
{
    const unsigned f = zd__nn_cpu_features();
    int n = 0;
    names[n++] = "generic";
    if (f & NN_CPU_AVX2)
        names[n++] = "avx2";
    if (f & NN_CPU_AVX512)
        names[n++] = "avx512";
    return n;
}

/*  Floats from a few values, so that windows hold ties; NaN at `nan_every`
    (0: none). */
static void fill(float *p, size_t n, int nan_every)
{
    for (size_t i = 0; i < n; i++) {
        p[i] = (float)zd_rng_below(&rng, 5) - 2.0f;
        if (nan_every && zd_rng_below(&rng, (uint64_t)nan_every) == 0)
            p[i] = NAN;
    }
}

static void assert_same_bits(const char *what, const char *path, const void *a, const void *b,
                             size_t bytes)
{
    if (memcmp(a, b, bytes) != 0) {
        const unsigned char *x = a, *y = b;
        size_t i = 0;
        while (x[i] == y[i])
            i++;
        fail_msg("%s on %s: differs from generic at byte %zu", what, path, i);
    }
}

static void check_pool(int H, int W, int k, int s, int nan_every)
{
    const char *names[3];
    const int np = paths(names), Ho = (H - k) / s + 1, Wo = (W - k) / s + 1;
    const int ld = W + 3, idx_ld = W + 5; /* rows apart, numbered otherwise */
    float *x = malloc(sizeof(float) * (size_t)H * ld);
    float *y[3];
    int32_t *am[3];
    assert_non_null(x);
    fill(x, (size_t)H * ld, nan_every);
    for (int p = 0; p < np; p++) {
        y[p] = malloc(sizeof(float) * (size_t)Ho * Wo);
        am[p] = malloc(sizeof(int32_t) * (size_t)Ho * Wo);
        assert_true(y[p] && am[p]);
        assert_int_equal(zd__nn_cpu_set(names[p]), 0);
        zd__nn_pool_plane(x, H, W, ld, idx_ld, k, s, y[p], am[p]);
    }
    assert_int_equal(zd__nn_cpu_set(NULL), 0);
    char what[64];
    snprintf(what, sizeof what, "pool %dx%d k%d s%d", H, W, k, s);
    for (int p = 1; p < np; p++) {
        assert_same_bits(what, names[p], y[0], y[p], sizeof(float) * (size_t)Ho * Wo);
        assert_same_bits(what, names[p], am[0], am[p], sizeof(int32_t) * (size_t)Ho * Wo);
    }
    /* and the portable result is PyTorch's rule */
    for (int oh = 0; oh < Ho; oh++)
        for (int ow = 0; ow < Wo; ow++) {
            int32_t want = -1;
            float best = 0.0f;
            for (int i = 0; i < k; i++)
                for (int j = 0; j < k; j++) {
                    const float v = x[(oh * s + i) * ld + ow * s + j];
                    if (want < 0 || v > best || isnan(v)) {
                        best = v;
                        want = (oh * s + i) * idx_ld + ow * s + j;
                    }
                }
            assert_int_equal(am[0][oh * Wo + ow], want);
        }
    for (int p = 0; p < np; p++) {
        free(y[p]);
        free(am[p]);
    }
    free(x);
}

static void test_pool(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 7);
    static const int sizes[][2] = {{2, 2},  {3, 3},   {4, 7},   {5, 31}, {6, 33},
                                   {9, 47}, {26, 26}, {24, 24}, {7, 50}, {11, 97}};
    static const int ks[][2] = {{2, 2}, {3, 3}, {3, 2}, {2, 1}, {1, 1}};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++)
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++) {
            const int H = sizes[a][0], W = sizes[a][1], k = ks[b][0], s = ks[b][1];
            if (H < k || W < k)
                continue;
            check_pool(H, W, k, s, 0);
            check_pool(H, W, k, s, 7);
        }
}

static void test_transpose(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 8);
    const char *names[3];
    const int np = paths(names);
    static const int sizes[][2] = {{1, 1}, {3, 5}, {8, 8}, {9, 17}, {16, 16}, {33, 20}, {47, 3}};
    for (size_t a = 0; a < sizeof sizes / sizeof *sizes; a++) {
        const int rows = sizes[a][0], cols = sizes[a][1], lds = cols + 2, ldd = rows + 3;
        float *src = malloc(sizeof(float) * (size_t)rows * lds), *dst[3];
        assert_non_null(src);
        fill(src, (size_t)rows * lds, 0);
        for (int p = 0; p < np; p++) {
            /* the gaps between rows must stay as they were */
            assert_non_null(dst[p] = malloc(sizeof(float) * (size_t)cols * ldd));
            memset(dst[p], 0x5a, sizeof(float) * (size_t)cols * ldd);
            assert_int_equal(zd__nn_cpu_set(names[p]), 0);
            zd__nn_transpose(src, rows, cols, lds, dst[p], ldd);
        }
        assert_int_equal(zd__nn_cpu_set(NULL), 0);
        for (int p = 1; p < np; p++)
            assert_same_bits("transpose", names[p], dst[0], dst[p],
                             sizeof(float) * (size_t)cols * ldd);
        for (int p = 0; p < np; p++)
            free(dst[p]);
        free(src);
    }
}

static void test_im2col_col2im(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 9);
    const char *names[3];
    const int np = paths(names);
    static const nn_conv_geom_t geoms[] = {
        {.C = 1, .H = 28, .W = 28, .kh = 3, .kw = 3, .stride = 1, .padding = 0},
        {.C = 3, .H = 9, .W = 21, .kh = 3, .kw = 3, .stride = 1, .padding = 1},
        {.C = 2, .H = 7, .W = 19, .kh = 5, .kw = 2, .stride = 1, .padding = 2},
        {.C = 2, .H = 10, .W = 11, .kh = 3, .kw = 3, .stride = 2, .padding = 1},
    };
    for (size_t a = 0; a < sizeof geoms / sizeof *geoms; a++) {
        nn_conv_geom_t g = geoms[a];
        g.Ho = (g.H + 2 * g.padding - g.kh) / g.stride + 1;
        g.Wo = (g.W + 2 * g.padding - g.kw) / g.stride + 1;
        const size_t nx = (size_t)g.C * g.H * g.W;
        const size_t ncol = (size_t)g.C * g.kh * g.kw * g.Ho * g.Wo;
        float *x = malloc(sizeof(float) * nx), *col[3], *dx[3];
        assert_non_null(x);
        fill(x, nx, 0);
        for (int p = 0; p < np; p++) {
            assert_non_null(col[p] = malloc(sizeof(float) * ncol));
            assert_non_null(dx[p] = malloc(sizeof(float) * nx));
            assert_int_equal(zd__nn_cpu_set(names[p]), 0);
            zd__nn_im2col(&g, x, col[p]);
            memcpy(dx[p], x, sizeof(float) * nx);
            zd__nn_col2im(&g, col[p], dx[p]);
        }
        assert_int_equal(zd__nn_cpu_set(NULL), 0);
        for (int p = 1; p < np; p++) {
            assert_same_bits("im2col", names[p], col[0], col[p], sizeof(float) * ncol);
            assert_same_bits("col2im", names[p], dx[0], dx[p], sizeof(float) * nx);
        }
        for (int p = 0; p < np; p++) {
            free(col[p]);
            free(dx[p]);
        }
        free(x);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_im2col_col2im),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
