/* SPDX-License-Identifier: MIT */
/*  transport.c: the sockets and sending (receiving: io.c).

    Sending (any thread): the header frame is built in a ZeroMQ message,
    tensors follow as zmq_msg_init_data frames whose free callback drops the
    tensor reference, so tensor memory goes to the kernel without a copy.
    Tensors of more than RPC_STREAM_OVER bytes are streamed instead: an
    empty frame in the message, a stream table, then the data in pieces,
    messages of their own queued right behind it (wire.h, stream.h); the
    pieces point into the tensor too. Sends on the shared sockets never
    block: those DEALERs have
    ZMQ_IMMEDIATE set, so a peer without a live connection makes the send
    fail at once ("unreachable") instead of queueing forever. They never
    receive, which matters: with ZMQ_IMMEDIATE, messages that arrived but
    were not read yet are lost when the connection closes. */
#define _GNU_SOURCE /* pthread_timedjoin_np: bounded joins at shutdown */
#include "rpc/net/net.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/net/address.h"
#include "rpc/net/bufcache.h"
#include "rpc/value/copy.h"
#include "rpc/net/security.h"
#include "rpc/net/shm.h"
#include "rpc/net/stream.h"

/*  ---- setup ---- */

static void set_int(void *sock, int opt, int value)
{
    zmq_setsockopt(sock, opt, &value, sizeof value);
}

/*  Worlds of up to this many processes connect every pair at init (the
    cost is N^2 connections, and their heartbeats); larger ones connect on
    first use. $ZDIST_RPC_EAGER_MAX changes it (0: always on first use). */
#define EAGER_MAX_DEFAULT 16
/*  The longest ZMQ_SNDTIMEO set (an int of ms): about 11.6 days. */
#define SNDTIMEO_MAX_MS INT64_C(1000000000)
/*  Past this world size rank 0's libzmq runs two I/O threads. */
#define HUB_SPLIT_WORLD 64

static int eager_max(void)
{
    const char *e = getenv("ZDIST_RPC_EAGER_MAX");
    if (!e || !*e)
        return EAGER_MAX_DEFAULT;
    char *end;
    long v = strtol(e, &end, 10);
    return *end || v < 0 || v > 1000000 ? EAGER_MAX_DEFAULT : (int)v;
}

int zd__transport_bind(zd__net_t *n, const char *listen_ip)
{
    zd__rpc_bufcache_enable(true);
    zd__rpc_copy_enable(true);
    zd__shm_start(n);
    n->ctx = zmq_ctx_new();
    if (!n->ctx)
        return zd_error_set("cannot create a ZeroMQ context: %s", zmq_strerror(errno));
    zmq_ctx_set(n->ctx, ZMQ_BLOCKY, 0);
    /* Every thread that calls zd_rpc_sync has a socket per peer it calls: the
       descriptor limit is the real bound, not ZeroMQ's default of 1023. */
    zmq_ctx_set(n->ctx, ZMQ_MAX_SOCKETS, 16384);
    /* Rank 0 holds a connection from every rank and, in a crowded world,
       a handshake timer and a heartbeat timer on each; libzmq cancels a
       timer by walking its thread's list of them. With the connections
       shared by two I/O threads, a 512-rank world formed 8-12 % sooner
       (this change alone, 3 rounds alternated on 2 cores). */
    if (n->rank == 0 && n->world > HUB_SPLIT_WORLD)
        zmq_ctx_set(n->ctx, ZMQ_IO_THREADS, 2);
    if (zd__security_start(n) < 0)
        return -1;
    n->router = zmq_socket(n->ctx, ZMQ_ROUTER);
    if (!n->router)
        return zd_error_set("cannot create the receiving socket: %s", zmq_strerror(errno));
    set_int(n->router, ZMQ_LINGER, 0);
    set_int(n->router, ZMQ_RCVHWM, 0);
    /* A ROUTER drops what it cannot queue: a streamed answer is hundreds
       of messages, and none may be lost. */
    set_int(n->router, ZMQ_SNDHWM, 0);
    /* A connection with a routing id already taken replaces the old one
       (a peer that reconnects before its old connection is seen dead);
       only under CURVE, where connecting at all needs a key of the table. */
    set_int(n->router, ZMQ_ROUTER_HANDOVER, zd__security_curve(n) ? 1 : 0);
    if (zd__security_server(n, n->router) < 0)
        return -1;
    zd__security_watch(n, n->router, "the RPC socket");
    set_int(n->router, ZMQ_TCP_KEEPALIVE, 1);
    /* Every rank connects to rank 0 at once: past libzmq's backlog of 100
       the kernel dropped their SYNs, and each dropped one was sent again
       a second later (a world of 128 formed 0.8 s later for it). */
    set_int(n->router, ZMQ_BACKLOG, n->world > 100 ? n->world : 100);
    n->handshake_ms = n->world > eager_max() ? RPC_HANDSHAKE_CROWDED_MS : RPC_HANDSHAKE_MS;
    zd__net_set_limits(n->router, n->handshake_ms);
    if (listen_ip &&
        zd__transport_listen(n, listen_ip, n->peers[n->rank].endpoint,
                             sizeof n->peers[n->rank].endpoint) < 0)
        return -1;
    size_t len = sizeof n->router_fd;
    if (zmq_getsockopt(n->router, ZMQ_FD, &n->router_fd, &len) < 0)
        return zd_error_set("cannot read the socket's descriptor: %s", zmq_strerror(errno));
    n->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (n->wake_fd < 0)
        return zd_error_set("cannot create an eventfd: %s", strerror(errno));
    return 0;
}

int zd__transport_listen(zd__net_t *n, const char *ip, char *endpoint, size_t size)
{
    char ep[ZD_RPC_MAX_ENDPOINT + 1];
    zd__addr_endpoint(ip, "*", ep, sizeof ep);
    /* The option is read at bind time: on for an IPv6 address only, so
       that an IPv4 one stays a plain IPv4 socket. */
    set_int(n->router, ZMQ_IPV6, zd__addr_family(ip) == AF_INET6);
    int rc = zmq_bind(n->router, ep);
    int e = errno;
    set_int(n->router, ZMQ_IPV6, 0);
    if (rc < 0)
        return zd_error_set("cannot listen at %s: %s%s", ep, zmq_strerror(e),
                            e == EADDRNOTAVAIL ? " (not an address of this host)" : "");
    if (zmq_getsockopt(n->router, ZMQ_LAST_ENDPOINT, endpoint, &size) < 0)
        return zd_error_set("cannot read the bound endpoint: %s", zmq_strerror(errno));
    return 0;
}

/*  ZMTP heartbeats: a peer that does not answer a PING within timeout_ms is
    cut off (the monitor then reports the disconnection, io.c). Pings every
    sixth of it (5 s for the default 30 s), at least every 100 ms. A PING
    waits behind the message being sent, though: to a frozen peer whose
    buffers filled mid-message none is ever sent, and the connection would
    stay up forever. TCP_USER_TIMEOUT (ZMQ_TCP_MAXRT) cuts it off when data
    stays unacknowledged, or the window shut, that long. */
static void set_heartbeat(void *sock, int64_t timeout_ms)
{
    if (timeout_ms == 0) /* no limit: silence alone never loses a peer */
        return;
    int64_t ivl = timeout_ms / 6;
    set_int(sock, ZMQ_HEARTBEAT_IVL, (int)(ivl < 100 ? 100 : ivl));
    set_int(sock, ZMQ_HEARTBEAT_TIMEOUT, (int)timeout_ms);
    set_int(sock, ZMQ_TCP_MAXRT, (int)timeout_ms);
}

static int open_peer(zd__net_t *n, peer_t *p)
{
    p->sock = zmq_socket(n->ctx, ZMQ_DEALER);
    if (!p->sock)
        return zd_error_set("cannot create a socket for peer \"%s\": %s", p->name,
                            zmq_strerror(errno));
    uint8_t id[RPC_WIRE_ID_LEN];
    zd__rpc_wire_identity(n->rank, id);
    zmq_setsockopt(p->sock, ZMQ_ROUTING_ID, id, sizeof id);
    set_int(p->sock, ZMQ_LINGER, 0);
    set_int(p->sock, ZMQ_SNDHWM, 0);
    set_int(p->sock, ZMQ_IMMEDIATE, 1);
    set_int(p->sock, ZMQ_TCP_KEEPALIVE, 1);
    set_heartbeat(p->sock, n->heartbeat_ms);
    if (zd__security_client(n, p->sock, p->rank) < 0)
        return -1;
    char mon[96];
    snprintf(mon, sizeof mon, "inproc://zd-monitor-%u-%d-%u", n->gen, p->rank,
             atomic_load(&p->incarnation));
    if (zmq_socket_monitor(p->sock, mon,
                           ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0) {
        p->monitor = zmq_socket(n->ctx, ZMQ_PAIR);
        if (p->monitor && zmq_connect(p->monitor, mon) < 0) {
            zmq_close(p->monitor);
            p->monitor = NULL;
        }
    }
    zd__net_use_ipv6(p->sock, p->endpoint);
    if (zmq_connect(p->sock, p->endpoint) < 0)
        return zd_error_set("cannot connect to peer \"%s\" (rank %d) at %s: %s", p->name, p->rank,
                            p->endpoint, zmq_strerror(errno));
    zd__log(ZD_LOG_DEBUG, "rpc: connecting to \"%s\" (rank %d) at %s", p->name, p->rank,
            p->endpoint);
    /* The socket and its monitor are complete: the I/O thread may poll the
       monitor from now on (it reads p->monitor only once it sees this). */
    atomic_store(&p->opened, true);
    atomic_store(&n->peers_opened, true);
    return 0;
}

static void close_peer(peer_t *p, int linger_ms)
{
    atomic_store(&p->opened, false);
    atomic_store(&p->reached, false);
    if (p->sock) {
        zmq_socket_monitor(p->sock, NULL, 0);
        set_int(p->sock, ZMQ_LINGER, linger_ms);
        zmq_close(p->sock);
        p->sock = NULL;
    }
    if (p->monitor) {
        zmq_close(p->monitor);
        p->monitor = NULL;
    }
}

/*  The old connection leads to a process that is gone; the new one may be
    at another endpoint, with another key (set in p before). */
int zd__transport_renew_peer(zd__net_t *n, peer_t *p)
{
    pthread_mutex_lock(&p->lock);
    close_peer(p, 0);
    int rc = open_peer(n, p);
    if (rc < 0)
        close_peer(p, 0); /* a half-made socket: sends fail until it is made again */
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/*  A blocking send of a HELLO returns once the connection to p is up
    (ZMQ_IMMEDIATE), or fails at deadline_ns. Under p->lock. 0, or -1. */
static int hello_locked(zd__net_t *n, peer_t *p, int64_t deadline_ns)
{
    int64_t left = zd__ms_left(zd__net_now_ns(), deadline_ns);
    if (deadline_ns != ZD__NEVER && left < 1)
        left = 1;
    rpc_wire_header_t h = {.type = RPC_MSG_HELLO, .src = n->rank, .dst = p->rank};
    uint8_t buf[RPC_WIRE_FIXED];
    zd__rpc_wire_write(&h, buf);
    set_int(p->sock, ZMQ_SNDTIMEO, (int)(left > SNDTIMEO_MAX_MS ? SNDTIMEO_MAX_MS : left));
    int rc = zmq_send(p->sock, buf, sizeof buf, 0);
    set_int(p->sock, ZMQ_SNDTIMEO, -1);
    if (rc >= 0)
        atomic_store(&p->reached, true);
    return rc < 0 ? -1 : 0;
}

static int say_hello(zd__net_t *n, peer_t *p, int64_t deadline_ns)
{
    pthread_mutex_lock(&p->lock);
    int rc = p->sock ? hello_locked(n, p, deadline_ns) : -1;
    p->offered = rc == 0; /* zd__shm_offer_all offers to it */
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/*  How long the first send to a peer connected on first use waits for its
    connection: the call's own timeout, at most REACH_WAIT_MS (two crowded
    handshakes: on a host of hundreds of processes a CURVE handshake took
    more than 10 s); the I/O thread 1 s, since everything else waits for
    it meanwhile (what it sends, RRef messages, is retried). */
#define REACH_WAIT_MS    (2 * RPC_HANDSHAKE_CROWDED_MS)
#define IO_REACH_WAIT_MS 1000

int zd__transport_reach(zd__net_t *n, int dst, int64_t timeout_ms)
{
    if (!n->lazy || dst < 0 || dst >= n->world)
        return 0;
    peer_t *p = &n->peers[dst];
    if (atomic_load(&p->reached)) /* every send after the first: no lock */
        return 0;
    pthread_mutex_lock(&p->lock);
    int rc = 0;
    if (!atomic_load(&p->reached)) {
        int64_t wait = zd__net_thread_role() == ROLE_IO    ? IO_REACH_WAIT_MS
            : timeout_ms > 0 && timeout_ms < REACH_WAIT_MS ? timeout_ms
                                                           : REACH_WAIT_MS;
        if (!p->sock && (zd__peer_gone(p) || open_peer(n, p) < 0)) {
            close_peer(p, 0);
            rc = -1;
        } else if (atomic_load(&p->lost)) {
            rc = -1; /* its connection came up and went down: at once, as ZMQ_IMMEDIATE */
        } else {
            rc = hello_locked(n, p, zd__deadline_after(zd__net_now_ns(), wait));
        }
        if (rc == 0)
            zd__log(ZD_LOG_DEBUG, "rpc: connected to \"%s\" (rank %d) on first use", p->name, dst);
    }
    bool fresh = rc == 0 && !p->offered;
    p->offered = p->offered || rc == 0;
    pthread_mutex_unlock(&p->lock);
    /* A new pair: shared memory is offered as at init (a send itself, now
       one that finds the connection made). */
    if (fresh && n->io_started)
        zd__shm_offer(n, dst);
    return rc < 0
        ? zd_error_set_code(ZD_ERR_PEER, "peer \"%s\" (rank %d) unreachable (no connection to %s)",
                            p->name, dst, p->endpoint)
        : 0;
}

bool zd__transport_reached(zd__net_t *n, int dst)
{
    if (!n->lazy)
        return true;
    return atomic_load(&n->peers[dst].reached);
}

void zd__transport_open_back(zd__net_t *n, int src)
{
    peer_t *p = &n->peers[src];
    if (!n->lazy || atomic_load(&p->opened) || atomic_load(&p->lost_at_ns))
        return;
    /* Taken: another thread is making it now. */
    if (pthread_mutex_trylock(&p->lock) != 0)
        return;
    if (!p->sock && open_peer(n, p) < 0) {
        zd__log(ZD_LOG_DEBUG, "rpc: cannot connect back to rank %d: %s", src, zd_error_last());
        close_peer(p, 0);
    }
    pthread_mutex_unlock(&p->lock);
}

int zd__transport_connect(zd__net_t *n, int64_t deadline_ns)
{
    /* A world that is large connects on first use: rank 0 to everyone
       (it hosts the barrier and the membership, and sees who is lost),
       the others to rank 0 and themselves. A process joining a running
       world connects to all (below). */
    n->lazy = !n->rejoined && n->world > eager_max();
    for (int i = 0; i < n->world; i++) {
        peer_t *p = &n->peers[i];
        if (n->lazy && n->rank != 0 && i != 0 && i != n->rank)
            continue;
        /* A rank gone from the world a restarted rank 0 formed left no key
           to pin: it gets its socket when it rejoins (renew_peer). */
        if (zd__security_curve(n) && !p->key[0] && atomic_load(&p->lost_at_ns))
            continue;
        if (open_peer(n, p) < 0)
            return -1;
    }
    /* A blocking send with ZMQ_IMMEDIATE returns once the connection is up:
       after this loop every peer is known to be reachable. The I/O thread
       starts after it, so that nothing that arrived is dispatched before
       this process can answer its sender: a restarted process is called
       by the running world as soon as rank 0 announces it, and its answers
       (RRef acknowledgements among them) to a peer it had no connection to
       yet were lost, leaving that peer waiting for them. What arrives
       meanwhile waits in the receiving socket.
       A process joining a running world needs rank 0 only (and itself):
       any other member may be down at that moment, or restarting too and
       not yet told of this process's key, and waiting for each of them
       had two ranks restarting at once keep each other out for ever.
       Those get JOIN_PEER_WAIT_MS (the connections are made meanwhile,
       all at once); one that did not answer is lost to this process until
       its connection comes up or it rejoins (membership.c).
       A world connected lazily needs the same two (rank 0 then has its
       sockets to the others connecting meanwhile): the first send to any
       other waits for its connection (zd__transport_reach), so that an
       answer is not lost for want of one. */
    bool joining = n->rejoined;
    int64_t others_by = deadline_ns;
    for (int pass = 0; pass < (joining ? 2 : 1); pass++) {
        for (int i = 0; i < n->world; i++) {
            peer_t *p = &n->peers[i];
            bool needed = !joining || i == 0 || i == n->rank;
            if (n->lazy && i != 0 && i != n->rank)
                continue;
            if (atomic_load(&p->lost_at_ns) || (joining && needed != (pass == 0)))
                continue; /* gone from the running world this process joined */
            if (say_hello(n, p, needed ? deadline_ns : others_by) == 0)
                continue;
            if (needed)
                return zd_error_set_code(ZD_ERR_PEER, "peer \"%s\" (rank %d) at %s is unreachable",
                                         p->name, p->rank, p->endpoint);
            if (n->join_unreached)
                n->join_unreached(n->io_reached_arg, i);
        }
        int64_t by = zd__deadline_after(zd__net_now_ns(), JOIN_PEER_WAIT_MS);
        others_by = by < deadline_ns ? by : deadline_ns;
    }
    if (pthread_create(&n->io_thread, NULL, zd__transport_io_main, n) != 0)
        return zd_error_set("cannot start the I/O thread");
    n->io_started = true;
    zd__shm_offer_all(n);
    return 0;
}

int zd__transport_stop_io(zd__net_t *n, int64_t wait_ms)
{
    if (!n->io_started)
        return 0;
    atomic_store(&n->io_stop, true);
    uint64_t one = 1;
    if (write(n->wake_fd, &one, sizeof one) < 0) {
        /* The eventfd cannot be full; the tick wakes the thread anyway. */
    }
    /* Bounded: a future callback stuck in user code would hold it. */
    struct timespec until = zd__realtime_in(wait_ms);
    if (pthread_timedjoin_np(n->io_thread, NULL, &until) != 0) {
        zd__log(ZD_LOG_ERROR,
                "rpc: shutdown: the I/O thread did not stop within %lld ms (a "
                "future callback stuck in user code?)",
                (long long)wait_ms);
        pthread_detach(n->io_thread);
        n->io_started = false;
        return -1;
    }
    n->io_started = false;
    return 0;
}

void zd__transport_close(zd__net_t *n, bool graceful)
{
    zd__transport_stream_clear();
    /* Graceful: let the last answers reach their destination. */
    for (int i = 0; n->peers && i < n->world; i++)
        close_peer(&n->peers[i], graceful ? 2000 : 0);
    if (n->router) {
        /* Graceful: answers to zd_rpc_sync sockets leave through the ROUTER. */
        set_int(n->router, ZMQ_LINGER, graceful ? 2000 : 0);
        zmq_close(n->router);
    }
    n->router = NULL;
    if (n->wake_fd >= 0)
        close(n->wake_fd);
    n->wake_fd = -1;
    zd__security_free(n); /* its thread's sockets close before the context ends */
    if (n->ctx)
        zmq_ctx_term(n->ctx);
    n->ctx = NULL;
    zd__rpc_bufcache_enable(false);
    zd__shm_stop();
    zd__rpc_copy_enable(false);
}

/*  ---- sending ---- */

static void tensor_frame_free(void *data, void *hint)
{
    (void)data;
    zd_tensor_unref(hint);
}

/*  Sends one frame; on a full or missing pipe, lets the socket process its
    pending commands (a reconnection may be waiting) and tries once more. */
static int send_frame(void *sock, zmq_msg_t *m, int flags)
{
    if (zmq_msg_send(m, sock, flags | ZMQ_DONTWAIT) >= 0)
        return 0;
    if (errno != EAGAIN)
        return -1;
    int events;
    size_t len = sizeof events;
    zmq_getsockopt(sock, ZMQ_EVENTS, &events, &len);
    return zmq_msg_send(m, sock, flags | ZMQ_DONTWAIT) >= 0 ? 0 : -1;
}

/*  What send_message returns when memory ran out: nothing was sent, or a
    message its receiver refuses. */
#define SEND_NO_MEMORY (-2)

/*  Queues one tensor frame: len bytes at data, which belong to t (an empty
    frame when len is 0). Without memory for the frame, an empty one keeps
    the message whole (its receiver refuses it) and *oom is set. */
static int send_tensor_frame(void *sock, zd_tensor_t *t, void *data, size_t len, int flags,
                             bool *oom)
{
    zmq_msg_t m;
    if (len == 0)
        zmq_msg_init(&m);
    else if (zmq_msg_init_data(&m, data, len, tensor_frame_free, zd_tensor_ref(t)) < 0) {
        zd_tensor_unref(t);
        zmq_msg_init(&m); /* keep the frame count: the receiver rejects it */
        *oom = true;
    }
    if (send_frame(sock, &m, flags) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    return 0;
}

/*  A frame holding a copy of len bytes at data: 0, or -1 (out of memory). */
static int copy_msg(zmq_msg_t *m, const void *data, size_t len)
{
    if (zmq_msg_init_size(m, len) < 0)
        return -1;
    memcpy(zmq_msg_data(m), data, len);
    return 0;
}

/*  Queues m (taken over in every case). */
static int send_msg(void *sock, zmq_msg_t *m, int flags)
{
    if (send_frame(sock, m, flags) < 0) {
        zmq_msg_close(m);
        return -1;
    }
    return 0;
}

/*  The first frames of a message, made before any is queued: a message
    half queued cannot be taken back. The route (when route_len) in
    f[0], then a frame of `size` bytes for the header in f[1]. 0, or -1 (out
    of memory, nothing left to close). */
static int first_frames(zmq_msg_t f[2], const uint8_t *route, size_t route_len, size_t size)
{
    if (route_len && copy_msg(&f[0], route, route_len) < 0)
        return -1;
    if (zmq_msg_init_size(&f[1], size) < 0) {
        if (route_len)
            zmq_msg_close(&f[0]);
        return -1;
    }
    return 0;
}

/*  The stream table of a message whose tensors of more than `over` bytes
    are streamed (wire.h): a new frame's worth of bytes in *out (free()), or
    -1 (too large), or SEND_NO_MEMORY. */
static int stream_table(zd_tensor_t *const *tensors, int n_tensors, size_t over, uint8_t **out,
                        size_t *len, uint32_t *chunk)
{
    uint32_t count = 0;
    size_t largest = 0;
    rpc_wire_stream_t *e = malloc((size_t)n_tensors * sizeof *e);
    if (!e)
        return SEND_NO_MEMORY;
    for (int i = 0; i < n_tensors; i++) {
        size_t nb = zd_tensor_nbytes(tensors[i]);
        if (nb > over) {
            e[count].frame = (uint32_t)i;
            e[count++].bytes = nb;
            if (nb > largest)
                largest = nb;
        }
    }
    /* Pieces of RPC_STREAM_CHUNK, larger ones for huge tensors. */
    size_t c = RPC_STREAM_CHUNK;
    size_t least = largest / RPC_STREAM_MAX_PIECES + 1;
    if (least > c)
        c = (least + RPC_STREAM_CHUNK - 1) / RPC_STREAM_CHUNK * RPC_STREAM_CHUNK;
    if (c > RPC_WIRE_MAX_CHUNK || largest > RPC_WIRE_MAX_STREAM) {
        free(e);
        return -1;
    }
    *len = zd__rpc_wire_stream_table_size(count);
    *out = malloc(*len);
    if (*out)
        zd__rpc_wire_stream_table_write(e, count, (uint32_t)c, *out);
    free(e);
    *chunk = (uint32_t)c;
    return *out ? 0 : SEND_NO_MEMORY;
}

/*  Sends the pieces of a streamed message's tensors, each as a message
    [route] [header: REPLY, id, piece number] [data]. 0, -1, or
    SEND_NO_MEMORY (the pieces stop: the receiver drops the message). */
static int send_pieces(void *sock, const uint8_t *route, size_t route_len,
                       const rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors,
                       size_t over, size_t chunk)
{
    bool oom = false;
    rpc_wire_header_t ph = {.type = RPC_MSG_REPLY,
                            .flags = RPC_WIRE_F_CHUNK,
                            .src = h->src,
                            .dst = h->dst,
                            .id = h->id,
                            .n_tensors = 1};
    uint8_t head[RPC_WIRE_FIXED];
    for (int i = 0; i < n_tensors; i++) {
        size_t nb = zd_tensor_nbytes(tensors[i]);
        if (nb <= over)
            continue;
        char *data = zd_tensor_raw(tensors[i]);
        for (size_t at = 0; at < nb && !oom; at += chunk, ph.a++) {
            zmq_msg_t f[2];
            if (first_frames(f, route, route_len, sizeof head) < 0)
                return SEND_NO_MEMORY;
            zd__rpc_wire_write(&ph, zmq_msg_data(&f[1]));
            if ((route_len && send_msg(sock, &f[0], ZMQ_SNDMORE) < 0) ||
                send_msg(sock, &f[1], ZMQ_SNDMORE) < 0 ||
                send_tensor_frame(sock, tensors[i], data + at, nb - at < chunk ? nb - at : chunk, 0,
                                  &oom) < 0)
                return -1;
        }
    }
    return oom ? SEND_NO_MEMORY : 0;
}

/*  send_message for a message whose large tensors are in shared-memory
    segments (shm.h): their frames are empty, the segment table follows. */
static int64_t send_shm_message(void *sock, const uint8_t *route, size_t route_len,
                                rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors,
                                const rpc_shm_out_t *so)
{
    h->flags |= RPC_WIRE_F_SHM;
    h->n_tensors = (uint32_t)n_tensors + 1;
    size_t size = zd__rpc_wire_size(h);
    zmq_msg_t f[2], tab;
    if (first_frames(f, route, route_len, size) < 0)
        return SEND_NO_MEMORY;
    if (copy_msg(&tab, so->table, so->table_len) < 0) {
        if (route_len)
            zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        return SEND_NO_MEMORY;
    }
    zd__rpc_wire_write(h, zmq_msg_data(&f[1]));
    bool oom = false;
    int rc = 0;
    if (route_len && send_msg(sock, &f[0], ZMQ_SNDMORE) < 0) {
        zmq_msg_close(&f[1]);
        rc = -1;
    } else {
        rc = send_msg(sock, &f[1], ZMQ_SNDMORE);
    }
    int64_t sent = (int64_t)(size + so->table_len);
    for (int i = 0; i < n_tensors && rc == 0; i++) {
        size_t nb = zd_tensor_nbytes(tensors[i]);
        bool in_segment = zd__shm_in_segment(so, i);
        rc = send_tensor_frame(sock, tensors[i], zd_tensor_raw(tensors[i]), in_segment ? 0 : nb,
                               ZMQ_SNDMORE, &oom);
        sent += (int64_t)nb;
    }
    if (rc == 0)
        rc = send_msg(sock, &tab, 0);
    else
        zmq_msg_close(&tab);
    return rc < 0 ? -1 : oom ? SEND_NO_MEMORY : sent;
}

/*  Sends [route] header tensors... on sock (the caller owns or locked it);
    the tensors so placed in shared-memory segments travel there (shm.h),
    else those of more than RPC_STREAM_OVER bytes are streamed (wire.h).
    Returns the bytes sent, or -1, or SEND_NO_MEMORY. */
static int64_t send_message(void *sock, const uint8_t *route, size_t route_len,
                            rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors,
                            const rpc_shm_out_t *so)
{
    if (so->table)
        return send_shm_message(sock, route, route_len, h, tensors, n_tensors, so);
    const size_t over = RPC_STREAM_OVER;
    uint8_t *table = NULL;
    size_t table_len = 0;
    uint32_t chunk = 0;
    bool stream = false;
    for (int i = 0; i < n_tensors; i++)
        stream = stream || zd_tensor_nbytes(tensors[i]) > over;
    int rc = stream ? stream_table(tensors, n_tensors, over, &table, &table_len, &chunk) : 0;
    if (rc < 0)
        return rc;
    int n_frames = n_tensors + (stream ? 1 : 0);
    if (stream)
        h->flags |= RPC_WIRE_F_STREAMED;
    h->n_tensors = (uint32_t)n_frames;
    size_t size = zd__rpc_wire_size(h);
    zmq_msg_t f[2], tab;
    if (first_frames(f, route, route_len, size) < 0) {
        free(table);
        return SEND_NO_MEMORY;
    }
    if (stream && copy_msg(&tab, table, table_len) < 0) {
        if (route_len)
            zmq_msg_close(&f[0]);
        zmq_msg_close(&f[1]);
        free(table);
        return SEND_NO_MEMORY;
    }
    free(table);
    zd__rpc_wire_write(h, zmq_msg_data(&f[1]));
    if (route_len && send_msg(sock, &f[0], ZMQ_SNDMORE) < 0) {
        zmq_msg_close(&f[1]);
        rc = -1;
    } else {
        rc = send_msg(sock, &f[1], n_frames ? ZMQ_SNDMORE : 0);
    }
    /* Once the first frame is queued the rest of the message follows:
       ZeroMQ applies its limits per message, not per frame. */
    bool oom = false;
    int64_t sent = (int64_t)size;
    for (int i = 0; i < n_tensors && rc == 0; i++) {
        size_t nb = zd_tensor_nbytes(tensors[i]);
        int more = i + 1 < n_frames ? ZMQ_SNDMORE : 0;
        rc = send_tensor_frame(sock, tensors[i], zd_tensor_raw(tensors[i]), nb > over ? 0 : nb,
                               more, &oom);
        sent += (int64_t)nb;
    }
    if (stream && rc < 0)
        zmq_msg_close(&tab);
    else if (stream)
        rc = send_msg(sock, &tab, 0);
    /* A message with a frame missing is refused: its pieces need not follow. */
    if (stream && rc == 0 && !oom)
        rc = send_pieces(sock, route, route_len, h, tensors, n_tensors, over, chunk);
    return rc < 0 ? rc : oom ? SEND_NO_MEMORY : sent;
}

int zd__transport_send(zd__net_t *n, int dst, rpc_wire_header_t *h, zd_tensor_t *const *tensors,
                       int n_tensors)
{
    peer_t *p = &n->peers[dst];
    h->src = n->rank;
    h->dst = dst;
    rpc_shm_out_t so;
    if (zd__transport_reach(n, dst, h->timeout_ms) < 0)
        return -1;
    zd__shm_send_prepare(h, tensors, n_tensors, &so); /* the copy, before the lock */
    pthread_mutex_lock(&p->lock);
    int64_t bytes = p->sock ? send_message(p->sock, NULL, 0, h, tensors, n_tensors, &so) : -1;
    pthread_mutex_unlock(&p->lock);
    zd__shm_send_done(&so, bytes >= 0);
    if (bytes == SEND_NO_MEMORY)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "out of memory for a message to \"%s\" "
                                 "(rank %d)",
                                 p->name, dst);
    if (bytes < 0)
        return zd_error_set_code(ZD_ERR_PEER,
                                 "peer \"%s\" (rank %d) unreachable (no connection to %s)", p->name,
                                 dst, p->endpoint);
    atomic_fetch_add_explicit(&p->m.bytes_sent, bytes, memory_order_relaxed);
    return 0;
}

int zd__transport_send_routed(zd__net_t *n, int dst, const uint8_t *route, size_t route_len,
                              rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors)
{
    if (!route_len)
        return zd__transport_send(n, dst, h, tensors, n_tensors);
    peer_t *p = &n->peers[dst];
    h->src = n->rank;
    h->dst = dst;
    rpc_shm_out_t so;
    zd__shm_send_prepare(h, tensors, n_tensors, &so); /* the copy, before the lock */
    pthread_mutex_lock(&n->router_lock);
    int64_t bytes = send_message(n->router, route, route_len, h, tensors, n_tensors, &so);
    /* Sending may have taken the signal that something arrived: the I/O
       thread polls ZMQ_FD, which is edge-triggered. */
    int events = 0;
    size_t len = sizeof events;
    zmq_getsockopt(n->router, ZMQ_EVENTS, &events, &len);
    pthread_mutex_unlock(&n->router_lock);
    zd__shm_send_done(&so, bytes >= 0);
    if ((events & ZMQ_POLLIN) && zd__net_thread_role() != ROLE_IO) {
        uint64_t one = 1;
        if (write(n->wake_fd, &one, sizeof one) < 0) {
            /* cannot fail on an eventfd this small */
        }
    }
    if (bytes == SEND_NO_MEMORY)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "out of memory for an answer to \"%s\" "
                                 "(rank %d)",
                                 p->name, dst);
    if (bytes < 0)
        return zd_error_set("cannot answer \"%s\" (rank %d)", p->name, dst);
    atomic_fetch_add_explicit(&p->m.bytes_sent, bytes, memory_order_relaxed);
    return 0;
}

int zd__transport_send_on(zd__net_t *n, void *sock, int dst, rpc_wire_header_t *h,
                          zd_tensor_t *const *tensors, int n_tensors)
{
    peer_t *p = &n->peers[dst];
    h->src = n->rank;
    h->dst = dst;
    rpc_shm_out_t so;
    zd__shm_send_prepare(h, tensors, n_tensors, &so);
    int64_t bytes = send_message(sock, NULL, 0, h, tensors, n_tensors, &so);
    zd__shm_send_done(&so, bytes >= 0);
    if (bytes == SEND_NO_MEMORY)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "out of memory for a message to \"%s\" "
                                 "(rank %d)",
                                 p->name, dst);
    if (bytes < 0)
        return zd_error_set_code(ZD_ERR_PEER, "cannot send to \"%s\" (rank %d)", p->name, dst);
    atomic_fetch_add_explicit(&p->m.bytes_sent, bytes, memory_order_relaxed);
    return 0;
}

void zd__transport_answer_error(zd__net_t *n, const inmsg_t *m, uint64_t id, const char *text)
{
    size_t len = strlen(text);
    if (len == 0) {
        text = "unknown error";
        len = strlen(text);
    }
    if (len > 65536)
        len = 65536; /* an error text, not a payload */
    rpc_wire_header_t h = {
        .type = RPC_MSG_ERROR, .id = id, .meta = (const uint8_t *)text, .meta_len = len};
    if (zd__transport_send_routed(n, m->src, m->route, m->route_len, &h, NULL, 0) < 0)
        zd__log(ZD_LOG_WARN, "rpc: cannot answer request %llx of rank %d: %s",
                (unsigned long long)id, m->src, zd_error_last());
}
