/* SPDX-License-Identifier: MIT */
/*  Local objects behind RRefs, in a world of three real processes, through
    the public API only: an object value made by zd_rpc_remote() or handed out
    with zd_rref_new() stays on its owner, methods called through the RRef
    (from the creator and from a third worker it was forwarded to) get the
    object, to_here and plain results refuse to send it, and the owner frees
    it exactly when the last RRef to it anywhere is released. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define NOT_SENDABLE                                                                               \
    "a local object (Counter) cannot be sent to another process; "                                 \
    "send an RRef to it instead"

/*  ---- the object: a counter, and how many this process made and freed ---- */

typedef struct {
    atomic_llong value;
} counter_t;

static atomic_int n_made, n_freed;

static void counter_free(void *p)
{
    atomic_fetch_add(&n_freed, 1);
    free(p);
}

/*  A new Counter value starting at args[0]. */
static zd_value_t *new_counter(const zd_value_t *args)
{
    int64_t start;
    if (zd_rpc_arg_int(args, 0, &start) < 0)
        return NULL;
    counter_t *c = malloc(sizeof *c);
    if (!c) {
        zd_error_set("out of memory");
        return NULL;
    }
    atomic_init(&c->value, start);
    atomic_fetch_add(&n_made, 1);
    return zd_value_object(c, counter_free, "Counter");
}

/*  "Counter"(start): the object itself, kept by zd_rpc_remote on this process. */
static zd_value_t *fn_counter(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return new_counter(args);
}

/*  "Counter.add"(counter, k) -> the new count: a method. */
static zd_value_t *fn_add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    void *c;
    int64_t k;
    if (zd_rpc_arg_object(args, 0, "Counter", &c) < 0 || zd_rpc_arg_int(args, 1, &k) < 0)
        return NULL;
    return zd_value_int(atomic_fetch_add(&((counter_t *)c)->value, k) + k);
}

/*  "counter_rref"(start) -> RRef: made here with zd_rref_new and handed out. */
static zd_value_t *fn_counter_rref(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *v = new_counter(args);
    zd_rref_t *r = v ? zd_rref_new(v) : NULL;
    zd_value_unref(v);
    zd_value_t *out = r ? zd_value_rref(r) : NULL;
    zd_rref_unref(r);
    return out;
}

/*  "counter_value"(start): tries to send the object itself. */
static zd_value_t *fn_counter_value(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return new_counter(args);
}

/*  On the owner, its own RRef gives the object back as it is. */
static zd_value_t *fn_own_rref(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *v = new_counter(args), *got = NULL;
    zd_rref_t *r = v ? zd_rref_new(v) : NULL;
    void *a, *b;
    int ok = r && zd_rref_to_here(r, -1, &got) == 0 && zd_value_get_object(v, "Counter", &a) == 0 &&
        zd_value_get_object(got, "Counter", &b) == 0 && a == b;
    zd_value_unref(got);
    zd_value_unref(v);
    zd_rref_unref(r);
    return ok ? zd_value_int(1) : NULL;
}

/*  A third worker: RRefs it keeps, methods it calls through them. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static zd_rref_t *kept;

static zd_value_t *fn_keep(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_rref_t *r;
    if (zd_rpc_arg_rref(args, 0, &r) < 0)
        return NULL;
    pthread_mutex_lock(&kept_lock);
    zd_rref_unref(kept);
    kept = zd_rref_ref(r);
    pthread_mutex_unlock(&kept_lock);
    return zd_value_none();
}

static zd_value_t *fn_drop(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&kept_lock);
    zd_rref_unref(kept);
    kept = NULL;
    pthread_mutex_unlock(&kept_lock);
    return zd_value_none();
}

/*  "add_kept"(k): Counter.add through the kept RRef. */
static zd_value_t *fn_add_kept(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    pthread_mutex_lock(&kept_lock);
    zd_rref_t *r = zd_rref_ref(kept);
    pthread_mutex_unlock(&kept_lock);
    zd_value_t *res = NULL;
    if (!r)
        zd_error_set("no RRef kept");
    else if (zd_rref_rpc_sync(r, "Counter.add", args, -1, &res) < 0)
        res = NULL;
    zd_rref_unref(r);
    return res;
}

/*  "stats"() -> [made, freed, owned values] of this process. */
static zd_value_t *fn_stats(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd__rpc_args("iii", (int64_t)atomic_load(&n_made), (int64_t)atomic_load(&n_freed),
                        zd_rpc_debug_owner_rrefs());
}

static zd_value_t *fn_drain(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_rref_drain(10000) < 0 ? NULL : zd_value_none();
}

static int setup(const world_t *w)
{
    (void)w;
    if (zd_rpc_register("Counter", fn_counter, NULL) < 0 ||
        zd_rpc_register("Counter.add", fn_add, NULL) < 0 ||
        zd_rpc_register("counter_rref", fn_counter_rref, NULL) < 0 ||
        zd_rpc_register("counter_value", fn_counter_value, NULL) < 0 ||
        zd_rpc_register("own_rref", fn_own_rref, NULL) < 0 ||
        zd_rpc_register("keep", fn_keep, NULL) < 0 || zd_rpc_register("drop", fn_drop, NULL) < 0 ||
        zd_rpc_register("add_kept", fn_add_kept, NULL) < 0 ||
        zd_rpc_register("stats", fn_stats, NULL) < 0 ||
        zd_rpc_register("drain", fn_drain, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- the driver (rank 0) ---- */

/*  The int result of fn(args) on rank `to` (args taken over), or -1. */
static int64_t call_int(int to, const char *fn, zd_value_t *args)
{
    zd_value_t *r = NULL;
    int64_t v = -1;
    if (args && zd_rpc_sync(to, fn, args, -1, &r) == 0 && zd_value_get_int(r, &v) < 0)
        v = -1;
    zd_value_unref(r);
    zd_value_unref(args);
    return v;
}

/*  fn(args) on rank `to` (args taken over), for its effect: 0, or -1. */
static int call_ok(int to, const char *fn, zd_value_t *args)
{
    zd_value_t *r = NULL;
    int rc = args ? zd_rpc_sync(to, fn, args, -1, &r) : -1;
    zd_value_unref(r);
    zd_value_unref(args);
    return rc;
}

static int64_t method_int(zd_rref_t *r, int64_t k)
{
    zd_value_t *a = zd__rpc_args("i", k), *res = NULL;
    int64_t v = -1;
    if (a && zd_rref_rpc_sync(r, "Counter.add", a, -1, &res) == 0 && zd_value_get_int(res, &v) < 0)
        v = -1;
    zd_value_unref(res);
    zd_value_unref(a);
    return v;
}

/*  Every process has no RRef message in flight, twice round, so that
    releases that depend on earlier ones have arrived too. */
static int drain_all(int world)
{
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < world; r++)
            if (call_ok(r, "drain", zd__rpc_args("")) < 0)
                return -1;
    return 0;
}

/*  Counters made and freed on `rank`, and the values it owns. */
static int stats_of(int rank, int64_t *made, int64_t *freed, int64_t *owned)
{
    zd_value_t *r;
    if (zd_rpc_sync(rank, "stats", NULL, -1, &r) < 0)
        return -1;
    int rc = zd_rpc_arg_int(r, 0, made) | zd_rpc_arg_int(r, 1, freed) | zd_rpc_arg_int(r, 2, owned);
    zd_value_unref(r);
    return rc;
}

static int driver(const world_t *w)
{
    int64_t made, freed, owned, base_owned;
    WCHECK(stats_of(1, &made, &freed, &base_owned) == 0 && made == 0);

    /* zd_rpc_remote keeps the object on rank 1; methods get it. */
    zd_value_t *a = zd__rpc_args("i", (int64_t)10), *v = NULL;
    zd_rref_t *r = zd_rpc_remote(1, "Counter", a, -1);
    zd_value_unref(a);
    WCHECK(r != NULL);
    WCHECK(method_int(r, 5) == 15);
    a = zd__rpc_args("i", (int64_t)1);
    zd_future_t *f = zd_rref_rpc_async(r, "Counter.add", a, -1);
    WCHECK(f && zd_future_wait(f, ZD_TIMEOUT_NONE) == 0);
    WCHECK(zd_value_get_int(zd_future_value(f), &made) == 0 && made == 16);
    zd_future_unref(f);
    zd_rref_t *sum = zd_rref_remote(r, "Counter.add", a, -1); /* an int, kept there */
    zd_value_unref(a);
    WCHECK(sum && zd_rref_to_here(sum, -1, &v) == 0);
    WCHECK(zd_value_get_int(v, &made) == 0 && made == 17);
    zd_value_unref(v);
    zd_rref_unref(sum);

    /* The object itself cannot come here. */
    WCHECK(zd_rref_to_here(r, -1, &v) == -1 && !v);
    WCHECK(strstr(zd_error_last(), NOT_SENDABLE) != NULL);

    /* A third worker gets a fork and calls through it. */
    WCHECK(call_ok(2, "keep", zd__rpc_args("r", r)) == 0);
    WCHECK(call_int(2, "add_kept", zd__rpc_args("i", (int64_t)100)) == 117);

    /* Our release is not the last one: the counter lives on. */
    zd_rref_unref(r);
    WCHECK(drain_all(w->world_size) == 0);
    WCHECK(stats_of(1, &made, &freed, &owned) == 0);
    WCHECK(made == 1 && freed == 0);
    WCHECK(call_int(2, "add_kept", zd__rpc_args("i", (int64_t)1)) == 118);
    /* The third worker's is: the owner frees the object. */
    WCHECK(call_ok(2, "drop", zd__rpc_args("")) == 0);
    WCHECK(drain_all(w->world_size) == 0);
    WCHECK(stats_of(1, &made, &freed, &owned) == 0);
    WCHECK(made == 1 && freed == 1 && owned == base_owned);

    /* An RRef the owner made with zd_rref_new and handed out. */
    zd_value_t *res;
    a = zd__rpc_args("i", (int64_t)1);
    WCHECK(zd_rpc_sync(1, "counter_rref", a, -1, &res) == 0);
    zd_value_unref(a);
    zd_rref_t *r2;
    WCHECK(zd_value_get_rref(res, &r2) == 0);
    zd_rref_ref(r2);
    zd_value_unref(res);
    WCHECK(zd_rref_owner(r2) == 1 && method_int(r2, 2) == 3);
    WCHECK(zd_rref_to_here(r2, -1, &v) == -1 && strstr(zd_error_last(), NOT_SENDABLE));
    WCHECK(drain_all(w->world_size) == 0);
    WCHECK(stats_of(1, &made, &freed, &owned) == 0 && made == 2 && freed == 1);
    zd_rref_unref(r2);
    WCHECK(drain_all(w->world_size) == 0);
    WCHECK(stats_of(1, &made, &freed, &owned) == 0 && freed == 2 && owned == base_owned);

    /* A plain result cannot be an object: the call fails, the object is freed. */
    a = zd__rpc_args("i", (int64_t)1);
    WCHECK(zd_rpc_sync(1, "counter_value", a, -1, &res) == -1);
    zd_value_unref(a);
    WCHECK(strstr(zd_error_last(), "cannot send the result of \"counter_value\"") != NULL);
    WCHECK(strstr(zd_error_last(), NOT_SENDABLE) != NULL);
    WCHECK(stats_of(1, &made, &freed, &owned) == 0 && made == 3 && freed == 3);

    /* Nor an argument: refused before anything is sent. */
    a = zd__rpc_args("i", (int64_t)0);
    v = new_counter(a);
    zd_value_unref(a);
    a = zd__rpc_args("v", v);
    WCHECK(zd_rpc_sync(1, "Counter.add", a, -1, &res) == -1 &&
           strstr(zd_error_last(), NOT_SENDABLE));
    zd_value_unref(a);
    WCHECK(atomic_load(&n_made) == 1 && atomic_load(&n_freed) == 1);

    /* On the owner, its own RRef's value is the object itself. */
    WCHECK(call_int(1, "own_rref", zd__rpc_args("i", (int64_t)0)) == 1);
    WCHECK(drain_all(w->world_size) == 0);
    WCHECK(stats_of(1, &made, &freed, &owned) == 0 && made == 4 && freed == 4 &&
           owned == base_owned);
    return 0;
}

static int body(const world_t *w)
{
    return w->rank == 0 ? driver(w) : 0;
}

static void test_objects_behind_rrefs(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = setup, .fn = body, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_objects_behind_rrefs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
