/* SPDX-License-Identifier: MIT */
/*  Error codes beside the error texts, in worlds of real processes: a
    timeout, a handler's failure, an unknown function, a bad rank and an
    unknown worker name (which the error names), RPC not running, and a
    process that takes distributed-autograd traffic without
    zd_dist_autograd_init() (the call fails, naming the missing call,
    instead of losing the gradients), or owns parameters of a
    DistributedOptimizer without zd_dist_optim_init(). Also: zd_error_wrap keeps the code,
    a new error may quote the last one (zd_error_last() among its
    arguments), and zd_rpc_set_timeout changes the default of later calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"

#define TRY(cond)                                                                                  \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return world_fail(w, "line %d: %s (last error [%s]: %s)", __LINE__, #cond,             \
                              zd_error_code_name(zd_error_code()), zd_error_last());               \
    } while (0)

/*  ---- rank 1's functions ---- */

/*  "hold"() answers only when "release" is called: calls to it time out. */
#define MAX_HELD 8
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static zd_future_t *held[MAX_HELD];
static int n_held;

static zd_future_t *fn_hold(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_future_t *f = zd_future_new();
    pthread_mutex_lock(&held_lock);
    if (f && n_held < MAX_HELD)
        held[n_held++] = zd_future_ref(f);
    pthread_mutex_unlock(&held_lock);
    return f;
}

static zd_value_t *fn_release(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&held_lock);
    int n = n_held;
    for (int i = 0; i < n_held; i++) {
        zd_value_t *none = zd_value_none();
        zd_future_set_value(held[i], none);
        zd_value_unref(none);
        zd_future_unref(held[i]);
    }
    n_held = 0;
    pthread_mutex_unlock(&held_lock);
    return zd_value_int(n);
}

/*  "fail"(): the handler fails, with a code of its own that stays here. */
static zd_value_t *fn_fail(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_error_set_code(ZD_ERR_ARGUMENT, "bad input 7");
    return NULL;
}

static int setup(const world_t *w)
{
    (void)w;
    if (zd_rpc_register_async("hold", fn_hold, NULL) < 0 ||
        zd_rpc_register_inline("release", fn_release, NULL) < 0 ||
        zd_rpc_register("fail", fn_fail, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- the driver (rank 0) ---- */

static int driver(const world_t *w)
{
    zd_value_t *r = NULL;

    /* A timeout, waited for by zd_rpc_sync and through a future. */
    TRY(zd_rpc_sync(1, "hold", NULL, 100, &r) == -1 && !r);
    TRY(zd_error_code() == ZD_ERR_TIMEOUT);
    TRY(strstr(zd_error_last(), "timed out after 100 ms") != NULL);
    zd_future_t *f = zd_rpc_async(1, "hold", NULL, 100);
    TRY(f != NULL);
    TRY(zd_future_wait(f, ZD_TIMEOUT_DEFAULT) == -1 && zd_error_code() == ZD_ERR_TIMEOUT);
    TRY(zd_future_error_code(f) == ZD_ERR_TIMEOUT);
    zd_future_unref(f);

    /* The configured default, changed at run time. */
    TRY(zd_rpc_get_timeout() == 60000);
    TRY(zd_rpc_set_timeout(150) == 0 && zd_rpc_get_timeout() == 150);
    TRY(zd_rpc_sync(1, "hold", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_error_code() == ZD_ERR_TIMEOUT);
    TRY(strstr(zd_error_last(), "timed out after 150 ms") != NULL);
    /* ZD_TIMEOUT_DEFAULT puts the documented default back, as everywhere. */
    TRY(zd_rpc_set_timeout(ZD_TIMEOUT_DEFAULT) == 0 && zd_rpc_get_timeout() == 60000);
    TRY(zd_rpc_sync(1, "release", NULL, ZD_TIMEOUT_DEFAULT, &r) == 0);
    zd_value_unref(r);
    r = NULL;

    /* The remote handler failed: its text comes back, as a remote error. */
    TRY(zd_rpc_sync(1, "fail", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_error_code() == ZD_ERR_REMOTE);
    TRY(strstr(zd_error_last(), "remote error: bad input 7") != NULL);

    /* No such function there. */
    TRY(zd_rpc_sync(1, "no_such_fn", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_error_code() == ZD_ERR_NO_FUNCTION);
    TRY(strstr(zd_error_last(), "unknown function \"no_such_fn\" on \"worker1\"") != NULL);

    /* A bad rank, and an unknown name, which the error keeps. */
    TRY(zd_rpc_sync(7, "fail", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_error_code() == ZD_ERR_ARGUMENT);
    TRY(strstr(zd_error_last(), "no worker with rank 7") != NULL);
    TRY(zd_rpc_async(7, "fail", NULL, ZD_TIMEOUT_DEFAULT) == NULL);
    TRY(zd_error_code() == ZD_ERR_ARGUMENT);
    TRY(zd_rpc_worker("nope") == -1 && zd_error_code() == ZD_ERR_ARGUMENT);
    TRY(zd_rpc_sync(zd_rpc_worker("nope"), "fail", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(zd_error_code() == ZD_ERR_ARGUMENT);
    TRY(strstr(zd_error_last(), "no worker called \"nope\"") != NULL);
    TRY(zd_rpc_worker("worker1") == 1);
    TRY(zd_rpc_sync(-1, "fail", NULL, ZD_TIMEOUT_DEFAULT, &r) == -1);
    TRY(strstr(zd_error_last(), "no worker with rank -1") != NULL); /* the name is forgotten */

    /* A code survives context added on the way up. */
    TRY(zd_rpc_sync(1, "hold", NULL, 50, &r) == -1);
    zd_error_wrap("step %d", 3);
    TRY(zd_error_code() == ZD_ERR_TIMEOUT && strncmp(zd_error_last(), "step 3: ", 8) == 0);
    TRY(zd_rpc_sync(1, "release", NULL, ZD_TIMEOUT_DEFAULT, &r) == 0);
    zd_value_unref(r);
    return 0;
}

static int body(const world_t *w)
{
    return w->rank == 0 ? driver(w) : 0;
}

static void test_codes_of_call_failures(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2, .setup = setup, .fn = body, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- without a running agent, and the codes themselves ---- */

static void test_not_running_and_wrap(void **state)
{
    (void)state;
    zd_value_t *r = NULL;
    assert_int_equal(zd_rpc_sync(0, "fail", NULL, ZD_TIMEOUT_DEFAULT, &r), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_NOT_INITIALIZED);
    assert_non_null(strstr(zd_error_last(), "RPC is not running"));
    assert_null(zd_rpc_async(0, "fail", NULL, ZD_TIMEOUT_DEFAULT));
    assert_int_equal(zd_error_code(), ZD_ERR_NOT_INITIALIZED);
    assert_int_equal(zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_NOT_INITIALIZED);
    assert_int_equal(zd_rpc_set_timeout(10), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_NOT_INITIALIZED);
    assert_int_equal(zd_rpc_get_timeout(), 60000);
    int64_t ctx;
    assert_int_equal(zd_dist_autograd_context_begin(&ctx), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_NOT_INITIALIZED);

    assert_int_equal(zd_error_set_code(ZD_ERR_PEER, "lost %s", "w1"), -1);
    assert_int_equal(zd_error_wrap("calling %s", "f"), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_PEER);
    assert_string_equal(zd_error_last(), "calling f: lost w1");
    assert_string_equal(zd_error_code_name(zd_error_code()), "peer");
    zd_error_set("plain");
    assert_int_equal(zd_error_code(), ZD_ERR_OTHER);
    zd_error_clear();
    assert_int_equal(zd_error_code(), ZD_OK);
    zd_error_wrap("nothing before");
    assert_int_equal(zd_error_code(), ZD_ERR_OTHER);
    /* The last error among the new one's arguments (its buffer is the one
       written): it reads as it was, once. */
    zd_error_set("tensor %s has shape %s", "conv1.weight", "(32, 1, 3, 3)");
    zd_error_set_code(ZD_ERR_REMOTE, "shard %d answered badly: %s", 0, zd_error_last());
    assert_string_equal(zd_error_last(),
                        "shard 0 answered badly: tensor conv1.weight has shape (32, 1, 3, 3)");
    zd_error_set("%s, and more", zd_error_last());
    assert_string_equal(zd_error_last(),
                        "shard 0 answered badly: tensor conv1.weight has shape (32, 1, 3, 3), and "
                        "more");
    zd_error_clear();
}

/*  ---- structs that carry their size, lists of RRefs: argument errors ---- */

static void test_sizes_and_lists(void **state)
{
    (void)state;
    /* An option struct no _default() made is refused, the old bounds kept. */
    zd_dist_autograd_limits_t sizeless = {.max_contexts = 1};
    assert_int_equal(zd_dist_autograd_set_limits(&sizeless), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_dist_autograd_limits_default()"));
    zd_dist_autograd_limits_t l = zd_dist_autograd_limits_default();
    assert_int_equal(l.size, sizeof l);
    assert_int_equal(l.idle_timeout_ms, ZD_TIMEOUT_DEFAULT);
    assert_int_equal(zd_dist_autograd_set_limits(&l), 0);
    assert_int_equal(zd_dist_autograd_set_limits(NULL), 0);
    /* A backward guard is a pair or nothing. */
    assert_int_equal(zd_dist_autograd_set_backward_guard(NULL, zd_dist_optim_read_unlock), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "enter is NULL"));
    assert_int_equal(zd_dist_autograd_set_backward_guard(zd_dist_optim_read_lock, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "leave is NULL"));
    assert_int_equal(zd_dist_autograd_set_backward_guard(NULL, NULL), 0);
    assert_int_equal(zd_dist_autograd_run_guarded(NULL, NULL), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "NULL fn"));
    zd_dist_optim_owner_limits_t ol = {.max_change = 1};
    assert_int_equal(zd_dist_optim_set_owner_limits(&ol), -1);
    ol = zd_dist_optim_owner_limits_default();
    assert_int_equal(zd_dist_optim_set_owner_limits(&ol), 0);
    /* An optimizer config no zd_optim_*_defaults() made, in the limits or
       given to a DistributedOptimizer (checked before RPC is asked for). */
    zd_optim_config_t cfg_sizeless = {.kind = ZD_OPTIM_SGD, .lr = 0.1};
    ol.config = &cfg_sizeless;
    assert_int_equal(zd_dist_optim_set_owner_limits(&ol), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t.size is 0"));
    assert_null(zd_dist_optim_new(&cfg_sizeless, NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t.size is 0"));
    zd_optim_config_t sgd = zd_optim_sgd_defaults(0.1);
    ol.config = &sgd;
    assert_int_equal(zd_dist_optim_set_owner_limits(&ol), 0);
    assert_int_equal(zd_dist_optim_set_owner_limits(NULL), 0);
    zd_autograd_options_t ao = {.retain_graph = true};
    zd_autograd_root_t root = {0};
    assert_int_equal(zd_autograd_run(&root, 1, &ao), -1);
    assert_non_null(strstr(zd_error_last(), "zd_autograd_options_default()"));

    /* An out-struct is written no further than the size passed. */
    struct {
        zd_dist_autograd_stats_t s;
        int64_t newer;
    } big = {.newer = 9};
    assert_int_equal(zd_dist_autograd_stats(&big.s, sizeof big), 0);
    assert_int_equal(big.newer, 0);
    big.s.contexts = -5;
    assert_int_equal(zd_dist_autograd_stats(&big.s, sizeof big.s - 1), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(big.s.contexts, -5);
    assert_int_equal(zd_dist_autograd_stats(NULL, sizeof big.s), -1);

    /* Lists of RRefs: NULL-safe readers, refused NULL writes; an optimizer
       over no parameters is refused. */
    zd_rref_list_t *list = zd_rref_list_new();
    assert_non_null(list);
    assert_int_equal(zd_rref_list_len(list), 0);
    assert_int_equal(zd_rref_list_len(NULL), 0);
    assert_null(zd_rref_list_get(list, 0));
    assert_int_equal(zd_rref_list_append(list, NULL), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(zd_rref_list_extend(NULL, list), -1);
    assert_int_equal(zd_rref_list_extend(list, list), 0);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.1);
    assert_null(zd_dist_optim_new(&cfg, list));
    assert_non_null(strstr(zd_error_last(), "no parameters"));
    assert_null(zd_dist_optim_new(&cfg, NULL));
    zd_rref_list_free(list);
    zd_rref_list_free(NULL);

    /* A name that could not be set is reported. */
    assert_int_equal(zd_tensor_set_name(NULL, "w"), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
}

/*  ---- distributed autograd with one process missing its init ---- */

/*  "param"() -> an RRef to a 2x2 tensor owned here. */
static zd_value_t *fn_param(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    int64_t shape[2] = {2, 2};
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, 2);
    zd_value_t *v = t ? zd_value_tensor(t) : NULL;
    zd_tensor_unref(t);
    zd_rref_t *r = v ? zd_rref_new(v) : NULL;
    zd_value_unref(v);
    zd_value_t *out = r ? zd_value_rref(r) : NULL;
    zd_rref_unref(r);
    return out;
}

/*  Rank 1 calls zd_dist_autograd_init(), rank 0 neither it nor
    zd_dist_optim_init() (newuser.md B1 and its item 6). */
static int setup_half(const world_t *w)
{
    if (w->rank == 1 && zd_dist_autograd_init() < 0)
        return -1;
    if (zd_rpc_register("param", fn_param, NULL) < 0)
        return -1;
    return zd_rpc_register("identity", fn_release, NULL);
}

static int half_body(const world_t *w)
{
    int64_t ctx;
    if (w->rank == 0) {
        /* The other way round: no context without the init. */
        TRY(zd_dist_autograd_context_begin(&ctx) == -1);
        TRY(zd_error_code() == ZD_ERR_NOT_INITIALIZED);
        TRY(strstr(zd_error_last(), "zd_dist_autograd_init() was not called") != NULL);
        return 0;
    }
    TRY(zd_dist_autograd_context_begin(&ctx) == 0);
    int64_t shape[2] = {2, 2};
    zd_tensor_t *x = zd_tensor_new(ZD_FLOAT32, shape, 2);
    TRY(x != NULL);
    zd_tensor_fill_(x, 1.0f);
    zd_tensor_set_requires_grad(x, true);
    zd_value_t *args = zd_value_list(1), *r = NULL;
    TRY(args && zd_list_append(args, zd_value_tensor(x)) == 0);
    int rc = zd_rpc_sync(0, "identity", args, ZD_TIMEOUT_DEFAULT, &r);
    zd_value_unref(args);
    zd_tensor_unref(x);
    TRY(rc == -1 && !r);
    TRY(zd_error_code() == ZD_ERR_NOT_INITIALIZED);
    TRY(strstr(zd_error_last(),
               "worker \"worker0\" received a distributed-autograd message but "
               "zd_dist_autograd_init() was not called before zd_rpc_init()") != NULL);
    /* The release cannot reach rank 0's missing functions; here it is freed. */
    zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT);
    TRY(zd_dist_autograd_num_contexts() == 0);

    /* A DistributedOptimizer over a parameter of rank 0, which lacks
       zd_dist_optim_init(): the error says so. */
    TRY(zd_rpc_sync(0, "param", NULL, ZD_TIMEOUT_DEFAULT, &r) == 0);
    zd_rref_t *param;
    TRY(zd_value_get_rref(r, &param) == 0);
    zd_rref_ref(param);
    zd_value_unref(r);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.1);
    zd_rref_list_t *params = zd_rref_list_new();
    TRY(params && zd_rref_list_append(params, param) == 0);
    zd_dist_optim_t *opt = zd_dist_optim_new(&cfg, params);
    zd_rref_list_free(params);
    zd_rref_unref(param);
    TRY(!opt);
    TRY(zd_error_code() == ZD_ERR_NOT_INITIALIZED);
    TRY(strstr(zd_error_last(), "unknown function \"__dist_optim_new\"") != NULL);
    TRY(strstr(zd_error_last(),
               "zd_dist_optim_init() was not called on \"worker0\" before "
               "zd_rpc_init()") != NULL);
    return 0;
}

static void test_missing_dist_autograd_init_fails_loudly(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2, .setup = setup_half, .fn = half_body, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_running_and_wrap),
        cmocka_unit_test(test_sizes_and_lists),
        cmocka_unit_test(test_codes_of_call_failures),
        cmocka_unit_test(test_missing_dist_autograd_init_fails_loudly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
