/* SPDX-License-Identifier: MIT */
/*  membership.h: processes that restart rejoin the running world
    (membership.c; private to rpc/). */
#ifndef ZDIST_RPC_MEMBERSHIP_H
#define ZDIST_RPC_MEMBERSHIP_H

#include <czmq.h>

#include "rpc/net/address.h"
#include "rpc/world/register.h"
#include "rpc/world/rendezvous_run.h"
#include "rpc/agent/agent.h"

typedef struct membership membership_t;

/*  Before the rendezvous: a->mb, remembering where the master is. 0, or -1. */
int zd__membership_new(agent_t *a, const char *master, int port);

/*  The hooks zd__rendezvous_run reaches membership by (rendezvous_run.h):
    the ranks a running world lost, and rank 0's socket and agent
    endpoints, kept to answer processes that restart later. */
zd__rendezvous_up_t zd__membership_rendezvous_up(agent_t *a);

/*  After zd_rpc_init's last step: starts the thread that answers restarted
    processes (rank 0) or waits for a lost rank 0 (the others). 0, or -1. */
int zd__membership_start(agent_t *a);

/*  Stops the thread (bounded) and closes rank 0's rendezvous socket; a->mb
    stays for the threads that may still look at it. Idempotent. */
void zd__membership_stop(agent_t *a);

/*  When the agent is freed (no thread left): stops and frees a->mb. */
void zd__membership_free(agent_t *a);

/*  Rank was declared lost (peer_lost.c); rank 0 of a lazily connected
    world tells the other members ("__zd_lost"). */
void zd__membership_peer_lost(agent_t *a, int rank);

/*  From the start: rank is gone from the running world this process joins. */
void zd__membership_mark_lost(agent_t *a, int rank);

/*  From the start: rank did not answer when this process joined a running
    world: lost (calls to it fail at once) until its connection comes up
    (the I/O thread's a->net.io_reached) or rank 0 announces it again. */
void zd__membership_mark_unreached(agent_t *a, int rank);

/*  Points peer rank at a restarted process (endpoint, key; name, unless
    NULL, once what the old process held is released: the release logs the
    old name from the pool): waits, bounded, until the I/O thread has made
    its sockets anew; rank is alive again then. turn: rank 0's number for
    this return of rank (0: none), a number taken already changing nothing
    (an announcement made again, or late). Not on the I/O thread. 0, or -1. */
int zd__membership_renew(agent_t *a, int rank, const char *name, const char *endpoint,
                         const char *key, int64_t turn);

/*  "__zd_member": rank 0 tells a member that a process restarted. */
zd_value_t *zd__membership_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  "__zd_lost": rank 0 of a lazily connected world tells a member that a
    peer was lost. */
zd_value_t *zd__membership_lost_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  zd__peer_run_joined, zd__peer_declare_lost: rpc/world/peer_lost.h */

/*  rendezvous.c's table, registration and client: rpc/world/rendezvous_run.h */

#endif
