/* SPDX-License-Identifier: MIT */
/*  fuzz_dist.c: libFuzzer target for what a peer can make distributed
    autograd and the RRef owner do: the "__dist_*" handlers and the RPC
    hooks of dist_autograd/, against a recorded graph, and the RRef control
    messages, fetches and wire forms of rpc/agent/rref.c.

    No network: the RPC layer around these files is a stand-in. This
    process is rank 0 of a world of 4; handlers are called directly with a
    caller rank from the input; zd_rpc_async completes at once (with 0 or
    an error, as the input says) and the agent of rref.c has no sockets.

    Each input starts from the same recorded graph: peer 1 called us under
    context (1 << 48 | 1) with x [4,3] requiring grad, and we answered
    log_softmax(x @ W) [4,5] with our parameter W [3,5]. Then, until the
    input runs out, one operation per opcode byte (op % 12):

        0  __dist_backward(ctx, msg, pass, retain, k gradients): each of a
           fuzzed dtype (float32/uint8/int64) and shape, float data from
           the input
        1  __dist_pending(ctx, pass, query)     2  __dist_flush(ctx, pass)
        3  __dist_release(ctx)
        4  a request under a context: fuzzed hook bytes (valid layout or
           raw), a tensor requiring grad, then our reply (a tensor)
        5  our own call under a context of ours: the request hook, a
           reply with fuzzed hook bytes, then a backward of it
        6  new limits on contexts (small caps)
        7  an RRef control message (USER_DELETE, FORK_REQUEST,
           CHILD_ACCEPT) with ids from a small space
        8  an RRef fetch (the owner's value future, maybe a placeholder)
        9  an RRef in a value from a peer (its 40 wire bytes), dropped
        10 time passes for the RRef placeholders (expiry)
        11 an owned RRef made here, or the last one dropped
    Ids (contexts, messages, RRefs, forks) are picked from small spaces
    so that operations meet each other; a few bytes pick "any 64 bits".

    Checks, beyond "no crash, no sanitizer report": a refused handler sets
    an error text; a gradient message is never accepted when a gradient's
    dtype or shape differs from what was sent; the clock never wraps; after
    the input every context is released and every RRef entry freed
    (LeakSanitizer sees what is not).

    Build and run with tools/fuzz.sh 600 fuzz_dist. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>
#include <zdist/value.h>
#include "dist_autograd/dist_private.h"
#include "rpc/value/args.h"
#include "rpc/agent/rref.h"

#define FUZZ_NAME "fuzz_dist"
#include "tools/fuzz_check.h"

#define WORLD 4
#define CTX0  ((int64_t)(UINT64_C(1) << 48 | 1))

/*  ---- the input ---- */

typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint8_t u8(input_t *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static uint64_t u64(input_t *in)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)u8(in) << (8 * i);
    return v;
}

/*  ---- the stand-in RPC layer ---- */

struct zd_rpc_call {
    int caller;
    void *hook_state;
};

static zd_rpc_hooks_t hooks;
static struct {
    char name[32];
    zd_rpc_handler_fn *fn;
    zd_rpc_async_handler_fn *async_fn;
} fns[16];
static int n_fns;
static bool async_fails; /* the input's choice for zd_rpc_async */
static int64_t async_calls;

int zd_rpc_set_hooks(const zd_rpc_hooks_t *h)
{
    hooks = *h;
    return 0;
}

int zd_rpc_register_function(const char *name, const zd_rpc_function_t *f)
{
    CHECK(n_fns < 16, "too many functions");
    snprintf(fns[n_fns].name, sizeof fns[n_fns].name, "%s", name);
    fns[n_fns].fn = f->fn;
    fns[n_fns++].async_fn = f->async_fn;
    return 0;
}

int zd_rpc_register(const char *name, zd_rpc_handler_fn *fn, void *arg)
{
    (void)arg;
    return zd_rpc_register_function(name, &(zd_rpc_function_t){.fn = fn});
}

int zd_rpc_register_async(const char *name, zd_rpc_async_handler_fn *fn, void *arg)
{
    (void)arg;
    return zd_rpc_register_function(name, &(zd_rpc_function_t){.async_fn = fn});
}

zd_future_t *zd_rpc_async(int to, const char *fn, zd_value_t *args, int64_t timeout_ms)
{
    (void)timeout_ms, (void)args;
    CHECK(to >= 0 && to < WORLD, "a message to rank %d", to);
    CHECK(strncmp(fn, "__dist_", 7) == 0, "an unexpected call of %s", fn);
    async_calls++;
    zd_future_t *f = zd_future_new();
    if (async_fails) {
        zd_future_set_error(f, "stand-in: rank %d is gone", to);
    } else if (strcmp(fn, "__dist_pending") == 0) {
        zd_value_t *v = zd__rpc_args("ii", (int64_t)0, (int64_t)to);
        zd_future_set_value(f, v);
        zd_value_unref(v);
    } else {
        zd_value_t *v = zd_value_int(0);
        zd_future_set_value(f, v);
        zd_value_unref(v);
    }
    return f;
}

int zd_rpc_sync(int to, const char *fn, zd_value_t *args, int64_t timeout_ms, zd_value_t **result)
{
    (void)to, (void)fn, (void)args, (void)timeout_ms;
    *result = NULL;
    return zd_error_set("stand-in: no zd_rpc_sync");
}

zd_rref_t *zd_rpc_remote(int to, const char *fn, zd_value_t *args, int64_t timeout_ms)
{
    (void)to, (void)fn, (void)args, (void)timeout_ms;
    zd_error_set("stand-in: no zd_rpc_remote");
    return NULL;
}

zd_rref_t *zd_rref_remote(zd_rref_t *r, const char *method, zd_value_t *args, int64_t timeout_ms)
{
    (void)r, (void)method, (void)args, (void)timeout_ms;
    zd_error_set("stand-in: no zd_rref_remote");
    return NULL;
}

zd_future_t *zd_rref_rpc_async(zd_rref_t *r, const char *method, zd_value_t *args,
                               int64_t timeout_ms)
{
    (void)r, (void)method, (void)args, (void)timeout_ms;
    zd_error_set("stand-in: no zd_rref_rpc_async");
    return NULL;
}

int zd_rref_rpc_sync(zd_rref_t *r, const char *method, zd_value_t *args, int64_t timeout_ms,
                     zd_value_t **result)
{
    (void)r, (void)method, (void)args, (void)timeout_ms;
    *result = NULL;
    return zd_error_set("stand-in: no zd_rref_rpc_sync");
}

bool zd_rref_is_owner(const zd_rref_t *r)
{
    return r->is_owner;
}

int zd_rref_local_value(zd_rref_t *r, zd_value_t **value)
{
    (void)r;
    *value = NULL;
    return zd_error_set("stand-in: no local value");
}

int zd_rpc_call_caller_rank(const zd_rpc_call_t *call)
{
    return call->caller;
}
void *zd_rpc_call_hook_state(const zd_rpc_call_t *call)
{
    return call->hook_state;
}
void zd_rpc_call_set_hook_state(zd_rpc_call_t *call, void *state)
{
    call->hook_state = state;
}
int64_t zd_rpc_get_timeout(void)
{
    return 1000;
}
bool zd_rpc_is_running(void)
{
    return true;
}
const char *zd_rpc_name(void)
{
    return "fuzz";
}
int zd_rpc_rank(void)
{
    return 0;
}
int zd_rpc_world_size(void)
{
    return WORLD;
}
bool zd_rpc_peer_is_lost(int rank)
{
    (void)rank;
    return false;
}

int zd_rpc_get_worker_info_by_rank(int rank, zd_rpc_worker_info_t *out)
{
    if (rank < 0 || rank >= WORLD)
        return zd_error_set("stand-in: no rank %d", rank);
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "worker%d", rank);
    out->rank = rank;
    return 0;
}

/*  ---- the stand-in agent of rref.c ---- */

static agent_t agent;
static int64_t clock_ns = 1000000000;
static uint64_t next_id = 1;

int64_t zd__net_now_ns(void)
{
    return clock_ns;
}
agent_t *zd__agent_try_acquire(void)
{
    return &agent;
}
void zd__agent_release(agent_t *a)
{
    (void)a;
}
uint64_t zd__agent_new_id(agent_t *a)
{
    return (uint64_t)a->net.rank << 48 | next_id++;
}

/*  The stand-in has no I/O thread: the input drives the clock and the ticks. */
void zd__io_due(zd__net_t *n, int64_t due_ns)
{
    (void)n, (void)due_ns;
}

int64_t zd__agent_timeout(agent_t *a, int64_t timeout_ms)
{
    (void)a;
    return timeout_ms < 0 ? 1000 : timeout_ms;
}

int zd__transport_send_routed(zd__net_t *n, int dst, const uint8_t *route, size_t route_len,
                              rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors)
{
    (void)n, (void)route, (void)route_len, (void)h, (void)tensors, (void)n_tensors;
    CHECK(dst >= 0 && dst < WORLD, "an answer to rank %d", dst);
    return 0;
}

void zd__transport_answer_error(zd__net_t *n, const inmsg_t *m, uint64_t id, const char *text)
{
    (void)n, (void)m, (void)id;
    CHECK(text && text[0], "an error answer without text");
}

/*  Control messages the RRef code sends (deletes, fork requests): answered
    at once, as the input says. */
zd_future_t *zd__call_start(agent_t *a, int to, const call_req_t *req)
{
    (void)a, (void)req;
    CHECK(to >= 0 && to < WORLD, "a control message to rank %d", to);
    zd_future_t *f = zd_future_new();
    if (async_fails) {
        zd_future_set_error(f, "stand-in: rank %d is gone", to);
    } else {
        zd_value_t *v = zd_value_none();
        zd_future_set_value(f, v);
        zd_value_unref(v);
    }
    return f;
}

/*  ---- helpers ---- */

static zd_future_t *(*handler(const char *name))(zd_rpc_call_t *, zd_value_t *, void *)
{
    for (int i = 0; i < n_fns; i++)
        if (strcmp(fns[i].name, name) == 0)
            return fns[i].async_fn;
    return NULL;
}

/*  Context ids picked from all 64 bits (removed after the input). */
static int64_t wild[64];
static int n_wild;

static int64_t pick_ctx(input_t *in)
{
    uint8_t b = u8(in);
    if (b == 0xff && n_wild < 64)
        return wild[n_wild++] = (int64_t)u64(in);
    return (int64_t)((uint64_t)(b % WORLD) << 48 | (uint64_t)((b >> 2) % 4 + 1));
}

static zd_tensor_t *fuzz_tensor(input_t *in)
{
    uint8_t kind = u8(in);
    zd_tensor_dtype_t dt = kind % 3 == 0 ? ZD_FLOAT32 : kind % 3 == 1 ? ZD_UINT8 : ZD_INT64;
    int ndim = (kind >> 2) % 4;
    int64_t shape[3];
    for (int d = 0; d < ndim; d++)
        shape[d] = u8(in) % 7;
    zd_tensor_t *t = zd_tensor_new(dt, shape, ndim);
    if (t && dt == ZD_FLOAT32)
        for (int64_t i = 0; i < zd_tensor_numel(t) && in->n; i++)
            ((float *)zd_tensor_data(t))[i] = (float)(int8_t)u8(in) / 16.0f;
    return t;
}

static zd_tensor_t *ones(int64_t r, int64_t c, bool grad)
{
    int64_t shape[2] = {r, c};
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, 2);
    zd_tensor_fill_(t, 0.25f);
    if (grad)
        zd_tensor_set_requires_grad(t, true);
    return t;
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/*  A handler's result: a future (done here: every message below completes
    at once), or NULL with an error text. */
static void finish(zd_future_t *f)
{
    if (!f) {
        CHECK(zd_error_last()[0], "a handler failed without an error text");
        return;
    }
    CHECK(zd_future_done(f), "a handler's future is still pending");
    zd_future_unref(f);
}

/*  ---- the recorded graph: peer 1's call, our reply ---- */

static zd_tensor_t *server_w;
static uint64_t graph_msg; /* our send function's message id */

/*  A request from `caller` with hook bytes extra, args [x], then our answer
    log_softmax(x @ W) (or W itself when x does not fit). Returns the
    message id our reply's hook bytes carry (0: none). */
static uint64_t serve_request(int caller, const void *extra, size_t len, zd_tensor_t *x)
{
    zd_rpc_call_t call = {caller, NULL};
    zd_value_t *args = zd__rpc_args("t", x);
    uint64_t msg = 0;
    if (hooks.on_recv_request(hooks.arg, &call, extra, len, &args) == 0) {
        zd_tensor_t *x_in = NULL, *h = NULL, *y = NULL;
        zd_rpc_arg_tensor(args, 0, &x_in);
        if (x_in && zd_tensor_matmul(x_in, server_w, &h) == 0)
            zd_nn_log_softmax(h, 1, &y);
        else
            y = zd_tensor_ref(server_w);
        hooks.on_handler_return(hooks.arg, &call);
        zd_value_t *result = y ? zd_value_tensor(y) : NULL;
        zd_rpc_bytes_t out = {0};
        if (hooks.on_send_reply(hooks.arg, &call, &result, &out) == 0 && out.len == 18) {
            for (int i = 0; i < 8; i++)
                msg |= (uint64_t)((uint8_t *)out.data)[2 + i] << (8 * i);
        }
        free(out.data);
        zd_value_unref(result);
        zd_tensor_unref(h);
        zd_tensor_unref(y);
    } else {
        CHECK(zd_error_last()[0], "a request refused without an error text");
    }
    zd_value_unref(args);
    CHECK(!call.hook_state, "hook state left behind");
    return msg;
}

static void record_graph(void)
{
    uint8_t extra[26] = {'D', 1};
    put_u64(extra + 2, (uint64_t)CTX0);
    put_u64(extra + 10, UINT64_C(1) << 48 | 77);
    put_u64(extra + 18, zd_autograd_seq_current());
    zd_tensor_t *x = ones(4, 3, true);
    graph_msg = serve_request(1, extra, sizeof extra, x);
    zd_tensor_unref(x);
    CHECK(graph_msg != 0, "the graph was not recorded: %s", zd_error_last());
}

/*  ---- operations ---- */

static void op_backward(input_t *in)
{
    int64_t ctx = u8(in) & 1 ? CTX0 : pick_ctx(in);
    uint8_t m = u8(in);
    int64_t msg = m < 200 ? (int64_t)graph_msg : m == 255 ? (int64_t)u64(in) : (int64_t)m;
    int caller = u8(in) % WORLD;
    int k = u8(in) % 3;
    zd_value_t *args =
        zd__rpc_args("iiii", ctx, msg, (int64_t)(u8(in) % 3 + 1), (int64_t)(u8(in) & 1));
    bool exact = true;
    for (int i = 0; i < k; i++) {
        zd_tensor_t *g;
        if (u8(in) & 1) {
            g = ones(4, 5, false);
        } else {
            g = fuzz_tensor(in);
            int64_t want[2] = {4, 5};
            exact = exact && g && zd_tensor_dtype(g) == ZD_FLOAT32 && zd_tensor_ndim(g) == 2 &&
                zd_tensor_shape(g)[0] == want[0] && zd_tensor_shape(g)[1] == want[1];
        }
        if (g)
            zd_list_append(args, zd_value_tensor(g));
        zd_tensor_unref(g);
    }
    zd_rpc_call_t call = {caller, NULL};
    zd_future_t *f = handler("__dist_backward")(&call, args, NULL);
    /* A gradient not shaped as what was sent never gets in. */
    if (f && zd_future_value(f))
        CHECK(exact && k == 1 && ctx == CTX0 && (uint64_t)msg == graph_msg && caller == 1,
              "a gradient message accepted: ctx %llx msg %llx from %d, %d gradients, exact %d",
              (unsigned long long)ctx, (unsigned long long)msg, caller, k, exact);
    finish(f);
    zd_value_unref(args);
}

static void op_query(input_t *in, const char *fn)
{
    int64_t ctx = u8(in) & 1 ? CTX0 : pick_ctx(in);
    zd_value_t *args = strcmp(fn, "__dist_release") == 0 ? zd__rpc_args("i", ctx)
        : strcmp(fn, "__dist_flush") == 0
        ? zd__rpc_args("ii", ctx, (int64_t)(u8(in) % 3 + 1))
        : zd__rpc_args("iii", ctx, (int64_t)(u8(in) % 3 + 1), (int64_t)u8(in));
    zd_rpc_call_t call = {u8(in) % WORLD, NULL};
    finish(handler(fn)(&call, args, NULL));
    zd_value_unref(args);
}

static void op_request(input_t *in)
{
    uint8_t extra[64];
    size_t len;
    int caller = u8(in) % WORLD;
    if (u8(in) & 1) {
        len = u8(in) % sizeof extra;
        for (size_t i = 0; i < len; i++)
            extra[i] = u8(in);
    } else {
        len = 26;
        extra[0] = 'D';
        extra[1] = 1;
        put_u64(extra + 2, (uint64_t)pick_ctx(in));
        put_u64(extra + 10, u8(in) & 1 ? u64(in) : 0);
        uint8_t s = u8(in);
        put_u64(extra + 18, s == 255 ? u64(in) : zd_autograd_seq_current() + s);
    }
    zd_tensor_t *x = u8(in) & 1 ? ones(4, 3, true) : fuzz_tensor(in);
    if (x && zd_tensor_dtype(x) == ZD_FLOAT32 && !zd_tensor_requires_grad(x))
        zd_tensor_set_requires_grad(x, true);
    if (x)
        serve_request(caller, extra, len, x);
    zd_tensor_unref(x);
}

/*  Our own call to a peer under a context of ours, its reply with fuzzed
    hook bytes, and a backward through what came back. */
static void op_own_call(input_t *in)
{
    int64_t ctx;
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        return;
    int peer = 1 + u8(in) % (WORLD - 1);
    zd_tensor_t *a = ones(2, 2, true);
    zd_value_t *args = zd__rpc_args("t", a);
    zd_rpc_hook_msg_t m = {.peer = peer, .function = "f"};
    zd_rpc_bytes_t extra = {0};
    void *state = NULL;
    if (hooks.on_send_request(hooks.arg, &m, &args, &extra, &state) == 0) {
        uint8_t rep[32];
        size_t len = 18;
        rep[0] = 'D';
        rep[1] = 1;
        put_u64(rep + 2, u8(in) & 1 ? u64(in) : 0);
        uint8_t s = u8(in);
        put_u64(rep + 10, s == 255 ? u64(in) : zd_autograd_seq_current() + s);
        if (u8(in) == 7)
            len = u8(in) % sizeof rep;
        zd_tensor_t *r = u8(in) & 1 ? ones(2, 2, true) : fuzz_tensor(in);
        if (r && zd_tensor_dtype(r) == ZD_FLOAT32 && !zd_tensor_requires_grad(r))
            zd_tensor_set_requires_grad(r, true);
        zd_value_t *result = r ? zd_value_tensor(r) : NULL;
        zd_tensor_unref(r);
        if (hooks.on_recv_reply(hooks.arg, &m, state, rep, len, &result) == 0 && result) {
            zd_tensor_t *t, *s2 = NULL;
            if (zd_value_get_tensor(result, &t) == 0 && zd_tensor_dtype(t) == ZD_FLOAT32 &&
                zd_tensor_sum(t, &s2) == 0)
                zd_dist_autograd_backward(ctx, &s2, 1, u8(in) & 1);
            zd_tensor_unref(s2);
        }
        zd_value_unref(result);
        free(extra.data);
    }
    zd_value_unref(args);
    zd_tensor_unref(a);
    zd_dist_autograd_context_end(ctx, 0);
    zd_dist_autograd_set_current_context(-1);
}

static void op_limits(input_t *in)
{
    zd_dist_autograd_limits_t l = zd_dist_autograd_limits_default();
    l.max_contexts = u8(in) % 8;
    l.max_contexts_per_peer = u8(in) % 4;
    l.idle_timeout_ms = ZD_TIMEOUT_NONE;
    CHECK(zd_dist_autograd_set_limits(&l) == 0, "set_limits: %s", zd_error_last());
}

/*  ---- RRefs ---- */

static zd_rref_t *owned[4];
static int n_owned;

static uint64_t pick_rref_id(input_t *in)
{
    uint8_t b = u8(in);
    if (b == 0xff)
        return u64(in);
    return (uint64_t)(b % WORLD) << 48 | (uint64_t)((b >> 2) % 6);
}

static void op_control(input_t *in)
{
    static const uint8_t types[] = {RPC_MSG_RREF_USER_DELETE, RPC_MSG_RREF_FORK_REQUEST,
                                    RPC_MSG_RREF_CHILD_ACCEPT};
    inmsg_t m;
    memset(&m, 0, sizeof m);
    m.src = u8(in) % WORLD;
    m.h.type = types[u8(in) % 3];
    m.h.src = m.src;
    m.h.id = next_id++;
    m.h.a = pick_rref_id(in);
    m.h.b = pick_rref_id(in);
    m.h.timeout_ms = u8(in) & 1 ? (uint32_t)u64(in) : 100;
    zd__rref_handle_control(&agent, &m);
}

static void op_fetch(input_t *in)
{
    zd_future_t *f = zd__rref_owner_value(&agent, pick_rref_id(in), (int64_t)(u8(in) % 4) * 100);
    if (!f)
        CHECK(zd_error_last()[0], "a fetch refused without an error text");
    zd_future_unref(f);
}

static void op_decode(input_t *in)
{
    uint8_t wire[RPC_RREF_WIRE_SIZE] = {0};
    put_u64(wire, pick_rref_id(in));
    put_u64(wire + 8, pick_rref_id(in));
    wire[16] = u8(in) % (WORLD + 1);
    wire[18] = u8(in) % (WORLD + 1);
    if (u8(in) == 3)
        for (int i = 0; i < RPC_RREF_WIRE_SIZE; i++)
            wire[i] = u8(in);
    zd_rref_t *r = NULL;
    if (zd__rref_decode(&agent, wire, u8(in) % WORLD, &r) == 0)
        zd_rref_unref(r);
    else
        CHECK(zd_error_last()[0], "an RRef refused without an error text");
}

static void op_owned(input_t *in)
{
    if ((u8(in) & 1) && n_owned < 4) {
        zd_value_t *v = zd_value_int(7);
        zd_rref_t *r = zd__rref_new_local(&agent, v);
        zd_value_unref(v);
        if (r)
            owned[n_owned++] = r;
    } else if (n_owned > 0) {
        zd_rref_unref(owned[--n_owned]);
    }
}

/*  ---- one input ---- */

static void setup_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    zd_log_set_level(ZD_LOG_ERROR);
    CHECK(zd_dist_autograd_init() == 0, "init: %s", zd_error_last());
    server_w = ones(3, 5, true);
    agent.net.rank = 0;
    agent.net.world = WORLD;
    snprintf(agent.name, sizeof agent.name, "fuzz");
}

/*  Everything an input made goes: contexts (of every id an input can name,
    and any left by a 64-bit pick, through the registry's count), RRefs. */
static void teardown(void)
{
    for (int r = 0; r < WORLD; r++)
        for (int k = 1; k <= 4; k++)
            zd__dist_context_unref(
                zd__dist_context_remove((int64_t)((uint64_t)r << 48 | (uint64_t)k)));
    while (n_wild > 0)
        zd__dist_context_unref(zd__dist_context_remove(wild[--n_wild]));
    while (n_owned > 0)
        zd_rref_unref(owned[--n_owned]);
    zd_dist_autograd_set_limits(NULL);
    zd_dist_autograd_set_current_context(-1);
    clock_ns += (int64_t)3600 * 1000000000;
    zd__rref_tick(&agent, clock_ns);
    zd__rref_ctx_free(&agent);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    CHECK(zd__rref_ctx_new(&agent) == 0, "rref ctx");
    input_t in = {data, size};
    async_fails = false;
    uint64_t seq0 = zd_autograd_seq_current();
    record_graph();
    while (in.n) {
        uint8_t op = u8(&in);
        async_fails = (op & 0x80) != 0;
        zd_error_clear();
        switch (op % 12) {
        case 0:
            op_backward(&in);
            break;
        case 1:
            op_query(&in, "__dist_pending");
            break;
        case 2:
            op_query(&in, "__dist_flush");
            break;
        case 3:
            op_query(&in, "__dist_release");
            break;
        case 4:
            op_request(&in);
            break;
        case 5:
            op_own_call(&in);
            break;
        case 6:
            op_limits(&in);
            break;
        case 7:
            op_control(&in);
            break;
        case 8:
            op_fetch(&in);
            break;
        case 9:
            op_decode(&in);
            break;
        case 10:
            clock_ns += (int64_t)(u8(&in) % 8) * 100000000;
            zd__rref_tick(&agent, clock_ns);
            break;
        case 11:
            op_owned(&in);
            break;
        }
        CHECK(zd_autograd_seq_current() >= seq0, "the Lamport clock went back (wrapped)");
        CHECK(zd_autograd_seq_current() <= (UINT64_C(1) << 62) + (UINT64_C(1) << 32),
              "the Lamport clock is at %llu", (unsigned long long)zd_autograd_seq_current());
    }
    teardown();
    CHECK(zd_dist_autograd_num_contexts() == 0,
          "%lld contexts left (ids outside the input's "
          "space were created)",
          (long long)zd_dist_autograd_num_contexts());
    return 0;
}
