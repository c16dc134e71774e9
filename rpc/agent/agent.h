/* SPDX-License-Identifier: MIT */
/*  agent.h: state shared by the files of the RPC agent (private to rpc/).

    Which file does what, and which room (value/ net/ world/ agent/) it
    lives in: rpc/README.md.
    Log lines go through zd__log (core/log_private.h, core/log.c); the agent
    sets the worker they name while it runs. */
#ifndef ZDIST_RPC_AGENT_H
#define ZDIST_RPC_AGENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <zmq.h>

#include "core/clock.h"
#include "rpc/value/codec.h"
#include "rpc/value/future_hook.h"
#include "core/log_private.h"
#include <zdist/rpc.h>
#include "rpc/net/net.h"
#include "rpc/net/wire.h"
#include "rpc/world/options.h"
#include "rpc/world/peer_lost.h"
#include "rpc/world/worker_info.h"

typedef struct pool pool_t;
typedef struct pending pending_t;
typedef struct rref_ctx rref_ctx_t;

typedef struct agent {
    zd__net_t net; /* its sockets and peers (net/net.h) */
    char name[ZD_RPC_MAX_NAME + 1];
    _Atomic int64_t timeout_ms; /* default call timeout, 0 = none (zd_rpc_set_timeout) */
    int n_threads;
    atomic_int n_lost;          /* peers declared lost */
    zd__peer_lost_up_t lost_up; /* peer_lost.c's way up (agent_new) */
    struct membership *mb;      /* restarted processes (world/membership.c) */
    atomic_bool ending;         /* rank 0: shutdown's round 0 is complete */

    pool_t *pool;

    pthread_mutex_t pending_lock;
    pending_t **buckets;
    size_t n_buckets;
    int64_t n_pending;
    int64_t earliest_ns;                /* no pending deadline before this */
    atomic_int_fast64_t user_in_flight; /* non-internal outgoing calls */
    atomic_int_fast64_t serving;        /* incoming calls not answered yet */

    rref_ctx_t *rrefs;
    rpc_rref_codec_t rref_codec;

    zd_rpc_hooks_t hooks;
    bool has_hooks;

    pthread_mutex_t barrier_lock; /* rank 0: the shutdown barrier */
    struct barrier_round *barrier;
    int64_t *barrier_last;                          /* rank 0: each rank's last round entered */
    bool barrier_done;                              /* rank 0: a round completed: the last one, */
    int64_t barrier_done_round, barrier_done_total; /* with its total */

    struct metrics_out *metrics_out; /* ZDIST_METRICS's writer, or NULL */
} agent_t;

/*  ---- agent.c: the running agent ---- */

/*  The running agent with one more user, or NULL ("RPC is not running"
    error). Every public entry point brackets its use of the agent with
    zd__agent_acquire/zd__agent_release, so shutdown can wait for them. */
agent_t *zd__agent_acquire(void);
void zd__agent_release(agent_t *a);
/*  Same without setting an error (for release paths). */
agent_t *zd__agent_try_acquire(void);
/*  The agent of generation gen, even while it shuts down (until its sockets
    close): for answers to calls it already took. NULL, no error. */
agent_t *zd__agent_acquire_gen(unsigned gen);

/*  A fresh id: rank << 48 | counter (zd__net_new_id). */
uint64_t zd__agent_new_id(agent_t *a);

/*  Effective timeout of a call, RRef fetch or RRef message: timeout_ms < 0
    (ZD_TIMEOUT_DEFAULT) gives the agent's default; 0 stays "none". */
int64_t zd__agent_timeout(agent_t *a, int64_t timeout_ms);

/*  options.c, launch_env.c: rpc/world/options.h */

/*  worker_info.c: rpc/world/worker_info.h */

/*  rendezvous.c: rpc/world/rendezvous_run.h */

/*  transport.c, io.c, stream.c, shm.c: rpc/net/net.h (and stream.h, shm.h) */

/*  ---- call.c: outgoing requests ---- */

typedef struct {
    uint8_t type;       /* CALL, REMOTE, RREF_FETCH or a control type */
    uint16_t flags;     /* RPC_WIRE_F_* */
    const char *fn;     /* CALL/REMOTE */
    const char *api;    /* "zd_rpc_sync", ... for error texts */
    zd_value_t *args;   /* CALL/REMOTE, borrowed, NULL = none */
    uint64_t a, b;      /* header fields */
    int64_t timeout_ms; /* < 0 default */
    int64_t wait_ms;    /* > 0: stop waiting for the answer after this
                                   long, though the peer is told timeout_ms
                                   (one attempt of a retried message) */
    bool hooked;        /* run the hooks (user-visible requests) */
    bool shared_only;   /* zd__call_sync: on the shared socket, after what
                                   was sent there (an RRef's fork request) */
    uint64_t *id_out;   /* if set, receives the request id */
    void *sock;         /* a zd_rpc_sync socket of the calling thread, or NULL */
    int wake_fd;        /* the caller's eventfd (with sock) */
} call_req_t;

/*  Sends a request and returns the future of its answer (a new reference),
    or NULL when it could not be sent (error set). */
zd_future_t *zd__call_start(agent_t *a, int to, const call_req_t *req);

/*  Sends a request and waits for its answer (not on the I/O thread):
    0 and *result (new reference), or -1 with the request's error. */
int zd__call_sync(const call_req_t *req, int to, zd_value_t **result);

/*  Handles a REPLY / ERROR (I/O thread); consumes frames. */
void zd__call_handle_answer(agent_t *a, const rpc_wire_header_t *h, rpc_frame_t *frames, int n);

/*  Fails the pending calls whose deadline has passed (I/O thread); returns
    the next deadline (INT64_MAX: none pending). */
int64_t zd__call_expire(agent_t *a, int64_t now_ns);

/*  Fails pending calls to peer (or every one with peer < 0) with text. */
void zd__call_fail_peer(agent_t *a, int peer, const char *text, zd_error_code_t code);
/*  Fails call id with text, if it is waiting for an answer from rank src
    (an answer that was lost on its way in). */
void zd__call_fail_answer(agent_t *a, uint64_t id, int src, const char *text, zd_error_code_t code);

/*  Fails request id now if still pending (a waiter that timed out). */
void zd__call_timeout_now(agent_t *a, uint64_t id);

/*  The agent's part in every zd_future_wait* (future_hook.h): busy-polls
    (zd__poll_future), and a pool thread lets the pool compensate
    while it sleeps. Installed by zd_rpc_init. */
extern const rpc_future_wait_hooks_t zd__call_wait_hooks;

/*  ---- serve.c: incoming requests ---- */

/*  Handles CALL / REMOTE / RREF_FETCH (I/O thread); consumes the frames. */
void zd__serve_request(agent_t *a, inmsg_t *m);

/*  Registers the agent's own functions (shutdown barrier). */
int zd__serve_register_internal(void);
/*  Calls one peer may have queued or running here at once; more are
    answered "busy" (ZDIST_RPC_MAX_CALLS_PER_PEER). */
int64_t zd__serve_max_calls_per_peer(void);

/*  ---- pool.c ---- */

typedef void(pool_fn)(void *arg);

pool_t *zd__pool_new(int n_threads);
/*  Queues fn(arg); drop(arg) runs instead if the pool is destroyed first.
    0, or -1 (out of memory, stopping: drop has run). */
int zd__pool_submit(pool_t *p, pool_fn *fn, pool_fn *drop, void *arg);
/*  Bracket a blocking wait on a pool thread (no-op on other threads). */
void zd__pool_block_begin(void);
void zd__pool_block_end(void);
/*  Threads alive and threads waiting for work, now. */
void zd__pool_stats(pool_t *p, int *threads, int *idle);
/*  Stops taking work, drops queued tasks, joins every thread, waiting up to
    wait_ms in all: 0, or -1 when handlers still run then (logged; the pool
    is left to them, not freed). */
int zd__pool_destroy(pool_t *p, int64_t wait_ms);

/*  ---- rref.c ---- */

int zd__rref_ctx_new(agent_t *a);
void zd__rref_ctx_free(agent_t *a);
/*  Drops every fork that rank holds of RRefs owned here (a lost peer),
    freeing the values nothing else holds. Returns the forks dropped;
    *freed (may be NULL) gets the values freed. */
int64_t zd__rref_release_holder(agent_t *a, int rank, int64_t *freed);
/*  Control messages from peers (I/O thread): answer with a REPLY or ERROR. */
void zd__rref_handle_control(agent_t *a, const inmsg_t *m);
/*  Periodic work: placeholder expiry (I/O thread); returns when it is due
    next (INT64_MAX: nothing waits). */
int64_t zd__rref_tick(agent_t *a, int64_t now_ns);

/*  ---- shutdown.c ---- */

int zd__shutdown_graceful(agent_t *a, int64_t timeout_ms);
/*  One round of the barrier hosted by rank 0: returns once every worker has
    entered round `round`, with *sum the total of their counts. Round -1 is
    init's. 0, or -1 (timeout, rank 0 unreachable, a worker lost). */
int zd__barrier_all(int64_t round, int64_t count, int64_t deadline_ns, const char *api,
                    int64_t *sum);
/*  Rank 0, I/O thread: fails barrier rounds that cannot complete; returns
    when to look again (INT64_MAX: no round open). */
int64_t zd__shutdown_tick(agent_t *a, int64_t now_ns);
/*  Teardown: fails the barrier rounds still open. */
void zd__shutdown_abort_barrier(agent_t *a);
/*  The barrier's handler on rank 0 (registered by zd__serve_register_internal). */
zd_future_t *zd__shutdown_barrier_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  ---- peers that are gone: rpc/world/peer_lost.h, and ---- */

/*  serve.c: stops waiting for the futures of the calls src made (async
    handlers, RRef fetches) and answers them with text; the futures stay
    their owners'. Returns how many. */
int zd__serve_cancel_peer(agent_t *a, int src, const char *text);

/*  ---- metrics.c ---- */

void zd__metrics_init(peer_metrics_t *m);
void zd__metrics_destroy(peer_metrics_t *m);
void zd__metrics_latency(peer_metrics_t *m, int64_t ns);
/*  The counters of one peer (peer < 0: all of them) into *out. */
void zd__metrics_collect(agent_t *a, int peer, zd_rpc_metrics_t *out);

/*  ---- metrics_out.c: ZDIST_METRICS ---- */

/*  When ZDIST_METRICS is set: creates the process's file (at init, before
    the rendezvous, so that a bad folder fails zd_rpc_init). 0, or -1. */
int zd__metrics_out_open(agent_t *a);
/*  Starts the periodic lines once the world is up. */
void zd__metrics_out_start(agent_t *a);
/*  Stops them, writes the last line (if started) and closes the file;
    harmless when nothing was opened. Before the agent is torn down. */
void zd__metrics_out_close(agent_t *a);
/*  Writes a line now, from the calling thread (tests: with an interval
    that keeps the writer thread from writing meanwhile). 0, or -1. */
int zd__metrics_out_line(void);

#endif
