/* SPDX-License-Identifier: MIT */
/*  register.h: the registration client (register.c; private to rpc/). A
    process registers with rank 0's rendezvous socket and reads its answer
    in one place, whether it joins the world at init (rendezvous.c) or is a
    member waiting for a restarted rank 0 (membership.c). The messages:
    rendezvous.h. */
#ifndef ZDIST_RPC_REGISTER_H
#define ZDIST_RPC_REGISTER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <czmq.h>

#include "rpc/world/rendezvous.h"

/*  A registration unanswered this long is said again: one that reached a
    rendezvous socket being closed (rank 0 of a previous world on the same
    port, a restarted rank 0's predecessor) is lost with it. Rank 0 takes a
    repeat on one connection as one. */
#define REG_RESEND_MS 2000
/*  After a "not yet" (the process this one replaces is not gone yet at
    rank 0), asked again this soon. */
#define REG_BUSY_RESEND_MS 500
/*  How often a client that can be stopped looks at its stop flag. */
#define REG_STOP_POLL_MS 200

typedef struct {
    void *ctx;            /* ZeroMQ context */
    const char *endpoint; /* rank 0's rendezvous (zd__reg_master_endpoint) */
    int world, rank;      /* who registers, to check the answer against */
    const char *name;
    bool curve; /* the world has a key: the timeout's advice says so */
    /* Makes the socket a CURVE client before it connects (NULL: no key).
       0, or -1 with the error set. */
    int (*secure)(void *arg, void *sock);
    /* This process's registration, made anew for every send (its status
       may change between two). NULL: out of memory. */
    zmsg_t *(*registration)(void *arg);
    void *arg;
    int64_t deadline;        /* zd__now_ns's clock; ZD__NEVER: none */
    const atomic_bool *stop; /* NULL, or gives up once set */
    /* An error answer is logged once and waited past, registering again,
       rather than failing (a member waiting for a restarted rank 0: the
       answer may come from a rank 0 that is not the new one). */
    bool patient;
} reg_client_t;

/*  The master's address as a numeric literal, and the endpoint to dial for
    addr:port. 0, or -1. */
int zd__reg_master_endpoint(const char *addr, int port, char *ep, size_t size);

/*  Registers (again every REG_RESEND_MS while unanswered) until rank 0
    answers with a table, read into table[0..world-1] with *running set
    when the world was running: 0. -1 with the error set on an error answer
    (unless patient), a stop, or the deadline (saying whether rank 0 was
    reached at all). */
int zd__reg_run(const reg_client_t *c, rdv_entry_t *table, bool *running);

#endif
