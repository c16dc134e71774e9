/* SPDX-License-Identifier: MIT */
/*  membership.h: processes that restart rejoin the running world
    (membership.c; private to rpc/). It takes the net and a membership_t of
    its own, and reaches the agent (its count of lost peers, rank 0's
    shutdown rounds, the pool, the calls) through the hooks the agent
    passes in (zd__membership_up_t), never by name. */
#ifndef ZDIST_RPC_MEMBERSHIP_H
#define ZDIST_RPC_MEMBERSHIP_H

#include <stdbool.h>
#include <stdint.h>

#include <czmq.h>

#include <zdist/future.h>
#include <zdist/rpc.h>
#include <zdist/value.h>

#include "rpc/net/address.h"
#include "rpc/net/net.h"
#include "rpc/world/peer_lost.h"
#include "rpc/world/register.h"
#include "rpc/world/rendezvous_run.h"

typedef struct membership membership_t;

/*  What membership does above world/, each by one call up; the agent sets
    every field. Each gets arg (the agent). */
typedef struct {
    void *arg;
    /* The count of peers declared lost, by delta (+1, -1). */
    void (*count_lost)(void *arg, int delta);
    /* Rank 0: rank counts in the shutdown rounds again, after its
       (skipped) init round. */
    void (*back_in_rounds)(void *arg, int rank);
    /* Rank 0: the world is leaving (shutdown's round 0 is complete). */
    bool (*ending)(void *arg);
    /* Queues fn(job) on a pool thread; drop(job) runs instead if the pool
       stops first. 0, or -1 (drop has run). */
    int (*submit)(void *arg, void (*fn)(void *job), void (*drop)(void *job), void *job);
    /* Calls fn on rank `to` with args (borrowed), an internal call (no
       hooks) with timeout_ms: its future (a new reference), or NULL. */
    zd_future_t *(*call)(void *arg, int to, const char *fn, const char *api, zd_value_t *args,
                         int64_t timeout_ms);
    /* Brackets a blocking wait on a pool thread (no-op on other threads). */
    void (*block_begin)(void);
    void (*block_end)(void);
} zd__membership_up_t;

/*  Before the rendezvous: the membership of n's world, remembering where
    the master is; up and lost_up are copied and pointed to, and must
    outlive it. Installs its hooks on n (io_renew, io_reached,
    join_unreached). NULL (error set) when out of memory. */
membership_t *zd__membership_new(zd__net_t *n, const zd__membership_up_t *up,
                                 const zd__peer_lost_up_t *lost_up, int64_t master_wait_ms,
                                 const char *master, int port);

/*  The rendezvous's hook (zd__rendezvous_up_t.keep_desk), rank 0: keeps
    its socket (taken) and rank 0's agent endpoints, to answer processes
    that restart later. */
void zd__membership_keep_desk(membership_t *mb, void *sock, char bound[][ZD_RPC_MAX_ENDPOINT + 1],
                              char bound_ip[][ZD_ADDR_MAX], int n_bound);

/*  After zd_rpc_init's last step: starts the thread that answers restarted
    processes (rank 0) or waits for a lost rank 0 (the others). 0, or -1. */
int zd__membership_start(membership_t *mb);

/*  Stops the thread (bounded) and closes rank 0's rendezvous socket; mb
    stays for the threads that may still look at it. Idempotent; NULL:
    nothing to stop. */
void zd__membership_stop(membership_t *mb);

/*  When the agent is freed (no thread left): stops mb, takes its hooks off
    the net, and frees it. NULL: nothing to free. */
void zd__membership_free(membership_t *mb);

/*  Rank was declared lost (peer_lost.c); rank 0 of a lazily connected
    world tells the other members ("__zd_lost"). mb NULL: nobody to tell. */
void zd__membership_peer_lost(membership_t *mb, int rank);

/*  From the start: rank is gone from the running world this process joins. */
void zd__membership_mark_lost(membership_t *mb, int rank);

/*  From the start: rank did not answer when this process joined a running
    world: lost (calls to it fail at once) until its connection comes up
    (the I/O thread's n->io_reached) or rank 0 announces it again. */
void zd__membership_mark_unreached(membership_t *mb, int rank);

/*  Points peer rank at a restarted process (endpoint, key; name, unless
    NULL, once what the old process held is released: the release logs the
    old name from the pool): waits, bounded, until the I/O thread has made
    its sockets anew; rank is alive again then. turn: rank 0's number for
    this return of rank (0: none), a number taken already changing nothing
    (an announcement made again, or late). Not on the I/O thread. 0, or -1. */
int zd__membership_renew(membership_t *mb, int rank, const char *name, const char *endpoint,
                         const char *key, int64_t turn);

/*  "__zd_member": rank 0 tells a member that a process restarted. */
zd_value_t *zd__membership_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  "__zd_lost": rank 0 of a lazily connected world tells a member that a
    peer was lost. */
zd_value_t *zd__membership_lost_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  zd__peer_run_joined, zd__peer_declare_lost: peer_lost.h; rendezvous.c's
    table, registration and client: rendezvous_run.h */

#endif
