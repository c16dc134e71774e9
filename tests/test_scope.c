/* SPDX-License-Identifier: MIT */
/*  Scopes for temporaries: add, end, nesting, keep (to the enclosing scope
    and back to the caller), per-thread, safe with autograd; every test
    ends with as many live tensors as it began with (and the sanitizer
    build checks for leaks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/scope.h>

static zd_tensor_t *vec(float a, float b, float c)
{
    float v[3] = {a, b, c};
    int64_t n = 3;
    return zd_tensor_from_data(ZD_FLOAT32, &n, 1, v);
}

static void test_add_and_end(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    assert_null(zd_scope_current());
    /* without a scope the reference is dropped, not leaked */
    assert_null(zd_scope_add(vec(1, 2, 3)));
    assert_non_null(strstr(zd_error_last(), "no scope is open"));
    assert_int_equal(zd_tensor_live_count(), live);
    assert_null(zd_scope_add(NULL));

    zd_scope_t *s = zd_scope_begin();
    assert_ptr_equal(zd_scope_current(), s);
    zd_tensor_t *a = zd_scope_add(vec(1, 2, 3)), *b = zd_scope_add(vec(4, 5, 6)), *c;
    assert_int_equal(zd_tensor_add(a, b, &c), 0);
    assert_ptr_equal(zd_scope_add(c), c);
    assert_true(zd_tensor_data(c)[2] == 9.0f);
    assert_int_equal(zd_scope_len(s), 3);
    assert_int_equal(zd_tensor_live_count(), live + 3);
    assert_int_equal(zd_scope_end(s), 0);
    assert_null(zd_scope_current());
    assert_int_equal(zd_tensor_live_count(), live);
    assert_int_equal(zd_scope_end(NULL), 0);
}

/*  h and the product are dropped at the end of the scope; the graph keeps
    what backward needs, so backward from the kept loss still works. */
static void test_autograd_after_the_scope(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *w = vec(0.5f, -1.0f, 2.0f), *loss = NULL;
    zd_tensor_set_requires_grad(w, true);
    zd_scope_t *s = zd_scope_begin();
    zd_tensor_t *x = zd_scope_add(vec(1, 2, 3)), *h, *p;
    assert_int_equal(zd_tensor_mul(x, w, &h), 0);
    zd_scope_add(h);
    assert_int_equal(zd_tensor_mul(h, h, &p), 0);
    zd_scope_add(p);
    assert_int_equal(zd_tensor_sum(p, &loss), 0);
    zd_scope_add(loss);
    assert_ptr_equal(zd_scope_keep(loss), loss); /* outermost: back to us */
    assert_int_equal(zd_scope_len(s), 3);
    assert_int_equal(zd_scope_end(s), 0);
    /* loss = sum((x w)^2): dL/dw = 2 x^2 w */
    assert_int_equal(zd_autograd_backward(loss, NULL, false), 0);
    zd_tensor_t *g = zd_tensor_grad(w);
    assert_true(zd_tensor_data(g)[0] == 2 * 1 * 1 * 0.5f);
    assert_true(zd_tensor_data(g)[1] == 2 * 2 * 2 * -1.0f);
    assert_true(zd_tensor_data(g)[2] == 2 * 3 * 3 * 2.0f);
    zd_tensor_unref(g);
    zd_tensor_unref(loss);
    zd_tensor_unref(w);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  A function that works in its own scope and returns its result into
    the caller's. */
static zd_tensor_t *layer(zd_tensor_t *x, zd_tensor_t *w)
{
    zd_scope_t *s = zd_scope_begin();
    zd_tensor_t *h, *y = NULL;
    if (zd_tensor_mul(x, w, &h) == 0 && zd_scope_add(h) && zd_nn_relu(h, &y) == 0 &&
        zd_scope_add(y))
        zd_scope_keep(y);
    else
        y = NULL;
    zd_scope_end(s);
    return y;
}

static void test_nesting_and_keep(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *w = vec(1, -1, 1);
    zd_scope_t *outer = zd_scope_begin();
    zd_tensor_t *x = zd_scope_add(vec(-1, -2, 3));
    zd_tensor_t *y = layer(x, w);
    assert_non_null(y);
    assert_true(zd_tensor_data(y)[0] == 0.0f && zd_tensor_data(y)[1] == 2.0f);
    assert_ptr_equal(zd_scope_current(), outer);
    assert_int_equal(zd_scope_len(outer), 2);           /* x and y */
    assert_int_equal(zd_tensor_live_count(), live + 3); /* and w */

    /* ending an outer scope ends the inner ones first */
    zd_scope_t *inner = zd_scope_begin(), *inner2 = zd_scope_begin();
    zd_scope_add(vec(0, 0, 0));
    zd_scope_add(vec(0, 0, 1));
    assert_ptr_equal(zd_scope_current(), inner2);
    assert_int_equal(zd_scope_end(inner), 0);
    assert_ptr_equal(zd_scope_current(), outer);
    assert_int_equal(zd_scope_end(inner), -1); /* already ended */
    assert_non_null(strstr(zd_error_last(), "not an open scope"));
    assert_int_equal(zd_tensor_live_count(), live + 3);

    /* keep of a tensor no scope holds changes nothing */
    assert_null(zd_scope_keep(w));
    assert_int_equal(zd_scope_len(outer), 2);
    assert_int_equal(zd_scope_end(outer), 0);
    zd_tensor_unref(w);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void *other_thread(void *arg)
{
    zd_scope_t *s = arg;
    /* scopes are per thread: not this one's to end, and none is open here */
    intptr_t ok = zd_scope_current() == NULL && zd_scope_end(s) == -1;
    zd_scope_t *mine = zd_scope_begin();
    ok = ok && zd_scope_add(vec(1, 1, 1)) && zd_scope_end(mine) == 0;
    return (void *)ok;
}

static void test_per_thread(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_scope_t *s = zd_scope_begin();
    zd_scope_add(vec(1, 2, 3));
    pthread_t th;
    void *ok;
    assert_int_equal(pthread_create(&th, NULL, other_thread, s), 0);
    pthread_join(th, &ok);
    assert_true(ok != NULL);
    assert_int_equal(zd_scope_len(s), 1);
    assert_int_equal(zd_scope_end(s), 0);
    assert_int_equal(zd_tensor_live_count(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_and_end),
        cmocka_unit_test(test_autograd_after_the_scope),
        cmocka_unit_test(test_nesting_and_keep),
        cmocka_unit_test(test_per_thread),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
