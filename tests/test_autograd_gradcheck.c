/* SPDX-License-Identifier: MIT */
/*  Finite-difference gradient checks of the tensor ops of autograd/ that
    are not layers: tanh, sigmoid, exp, log, permute, transpose, and add,
    sub, mul, div between shapes that broadcast; and their errors.

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
#include <zdist/rng.h>

#include "tests/support/gradcheck.h"

typedef struct check check_t;
typedef int(fn_t)(check_t *c, zd_tensor_t **out);

struct check {
    const char *name;
    fn_t *fn;
    int n_in;
    zd_tensor_t *in[2];
    int dims[ZD_TENSOR_MAX_DIMS]; /* permute; transpose uses dims[0..1] */
    int ndims;
};

/*  Values in [lo, hi) with a random sign: away from 0 for div and log. */
static zd_tensor_t *away_from_zero(int ndim, const int64_t *shape, float lo, float hi, bool sign)
{
    zd_rng_t *rng = gradcheck_rng();
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    assert_non_null(t);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++) {
        float v = zd_rng_uniform_range(rng, lo, hi);
        zd_tensor_data(t)[i] = sign && zd_rng_below(rng, 2) ? -v : v;
    }
    return t;
}

static int run(void *arg, zd_tensor_t **outs)
{
    check_t *c = arg;
    return c->fn(c, &outs[0]) < 0 ? -1 : 1;
}

/*  Every element of every input probed; inputs not requiring grad must
    get no gradient. */
static void check(check_t *c)
{
    gradcheck(
        &(gradcheck_t){.name = c->name, .fn = run, .arg = c, .inputs = c->in, .n_inputs = c->n_in});
}

static void release(check_t *c)
{
    for (int i = 0; i < c->n_in; i++)
        zd_tensor_unref(c->in[i]);
}

/*  ---- element-wise functions ---- */

static int fn_tanh(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_tanh(c->in[0], out);
}
static int fn_sigmoid(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_sigmoid(c->in[0], out);
}
static int fn_exp(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_exp(c->in[0], out);
}
static int fn_log(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_log(c->in[0], out);
}

static void unary_case(const char *name, fn_t *fn, zd_tensor_t *x)
{
    check_t c = {.name = name, .fn = fn, .n_in = 1, .in = {leaf(x)}};
    check(&c);
    release(&c);
}

static void test_unary(void **state)
{
    (void)state;
    unary_case("tanh", fn_tanh, randn(3, (int64_t[]){2, 3, 4}, 1.5f));
    unary_case("sigmoid", fn_sigmoid, randn(2, (int64_t[]){5, 3}, 2.0f));
    unary_case("exp", fn_exp, randn(1, (int64_t[]){7}, 1.0f));
    unary_case("log", fn_log, away_from_zero(2, (int64_t[]){4, 3}, 0.3f, 3.0f, false));
    unary_case("tanh of a scalar", fn_tanh, randn(0, NULL, 1.0f));
}

static void test_unary_values(void **state)
{
    (void)state;
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){4}, 1, (float[]){0, 1, -100, 100});
    zd_tensor_t *y;
    assert_int_equal(zd_tensor_sigmoid(x, &y), 0);
    assert_float_equal(zd_tensor_data(y)[0], 0.5, 1e-7);
    assert_float_equal(zd_tensor_data(y)[2], 0.0, 1e-30); /* no NaN from exp overflow */
    assert_float_equal(zd_tensor_data(y)[3], 1.0, 1e-7);
    zd_tensor_unref(y);
    assert_int_equal(zd_tensor_exp(x, &y), 0);
    assert_float_equal(zd_tensor_data(y)[1], M_E, 1e-6);
    zd_tensor_unref(y);
    assert_int_equal(zd_tensor_log(x, &y), 0);
    assert_true(isinf(zd_tensor_data(y)[0]) && zd_tensor_data(y)[0] < 0);
    assert_true(isnan(zd_tensor_data(y)[2]));
    zd_tensor_unref(y);
    zd_tensor_unref(x);
}

/*  ---- broadcasting binary ops ---- */

static int fn_add(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_add(c->in[0], c->in[1], out);
}
static int fn_sub(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_sub(c->in[0], c->in[1], out);
}
static int fn_mul(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_mul(c->in[0], c->in[1], out);
}
static int fn_div(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_div(c->in[0], c->in[1], out);
}

static const struct {
    const char *name;
    fn_t *fn;
} binops[] = {{"add", fn_add}, {"sub", fn_sub}, {"mul", fn_mul}, {"div", fn_div}};

/*  Every op over a (na dims) and b (nb dims); which: 1 a requires grad, 2
    b does, 3 both. */
static void binary_cases(int na, const int64_t *sa, int nb, const int64_t *sb, int which)
{
    for (size_t k = 0; k < 4; k++) {
        char name[128];
        snprintf(name, sizeof name, "%s, shapes of %d and %d dims, grads %d", binops[k].name, na,
                 nb, which);
        check_t c = {.name = name, .fn = binops[k].fn, .n_in = 2};
        c.in[0] = randn(na, sa, 1.0f);
        c.in[1] =
            binops[k].fn == fn_div ? away_from_zero(nb, sb, 0.5f, 2.0f, true) : randn(nb, sb, 1.0f);
        if (which & 1)
            leaf(c.in[0]);
        if (which & 2)
            leaf(c.in[1]);
        check(&c);
        release(&c);
    }
}

static void test_broadcast_gradients(void **state)
{
    (void)state;
    binary_cases(3, (int64_t[]){3, 1, 4}, 2, (int64_t[]){2, 4}, 3); /* (3,2,4) */
    binary_cases(2, (int64_t[]){2, 4}, 3, (int64_t[]){3, 1, 4}, 3); /* the other way round */
    binary_cases(2, (int64_t[]){2, 3}, 1, (int64_t[]){1}, 3);       /* scalar-like (1,) */
    binary_cases(1, (int64_t[]){1}, 2, (int64_t[]){2, 3}, 3);
    binary_cases(0, NULL, 2, (int64_t[]){2, 3}, 3);              /* a true scalar */
    binary_cases(2, (int64_t[]){4, 1}, 2, (int64_t[]){1, 5}, 3); /* both broadcast */
    binary_cases(4, (int64_t[]){2, 1, 3, 1}, 3, (int64_t[]){4, 1, 2}, 3);
    binary_cases(3, (int64_t[]){2, 3, 4}, 1, (int64_t[]){4}, 1);    /* only a needs grad */
    binary_cases(3, (int64_t[]){2, 3, 4}, 2, (int64_t[]){3, 1}, 2); /* only b */
    binary_cases(2, (int64_t[]){3, 2}, 2, (int64_t[]){3, 2}, 3);    /* same shape (div) */
}

static void test_broadcast_values(void **state)
{
    (void)state;
    zd_tensor_t *a = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){2, 1}, 2, (float[]){1, 2});
    zd_tensor_t *b = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){3}, 1, (float[]){10, 20, 40});
    zd_tensor_t *y;
    assert_int_equal(zd_tensor_sub(a, b, &y), 0);
    assert_int_equal(zd_tensor_ndim(y), 2);
    assert_int_equal(zd_tensor_size(y, 0), 2);
    assert_int_equal(zd_tensor_size(y, 1), 3);
    const float want_sub[] = {-9, -19, -39, -8, -18, -38};
    for (int i = 0; i < 6; i++)
        assert_float_equal(zd_tensor_data(y)[i], want_sub[i], 0);
    zd_tensor_unref(y);
    assert_int_equal(zd_tensor_div(b, a, &y), 0);
    const float want_div[] = {10, 20, 40, 5, 10, 20};
    for (int i = 0; i < 6; i++)
        assert_float_equal(zd_tensor_data(y)[i], want_div[i], 0);
    zd_tensor_unref(y);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
}

/*  ---- permute, transpose ---- */

static int fn_permute(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_permute(c->in[0], c->dims, c->ndims, out);
}

static int fn_transpose(check_t *c, zd_tensor_t **out)
{
    return zd_tensor_transpose(c->in[0], c->dims[0], c->dims[1], out);
}

/*  permute, then a broadcasting mul by a second input: the permuted
    result's gradient is not a plain reshape of the input's. */
static int fn_permute_mul(check_t *c, zd_tensor_t **out)
{
    zd_tensor_t *p;
    if (zd_tensor_permute(c->in[0], c->dims, c->ndims, &p) < 0)
        return -1;
    int rc = zd_tensor_mul(p, c->in[1], out);
    zd_tensor_unref(p);
    return rc;
}

static void permute_case(int nd, const int64_t *shape, const int *dims)
{
    check_t c = {.name = "permute", .fn = fn_permute, .n_in = 1, .ndims = nd};
    memcpy(c.dims, dims, sizeof(int) * (size_t)nd);
    c.in[0] = leaf(randn(nd, shape, 1.0f));
    check(&c);
    release(&c);
}

static void test_permute_gradients(void **state)
{
    (void)state;
    permute_case(3, (int64_t[]){2, 3, 4}, (int[]){2, 0, 1});
    permute_case(3, (int64_t[]){2, 3, 4}, (int[]){1, 2, 0});
    permute_case(3, (int64_t[]){2, 3, 4}, (int[]){0, 2, 1});
    permute_case(4, (int64_t[]){2, 3, 1, 5}, (int[]){3, 1, 0, 2});
    permute_case(4, (int64_t[]){3, 2, 2, 3}, (int[]){-1, 0, -2, 1}); /* negative dims */
    permute_case(2, (int64_t[]){3, 5}, (int[]){0, 1});               /* identity */
    check_t t = {.name = "transpose", .fn = fn_transpose, .n_in = 1, .dims = {0, 2}};
    t.in[0] = leaf(randn(3, (int64_t[]){2, 3, 4}, 1.0f));
    check(&t);
    t.dims[0] = -1;
    t.dims[1] = -2;
    check(&t);
    release(&t);
    check_t m = {
        .name = "permute then mul", .fn = fn_permute_mul, .n_in = 2, .ndims = 3, .dims = {2, 0, 1}};
    m.in[0] = leaf(randn(3, (int64_t[]){2, 3, 4}, 1.0f));
    m.in[1] = leaf(randn(2, (int64_t[]){1, 3}, 1.0f)); /* broadcast over (4,2,3) */
    check(&m);
    release(&m);
}

static void test_permute_values(void **state)
{
    (void)state;
    int64_t v[6] = {0, 1, 2, 3, 4, 5};
    zd_tensor_t *t = zd_tensor_from_data(ZD_INT64, (int64_t[]){2, 3}, 2, v), *y;
    assert_int_equal(zd_tensor_transpose(t, 0, 1, &y), 0); /* any dtype */
    assert_int_equal(zd_tensor_dtype(y), ZD_INT64);
    assert_int_equal(zd_tensor_size(y, 0), 3);
    const int64_t want[] = {0, 3, 1, 4, 2, 5};
    for (int i = 0; i < 6; i++)
        assert_int_equal(zd_tensor_data_i64(y)[i], want[i]);
    zd_tensor_unref(y);
    zd_tensor_unref(t);
}

/*  ---- errors ---- */

static void test_errors(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *a = zd_tensor_zeros2(3, 4), *b = zd_tensor_zeros2(2, 4), *y = (zd_tensor_t *)1;
    assert_int_equal(zd_tensor_add(a, b, &y), -1);
    assert_null(y);
    assert_non_null(strstr(zd_error_last(), "(3, 4) and (2, 4) do not broadcast"));
    assert_int_equal(zd_tensor_div(a, b, &y), -1);
    assert_non_null(strstr(zd_error_last(), "div:"));
    zd_tensor_t *c = zd_tensor_zeros1(3);
    assert_int_equal(zd_tensor_mul(a, c, &y), -1); /* (3,4) * (3): last dims 4, 3 */
    assert_non_null(strstr(zd_error_last(), "dimension 1: 4 and 3"));
    assert_int_equal(zd_tensor_permute(a, (int[]){0, 0}, 2, &y), -1);
    assert_null(y);
    assert_non_null(strstr(zd_error_last(), "not a permutation"));
    assert_int_equal(zd_tensor_permute(a, (int[]){0, 1, 2}, 3, &y), -1);
    assert_non_null(strstr(zd_error_last(), "3 dimensions given"));
    assert_int_equal(zd_tensor_permute(a, (int[]){0, 2}, 2, &y), -1);
    assert_non_null(strstr(zd_error_last(), "out of range"));
    assert_int_equal(zd_tensor_permute(a, NULL, 2, &y), -1);
    assert_int_equal(zd_tensor_transpose(a, 0, 2, &y), -1);
    assert_non_null(strstr(zd_error_last(), "out of range"));
    assert_int_equal(zd_tensor_transpose(a, -3, 0, &y), -1);
    zd_tensor_t *i = zd_tensor_new(ZD_INT64, (int64_t[]){2}, 1);
    assert_int_equal(zd_tensor_tanh(i, &y), -1);
    assert_non_null(strstr(zd_error_last(), "tanh: expected float32"));
    assert_int_equal(zd_tensor_add(a, i, &y), -1);
    assert_int_equal(zd_tensor_log(NULL, &y), -1);
    zd_tensor_unref(i);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    zd_tensor_unref(c);
    assert_int_equal(zd_tensor_live_count(), live);
}

int main(void)
{
    gradcheck_seed(20261125);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unary),
        cmocka_unit_test(test_unary_values),
        cmocka_unit_test(test_broadcast_gradients),
        cmocka_unit_test(test_broadcast_values),
        cmocka_unit_test(test_permute_gradients),
        cmocka_unit_test(test_permute_values),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
