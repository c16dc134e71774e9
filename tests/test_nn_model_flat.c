/* SPDX-License-Identifier: MIT */
/*  A model's parameters and gradients as one flat vector and back
    (zd_nn_module_params_to_vector, zd_nn_module_grads_to_vector,
    zd_nn_module_vector_to_params): PyTorch's layout, round trips, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>

/*  v holds every parameter of m (or its gradient), in order, flattened. */
static void assert_layout(zd_nn_module_t *m, const zd_tensor_t *v, bool grads)
{
    assert_int_equal(zd_tensor_ndim(v), 1);
    assert_int_equal(zd_tensor_numel(v), zd_nn_module_numel(m));
    const float *d = zd_tensor_data(v);
    for (int i = 0; i < zd_nn_module_n_params(m); i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i),
                    *src = grads ? zd_tensor_grad(p) : zd_tensor_ref(p);
        assert_non_null(src);
        assert_memory_equal(d, zd_tensor_data(src), zd_tensor_nbytes(p));
        zd_tensor_unref(src);
        d += zd_tensor_numel(p);
    }
    assert_ptr_equal(d, zd_tensor_data(v) + zd_tensor_numel(v));
}

static void test_params_round_trip(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_nn_module_t *a = zd_nn_convnet_new(3), *b = zd_nn_convnet_new(4);
    zd_tensor_t *va, *vb;
    assert_int_equal(zd_nn_module_params_to_vector(a, &va), 0);
    assert_int_equal(zd_tensor_numel(va), 3 * 9 + 3 + 192 * 10 + 10);
    assert_layout(a, va, false);
    /* A copy: changing the vector leaves the model alone. */
    float first = zd_tensor_data(zd_nn_module_param(a, 0))[0];
    zd_tensor_data(va)[0] = first + 1;
    assert_float_equal(zd_tensor_data(zd_nn_module_param(a, 0))[0], first, 0);
    zd_tensor_data(va)[0] = first;
    /* Into another model: the same parameters, still leaves needing grad. */
    assert_int_equal(zd_nn_module_vector_to_params(b, va), 0);
    assert_int_equal(zd_nn_module_params_to_vector(b, &vb), 0);
    assert_memory_equal(zd_tensor_data(vb), zd_tensor_data(va), zd_tensor_nbytes(va));
    for (int i = 0; i < zd_nn_module_n_params(b); i++) {
        assert_true(zd_tensor_is_leaf(zd_nn_module_param(b, i)));
        assert_true(zd_tensor_requires_grad(zd_nn_module_param(b, i)));
    }
    /* The last value lands in the last parameter (fc.bias[9]). */
    zd_tensor_data(va)[zd_tensor_numel(va) - 1] = 42;
    assert_int_equal(zd_nn_module_vector_to_params(b, va), 0);
    assert_float_equal(zd_tensor_data(zd_nn_module_find(b, "fc.bias"))[9], 42, 0);
    zd_tensor_unref(va);
    zd_tensor_unref(vb);
    zd_nn_module_free(a);
    zd_nn_module_free(b);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_grads_to_vector(void **state)
{
    (void)state;
    zd_nn_module_t *m = zd_nn_convnet_new(5);
    zd_tensor_t *g;
    /* No gradient yet: zeros. */
    assert_int_equal(zd_nn_module_grads_to_vector(m, &g), 0);
    assert_int_equal(zd_tensor_numel(g), zd_nn_module_numel(m));
    for (int64_t i = 0; i < zd_tensor_numel(g); i++)
        assert_float_equal(zd_tensor_data(g)[i], 0, 0);
    zd_tensor_unref(g);
    /* After a backward: every gradient, in order. */
    zd_tensor_t *x = zd_tensor_zeros4(2, 1, 28, 28), *y, *lp, *loss;
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        zd_tensor_data(x)[i] = (float)(i % 17) / 17.0f;
    y = zd_tensor_from_data(ZD_INT64, (int64_t[]){2}, 1, (int64_t[]){3, 7});
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &lp, 1), 0);
    assert_int_equal(zd_nn_nll_loss(lp, y, &loss), 0);
    assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
    assert_int_equal(zd_nn_module_grads_to_vector(m, &g), 0);
    assert_layout(m, g, true);
    zd_tensor_unref(g);
    /* A parameter without a gradient contributes zeros in its place. */
    zd_tensor_t *fc_w = zd_nn_module_find(m, "fc.weight");
    zd_tensor_clear_grad(fc_w);
    assert_int_equal(zd_nn_module_grads_to_vector(m, &g), 0);
    int64_t at = 3 * 9 + 3; /* conv1.weight and conv1.bias come first */
    for (int64_t i = 0; i < zd_tensor_numel(fc_w); i++)
        assert_float_equal(zd_tensor_data(g)[at + i], 0, 0);
    zd_tensor_t *fc_b = zd_tensor_grad(zd_nn_module_find(m, "fc.bias"));
    assert_memory_equal(zd_tensor_data(g) + at + zd_tensor_numel(fc_w), zd_tensor_data(fc_b),
                        zd_tensor_nbytes(fc_b));
    zd_tensor_unref(fc_b);
    zd_tensor_unref(g);
    zd_tensor_unref(loss);
    zd_tensor_unref(lp);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    zd_nn_module_free(m);
}

static void test_bad_vectors(void **state)
{
    (void)state;
    zd_nn_module_t *m = zd_nn_convnet_new(1);
    zd_tensor_t *small = zd_tensor_zeros1(5), *flat2 = zd_tensor_zeros2(1, zd_nn_module_numel(m));
    int64_t n = zd_nn_module_numel(m);
    zd_tensor_t *ints = zd_tensor_new(ZD_INT64, &n, 1), *before, *after;
    assert_int_equal(zd_nn_module_params_to_vector(m, &before), 0);
    assert_int_equal(zd_nn_module_vector_to_params(m, small), -1);
    assert_string_equal(zd_error_last(),
                        "vector_to_params: the ConvNet has 1960 parameter "
                        "values; the vector is float32 (5)");
    assert_int_equal(zd_nn_module_vector_to_params(m, ints), -1);
    assert_non_null(strstr(zd_error_last(), "int64 (1960)"));
    assert_int_equal(zd_nn_module_vector_to_params(m, flat2), -1);
    assert_non_null(strstr(zd_error_last(), "(1, 1960)"));
    assert_int_equal(zd_nn_module_vector_to_params(m, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "NULL vector"));
    assert_int_equal(zd_nn_module_vector_to_params(NULL, small), -1);
    zd_tensor_t *out = small;
    assert_int_equal(zd_nn_module_params_to_vector(NULL, &out), -1);
    assert_null(out);
    /* Nothing was written by the refused calls. */
    assert_int_equal(zd_nn_module_params_to_vector(m, &after), 0);
    assert_memory_equal(zd_tensor_data(after), zd_tensor_data(before), zd_tensor_nbytes(before));
    zd_tensor_t *all[] = {small, flat2, ints, before, after};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
    zd_nn_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_round_trip),
        cmocka_unit_test(test_grads_to_vector),
        cmocka_unit_test(test_bad_vectors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
