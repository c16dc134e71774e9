/* SPDX-License-Identifier: MIT */
/*  The parameter container (SPEC N5): dotted names in PyTorch's order,
    submodules, a module defined in C with its own forward, train/eval,
    zero_grad, checkpoints, state_dict, errors; nothing leaks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/checkpoint.h>
#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/nn.h>

/*  A two-layer perceptron written as a user would: fc1 -> relu -> fc2. */
typedef struct {
    zd_nn_module_t *fc1, *fc2; /* borrowed: children of the module */
    int forwards;
} mlp_t;

static int mlp_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                       int n_out)
{
    mlp_t *s = zd_nn_module_state(m);
    zd_tensor_t *h, *r;
    if (n_in != 1 || n_out != 1)
        return zd_error_set("takes 1 input, gives 1 output");
    if (zd_nn_module_forward(s->fc1, in, 1, &h, 1) < 0)
        return -1;
    int rc = zd_nn_relu(h, &r);
    zd_tensor_unref(h);
    if (rc == 0) {
        rc = zd_nn_module_forward(s->fc2, &r, 1, out, 1);
        zd_tensor_unref(r);
    }
    s->forwards++;
    return rc;
}

static zd_nn_module_t *mlp_new(uint64_t seed)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    mlp_t *s = calloc(1, sizeof *s);
    zd_nn_module_t *m = zd_nn_module_new("Mlp", mlp_forward, s, free);
    if (!m)
        return NULL;
    s->fc1 = zd_nn_linear_new(3, 4, true, &rng);
    s->fc2 = zd_nn_linear_new(4, 2, false, &rng);
    if (zd_nn_module_register_module(m, "fc1", s->fc1) < 0 ||
        zd_nn_module_register_module(m, "fc2", s->fc2) < 0) {
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

static void test_names_order_and_lookup(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = mlp_new(1);
    assert_non_null(m);
    /* the module's own parameters come first, then the children's */
    zd_tensor_t *scale = zd_nn_module_add_parameter(m, "scale", (int64_t[]){2}, 1);
    assert_non_null(scale);
    assert_int_equal(zd_nn_module_n_params(m), 4);
    const char *expect[] = {"scale", "fc1.weight", "fc1.bias", "fc2.weight"};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(zd_nn_module_param_name(m, i), expect[i]);
        assert_ptr_equal(zd_nn_module_find(m, expect[i]), zd_nn_module_param(m, i));
        assert_true(zd_tensor_requires_grad(zd_nn_module_param(m, i)));
    }
    assert_int_equal(zd_tensor_size(zd_nn_module_find(m, "fc1.weight"), 0), 4);
    assert_int_equal(zd_tensor_size(zd_nn_module_find(m, "fc1.weight"), 1), 3);
    assert_int_equal(zd_nn_module_numel(m), 2 + 12 + 4 + 8);
    assert_string_equal(zd_tensor_name(scale), "scale");
    assert_string_equal(zd_tensor_name(zd_nn_module_param(m, 1)), "fc1.weight");
    assert_ptr_equal(zd_nn_module_child(m, "fc2"), ((mlp_t *)zd_nn_module_state(m))->fc2);
    assert_string_equal(zd_nn_module_type(zd_nn_module_child(m, "fc1")), "Linear");

    /* errors name what is wrong and change nothing */
    assert_null(zd_nn_module_find(m, "fc3.weight"));
    assert_non_null(strstr(zd_error_last(), "fc3.weight"));
    assert_null(zd_nn_module_param(m, 4));
    assert_null(zd_nn_module_add_parameter(m, "scale", (int64_t[]){2}, 1));
    assert_non_null(strstr(zd_error_last(), "already has a parameter"));
    assert_null(zd_nn_module_add_parameter(m, "fc1", (int64_t[]){2}, 1));
    assert_non_null(strstr(zd_error_last(), "already has a submodule"));
    assert_null(zd_nn_module_add_parameter(m, "a.b", (int64_t[]){2}, 1));
    zd_tensor_t *ints = zd_tensor_new(ZD_INT64, (int64_t[]){2}, 1);
    assert_int_equal(zd_nn_module_register_parameter(m, "ints", ints), -1);
    zd_tensor_unref(ints);
    zd_nn_module_t *other = zd_nn_module_new("Empty", NULL, NULL, NULL);
    assert_int_equal(zd_nn_module_register_module(m, "fc1", other), -1); /* freed */
    assert_int_equal(zd_nn_module_n_params(m), 4);

    /* a parameter registered in a child after it joined shows at once */
    assert_non_null(zd_nn_module_add_parameter(zd_nn_module_child(m, "fc2"), "extra", NULL, 0));
    assert_int_equal(zd_nn_module_n_params(m), 5);
    assert_string_equal(zd_nn_module_param_name(m, 4), "fc2.extra");
    assert_string_equal(zd_tensor_name(zd_nn_module_param(m, 4)), "fc2.extra");

    zd_nn_module_free(m);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_forward_backward_zero_grad_and_modes(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = mlp_new(7);
    float xv[6] = {1, -2, 0.5f, 3, 0.25f, -1};
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 3}, 2, xv), *y, *loss;
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &y, 1), 0);
    assert_int_equal(zd_tensor_size(y, 0), 2);
    assert_int_equal(zd_tensor_size(y, 1), 2);

    /* the same numbers as the layers called by hand */
    zd_tensor_t *h, *r, *y2;
    assert_int_equal(
        zd_nn_linear(x, zd_nn_module_find(m, "fc1.weight"), zd_nn_module_find(m, "fc1.bias"), &h),
        0);
    assert_int_equal(zd_nn_relu(h, &r), 0);
    assert_int_equal(zd_nn_linear(r, zd_nn_module_find(m, "fc2.weight"), NULL, &y2), 0);
    for (int i = 0; i < 4; i++)
        assert_true(zd_tensor_data(y)[i] == zd_tensor_data(y2)[i]);
    zd_tensor_unref(h);
    zd_tensor_unref(r);
    zd_tensor_unref(y2);

    assert_int_equal(zd_tensor_sum(y, &loss), 0);
    assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
    for (int i = 0; i < zd_nn_module_n_params(m); i++) {
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_param(m, i));
        assert_non_null(g);
        zd_tensor_unref(g);
    }
    /* dL/d fc2.weight[o][k] = sum over the batch of relu(h)[n][k] */
    zd_tensor_t *g2 = zd_tensor_grad(zd_nn_module_find(m, "fc2.weight"));
    zd_tensor_t *w1 = zd_nn_module_find(m, "fc1.weight"), *b1 = zd_nn_module_find(m, "fc1.bias");
    for (int k = 0; k < 4; k++) {
        double sum = 0;
        for (int n = 0; n < 2; n++) {
            double hk = zd_tensor_data(b1)[k];
            for (int j = 0; j < 3; j++)
                hk += (double)zd_tensor_data(w1)[k * 3 + j] * xv[n * 3 + j];
            sum += hk > 0 ? hk : 0;
        }
        assert_true(fabs(zd_tensor_data(g2)[k] - sum) < 1e-5);
        assert_true(fabs(zd_tensor_data(g2)[4 + k] - sum) < 1e-5);
    }
    zd_tensor_unref(g2);
    zd_nn_module_zero_grad(m);
    for (int i = 0; i < zd_nn_module_n_params(m); i++)
        assert_null(zd_tensor_grad(zd_nn_module_param(m, i)));

    /* modes reach the children */
    assert_true(zd_nn_module_is_training(m));
    assert_true(zd_nn_module_train(m, false));
    assert_false(zd_nn_module_is_training(zd_nn_module_child(m, "fc1")));
    assert_false(zd_nn_module_train(m, true));
    assert_true(zd_nn_module_is_training(zd_nn_module_child(m, "fc2")));

    /* forward errors carry the module's type */
    zd_tensor_t *two[2] = {x, x}, *bad = (zd_tensor_t *)1;
    assert_int_equal(zd_nn_module_forward(m, two, 2, &bad, 1), -1);
    assert_null(bad);
    assert_non_null(strstr(zd_error_last(), "Mlp forward"));
    zd_nn_module_t *empty = zd_nn_module_new("Box", NULL, NULL, NULL);
    assert_int_equal(zd_nn_module_forward(empty, &x, 1, &bad, 1), -1);
    assert_non_null(strstr(zd_error_last(), "no forward"));
    zd_nn_module_free(empty);
    assert_int_equal(((mlp_t *)zd_nn_module_state(m))->forwards, 1);

    zd_tensor_unref(loss);
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_save_load(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    char path[] = "/tmp/zd_test_module_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    zd_nn_module_t *a = mlp_new(1), *b = mlp_new(2);
    assert_int_equal(zd_nn_module_save(a, path), 0);
    zd_tensor_t *wa = zd_nn_module_find(a, "fc2.weight"), *wb = zd_nn_module_find(b, "fc2.weight");
    assert_false(zd_tensor_data(wa)[0] == zd_tensor_data(wb)[0]);
    assert_int_equal(zd_nn_module_load(b, path), 0);
    for (int i = 0; i < zd_nn_module_n_params(a); i++) {
        zd_tensor_t *p = zd_nn_module_param(a, i), *q = zd_nn_module_param(b, i);
        assert_memory_equal(zd_tensor_data(p), zd_tensor_data(q), zd_tensor_nbytes(p));
    }
    /* the file is written with the dotted names */
    zd_named_tensors_t *nt = zd_checkpoint_read(path);
    assert_non_null(nt);
    assert_int_equal(zd_named_tensors_len(nt), 3);
    assert_string_equal(zd_named_tensors_name(nt, 1), "fc1.bias");
    zd_named_tensors_free(nt);

    /* a module of another shape refuses the file and keeps its values */
    zd_rng_t rng;
    zd_rng_seed(&rng, 3);
    zd_nn_module_t *c = zd_nn_linear_new(3, 4, true, &rng);
    float before = zd_tensor_data(zd_nn_module_param(c, 0))[0];
    assert_int_equal(zd_nn_module_load(c, path), -1);
    assert_true(zd_tensor_data(zd_nn_module_param(c, 0))[0] == before);
    unlink(path);
    zd_nn_module_free(a);
    zd_nn_module_free(b);
    zd_nn_module_free(c);
    assert_null(zd_nn_linear_new(0, 2, true, &rng));
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  state_dict: PyTorch's names and order, children included, the module's
    own tensors (a write through the list is a write to the weights, and
    the list keeps them alive after the module), a tied weight under each
    of its names, as PyTorch's state_dict() lists it. */
static void test_state_dict(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = mlp_new(1);
    assert_non_null(m);
    zd_tensor_t *scale = zd_nn_module_add_parameter(m, "scale", (int64_t[]){2}, 1);
    assert_non_null(scale);
    /* fc2 also holds fc1's weight: listed under both names */
    zd_tensor_t *w1 = zd_nn_module_find(m, "fc1.weight");
    assert_int_equal(zd_nn_module_register_parameter(zd_nn_module_child(m, "fc2"), "tied", w1), 0);
    assert_int_equal(zd_nn_module_n_params(m), 4); /* parameters(): w1 once */

    zd_named_tensors_t *sd = zd_nn_module_state_dict(m);
    assert_non_null(sd);
    const char *expect[] = {"scale", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.tied"};
    assert_int_equal(zd_named_tensors_len(sd), 5);
    for (int i = 0; i < 5; i++) {
        assert_string_equal(zd_named_tensors_name(sd, i), expect[i]);
        assert_ptr_equal(zd_named_tensors_tensor(sd, i), zd_nn_module_find(m, expect[i]));
    }
    assert_ptr_equal(zd_named_tensors_find(sd, "fc2.tied"), w1);
    zd_tensor_data(zd_named_tensors_find(sd, "fc1.weight"))[0] = 42.0f;
    assert_true(zd_tensor_data(w1)[0] == 42.0f);
    assert_true(zd_tensor_data(zd_nn_module_find(m, "fc2.tied"))[0] == 42.0f);

    zd_tensor_t *kept = zd_named_tensors_find(sd, "fc1.bias");
    float b0 = zd_tensor_data(kept)[0];
    zd_nn_module_free(m);
    assert_true(zd_tensor_data(kept)[0] == b0); /* the list's references */
    zd_named_tensors_free(sd);
    assert_int_equal(zd_tensor_live_count(), live);

    /* an empty module: an empty list; no module: an error */
    zd_nn_module_t *e = zd_nn_module_new("Empty", NULL, NULL, NULL);
    sd = zd_nn_module_state_dict(e);
    assert_non_null(sd);
    assert_int_equal(zd_named_tensors_len(sd), 0);
    zd_named_tensors_free(sd);
    zd_nn_module_free(e);
    assert_null(zd_nn_module_state_dict(NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
}

/*  Tied weights, as the word language model's tie_weights: the decoder's
    weight is the encoder's. parameters() lists the tensor once, where it
    was first seen; state_dict() keeps both names; gradients from both
    uses accumulate into the one tensor. */
typedef struct {
    zd_nn_module_t *enc;
    zd_tensor_t *bias; /* borrowed */
} tied_t;

static int tied_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                        int n_out)
{
    tied_t *t = zd_nn_module_state(m);
    zd_tensor_t *e;
    if (n_in != 1 || n_out != 1 || zd_nn_module_forward(t->enc, in, 1, &e, 1) < 0)
        return -1;
    int rc = zd_nn_linear(e, zd_nn_module_find(m, "decoder.weight"), t->bias, out);
    zd_tensor_unref(e);
    return rc;
}

static void test_tied_weights(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    tied_t *t = calloc(1, sizeof *t);
    zd_nn_module_t *m = zd_nn_module_new("Tied", tied_forward, t, free);
    assert_non_null(m);
    t->enc = zd_nn_embedding_new(5, 3, ZD_NN_NO_PADDING, 7);
    assert_int_equal(zd_nn_module_register_module(m, "encoder", t->enc), 0);
    zd_nn_module_t *dec = zd_nn_module_new("Linear", NULL, NULL, NULL);
    assert_int_equal(zd_nn_module_register_module(m, "decoder", dec), 0);
    zd_tensor_t *w = zd_nn_module_find(m, "encoder.weight");
    assert_int_equal(zd_nn_module_register_parameter(dec, "weight", w), 0); /* (5, 3) */
    t->bias = zd_nn_module_add_parameter(dec, "bias", (int64_t[]){5}, 1);
    assert_non_null(t->bias);

    /* parameters(): encoder.weight, decoder.bias */
    assert_int_equal(zd_nn_module_n_params(m), 2);
    assert_ptr_equal(zd_nn_module_param(m, 0), w);
    assert_string_equal(zd_nn_module_param_name(m, 0), "encoder.weight");
    assert_string_equal(zd_nn_module_param_name(m, 1), "decoder.bias");
    assert_null(zd_nn_module_param(m, 2));
    assert_int_equal(zd_nn_module_numel(m), 15 + 5);
    assert_int_equal(zd_nn_module_n_params(dec), 2); /* the decoder alone has both */
    assert_string_equal(zd_tensor_name(w), "encoder.weight");
    /* state_dict(): both names, one tensor */
    zd_named_tensors_t *sd = zd_nn_module_state_dict(m);
    assert_non_null(sd);
    assert_int_equal(zd_named_tensors_len(sd), 3);
    assert_string_equal(zd_named_tensors_name(sd, 0), "encoder.weight");
    assert_string_equal(zd_named_tensors_name(sd, 1), "decoder.weight");
    assert_string_equal(zd_named_tensors_name(sd, 2), "decoder.bias");
    assert_ptr_equal(zd_named_tensors_tensor(sd, 1), w);
    assert_ptr_equal(zd_nn_module_find(m, "decoder.weight"), w);
    zd_named_tensors_free(sd);

    /* both uses give w a gradient: sum(linear(emb(idx), w)) */
    int64_t idx[2] = {1, 3};
    zd_tensor_t *x = zd_tensor_from_data(ZD_INT64, (int64_t[]){2}, 1, idx), *y, *loss;
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &y, 1), 0);
    assert_int_equal(zd_tensor_sum(y, &loss), 0);
    assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
    const float *wd = zd_tensor_data(w);
    zd_tensor_t *g = zd_tensor_grad(w);
    assert_non_null(g);
    /* d/dW[j,k] = sum_i e_i[k] (decoder) + [j in idx] sum_j' W[j',k] (encoder) */
    for (int j = 0; j < 5; j++)
        for (int k = 0; k < 3; k++) {
            double expect = (double)wd[1 * 3 + k] + wd[3 * 3 + k];
            if (j == 1 || j == 3)
                for (int r = 0; r < 5; r++)
                    expect += wd[r * 3 + k];
            assert_true(fabs(zd_tensor_data(g)[j * 3 + k] - expect) < 1e-4);
        }
    zd_tensor_unref(g);
    zd_nn_module_zero_grad(m);
    assert_null(zd_tensor_grad(w));
    zd_tensor_unref(loss);
    zd_tensor_unref(y);
    zd_tensor_unref(x);

    /* registered twice in one module: still one parameter */
    assert_int_equal(zd_nn_module_register_parameter(m, "again", w), 0);
    assert_int_equal(zd_nn_module_n_params(m), 2);
    assert_string_equal(zd_nn_module_param_name(m, 0), "again"); /* the module's own first */
    zd_nn_module_free(m);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  nn.Embedding: N(0, 1) weight, the padding row zeroed and left without
    gradient, the functional form's numbers. */
static void test_embedding_module(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *e = zd_nn_embedding_new(50, 8, 2, 11);
    assert_non_null(e);
    assert_string_equal(zd_nn_module_type(e), "Embedding");
    assert_int_equal(zd_nn_module_n_params(e), 1);
    assert_string_equal(zd_nn_module_param_name(e, 0), "weight");
    zd_tensor_t *w = zd_nn_module_param(e, 0);
    assert_int_equal(zd_tensor_size(w, 0), 50);
    assert_int_equal(zd_tensor_size(w, 1), 8);
    assert_true(zd_tensor_requires_grad(w));
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < 400; i++) {
        float v = zd_tensor_data(w)[i];
        if (i / 8 == 2)
            assert_true(v == 0.0f);
        sum += v;
        sq += (double)v * v;
    }
    double mean = sum / 392, var = sq / 392 - mean * mean;
    assert_true(fabs(mean) < 0.2 && var > 0.7 && var < 1.3); /* N(0, 1) */
    zd_nn_module_t *e2 = zd_nn_embedding_new(50, 8, 2, 11);
    assert_memory_equal(zd_tensor_data(w), zd_tensor_data(zd_nn_module_param(e2, 0)), 400 * 4);
    zd_nn_module_free(e2);

    int64_t idx[4] = {0, 2, 2, 49};
    zd_tensor_t *x = zd_tensor_from_data(ZD_INT64, (int64_t[]){2, 2}, 2, idx), *y, *z, *s;
    assert_int_equal(zd_nn_module_forward(e, &x, 1, &y, 1), 0);
    assert_int_equal(zd_nn_embedding(x, w, 2, &z), 0);
    assert_int_equal(zd_tensor_ndim(y), 3);
    assert_memory_equal(zd_tensor_data(y), zd_tensor_data(z), zd_tensor_nbytes(z));
    assert_int_equal(zd_tensor_sum(y, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(w);
    assert_true(zd_tensor_data(g)[0] == 1.0f && zd_tensor_data(g)[2 * 8] == 0.0f &&
                zd_tensor_data(g)[49 * 8] == 1.0f && zd_tensor_data(g)[8] == 0.0f);
    zd_tensor_unref(g);
    zd_tensor_t *bad = NULL;
    assert_int_equal(zd_nn_module_forward(e, (zd_tensor_t *[]){x, x}, 2, &bad, 1), -1);
    assert_null(bad);
    assert_non_null(strstr(zd_error_last(), "Embedding forward"));
    zd_tensor_unref(s);
    zd_tensor_unref(y);
    zd_tensor_unref(z);
    zd_tensor_unref(x);
    zd_nn_module_free(e);

    /* no padding: no zero row; bad arguments */
    e = zd_nn_embedding_new(3, 2, ZD_NN_NO_PADDING, 1);
    assert_non_null(e);
    zd_nn_module_free(e);
    assert_null(zd_nn_embedding_new(3, 2, 3, 1));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_null(zd_nn_embedding_new(0, 2, -1, 1));
    assert_null(zd_nn_embedding_new(3, 2, -2, 1));
    assert_int_equal(zd_tensor_live_count(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_order_and_lookup),
        cmocka_unit_test(test_forward_backward_zero_grad_and_modes),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_state_dict),
        cmocka_unit_test(test_tied_weights),
        cmocka_unit_test(test_embedding_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
