/* SPDX-License-Identifier: MIT */
/*  Models' weights between zdist and PyTorch through safetensors files
    (<zdist/safetensors.h>), under PyTorch's state_dict() names:
      - the tutorial Net and a 2-layer LSTM trained by PyTorch
        (tests/safetensors/, written by tools/safetensors/gen_reference.py)
        load into zdist's, which then give PyTorch's outputs within 1e-5;
      - a Net trained by zdist, saved, loads into PyTorch's Net
        (tests/safetensors_models_torch.py, run by /usr/bin/python3;
        skipped when it cannot import torch), which gives zdist's
        log-probabilities within 1e-5 and the same argmax for every input;
      - strict loading refuses a missing, extra or mis-shaped tensor by
        name and changes nothing; non-strict loading names what it skipped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/rng.h>
#include <zdist/rnn.h>
#include <zdist/safetensors.h>
#include "tests/support/fixtures.h"

#define TOL 1e-5

/*  tests/safetensors/name. */
static const char *ref_path(const char *name)
{
    static char path[4][1200];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/safetensors/%s", tests_dir(), name);
    return path[k];
}

/*  A container module "Net" whose submodules conv1, conv2, fc1, fc2 hold
    the model's own tensors as "weight" and "bias": PyTorch's module tree,
    so the module's names are the Net's state_dict() names. */
static zd_nn_module_t *net_module(zd_nn_module_t *net)
{
    zd_nn_module_t *m = zd_nn_module_new("Net", NULL, NULL, NULL);
    assert_non_null(m);
    const char *layers[] = {"conv1", "conv2", "fc1", "fc2"};
    for (int l = 0; l < 4; l++) {
        zd_nn_module_t *c = zd_nn_module_new("Layer", NULL, NULL, NULL);
        assert_non_null(c);
        const char *kinds[] = {"weight", "bias"};
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s.%s", layers[l], kinds[k]);
            zd_tensor_t *t = zd_nn_module_find(net, name);
            assert_non_null(t);
            assert_int_equal(zd_nn_module_register_parameter(c, kinds[k], t), 0);
        }
        assert_int_equal(zd_nn_module_register_module(m, layers[l], c), 0);
    }
    return m;
}

static zd_named_tensors_t *read_ref(const char *name)
{
    zd_named_tensors_t *nt = zd_safetensors_read(ref_path(name), NULL);
    if (!nt)
        fail_msg("%s (regenerate with tools/safetensors/gen_reference.py)", zd_error_last());
    return nt;
}

static zd_tensor_t *find(const zd_named_tensors_t *nt, const char *name)
{
    zd_tensor_t *t = zd_named_tensors_find(nt, name);
    if (!t)
        fail_msg("no tensor \"%s\" in the reference file", name);
    return t;
}

/*  got equals want within TOL, element by element. */
static void assert_close(const zd_tensor_t *got, const zd_tensor_t *want, const char *what)
{
    if (!zd_tensor_same_shape(got, want)) {
        char a[96], b[96];
        fail_msg("%s: shape %s, PyTorch's %s", what, zd_tensor_shape_str(got, a, sizeof a),
                 zd_tensor_shape_str(want, b, sizeof b));
    }
    const float *g = zd_tensor_data(got), *w = zd_tensor_data(want);
    double worst = 0;
    int64_t at = 0;
    for (int64_t i = 0; i < zd_tensor_numel(got); i++) {
        double d = fabs((double)g[i] - (double)w[i]);
        if (!(d <= worst)) {
            worst = d;
            at = i;
        }
    }
    printf("%s: largest difference from PyTorch's %.3g\n", what, worst);
    if (!(worst <= TOL))
        fail_msg("%s: element %lld is %.9g, PyTorch's %.9g", what, (long long)at, g[at], w[at]);
}

static void assert_equal_data(const zd_tensor_t *a, const zd_tensor_t *b, const char *what)
{
    assert_true(zd_tensor_same_shape(a, b));
    if (memcmp(zd_tensor_data(a), zd_tensor_data(b), zd_tensor_nbytes(a)) != 0)
        fail_msg("%s: not the file's values", what);
}

static void test_net_from_pytorch(void **state)
{
    (void)state;
    zd_nn_module_t *net = zd_nn_net_new(99);
    assert_non_null(net);
    zd_nn_module_t *m = net_module(net);
    zd_strings_t *skipped = NULL;
    if (zd_nn_module_load_safetensors(m, ref_path("net.safetensors"), true, &skipped) < 0)
        fail_msg("%s", zd_error_last());
    assert_int_equal(zd_strings_len(skipped), 0);
    zd_strings_free(skipped);
    zd_named_tensors_t *w = read_ref("net.safetensors");
    assert_int_equal(zd_named_tensors_len(w), 8);
    for (int i = 0; i < zd_nn_module_n_params(net); i++)
        assert_equal_data(zd_nn_module_param(net, i), find(w, zd_nn_module_param_name(net, i)),
                          zd_nn_module_param_name(net, i));
    zd_named_tensors_free(w);

    zd_named_tensors_t *io = read_ref("net_io.safetensors");
    zd_nn_module_train(net, false);
    bool prev = zd_autograd_set_grad_enabled(false);
    zd_tensor_t *lp;
    zd_tensor_t *x_in = find(io, "x");
    assert_int_equal(zd_nn_module_forward(net, &x_in, 1, &lp, 1), 0);
    zd_autograd_set_grad_enabled(prev);
    assert_close(lp, find(io, "logprobs"), "Net log-probabilities");
    zd_tensor_unref(lp);
    zd_named_tensors_free(io);
    zd_nn_module_free(m);
    zd_nn_module_free(net);
}

static void test_lstm_from_pytorch(void **state)
{
    (void)state;
    zd_nn_module_t *m = zd_nn_lstm_new(6, 12, 2, 0.2f, 99);
    assert_non_null(m);
    if (zd_nn_module_load_safetensors(m, ref_path("lstm.safetensors"), true, NULL) < 0)
        fail_msg("%s", zd_error_last());
    zd_named_tensors_t *io = read_ref("lstm_io.safetensors");
    zd_nn_module_train(m, false);
    bool prev = zd_autograd_set_grad_enabled(false);
    zd_tensor_t *outs[3];
    zd_tensor_t *in[3] = {find(io, "x"), find(io, "h0"), find(io, "c0")};
    assert_int_equal(zd_nn_module_forward(m, in, 3, outs, 3), 0);
    zd_tensor_t *out = outs[0], *h_n = outs[1], *c_n = outs[2];
    zd_autograd_set_grad_enabled(prev);
    assert_close(out, find(io, "out"), "LSTM out");
    assert_close(h_n, find(io, "h_n"), "LSTM h_n");
    assert_close(c_n, find(io, "c_n"), "LSTM c_n");
    zd_tensor_unref(out);
    zd_tensor_unref(h_n);
    zd_tensor_unref(c_n);
    zd_named_tensors_free(io);
    zd_nn_module_free(m);
}

static bool has_name(const zd_strings_t *names, const char *name)
{
    for (int i = 0; i < zd_strings_len(names); i++)
        if (strcmp(zd_strings_get(names, i), name) == 0)
            return true;
    return false;
}

static bool all_zero(const zd_tensor_t *t)
{
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        if (zd_tensor_data(t)[i] != 0)
            return false;
    return true;
}

static void expect_refused(zd_nn_module_t *m, const char *file, bool strict, const char *needle)
{
    zd_strings_t *skipped = (zd_strings_t *)&skipped;
    assert_int_equal(zd_nn_module_load_safetensors(m, ref_path(file), strict, &skipped), -1);
    assert_null(skipped);
    printf("refused: %s\n", zd_error_last());
    assert_contains(zd_error_last(), needle);
    assert_contains(zd_error_last(), file);
}

static void test_strict_and_not(void **state)
{
    (void)state;
    const char *net_file = "net.safetensors";

    /* Missing and extra tensors: the LSTM's names are not the Net's. */
    zd_nn_module_t *lm = zd_nn_lstm_new(6, 12, 2, 0, 5);
    assert_non_null(lm);
    zd_tensor_t *before = zd_tensor_detach_copy(zd_nn_module_param(lm, 0));
    expect_refused(lm, net_file, true, "no tensor \"weight_ih_l0\" in the file");
    zd_strings_t *skipped;
    assert_int_equal(zd_nn_module_load_safetensors(lm, ref_path(net_file), false, &skipped), 0);
    assert_int_equal(zd_strings_len(skipped), 16); /* the LSTM's 8, then the file's 8 */
    assert_string_equal(zd_strings_get(skipped, 0), "weight_ih_l0");
    assert_string_equal(zd_strings_get(skipped, 7), "bias_hh_l1");
    assert_true(has_name(skipped, "conv1.weight") && has_name(skipped, "fc2.bias"));
    zd_strings_free(skipped);
    assert_equal_data(zd_nn_module_param(lm, 0), before, "weight_ih_l0 left as it was");
    zd_tensor_unref(before);
    zd_nn_module_free(lm);

    /* An extra tensor: a model of conv1 only. Not strict, conv1 loads and
       the rest is named. */
    zd_nn_module_t *conv1 = zd_nn_module_new("Conv1Only", NULL, NULL, NULL);
    zd_nn_module_t *c = zd_nn_module_new("Conv2d", NULL, NULL, NULL);
    zd_tensor_t *w = zd_nn_module_add_parameter(c, "weight", (int64_t[]){32, 1, 3, 3}, 4);
    assert_non_null(zd_nn_module_add_parameter(c, "bias", (int64_t[]){32}, 1));
    assert_int_equal(zd_nn_module_register_module(conv1, "conv1", c), 0);
    expect_refused(conv1, net_file, true, "\"conv2.bias\" is not one of the model's");
    assert_true(all_zero(w));
    assert_int_equal(zd_nn_module_load_safetensors(conv1, ref_path(net_file), false, &skipped), 0);
    assert_int_equal(zd_strings_len(skipped), 6);
    assert_true(has_name(skipped, "conv2.weight") && has_name(skipped, "fc1.bias") &&
                !has_name(skipped, "conv1.weight"));
    zd_strings_free(skipped);
    zd_named_tensors_t *ref = read_ref(net_file);
    assert_equal_data(w, find(ref, "conv1.weight"), "conv1.weight");
    zd_named_tensors_free(ref);
    /* No list wanted: loads the same. */
    assert_int_equal(zd_nn_module_load_safetensors(conv1, ref_path(net_file), false, NULL), 0);
    zd_nn_module_free(conv1);

    /* A tensor of another shape is refused in both modes, and nothing
       changes (conv1.weight, checked first, still zero). */
    zd_nn_module_t *bad = zd_nn_module_new("Bad", NULL, NULL, NULL);
    c = zd_nn_module_new("Conv2d", NULL, NULL, NULL);
    w = zd_nn_module_add_parameter(c, "weight", (int64_t[]){32, 1, 3, 3}, 4);
    assert_int_equal(zd_nn_module_register_module(bad, "conv1", c), 0);
    c = zd_nn_module_new("Linear", NULL, NULL, NULL);
    assert_non_null(zd_nn_module_add_parameter(c, "bias", (int64_t[]){5}, 1));
    assert_int_equal(zd_nn_module_register_module(bad, "fc2", c), 0);
    expect_refused(bad, net_file, false,
                   "\"fc2.bias\" is float32 (10), the model's is float32 (5)");
    expect_refused(bad, net_file, true, "\"fc2.bias\" is float32 (10)");
    assert_true(all_zero(w));
    zd_nn_module_free(bad);

    /* Files that are not there or not safetensors. */
    zd_nn_module_t *empty = zd_nn_module_new("Empty", NULL, NULL, NULL);
    assert_int_equal(
        zd_nn_module_load_safetensors(empty, tmp_path("none.safetensors"), false, NULL), -1);
    assert_contains(zd_error_last(), "none.safetensors");
    assert_int_equal(zd_nn_module_load_safetensors(NULL, ref_path(net_file), true, NULL), -1);
    zd_nn_module_free(empty);
}

/*  Fills t with normal(0, 1) values from r. */
static void fill_normal(zd_tensor_t *t, zd_rng_t *r)
{
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = zd_rng_normal(r, 0, 1);
}

/*  Runs safetensors_models_torch.py MODEL IO (see torch_script). */
static void torch_check(const char *model, const char *io)
{
    char args[1300], out[8192];
    snprintf(args, sizeof args, "%s %s", model, io);
    torch_script("safetensors_models_torch.py", args, out, sizeof out);
    assert_contains(out, "PyTorch's outputs equal zdist's");
}

/*  A Net trained by zdist (3 SGD steps, dropout on) goes to PyTorch. */
static void test_net_to_pytorch(void **state)
{
    (void)state;
    zd_rng_t r;
    zd_rng_seed(&r, 30);
    zd_nn_module_t *net = zd_nn_net_new(7);
    zd_nn_module_t *m = net_module(net);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.05);
    zd_tensor_t *params[8];
    for (int i = 0; i < 8; i++)
        params[i] = zd_nn_module_param(net, i);
    zd_optim_t *opt = zd_optim_new(&cfg, params, 8);
    assert_non_null(opt);
    zd_tensor_t *x = zd_tensor_new(ZD_FLOAT32, (int64_t[]){16, 1, 28, 28}, 4);
    zd_tensor_t *y = zd_tensor_new(ZD_INT64, (int64_t[]){16}, 1);
    for (int step = 0; step < 3; step++) {
        fill_normal(x, &r);
        for (int i = 0; i < 16; i++)
            zd_tensor_data_i64(y)[i] = (int64_t)zd_rng_below(&r, 10);
        zd_tensor_t *lp, *loss;
        assert_int_equal(zd_nn_module_forward(net, &x, 1, &lp, 1), 0);
        assert_int_equal(zd_nn_nll_loss(lp, y, &loss), 0);
        assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
        assert_int_equal(zd_optim_step_grad(opt), 0);
        zd_optim_zero_grad(opt, true);
        zd_tensor_unref(lp);
        zd_tensor_unref(loss);
    }
    zd_optim_free(opt);
    zd_tensor_unref(y);

    char model[600], io_path[600];
    snprintf(model, sizeof model, "%s", tmp_path("zdist_net.safetensors"));
    snprintf(io_path, sizeof io_path, "%s", tmp_path("zdist_net_io.safetensors"));
    zd_strings_t *meta = zd_strings_from((const char *const[]){"step", "3"}, 2);
    if (!meta || zd_nn_module_save_safetensors(m, model, meta) < 0)
        fail_msg("%s", zd_error_last());
    zd_strings_free(meta);

    zd_nn_module_train(net, false);
    bool prev = zd_autograd_set_grad_enabled(false);
    zd_tensor_t *test = zd_tensor_new(ZD_FLOAT32, (int64_t[]){64, 1, 28, 28}, 4), *lp;
    fill_normal(test, &r);
    assert_int_equal(zd_nn_module_forward(net, &test, 1, &lp, 1), 0);

    /* zdist reads its own file back: another Net gives the same outputs. */
    zd_nn_module_t *again = zd_nn_net_new(8);
    zd_nn_module_train(again, false);
    zd_nn_module_t *am = net_module(again);
    assert_int_equal(zd_nn_module_load_safetensors(am, model, true, NULL), 0);
    zd_tensor_t *lp2;
    assert_int_equal(zd_nn_module_forward(again, &test, 1, &lp2, 1), 0);
    assert_equal_data(lp2, lp, "the reloaded Net's log-probabilities");
    zd_autograd_set_grad_enabled(prev);
    zd_named_tensors_t *back = zd_safetensors_read(model, &meta);
    assert_non_null(back);
    assert_int_equal(zd_strings_len(meta), 2);
    assert_string_equal(zd_strings_value(meta, "step"), "3");
    zd_strings_free(meta);
    zd_named_tensors_free(back);

    zd_named_tensors_t *io = zd_named_tensors_new();
    assert_int_equal(zd_named_tensors_add(io, "x", test), 0);
    assert_int_equal(zd_named_tensors_add(io, "logprobs", lp), 0);
    assert_int_equal(zd_safetensors_write(io, io_path, NULL), 0);
    zd_named_tensors_free(io);
    zd_tensor_unref(lp);
    zd_tensor_unref(lp2);
    zd_tensor_unref(test);
    zd_tensor_unref(x);
    zd_nn_module_free(am);
    zd_nn_module_free(again);
    zd_nn_module_free(m);
    zd_nn_module_free(net);
    torch_check(model, io_path);
}

static int setup(void **state)
{
    (void)state;
    return tmpdir_setup("safetensors_models");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_net_from_pytorch),
        cmocka_unit_test(test_lstm_from_pytorch),
        cmocka_unit_test(test_strict_and_not),
        cmocka_unit_test(test_net_to_pytorch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
