/* SPDX-License-Identifier: MIT */
/*  net.h: the sockets of one running agent, and the peers they reach
    (private to rpc/).

    Sockets. One ROUTER per process, bound: the I/O thread receives
    everything on it, and other threads answer on it (under router_lock)
    requests that came from a peer thread's zd_rpc_sync socket. One DEALER
    per peer (identity = our rank, see wire.h) sends to that peer's ROUTER:
    requests, and the replies to requests that came through the peer's
    shared socket. It never receives, so any thread may send on it while
    holding the peer's lock. A thread calling zd_rpc_sync has a DEALER of
    its own per peer (direct.c), sends its request there and reads the
    answer itself: no hand-off between our threads on that path.

    zd__net_t is embedded in the agent (agent/agent.h) rather than pointed
    to, so that a send reaches a peer's socket at the same cost as before
    the split. The files of net/ take it instead of the whole agent; where
    they must reach up (into membership, the calls, the served requests),
    they go through a hook the agent installs here (zd__net_up_t). */
#ifndef ZDIST_RPC_NET_H
#define ZDIST_RPC_NET_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <zmq.h>

#include <zdist/error.h>
#include <zdist/future.h>
#include <zdist/rpc.h>

#include "rpc/net/wire.h"
#include "rpc/value/codec.h"

typedef struct security security_t;

#define SECURITY_KEY_TXT 41 /* a Z85 CURVE key and its terminating 0 */

#define RPC_LAT_BUCKETS 448 /* 16 per octave from 1 us: up to 2^28 us */

typedef struct {
    pthread_mutex_t lock; /* guards the rest */
    int64_t count;
    double sum_us;
    uint32_t hist[RPC_LAT_BUCKETS];
} peer_latency_t;

/*  The latencies are made on a peer's first answered call: most pairs of
    ranks of a large world never call each other, and 1.8 kB per peer,
    zeroed and touched at init, made a rank of 512 fault in 1.2 MB. */
typedef struct {
    atomic_int_fast64_t calls_sent, calls_served, errors;
    atomic_int_fast64_t bytes_sent, bytes_received;
    atomic_int_fast64_t in_flight, serving;
    _Atomic(peer_latency_t *) lat; /* NULL until the first latency */
} peer_metrics_t;

typedef struct {
    char name[ZD_RPC_MAX_NAME + 1];
    int rank;
    char endpoint[ZD_RPC_MAX_ENDPOINT + 1];
    char key[SECURITY_KEY_TXT]; /* its CURVE public key (Z85), "" without CURVE */
    void *sock;                 /* DEALER to the peer's ROUTER */
    pthread_mutex_t lock;       /* serialises use of sock */
    void *monitor;              /* PAIR with sock's disconnect events (I/O thread) */
    atomic_bool lost;           /* the connection is down */
    int64_t fail_at_ns;         /* I/O thread: when to fail calls to it (0: no) */
    int64_t down_since_ns;      /* I/O thread: when the connection went down */
    _Atomic int64_t lost_at_ns; /* declared lost (peer_lost.c); 0: alive (again,
                                   once a restarted process rejoined: membership.c) */
    atomic_bool releasing;      /* what it held is being released (peer_lost.c) */
    atomic_bool unreached;      /* lost because it did not answer when this process
                                   joined a running world; alive again once its
                                   connection comes up (membership.c) */
    int64_t remake_at_ns;       /* I/O thread: make its socket again then (0: no),
                                   the peer having refused our key */
    atomic_int joins;           /* times it rejoined (membership.c: zd_rpc_peer_joins) */
    atomic_uint incarnation;    /* its process: one more at each rejoin, and at
                                   each socket made again after a refused key */
    atomic_uint losses;         /* at least one more each time it is declared lost, counted
                                   before it shows: an RRef it owned, made before,
                                   holds a value this process can no longer reach */
    bool reoffer;               /* I/O thread: offer shared memory once connected */
    unsigned up_incarnation;    /* I/O thread: 1 + the incarnation whose socket
                                   completed a handshake, 0: none; a socket made
                                   since never carried anything yet (io.c) */
    atomic_bool opened;         /* sock and monitor exist (set last: the I/O thread
                                   then polls the monitor, transport.c) */
    atomic_bool reached;        /* written under lock: a HELLO went through sock since it was
                                   made (a lazily connected world, transport.c) */
    bool offered;               /* under lock: shared memory was offered to it
                                   once reached (a lazily connected world) */
    peer_metrics_t m;
} peer_t;

/*  Lost for good here (not merely unreached): only its own rejoin brings
    it back, with a table of its own. */
static inline bool zd__peer_gone(peer_t *p)
{
    return atomic_load(&p->lost_at_ns) && !atomic_load(&p->unreached);
}

/*  A received message, validated: header h points into hm; frames (a buffer
    the reader reuses) hold n tensor frames; route is the routing id of an
    zd_rpc_sync socket, to answer on the same connection (route_len 0: answer
    through the shared socket). */
typedef struct {
    zmq_msg_t hm;
    rpc_wire_header_t h;
    rpc_frame_t *frames;
    int n, cap;
    int src;
    uint8_t route[RPC_WIRE_SYNC_ID_LEN];
    size_t route_len;
    uint64_t reject_id; /* a dropped request to answer with reject */
    char reject[512];
} inmsg_t;

/*  Releases m's tensor frames (a message nobody takes them from). */
static inline void zd__inmsg_release_frames(inmsg_t *m)
{
    for (int i = 0; i < m->n; i++)
        m->frames[i].release(m->frames[i].data, m->frames[i].release_arg);
}

/*  The way up from the sockets into the agent: what the I/O thread (io.c)
    and the receive filters (stream.c, shm.c) hand over, and the agent's
    periodic work, each by one indirect call instead of by name. The agent
    fills it (agent_new, agent.c) before anything can receive, and clears
    it when it is freed, after the I/O thread stopped and every thread left
    the sockets; an agent sets every field. Each gets arg (the agent).
    The fakes of the tests and fuzzers set what their filters call. */
typedef struct {
    void *arg;
    /* A valid message that is not the net's own (HELLO, SHM_*): answers,
       requests, RRef control messages. Consumes m's frames (not m->hm).
       I/O thread, once per message. */
    void (*dispatch)(void *arg, inmsg_t *m);
    /* Call id fails with text, if it waits for an answer from rank src (its
       answer was dropped on the way in). Any receiving thread. */
    void (*fail_answer)(void *arg, uint64_t id, int src, const char *text, zd_error_code_t code);
    /* The calls waiting for peer fail with text (its connection came back:
       they may have been lost on it). I/O thread. */
    void (*fail_peer)(void *arg, int peer, const char *text, zd_error_code_t code);
    /* Peer rank is lost for good, its connection down since since_ns.
       I/O thread. */
    void (*peer_lost)(void *arg, int rank, int64_t since_ns);
    /* The ticks (I/O thread), in this order around the streams' expiry:
       expire fails the calls whose deadline passed, tick does the rest
       (RRefs' placeholders, the shutdown barrier). Each returns when it
       is due next (INT64_MAX: nothing waits). */
    int64_t (*expire)(void *arg, int64_t now_ns);
    int64_t (*tick)(void *arg, int64_t now_ns);
} zd__net_up_t;

/*  How long a process joining a running world waits for members other than
    rank 0 to answer before it treats them as lost (transport.c). */
#define JOIN_PEER_WAIT_MS 2000

typedef struct zd__net {
    int rank, world;
    unsigned gen;                 /* distinguishes successive inits */
    bool lazy;                    /* peers are connected on first use (transport.c) */
    int handshake_ms;             /* receiving sockets' handshake limit (transport.c) */
    const char *name;             /* this process's name (the agent's) */
    int64_t heartbeat_ms;         /* see zd_rpc_options_t.heartbeat_ms; 0 = none */
    int64_t busy_poll_ns;         /* see zd_rpc_options_t.busy_poll_us */
    bool rejoined;                /* this process joined a running world */
    atomic_bool joined;           /* the init barrier is passed (or a rejoin done):
                                     from then on a peer down is lost (io.c) */
    atomic_bool closing;          /* no new calls: the agent shuts down */
    atomic_uint_fast64_t next_id; /* zd__net_new_id */
    atomic_bool peers_opened;     /* a peer's socket was made: the I/O thread polls
                                     its monitor from now on */
    atomic_bool renew_pending;    /* a peer's sockets await renewal (membership.c) */

    void *ctx; /* ZeroMQ context */
    void *router;
    int router_fd;               /* its ZMQ_FD, polled by the I/O thread */
    pthread_mutex_t router_lock; /* the I/O thread receives, pool threads answer */
    pthread_mutex_t sync_lock;   /* threads' zd_rpc_sync sockets (direct.c) */
    struct sync_set *sync_sets;
    atomic_int next_slot;
    int wake_fd;   /* eventfd that wakes the I/O thread */
    peer_t *peers; /* world entries */

    pthread_t io_thread;
    bool io_started;
    atomic_bool io_stop;
    atomic_int io_poll_waiters; /* threads in zd__poll_future */
    atomic_bool io_asleep;      /* the I/O thread sleeps in zmq_poll */
    _Atomic int64_t io_wake_ns; /* when it wakes by itself next (io.c) */
    /* The hook by which the I/O thread makes a restarted peer's sockets
       anew without calling up into world/: while renew_pending is set,
       each pass calls io_renew(io_renew_arg), true when a peer's sockets
       changed. membership.c installs it before the I/O thread starts
       (zd__membership_new) and clears it once the thread is gone
       (zd__membership_free); NULL: nothing to renew. */
    bool (*io_renew)(void *arg);
    void *io_renew_arg;
    /* The same for a peer's connection coming up (its handshake done):
       io_reached(io_reached_arg, rank) lets membership.c count a peer
       unreached at a rejoin as alive again. Installed and cleared with
       io_renew; NULL: nobody to tell. */
    void (*io_reached)(void *arg, int rank);
    void *io_reached_arg;
    /* And for a member that did not answer when this process joined a
       running world (zd__transport_connect, not the I/O thread):
       join_unreached(io_reached_arg, rank) counts it lost until its
       connection comes up. Installed and cleared with io_reached; NULL:
       nobody to tell. */
    void (*join_unreached)(void *arg, int rank);

    zd__net_up_t up; /* the way up into the agent */

    security_t *sec; /* keys and the ZAP handler (security.h) */
} zd__net_t;

/*  A fresh id: rank << 48 | counter. */
static inline uint64_t zd__net_new_id(zd__net_t *n)
{
    uint64_t c = atomic_fetch_add(&n->next_id, 1) & ((UINT64_C(1) << 48) - 1);
    return (uint64_t)n->rank << 48 | c;
}

/*  ---- poll.c: the clock, threads' roles, the busy-poll policy (why: the
    top of poll.c) ---- */

/*  Monotonic clock in ns (zd__now_ns, core/clock.h), a function of its own
    so that the fuzz targets can stand in for the agent's clock. */
int64_t zd__net_now_ns(void);

/*  Roles of threads, for guards and for the pool's compensation. */
typedef enum { ROLE_USER = 0, ROLE_IO = 1, ROLE_POOL = 2 } thread_role_t;
thread_role_t zd__net_thread_role(void);
void zd__net_set_thread_role(thread_role_t role);

/*  The running agent's busy-poll time in ns (0 when not running), and its
    setter (init and shutdown). */
int64_t zd__poll_busy_ns(void);
void zd__poll_set_busy_ns(int64_t ns);

/*  The right to busy-poll, for one thread of the process at a time.
    Returns the time to poll in ns, or 0 (polling off, or another thread
    polls); after a non-zero answer, zd__poll_end gives it back. */
int64_t zd__poll_begin(void);
void zd__poll_end(void);

/*  Polls zd_future_done(f) for up to the busy-poll time (at most max_ns;
    not at all on the I/O thread), yielding the CPU between looks, with
    the I/O thread polling too when calls_in_flight (the agent's calls
    not answered yet); true once it holds. Measured (bench_dist, medians
    of 8 interleaved runs): a 10x10 forward + distributed backward 299 ->
    237 us. */
bool zd__poll_future(zd__net_t *n, zd_future_t *f, int64_t max_ns, bool calls_in_flight);

/*  True while some thread waits in zd__poll_future: the I/O thread then
    polls instead of sleeping (it sets io_asleep around its sleeps). */
bool zd__poll_io_wanted(zd__net_t *n);

/*  ---- direct.c: each thread's zd_rpc_sync sockets, and what every
    socket that receives from peers is set to ---- */

/*  The largest frame a receiving socket accepts (ZMQ_MAXMSGSIZE, set by
    zd__net_set_limits): a header with the longest name, hook metadata
    and value metadata, plus a margin. Tensor frames (at most RPC_STREAM_OVER
    bytes, larger ones are streamed) and stream pieces (at most
    RPC_WIRE_MAX_CHUNK) are smaller. A larger frame makes libzmq close the
    connection before it allocates the frame. */
#define RPC_MAX_FRAME                                                                              \
    (RPC_WIRE_FIXED + RPC_WIRE_MAX_FN + RPC_WIRE_MAX_EXTRA + RPC_CODEC_MAX_META + ((size_t)1 << 20))
/*  Messages a receiving socket queues per connection before libzmq stops
    reading that connection (ZMQ_RCVHWM). Inbound, a full queue is
    backpressure (the sender's queue and TCP fill up), not loss, so a
    stream of a thousand pieces still arrives whole, only paced. */
#define RPC_RCVHWM 1000
/*  A connection must finish its ZMTP (or CURVE) handshake within this; in
    a world of more processes than ZDIST_RPC_EAGER_MAX, connected on first
    use, within RPC_HANDSHAKE_CROWDED_MS: there hundreds of processes may
    share a host's cores, and a CURVE handshake, four messages and the ZAP
    handler on two processes each waiting for a core, took longer than 5 s
    between 256 processes on 2 cores (test_world_scale_netns). */
#define RPC_HANDSHAKE_MS         5000
#define RPC_HANDSHAKE_CROWDED_MS 30000

/*  Sets the limits of a socket that receives from peers. */
void zd__net_set_limits(void *sock, int handshake_ms);

/*  Sets ZMQ_IPV6 on sock when endpoint is an IPv6 one: before connecting. */
void zd__net_use_ipv6(void *sock, const char *endpoint);

/*  The calling thread's socket to peer (made on first use) and its wake-up
    eventfd; NULL when none can be made (use the shared path). */
void *zd__direct_socket(zd__net_t *n, int peer, int *wake_fd);
/*  Teardown: closes every thread's sockets. */
void zd__direct_close_all(zd__net_t *n);
/*  How a thread that exits reaches the running agent's sockets, to close
    its own (NULL: none runs) and let them go again; installed by the
    agent at init, before any thread can make a socket. */
void zd__direct_hooks(zd__net_t *(*acquire)(void), void (*release)(zd__net_t *n));

/*  ---- transport.c: the sockets and sending ---- */

/*  Creates the context and the ROUTER, and binds it on listen_ip (port
    chosen by the OS), filling n->peers[n->rank].endpoint; listen_ip NULL
    leaves the binding to zd__transport_listen (rank 0 binds once it knows
    where its peers are, rendezvous.c). */
int zd__transport_bind(zd__net_t *n, const char *listen_ip);

/*  Binds the ROUTER once more, on ip (IPv4 or IPv6 literal, port chosen by
    the OS), and writes the endpoint ("tcp://[fd00::1]:41000") to endpoint.
    0, or -1 naming the address. */
int zd__transport_listen(zd__net_t *n, const char *ip, char *endpoint, size_t size);

/*  Creates and connects the DEALERs, makes sure the peers needed are
    reachable (HELLO) before deadline_ns, then starts the I/O thread. A world
    of more than ZDIST_RPC_EAGER_MAX processes (16) is connected lazily:
    rank 0 to everyone, the others to rank 0 and themselves, and each to the
    others on first use (zd__transport_reach). */
int zd__transport_connect(zd__net_t *n, int64_t deadline_ns);
/*  In a lazily connected world (n->lazy), makes the shared socket to rank
    dst if there is none and waits until it is connected, up to timeout_ms
    (the call's; 0: none) and at most 60 s; at once when it is, or in a
    world connected at init. 0, or -1 ("unreachable"). */
int zd__transport_reach(zd__net_t *n, int dst, int64_t timeout_ms);
/*  Whether rank dst may be sent to without waiting: always in a world
    connected at init; once reached in one connected lazily. */
bool zd__transport_reached(zd__net_t *n, int dst);
/*  I/O thread, a lazily connected world: a message came from rank src on
    its shared socket; starts the connection back (no wait), so that what
    answers it finds it made. */
void zd__transport_open_back(zd__net_t *n, int src);
/*  I/O thread: closes the peer's DEALER and monitor and makes them anew for
    its endpoint and key (a restarted process, membership.c). 0, or -1 (the
    peer then has no socket: sends to it fail). */
int zd__transport_renew_peer(zd__net_t *n, peer_t *p);

/*  Sends h (src, dst and sizes filled in here) and the tensors, zero-copy,
    to rank dst. Any thread. 0, or -1 ("peer unreachable"). */
int zd__transport_send(zd__net_t *n, int dst, rpc_wire_header_t *h, zd_tensor_t *const *tensors,
                       int n_tensors);

/*  Answers through route (a zd_rpc_sync socket of rank dst) when route_len,
    else through the shared socket. */
int zd__transport_send_routed(zd__net_t *n, int dst, const uint8_t *route, size_t route_len,
                              rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors);
void zd__transport_answer_error(zd__net_t *n, const inmsg_t *m, uint64_t id, const char *text);

/*  Sends on a socket the calling thread owns (direct.c). */
int zd__transport_send_on(zd__net_t *n, void *sock, int dst, rpc_wire_header_t *h,
                          zd_tensor_t *const *tensors, int n_tensors);

/*  Stops the I/O thread (waiting up to wait_ms for it: -1, logged and left
    running, when it does not stop) and closes every socket and the
    context. */
int zd__transport_stop_io(zd__net_t *n, int64_t wait_ms);
void zd__transport_close(zd__net_t *n, bool graceful);

/*  ---- io.c: receiving, and the I/O thread ---- */

/*  Reads one message from sock without waiting: the ROUTER (expect_src < 0,
    under router_lock), or a thread's zd_rpc_sync socket connected to rank
    expect_src (answers only). Returns 1 for a valid message (dispatch it,
    then zd__transport_msg_done), 0 when none is there, -1 when one was dropped
    (logged, answered with an ERROR when it was a request). The pieces of
    streamed tensors are read and put together on the way (stream.h). */
int zd__transport_recv(zd__net_t *n, void *sock, int expect_src, inmsg_t *m);
void zd__transport_msg_done(inmsg_t *m);

/*  Fault injection for tests of the retries: the next count messages of
    wire type `type` that reach the I/O thread are dropped unseen, as if
    lost on the way. count 0 disarms it. Returns how many the previous
    call had left to drop. */
int zd__transport_drop_next(uint8_t type, int count);

/*  The I/O thread's body (arg: the zd__net_t). */
void *zd__transport_io_main(void *arg);

/*  Tells the I/O thread that something of its periodic work (a call's
    deadline, an RRef's expiry, a barrier round) is due at due_ns: it is
    woken when it would sleep past that. Any thread. */
void zd__io_due(zd__net_t *n, int64_t due_ns);

#endif
