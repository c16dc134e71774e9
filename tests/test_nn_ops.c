/* SPDX-License-Identifier: MIT */
/*  nn ops: every single-op golden case (forward and every gradient against
    PyTorch), error reporting, dropout semantics, argmax/accuracy, the
    random generator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rng.h>
#include "tests/support/golden_cases.h"

/*  ---- golden cases (tools/golden_manifest.h, tests/support/golden_cases.h) ---- */

/*  A copy of the case's tensor (the caller's own: leaves get requires_grad
    and gradients, the case's tensors stay as loaded), or NULL when it has
    none. */
static zd_tensor_t *golden_copy(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_tensor(c, role, name);
    return t ? zd_tensor_detach_copy(t) : NULL;
}

static zd_tensor_t *golden_need(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_copy(c, role, name);
    if (!t)
        fail_msg("%s: no %s %s", c->dir, role, name);
    return t;
}

static void assert_grad(const char *what, golden_case_t *c, zd_tensor_t *leaf)
{
    zd_tensor_t *e = golden_need(c, "grad", what);
    zd_tensor_t *g = zd_tensor_grad(leaf);
    if (!g)
        fail_msg("%s: no gradient for %s", c->dir, what);
    golden_assert_close(what, c, g, e);
    zd_tensor_unref(g);
    zd_tensor_unref(e);
}

static zd_tensor_t *leaf_from(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_need(c, role, name);
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

/*  Shared shape of the single-op checks: y = op(x [, weight, bias]), then
    backward with dy; the op itself is passed as a callback. */
typedef int(op_fn)(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                   zd_tensor_t **y);

typedef struct {
    op_fn *op;
    bool has_params;
} op_kind_t;

static void run_case(golden_case_t *c, void *arg)
{
    const op_kind_t *k = arg;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *x = leaf_from(c, "input", "x");
    zd_tensor_t *w = k->has_params ? leaf_from(c, "param", "weight") : NULL;
    zd_tensor_t *b = k->has_params ? golden_copy(c, "param", "bias") : NULL;
    if (b)
        assert_int_equal(zd_tensor_set_requires_grad(b, true), 0);
    zd_tensor_t *dy = golden_need(c, "input", "dy");
    zd_tensor_t *ey = golden_need(c, "output", "y");
    zd_tensor_t *y = NULL;
    if (k->op(c, x, w, b, &y) < 0)
        fail_msg("%s: %s", c->dir, zd_error_last());
    golden_assert_close("y", c, y, ey);
    if (zd_autograd_backward(y, dy, false) < 0)
        fail_msg("%s: backward: %s", c->dir, zd_error_last());
    assert_grad("x", c, x);
    if (w)
        assert_grad("weight", c, w);
    if (b)
        assert_grad("bias", c, b);
    zd_tensor_unref(y);
    zd_tensor_unref(ey);
    zd_tensor_unref(dy);
    zd_tensor_unref(b);
    zd_tensor_unref(w);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void run_kind(const char *kind, op_fn *op, bool has_params)
{
    op_kind_t k = {op, has_params};
    if (golden_each(kind, run_case, &k) <= 0)
        fail_msg("no golden case of kind %s under %s", kind, golden_root());
}

static int op_conv(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                   zd_tensor_t **y)
{
    assert_int_equal((int)golden_attr(c, "dilation", 1), 1);
    assert_int_equal((int)golden_attr(c, "groups", 1), 1);
    return zd_nn_conv2d(x, w, b, (int)golden_attr(c, "stride", 1),
                        (int)golden_attr(c, "padding", 0), y);
}

static int op_pool(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                   zd_tensor_t **y)
{
    (void)w, (void)b;
    int k = (int)golden_attr(c, "kernel_size", 0);
    assert_int_equal((int)golden_attr(c, "padding", 0), 0);
    assert_int_equal((int)golden_attr(c, "ceil_mode", 0), 0);
    return zd_nn_max_pool2d(x, k, (int)golden_attr(c, "stride", k), y);
}

static int op_linear(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                     zd_tensor_t **y)
{
    (void)c;
    return zd_nn_linear(x, w, b, y);
}

static int op_relu(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                   zd_tensor_t **y)
{
    (void)c, (void)w, (void)b;
    return zd_nn_relu(x, y);
}

static int op_log_softmax(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                          zd_tensor_t **y)
{
    (void)w, (void)b;
    return zd_nn_log_softmax(x, (int)golden_attr(c, "dim", 1), y);
}

/*  The golden loss is stored as a 1-element 1-D tensor; ours is a scalar
    of the same element, so reshape for the comparison. Targets come as
    uint8: run with them as int64 (the usual dtype). */
static int op_nll(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b, zd_tensor_t **y)
{
    (void)w, (void)b;
    zd_tensor_t *t8 = golden_need(c, "input", "target");
    zd_tensor_t *t64 = zd_tensor_empty(ZD_INT64, zd_tensor_shape(t8), 1);
    for (int64_t i = 0; i < zd_tensor_numel(t8); i++)
        zd_tensor_data_i64(t64)[i] = ((uint8_t *)zd_tensor_raw(t8))[i];
    zd_tensor_t *loss;
    int rc = zd_nn_nll_loss(x, t64, &loss);
    assert_int_equal(rc, 0);
    assert_int_equal(zd_tensor_ndim(loss), 0);
    /* uint8 targets give the same value */
    zd_tensor_t *loss8;
    assert_int_equal(zd_nn_nll_loss(x, t8, &loss8), 0);
    assert_true(zd_tensor_data(loss8)[0] == zd_tensor_data(loss)[0]);
    zd_tensor_unref(loss8);
    rc = zd_tensor_reshape(loss, (int64_t[]){1}, 1, y);
    zd_tensor_unref(loss);
    zd_tensor_unref(t64);
    zd_tensor_unref(t8);
    return rc;
}

static void test_golden_conv2d(void **s)
{
    (void)s;
    run_kind("conv2d", op_conv, true);
}
static void test_golden_max_pool2d(void **s)
{
    (void)s;
    run_kind("max_pool2d", op_pool, false);
}
static void test_golden_linear(void **s)
{
    (void)s;
    run_kind("linear", op_linear, true);
}
static void test_golden_relu(void **s)
{
    (void)s;
    run_kind("relu", op_relu, false);
}
static void test_golden_log_softmax(void **s)
{
    (void)s;
    run_kind("log_softmax", op_log_softmax, false);
}
static void test_golden_nll_loss(void **s)
{
    (void)s;
    run_kind("nll_loss", op_nll, false);
}

/*  ---- errors ---- */

static void expect_error(int rc, zd_tensor_t *out, const char *needle)
{
    assert_int_equal(rc, -1);
    assert_null(out);
    if (!strstr(zd_error_last(), needle))
        fail_msg("error '%s' does not mention '%s'", zd_error_last(), needle);
}

static void test_errors_are_reported(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *x = zd_tensor_zeros4(2, 3, 5, 5), *w = zd_tensor_zeros4(4, 2, 3, 3);
    zd_tensor_t *w3 = zd_tensor_zeros4(4, 3, 3, 3), *b5 = zd_tensor_zeros1(5), *out = NULL;
    expect_error(zd_nn_conv2d(x, w, NULL, 1, 0, &out), out, "channels");
    expect_error(zd_nn_conv2d(x, w3, b5, 1, 0, &out), out, "bias");
    expect_error(zd_nn_conv2d(x, w3, NULL, 0, 0, &out), out, "stride");
    zd_tensor_t *big = zd_tensor_zeros4(1, 3, 7, 7);
    expect_error(zd_nn_conv2d(x, big, NULL, 1, 0, &out), out, "larger");
    zd_tensor_t *flat = zd_tensor_zeros2(2, 75);
    expect_error(zd_nn_conv2d(flat, w3, NULL, 1, 0, &out), out, "dimensions");
    expect_error(zd_nn_max_pool2d(x, 6, 0, &out), out, "larger");
    expect_error(zd_nn_max_pool2d(flat, 2, 0, &out), out, "dimensions");
    zd_tensor_t *lw = zd_tensor_zeros2(3, 74);
    expect_error(zd_nn_linear(flat, lw, NULL, &out), out, "75");
    expect_error(zd_nn_dropout(flat, 1.5f, true, NULL, &out), out, "probability");
    expect_error(zd_nn_dropout(flat, 0.5f, true, NULL, &out), out, "generator");
    expect_error(zd_nn_log_softmax(flat, 0, &out), out, "dim");
    zd_tensor_t *i8 = zd_tensor_new(ZD_UINT8, (int64_t[]){2}, 1);
    expect_error(zd_nn_relu(i8, &out), out, "float32");

    /* nll_loss names the sample and the class count on a bad target */
    zd_tensor_t *lp = zd_tensor_zeros2(3, 4);
    zd_tensor_t *t = zd_tensor_new(ZD_INT64, (int64_t[]){3}, 1);
    zd_tensor_data_i64(t)[1] = 4;
    expect_error(zd_nn_nll_loss(lp, t, &out), out, "target[1] = 4 is out of range for 4 classes");
    zd_tensor_data_i64(t)[1] = -1;
    expect_error(zd_nn_cross_entropy(lp, t, &out), out, "out of range");
    assert_int_equal(zd_nn_accuracy(lp, t), -1);
    zd_tensor_t *t2 = zd_tensor_new(ZD_INT64, (int64_t[]){2}, 1);
    expect_error(zd_nn_nll_loss(lp, t2, &out), out, "does not match");
    zd_tensor_t *tf = zd_tensor_zeros1(3);
    expect_error(zd_nn_nll_loss(lp, tf, &out), out, "int64");
    expect_error(zd_nn_flatten(tf, &out), out, "2 dimensions");

    zd_tensor_t *objs[] = {x, w, w3, b5, big, flat, lw, i8, lp, t, t2, tf};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        zd_tensor_unref(objs[i]);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- dropout ---- */

static zd_tensor_t *ramp(int ndim, const int64_t *shape)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = 1.0f + (float)(i % 97) * 0.01f;
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

static void test_dropout(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *x = ramp(2, (int64_t[]){100, 200}), *y, *y2;
    zd_rng_t rng, rng2;
    /* evaluation: the input itself */
    assert_int_equal(zd_nn_dropout(x, 0.5f, false, NULL, &y), 0);
    assert_ptr_equal(y, x);
    zd_tensor_unref(y);

    zd_rng_seed(&rng, 7);
    assert_int_equal(zd_nn_dropout(x, 0.3f, true, &rng, &y), 0);
    int64_t zeros = 0;
    for (int64_t i = 0; i < zd_tensor_numel(x); i++) {
        float v = zd_tensor_data(y)[i], xv = zd_tensor_data(x)[i];
        if (v == 0.0f)
            zeros++;
        else
            assert_float_equal(v, xv / 0.7f, 1e-6);
    }
    /* 20000 draws at p = 0.3: 6000 +- 65 (1 sigma) */
    assert_in_range(zeros, 5700, 6300);
    /* the gradient is the same mask */
    zd_tensor_t *s;
    assert_int_equal(zd_tensor_sum(y, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(x);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        assert_float_equal(zd_tensor_data(g)[i], zd_tensor_data(y)[i] == 0.0f ? 0.0f : 1.0f / 0.7f,
                           1e-6);
    /* same seed, same mask */
    zd_rng_seed(&rng2, 7);
    assert_int_equal(zd_nn_dropout(x, 0.3f, true, &rng2, &y2), 0);
    assert_memory_equal(zd_tensor_data(y), zd_tensor_data(y2), zd_tensor_nbytes(y));
    zd_tensor_unref(y2);
    /* p = 1 drops everything */
    assert_int_equal(zd_nn_dropout(x, 1.0f, true, &rng, &y2), 0);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        assert_true(zd_tensor_data(y2)[i] == 0.0f);
    zd_tensor_unref(y2);
    zd_tensor_unref(g);
    zd_tensor_unref(s);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_dropout2d_zeroes_channels(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *x = ramp(4, (int64_t[]){8, 50, 3, 5}), *y;
    zd_rng_t rng;
    zd_rng_seed(&rng, 11);
    assert_int_equal(zd_nn_dropout2d(x, 0.25f, true, &rng, &y), 0);
    int dropped = 0;
    for (int p = 0; p < 8 * 50; p++) {
        const float *yp = zd_tensor_data(y) + p * 15, *xp = zd_tensor_data(x) + p * 15;
        bool zero = yp[0] == 0.0f;
        dropped += zero;
        for (int i = 0; i < 15; i++)
            assert_float_equal(yp[i], zero ? 0.0f : xp[i] / 0.75f, 1e-6);
    }
    assert_in_range(dropped, 70, 130); /* 100 +- 8.7 */
    zd_tensor_unref(y);
    assert_int_equal(zd_nn_dropout2d(x, 0.25f, false, &rng, &y), 0);
    assert_ptr_equal(y, x);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- flatten, argmax, accuracy ---- */

static void test_flatten_is_a_view(void **state)
{
    (void)state;
    zd_tensor_t *x = zd_tensor_zeros4(3, 2, 4, 5), *f;
    assert_int_equal(zd_nn_flatten(x, &f), 0);
    assert_int_equal(zd_tensor_ndim(f), 2);
    assert_int_equal(zd_tensor_size(f, 0), 3);
    assert_int_equal(zd_tensor_size(f, 1), 40);
    assert_ptr_equal(zd_tensor_data(f), zd_tensor_data(x));
    zd_tensor_unref(f);
    zd_tensor_unref(x);
}

/*  No input features: y is the bias on every row (and 0 without one). */
static void test_linear_without_features(void **state)
{
    (void)state;
    zd_tensor_t *x = zd_tensor_zeros2(3, 0), *w = zd_tensor_zeros2(2, 0), *y;
    zd_tensor_t *b = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2}, 1, (float[]){1.5f, -2.0f});
    assert_int_equal(zd_nn_linear(x, w, b, &y), 0);
    assert_int_equal(zd_tensor_size(y, 0), 3);
    for (int r = 0; r < 3; r++) {
        assert_float_equal(zd_tensor_data(y)[2 * r], 1.5f, 0);
        assert_float_equal(zd_tensor_data(y)[2 * r + 1], -2.0f, 0);
    }
    zd_tensor_unref(y);
    assert_int_equal(zd_nn_linear(x, w, NULL, &y), 0);
    for (int i = 0; i < 6; i++)
        assert_float_equal(zd_tensor_data(y)[i], 0.0f, 0);
    zd_tensor_unref(y);
    zd_tensor_unref(b);
    zd_tensor_unref(w);
    zd_tensor_unref(x);
}

static void test_argmax_accuracy(void **state)
{
    (void)state;
    float v[] = {0.1f, 0.9f, 0.0f, /**/ 5, -1, 2, /**/ -3, -2, -1, /**/ 1, 1, 0};
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){4, 3}, 2, v), *am;
    assert_int_equal(zd_nn_argmax(x, &am), 0);
    assert_int_equal(zd_tensor_dtype(am), ZD_INT64);
    int64_t expect[] = {1, 0, 2, 0}; /* ties: the first */
    assert_memory_equal(zd_tensor_data_i64(am), expect, sizeof expect);
    zd_tensor_t *t = zd_tensor_from_data(ZD_INT64, (int64_t[]){4}, 1, (int64_t[]){1, 2, 2, 0});
    assert_int_equal(zd_nn_accuracy(x, t), 3);
    zd_tensor_unref(t);
    zd_tensor_unref(am);
    zd_tensor_unref(x);
}

/*  ---- fused convolutions: the numbers of the composition ---- */

static zd_tensor_t *rand_leaf(zd_rng_t *rng, int ndim, const int64_t *shape, float scale)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = zd_rng_normal(rng, 0.0f, scale);
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

static void assert_same_values(const char *what, zd_tensor_t *a, zd_tensor_t *b)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_true(zd_tensor_same_shape(a, b));
    for (int64_t i = 0; i < zd_tensor_numel(a); i++) {
        float x = zd_tensor_data(a)[i], y = zd_tensor_data(b)[i];
        if (!(fabsf(x - y) <= 1e-6f + 1e-5f * fabsf(y)))
            fail_msg("%s[%lld]: fused %.9g, composed %.9g", what, (long long)i, (double)x,
                     (double)y);
    }
}

/*  Runs `fused` and the composition on the same leaves, backward from the
    same upstream gradient, and compares outputs and every gradient. */
static void check_fused(int N, int C, int H, int W, int O, int k, int stride, int padding,
                        int pool_k, int pool_s)
{
    int64_t live = zd_tensor_live_count();
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)(N * 1000 + H * 10 + pool_k));
    zd_tensor_t *x = rand_leaf(&rng, 4, (int64_t[]){N, C, H, W}, 1.0f);
    zd_tensor_t *w = rand_leaf(&rng, 4, (int64_t[]){O, C, k, k}, 0.5f);
    zd_tensor_t *b = rand_leaf(&rng, 1, (int64_t[]){O}, 0.5f);
    zd_tensor_t *yf, *c, *yc, *g[2][3];
    if (pool_k)
        assert_int_equal(zd_nn_conv2d_max_pool2d(x, w, b, stride, padding, pool_k, pool_s, &yf), 0);
    else
        assert_int_equal(zd_nn_conv2d_relu(x, w, b, stride, padding, &yf), 0);
    assert_int_equal(zd_nn_conv2d(x, w, b, stride, padding, &c), 0);
    if (pool_k)
        assert_int_equal(zd_nn_max_pool2d(c, pool_k, pool_s, &yc), 0);
    else
        assert_int_equal(zd_nn_relu(c, &yc), 0);
    assert_same_values("output", yf, yc);
    zd_tensor_t *dy = rand_leaf(&rng, 4, zd_tensor_shape(yf), 1.0f);
    zd_tensor_t *ys[2] = {yf, yc}, *leaves[3] = {x, w, b};
    for (int v = 0; v < 2; v++) {
        assert_int_equal(zd_autograd_backward(ys[v], dy, false), 0);
        for (int i = 0; i < 3; i++) {
            g[v][i] = zd_tensor_grad(leaves[i]);
            zd_tensor_clear_grad(leaves[i]);
        }
    }
    assert_same_values("grad x", g[0][0], g[1][0]);
    assert_same_values("grad weight", g[0][1], g[1][1]);
    assert_same_values("grad bias", g[0][2], g[1][2]);
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 3; i++)
            zd_tensor_unref(g[v][i]);
    zd_tensor_t *objs[] = {x, w, b, yf, c, yc, dy};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        zd_tensor_unref(objs[i]);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_fused_conv_matches_composition(void **state)
{
    (void)state;
    check_fused(4, 3, 12, 12, 5, 3, 1, 0, 0, 0); /* conv + relu */
    check_fused(3, 2, 9, 7, 4, 3, 2, 1, 0, 0);
    check_fused(5, 3, 14, 14, 6, 3, 1, 0, 2, 2); /* the Net's conv2 + pool 2 */
    check_fused(4, 1, 28, 28, 3, 3, 1, 0, 3, 3); /* the ConvNet's conv1 + pool 3 */
    check_fused(2, 2, 11, 10, 3, 2, 1, 1, 3, 2); /* overlapping windows */
    check_fused(1, 2, 6, 6, 2, 1, 1, 0, 2, 0);   /* pointwise kernel */
    zd_tensor_t *x = zd_tensor_zeros4(1, 1, 4, 4), *w = zd_tensor_zeros4(1, 1, 3, 3), *out = NULL;
    expect_error(zd_nn_conv2d_max_pool2d(x, w, NULL, 1, 0, 3, 3, &out), out, "pool kernel 3");
    zd_tensor_unref(w);
    zd_tensor_unref(x);
}

/*  Ops that keep their own output for the backward pass must not keep the
    graph alive when no backward pass comes (a reference cycle). */
static void test_forward_only_frees_graph(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_rng_t rng;
    zd_rng_seed(&rng, 5);
    zd_tensor_t *x = rand_leaf(&rng, 4, (int64_t[]){2, 3, 6, 6}, 1.0f);
    zd_tensor_t *w = rand_leaf(&rng, 4, (int64_t[]){4, 3, 3, 3}, 1.0f);
    zd_tensor_t *y, *f, *l;
    assert_int_equal(zd_nn_relu(x, &y), 0);
    zd_tensor_unref(y);
    assert_int_equal(zd_nn_conv2d_relu(x, w, NULL, 1, 1, &y), 0);
    assert_int_equal(zd_nn_flatten(y, &f), 0);
    assert_int_equal(zd_nn_log_softmax(f, 1, &l), 0);
    zd_tensor_unref(l);
    zd_tensor_unref(f);
    zd_tensor_unref(y);
    zd_tensor_unref(w);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- the generator ---- */

static void test_rng(void **state)
{
    (void)state;
    zd_rng_t a, b;
    zd_rng_seed(&a, 42);
    zd_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++)
        assert_true(zd_rng_u64(&a) == zd_rng_u64(&b));
    zd_rng_seed(&b, 43);
    assert_true(zd_rng_u64(&a) != zd_rng_u64(&b));

    double sum = 0, sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = zd_rng_uniform(&a);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
        float r = zd_rng_uniform_range(&a, -2.0f, 3.0f);
        assert_true(r >= -2.0f && r < 3.0f);
    }
    assert_true(fabs(sum / n - 0.5) < 0.005);
    sum = 0;
    for (int i = 0; i < n; i++) {
        double z = zd_rng_normal(&a, 1.0f, 2.0f);
        sum += z;
        sq += z * z;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    assert_true(fabs(mean - 1.0) < 0.03);
    assert_true(fabs(var - 4.0) < 0.08);

    int64_t perm[1000];
    int seen[1000] = {0};
    zd_rng_permutation(&a, perm, 1000);
    int moved = 0;
    for (int i = 0; i < 1000; i++) {
        assert_in_range(perm[i], 0, 999);
        seen[perm[i]]++;
        moved += perm[i] != i;
    }
    for (int i = 0; i < 1000; i++)
        assert_int_equal(seen[i], 1);
    assert_true(moved > 900);
    for (int i = 0; i < 1000; i++)
        assert_true(zd_rng_below(&a, 7) < 7);
    assert_true(zd_rng_below(&a, 0) == 0);

    /* jumped copies are different streams */
    b = a;
    zd_rng_jump(&b);
    assert_true(zd_rng_u64(&a) != zd_rng_u64(&b));
}

/*  The thread count is set before the first layer runs, and only then. */
static void test_num_threads(void **state)
{
    (void)state;
    assert_int_equal(zd_nn_set_num_threads(0), -1);
    assert_int_equal(zd_nn_set_num_threads(1000), -1);
    zd_tensor_t *x = zd_tensor_zeros4(4, 1, 8, 8), *w = zd_tensor_zeros4(2, 1, 3, 3), *y = NULL;
    assert_int_equal(zd_nn_conv2d(x, w, NULL, 1, 0, &y), 0); /* the layers now run */
    int n = zd_nn_get_num_threads();
    assert_true(n >= 1);
    assert_int_equal(zd_nn_set_num_threads(n), 0); /* no change: fine */
    assert_int_equal(zd_nn_set_num_threads(n == 1 ? 2 : 1), -1);
    assert_non_null(strstr(zd_error_last(), "already run"));
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    zd_tensor_unref(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_conv2d),
        cmocka_unit_test(test_golden_max_pool2d),
        cmocka_unit_test(test_golden_linear),
        cmocka_unit_test(test_golden_relu),
        cmocka_unit_test(test_golden_log_softmax),
        cmocka_unit_test(test_golden_nll_loss),
        cmocka_unit_test(test_errors_are_reported),
        cmocka_unit_test(test_fused_conv_matches_composition),
        cmocka_unit_test(test_forward_only_frees_graph),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_dropout2d_zeroes_channels),
        cmocka_unit_test(test_flatten_is_a_view),
        cmocka_unit_test(test_linear_without_features),
        cmocka_unit_test(test_argmax_accuracy),
        cmocka_unit_test(test_rng),
        cmocka_unit_test(test_num_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
