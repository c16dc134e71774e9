/*  rref_api.c: the public RRef functions (SPEC R4, R5, R6). */
#include "rpc/rref.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/error.h"

/* The running agent, checked against the RRef's session. */
static agent_t *acquire_for(const rpc_rref_t *r, const char *api)
{
    if (!r) {
        error_set("%s: NULL RRef", api);
        return NULL;
    }
    agent_t *a = agent_acquire();
    if (!a) {
        error_wrap("%s", api);
        return NULL;
    }
    if (a->gen != r->gen) {
        agent_release(a);
        error_set("%s: the RRef belongs to an earlier RPC session", api);
        return NULL;
    }
    return a;
}

typedef struct {
    agent_t *a;
    rpc_rref_t *r;
} remote_watch_t;

static void remote_answered(rpc_future_t *f, void *arg)
{
    remote_watch_t *w = arg;
    rref_user_created(w->a, w->r, rpc_future_value(f) ? NULL : rpc_future_error(f));
    rpc_rref_unref(w->r);
    free(w);
}

static rpc_rref_t *remote_start(int to, const char *fn, rpc_value_t *args, int64_t timeout_ms,
                                uint16_t flags, const char *api)
{
    agent_t *a = agent_acquire();
    if (!a) {
        error_wrap("%s", api);
        return NULL;
    }
    rpc_rref_t *r = NULL;
    remote_watch_t *w = malloc(sizeof *w);
    if (!w) {
        error_set("%s: out of memory", api);
        goto out;
    }
    if (agent_check_rank(a, to, api) < 0 || !(r = rref_new_for_remote(a, to))) {
        free(w);
        goto out;
    }
    w->a = a;
    w->r = rpc_rref_ref(r);
    call_req_t req = {.type = RPC_MSG_REMOTE, .flags = flags, .fn = fn, .api = api,
                      .args = args, .a = r->rref_id, .b = r->is_owner ? 0 : r->fork_id,
                      .timeout_ms = timeout_ms, .hooked = true};
    rpc_future_t *f = call_start(a, to, &req);
    if (!f) {
        char text[512];
        snprintf(text, sizeof text, "%s", error_last());
        rref_user_created(a, r, text);
        rpc_rref_unref(w->r);
        free(w);
        rpc_rref_unref(r);
        r = NULL;
        error_set("%s", text);
        goto out;
    }
    rpc_future_then(f, remote_answered, w);
    rpc_future_unref(f);
out:
    agent_release(a);
    return r;
}

rpc_rref_t *rpc_remote(int to, const char *fn, rpc_value_t *args, int64_t timeout_ms)
{
    return remote_start(to, fn, args, timeout_ms, 0, "remote");
}

rpc_rref_t *rpc_rref_new(rpc_value_t *value)
{
    agent_t *a = agent_acquire();
    if (!a) {
        error_wrap("rpc_rref_new");
        return NULL;
    }
    rpc_rref_t *r = NULL;
    if (!value)
        error_set("rpc_rref_new: NULL value");
    else
        r = rref_new_local(a, value);
    agent_release(a);
    return r;
}

int rpc_rref_to_here(rpc_rref_t *r, int64_t timeout_ms, rpc_value_t **value)
{
    if (value)
        *value = NULL;
    agent_t *a = acquire_for(r, "to_here");
    if (!a)
        return -1;
    int64_t t = agent_timeout(a, timeout_ms);
    if (r->is_owner) {
        agent_release(a);
        if (transport_thread_role() == ROLE_IO && !rpc_future_done(r->value))
            return error_set("to_here: would wait on the RPC I/O thread");
        if (call_wait(r->value, t ? t : -1) < 0)
            return error_wrap("to_here of an RRef owned here");
        if (value)
            *value = rpc_value_ref(rpc_future_value(r->value));
        return 0;
    }
    char error[1024];
    rref_user_error(a, r, error, sizeof error);
    agent_release(a);
    if (error[0])
        return error_set("to_here to \"%s\" (rank %d): %s", rpc_rref_owner_name(r), r->owner,
                         error);
    call_req_t req = {.type = RPC_MSG_RREF_FETCH, .api = "to_here", .a = r->rref_id,
                      .timeout_ms = timeout_ms, .hooked = true};
    return call_sync(&req, r->owner, value);
}

int rpc_rref_local_value(rpc_rref_t *r, rpc_value_t **value)
{
    if (value)
        *value = NULL;
    agent_t *a = acquire_for(r, "local_value");
    if (!a)
        return -1;
    int64_t t = a->timeout_ms;
    agent_release(a);
    if (!r->is_owner)
        return error_set("local_value: the RRef is owned by \"%s\" (rank %d), not by this "
                         "worker", rpc_rref_owner_name(r), r->owner);
    if (call_wait(r->value, t ? t : -1) < 0)
        return error_wrap("local_value");
    if (value)
        *value = rpc_value_ref(rpc_future_value(r->value));
    return 0;
}

int rpc_rref_owner(const rpc_rref_t *r)
{
    return r ? r->owner : -1;
}

const char *rpc_rref_owner_name(const rpc_rref_t *r)
{
    static __thread char name[RPC_MAX_NAME + 1];
    rpc_worker_info_t info;
    name[0] = 0;
    if (r && rpc_get_worker_info_by_rank(r->owner, &info) == 0)
        snprintf(name, sizeof name, "%s", info.name);
    return name;
}

bool rpc_rref_is_owner(const rpc_rref_t *r)
{
    return r && r->is_owner;
}

bool rpc_rref_confirmed_by_owner(const rpc_rref_t *r)
{
    return r && atomic_load(&r->confirmed);
}

/* [r, args...] for a method call at the owner. */
static rpc_value_t *method_args(rpc_rref_t *r, rpc_value_t *args, const char *api)
{
    if (args && rpc_value_kind(args) != RPC_LIST) {
        error_set("%s: arguments must be a list", api);
        return NULL;
    }
    size_t n = args ? rpc_list_len(args) : 0;
    rpc_value_t *list = rpc_value_list(n + 1);
    if (!list || rpc_list_append(list, rpc_value_rref(r)) < 0) {
        rpc_value_unref(list);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (rpc_list_append(list, rpc_value_ref(rpc_list_get(args, i))) < 0) {
            rpc_value_unref(list);
            return NULL;
        }
    return list;
}

int rpc_rref_rpc_sync(rpc_rref_t *r, const char *method, rpc_value_t *args,
                      int64_t timeout_ms, rpc_value_t **result)
{
    if (result)
        *result = NULL;
    if (!r)
        return error_set("rref.rpc_sync: NULL RRef");
    rpc_value_t *list = method_args(r, args, "rref.rpc_sync");
    if (!list)
        return -1;
    call_req_t req = {.type = RPC_MSG_CALL, .flags = RPC_WIRE_F_DEREF_FIRST, .fn = method,
                      .api = "rref.rpc_sync", .args = list, .timeout_ms = timeout_ms,
                      .hooked = true};
    int rc = call_sync(&req, r->owner, result);
    rpc_value_unref(list);
    return rc;
}

rpc_future_t *rpc_rref_rpc_async(rpc_rref_t *r, const char *method, rpc_value_t *args,
                                 int64_t timeout_ms)
{
    agent_t *a = acquire_for(r, "rref.rpc_async");
    if (!a)
        return NULL;
    rpc_future_t *f = NULL;
    rpc_value_t *list = method_args(r, args, "rref.rpc_async");
    if (list) {
        call_req_t req = {.type = RPC_MSG_CALL, .flags = RPC_WIRE_F_DEREF_FIRST, .fn = method,
                          .api = "rref.rpc_async", .args = list, .timeout_ms = timeout_ms,
                          .hooked = true};
        f = call_start(a, r->owner, &req);
        rpc_value_unref(list);
    }
    agent_release(a);
    return f;
}

rpc_rref_t *rpc_rref_remote(rpc_rref_t *r, const char *method, rpc_value_t *args,
                            int64_t timeout_ms)
{
    if (!r) {
        error_set("rref.remote: NULL RRef");
        return NULL;
    }
    rpc_value_t *list = method_args(r, args, "rref.remote");
    if (!list)
        return NULL;
    rpc_rref_t *out = remote_start(r->owner, method, list, timeout_ms, RPC_WIRE_F_DEREF_FIRST,
                                   "rref.remote");
    rpc_value_unref(list);
    return out;
}

int rpc_rref_drain(int64_t timeout_ms)
{
    agent_t *a = agent_acquire();
    if (!a)
        return error_wrap("rpc_rref_drain");
    int64_t t = agent_timeout(a, timeout_ms);
    int64_t deadline = t ? agent_now_ns() + t * 1000000 : INT64_MAX;
    agent_release(a);
    /* Polls rather than waits on a condition: the agent may shut down
       meanwhile, and nothing may be held across that. */
    for (;;) {
        a = agent_acquire();
        if (!a)
            return error_wrap("rpc_rref_drain");
        int64_t n = rref_outstanding(a);
        agent_release(a);
        if (n == 0)
            return 0;
        if (agent_now_ns() >= deadline)
            return error_set("rpc_rref_drain: %lld RRef messages still outstanding after "
                             "%lld ms", (long long)n, (long long)t);
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
}

int64_t rpc_debug_owner_rrefs(void)
{
    agent_t *a = agent_try_acquire();
    if (!a)
        return 0;
    int64_t n = rref_owner_count(a);
    agent_release(a);
    return n;
}
