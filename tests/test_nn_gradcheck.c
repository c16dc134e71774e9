/* SPDX-License-Identifier: MIT */
/*  Finite-difference gradient checks of every nn op on random shapes:
    padding, stride, non-square and odd sizes, batches, overlapping pools,
    dropout with a fixed mask, the losses, and a whole model.

    For an op f and a fixed random r, L(inputs) = sum(f(inputs) * r) (in
    double). The analytic gradient comes from zd_autograd_backward(f, r); the
    numeric one from central differences (L(x+eps) - L(x-eps)) / 2eps with
    eps = 1e-2 in float32. Outputs not touched by a perturbation are
    bit-identical between the two evaluations, so the rounding noise stays
    around 1e-4; inputs of relu and max_pool keep clear of their kinks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/rng.h>

#define EPS 1e-2f
#define ATOL 2e-3
#define RTOL 1e-2
#define MAX_PROBES 48       /* numeric probes per input (random elements) */

typedef struct check check_t;
typedef int (fn_t)(check_t *c, zd_tensor_t **out);

struct check {
    const char *name;
    fn_t *fn;
    int n_in;
    zd_tensor_t *in[4];        /* float inputs; those requiring grad are checked */
    zd_tensor_t *target;       /* for losses */
    int stride, padding, kernel;
    float p;
    uint64_t mask_seed;
    zd_nn_model_t *model;
    float eps;              /* 0: EPS */
};

static zd_nn_rng_t rng;

static zd_tensor_t *randn(int ndim, const int64_t *shape, float scale)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, ndim, shape);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = zd_nn_rng_normal(&rng, 0.0f, scale);
    return t;
}

static zd_tensor_t *param(zd_tensor_t *t)
{
    assert_int_equal(zd_tensor_set_requires_grad(t, true), 0);
    return t;
}

static int rand_int(int lo, int hi)
{
    return lo + (int)zd_nn_rng_below(&rng, (uint64_t)(hi - lo + 1));
}

static double weighted_sum(zd_tensor_t *y, zd_tensor_t *r)
{
    double acc = 0;
    for (int64_t i = 0; i < zd_tensor_numel(y); i++)
        acc += (double)zd_tensor_data(y)[i] * zd_tensor_data(r)[i];
    return acc;
}

static double eval_loss(check_t *c, zd_tensor_t *r)
{
    zd_tensor_t *y;
    bool prev = zd_autograd_set_grad_enabled(false);
    if (c->fn(c, &y) < 0)
        fail_msg("%s: %s", c->name, zd_error_last());
    zd_autograd_set_grad_enabled(prev);
    double l = weighted_sum(y, r);
    zd_tensor_unref(y);
    return l;
}

static void gradcheck(check_t *c)
{
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *y;
    if (c->fn(c, &y) < 0)
        fail_msg("%s: %s", c->name, zd_error_last());
    zd_tensor_t *r = randn(zd_tensor_ndim(y), zd_tensor_shape(y), 1.0f);
    zd_tensor_t *r_grad = zd_tensor_detach_copy(r);
    if (zd_autograd_backward(y, r_grad, false) < 0)
        fail_msg("%s: backward: %s", c->name, zd_error_last());
    zd_tensor_unref(r_grad);
    zd_tensor_unref(y);

    zd_tensor_t *ins[8];
    int n = 0;
    for (int i = 0; i < c->n_in; i++)
        if (c->in[i] && zd_tensor_requires_grad(c->in[i]))
            ins[n++] = c->in[i];
    for (int i = 0; c->model && i < zd_nn_model_n_params(c->model); i++)
        ins[n++] = zd_nn_model_param(c->model, i);
    assert_true(n > 0);
    for (int i = 0; i < n; i++) {
        zd_tensor_t *g = zd_tensor_grad(ins[i]);
        if (!g)
            fail_msg("%s: input %d got no gradient", c->name, i);
        float *x = zd_tensor_data(ins[i]);
        int64_t numel = zd_tensor_numel(ins[i]);
        int probes = numel < MAX_PROBES ? (int)numel : MAX_PROBES;
        for (int k = 0; k < probes; k++) {
            int64_t j = numel <= MAX_PROBES ? k : (int64_t)zd_nn_rng_below(&rng, (uint64_t)numel);
            float keep = x[j];
            float eps = c->eps > 0 ? c->eps : EPS;
            x[j] = keep + eps;
            double lp = eval_loss(c, r);
            x[j] = keep - eps;
            double lm = eval_loss(c, r);
            x[j] = keep;
            double num = (lp - lm) / (2.0 * (double)eps), ana = zd_tensor_data(g)[j];
            if (!(fabs(num - ana) <= ATOL + RTOL * fabs(ana)))
                fail_msg("%s: d/d input%d[%lld]: analytic %.6g, numeric %.6g", c->name, i,
                         (long long)j, ana, num);
        }
        zd_tensor_clear_grad(ins[i]);
        zd_tensor_unref(g);
    }
    zd_tensor_unref(r);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void release(check_t *c)
{
    for (int i = 0; i < c->n_in; i++)
        zd_tensor_unref(c->in[i]);
    zd_tensor_unref(c->target);
}

/* ---- conv2d ---- */

static int fn_conv(check_t *c, zd_tensor_t **out)
{
    return zd_nn_conv2d(c->in[0], c->in[1], c->in[2], c->stride, c->padding, out);
}

static void conv_case(int N, int C, int H, int W, int O, int kh, int kw, int stride, int padding,
                      bool bias)
{
    char name[160];
    snprintf(name, sizeof name, "conv2d x(%d,%d,%d,%d) w(%d,%d,%d,%d) s%d p%d%s", N, C, H, W, O,
             C, kh, kw, stride, padding, bias ? "" : " no bias");
    check_t c = {.name = name, .fn = fn_conv, .n_in = 3, .stride = stride, .padding = padding};
    c.in[0] = param(randn(4, (int64_t[]){N, C, H, W}, 1.0f));
    c.in[1] = param(randn(4, (int64_t[]){O, C, kh, kw}, 0.5f));
    c.in[2] = bias ? param(randn(1, (int64_t[]){O}, 0.5f)) : NULL;
    gradcheck(&c);
    release(&c);
}

static void test_conv2d(void **state)
{
    (void)state;
    conv_case(2, 3, 7, 5, 4, 3, 3, 1, 0, true);      /* non-square */
    conv_case(2, 2, 6, 7, 3, 3, 3, 2, 1, true);      /* stride 2, padding */
    conv_case(1, 2, 5, 5, 2, 3, 2, 1, 2, false);     /* kernel 3x2, padding > 1 */
    conv_case(3, 4, 4, 3, 5, 1, 1, 1, 0, true);      /* pointwise */
    conv_case(1, 1, 2, 2, 2, 3, 3, 1, 1, true);      /* kernel larger than input */
    conv_case(2, 3, 9, 8, 2, 2, 3, 3, 1, true);      /* stride 3 */
    for (int t = 0; t < 6; t++) {
        int k = rand_int(1, 4), kw = rand_int(1, 4), s = rand_int(1, 3), p = rand_int(0, 2);
        int H = rand_int(k, 9), W = rand_int(kw, 9);
        conv_case(rand_int(1, 3), rand_int(1, 4), H, W, rand_int(1, 5), k, kw, s, p,
                  rand_int(0, 1));
    }
}

/* ---- linear ---- */

static int fn_linear(check_t *c, zd_tensor_t **out)
{
    return zd_nn_linear(c->in[0], c->in[1], c->in[2], out);
}

static void linear_case(int ndim, const int64_t *xshape, int out_f, bool bias)
{
    check_t c = {.name = "linear", .fn = fn_linear, .n_in = 3};
    c.in[0] = param(randn(ndim, xshape, 1.0f));
    c.in[1] = param(randn(2, (int64_t[]){out_f, xshape[ndim - 1]}, 0.5f));
    c.in[2] = bias ? param(randn(1, (int64_t[]){out_f}, 0.5f)) : NULL;
    gradcheck(&c);
    release(&c);
}

static void test_linear(void **state)
{
    (void)state;
    linear_case(2, (int64_t[]){4, 7}, 3, true);
    linear_case(2, (int64_t[]){1, 13}, 5, false);
    linear_case(3, (int64_t[]){2, 3, 5}, 4, true);     /* leading batch dims */
    for (int t = 0; t < 4; t++)
        linear_case(2, (int64_t[]){rand_int(1, 6), rand_int(1, 40)}, rand_int(1, 12), true);
}

/* ---- relu, max_pool2d: inputs away from the kinks ---- */

static int fn_relu(check_t *c, zd_tensor_t **out) { return zd_nn_relu(c->in[0], out); }

static void test_relu(void **state)
{
    (void)state;
    check_t c = {.name = "relu", .fn = fn_relu, .n_in = 1};
    c.in[0] = randn(3, (int64_t[]){3, 5, 7}, 1.0f);
    float *d = zd_tensor_data(c.in[0]);
    for (int64_t i = 0; i < zd_tensor_numel(c.in[0]); i++)
        d[i] = d[i] >= 0 ? d[i] + 0.05f : d[i] - 0.05f;
    param(c.in[0]);
    gradcheck(&c);
    release(&c);
}

static int fn_pool(check_t *c, zd_tensor_t **out)
{
    return zd_nn_max_pool2d(c->in[0], c->kernel, c->stride, out);
}

/*  Distinct values at least 0.05 apart, shuffled: no perturbation of EPS
    changes which element wins a window. */
static zd_tensor_t *spread(int ndim, const int64_t *shape)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, ndim, shape);
    int64_t n = zd_tensor_numel(t), perm[4096];
    assert_true(n <= 4096);
    zd_nn_rng_permutation(&rng, perm, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        zd_tensor_data(t)[i] = (float)(perm[i] - n / 2) * 0.05f;
    return t;
}

static void pool_case(int N, int C, int H, int W, int k, int s)
{
    char name[96];
    snprintf(name, sizeof name, "max_pool2d (%d,%d,%d,%d) k%d s%d", N, C, H, W, k, s);
    check_t c = {.name = name, .fn = fn_pool, .n_in = 1, .kernel = k, .stride = s};
    c.in[0] = param(spread(4, (int64_t[]){N, C, H, W}));
    gradcheck(&c);
    release(&c);
}

static void test_max_pool2d(void **state)
{
    (void)state;
    pool_case(2, 3, 6, 6, 2, 0);
    pool_case(1, 2, 7, 5, 2, 0);     /* odd sizes: trailing rows/cols dropped */
    pool_case(2, 2, 8, 9, 3, 0);
    pool_case(1, 3, 7, 7, 3, 2);     /* overlapping windows */
    pool_case(2, 1, 5, 6, 2, 1);
    for (int t = 0; t < 4; t++) {
        int k = rand_int(1, 3);
        pool_case(rand_int(1, 3), rand_int(1, 3), rand_int(k, 9), rand_int(k, 9), k,
                  rand_int(0, 3));
    }
}

/* ---- dropout with a fixed mask ---- */

static int fn_dropout(check_t *c, zd_tensor_t **out)
{
    zd_nn_rng_t r;
    zd_nn_rng_seed(&r, c->mask_seed);    /* the same mask on every evaluation */
    return c->kernel == 2 ? zd_nn_dropout2d(c->in[0], c->p, true, &r, out)
                          : zd_nn_dropout(c->in[0], c->p, true, &r, out);
}

static void test_dropout(void **state)
{
    (void)state;
    check_t c = {.name = "dropout", .fn = fn_dropout, .n_in = 1, .p = 0.4f, .mask_seed = 3};
    c.in[0] = param(randn(2, (int64_t[]){6, 9}, 1.0f));
    gradcheck(&c);
    release(&c);
    check_t d = {.name = "dropout2d", .fn = fn_dropout, .n_in = 1, .p = 0.3f, .mask_seed = 4,
                 .kernel = 2};
    d.in[0] = param(randn(4, (int64_t[]){3, 5, 3, 2}, 1.0f));
    gradcheck(&d);
    release(&d);
}

/* ---- flatten, log_softmax, losses ---- */

static int fn_flatten_scale(check_t *c, zd_tensor_t **out)
{
    zd_tensor_t *f;
    if (zd_nn_flatten(c->in[0], &f) < 0)
        return -1;
    int rc = zd_nn_linear(f, c->in[1], NULL, out);
    zd_tensor_unref(f);
    return rc;
}

static void test_flatten(void **state)
{
    (void)state;
    check_t c = {.name = "flatten+linear", .fn = fn_flatten_scale, .n_in = 2};
    c.in[0] = param(randn(4, (int64_t[]){2, 3, 2, 2}, 1.0f));
    c.in[1] = param(randn(2, (int64_t[]){3, 12}, 1.0f));
    gradcheck(&c);
    release(&c);
}

static int fn_log_softmax(check_t *c, zd_tensor_t **out)
{
    return zd_nn_log_softmax(c->in[0], 1, out);
}

static void test_log_softmax(void **state)
{
    (void)state;
    int64_t shapes[][2] = {{4, 10}, {3, 7}, {1, 1}, {5, 2}};
    for (size_t i = 0; i < 4; i++) {
        check_t c = {.name = "log_softmax", .fn = fn_log_softmax, .n_in = 1};
        c.in[0] = param(randn(2, shapes[i], 2.0f));
        gradcheck(&c);
        release(&c);
    }
}

static int fn_nll(check_t *c, zd_tensor_t **out) { return zd_nn_nll_loss(c->in[0], c->target, out); }
static int fn_ce(check_t *c, zd_tensor_t **out) { return zd_nn_cross_entropy(c->in[0], c->target, out); }

static zd_tensor_t *targets(zd_tensor_dtype_t dtype, int n, int classes)
{
    zd_tensor_t *t = zd_tensor_empty(dtype, 1, (int64_t[]){n});
    for (int i = 0; i < n; i++) {
        int64_t v = (int64_t)zd_nn_rng_below(&rng, (uint64_t)classes);
        if (dtype == ZD_INT64)
            zd_tensor_data_i64(t)[i] = v;
        else
            ((uint8_t *)zd_tensor_raw(t))[i] = (uint8_t)v;
    }
    return t;
}

static void test_losses(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        check_t c = {.name = k ? "nll_loss u8" : "nll_loss", .fn = fn_nll, .n_in = 1};
        c.in[0] = param(randn(2, (int64_t[]){5, 4}, 1.0f));
        c.target = targets(k ? ZD_UINT8 : ZD_INT64, 5, 4);
        gradcheck(&c);
        release(&c);
        check_t d = {.name = "cross_entropy", .fn = fn_ce, .n_in = 1};
        d.in[0] = param(randn(2, (int64_t[]){6, 3 + k * 7}, 2.0f));
        d.target = targets(k ? ZD_UINT8 : ZD_INT64, 6, 3 + k * 7);
        gradcheck(&d);
        release(&d);
    }
}

/* ---- a whole model ---- */

static int fn_model(check_t *c, zd_tensor_t **out)
{
    zd_tensor_t *lp;
    if (zd_nn_model_forward(c->model, c->in[0], &lp) < 0)
        return -1;
    int rc = zd_nn_nll_loss(lp, c->target, out);
    zd_tensor_unref(lp);
    return rc;
}

static void test_convnet_model(void **state)
{
    (void)state;
    /* max_pool and relu inside: a smaller step makes crossing a kink
       unlikely; the loss is one scalar, so rounding noise stays small. */
    check_t c = {.name = "convnet", .fn = fn_model, .n_in = 1, .eps = 1e-3f};
    c.model = zd_nn_convnet_new(21);
    zd_nn_model_train(c.model, false);
    c.in[0] = randn(4, (int64_t[]){2, 1, 28, 28}, 1.0f);
    c.target = targets(ZD_INT64, 2, 10);
    gradcheck(&c);
    release(&c);
    zd_nn_model_free(c.model);
}

int main(void)
{
    zd_nn_rng_seed(&rng, 20240601);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_relu),
        cmocka_unit_test(test_max_pool2d),
        cmocka_unit_test(test_dropout),
        cmocka_unit_test(test_flatten),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_losses),
        cmocka_unit_test(test_convnet_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
