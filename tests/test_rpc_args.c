/* SPDX-License-Identifier: MIT */
/*  Typed argument lists and the calls that take them over, through the
    public API: ZD_ARGS (every kind of C value, the conversions, nesting,
    failures that release what was built), ZD_UNPACK and zd__rpc_unpack
    (types, arity), the _take calls between two real processes (success,
    remote failure, a NULL list from a failed ZD_ARGS; no tensor leaked),
    and ZD_DIST_AUTOGRAD_CONTEXT (the context released on every way out of
    the block, here and on the peer).

    What must not compile is checked by ctest too (tests/compile_fail/,
    see tests/CMakeLists.txt): ZD_UNPACK(args, &i) with `int i` is an
    error, since _Generic has no association for int *; so is ZD_ARGS(p)
    with a void *p. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include <zdist/tensor.h>
#include "tests/support/world.h"
#include "rpc/value/args.h"

static zd_tensor_t *vec(float a, float b)
{
    int64_t shape[1] = {2};
    float data[2] = {a, b};
    return zd_tensor_from_data(ZD_FLOAT32, shape, 1, data);
}

static bool has(const char *text)
{
    if (strstr(zd_error_last(), text))
        return true;
    fprintf(stderr, "error \"%s\" lacks \"%s\"\n", zd_error_last(), text);
    return false;
}

/*  ---- ZD_ARGS, locally ---- */

static void test_args_kinds_and_values(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *t = vec(1, 2);
    char buf[8] = "buf";
    const char *cs = "const";
    int8_t i8 = -5;
    unsigned u = 4000000000u;
    uint64_t u64 = (uint64_t)INT64_MAX;
    short sh = -300;
    float fl = 0.5f;
    zd_value_t *a = ZD_ARGS(-1, i8, u, u64, sh, true, 'A', fl, 2.25, "lit", buf, cs, t,
                            ZD_ARGS(7, ZD_ARGS()), zd_value_none());
    assert_non_null(a);
    assert_int_equal(zd_list_len(a), 15);

    /* Ints arrive as ints, negative ones negative. */
    int64_t want[7] = {-1, -5, 4000000000ll, INT64_MAX, -300, 1, 'A'};
    for (size_t i = 0; i < 7; i++) {
        int64_t v;
        assert_int_equal(zd_rpc_arg_int(a, i, &v), 0);
        assert_int_equal(v, want[i]);
        assert_int_equal(zd_value_kind(zd_list_get(a, i)), ZD_VALUE_INT);
    }
    assert_int_equal(zd_value_kind(zd_list_get(a, 7)), ZD_VALUE_FLOAT);
    assert_int_equal(zd_value_kind(zd_list_get(a, 8)), ZD_VALUE_FLOAT);
    double d;
    assert_int_equal(zd_rpc_arg_float(a, 7, &d), 0);
    assert_true(d == 0.5);
    assert_int_equal(zd_rpc_arg_float(a, 8, &d), 0);
    assert_true(d == 2.25);
    const char *s;
    assert_int_equal(zd_rpc_arg_string(a, 9, &s), 0);
    assert_string_equal(s, "lit");
    assert_int_equal(zd_rpc_arg_string(a, 10, &s), 0);
    assert_string_equal(s, "buf");
    assert_true(s != buf); /* copied */
    assert_int_equal(zd_rpc_arg_string(a, 11, &s), 0);
    assert_string_equal(s, "const");
    zd_tensor_t *got;
    assert_int_equal(zd_rpc_arg_tensor(a, 12, &got), 0);
    assert_ptr_equal(got, t); /* a reference, not a copy */

    /* Nested lists, the empty one included. */
    zd_value_t *inner = zd_list_get(a, 13);
    assert_int_equal(zd_value_kind(inner), ZD_VALUE_LIST);
    assert_int_equal(zd_list_len(inner), 2);
    assert_int_equal(zd_value_kind(zd_list_get(inner, 1)), ZD_VALUE_LIST);
    assert_int_equal(zd_list_len(zd_list_get(inner, 1)), 0);
    assert_int_equal(zd_value_kind(zd_list_get(a, 14)), ZD_VALUE_NONE);

    /* The same list through zd__rpc_args, casts and all. */
    zd_value_t *b =
        zd__rpc_args("iiiiiiiffsssvvn", (int64_t)-1, (int64_t)-5, (int64_t)4000000000ll, INT64_MAX,
                     (int64_t)-300, (int64_t)1, (int64_t)'A', 0.5, 2.25, "lit", "buf", "const",
                     zd_value_tensor(t), zd__rpc_args("iv", (int64_t)7, zd_value_list(0)));
    assert_non_null(b);
    assert_true(zd_value_equal(a, b));
    zd_value_unref(b);

    /* The list holds its own reference: the tensor outlives ours. */
    zd_tensor_unref(t);
    assert_int_equal(zd_tensor_live_count(), live + 1);
    zd_value_unref(a);
    assert_int_equal(zd_tensor_live_count(), live);

    zd_value_t *e = ZD_ARGS();
    assert_non_null(e);
    assert_int_equal(zd_value_kind(e), ZD_VALUE_LIST);
    assert_int_equal(zd_list_len(e), 0);
    zd_value_unref(e);

    /* At least 16 items (24 in fact). */
    zd_value_t *many = ZD_ARGS(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19,
                               20, 21, 22, 23, 24);
    assert_int_equal(zd_list_len(many), 24);
    int64_t last;
    assert_int_equal(zd_rpc_arg_int(many, 23, &last), 0);
    assert_int_equal(last, 24);
    zd_value_unref(many);
}

static int evaluations;

static int64_t counted(int64_t v)
{
    evaluations++;
    return v;
}

static void test_args_evaluate_once(void **state)
{
    (void)state;
    evaluations = 0;
    zd_value_t *a = ZD_ARGS(counted(1), counted(2));
    assert_int_equal(evaluations, 2);
    zd_value_unref(a);
}

static void test_args_failures_release_everything(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *t1 = vec(1, 2), *t2 = vec(3, 4);
    const char *null_string = NULL;

    /* A NULL string in the middle: the taken-over values before and after
       it, and the tensor references taken so far, are all released. */
    zd_value_t *a = ZD_ARGS(zd_value_tensor(t1), t2, null_string, zd_value_tensor(t2), 1);
    assert_null(a);
    assert_true(has("ZD_ARGS: argument 2: zd_value_string: NULL string"));

    /* An unsigned value that does not fit. */
    a = ZD_ARGS(zd_value_tensor(t1), UINT64_MAX, zd_value_tensor(t2));
    assert_null(a);
    assert_true(has("ZD_ARGS: argument 1: 18446744073709551615 does not fit"));

    /* A failed nested list fails the outer one. */
    a = ZD_ARGS(t1, ZD_ARGS(zd_value_tensor(t2), null_string));
    assert_null(a);
    assert_true(has("ZD_ARGS: argument 1: NULL value: ZD_ARGS: argument 1: zd_value_string: NULL"));

    zd_tensor_t *no_tensor = NULL;
    assert_null(ZD_ARGS(no_tensor));
    zd_tensor_unref(t1);
    zd_tensor_unref(t2);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- ZD_UNPACK and zd__rpc_unpack, locally ---- */

static void test_unpack(void **state)
{
    (void)state;
    zd_tensor_t *t = vec(1, 2);
    zd_value_t *a = ZD_ARGS(-3, 1.5, "s", t, ZD_ARGS(1));
    int64_t n = 0;
    double f = 0;
    const char *s = NULL;
    zd_tensor_t *got = NULL;
    zd_value_t *v = NULL;
    assert_int_equal(ZD_UNPACK(a, &n, &f, &s, &got, &v), 0);
    assert_int_equal(n, -3);
    assert_true(f == 1.5);
    assert_string_equal(s, "s");
    assert_ptr_equal(got, t);
    assert_ptr_equal(v, zd_list_get(a, 4));

    /* An int is accepted as a float, as zd_rpc_arg_float does. */
    assert_int_equal(ZD_UNPACK(a, &f, &f, &s, &got, &v), 0);
    assert_true(f == 1.5);

    /* The wrong type, with its index. */
    assert_int_equal(ZD_UNPACK(a, &n, &f, &s, &n, &v), -1);
    assert_true(has("argument 3: expected int, got tensor"));
    assert_int_equal(ZD_UNPACK(a, &got, &f, &s, &got, &v), -1);
    assert_true(has("argument 0: expected tensor, got int"));

    /* The wrong arity, either way. */
    assert_int_equal(ZD_UNPACK(a, &n, &f), -1);
    assert_true(has("expected 2 arguments, got 5"));
    zd_value_t *one = ZD_ARGS(1);
    assert_int_equal(ZD_UNPACK(one, &n, &n), -1);
    assert_true(has("expected 2 arguments, got 1"));
    assert_int_equal(ZD_UNPACK(one), -1);
    assert_true(has("expected 0 arguments, got 1"));
    zd_value_t *none = ZD_ARGS();
    assert_int_equal(ZD_UNPACK(none), 0);
    zd_value_unref(none);

    /* Not a list. */
    zd_value_t *i = zd_value_int(1);
    assert_int_equal(ZD_UNPACK(i, &n), -1);
    assert_true(has("arguments: expected list, got int"));
    zd_value_unref(i);

    /* The spec function, for C++. */
    n = 0;
    assert_int_equal(zd__rpc_unpack(one, "i", &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(zd__rpc_unpack(a, "ifstv", &n, &f, &s, &got, &v), 0);
    assert_int_equal(n, -3);
    assert_int_equal(zd__rpc_unpack(a, "ifsiv", &n, &f, &s, &n, &v), -1);
    assert_true(has("argument 3: expected int, got tensor"));
    assert_int_equal(zd__rpc_unpack(a, "if", &n, &f), -1);
    assert_true(has("expected 2 arguments, got 5"));
    assert_int_equal(zd__rpc_unpack(one, "x", &n), -1);
    assert_true(has("unknown letter 'x'"));

    zd_value_unref(one);
    zd_value_unref(a);
    zd_tensor_unref(t);
}

/*  ---- the _take calls and the scope, between two processes ---- */

/*  "add"(a, b) -> a + b */
static zd_value_t *fn_add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t a, b;
    if (ZD_UNPACK(args, &a, &b) < 0)
        return NULL;
    return zd_value_int(a + b);
}

/*  "echo"(...) -> the argument list itself */
static zd_value_t *fn_echo(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return zd_value_ref(args);
}

/*  "tsum"(t) -> the sum of t's elements, as an int */
static zd_value_t *fn_tsum(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *t;
    if (ZD_UNPACK(args, &t) < 0)
        return NULL;
    float sum = 0;
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        sum += zd_tensor_data(t)[i];
    return zd_value_int((int64_t)sum);
}

/*  "fail"(...): always fails */
static zd_value_t *fn_fail(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_error_set("failing on purpose");
    return NULL;
}

/*  "plus"(value, k): a method, through an RRef to an int -> value + k */
static zd_value_t *fn_plus(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t v, k;
    if (ZD_UNPACK(args, &v, &k) < 0)
        return NULL;
    return zd_value_int(v + k);
}

/*  "num_contexts"() -> live distributed autograd contexts here */
static zd_value_t *fn_num_contexts(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    if (ZD_UNPACK(args) < 0)
        return NULL;
    return zd_value_int(zd_dist_autograd_num_contexts());
}

static int setup(const world_t *w)
{
    (void)w;
    const struct {
        const char *name;
        zd_rpc_handler_fn *fn;
    } fns[] = {{"add", fn_add},   {"echo", fn_echo}, {"tsum", fn_tsum},
               {"fail", fn_fail}, {"plus", fn_plus}, {"num_contexts", fn_num_contexts}};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (zd_rpc_register(fns[i].name, fns[i].fn, NULL) < 0)
            return -1;
    return 0;
}

#define TRY(cond)                                                                                  \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return world_fail(w, "line %d: %s failed (%s)", __LINE__, #cond, zd_error_last());     \
    } while (0)

static int64_t int_of(zd_value_t *v)
{
    int64_t n = INT64_MIN;
    zd_value_get_int(v, &n);
    zd_value_unref(v);
    return n;
}

/*  Waits (up to 10 s) until this process holds `live` tensors: the last
    reference to a tensor that was sent goes when ZeroMQ has written its
    frame, on ZeroMQ's own thread, not necessarily before the answer. */
static bool live_tensors_back_to(int64_t live)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (zd_tensor_live_count() != live) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) {
            fprintf(stderr, "%lld tensors live, expected %lld\n", (long long)zd_tensor_live_count(),
                    (long long)live);
            return false;
        }
        sched_yield();
    }
    return true;
}

static int take_calls(const world_t *w)
{
    int64_t live = zd_tensor_live_count();
    zd_value_t *r = NULL;

    /* Plain ints, negative ones too. */
    TRY(zd_rpc_sync_take(1, "add", ZD_ARGS(2, 3), ZD_TIMEOUT_DEFAULT, &r) == 0);
    TRY(int_of(r) == 5);
    int8_t small = -5;
    TRY(zd_rpc_sync_take(1, "add", ZD_ARGS(-2, small), ZD_TIMEOUT_DEFAULT, &r) == 0);
    TRY(int_of(r) == -7);

    /* Every kind survives the trip. */
    zd_tensor_t *t = vec(1.5f, 2.5f);
    zd_value_t *want = ZD_ARGS(-1, true, 0.25f, "s", t, ZD_ARGS(1, ZD_ARGS()));
    TRY(want != NULL);
    TRY(zd_rpc_sync_take(1, "echo", zd_value_ref(want), ZD_TIMEOUT_DEFAULT, &r) == 0);
    TRY(zd_value_equal(r, want));
    zd_value_unref(r);
    zd_value_unref(want);

    /* A tensor argument, no reference left behind. */
    TRY(zd_rpc_sync_take(1, "tsum", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT, &r) == 0);
    TRY(int_of(r) == 4);

    /* A remote failure releases the arguments all the same. */
    r = (zd_value_t *)&r;
    TRY(zd_rpc_sync_take(1, "fail", ZD_ARGS(t, 1), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(r == NULL && has("failing on purpose"));
    TRY(zd_rpc_sync_take(1, "add", ZD_ARGS(1, 2, 3), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(has("expected 2 arguments, got 3"));
    TRY(zd_rpc_sync_take(1, "add", ZD_ARGS(t, 2), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(has("argument 0: expected int, got tensor"));

    /* Async. */
    zd_future_t *f = zd_rpc_async_take(1, "tsum", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT);
    TRY(f != NULL && zd_future_wait(f, -1) == 0);
    TRY(int_of(zd_value_ref(zd_future_value(f))) == 4);
    zd_future_unref(f);
    f = zd_rpc_async_take(1, "fail", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT);
    TRY(f != NULL && zd_future_wait(f, -1) == -1 && has("failing on purpose"));
    zd_future_unref(f);

    /* Remote, and the RRef method calls. */
    zd_rref_t *rr = zd_rpc_remote_take(1, "add", ZD_ARGS(2, 3), ZD_TIMEOUT_DEFAULT);
    TRY(rr != NULL);
    TRY(zd_rref_rpc_sync_take(rr, "plus", ZD_ARGS(10), ZD_TIMEOUT_DEFAULT, &r) == 0);
    TRY(int_of(r) == 15);
    f = zd_rref_rpc_async_take(rr, "plus", ZD_ARGS(-10), ZD_TIMEOUT_DEFAULT);
    TRY(f != NULL && zd_future_wait(f, -1) == 0);
    TRY(int_of(zd_value_ref(zd_future_value(f))) == -5);
    zd_future_unref(f);
    zd_rref_t *rr2 = zd_rref_remote_take(rr, "plus", ZD_ARGS(100), ZD_TIMEOUT_DEFAULT);
    TRY(rr2 != NULL && zd_rref_to_here(rr2, -1, &r) == 0);
    TRY(int_of(r) == 105);
    TRY(zd_rref_rpc_sync_take(rr, "plus", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(has("argument 1: expected int, got tensor"));
    zd_rref_t *rr3 = zd_rpc_remote_take(1, "fail", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT);
    TRY(rr3 != NULL && zd_rref_to_here(rr3, -1, &r) == -1 && has("failing on purpose"));
    zd_rref_unref(rr3);

    /* An RRef as an argument. */
    TRY(zd_rpc_sync_take(1, "echo", ZD_ARGS(rr), ZD_TIMEOUT_DEFAULT, &r) == 0);
    zd_rref_t *back;
    TRY(ZD_UNPACK(r, &back) == 0 && zd_rref_owner(back) == 1);
    zd_value_unref(r);

    /* A NULL list from a failed ZD_ARGS: every call fails with its error,
       releasing the rest of the list. */
    const char *null_string = NULL;
    r = (zd_value_t *)&r;
    TRY(zd_rpc_sync_take(1, "add", ZD_ARGS(zd_value_tensor(t), null_string), ZD_TIMEOUT_DEFAULT,
                         &r) == -1);
    TRY(r == NULL);
    TRY(has("zd_rpc_sync calling \"add\": ZD_ARGS: argument 1: zd_value_string: NULL string"));
    TRY(zd_rpc_async_take(1, "add", ZD_ARGS(t, null_string), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(has("zd_rpc_async calling \"add\": ZD_ARGS: argument 1"));
    TRY(zd_rpc_remote_take(1, "add", ZD_ARGS(t, null_string), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(has("zd_rpc_remote calling \"add\": ZD_ARGS"));
    TRY(zd_rref_rpc_sync_take(rr, "plus", ZD_ARGS(t, null_string), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(has("rref.rpc_sync calling \"plus\": ZD_ARGS"));
    TRY(zd_rref_rpc_async_take(rr, "plus", ZD_ARGS(t, null_string), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(has("rref.rpc_async calling \"plus\": ZD_ARGS"));
    TRY(zd_rref_remote_take(rr, "plus", ZD_ARGS(t, null_string), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(has("rref.remote calling \"plus\": ZD_ARGS"));
    zd_error_clear();
    TRY(zd_rpc_sync_take(1, "add", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(has("zd_rpc_sync calling \"add\": NULL argument list (ZD_ARGS() is the empty one)"));

    /* A call that cannot be made at all still releases its list. */
    TRY(zd_rpc_sync_take(7, "add", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_rpc_async_take(7, "add", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(zd_rpc_remote_take(7, "add", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(zd_rref_rpc_sync_take(NULL, "plus", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_rref_rpc_async_take(NULL, "plus", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(zd_rref_remote_take(NULL, "plus", ZD_ARGS(t), ZD_TIMEOUT_DEFAULT) == NULL);

    zd_rref_unref(rr2);
    zd_rref_unref(rr);
    zd_tensor_unref(t);
    TRY(live_tensors_back_to(live));
    return 0;
}

static int take_body(const world_t *w)
{
    return w->rank == 0 ? take_calls(w) : 0;
}

static void test_take_calls(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2, .setup = setup, .fn = take_body, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  A call under the current context with a tensor that requires grad, so
    that the peer takes part in the context too. */
static int touch_peer(void)
{
    zd_tensor_t *x = vec(1, 3);
    zd_tensor_set_requires_grad(x, true);
    zd_value_t *r = NULL;
    int rc = zd_rpc_sync_take(1, "tsum", ZD_ARGS(x), ZD_TIMEOUT_DEFAULT, &r);
    zd_value_unref(r);
    zd_tensor_unref(x);
    return rc;
}

static int64_t peer_contexts(void)
{
    zd_value_t *r = NULL;
    if (zd_dist_autograd_wait_releases(-1) < 0 ||
        zd_rpc_sync_take(1, "num_contexts", ZD_ARGS(), ZD_TIMEOUT_DEFAULT, &r) < 0)
        return -1;
    return int_of(r);
}

static int64_t scope_returning(int *ran)
{
    ZD_DIST_AUTOGRAD_CONTEXT(cid)
    {
        *ran = touch_peer() == 0;
        return cid;
    }
    return -1;
}

static int scopes(const world_t *w)
{
    TRY(zd_dist_autograd_num_contexts() == 0 && peer_contexts() == 0);

    /* Normal exit. */
    int64_t seen = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(cid)
    {
        TRY(cid >= 0 && zd_dist_autograd_current_context() == cid);
        TRY(zd_dist_autograd_num_contexts() == 1 && touch_peer() == 0);
        TRY(peer_contexts() == 1);
        seen = cid;
    }
    TRY(seen >= 0 && !zd_dist_autograd_context_exists(seen));
    TRY(zd_dist_autograd_current_context() == -1 && zd_dist_autograd_num_contexts() == 0);
    TRY(peer_contexts() == 0);

    /* break (and continue) leave the block, releasing the context. */
    int runs = 0;
    for (int i = 0; i < 3; i++) {
        ZD_DIST_AUTOGRAD_CONTEXT(cid)
        {
            runs++;
            TRY(touch_peer() == 0);
            if (i == 0)
                continue;
            break;
        }
        TRY(zd_dist_autograd_num_contexts() == 0 && zd_dist_autograd_current_context() == -1);
    }
    TRY(runs == 3 && peer_contexts() == 0);

    /* return from a function. */
    int ran = 0;
    int64_t cid = scope_returning(&ran);
    TRY(ran && cid >= 0 && !zd_dist_autograd_context_exists(cid));
    TRY(zd_dist_autograd_current_context() == -1 && peer_contexts() == 0);

    /* goto out of it. */
    ZD_DIST_AUTOGRAD_CONTEXT(c)
    {
        TRY(touch_peer() == 0);
        goto out;
    }
out:
    TRY(zd_dist_autograd_num_contexts() == 0 && peer_contexts() == 0);

    /* Scopes do not nest: the inner block is skipped, zd_error_last() says
       why, and the outer context is still released. A block's error (text
       and code) survives the release. */
    int inner_ran = 0, outer_ran = 0;
    ZD_DIST_AUTOGRAD_CONTEXT(outer)
    {
        outer_ran = 1;
        ZD_DIST_AUTOGRAD_CONTEXT(inner)
        {
            inner_ran = 1;
        }
        TRY(has("already has context") && zd_dist_autograd_current_context() == outer);
        zd_error_set_code(ZD_ERR_TIMEOUT, "the block failed");
    }
    TRY(outer_ran && !inner_ran && zd_dist_autograd_num_contexts() == 0);
    TRY(strcmp(zd_error_last(), "the block failed") == 0 && zd_error_code() == ZD_ERR_TIMEOUT);

    /* A block that succeeded leaves no error behind. */
    zd_error_set("before the block");
    ZD_DIST_AUTOGRAD_CONTEXT(c)
    {
        TRY(touch_peer() == 0);
        zd_error_clear();
    }
    TRY(zd_error_code() == ZD_OK && zd_error_last()[0] == '\0');

    /* A block that ends its context itself. */
    ZD_DIST_AUTOGRAD_CONTEXT(c)
    {
        TRY(touch_peer() == 0 && zd_dist_autograd_context_end(c, -1) == 0);
    }
    TRY(zd_dist_autograd_num_contexts() == 0 && peer_contexts() == 0);
    return 0;
}

static int scope_after_shutdown(void)
{
    /* Outside a world (this process never called zd_dist_autograd_init or
       zd_rpc_init): the block is skipped, and the error says why. */
    int ran = 0;
    ZD_DIST_AUTOGRAD_CONTEXT(cid)
    {
        ran = 1;
        (void)cid;
    }
    return !ran && zd_error_code() == ZD_ERR_NOT_INITIALIZED &&
            strstr(zd_error_last(), "zd_dist_autograd_init")
        ? 0
        : -1;
}

static int scope_body(const world_t *w)
{
    return w->rank == 0 ? scopes(w) : 0;
}

static void test_scoped_context(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = setup, .fn = scope_body, .timeout_s = 60, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
    assert_int_equal(scope_after_shutdown(), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_args_kinds_and_values),
        cmocka_unit_test(test_args_evaluate_once),
        cmocka_unit_test(test_args_failures_release_everything),
        cmocka_unit_test(test_unpack),
        cmocka_unit_test(test_take_calls),
        cmocka_unit_test(test_scoped_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
