/* SPDX-License-Identifier: MIT */
/*  nn models: the "net" and "convnet" golden cases (activations, log-probs,
    loss, every parameter gradient, one SGD step), the two-stage Net, train
    and eval modes, parameter names and shapes, initialisation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include "tests/support/golden_cases.h"

/*  ---- golden cases (tools/golden_manifest.h, tests/support/golden_cases.h) ---- */

/*  The case's tensor (borrowed from the case); fails the test when it has none. */
static zd_tensor_t *golden_borrow(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_tensor(c, role, name);
    if (!t)
        fail_msg("%s: no %s %s", c->dir, role, name);
    return t;
}

/*  The given rows of t (dim 0), as a new tensor. */
static zd_tensor_t *take_rows(zd_tensor_t *t, const int64_t *rows, int n)
{
    int64_t shape[8];
    memcpy(shape, zd_tensor_shape(t), sizeof(int64_t) * (size_t)zd_tensor_ndim(t));
    int64_t row = zd_tensor_numel(t) / shape[0];
    shape[0] = n;
    zd_tensor_t *r = zd_tensor_empty(ZD_FLOAT32, shape, zd_tensor_ndim(t));
    for (int i = 0; i < n; i++) {
        assert_in_range(rows[i], 0, zd_tensor_size(t, 0) - 1);
        memcpy(zd_tensor_data(r) + i * row, zd_tensor_data(t) + rows[i] * row,
               sizeof(float) * (size_t)row);
    }
    return r;
}

static zd_tensor_t *as_i64(zd_tensor_t *t8)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_INT64, zd_tensor_shape(t8), 1);
    for (int64_t i = 0; i < zd_tensor_numel(t8); i++)
        zd_tensor_data_i64(t)[i] = ((uint8_t *)zd_tensor_raw(t8))[i];
    return t;
}

/*  Copies every golden param into the model (names must all exist). */
static void load_params(const golden_case_t *c, zd_nn_module_t *m)
{
    int loaded = 0;
    for (int i = 0; i < c->n; i++) {
        const golden_entry_t *e = &c->entries[i];
        if (strcmp(e->role, "param") != 0)
            continue;
        zd_tensor_t *p = zd_nn_module_find(m, e->name);
        if (!p)
            fail_msg("%s: %s", c->dir, zd_error_last());
        assert_true(zd_tensor_same_shape(p, e->value));
        assert_int_equal(zd_tensor_copy_(p, e->value), 0);
        loaded++;
    }
    assert_int_equal(loaded, zd_nn_module_n_params(m));
}

/*  Compares every `grad` entry with the model's gradients (row subsets
    included). */
static void check_grads(const golden_case_t *c, zd_nn_module_t *m)
{
    int checked = 0;
    for (int i = 0; i < c->n; i++) {
        const golden_entry_t *e = &c->entries[i];
        if (strcmp(e->role, "grad") != 0)
            continue;
        zd_tensor_t *p = zd_nn_module_find(m, e->name);
        if (!p)
            fail_msg("%s: %s", c->dir, zd_error_last());
        zd_tensor_t *g = zd_tensor_grad(p);
        if (!g)
            fail_msg("%s: no gradient for %s", c->dir, e->name);
        zd_tensor_t *sel = e->n_rows ? take_rows(g, e->rows, e->n_rows) : zd_tensor_ref(g);
        golden_assert_close(e->name, c, sel, e->value);
        zd_tensor_unref(sel);
        zd_tensor_unref(g);
        checked++;
    }
    assert_int_equal(checked, zd_nn_module_n_params(m));
}

static void check_output(golden_case_t *c, const char *name, zd_tensor_t *actual)
{
    golden_assert_close(name, c, actual, golden_borrow(c, "output", name));
}

/*  The activations the README defines for each kind, recomputed from the
    ops on the loaded parameters. */
static void check_activations(golden_case_t *c, zd_nn_module_t *m, zd_tensor_t *x)
{
    zd_tensor_t *a = NULL, *b = NULL, *f = NULL;
    if (strcmp(c->kind, "net") == 0) {
        assert_int_equal(zd_nn_net_forward_conv(m, x, &f), 0);
        check_output(c, "act.flatten", f);
        assert_int_equal(zd_nn_linear(f, zd_nn_module_find(m, "fc1.weight"),
                                      zd_nn_module_find(m, "fc1.bias"), &a),
                         0);
        check_output(c, "act.fc1", a);
        assert_int_equal(zd_nn_relu(a, &b), 0);
        zd_tensor_unref(a);
        assert_int_equal(zd_nn_linear(b, zd_nn_module_find(m, "fc2.weight"),
                                      zd_nn_module_find(m, "fc2.bias"), &a),
                         0);
        check_output(c, "act.fc2", a);
    } else {
        zd_tensor_t *conv, *pool;
        assert_int_equal(zd_nn_conv2d(x, zd_nn_module_find(m, "conv1.weight"),
                                      zd_nn_module_find(m, "conv1.bias"), 1, 0, &conv),
                         0);
        check_output(c, "act.conv1", conv);
        assert_int_equal(zd_nn_max_pool2d(conv, 3, 3, &pool), 0);
        assert_int_equal(zd_nn_relu(pool, &b), 0);
        assert_int_equal(zd_nn_flatten(b, &f), 0);
        check_output(c, "act.flatten", f);
        assert_int_equal(
            zd_nn_linear(f, zd_nn_module_find(m, "fc.weight"), zd_nn_module_find(m, "fc.bias"), &a),
            0);
        check_output(c, "act.fc", a);
        zd_tensor_unref(pool);
        zd_tensor_unref(conv);
    }
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    zd_tensor_unref(f);
}

static void run_model_case(golden_case_t *c, void *arg)
{
    (void)arg;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = zd_nn_tutorial_model_new(c->kind, 1);
    assert_non_null(m);
    load_params(c, m);
    zd_nn_module_train(m, false);
    zd_tensor_t *x = golden_borrow(c, "input", "x");
    zd_tensor_t *t8 = golden_borrow(c, "input", "target"), *target = as_i64(t8);
    assert_int_equal(zd_tensor_size(x, 0), (int64_t)golden_attr(c, "batch", zd_tensor_size(x, 0)));

    bool prev = zd_autograd_set_grad_enabled(false);
    check_activations(c, m, x);
    zd_autograd_set_grad_enabled(prev);

    zd_tensor_t *lp, *loss, *loss1;
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &lp, 1), 0);
    check_output(c, "logprobs", lp);
    assert_int_equal(zd_nn_nll_loss(lp, target, &loss), 0);
    assert_int_equal(zd_tensor_reshape(loss, (int64_t[]){1}, 1, &loss1), 0);
    check_output(c, "loss", loss1);
    assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
    check_grads(c, m);

    /* One plain SGD step with the gradients just computed; the loss at the
       new parameters must match PyTorch's after the same step. */
    float lr = (float)golden_attr(c, "sgd_lr", 0.0);
    zd_tensor_t *after = golden_tensor(c, "output", "loss.after_sgd");
    if (after && lr > 0) {
        for (int i = 0; i < zd_nn_module_n_params(m); i++) {
            zd_tensor_t *p = zd_nn_module_param(m, i), *g = zd_tensor_grad(p);
            for (int64_t k = 0; k < zd_tensor_numel(p); k++)
                zd_tensor_data(p)[k] -= lr * zd_tensor_data(g)[k];
            zd_tensor_unref(g);
        }
        zd_tensor_t *lp2, *l2, *l21;
        prev = zd_autograd_set_grad_enabled(false);
        assert_int_equal(zd_nn_module_forward(m, &x, 1, &lp2, 1), 0);
        zd_autograd_set_grad_enabled(prev);
        assert_int_equal(zd_nn_nll_loss(lp2, t8, &l2), 0);
        assert_int_equal(zd_tensor_reshape(l2, (int64_t[]){1}, 1, &l21), 0);
        golden_assert_close("loss.after_sgd", c, l21, after);
        zd_tensor_unref(l21);
        zd_tensor_unref(l2);
        zd_tensor_unref(lp2);
    }
    zd_tensor_unref(loss1);
    zd_tensor_unref(loss);
    zd_tensor_unref(lp);
    zd_tensor_unref(target);
    zd_nn_module_free(m);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void run_kind(const char *kind)
{
    if (golden_each(kind, run_model_case, NULL) <= 0)
        fail_msg("no golden case of kind %s under %s", kind, golden_root());
}

static void test_golden_net(void **s)
{
    (void)s;
    run_kind("net");
}
static void test_golden_convnet(void **s)
{
    (void)s;
    run_kind("convnet");
}

/*  ---- structure ---- */

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
} param_spec_t;

static void check_params(zd_nn_module_t *m, const param_spec_t *spec, int n)
{
    assert_int_equal(zd_nn_module_n_params(m), n);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i);
        assert_string_equal(zd_nn_module_param_name(m, i), spec[i].name);
        assert_ptr_equal(zd_nn_module_find(m, spec[i].name), p);
        assert_int_equal(zd_nn_module_param_index(m, spec[i].name), i);
        assert_string_equal(zd_tensor_name(p), spec[i].name);
        assert_int_equal(zd_tensor_ndim(p), spec[i].ndim);
        for (int d = 0; d < spec[i].ndim; d++)
            assert_int_equal(zd_tensor_size(p, d), spec[i].shape[d]);
        assert_true(zd_tensor_requires_grad(p));
        assert_true(zd_tensor_is_leaf(p));
        total += zd_tensor_numel(p);
    }
    assert_int_equal(zd_nn_module_numel(m), total);
    assert_null(zd_nn_module_param(m, n));
    assert_null(zd_nn_module_param(m, -1));
    assert_null(zd_nn_module_find(m, "fc3.weight"));
    assert_non_null(strstr(zd_error_last(), "fc3.weight"));
}

static void test_named_parameters(void **state)
{
    (void)state;
    static const param_spec_t net[] = {
        {"conv1.weight", 4, {32, 1, 3, 3}},  {"conv1.bias", 1, {32}},
        {"conv2.weight", 4, {64, 32, 3, 3}}, {"conv2.bias", 1, {64}},
        {"fc1.weight", 2, {128, 9216}},      {"fc1.bias", 1, {128}},
        {"fc2.weight", 2, {10, 128}},        {"fc2.bias", 1, {10}},
    };
    static const param_spec_t convnet[] = {
        {"conv1.weight", 4, {3, 1, 3, 3}},
        {"conv1.bias", 1, {3}},
        {"fc.weight", 2, {10, 192}},
        {"fc.bias", 1, {10}},
    };
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = zd_nn_net_new(3);
    assert_string_equal(zd_nn_module_type(m), "Net");
    check_params(m, net, 8);
    assert_int_equal(zd_nn_module_numel(m), 1199882);
    zd_nn_module_free(m);
    m = zd_nn_tutorial_model_new("convnet", 3);
    assert_string_equal(zd_nn_module_type(m), "ConvNet");
    check_params(m, convnet, 4);
    zd_tensor_t *flat;
    zd_tensor_t *x = zd_tensor_zeros4(1, 1, 28, 28);
    assert_int_equal(zd_nn_net_forward_conv(m, x, &flat), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "ConvNet is not a Net"));
    assert_int_equal(zd_nn_net_seed_dropout(m, 5), 0);
    assert_int_equal(zd_nn_module_param_index(m, "fc.bias"), 3);
    assert_int_equal(zd_nn_module_param_index(m, "fc2.bias"), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_nn_module_free(m);
    /* A user's module called "Net" is not ours: its state is its own. */
    int user_state = 0;
    m = zd_nn_module_new("Net", NULL, &user_state, NULL);
    assert_int_equal(zd_nn_net_forward_conv(m, x, &flat), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(zd_nn_net_forward_fc(m, x, &flat), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(zd_nn_net_seed_dropout(m, 5), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(zd_nn_net_forward_conv(NULL, x, &flat), -1);
    zd_nn_module_free(m);
    assert_null(zd_nn_tutorial_model_new("resnet", 1));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "resnet"));
    m = zd_nn_tutorial_model_new("Net", 3);
    assert_string_equal(zd_nn_module_type(m), "Net");
    assert_string_equal(zd_nn_module_type(zd_nn_module_child(m, "fc1")), "Linear");
    assert_string_equal(zd_nn_module_type(zd_nn_module_child(m, "conv2")), "Conv2d");
    zd_nn_module_free(m);
    zd_tensor_unref(x);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_bad_input_is_refused(void **state)
{
    (void)state;
    zd_nn_module_t *m = zd_nn_net_new(1);
    zd_tensor_t *x = zd_tensor_zeros4(2, 1, 27, 28), *out;
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &out, 1), -1);
    assert_null(out);
    assert_non_null(strstr(zd_error_last(), "(2, 1, 27, 28)"));
    zd_tensor_t *flat = zd_tensor_zeros2(2, 100);
    assert_int_equal(zd_nn_net_forward_fc(m, flat, &out), -1);
    assert_non_null(strstr(zd_error_last(), "9216"));
    zd_tensor_unref(flat);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
}

/*  ---- modes ---- */

static zd_tensor_t *random_images(int n, uint64_t seed)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    zd_tensor_t *x = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){n, 1, 28, 28}, 4);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        zd_tensor_data(x)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    return x;
}

static bool same(zd_tensor_t *a, zd_tensor_t *b)
{
    return memcmp(zd_tensor_data(a), zd_tensor_data(b), zd_tensor_nbytes(a)) == 0;
}

static void test_train_and_eval_modes(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    bool prev = zd_autograd_set_grad_enabled(false);
    zd_tensor_t *x = random_images(3, 5), *e1, *e2, *t1, *t2, *t3, *flat, *two;
    zd_nn_module_t *m = zd_nn_net_new(9);
    assert_true(zd_nn_module_is_training(m)); /* as in PyTorch */
    assert_true(zd_nn_module_train(m, false));
    assert_false(zd_nn_module_is_training(m));
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &e1, 1), 0);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &e2, 1), 0);
    assert_true(same(e1, e2)); /* eval: deterministic */
    /* the two stages compose to the whole */
    assert_int_equal(zd_nn_net_forward_conv(m, x, &flat), 0);
    assert_int_equal(zd_nn_net_forward_fc(m, flat, &two), 0);
    assert_true(same(e1, two));

    zd_nn_module_train(m, true);
    zd_nn_net_seed_dropout(m, 77);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &t1, 1), 0);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &t2, 1), 0);
    zd_nn_net_seed_dropout(m, 77);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &t3, 1), 0);
    assert_false(same(t1, e1)); /* dropout is active */
    assert_false(same(t1, t2)); /* fresh masks each pass */
    assert_true(same(t1, t3));  /* reproducible by seed */
    zd_tensor_t *objs[] = {x, e1, e2, t1, t2, t3, flat, two};
    for (size_t i = 0; i < sizeof objs / sizeof *objs; i++)
        zd_tensor_unref(objs[i]);
    zd_nn_module_free(m);

    /* the convnet has no dropout: both modes agree */
    m = zd_nn_convnet_new(9);
    x = random_images(2, 6);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &t1, 1), 0);
    zd_nn_module_train(m, false);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &e1, 1), 0);
    assert_true(same(t1, e1));
    zd_tensor_unref(t1);
    zd_tensor_unref(e1);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    zd_autograd_set_grad_enabled(prev);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_training_step_records_graph(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = zd_nn_net_new(4);
    zd_tensor_t *x = random_images(2, 8), *lp, *loss;
    zd_tensor_t *t = zd_tensor_from_data(ZD_INT64, (int64_t[]){2}, 1, (int64_t[]){3, 7});
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &lp, 1), 0);
    assert_non_null(zd_tensor_grad_fn(lp));
    assert_int_equal(zd_nn_cross_entropy(lp, t, &loss), 0);
    assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
    for (int i = 0; i < zd_nn_module_n_params(m); i++) {
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_param(m, i));
        assert_non_null(g);
        zd_tensor_unref(g);
    }
    zd_nn_module_zero_grad(m);
    for (int i = 0; i < zd_nn_module_n_params(m); i++)
        assert_null(zd_tensor_grad(zd_nn_module_param(m, i)));
    zd_tensor_unref(loss);
    zd_tensor_unref(lp);
    zd_tensor_unref(t);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- threads and processes ---- */

static bool close_enough(zd_tensor_t *a, zd_tensor_t *b)
{
    for (int64_t i = 0; i < zd_tensor_numel(a); i++) {
        float x = zd_tensor_data(a)[i], y = zd_tensor_data(b)[i];
        if (!(fabsf(x - y) <= 1e-6f + 1e-5f * fabsf(y)))
            return false;
    }
    return zd_tensor_same_shape(a, b);
}

typedef struct {
    zd_nn_module_t *m;
    zd_tensor_t *x, *expect;
    int mismatches;
} fwd_arg_t;

static void *forward_loop(void *p)
{
    fwd_arg_t *a = p;
    for (int i = 0; i < 6; i++) {
        zd_tensor_t *lp;
        if (zd_nn_module_forward(a->m, &a->x, 1, &lp, 1) < 0 || !close_enough(lp, a->expect))
            a->mismatches++;
        zd_tensor_unref(lp);
    }
    return NULL;
}

/*  Forwards from several threads at once on one model: whoever does not
    get the thread pool runs on its own, with the same results. */
static void test_concurrent_forwards(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = zd_nn_net_new(12);
    zd_nn_module_train(m, false);
    zd_tensor_t *x = random_images(4, 13), *expect;
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &expect, 1), 0);
    fwd_arg_t args[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        args[i] = (fwd_arg_t){m, x, expect, 0};
        assert_int_equal(pthread_create(&t[i], NULL, forward_loop, &args[i]), 0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].mismatches, 0);
    }
    zd_tensor_unref(expect);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  A child forked after the thread pool started gets a working pool. */
static void test_forward_after_fork(void **state)
{
    (void)state;
    zd_nn_module_t *m = zd_nn_net_new(14);
    zd_nn_module_train(m, false);
    zd_tensor_t *x = random_images(4, 15), *expect;
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &expect, 1), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        zd_tensor_t *lp;
        int ok = zd_nn_module_forward(m, &x, 1, &lp, 1) == 0 && close_enough(lp, expect);
        _exit(ok ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    zd_tensor_unref(expect);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
}

/*  ---- initialisation ---- */

static void check_init_stats(zd_nn_module_t *m)
{
    for (int i = 0; i < zd_nn_module_n_params(m); i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i);
        /* a bias takes the bound of the weight before it */
        zd_tensor_t *w = zd_nn_module_param(m, i & ~1);
        double fan_in = (double)zd_tensor_numel(w) / (double)zd_tensor_size(w, 0);
        double bound = 1.0 / sqrt(fan_in);
        double sum = 0, sq = 0, mx = 0;
        const float *d = zd_tensor_data(p);
        int64_t n = zd_tensor_numel(p);
        for (int64_t k = 0; k < n; k++) {
            sum += d[k];
            sq += (double)d[k] * d[k];
            mx = fmax(mx, fabs(d[k]));
        }
        if (mx > bound)
            fail_msg("%s: |value| %g above the bound %g", zd_nn_module_param_name(m, i), mx, bound);
        if (n >= 1000) {
            /* uniform(-b, b): mean 0, variance b^2/3, largest value near b */
            double mean = sum / (double)n, var = sq / (double)n - mean * mean;
            double se = bound / sqrt(3.0 * (double)n);
            assert_true(fabs(mean) < 5 * se);
            assert_true(fabs(var / (bound * bound / 3.0) - 1.0) < 10.0 / sqrt((double)n));
            assert_true(mx > 0.99 * bound);
        }
    }
}

static void test_init(void **state)
{
    (void)state;
    zd_nn_module_t *a = zd_nn_net_new(123), *b = zd_nn_net_new(123), *c = zd_nn_net_new(124);
    check_init_stats(a);
    for (int i = 0; i < zd_nn_module_n_params(a); i++) {
        assert_true(same(zd_nn_module_param(a, i), zd_nn_module_param(b, i)));
        assert_false(same(zd_nn_module_param(a, i), zd_nn_module_param(c, i)));
    }
    zd_nn_module_t *d = zd_nn_convnet_new(5);
    check_init_stats(d);
    zd_nn_module_free(d);
    zd_nn_module_free(c);
    zd_nn_module_free(b);
    zd_nn_module_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_net),
        cmocka_unit_test(test_golden_convnet),
        cmocka_unit_test(test_named_parameters),
        cmocka_unit_test(test_bad_input_is_refused),
        cmocka_unit_test(test_train_and_eval_modes),
        cmocka_unit_test(test_training_step_records_graph),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_concurrent_forwards),
        cmocka_unit_test(test_forward_after_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
