/* SPDX-License-Identifier: MIT */
/*  gradcheck.c: the finite-difference gradient check of gradcheck.h. */
#include "tests/support/gradcheck.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>

#include <zdist/autograd.h>
#include <zdist/error.h>

static zd_rng_t rng;

void gradcheck_seed(uint64_t seed)
{
    zd_rng_seed(&rng, seed);
}

zd_rng_t *gradcheck_rng(void)
{
    return &rng;
}

zd_tensor_t *randn(int ndim, const int64_t *shape, float scale)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    assert_non_null(t);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = zd_rng_normal(&rng, 0.0f, scale);
    return t;
}

zd_tensor_t *leaf(zd_tensor_t *t)
{
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

/*  sum_k sum(outs_k * r_k) with gradients off. */
static double eval_loss(const gradcheck_t *g, zd_tensor_t *const *r, int n_out)
{
    zd_tensor_t *outs[GRADCHECK_MAX_OUT] = {NULL};
    bool prev = zd_autograd_set_grad_enabled(false);
    int n = g->fn(g->arg, outs);
    zd_autograd_set_grad_enabled(prev);
    if (n < 0)
        fail_msg("%s: %s", g->name, zd_error_last());
    if (n != n_out)
        fail_msg("%s: %d outputs, then %d", g->name, n_out, n);
    double l = 0;
    for (int k = 0; k < n; k++) {
        for (int64_t i = 0; i < zd_tensor_numel(outs[k]); i++)
            l += (double)zd_tensor_data(outs[k])[i] * zd_tensor_data(r[k])[i];
        zd_tensor_unref(outs[k]);
    }
    return l;
}

/*  Probes input i (x, its analytic gradient ga) element by element. */
static void check_input(const gradcheck_t *g, int i, zd_tensor_t *x, zd_tensor_t *ga,
                        zd_tensor_t *const *r, int n_out)
{
    const float eps = g->eps > 0 ? g->eps : GRADCHECK_EPS;
    const bool tol_given = g->atol > 0 || g->rtol > 0;
    const double atol = tol_given ? g->atol : GRADCHECK_ATOL;
    const double rtol = tol_given ? g->rtol : GRADCHECK_RTOL;
    const int64_t numel = zd_tensor_numel(x);
    const int64_t row = zd_tensor_ndim(x) ? numel / zd_tensor_size(x, 0) : 1;
    const bool all = g->max_probes <= 0 || numel <= g->max_probes;
    const int64_t probes = all ? numel : g->max_probes;
    float *p = zd_tensor_data(x);
    for (int64_t k = 0; k < probes; k++) {
        int64_t j = all ? k : (int64_t)zd_rng_below(&rng, (uint64_t)numel);
        double ana = zd_tensor_data(ga)[j];
        if (x == g->zero_row_of && j / row == g->zero_row) {
            if (ana != 0.0)
                fail_msg("%s: row %lld of input %d has gradient %g, expected 0", g->name,
                         (long long)g->zero_row, i, ana);
            continue;
        }
        float keep = p[j];
        p[j] = keep + eps;
        double lp = eval_loss(g, r, n_out);
        p[j] = keep - eps;
        double lm = eval_loss(g, r, n_out);
        p[j] = keep;
        double num = (lp - lm) / (2.0 * (double)eps);
        if (!(fabs(num - ana) <= atol + rtol * fabs(ana)))
            fail_msg("%s: d/d input%d[%lld]: analytic %.6g, numeric %.6g", g->name, i, (long long)j,
                     ana, num);
    }
}

void gradcheck(const gradcheck_t *g)
{
    const int64_t live = zd_tensor_live_count();
    zd_tensor_t *outs[GRADCHECK_MAX_OUT] = {NULL}, *r[GRADCHECK_MAX_OUT] = {NULL};
    int n_out = g->fn(g->arg, outs);
    if (n_out < 0)
        fail_msg("%s: %s", g->name, zd_error_last());
    assert_in_range(n_out, 1, GRADCHECK_MAX_OUT);
    /* The backward pass gets copies: r stays what the probes weigh by even
       if the engine hands a root's gradient on as a leaf's. */
    zd_autograd_root_t roots[GRADCHECK_MAX_OUT] = {{0}};
    for (int k = 0; k < n_out; k++) {
        r[k] = randn(zd_tensor_ndim(outs[k]), zd_tensor_shape(outs[k]), 1.0f);
        roots[k].tensor = outs[k];
        roots[k].grad = zd_tensor_detach_copy(r[k]);
    }
    if (zd_autograd_run(roots, n_out, NULL) < 0)
        fail_msg("%s: backward: %s", g->name, zd_error_last());
    for (int k = 0; k < n_out; k++) {
        zd_tensor_unref(roots[k].grad);
        zd_tensor_unref(outs[k]);
    }
    int checked = 0;
    for (int i = 0; i < g->n_inputs; i++) {
        zd_tensor_t *x = g->inputs[i];
        if (!x)
            continue;
        zd_tensor_t *ga = zd_tensor_grad(x);
        if (!zd_tensor_requires_grad(x)) {
            if (ga)
                fail_msg("%s: input %d requires no grad but got a gradient", g->name, i);
            continue;
        }
        if (!ga)
            fail_msg("%s: input %d got no gradient", g->name, i);
        assert_int_equal(zd_tensor_ndim(ga), zd_tensor_ndim(x));
        assert_true(zd_tensor_same_shape(ga, x));
        check_input(g, i, x, ga, r, n_out);
        checked++;
        zd_tensor_clear_grad(x);
        zd_tensor_unref(ga);
    }
    assert_true(checked > 0);
    for (int k = 0; k < n_out; k++)
        zd_tensor_unref(r[k]);
    assert_int_equal(zd_tensor_live_count(), live);
}
