/* SPDX-License-Identifier: MIT */
/*  peer_lost.c: peers that are gone for good.

    The I/O thread learns that a connection went down from the monitor of
    the peer's DEALER (io.c): at once when the process died (its kernel
    closed the socket), after heartbeat_ms when it is frozen or cut off
    (ZeroMQ's heartbeats time out). A grace later the peer is declared
    lost, for the rest of this agent's life (there is no rejoin): its
    pending calls fail, new calls to it fail at once naming it and how long
    ago it went, the shutdown barrier stops counting it, and the owner
    releases what it held: its RRef forks (and the values nothing else
    holds), then whatever the modules (the hooks' on_peer_lost: distributed
    autograd's contexts) and the application (zd_rpc_register_peer_lost)
    keep for it. The release runs on a pool thread: it frees values and
    calls user code, neither of which belongs on the I/O thread. */
#include "rpc/agent.h"

#include <stdio.h>
#include <stdlib.h>

#include <zdist/error.h>
#include "rpc/rref.h"

#define MAX_LISTENERS 8

static struct {
    zd_rpc_peer_lost_fn *fn;
    void *arg;
} g_listeners[MAX_LISTENERS];
static int g_n_listeners;
static pthread_mutex_t g_listeners_lock = PTHREAD_MUTEX_INITIALIZER;

int zd_rpc_register_peer_lost(zd_rpc_peer_lost_fn *fn, void *arg)
{
    if (!fn)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_register_peer_lost: no function");
    pthread_mutex_lock(&g_listeners_lock);
    for (int i = 0; i < g_n_listeners; i++)
        if (g_listeners[i].fn == fn && g_listeners[i].arg == arg) {
            pthread_mutex_unlock(&g_listeners_lock);
            return 0;
        }
    if (g_n_listeners == MAX_LISTENERS) {
        pthread_mutex_unlock(&g_listeners_lock);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_register_peer_lost: already %d callbacks",
                                 MAX_LISTENERS);
    }
    g_listeners[g_n_listeners].fn = fn;
    g_listeners[g_n_listeners].arg = arg;
    g_n_listeners++;
    pthread_mutex_unlock(&g_listeners_lock);
    return 0;
}

bool zd__peer_lost(agent_t *a, int rank, char *text, size_t size)
{
    if (rank < 0 || rank >= a->world)
        return false;
    int64_t at = atomic_load(&a->peers[rank].lost_at_ns);
    if (!at)
        return false;
    if (text && size)
        snprintf(text, size, "peer \"%s\" (rank %d) lost %.1f s ago", a->peers[rank].name, rank,
                 (double)(zd__agent_now_ns() - at) / 1e9);
    return true;
}

bool zd_rpc_peer_is_lost(int rank)
{
    agent_t *a = zd__agent_try_acquire();
    bool lost = a && zd__peer_lost(a, rank, NULL, 0);
    zd__agent_release(a);
    return lost;
}

typedef struct {
    agent_t *a;
    int rank;
} release_t;

static void release_peer(void *arg)
{
    release_t *r = arg;
    agent_t *a = r->a;
    const char *name = a->peers[r->rank].name;
    int64_t freed = 0;
    int64_t forks = zd__rref_release_holder(a, r->rank, &freed);
    if (a->has_hooks && a->hooks.on_peer_lost)
        a->hooks.on_peer_lost(a->hooks.arg, r->rank);
    pthread_mutex_lock(&g_listeners_lock);
    int n = g_n_listeners;
    pthread_mutex_unlock(&g_listeners_lock);
    for (int i = 0; i < n; i++)   /* entries are never removed: no lock while they run */
        g_listeners[i].fn(g_listeners[i].arg, r->rank, name);
    zd__log(ZD_LOG_WARN, "rpc: released what lost \"%s\" (rank %d) held: %lld RRef fork(s), "
            "%lld value(s) freed", name, r->rank, (long long)forks, (long long)freed);
    free(r);
}

void zd__peer_declare_lost(agent_t *a, int rank, int64_t since_ns)
{
    peer_t *p = &a->peers[rank];
    int64_t expected = 0;
    if (rank == a->rank || !atomic_compare_exchange_strong(&p->lost_at_ns, &expected,
                                                           since_ns ? since_ns : 1))
        return;
    atomic_fetch_add(&a->n_lost, 1);
    char text[256];
    zd__peer_lost(a, rank, text, sizeof text);
    zd__log(ZD_LOG_WARN, "rpc: %s (its connection to %s went down)", text, p->endpoint);
    zd__call_fail_peer(a, rank, text, ZD_ERR_PEER);
    release_t *r = malloc(sizeof *r);
    if (!r) {
        zd__log(ZD_LOG_ERROR, "rpc: out of memory: what lost rank %d held stays", rank);
        return;
    }
    r->a = a;
    r->rank = rank;
    if (zd__pool_submit(a->pool, release_peer, free, r) < 0)
        zd__log(ZD_LOG_WARN, "rpc: what lost rank %d held stays until shutdown", rank);
}
