/* SPDX-License-Identifier: MIT */
/*  dist_context.c: the registry of distributed autograd contexts, their
    tables of send/receive functions, participants and gradients. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist_autograd/dist_private.h"
#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "core/sized.h"

#define BUCKETS 64 /* contexts live for one iteration: few at a time */

typedef struct entry {
    dist_context_t *ctx;
    struct entry *next;
} entry_t;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *buckets[BUCKETS];
static int64_t live_contexts;
static atomic_uint_fast64_t id_counter = 1;

/*  Contexts peers made here: how many per peer (indexed by rank), in all,
    the limits, and when the idle ones were last looked for. All under
    registry_lock. */
#define DEFAULT_MAX_CONTEXTS 4096
#define DEFAULT_MAX_PER_PEER 256
/*  How often the idle contexts are swept: every second, or four times per
    idle timeout when that is shorter. */
#define SWEEP_EVERY_MS ZD__MS_PER_S
static int64_t *made_per_peer;
static int made_cap;
static int64_t made_total;
static zd_dist_autograd_limits_t limits;
static int64_t last_sweep_ms;

_Thread_local int64_t zd__dist_current_ctx = -1;
atomic_int_fast64_t zd__dist_stat_sends, zd__dist_stat_recvs, zd__dist_stat_passes,
    zd__dist_stat_flushed;
atomic_int_fast64_t zd__dist_total_contexts, zd__dist_total_backward, zd__dist_total_grad_messages,
    zd__dist_total_sends;

uint64_t zd__dist_next_id(void)
{
    uint64_t rank = (uint64_t)(zd_rpc_rank() < 0 ? 0 : zd_rpc_rank()) & 0xffff;
    return rank << 48 | (atomic_fetch_add(&id_counter, 1) & 0xffffffffffffULL);
}

static int64_t now_ms(void)
{
    return zd__now_ns() / ZD__NS_PER_MS;
}

static size_t bucket_of(int64_t id)
{
    uint64_t x = (uint64_t)id * 0x9e3779b97f4a7c15ULL;
    return (size_t)(x >> 58) % BUCKETS;
}

static dist_context_t *context_new(int64_t id)
{
    dist_context_t *c = calloc(1, sizeof *c);
    if (!c) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
        return NULL;
    }
    atomic_init(&c->refs, 1);
    atomic_fetch_add(&zd__dist_total_contexts, 1);
    c->id = id;
    c->made_by = -1;
    c->last_query = -1;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->grad_lock, NULL);
    pthread_mutex_init(&c->pass_lock, NULL);
    return c;
}

static void free_fns(dist_fn_t *fns, int n, atomic_int_fast64_t *stat)
{
    for (int i = 0; i < n; i++)
        zd_autograd_node_unref(fns[i].node);
    atomic_fetch_sub(stat, n);
    free(fns);
}

void zd__dist_context_unref(dist_context_t *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    zd_autograd_task_free(c->task);
    free_fns(c->sends, c->n_sends, &zd__dist_stat_sends);
    free_fns(c->recvs, c->n_recvs, &zd__dist_stat_recvs);
    for (int i = 0; i < c->n_grads; i++) {
        zd_tensor_unref(c->grads[i].tensor);
        zd_tensor_unref(c->grads[i].grad);
    }
    free(c->grads);
    free(c->peers);
    pthread_mutex_destroy(&c->lock);
    pthread_mutex_destroy(&c->grad_lock);
    pthread_mutex_destroy(&c->pass_lock);
    free(c);
}

static dist_context_t *find_locked(int64_t id)
{
    for (entry_t *e = buckets[bucket_of(id)]; e; e = e->next)
        if (e->ctx->id == id)
            return e->ctx;
    return NULL;
}

static int sweep_locked(int64_t now, dist_context_t **out, int max);
static void release_expired(dist_context_t **expired, int n, int64_t now);

dist_context_t *zd__dist_context_get(int64_t id)
{
    dist_context_t *expired[16];
    int64_t now = now_ms();
    pthread_mutex_lock(&registry_lock);
    int n_expired = sweep_locked(now, expired, 16);
    dist_context_t *c = find_locked(id);
    if (c) {
        atomic_fetch_add(&c->refs, 1);
        if (c->made_by >= 0)
            atomic_store(&c->last_used_ms, now);
    }
    pthread_mutex_unlock(&registry_lock);
    release_expired(expired, n_expired, now);
    return c;
}

dist_context_t *zd__dist_context_get_or_create(int64_t id)
{
    pthread_mutex_lock(&registry_lock);
    dist_context_t *c = find_locked(id);
    if (!c) {
        entry_t *e = malloc(sizeof *e);
        c = e ? context_new(id) : NULL;
        if (!c) {
            free(e);
            pthread_mutex_unlock(&registry_lock);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
            return NULL;
        }
        e->ctx = c; /* the registry's reference */
        e->next = buckets[bucket_of(id)];
        buckets[bucket_of(id)] = e;
        live_contexts++;
    }
    atomic_fetch_add(&c->refs, 1);
    pthread_mutex_unlock(&registry_lock);
    return c;
}

dist_context_t *zd__dist_context_remove(int64_t id)
{
    dist_context_t *c = NULL;
    pthread_mutex_lock(&registry_lock);
    for (entry_t **p = &buckets[bucket_of(id)]; *p; p = &(*p)->next) {
        if ((*p)->ctx->id == id) {
            entry_t *e = *p;
            c = e->ctx;
            *p = e->next;
            free(e);
            live_contexts--;
            if (c->made_by >= 0 && c->made_by < made_cap) {
                made_per_peer[c->made_by]--;
                made_total--;
            }
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return c;
}

const char *zd__dist_peer_desc(int rank, char *buf, size_t size)
{
    zd_rpc_worker_info_t info;
    if (zd_rpc_get_worker_info_by_rank(rank, &info) == 0)
        snprintf(buf, size, "peer \"%s\" (rank %d)", info.name, rank);
    else
        snprintf(buf, size, "peer of rank %d", rank);
    return buf;
}

int zd_dist_autograd_set_limits(const zd_dist_autograd_limits_t *l)
{
    zd_dist_autograd_limits_t want = zd_dist_autograd_limits_default();
    if (l &&
        zd__sized_read(&want, sizeof want, l,
                       ZD__SIZE_THROUGH(zd_dist_autograd_limits_t, idle_timeout_ms),
                       "zd_dist_autograd_limits_t", "zd_dist_autograd_limits_default()") < 0)
        return zd_error_wrap("zd_dist_autograd_set_limits");
    pthread_mutex_lock(&registry_lock);
    limits = want;
    last_sweep_ms = 0;
    pthread_mutex_unlock(&registry_lock);
    return 0;
}

/*  The idle timeout by error.h's rule: -1 (never) for ZD_TIMEOUT_NONE. */
static int64_t idle_timeout_ms(void)
{
    if (limits.idle_timeout_ms == ZD_TIMEOUT_NONE)
        return -1;
    if (limits.idle_timeout_ms > 0)
        return limits.idle_timeout_ms;
    int64_t rpc = zd_rpc_get_timeout();
    return rpc > 0 ? 10 * rpc : 10 * 60 * ZD__MS_PER_S;
}

/*  Takes out of the registry, under registry_lock, peers' contexts nobody
    used for the idle timeout and nobody holds; returns how many are in
    out (at most max) for the caller to log and free after unlocking. */
static int sweep_locked(int64_t now, dist_context_t **out, int max)
{
    int64_t ttl = idle_timeout_ms();
    int n = 0;
    if (ttl < 0 || made_total == 0 ||
        now - last_sweep_ms < (ttl < 4 * SWEEP_EVERY_MS ? ttl / 4 : SWEEP_EVERY_MS))
        return 0;
    last_sweep_ms = now;
    for (int b = 0; b < BUCKETS && n < max; b++) {
        for (entry_t **p = &buckets[b]; *p && n < max;) {
            dist_context_t *c = (*p)->ctx;
            if (c->made_by < 0 || atomic_load(&c->refs) != 1 ||
                now - atomic_load(&c->last_used_ms) < ttl) {
                p = &(*p)->next;
                continue;
            }
            entry_t *e = *p;
            *p = e->next;
            free(e);
            live_contexts--;
            if (c->made_by < made_cap) {
                made_per_peer[c->made_by]--;
                made_total--;
            }
            out[n++] = c;
        }
    }
    return n;
}

static void release_expired(dist_context_t **expired, int n, int64_t now)
{
    for (int i = 0; i < n; i++) {
        char who[160];
        zd__log(ZD_LOG_WARN, "dist_autograd: context %lld made by %s unused for %lld s: released",
                (long long)expired[i]->id, zd__dist_peer_desc(expired[i]->made_by, who, sizeof who),
                (long long)((now - atomic_load(&expired[i]->last_used_ms)) / ZD__MS_PER_S));
        zd__dist_context_unref(expired[i]);
    }
}

/*  Why peer may not make context id here ("" when it may), under
    registry_lock. */
static const char *refuse_locked(int64_t id, int peer, char *why, size_t size)
{
    int creator = (int)((uint64_t)id >> 48);
    int64_t max_all = limits.max_contexts > 0 ? limits.max_contexts : DEFAULT_MAX_CONTEXTS;
    int64_t max_peer =
        limits.max_contexts_per_peer > 0 ? limits.max_contexts_per_peer : DEFAULT_MAX_PER_PEER;
    why[0] = '\0';
    if (id <= 0 || creator >= zd_rpc_world_size() || (id & 0xffffffffffffLL) == 0)
        snprintf(why, size, "context id %llx was not made by a member of this world",
                 (unsigned long long)id);
    else if (creator == zd_rpc_rank())
        snprintf(why, size,
                 "context %llx would be this process's own, and it has no such "
                 "context",
                 (unsigned long long)id);
    else if (peer < made_cap && made_per_peer[peer] >= max_peer)
        snprintf(why, size, "it already has %lld contexts here (the limit per peer)",
                 (long long)made_per_peer[peer]);
    else if (made_total >= max_all)
        snprintf(why, size, "peers already have %lld contexts here (the limit)",
                 (long long)made_total);
    return why;
}

dist_context_t *zd__dist_context_get_or_create_for(int64_t id, int peer)
{
    dist_context_t *expired[16];
    char why[200];
    int64_t now = now_ms();
    if (peer < 0 || peer > 0xffff) {
        zd_error_set("dist_autograd: a context request from rank %d", peer);
        return NULL;
    }
    pthread_mutex_lock(&registry_lock);
    int n_expired = sweep_locked(now, expired, 16);
    dist_context_t *c = find_locked(id);
    if (!c && refuse_locked(id, peer, why, sizeof why)[0] == '\0' && peer >= made_cap) {
        int ncap = peer + 16;
        int64_t *p = realloc(made_per_peer, sizeof *p * (size_t)ncap);
        if (p) {
            memset(p + made_cap, 0, sizeof *p * (size_t)(ncap - made_cap));
            made_per_peer = p;
            made_cap = ncap;
        } else {
            snprintf(why, sizeof why, "out of memory");
        }
    }
    if (!c && why[0] == '\0') {
        entry_t *e = malloc(sizeof *e);
        c = e ? context_new(id) : NULL;
        if (c) {
            c->made_by = peer;
            e->ctx = c;
            e->next = buckets[bucket_of(id)];
            buckets[bucket_of(id)] = e;
            live_contexts++;
            made_per_peer[peer]++;
            made_total++;
        } else {
            free(e);
            snprintf(why, sizeof why, "out of memory");
        }
    }
    if (c) {
        atomic_fetch_add(&c->refs, 1);
        atomic_store(&c->last_used_ms, now);
    }
    pthread_mutex_unlock(&registry_lock);
    release_expired(expired, n_expired, now);
    if (!c) {
        char who[160];
        zd__dist_peer_desc(peer, who, sizeof who);
        zd__log(ZD_LOG_WARN, "dist_autograd: refused a new context %llx from %s: %s",
                (unsigned long long)id, who, why);
        zd_error_set("dist_autograd: refused a new context from %s: %s", who, why);
    }
    return c;
}

bool zd__dist_context_is_participant(dist_context_t *c, int peer)
{
    if ((int)((uint64_t)c->id >> 48) == peer)
        return true;
    pthread_mutex_lock(&c->lock);
    bool known = false;
    for (int i = 0; i < c->n_peers && !known; i++)
        known = c->peers[i] == peer;
    pthread_mutex_unlock(&c->lock);
    return known;
}

bool zd__dist_context_may_release(dist_context_t *c, int peer)
{
    int creator = (int)((uint64_t)c->id >> 48);
    if (peer == creator)
        return true;
    if (peer != c->made_by)
        return false;
    pthread_mutex_lock(&c->lock);
    bool creator_came = false;
    for (int i = 0; i < c->n_peers && !creator_came; i++)
        creator_came = c->peers[i] == creator;
    pthread_mutex_unlock(&c->lock);
    return !creator_came;
}

int64_t zd_dist_autograd_num_contexts(void)
{
    dist_context_t *expired[16];
    int64_t now = now_ms();
    pthread_mutex_lock(&registry_lock);
    int n_expired = sweep_locked(now, expired, 16);
    int64_t n = live_contexts;
    pthread_mutex_unlock(&registry_lock);
    release_expired(expired, n_expired, now);
    return n;
}

bool zd_dist_autograd_context_exists(int64_t id)
{
    dist_context_t *c = zd__dist_context_get(id);
    zd__dist_context_unref(c);
    return c != NULL;
}

/*  Grows *items (of size elem) to hold one more; 0 or -1. */
static int reserve(void **items, int n, int *cap, size_t elem)
{
    if (n < *cap)
        return 0;
    int ncap = *cap ? *cap * 2 : 8;
    void *p = realloc(*items, (size_t)ncap * elem);
    if (!p)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    *items = p;
    *cap = ncap;
    return 0;
}

int zd__dist_context_add_peer(dist_context_t *c, int peer)
{
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    bool known = false;
    for (int i = 0; i < c->n_peers && !known; i++)
        known = c->peers[i] == peer;
    if (!known && (rc = reserve((void **)&c->peers, c->n_peers, &c->cap_peers, sizeof(int))) == 0)
        c->peers[c->n_peers++] = peer;
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int zd__dist_context_peers(dist_context_t *c, int **peers, int *n)
{
    pthread_mutex_lock(&c->lock);
    *n = c->n_peers;
    *peers = malloc(sizeof(int) * (size_t)(c->n_peers ? c->n_peers : 1));
    if (*peers && c->n_peers > 0)
        memcpy(*peers, c->peers, sizeof(int) * (size_t)c->n_peers);
    pthread_mutex_unlock(&c->lock);
    return *peers ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
}

int zd__dist_context_add_fn(dist_context_t *c, bool send, uint64_t msg_id, zd_autograd_node_t *node,
                            int peer)
{
    pthread_mutex_lock(&c->lock);
    dist_fn_t **fns = send ? &c->sends : &c->recvs;
    int *n = send ? &c->n_sends : &c->n_recvs;
    int rc = reserve((void **)fns, *n, send ? &c->cap_sends : &c->cap_recvs, sizeof(dist_fn_t));
    if (rc == 0) {
        (*fns)[(*n)++] = (dist_fn_t){msg_id, zd_autograd_node_ref(node), peer};
        atomic_fetch_add(send ? &zd__dist_stat_sends : &zd__dist_stat_recvs, 1);
        if (send)
            atomic_fetch_add(&zd__dist_total_sends, 1);
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

zd_autograd_node_t *zd__dist_context_find_send(dist_context_t *c, uint64_t msg_id)
{
    zd_autograd_node_t *node = NULL;
    pthread_mutex_lock(&c->lock);
    for (int i = c->n_sends - 1; i >= 0 && !node; i--)
        if (c->sends[i].msg_id == msg_id)
            node = c->sends[i].node;
    pthread_mutex_unlock(&c->lock);
    return node;
}

int zd__dist_context_send_peer(dist_context_t *c, uint64_t msg_id)
{
    int peer = -1;
    pthread_mutex_lock(&c->lock);
    for (int i = c->n_sends - 1; i >= 0 && peer < 0; i--)
        if (c->sends[i].msg_id == msg_id)
            peer = c->sends[i].peer;
    pthread_mutex_unlock(&c->lock);
    return peer;
}

int zd__dist_context_accumulate(void *arg, zd_tensor_t *leaf, zd_tensor_t *grad)
{
    dist_context_t *c = arg;
    int rc = 0;
    pthread_mutex_lock(&c->grad_lock);
    dist_grad_t *slot = NULL;
    for (int i = 0; i < c->n_grads && !slot; i++)
        if (c->grads[i].tensor == leaf)
            slot = &c->grads[i];
    if (slot) {
        float *d = zd_tensor_data(slot->grad);
        const float *s = zd_tensor_data(grad);
        for (int64_t i = 0; i < zd_tensor_numel(grad); i++)
            d[i] += s[i];
    } else if ((rc = reserve((void **)&c->grads, c->n_grads, &c->cap_grads, sizeof(dist_grad_t))) ==
               0) {
        /* Later gradients are summed into the stored one, so keep the
           incoming buffer only when nobody else can see it; else copy. */
        zd_tensor_t *g;
        if (zd_tensor_is_exclusive(grad) && zd_tensor_same_shape(grad, leaf)) {
            g = zd_tensor_ref(grad);
        } else if ((g = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(leaf), zd_tensor_ndim(leaf)))) {
            memcpy(zd_tensor_data(g), zd_tensor_data(grad), zd_tensor_nbytes(g));
        }
        if (!g)
            rc = -1;
        else
            c->grads[c->n_grads++] = (dist_grad_t){zd_tensor_ref(leaf), g};
    }
    pthread_mutex_unlock(&c->grad_lock);
    return rc;
}

int zd_dist_autograd_get_gradient(int64_t context_id, zd_tensor_t *t, zd_tensor_t **grad)
{
    *grad = NULL;
    dist_context_t *c = zd__dist_context_get(context_id);
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dist_autograd: no context %lld in this process",
                                 (long long)context_id);
    pthread_mutex_lock(&c->grad_lock);
    for (int i = 0; i < c->n_grads && !*grad; i++)
        if (c->grads[i].tensor == t)
            *grad = zd_tensor_ref(c->grads[i].grad);
    pthread_mutex_unlock(&c->grad_lock);
    zd__dist_context_unref(c);
    return 0;
}

zd_named_tensors_t *zd_dist_autograd_get_gradients(int64_t context_id)
{
    dist_context_t *c = zd__dist_context_get(context_id);
    if (!c) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "dist_autograd: no context %lld in this process",
                          (long long)context_id);
        return NULL;
    }
    zd_named_tensors_t *out = zd_named_tensors_new();
    pthread_mutex_lock(&c->grad_lock);
    for (int i = 0; out && i < c->n_grads; i++) {
        /* Under the tensor's name, else (none, or a second tensor named
           alike) under its place in the context. */
        const char *name = zd_tensor_name(c->grads[i].tensor);
        char fallback[32];
        if (!*name || zd_named_tensors_index(out, name) >= 0) {
            snprintf(fallback, sizeof fallback, "tensor%d", i);
            name = fallback;
        }
        if (zd_named_tensors_add(out, name, c->grads[i].grad) < 0) {
            zd_error_wrap("dist_autograd: the gradients of context %lld", (long long)context_id);
            zd_named_tensors_free(out);
            out = NULL;
        }
    }
    pthread_mutex_unlock(&c->grad_lock);
    zd__dist_context_unref(c);
    return out;
}

int64_t zd_dist_autograd_current_context(void)
{
    return zd__dist_current_ctx;
}

int zd_dist_autograd_set_current_context(int64_t context_id)
{
    if (context_id != -1 && !zd_dist_autograd_context_exists(context_id))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dist_autograd: no context %lld in this process",
                                 (long long)context_id);
    zd__dist_current_ctx = context_id;
    return 0;
}

int zd_dist_autograd_context_begin(int64_t *context_id)
{
    if (zd__dist_current_ctx != -1)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "dist_autograd: this thread already has context %lld; end it "
                                 "before beginning another",
                                 (long long)zd__dist_current_ctx);
    if (!zd__dist_installed())
        return zd_error_set_code(ZD_ERR_NOT_INITIALIZED,
                                 "dist_autograd: zd_dist_autograd_init() "
                                 "was not called (call it before zd_rpc_init())");
    if (!zd_rpc_is_running())
        return zd_error_set_code(ZD_ERR_NOT_INITIALIZED,
                                 "dist_autograd: RPC is not running (call "
                                 "zd_rpc_init first)");
    int64_t id = (int64_t)zd__dist_next_id();
    dist_context_t *c = zd__dist_context_get_or_create(id);
    if (!c)
        return -1;
    zd__dist_context_unref(c);
    zd__dist_current_ctx = id;
    *context_id = id;
    return 0;
}

int zd_dist_autograd_stats(zd_dist_autograd_stats_t *out, size_t size)
{
    zd_dist_autograd_stats_t s = {
        .contexts = zd_dist_autograd_num_contexts(),
        .backward_passes = atomic_load(&zd__dist_stat_passes),
        .send_functions = atomic_load(&zd__dist_stat_sends),
        .recv_functions = atomic_load(&zd__dist_stat_recvs),
        .flushed_nodes = atomic_load(&zd__dist_stat_flushed),
        .total_contexts = atomic_load(&zd__dist_total_contexts),
        .total_backward = atomic_load(&zd__dist_total_backward),
        .total_grad_messages = atomic_load(&zd__dist_total_grad_messages),
        .total_send_functions = atomic_load(&zd__dist_total_sends),
    };
    return zd__sized_write(out, size, &s, sizeof s,
                           ZD__SIZE_THROUGH(zd_dist_autograd_stats_t, total_send_functions),
                           "zd_dist_autograd_stats");
}

/*  ---- a lost peer ---- */

/*  A context dies with its creator (the rank in its id's top bits), and with
    its participants when every one of them is lost: nobody is left to run
    its backward pass or release it. Removed from the registry only; a pass
    still running keeps its reference until it ends. */
static bool orphaned(dist_context_t *c, int lost)
{
    if ((int)((uint64_t)c->id >> 48) == lost && lost != zd_rpc_rank())
        return true;
    int *peers, n;
    if (zd__dist_context_peers(c, &peers, &n) < 0)
        return false;
    bool all_lost = n > 0;
    for (int i = 0; i < n && all_lost; i++)
        all_lost = peers[i] == zd_rpc_rank() || zd_rpc_peer_is_lost(peers[i]);
    free(peers);
    return all_lost;
}

int64_t zd__dist_context_release_lost(int lost)
{
    pthread_mutex_lock(&registry_lock);
    int64_t n = 0, cap = live_contexts;
    dist_context_t **all = malloc(sizeof *all * (size_t)(cap ? cap : 1));
    for (int b = 0; all && b < BUCKETS; b++)
        for (entry_t *e = buckets[b]; e && n < cap; e = e->next) {
            atomic_fetch_add(&e->ctx->refs, 1);
            all[n++] = e->ctx;
        }
    pthread_mutex_unlock(&registry_lock);
    if (!all)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_autograd: out of memory");
    int64_t released = 0;
    for (int64_t i = 0; i < n; i++) {
        if (orphaned(all[i], lost)) {
            dist_context_t *c = zd__dist_context_remove(all[i]->id);
            released += c != NULL;
            zd__dist_context_unref(c); /* the registry's reference */
        }
        zd__dist_context_unref(all[i]);
    }
    free(all);
    return released;
}
