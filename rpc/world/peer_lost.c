/* SPDX-License-Identifier: MIT */
/*  peer_lost.c: peers that are gone.

    The I/O thread learns that a connection went down from the monitor of
    the peer's DEALER (io.c): at once when the process died (its kernel
    closed the socket), after heartbeat_ms when it is frozen or cut off
    (ZeroMQ's heartbeats time out). A grace later the peer is declared
    lost: its pending calls fail, new calls to it fail at once naming it and how long
    ago it went, the shutdown barrier stops counting it, and the owner
    releases what it held: its RRef forks (and the values nothing else
    holds), then whatever the modules (the hooks' on_peer_lost: distributed
    autograd's contexts) and the application (zd_rpc_register_peer_lost)
    keep for it. The release runs on a pool thread: it frees values and
    calls user code, neither of which belongs on the I/O thread. A process
    restarted under a lost rank may rejoin (membership.c), once the release
    is over; the callbacks of zd_rpc_register_peer_joined are here too.

    It takes the net, not the agent: what the agent holds for the peer (its
    calls, the calls it made here, its RRef forks, the pool, membership's
    news) is reached through the hooks the agent fills (peer_lost.h). */
#include "rpc/world/peer_lost.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/world/worker_info.h"

#define MAX_LISTENERS 8

/*  The application's callbacks for a kind of event: entries are only ever
    added, so they run without the lock held. */
typedef struct {
    struct {
        void (*fn)(void *arg, int peer, const char *name);
        void *arg;
    } e[MAX_LISTENERS];
    int n;
    pthread_mutex_t lock;
    const char *api;
} listeners_t;

static listeners_t g_lost = {.lock = PTHREAD_MUTEX_INITIALIZER, .api = "zd_rpc_register_peer_lost"};
static listeners_t g_joined = {.lock = PTHREAD_MUTEX_INITIALIZER,
                               .api = "zd_rpc_register_peer_joined"};

static int listeners_add(listeners_t *l, void (*fn)(void *, int, const char *), void *arg)
{
    if (!fn)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no function", l->api);
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < l->n; i++)
        if (l->e[i].fn == fn && l->e[i].arg == arg) {
            pthread_mutex_unlock(&l->lock);
            return 0;
        }
    if (l->n == MAX_LISTENERS) {
        pthread_mutex_unlock(&l->lock);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: already %d callbacks", l->api,
                                 MAX_LISTENERS);
    }
    l->e[l->n].fn = fn;
    l->e[l->n].arg = arg;
    l->n++;
    pthread_mutex_unlock(&l->lock);
    return 0;
}

static void listeners_run(listeners_t *l, int rank, const char *name)
{
    pthread_mutex_lock(&l->lock);
    int n = l->n;
    pthread_mutex_unlock(&l->lock);
    for (int i = 0; i < n; i++)
        l->e[i].fn(l->e[i].arg, rank, name);
}

int zd_rpc_register_peer_lost(zd_rpc_peer_lost_fn *fn, void *arg)
{
    return listeners_add(&g_lost, fn, arg);
}

int zd_rpc_register_peer_joined(zd_rpc_peer_joined_fn *fn, void *arg)
{
    return listeners_add(&g_joined, fn, arg);
}

void zd__peer_run_joined(const zd__net_t *n, int rank)
{
    listeners_run(&g_joined, rank, n->peers[rank].name);
}

bool zd__peer_lost(const zd__net_t *n, int rank, char *text, size_t size)
{
    if (rank < 0 || rank >= n->world)
        return false;
    int64_t at = atomic_load(&n->peers[rank].lost_at_ns);
    if (!at)
        return false;
    double ago = (double)(zd__net_now_ns() - at) / (double)ZD__NS_PER_S;
    if (text && size && atomic_load(&n->peers[rank].unreached))
        snprintf(text, size,
                 "peer \"%s\" (rank %d) not reached since this process joined the "
                 "running world %.1f s ago",
                 n->peers[rank].name, rank, ago);
    else if (text && size)
        snprintf(text, size, "peer \"%s\" (rank %d) lost %.1f s ago", n->peers[rank].name, rank,
                 ago);
    return true;
}

bool zd_rpc_peer_is_lost(int rank)
{
    zd__net_t *n = zd__world_try_acquire();
    bool lost = n && zd__peer_lost(n, rank, NULL, 0);
    zd__world_release(n);
    return lost;
}

typedef struct {
    zd__net_t *n;
    const zd__peer_lost_up_t *up;
    int rank;
} release_t;

static void release_peer(void *arg)
{
    release_t *r = arg;
    zd__net_t *n = r->n;
    const char *name = n->peers[r->rank].name;
    int cancelled = 0;
    int64_t forks = 0, freed = 0;
    char text[256];
    snprintf(text, sizeof text, "the caller, \"%s\" (rank %d), was lost", name, r->rank);
    r->up->release(r->up->arg, r->rank, text, &cancelled, &forks, &freed);
    listeners_run(&g_lost, r->rank, name);
    zd__log(ZD_LOG_WARN,
            "rpc: released what lost \"%s\" (rank %d) held: %lld RRef fork(s), "
            "%lld value(s) freed, %d call(s) no longer waited for",
            name, r->rank, (long long)forks, (long long)freed, cancelled);
    atomic_store(&n->peers[r->rank].releasing, false); /* it may rejoin (membership.c) */
    free(r);
}

/*  A job the pool drops unrun (it is shutting down). */
static void free_release(void *arg)
{
    release_t *r = arg;
    atomic_store(&r->n->peers[r->rank].releasing, false);
    free(r);
}

void zd__peer_declare_lost(zd__net_t *n, const zd__peer_lost_up_t *up, int rank, int64_t since_ns)
{
    peer_t *p = &n->peers[rank];
    int64_t expected = 0;
    if (rank == n->rank || atomic_load(&p->lost_at_ns))
        return;
    atomic_fetch_add(&p->losses, 1); /* before it shows (net.h) */
    if (!atomic_compare_exchange_strong(&p->lost_at_ns, &expected, since_ns ? since_ns : 1))
        return;
    atomic_store(&p->releasing, true);
    char text[256];
    zd__peer_lost(n, rank, text, sizeof text);
    zd__log(ZD_LOG_WARN, "rpc: %s (its connection to %s went down)", text, p->endpoint);
    up->lost(up->arg, rank, text);
    release_t *r = malloc(sizeof *r);
    if (!r) {
        atomic_store(&p->releasing, false);
        zd__log(ZD_LOG_ERROR, "rpc: out of memory: what lost rank %d held stays", rank);
        return;
    }
    r->n = n;
    r->up = up;
    r->rank = rank;
    if (up->submit(up->arg, release_peer, free_release, r) < 0) {
        atomic_store(&p->releasing, false);
        zd__log(ZD_LOG_WARN, "rpc: what lost rank %d held stays until shutdown", rank);
    }
}
