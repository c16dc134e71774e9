/* SPDX-License-Identifier: MIT */
/*  Finite-difference gradient checks of softmax, gelu, layer_norm,
    mse_loss and embedding (padding row, repeated indices, uint8 and int64
    indices of several dimensions), their errors, and init_normal.

    The check is tests/support/gradcheck.h's, every element of every
    input probed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rng.h>

#include "tests/support/gradcheck.h"

typedef struct check check_t;
typedef int(fn_t)(check_t *c, zd_tensor_t **out);

struct check {
    const char *name;
    fn_t *fn;
    int n_in;
    zd_tensor_t *in[3];   /* float inputs; those requiring grad are checked */
    zd_tensor_t *indices; /* embedding */
    int dim;              /* softmax dim, layer_norm's norm_ndim */
    int64_t padding_idx;  /* embedding: its row's gradient must be 0 */
};

static int run(void *arg, zd_tensor_t **outs)
{
    check_t *c = arg;
    return c->fn(c, &outs[0]) < 0 ? -1 : 1;
}

/*  Every element of every input probed. With a padding row (embedding's
    input 0, the weight), the row's elements must have an analytic
    gradient of exactly 0, although the output does depend on them
    (PyTorch's padding_idx). */
static void check(check_t *c)
{
    const bool padding = c->indices && c->padding_idx >= 0;
    gradcheck(&(gradcheck_t){.name = c->name,
                             .fn = run,
                             .arg = c,
                             .inputs = c->in,
                             .n_inputs = c->n_in,
                             .zero_row_of = padding ? c->in[0] : NULL,
                             .zero_row = c->padding_idx});
}

static void release(check_t *c)
{
    for (int i = 0; i < c->n_in; i++)
        zd_tensor_unref(c->in[i]);
    zd_tensor_unref(c->indices);
}

/*  ---- softmax, gelu ---- */

static int fn_softmax(check_t *c, zd_tensor_t **out)
{
    return zd_nn_softmax(c->in[0], c->dim, out);
}
static int fn_gelu(check_t *c, zd_tensor_t **out)
{
    return zd_nn_gelu(c->in[0], out);
}

static void test_softmax(void **state)
{
    (void)state;
    const int dims[] = {0, 1, 2, -1, -2};
    for (size_t k = 0; k < sizeof dims / sizeof dims[0]; k++) {
        check_t c = {.name = "softmax (2,3,4)", .fn = fn_softmax, .n_in = 1, .dim = dims[k]};
        c.in[0] = leaf(randn(3, (int64_t[]){2, 3, 4}, 2.0f));
        check(&c);
        release(&c);
    }
    check_t c = {.name = "softmax (4,10)", .fn = fn_softmax, .n_in = 1, .dim = 1};
    c.in[0] = leaf(randn(2, (int64_t[]){4, 10}, 3.0f));
    check(&c);
    /* rows sum to 1, also with large inputs */
    zd_tensor_data(c.in[0])[0] = 1000.0f;
    zd_tensor_t *y;
    assert_int_equal(zd_nn_softmax(c.in[0], -1, &y), 0);
    for (int r = 0; r < 4; r++) {
        double s = 0;
        for (int k = 0; k < 10; k++)
            s += zd_tensor_data(y)[r * 10 + k];
        assert_float_equal(s, 1.0, 1e-5);
    }
    assert_float_equal(zd_tensor_data(y)[0], 1.0, 1e-6);
    zd_tensor_unref(y);
    release(&c);
}

static void test_gelu(void **state)
{
    (void)state;
    check_t c = {.name = "gelu", .fn = fn_gelu, .n_in = 1};
    c.in[0] = leaf(randn(3, (int64_t[]){2, 5, 3}, 2.0f));
    check(&c);
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){3}, 1, (float[]){0, 1, -1}), *y;
    assert_int_equal(zd_nn_gelu(x, &y), 0);
    /* x Phi(x): Phi(1) = 0.8413447460685429 */
    assert_float_equal(zd_tensor_data(y)[0], 0.0, 0);
    assert_float_equal(zd_tensor_data(y)[1], 0.8413447460685429, 1e-6);
    assert_float_equal(zd_tensor_data(y)[2], -(1 - 0.8413447460685429), 1e-6);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    release(&c);
}

/*  ---- layer_norm ---- */

static int fn_layer_norm(check_t *c, zd_tensor_t **out)
{
    return zd_nn_layer_norm(c->in[0], c->dim, c->in[1], c->in[2], 1e-5f, out);
}

static void ln_case(int nd, const int64_t *shape, int norm_ndim, bool weight, bool bias)
{
    char name[96];
    snprintf(name, sizeof name, "layer_norm over %d dims%s%s", norm_ndim, weight ? ", weight" : "",
             bias ? ", bias" : "");
    check_t c = {.name = name, .fn = fn_layer_norm, .n_in = 3, .dim = norm_ndim};
    c.in[0] = leaf(randn(nd, shape, 2.0f));
    const int64_t *wshape = shape + nd - norm_ndim;
    c.in[1] = weight ? leaf(randn(norm_ndim, wshape, 1.0f)) : NULL;
    c.in[2] = bias ? leaf(randn(norm_ndim, wshape, 1.0f)) : NULL;
    check(&c);
    release(&c);
}

static void test_layer_norm(void **state)
{
    (void)state;
    ln_case(2, (int64_t[]){4, 6}, 1, true, true);
    ln_case(3, (int64_t[]){2, 3, 4}, 2, true, true);
    ln_case(3, (int64_t[]){2, 3, 4}, 3, true, false);
    ln_case(2, (int64_t[]){3, 5}, 1, false, false);
    ln_case(2, (int64_t[]){3, 5}, 1, false, true); /* bias without weight */
}

/*  ---- mse_loss ---- */

static int fn_mse(check_t *c, zd_tensor_t **out)
{
    return zd_nn_mse_loss(c->in[0], c->in[1], out);
}

static void test_mse_loss(void **state)
{
    (void)state;
    for (int which = 1; which <= 3; which++) {
        check_t c = {.name = "mse_loss", .fn = fn_mse, .n_in = 2};
        c.in[0] = randn(3, (int64_t[]){2, 3, 2}, 1.0f);
        c.in[1] = randn(3, (int64_t[]){2, 3, 2}, 1.0f);
        if (which & 1)
            leaf(c.in[0]);
        if (which & 2)
            leaf(c.in[1]);
        check(&c);
        release(&c);
    }
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2}, 1, (float[]){1, 3});
    zd_tensor_t *t = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2}, 1, (float[]){0, 1}), *y;
    assert_int_equal(zd_nn_mse_loss(x, t, &y), 0);
    assert_int_equal(zd_tensor_ndim(y), 0);
    assert_float_equal(zd_tensor_data(y)[0], 2.5, 0); /* (1 + 4) / 2 */
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    zd_tensor_unref(t);
}

/*  ---- embedding ---- */

static int fn_embedding(check_t *c, zd_tensor_t **out)
{
    return zd_nn_embedding(c->indices, c->in[0], c->padding_idx, out);
}

static zd_tensor_t *indices(zd_tensor_dtype_t dtype, int nd, const int64_t *shape, const int *v)
{
    zd_tensor_t *t = zd_tensor_empty(dtype, shape, nd);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++) {
        if (dtype == ZD_INT64)
            zd_tensor_data_i64(t)[i] = v[i];
        else
            ((uint8_t *)zd_tensor_raw(t))[i] = (uint8_t)v[i];
    }
    return t;
}

static void test_embedding_gradients(void **state)
{
    (void)state;
    /* repeats (3 twice, 0 three times), the padding index among them */
    const int v[] = {3, 0, 5, 3, 0, 1, 0, 6};
    for (int k = 0; k < 4; k++) {
        check_t c = {.name = k & 1 ? "embedding, padding 0" : "embedding",
                     .fn = fn_embedding,
                     .n_in = 1,
                     .padding_idx = k & 1 ? 0 : ZD_NN_NO_PADDING};
        c.in[0] = leaf(randn(2, (int64_t[]){7, 3}, 1.0f));
        c.indices = k & 2 ? indices(ZD_UINT8, 2, (int64_t[]){2, 4}, v)
                          : indices(ZD_INT64, 1, (int64_t[]){8}, v);
        check(&c);
        release(&c);
    }
}

static void test_embedding_values(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *w = leaf(randn(2, (int64_t[]){4, 2}, 1.0f));
    zd_tensor_t *idx = indices(ZD_INT64, 2, (int64_t[]){1, 3}, (const int[]){2, 2, 1}), *y, *s;
    assert_int_equal(zd_nn_embedding(idx, w, 1, &y), 0);
    assert_int_equal(zd_tensor_ndim(y), 3);
    assert_int_equal(zd_tensor_size(y, 2), 2);
    /* the padding row is still looked up as it is */
    assert_memory_equal(zd_tensor_data(y) + 4, zd_tensor_data(w) + 2, 2 * sizeof(float));
    assert_int_equal(zd_tensor_sum(y, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(w);
    const float want[] = {0, 0, 0, 0, 2, 2, 0, 0}; /* row 2 twice, row 1 padding */
    for (int i = 0; i < 8; i++)
        assert_float_equal(zd_tensor_data(g)[i], want[i], 0);
    zd_tensor_unref(g);
    zd_tensor_unref(s);
    zd_tensor_unref(y);
    zd_tensor_unref(idx);
    zd_tensor_unref(w);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- errors, init ---- */

static void test_errors(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *w = zd_tensor_zeros2(5, 3), *y = (zd_tensor_t *)1;
    zd_tensor_t *idx = indices(ZD_INT64, 1, (int64_t[]){3}, (const int[]){1, 5, 0});
    assert_int_equal(zd_nn_embedding(idx, w, ZD_NN_NO_PADDING, &y), -1);
    assert_null(y);
    assert_non_null(strstr(zd_error_last(), "index 5 (element 1) out of range for 5 rows"));
    zd_tensor_data_i64(idx)[1] = -1;
    assert_int_equal(zd_nn_embedding(idx, w, ZD_NN_NO_PADDING, &y), -1);
    assert_non_null(strstr(zd_error_last(), "out of range"));
    zd_tensor_data_i64(idx)[1] = 2;
    assert_int_equal(zd_nn_embedding(idx, w, 5, &y), -1);
    assert_non_null(strstr(zd_error_last(), "padding_idx 5"));
    assert_int_equal(zd_nn_embedding(w, w, ZD_NN_NO_PADDING, &y), -1);
    assert_non_null(strstr(zd_error_last(), "int64 or uint8"));
    assert_int_equal(zd_nn_embedding(idx, idx, ZD_NN_NO_PADDING, &y), -1);

    assert_int_equal(zd_nn_softmax(w, 2, &y), -1);
    assert_non_null(strstr(zd_error_last(), "dimension 2 out of range"));
    assert_int_equal(zd_nn_softmax(w, -3, &y), -1);
    assert_int_equal(zd_nn_layer_norm(w, 3, NULL, NULL, 1e-5f, &y), -1);
    assert_int_equal(zd_nn_layer_norm(w, 0, NULL, NULL, 1e-5f, &y), -1);
    zd_tensor_t *b = zd_tensor_zeros1(5);
    assert_int_equal(zd_nn_layer_norm(w, 1, b, NULL, 1e-5f, &y), -1);
    assert_non_null(strstr(zd_error_last(), "weight (5) does not match"));
    zd_tensor_t *t = zd_tensor_zeros2(3, 5);
    assert_int_equal(zd_nn_mse_loss(w, t, &y), -1);
    assert_non_null(strstr(zd_error_last(), "(5, 3) and target (3, 5)"));
    assert_int_equal(zd_nn_gelu(idx, &y), -1);
    assert_null(y);
    assert_int_equal(zd_nn_init_normal(w, 0.0f, -1.0f, gradcheck_rng()), -1);
    assert_int_equal(zd_nn_init_normal(w, 0.0f, 1.0f, NULL), -1);
    zd_tensor_unref(t);
    zd_tensor_unref(b);
    zd_tensor_unref(idx);
    zd_tensor_unref(w);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_init_normal(void **state)
{
    (void)state;
    zd_tensor_t *w = zd_tensor_zeros2(100, 100);
    assert_int_equal(zd_nn_init_normal(w, 0.0f, 1.0f, gradcheck_rng()), 0);
    double s = 0, sq = 0;
    for (int i = 0; i < 10000; i++) {
        s += zd_tensor_data(w)[i];
        sq += (double)zd_tensor_data(w)[i] * zd_tensor_data(w)[i];
    }
    /* 10000 samples: the mean's standard error is 0.01, the variance's 0.014 */
    assert_float_equal(s / 10000, 0.0, 0.05);
    assert_float_equal(sq / 10000, 1.0, 0.07);
    zd_tensor_unref(w);
}

int main(void)
{
    gradcheck_seed(20261126);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_mse_loss),
        cmocka_unit_test(test_embedding_gradients),
        cmocka_unit_test(test_embedding_values),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_init_normal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
