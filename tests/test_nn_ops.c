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

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/nn.h"
#include "nn/rng.h"
#include "tests/support/golden_cases.h"

/* ---- golden cases (tools/golden_manifest.h, tests/support/golden_cases.h) ---- */

/*  A copy of the case's tensor (the caller's own: leaves get requires_grad
    and gradients, the case's tensors stay as loaded), or NULL when it has
    none. */
static tensor_t *golden_copy(golden_case_t *c, const char *role, const char *name)
{
    tensor_t *t = golden_tensor(c, role, name);
    return t ? tensor_clone(t) : NULL;
}

static tensor_t *golden_need(golden_case_t *c, const char *role, const char *name)
{
    tensor_t *t = golden_copy(c, role, name);
    if (!t)
        fail_msg("%s: no %s %s", c->dir, role, name);
    return t;
}

static void assert_grad(const char *what, golden_case_t *c, tensor_t *leaf)
{
    tensor_t *e = golden_need(c, "grad", what);
    tensor_t *g = tensor_grad(leaf);
    if (!g)
        fail_msg("%s: no gradient for %s", c->dir, what);
    golden_assert_close(what, c, g, e);
    tensor_unref(g);
    tensor_unref(e);
}

static tensor_t *leaf_from(golden_case_t *c, const char *role, const char *name)
{
    tensor_t *t = golden_need(c, role, name);
    assert_int_equal(tensor_set_requires_grad(t, true), 0);
    return t;
}

/*  Shared shape of the single-op checks: y = op(x [, weight, bias]), then
    backward with dy; the op itself is passed as a callback. */
typedef int (op_fn)(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b, tensor_t **y);

typedef struct {
    op_fn *op;
    bool has_params;
} op_kind_t;

static void run_case(golden_case_t *c, void *arg)
{
    const op_kind_t *k = arg;
    int64_t live = tensor_live_count();
    tensor_t *x = leaf_from(c, "input", "x");
    tensor_t *w = k->has_params ? leaf_from(c, "param", "weight") : NULL;
    tensor_t *b = k->has_params ? golden_copy(c, "param", "bias") : NULL;
    if (b)
        assert_int_equal(tensor_set_requires_grad(b, true), 0);
    tensor_t *dy = golden_need(c, "input", "dy");
    tensor_t *ey = golden_need(c, "output", "y");
    tensor_t *y = NULL;
    if (k->op(c, x, w, b, &y) < 0)
        fail_msg("%s: %s", c->dir, error_last());
    golden_assert_close("y", c, y, ey);
    if (autograd_backward(y, dy, false) < 0)
        fail_msg("%s: backward: %s", c->dir, error_last());
    assert_grad("x", c, x);
    if (w)
        assert_grad("weight", c, w);
    if (b)
        assert_grad("bias", c, b);
    tensor_unref(y);
    tensor_unref(ey);
    tensor_unref(dy);
    tensor_unref(b);
    tensor_unref(w);
    tensor_unref(x);
    assert_int_equal(tensor_live_count(), live);
}

static void run_kind(const char *kind, op_fn *op, bool has_params)
{
    op_kind_t k = {op, has_params};
    if (golden_each(kind, run_case, &k) <= 0)
        fail_msg("no golden case of kind %s under %s", kind, golden_root());
}

static int op_conv(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b, tensor_t **y)
{
    assert_int_equal((int)golden_attr(c, "dilation", 1), 1);
    assert_int_equal((int)golden_attr(c, "groups", 1), 1);
    return nn_conv2d(x, w, b, (int)golden_attr(c, "stride", 1), (int)golden_attr(c, "padding", 0),
                     y);
}

static int op_pool(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b, tensor_t **y)
{
    (void)w, (void)b;
    int k = (int)golden_attr(c, "kernel_size", 0);
    assert_int_equal((int)golden_attr(c, "padding", 0), 0);
    assert_int_equal((int)golden_attr(c, "ceil_mode", 0), 0);
    return nn_max_pool2d(x, k, (int)golden_attr(c, "stride", k), y);
}

static int op_linear(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b, tensor_t **y)
{
    (void)c;
    return nn_linear(x, w, b, y);
}

static int op_relu(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b, tensor_t **y)
{
    (void)c, (void)w, (void)b;
    return nn_relu(x, y);
}

static int op_log_softmax(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b,
                          tensor_t **y)
{
    (void)w, (void)b;
    return nn_log_softmax(x, (int)golden_attr(c, "dim", 1), y);
}

/*  The golden loss is stored as a 1-element 1-D tensor; ours is a scalar
    of the same element, so reshape for the comparison. Targets come as
    uint8: run with them as int64 (the usual dtype). */
static int op_nll(golden_case_t *c, tensor_t *x, tensor_t *w, tensor_t *b, tensor_t **y)
{
    (void)w, (void)b;
    tensor_t *t8 = golden_need(c, "input", "target");
    tensor_t *t64 = tensor_empty(TENSOR_I64, 1, tensor_shape(t8));
    for (int64_t i = 0; i < tensor_numel(t8); i++)
        tensor_data_i64(t64)[i] = ((uint8_t *)tensor_raw(t8))[i];
    tensor_t *loss;
    int rc = nn_nll_loss(x, t64, &loss);
    assert_int_equal(rc, 0);
    assert_int_equal(tensor_ndim(loss), 0);
    /* uint8 targets give the same value */
    tensor_t *loss8;
    assert_int_equal(nn_nll_loss(x, t8, &loss8), 0);
    assert_true(tensor_data(loss8)[0] == tensor_data(loss)[0]);
    tensor_unref(loss8);
    rc = tensor_reshape(loss, 1, (int64_t[]){1}, y);
    tensor_unref(loss);
    tensor_unref(t64);
    tensor_unref(t8);
    return rc;
}

static void test_golden_conv2d(void **s) { (void)s; run_kind("conv2d", op_conv, true); }
static void test_golden_max_pool2d(void **s) { (void)s; run_kind("max_pool2d", op_pool, false); }
static void test_golden_linear(void **s) { (void)s; run_kind("linear", op_linear, true); }
static void test_golden_relu(void **s) { (void)s; run_kind("relu", op_relu, false); }
static void test_golden_log_softmax(void **s)
{
    (void)s;
    run_kind("log_softmax", op_log_softmax, false);
}
static void test_golden_nll_loss(void **s) { (void)s; run_kind("nll_loss", op_nll, false); }

/* ---- errors ---- */

static void expect_error(int rc, tensor_t *out, const char *needle)
{
    assert_int_equal(rc, -1);
    assert_null(out);
    if (!strstr(error_last(), needle))
        fail_msg("error '%s' does not mention '%s'", error_last(), needle);
}

static void test_errors_are_reported(void **state)
{
    (void)state;
    int64_t live = tensor_live_count();
    tensor_t *x = tensor_zeros4(2, 3, 5, 5), *w = tensor_zeros4(4, 2, 3, 3);
    tensor_t *w3 = tensor_zeros4(4, 3, 3, 3), *b5 = tensor_zeros1(5), *out = NULL;
    expect_error(nn_conv2d(x, w, NULL, 1, 0, &out), out, "channels");
    expect_error(nn_conv2d(x, w3, b5, 1, 0, &out), out, "bias");
    expect_error(nn_conv2d(x, w3, NULL, 0, 0, &out), out, "stride");
    tensor_t *big = tensor_zeros4(1, 3, 7, 7);
    expect_error(nn_conv2d(x, big, NULL, 1, 0, &out), out, "larger");
    tensor_t *flat = tensor_zeros2(2, 75);
    expect_error(nn_conv2d(flat, w3, NULL, 1, 0, &out), out, "dimensions");
    expect_error(nn_max_pool2d(x, 6, 0, &out), out, "larger");
    expect_error(nn_max_pool2d(flat, 2, 0, &out), out, "dimensions");
    tensor_t *lw = tensor_zeros2(3, 74);
    expect_error(nn_linear(flat, lw, NULL, &out), out, "75");
    expect_error(nn_dropout(flat, 1.5f, true, NULL, &out), out, "probability");
    expect_error(nn_dropout(flat, 0.5f, true, NULL, &out), out, "generator");
    expect_error(nn_log_softmax(flat, 0, &out), out, "dim");
    tensor_t *i8 = tensor_new(TENSOR_U8, 1, (int64_t[]){2});
    expect_error(nn_relu(i8, &out), out, "float32");

    /* nll_loss names the sample and the class count on a bad target */
    tensor_t *lp = tensor_zeros2(3, 4);
    tensor_t *t = tensor_new(TENSOR_I64, 1, (int64_t[]){3});
    tensor_data_i64(t)[1] = 4;
    expect_error(nn_nll_loss(lp, t, &out), out, "target[1] = 4 is out of range for 4 classes");
    tensor_data_i64(t)[1] = -1;
    expect_error(nn_cross_entropy(lp, t, &out), out, "out of range");
    assert_int_equal(nn_accuracy(lp, t), -1);
    tensor_t *t2 = tensor_new(TENSOR_I64, 1, (int64_t[]){2});
    expect_error(nn_nll_loss(lp, t2, &out), out, "does not match");
    tensor_t *tf = tensor_zeros1(3);
    expect_error(nn_nll_loss(lp, tf, &out), out, "int64");
    expect_error(nn_flatten(tf, &out), out, "2 dimensions");

    tensor_t *objs[] = {x, w, w3, b5, big, flat, lw, i8, lp, t, t2, tf};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        tensor_unref(objs[i]);
    assert_int_equal(tensor_live_count(), live);
}

/* ---- dropout ---- */

static tensor_t *ramp(int ndim, const int64_t *shape)
{
    tensor_t *t = tensor_empty(TENSOR_F32, ndim, shape);
    for (int64_t i = 0; i < tensor_numel(t); i++)
        tensor_data(t)[i] = 1.0f + (float)(i % 97) * 0.01f;
    assert_int_equal(tensor_set_requires_grad(t, true), 0);
    return t;
}

static void test_dropout(void **state)
{
    (void)state;
    int64_t live = tensor_live_count();
    tensor_t *x = ramp(2, (int64_t[]){100, 200}), *y, *y2;
    nn_rng_t rng, rng2;
    /* evaluation: the input itself */
    assert_int_equal(nn_dropout(x, 0.5f, false, NULL, &y), 0);
    assert_ptr_equal(y, x);
    tensor_unref(y);

    nn_rng_seed(&rng, 7);
    assert_int_equal(nn_dropout(x, 0.3f, true, &rng, &y), 0);
    int64_t zeros = 0;
    for (int64_t i = 0; i < tensor_numel(x); i++) {
        float v = tensor_data(y)[i], xv = tensor_data(x)[i];
        if (v == 0.0f)
            zeros++;
        else
            assert_float_equal(v, xv / 0.7f, 1e-6);
    }
    /* 20000 draws at p = 0.3: 6000 +- 65 (1 sigma) */
    assert_in_range(zeros, 5700, 6300);
    /* the gradient is the same mask */
    tensor_t *s;
    assert_int_equal(tensor_sum(y, &s), 0);
    assert_int_equal(autograd_backward(s, NULL, false), 0);
    tensor_t *g = tensor_grad(x);
    for (int64_t i = 0; i < tensor_numel(x); i++)
        assert_float_equal(tensor_data(g)[i], tensor_data(y)[i] == 0.0f ? 0.0f : 1.0f / 0.7f,
                           1e-6);
    /* same seed, same mask */
    nn_rng_seed(&rng2, 7);
    assert_int_equal(nn_dropout(x, 0.3f, true, &rng2, &y2), 0);
    assert_memory_equal(tensor_data(y), tensor_data(y2), tensor_nbytes(y));
    tensor_unref(y2);
    /* p = 1 drops everything */
    assert_int_equal(nn_dropout(x, 1.0f, true, &rng, &y2), 0);
    for (int64_t i = 0; i < tensor_numel(x); i++)
        assert_true(tensor_data(y2)[i] == 0.0f);
    tensor_unref(y2);
    tensor_unref(g);
    tensor_unref(s);
    tensor_unref(y);
    tensor_unref(x);
    assert_int_equal(tensor_live_count(), live);
}

static void test_dropout2d_zeroes_channels(void **state)
{
    (void)state;
    int64_t live = tensor_live_count();
    tensor_t *x = ramp(4, (int64_t[]){8, 50, 3, 5}), *y;
    nn_rng_t rng;
    nn_rng_seed(&rng, 11);
    assert_int_equal(nn_dropout2d(x, 0.25f, true, &rng, &y), 0);
    int dropped = 0;
    for (int p = 0; p < 8 * 50; p++) {
        const float *yp = tensor_data(y) + p * 15, *xp = tensor_data(x) + p * 15;
        bool zero = yp[0] == 0.0f;
        dropped += zero;
        for (int i = 0; i < 15; i++)
            assert_float_equal(yp[i], zero ? 0.0f : xp[i] / 0.75f, 1e-6);
    }
    assert_in_range(dropped, 70, 130);    /* 100 +- 8.7 */
    tensor_unref(y);
    assert_int_equal(nn_dropout2d(x, 0.25f, false, &rng, &y), 0);
    assert_ptr_equal(y, x);
    tensor_unref(y);
    tensor_unref(x);
    assert_int_equal(tensor_live_count(), live);
}

/* ---- flatten, argmax, accuracy ---- */

static void test_flatten_is_a_view(void **state)
{
    (void)state;
    tensor_t *x = tensor_zeros4(3, 2, 4, 5), *f;
    assert_int_equal(nn_flatten(x, &f), 0);
    assert_int_equal(tensor_ndim(f), 2);
    assert_int_equal(tensor_size(f, 0), 3);
    assert_int_equal(tensor_size(f, 1), 40);
    assert_ptr_equal(tensor_data(f), tensor_data(x));
    tensor_unref(f);
    tensor_unref(x);
}

/*  No input features: y is the bias on every row (and 0 without one). */
static void test_linear_without_features(void **state)
{
    (void)state;
    tensor_t *x = tensor_zeros2(3, 0), *w = tensor_zeros2(2, 0), *y;
    tensor_t *b = tensor_from_data(TENSOR_F32, 1, (int64_t[]){2}, (float[]){1.5f, -2.0f});
    assert_int_equal(nn_linear(x, w, b, &y), 0);
    assert_int_equal(tensor_size(y, 0), 3);
    for (int r = 0; r < 3; r++) {
        assert_float_equal(tensor_data(y)[2 * r], 1.5f, 0);
        assert_float_equal(tensor_data(y)[2 * r + 1], -2.0f, 0);
    }
    tensor_unref(y);
    assert_int_equal(nn_linear(x, w, NULL, &y), 0);
    for (int i = 0; i < 6; i++)
        assert_float_equal(tensor_data(y)[i], 0.0f, 0);
    tensor_unref(y);
    tensor_unref(b);
    tensor_unref(w);
    tensor_unref(x);
}

static void test_argmax_accuracy(void **state)
{
    (void)state;
    float v[] = {0.1f, 0.9f, 0.0f, /**/ 5, -1, 2, /**/ -3, -2, -1, /**/ 1, 1, 0};
    tensor_t *x = tensor_from_data(TENSOR_F32, 2, (int64_t[]){4, 3}, v), *am;
    assert_int_equal(nn_argmax(x, &am), 0);
    assert_int_equal(tensor_dtype(am), TENSOR_I64);
    int64_t expect[] = {1, 0, 2, 0};   /* ties: the first */
    assert_memory_equal(tensor_data_i64(am), expect, sizeof expect);
    tensor_t *t = tensor_from_data(TENSOR_I64, 1, (int64_t[]){4}, (int64_t[]){1, 2, 2, 0});
    assert_int_equal(nn_accuracy(x, t), 3);
    tensor_unref(t);
    tensor_unref(am);
    tensor_unref(x);
}

/* ---- fused convolutions: the numbers of the composition ---- */

static tensor_t *rand_leaf(nn_rng_t *rng, int ndim, const int64_t *shape, float scale)
{
    tensor_t *t = tensor_empty(TENSOR_F32, ndim, shape);
    for (int64_t i = 0; i < tensor_numel(t); i++)
        tensor_data(t)[i] = nn_rng_normal(rng, 0.0f, scale);
    assert_int_equal(tensor_set_requires_grad(t, true), 0);
    return t;
}

static void assert_same_values(const char *what, tensor_t *a, tensor_t *b)
{
    assert_non_null(a);
    assert_non_null(b);
    assert_true(tensor_same_shape(a, b));
    for (int64_t i = 0; i < tensor_numel(a); i++) {
        float x = tensor_data(a)[i], y = tensor_data(b)[i];
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
    int64_t live = tensor_live_count();
    nn_rng_t rng;
    nn_rng_seed(&rng, (uint64_t)(N * 1000 + H * 10 + pool_k));
    tensor_t *x = rand_leaf(&rng, 4, (int64_t[]){N, C, H, W}, 1.0f);
    tensor_t *w = rand_leaf(&rng, 4, (int64_t[]){O, C, k, k}, 0.5f);
    tensor_t *b = rand_leaf(&rng, 1, (int64_t[]){O}, 0.5f);
    tensor_t *yf, *c, *yc, *g[2][3];
    if (pool_k)
        assert_int_equal(nn_conv2d_max_pool2d(x, w, b, stride, padding, pool_k, pool_s, &yf), 0);
    else
        assert_int_equal(nn_conv2d_relu(x, w, b, stride, padding, &yf), 0);
    assert_int_equal(nn_conv2d(x, w, b, stride, padding, &c), 0);
    if (pool_k)
        assert_int_equal(nn_max_pool2d(c, pool_k, pool_s, &yc), 0);
    else
        assert_int_equal(nn_relu(c, &yc), 0);
    assert_same_values("output", yf, yc);
    tensor_t *dy = rand_leaf(&rng, 4, tensor_shape(yf), 1.0f);
    tensor_t *ys[2] = {yf, yc}, *leaves[3] = {x, w, b};
    for (int v = 0; v < 2; v++) {
        assert_int_equal(autograd_backward(ys[v], dy, false), 0);
        for (int i = 0; i < 3; i++) {
            g[v][i] = tensor_grad(leaves[i]);
            tensor_clear_grad(leaves[i]);
        }
    }
    assert_same_values("grad x", g[0][0], g[1][0]);
    assert_same_values("grad weight", g[0][1], g[1][1]);
    assert_same_values("grad bias", g[0][2], g[1][2]);
    for (int v = 0; v < 2; v++)
        for (int i = 0; i < 3; i++)
            tensor_unref(g[v][i]);
    tensor_t *objs[] = {x, w, b, yf, c, yc, dy};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        tensor_unref(objs[i]);
    assert_int_equal(tensor_live_count(), live);
}

static void test_fused_conv_matches_composition(void **state)
{
    (void)state;
    check_fused(4, 3, 12, 12, 5, 3, 1, 0, 0, 0);      /* conv + relu */
    check_fused(3, 2, 9, 7, 4, 3, 2, 1, 0, 0);
    check_fused(5, 3, 14, 14, 6, 3, 1, 0, 2, 2);      /* the Net's conv2 + pool 2 */
    check_fused(4, 1, 28, 28, 3, 3, 1, 0, 3, 3);      /* the ConvNet's conv1 + pool 3 */
    check_fused(2, 2, 11, 10, 3, 2, 1, 1, 3, 2);      /* overlapping windows */
    check_fused(1, 2, 6, 6, 2, 1, 1, 0, 2, 0);        /* pointwise kernel */
    tensor_t *x = tensor_zeros4(1, 1, 4, 4), *w = tensor_zeros4(1, 1, 3, 3), *out = NULL;
    expect_error(nn_conv2d_max_pool2d(x, w, NULL, 1, 0, 3, 3, &out), out, "pool kernel 3");
    tensor_unref(w);
    tensor_unref(x);
}

/*  Ops that keep their own output for the backward pass must not keep the
    graph alive when no backward pass comes (a reference cycle). */
static void test_forward_only_frees_graph(void **state)
{
    (void)state;
    int64_t live = tensor_live_count();
    nn_rng_t rng;
    nn_rng_seed(&rng, 5);
    tensor_t *x = rand_leaf(&rng, 4, (int64_t[]){2, 3, 6, 6}, 1.0f);
    tensor_t *w = rand_leaf(&rng, 4, (int64_t[]){4, 3, 3, 3}, 1.0f);
    tensor_t *y, *f, *l;
    assert_int_equal(nn_relu(x, &y), 0);
    tensor_unref(y);
    assert_int_equal(nn_conv2d_relu(x, w, NULL, 1, 1, &y), 0);
    assert_int_equal(nn_flatten(y, &f), 0);
    assert_int_equal(nn_log_softmax(f, 1, &l), 0);
    tensor_unref(l);
    tensor_unref(f);
    tensor_unref(y);
    tensor_unref(w);
    tensor_unref(x);
    assert_int_equal(tensor_live_count(), live);
}

/* ---- the generator ---- */

static void test_rng(void **state)
{
    (void)state;
    nn_rng_t a, b;
    nn_rng_seed(&a, 42);
    nn_rng_seed(&b, 42);
    for (int i = 0; i < 100; i++)
        assert_true(nn_rng_u64(&a) == nn_rng_u64(&b));
    nn_rng_seed(&b, 43);
    assert_true(nn_rng_u64(&a) != nn_rng_u64(&b));

    double sum = 0, sq = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float u = nn_rng_uniform(&a);
        assert_true(u >= 0.0f && u < 1.0f);
        sum += u;
        float r = nn_rng_uniform_range(&a, -2.0f, 3.0f);
        assert_true(r >= -2.0f && r < 3.0f);
    }
    assert_true(fabs(sum / n - 0.5) < 0.005);
    sum = 0;
    for (int i = 0; i < n; i++) {
        double z = nn_rng_normal(&a, 1.0f, 2.0f);
        sum += z;
        sq += z * z;
    }
    double mean = sum / n, var = sq / n - mean * mean;
    assert_true(fabs(mean - 1.0) < 0.03);
    assert_true(fabs(var - 4.0) < 0.08);

    int64_t perm[1000];
    int seen[1000] = {0};
    nn_rng_permutation(&a, perm, 1000);
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
        assert_true(nn_rng_below(&a, 7) < 7);
    assert_true(nn_rng_below(&a, 0) == 0);

    /* jumped copies are different streams */
    b = a;
    nn_rng_jump(&b);
    assert_true(nn_rng_u64(&a) != nn_rng_u64(&b));
}

/*  The thread count is set before the first layer runs, and only then. */
static void test_num_threads(void **state)
{
    (void)state;
    assert_int_equal(nn_set_num_threads(0), -1);
    assert_int_equal(nn_set_num_threads(1000), -1);
    tensor_t *x = tensor_zeros4(4, 1, 8, 8), *w = tensor_zeros4(2, 1, 3, 3), *y = NULL;
    assert_int_equal(nn_conv2d(x, w, NULL, 1, 0, &y), 0);   /* the layers now run */
    int n = nn_get_num_threads();
    assert_true(n >= 1);
    assert_int_equal(nn_set_num_threads(n), 0);              /* no change: fine */
    assert_int_equal(nn_set_num_threads(n == 1 ? 2 : 1), -1);
    assert_non_null(strstr(error_last(), "already run"));
    tensor_unref(y);
    tensor_unref(x);
    tensor_unref(w);
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
