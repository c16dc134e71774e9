/*  A model's parameters and gradients as one flat vector and back
    (nn_model_params_to_vector, nn_model_grads_to_vector,
    nn_model_vector_to_params): PyTorch's layout, round trips, errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/model.h"
#include "nn/nn.h"

/*  v holds every parameter of m (or its gradient), in order, flattened. */
static void assert_layout(nn_model_t *m, const tensor_t *v, bool grads)
{
    assert_int_equal(tensor_ndim(v), 1);
    assert_int_equal(tensor_numel(v), nn_model_numel(m));
    const float *d = tensor_data(v);
    for (int i = 0; i < nn_model_n_params(m); i++) {
        tensor_t *p = nn_model_param(m, i), *src = grads ? tensor_grad(p) : tensor_ref(p);
        assert_non_null(src);
        assert_memory_equal(d, tensor_data(src), tensor_nbytes(p));
        tensor_unref(src);
        d += tensor_numel(p);
    }
    assert_ptr_equal(d, tensor_data(v) + tensor_numel(v));
}

static void test_params_round_trip(void **state)
{
    (void)state;
    int64_t before = tensor_live_count();
    nn_model_t *a = nn_convnet_new(3), *b = nn_convnet_new(4);
    tensor_t *va, *vb;
    assert_int_equal(nn_model_params_to_vector(a, &va), 0);
    assert_int_equal(tensor_numel(va), 3 * 9 + 3 + 192 * 10 + 10);
    assert_layout(a, va, false);
    /* A copy: changing the vector leaves the model alone. */
    float first = tensor_data(nn_model_param(a, 0))[0];
    tensor_data(va)[0] = first + 1;
    assert_float_equal(tensor_data(nn_model_param(a, 0))[0], first, 0);
    tensor_data(va)[0] = first;
    /* Into another model: the same parameters, still leaves needing grad. */
    assert_int_equal(nn_model_vector_to_params(b, va), 0);
    assert_int_equal(nn_model_params_to_vector(b, &vb), 0);
    assert_memory_equal(tensor_data(vb), tensor_data(va), tensor_nbytes(va));
    for (int i = 0; i < nn_model_n_params(b); i++) {
        assert_true(tensor_is_leaf(nn_model_param(b, i)));
        assert_true(tensor_requires_grad(nn_model_param(b, i)));
    }
    /* The last value lands in the last parameter (fc.bias[9]). */
    tensor_data(va)[tensor_numel(va) - 1] = 42;
    assert_int_equal(nn_model_vector_to_params(b, va), 0);
    assert_float_equal(tensor_data(nn_model_find_param(b, "fc.bias"))[9], 42, 0);
    tensor_unref(va);
    tensor_unref(vb);
    nn_model_free(a);
    nn_model_free(b);
    assert_int_equal(tensor_live_count(), before);
}

static void test_grads_to_vector(void **state)
{
    (void)state;
    nn_model_t *m = nn_convnet_new(5);
    tensor_t *g;
    /* No gradient yet: zeros. */
    assert_int_equal(nn_model_grads_to_vector(m, &g), 0);
    assert_int_equal(tensor_numel(g), nn_model_numel(m));
    for (int64_t i = 0; i < tensor_numel(g); i++)
        assert_float_equal(tensor_data(g)[i], 0, 0);
    tensor_unref(g);
    /* After a backward: every gradient, in order. */
    tensor_t *x = tensor_zeros4(2, 1, 28, 28), *y, *lp, *loss;
    for (int64_t i = 0; i < tensor_numel(x); i++)
        tensor_data(x)[i] = (float)(i % 17) / 17.0f;
    y = tensor_from_data(TENSOR_I64, 1, (int64_t[]){2}, (int64_t[]){3, 7});
    assert_int_equal(nn_model_forward(m, x, &lp), 0);
    assert_int_equal(nn_nll_loss(lp, y, &loss), 0);
    assert_int_equal(autograd_backward(loss, NULL, false), 0);
    assert_int_equal(nn_model_grads_to_vector(m, &g), 0);
    assert_layout(m, g, true);
    tensor_unref(g);
    /* A parameter without a gradient contributes zeros in its place. */
    tensor_t *fc_w = nn_model_find_param(m, "fc.weight");
    tensor_clear_grad(fc_w);
    assert_int_equal(nn_model_grads_to_vector(m, &g), 0);
    int64_t at = 3 * 9 + 3;   /* conv1.weight and conv1.bias come first */
    for (int64_t i = 0; i < tensor_numel(fc_w); i++)
        assert_float_equal(tensor_data(g)[at + i], 0, 0);
    tensor_t *fc_b = tensor_grad(nn_model_find_param(m, "fc.bias"));
    assert_memory_equal(tensor_data(g) + at + tensor_numel(fc_w), tensor_data(fc_b),
                        tensor_nbytes(fc_b));
    tensor_unref(fc_b);
    tensor_unref(g);
    tensor_unref(loss);
    tensor_unref(lp);
    tensor_unref(x);
    tensor_unref(y);
    nn_model_free(m);
}

static void test_bad_vectors(void **state)
{
    (void)state;
    nn_model_t *m = nn_convnet_new(1);
    tensor_t *small = tensor_zeros1(5), *flat2 = tensor_zeros2(1, nn_model_numel(m));
    int64_t n = nn_model_numel(m);
    tensor_t *ints = tensor_new(TENSOR_I64, 1, &n), *before, *after;
    assert_int_equal(nn_model_params_to_vector(m, &before), 0);
    assert_int_equal(nn_model_vector_to_params(m, small), -1);
    assert_string_equal(error_last(), "vector_to_params: the convnet has 1960 parameter "
                                      "values; the vector is float32 (5)");
    assert_int_equal(nn_model_vector_to_params(m, ints), -1);
    assert_non_null(strstr(error_last(), "int64 (1960)"));
    assert_int_equal(nn_model_vector_to_params(m, flat2), -1);
    assert_non_null(strstr(error_last(), "(1, 1960)"));
    assert_int_equal(nn_model_vector_to_params(m, NULL), -1);
    assert_non_null(strstr(error_last(), "NULL vector"));
    assert_int_equal(nn_model_vector_to_params(NULL, small), -1);
    tensor_t *out = small;
    assert_int_equal(nn_model_params_to_vector(NULL, &out), -1);
    assert_null(out);
    /* Nothing was written by the refused calls. */
    assert_int_equal(nn_model_params_to_vector(m, &after), 0);
    assert_memory_equal(tensor_data(after), tensor_data(before), tensor_nbytes(before));
    tensor_t *all[] = {small, flat2, ints, before, after};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tensor_unref(all[i]);
    nn_model_free(m);
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
