/* SPDX-License-Identifier: MIT */
/*  call.c: outgoing requests, their pending table, zd_rpc_sync / zd_rpc_async.

    A request gets a future and an entry in the pending table (keyed by its
    64-bit id) before it is sent; the I/O thread takes the entry out when
    the answer arrives, or when its deadline passes, and completes the
    future. zd_rpc_async hands that future to the caller. zd_rpc_sync
    sends on a socket of its calling thread (direct.c) and reads the answer
    there itself (wait_direct): no hand-off between threads; the shared
    path (a future waited on) remains for peers whose connection is down
    and threads that cannot have sockets of their own. */
#include "rpc/agent/agent.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>
#include "rpc/value/future_hook.h"
#include "rpc/agent/rref.h"

/*  A direct wait polls at most this long at a time (1000 s), then looks at
    its deadline again: zmq_poll takes a long of ms. */
#define WAIT_SLICE_MAX_MS INT64_C(1000000)

struct pending {
    uint64_t id;
    int dst;
    uint8_t type;
    bool internal;
    bool hooked; /* on_send_request ran: on_recv_reply is due */
    char fn[ZD_RPC_MAX_FUNCTION + 1];
    const char *api;
    zd_future_t *future;
    int64_t start_ns;
    int64_t deadline_ns; /* INT64_MAX: none */
    int64_t timeout_ms;
    void *hook_state;
    int wake_fd;     /* zd_rpc_sync on its own socket: wake it when */
    pthread_t owner; /* another thread completes the call */
    /* Under pending_lock: the request is still being sent, and an ERROR
       answer that came meanwhile (its text, owned, NULL when it could not
       be kept) waits for the send's outcome (handle_error). */
    bool sending, refused;
    char *refusal;
    zd_error_code_t refusal_code;
    pending_t *next;
};

/*  ---- the table ---- */

static size_t bucket_of(agent_t *a, uint64_t id)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (a->n_buckets - 1);
}

static void pending_insert(agent_t *a, pending_t *p)
{
    pthread_mutex_lock(&a->pending_lock);
    size_t b = bucket_of(a, p->id);
    p->next = a->buckets[b];
    a->buckets[b] = p;
    a->n_pending++;
    int64_t due = p->deadline_ns; /* p may be answered and freed once unlocked */
    if (due < a->earliest_ns || a->n_pending == 1)
        a->earliest_ns = due;
    pthread_mutex_unlock(&a->pending_lock);
    zd__io_due(&a->net, due);
}

/*  The link to the entry of id (*link NULL: none). Under pending_lock. */
static pending_t **pending_find(agent_t *a, uint64_t id)
{
    pending_t **pp = &a->buckets[bucket_of(a, id)];
    while (*pp && (*pp)->id != id)
        pp = &(*pp)->next;
    return pp;
}

/*  Unlinks the entry at *pp. Under pending_lock. */
static pending_t *pending_unlink(agent_t *a, pending_t **pp)
{
    pending_t *p = *pp;
    *pp = p->next;
    a->n_pending--;
    return p;
}

/*  Takes the entry of id if it was sent to src; *dst: the rank it was
    sent to (-1: no entry). An answer from another rank leaves the entry
    where it is, never out of the table for a moment. */
static pending_t *pending_take_from(agent_t *a, uint64_t id, int src, int *dst)
{
    pthread_mutex_lock(&a->pending_lock);
    pending_t **pp = pending_find(a, id);
    *dst = *pp ? (*pp)->dst : -1;
    pending_t *p = *pp && (*pp)->dst == src ? pending_unlink(a, pp) : NULL;
    pthread_mutex_unlock(&a->pending_lock);
    return p;
}

static pending_t *pending_take(agent_t *a, uint64_t id)
{
    pthread_mutex_lock(&a->pending_lock);
    pending_t **pp = pending_find(a, id);
    pending_t *p = *pp ? pending_unlink(a, pp) : NULL;
    pthread_mutex_unlock(&a->pending_lock);
    return p;
}

/*  Takes every entry matching (peer, or all with peer < 0; or only expired
    ones with now >= 0) out of the table, as a list. */
static pending_t *pending_take_many(agent_t *a, int peer, int64_t now)
{
    pending_t *out = NULL;
    pthread_mutex_lock(&a->pending_lock);
    if (now >= 0 && (a->n_pending == 0 || now < a->earliest_ns)) {
        pthread_mutex_unlock(&a->pending_lock);
        return NULL;
    }
    int64_t earliest = INT64_MAX;
    for (size_t b = 0; b < a->n_buckets; b++) {
        pending_t **pp = &a->buckets[b];
        while (*pp) {
            pending_t *p = *pp;
            bool take = now >= 0 ? p->deadline_ns <= now : (peer < 0 || p->dst == peer);
            if (take) {
                *pp = p->next;
                a->n_pending--;
                p->next = out;
                out = p;
            } else {
                if (p->deadline_ns < earliest)
                    earliest = p->deadline_ns;
                pp = &p->next;
            }
        }
    }
    a->earliest_ns = earliest;
    pthread_mutex_unlock(&a->pending_lock);
    return out;
}

/*  ---- completion ---- */

static void pending_free(pending_t *p)
{
    zd_future_unref(p->future);
    free(p->refusal);
    free(p);
}

static zd_rpc_call_kind_t kind_of(int type)
{
    return type == RPC_MSG_REMOTE    ? ZD_RPC_KIND_REMOTE
        : type == RPC_MSG_RREF_FETCH ? ZD_RPC_KIND_FETCH
                                     : ZD_RPC_KIND_CALL;
}

/*  Completes p with value (borrowed) or the failure detail and its code,
    runs the reply hook (with the answer's extra bytes), counts, and frees
    p. */
static void pending_finish(agent_t *a, pending_t *p, zd_value_t *value, const char *detail,
                           zd_error_code_t code, const void *extra, size_t extra_len)
{
    peer_t *peer = &a->net.peers[p->dst];
    zd_value_t *v = value ? zd_value_ref(value) : NULL;
    char text[512];
    if (p->hooked && a->hooks.on_recv_reply) {
        zd_rpc_hook_msg_t m = {p->dst, p->fn, kind_of(p->type), p->id};
        bool had_value = v != NULL;
        if (a->hooks.on_recv_reply(a->hooks.arg, &m, p->hook_state, extra, extra_len, &v) < 0 &&
            had_value) {
            snprintf(text, sizeof text, "reply hook failed: %s", zd_error_last());
            detail = text;
            code = zd_error_code();
            zd_value_unref(v);
            v = NULL;
        }
    }
    if (!p->internal) {
        atomic_fetch_sub_explicit(&peer->m.in_flight, 1, memory_order_relaxed);
        atomic_fetch_sub_explicit(&a->user_in_flight, 1, memory_order_relaxed);
    }
    /* The waiter polls its own socket: tell it before completing, while it
       is sure to be waiting (its eventfd lives as long as its thread). */
    if (p->wake_fd >= 0 && !pthread_equal(p->owner, pthread_self())) {
        uint64_t one = 1;
        if (write(p->wake_fd, &one, sizeof one) < 0) {
            /* an eventfd this small cannot be full */
        }
    }
    if (v) {
        if (!p->internal)
            zd__metrics_latency(&peer->m, zd__net_now_ns() - p->start_ns);
        zd_future_set_value(p->future, v);
        zd_value_unref(v);
    } else {
        if (!p->internal)
            atomic_fetch_add_explicit(&peer->m.errors, 1, memory_order_relaxed);
        if (p->internal || p->type == RPC_MSG_RREF_FETCH) /* no internal name for users */
            zd_future_set_error_code(p->future, code, "%s to \"%s\" (rank %d): %s", p->api,
                                     peer->name, p->dst, detail ? detail : "failed");
        else
            zd_future_set_error_code(p->future, code, "%s to \"%s\" (rank %d) calling \"%s\": %s",
                                     p->api, peer->name, p->dst, p->fn, detail ? detail : "failed");
    }
    pending_free(p);
}

/*  The request of id has left whole: an ERROR answer that came meanwhile
    completes it now. (When the send failed, the sender takes the call out
    and fails it with its own error instead: the refusal of a message it
    could not finish, such as a tensor frame it could not allocate and
    sent empty, must not read as the call's failure.) */
static void pending_sent(agent_t *a, uint64_t id)
{
    pthread_mutex_lock(&a->pending_lock);
    pending_t **pp = pending_find(a, id);
    pending_t *p = *pp;
    if (p)
        p->sending = false;
    if (p && p->refused)
        pending_unlink(a, pp);
    else
        p = NULL;
    pthread_mutex_unlock(&a->pending_lock);
    if (p)
        pending_finish(a, p, NULL, p->refusal ? p->refusal : "remote error", p->refusal_code, NULL,
                       0);
}

/*  ---- sending ---- */

static zd_value_t *empty_args(void)
{
    static _Atomic(zd_value_t *) empty;
    zd_value_t *v = atomic_load(&empty);
    if (v)
        return v;
    zd_value_t *n = zd_value_list(0);
    if (!n)
        return NULL;
    if (!atomic_compare_exchange_strong(&empty, &v, n)) {
        zd_value_unref(n);
        return v;
    }
    return n;
}

static const char *type_fn_name(const call_req_t *req)
{
    if (req->fn)
        return req->fn;
    return req->type == RPC_MSG_RREF_FETCH ? "__to_here" : zd__rpc_wire_type_name(req->type);
}

zd_future_t *zd__call_start(agent_t *a, int to, const call_req_t *req)
{
    if (zd__world_check_rank(&a->net, to, req->api) < 0)
        return NULL;
    if (atomic_load(&a->net.closing))
        return zd_error_set_code(ZD_ERR_SHUTDOWN, "%s: RPC is shutting down", req->api), NULL;
    char lost[256];
    if (zd__peer_lost(&a->net, to, lost, sizeof lost))
        return zd_error_set_code(ZD_ERR_PEER, "%s: %s", req->api, lost), NULL;
    bool has_value = req->type == RPC_MSG_CALL || req->type == RPC_MSG_REMOTE;
    if (has_value && !zd__rpc_wire_name_ok(req->fn, ZD_RPC_MAX_FUNCTION))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s to \"%s\" (rank %d): bad function name "
                                 "\"%s\"",
                                 req->api, a->net.peers[to].name, to, req->fn ? req->fn : "(null)"),
               NULL;
    if (req->args && zd_value_kind(req->args) != ZD_VALUE_LIST)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s to \"%s\" (rank %d) calling \"%s\": "
                                 "arguments must be a list, not %s",
                                 req->api, a->net.peers[to].name, to, req->fn,
                                 zd_value_kind_name(zd_value_kind(req->args))),
               NULL;
    pending_t *p = calloc(1, sizeof *p);
    zd_future_t *f = zd_future_new();
    if (!p || !f) {
        free(p);
        zd_future_unref(f);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", req->api), NULL;
    }
    p->id = zd__agent_new_id(a);
    p->dst = to;
    p->type = req->type;
    p->internal = !req->hooked;
    p->api = req->api;
    snprintf(p->fn, sizeof p->fn, "%s", type_fn_name(req));
    p->future = f;
    p->wake_fd = req->sock ? req->wake_fd : -1;
    p->owner = pthread_self();
    int64_t told_ms = zd__agent_timeout(a, req->timeout_ms);
    p->timeout_ms =
        req->wait_ms > 0 && (told_ms == 0 || req->wait_ms < told_ms) ? req->wait_ms : told_ms;
    p->start_ns = zd__net_now_ns();
    p->deadline_ns = zd__deadline_after(p->start_ns, p->timeout_ms);
    if (req->id_out)
        *req->id_out = p->id;
    zd_future_ref(f); /* the caller's */
    peer_t *peer = &a->net.peers[to];
    if (!p->internal) {
        atomic_fetch_add_explicit(&peer->m.calls_sent, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&peer->m.in_flight, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->user_in_flight, 1, memory_order_relaxed);
    }

    zd_value_t *args = NULL;
    if (has_value)
        args = zd_value_ref(req->args ? req->args : empty_args());
    zd_rpc_bytes_t extra = {NULL, 0};
    char detail[512] = "";
    zd_error_code_t code = ZD_ERR_OTHER;
    if (req->hooked && a->has_hooks) {
        zd_rpc_hook_msg_t m = {to, p->fn, kind_of(req->type), p->id};
        if (a->hooks.on_send_request &&
            a->hooks.on_send_request(a->hooks.arg, &m, &args, &extra, &p->hook_state) < 0) {
            snprintf(detail, sizeof detail, "request hook failed: %s", zd_error_last());
            code = zd_error_code();
            goto fail;
        }
        p->hooked = true;
    }
    if (extra.len > RPC_WIRE_MAX_EXTRA) {
        snprintf(detail, sizeof detail, "%zu bytes of hook metadata", extra.len);
        goto fail;
    }
    rref_txn_t txn;
    zd__rref_txn_init(&txn, a);
    rpc_encoded_t enc = {0};
    if (has_value) {
        rpc_rref_codec_t codec = zd__rref_txn_codec(&txn);
        if (zd__value_encode(args, &codec, to, &enc) < 0) {
            snprintf(detail, sizeof detail, "cannot send the arguments: %s", zd_error_last());
            code = zd_error_code();
            zd__rref_txn_rollback(&txn);
            goto fail;
        }
    }
    rpc_wire_header_t h = {
        .type = req->type,
        .flags = req->flags | (req->hooked ? 0 : RPC_WIRE_F_INTERNAL),
        .id = p->id,
        .a = req->a,
        .b = req->b,
        .timeout_ms = told_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)told_ms,
        .fn = req->fn,
        .fn_len = has_value ? strlen(req->fn) : 0,
        .extra = extra.data,
        .extra_len = extra.len,
        .meta = enc.meta,
        .meta_len = enc.meta_len,
    };
    /* In the table before the first byte leaves: the answer may come back
       before zd__transport_send returns. */
    p->sending = true;
    pending_insert(a, p);
    /* A call on the thread's own socket still needs the shared one made
       (a world connected on first use): it is what tells of the peer lost. */
    int rc = !req->sock ? zd__transport_send(&a->net, to, &h, enc.tensors, enc.n_tensors)
        : zd__transport_reach(&a->net, to, h.timeout_ms) < 0
        ? -1
        : zd__transport_send_on(&a->net, req->sock, to, &h, enc.tensors, enc.n_tensors);
    zd__rpc_encoded_clear(&enc);
    free(extra.data);
    zd_value_unref(args);
    if (rc == 0) {
        zd__rref_txn_commit(&txn);
        pending_sent(a, h.id);
        return f;
    }
    zd__rref_txn_rollback(&txn);
    snprintf(detail, sizeof detail, "%s", zd_error_last());
    code = zd_error_code();
    p = pending_take(a, h.id);
    if (p)
        pending_finish(a, p, NULL, detail, code, NULL, 0);
    return f; /* failed: the error is in the future */
fail:
    free(extra.data);
    zd_value_unref(args);
    pending_finish(a, p, NULL, detail, code, NULL, 0);
    return f;
}

/*  ---- answers and expiry (I/O thread) ---- */

/*  The code an ERROR answer carries in field a (wire.h); 0 (older senders,
    dropped messages) and unknown values read as a remote failure. */
static zd_error_code_t wire_error_code(const rpc_wire_header_t *h)
{
    if (h->a == 0 || h->a > ZD_ERR_SHUTDOWN)
        return ZD_ERR_REMOTE;
    return (zd_error_code_t)h->a;
}

/*  The text of an ERROR answer. A peer without hooks refused our hook
    metadata: say which module's init call it misses, as only this side
    knows the module. */
static void error_text(agent_t *a, const pending_t *p, const rpc_wire_header_t *h, char *text,
                       size_t size)
{
    if (wire_error_code(h) == ZD_ERR_NOT_INITIALIZED && p->hooked && a->hooks.module &&
        a->hooks.init_call)
        snprintf(text, size,
                 "worker \"%s\" received a %s message but %s was not called "
                 "before zd_rpc_init()",
                 a->net.peers[p->dst].name, a->hooks.module, a->hooks.init_call);
    else
        snprintf(text, size, "remote error: %.*s", (int)h->meta_len, (const char *)h->meta);
}

static void dropped_answer(const rpc_wire_header_t *h, int dst)
{
    zd__log(ZD_LOG_WARN,
            "rpc: dropped an answer to request %" PRIx64 " from rank %d: it was sent to rank %d",
            h->id, h->src, dst);
}

/*  An ERROR answer. One that comes while its request is still being sent
    waits in the entry for the send's outcome (pending_sent). */
static void handle_error(agent_t *a, const rpc_wire_header_t *h)
{
    size_t size = h->meta_len + 512;
    char *text = malloc(size);
    pthread_mutex_lock(&a->pending_lock);
    pending_t **pp = pending_find(a, h->id);
    pending_t *p = *pp;
    int dst = p ? p->dst : -1;
    if (p && dst == h->src && text)
        error_text(a, p, h, text, size);
    if (p && dst == h->src && p->sending) {
        if (!p->refused) { /* the first refusal is kept; text of another is freed below */
            p->refused = true;
            p->refusal = text;
            p->refusal_code = wire_error_code(h);
            text = NULL;
        }
        p = NULL;
    } else if (p && dst == h->src) {
        pending_unlink(a, pp);
    } else {
        p = NULL;
    }
    pthread_mutex_unlock(&a->pending_lock);
    if (dst >= 0 && dst != h->src)
        dropped_answer(h, dst);
    if (p)
        pending_finish(a, p, NULL, text ? text : "remote error", wire_error_code(h), h->extra,
                       h->extra_len);
    free(text);
}

void zd__call_handle_answer(agent_t *a, const rpc_wire_header_t *h, rpc_frame_t *frames, int n)
{
    if (h->type == RPC_MSG_ERROR) {
        for (int i = 0; i < n; i++)
            frames[i].release(frames[i].data, frames[i].release_arg);
        handle_error(a, h);
        return;
    }
    int dst;
    pending_t *p = pending_take_from(a, h->id, h->src, &dst);
    if (!p && dst >= 0)
        dropped_answer(h, dst);
    /* Decoded even when nobody waits any more (a late answer), so that the
       RRefs inside follow their protocol and nothing leaks. */
    zd_value_t *v = NULL;
    int rc = zd__value_decode(h->meta, h->meta_len, frames, n, &a->rref_codec, h->src, &v);
    if (!p) {
        zd_value_unref(v);
        return;
    }
    if (rc < 0) {
        char text[512];
        snprintf(text, sizeof text, "bad reply: %s", zd_error_last());
        zd_error_code_t code =
            zd_error_code() == ZD_ERR_NO_MEMORY ? ZD_ERR_NO_MEMORY : ZD_ERR_OTHER;
        zd__log(ZD_LOG_WARN, "rpc: %s", text);
        pending_finish(a, p, NULL, text, code, h->extra, h->extra_len);
        return;
    }
    pending_finish(a, p, v, NULL, ZD_OK, h->extra, h->extra_len);
    zd_value_unref(v);
}

/*  Fails every call of list: with text and code, or (text NULL) as timed
    out. */
static void finish_list(agent_t *a, pending_t *list, const char *detail, zd_error_code_t code)
{
    while (list) {
        pending_t *next = list->next;
        char text[256];
        if (!detail)
            snprintf(text, sizeof text, "timed out after %" PRId64 " ms", list->timeout_ms);
        pending_finish(a, list, NULL, detail ? detail : text, detail ? code : ZD_ERR_TIMEOUT, NULL,
                       0);
        list = next;
    }
}

int64_t zd__call_expire(agent_t *a, int64_t now_ns)
{
    finish_list(a, pending_take_many(a, -1, now_ns), NULL, ZD_ERR_TIMEOUT);
    pthread_mutex_lock(&a->pending_lock);
    int64_t due = a->n_pending ? a->earliest_ns : INT64_MAX;
    pthread_mutex_unlock(&a->pending_lock);
    return due;
}

void zd__call_fail_peer(agent_t *a, int peer, const char *text, zd_error_code_t code)
{
    finish_list(a, pending_take_many(a, peer, -1), text, code);
}

void zd__call_fail_answer(agent_t *a, uint64_t id, int src, const char *text, zd_error_code_t code)
{
    int dst; /* not that peer's call: left alone */
    pending_t *p = pending_take_from(a, id, src, &dst);
    if (p)
        finish_list(a, p, text, code);
}

void zd__call_timeout_now(agent_t *a, uint64_t id)
{
    pending_t *p = pending_take(a, id);
    if (p)
        finish_list(a, p, NULL, ZD_ERR_TIMEOUT);
}

/*  ---- public calls ---- */

/*  Waits for a request's future like zd_rpc_sync does: the waiter enforces the
    timeout itself (the I/O thread checks deadlines only every few ms).
    timeout_ms: as in error.h, already resolved (0: none). */
static int wait_answer(zd_future_t *f, uint64_t id, int64_t timeout_ms)
{
    int rc = zd_future_wait(f, timeout_ms);
    if (rc < 0 && !zd_future_done(f)) {
        agent_t *a = zd__agent_acquire();
        if (a) {
            zd__call_timeout_now(a, id);
            zd__agent_release(a);
        }
        rc = zd_future_wait(f, ZD_TIMEOUT_NONE);
    }
    return rc;
}

/*  Waits for the answer on the thread's own socket: reads and handles what
    arrives there (answers to this call, or late answers to earlier ones,
    decoded and dropped), until the future completes or the deadline. The
    eventfd says another thread completed the call (failure, shutdown, or an
    answer that came through the shared path). */
static int wait_direct(agent_t *a, int to, void *sock, int wake_fd, zd_future_t *f, uint64_t id,
                       int64_t timeout_ms)
{
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), timeout_ms);
    int64_t poll_ns = zd__poll_begin(); /* see zd__poll_future */
    int64_t poll_until = zd__net_now_ns() + poll_ns;
    inmsg_t m = {0};
    zd__pool_block_begin();
    while (!zd_future_done(f)) {
        int64_t now = zd__net_now_ns();
        if (now >= deadline) {
            /* Fails it, unless another thread is completing it right now. */
            zd__call_timeout_now(a, id);
            zd_future_wait(f, ZD_TIMEOUT_NONE);
            break;
        }
        int64_t left = zd__ms_left(now, deadline);
        if (left > WAIT_SLICE_MAX_MS)
            left = WAIT_SLICE_MAX_MS;
        if (now < poll_until)
            left = 0;
        else if (poll_ns) {
            zd__poll_end();
            poll_ns = 0;
        }
        zmq_pollitem_t items[2] = {{sock, 0, ZMQ_POLLIN, 0}, {NULL, wake_fd, ZMQ_POLLIN, 0}};
        int rc = zmq_poll(items, 2, (long)left);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc == 0 && left == 0)
            sched_yield(); /* polling: let the threads that bring the answer run */
        if (items[1].revents & ZMQ_POLLIN) {
            uint64_t v;
            if (read(wake_fd, &v, sizeof v) < 0) {
                /* drained already */
            }
            /* Completion is under way on the other thread. */
            zd_future_wait(f, ZD_TIMEOUT_NONE);
            break;
        }
        int got;
        while ((got = zd__transport_recv(&a->net, sock, to, &m)) != 0)
            if (got > 0) {
                zd__call_handle_answer(a, &m.h, m.frames, m.n);
                zd__transport_msg_done(&m);
            }
    }
    if (poll_ns)
        zd__poll_end();
    zd__pool_block_end();
    free(m.frames);
    /* Done: zd_future_wait only collects the result. */
    return zd_future_done(f) ? zd_future_wait(f, ZD_TIMEOUT_NONE)
                             : zd_error_set("cannot wait for the answer: %s", zmq_strerror(errno));
}

int zd__call_sync(const call_req_t *req, int to, zd_value_t **result)
{
    if (result)
        *result = NULL;
    if (zd__net_thread_role() == ROLE_IO)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: called on the RPC I/O thread (in a future "
                                 "callback or an inline handler), where it would wait forever: "
                                 "use zd_rpc_async",
                                 req->api);
    agent_t *a = zd__agent_acquire();
    if (!a)
        return zd_error_wrap("%s", req->api);
    uint64_t id = 0;
    call_req_t r = *req;
    r.id_out = &id;
    int64_t timeout = zd__agent_timeout(a, req->timeout_ms);
    r.timeout_ms = timeout; /* one reading of the default for both uses */
    /* A peer whose connection is down: the shared socket says so at once. */
    if (to >= 0 && to < a->net.world && !atomic_load(&a->net.peers[to].lost) && !req->shared_only)
        r.sock = zd__direct_socket(&a->net, to, &r.wake_fd);
    if (r.sock) {
        /* A wake-up left from an earlier call (completed by another thread
           while this one was already returning) must not count for this one. */
        uint64_t stale;
        if (read(r.wake_fd, &stale, sizeof stale) < 0) {
            /* nothing left: the usual case */
        }
    }
    zd_future_t *f = zd__call_start(a, to, &r);
    if (!f) {
        zd__agent_release(a);
        return -1;
    }
    int rc;
    if (r.sock) {
        /* Holds the agent while it reads its socket: shutdown fails the
           call first, which wakes this thread. */
        rc = wait_direct(a, to, r.sock, r.wake_fd, f, id, timeout);
        zd__agent_release(a);
    } else {
        zd__agent_release(a);
        rc = wait_answer(f, id, timeout);
    }
    if (rc == 0 && result)
        *result = zd_value_ref(zd_future_value(f));
    zd_future_unref(f);
    return rc;
}

int zd_rpc_sync(int to, const char *fn, zd_value_t *args, int64_t timeout_ms, zd_value_t **result)
{
    call_req_t req = {.type = RPC_MSG_CALL,
                      .fn = fn,
                      .api = "zd_rpc_sync",
                      .args = args,
                      .timeout_ms = timeout_ms,
                      .hooked = true};
    return zd__call_sync(&req, to, result);
}

zd_future_t *zd_rpc_async(int to, const char *fn, zd_value_t *args, int64_t timeout_ms)
{
    agent_t *a = zd__agent_acquire();
    if (!a) {
        zd_error_wrap("zd_rpc_async");
        return NULL;
    }
    call_req_t req = {.type = RPC_MSG_CALL,
                      .fn = fn,
                      .api = "zd_rpc_async",
                      .args = args,
                      .timeout_ms = timeout_ms,
                      .hooked = true};
    zd_future_t *f = zd__call_start(a, to, &req);
    zd__agent_release(a);
    return f;
}

/*  ---- the agent's part in waits on futures (future_hook.h) ---- */

static bool wait_poll(zd_future_t *f, int64_t max_ns)
{
    agent_t *a = zd__agent_try_acquire();
    bool done = a ? zd__poll_future(&a->net, f, max_ns, atomic_load(&a->user_in_flight) > 0)
                  : zd_future_done(f);
    zd__agent_release(a);
    return done;
}

const rpc_future_wait_hooks_t zd__call_wait_hooks = {wait_poll, zd__pool_block_begin,
                                                     zd__pool_block_end};
