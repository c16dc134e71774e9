/* SPDX-License-Identifier: MIT */
/*  peer_lost.h: peers that are gone (peer_lost.c; private to rpc/). It
    takes the net (the peers' table) and reaches what the agent holds for
    a lost peer (its calls, the calls it made here, its RRef forks, the
    pool, membership) through the hooks the agent fills
    (zd__peer_lost_up_t), never by name. */
#ifndef ZDIST_RPC_PEER_LOST_H
#define ZDIST_RPC_PEER_LOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/net/net.h"

/*  What a peer declared lost means above world/, each by one call up; the
    agent fills it when it is made (agent_new) and sets every field. Each
    gets arg (the agent). */
typedef struct {
    void *arg;
    /* Once per lost peer, on the thread that declares it: counts it among
       the lost, fails the calls waiting for it with text, and tells
       membership. */
    void (*lost)(void *arg, int rank, const char *text);
    /* Queues fn(job) on a pool thread; drop(job) runs instead if the pool
       stops first. 0, or -1 (drop has run). */
    int (*submit)(void *arg, void (*fn)(void *job), void (*drop)(void *job), void *job);
    /* On that pool thread: stops waiting for the calls rank made here
       (answered with text), drops the RRef forks it held and runs the
       modules' on_peer_lost; *cancelled, *forks and *freed (values freed)
       say how much. */
    void (*release)(void *arg, int rank, const char *text, int *cancelled, int64_t *forks,
                    int64_t *freed);
} zd__peer_lost_up_t;

/*  Peer rank is lost for good (its connection down since since_ns), from
    the I/O thread or membership's: fails its calls, then on a pool thread
    releases what it held and runs the hooks' and the application's
    callbacks. */
void zd__peer_declare_lost(zd__net_t *n, const zd__peer_lost_up_t *up, int rank, int64_t since_ns);

/*  True when rank was declared lost; text (may be NULL) gets
    'peer "NAME" (rank N) lost 3.1 s ago'. */
bool zd__peer_lost(const zd__net_t *n, int rank, char *text, size_t size);

/*  Runs the zd_rpc_register_peer_joined callbacks (membership.c). */
void zd__peer_run_joined(const zd__net_t *n, int rank);

#endif
