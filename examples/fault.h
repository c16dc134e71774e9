/* SPDX-License-Identifier: MIT */
/*  fault.h: a fault-injection hook, for tests only.

    With ZDIST_FAULT="RANK:PHASE:ACTION[:N]" in its environment, the
    process of rank RANK does ACTION the N-th time (default 1) it reaches
    the named point PHASE of an example (fault_point): kill (raise
    SIGKILL: a crash) or stop (raise SIGSTOP: frozen, with its sockets
    alive, until a SIGCONT). The library reads the same variable at
    points of its own (docs/ps.md, "Faults in tests"): rendezvous
    (zd_rpc_init) and shutdown (zd_rpc_shutdown) in every program;
    backward and step in every zd_dist_autograd_backward and
    zd_dist_optim_step; the remote model's (rpc_ps) forward (a trainer's
    training forward, each forward a server's stage serves), checkpoint
    (a trainer's zd_ps_model_checkpoint, each write of a stage but the
    run's start) and evaluation (zd_ps_trainer_wait_all, and the
    registry taking a trainer's wait in); step in push/pull (each step a
    shard takes: ps_sync_async's parameter servers, ps_lstm's shards;
    each push of a trainer: ps_sync_async's driver applying gradients).
    rpc_ps has no points of its own. The examples' points, by role:
      ps_sync_async driver: evaluation; worker: backward
                    (compute_gradients, a local backward);
      pipeline      driver: forward, evaluation; stages: forward.
    A server's, a worker's or a stage's shutdown starts as soon as it has
    joined: it serves the others from inside zd_rpc_shutdown. Tests use
    it to pin a fault to a phase without sleeping; without the variable it
    costs a load and a compare. A process that tools/launch restarted
    (ZDIST_RESTART_COUNT above 0) does nothing: the fault was its first
    life's. */
#ifndef ZDIST_EXAMPLES_FAULT_H
#define ZDIST_EXAMPLES_FAULT_H

#include <stdint.h>

/*  Rank `rank` reached `phase`: does what ZDIST_FAULT says, if it names
    them, and returns otherwise. */
void fault_point(int rank, const char *phase);

#endif
