/* SPDX-License-Identifier: MIT */
/*  rref_fork.c: RRefs crossing the wire: forks made while encoding a
    message (and taken back when it is never sent), RRefs arriving in a
    message, and the control messages they cause (RREF_FORK_REQUEST,
    RREF_CHILD_ACCEPT, RREF_USER_DELETE), idempotent and retried. The
    protocol is described in rref.h. */
#include "rpc/agent/rref.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/fault_inject.h"

/*  A control message that gets no answer may have been lost on the way (a
    connection that broke with it in flight): it is sent again after 1 s,
    then 2, 4, ... (at most CTRL_MAX_WAIT_MS), until the RPC timeout has
    passed since the first attempt. Waiting the whole timeout for each
    attempt would leave the first retry after a shutdown had given up. The
    peer is still told the whole timeout: a fork request's placeholder
    lives that long. Attempts that fail otherwise (the peer refused it, is
    lost, or its connection came back under the call) are made again up to
    CTRL_RETRIES times, within the same time. */
#define CTRL_RETRIES       3
#define CTRL_FIRST_WAIT_MS 1000
#define CTRL_MAX_WAIT_MS   30000

enum { TXN_OWNER_FORK, TXN_CHILD };

struct txn_item {
    int kind;
    uint64_t rref_id, fork_id;
};

static size_t child_bucket(uint64_t id)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 40) % CHILD_BUCKETS;
}

/*  ---- control messages (idempotent, retried) ---- */

static void ctrl_send(ctrl_t *c);

/*  How long the next attempt waits for its answer; 0 when the time is up. */
static int64_t next_wait_ms(const ctrl_t *c)
{
    int64_t wait = CTRL_FIRST_WAIT_MS << (c->attempts < 5 ? c->attempts : 5);
    if (wait > CTRL_MAX_WAIT_MS)
        wait = CTRL_MAX_WAIT_MS;
    int64_t total = zd__agent_timeout(c->a, -1);
    if (total == 0 || c->attempts == 0)
        return total && total < wait ? total : wait;
    int64_t left = total - (zd__net_now_ns() - c->first_ns) / ZD__NS_PER_MS;
    return left <= 0 ? 0 : left < wait ? left : wait;
}

/*  The outcome of an attempt: c is sent again, or finished and freed. */
static void ctrl_outcome(ctrl_t *c, bool ok, zd_error_code_t code, const char *error)
{
    agent_t *a = c->a;
    bool again = false;
    if (!ok && !atomic_load(&a->net.closing)) {
        if (code != ZD_ERR_TIMEOUT)
            c->failures++;
        again = c->failures < CTRL_RETRIES && next_wait_ms(c) > 0;
    }
    if (again) {
        zd__log(ZD_LOG_DEBUG, "rpc: %s to rank %d, attempt %d: %s: sending it again",
                zd__rpc_wire_type_name(c->type), c->dst, c->attempts, error);
        ctrl_send(c);
        return;
    }
    /* One line per message would repeat the loss of a peer, logged once
       already, for every RRef it shared with this process. */
    if (!ok)
        zd__log(code == ZD_ERR_PEER && atomic_load(&a->net.peers[c->dst].lost_at_ns) ? ZD_LOG_DEBUG
                                                                                     : ZD_LOG_WARN,
                "rpc: %s (attempt %d)", error, c->attempts);
    if (c->done)
        c->done(a, c, ok);
    pthread_mutex_lock(&a->rrefs->lock);
    a->rrefs->n_ctrl--;
    pthread_mutex_unlock(&a->rrefs->lock);
    free(c);
}

static void ctrl_answer(zd_future_t *f, void *arg)
{
    ctrl_outcome(arg, zd_future_value(f) != NULL, zd_future_error_code(f), zd_future_error(f));
}

static void ctrl_send(ctrl_t *c)
{
    int64_t wait = next_wait_ms(c);
    if (wait <= 0)
        wait = 1; /* the time ran out since ctrl_answer looked: one last short try */
    if (c->attempts++ == 0)
        c->first_ns = zd__net_now_ns();
    call_req_t req = {.type = c->type,
                      .api = "RRef protocol",
                      .a = c->rref_id,
                      .b = c->fork_id,
                      .timeout_ms = -1,
                      .wait_ms = wait,
                      .hooked = false};
    /* An attempt that finds no memory here fails like any other: the next
       one may, and the messages are idempotent. */
    ZD_FAULT_BENIGN(true);
    zd_future_t *f = zd__call_start(c->a, c->dst, &req);
    int watched = f ? zd_future_then(f, ctrl_answer, c) : -1;
    ZD_FAULT_BENIGN(false);
    zd_future_unref(f);
    if (watched < 0) {
        /* Not even sent (shutting down: finished as failed), or its answer
           not watched (out of memory: sent again). */
        if (zd_error_code() != ZD_ERR_NO_MEMORY)
            c->failures = CTRL_RETRIES;
        char error[512];
        snprintf(error, sizeof error, "%s", zd_error_last());
        ctrl_outcome(c, false, zd_error_code(), error);
    }
}

void zd__rref_ctrl_start(agent_t *a, int dst, uint8_t type, uint64_t rref_id, uint64_t fork_id,
                         ctrl_done_fn *done, zd_rref_t *r, int parent)
{
    zd__rref_ctrl_run(a, calloc(1, sizeof(ctrl_t)), dst, type, rref_id, fork_id, done, r, parent);
}

void zd__rref_ctrl_run(agent_t *a, ctrl_t *c, int dst, uint8_t type, uint64_t rref_id,
                       uint64_t fork_id, ctrl_done_fn *done, zd_rref_t *r, int parent)
{
    if (!c) {
        zd__log(ZD_LOG_ERROR, "rpc: RRef: out of memory for a %s", zd__rpc_wire_type_name(type));
        if (done) {
            ctrl_t tmp = {.a = a, .r = r, .parent = parent};
            done(a, &tmp, false);
        }
        return;
    }
    *c = (ctrl_t){.a = a,
                  .dst = dst,
                  .type = type,
                  .rref_id = rref_id,
                  .fork_id = fork_id,
                  .done = done,
                  .r = r,
                  .parent = parent};
    pthread_mutex_lock(&a->rrefs->lock);
    a->rrefs->n_ctrl++;
    pthread_mutex_unlock(&a->rrefs->lock);
    ctrl_send(c);
}

/*  ---- encoding: forks ---- */

void zd__rref_user_error(agent_t *a, zd_rref_t *r, char *buf, size_t size);

void zd__rref_txn_init(rref_txn_t *t, agent_t *a)
{
    memset(t, 0, sizeof *t);
    t->a = a;
}

static int txn_encode(void *arg, zd_rref_t *r, int dst, uint8_t out[RPC_RREF_WIRE_SIZE])
{
    rref_txn_t *t = arg;
    agent_t *a = t->a;
    rref_ctx_t *x = a->rrefs;
    if (r->gen != a->net.gen)
        return zd_error_set("RRef from an earlier RPC session cannot be sent");
    char error[1024];
    zd__rref_user_error(a, r, error, sizeof error);
    /* an owner lost since says the most; a creation that failed before
       is said too */
    if (zd__rref_owner_lost_since(a, r, "RRef argument")) {
        if (error[0]) {
            char lost[512];
            snprintf(lost, sizeof lost, "%s", zd_error_last());
            zd_error_set_code(ZD_ERR_PEER, "%s; and its creation had failed: %s", lost, error);
        }
        return -1;
    }
    if (error[0])
        return zd_error_set("%s", error);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 4;
        struct txn_item *it = realloc(t->items, (size_t)cap * sizeof *it);
        if (!it)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "RRef: out of memory");
        t->items = it;
        t->cap = cap;
    }
    uint64_t fork_id = zd__rref_new_id(a);
    pthread_mutex_lock(&x->lock);
    if (r->is_owner) {
        /* Early registration: the owner adds the child itself. */
        owner_t *e = zd__rref_owner_find(x, r->rref_id);
        if (!e || zd__rref_owner_add_fork(e, fork_id, dst) < 0) {
            pthread_mutex_unlock(&x->lock);
            return e ? -1 : zd_error_set("RRef %" PRIx64 " is no longer owned here", r->rref_id);
        }
        t->items[t->n++] = (struct txn_item){TXN_OWNER_FORK, r->rref_id, fork_id};
    } else {
        /* G2: the parent stays alive until the child is confirmed. */
        child_t *c = malloc(sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&x->lock);
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "RRef: out of memory");
        }
        c->fork_id = fork_id;
        c->holder = dst;
        c->parent = zd_rref_ref(r);
        size_t b = child_bucket(fork_id);
        c->next = x->children[b];
        x->children[b] = c;
        x->n_children++;
        t->items[t->n++] = (struct txn_item){TXN_CHILD, r->rref_id, fork_id};
    }
    pthread_mutex_unlock(&x->lock);
    memset(out, 0, RPC_RREF_WIRE_SIZE);
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(r->rref_id >> (8 * i));
        out[8 + i] = (uint8_t)(fork_id >> (8 * i));
    }
    out[16] = (uint8_t)r->owner;
    out[17] = (uint8_t)(r->owner >> 8);
    out[18] = (uint8_t)a->net.rank;
    out[19] = (uint8_t)(a->net.rank >> 8);
    return 0;
}

rpc_rref_codec_t zd__rref_txn_codec(rref_txn_t *t)
{
    rpc_rref_codec_t c = {txn_encode, NULL, t}; /* encoding only */
    return c;
}

/*  Removes a pending child; returns its parent reference, or NULL. */
zd_rref_t *zd__rref_child_take(rref_ctx_t *x, uint64_t fork_id)
{
    child_t **pp = &x->children[child_bucket(fork_id)];
    while (*pp && (*pp)->fork_id != fork_id)
        pp = &(*pp)->next;
    child_t *c = *pp;
    if (!c)
        return NULL;
    *pp = c->next;
    x->n_children--;
    zd_rref_t *parent = c->parent;
    free(c);
    return parent;
}

void zd__rref_txn_commit(rref_txn_t *t)
{
    free(t->items);
    t->items = NULL;
    t->n = t->cap = 0;
}

void zd__rref_txn_rollback(rref_txn_t *t)
{
    rref_ctx_t *x = t->a->rrefs;
    for (int i = 0; i < t->n; i++) {
        struct txn_item *it = &t->items[i];
        pthread_mutex_lock(&x->lock);
        owner_t *freed = NULL;
        zd_rref_t *parent = NULL;
        if (it->kind == TXN_OWNER_FORK) {
            owner_t *e = zd__rref_owner_find(x, it->rref_id);
            if (e)
                zd__rref_owner_del_fork(e, it->fork_id);
            freed = zd__rref_owner_maybe_unlink(x, e);
        } else {
            parent = zd__rref_child_take(x, it->fork_id);
        }
        pthread_mutex_unlock(&x->lock);
        zd__rref_owner_free(freed);
        zd_rref_unref(parent);
    }
    zd__rref_txn_commit(t);
}

/*  ---- decoding: a fork arrives ---- */

/*  The child was accepted by the owner (or the owner is unreachable): the
    parent may go, and the child is a confirmed user. */
static void fork_request_done(agent_t *a, ctrl_t *c, bool ok)
{
    zd_rref_t *r = c->r;
    rref_ctx_t *x = a->rrefs;
    if (ok) {
        atomic_store(&r->confirmed, true);
    } else {
        pthread_mutex_lock(&x->lock);
        if (!r->error)
            r->error = strdup("the owner did not confirm this RRef (unreachable?)");
        pthread_mutex_unlock(&x->lock);
    }
    zd__rref_ctrl_start(a, c->parent, RPC_MSG_RREF_CHILD_ACCEPT, 0, r->fork_id, NULL, NULL, -1);
    pthread_mutex_lock(&x->lock);
    x->n_pending_users--;
    pthread_mutex_unlock(&x->lock);
    zd_rref_unref(r); /* the pending user's reference */
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int zd__rref_decode(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src, zd_rref_t **out)
{
    agent_t *a = arg;
    rref_ctx_t *x = a->rrefs;
    *out = NULL;
    uint64_t rref_id = get_u64(in), fork_id = get_u64(in + 8);
    int owner = in[16] | in[17] << 8, parent = in[18] | in[19] << 8;
    for (int i = 20; i < RPC_RREF_WIRE_SIZE; i++)
        if (in[i])
            return zd_error_set("RRef: reserved bytes are not 0");
    if (owner >= a->net.world || parent != src || !zd__rref_id_ok(a, rref_id) ||
        !zd__rref_id_ok(a, fork_id) || zd__rref_creator(fork_id) != src)
        return zd_error_set("RRef: inconsistent ids (rref %" PRIx64 ", fork %" PRIx64 ", owner "
                            "%d, parent %d, sender %d)",
                            rref_id, fork_id, owner, parent, src);
    if (owner == a->net.rank) {
        pthread_mutex_lock(&x->lock);
        owner_t *e = zd__rref_owner_find(x, rref_id);
        bool fresh = false;
        if (!e && !zd__rref_never_here(a, rref_id)) {
            /* The REMOTE creating it may still be on its way. */
            e = zd__rref_placeholder_admit(a, x, src) == 0
                ? zd__rref_owner_create(x, rref_id, OWNER_PLACEHOLDER)
                : NULL;
            if (e) {
                fresh = true;
                zd__rref_placeholder_arm(a, x, e, src, 0);
            }
        }
        zd_rref_t *h = e ? zd__rref_owner_handle(a, e) : NULL;
        if (h && parent == a->net.rank)
            zd__rref_owner_del_fork(e, fork_id); /* registered early by our own encode */
        zd_future_t *watch = fresh ? zd_future_ref(e->value) : NULL;
        pthread_mutex_unlock(&x->lock);
        if (watch) {
            zd__rref_watch_value(a, watch, rref_id);
            zd_future_unref(watch);
        }
        if (!h)
            return -1;
        if (parent != a->net.rank) /* a phantom fork: the parent may go now */
            zd__rref_ctrl_start(a, parent, RPC_MSG_RREF_CHILD_ACCEPT, 0, fork_id, NULL, NULL, -1);
        *out = h;
        return 0;
    }
    zd_rref_t *h = zd__rref_handle_new(a, rref_id, fork_id, owner);
    if (!h)
        return -1;
    if (parent == owner) {
        atomic_store(&h->confirmed, true); /* the owner registered it early */
    } else {
        zd_rref_ref(h); /* pending user */
        pthread_mutex_lock(&x->lock);
        x->n_pending_users++;
        pthread_mutex_unlock(&x->lock);
        zd__rref_ctrl_start(a, owner, RPC_MSG_RREF_FORK_REQUEST, rref_id, fork_id,
                            fork_request_done, h, parent);
    }
    *out = h;
    return 0;
}
