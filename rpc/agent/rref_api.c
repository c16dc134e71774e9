/* SPDX-License-Identifier: MIT */
/*  rref_api.c: the public RRef functions. */
#include "rpc/agent/rref.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>

/*  The running agent, checked against the RRef's session. */
static agent_t *acquire_for(const zd_rref_t *r, const char *api)
{
    if (!r) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL RRef", api);
        return NULL;
    }
    agent_t *a = zd__agent_acquire();
    if (!a) {
        zd_error_wrap("%s", api);
        return NULL;
    }
    if (a->net.gen != r->gen) {
        zd__agent_release(a);
        zd_error_set("%s: the RRef belongs to an earlier RPC session", api);
        return NULL;
    }
    if (zd__rref_owner_lost_since(a, r, api)) {
        zd__agent_release(a);
        return NULL;
    }
    return a;
}

typedef struct {
    agent_t *a;
    zd_rref_t *r;
} remote_watch_t;

static void remote_answered(zd_future_t *f, void *arg)
{
    remote_watch_t *w = arg;
    zd__rref_user_created(w->a, w->r, zd_future_value(f) ? NULL : zd_future_error(f));
    zd_rref_unref(w->r);
    free(w);
}

static zd_rref_t *remote_start(int to, const char *fn, zd_value_t *args, int64_t timeout_ms,
                               uint16_t flags, const char *api)
{
    agent_t *a = zd__agent_acquire();
    if (!a) {
        zd_error_wrap("%s", api);
        return NULL;
    }
    zd_rref_t *r = NULL;
    remote_watch_t *w = malloc(sizeof *w);
    if (!w) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", api);
        goto out;
    }
    if (zd__world_check_rank(&a->net, to, api) < 0 || !(r = zd__rref_new_for_remote(a, to))) {
        free(w);
        goto out;
    }
    w->a = a;
    w->r = zd_rref_ref(r);
    call_req_t req = {.type = RPC_MSG_REMOTE,
                      .flags = flags,
                      .fn = fn,
                      .api = api,
                      .args = args,
                      .a = r->rref_id,
                      .b = r->is_owner ? 0 : r->fork_id,
                      .timeout_ms = timeout_ms,
                      .hooked = true};
    zd_future_t *f = zd__call_start(a, to, &req);
    /* Out of memory here, the call was not made: fail now rather than
       from to_here (which tells a failure of the owner's). */
    if (f && zd_future_done(f) && zd_future_error_code(f) == ZD_ERR_NO_MEMORY) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "%s", zd_future_error(f));
        zd_future_unref(f);
        f = NULL;
    }
    if (!f || zd_future_then(f, remote_answered, w) < 0) {
        /* The handle's release still tells the owner, which may have made
           the value. */
        char text[512];
        snprintf(text, sizeof text, "%s", zd_error_last());
        zd_error_code_t code = zd_error_code();
        zd_future_unref(f);
        zd__rref_user_created(a, r, text);
        zd_rref_unref(w->r);
        free(w);
        zd_rref_unref(r);
        r = NULL;
        zd_error_set_code(code, "%s", text);
        goto out;
    }
    zd_future_unref(f);
out:
    zd__agent_release(a);
    return r;
}

zd_rref_t *zd_rpc_remote(int to, const char *fn, zd_value_t *args, int64_t timeout_ms)
{
    return remote_start(to, fn, args, timeout_ms, 0, "remote");
}

zd_rref_t *zd_rref_new(zd_value_t *value)
{
    agent_t *a = zd__agent_acquire();
    if (!a) {
        zd_error_wrap("zd_rref_new");
        return NULL;
    }
    zd_rref_t *r = NULL;
    if (!value)
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rref_new: NULL value");
    else
        r = zd__rref_new_local(a, value);
    zd__agent_release(a);
    return r;
}

int zd_rref_to_here(zd_rref_t *r, int64_t timeout_ms, zd_value_t **value)
{
    if (value)
        *value = NULL;
    agent_t *a = acquire_for(r, "to_here");
    if (!a)
        return -1;
    int64_t t = zd__agent_timeout(a, timeout_ms);
    if (r->is_owner) {
        zd__agent_release(a);
        if (zd__net_thread_role() == ROLE_IO && !zd_future_done(r->value))
            return zd_error_set("to_here: would wait on the RPC I/O thread");
        if (zd_future_wait(r->value, t) < 0)
            return zd_error_wrap("to_here of an RRef owned here");
        if (value)
            *value = zd_value_ref(zd_future_value(r->value));
        return 0;
    }
    char error[1024];
    zd__rref_user_error(a, r, error, sizeof error);
    zd__agent_release(a);
    if (error[0])
        return zd_error_set("to_here to \"%s\" (rank %d): %s", zd_rref_owner_name(r), r->owner,
                            error);
    /* The owner serves only ranks that hold a fork: until it has confirmed
       ours, the fetch follows our fork request on the same connection. */
    call_req_t req = {.type = RPC_MSG_RREF_FETCH,
                      .api = "to_here",
                      .a = r->rref_id,
                      .timeout_ms = timeout_ms,
                      .hooked = true,
                      .shared_only = !atomic_load(&r->confirmed)};
    return zd__call_sync(&req, r->owner, value);
}

int zd_rref_local_value(zd_rref_t *r, zd_value_t **value)
{
    if (value)
        *value = NULL;
    agent_t *a = acquire_for(r, "local_value");
    if (!a)
        return -1;
    int64_t t = zd__agent_timeout(a, ZD_TIMEOUT_DEFAULT);
    zd__agent_release(a);
    if (!r->is_owner)
        return zd_error_set("local_value: the RRef is owned by \"%s\" (rank %d), not by this "
                            "worker",
                            zd_rref_owner_name(r), r->owner);
    if (zd_future_wait(r->value, t) < 0)
        return zd_error_wrap("local_value");
    if (value)
        *value = zd_value_ref(zd_future_value(r->value));
    return 0;
}

int zd_rref_owner(const zd_rref_t *r)
{
    return r ? r->owner : -1;
}

const char *zd_rref_owner_name(const zd_rref_t *r)
{
    static __thread char name[ZD_RPC_MAX_NAME + 1];
    zd_rpc_worker_info_t info;
    name[0] = 0;
    if (r && zd_rpc_get_worker_info_by_rank(r->owner, &info) == 0)
        snprintf(name, sizeof name, "%s", info.name);
    return name;
}

bool zd_rref_is_owner(const zd_rref_t *r)
{
    return r && r->is_owner;
}

bool zd_rref_confirmed_by_owner(const zd_rref_t *r)
{
    return r && atomic_load(&r->confirmed);
}

/*  [r, args...] for a method call at the owner. */
static zd_value_t *method_args(zd_rref_t *r, zd_value_t *args, const char *api)
{
    if (args && zd_value_kind(args) != ZD_VALUE_LIST) {
        zd_error_set("%s: arguments must be a list", api);
        return NULL;
    }
    size_t n = args ? zd_list_len(args) : 0;
    zd_value_t *list = zd_value_list(n + 1);
    if (!list || zd_list_append(list, zd_value_rref(r)) < 0) {
        zd_value_unref(list);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (zd_list_append(list, zd_value_ref(zd_list_get(args, i))) < 0) {
            zd_value_unref(list);
            return NULL;
        }
    return list;
}

int zd_rref_rpc_sync(zd_rref_t *r, const char *method, zd_value_t *args, int64_t timeout_ms,
                     zd_value_t **result)
{
    if (result)
        *result = NULL;
    if (!r)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "rref.rpc_sync: NULL RRef");
    zd_value_t *list = method_args(r, args, "rref.rpc_sync");
    if (!list)
        return -1;
    call_req_t req = {.type = RPC_MSG_CALL,
                      .flags = RPC_WIRE_F_DEREF_FIRST,
                      .fn = method,
                      .api = "rref.rpc_sync",
                      .args = list,
                      .timeout_ms = timeout_ms,
                      .hooked = true};
    int rc = zd__call_sync(&req, r->owner, result);
    zd_value_unref(list);
    return rc;
}

zd_future_t *zd_rref_rpc_async(zd_rref_t *r, const char *method, zd_value_t *args,
                               int64_t timeout_ms)
{
    agent_t *a = acquire_for(r, "rref.rpc_async");
    if (!a)
        return NULL;
    zd_future_t *f = NULL;
    zd_value_t *list = method_args(r, args, "rref.rpc_async");
    if (list) {
        call_req_t req = {.type = RPC_MSG_CALL,
                          .flags = RPC_WIRE_F_DEREF_FIRST,
                          .fn = method,
                          .api = "rref.rpc_async",
                          .args = list,
                          .timeout_ms = timeout_ms,
                          .hooked = true};
        f = zd__call_start(a, r->owner, &req);
        zd_value_unref(list);
    }
    zd__agent_release(a);
    return f;
}

zd_rref_t *zd_rref_remote(zd_rref_t *r, const char *method, zd_value_t *args, int64_t timeout_ms)
{
    if (!r) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "rref.remote: NULL RRef");
        return NULL;
    }
    zd_value_t *list = method_args(r, args, "rref.remote");
    if (!list)
        return NULL;
    zd_rref_t *out =
        remote_start(r->owner, method, list, timeout_ms, RPC_WIRE_F_DEREF_FIRST, "rref.remote");
    zd_value_unref(list);
    return out;
}

int zd_rref_drain(int64_t timeout_ms)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return zd_error_wrap("zd_rref_drain");
    int64_t t = timeout_ms > 0 ? timeout_ms : 0; /* default: no limit */
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), t);
    zd__agent_release(a);
    /* Polls rather than waits on a condition: the agent may shut down
       meanwhile, and nothing may be held across that. */
    for (;;) {
        a = zd__agent_acquire();
        if (!a)
            return zd_error_wrap("zd_rref_drain");
        int64_t n = zd__rref_outstanding(a);
        zd__agent_release(a);
        if (n == 0)
            return 0;
        if (zd__net_now_ns() >= deadline)
            return zd_error_set_code(ZD_ERR_TIMEOUT,
                                     "zd_rref_drain: %lld RRef messages still "
                                     "outstanding after %lld ms",
                                     (long long)n, (long long)t);
        struct timespec ts = {0, 200 * ZD__NS_PER_US};
        nanosleep(&ts, NULL);
    }
}

int64_t zd_rpc_debug_owner_rrefs(void)
{
    agent_t *a = zd__agent_try_acquire();
    if (!a)
        return 0;
    int64_t n = zd__rref_owner_count(a);
    zd__agent_release(a);
    return n;
}
