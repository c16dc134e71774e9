/* SPDX-License-Identifier: MIT */
/*  fault.h: a fault-injection hook, for tests only.

    With ZDIST_FAULT="RANK:PHASE:ACTION[:N]" in its environment, the
    process of rank RANK does ACTION the N-th time (default 1) it reaches
    the named point PHASE of an example (fault_point): kill (raise
    SIGKILL: a crash) or stop (raise SIGSTOP: frozen, with its sockets
    alive, until a SIGCONT). Phases: rendezvous, forward, backward, step,
    checkpoint, evaluation, shutdown; where each role reaches them:
      rpc_ps        trainer: all but evaluation; server shards:
                    rendezvous, forward (a trainer's ps_forward on shard 0,
                    ps_fc1_part on the others), checkpoint (each save),
                    shutdown; evaluation is the library's point on both
                    sides (zd_ps_trainer_wait_all, and the registry taking
                    a trainer's wait in: docs/ps.md, "Faults in tests"),
                    which reads the same variable;
      ps_sync_async driver: rendezvous, step (applying gradients),
                    evaluation, shutdown; parameter server: rendezvous,
                    step (each step its shard takes), shutdown; worker:
                    rendezvous, backward (compute_gradients), shutdown;
      ps_lstm       server shards: step (each step a shard takes: its
                    on_step is fault_on_step);
      pipeline      driver: rendezvous, forward, backward, step,
                    evaluation, shutdown; stages: rendezvous, forward,
                    shutdown.
    A server's, a worker's or a stage's shutdown starts as soon as it has
    joined: it serves the others from inside zd_rpc_shutdown. Their
    backward and step run inside the library: no point there. Tests use
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

/*  A parameter-server shard's on_step (zd_ps_options_t): the "step"
    point of this process's rank. */
void fault_on_step(void *arg, int shard, int64_t version);

#endif
