/* SPDX-License-Identifier: MIT */
/*  direct.c: every thread that calls zd_rpc_sync gets its own DEALER per peer.

    The answer to a request sent on such a socket comes back on the same
    connection (the callee answers through its ROUTER with the socket's
    routing id, 's' rank slot), and the waiting thread reads it itself: the
    round trip has no hand-off between our threads at all, like a plain
    REQ/REP exchange. Everything else (zd_rpc_async, RRef messages, answers to
    shared-socket requests) keeps going through the shared sockets and the
    I/O thread.

    The sockets of a thread live in a sync_set, registered in the agent so
    that shutdown can close them before the ZeroMQ context ends; a thread
    that exits closes its own (pthread key destructor). A thread's set
    belongs to one agent generation; after re-init it makes a new one. */
#include "rpc/agent/agent.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zdist/error.h>
#include "rpc/net/security.h"

typedef struct sync_set {
    unsigned gen;
    int slot;
    int wake_fd;
    void **socks;   /* per peer, NULL until first used */
    unsigned *incs; /* per peer: the incarnation its socket reaches */
    int world;
    struct sync_set *next;
} sync_set_t;

static __thread sync_set_t *tls_set;
static __thread unsigned tls_gen;
static pthread_key_t set_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

static void set_free(sync_set_t *s)
{
    for (int i = 0; s->socks && i < s->world; i++)
        if (s->socks[i])
            zmq_close(s->socks[i]);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    free(s->socks);
    free(s->incs);
    free(s);
}

/* Thread exit: closes the set if its agent still runs (else shutdown did,
   and s must not even be read). */
static void set_destructor(void *arg)
{
    sync_set_t *s = arg;
    agent_t *a = zd__agent_try_acquire();
    if (a && a->net.gen == tls_gen && s == tls_set) {
        pthread_mutex_lock(&a->net.sync_lock);
        sync_set_t **pp = &a->net.sync_sets;
        while (*pp && *pp != s)
            pp = &(*pp)->next;
        bool mine = *pp == s;
        if (mine)
            *pp = s->next;
        pthread_mutex_unlock(&a->net.sync_lock);
        if (mine)
            set_free(s);
    }
    zd__agent_release(a);
}

static void make_key(void)
{
    pthread_key_create(&set_key, set_destructor);
}

static sync_set_t *set_get(agent_t *a)
{
    if (tls_set && tls_gen == a->net.gen)
        return tls_set;
    pthread_once(&key_once, make_key);
    int slot = atomic_fetch_add(&a->net.next_slot, 1);
    if (slot > 65535)
        return NULL; /* that many threads: the shared path still works */
    sync_set_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->gen = a->net.gen;
    s->slot = slot;
    s->world = a->net.world;
    s->socks = calloc((size_t)a->net.world, sizeof *s->socks);
    s->incs = calloc((size_t)a->net.world, sizeof *s->incs);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->socks || !s->incs || s->wake_fd < 0) {
        s->wake_fd = s->wake_fd < 0 ? -1 : s->wake_fd;
        set_free(s);
        return NULL;
    }
    pthread_mutex_lock(&a->net.sync_lock);
    s->next = a->net.sync_sets;
    a->net.sync_sets = s;
    pthread_mutex_unlock(&a->net.sync_lock);
    tls_set = s;
    tls_gen = a->net.gen;
    pthread_setspecific(set_key, s);
    return s;
}

void *zd__direct_socket(agent_t *a, int peer, int *wake_fd)
{
    sync_set_t *s = set_get(a);
    if (!s)
        return NULL;
    *wake_fd = s->wake_fd;
    unsigned inc = atomic_load(&a->net.peers[peer].incarnation);
    if (s->socks[peer] && s->incs[peer] == inc)
        return s->socks[peer];
    if (s->socks[peer]) { /* it reaches a process that is gone: the peer rejoined */
        zmq_close(s->socks[peer]);
        s->socks[peer] = NULL;
    }
    void *sock = zmq_socket(a->net.ctx, ZMQ_DEALER);
    if (!sock)
        return NULL;
    uint8_t id[RPC_WIRE_SYNC_ID_LEN];
    zd__rpc_wire_sync_identity(a->net.rank, s->slot, id);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, sizeof id);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zd__transport_set_limits(sock); /* it receives answers: bounded like the ROUTER */
    /* Not ZMQ_IMMEDIATE: with it, an answer that arrived just before its
       sender closed the connection would be thrown away unread. A send to a
       peer that is gone just waits; the call's deadline or the peer's lost
       connection (seen on the shared socket) ends the wait. (libzmq drops
       a connection's unread messages at once when ZMQ_IMMEDIATE is set:
       session_base reconnect terminates the pipe without delay.) */
    zd__transport_use_ipv6(sock, a->net.peers[peer].endpoint);
    if (zd__security_client(&a->net, sock, peer) < 0) {
        zmq_close(sock);
        return NULL;
    }
    if (zmq_connect(sock, a->net.peers[peer].endpoint) < 0) {
        zmq_close(sock);
        return NULL;
    }
    s->socks[peer] = sock;
    s->incs[peer] = inc;
    return sock;
}

void zd__direct_close_all(agent_t *a)
{
    pthread_mutex_lock(&a->net.sync_lock);
    sync_set_t *s = a->net.sync_sets;
    a->net.sync_sets = NULL;
    pthread_mutex_unlock(&a->net.sync_lock);
    while (s) {
        sync_set_t *next = s->next;
        set_free(s);
        s = next;
    }
}
