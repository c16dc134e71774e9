/* SPDX-License-Identifier: MIT */
/*  fault.h: a fault-injection hook, for tests only.

    With ZDIST_FAULT="RANK:PHASE:ACTION[:N]" in its environment, the
    process of rank RANK does ACTION the N-th time (default 1) it reaches
    the named point PHASE of an example (fault_point): kill (raise
    SIGKILL: a crash) or stop (raise SIGSTOP: frozen, with its sockets
    alive, until a SIGCONT). Phases: rendezvous, forward, backward, step,
    checkpoint, evaluation, shutdown. Tests use it to pin a fault to a
    phase without sleeping; without the variable it costs a load and a
    compare. */
#ifndef ZDIST_EXAMPLES_FAULT_H
#define ZDIST_EXAMPLES_FAULT_H

/*  Rank `rank` reached `phase`: does what ZDIST_FAULT says, if it names
    them, and returns otherwise. */
void fault_point(int rank, const char *phase);

#endif
