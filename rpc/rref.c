/*  rref.c: the RRef context of one agent: owner entries, forks, pending
    users and children, and the control messages (protocol in rref.h).

    Locking: one mutex per context guards every table and counter. Values
    are never freed under it (a value may hold RRefs, whose release takes
    it again): functions that may free an entry hand it back to be freed
    after unlocking. */
#include "rpc/rref.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/error.h"

#define OWNER_BUCKETS 1024
#define CHILD_BUCKETS 256
#define CTRL_RETRIES 3

typedef enum {
    OWNER_PLACEHOLDER,      /* seen in a fetch/fork before its REMOTE: expires */
    OWNER_AWAITING_REMOTE,  /* this process's own remote() to itself, in flight */
    OWNER_CREATED,
} owner_state_t;

typedef struct owner {
    uint64_t rref_id;
    owner_state_t state;
    rpc_future_t *value;
    uint64_t *forks;
    int n_forks, cap_forks;
    rpc_rref_t *handle;         /* the local handle while referenced (weak) */
    int64_t expire_ns;          /* placeholders */
    struct owner *next;
} owner_t;

typedef struct child {
    uint64_t fork_id;
    rpc_rref_t *parent;         /* a reference, dropped on RREF_CHILD_ACCEPT */
    struct child *next;
} child_t;

struct rref_ctx {
    pthread_mutex_t lock;
    bool closing;
    owner_t *owners[OWNER_BUCKETS];
    int64_t n_owners, n_placeholders;
    child_t *children[CHILD_BUCKETS];
    int64_t n_children, n_pending_users, n_ctrl;
};

enum { TXN_OWNER_FORK, TXN_CHILD };

struct txn_item {
    int kind;
    uint64_t rref_id, fork_id;
};

/* ---- small helpers ---- */

static int creator(uint64_t id)
{
    return (int)(id >> 48);
}

static bool id_ok(agent_t *a, uint64_t id)
{
    return (id & ((UINT64_C(1) << 48) - 1)) != 0 && creator(id) < a->world;
}

static size_t owner_bucket(uint64_t id)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 40) % OWNER_BUCKETS;
}

static size_t child_bucket(uint64_t id)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 40) % CHILD_BUCKETS;
}

static rpc_rref_t *handle_new(agent_t *a, uint64_t rref_id, uint64_t fork_id, int owner)
{
    rpc_rref_t *r = calloc(1, sizeof *r);
    if (!r) {
        error_set("RRef: out of memory");
        return NULL;
    }
    atomic_init(&r->refs, 1);
    r->gen = a->gen;
    r->rref_id = rref_id;
    r->fork_id = fork_id;
    r->owner = owner;
    r->is_owner = owner == a->rank;
    atomic_init(&r->confirmed, r->is_owner);
    return r;
}

static void handle_free(rpc_rref_t *r)
{
    rpc_future_unref(r->value);
    free(r->error);
    free(r);
}

/* ---- owner entries (under the lock) ---- */

static owner_t *owner_find(rref_ctx_t *x, uint64_t id)
{
    owner_t *e = x->owners[owner_bucket(id)];
    while (e && e->rref_id != id)
        e = e->next;
    return e;
}

static owner_t *owner_create(rref_ctx_t *x, uint64_t id, owner_state_t state)
{
    owner_t *e = calloc(1, sizeof *e);
    if (!e || !(e->value = rpc_future_new())) {
        free(e);
        error_set("RRef: out of memory");
        return NULL;
    }
    e->rref_id = id;
    e->state = state;
    e->expire_ns = INT64_MAX;
    size_t b = owner_bucket(id);
    e->next = x->owners[b];
    x->owners[b] = e;
    x->n_owners++;
    if (state == OWNER_PLACEHOLDER)
        x->n_placeholders++;
    return e;
}

static int owner_add_fork(owner_t *e, uint64_t fork_id)
{
    for (int i = 0; i < e->n_forks; i++)
        if (e->forks[i] == fork_id)
            return 0;
    if (e->n_forks == e->cap_forks) {
        int cap = e->cap_forks ? 2 * e->cap_forks : 4;
        uint64_t *f = realloc(e->forks, (size_t)cap * sizeof *f);
        if (!f)
            return error_set("RRef: out of memory");
        e->forks = f;
        e->cap_forks = cap;
    }
    e->forks[e->n_forks++] = fork_id;
    return 0;
}

static void owner_del_fork(owner_t *e, uint64_t fork_id)
{
    for (int i = 0; i < e->n_forks; i++)
        if (e->forks[i] == fork_id) {
            e->forks[i] = e->forks[--e->n_forks];
            return;
        }
}

/* Unlinks e when nothing holds it any more; returns it for owner_free after
   the lock is released, else NULL. */
static owner_t *owner_maybe_unlink(rref_ctx_t *x, owner_t *e)
{
    if (!e || e->n_forks || e->handle || e->state != OWNER_CREATED || !rpc_future_done(e->value))
        return NULL;
    owner_t **pp = &x->owners[owner_bucket(e->rref_id)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    x->n_owners--;
    return e;
}

static void owner_free(owner_t *e)
{
    if (!e)
        return;
    rpc_future_unref(e->value);
    free(e->forks);
    free(e);
}

typedef struct {
    agent_t *a;
    uint64_t rref_id;
} value_watch_t;

/* The value of an entry arrived: it may be the last thing keeping it. */
static void value_arrived(rpc_future_t *f, void *arg)
{
    (void)f;
    value_watch_t *w = arg;
    rref_ctx_t *x = w->a->rrefs;
    pthread_mutex_lock(&x->lock);
    owner_t *e = x->closing ? NULL : owner_maybe_unlink(x, owner_find(x, w->rref_id));
    pthread_mutex_unlock(&x->lock);
    owner_free(e);
    free(w);
}

/* Called after creating e and unlocking: watches its value. */
static void watch_value(agent_t *a, rpc_future_t *value, uint64_t rref_id)
{
    value_watch_t *w = malloc(sizeof *w);
    if (!w)
        return;   /* the entry is then freed by its last release only */
    w->a = a;
    w->rref_id = rref_id;
    rpc_future_then(value, value_arrived, w);
}

/* The entry's local handle with one more reference, made if needed. */
static rpc_rref_t *owner_handle(agent_t *a, owner_t *e)
{
    rpc_rref_t *h = e->handle;
    if (h) {
        /* A handle whose count reached 0 is being destroyed: never revive it. */
        int n = atomic_load(&h->refs);
        while (n > 0)
            if (atomic_compare_exchange_weak(&h->refs, &n, n + 1))
                return h;
    }
    h = handle_new(a, e->rref_id, 0, a->rank);
    if (!h)
        return NULL;
    h->value = rpc_future_ref(e->value);
    e->handle = h;
    return h;
}

/* ---- control messages (idempotent, retried) ---- */

typedef struct ctrl ctrl_t;
typedef void (ctrl_done_fn)(agent_t *a, ctrl_t *c, bool ok);

struct ctrl {
    agent_t *a;
    int dst;
    uint8_t type;
    uint64_t rref_id, fork_id;
    int attempts;
    ctrl_done_fn *done;
    rpc_rref_t *r;          /* for done */
    int parent;             /* for done */
};

static void ctrl_send(ctrl_t *c);

static void ctrl_answer(rpc_future_t *f, void *arg)
{
    ctrl_t *c = arg;
    agent_t *a = c->a;
    bool ok = rpc_future_value(f) != NULL;
    if (!ok && c->attempts < CTRL_RETRIES && !atomic_load(&a->closing)) {
        ctrl_send(c);
        return;
    }
    if (!ok)
        agent_log(a, "%s", rpc_future_error(f));
    if (c->done)
        c->done(a, c, ok);
    pthread_mutex_lock(&a->rrefs->lock);
    a->rrefs->n_ctrl--;
    pthread_mutex_unlock(&a->rrefs->lock);
    free(c);
}

static void ctrl_send(ctrl_t *c)
{
    c->attempts++;
    call_req_t req = {.type = c->type, .api = "RRef protocol", .a = c->rref_id,
                      .b = c->fork_id, .timeout_ms = -1, .hooked = false};
    rpc_future_t *f = call_start(c->a, c->dst, &req);
    if (!f) {
        /* Not even sent (shutting down): finish as failed. */
        c->attempts = CTRL_RETRIES;
        rpc_future_t *failed = rpc_future_new();
        if (failed) {
            rpc_future_set_error(failed, "%s", error_last());
            ctrl_answer(failed, c);
            rpc_future_unref(failed);
        }
        return;
    }
    rpc_future_then(f, ctrl_answer, c);
    rpc_future_unref(f);
}

static void ctrl_start(agent_t *a, int dst, uint8_t type, uint64_t rref_id, uint64_t fork_id,
                       ctrl_done_fn *done, rpc_rref_t *r, int parent)
{
    ctrl_t *c = calloc(1, sizeof *c);
    if (!c) {
        agent_log(a, "RRef: out of memory for a %s", rpc_wire_type_name(type));
        if (done) {
            ctrl_t tmp = {.a = a, .r = r, .parent = parent};
            done(a, &tmp, false);
        }
        return;
    }
    *c = (ctrl_t){a, dst, type, rref_id, fork_id, 0, done, r, parent};
    pthread_mutex_lock(&a->rrefs->lock);
    a->rrefs->n_ctrl++;
    pthread_mutex_unlock(&a->rrefs->lock);
    ctrl_send(c);
}

/* ---- handles ---- */

rpc_rref_t *rpc_rref_ref(rpc_rref_t *r)
{
    if (r)
        atomic_fetch_add(&r->refs, 1);
    return r;
}

void rref_value_ref_hook(rpc_rref_t *r)
{
    rpc_rref_ref(r);
}

void rref_value_unref_hook(rpc_rref_t *r)
{
    rpc_rref_unref(r);
}

void rpc_rref_unref(rpc_rref_t *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    agent_t *a = agent_try_acquire();
    if (a && a->gen == r->gen) {
        rref_ctx_t *x = a->rrefs;
        if (r->is_owner) {
            pthread_mutex_lock(&x->lock);
            owner_t *e = owner_find(x, r->rref_id);
            if (e && e->handle == r)
                e->handle = NULL;
            e = owner_maybe_unlink(x, e);
            pthread_mutex_unlock(&x->lock);
            owner_free(e);
        } else if (!atomic_exchange(&r->deleted, true)) {
            /* G1: the owner hears of it. A user is only released once the
               owner confirmed it (pending_users hold a reference), or when
               its creation failed, where the delete is harmless. */
            ctrl_start(a, r->owner, RPC_MSG_RREF_USER_DELETE, r->rref_id, r->fork_id, NULL,
                       NULL, -1);
        }
    }
    agent_release(a);
    handle_free(r);
}

/* ---- encoding: forks ---- */

void rref_user_error(agent_t *a, rpc_rref_t *r, char *buf, size_t size);

void rref_txn_init(rref_txn_t *t, agent_t *a)
{
    memset(t, 0, sizeof *t);
    t->a = a;
}

static int txn_encode(void *arg, rpc_rref_t *r, int dst, uint8_t out[RPC_RREF_WIRE_SIZE])
{
    rref_txn_t *t = arg;
    agent_t *a = t->a;
    rref_ctx_t *x = a->rrefs;
    (void)dst;
    if (r->gen != a->gen)
        return error_set("RRef from an earlier RPC session cannot be sent");
    char error[1024];
    rref_user_error(a, r, error, sizeof error);
    if (error[0])
        return error_set("%s", error);
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 4;
        struct txn_item *it = realloc(t->items, (size_t)cap * sizeof *it);
        if (!it)
            return error_set("RRef: out of memory");
        t->items = it;
        t->cap = cap;
    }
    uint64_t fork_id = agent_new_id(a);
    pthread_mutex_lock(&x->lock);
    if (r->is_owner) {
        /* Early registration: the owner adds the child itself. */
        owner_t *e = owner_find(x, r->rref_id);
        if (!e || owner_add_fork(e, fork_id) < 0) {
            pthread_mutex_unlock(&x->lock);
            return e ? -1 : error_set("RRef %" PRIx64 " is no longer owned here", r->rref_id);
        }
        t->items[t->n++] = (struct txn_item){TXN_OWNER_FORK, r->rref_id, fork_id};
    } else {
        /* G2: the parent stays alive until the child is confirmed. */
        child_t *c = malloc(sizeof *c);
        if (!c) {
            pthread_mutex_unlock(&x->lock);
            return error_set("RRef: out of memory");
        }
        c->fork_id = fork_id;
        c->parent = rpc_rref_ref(r);
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
    out[18] = (uint8_t)a->rank;
    out[19] = (uint8_t)(a->rank >> 8);
    return 0;
}

rpc_rref_codec_t rref_txn_codec(rref_txn_t *t)
{
    rpc_rref_codec_t c = {txn_encode, NULL, t};   /* encoding only */
    return c;
}

/* Removes a pending child; returns its parent reference, or NULL. */
static rpc_rref_t *child_take(rref_ctx_t *x, uint64_t fork_id)
{
    child_t **pp = &x->children[child_bucket(fork_id)];
    while (*pp && (*pp)->fork_id != fork_id)
        pp = &(*pp)->next;
    child_t *c = *pp;
    if (!c)
        return NULL;
    *pp = c->next;
    x->n_children--;
    rpc_rref_t *parent = c->parent;
    free(c);
    return parent;
}

void rref_txn_commit(rref_txn_t *t)
{
    free(t->items);
    t->items = NULL;
    t->n = t->cap = 0;
}

void rref_txn_rollback(rref_txn_t *t)
{
    rref_ctx_t *x = t->a->rrefs;
    for (int i = 0; i < t->n; i++) {
        struct txn_item *it = &t->items[i];
        pthread_mutex_lock(&x->lock);
        owner_t *freed = NULL;
        rpc_rref_t *parent = NULL;
        if (it->kind == TXN_OWNER_FORK) {
            owner_t *e = owner_find(x, it->rref_id);
            if (e)
                owner_del_fork(e, it->fork_id);
            freed = owner_maybe_unlink(x, e);
        } else {
            parent = child_take(x, it->fork_id);
        }
        pthread_mutex_unlock(&x->lock);
        owner_free(freed);
        rpc_rref_unref(parent);
    }
    rref_txn_commit(t);
}

/* ---- decoding: a fork arrives ---- */

/* The child was accepted by the owner (or the owner is unreachable): the
   parent may go, and the child is a confirmed user. */
static void fork_request_done(agent_t *a, ctrl_t *c, bool ok)
{
    rpc_rref_t *r = c->r;
    rref_ctx_t *x = a->rrefs;
    if (ok) {
        atomic_store(&r->confirmed, true);
    } else {
        pthread_mutex_lock(&x->lock);
        if (!r->error)
            r->error = strdup("the owner did not confirm this RRef (unreachable?)");
        pthread_mutex_unlock(&x->lock);
    }
    ctrl_start(a, c->parent, RPC_MSG_RREF_CHILD_ACCEPT, 0, r->fork_id, NULL, NULL, -1);
    pthread_mutex_lock(&x->lock);
    x->n_pending_users--;
    pthread_mutex_unlock(&x->lock);
    rpc_rref_unref(r);   /* the pending user's reference */
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

int rref_decode(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src, rpc_rref_t **out)
{
    agent_t *a = arg;
    rref_ctx_t *x = a->rrefs;
    *out = NULL;
    uint64_t rref_id = get_u64(in), fork_id = get_u64(in + 8);
    int owner = in[16] | in[17] << 8, parent = in[18] | in[19] << 8;
    for (int i = 20; i < RPC_RREF_WIRE_SIZE; i++)
        if (in[i])
            return error_set("RRef: reserved bytes are not 0");
    if (owner >= a->world || parent != src || !id_ok(a, rref_id) || !id_ok(a, fork_id) ||
        creator(fork_id) != src)
        return error_set("RRef: inconsistent ids (rref %" PRIx64 ", fork %" PRIx64 ", owner "
                         "%d, parent %d, sender %d)", rref_id, fork_id, owner, parent, src);
    if (owner == a->rank) {
        pthread_mutex_lock(&x->lock);
        owner_t *e = owner_find(x, rref_id);
        bool fresh = false;
        if (!e) {
            /* The REMOTE creating it may still be on its way. */
            e = owner_create(x, rref_id, OWNER_PLACEHOLDER);
            if (e) {
                fresh = true;
                e->expire_ns = agent_now_ns() + agent_timeout(a, -1) * 1000000;
                if (e->expire_ns < agent_now_ns())
                    e->expire_ns = INT64_MAX;
            }
        }
        rpc_rref_t *h = e ? owner_handle(a, e) : NULL;
        if (h && parent == a->rank)
            owner_del_fork(e, fork_id);   /* registered early by our own encode */
        rpc_future_t *watch = fresh ? rpc_future_ref(e->value) : NULL;
        pthread_mutex_unlock(&x->lock);
        if (watch) {
            watch_value(a, watch, rref_id);
            rpc_future_unref(watch);
        }
        if (!h)
            return -1;
        if (parent != a->rank)   /* a phantom fork: the parent may go now */
            ctrl_start(a, parent, RPC_MSG_RREF_CHILD_ACCEPT, 0, fork_id, NULL, NULL, -1);
        *out = h;
        return 0;
    }
    rpc_rref_t *h = handle_new(a, rref_id, fork_id, owner);
    if (!h)
        return -1;
    if (parent == owner) {
        atomic_store(&h->confirmed, true);   /* the owner registered it early */
    } else {
        rpc_rref_ref(h);   /* pending user */
        pthread_mutex_lock(&x->lock);
        x->n_pending_users++;
        pthread_mutex_unlock(&x->lock);
        ctrl_start(a, owner, RPC_MSG_RREF_FORK_REQUEST, rref_id, fork_id, fork_request_done, h,
                   parent);
    }
    *out = h;
    return 0;
}

/* ---- owner side ---- */

static int64_t placeholder_expiry(agent_t *a, int64_t timeout_ms)
{
    int64_t t = timeout_ms > 0 ? timeout_ms : agent_timeout(a, -1);
    return t > 0 ? agent_now_ns() + t * 1000000 : INT64_MAX;
}

rpc_future_t *rref_owner_remote(agent_t *a, uint64_t rref_id, uint64_t fork_id, int src)
{
    rref_ctx_t *x = a->rrefs;
    if (!id_ok(a, rref_id) || creator(rref_id) != src)
        return error_set("bad RRef id %" PRIx64 " from rank %d", rref_id, src), NULL;
    if (fork_id && (!id_ok(a, fork_id) || creator(fork_id) != src))
        return error_set("bad fork id %" PRIx64 " from rank %d", fork_id, src), NULL;
    if (!fork_id && src != a->rank)
        return error_set("REMOTE from rank %d without a fork id", src), NULL;
    pthread_mutex_lock(&x->lock);
    owner_t *e = owner_find(x, rref_id);
    bool fresh = false;
    if (!e) {
        e = owner_create(x, rref_id, OWNER_CREATED);
        fresh = e != NULL;
    } else if (e->state == OWNER_PLACEHOLDER) {
        e->state = OWNER_CREATED;
        e->expire_ns = INT64_MAX;
        x->n_placeholders--;
    } else if (e->state == OWNER_AWAITING_REMOTE && src == a->rank) {
        e->state = OWNER_CREATED;
    } else {
        pthread_mutex_unlock(&x->lock);
        return error_set("RRef %" PRIx64 " created twice", rref_id), NULL;
    }
    if (!e || (fork_id && owner_add_fork(e, fork_id) < 0)) {
        pthread_mutex_unlock(&x->lock);
        return NULL;
    }
    rpc_future_t *f = rpc_future_ref(e->value);
    pthread_mutex_unlock(&x->lock);
    if (fresh)
        watch_value(a, f, rref_id);
    return f;
}

rpc_future_t *rref_owner_value(agent_t *a, uint64_t rref_id, int64_t timeout_ms)
{
    rref_ctx_t *x = a->rrefs;
    if (!id_ok(a, rref_id))
        return error_set("bad RRef id %" PRIx64, rref_id), NULL;
    pthread_mutex_lock(&x->lock);
    owner_t *e = owner_find(x, rref_id);
    bool fresh = false;
    if (!e) {
        e = owner_create(x, rref_id, OWNER_PLACEHOLDER);
        if (e) {
            fresh = true;
            e->expire_ns = placeholder_expiry(a, timeout_ms);
        }
    }
    rpc_future_t *f = e ? rpc_future_ref(e->value) : NULL;
    pthread_mutex_unlock(&x->lock);
    if (fresh)
        watch_value(a, f, rref_id);
    return f;
}

rpc_rref_t *rref_new_for_remote(agent_t *a, int owner)
{
    rref_ctx_t *x = a->rrefs;
    uint64_t rref_id = agent_new_id(a);
    if (owner != a->rank) {
        rpc_rref_t *h = handle_new(a, rref_id, agent_new_id(a), owner);
        if (!h)
            return NULL;
        rpc_rref_ref(h);   /* pending user until the REMOTE is answered */
        pthread_mutex_lock(&x->lock);
        x->n_pending_users++;
        pthread_mutex_unlock(&x->lock);
        return h;
    }
    pthread_mutex_lock(&x->lock);
    owner_t *e = owner_create(x, rref_id, OWNER_AWAITING_REMOTE);
    rpc_rref_t *h = e ? owner_handle(a, e) : NULL;
    rpc_future_t *watch = e ? rpc_future_ref(e->value) : NULL;
    pthread_mutex_unlock(&x->lock);
    if (watch) {
        watch_value(a, watch, rref_id);
        rpc_future_unref(watch);
    }
    return h;
}

void rref_user_created(agent_t *a, rpc_rref_t *r, const char *error)
{
    rref_ctx_t *x = a->rrefs;
    if (r->is_owner) {
        /* remote() to ourselves: if the REMOTE failed, so did the value. */
        if (error) {
            pthread_mutex_lock(&x->lock);
            owner_t *e = owner_find(x, r->rref_id);
            if (e && e->state == OWNER_AWAITING_REMOTE)
                e->state = OWNER_CREATED;
            pthread_mutex_unlock(&x->lock);
            if (!rpc_future_done(r->value))
                rpc_future_set_error(r->value, "RRef creation via rpc_remote() failed: %s",
                                     error);
        }
        return;
    }
    pthread_mutex_lock(&x->lock);
    if (error && !r->error) {
        size_t n = strlen(error) + 128;
        r->error = malloc(n);
        if (r->error)
            snprintf(r->error, n, "RRef creation via rpc_remote() failed, and the RRef may not "
                     "exist on its owner: %s", error);
    }
    x->n_pending_users--;
    pthread_mutex_unlock(&x->lock);
    if (!error)
        atomic_store(&r->confirmed, true);
    rpc_rref_unref(r);   /* the pending user's reference */
}

/* ---- control messages received (I/O thread) ---- */

static void send_ack(agent_t *a, const inmsg_t *m)
{
    rpc_value_t *none = rpc_value_none();
    rpc_encoded_t enc = {0};
    if (none && rpc_value_encode(none, NULL, m->src, &enc) == 0) {
        rpc_wire_header_t h = {.type = RPC_MSG_REPLY, .id = m->h.id, .meta = enc.meta,
                               .meta_len = enc.meta_len};
        if (transport_send_routed(a, m->src, m->route, m->route_len, &h, NULL, 0) < 0)
            agent_log(a, "cannot acknowledge to rank %d: %s", m->src, error_last());
    }
    rpc_encoded_clear(&enc);
    rpc_value_unref(none);
}

void rref_handle_control(agent_t *a, const inmsg_t *m)
{
    rref_ctx_t *x = a->rrefs;
    const rpc_wire_header_t *h = &m->h;
    if ((h->type != RPC_MSG_RREF_CHILD_ACCEPT && !id_ok(a, h->a)) || !id_ok(a, h->b)) {
        char text[160];
        snprintf(text, sizeof text, "bad ids in %s (rref %" PRIx64 ", fork %" PRIx64 ")",
                 rpc_wire_type_name(h->type), h->a, h->b);
        agent_log(a, "from rank %d: %s", h->src, text);
        transport_answer_error(a, m, h->id, text);
        return;
    }
    owner_t *freed = NULL;
    rpc_rref_t *parent = NULL;
    rpc_future_t *watch = NULL;
    pthread_mutex_lock(&x->lock);
    switch (h->type) {
    case RPC_MSG_RREF_USER_DELETE: {
        owner_t *e = owner_find(x, h->a);
        if (e)
            owner_del_fork(e, h->b);
        freed = owner_maybe_unlink(x, e);
        break;
    }
    case RPC_MSG_RREF_FORK_REQUEST: {
        owner_t *e = owner_find(x, h->a);
        if (!e && (e = owner_create(x, h->a, OWNER_PLACEHOLDER))) {
            e->expire_ns = placeholder_expiry(a, h->timeout_ms);
            watch = rpc_future_ref(e->value);
        }
        if (!e || owner_add_fork(e, h->b) < 0) {
            pthread_mutex_unlock(&x->lock);
            rpc_future_unref(watch);
            transport_answer_error(a, m, h->id, "out of memory");
            return;
        }
        break;
    }
    case RPC_MSG_RREF_CHILD_ACCEPT:
        parent = child_take(x, h->b);
        break;
    }
    pthread_mutex_unlock(&x->lock);
    if (watch) {
        watch_value(a, watch, h->a);
        rpc_future_unref(watch);
    }
    owner_free(freed);
    rpc_rref_unref(parent);
    send_ack(a, m);
}

void rref_tick(agent_t *a, int64_t now_ns)
{
    rref_ctx_t *x = a->rrefs;
    enum { MAX_EXPIRED = 64 };
    rpc_future_t *expired[MAX_EXPIRED];
    uint64_t ids[MAX_EXPIRED];
    int n = 0;
    pthread_mutex_lock(&x->lock);
    for (size_t b = 0; x->n_placeholders && b < OWNER_BUCKETS && n < MAX_EXPIRED; b++)
        for (owner_t *e = x->owners[b]; e && n < MAX_EXPIRED; e = e->next)
            if (e->state == OWNER_PLACEHOLDER && e->expire_ns <= now_ns) {
                e->state = OWNER_CREATED;   /* failed: freed like any other */
                x->n_placeholders--;
                ids[n] = e->rref_id;
                expired[n++] = rpc_future_ref(e->value);
            }
    pthread_mutex_unlock(&x->lock);
    for (int i = 0; i < n; i++) {
        rpc_future_set_error(expired[i], "unknown RRef %" PRIx64 ": no remote() created it "
                             "on \"%s\" (rank %d) in time", ids[i], a->name, a->rank);
        rpc_future_unref(expired[i]);
    }
}

/* ---- the context ---- */

static atomic_int_fast64_t g_leaked;

int64_t rpc_debug_owner_rrefs_leaked(void)
{
    return atomic_load(&g_leaked);
}

int rref_ctx_new(agent_t *a)
{
    rref_ctx_t *x = calloc(1, sizeof *x);
    if (!x)
        return error_set("RRef: out of memory");
    pthread_mutex_init(&x->lock, NULL);
    a->rrefs = x;
    a->rref_codec = (rpc_rref_codec_t){NULL, rref_decode, a};
    return 0;
}

void rref_ctx_free(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    if (!x)
        return;
    /* Whoever waits for a value that will never come gets an error (and
       their callbacks run now, while the sockets are still open). */
    pthread_mutex_lock(&x->lock);
    x->closing = true;
    int64_t n = x->n_owners, leaked = 0;
    rpc_future_t **open = calloc((size_t)(n ? n : 1), sizeof *open);
    int n_open = 0;
    for (size_t b = 0; b < OWNER_BUCKETS; b++)
        for (owner_t *e = x->owners[b]; e; e = e->next) {
            leaked += e->n_forks > 0 || e->handle;
            if (open && !rpc_future_done(e->value))
                open[n_open++] = rpc_future_ref(e->value);
        }
    pthread_mutex_unlock(&x->lock);
    for (int i = 0; i < n_open; i++) {
        rpc_future_set_error(open[i], "RPC shut down");
        rpc_future_unref(open[i]);
    }
    free(open);
    if (leaked)
        agent_log(a, "shutdown: %" PRId64 " owned RRef value(s) still referenced", leaked);
    atomic_store(&g_leaked, leaked);
    for (size_t b = 0; b < OWNER_BUCKETS; b++)
        while (x->owners[b]) {
            owner_t *e = x->owners[b];
            x->owners[b] = e->next;
            owner_free(e);
        }
    for (size_t b = 0; b < CHILD_BUCKETS; b++)
        while (x->children[b]) {
            child_t *c = x->children[b];
            x->children[b] = c->next;
            rpc_rref_unref(c->parent);
            free(c);
        }
    pthread_mutex_destroy(&x->lock);
    free(x);
    a->rrefs = NULL;
}

int64_t rref_outstanding(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    pthread_mutex_lock(&x->lock);
    int64_t n = x->n_ctrl + x->n_pending_users + x->n_children;
    pthread_mutex_unlock(&x->lock);
    return n;
}

int64_t rref_owner_count(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    pthread_mutex_lock(&x->lock);
    int64_t n = x->n_owners;
    pthread_mutex_unlock(&x->lock);
    return n;
}

rpc_rref_t *rref_new_local(agent_t *a, rpc_value_t *value)
{
    rref_ctx_t *x = a->rrefs;
    uint64_t rref_id = agent_new_id(a);
    pthread_mutex_lock(&x->lock);
    owner_t *e = owner_create(x, rref_id, OWNER_CREATED);
    rpc_rref_t *h = e ? owner_handle(a, e) : NULL;
    rpc_future_t *f = e ? rpc_future_ref(e->value) : NULL;
    pthread_mutex_unlock(&x->lock);
    if (f) {
        rpc_future_set_value(f, value);
        watch_value(a, f, rref_id);
        rpc_future_unref(f);
    }
    return h;
}

void rref_user_error(agent_t *a, rpc_rref_t *r, char *buf, size_t size)
{
    pthread_mutex_lock(&a->rrefs->lock);
    snprintf(buf, size, "%s", r->error ? r->error : "");
    pthread_mutex_unlock(&a->rrefs->lock);
}
