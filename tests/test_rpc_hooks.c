/* SPDX-License-Identifier: MIT */
/*  The hooks that distributed autograd will use, exercised with a fake:
    a thread-local "context id" travels with requests and replies as extra
    bytes, is current on the handler's thread (so nested calls carry it on),
    every send and receive is recorded on both sides, and results can be
    replaced on arrival. */
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

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

static __thread int64_t current_ctx;

/*  Events seen by this process: [kind][direction] */
enum { SEND_REQ, RECV_REQ, SEND_REP, RECV_REP, RETURNED, N_EVENTS };
static atomic_int events[3][N_EVENTS];
static atomic_int states_live;

typedef struct {
    int64_t ctx;
    uint64_t request_id;
} fake_state_t;

static int put_ctx(zd_rpc_bytes_t *extra, int64_t ctx)
{
    extra->data = malloc(sizeof ctx);
    if (!extra->data)
        return -1;
    memcpy(extra->data, &ctx, sizeof ctx);
    extra->len = sizeof ctx;
    return 0;
}

static int get_ctx(const void *extra, size_t len, int64_t *ctx)
{
    if (len != sizeof *ctx)
        return zd_error_set("fake hook: %zu extra bytes", len);
    memcpy(ctx, extra, sizeof *ctx);
    return 0;
}

static int on_send_request(void *arg, const zd_rpc_hook_msg_t *m, zd_value_t **args,
                           zd_rpc_bytes_t *extra, void **state)
{
    (void)arg;
    if (strcmp(m->function, "forbidden") == 0)
        return zd_error_set("the fake hook refuses \"forbidden\"");
    atomic_fetch_add(&events[m->kind][SEND_REQ], 1);
    if (current_ctx == 0)
        return 0;
    fake_state_t *s = malloc(sizeof *s);
    if (!s || put_ctx(extra, current_ctx) < 0) {
        free(s);
        return zd_error_set("fake hook: out of memory");
    }
    s->ctx = current_ctx;
    s->request_id = m->request_id;
    *state = s;
    atomic_fetch_add(&states_live, 1);
    /* Replace the arguments by a copy: the callee must see the copy. */
    if (*args) {
        zd_value_t *copy = zd_value_list(zd_list_len(*args));
        for (size_t i = 0; i < zd_list_len(*args); i++)
            zd_list_append(copy, zd_value_ref(zd_list_get(*args, i)));
        zd_value_unref(*args);
        *args = copy;
    }
    return 0;
}

typedef struct {
    int64_t ctx;
    int64_t saved;
} callee_state_t;

static int on_recv_request(void *arg, zd_rpc_call_t *call, const void *extra, size_t len,
                           zd_value_t **args)
{
    (void)arg;
    (void)args;
    atomic_fetch_add(&events[zd_rpc_call_kind(call)][RECV_REQ], 1);
    if (len == 0)
        return 0;
    callee_state_t *s = malloc(sizeof *s);
    if (!s || get_ctx(extra, len, &s->ctx) < 0) {
        free(s);
        return -1;
    }
    s->saved = current_ctx;
    current_ctx = s->ctx; /* current on the handler's thread */
    zd_rpc_call_set_hook_state(call, s);
    atomic_fetch_add(&states_live, 1);
    return 0;
}

static void on_handler_return(void *arg, zd_rpc_call_t *call)
{
    (void)arg;
    atomic_fetch_add(&events[zd_rpc_call_kind(call)][RETURNED], 1);
    callee_state_t *s = zd_rpc_call_hook_state(call);
    if (s)
        current_ctx = s->saved;
}

static int on_send_reply(void *arg, zd_rpc_call_t *call, zd_value_t **result, zd_rpc_bytes_t *extra)
{
    (void)arg;
    (void)result;
    atomic_fetch_add(&events[zd_rpc_call_kind(call)][SEND_REP], 1);
    callee_state_t *s = zd_rpc_call_hook_state(call);
    if (!s)
        return 0;
    int rc = put_ctx(extra, s->ctx);
    free(s);
    zd_rpc_call_set_hook_state(call, NULL);
    atomic_fetch_sub(&states_live, 1);
    return rc;
}

static int on_recv_reply(void *arg, const zd_rpc_hook_msg_t *m, void *state, const void *extra,
                         size_t len, zd_value_t **result)
{
    (void)arg;
    atomic_fetch_add(&events[m->kind][RECV_REP], 1);
    fake_state_t *s = state;
    if (!s)
        return 0;
    int64_t ctx = 0;
    int rc = 0;
    if (*result) {
        /* The reply carries the context back; mark the result as seen. */
        if (get_ctx(extra, len, &ctx) < 0 || ctx != s->ctx || s->request_id != m->request_id)
            rc = zd_error_set("fake hook: reply with context %lld for %lld", (long long)ctx,
                              (long long)s->ctx);
        int64_t v;
        if (rc == 0 && zd_value_get_int(*result, &v) == 0) {
            zd_value_unref(*result);
            *result = zd_value_int(v + 1000000);
        }
    }
    free(s);
    atomic_fetch_sub(&states_live, 1);
    return rc;
}

static int debug_info(void *arg, zd_rpc_debug_item_t *items, int max)
{
    (void)arg;
    if (max >= 1) {
        snprintf(items[0].name, sizeof items[0].name, "fake_states_live");
        items[0].value = atomic_load(&states_live);
    }
    return 1;
}

static const zd_rpc_hooks_t fake_hooks = {.size = sizeof(zd_rpc_hooks_t),
                                          .on_send_request = on_send_request,
                                          .on_recv_request = on_recv_request,
                                          .on_handler_return = on_handler_return,
                                          .on_send_reply = on_send_reply,
                                          .on_recv_reply = on_recv_reply,
                                          .debug_info = debug_info};

/*  ---- handlers ---- */

static zd_value_t *h_ctx(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(current_ctx);
}

/*  Calls "ctx" on the next rank: the context travels on. */
static zd_value_t *h_nested_ctx(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    zd_value_t *r;
    if (zd_rpc_sync((zd_rpc_rank() + 1) % zd_rpc_world_size(), "ctx", NULL, -1, &r) < 0)
        return NULL;
    return r;
}

/*  "ctx_later" answers 5 when "release" comes. */
static world_hold_t later = {.answer = 5};

static zd_value_t *h_events(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t kind, what;
    if (zd_rpc_arg_int(args, 0, &kind) < 0 || zd_rpc_arg_int(args, 1, &what) < 0)
        return NULL;
    return zd_value_int(atomic_load(&events[kind][what]));
}

static int64_t remote_events(int rank, int kind, int what)
{
    zd_value_t *args = zd__rpc_args("ii", (int64_t)kind, (int64_t)what), *r = NULL;
    int64_t n = -1;
    int saved = current_ctx;
    current_ctx = 0;
    if (zd_rpc_sync(rank, "events", args, -1, &r) == 0)
        zd_value_get_int(r, &n);
    current_ctx = saved;
    zd_value_unref(r);
    zd_value_unref(args);
    return n;
}

static int world_hooks(const world_t *w)
{
    /* Structs that no _default() made are refused, naming it. */
    zd_rpc_hooks_t sizeless = {.on_send_request = on_send_request};
    WCHECK(zd_rpc_set_hooks(&sizeless) == -1 && zd_error_code() == ZD_ERR_ARGUMENT);
    WCHECK(strstr(zd_error_last(), "zd_rpc_hooks_default()") != NULL);
    zd_rpc_function_t f = {.fn = h_ctx};
    WCHECK(zd_rpc_register_function("ctx", &f) == -1 && zd_error_code() == ZD_ERR_ARGUMENT);
    WCHECK(zd_rpc_set_hooks(&fake_hooks) == 0);
    WCHECK(zd_rpc_register("ctx", h_ctx, NULL) == 0);
    WCHECK(zd_rpc_register_inline("ctx_inline", h_ctx, NULL) == 0);
    WCHECK(zd_rpc_register("nested_ctx", h_nested_ctx, NULL) == 0);
    WCHECK(zd_rpc_register_async("ctx_later", world_h_hold, &later) == 0);
    WCHECK(zd_rpc_register_inline("release", world_h_release, &later) == 0);
    WCHECK(zd_rpc_register("fail", world_h_fail, "failing on purpose") == 0);
    WCHECK(zd_rpc_register_inline("events", h_events, NULL) == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    WCHECK(zd_rpc_set_hooks(NULL) == -1); /* not while running */
    /* The module's counters follow the agent's in the debug info. */
    zd_rpc_debug_item_t items[16];
    int n = zd_rpc_get_debug_info(items, 16);
    WCHECK(n >= 2 && n <= 16 && !strcmp(items[n - 1].name, "fake_states_live"));
    WCHECK(zd_rpc_get_debug_info(items, 1) == n); /* the count even when cut short */
    /* (none live yet on rank 0, which makes the calls; rank 1 may already
       be serving rank 0's first one) */
    int64_t v = -1;
    WCHECK(zd_rpc_get_debug_value("fake_states_live", &v) == 0 && (w->rank != 0 || v == 0));
    if (w->rank == 0) {
        /* No context: nothing extra travels, results are untouched. */
        WCHECK(world_call_int(1, "ctx") == 0);
        /* A context: the handler sees it, the reply brings it back (the
           fake marks the result with +1000000). */
        current_ctx = 77;
        WCHECK(world_call_int(1, "ctx") == 1000077);
        WCHECK(world_call_int(1, "ctx_inline") == 1000077);
        /* Nested: 1 runs nested_ctx, calls 2's ctx under the same context;
           both replies are marked on their way back. */
        WCHECK(world_call_int(1, "nested_ctx") == 2000077);
        /* An async handler's reply, sent by another thread, still has it. */
        zd_future_t *f = zd_rpc_async(1, "ctx_later", NULL, -1);
        current_ctx = 0;
        while (world_call_int(1, "release") == 0) { /* until the held call has arrived */
        }
        current_ctx = 77;
        WCHECK(zd_future_wait(f, 10000) == 0);
        int64_t v;
        WCHECK(zd_value_get_int(zd_future_value(f), &v) == 0 && v == 1000005);
        zd_future_unref(f);
        /* Failures still release the caller's state (leak-checked). */
        zd_value_t *r;
        WCHECK(zd_rpc_sync(1, "fail", NULL, -1, &r) == -1);
        WCHECK(strstr(zd_error_last(), "failing on purpose") != NULL);
        WCHECK(zd_rpc_sync(1, "nosuch", NULL, -1, &r) == -1);
        /* A hook can refuse a call. */
        WCHECK(zd_rpc_sync(1, "forbidden", NULL, -1, &r) == -1);
        WCHECK(strstr(zd_error_last(), "request hook failed: the fake hook refuses") != NULL);
        /* remote and to_here go through the hooks, with their kinds. */
        zd_rref_t *rr = zd_rpc_remote(1, "ctx", NULL, -1);
        WCHECK(rr != NULL);
        WCHECK(zd_rref_to_here(rr, -1, &r) == 0);
        WCHECK(zd_value_get_int(r, &v) == 0 && v == 1000077); /* marked by the fetch */
        zd_value_unref(r);
        zd_rref_unref(rr);
        WCHECK(zd_rref_drain(10000) == 0);
        current_ctx = 0;
        WCHECK(atomic_load(&events[ZD_RPC_KIND_REMOTE][SEND_REQ]) == 1);
        WCHECK(atomic_load(&events[ZD_RPC_KIND_REMOTE][RECV_REP]) == 1);
        WCHECK(atomic_load(&events[ZD_RPC_KIND_FETCH][SEND_REQ]) == 1);
        WCHECK(atomic_load(&events[ZD_RPC_KIND_FETCH][RECV_REP]) == 1);
        WCHECK(remote_events(1, ZD_RPC_KIND_REMOTE, RECV_REQ) == 1);
        WCHECK(remote_events(1, ZD_RPC_KIND_REMOTE, SEND_REP) == 1);
        WCHECK(remote_events(1, ZD_RPC_KIND_FETCH, RECV_REQ) == 1);
        WCHECK(remote_events(1, ZD_RPC_KIND_FETCH, SEND_REP) == 1);
        /* Every send on one side is a receive on the other. */
        int64_t sent = atomic_load(&events[ZD_RPC_KIND_CALL][SEND_REQ]);
        int64_t got = atomic_load(&events[ZD_RPC_KIND_CALL][RECV_REP]);
        WCHECK(sent == got);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    WCHECK(atomic_load(&states_live) == 0);
    /* Handlers that ran had their return hook, on every process. */
    WCHECK(atomic_load(&events[ZD_RPC_KIND_CALL][RETURNED]) <=
           atomic_load(&events[ZD_RPC_KIND_CALL][RECV_REQ]));
    WCHECK(atomic_load(&events[ZD_RPC_KIND_CALL][SEND_REP]) ==
           atomic_load(&events[ZD_RPC_KIND_CALL][RECV_REQ]));
    zd_rpc_set_hooks(NULL);
    return 0;
}

static void test_hooks_carry_context_both_ways(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 60, world_hooks, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_carry_context_both_ways),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
