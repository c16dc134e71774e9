/*  RPC values: constructors, lists, rpc_args, typed argument errors,
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

#include "autograd/error.h"
#include "rpc/codec.h"
#include "rpc/value.h"

/* Stands in for the agent's RRefs: the value layer only counts references. */
typedef struct {
    atomic_int refs;
} fake_rref_t;

static void fake_ref(rpc_rref_t *r) { atomic_fetch_add(&((fake_rref_t *)r)->refs, 1); }
static void fake_unref(rpc_rref_t *r) { atomic_fetch_sub(&((fake_rref_t *)r)->refs, 1); }

static int setup(void **state)
{
    (void)state;
    rpc_value_set_rref_hooks(fake_ref, fake_unref);
    return 0;
}

static tensor_t *vec(int64_t n, const float *v)
{
    tensor_t *t = tensor_from_data(TENSOR_F32, 1, &n, v);
    assert_non_null(t);
    return t;
}

static void test_scalars(void **state)
{
    (void)state;
    rpc_value_t *v = rpc_value_int(-42);
    int64_t i = 0;
    double f = 0;
    assert_int_equal(rpc_value_kind(v), RPC_INT);
    assert_int_equal(rpc_value_get_int(v, &i), 0);
    assert_int_equal(i, -42);
    assert_int_equal(rpc_value_get_float(v, &f), 0);   /* ints convert */
    assert_true(f == -42.0);
    rpc_value_unref(v);

    v = rpc_value_float(2.5);
    assert_int_equal(rpc_value_get_float(v, &f), 0);
    assert_true(f == 2.5);
    assert_int_equal(rpc_value_get_int(v, &i), -1);   /* floats do not */
    assert_string_equal(error_last(), "expected int, got float");
    rpc_value_unref(v);

    v = rpc_value_none();
    assert_int_equal(rpc_value_kind(v), RPC_NONE);
    assert_string_equal(rpc_value_kind_name(rpc_value_kind(v)), "none");
    rpc_value_unref(v);
    assert_string_equal(rpc_value_kind_name((rpc_value_kind_t)99), "?");
}

static void test_strings_and_bytes_are_copied(void **state)
{
    (void)state;
    char text[] = "hello";
    rpc_value_t *s = rpc_value_string(text);
    text[0] = 'j';
    const char *got;
    assert_int_equal(rpc_value_get_string(s, &got), 0);
    assert_string_equal(got, "hello");

    unsigned char raw[4] = {0, 1, 0, 255};
    rpc_value_t *b = rpc_value_bytes(raw, sizeof raw);
    raw[1] = 7;
    const void *data;
    size_t len;
    assert_int_equal(rpc_value_get_bytes(b, &data, &len), 0);
    assert_int_equal(len, 4);
    assert_memory_equal(data, ((unsigned char[]){0, 1, 0, 255}), 4);
    assert_int_equal(rpc_value_get_string(b, &got), -1);
    assert_string_equal(error_last(), "expected string, got bytes");

    rpc_value_t *empty = rpc_value_bytes(NULL, 0);
    assert_non_null(empty);
    assert_int_equal(rpc_value_get_bytes(empty, &data, &len), 0);
    assert_int_equal(len, 0);

    assert_null(rpc_value_string(NULL));
    assert_null(rpc_value_bytes(NULL, 3));
    assert_null(rpc_value_string_len("a\0b", 3));
    assert_non_null(strstr(error_last(), "NUL"));
    rpc_value_unref(s);
    rpc_value_unref(b);
    rpc_value_unref(empty);
}

static void test_tensor_values_hold_a_reference(void **state)
{
    (void)state;
    int64_t before = tensor_live_count();
    tensor_t *t = vec(3, (float[]){1, 2, 3});
    rpc_value_t *v = rpc_value_tensor(t);
    tensor_unref(t);   /* the value keeps it alive */
    assert_int_equal(tensor_live_count(), before + 1);
    tensor_t *got = NULL;
    assert_int_equal(rpc_value_get_tensor(v, &got), 0);
    assert_float_equal(tensor_data(got)[2], 3, 0);
    rpc_value_t *v2 = rpc_value_ref(v);
    rpc_value_unref(v);
    assert_int_equal(tensor_live_count(), before + 1);
    rpc_value_unref(v2);
    assert_int_equal(tensor_live_count(), before);
    assert_null(rpc_value_tensor(NULL));
}

static void test_rref_values_use_the_hooks(void **state)
{
    (void)state;
    fake_rref_t r = {1};
    rpc_value_t *v = rpc_value_rref((rpc_rref_t *)&r);
    assert_int_equal(atomic_load(&r.refs), 2);
    rpc_rref_t *got = NULL;
    assert_int_equal(rpc_value_get_rref(v, &got), 0);
    assert_ptr_equal(got, &r);
    rpc_value_unref(v);
    assert_int_equal(atomic_load(&r.refs), 1);

    /* adopt takes over the caller's reference instead of adding one */
    fake_ref((rpc_rref_t *)&r);
    v = rpc_value_rref_adopt((rpc_rref_t *)&r);
    assert_int_equal(atomic_load(&r.refs), 2);
    rpc_value_unref(v);
    assert_int_equal(atomic_load(&r.refs), 1);
    assert_null(rpc_value_rref(NULL));
}

static void test_lists(void **state)
{
    (void)state;
    int64_t before = tensor_live_count();
    rpc_value_t *l = rpc_value_list(0);
    for (int i = 0; i < 100; i++)   /* grows past any initial capacity */
        assert_int_equal(rpc_list_append(l, rpc_value_int(i)), 0);
    assert_int_equal(rpc_list_len(l), 100);
    int64_t i = 0;
    assert_int_equal(rpc_value_get_int(rpc_list_get(l, 99), &i), 0);
    assert_int_equal(i, 99);
    assert_null(rpc_list_get(l, 100));

    rpc_value_t *inner = rpc_value_list(2);
    tensor_t *t = vec(2, (float[]){1, 2});
    assert_int_equal(rpc_list_append(inner, rpc_value_tensor(t)), 0);
    assert_int_equal(rpc_list_append(l, inner), 0);
    assert_int_equal(rpc_list_len(rpc_list_get(l, 100)), 1);

    /* failures release the item they were given */
    rpc_value_t *not_list = rpc_value_int(1);
    assert_int_equal(rpc_list_append(not_list, rpc_value_tensor(t)), -1);
    assert_string_equal(error_last(), "rpc_list_append: expected list, got int");
    assert_int_equal(rpc_list_len(not_list), 0);
    assert_null(rpc_list_get(not_list, 0));
    assert_int_equal(rpc_list_append(l, rpc_value_ref(l)), -1);
    assert_non_null(strstr(error_last(), "itself"));
    assert_int_equal(rpc_list_append(l, NULL), -1);
    assert_int_equal(rpc_list_len(l), 101);

    tensor_unref(t);
    rpc_value_unref(not_list);
    rpc_value_unref(l);
    assert_int_equal(tensor_live_count(), before);
}

static void test_args_spec(void **state)
{
    (void)state;
    int64_t before = tensor_live_count();
    fake_rref_t r = {1};
    tensor_t *t = vec(1, (float[]){5});
    rpc_value_t *args = rpc_args("ifstrnbv", (int64_t)7, 0.25, "name", t, (rpc_rref_t *)&r,
                                 "xyz", (size_t)2, rpc_value_int(9));
    assert_non_null(args);
    assert_int_equal(rpc_list_len(args), 8);
    int64_t i;
    double f;
    const char *s;
    tensor_t *got_t;
    rpc_rref_t *got_r;
    const void *data;
    size_t len;
    assert_int_equal(rpc_arg_int(args, 0, &i), 0);
    assert_int_equal(i, 7);
    assert_int_equal(rpc_arg_float(args, 1, &f), 0);
    assert_true(f == 0.25);
    assert_int_equal(rpc_arg_float(args, 0, &f), 0);   /* an int passes as float */
    assert_true(f == 7.0);
    assert_int_equal(rpc_arg_string(args, 2, &s), 0);
    assert_string_equal(s, "name");
    assert_int_equal(rpc_arg_tensor(args, 3, &got_t), 0);
    assert_ptr_equal(got_t, t);
    assert_int_equal(rpc_arg_rref(args, 4, &got_r), 0);
    assert_ptr_equal(got_r, &r);
    assert_int_equal(atomic_load(&r.refs), 2);
    assert_int_equal(rpc_value_kind(rpc_list_get(args, 5)), RPC_NONE);
    assert_int_equal(rpc_arg_bytes(args, 6, &data, &len), 0);
    assert_int_equal(len, 2);
    assert_memory_equal(data, "xy", 2);
    assert_int_equal(rpc_arg_int(args, 7, &i), 0);
    assert_int_equal(i, 9);

    /* typed errors name the argument */
    assert_int_equal(rpc_arg_tensor(args, 0, &got_t), -1);
    assert_string_equal(error_last(), "argument 0: expected tensor, got int");
    assert_int_equal(rpc_arg_int(args, 3, &i), -1);
    assert_string_equal(error_last(), "argument 3: expected int, got tensor");
    assert_int_equal(rpc_arg_string(args, 8, &s), -1);
    assert_string_equal(error_last(), "argument 8 missing (8 given)");
    assert_int_equal(rpc_arg_int(rpc_list_get(args, 0), 0, &i), -1);
    assert_string_equal(error_last(), "arguments: expected list, got int");
    assert_int_equal(rpc_arg_int(NULL, 0, &i), -1);

    rpc_value_unref(args);
    tensor_unref(t);
    assert_int_equal(atomic_load(&r.refs), 1);
    assert_int_equal(tensor_live_count(), before);
}

static void test_args_errors_release_taken_values(void **state)
{
    (void)state;
    int64_t before = tensor_live_count();
    tensor_t *t = vec(1, (float[]){1});
    /* the NULL string fails; the 'v' holding a tensor after it is released */
    rpc_value_t *args = rpc_args("isv", (int64_t)1, (const char *)NULL, rpc_value_tensor(t));
    assert_null(args);
    assert_non_null(strstr(error_last(), "argument 1 ('s')"));
    assert_null(rpc_args("tv", (tensor_t *)NULL, rpc_value_tensor(t)));
    assert_non_null(strstr(error_last(), "argument 0 ('t')"));
    assert_null(rpc_args("iv", (int64_t)1, (rpc_value_t *)NULL));
    assert_null(rpc_args("ix", (int64_t)1, 2));
    assert_string_equal(error_last(), "rpc_args: unknown letter 'x' in spec \"ix\"");
    assert_null(rpc_args(NULL));
    rpc_value_t *empty = rpc_args("");
    assert_int_equal(rpc_list_len(empty), 0);
    assert_int_equal(rpc_value_kind(empty), RPC_LIST);
    rpc_value_unref(empty);
    tensor_unref(t);
    assert_int_equal(tensor_live_count(), before);
}

static void test_equal_compares_deeply(void **state)
{
    (void)state;
    tensor_t *a = vec(2, (float[]){1, 2});
    tensor_t *b = vec(2, (float[]){1, 2});
    tensor_t *c = vec(2, (float[]){1, 3});
    rpc_value_t *x = rpc_args("itsv", (int64_t)1, a, "s", rpc_args("fn", NAN));
    rpc_value_t *y = rpc_args("itsv", (int64_t)1, b, "s", rpc_args("fn", NAN));
    rpc_value_t *z = rpc_args("itsv", (int64_t)1, c, "s", rpc_args("fn", NAN));
    rpc_value_t *w = rpc_args("itsv", (int64_t)1, b, "s", rpc_args("f", NAN));
    assert_true(rpc_value_equal(x, y));   /* tensors by content, NaN bit for bit */
    assert_false(rpc_value_equal(x, z));
    assert_false(rpc_value_equal(x, w));
    assert_true(rpc_value_equal(NULL, NULL));
    assert_false(rpc_value_equal(x, NULL));

    rpc_value_t *p0 = rpc_value_float(0.0), *n0 = rpc_value_float(-0.0);
    assert_false(rpc_value_equal(p0, n0));
    rpc_value_t *i1 = rpc_value_int(1), *f1 = rpc_value_float(1.0);
    assert_false(rpc_value_equal(i1, f1));
    rpc_value_t *s1 = rpc_value_string("ab"), *b1 = rpc_value_bytes("ab", 2);
    assert_false(rpc_value_equal(s1, b1));

    int64_t shape[2] = {1, 2};
    tensor_t *d = tensor_from_data(TENSOR_F32, 2, shape, (float[]){1, 2});
    rpc_value_t *vd = rpc_value_tensor(d), *va = rpc_value_tensor(a);
    assert_false(rpc_value_equal(vd, va));   /* same bytes, other shape */

    rpc_value_t *vals[] = {x, y, z, w, p0, n0, i1, f1, s1, b1, vd, va};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++)
        rpc_value_unref(vals[i]);
    tensor_t *ts[] = {a, b, c, d};
    for (size_t i = 0; i < 4; i++)
        tensor_unref(ts[i]);
}

static void test_format(void **state)
{
    (void)state;
    int64_t shape[2] = {2, 3};
    tensor_t *t = tensor_new(TENSOR_I64, 2, shape);
    rpc_value_t *v = rpc_args("ifsbtnv", (int64_t)-3, 2.5, "a\"b\n", "xyz", (size_t)3, t,
                              rpc_args(""));
    char buf[256];
    assert_string_equal(rpc_value_format(v, buf, sizeof buf),
                        "[-3, 2.5, \"a\\\"b\\x0a\", bytes(3), tensor int64 (2, 3), none, []]");
    char small[12];
    assert_string_equal(rpc_value_format(v, small, sizeof small), "[-3, 2.5...");
    assert_string_equal(rpc_value_format(NULL, buf, sizeof buf), "NULL");
    rpc_value_unref(v);
    tensor_unref(t);
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
    rpc_value_t *v = rpc_value_object(&server, count_free, "ParameterServer");
    assert_int_equal(rpc_value_kind(v), RPC_OBJECT);
    assert_string_equal(rpc_value_kind_name(RPC_OBJECT), "object");
    assert_string_equal(rpc_value_object_type(v), "ParameterServer");
    void *p = NULL;
    assert_int_equal(rpc_value_get_object(v, "ParameterServer", &p), 0);
    assert_ptr_equal(p, &server);
    char type[] = "ParameterServer";   /* types compare as strings */
    assert_int_equal(rpc_value_get_object(v, type, &p), 0);
    assert_int_equal(rpc_value_get_object(v, NULL, &p), 0);   /* any type */
    assert_int_equal(rpc_value_get_object(v, "DataWorker", &p), -1);
    assert_string_equal(error_last(),
                        "expected a DataWorker object; this object is a ParameterServer");

    /* Other kinds are not objects. */
    rpc_value_t *i = rpc_value_int(1);
    assert_null(rpc_value_object_type(i));
    assert_int_equal(rpc_value_get_object(i, "DataWorker", &p), -1);
    assert_string_equal(error_last(), "expected a DataWorker object, got int");
    assert_int_equal(rpc_value_get_object(i, NULL, &p), -1);
    assert_string_equal(error_last(), "expected an object, got int");
    assert_int_equal(rpc_value_get_object(NULL, "DataWorker", &p), -1);
    assert_string_equal(error_last(), "expected a DataWorker object, got NULL");

    /* Arguments: the index is named. */
    rpc_value_t *args = rpc_args("vv", rpc_value_ref(v), rpc_value_ref(i));
    assert_int_equal(rpc_arg_object(args, 0, "ParameterServer", &p), 0);
    assert_ptr_equal(p, &server);
    assert_int_equal(rpc_arg_object(args, 0, "DataWorker", &p), -1);
    assert_string_equal(error_last(), "argument 0: expected a DataWorker object; this object "
                                      "is a ParameterServer");
    assert_int_equal(rpc_arg_object(args, 1, "DataWorker", &p), -1);
    assert_string_equal(error_last(), "argument 1: expected a DataWorker object, got int");
    assert_int_equal(rpc_arg_object(args, 2, "DataWorker", &p), -1);
    assert_string_equal(error_last(), "argument 2 missing (2 given)");

    /* Identity: the same pointer is the same object. */
    rpc_value_t *same = rpc_value_object(&server, NULL, "ParameterServer");
    rpc_value_t *other = rpc_value_object(&worker, NULL, "ParameterServer");
    assert_true(rpc_value_equal(v, same));
    assert_false(rpc_value_equal(v, other));
    assert_false(rpc_value_equal(v, i));
    char buf[128], want[128];
    snprintf(want, sizeof want, "[ParameterServer@%p, 1]", (void *)&server);
    assert_string_equal(rpc_value_format(args, buf, sizeof buf), want);

    /* free_fn runs once, when the last reference goes (here the list's). */
    rpc_value_unref(same);
    rpc_value_unref(other);   /* no free_fn: nothing freed */
    rpc_value_unref(v);
    assert_int_equal(n_freed, 0);
    rpc_value_unref(args);
    assert_int_equal(n_freed, 1);
    assert_ptr_equal(last_freed, &server);
    rpc_value_unref(i);

    /* A failed constructor frees the object itself. */
    assert_null(rpc_value_object(&worker, count_free, NULL));
    assert_string_equal(error_last(), "rpc_value_object: NULL type");
    assert_int_equal(n_freed, 2);
    assert_ptr_equal(last_freed, &worker);
    assert_null(rpc_value_object(NULL, count_free, "DataWorker"));
    assert_string_equal(error_last(), "rpc_value_object: NULL object");
    assert_int_equal(n_freed, 2);
}

typedef struct {
    rpc_value_t *shared;
    int rounds;
} share_arg_t;

static void *share_thread(void *p)
{
    share_arg_t *a = p;
    for (int i = 0; i < a->rounds; i++) {
        rpc_value_t *mine = rpc_value_ref(a->shared);
        rpc_value_t *l = rpc_value_list(1);
        rpc_list_append(l, mine);   /* the list's release drops it again */
        rpc_value_unref(l);
    }
    return NULL;
}

static void test_threads_share_values(void **state)
{
    (void)state;
    int64_t before = tensor_live_count();
    tensor_t *t = vec(1, (float[]){1});
    share_arg_t arg = {rpc_value_tensor(t), 20000};
    tensor_unref(t);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, share_thread, &arg), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(tensor_live_count(), before + 1);
    rpc_value_unref(arg.shared);
    assert_int_equal(tensor_live_count(), before);
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
