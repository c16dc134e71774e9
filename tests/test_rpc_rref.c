/* SPDX-License-Identifier: MIT */
/*  Remote references (SPEC R4, R5, R6): remote + to_here, methods at the
    owner, RRefs as arguments and results (also user to third user), and
    distributed reference counting: the owner's count of live values goes
    back to zero after create / fork / release sequences, and never frees a
    value someone still holds. Real processes over loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/agent/agent.h"
#include "rpc/agent/rref.h"
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

/*  ---- handlers served by every process ---- */

/*  A float tensor of n elements, all v. */
static zd_value_t *h_make_tensor(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t n;
    double v;
    if (zd_rpc_arg_int(args, 0, &n) < 0 || zd_rpc_arg_float(args, 1, &v) < 0)
        return NULL;
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, &n, 1);
    zd_tensor_fill_(t, (float)v);
    zd_value_t *r = zd_value_tensor(t);
    zd_tensor_unref(t);
    return r;
}

static double tensor_total(zd_tensor_t *t)
{
    double s = 0;
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        s += zd_tensor_data(t)[i];
    return s;
}

/*  A method: args[0] is the RRef's value (a tensor), args[1] a factor. */
static zd_value_t *h_sum(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_tensor_t *t;
    double k = 1;
    if (zd_rpc_arg_tensor(args, 0, &t) < 0)
        return NULL;
    if (zd_list_len(args) > 1 && zd_rpc_arg_float(args, 1, &k) < 0)
        return NULL;
    return zd_value_float(tensor_total(t) * k);
}

static zd_value_t *h_scaled(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_tensor_t *t, *y;
    double k;
    if (zd_rpc_arg_tensor(args, 0, &t) < 0 || zd_rpc_arg_float(args, 1, &k) < 0 ||
        zd_tensor_scale(t, (float)k, &y) < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(y);
    zd_tensor_unref(y);
    return v;
}

/*  A third worker fetches through an RRef it was given. */
static zd_value_t *h_to_here_sum(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rref_t *r;
    zd_value_t *v;
    zd_tensor_t *t;
    if (zd_rpc_arg_rref(args, 0, &r) < 0 || zd_rref_to_here(r, -1, &v) < 0)
        return NULL;
    if (zd_value_get_tensor(v, &t) < 0) {
        zd_value_unref(v);
        return NULL;
    }
    double s = tensor_total(t);
    zd_value_unref(v);
    return zd_value_float(s);
}

/*  Where the RRef is the owner's own: is_owner and local_value work. */
static zd_value_t *h_local_sum(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rref_t *r;
    zd_value_t *v;
    zd_tensor_t *t;
    if (zd_rpc_arg_rref(args, 0, &r) < 0)
        return NULL;
    if (!zd_rref_is_owner(r))
        return zd_value_string("not owner");
    if (zd_rref_local_value(r, &v) < 0)
        return NULL;
    if (zd_value_get_tensor(v, &t) < 0) {
        zd_value_unref(v);
        return NULL;
    }
    double s = tensor_total(t);
    zd_value_unref(v);
    return zd_value_float(s);
}

/*  RRefs kept by this process until drop_kept. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static zd_rref_t *kept[64];
static int n_kept;

static zd_value_t *h_keep(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rref_t *r;
    if (zd_rpc_arg_rref(args, 0, &r) < 0)
        return NULL;
    pthread_mutex_lock(&kept_lock);
    kept[n_kept++] = zd_rref_ref(r);
    pthread_mutex_unlock(&kept_lock);
    return zd_value_int(zd_rref_confirmed_by_owner(r) || !zd_rref_confirmed_by_owner(r));
}

static zd_value_t *h_drop_kept(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    pthread_mutex_lock(&kept_lock);
    int n = n_kept;
    for (int i = 0; i < n_kept; i++)
        zd_rref_unref(kept[i]);
    n_kept = 0;
    pthread_mutex_unlock(&kept_lock);
    return zd_value_int(n);
}

/*  A user forwards its RRef to another user, who keeps it. */
static zd_value_t *h_forward_keep(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rref_t *r;
    int64_t to;
    if (zd_rpc_arg_rref(args, 0, &r) < 0 || zd_rpc_arg_int(args, 1, &to) < 0)
        return NULL;
    zd_value_t *fwd = zd__rpc_args("r", r), *res = NULL;
    int rc = zd_rpc_sync((int)to, "keep", fwd, -1, &res);
    zd_value_unref(fwd);
    if (rc < 0)
        return NULL;
    return res;
}

/*  A user forwards its RRef to another user, who fetches it: the sum. */
static zd_value_t *h_forward_sum(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_rref_t *r;
    int64_t to;
    if (zd_rpc_arg_rref(args, 0, &r) < 0 || zd_rpc_arg_int(args, 1, &to) < 0)
        return NULL;
    zd_value_t *fwd = zd__rpc_args("r", r), *res = NULL;
    int rc = zd_rpc_sync((int)to, "to_here_sum", fwd, -1, &res);
    zd_value_unref(fwd);
    return rc < 0 ? NULL : res;
}

/*  Fork requests that waited here for their parent to become a holder. */
static zd_value_t *h_waited(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    agent_t *a = zd__agent_try_acquire();
    int64_t n = 0;
    if (a) {
        pthread_mutex_lock(&a->rrefs->lock);
        n = a->rrefs->n_waited;
        pthread_mutex_unlock(&a->rrefs->lock);
    }
    zd__agent_release(a);
    return zd_value_int(n);
}

/*  An RRef as a result: owned by the callee. */
static zd_value_t *h_make_rref(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t v;
    if (zd_rpc_arg_int(args, 0, &v) < 0)
        return NULL;
    zd_value_t *value = zd_value_int(v);
    zd_rref_t *r = zd_rref_new(value);
    zd_value_unref(value);
    if (!r)
        return NULL;
    zd_value_t *out = zd_value_rref(r);
    zd_rref_unref(r);
    return out;
}

static zd_value_t *h_drain(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    if (zd_rref_drain(10000) < 0)
        return NULL;
    return zd_value_none();
}

/*  Arms the drop of the next message of wire type args[0] arriving here;
    answers how many the previous arming had left to drop. */
static zd_value_t *h_drop_next(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t type, count;
    if (zd_rpc_arg_int(args, 0, &type) < 0 || zd_rpc_arg_int(args, 1, &count) < 0)
        return NULL;
    return zd_value_int(zd__transport_drop_next((uint8_t)type, (int)count));
}

static zd_value_t *h_drain_long(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    if (zd_rref_drain(world_scaled_ms(20000)) < 0)
        return NULL;
    return zd_value_none();
}

/*  "slow" answers 99 only on "release_slow". */
static world_hold_t slow = {.answer = 99};

static int start_with(int rank, int world, int port, int64_t rpc_timeout_ms)
{
    if (zd_rpc_register("make_tensor", h_make_tensor, NULL) < 0 ||
        zd_rpc_register("sum", h_sum, NULL) < 0 || zd_rpc_register("scaled", h_scaled, NULL) < 0 ||
        zd_rpc_register("to_here_sum", h_to_here_sum, NULL) < 0 ||
        zd_rpc_register("local_sum", h_local_sum, NULL) < 0 ||
        zd_rpc_register("keep", h_keep, NULL) < 0 ||
        zd_rpc_register("drop_kept", h_drop_kept, NULL) < 0 ||
        zd_rpc_register("forward_keep", h_forward_keep, NULL) < 0 ||
        zd_rpc_register("forward_sum", h_forward_sum, NULL) < 0 ||
        zd_rpc_register_inline("waited", h_waited, NULL) < 0 ||
        zd_rpc_register("make_rref", h_make_rref, NULL) < 0 ||
        zd_rpc_register_inline("owner_count", world_h_owner_count, NULL) < 0 ||
        zd_rpc_register("drain", h_drain, NULL) < 0 ||
        zd_rpc_register("fail", world_h_fail, "no value for you") < 0 ||
        zd_rpc_register_async("slow", world_h_hold, &slow) < 0 ||
        zd_rpc_register_inline("release_slow", world_h_release, &slow) < 0 ||
        zd_rpc_register_inline("drop_next", h_drop_next, NULL) < 0 ||
        zd_rpc_register("drain_long", h_drain_long, NULL) < 0)
        return -1;
    zd_rpc_options_t o = world_rpc_options(port);
    if (rpc_timeout_ms)
        o.rpc_timeout_ms = rpc_timeout_ms;
    return zd_rpc_init(NULL, rank, world, &o);
}

static int start(int rank, int world, int port)
{
    return start_with(rank, world, port, 0);
}

/*  ---- helpers on the driving process ---- */

static double call_float(int to, const char *fn, zd_value_t *args)
{
    zd_value_t *r = NULL;
    double v = -1;
    if (zd_rpc_sync(to, fn, args, -1, &r) == 0)
        zd_value_get_float(r, &v);
    zd_value_unref(r);
    zd_value_unref(args);
    return v;
}

/*  Every process has no RRef message in flight, in order: the releases of
    the earlier ones may be what the later ones wait for. drain_fn is the
    handler that waits ("drain", or "drain_long"). */
static int drain_every(int world, const char *drain_fn)
{
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < world; r++) {
            zd_value_t *res;
            if (zd_rpc_sync(r, drain_fn, NULL, -1, &res) < 0)
                return -1;
            zd_value_unref(res);
        }
    return 0;
}

static int drain_all(int world)
{
    return drain_every(world, "drain");
}

static zd_rref_t *remote_tensor(int owner, int64_t n, double v)
{
    zd_value_t *args = zd__rpc_args("if", n, v);
    zd_rref_t *r = zd_rpc_remote(owner, "make_tensor", args, -1);
    zd_value_unref(args);
    return r;
}

/*  ---- remote, to_here, methods ---- */

static int world_basics(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port) == 0);
    if (w->rank == 0) {
        zd_rref_t *r = remote_tensor(1, 10, 1.5);
        WCHECK(r != NULL);
        WCHECK(zd_rref_owner(r) == 1 && !zd_rref_is_owner(r));
        WCHECK(strcmp(zd_rref_owner_name(r), "worker1") == 0);
        zd_value_t *v;
        WCHECK(zd_rref_to_here(r, -1, &v) == 0);
        zd_tensor_t *t;
        WCHECK(zd_value_get_tensor(v, &t) == 0 && zd_tensor_numel(t) == 10);
        WCHECK(tensor_total(t) == 15.0);
        zd_value_unref(v);
        WCHECK(zd_rref_local_value(r, &v) == -1);
        WCHECK(strstr(zd_error_last(), "owned by \"worker1\" (rank 1)") != NULL);
        /* Methods run at the owner with the value first. */
        zd_value_t *k = zd__rpc_args("f", 2.0), *res;
        WCHECK(zd_rref_rpc_sync(r, "sum", k, -1, &res) == 0);
        double d;
        WCHECK(zd_value_get_float(res, &d) == 0 && d == 30.0);
        zd_value_unref(res);
        zd_future_t *f = zd_rref_rpc_async(r, "sum", k, -1);
        WCHECK(zd_future_wait(f, 10000) == 0);
        WCHECK(zd_value_get_float(zd_future_value(f), &d) == 0 && d == 30.0);
        zd_future_unref(f);
        zd_rref_t *r2 = zd_rref_remote(r, "scaled", k, -1); /* stays at the owner */
        WCHECK(r2 && zd_rref_owner(r2) == 1);
        WCHECK(call_float(2, "to_here_sum", zd__rpc_args("r", r2)) == 30.0);
        zd_value_unref(k);
        /* The owner sees its own RRef when it comes back to it. */
        WCHECK(call_float(1, "local_sum", zd__rpc_args("r", r)) == 15.0);
        /* An RRef as a result, owned by the callee. */
        zd_value_t *five = zd__rpc_args("i", (int64_t)5);
        WCHECK(zd_rpc_sync(2, "make_rref", five, -1, &res) == 0);
        zd_value_unref(five);
        zd_rref_t *r3;
        WCHECK(zd_value_get_rref(res, &r3) == 0 && zd_rref_owner(r3) == 2);
        WCHECK(zd_rref_to_here(r3, -1, &v) == 0);
        int64_t i;
        WCHECK(zd_value_get_int(v, &i) == 0 && i == 5);
        zd_value_unref(v);
        WCHECK(zd_rref_confirmed_by_owner(r3)); /* the owner forked it to us */
        zd_value_unref(res);                    /* and with it r3 */
        /* remote to oneself: the owner's handle. */
        zd_rref_t *mine = remote_tensor(0, 4, 2.0);
        WCHECK(mine && zd_rref_is_owner(mine) && zd_rref_confirmed_by_owner(mine));
        WCHECK(zd_rref_local_value(mine, &v) == 0);
        WCHECK(zd_value_get_tensor(v, &t) == 0 && tensor_total(t) == 8.0);
        zd_value_unref(v);
        WCHECK(call_float(1, "to_here_sum", zd__rpc_args("r", mine)) == 8.0);
        zd_rref_unref(mine);
        zd_rref_unref(r);
        zd_rref_unref(r2);
        WCHECK(drain_all(w->world_size) == 0);
        for (int peer = 0; peer < w->world_size; peer++)
            WCHECK(world_call_int(peer, "owner_count") == 0);
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(10000)) == 0);
    return 0;
}

static void test_remote_to_here_and_methods(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 60, world_basics, NULL), 0);
}

/*  ---- distributed reference counting ---- */

static int64_t count_on(int owner)
{
    return world_call_int(owner, "owner_count");
}

static int world_refcount(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port) == 0);
    if (w->rank == 0) {
        const int owner = 1;
        /* create, release */
        zd_rref_t *r = remote_tensor(owner, 8, 1.0);
        zd_value_t *v;
        WCHECK(zd_rref_to_here(r, -1, &v) == 0);
        zd_value_unref(v);
        WCHECK(count_on(owner) == 1);
        zd_rref_unref(r);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 0);

        /* create, fork to a third process that keeps it, release here:
           the owner keeps the value for the third process. */
        r = remote_tensor(owner, 8, 2.0);
        zd_value_t *args = zd__rpc_args("r", r), *res;
        WCHECK(zd_rpc_sync(2, "keep", args, -1, &res) == 0);
        zd_value_unref(res);
        zd_value_unref(args);
        zd_rref_unref(r);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 1);
        /* never earlier: the keeper can still use it */
        WCHECK(world_call_int(2, "drop_kept") == 1);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 0);

        /* released right after forking, before anyone confirmed anything:
           G2 keeps the parent until the child is accepted. */
        for (int k = 0; k < 8; k++) {
            r = remote_tensor(owner, 4, 1.0);
            WCHECK(zd_rref_to_here(r, -1, &v) == 0); /* confirmed: its delete goes at once */
            zd_value_unref(v);
            args = zd__rpc_args("r", r);
            zd_future_t *f = zd_rpc_async(2, "to_here_sum", args, -1);
            zd_value_unref(args);
            zd_rref_unref(r);
            WCHECK(zd_future_wait(f, 10000) == 0);
            double d;
            WCHECK(zd_value_get_float(zd_future_value(f), &d) == 0 && d == 4.0);
            zd_future_unref(f);
        }
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 0);

        /* user -> user -> user: 0 forks to 2, 2 forwards to 3, 3 keeps */
        r = remote_tensor(owner, 8, 3.0);
        args = zd__rpc_args("ri", r, (int64_t)3);
        WCHECK(zd_rpc_sync(2, "forward_keep", args, -1, &res) == 0);
        zd_value_unref(res);
        zd_value_unref(args);
        zd_rref_unref(r);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 1);
        WCHECK(world_call_int(3, "drop_kept") == 1);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 0);

        /* the owner forks to users, and a user hands it back to the owner */
        args = zd__rpc_args("i", (int64_t)7);
        WCHECK(zd_rpc_sync(owner, "make_rref", args, -1, &res) == 0);
        zd_value_unref(args);
        zd_rref_t *back;
        WCHECK(zd_value_get_rref(res, &back) == 0);
        args = zd__rpc_args("r", back);
        WCHECK(zd_rpc_sync(owner, "keep", args, -1, &v) == 0); /* the owner keeps its own */
        zd_value_unref(v);
        zd_value_unref(args);
        zd_value_unref(res);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 1);
        WCHECK(world_call_int(owner, "drop_kept") == 1);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 0);

        /* many users at once */
        r = remote_tensor(owner, 2, 1.0);
        for (int peer = 0; peer < w->world_size; peer++)
            for (int k = 0; k < 3; k++) {
                args = zd__rpc_args("r", r);
                WCHECK(zd_rpc_sync(peer, "keep", args, -1, &v) == 0);
                zd_value_unref(v);
                zd_value_unref(args);
            }
        zd_rref_unref(r);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(count_on(owner) == 1);
        for (int peer = 0; peer < w->world_size; peer++) {
            WCHECK(world_call_int(peer, "drop_kept") == 3);
            WCHECK(drain_all(w->world_size) == 0);
            WCHECK(count_on(owner) == (peer + 1 < w->world_size ? 1 : 0));
        }
        for (int peer = 0; peer < w->world_size; peer++)
            WCHECK(world_call_int(peer, "owner_count") == 0);
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(10000)) == 0);
    return 0;
}

static void test_owner_frees_exactly_when_no_user_holds(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(4, 60, world_refcount, NULL), 0);
}

/*  ---- failures ---- */

static int world_rref_errors(const world_t *w)
{
    WCHECK(start(w->rank, w->world_size, w->port) == 0);
    if (w->rank == 0) {
        zd_value_t *v;
        /* The function fails at the owner: to_here says why. */
        zd_rref_t *r = zd_rpc_remote(1, "fail", NULL, -1);
        WCHECK(r != NULL);
        WCHECK(zd_rref_to_here(r, -1, &v) == -1);
        WCHECK(strstr(zd_error_last(), "no value for you") != NULL);
        WCHECK(strstr(zd_error_last(), "\"worker1\" (rank 1)") != NULL);
        zd_rref_unref(r);
        /* Unknown function. */
        r = zd_rpc_remote(1, "nosuch", NULL, -1);
        WCHECK(zd_rref_to_here(r, -1, &v) == -1);
        WCHECK(strstr(zd_error_last(), "unknown function \"nosuch\"") != NULL);
        zd_rref_unref(r);
        /* A value slow to come: to_here times out, then it comes. */
        r = zd_rpc_remote(1, "slow", NULL, -1);
        WCHECK(zd_rref_to_here(r, 200, &v) == -1);
        WCHECK(strstr(zd_error_last(), "timed out after 200 ms") != NULL);
        while (world_call_int(1, "release_slow") == 0) {
        }
        WCHECK(zd_rref_to_here(r, -1, &v) == 0);
        int64_t i;
        WCHECK(zd_value_get_int(v, &i) == 0 && i == 99);
        zd_value_unref(v);
        zd_rref_unref(r);
        /* Creation that times out poisons the RRef; the owner still frees
           the value once it is released. */
        r = zd_rpc_remote(1, "slow", NULL, 200);
        zd_future_t *done = zd_rref_rpc_async(r, "sum", NULL, -1); /* waits at the owner */
        WCHECK(zd_rref_to_here(r, 1000, &v) == -1); /* outlives the creation timeout */
        WCHECK(strstr(zd_error_last(), "timed out after 1000 ms") != NULL);
        WCHECK(zd_rref_to_here(r, -1, &v) == -1);
        WCHECK(strstr(zd_error_last(), "RRef creation via zd_rpc_remote() failed") != NULL);
        WCHECK(strstr(zd_error_last(), "timed out after 200 ms") != NULL);
        while (world_call_int(1, "release_slow") == 0) {
        }
        WCHECK(zd_future_wait(done, 10000) == -1); /* the method ran on the late value */
        WCHECK(strstr(zd_future_error(done), "argument 0: expected tensor, got int") != NULL);
        zd_future_unref(done);
        zd_rref_unref(r);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(world_call_int(1, "owner_count") == 0);
        /* Methods on a failed value fail. */
        r = zd_rpc_remote(1, "fail", NULL, -1);
        WCHECK(zd_rref_rpc_sync(r, "sum", NULL, -1, &v) == -1);
        WCHECK(strstr(zd_error_last(), "no value for you") != NULL);
        zd_rref_unref(r);
        WCHECK(drain_all(w->world_size) == 0);
        WCHECK(world_call_int(1, "owner_count") == 0);
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(10000)) == 0);
    return 0;
}

static void test_rref_failures(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_rref_errors, NULL), 0);
}

/*  ---- control messages lost on the way ---- */

static int drop_next(int rank, int type, int count)
{
    zd_value_t *args = zd__rpc_args("ii", (int64_t)type, (int64_t)count), *r = NULL;
    int64_t left = -1;
    if (zd_rpc_sync(rank, "drop_next", args, -1, &r) == 0)
        zd_value_get_int(r, &left);
    zd_value_unref(r);
    zd_value_unref(args);
    return (int)left;
}

/*  A lost RREF_USER_DELETE, RREF_FORK_REQUEST or RREF_CHILD_ACCEPT is sent
    again within seconds, well inside this world's RPC timeout of 60 s that
    each attempt used to wait for; the drains are bounded by 20 s (both
    scaled alike under the sanitizers).
    Rank 1 owns, rank 0 drives, rank 2 is a third user. */
static int world_lost_control(const world_t *w)
{
    WCHECK(start_with(w->rank, w->world_size, w->port, world_scaled_ms(60000)) == 0);
    if (w->rank == 0) {
        zd_value_t *v;
        /* The user's deletion. */
        zd_rref_t *r = remote_tensor(1, 4, 2.0);
        WCHECK(zd_rref_to_here(r, -1, &v) == 0);
        zd_value_unref(v);
        WCHECK(drop_next(1, RPC_MSG_RREF_USER_DELETE, 1) == 0);
        zd_rref_unref(r);
        WCHECK(zd_rref_drain(world_scaled_ms(20000)) == 0);
        WCHECK(drop_next(1, RPC_MSG_RREF_USER_DELETE, 0) == 0); /* it was dropped */
        WCHECK(world_call_int(1, "owner_count") == 0);

        /* A third user's fork request, then the child's accept to its parent. */
        static const int lost[] = {RPC_MSG_RREF_FORK_REQUEST, RPC_MSG_RREF_CHILD_ACCEPT};
        for (int k = 0; k < 2; k++) {
            int at = lost[k] == RPC_MSG_RREF_FORK_REQUEST ? 1 : 0;
            r = remote_tensor(1, 4, 2.0);
            WCHECK(zd_rref_to_here(r, -1, &v) == 0);
            zd_value_unref(v);
            WCHECK(drop_next(at, lost[k], 1) == 0);
            zd_value_t *args = zd__rpc_args("r", r);
            zd_value_t *res = NULL;
            WCHECK(zd_rpc_sync(2, "keep", args, -1, &res) == 0);
            zd_value_unref(res);
            zd_value_unref(args);
            zd_rref_unref(r);
            WCHECK(drain_every(w->world_size, "drain_long") == 0);
            WCHECK(drop_next(at, lost[k], 0) == 0);
            WCHECK(world_call_int(1, "owner_count") == 1); /* rank 2 holds it */
            WCHECK(world_call_int(2, "drop_kept") == 1);
            WCHECK(drain_every(w->world_size, "drain_long") == 0);
            WCHECK(world_call_int(1, "owner_count") == 0);
        }
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(20000)) == 0);
    return 0;
}

static void test_lost_control_messages_are_sent_again(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 120, world_lost_control, NULL), 0);
}

/*  ---- a fork request that reaches the owner before its parent's ---- */

/*  Rank 1 owns, rank 0 creates, rank 2 forwards to rank 3, which fetches.
    The owner drops rank 2's fork request once: rank 3's arrives while its
    parent (rank 2) holds nothing yet, and waits, and so does rank 3's
    fetch, until rank 2's request comes again (a second later) and makes
    rank 2 a holder: both are accepted, the fetch answered. */
static int world_fork_waits(const world_t *w)
{
    WCHECK(start_with(w->rank, w->world_size, w->port, world_scaled_ms(60000)) == 0);
    if (w->rank == 0) {
        zd_rref_t *r = remote_tensor(1, 4, 2.5);
        zd_value_t *v;
        WCHECK(zd_rref_to_here(r, -1, &v) == 0); /* rank 0 is a holder */
        zd_value_unref(v);
        WCHECK(drop_next(1, RPC_MSG_RREF_FORK_REQUEST, 1) == 0);
        WCHECK(call_float(2, "forward_sum", zd__rpc_args("ri", r, (int64_t)3)) == 10.0);
        WCHECK(drop_next(1, RPC_MSG_RREF_FORK_REQUEST, 0) == 0); /* it was dropped */
        WCHECK(world_call_int(1, "waited") >= 1);
        zd_rref_unref(r);
        WCHECK(drain_every(w->world_size, "drain_long") == 0);
        WCHECK(world_call_int(1, "owner_count") == 0);
    }
    WCHECK(zd_rpc_shutdown(true, world_scaled_ms(20000)) == 0);
    return 0;
}

static void test_fork_request_waits_for_its_parent(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(4, 120, world_fork_waits, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_remote_to_here_and_methods),
        cmocka_unit_test(test_owner_frees_exactly_when_no_user_holds),
        cmocka_unit_test(test_rref_failures),
        cmocka_unit_test(test_lost_control_messages_are_sent_again),
        cmocka_unit_test(test_fork_request_waits_for_its_parent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
