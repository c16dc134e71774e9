/* SPDX-License-Identifier: MIT */
/*  handlers.c: the shared handlers of handlers.h. */
#include "tests/support/handlers.h"

#include <zdist/error.h>

zd_value_t *world_h_add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t a, b;
    if (zd_rpc_arg_int(args, 0, &a) < 0 || zd_rpc_arg_int(args, 1, &b) < 0)
        return NULL;
    return zd_value_int(a + b);
}

zd_value_t *world_h_echo(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_value_t *v = zd_list_get(args, 0);
    return v ? zd_value_ref(v) : zd_value_none();
}

zd_value_t *world_h_fail(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    zd_error_set("%s", (const char *)arg);
    return NULL;
}

zd_value_t *world_h_owner_count(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(zd_rpc_debug_owner_rrefs());
}

zd_future_t *world_h_hold(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    world_hold_t *h = arg;
    zd_future_t *f = zd_future_new();
    atomic_store(&h->call, zd_future_ref(f));
    if (h->arrived)
        zd_future_set_value(h->arrived, NULL);
    return f;
}

int world_hold_release(world_hold_t *h)
{
    zd_future_t *f = atomic_exchange(&h->call, NULL);
    if (!f)
        return 0;
    zd_value_t *v = h->answer_none ? NULL : zd_value_int(h->answer);
    zd_future_set_value(f, v);
    zd_value_unref(v);
    zd_future_unref(f);
    return 1;
}

zd_value_t *world_h_release(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    return zd_value_int(world_hold_release(arg));
}

int64_t world_call_int(int to, const char *fn)
{
    zd_value_t *r = NULL;
    int64_t v = -1;
    if (zd_rpc_sync(to, fn, NULL, -1, &r) == 0)
        zd_value_get_int(r, &v);
    zd_value_unref(r);
    return v;
}

int world_echo_int(int to, int64_t v, int timeout_ms)
{
    zd_value_t *args = ZD_ARGS(v), *r = NULL;
    int64_t got = -1;
    int rc = zd_rpc_sync(to, "echo", args, timeout_ms, &r);
    zd_value_unref(args);
    if (rc == 0 && (zd_value_get_int(r, &got) < 0 || got != v))
        rc =
            zd_error_set("echo from rank %d gave %lld, not %lld", to, (long long)got, (long long)v);
    zd_value_unref(r);
    return rc;
}
