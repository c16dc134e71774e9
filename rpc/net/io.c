/* SPDX-License-Identifier: MIT */
/*  io.c: receiving, and the I/O thread.

    Every frame after the header is kept in its own heap-allocated
    zmq_msg_t that becomes the storage of the decoded tensor (released when
    the tensor dies). Everything is validated before use: routing id, header
    (wire.h), sender and receiver ranks, frame count; the value decoder
    checks the rest. A bad message is logged and dropped, or answered with
    an ERROR when it names a request we can answer.

    The I/O thread polls the ROUTER's ZMQ_FD (not the socket: pool threads
    answer through the ROUTER under router_lock, and zmq_poll on the socket
    would touch it without the lock) and the wake-up eventfd. On its ticks
    it looks at the monitors of the shared sockets and expires calls,
    placeholders and barrier rounds (and once a second, stalled streams).
    What it hands to the agent (answers, requests, RRef messages, lost
    peers) and the agent's part of the ticks go through n->up (net.h),
    one indirect call each, never up by name.
    An idle thread sleeps until the next of these is due, at most
    IO_IDLE_MS: it used to wake every 20 ms, and the 256 waiting trainers
    of an rpc_ps world spent more of the 2 cores on that than the server
    had (perf: 62 % against 18 %). Another thread that arms something
    earlier (a call with a short timeout) wakes it (zd__io_due). */
#include "rpc/net/net.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/net/security.h"
#include "rpc/net/shm.h"
#include "rpc/net/stream.h"

#define IO_IDLE_MS 250
#define RECV_BATCH 256

static void frame_release(void *data, void *arg)
{
    (void)data;
    zmq_msg_close(arg);
    free(arg);
}

static void release_frames(rpc_frame_t *frames, int n)
{
    for (int i = 0; i < n; i++)
        frames[i].release(frames[i].data, frames[i].release_arg);
}

/*  Reads the rest of a multipart message from sock into m's frames (grown
    as needed); frames past RPC_CODEC_MAX_TENSORS are read and dropped, and
    the message is refused (logged naming the sender). libzmq hands a
    message over only once its last frame is in, so a message whose frames
    never end is held inside libzmq, beyond our reach (ZMQ_RCVHWM counts
    whole messages, ZMQ_MAXMSGSIZE single frames): what bounds it is that
    only an authenticated peer can connect (CURVE), not this reader. A
    ROUTER cannot drop one peer's connection either (libzmq has no call for
    it): the message is dropped, the connection stays.
    Returns the count, or -1 when too many arrived or (*oom) memory ran
    out (all released). */
static int recv_frames(void *sock, inmsg_t *m, int64_t *bytes, bool *oom)
{
    int n = 0;
    bool too_many = false;
    int more = 1;
    while (more) {
        zmq_msg_t *z = malloc(sizeof *z);
        zmq_msg_t scratch;
        *oom |= !z;
        if (!z || too_many)
            z = (free(z), &scratch);
        zmq_msg_init(z);
        if (zmq_msg_recv(z, sock, 0) < 0) {
            zmq_msg_close(z);
            if (z != &scratch)
                free(z);
            break;
        }
        more = zmq_msg_more(z);
        *bytes += (int64_t)zmq_msg_size(z);
        if (z == &scratch || n >= RPC_CODEC_MAX_TENSORS) {
            too_many = true;
            zmq_msg_close(z);
            if (z != &scratch)
                free(z);
            continue;
        }
        if (n == m->cap) {
            int ncap = m->cap ? 2 * m->cap : 8;
            rpc_frame_t *nf = realloc(m->frames, (size_t)ncap * sizeof *nf);
            if (!nf) {
                too_many = *oom = true;
                zmq_msg_close(z);
                free(z);
                continue;
            }
            m->frames = nf;
            m->cap = ncap;
        }
        m->frames[n++] = (rpc_frame_t){.data = zmq_msg_data(z),
                                       .size = zmq_msg_size(z),
                                       .release = frame_release,
                                       .release_arg = z};
    }
    if (too_many) {
        release_frames(m->frames, n);
        return -1;
    }
    return n;
}

static bool is_request(int type)
{
    return type == RPC_MSG_CALL || type == RPC_MSG_REMOTE || type == RPC_MSG_RREF_FETCH ||
        type == RPC_MSG_RREF_USER_DELETE || type == RPC_MSG_RREF_FORK_REQUEST ||
        type == RPC_MSG_RREF_CHILD_ACCEPT;
}

void zd__transport_msg_done(inmsg_t *m)
{
    zmq_msg_close(&m->hm);
}

/*  A message from a routing id that is no rank: libzmq also takes a
    connection that does not start with a ZMTP 3 greeting for a ZMTP 1.0
    peer, so noise sent at the port arrives as a stream of such messages.
    Logged once a second with the count, so that the flood does not use up
    the log's lines for everything else. I/O thread only. */
static void log_unknown_sender(void)
{
    static int64_t last_ns;
    static long dropped;
    dropped++;
    int64_t now = zd__net_now_ns();
    if (now - last_ns < ZD__NS_PER_S)
        return;
    zd__log(ZD_LOG_WARN,
            "rpc: dropped %ld message(s) from an unknown sender (routing id not "
            "a rank)",
            dropped);
    last_ns = now;
    dropped = 0;
}

static int recv_message(zd__net_t *n, void *sock, int expect_src, inmsg_t *m)
{
    bool routed = expect_src < 0;
    int src = expect_src;
    m->route_len = 0;
    m->reject_id = 0;
    m->n = 0;
    zmq_msg_init(&m->hm);
    if (routed) {
        zmq_msg_t id;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&id);
            return 0;
        }
        src = zd__rpc_wire_identity_rank(zmq_msg_data(&id), zmq_msg_size(&id));
        if (zmq_msg_size(&id) == RPC_WIRE_SYNC_ID_LEN && src >= 0) {
            memcpy(m->route, zmq_msg_data(&id), RPC_WIRE_SYNC_ID_LEN);
            m->route_len = RPC_WIRE_SYNC_ID_LEN;
        }
        bool more = zmq_msg_more(&id);
        zmq_msg_close(&id);
        if (!more) {
            zd__log(ZD_LOG_WARN, "rpc: dropped an empty message from routing id of rank %d", src);
            return -1;
        }
        if (zmq_msg_recv(&m->hm, sock, 0) < 0)
            return -1;
    } else if (zmq_msg_recv(&m->hm, sock, ZMQ_DONTWAIT) < 0) {
        return 0;
    }
    int64_t bytes = (int64_t)zmq_msg_size(&m->hm);
    bool oom = false;
    int nf = zmq_msg_more(&m->hm) ? recv_frames(sock, m, &bytes, &oom) : 0;
    if (src < 0 || src >= n->world) {
        log_unknown_sender();
        goto drop;
    }
    /* Under CURVE the routing id must be the rank whose key the connection
       authenticated with; not even an error goes back to a spoofer. */
    if (routed && !zd__security_sender_ok(n, &m->hm, src))
        goto drop;
    atomic_fetch_add_explicit(&n->peers[src].m.bytes_received, bytes, memory_order_relaxed);
    rpc_wire_header_t *h = &m->h;
    if (nf < 0 && !oom) {
        zd_error_set("more than %d tensor frames", RPC_CODEC_MAX_TENSORS);
    } else if (zd__rpc_wire_parse(zmq_msg_data(&m->hm), zmq_msg_size(&m->hm), h) < 0) {
        /* error set */
    } else if (h->src != src) {
        zd_error_set("header says rank %d but the connection is rank %d's", h->src, src);
    } else if (h->dst != n->rank) {
        zd_error_set("message for rank %d delivered to rank %d", h->dst, n->rank);
    } else if (nf < 0) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for its %u frames", h->n_tensors);
        /* An answer: its call fails now rather than at its timeout. */
        if (h->type == RPC_MSG_REPLY || h->type == RPC_MSG_ERROR)
            n->up.fail_answer(n->up.arg, h->id, src, zd_error_last(), ZD_ERR_NO_MEMORY);
    } else if (h->n_tensors != (uint32_t)nf) {
        zd_error_set("header announces %u tensor frames but %d arrived", h->n_tensors, nf);
    } else if (!routed && h->type != RPC_MSG_REPLY && h->type != RPC_MSG_ERROR) {
        zd_error_set("a %s where only answers come", zd__rpc_wire_type_name(h->type));
    } else {
        m->src = src;
        m->n = nf;
        return 1;
    }
    zd__log(ZD_LOG_WARN, "rpc: dropped a bad message from \"%s\" (rank %d): %s", n->peers[src].name,
            src, zd_error_last());
    /* Answer a request we can identify, so its caller does not wait for
       its timeout. */
    if (routed && zmq_msg_size(&m->hm) >= RPC_WIRE_FIXED) {
        const uint8_t *p = zmq_msg_data(&m->hm);
        uint64_t rid = 0;
        for (int i = 7; i >= 0; i--)
            rid = rid << 8 | p[16 + i];
        if (p[0] == 'Z' && p[1] == 'D' && is_request(p[3]) && rid != 0) {
            snprintf(m->reject, sizeof m->reject, "bad message: %s", zd_error_last());
            m->reject_id = rid;
            m->src = src;
        }
    }
drop:
    if (nf > 0)
        release_frames(m->frames, nf);
    zmq_msg_close(&m->hm);
    return -1;
}

int zd__transport_recv(zd__net_t *n, void *sock, int expect_src, inmsg_t *m)
{
    /* A streamed tensor comes in pieces, messages of their own (wire.h):
       read on until a message is complete or none is left. */
    int rc;
    while ((rc = recv_message(n, sock, expect_src, m)) > 0 &&
           (rc = zd__transport_stream_filter(n, sock, m)) == 0) {
    }
    if (rc > 0)
        rc = zd__shm_filter(n, sock, m);
    return rc;
}

/*  A peer declared lost stays lost (peer_lost.c): what it held here is
    released, so a request from it (a frozen process that woke up) is
    refused, and it learns why. One this process has not reached since it
    joined the world is refused too, until it is reached (membership.c):
    it is alive, but answers to it could not leave. */
static bool refuse_lost(zd__net_t *n, inmsg_t *m)
{
    peer_t *p = &n->peers[m->h.src];
    if (!atomic_load(&p->lost_at_ns))
        return false;
    release_frames(m->frames, m->n);
    if (is_request(m->h.type)) {
        char text[256];
        if (atomic_load(&p->unreached))
            snprintf(text, sizeof text,
                     "\"%s\" (rank %d) has not reached you since it joined "
                     "the running world: try again later",
                     n->name, n->rank);
        else
            snprintf(text, sizeof text,
                     "\"%s\" (rank %d) declared you lost and released what "
                     "you held: leave the world",
                     n->name, n->rank);
        zd__transport_answer_error(n, m, m->h.id, text);
    }
    return true;
}

static atomic_int drop_type = -1, drop_count;

int zd__transport_drop_next(uint8_t type, int count)
{
    int left = atomic_exchange(&drop_count, 0);
    atomic_store(&drop_type, type);
    atomic_store(&drop_count, count);
    return left;
}

static bool dropped_by_test(const inmsg_t *m)
{
    if (m->h.type != atomic_load_explicit(&drop_type, memory_order_relaxed))
        return false;
    int n = atomic_load(&drop_count);
    while (n > 0 && !atomic_compare_exchange_weak(&drop_count, &n, n - 1)) {
    }
    if (n <= 0)
        return false;
    zd__log(ZD_LOG_DEBUG, "rpc: dropped a %s from rank %d (fault injection)",
            zd__rpc_wire_type_name(m->h.type), m->h.src);
    return true;
}

/*  HELLO and the shared memory's handshake are the net's own; everything
    else goes up to the agent (n->up.dispatch): answers, requests, RRef
    control messages. */
static void dispatch(zd__net_t *n, inmsg_t *m)
{
    if (dropped_by_test(m)) {
        release_frames(m->frames, m->n);
        return;
    }
    if (refuse_lost(n, m))
        return;
    switch (m->h.type) {
    case RPC_MSG_HELLO:
        release_frames(m->frames, m->n);
        break;
    case RPC_MSG_SHM_OFFER:
    case RPC_MSG_SHM_ACCEPT:
    case RPC_MSG_SHM_SEGMENT:
    case RPC_MSG_SHM_MAPPED:
        zd__shm_handle(n, m);
        break;
    default:
        n->up.dispatch(n->up.arg, m);
        break;
    }
}

/*  The I/O thread receives from the ROUTER under router_lock, which routed
    senders take too; it polls the socket's ZMQ_FD rather than the socket,
    since zmq_poll on a socket would touch it without the lock. Returns
    whether a message was there. */
static bool recv_one(zd__net_t *n, inmsg_t *m)
{
    pthread_mutex_lock(&n->router_lock);
    int rc = zd__transport_recv(n, n->router, -1, m);
    pthread_mutex_unlock(&n->router_lock);
    if (rc > 0) {
        /* Its answer goes back on the shared socket: in a world connected
           on first use, the connection is started now, before the work. */
        if (!m->route_len)
            zd__transport_open_back(n, m->src);
        dispatch(n, m);
        zd__transport_msg_done(m);
    } else if (rc < 0 && m->reject_id) {
        zd__transport_answer_error(n, m, m->reject_id, m->reject);
    }
    return rc != 0;
}

/*  A peer's connection went down (or came back). Calls waiting for that
    peer fail LOST_GRACE_MS later rather than at their timeout: the grace
    lets answers already on their way (over the peer's own connection to
    us) arrive first. */
#define LOST_GRACE_MS 1000
/*  How long after a refusal of our key the socket to that peer is made again. */
#define REMAKE_MS 1000

/*  A connection that went down and came back may have taken requests with
    it (those libzmq had already taken from its queue), and their answers
    would never come: the caller would wait out its timeout, or forever
    with none. Which of them reached the peer cannot be known, so every
    call still waiting for this peer fails now, saying that it may have
    run. Answers that do come later find no call and are dropped. */
static void fail_interrupted(zd__net_t *n, peer_t *p)
{
    int64_t down_ms = (zd__net_now_ns() - p->down_since_ns) / ZD__NS_PER_MS;
    char text[192];
    snprintf(text, sizeof text,
             "the connection to it was down for %lld ms and came back; "
             "the request may or may not have run",
             (long long)down_ms);
    zd__log(ZD_LOG_WARN,
            "rpc: connection to \"%s\" (rank %d) came back after %lld ms down; "
            "calls waiting for it fail",
            p->name, p->rank, (long long)down_ms);
    n->up.fail_peer(n->up.arg, p->rank, text, ZD_ERR_PEER);
}

static void handle_monitor(zd__net_t *n, peer_t *p)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, p->monitor, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&m);
        return;
    }
    uint16_t event = 0;
    if (zmq_msg_size(&m) >= 2)
        memcpy(&event, zmq_msg_data(&m), 2);
    bool more = zmq_msg_more(&m);
    zmq_msg_close(&m);
    while (more) { /* the endpoint */
        zmq_msg_init(&m);
        more = zmq_msg_recv(&m, p->monitor, 0) >= 0 && zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    /* Before its first handshake a connection carried nothing (the sockets
       are ZMQ_IMMEDIATE: nothing is queued to a connection not yet made),
       so its failures interrupt no call; libzmq connects again. */
    unsigned up = atomic_load(&p->incarnation) + 1;
    bool was_up = p->up_incarnation == up;
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        p->remake_at_ns = 0;
        p->up_incarnation = up;
        if (n->io_reached) /* when it was not reached at the join */
            n->io_reached(n->io_reached_arg, p->rank);
        atomic_store(&p->lost, false);
        if (p->fail_at_ns && was_up) /* back within the grace, not declared lost */
            fail_interrupted(n, p);
        p->fail_at_ns = 0;
        if (p->reoffer) { /* a restarted peer: now a send cannot block */
            p->reoffer = false;
            zd__shm_offer(n, p->rank);
        }
    } else if (event == ZMQ_EVENT_DISCONNECTED && !was_up) {
        /* Its first handshake did not complete (the peer's socket gave up
           on it, on a crowded host, or the peer is frozen): the peer is
           lost only if none completes within the heartbeat's time, as a
           silent peer is, counted from the first failure. */
        zd__log(ZD_LOG_INFO,
                "rpc: connection to \"%s\" (rank %d) dropped before its handshake "
                "completed; connecting again",
                p->name, p->rank);
        if (!p->fail_at_ns && n->heartbeat_ms > 0) {
            p->down_since_ns = zd__net_now_ns();
            p->fail_at_ns = zd__deadline_after(p->down_since_ns, n->heartbeat_ms);
        }
    } else if (event == ZMQ_EVENT_DISCONNECTED) {
        if (!atomic_load(&n->closing))
            zd__log(ZD_LOG_INFO, "rpc: connection to \"%s\" (rank %d) went down", p->name, p->rank);
        atomic_store(&p->lost, true);
        p->down_since_ns = zd__net_now_ns();
        p->fail_at_ns = zd__deadline_after(p->down_since_ns, LOST_GRACE_MS);
    } else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && !zd__peer_gone(p)) {
        /* The peer does not know our key yet (it joined, or we did, and
           rank 0's word has not reached it): libzmq does not connect again
           after a refusal, so the socket is made anew a little later. */
        zd__log(ZD_LOG_INFO,
                "rpc: \"%s\" (rank %d) refused this process's key; connecting "
                "again in %d ms",
                p->name, p->rank, REMAKE_MS);
        p->remake_at_ns = zd__deadline_after(zd__net_now_ns(), REMAKE_MS);
    }
}

/*  Makes again the sockets of peers that refused our key (handle_monitor);
    true when one was made (the thread polls other monitors now). *due: the
    next one to make, if earlier. */
static bool remake_refused(zd__net_t *n, int64_t now, int64_t *due)
{
    bool made = false;
    for (int i = 0; i < n->world; i++) {
        peer_t *p = &n->peers[i];
        if (!p->remake_at_ns)
            continue;
        if (now < p->remake_at_ns) {
            *due = p->remake_at_ns < *due ? p->remake_at_ns : *due;
            continue;
        }
        p->remake_at_ns = 0;
        if (zd__peer_gone(p))
            continue; /* lost meanwhile: its rejoin makes it */
        /* Another monitor name, and zd_rpc_sync's sockets are made again too. */
        atomic_fetch_add(&p->incarnation, 1);
        if (zd__transport_renew_peer(n, p) < 0)
            zd__log(ZD_LOG_WARN, "rpc: cannot connect to \"%s\" (rank %d) again: %s", p->name,
                    p->rank, zd_error_last());
        made = true;
    }
    return made;
}

/*  The monitors are looked at on the ticks, at most every MONITOR_POLL_MS,
    not on every pass: they tell of connections going down or coming back,
    which waits for LOST_GRACE_MS anyway, and zmq_poll on a ZeroMQ socket
    costs a system call or more each (libzmq checks getpid for a fork):
    with every peer's monitor in each pass, getpid and poll were the
    largest CPU cost (perf) of the processes of a world of 65 gathering.
    items[0..count) are monitors, of the peers item_peer[0..count). */
#define MONITOR_POLL_MS 50

static void poll_monitors(zd__net_t *n, zmq_pollitem_t *items, const int *item_peer, int count)
{
    if (count < 1 || zmq_poll(items, count, 0) <= 0)
        return;
    for (int i = 0; i < count; i++)
        if (items[i].revents & ZMQ_POLLIN)
            handle_monitor(n, &n->peers[item_peer[i]]);
}

/*  Not while joining: on a host with far more processes than cores (65 on
    2), a handshake may outlast libzmq's limit and the connection drop and
    come back; the init barrier's deadline bounds that wait, and a peer
    still down once it is passed is declared lost then. Returns when the
    next peer is due to be declared lost (INT64_MAX: none). */
static int64_t fail_lost_peers(zd__net_t *n, int64_t now)
{
    int64_t due = INT64_MAX;
    if (!atomic_load(&n->joined))
        return zd__deadline_after(now, MONITOR_POLL_MS); /* not yet joined: soon again */
    for (int i = 0; i < n->world; i++) {
        peer_t *p = &n->peers[i];
        if (!p->fail_at_ns || atomic_load(&n->closing))
            continue;
        if (now < p->fail_at_ns) {
            due = p->fail_at_ns < due ? p->fail_at_ns : due;
            continue;
        }
        p->fail_at_ns = 0;
        n->up.peer_lost(n->up.arg, i, p->down_since_ns);
    }
    return due;
}

/*  What the thread waits on: the ROUTER, the wake-up, each peer's monitor. */
static int poll_items(zd__net_t *n, zmq_pollitem_t *items, int *item_peer)
{
    items[0] = (zmq_pollitem_t){NULL, n->router_fd, ZMQ_POLLIN, 0};
    items[1] = (zmq_pollitem_t){NULL, n->wake_fd, ZMQ_POLLIN, 0};
    int count = 2;
    /* opened before monitor: another thread may be making a peer's socket
       (transport.c), and sets opened once it is made. */
    for (int i = 0; i < n->world; i++)
        if (atomic_load(&n->peers[i].opened) && n->peers[i].monitor) {
            item_peer[count] = i;
            items[count++] = (zmq_pollitem_t){n->peers[i].monitor, 0, ZMQ_POLLIN, 0};
        }
    return count;
}

void zd__io_due(zd__net_t *n, int64_t due_ns)
{
    /* Sequentially consistent against the I/O thread's store before it
       looks at what is due (below): it sees what was armed, or this sees
       its wake time. */
    if (due_ns >= atomic_load(&n->io_wake_ns))
        return;
    uint64_t one = 1;
    if (write(n->wake_fd, &one, sizeof one) < 0) {
        /* cannot be full */
    }
}

/*  The ticks' work; returns how long the thread may sleep after it (ms). */
static int tick(zd__net_t *n, int64_t now, zmq_pollitem_t *items, int *item_peer, int *n_items,
                int64_t *next_monitor_poll, int64_t *next_stream_check, bool *look_again)
{
    /* The latest it would sleep to, before it looks (zd__io_due). */
    int64_t idle_until = zd__deadline_after(now, IO_IDLE_MS);
    atomic_store(&n->io_wake_ns, idle_until);
    if (now >= *next_monitor_poll) {
        *next_monitor_poll = zd__deadline_after(now, MONITOR_POLL_MS);
        poll_monitors(n, items + 2, item_peer + 2, *n_items - 2);
    }
    int64_t due = fail_lost_peers(n, now);
    if (remake_refused(n, now, &due)) {
        *n_items = poll_items(n, items, item_peer);
        *look_again = true;
    }
    int64_t t = n->up.expire(n->up.arg, now);
    due = t < due ? t : due;
    if (now >= *next_stream_check) {
        *next_stream_check = now + ZD__NS_PER_S;
        /* Answering on the ROUTER may have taken the edge of its
           ZMQ_FD: look at it once more before sleeping. */
        *look_again |= zd__transport_stream_expire(n, now) > 0;
    }
    due = *next_stream_check < due ? *next_stream_check : due;
    t = n->up.tick(n->up.arg, now);
    due = t < due ? t : due;
    if (due >= idle_until)
        return IO_IDLE_MS;
    atomic_store(&n->io_wake_ns, due);
    int64_t ms = (due - now + ZD__NS_PER_MS - 1) / ZD__NS_PER_MS;
    return ms < 1 ? 1 : (int)ms;
}

void *zd__transport_io_main(void *arg)
{
    zd__net_t *n = arg;
    zd__net_set_thread_role(ROLE_IO);
    int n_items = 2 + n->world;
    zmq_pollitem_t *items = calloc((size_t)n_items, sizeof *items);
    int *item_peer = calloc((size_t)n_items, sizeof *item_peer);
    inmsg_t msg = {0};
    if (!items || !item_peer) {
        zd__log(ZD_LOG_ERROR, "rpc: I/O thread: out of memory");
        free(items);
        free(item_peer);
        return NULL;
    }
    n_items = poll_items(n, items, item_peer);
    /* After traffic the thread keeps polling (timeout 0) for the busy-poll
       time before it sleeps again, and it polls while a thread waits for a
       future: see zd__poll_future. */
    int64_t poll_until = 0, next_tick = 0, next_stream_check = 0, next_monitor_poll = 0;
    bool polling = false, look_again = false;
    int sleep_ms = 0; /* until the first tick */
    while (!atomic_load(&n->io_stop)) {
        if (polling && zd__net_now_ns() >= poll_until) {
            zd__poll_end();
            polling = false;
        }
        bool may_sleep = !polling && !look_again;
        look_again = false;
        if (may_sleep) {
            atomic_store(&n->io_asleep, true); /* before the look: see zd__poll_future */
            if (zd__poll_io_wanted(n)) {
                atomic_store(&n->io_asleep, false);
                may_sleep = false;
            }
        }
        int rc = zmq_poll(items, 2, may_sleep ? sleep_ms : 0); /* monitors: on ticks */
        if (may_sleep) /* while polling the flag stays down: no store per look */
            atomic_store(&n->io_asleep, false);
        if (rc < 0 && errno != EINTR)
            break;
        if (rc > 0 && (items[1].revents & ZMQ_POLLIN)) {
            uint64_t v;
            if (read(n->wake_fd, &v, sizeof v) < 0) {
                /* spurious: nothing to drain */
            }
        }
        if (atomic_load(&n->io_stop))
            break;
        /* Sockets made on first use by other threads: their monitors. */
        if (atomic_load(&n->peers_opened) && atomic_exchange(&n->peers_opened, false))
            n_items = poll_items(n, items, item_peer);
        /* A restarted peer's new sockets (n->io_renew): the old monitor
           is closed, so its events of this pass are not read. */
        if (atomic_load(&n->renew_pending) && n->io_renew && n->io_renew(n->io_renew_arg)) {
            n_items = poll_items(n, items, item_peer);
            rc = 0;
            look_again = true;
        }
        int got = 0;
        while (got < RECV_BATCH && recv_one(n, &msg))
            got++;
        int64_t now = zd__net_now_ns();
        if ((got || rc > 0) && (polling || (polling = zd__poll_begin() > 0)))
            poll_until = now + n->busy_poll_ns;
        else if (now < next_tick) {
            sched_yield();
            sleep_ms = 1; /* woken for something due (zd__io_due): the tick is next */
            continue;
        } /* an empty look while polling: the ticks can wait */
        next_tick = now + ZD__NS_PER_MS;
        sleep_ms = tick(n, now, items, item_peer, &n_items, &next_monitor_poll, &next_stream_check,
                        &look_again);
    }
    if (polling)
        zd__poll_end();
    free(msg.frames);
    free(items);
    free(item_peer);
    return NULL;
}
