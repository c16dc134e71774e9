/* SPDX-License-Identifier: MIT */
/*  Futures: timed waits, callbacks, single completion, wait_all / wait_any,
    collect_all, error codes, and many threads completing and waiting at
    once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include <zdist/future.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t value_int(zd_future_t *f)
{
    int64_t i = -1;
    assert_int_equal(zd_value_get_int(zd_future_value(f), &i), 0);
    return i;
}

static int set_int(zd_future_t *f, int64_t i)
{
    zd_value_t *v = zd_value_int(i);
    int rc = zd_future_set_value(f, v);
    zd_value_unref(v);
    return rc;
}

static void test_wait_times_out_then_completes(void **state)
{
    (void)state;
    zd_future_t *f = zd_future_new();
    assert_false(zd_future_done(f));
    assert_null(zd_future_value(f));
    assert_string_equal(zd_future_error(f), "");
    int64_t t0 = now_ms();
    assert_int_equal(zd_future_wait(f, 20), -1);
    assert_true(now_ms() - t0 >= 20); /* a monotonic deadline never fires early */
    assert_string_equal(zd_error_last(), "timed out after 20 ms");
    assert_int_equal(zd_error_code(), ZD_ERR_TIMEOUT);
    assert_false(zd_future_done(f)); /* looking without waiting */

    assert_int_equal(set_int(f, 5), 0);
    assert_true(zd_future_done(f));
    assert_int_equal(zd_future_wait(f, ZD_TIMEOUT_NONE), 0);
    assert_int_equal(zd_future_wait(f, ZD_TIMEOUT_DEFAULT), 0);
    assert_int_equal(value_int(f), 5);
    assert_string_equal(zd_future_error(f), "");
    zd_future_unref(f);
}

static void test_error_completion(void **state)
{
    (void)state;
    zd_future_t *f = zd_future_new();
    assert_int_equal(zd_future_set_error(f, "worker%d: function '%s' failed", 2, "add"), 0);
    assert_true(zd_future_done(f));
    assert_int_equal(zd_future_wait(f, -1), -1);
    assert_string_equal(zd_error_last(), "worker2: function 'add' failed");
    assert_int_equal(zd_error_code(), ZD_ERR_OTHER);
    assert_int_equal(zd_future_error_code(f), ZD_ERR_OTHER);
    assert_string_equal(zd_future_error(f), "worker2: function 'add' failed");
    assert_null(zd_future_value(f));
    zd_future_unref(f);

    f = zd_future_new(); /* an empty text must still read as an error */
    assert_int_equal(zd_future_set_error(f, "%s", ""), 0);
    assert_int_equal(zd_future_wait(f, 0), -1);
    assert_string_equal(zd_future_error(f), "unknown error");
    zd_future_unref(f);

    f = zd_future_new(); /* a code travels with the text to every waiter */
    assert_int_equal(zd_future_error_code(f), ZD_OK);
    assert_int_equal(zd_future_set_error_code(f, ZD_ERR_PEER, "peer %s lost", "w1"), 0);
    assert_int_equal(zd_future_error_code(f), ZD_ERR_PEER);
    zd_error_clear();
    assert_int_equal(zd_error_code(), ZD_OK);
    assert_int_equal(zd_future_wait(f, ZD_TIMEOUT_NONE), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_PEER);
    assert_string_equal(zd_error_last(), "peer w1 lost");
    zd_future_unref(f);
}

static void test_only_first_completion_counts(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_future_t *f = zd_future_new();
    assert_int_equal(set_int(f, 1), 0);
    zd_tensor_t *t = zd_tensor_zeros1(4);
    zd_value_t *tv = zd_value_tensor(t);
    zd_tensor_unref(t);
    assert_int_equal(zd_future_set_value(f, tv), -1);
    assert_string_equal(zd_error_last(), "rpc future: already completed");
    assert_int_equal(zd_future_set_error(f, "late"), -1);
    zd_value_unref(tv);
    assert_int_equal(zd_tensor_live_count(), before); /* the refused value was not kept */
    assert_int_equal(value_int(f), 1);
    assert_string_equal(zd_future_error(f), "");
    zd_future_unref(f);

    f = zd_future_new();
    assert_int_equal(zd_future_set_value(f, NULL), 0); /* NULL reads as none */
    assert_int_equal(zd_value_kind(zd_future_value(f)), ZD_VALUE_NONE);
    assert_int_equal(zd_future_set_value(f, NULL), -1);
    zd_future_unref(f);
}

typedef struct {
    int calls;
    int order[8];
    int n;
} trace_t;

static trace_t trace;

static void record(zd_future_t *f, void *arg)
{
    assert_true(zd_future_done(f));
    trace.calls++;
    trace.order[trace.n++ % 8] = (int)(intptr_t)arg;
}

static void test_callbacks_run_once_in_order(void **state)
{
    (void)state;
    memset(&trace, 0, sizeof trace);
    zd_future_t *f = zd_future_new();
    assert_int_equal(zd_future_then(f, record, (void *)1), 0);
    assert_int_equal(zd_future_then(f, record, (void *)2), 0);
    assert_int_equal(trace.calls, 0);
    assert_int_equal(set_int(f, 3), 0);
    assert_int_equal(trace.calls, 2);
    assert_int_equal(trace.order[0], 1);
    assert_int_equal(trace.order[1], 2);
    /* added after completion: runs at once, on this thread */
    assert_int_equal(zd_future_then(f, record, (void *)3), 0);
    assert_int_equal(trace.calls, 3);
    assert_int_equal(trace.order[2], 3);
    assert_int_equal(zd_future_set_error(f, "again"), -1);
    assert_int_equal(trace.calls, 3);
    assert_int_equal(zd_future_then(NULL, record, NULL), -1);
    assert_int_equal(zd_future_then(f, NULL, NULL), -1);
    zd_future_unref(f);
}

static void drop_future(zd_future_t *f, void *arg)
{
    (void)arg;
    zd_future_unref(f);
}

static void test_callback_may_drop_last_reference(void **state)
{
    (void)state;
    zd_future_t *f = zd_future_new();
    /* The callback owns the only reference once the completer is done:
       completion must not touch f after running it. */
    assert_int_equal(zd_future_then(f, drop_future, NULL), 0);
    assert_int_equal(zd_future_then(f, record, (void *)9), 0);
    memset(&trace, 0, sizeof trace);
    assert_int_equal(zd_future_set_error(f, "boom"), 0);
    assert_int_equal(trace.calls, 1);

    /* A future dropped while pending never runs its callbacks, leaks nothing. */
    f = zd_future_new();
    assert_int_equal(zd_future_then(f, record, (void *)1), 0);
    zd_future_unref(f);
    assert_int_equal(trace.calls, 1);
}

static void test_wait_all(void **state)
{
    (void)state;
    zd_future_t *fs[3] = {zd_future_new(), zd_future_new(), zd_future_new()};
    assert_int_equal(zd_future_wait_all(fs, 0, 0), 0);
    assert_int_equal(set_int(fs[0], 0), 0);
    assert_int_equal(zd_future_wait_all(fs, 3, 15), -1);
    assert_string_equal(zd_error_last(), "timed out after 15 ms (1 of 3 futures done)");
    assert_int_equal(set_int(fs[1], 1), 0);
    assert_int_equal(set_int(fs[2], 2), 0);
    assert_int_equal(zd_future_wait_all(fs, 3, -1), 0);
    for (int i = 0; i < 3; i++)
        zd_future_unref(fs[i]);

    /* A failure ends the wait at once even though fs[0] never completes. */
    for (int i = 0; i < 3; i++)
        fs[i] = zd_future_new();
    assert_int_equal(set_int(fs[1], 1), 0);
    assert_int_equal(zd_future_set_error(fs[2], "worker3 died"), 0);
    assert_int_equal(zd_future_wait_all(fs, 3, -1), -1);
    assert_string_equal(zd_error_last(), "worker3 died");
    zd_future_t *bad[2] = {fs[0], NULL};
    assert_int_equal(zd_future_wait_all(bad, 2, 0), -1);
    assert_string_equal(zd_error_last(), "zd_future_wait_all: future 1 is NULL");
    for (int i = 0; i < 3; i++)
        zd_future_unref(fs[i]);
}

typedef struct {
    zd_future_t *f;
    int64_t value;
    const char *error;
} completer_arg_t;

static void *complete_later(void *p)
{
    completer_arg_t *a = p;
    if (a->error)
        zd_future_set_error(a->f, "%s", a->error);
    else
        set_int(a->f, a->value);
    return NULL;
}

static void test_wait_all_wakes_on_failure_from_another_thread(void **state)
{
    (void)state;
    zd_future_t *fs[2] = {zd_future_new(), zd_future_new()};
    completer_arg_t a = {fs[1], 0, "peer gone"};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, complete_later, &a), 0);
    assert_int_equal(zd_future_wait_all(fs, 2, 60000), -1);
    assert_string_equal(zd_error_last(), "peer gone");
    pthread_join(th, NULL);
    zd_future_unref(fs[0]);
    zd_future_unref(fs[1]);
}

static void test_wait_any(void **state)
{
    (void)state;
    zd_future_t *fs[3] = {zd_future_new(), zd_future_new(), zd_future_new()};
    int index = -1;
    assert_int_equal(zd_future_wait_any(fs, 3, 10, &index), -1);
    assert_string_equal(zd_error_last(), "timed out after 10 ms (none of 3 futures done)");
    /* repeated waits on the same pending futures leave no callbacks behind */
    for (int i = 0; i < 50; i++)
        assert_int_equal(zd_future_wait_any(fs, 3, 1, &index), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_TIMEOUT);

    completer_arg_t a = {fs[2], 42, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, complete_later, &a), 0);
    assert_int_equal(zd_future_wait_any(fs, 3, 60000, &index), 0);
    assert_int_equal(index, 2);
    assert_int_equal(value_int(fs[2]), 42);
    pthread_join(th, NULL);

    /* an error counts as completion: the caller checks which */
    assert_int_equal(zd_future_set_error(fs[1], "bad argument"), 0);
    assert_int_equal(zd_future_wait_any(fs, 2, -1, &index), 0);
    assert_int_equal(index, 1);
    assert_string_equal(zd_future_error(fs[index]), "bad argument");
    assert_int_equal(zd_future_wait_any(fs, 3, -1, &index), 0);
    assert_int_equal(index, 1); /* the first completed one */

    assert_int_equal(zd_future_wait_any(fs, 0, -1, &index), -1);
    assert_string_equal(zd_error_last(), "zd_future_wait_any: no futures");
    for (int i = 0; i < 3; i++)
        zd_future_unref(fs[i]);
}

/*  ---- collect_all ---- */

static void test_collect_all_values_in_order(void **state)
{
    (void)state;
    zd_future_t *fs[3] = {zd_future_new(), zd_future_new(), zd_future_new()};
    assert_int_equal(set_int(fs[1], 11), 0); /* before and after */
    zd_future_t *all = zd_future_collect_all(fs, 3);
    assert_non_null(all);
    assert_int_equal(set_int(fs[2], 12), 0);
    assert_false(zd_future_done(all));
    completer_arg_t a = {fs[0], 10, NULL};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, complete_later, &a), 0);
    assert_int_equal(zd_future_wait(all, 60000), 0);
    pthread_join(th, NULL);
    zd_value_t *list = zd_future_value(all);
    assert_int_equal(zd_list_len(list), 3);
    for (int i = 0; i < 3; i++) {
        int64_t v;
        assert_int_equal(zd_rpc_arg_int(list, (size_t)i, &v), 0);
        assert_int_equal(v, 10 + i);
    }
    zd_future_unref(all);
    for (int i = 0; i < 3; i++)
        zd_future_unref(fs[i]);
}

static void test_collect_all_fails_with_the_first_error(void **state)
{
    (void)state;
    zd_future_t *fs[3] = {zd_future_new(), zd_future_new(), zd_future_new()};
    zd_future_t *all = zd_future_collect_all(fs, 3);
    assert_int_equal(zd_future_set_error_code(fs[1], ZD_ERR_TIMEOUT, "first"), 0);
    assert_int_equal(zd_future_set_error(fs[0], "second"), 0);
    assert_false(zd_future_done(all)); /* like PyTorch's: waits for all */
    assert_int_equal(set_int(fs[2], 2), 0);
    assert_true(zd_future_done(all));
    assert_int_equal(zd_future_wait(all, ZD_TIMEOUT_NONE), -1);
    assert_string_equal(zd_error_last(), "first");
    assert_int_equal(zd_error_code(), ZD_ERR_TIMEOUT);
    assert_null(zd_future_value(all));
    zd_future_unref(all);
    for (int i = 0; i < 3; i++)
        zd_future_unref(fs[i]);

    /* a future freed before it completed can never give its value */
    zd_future_t *lone = zd_future_new();
    all = zd_future_collect_all(&lone, 1);
    zd_future_unref(lone);
    assert_true(zd_future_done(all));
    assert_non_null(strstr(zd_future_error(all), "future 0 was freed"));
    zd_future_unref(all);
}

static void test_collect_all_of_none(void **state)
{
    (void)state;
    zd_future_t *all = zd_future_collect_all(NULL, 0);
    assert_non_null(all);
    assert_true(zd_future_done(all));
    assert_int_equal(zd_value_kind(zd_future_value(all)), ZD_VALUE_LIST);
    assert_int_equal(zd_list_len(zd_future_value(all)), 0);
    zd_future_unref(all);
    zd_future_t *bad[1] = {NULL};
    assert_null(zd_future_collect_all(bad, 1));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_null(zd_future_collect_all(bad, -1));
}

/*  ---- many threads ---- */

#define N_FUT  16
#define ROUNDS 2000

typedef struct {
    pthread_barrier_t start, end;
    zd_future_t *fs[N_FUT];
    atomic_int wins[N_FUT];
    atomic_int winner_value[N_FUT]; /* 1000*thread + i of the successful set */
    atomic_int cb_calls[N_FUT];
    atomic_int failures_seen;
    atomic_int bad; /* cmocka asserts belong to the main thread */
} stress_t;

typedef struct {
    stress_t *s;
    int id;
} stress_arg_t;

static void count_cb(zd_future_t *f, void *arg)
{
    (void)f;
    atomic_fetch_add((atomic_int *)arg, 1);
}

static void *completer(void *p)
{
    stress_arg_t *a = p;
    stress_t *s = a->s;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(&s->start);
        for (int k = 0; k < N_FUT; k++) {
            int i = a->id ? N_FUT - 1 - k : k; /* the two meet in the middle */
            int code = 1000 * a->id + i;
            int rc = (i + round) % 5 == 0 ? zd_future_set_error(s->fs[i], "e%d", code)
                                          : set_int(s->fs[i], code);
            if (rc == 0) {
                atomic_fetch_add(&s->wins[i], 1);
                atomic_store(&s->winner_value[i], code);
            }
        }
        pthread_barrier_wait(&s->end);
    }
    return NULL;
}

static void *waiter(void *p)
{
    stress_arg_t *a = p;
    stress_t *s = a->s;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_barrier_wait(&s->start);
        if (a->id == 0) {
            /* callbacks racing with completion, then wait_all */
            for (int i = 0; i < N_FUT; i++)
                if (zd_future_then(s->fs[i], count_cb, &s->cb_calls[i]) < 0)
                    atomic_fetch_add(&s->bad, 1);
            if (zd_future_wait_all(s->fs, N_FUT, -1) < 0)
                atomic_fetch_add(&s->failures_seen, 1);
            for (int i = 0; i < N_FUT; i++)
                zd_future_wait(s->fs[i], -1);
        } else {
            /* wait_any until every future has been seen */
            zd_future_t *left[N_FUT];
            memcpy(left, s->fs, sizeof left);
            int n = N_FUT, index;
            while (n > 0) {
                if (zd_future_wait_any(left, n, -1, &index) < 0 || !zd_future_done(left[index])) {
                    atomic_fetch_add(&s->bad, 1);
                    break;
                }
                left[index] = left[--n];
            }
        }
        pthread_barrier_wait(&s->end);
    }
    return NULL;
}

static void test_many_threads(void **state)
{
    (void)state;
    static stress_t s;
    pthread_barrier_init(&s.start, NULL, 5);
    pthread_barrier_init(&s.end, NULL, 5);
    pthread_t th[4];
    stress_arg_t args[4] = {{&s, 0}, {&s, 1}, {&s, 0}, {&s, 1}};
    int expected_failures = 0;
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, completer, &args[i]), 0);
    for (int i = 2; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, waiter, &args[i]), 0);
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N_FUT; i++) {
            s.fs[i] = zd_future_new();
            atomic_store(&s.wins[i], 0);
            atomic_store(&s.cb_calls[i], 0);
        }
        pthread_barrier_wait(&s.start);
        pthread_barrier_wait(&s.end);
        bool any_error = false;
        for (int i = 0; i < N_FUT; i++) {
            assert_int_equal(atomic_load(&s.wins[i]), 1);
            assert_int_equal(atomic_load(&s.cb_calls[i]), 1);
            int code = atomic_load(&s.winner_value[i]);
            assert_int_equal(code % 1000, i);
            if ((i + round) % 5 == 0) {
                char want[16];
                snprintf(want, sizeof want, "e%d", code);
                assert_string_equal(zd_future_error(s.fs[i]), want);
                any_error = true;
            } else {
                assert_int_equal(value_int(s.fs[i]), code);
            }
            zd_future_unref(s.fs[i]);
        }
        expected_failures += any_error;
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&s.failures_seen), expected_failures);
    assert_int_equal(atomic_load(&s.bad), 0);
    pthread_barrier_destroy(&s.start);
    pthread_barrier_destroy(&s.end);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wait_times_out_then_completes),
        cmocka_unit_test(test_error_completion),
        cmocka_unit_test(test_only_first_completion_counts),
        cmocka_unit_test(test_callbacks_run_once_in_order),
        cmocka_unit_test(test_callback_may_drop_last_reference),
        cmocka_unit_test(test_wait_all),
        cmocka_unit_test(test_wait_all_wakes_on_failure_from_another_thread),
        cmocka_unit_test(test_wait_any),
        cmocka_unit_test(test_collect_all_values_in_order),
        cmocka_unit_test(test_collect_all_fails_with_the_first_error),
        cmocka_unit_test(test_collect_all_of_none),
        cmocka_unit_test(test_many_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
