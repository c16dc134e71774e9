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
#include "rpc/net/net.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <zdist/error.h>
#include "rpc/net/security.h"

static void set_int(void *sock, int opt, int value)
{
    zmq_setsockopt(sock, opt, &value, sizeof value);
}

/*  What a peer can make a receiving socket hold (docs/rpc.md, "Limits"): no
    frame above RPC_MAX_FRAME, RPC_RCVHWM messages queued per connection, and
    a handshake within handshake_ms (net.h: RPC_HANDSHAKE_MS). libzmq counts the high-water mark at
    the last frame of a message and limits each frame, not the message: a
    multipart message that never ends is held whole inside libzmq until it
    does, so what bounds it is authentication (a stranger cannot connect),
    not these options. */
void zd__net_set_limits(void *sock, int handshake_ms)
{
    int64_t max = (int64_t)RPC_MAX_FRAME;
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max);
    set_int(sock, ZMQ_RCVHWM, RPC_RCVHWM);
    set_int(sock, ZMQ_HANDSHAKE_IVL, handshake_ms);
}

void zd__net_use_ipv6(void *sock, const char *endpoint)
{
    if (strncmp(endpoint, "tcp://[", 7) == 0)
        set_int(sock, ZMQ_IPV6, 1);
}

typedef struct sync_set {
    unsigned gen;
    int slot;
    int wake_fd;
    void **socks;   /* per peer, NULL until first used */
    unsigned *incs; /* per peer: the incarnation its socket reaches */
    int world;
    struct sync_set *next;
} sync_set_t;

static zd__net_t *(*_Atomic g_acquire)(void);
static void (*_Atomic g_release)(zd__net_t *n);

void zd__direct_hooks(zd__net_t *(*acquire)(void), void (*release)(zd__net_t *n))
{
    atomic_store(&g_acquire, acquire);
    atomic_store(&g_release, release);
}

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

/*  Thread exit: closes the set if its agent still runs (else shutdown did,
    and s must not even be read). */
static void set_destructor(void *arg)
{
    sync_set_t *s = arg;
    zd__net_t *n = atomic_load(&g_acquire)();
    if (n && n->gen == tls_gen && s == tls_set) {
        pthread_mutex_lock(&n->sync_lock);
        sync_set_t **pp = &n->sync_sets;
        while (*pp && *pp != s)
            pp = &(*pp)->next;
        bool mine = *pp == s;
        if (mine)
            *pp = s->next;
        pthread_mutex_unlock(&n->sync_lock);
        if (mine)
            set_free(s);
    }
    atomic_load (&g_release)(n);
}

static void make_key(void)
{
    pthread_key_create(&set_key, set_destructor);
}

static sync_set_t *set_get(zd__net_t *n)
{
    if (tls_set && tls_gen == n->gen)
        return tls_set;
    pthread_once(&key_once, make_key);
    int slot = atomic_fetch_add(&n->next_slot, 1);
    if (slot > 65535)
        return NULL; /* that many threads: the shared path still works */
    sync_set_t *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->gen = n->gen;
    s->slot = slot;
    s->world = n->world;
    s->socks = calloc((size_t)n->world, sizeof *s->socks);
    s->incs = calloc((size_t)n->world, sizeof *s->incs);
    s->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (!s->socks || !s->incs || s->wake_fd < 0) {
        s->wake_fd = s->wake_fd < 0 ? -1 : s->wake_fd;
        set_free(s);
        return NULL;
    }
    pthread_mutex_lock(&n->sync_lock);
    s->next = n->sync_sets;
    n->sync_sets = s;
    pthread_mutex_unlock(&n->sync_lock);
    tls_set = s;
    tls_gen = n->gen;
    pthread_setspecific(set_key, s);
    return s;
}

void *zd__direct_socket(zd__net_t *n, int peer, int *wake_fd)
{
    sync_set_t *s = set_get(n);
    if (!s)
        return NULL;
    *wake_fd = s->wake_fd;
    unsigned inc = atomic_load(&n->peers[peer].incarnation);
    if (s->socks[peer] && s->incs[peer] == inc)
        return s->socks[peer];
    if (s->socks[peer]) { /* it reaches a process that is gone: the peer rejoined */
        zmq_close(s->socks[peer]);
        s->socks[peer] = NULL;
    }
    void *sock = zmq_socket(n->ctx, ZMQ_DEALER);
    if (!sock)
        return NULL;
    uint8_t id[RPC_WIRE_SYNC_ID_LEN];
    zd__rpc_wire_sync_identity(n->rank, s->slot, id);
    int zero = 0;
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, sizeof id);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof zero);
    zd__net_set_limits(sock, n->handshake_ms); /* it receives answers: bounded like the ROUTER */
    /* Not ZMQ_IMMEDIATE: with it, an answer that arrived just before its
       sender closed the connection would be thrown away unread. A send to a
       peer that is gone just waits; the call's deadline or the peer's lost
       connection (seen on the shared socket) ends the wait. (libzmq drops
       a connection's unread messages at once when ZMQ_IMMEDIATE is set:
       session_base reconnect terminates the pipe without delay.) */
    zd__net_use_ipv6(sock, n->peers[peer].endpoint);
    if (zd__security_client(n, sock, peer) < 0) {
        zmq_close(sock);
        return NULL;
    }
    if (zmq_connect(sock, n->peers[peer].endpoint) < 0) {
        zmq_close(sock);
        return NULL;
    }
    s->socks[peer] = sock;
    s->incs[peer] = inc;
    return sock;
}

void zd__direct_close_all(zd__net_t *n)
{
    pthread_mutex_lock(&n->sync_lock);
    sync_set_t *s = n->sync_sets;
    n->sync_sets = NULL;
    pthread_mutex_unlock(&n->sync_lock);
    while (s) {
        sync_set_t *next = s->next;
        set_free(s);
        s = next;
    }
}
