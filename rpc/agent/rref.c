/* SPDX-License-Identifier: MIT */
/*  rref.c: the RRef context of one agent: owner entries, handles and their
    release, the owner's side of the protocol and the control messages it
    receives (protocol in rref.h; forks and the wire in rref_fork.c).

    Locking: one mutex per context guards every table and counter. Values
    are never freed under it (a value may hold RRefs, whose release takes
    it again): functions that may free an entry hand it back to be freed
    after unlocking. */
#include "rpc/agent/rref.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/fault_inject.h"

/*  ---- ids ---- */

#define ID_MASK ((UINT64_C(1) << 48) - 1)

int zd__rref_creator(uint64_t id)
{
    return (int)(id >> 48);
}

bool zd__rref_id_ok(agent_t *a, uint64_t id)
{
    return (id & ID_MASK) != 0 && zd__rref_creator(id) < a->net.world;
}

static uint64_t rotl(uint64_t v, int b)
{
    return v << b | v >> (64 - b);
}

#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1, v1 = rotl(v1, 13), v1 ^= v0, v0 = rotl(v0, 32);                                  \
        v2 += v3, v3 = rotl(v3, 16), v3 ^= v2;                                                     \
        v0 += v3, v3 = rotl(v3, 21), v3 ^= v0;                                                     \
        v2 += v1, v1 = rotl(v1, 17), v1 ^= v2, v2 = rotl(v2, 32);                                  \
    } while (0)

/*  SipHash-2-4 of one 64-bit word under key k. */
static uint64_t siphash_word(const uint64_t k[2], uint64_t m)
{
    uint64_t v0 = k[0] ^ UINT64_C(0x736f6d6570736575), v1 = k[1] ^ UINT64_C(0x646f72616e646f6d);
    uint64_t v2 = k[0] ^ UINT64_C(0x6c7967656e657261), v3 = k[1] ^ UINT64_C(0x7465646279746573);
    const uint64_t last = UINT64_C(8) << 56; /* the length byte of an 8-byte message */
    v3 ^= m;
    SIPROUND;
    SIPROUND;
    v0 ^= m;
    v3 ^= last;
    SIPROUND;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/*  Ids used to be a counter, the same from run to run: a member could name
    any RRef by guessing (issue 24 point 5). A counter is still what keeps
    them unique, so each id is the counter through a permutation of 48 bits
    keyed by a secret of this agent: a Feistel network of 24-bit halves
    with SipHash as its round function. Seeing some ids tells nothing of
    the others without the key. */
uint64_t zd__rref_new_id(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    for (;;) {
        uint64_t n = atomic_fetch_add(&x->id_next, 1) & ID_MASK;
        uint64_t l = n >> 24, r = n & 0xffffff;
        for (uint64_t round = 0; round < 6; round++) {
            uint64_t f = siphash_word(x->id_key, round << 32 | r) & 0xffffff;
            uint64_t t = r;
            r = l ^ f;
            l = t;
        }
        uint64_t v = l << 24 | r;
        if (v) /* 0 is no id: the next counter value maps elsewhere */
            return (uint64_t)a->net.rank << 48 | v;
    }
}

/*  ---- small helpers ---- */

static size_t owner_bucket(uint64_t id)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 40) % OWNER_BUCKETS;
}

zd_rref_t *zd__rref_handle_new(agent_t *a, uint64_t rref_id, uint64_t fork_id, int owner)
{
    zd_rref_t *r = calloc(1, sizeof *r);
    if (r && owner != a->net.rank && !(r->del = calloc(1, sizeof *r->del))) {
        free(r);
        r = NULL;
    }
    if (!r) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "RRef: out of memory");
        return NULL;
    }
    atomic_init(&r->refs, 1);
    r->gen = a->net.gen;
    r->rref_id = rref_id;
    r->fork_id = fork_id;
    r->owner = owner;
    r->is_owner = owner == a->net.rank;
    if (!r->is_owner && a->net.peers && owner >= 0 && owner < a->net.world)
        r->owner_losses = atomic_load(&a->net.peers[owner].losses);
    atomic_init(&r->confirmed, r->is_owner);
    return r;
}

void zd__rref_handle_free(zd_rref_t *r)
{
    zd_future_unref(r->value);
    free(r->error);
    free(r->del);
    free(r);
}

/*  ---- owner entries (under the lock) ---- */

owner_t *zd__rref_owner_find(rref_ctx_t *x, uint64_t id)
{
    owner_t *e = x->owners[owner_bucket(id)];
    while (e && e->rref_id != id)
        e = e->next;
    return e;
}

owner_t *zd__rref_owner_create(rref_ctx_t *x, uint64_t id, owner_state_t state)
{
    owner_t *e = calloc(1, sizeof *e);
    if (!e || !(e->value = zd_future_new())) {
        free(e);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "RRef: out of memory");
        return NULL;
    }
    e->rref_id = id;
    e->state = state;
    e->expire_ns = INT64_MAX;
    e->ph_src = -1;
    size_t b = owner_bucket(id);
    e->next = x->owners[b];
    x->owners[b] = e;
    x->n_owners++;
    if (state == OWNER_PLACEHOLDER) {
        x->n_placeholders++;
        e->ph_next = x->placeholders;
        if (e->ph_next)
            e->ph_next->ph_prev = e;
        x->placeholders = e;
    }
    return e;
}

/*  e stops being a placeholder (its REMOTE came, or it expired). Locked. */
static void placeholder_done(rref_ctx_t *x, owner_t *e)
{
    e->state = OWNER_CREATED;
    e->expire_ns = INT64_MAX;
    x->n_placeholders--;
    if (e->ph_prev)
        e->ph_prev->ph_next = e->ph_next;
    else
        x->placeholders = e->ph_next;
    if (e->ph_next)
        e->ph_next->ph_prev = e->ph_prev;
    e->ph_next = e->ph_prev = NULL;
    if (e->ph_src >= 0 && e->ph_src < x->ph_world)
        x->ph_by_peer[e->ph_src]--;
    e->ph_src = -1;
}

int zd__rref_placeholder_admit(agent_t *a, rref_ctx_t *x, int src)
{
    if (x->n_placeholders >= RREF_MAX_PLACEHOLDERS)
        return zd_error_set("too many RRefs awaited before their creation (%d; asked by rank %d)",
                            RREF_MAX_PLACEHOLDERS, src);
    if (src >= 0 && src < x->ph_world && src != a->net.rank &&
        x->ph_by_peer[src] >= RREF_MAX_PLACEHOLDERS_PEER)
        return zd_error_set("too many RRefs awaited before their creation asked by rank %d (%d)",
                            src, RREF_MAX_PLACEHOLDERS_PEER);
    return 0;
}

int zd__rref_owner_add_fork(owner_t *e, uint64_t fork_id, int holder)
{
    for (int i = 0; i < e->n_forks; i++)
        if (e->forks[i] == fork_id)
            return 0;
    if (e->n_forks == e->cap_forks) {
        int cap = e->cap_forks ? 2 * e->cap_forks : 4;
        uint64_t *f = realloc(e->forks, (size_t)cap * sizeof *f);
        if (f)
            e->forks = f;
        int *h = f ? realloc(e->holders, (size_t)cap * sizeof *h) : NULL;
        if (!h)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "RRef: out of memory");
        e->holders = h;
        e->cap_forks = cap;
    }
    e->holders[e->n_forks] = holder;
    e->forks[e->n_forks++] = fork_id;
    return 0;
}

int zd__rref_owner_fork_holder(const owner_t *e, uint64_t fork_id)
{
    for (int i = 0; e && i < e->n_forks; i++)
        if (e->forks[i] == fork_id)
            return e->holders[i];
    return -1;
}

void zd__rref_owner_del_fork(owner_t *e, uint64_t fork_id)
{
    for (int i = 0; i < e->n_forks; i++)
        if (e->forks[i] == fork_id) {
            e->n_forks--;
            e->forks[i] = e->forks[e->n_forks];
            e->holders[i] = e->holders[e->n_forks];
            return;
        }
}

/*  Unlinks e when nothing holds it any more; returns it for owner_free after
    the lock is released, else NULL. */
owner_t *zd__rref_owner_maybe_unlink(rref_ctx_t *x, owner_t *e)
{
    if (!e || e->n_forks || e->handle || e->state != OWNER_CREATED || !zd_future_done(e->value))
        return NULL;
    owner_t **pp = &x->owners[owner_bucket(e->rref_id)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    x->n_owners--;
    return e;
}

void zd__rref_owner_free(owner_t *e)
{
    if (!e)
        return;
    zd_future_unref(e->value);
    free(e->forks);
    free(e->holders);
    free(e);
}

typedef struct {
    agent_t *a;
    uint64_t rref_id;
} value_watch_t;

/*  The value of an entry arrived: it may be the last thing keeping it. */
static void value_arrived(zd_future_t *f, void *arg)
{
    (void)f;
    value_watch_t *w = arg;
    rref_ctx_t *x = w->a->rrefs;
    pthread_mutex_lock(&x->lock);
    owner_t *e =
        x->closing ? NULL : zd__rref_owner_maybe_unlink(x, zd__rref_owner_find(x, w->rref_id));
    pthread_mutex_unlock(&x->lock);
    zd__rref_owner_free(e);
    free(w);
}

/*  Called after creating e and unlocking: watches its value. */
void zd__rref_watch_value(agent_t *a, zd_future_t *value, uint64_t rref_id)
{
    ZD_FAULT_BENIGN(true);
    value_watch_t *w = malloc(sizeof *w);
    ZD_FAULT_BENIGN(false);
    if (!w)
        return; /* the entry is then freed by its last release only */
    w->a = a;
    w->rref_id = rref_id;
    zd_future_then(value, value_arrived, w);
}

/*  The entry's local handle with one more reference, made if needed. */
zd_rref_t *zd__rref_owner_handle(agent_t *a, owner_t *e)
{
    zd_rref_t *h = e->handle;
    if (h) {
        /* A handle whose count reached 0 is being destroyed: never revive it. */
        int n = atomic_load(&h->refs);
        while (n > 0)
            if (atomic_compare_exchange_weak(&h->refs, &n, n + 1))
                return h;
    }
    h = zd__rref_handle_new(a, e->rref_id, 0, a->net.rank);
    if (!h)
        return NULL;
    h->value = zd_future_ref(e->value);
    e->handle = h;
    return h;
}

/*  ---- handles ---- */

zd_rref_t *zd_rref_ref(zd_rref_t *r)
{
    if (r)
        atomic_fetch_add(&r->refs, 1);
    return r;
}

void zd__rref_value_ref_hook(zd_rref_t *r)
{
    zd_rref_ref(r);
}

void zd__rref_value_unref_hook(zd_rref_t *r)
{
    zd_rref_unref(r);
}

void zd_rref_unref(zd_rref_t *r)
{
    if (!r || atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    agent_t *a = zd__agent_try_acquire();
    if (a && a->net.gen == r->gen) {
        rref_ctx_t *x = a->rrefs;
        if (r->is_owner) {
            pthread_mutex_lock(&x->lock);
            owner_t *e = zd__rref_owner_find(x, r->rref_id);
            if (e && e->handle == r)
                e->handle = NULL;
            e = zd__rref_owner_maybe_unlink(x, e);
            pthread_mutex_unlock(&x->lock);
            zd__rref_owner_free(e);
        } else if (!atomic_exchange(&r->deleted, true)) {
            /* G1: the owner hears of it. A user is only released once the
               owner confirmed it (pending_users hold a reference), or when
               its creation failed, where the delete is harmless. */
            ctrl_t *del = r->del;
            r->del = NULL;
            zd__rref_ctrl_run(a, del, r->owner, RPC_MSG_RREF_USER_DELETE, r->rref_id, r->fork_id,
                              NULL, NULL, -1);
        }
    }
    zd__agent_release(a);
    zd__rref_handle_free(r);
}

/*  ---- fork requests waiting for their parent (rref.h) ---- */

static void send_ack(agent_t *a, const inmsg_t *m)
{
    zd_value_t *none = zd_value_none();
    rpc_encoded_t enc = {0};
    if (none && zd__value_encode(none, NULL, m->src, &enc) == 0) {
        rpc_wire_header_t h = {
            .type = RPC_MSG_REPLY, .id = m->h.id, .meta = enc.meta, .meta_len = enc.meta_len};
        if (zd__transport_send_routed(&a->net, m->src, m->route, m->route_len, &h, NULL, 0) < 0)
            zd__log(ZD_LOG_WARN, "rpc: cannot acknowledge to rank %d: %s", m->src, zd_error_last());
    }
    zd__rpc_encoded_clear(&enc);
    zd_value_unref(none);
}

/*  The name of rank for a log line ("?" when the agent has no table: a
    stand-in agent of the fuzzers). */
static const char *peer_name(const agent_t *a, int rank)
{
    return a->net.peers && rank >= 0 && rank < a->net.world ? a->net.peers[rank].name : "?";
}

/*  Whether rank holds a fork of e recorded here. */
static bool has_holder(const owner_t *e, int rank)
{
    for (int i = 0; e && i < e->n_forks; i++)
        if (e->holders[i] == rank)
            return true;
    return false;
}

/*  Under the lock: the wait of src for fork_id of rref_id (fork_id 0: any
    of its forks of rref_id), or NULL. */
static fork_wait_t *wait_find(rref_ctx_t *x, uint64_t rref_id, uint64_t fork_id, int src)
{
    fork_wait_t *w = x->waits;
    while (w && !(w->rref_id == rref_id && w->src == src && (!fork_id || w->fork_id == fork_id)))
        w = w->next;
    return w;
}

/*  Under the lock: takes w, which *pp points to, off the list. */
static void wait_unlink(rref_ctx_t *x, fork_wait_t **pp)
{
    fork_wait_t *w = *pp;
    *pp = w->next;
    w->next = NULL;
    x->n_waits--;
    if (w->src >= 0 && w->src < x->waits_world)
        x->waits_by_peer[w->src]--;
}

/*  Under the lock: whether src may leave one more request waiting; -1 with
    the error set when not. */
static int wait_admit(agent_t *a, rref_ctx_t *x, int src)
{
    if (!x->waits_by_peer && a->net.world > 0 &&
        (x->waits_by_peer = calloc((size_t)a->net.world, sizeof *x->waits_by_peer)))
        x->waits_world = a->net.world;
    if (x->n_waits >= RREF_MAX_FORK_WAITS)
        return zd_error_set("too many fork requests waiting for their parent (%d; asked by "
                            "rank %d)",
                            RREF_MAX_FORK_WAITS, src);
    if (src >= 0 && src < x->waits_world && x->waits_by_peer[src] >= RREF_MAX_FORK_WAITS_PEER)
        return zd_error_set("too many fork requests waiting for their parent asked by rank %d "
                            "(%d)",
                            src, RREF_MAX_FORK_WAITS_PEER);
    return 0;
}

/*  Under the lock: moves the waits on e whose parent now holds a fork of it
    to *ready, their forks registered; each may make another parent a
    holder, so until none is left. */
static void waits_release(rref_ctx_t *x, owner_t *e, fork_wait_t **ready)
{
    for (bool more = x->n_waits > 0; more;) {
        more = false;
        for (fork_wait_t **pp = &x->waits; *pp;) {
            fork_wait_t *w = *pp;
            if (w->rref_id != e->rref_id || !has_holder(e, w->parent)) {
                pp = &w->next;
                continue;
            }
            wait_unlink(x, pp);
            int holder = zd__rref_owner_fork_holder(e, w->fork_id);
            if (holder >= 0 && holder != w->src) {
                w->refused = true;
                snprintf(w->why, sizeof w->why,
                         "fork request of rank %d for fork %" PRIx64 " of "
                         "RRef %" PRIx64 " refused: rank %d holds that fork",
                         w->src, w->fork_id, w->rref_id, holder);
            } else if (zd__rref_owner_add_fork(e, w->fork_id, w->src) < 0) {
                w->refused = true;
                snprintf(w->why, sizeof w->why, "RRef: out of memory");
            } else {
                more = true;
                if (w->settled)
                    w->value = zd_future_ref(e->value);
            }
            w->next = *ready;
            *ready = w;
        }
    }
}

/*  The value (or error) of the future it follows, into arg's future. */
static void forward_value(zd_future_t *f, void *arg)
{
    zd_future_t *to = arg;
    if (zd_future_value(f))
        zd_future_set_value(to, zd_future_value(f));
    else
        zd_future_set_error_code(to, zd_future_error_code(f), "%s", zd_future_error(f));
    zd_future_unref(to);
}

/*  Whether a refusal of the kind *last stands for is worth a log line now:
    once a second. */
static bool log_due(_Atomic int64_t *last)
{
    int64_t now = zd__net_now_ns(), then = atomic_load(last);
    return now - then >= ZD__NS_PER_S && atomic_compare_exchange_strong(last, &then, now);
}

/*  After unlocking: answers the requests of list (taken off the waits) and
    settles the fetches that waited with them; frees them. */
static void waits_answer(agent_t *a, fork_wait_t *list)
{
    while (list) {
        fork_wait_t *w = list;
        list = w->next;
        inmsg_t m;
        memset(&m, 0, sizeof m);
        m.src = w->src;
        m.h.id = w->req_id;
        memcpy(m.route, w->route, w->route_len);
        m.route_len = w->route_len;
        if (w->refused) {
            static _Atomic int64_t last;
            if (!w->silent && log_due(&last))
                zd__log(ZD_LOG_WARN, "rpc: from \"%s\" (rank %d): %s", peer_name(a, w->src), w->src,
                        w->why);
            if (!w->silent)
                zd__transport_answer_error(&a->net, &m, w->req_id, w->why);
            if (w->settled)
                zd_future_set_error(w->settled, "%s", w->why);
        } else {
            send_ack(a, &m);
            if (w->settled && w->value &&
                zd_future_then(w->value, forward_value, zd_future_ref(w->settled)) < 0) {
                zd_future_unref(w->settled); /* the reference given to forward_value */
                zd_future_set_error(w->settled, "RRef: out of memory");
            }
        }
        zd_future_unref(w->value);
        zd_future_unref(w->settled);
        free(w);
    }
}

/*  ---- owner side ---- */

/*  When a placeholder (a value whose REMOTE has not arrived) is given up: at
    the caller's timeout or the agent's default, the smaller one set (the
    caller's comes from the wire: it may not hold the entry longer than
    this process would), and never later than RREF_PLACEHOLDER_MAX_MS, so
    that a REMOTE that never comes does not leave the entry behind. */
static int64_t placeholder_expiry(agent_t *a, int64_t timeout_ms)
{
    int64_t t = RREF_PLACEHOLDER_MAX_MS, local = zd__agent_timeout(a, -1);
    if (timeout_ms > 0 && timeout_ms < t)
        t = timeout_ms;
    if (local > 0 && local < t)
        t = local;
    return zd__deadline_after(zd__net_now_ns(), t);
}

void zd__rref_placeholder_arm(agent_t *a, rref_ctx_t *x, owner_t *e, int src, int64_t timeout_ms)
{
    e->expire_ns = placeholder_expiry(a, timeout_ms);
    if (e->expire_ns < x->ph_due_ns || x->n_placeholders == 1)
        x->ph_due_ns = e->expire_ns;
    zd__io_due(&a->net, e->expire_ns);
    if (!x->ph_by_peer && a->net.world > 0 &&
        (x->ph_by_peer = calloc((size_t)a->net.world, sizeof *x->ph_by_peer)))
        x->ph_world = a->net.world;
    if (src >= 0 && src < x->ph_world && src != a->net.rank) {
        e->ph_src = src;
        x->ph_by_peer[src]++;
    }
}

zd_future_t *zd__rref_owner_remote(agent_t *a, uint64_t rref_id, uint64_t fork_id, int src)
{
    rref_ctx_t *x = a->rrefs;
    if (!zd__rref_id_ok(a, rref_id) || zd__rref_creator(rref_id) != src)
        return zd_error_set("bad RRef id %" PRIx64 " from rank %d", rref_id, src), NULL;
    if (fork_id && (!zd__rref_id_ok(a, fork_id) || zd__rref_creator(fork_id) != src))
        return zd_error_set("bad fork id %" PRIx64 " from rank %d", fork_id, src), NULL;
    if (!fork_id && src != a->net.rank)
        return zd_error_set("REMOTE from rank %d without a fork id", src), NULL;
    pthread_mutex_lock(&x->lock);
    owner_t *e = zd__rref_owner_find(x, rref_id);
    bool fresh = false;
    if (!e) {
        e = zd__rref_owner_create(x, rref_id, OWNER_CREATED);
        fresh = e != NULL;
    } else if (e->state == OWNER_PLACEHOLDER) {
        placeholder_done(x, e);
    } else if (e->state == OWNER_AWAITING_REMOTE && src == a->net.rank) {
        e->state = OWNER_CREATED;
    } else {
        pthread_mutex_unlock(&x->lock);
        return zd_error_set("RRef %" PRIx64 " created twice", rref_id), NULL;
    }
    if (!e || (fork_id && zd__rref_owner_add_fork(e, fork_id, src) < 0)) {
        pthread_mutex_unlock(&x->lock);
        return NULL;
    }
    /* The creator is a holder now: forks it made before may be accepted. */
    fork_wait_t *ready = NULL;
    waits_release(x, e, &ready);
    zd_future_t *f = zd_future_ref(e->value);
    pthread_mutex_unlock(&x->lock);
    waits_answer(a, ready);
    if (fresh)
        zd__rref_watch_value(a, f, rref_id);
    return f;
}

/*  The value future of rref_id, a placeholder made for it counting as
    src's (zd__rref_placeholder_admit). */
bool zd__rref_never_here(agent_t *a, uint64_t rref_id)
{
    if (zd__rref_creator(rref_id) != a->net.rank)
        return false;
    zd_error_set_code(ZD_ERR_ARGUMENT,
                      "RRef %" PRIx64 " is not held by its owner \"%s\" (rank %d): freed, or "
                      "made by an earlier process of that rank, which was restarted",
                      rref_id, a->net.name, a->net.rank);
    return true;
}

bool zd__rref_owner_lost_since(agent_t *a, const zd_rref_t *r, const char *api)
{
    if (r->is_owner || !a->net.peers || r->owner < 0 || r->owner >= a->net.world ||
        atomic_load(&a->net.peers[r->owner].losses) == r->owner_losses)
        return false;
    zd_error_set_code(ZD_ERR_PEER,
                      "%s: RRef %" PRIx64 ": its owner \"%s\" (rank %d) was lost since the RRef "
                      "was made (a process restarted in its place does not have its value)",
                      api, r->rref_id, a->net.peers[r->owner].name, r->owner);
    return true;
}

static zd_future_t *owner_value_admit(agent_t *a, uint64_t rref_id, int64_t timeout_ms, int src)
{
    rref_ctx_t *x = a->rrefs;
    if (!zd__rref_id_ok(a, rref_id))
        return zd_error_set("bad RRef id %" PRIx64, rref_id), NULL;
    pthread_mutex_lock(&x->lock);
    owner_t *e = zd__rref_owner_find(x, rref_id);
    if (!e && zd__rref_never_here(a, rref_id)) {
        pthread_mutex_unlock(&x->lock);
        return NULL;
    }
    bool fresh = false;
    if (!e && zd__rref_placeholder_admit(a, x, src) == 0) {
        e = zd__rref_owner_create(x, rref_id, OWNER_PLACEHOLDER);
        if (e) {
            fresh = true;
            zd__rref_placeholder_arm(a, x, e, src, timeout_ms);
        }
    }
    zd_future_t *f = e ? zd_future_ref(e->value) : NULL;
    pthread_mutex_unlock(&x->lock);
    if (fresh)
        zd__rref_watch_value(a, f, rref_id);
    return f;
}

zd_future_t *zd__rref_owner_value(agent_t *a, uint64_t rref_id, int64_t timeout_ms)
{
    return owner_value_admit(a, rref_id, timeout_ms, a->net.rank);
}

zd_future_t *zd__rref_owner_value_for(agent_t *a, uint64_t rref_id, int64_t timeout_ms, int src)
{
    rref_ctx_t *x = a->rrefs;
    if (src != a->net.rank && zd__rref_id_ok(a, rref_id)) {
        pthread_mutex_lock(&x->lock);
        owner_t *e = zd__rref_owner_find(x, rref_id);
        bool holds = !e || e->state != OWNER_CREATED; /* not made yet: the REMOTE decides */
        holds = holds || has_holder(e, src);
        /* Its fork request waits for its parent: so does the fetch, for
           the value if the request is accepted, else for its refusal. */
        fork_wait_t *w = holds ? NULL : wait_find(x, rref_id, 0, src);
        if (w && !w->settled)
            w->settled = zd_future_new();
        zd_future_t *settled = w && w->settled ? zd_future_ref(w->settled) : NULL;
        pthread_mutex_unlock(&x->lock);
        if (settled)
            return settled;
        if (!holds) {
            zd__log(ZD_LOG_WARN,
                    "rpc: refused a fetch of RRef %" PRIx64 " from \"%s\" (rank %d), "
                    "which holds no fork of it",
                    rref_id, a->net.peers[src].name, src);
            return zd_error_set("RRef %" PRIx64 ": rank %d holds no fork of it", rref_id, src),
                   NULL;
        }
    }
    return owner_value_admit(a, rref_id, timeout_ms, src);
}

zd_rref_t *zd__rref_new_for_remote(agent_t *a, int owner)
{
    rref_ctx_t *x = a->rrefs;
    uint64_t rref_id = zd__rref_new_id(a);
    if (owner != a->net.rank) {
        zd_rref_t *h = zd__rref_handle_new(a, rref_id, zd__rref_new_id(a), owner);
        if (!h)
            return NULL;
        zd_rref_ref(h); /* pending user until the REMOTE is answered */
        pthread_mutex_lock(&x->lock);
        x->n_pending_users++;
        pthread_mutex_unlock(&x->lock);
        return h;
    }
    pthread_mutex_lock(&x->lock);
    owner_t *e = zd__rref_owner_create(x, rref_id, OWNER_AWAITING_REMOTE);
    zd_rref_t *h = e ? zd__rref_owner_handle(a, e) : NULL;
    zd_future_t *watch = e ? zd_future_ref(e->value) : NULL;
    pthread_mutex_unlock(&x->lock);
    if (watch) {
        zd__rref_watch_value(a, watch, rref_id);
        zd_future_unref(watch);
    }
    return h;
}

void zd__rref_user_created(agent_t *a, zd_rref_t *r, const char *error)
{
    rref_ctx_t *x = a->rrefs;
    if (r->is_owner) {
        /* remote() to ourselves: if the REMOTE failed, so did the value. */
        if (error) {
            pthread_mutex_lock(&x->lock);
            owner_t *e = zd__rref_owner_find(x, r->rref_id);
            if (e && e->state == OWNER_AWAITING_REMOTE)
                e->state = OWNER_CREATED;
            pthread_mutex_unlock(&x->lock);
            if (!zd_future_done(r->value))
                zd_future_set_error(r->value, "RRef creation via zd_rpc_remote() failed: %s",
                                    error);
        }
        return;
    }
    pthread_mutex_lock(&x->lock);
    if (error && !r->error) {
        size_t n = strlen(error) + 128;
        r->error = malloc(n);
        if (r->error)
            snprintf(r->error, n,
                     "RRef creation via zd_rpc_remote() failed, and the RRef may not "
                     "exist on its owner: %s",
                     error);
    }
    x->n_pending_users--;
    pthread_mutex_unlock(&x->lock);
    if (!error)
        atomic_store(&r->confirmed, true);
    zd_rref_unref(r); /* the pending user's reference */
}

/*  ---- control messages received (I/O thread) ---- */

/*  Under x->lock: a fork is deleted or registered only by the rank that
    holds it (recorded when the owner learnt of it); any other sender is
    answered with an error. Unknown forks pass: the messages are
    idempotent. */
static bool control_refused(agent_t *a, const inmsg_t *m)
{
    const rpc_wire_header_t *h = &m->h;
    if (h->type != RPC_MSG_RREF_USER_DELETE && h->type != RPC_MSG_RREF_FORK_REQUEST)
        return false;
    int holder = zd__rref_owner_fork_holder(zd__rref_owner_find(a->rrefs, h->a), h->b);
    if (holder < 0 || holder == h->src)
        return false;
    char text[200];
    snprintf(text, sizeof text,
             "%s of fork %" PRIx64 " of RRef %" PRIx64 " from rank %d, "
             "which does not hold it",
             zd__rpc_wire_type_name(h->type), h->b, h->a, h->src);
    zd__log(ZD_LOG_WARN, "rpc: refused a %s", text);
    zd__transport_answer_error(&a->net, m, h->id, text);
    return true;
}

/*  FORK_GONE: refused, as an RRef this process never holds again
    (zd__rref_never_here): news for the sender, not a line of the log. */
enum { FORK_ACK, FORK_WAIT, FORK_REFUSE, FORK_GONE };

/*  Under x->lock: what becomes of a fork request (the rule in rref.h).
    FORK_ACK when the fork is registered (forks that waited for the child
    to become a holder go to *ready), FORK_WAIT when it waits for its parent
    (*watch: a placeholder it made), FORK_REFUSE or FORK_GONE with why. */
static int fork_request(agent_t *a, const inmsg_t *m, zd_future_t **watch, fork_wait_t **ready,
                        char *why, size_t size)
{
    rref_ctx_t *x = a->rrefs;
    const rpc_wire_header_t *h = &m->h;
    int src = h->src, parent = zd__rref_creator(h->b);
    owner_t *e = zd__rref_owner_find(x, h->a);
    if (zd__rref_owner_fork_holder(e, h->b) == src)
        return FORK_ACK; /* a retry */
    if (parent == a->net.rank) {
        snprintf(why, size,
                 "fork request of rank %d for fork %" PRIx64 " of RRef %" PRIx64
                 " refused: forks made by the owner (rank %d) are registered when sent, never "
                 "requested",
                 src, h->b, h->a, a->net.rank);
        return FORK_REFUSE;
    }
    if (has_holder(e, parent)) {
        if (zd__rref_owner_add_fork(e, h->b, src) < 0) {
            snprintf(why, size, "%s", zd_error_last());
            return FORK_REFUSE;
        }
        waits_release(x, e, ready); /* src is a holder now */
        return FORK_ACK;
    }
    fork_wait_t *w = wait_find(x, h->a, h->b, src);
    if (w) {
        /* An attempt again (the last one timed out waiting): the answer
           goes to the newest, which its sender waits for. */
        w->req_id = h->id;
        memcpy(w->route, m->route, m->route_len);
        w->route_len = m->route_len;
        return FORK_WAIT;
    }
    if (!e && zd__rref_never_here(a, h->a)) {
        snprintf(why, size, "%s", zd_error_last());
        return FORK_GONE;
    }
    if ((!e && zd__rref_placeholder_admit(a, x, src) < 0) || wait_admit(a, x, src) < 0) {
        snprintf(why, size, "%s", zd_error_last());
        return FORK_REFUSE;
    }
    if (!(w = calloc(1, sizeof *w))) {
        snprintf(why, size, "RRef: out of memory");
        return FORK_REFUSE;
    }
    if (!e) { /* the REMOTE creating it may still be on its way */
        if (!(e = zd__rref_owner_create(x, h->a, OWNER_PLACEHOLDER))) {
            free(w);
            snprintf(why, size, "%s", zd_error_last());
            return FORK_REFUSE;
        }
        zd__rref_placeholder_arm(a, x, e, src, h->timeout_ms);
        *watch = zd_future_ref(e->value);
    }
    *w = (fork_wait_t){.rref_id = h->a,
                       .fork_id = h->b,
                       .src = src,
                       .parent = parent,
                       .req_id = h->id,
                       .route_len = m->route_len,
                       .since_ns = zd__net_now_ns(),
                       .next = x->waits};
    memcpy(w->route, m->route, m->route_len);
    /* As long as a placeholder would wait for its REMOTE. */
    w->expire_ns = placeholder_expiry(a, h->timeout_ms);
    if (w->expire_ns < x->waits_due_ns || x->n_waits == 0)
        x->waits_due_ns = w->expire_ns;
    zd__io_due(&a->net, w->expire_ns);
    x->waits = w;
    x->n_waits++;
    x->n_waited++;
    if (src >= 0 && src < x->waits_world)
        x->waits_by_peer[src]++;
    return FORK_WAIT;
}

void zd__rref_handle_control(agent_t *a, const inmsg_t *m)
{
    rref_ctx_t *x = a->rrefs;
    const rpc_wire_header_t *h = &m->h;
    if ((h->type != RPC_MSG_RREF_CHILD_ACCEPT && !zd__rref_id_ok(a, h->a)) ||
        !zd__rref_id_ok(a, h->b)) {
        char text[160];
        snprintf(text, sizeof text, "bad ids in %s (rref %" PRIx64 ", fork %" PRIx64 ")",
                 zd__rpc_wire_type_name(h->type), h->a, h->b);
        zd__log(ZD_LOG_WARN, "rpc: from rank %d: %s", h->src, text);
        zd__transport_answer_error(&a->net, m, h->id, text);
        return;
    }
    owner_t *freed = NULL;
    zd_rref_t *parent = NULL;
    zd_future_t *watch = NULL;
    fork_wait_t *ready = NULL;
    int outcome = FORK_ACK;
    char why[256];
    pthread_mutex_lock(&x->lock);
    if (control_refused(a, m)) {
        pthread_mutex_unlock(&x->lock);
        return;
    }
    switch (h->type) {
    case RPC_MSG_RREF_USER_DELETE: {
        owner_t *e = zd__rref_owner_find(x, h->a);
        if (e)
            zd__rref_owner_del_fork(e, h->b);
        freed = zd__rref_owner_maybe_unlink(x, e);
        /* A child that gave up waiting: its request goes too, unanswered. */
        for (fork_wait_t **pp = &x->waits; *pp; pp = &(*pp)->next)
            if ((*pp)->rref_id == h->a && (*pp)->fork_id == h->b && (*pp)->src == h->src) {
                fork_wait_t *w = *pp;
                wait_unlink(x, pp);
                w->refused = w->silent = true;
                snprintf(w->why, sizeof w->why, "RRef %" PRIx64 ": rank %d deleted its fork", h->a,
                         h->src);
                ready = w;
                break;
            }
        break;
    }
    case RPC_MSG_RREF_FORK_REQUEST:
        outcome = fork_request(a, m, &watch, &ready, why, sizeof why);
        break;
    case RPC_MSG_RREF_CHILD_ACCEPT:
        parent = zd__rref_child_take(x, h->b);
        break;
    }
    pthread_mutex_unlock(&x->lock);
    if (watch) {
        zd__rref_watch_value(a, watch, h->a);
        zd_future_unref(watch);
    }
    zd__rref_owner_free(freed);
    zd_rref_unref(parent);
    if (outcome == FORK_ACK) {
        send_ack(a, m);
    } else if (outcome == FORK_REFUSE || outcome == FORK_GONE) {
        static _Atomic int64_t last;
        bool gone = outcome == FORK_GONE;
        if (gone || log_due(&last))
            zd__log(gone ? ZD_LOG_DEBUG : ZD_LOG_WARN,
                    "rpc: from \"%s\" (rank %d): fork request refused: %s", peer_name(a, h->src),
                    h->src, why);
        zd__transport_answer_error(&a->net, m, h->id, why);
    }
    waits_answer(a, ready);
}

/*  The expiry looks at the placeholders only when one is due, and then at
    most every RREF_SCAN_NS: a flood of them (bounded by the caps) costs the
    I/O thread a walk of their list a few times a second, not of every owner
    entry every tick. */
#define RREF_SCAN_NS ((int64_t)10000000)

/*  Under the lock: takes the fork requests that waited too long off the
    list, refused, into *out (at most every RREF_SCAN_NS, when one is due). */
static void waits_expire(rref_ctx_t *x, int64_t now_ns, fork_wait_t **out)
{
    if (!x->n_waits || now_ns < x->waits_due_ns || now_ns - x->waits_scan_ns < RREF_SCAN_NS)
        return;
    x->waits_scan_ns = now_ns;
    int64_t due = INT64_MAX;
    for (fork_wait_t **pp = &x->waits; *pp;) {
        fork_wait_t *w = *pp;
        if (w->expire_ns > now_ns) {
            if (w->expire_ns < due)
                due = w->expire_ns;
            pp = &w->next;
            continue;
        }
        wait_unlink(x, pp);
        w->refused = true;
        snprintf(w->why, sizeof w->why,
                 "fork request of rank %d for fork %" PRIx64 " of RRef %" PRIx64
                 " refused: rank %d, which made the fork, holds no fork of that RRef "
                 "(waited %lld ms)",
                 w->src, w->fork_id, w->rref_id, w->parent,
                 (long long)((now_ns - w->since_ns) / ZD__NS_PER_MS));
        w->next = *out;
        *out = w;
    }
    x->waits_due_ns = due;
}

/*  When a list scanned at most every RREF_SCAN_NS, its earliest expiry
    `due`, is due for a look. */
static int64_t scan_due(int64_t due, int64_t scanned_ns)
{
    int64_t next_scan = scanned_ns + RREF_SCAN_NS;
    return due > next_scan ? due : next_scan;
}

int64_t zd__rref_tick(agent_t *a, int64_t now_ns)
{
    rref_ctx_t *x = a->rrefs;
    enum { MAX_EXPIRED = 64 };
    zd_future_t *expired[MAX_EXPIRED];
    uint64_t ids[MAX_EXPIRED];
    int n = 0;
    fork_wait_t *refused = NULL;
    pthread_mutex_lock(&x->lock);
    waits_expire(x, now_ns, &refused);
    if (x->n_placeholders && now_ns >= x->ph_due_ns && now_ns - x->ph_scan_ns >= RREF_SCAN_NS) {
        x->ph_scan_ns = now_ns;
        int64_t due = INT64_MAX;
        for (owner_t *e = x->placeholders, *next; e; e = next) {
            next = e->ph_next;
            if (e->expire_ns <= now_ns && n < MAX_EXPIRED) {
                placeholder_done(x, e); /* failed: freed like any other */
                ids[n] = e->rref_id;
                expired[n++] = zd_future_ref(e->value);
            } else if (e->expire_ns < due) {
                due = e->expire_ns;
            }
        }
        x->ph_due_ns = due;
    }
    int64_t next = INT64_MAX;
    if (x->n_waits)
        next = scan_due(x->waits_due_ns, x->waits_scan_ns);
    if (x->n_placeholders) {
        int64_t ph = scan_due(x->ph_due_ns, x->ph_scan_ns);
        next = ph < next ? ph : next;
    }
    pthread_mutex_unlock(&x->lock);
    waits_answer(a, refused);
    for (int i = 0; i < n; i++) {
        zd_future_set_error(expired[i],
                            "unknown RRef %" PRIx64 ": no remote() created it "
                            "on \"%s\" (rank %d) in time",
                            ids[i], a->name, a->net.rank);
        zd_future_unref(expired[i]);
    }
    return next;
}

/*  ---- a lost holder ---- */

int64_t zd__rref_release_holder(agent_t *a, int rank, int64_t *freed_out)
{
    rref_ctx_t *x = a->rrefs;
    int64_t dropped = 0, freed = 0;
    if (!x)
        return 0;
    /* Entries to free are unlinked under the lock and freed after it: their
       values may hold RRefs, whose release takes it. */
    owner_t *to_free = NULL;
    pthread_mutex_lock(&x->lock);
    for (size_t b = 0; b < OWNER_BUCKETS; b++) {
        owner_t *e = x->owners[b];
        while (e) {
            owner_t *next = e->next;
            bool had = false;
            for (int i = e->n_forks - 1; i >= 0; i--)
                if (e->holders[i] == rank) {
                    zd__rref_owner_del_fork(e, e->forks[i]);
                    dropped++;
                    had = true;
                }
            owner_t *gone = had ? zd__rref_owner_maybe_unlink(x, e) : NULL;
            if (gone) {
                gone->next = to_free;
                to_free = gone;
                freed++;
            }
            e = next;
        }
    }
    /* Its fork requests waiting here: nobody to answer. Those waiting for
       it to become a holder: it never will. */
    fork_wait_t *waits = NULL;
    for (fork_wait_t **pp = &x->waits; *pp;) {
        fork_wait_t *w = *pp;
        if (w->src != rank && w->parent != rank) {
            pp = &w->next;
            continue;
        }
        wait_unlink(x, pp);
        w->refused = true;
        w->silent = w->src == rank;
        snprintf(w->why, sizeof w->why,
                 "fork request of rank %d for fork %" PRIx64 " of RRef %" PRIx64
                 " refused: rank %d, which made the fork, was lost before it held one",
                 w->src, w->fork_id, w->rref_id, w->parent);
        w->next = waits;
        waits = w;
    }
    /* Children sent to it: their CHILD_ACCEPT will never come, and the
       parents they keep alive would hold up the shutdown's drain. */
    child_t *orphans = NULL;
    for (size_t b = 0; b < CHILD_BUCKETS; b++) {
        child_t **pp = &x->children[b];
        while (*pp) {
            child_t *c = *pp;
            if (c->holder != rank) {
                pp = &c->next;
                continue;
            }
            *pp = c->next;
            x->n_children--;
            dropped++;
            c->next = orphans;
            orphans = c;
        }
    }
    pthread_mutex_unlock(&x->lock);
    waits_answer(a, waits);
    while (orphans) { /* parents are released outside the lock: it is theirs too */
        child_t *next = orphans->next;
        zd_rref_unref(orphans->parent);
        free(orphans);
        orphans = next;
    }
    while (to_free) {
        owner_t *next = to_free->next;
        zd__rref_owner_free(to_free);
        to_free = next;
    }
    if (freed_out)
        *freed_out = freed;
    return dropped;
}

/*  ---- the context ---- */

static atomic_int_fast64_t g_leaked;

int64_t zd_rpc_debug_owner_rrefs_leaked(void)
{
    return atomic_load(&g_leaked);
}

int zd__rref_ctx_new(agent_t *a)
{
    rref_ctx_t *x = calloc(1, sizeof *x);
    if (!x)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "RRef: out of memory");
    pthread_mutex_init(&x->lock, NULL);
    if (getrandom(x->id_key, sizeof x->id_key, 0) != (ssize_t)sizeof x->id_key) {
        /* No kernel entropy (a kernel before 3.17): unique ids still, but
           a peer that knows the clock could guess them. */
        zd__log(ZD_LOG_WARN, "rpc: getrandom failed: RRef ids are less hard to guess");
        x->id_key[0] = (uint64_t)zd__net_now_ns() ^ (uint64_t)(uintptr_t)x;
        x->id_key[1] = (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)&x;
    }
    atomic_init(&x->id_next, 1);
    a->rrefs = x;
    a->rref_codec = (rpc_rref_codec_t){NULL, zd__rref_decode, a};
    return 0;
}

void zd__rref_ctx_free(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    if (!x)
        return;
    /* Whoever waits for a value that will never come gets an error (and
       their callbacks run now, while the sockets are still open). */
    pthread_mutex_lock(&x->lock);
    x->closing = true;
    int64_t n = x->n_owners, leaked = 0;
    zd_future_t **open = calloc((size_t)(n ? n : 1), sizeof *open);
    int n_open = 0;
    for (size_t b = 0; b < OWNER_BUCKETS; b++)
        for (owner_t *e = x->owners[b]; e; e = e->next) {
            leaked += e->n_forks > 0 || e->handle;
            if (open && !zd_future_done(e->value))
                open[n_open++] = zd_future_ref(e->value);
        }
    fork_wait_t *waits = x->waits; /* and fetches waiting with them */
    x->waits = NULL;
    x->n_waits = 0;
    pthread_mutex_unlock(&x->lock);
    for (int i = 0; i < n_open; i++) {
        zd_future_set_error(open[i], "RPC shut down");
        zd_future_unref(open[i]);
    }
    for (fork_wait_t *w = waits; w; w = w->next) {
        w->refused = w->silent = true;
        snprintf(w->why, sizeof w->why, "RPC shut down");
    }
    waits_answer(a, waits);
    free(open);
    if (leaked)
        zd__log(ZD_LOG_WARN, "rpc: shutdown: %" PRId64 " owned RRef value(s) still referenced",
                leaked);
    atomic_store(&g_leaked, leaked);
    for (size_t b = 0; b < OWNER_BUCKETS; b++)
        while (x->owners[b]) {
            owner_t *e = x->owners[b];
            x->owners[b] = e->next;
            zd__rref_owner_free(e);
        }
    for (size_t b = 0; b < CHILD_BUCKETS; b++)
        while (x->children[b]) {
            child_t *c = x->children[b];
            x->children[b] = c->next;
            zd_rref_unref(c->parent);
            free(c);
        }
    pthread_mutex_destroy(&x->lock);
    free(x->waits_by_peer);
    free(x->ph_by_peer);
    free(x);
    a->rrefs = NULL;
}

int64_t zd__rref_outstanding(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    pthread_mutex_lock(&x->lock);
    int64_t n = x->n_ctrl + x->n_pending_users + x->n_children;
    pthread_mutex_unlock(&x->lock);
    return n;
}

int64_t zd__rref_owner_count(agent_t *a)
{
    rref_ctx_t *x = a->rrefs;
    pthread_mutex_lock(&x->lock);
    int64_t n = x->n_owners;
    pthread_mutex_unlock(&x->lock);
    return n;
}

zd_rref_t *zd__rref_new_local(agent_t *a, zd_value_t *value)
{
    rref_ctx_t *x = a->rrefs;
    uint64_t rref_id = zd__rref_new_id(a);
    pthread_mutex_lock(&x->lock);
    owner_t *e = zd__rref_owner_create(x, rref_id, OWNER_CREATED);
    zd_rref_t *h = e ? zd__rref_owner_handle(a, e) : NULL;
    zd_future_t *f = e ? zd_future_ref(e->value) : NULL;
    pthread_mutex_unlock(&x->lock);
    if (f) {
        zd_future_set_value(f, value);
        zd__rref_watch_value(a, f, rref_id);
        zd_future_unref(f);
    }
    return h;
}

void zd__rref_user_error(agent_t *a, zd_rref_t *r, char *buf, size_t size)
{
    pthread_mutex_lock(&a->rrefs->lock);
    snprintf(buf, size, "%s", r->error ? r->error : "");
    pthread_mutex_unlock(&a->rrefs->lock);
}
