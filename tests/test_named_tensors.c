/* SPDX-License-Identifier: MIT */
/*  zd_named_tensors_t: order, lookups, references held and dropped, the
    adds it refuses, and lists of many names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/named_tensors.h>

static void test_order_lookup_and_references(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_named_tensors_t *nt = zd_named_tensors_new();
    assert_non_null(nt);
    zd_tensor_t *w = zd_tensor_zeros2(3, 4), *b = zd_tensor_zeros1(3);
    char name[32];
    assert_int_equal(zd_named_tensors_add(nt, "fc.weight", w), 0);
    assert_int_equal(zd_named_tensors_add(nt, "fc.bias", b), 0);
    for (int i = 0; i < 20; i++) { /* past the first growth */
        snprintf(name, sizeof name, "extra.%d", i);
        assert_int_equal(zd_named_tensors_add(nt, name, b), 0);
    }
    zd_tensor_unref(w); /* the list holds its own references */
    zd_tensor_unref(b);
    assert_int_equal(zd_named_tensors_len(nt), 22);
    assert_string_equal(zd_named_tensors_name(nt, 0), "fc.weight");
    assert_string_equal(zd_named_tensors_name(nt, 21), "extra.19");
    assert_ptr_equal(zd_named_tensors_find(nt, "fc.bias"), zd_named_tensors_tensor(nt, 1));
    assert_int_equal(zd_named_tensors_index(nt, "extra.3"), 5);
    assert_int_equal(zd_tensor_size(zd_named_tensors_find(nt, "fc.weight"), 1), 4);
    assert_null(zd_named_tensors_find(nt, "nope"));
    assert_null(zd_named_tensors_name(nt, 22));
    assert_null(zd_named_tensors_tensor(nt, -1));
    zd_named_tensors_free(nt);
    assert_int_equal(zd_tensor_live_count(), before);
    zd_named_tensors_free(NULL);
    assert_int_equal(zd_named_tensors_len(NULL), 0);
}

static void test_refused_adds(void **state)
{
    (void)state;
    zd_named_tensors_t *nt = zd_named_tensors_new();
    zd_tensor_t *t = zd_tensor_zeros1(1);
    assert_int_equal(zd_named_tensors_add(nt, "a", t), 0);
    assert_int_equal(zd_named_tensors_add(nt, "a", t), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "\"a\" is there already"));
    assert_int_equal(zd_named_tensors_add(nt, "", t), -1);
    assert_int_equal(zd_named_tensors_add(nt, NULL, t), -1);
    assert_int_equal(zd_named_tensors_add(nt, "b", NULL), -1);
    assert_int_equal(zd_named_tensors_len(nt), 1);
    zd_tensor_unref(t);
    zd_named_tensors_free(nt);
}

/*  A file may name a million tensors: each add checks its name against the
    others through the index, not by walking the list (walking took about
    10^11 comparisons for these, past the test's timeout). */
static void test_many_names(void **state)
{
    (void)state;
    enum { N = 300000 };
    zd_named_tensors_t *nt = zd_named_tensors_new();
    zd_tensor_t *t = zd_tensor_zeros1(1);
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "layer.%d.weight", i);
        assert_int_equal(zd_named_tensors_add(nt, name, t), 0);
    }
    for (int i = 0; i < N; i += 997) {
        snprintf(name, sizeof name, "layer.%d.weight", i);
        assert_int_equal(zd_named_tensors_index(nt, name), i);
        assert_int_equal(zd_named_tensors_add(nt, name, t), -1);
    }
    assert_int_equal(zd_named_tensors_index(nt, "layer.300000.weight"), -1);
    assert_int_equal(zd_named_tensors_len(nt), N);
    zd_tensor_unref(t);
    zd_named_tensors_free(nt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_lookup_and_references),
        cmocka_unit_test(test_refused_adds),
        cmocka_unit_test(test_many_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
