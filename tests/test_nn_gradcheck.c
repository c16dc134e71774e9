/* SPDX-License-Identifier: MIT */
/*  Finite-difference gradient checks of every nn op on random shapes:
    padding, stride, non-square and odd sizes, batches, overlapping pools,
    dropout with a fixed mask, the losses, and a whole model.

    The check is tests/support/gradcheck.h's, on up to MAX_PROBES random
    elements of each input; inputs of relu and max_pool keep clear of their
    kinks. */
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

#include "tests/support/gradcheck.h"

#define MAX_PROBES 48 /* numeric probes per input (random elements) */
#define MAX_INPUTS 32

typedef struct check check_t;
typedef int(fn_t)(check_t *c, zd_tensor_t **out);

struct check {
    const char *name;
    fn_t *fn;
    int n_in;
    zd_tensor_t *in[4];  /* float inputs; those requiring grad are checked */
    zd_tensor_t *target; /* for losses */
    int stride, padding, kernel;
    float p;
    uint64_t mask_seed;
    zd_nn_module_t *model;
    float eps; /* 0: GRADCHECK_EPS */
};

static int rand_int(int lo, int hi)
{
    return lo + (int)zd_rng_below(gradcheck_rng(), (uint64_t)(hi - lo + 1));
}

static int run(void *arg, zd_tensor_t **outs)
{
    check_t *c = arg;
    return c->fn(c, &outs[0]) < 0 ? -1 : 1;
}

/*  The inputs, then the model's parameters. */
static void check(check_t *c)
{
    zd_tensor_t *ins[MAX_INPUTS];
    int n = 0;
    for (int i = 0; i < c->n_in; i++)
        ins[n++] = c->in[i];
    for (int i = 0; c->model && i < zd_nn_module_n_params(c->model); i++) {
        assert_true(n < MAX_INPUTS);
        ins[n++] = zd_nn_module_param(c->model, i);
    }
    gradcheck(&(gradcheck_t){.name = c->name,
                             .fn = run,
                             .arg = c,
                             .inputs = ins,
                             .n_inputs = n,
                             .eps = c->eps,
                             .max_probes = MAX_PROBES});
}

static void release(check_t *c)
{
    for (int i = 0; i < c->n_in; i++)
        zd_tensor_unref(c->in[i]);
    zd_tensor_unref(c->target);
}

/*  ---- conv2d ---- */

static int fn_conv(check_t *c, zd_tensor_t **out)
{
    return zd_nn_conv2d(c->in[0], c->in[1], c->in[2], c->stride, c->padding, out);
}

static void conv_case(int N, int C, int H, int W, int O, int kh, int kw, int stride, int padding,
                      bool bias)
{
    char name[160];
    snprintf(name, sizeof name, "conv2d x(%d,%d,%d,%d) w(%d,%d,%d,%d) s%d p%d%s", N, C, H, W, O, C,
             kh, kw, stride, padding, bias ? "" : " no bias");
    check_t c = {.name = name, .fn = fn_conv, .n_in = 3, .stride = stride, .padding = padding};
    c.in[0] = leaf(randn(4, (int64_t[]){N, C, H, W}, 1.0f));
    c.in[1] = leaf(randn(4, (int64_t[]){O, C, kh, kw}, 0.5f));
    c.in[2] = bias ? leaf(randn(1, (int64_t[]){O}, 0.5f)) : NULL;
    check(&c);
    release(&c);
}

static void test_conv2d(void **state)
{
    (void)state;
    conv_case(2, 3, 7, 5, 4, 3, 3, 1, 0, true);  /* non-square */
    conv_case(2, 2, 6, 7, 3, 3, 3, 2, 1, true);  /* stride 2, padding */
    conv_case(1, 2, 5, 5, 2, 3, 2, 1, 2, false); /* kernel 3x2, padding > 1 */
    conv_case(3, 4, 4, 3, 5, 1, 1, 1, 0, true);  /* pointwise */
    conv_case(1, 1, 2, 2, 2, 3, 3, 1, 1, true);  /* kernel larger than input */
    conv_case(2, 3, 9, 8, 2, 2, 3, 3, 1, true);  /* stride 3 */
    for (int t = 0; t < 6; t++) {
        int k = rand_int(1, 4), kw = rand_int(1, 4), s = rand_int(1, 3), p = rand_int(0, 2);
        int H = rand_int(k, 9), W = rand_int(kw, 9);
        conv_case(rand_int(1, 3), rand_int(1, 4), H, W, rand_int(1, 5), k, kw, s, p,
                  rand_int(0, 1));
    }
}

/*  ---- linear ---- */

static int fn_linear(check_t *c, zd_tensor_t **out)
{
    return zd_nn_linear(c->in[0], c->in[1], c->in[2], out);
}

static void linear_case(int ndim, const int64_t *xshape, int out_f, bool bias)
{
    check_t c = {.name = "linear", .fn = fn_linear, .n_in = 3};
    c.in[0] = leaf(randn(ndim, xshape, 1.0f));
    c.in[1] = leaf(randn(2, (int64_t[]){out_f, xshape[ndim - 1]}, 0.5f));
    c.in[2] = bias ? leaf(randn(1, (int64_t[]){out_f}, 0.5f)) : NULL;
    check(&c);
    release(&c);
}

static void test_linear(void **state)
{
    (void)state;
    linear_case(2, (int64_t[]){4, 7}, 3, true);
    linear_case(2, (int64_t[]){1, 13}, 5, false);
    linear_case(3, (int64_t[]){2, 3, 5}, 4, true); /* leading batch dims */
    for (int t = 0; t < 4; t++)
        linear_case(2, (int64_t[]){rand_int(1, 6), rand_int(1, 40)}, rand_int(1, 12), true);
}

/*  ---- relu, max_pool2d: inputs away from the kinks ---- */

static int fn_relu(check_t *c, zd_tensor_t **out)
{
    return zd_nn_relu(c->in[0], out);
}

static void test_relu(void **state)
{
    (void)state;
    check_t c = {.name = "relu", .fn = fn_relu, .n_in = 1};
    c.in[0] = randn(3, (int64_t[]){3, 5, 7}, 1.0f);
    float *d = zd_tensor_data(c.in[0]);
    for (int64_t i = 0; i < zd_tensor_numel(c.in[0]); i++)
        d[i] = d[i] >= 0 ? d[i] + 0.05f : d[i] - 0.05f;
    leaf(c.in[0]);
    check(&c);
    release(&c);
}

static int fn_pool(check_t *c, zd_tensor_t **out)
{
    return zd_nn_max_pool2d(c->in[0], c->kernel, c->stride, out);
}

/*  Distinct values at least 0.05 apart, shuffled: no perturbation of GRADCHECK_EPS
    changes which element wins a window. */
static zd_tensor_t *spread(int ndim, const int64_t *shape)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    int64_t n = zd_tensor_numel(t), perm[4096];
    assert_true(n <= 4096);
    zd_rng_permutation(gradcheck_rng(), perm, (size_t)n);
    for (int64_t i = 0; i < n; i++)
        zd_tensor_data(t)[i] = (float)(perm[i] - n / 2) * 0.05f;
    return t;
}

static void pool_case(int N, int C, int H, int W, int k, int s)
{
    char name[96];
    snprintf(name, sizeof name, "max_pool2d (%d,%d,%d,%d) k%d s%d", N, C, H, W, k, s);
    check_t c = {.name = name, .fn = fn_pool, .n_in = 1, .kernel = k, .stride = s};
    c.in[0] = leaf(spread(4, (int64_t[]){N, C, H, W}));
    check(&c);
    release(&c);
}

static void test_max_pool2d(void **state)
{
    (void)state;
    pool_case(2, 3, 6, 6, 2, 0);
    pool_case(1, 2, 7, 5, 2, 0); /* odd sizes: trailing rows/cols dropped */
    pool_case(2, 2, 8, 9, 3, 0);
    pool_case(1, 3, 7, 7, 3, 2); /* overlapping windows */
    pool_case(2, 1, 5, 6, 2, 1);
    for (int t = 0; t < 4; t++) {
        int k = rand_int(1, 3);
        pool_case(rand_int(1, 3), rand_int(1, 3), rand_int(k, 9), rand_int(k, 9), k,
                  rand_int(0, 3));
    }
}

/*  ---- dropout with a fixed mask ---- */

static int fn_dropout(check_t *c, zd_tensor_t **out)
{
    zd_rng_t r;
    zd_rng_seed(&r, c->mask_seed); /* the same mask on every evaluation */
    return c->kernel == 2 ? zd_nn_dropout2d(c->in[0], c->p, true, &r, out)
                          : zd_nn_dropout(c->in[0], c->p, true, &r, out);
}

static void test_dropout(void **state)
{
    (void)state;
    check_t c = {.name = "dropout", .fn = fn_dropout, .n_in = 1, .p = 0.4f, .mask_seed = 3};
    c.in[0] = leaf(randn(2, (int64_t[]){6, 9}, 1.0f));
    check(&c);
    release(&c);
    check_t d = {
        .name = "dropout2d", .fn = fn_dropout, .n_in = 1, .p = 0.3f, .mask_seed = 4, .kernel = 2};
    d.in[0] = leaf(randn(4, (int64_t[]){3, 5, 3, 2}, 1.0f));
    check(&d);
    release(&d);
}

/*  ---- flatten, log_softmax, losses ---- */

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
    c.in[0] = leaf(randn(4, (int64_t[]){2, 3, 2, 2}, 1.0f));
    c.in[1] = leaf(randn(2, (int64_t[]){3, 12}, 1.0f));
    check(&c);
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
        c.in[0] = leaf(randn(2, shapes[i], 2.0f));
        check(&c);
        release(&c);
    }
}

static int fn_nll(check_t *c, zd_tensor_t **out)
{
    return zd_nn_nll_loss(c->in[0], c->target, out);
}
static int fn_ce(check_t *c, zd_tensor_t **out)
{
    return zd_nn_cross_entropy(c->in[0], c->target, out);
}

static zd_tensor_t *targets(zd_tensor_dtype_t dtype, int n, int classes)
{
    zd_tensor_t *t = zd_tensor_empty(dtype, (int64_t[]){n}, 1);
    for (int i = 0; i < n; i++) {
        int64_t v = (int64_t)zd_rng_below(gradcheck_rng(), (uint64_t)classes);
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
        c.in[0] = leaf(randn(2, (int64_t[]){5, 4}, 1.0f));
        c.target = targets(k ? ZD_UINT8 : ZD_INT64, 5, 4);
        check(&c);
        release(&c);
        check_t d = {.name = "cross_entropy", .fn = fn_ce, .n_in = 1};
        d.in[0] = leaf(randn(2, (int64_t[]){6, 3 + k * 7}, 2.0f));
        d.target = targets(k ? ZD_UINT8 : ZD_INT64, 6, 3 + k * 7);
        check(&d);
        release(&d);
    }
}

/*  ---- a whole model ---- */

static int fn_model(check_t *c, zd_tensor_t **out)
{
    zd_tensor_t *lp;
    if (zd_nn_module_forward(c->model, &c->in[0], 1, &lp, 1) < 0)
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
    zd_nn_module_train(c.model, false);
    c.in[0] = randn(4, (int64_t[]){2, 1, 28, 28}, 1.0f);
    c.target = targets(ZD_INT64, 2, 10);
    check(&c);
    release(&c);
    zd_nn_module_free(c.model);
}

int main(void)
{
    gradcheck_seed(20240601);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv2d),        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_relu),          cmocka_unit_test(test_max_pool2d),
        cmocka_unit_test(test_dropout),       cmocka_unit_test(test_flatten),
        cmocka_unit_test(test_log_softmax),   cmocka_unit_test(test_losses),
        cmocka_unit_test(test_convnet_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
