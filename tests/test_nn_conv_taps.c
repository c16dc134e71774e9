/* SPDX-License-Identifier: MIT */
/*  The taps kernels (nn/conv_direct.c, nn/conv_taps.c): the shifted-plane
    GEMMs against plain double-precision loops, on odd sizes that exercise
    every block edge and tail mask; then the three convolution ops on odd
    shapes (Winograd's forward pass among them), and large linear layers,
    output and every gradient, against the im2col / BLAS path
    (zd__nn_use_taps(false)), and against the portable kernels
    (zd__nn_cpu_set("generic")). Without AVX-512 (or with ZDIST_CPU=generic)
    every side takes the same path and the op comparisons are trivially
    exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"
#include <zdist/rng.h>

#define SENTINEL 12345.0f

static zd_rng_t rng;

static float *rand_floats(size_t n)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    return p;
}

static void assert_close(const char *what, int i, double got, double want)
{
    if (!(fabs(got - want) <= 1e-4 + 1e-4 * fabs(want)))
        fail_msg("%s[%d]: got %.9g, want %.9g", what, i, got, want);
}

/*  Random taps into a source of n floats, each leaving room for L reads. */
static int32_t *rand_taps(int K, int n, int L)
{
    int32_t *offs = malloc(sizeof(int32_t) * (size_t)K);
    assert_non_null(offs);
    for (int k = 0; k < K; k++)
        offs[k] = (int32_t)zd_rng_below(&rng, (uint64_t)(n - L + 1));
    return offs;
}

static void check_taps_gemm(int M, int K, int L, bool with_bias)
{
    const int n_src = L + 40, ldc = L + 5;
    float *a = rand_floats((size_t)M * K), *src = rand_floats((size_t)n_src);
    float *bias = with_bias ? rand_floats((size_t)M) : NULL;
    int32_t *offs = rand_taps(K, n_src, L);
    float *packed = malloc(sizeof(float) * zd__nn_taps_packed_floats(M, K));
    float *c = malloc(sizeof(float) * (size_t)M * ldc);
    assert_non_null(packed);
    assert_non_null(c);
    for (int i = 0; i < M * ldc; i++)
        c[i] = SENTINEL;
    zd__nn_taps_pack(a, M, K, K, NULL, packed);
    zd__nn_taps_gemm(packed, M, K, offs, src, L, bias, c, ldc);
    for (int m = 0; m < M; m++) {
        for (int q = 0; q < L; q++) {
            double want = bias ? bias[m] : 0.0;
            for (int k = 0; k < K; k++)
                want += (double)a[m * K + k] * src[offs[k] + q];
            assert_close("taps_gemm", m * ldc + q, c[m * ldc + q], want);
        }
        for (int q = L; q < ldc; q++) /* nothing written past L */
            assert_true(c[m * ldc + q] == SENTINEL);
    }
    free(a);
    free(src);
    free(bias);
    free(offs);
    free(packed);
    free(c);
}

static void test_taps_gemm(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 1);
    const int Ms[] = {1, 5, 8, 13, 17};
    const int Ks[] = {1, 3, 9, 10};
    const int Ls[] = {1, 15, 16, 17, 47, 48, 49, 100};
    for (size_t i = 0; i < sizeof Ms / sizeof *Ms; i++)
        for (size_t j = 0; j < sizeof Ks / sizeof *Ks; j++)
            for (size_t l = 0; l < sizeof Ls / sizeof *Ls; l++)
                check_taps_gemm(Ms[i], Ks[j], Ls[l], (i + j + l) % 2 == 0);
}

/*  Packing through column offsets, element (m, k) = a[m*stride + koff[k]],
    is packing the gathered matrix. */
static void test_taps_pack_gather(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 2);
    const int M = 11, K = 6, stride = 7;
    const int32_t koff[6] = {6, 0, 3, 3, 1, 5};
    float *a = rand_floats((size_t)M * stride), gathered[11 * 6];
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            gathered[m * K + k] = a[m * stride + koff[k]];
    size_t n = zd__nn_taps_packed_floats(M, K);
    assert_int_equal(n, 16 * K);
    float *p1 = malloc(sizeof(float) * n), *p2 = malloc(sizeof(float) * n);
    assert_non_null(p1);
    assert_non_null(p2);
    zd__nn_taps_pack(a, M, K, stride, koff, p1);
    zd__nn_taps_pack(gathered, M, K, K, NULL, p2);
    for (size_t i = 0; i < n; i++)
        assert_true(p1[i] == p2[i]);
    free(a);
    free(p1);
    free(p2);
}

/*  Positions: nrun runs of `run`, `stride` apart (L = their span). */
static void check_taps_gemm_bt(int K, int N, int nrun, int run, int stride)
{
    const int L = (nrun - 1) * stride + run;
    const int n_src = L + 30, ldb = N + 1, ldc = N + 3;
    float *src = rand_floats((size_t)n_src), *b = rand_floats((size_t)L * ldb);
    float *c = rand_floats((size_t)K * ldc), *c0 = malloc(sizeof(float) * K * ldc);
    int32_t *offs = rand_taps(K, n_src, L);
    assert_non_null(c0);
    for (int i = 0; i < K * ldc; i++)
        c0[i] = c[i];
    zd__nn_taps_gemm_bt(offs, K, src, b, ldb, N, nrun, run, stride, c, ldc);
    for (int k = 0; k < K; k++) {
        for (int n = 0; n < N; n++) {
            double want = c0[k * ldc + n];
            for (int r = 0; r < nrun; r++)
                for (int q = r * stride; q < r * stride + run; q++)
                    want += (double)src[offs[k] + q] * b[q * ldb + n];
            assert_close("taps_gemm_bt", k * ldc + n, c[k * ldc + n], want);
        }
        for (int n = N; n < ldc; n++) /* columns past N untouched */
            assert_true(c[k * ldc + n] == c0[k * ldc + n]);
    }
    free(src);
    free(b);
    free(c);
    free(c0);
    free(offs);
}

static void test_taps_gemm_bt(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 3);
    const int Ks[] = {1, 5, 6, 7, 12, 13, 25};
    const int Ns[] = {1, 5, 16, 17, 32, 33, 64, 70, 130};
    /* runs: one plain run; rows of a plane (more than one pass of 128) */
    const int runs[][3] = {{1, 1, 1}, {1, 7, 7}, {1, 40, 40}, {9, 5, 7}, {30, 24, 26}};
    for (size_t i = 0; i < sizeof Ks / sizeof *Ks; i++)
        for (size_t j = 0; j < sizeof Ns / sizeof *Ns; j++)
            for (size_t l = 0; l < sizeof runs / sizeof *runs; l++)
                check_taps_gemm_bt(Ks[i], Ns[j], runs[l][0], runs[l][1], runs[l][2]);
}

/*  ---- the ops, taps path against im2col path ---- */

typedef enum { PLAIN, RELU, POOL } kind_t;

static zd_tensor_t *rand_leaf(int ndim, const int64_t *shape)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

/*  The op of `kind`; POOL pools by pool_k (stride pool_s) after it. */
static zd_tensor_t *run_op(kind_t kind, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b, int padding,
                           int pool_k, int pool_s)
{
    zd_tensor_t *y = NULL;
    int rc = kind == PLAIN ? zd_nn_conv2d(x, w, b, 1, padding, &y)
        : kind == RELU     ? zd_nn_conv2d_relu(x, w, b, 1, padding, &y)
                           : zd_nn_conv2d_max_pool2d(x, w, b, 1, padding, pool_k, pool_s, &y);
    if (rc < 0)
        fail_msg("conv: %s", zd_error_last());
    return y;
}

static void assert_same(const char *what, zd_tensor_t *got, zd_tensor_t *want)
{
    assert_non_null(got);
    assert_non_null(want);
    assert_true(zd_tensor_same_shape(got, want));
    for (int64_t i = 0; i < zd_tensor_numel(got); i++)
        assert_close(what, (int)i, zd_tensor_data(got)[i], zd_tensor_data(want)[i]);
}

typedef struct {
    kind_t kind;
    int N, C, H, W, O, kh, kw, pad;
    bool bias;
    int pool_k, pool_s; /* POOL: window and stride (0, 0: 2 and 2) */
    unsigned grads;     /* which of x, weight, bias need gradients (bits 0-2; 0: all) */
} conv_case_t;

/*  Backward from y with dy (made random, in y's shape, on the first call)
    and takes the leaves' gradients into g (NULL leaves are skipped). */
static void backward_take(zd_tensor_t *y, zd_tensor_t **dy, zd_tensor_t *const leaves[3],
                          zd_tensor_t *g[3])
{
    if (!*dy) {
        *dy = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(y), zd_tensor_ndim(y));
        for (int64_t i = 0; i < zd_tensor_numel(*dy); i++)
            zd_tensor_data(*dy)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    }
    assert_int_equal(zd_autograd_backward(y, *dy, false), 0);
    for (int i = 0; i < 3; i++)
        if (leaves[i]) {
            g[i] = zd_tensor_grad(leaves[i]);
            zd_tensor_clear_grad(leaves[i]);
        }
}

/*  The paths compared: 0 the taps path, 1 im2col / BLAS, 2 the portable
    kernels (im2col / BLAS too). */
#define PATHS 3

static void take_path(int v)
{
    zd__nn_use_taps(v == 0);
    assert_int_equal(zd__nn_cpu_set(v == 2 ? "generic" : NULL), 0);
}

static void restore_paths(void)
{
    zd__nn_use_taps(true);
    assert_int_equal(zd__nn_cpu_set(NULL), 0);
}

/*  Drops every path's results and the inputs; nothing may be left of them. */
static void release_all(zd_tensor_t *y[PATHS], zd_tensor_t *g[PATHS][3], zd_tensor_t *dy,
                        zd_tensor_t *const leaves[3], int64_t live)
{
    for (int v = 0; v < PATHS; v++) {
        zd_tensor_unref(y[v]);
        for (int i = 0; i < 3; i++)
            zd_tensor_unref(g[v][i]);
    }
    zd_tensor_unref(dy);
    for (int i = 0; i < 3; i++)
        zd_tensor_unref(leaves[i]);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void check_op(conv_case_t cc)
{
    int64_t live = zd_tensor_live_count();
    unsigned grads = cc.grads ? cc.grads : 7u;
    zd_tensor_t *x = rand_leaf(4, (int64_t[]){cc.N, cc.C, cc.H, cc.W});
    zd_tensor_t *w = rand_leaf(4, (int64_t[]){cc.O, cc.C, cc.kh, cc.kw});
    zd_tensor_t *b = cc.bias ? rand_leaf(1, (int64_t[]){cc.O}) : NULL;
    zd_tensor_t *leaves[3] = {x, w, b}, *y[PATHS], *g[PATHS][3] = {{0}};
    zd_tensor_t *dy = NULL;
    for (int i = 0; i < 3; i++)
        if (leaves[i])
            assert_int_equal(zd_tensor_set_requires_grad(leaves[i], (grads >> i) & 1), 0);
    for (int v = 0; v < PATHS; v++) {
        take_path(v);
        y[v] = run_op(cc.kind, x, w, b, cc.pad, cc.pool_k ? cc.pool_k : 2, cc.pool_s);
        backward_take(y[v], &dy, leaves, g[v]);
    }
    restore_paths();
    const char *names[3] = {"grad x", "grad weight", "grad bias"};
    for (int v = 1; v < PATHS; v++) {
        assert_same("y", y[0], y[v]);
        for (int i = 0; i < 3; i++) {
            if (!leaves[i])
                continue;
            if ((grads >> i) & 1)
                assert_same(names[i], g[0][i], g[v][i]);
            else
                assert_true(!g[0][i] && !g[v][i]);
        }
    }
    release_all(y, g, dy, leaves, live);
}

static void test_ops_match_im2col(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 4);
    static const conv_case_t cases[] = {
        /* kind, N, C, H, W, O, kh, kw, pad, bias, pool k, pool s, grads */
        {PLAIN, 3, 2, 7, 9, 5, 3, 3, 0, true, 0, 0, 0},
        {PLAIN, 2, 3, 11, 6, 9, 2, 3, 1, false, 0, 0, 0},
        {PLAIN, 1, 1, 5, 5, 1, 1, 1, 0, true, 0, 0, 0},   /* pointwise, one channel */
        {PLAIN, 2, 4, 9, 13, 17, 5, 5, 2, true, 0, 0, 0}, /* padding 2, 17 outputs */
        {PLAIN, 5, 1, 28, 28, 3, 3, 3, 0, true, 0, 0, 0}, /* the ConvNet's conv1 */
        {PLAIN, 1, 7, 3, 40, 10, 3, 1, 0, true, 0, 0, 0}, /* one output row */
        {PLAIN, 2, 3, 8, 8, 20, 3, 3, 1, true, 0, 0, 2},  /* weight gradient only */
        {RELU, 3, 1, 28, 28, 32, 3, 3, 0, true, 0, 0, 6}, /* the Net's conv1, x no grad */
        {RELU, 2, 5, 10, 12, 11, 3, 2, 1, true, 0, 0, 0},
        {RELU, 2, 3, 9, 9, 4, 3, 3, 0, true, 0, 0, 4},     /* bias gradient only */
        {POOL, 2, 32, 26, 26, 64, 3, 3, 0, true, 0, 0, 0}, /* the Net's conv2 */
        {POOL, 3, 3, 11, 9, 7, 3, 3, 1, false, 0, 0, 0},   /* odd planes: a row dropped */
        {POOL, 1, 2, 6, 30, 9, 2, 2, 0, true, 0, 0, 0},
        {POOL, 4, 1, 28, 28, 3, 3, 3, 0, true, 3, 3, 6},  /* the ConvNet's conv1 + pool 3 */
        {POOL, 2, 2, 13, 12, 5, 3, 3, 1, true, 3, 2, 0},  /* overlapping windows */
        {POOL, 1, 2, 5, 44, 6, 3, 3, 0, true, 2, 2, 0},   /* 21 windows a row */
        {POOL, 2, 3, 9, 9, 18, 3, 3, 0, false, 2, 2, 1},  /* input gradient only */
        {POOL, 2, 8, 10, 10, 70, 3, 3, 1, true, 0, 0, 0}, /* two blocks of output channels */
        {POOL, 1, 4, 9, 9, 130, 3, 3, 0, false, 3, 2, 0}, /* three, overlapping windows */
        /* rows of 85 x 16 floats: the weight gradient sums 2 rows of windows
           at a time, then the fifth alone */
        {POOL, 2, 16, 13, 85, 6, 3, 3, 0, true, 2, 2, 0},
        /* shapes Winograd's forward pass takes (3x3, C >= 16, O >= 32) */
        {PLAIN, 2, 16, 10, 9, 32, 3, 3, 1, true, 0, 0, 0},
        {RELU, 2, 20, 12, 12, 40, 3, 3, 0, true, 0, 0, 0},
        {POOL, 1, 17, 11, 13, 33, 3, 3, 1, true, 2, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        check_op(cases[i]);
}

/*  Linear layers large enough for the taps path (rows * in * out >= 2^20)
    against BLAS, on odd sizes. */
static void check_linear(int rows, int in_f, int out_f)
{
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *x = rand_leaf(2, (int64_t[]){rows, in_f});
    zd_tensor_t *w = rand_leaf(2, (int64_t[]){out_f, in_f});
    /* weights of PyTorch's scale (1/sqrt(in)), so that outputs are O(1) */
    for (int64_t i = 0; i < zd_tensor_numel(w); i++)
        zd_tensor_data(w)[i] /= sqrtf((float)in_f);
    zd_tensor_t *b = rand_leaf(1, (int64_t[]){out_f});
    zd_tensor_t *leaves[3] = {x, w, b}, *y[PATHS], *g[PATHS][3], *dy = NULL;
    for (int v = 0; v < PATHS; v++) {
        take_path(v);
        assert_int_equal(zd_nn_linear(x, w, b, &y[v]), 0);
        backward_take(y[v], &dy, leaves, g[v]);
    }
    restore_paths();
    for (int v = 1; v < PATHS; v++) {
        assert_same("linear y", y[0], y[v]);
        assert_same("linear grad x", g[0][0], g[v][0]);
        assert_same("linear grad weight", g[0][1], g[v][1]);
        assert_same("linear grad bias", g[0][2], g[v][2]);
    }
    release_all(y, g, dy, leaves, live);
}

static void test_linear_matches_blas(void **state)
{
    (void)state;
    zd_rng_seed(&rng, 5);
    check_linear(3, 4099, 129);
    check_linear(33, 2000, 17);
    check_linear(1, 1100, 1000);
    check_linear(4, 9216, 128); /* the Net's fc1, small batch */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_taps_gemm),           cmocka_unit_test(test_taps_pack_gather),
        cmocka_unit_test(test_taps_gemm_bt),        cmocka_unit_test(test_ops_match_im2col),
        cmocka_unit_test(test_linear_matches_blas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
