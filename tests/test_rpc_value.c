/* SPDX-License-Identifier: MIT */
/*  RPC values: constructors, lists, zd__rpc_args, typed argument errors,
    equality, formatting and reference counts; local objects. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/value/codec.h"
#include <zdist/value.h>
#include "rpc/value/args.h"

/*  Stands in for the agent's RRefs: the value layer only counts references. */
typedef struct {
    atomic_int refs;
} fake_rref_t;

static void fake_ref(zd_rref_t *r)
{
    atomic_fetch_add(&((fake_rref_t *)r)->refs, 1);
}
static void fake_unref(zd_rref_t *r)
{
    atomic_fetch_sub(&((fake_rref_t *)r)->refs, 1);
}

static int setup(void **state)
{
    (void)state;
    zd__value_set_rref_hooks(fake_ref, fake_unref);
    return 0;
}

static zd_tensor_t *vec(int64_t n, const float *v)
{
    zd_tensor_t *t = zd_tensor_from_data(ZD_FLOAT32, &n, 1, v);
    assert_non_null(t);
    return t;
}

static void test_scalars(void **state)
{
    (void)state;
    zd_value_t *v = zd_value_int(-42);
    int64_t i = 0;
    double f = 0;
    assert_int_equal(zd_value_kind(v), ZD_VALUE_INT);
    assert_int_equal(zd_value_get_int(v, &i), 0);
    assert_int_equal(i, -42);
    assert_int_equal(zd_value_get_float(v, &f), 0); /* ints convert */
    assert_true(f == -42.0);
    zd_value_unref(v);

    v = zd_value_float(2.5);
    assert_int_equal(zd_value_get_float(v, &f), 0);
    assert_true(f == 2.5);
    assert_int_equal(zd_value_get_int(v, &i), -1); /* floats do not */
    assert_string_equal(zd_error_last(), "expected int, got float");
    zd_value_unref(v);

    v = zd_value_none();
    assert_int_equal(zd_value_kind(v), ZD_VALUE_NONE);
    assert_string_equal(zd_value_kind_name(zd_value_kind(v)), "none");
    zd_value_unref(v);
    assert_string_equal(zd_value_kind_name((zd_value_kind_t)99), "?");
}

static void test_strings_and_bytes_are_copied(void **state)
{
    (void)state;
    char text[] = "hello";
    zd_value_t *s = zd_value_string(text);
    text[0] = 'j';
    const char *got;
    assert_int_equal(zd_value_get_string(s, &got), 0);
    assert_string_equal(got, "hello");

    unsigned char raw[4] = {0, 1, 0, 255};
    zd_value_t *b = zd_value_bytes(raw, sizeof raw);
    raw[1] = 7;
    const void *data;
    size_t len;
    assert_int_equal(zd_value_get_bytes(b, &data, &len), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(data, ((unsigned char[]){0, 1, 0, 255}), 4);
    assert_int_equal(zd_value_get_string(b, &got), -1);
    assert_string_equal(zd_error_last(), "expected string, got bytes");

    zd_value_t *empty = zd_value_bytes(NULL, 0);
    assert_non_null(empty);
    assert_int_equal(zd_value_get_bytes(empty, &data, &len), 0);
    assert_int_equal(len, 0);

    assert_null(zd_value_string(NULL));
    assert_null(zd_value_bytes(NULL, 3));
    assert_null(zd__value_string_len("a\0b", 3));
    assert_non_null(strstr(zd_error_last(), "NUL"));
    zd_value_unref(s);
    zd_value_unref(b);
    zd_value_unref(empty);
}

static void test_tensor_values_hold_a_reference(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *t = vec(3, (float[]){1, 2, 3});
    zd_value_t *v = zd_value_tensor(t);
    zd_tensor_unref(t); /* the value keeps it alive */
    assert_int_equal(zd_tensor_live_count(), before + 1);
    zd_tensor_t *got = NULL;
    assert_int_equal(zd_value_get_tensor(v, &got), 0);
    assert_float_equal(zd_tensor_data(got)[2], 3, 0);
    zd_value_t *v2 = zd_value_ref(v);
    zd_value_unref(v);
    assert_int_equal(zd_tensor_live_count(), before + 1);
    zd_value_unref(v2);
    assert_int_equal(zd_tensor_live_count(), before);
    assert_null(zd_value_tensor(NULL));
}

static void test_rref_values_use_the_hooks(void **state)
{
    (void)state;
    fake_rref_t r = {1};
    zd_value_t *v = zd_value_rref((zd_rref_t *)&r);
    assert_int_equal(atomic_load(&r.refs), 2);
    zd_rref_t *got = NULL;
    assert_int_equal(zd_value_get_rref(v, &got), 0);
    assert_ptr_equal(got, &r);
    zd_value_unref(v);
    assert_int_equal(atomic_load(&r.refs), 1);

    /* adopt takes over the caller's reference instead of adding one */
    fake_ref((zd_rref_t *)&r);
    v = zd__value_rref_adopt((zd_rref_t *)&r);
    assert_int_equal(atomic_load(&r.refs), 2);
    zd_value_unref(v);
    assert_int_equal(atomic_load(&r.refs), 1);
    assert_null(zd_value_rref(NULL));
}

static void test_lists(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_value_t *l = zd_value_list(0);
    for (int i = 0; i < 100; i++) /* grows past any initial capacity */
        assert_int_equal(zd_list_append(l, zd_value_int(i)), 0);
    assert_int_equal(zd_list_len(l), 100);
    int64_t i = 0;
    assert_int_equal(zd_value_get_int(zd_list_get(l, 99), &i), 0);
    assert_int_equal(i, 99);
    assert_null(zd_list_get(l, 100));

    zd_value_t *inner = zd_value_list(2);
    zd_tensor_t *t = vec(2, (float[]){1, 2});
    assert_int_equal(zd_list_append(inner, zd_value_tensor(t)), 0);
    assert_int_equal(zd_list_append(l, inner), 0);
    assert_int_equal(zd_list_len(zd_list_get(l, 100)), 1);

    /* failures release the item they were given */
    zd_value_t *not_list = zd_value_int(1);
    assert_int_equal(zd_list_append(not_list, zd_value_tensor(t)), -1);
    assert_string_equal(zd_error_last(), "zd_list_append: expected list, got int");
    assert_int_equal(zd_list_len(not_list), 0);
    assert_null(zd_list_get(not_list, 0));
    assert_int_equal(zd_list_append(l, zd_value_ref(l)), -1);
    assert_non_null(strstr(zd_error_last(), "itself"));
    assert_int_equal(zd_list_append(l, NULL), -1);
    assert_int_equal(zd_list_len(l), 101);

    zd_tensor_unref(t);
    zd_value_unref(not_list);
    zd_value_unref(l);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_args_spec(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    fake_rref_t r = {1};
    zd_tensor_t *t = vec(1, (float[]){5});
    zd_value_t *args = zd__rpc_args("ifstrnbv", (int64_t)7, 0.25, "name", t, (zd_rref_t *)&r, "xyz",
                                    (size_t)2, zd_value_int(9));
    assert_non_null(args);
    assert_int_equal(zd_list_len(args), 8);
    int64_t i;
    double f;
    const char *s;
    zd_tensor_t *got_t;
    zd_rref_t *got_r;
    const void *data;
    size_t len;
    assert_int_equal(zd_rpc_arg_int(args, 0, &i), 0);
    assert_int_equal(i, 7);
    assert_int_equal(zd_rpc_arg_float(args, 1, &f), 0);
    assert_true(f == 0.25);
    assert_int_equal(zd_rpc_arg_float(args, 0, &f), 0); /* an int passes as float */
    assert_true(f == 7.0);
    assert_int_equal(zd_rpc_arg_string(args, 2, &s), 0);
    assert_string_equal(s, "name");
    assert_int_equal(zd_rpc_arg_tensor(args, 3, &got_t), 0);
    assert_ptr_equal(got_t, t);
    assert_int_equal(zd_rpc_arg_rref(args, 4, &got_r), 0);
    assert_ptr_equal(got_r, &r);
    assert_int_equal(atomic_load(&r.refs), 2);
    assert_int_equal(zd_value_kind(zd_list_get(args, 5)), ZD_VALUE_NONE);
    assert_int_equal(zd_rpc_arg_bytes(args, 6, &data, &len), 0);
    assert_int_equal(len, 2);
    assert_memory_equal(data, "xy", 2);
    assert_int_equal(zd_rpc_arg_int(args, 7, &i), 0);
    assert_int_equal(i, 9);

    /* typed errors name the argument */
    assert_int_equal(zd_rpc_arg_tensor(args, 0, &got_t), -1);
    assert_string_equal(zd_error_last(), "argument 0: expected tensor, got int");
    assert_int_equal(zd_rpc_arg_int(args, 3, &i), -1);
    assert_string_equal(zd_error_last(), "argument 3: expected int, got tensor");
    assert_int_equal(zd_rpc_arg_string(args, 8, &s), -1);
    assert_string_equal(zd_error_last(), "argument 8 missing (8 given)");
    assert_int_equal(zd_rpc_arg_int(zd_list_get(args, 0), 0, &i), -1);
    assert_string_equal(zd_error_last(), "arguments: expected list, got int");
    assert_int_equal(zd_rpc_arg_int(NULL, 0, &i), -1);

    zd_value_unref(args);
    zd_tensor_unref(t);
    assert_int_equal(atomic_load(&r.refs), 1);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_args_errors_release_taken_values(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *t = vec(1, (float[]){1});
    /* the NULL string fails; the 'v' holding a tensor after it is released */
    zd_value_t *args = zd__rpc_args("isv", (int64_t)1, (const char *)NULL, zd_value_tensor(t));
    assert_null(args);
    assert_non_null(strstr(zd_error_last(), "argument 1 ('s')"));
    assert_null(zd__rpc_args("tv", (zd_tensor_t *)NULL, zd_value_tensor(t)));
    assert_non_null(strstr(zd_error_last(), "argument 0 ('t')"));
    assert_null(zd__rpc_args("iv", (int64_t)1, (zd_value_t *)NULL));
    assert_null(zd__rpc_args("ix", (int64_t)1, 2));
    assert_string_equal(zd_error_last(), "zd__rpc_args: unknown letter 'x' in spec \"ix\"");
    assert_null(zd__rpc_args(NULL));
    zd_value_t *empty = zd__rpc_args("");
    assert_int_equal(zd_list_len(empty), 0);
    assert_int_equal(zd_value_kind(empty), ZD_VALUE_LIST);
    zd_value_unref(empty);
    zd_tensor_unref(t);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_equal_compares_deeply(void **state)
{
    (void)state;
    zd_tensor_t *a = vec(2, (float[]){1, 2});
    zd_tensor_t *b = vec(2, (float[]){1, 2});
    zd_tensor_t *c = vec(2, (float[]){1, 3});
    zd_value_t *x = zd__rpc_args("itsv", (int64_t)1, a, "s", zd__rpc_args("fn", NAN));
    zd_value_t *y = zd__rpc_args("itsv", (int64_t)1, b, "s", zd__rpc_args("fn", NAN));
    zd_value_t *z = zd__rpc_args("itsv", (int64_t)1, c, "s", zd__rpc_args("fn", NAN));
    zd_value_t *w = zd__rpc_args("itsv", (int64_t)1, b, "s", zd__rpc_args("f", NAN));
    assert_true(zd_value_equal(x, y)); /* tensors by content, NaN bit for bit */
    assert_false(zd_value_equal(x, z));
    assert_false(zd_value_equal(x, w));
    assert_true(zd_value_equal(NULL, NULL));
    assert_false(zd_value_equal(x, NULL));

    zd_value_t *p0 = zd_value_float(0.0), *n0 = zd_value_float(-0.0);
    assert_false(zd_value_equal(p0, n0));
    zd_value_t *i1 = zd_value_int(1), *f1 = zd_value_float(1.0);
    assert_false(zd_value_equal(i1, f1));
    zd_value_t *s1 = zd_value_string("ab"), *b1 = zd_value_bytes("ab", 2);
    assert_false(zd_value_equal(s1, b1));

    int64_t shape[2] = {1, 2};
    zd_tensor_t *d = zd_tensor_from_data(ZD_FLOAT32, shape, 2, (float[]){1, 2});
    zd_value_t *vd = zd_value_tensor(d), *va = zd_value_tensor(a);
    assert_false(zd_value_equal(vd, va)); /* same bytes, other shape */

    zd_value_t *vals[] = {x, y, z, w, p0, n0, i1, f1, s1, b1, vd, va};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++)
        zd_value_unref(vals[i]);
    zd_tensor_t *ts[] = {a, b, c, d};
    for (size_t i = 0; i < 4; i++)
        zd_tensor_unref(ts[i]);
}

static void test_format(void **state)
{
    (void)state;
    int64_t shape[2] = {2, 3};
    zd_tensor_t *t = zd_tensor_new(ZD_INT64, shape, 2);
    zd_value_t *v =
        zd__rpc_args("ifsbtnv", (int64_t)-3, 2.5, "a\"b\n", "xyz", (size_t)3, t, zd__rpc_args(""));
    char buf[256];
    assert_string_equal(zd_value_format(v, buf, sizeof buf),
                        "[-3, 2.5, \"a\\\"b\\x0a\", bytes(3), tensor int64 (2, 3), none, []]");
    char small[12];
    assert_string_equal(zd_value_format(v, small, sizeof small), "[-3, 2.5...");
    assert_string_equal(zd_value_format(NULL, buf, sizeof buf), "NULL");
    zd_value_unref(v);
    zd_tensor_unref(t);
}

/*  ---- objects ---- */

static int n_freed;
static void *last_freed;

static void count_free(void *p)
{
    n_freed++;
    last_freed = p;
}

static void test_object_values(void **state)
{
    (void)state;
    int server = 0, worker = 0;
    n_freed = 0;
    zd_value_t *v = zd_value_object(&server, count_free, "ParameterServer");
    assert_int_equal(zd_value_kind(v), ZD_VALUE_OBJECT);
    assert_string_equal(zd_value_kind_name(ZD_VALUE_OBJECT), "object");
    assert_string_equal(zd_value_object_type(v), "ParameterServer");
    void *p = NULL;
    assert_int_equal(zd_value_get_object(v, "ParameterServer", &p), 0);
    assert_ptr_equal(p, &server);
    char type[] = "ParameterServer"; /* types compare as strings */
    assert_int_equal(zd_value_get_object(v, type, &p), 0);
    assert_int_equal(zd_value_get_object(v, NULL, &p), 0); /* any type */
    assert_int_equal(zd_value_get_object(v, "DataWorker", &p), -1);
    assert_string_equal(zd_error_last(),
                        "expected a DataWorker object; this object is a ParameterServer");

    /* Other kinds are not objects. */
    zd_value_t *i = zd_value_int(1);
    assert_null(zd_value_object_type(i));
    assert_int_equal(zd_value_get_object(i, "DataWorker", &p), -1);
    assert_string_equal(zd_error_last(), "expected a DataWorker object, got int");
    assert_int_equal(zd_value_get_object(i, NULL, &p), -1);
    assert_string_equal(zd_error_last(), "expected an object, got int");
    assert_int_equal(zd_value_get_object(NULL, "DataWorker", &p), -1);
    assert_string_equal(zd_error_last(), "expected a DataWorker object, got NULL");

    /* Arguments: the index is named. */
    zd_value_t *args = zd__rpc_args("vv", zd_value_ref(v), zd_value_ref(i));
    assert_int_equal(zd_rpc_arg_object(args, 0, "ParameterServer", &p), 0);
    assert_ptr_equal(p, &server);
    assert_int_equal(zd_rpc_arg_object(args, 0, "DataWorker", &p), -1);
    assert_string_equal(zd_error_last(),
                        "argument 0: expected a DataWorker object; this object "
                        "is a ParameterServer");
    assert_int_equal(zd_rpc_arg_object(args, 1, "DataWorker", &p), -1);
    assert_string_equal(zd_error_last(), "argument 1: expected a DataWorker object, got int");
    assert_int_equal(zd_rpc_arg_object(args, 2, "DataWorker", &p), -1);
    assert_string_equal(zd_error_last(), "argument 2 missing (2 given)");

    /* Identity: the same pointer is the same object. */
    zd_value_t *same = zd_value_object(&server, NULL, "ParameterServer");
    zd_value_t *other = zd_value_object(&worker, NULL, "ParameterServer");
    assert_true(zd_value_equal(v, same));
    assert_false(zd_value_equal(v, other));
    assert_false(zd_value_equal(v, i));
    char buf[128], want[128];
    snprintf(want, sizeof want, "[ParameterServer@%p, 1]", (void *)&server);
    assert_string_equal(zd_value_format(args, buf, sizeof buf), want);

    /* free_fn runs once, when the last reference goes (here the list's). */
    zd_value_unref(same);
    zd_value_unref(other); /* no free_fn: nothing freed */
    zd_value_unref(v);
    assert_int_equal(n_freed, 0);
    zd_value_unref(args);
    assert_int_equal(n_freed, 1);
    assert_ptr_equal(last_freed, &server);
    zd_value_unref(i);

    /* A failed constructor frees the object itself. */
    assert_null(zd_value_object(&worker, count_free, NULL));
    assert_string_equal(zd_error_last(), "zd_value_object: NULL type");
    assert_int_equal(n_freed, 2);
    assert_ptr_equal(last_freed, &worker);
    assert_null(zd_value_object(NULL, count_free, "DataWorker"));
    assert_string_equal(zd_error_last(), "zd_value_object: NULL object");
    assert_int_equal(n_freed, 2);
}

typedef struct {
    zd_value_t *shared;
    int rounds;
} share_arg_t;

static void *share_thread(void *p)
{
    share_arg_t *a = p;
    for (int i = 0; i < a->rounds; i++) {
        zd_value_t *mine = zd_value_ref(a->shared);
        zd_value_t *l = zd_value_list(1);
        zd_list_append(l, mine); /* the list's release drops it again */
        zd_value_unref(l);
    }
    return NULL;
}

static void test_threads_share_values(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *t = vec(1, (float[]){1});
    share_arg_t arg = {zd_value_tensor(t), 20000};
    zd_tensor_unref(t);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, share_thread, &arg), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(zd_tensor_live_count(), before + 1);
    zd_value_unref(arg.shared);
    assert_int_equal(zd_tensor_live_count(), before);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars),
        cmocka_unit_test(test_strings_and_bytes_are_copied),
        cmocka_unit_test(test_tensor_values_hold_a_reference),
        cmocka_unit_test(test_rref_values_use_the_hooks),
        cmocka_unit_test(test_lists),
        cmocka_unit_test(test_args_spec),
        cmocka_unit_test(test_args_errors_release_taken_values),
        cmocka_unit_test(test_equal_compares_deeply),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_object_values),
        cmocka_unit_test(test_threads_share_values),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
