/* SPDX-License-Identifier: MIT */
/*  Local optimizers: PyTorch's numbers from tests/golden (SGD, momentum,
    Adam on the net and convnet parameters), a double-precision reference of
    PyTorch's documented algorithms for every other option, argument checks,
    skipped parameters, .grad handling, the text form of configs, state
    export/import, and concurrent steps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/optim.h>
#include "tests/support/golden_cases.h"

#define RTOL 1e-4
#define ATOL 1e-5

/*  ---- golden cases (tools/golden_manifest.h, tests/support/golden_cases.h) ---- */

/*  The attribute's value; fails the test when it is absent. */
static double gattr(const golden_case_t *c, const char *key)
{
    double v = golden_attr(c, key, NAN);
    if (isnan(v))
        fail_msg("%s: no attribute %s", c->dir, key);
    return v;
}

/*  Compares the rows of `full` listed in e (all of it when e has no rows)
    with e's tensor; returns the largest |a-e| / (atol + rtol |e|). */
static double compare(const zd_tensor_t *full, const golden_entry_t *e, const char *what)
{
    int64_t row = zd_tensor_ndim(full) ? zd_tensor_numel(full) / zd_tensor_size(full, 0) : 1;
    int64_t n_rows = e->n_rows ? e->n_rows : zd_tensor_numel(full) / row;
    assert_int_equal(zd_tensor_numel(e->value), n_rows * row);
    double worst = 0;
    for (int64_t r = 0; r < n_rows; r++) {
        int64_t src = e->n_rows ? e->rows[r] : r;
        const float *a = zd_tensor_data(full) + src * row, *x = zd_tensor_data(e->value) + r * row;
        for (int64_t i = 0; i < row; i++) {
            double ratio = fabs((double)a[i] - x[i]) / (ATOL + RTOL * fabs((double)x[i]));
            if (ratio > 1)
                fail_msg("%s: row %lld element %lld: %.9g, PyTorch %.9g", what, (long long)src,
                         (long long)i, a[i], x[i]);
            worst = ratio > worst ? ratio : worst;
        }
    }
    return worst;
}

/*  Steps a copy of the case's parameters `steps` times with the stored
    gradients and checks "<prefix>.step<k>.<param>" after each step. */
static double golden_run(golden_case_t *c, const zd_optim_config_t *cfg, const char *prefix,
                         int steps, int *checked)
{
    zd_tensor_t *params[32], *grads[32];
    const golden_entry_t *pe[32];
    int np = 0;
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->entries[i].role, "param") != 0)
            continue;
        assert_true(np < 32);
        pe[np] = &c->entries[i];
        params[np] = zd_tensor_detach_copy(c->entries[i].value);
        const golden_entry_t *ge = golden_find(c, "grad", c->entries[i].name);
        assert_non_null(ge);
        /* A gradient stored for some rows only goes into those rows of a
           full-size gradient: every rule is elementwise. */
        grads[np] =
            zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(params[np]), zd_tensor_ndim(params[np]));
        int64_t row = zd_tensor_numel(params[np]) / zd_tensor_size(params[np], 0);
        int64_t n_rows = ge->n_rows ? ge->n_rows : zd_tensor_size(params[np], 0);
        assert_int_equal(zd_tensor_numel(ge->value), n_rows * row);
        for (int64_t r = 0; r < n_rows; r++)
            memcpy(zd_tensor_data(grads[np]) + (ge->n_rows ? ge->rows[r] : r) * row,
                   zd_tensor_data(ge->value) + r * row, (size_t)row * sizeof(float));
        np++;
    }
    assert_true(np > 0);
    zd_optim_t *opt = zd_optim_new(cfg, params, np);
    if (!opt)
        fail_msg("%s", zd_error_last());
    double worst = 0;
    for (int s = 1; s <= steps; s++) {
        assert_int_equal(zd_optim_step(opt, grads), 0);
        for (int i = 0; i < np; i++) {
            char name[200], what[1300];
            snprintf(name, sizeof name, "%s.step%d.%s", prefix, s, pe[i]->name);
            const golden_entry_t *oe = golden_find(c, "output", name);
            if (!oe)
                fail_msg("%s: no output %s", c->dir, name);
            snprintf(what, sizeof what, "%s %s", c->dir, name);
            double w = compare(params[i], oe, what);
            worst = w > worst ? w : worst;
            (*checked)++;
        }
    }
    zd_optim_free(opt);
    for (int i = 0; i < np; i++) {
        zd_tensor_unref(params[i]);
        zd_tensor_unref(grads[i]);
    }
    return worst;
}

/*  SGD, momentum and Adam from the case's parameters and gradients. */
static void golden_optim_case(golden_case_t *c, void *arg)
{
    (void)arg;
    int checked = 0;
    zd_optim_config_t sgd = zd_optim_sgd_defaults(gattr(c, "sgd_lr"));
    zd_optim_config_t mom = sgd;
    mom.momentum = gattr(c, "momentum");
    mom.weight_decay = gattr(c, "weight_decay");
    zd_optim_config_t adam = zd_optim_adam_defaults();
    adam.lr = gattr(c, "adam_lr");
    adam.beta1 = gattr(c, "adam_beta1");
    adam.beta2 = gattr(c, "adam_beta2");
    adam.eps = gattr(c, "adam_eps");
    double w1 = golden_run(c, &sgd, "sgd", 1, &checked);
    double w2 = golden_run(c, &mom, "momentum", 2, &checked);
    double w3 = golden_run(c, &adam, "adam", 2, &checked);
    print_message("%s (%s): %d tensors match; worst error %.2g (sgd), %.2g (momentum), "
                  "%.2g (adam) of the tolerance\n",
                  strrchr(c->dir, '/') + 1, c->kind, checked, w1, w2, w3);
    assert_true(checked >= 5 * 4);
}

static void test_golden_net_and_convnet(void **state)
{
    (void)state;
    int net = golden_each("net", golden_optim_case, NULL);
    if (net < 0)
        skip();
    int convnet = golden_each("convnet", golden_optim_case, NULL);
    assert_true(net + convnet > 0);
}

/*  ---- a double-precision reference of PyTorch's documented algorithms ---- */

#define RN 9

typedef struct {
    int step;
    bool started;
    double buf[RN], m[RN], v[RN], vmax[RN], sum[RN], sq[RN], gavg[RN];
} ref_t;

static void ref_init(const zd_optim_config_t *c, ref_t *r)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < RN; i++)
        r->sum[i] = c->initial_accumulator_value;
}

static void ref_step(const zd_optim_config_t *c, double *p, const double *grad, ref_t *r)
{
    r->step++;
    int t = r->step;
    for (int i = 0; i < RN; i++) {
        double g = c->maximize ? -grad[i] : grad[i];
        if (c->kind == ZD_OPTIM_ADAMW)
            p[i] *= 1 - c->lr * c->weight_decay;
        else if (c->weight_decay != 0)
            g += c->weight_decay * p[i];
        switch (c->kind) {
        case ZD_OPTIM_SGD:
            if (c->momentum != 0) {
                r->buf[i] = t > 1 ? c->momentum * r->buf[i] + (1 - c->dampening) * g : g;
                g = c->nesterov ? g + c->momentum * r->buf[i] : r->buf[i];
            }
            p[i] -= c->lr * g;
            break;
        case ZD_OPTIM_ADAM:
        case ZD_OPTIM_ADAMW: {
            r->m[i] = c->beta1 * r->m[i] + (1 - c->beta1) * g;
            r->v[i] = c->beta2 * r->v[i] + (1 - c->beta2) * g * g;
            r->vmax[i] = fmax(r->vmax[i], r->v[i]);
            double v = c->amsgrad ? r->vmax[i] : r->v[i];
            double denom = sqrt(v) / sqrt(1 - pow(c->beta2, t)) + c->eps;
            p[i] -= c->lr / (1 - pow(c->beta1, t)) * r->m[i] / denom;
            break;
        }
        case ZD_OPTIM_ADAGRAD: {
            double clr = c->lr / (1 + (t - 1) * c->lr_decay);
            r->sum[i] += g * g;
            p[i] -= clr * g / (sqrt(r->sum[i]) + c->eps);
            break;
        }
        case ZD_OPTIM_RMSPROP: {
            r->sq[i] = c->alpha * r->sq[i] + (1 - c->alpha) * g * g;
            double v = r->sq[i];
            if (c->centered) {
                r->gavg[i] = c->alpha * r->gavg[i] + (1 - c->alpha) * g;
                v -= r->gavg[i] * r->gavg[i];
            }
            double step = g / (sqrt(v) + c->eps);
            if (c->momentum > 0) {
                r->buf[i] = c->momentum * r->buf[i] + step;
                step = r->buf[i];
            }
            p[i] -= c->lr * step;
            break;
        }
        }
    }
}

/*  Gradients that change sign and size from step to step (step 2 is small,
    so AMSGrad's maximum differs from v). */
static double grad_at(int step, int i)
{
    double scale = step == 2 ? 0.05 : 1.0 + 0.5 * step;
    return scale * sin(1.3 * i + 0.7 * step + 0.1) + 0.01 * (i - 4);
}

static double param_at(int i)
{
    return 0.8 * cos(0.9 * i) - 0.2;
}

/*  Runs cfg for 3 steps against the reference; the parameters must move. */
static void check_against_reference(const char *label, zd_optim_config_t cfg)
{
    if (zd_optim_config_check(&cfg) < 0)
        fail_msg("%s: %s", label, zd_error_last());
    int64_t n = RN;
    zd_tensor_t *p = zd_tensor_zeros1(n), *g = zd_tensor_zeros1(n);
    double ref[RN];
    for (int i = 0; i < RN; i++)
        zd_tensor_data(p)[i] = (float)(ref[i] = param_at(i));
    ref_t r;
    ref_init(&cfg, &r);
    zd_optim_t *opt = zd_optim_new(&cfg, &p, 1);
    assert_non_null(opt);
    double moved = 0;
    for (int s = 1; s <= 3; s++) {
        double gd[RN];
        for (int i = 0; i < RN; i++)
            zd_tensor_data(g)[i] = (float)(gd[i] = grad_at(s, i));
        assert_int_equal(zd_optim_step(opt, &g), 0);
        ref_step(&cfg, ref, gd, &r);
        for (int i = 0; i < RN; i++) {
            double a = zd_tensor_data(p)[i];
            if (fabs(a - ref[i]) > ATOL + RTOL * fabs(ref[i]))
                fail_msg("%s: step %d element %d: %.9g, reference %.9g", label, s, i, a, ref[i]);
            moved = fmax(moved, fabs(ref[i] - param_at(i)));
        }
    }
    if (moved < 1e-3)
        fail_msg("%s: parameters barely moved (%g): a weak test", label, moved);
    zd_optim_free(opt);
    zd_tensor_unref(p);
    zd_tensor_unref(g);
}

static void test_against_reference(void **state)
{
    (void)state;
    zd_optim_config_t c;

    c = zd_optim_sgd_defaults(0.1);
    check_against_reference("sgd", c);
    c.weight_decay = 0.05;
    check_against_reference("sgd weight decay", c);
    c.momentum = 0.9;
    check_against_reference("sgd momentum", c);
    c.dampening = 0.3;
    check_against_reference("sgd dampening", c);
    c.dampening = 0;
    c.nesterov = true;
    check_against_reference("sgd nesterov", c);
    c.maximize = true;
    check_against_reference("sgd nesterov maximize", c);

    c = zd_optim_adam_defaults();
    c.lr = 0.05;
    check_against_reference("adam", c);
    c.amsgrad = true;
    check_against_reference("adam amsgrad", c);
    c.weight_decay = 0.1;
    c.beta1 = 0.8;
    c.beta2 = 0.9;
    c.eps = 1e-3;
    check_against_reference("adam amsgrad weight decay", c);
    c.maximize = true;
    check_against_reference("adam maximize", c);

    c = zd_optim_adamw_defaults();
    c.lr = 0.05;
    check_against_reference("adamw", c);
    c.weight_decay = 0.5;
    c.amsgrad = true;
    check_against_reference("adamw amsgrad", c);

    c = zd_optim_adagrad_defaults();
    c.lr = 0.1;
    check_against_reference("adagrad", c);
    c.lr_decay = 0.2;
    c.weight_decay = 0.05;
    c.initial_accumulator_value = 0.3;
    c.eps = 1e-4;
    check_against_reference("adagrad decay, accumulator", c);

    c = zd_optim_rmsprop_defaults();
    check_against_reference("rmsprop", c);
    c.centered = true;
    check_against_reference("rmsprop centered", c);
    c.momentum = 0.6;
    check_against_reference("rmsprop centered momentum", c);
    c.centered = false;
    c.weight_decay = 0.02;
    c.alpha = 0.9;
    check_against_reference("rmsprop momentum weight decay", c);
    c.maximize = true;
    check_against_reference("rmsprop maximize", c);
}

static void test_defaults(void **state)
{
    (void)state;
    zd_optim_config_t c = zd_optim_sgd_defaults(0.5);
    assert_int_equal(c.kind, ZD_OPTIM_SGD);
    assert_true(c.lr == 0.5 && c.momentum == 0 && c.dampening == 0 && c.weight_decay == 0);
    assert_false(c.nesterov || c.maximize);
    c = zd_optim_adam_defaults();
    assert_true(c.lr == 1e-3 && c.beta1 == 0.9 && c.beta2 == 0.999 && c.eps == 1e-8);
    assert_true(c.weight_decay == 0 && !c.amsgrad);
    c = zd_optim_adamw_defaults();
    assert_true(c.kind == ZD_OPTIM_ADAMW && c.lr == 1e-3 && c.weight_decay == 1e-2);
    c = zd_optim_adagrad_defaults();
    assert_true(c.lr == 1e-2 && c.lr_decay == 0 && c.initial_accumulator_value == 0);
    assert_true(c.eps == 1e-10 && c.weight_decay == 0);
    c = zd_optim_rmsprop_defaults();
    assert_true(c.lr == 1e-2 && c.alpha == 0.99 && c.eps == 1e-8 && c.momentum == 0);
    assert_false(c.centered);
    c = zd_optim_defaults(ZD_OPTIM_SGD);
    assert_int_equal(zd_optim_config_check(&c), -1);
    assert_non_null(strstr(zd_error_last(), "lr is required"));
}

static void expect_invalid(zd_optim_config_t c, const char *msg)
{
    zd_tensor_t *p = zd_tensor_zeros1(2);
    assert_int_equal(zd_optim_config_check(&c), -1);
    assert_null(zd_optim_new(&c, &p, 1));
    if (!strstr(zd_error_last(), msg))
        fail_msg("error '%s' lacks '%s'", zd_error_last(), msg);
    zd_tensor_unref(p);
}

static void test_invalid_hyper_parameters(void **state)
{
    (void)state;
    zd_optim_config_t c = zd_optim_sgd_defaults(-0.1);
    expect_invalid(c, "SGD: Invalid learning rate: -0.1");
    c = zd_optim_sgd_defaults(0.1);
    c.nesterov = true;
    expect_invalid(c, "Nesterov momentum requires a momentum and zero dampening");
    c.momentum = 0.9;
    c.dampening = 0.1;
    expect_invalid(c, "Nesterov momentum requires a momentum and zero dampening");
    c = zd_optim_sgd_defaults(0.1);
    c.momentum = -1;
    expect_invalid(c, "Invalid momentum value: -1.0");
    c = zd_optim_sgd_defaults(NAN);
    expect_invalid(c, "lr is required");
    c = zd_optim_adam_defaults();
    c.beta1 = 1.0;
    expect_invalid(c, "Adam: Invalid beta parameter at index 0: 1.0");
    c = zd_optim_adamw_defaults();
    c.beta2 = -0.5;
    expect_invalid(c, "AdamW: Invalid beta parameter at index 1: -0.5");
    c = zd_optim_adam_defaults();
    c.eps = -1e-8;
    expect_invalid(c, "Invalid epsilon value: -1e-08");
    c.eps = 1e-8;
    c.weight_decay = -0.01;
    expect_invalid(c, "Invalid weight_decay value: -0.01");
    c = zd_optim_adagrad_defaults();
    c.lr_decay = -1;
    expect_invalid(c, "Adagrad: Invalid lr_decay value: -1.0");
    c = zd_optim_adagrad_defaults();
    c.initial_accumulator_value = -0.5;
    expect_invalid(c, "Invalid initial_accumulator_value value: -0.5");
    c = zd_optim_rmsprop_defaults();
    c.alpha = -0.1;
    expect_invalid(c, "RMSprop: Invalid alpha value: -0.1");
    c = zd_optim_rmsprop_defaults();
    c.momentum = -0.1;
    expect_invalid(c, "RMSprop: Invalid momentum value: -0.1");
    c.kind = (zd_optim_kind_t)42;
    expect_invalid(c, "unknown kind 42");
}

static void test_invalid_parameters(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_optim_config_t c = zd_optim_sgd_defaults(0.1);
    zd_tensor_t *a = zd_tensor_zeros1(3), *b = zd_tensor_zeros1(3);
    zd_tensor_t *i64 = zd_tensor_new(ZD_INT64, (int64_t[]){3}, 1);
    assert_null(zd_optim_new(&c, NULL, 0));
    assert_non_null(strstr(zd_error_last(), "optimizer got an empty parameter list"));
    assert_null(zd_optim_new(&c, (zd_tensor_t *[]){a, a}, 2));
    assert_non_null(strstr(zd_error_last(), "parameter 1 is the same tensor as parameter 0"));
    assert_null(zd_optim_new(&c, (zd_tensor_t *[]){a, i64}, 2));
    assert_non_null(strstr(zd_error_last(), "parameter 1 is int64"));
    assert_int_equal(zd_tensor_set_requires_grad(a, true), 0);
    zd_tensor_t *y;
    assert_int_equal(zd_tensor_scale(a, 2.0f, &y), 0);
    assert_null(zd_optim_new(&c, (zd_tensor_t *[]){b, y}, 2));
    assert_non_null(strstr(zd_error_last(), "can't optimize a non-leaf tensor (parameter 1)"));

    /* A gradient of the wrong shape: refused before anything moves. */
    zd_tensor_fill_(a, 1.0f);
    zd_tensor_fill_(b, 1.0f);
    zd_tensor_set_name(b, "fc.bias");
    zd_optim_t *opt = zd_optim_new(&c, (zd_tensor_t *[]){a, b}, 2);
    zd_tensor_t *g3 = zd_tensor_zeros1(3), *g4 = zd_tensor_zeros1(4);
    zd_tensor_fill_(g3, 1.0f);
    assert_int_equal(zd_optim_step(opt, (zd_tensor_t *[]){g3, g4}), -1);
    assert_non_null(strstr(zd_error_last(), "gradient of parameter 1 ('fc.bias') is float32 (4)"));
    assert_float_equal(zd_tensor_data(a)[0], 1.0f, 0);
    assert_int_equal(zd_optim_step(opt, (zd_tensor_t *[]){g3, i64}), -1);
    assert_non_null(strstr(zd_error_last(), "is int64 (3)"));
    zd_optim_free(opt);
    zd_tensor_unref(g3);
    zd_tensor_unref(g4);
    zd_tensor_unref(y);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    zd_tensor_unref(i64);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  A parameter without a gradient is skipped: it and its state stay as
    they are, so its own step count (Adam's bias correction) starts later. */
static void test_skipped_parameters(void **state)
{
    (void)state;
    zd_optim_config_t c = zd_optim_adam_defaults();
    c.lr = 0.1;
    zd_tensor_t *p[2] = {zd_tensor_zeros1(RN), zd_tensor_zeros1(RN)};
    zd_tensor_t *g = zd_tensor_zeros1(RN);
    double ref0[RN], ref1[RN], gd[RN];
    for (int i = 0; i < RN; i++) {
        zd_tensor_data(p[0])[i] = zd_tensor_data(p[1])[i] = (float)param_at(i);
        ref0[i] = ref1[i] = param_at(i);
        zd_tensor_data(g)[i] = (float)(gd[i] = grad_at(1, i));
    }
    ref_t r0, r1;
    ref_init(&c, &r0);
    ref_init(&c, &r1);
    zd_optim_t *opt = zd_optim_new(&c, p, 2);
    assert_int_equal(zd_optim_step(opt, (zd_tensor_t *[]){g, NULL}), 0);
    ref_step(&c, ref0, gd, &r0);
    for (int i = 0; i < RN; i++)
        assert_float_equal(zd_tensor_data(p[1])[i], (float)param_at(i), 0);
    assert_int_equal(zd_optim_step(opt, (zd_tensor_t *[]){g, g}), 0);
    ref_step(&c, ref0, gd, &r0);
    ref_step(&c, ref1, gd, &r1);
    for (int i = 0; i < RN; i++) {
        assert_true(fabs(zd_tensor_data(p[0])[i] - ref0[i]) <= ATOL + RTOL * fabs(ref0[i]));
        assert_true(fabs(zd_tensor_data(p[1])[i] - ref1[i]) <= ATOL + RTOL * fabs(ref1[i]));
    }
    /* The two parameters differ: one had two steps, the other one. */
    assert_true(fabs(ref0[0] - ref1[0]) > 1e-3);
    zd_optim_free(opt);
    zd_tensor_unref(p[0]);
    zd_tensor_unref(p[1]);
    zd_tensor_unref(g);
}

static void test_grad_field_and_zero_grad(void **state)
{
    (void)state;
    zd_optim_config_t c = zd_optim_sgd_defaults(0.5);
    c.weight_decay = 0.5;
    zd_tensor_t *p = zd_tensor_zeros1(2), *q = zd_tensor_zeros1(2), *g = zd_tensor_zeros1(2);
    zd_tensor_fill_(p, 1.0f);
    zd_tensor_fill_(q, 1.0f);
    zd_tensor_fill_(g, 2.0f);
    assert_int_equal(zd_tensor_set_requires_grad(p, true), 0);
    assert_int_equal(zd_tensor_set_requires_grad(q, true), 0);
    assert_int_equal(zd_tensor_accumulate_grad(p, g), 0);
    zd_optim_t *opt = zd_optim_new(&c, (zd_tensor_t *[]){p, q}, 2);
    /* p: 1 - 0.5 * (2 + 0.5 * 1) = -0.25; q has no .grad: untouched. */
    assert_int_equal(zd_optim_step_grad(opt), 0);
    assert_float_equal(zd_tensor_data(p)[0], -0.25f, 1e-7);
    assert_float_equal(zd_tensor_data(q)[0], 1.0f, 0);
    /* zero_grad keeping zeros (PyTorch 1.13's default): p is still stepped,
       by weight decay alone: -0.25 - 0.5 * 0.5 * -0.25 = -0.1875. */
    zd_optim_zero_grad(opt, false);
    zd_tensor_t *z = zd_tensor_grad(p);
    assert_non_null(z);
    assert_float_equal(zd_tensor_data(z)[1], 0.0f, 0);
    zd_tensor_unref(z);
    assert_int_equal(zd_optim_step_grad(opt), 0);
    assert_float_equal(zd_tensor_data(p)[0], -0.1875f, 1e-7);
    /* zero_grad(set_to_none): nothing to step. */
    zd_optim_zero_grad(opt, true);
    assert_null(zd_tensor_grad(p));
    assert_int_equal(zd_optim_step_grad(opt), 0);
    assert_float_equal(zd_tensor_data(p)[0], -0.1875f, 0);
    /* Steps are not recorded by autograd: p stays a leaf. */
    assert_true(zd_tensor_is_leaf(p));
    assert_null(zd_tensor_grad_fn(p));

    assert_int_equal(zd_optim_set_lr(opt, -1), -1);
    assert_int_equal(zd_optim_set_lr(opt, 0.25), 0);
    zd_optim_config_t now;
    assert_int_equal(zd_optim_config(opt, &now, sizeof now), 0);
    assert_true(now.lr == 0.25 && now.size == sizeof now);
    assert_int_equal(zd_optim_n_params(opt), 2);
    assert_ptr_equal(zd_optim_param(opt, 1), q);
    assert_null(zd_optim_param(opt, 2));
    zd_optim_free(opt);
    zd_tensor_unref(p);
    zd_tensor_unref(q);
    zd_tensor_unref(g);
}

/*  Field by field: the struct has padding. */
static bool config_equal(const zd_optim_config_t *a, const zd_optim_config_t *b)
{
    return a->size == b->size && a->kind == b->kind && a->lr == b->lr &&
        a->momentum == b->momentum && a->dampening == b->dampening &&
        a->weight_decay == b->weight_decay && a->beta1 == b->beta1 && a->beta2 == b->beta2 &&
        a->eps == b->eps && a->lr_decay == b->lr_decay &&
        a->initial_accumulator_value == b->initial_accumulator_value && a->alpha == b->alpha &&
        a->nesterov == b->nesterov && a->amsgrad == b->amsgrad && a->centered == b->centered &&
        a->maximize == b->maximize;
}

static void test_config_text(void **state)
{
    (void)state;
    zd_optim_config_t all[5] = {zd_optim_sgd_defaults(0.03), zd_optim_adam_defaults(),
                                zd_optim_adamw_defaults(), zd_optim_adagrad_defaults(),
                                zd_optim_rmsprop_defaults()};
    all[0].momentum = 0.9;
    all[0].weight_decay = 1e-4;
    all[0].nesterov = true;
    all[1].amsgrad = true;
    all[1].beta2 = 0.99;
    all[3].lr_decay = 1.0 / 3.0;
    all[4].centered = true;
    char buf[512];
    int n = zd_optim_config_format(&all[0], buf, sizeof buf);
    assert_string_equal(buf,
                        "sgd lr=0.03 momentum=0.9 dampening=0 weight_decay=0.0001 "
                        "nesterov=1 maximize=0");
    assert_int_equal(n, (int)strlen(buf));
    for (int k = 0; k < 5; k++) {
        n = zd_optim_config_format(&all[k], buf, sizeof buf);
        assert_int_equal(n, (int)strlen(buf));
        zd_optim_config_t back;
        if (zd_optim_config_parse(buf, &back, sizeof back) < 0)
            fail_msg("%s: %s", buf, zd_error_last());
        assert_true(config_equal(&back, &all[k]));
    }
    /* Too small a buffer: snprintf's contract. */
    char small[8];
    assert_int_equal(zd_optim_config_format(&all[1], small, sizeof small),
                     zd_optim_config_format(&all[1], NULL, 0));
    assert_string_equal(small, "adam lr");

    zd_optim_config_t c;
    assert_int_equal(zd_optim_config_parse("  RMSprop   momentum=0.5 centered=true ", &c, sizeof c),
                     0);
    assert_int_equal(c.kind, ZD_OPTIM_RMSPROP);
    assert_true(c.momentum == 0.5 && c.centered && c.lr == 1e-2 && c.alpha == 0.99);
    assert_int_equal(zd_optim_config_parse("sgd", &c, sizeof c), 0);
    assert_int_equal(zd_optim_config_check(&c), -1);
    assert_int_equal(zd_optim_config_parse("adam momentum=0.9", &c, sizeof c), -1);
    assert_non_null(strstr(zd_error_last(), "Adam has no 'momentum'"));
    assert_int_equal(zd_optim_config_parse("adam lr=fast", &c, sizeof c), -1);
    assert_non_null(strstr(zd_error_last(), "lr=fast is not a number"));
    assert_int_equal(zd_optim_config_parse("adam foo=1", &c, sizeof c), -1);
    assert_non_null(strstr(zd_error_last(), "unknown key 'foo'"));
    assert_int_equal(zd_optim_config_parse("adam amsgrad=maybe", &c, sizeof c), -1);
    assert_int_equal(zd_optim_config_parse("lbfgs", &c, sizeof c), -1);
    assert_non_null(strstr(zd_error_last(), "unknown kind 'lbfgs'"));
    assert_int_equal(zd_optim_config_parse("", &c, sizeof c), -1);
    zd_optim_kind_t k;
    assert_int_equal(zd_optim_kind_from_name("AdamW", &k), 0);
    assert_int_equal(k, ZD_OPTIM_ADAMW);
    assert_string_equal(zd_optim_kind_name(ZD_OPTIM_ADAGRAD), "adagrad");
}

/*  Imports the pairs (names[i], ts[i]) as a list. */
static int import(zd_optim_t *o, int n, const char *const *names, zd_tensor_t *const *ts)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    assert_non_null(nt);
    for (int i = 0; i < n; i++)
        assert_int_equal(zd_named_tensors_add(nt, names[i], ts[i]), 0);
    int rc = zd_optim_state_import(o, nt);
    zd_named_tensors_free(nt);
    return rc;
}

/*  Export after two steps, import into a fresh optimizer over copies of the
    parameters: both continue identically. */
static void check_resume(zd_optim_config_t c)
{
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *p = zd_tensor_zeros2(3, 3), *g = zd_tensor_zeros2(3, 3);
    for (int i = 0; i < 9; i++)
        zd_tensor_data(p)[i] = (float)param_at(i);
    zd_optim_t *a = zd_optim_new(&c, &p, 1);
    for (int s = 1; s <= 2; s++) {
        for (int i = 0; i < 9; i++)
            zd_tensor_data(g)[i] = (float)grad_at(s, i);
        assert_int_equal(zd_optim_step(a, &g), 0);
    }
    zd_named_tensors_t *st = zd_optim_state_export(a);
    assert_non_null(st);
    zd_tensor_t *q = zd_tensor_detach_copy(p);
    zd_optim_t *b = zd_optim_new(&c, &q, 1);
    assert_int_equal(zd_optim_state_import(b, st), 0);
    for (int i = 0; i < 9; i++)
        zd_tensor_data(g)[i] = (float)grad_at(3, i);
    assert_int_equal(zd_optim_step(a, &g), 0);
    assert_int_equal(zd_optim_step(b, &g), 0);
    assert_memory_equal(zd_tensor_data(p), zd_tensor_data(q), 9 * sizeof(float));
    zd_named_tensors_free(st);
    zd_optim_free(a);
    zd_optim_free(b);
    zd_tensor_unref(p);
    zd_tensor_unref(q);
    zd_tensor_unref(g);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  A config carries its size (docs/conventions.md): one that no
    *_defaults() function made is refused by every function taking one,
    naming the struct; one built against a newer header (a larger size) is
    read as far as this library's struct goes; the out-structs are written
    no further than the size passed. */
static void test_config_sizes(void **state)
{
    (void)state;
    zd_tensor_t *p = zd_tensor_zeros1(2);
    assert_int_equal(zd_tensor_set_requires_grad(p, true), 0);
    zd_optim_config_t c = zd_optim_adam_defaults();
    assert_int_equal(c.size, sizeof c);
    zd_optim_config_t zeroed = {.kind = ZD_OPTIM_SGD, .lr = 0.1};
    char buf[256];
    assert_null(zd_optim_new(&zeroed, &p, 1));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t.size is 0"));
    assert_non_null(strstr(zd_error_last(), "zd_optim_*_defaults()"));
    assert_int_equal(zd_optim_config_check(&zeroed), -1);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t.size is 0"));
    assert_int_equal(zd_optim_config_format(&zeroed, buf, sizeof buf), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zeroed.size = offsetof(zd_optim_config_t, maximize); /* short of the 1.0 fields */
    assert_int_equal(zd_optim_config_check(&zeroed), -1);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t.size is"));

    struct {
        zd_optim_config_t c;
        double newer;
    } big = {.c = zd_optim_sgd_defaults(0.5), .newer = 1.0};
    big.c.size = sizeof big;
    assert_int_equal(zd_optim_config_check(&big.c), 0);
    zd_optim_t *opt = zd_optim_new(&big.c, &p, 1);
    assert_non_null(opt);

    /* written no further than the size given */
    zd_optim_config_t out[2];
    memset(out, 0xA5, sizeof out);
    assert_int_equal(zd_optim_config(opt, &out[0], sizeof out[0]), 0);
    assert_true(out[0].size == sizeof out[0] && out[0].kind == ZD_OPTIM_SGD && out[0].lr == 0.5);
    assert_int_equal(((unsigned char *)&out[1])[0], 0xA5);
    assert_int_equal(zd_optim_config(opt, &out[0], 8), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t"));
    assert_int_equal(zd_optim_config_parse("adam", &out[0], 8), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t"));
    assert_int_equal(zd_optim_config_parse("adam lr=0.5", &out[0], sizeof out[0]), 0);
    assert_true(out[0].size == sizeof out[0] && out[0].kind == ZD_OPTIM_ADAM && out[0].lr == 0.5);
    zd_optim_free(opt);
    zd_tensor_unref(p);
}

static void test_state_export_import(void **state)
{
    (void)state;
    zd_optim_config_t c = zd_optim_sgd_defaults(0.1);
    c.momentum = 0.9;
    check_resume(c);
    c = zd_optim_adam_defaults();
    c.amsgrad = true;
    check_resume(c);
    check_resume(zd_optim_adamw_defaults());
    check_resume(zd_optim_adagrad_defaults());
    c = zd_optim_rmsprop_defaults();
    c.centered = true;
    c.momentum = 0.5;
    check_resume(c);

    /* The names are PyTorch's state keys. */
    c = zd_optim_adam_defaults();
    zd_tensor_t *p0 = zd_tensor_zeros1(2), *p = zd_tensor_zeros1(4), *g = zd_tensor_zeros1(4);
    zd_tensor_fill_(g, 0.5f);
    zd_optim_t *o = zd_optim_new(&c, (zd_tensor_t *[]){p0, p}, 2);
    zd_named_tensors_t *st = zd_optim_state_export(o);
    assert_non_null(st);
    assert_int_equal(zd_named_tensors_len(st), 0);
    zd_named_tensors_free(st);
    assert_int_equal(zd_optim_step(o, (zd_tensor_t *[]){NULL, g}), 0);
    st = zd_optim_state_export(o);
    assert_non_null(st);
    assert_int_equal(zd_named_tensors_len(st), 3);
    const char *names[3];
    zd_tensor_t *ts[3];
    for (int i = 0; i < 3; i++) {
        names[i] = zd_named_tensors_name(st, i);
        ts[i] = zd_named_tensors_tensor(st, i);
    }
    assert_string_equal(names[0], "1.exp_avg");
    assert_string_equal(names[1], "1.exp_avg_sq");
    assert_string_equal(names[2], "1.step");
    assert_int_equal(zd_tensor_data_i64(ts[2])[0], 1);

    /* Broken states are refused whole. */
    const char *bad_names[3] = {"1.exp_avg", "1.exp_avg_sq", "1.max_exp_avg_sq"};
    assert_int_equal(import(o, 3, bad_names, ts), -1);
    assert_non_null(strstr(zd_error_last(), "no state 'max_exp_avg_sq'"));
    assert_int_equal(import(o, 2, names, ts), -1);
    assert_non_null(strstr(zd_error_last(), "parameter 1 has some state but no '1.step'"));
    const char *far[1] = {"7.exp_avg"};
    assert_int_equal(import(o, 1, far, ts), -1);
    assert_non_null(strstr(zd_error_last(), "index below 2"));
    const char *twice[3] = {"1.exp_avg", "01.exp_avg", "1.step"};
    assert_int_equal(import(o, 3, twice, ts), -1);
    assert_non_null(strstr(zd_error_last(), "entry '01.exp_avg' given twice"));
    zd_tensor_t *wrong = zd_tensor_zeros1(5);
    assert_int_equal(import(o, 3, names, (zd_tensor_t *[]){wrong, ts[1], ts[2]}), -1);
    assert_non_null(
        strstr(zd_error_last(), "'1.exp_avg' is float32 (5), the parameter float32 (4)"));
    zd_tensor_unref(wrong);
    assert_int_equal(zd_optim_state_import(o, NULL), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    /* The refused imports left the state as it was. */
    zd_named_tensors_t *again = zd_optim_state_export(o);
    assert_non_null(again);
    assert_int_equal(zd_named_tensors_len(again), 3);
    assert_int_equal(zd_tensor_data_i64(zd_named_tensors_find(again, "1.step"))[0], 1);
    zd_named_tensors_free(again);
    /* An empty state is a fresh start. */
    assert_int_equal(import(o, 0, NULL, NULL), 0);
    zd_named_tensors_free(st);
    st = zd_optim_state_export(o);
    assert_non_null(st);
    assert_int_equal(zd_named_tensors_len(st), 0);
    zd_named_tensors_free(st);
    zd_optim_free(o);
    zd_tensor_unref(p0);
    zd_tensor_unref(p);
    zd_tensor_unref(g);
}

/*  Several threads stepping one optimizer: steps are serialised, none is
    lost. With lr 0.5 and gradient 1 every value stays exact. */
#define THREADS 4
#define ROUNDS  200

static zd_optim_t *shared_opt;
static zd_tensor_t *shared_grad;

static void *stepper(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++)
        if (zd_optim_step(shared_opt, &shared_grad) < 0)
            return (void *)1;
    return NULL;
}

static void test_concurrent_steps(void **state)
{
    (void)state;
    zd_optim_config_t c = zd_optim_sgd_defaults(0.5);
    zd_tensor_t *p = zd_tensor_zeros1(1000);
    shared_grad = zd_tensor_zeros1(1000);
    zd_tensor_fill_(shared_grad, 1.0f);
    shared_opt = zd_optim_new(&c, &p, 1);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, stepper, NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        assert_null(rc);
    }
    for (int i = 0; i < 1000; i++)
        assert_float_equal(zd_tensor_data(p)[i], -0.5f * THREADS * ROUNDS, 0);
    zd_optim_free(shared_opt);
    zd_tensor_unref(shared_grad);
    zd_tensor_unref(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_net_and_convnet),
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_invalid_hyper_parameters),
        cmocka_unit_test(test_invalid_parameters),
        cmocka_unit_test(test_skipped_parameters),
        cmocka_unit_test(test_grad_field_and_zero_grad),
        cmocka_unit_test(test_config_text),
        cmocka_unit_test(test_config_sizes),
        cmocka_unit_test(test_state_export_import),
        cmocka_unit_test(test_concurrent_steps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
