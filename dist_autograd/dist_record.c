/* SPDX-License-Identifier: MIT */
/*  dist_record.c: the RPC hooks that record send and receive functions.

    Extra bytes carried by a request made under a context (little-endian):
        u8 'D', u8 version 1, i64 context id, u64 message id (0: no tensor
        needs a gradient), u64 the sender's autograd sequence number
    and by the reply to such a request:
        u8 'D', u8 version 1, u64 message id (0: none), u64 sequence number
    Tensors that require grad are found in the value in the codec's order
    (depth first), which both sides share, so output i of a receive
    function is tensor i of its send function. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_autograd/dist_private.h"
#include <zdist/error.h>
#include "core/log_private.h"
#include <zdist/value.h>

#define REQ_EXTRA        26
#define REP_EXTRA        18
#define MAX_GRAD_TENSORS 4096

/*  ---- little-endian helpers ---- */

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/*  ---- tensors of a value that require grad ---- */

typedef struct {
    zd_tensor_t **items;
    int n, cap;
} tensor_list_t;

static int collect(const zd_value_t *v, tensor_list_t *out, int depth)
{
    if (!v || depth > 64)
        return 0;
    if (zd_value_kind(v) == ZD_VALUE_TENSOR) {
        zd_tensor_t *t;
        zd_value_get_tensor(v, &t);
        if (!zd_tensor_requires_grad(t))
            return 0;
        if (out->n == out->cap) {
            int ncap = out->cap ? out->cap * 2 : 8;
            if (ncap > MAX_GRAD_TENSORS)
                return zd_error_set("dist_autograd: more than %d tensors need gradients in one "
                                    "message",
                                    MAX_GRAD_TENSORS);
            zd_tensor_t **p = realloc(out->items, sizeof *p * (size_t)ncap);
            if (!p)
                return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
            out->items = p;
            out->cap = ncap;
        }
        out->items[out->n++] = t;
        return 0;
    }
    if (zd_value_kind(v) == ZD_VALUE_LIST)
        for (size_t i = 0; i < zd_list_len(v); i++)
            if (collect(zd_list_get(v, i), out, depth + 1) < 0)
                return -1;
    return 0;
}

/*  Records a send function over the value's tensors that require grad.
    Sets *msg_id (0 when there were none). */
static int record_send(dist_context_t *c, const zd_value_t *v, int peer, uint64_t *msg_id)
{
    tensor_list_t tl = {0};
    *msg_id = 0;
    int rc = collect(v, &tl, 0);
    if (rc == 0 && tl.n > 0) {
        zd_autograd_node_t *node;
        rc = zd_autograd_node_new(&zd__dist_send_ops, tl.items, tl.n, tl.n, &node);
        /* The gradients that come back must have the shapes sent (all
           float32: only float32 tensors require grad). */
        for (int i = 0; rc == 0 && node && i < tl.n; i++)
            zd_autograd_node_set_output_shape(node, tl.items[i]);
        if (rc == 0 && node) {
            *msg_id = zd__dist_next_id();
            rc = zd__dist_context_add_fn(c, true, *msg_id, node, peer);
            zd_autograd_node_unref(node);
        }
    }
    free(tl.items);
    return rc;
}

/*  Makes a receive function the history of the value's tensors that
    require grad (they arrive as leaves). */
static int record_recv(dist_context_t *c, const zd_value_t *v, int peer, uint64_t msg_id)
{
    tensor_list_t tl = {0};
    int rc = collect(v, &tl, 0);
    if (rc == 0 && tl.n > 0) {
        zd_autograd_node_t *node;
        dist_recv_info_t *info = malloc(sizeof *info);
        rc = info ? zd_autograd_node_new(&zd__dist_recv_ops, NULL, 0, tl.n, &node)
                  : zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
        if (rc == 0 && node) {
            *info = (dist_recv_info_t){c->id, msg_id, peer};
            zd_autograd_node_set_ctx(node, info);
            info = NULL;
            for (int i = 0; i < tl.n; i++)
                zd_autograd_node_set_output(node, tl.items[i]);
            rc = zd__dist_context_add_fn(c, false, msg_id, node, peer);
            zd_autograd_node_unref(node);
        }
        free(info);
    }
    free(tl.items);
    return rc;
}

/*  A peer's Lamport number far ahead of ours is refused: believed, it could
    wrap the clock (zd_autograd_seq_observe clamps it too). */
static int observe_seq(uint64_t seq, int peer, const char *what)
{
    if (zd_autograd_seq_plausible(seq)) {
        zd_autograd_seq_observe(seq);
        return 0;
    }
    char who[160];
    zd__dist_peer_desc(peer, who, sizeof who);
    zd__log(ZD_LOG_WARN,
            "dist_autograd: %s from %s carries sequence number %llu, more than 2^32 "
            "ahead of ours (%llu): refused",
            what, who, (unsigned long long)seq, (unsigned long long)zd_autograd_seq_current());
    return zd_error_set("dist_autograd: %s from %s carries an implausible sequence number %llu",
                        what, who, (unsigned long long)seq);
}

static bool internal_fn(const char *fn)
{
    return strncmp(fn, "__dist_", 7) == 0;
}

/*  ---- caller side ---- */

static int on_send_request(void *arg, const zd_rpc_hook_msg_t *m, zd_value_t **args,
                           zd_rpc_bytes_t *extra, void **state)
{
    (void)arg;
    int64_t ctx_id = zd__dist_current_ctx;
    if (ctx_id == -1 || internal_fn(m->function))
        return 0;
    dist_context_t *c = zd__dist_context_get(ctx_id);
    if (!c)
        return zd_error_set("dist_autograd: the current context %lld was already released",
                            (long long)ctx_id);
    uint64_t msg_id = 0;
    uint8_t *buf = malloc(REQ_EXTRA);
    int rc = buf ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    if (rc == 0)
        rc = zd__dist_context_add_peer(c, m->peer);
    if (rc == 0)
        rc = record_send(c, *args, m->peer, &msg_id);
    if (rc < 0) {
        free(buf);
        zd__dist_context_unref(c);
        return -1;
    }
    buf[0] = 'D';
    buf[1] = 1;
    put_u64(buf + 2, (uint64_t)ctx_id);
    put_u64(buf + 10, msg_id);
    put_u64(buf + 18, zd_autograd_seq_current());
    extra->data = buf;
    extra->len = REQ_EXTRA;
    *state = c; /* the reference goes to on_recv_reply */
    return 0;
}

static int on_recv_reply(void *arg, const zd_rpc_hook_msg_t *m, void *state, const void *extra,
                         size_t len, zd_value_t **result)
{
    (void)arg;
    dist_context_t *c = state;
    int rc = 0;
    if (!c)
        return 0;
    if (*result && len == REP_EXTRA && ((const uint8_t *)extra)[0] == 'D') {
        uint64_t msg_id = get_u64((const uint8_t *)extra + 2);
        rc = observe_seq(get_u64((const uint8_t *)extra + 10), m->peer, "a reply");
        if (rc == 0 && msg_id)
            rc = record_recv(c, *result, m->peer, msg_id);
    } else if (*result && len != 0) {
        rc = zd_error_set("dist_autograd: malformed reply metadata (%zu bytes)", len);
    }
    zd__dist_context_unref(c);
    return rc;
}

/*  ---- callee side ---- */

typedef struct {
    dist_context_t *ctx;
    int64_t prev_ctx; /* the thread's context before the handler */
} call_state_t;

static int on_recv_request(void *arg, zd_rpc_call_t *call, const void *extra, size_t len,
                           zd_value_t **args)
{
    (void)arg;
    const uint8_t *x = extra;
    if (len == 0)
        return 0;
    if (len != REQ_EXTRA || x[0] != 'D' || x[1] != 1)
        return zd_error_set("dist_autograd: malformed request metadata (%zu bytes)", len);
    int64_t ctx_id = (int64_t)get_u64(x + 2);
    uint64_t msg_id = get_u64(x + 10);
    if (ctx_id < 0)
        return zd_error_set("dist_autograd: bad context id %lld", (long long)ctx_id);
    int peer = zd_rpc_call_caller_rank(call);
    if (observe_seq(get_u64(x + 18), peer, "a request") < 0)
        return -1;
    call_state_t *st = malloc(sizeof *st);
    if (!st)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    st->ctx = zd__dist_context_get_or_create_for(ctx_id, peer);
    int rc = st->ctx ? zd__dist_context_add_peer(st->ctx, peer) : -1;
    if (rc == 0 && msg_id)
        rc = record_recv(st->ctx, *args, peer, msg_id);
    if (rc < 0) {
        zd__dist_context_unref(st->ctx);
        free(st);
        return -1;
    }
    /* The handler works on behalf of the caller's context: its own RPCs are
       recorded in it too. */
    st->prev_ctx = zd__dist_current_ctx;
    zd__dist_current_ctx = ctx_id;
    zd_rpc_call_set_hook_state(call, st);
    return 0;
}

static void on_handler_return(void *arg, zd_rpc_call_t *call)
{
    (void)arg;
    call_state_t *st = zd_rpc_call_hook_state(call);
    if (st)
        zd__dist_current_ctx = st->prev_ctx;
}

static int on_send_reply(void *arg, zd_rpc_call_t *call, zd_value_t **result, zd_rpc_bytes_t *extra)
{
    (void)arg;
    call_state_t *st = zd_rpc_call_hook_state(call);
    int rc = 0;
    if (!st)
        return 0;
    zd_rpc_call_set_hook_state(call, NULL);
    if (*result) {
        uint64_t msg_id = 0;
        uint8_t *buf = malloc(REP_EXTRA);
        rc = buf ? record_send(st->ctx, *result, zd_rpc_call_caller_rank(call), &msg_id)
                 : zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
        if (rc == 0) {
            buf[0] = 'D';
            buf[1] = 1;
            put_u64(buf + 2, msg_id);
            put_u64(buf + 10, zd_autograd_seq_current());
            extra->data = buf;
            extra->len = REP_EXTRA;
        } else {
            free(buf);
        }
    }
    zd__dist_context_unref(st->ctx);
    free(st);
    return rc;
}

/*  The counters of zd_dist_autograd_stats, under the names PyTorch's
    dist_autograd._get_debug_info() uses where it has one. */
static int debug_info(void *arg, zd_rpc_debug_item_t *items, int max)
{
    (void)arg;
    zd_dist_autograd_stats_t st;
    zd_dist_autograd_stats(&st, sizeof st);
    const struct {
        const char *name;
        int64_t value;
    } all[] = {
        {"num_autograd_contexts", st.contexts},
        {"num_current_backward_passes", st.backward_passes},
        {"num_send_functions", st.send_functions},
        {"num_recv_functions", st.recv_functions},
        {"num_flushed_nodes", st.flushed_nodes},
        {"total_autograd_contexts", st.total_contexts},
        {"total_backward_calls", st.total_backward},
        {"total_grad_messages", st.total_grad_messages},
        {"total_send_functions", st.total_send_functions},
    };
    int n = (int)(sizeof all / sizeof all[0]);
    for (int i = 0; i < n && i < max; i++) {
        snprintf(items[i].name, sizeof items[i].name, "%s", all[i].name);
        items[i].value = all[i].value;
    }
    return n;
}

/*  RPC declared a peer lost (pool thread): what it left here goes. */
static void on_peer_lost(void *arg, int peer)
{
    (void)arg;
    int64_t n = zd__dist_context_release_lost(peer);
    if (n < 0)
        zd__log(ZD_LOG_WARN, "dist_autograd: contexts of lost rank %d: %s", peer, zd_error_last());
    else
        zd__log(ZD_LOG_WARN, "dist_autograd: released %lld context(s) of lost rank %d",
                (long long)n, peer);
}

zd_rpc_hooks_t zd__dist_record_hooks(void)
{
    return (zd_rpc_hooks_t){
        .size = sizeof(zd_rpc_hooks_t),
        .on_send_request = on_send_request,
        .on_recv_request = on_recv_request,
        .on_handler_return = on_handler_return,
        .on_send_reply = on_send_reply,
        .on_recv_reply = on_recv_reply,
        .debug_info = debug_info,
        .module = "distributed-autograd",
        .init_call = "zd_dist_autograd_init()",
        .on_peer_lost = on_peer_lost,
    };
}
