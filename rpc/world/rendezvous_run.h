/* SPDX-License-Identifier: MIT */
/*  rendezvous_run.h: the rendezvous itself (rendezvous.c; private to
    rpc/): rank 0 hosts it, the others register with it, and membership
    builds its messages with the same functions. It takes the net (the
    peers' table, the context, the keys) and reaches membership, which the
    agent holds, through the hooks the agent passes in
    (zd__rendezvous_up_t). The messages: rendezvous.h. */
#ifndef ZDIST_RPC_RENDEZVOUS_RUN_H
#define ZDIST_RPC_RENDEZVOUS_RUN_H

#include <czmq.h>

#include "rpc/net/address.h"
#include "rpc/net/net.h"
#include "rpc/world/register.h"

#define RDV_MAX_BINDS 8 /* addresses rank 0 listens on, per socket */

/*  What the rendezvous learns that the agent keeps, each by one call up
    instead of by name; each gets arg. */
typedef struct {
    void *arg;
    /* Rank is gone from the running world this process joins: lost from
       the start. */
    void (*mark_lost)(void *arg, int rank);
    /* Rank 0, at the end of its rendezvous: keeps its socket (taken) and
       rank 0's agent endpoints, to answer processes that restart later. */
    void (*keep_desk)(void *arg, void *sock, char bound[][ZD_RPC_MAX_ENDPOINT + 1],
                      char bound_ip[][ZD_ADDR_MAX], int n_bound);
} zd__rendezvous_up_t;

/*  Registers with the master at addr:port (hosting it on rank 0) and fills
    n->peers[*].name/endpoint/key. n->name/rank/world are set, and our own
    endpoint in n->peers[n->rank], except on rank 0 when its ROUTER is not
    bound yet (empty endpoint): rank 0 then binds it on the addresses that
    route to the workers that registered (addr "": no master address, the
    rendezvous listens on every interface). 0, or -1. */
int zd__rendezvous_run(zd__net_t *n, const char *addr, int port, int64_t timeout_ms,
                       const zd__rendezvous_up_t *up);

/*  The table of the world as n->peers has it, with ep0 for rank 0 and,
    when status is not NULL, its status frame. */
zmsg_t *zd__rendezvous_table(zd__net_t *n, const char *ep0, const char *status);

/*  This process's registration, with status when not NULL. */
zmsg_t *zd__rendezvous_registration(zd__net_t *n, const char *status);

/*  A registration client (register.h) for this process, to rank 0's
    rendezvous at ep: its registrations say no status, and it has no
    deadline, no stop flag and no patience; the caller changes what it
    needs. Its arg is n. */
void zd__rendezvous_client(zd__net_t *n, const char *ep, reg_client_t *c);

#endif
