/* SPDX-License-Identifier: MIT */
/*  fault_point.h: the library's ZDIST_FAULT points, for tests (private).

    With ZDIST_FAULT="RANK:PHASE:ACTION[:N]" in its environment, the
    process of rank RANK does ACTION the N-th time (default 1) it reaches
    a point of the named PHASE: kill (raise SIGKILL: a crash) or stop
    (raise SIGSTOP: frozen, its sockets alive, until a SIGCONT). The
    grammar and the line it prints are the examples' (examples/fault.h),
    so that a test pins a fault in a program on the library, where the
    program's training step has no hook (issue 27: no test hooks in a
    program's step). The points:
      every process (rpc/): rendezvous (zd_rpc_init, its arguments
               read), shutdown (zd_rpc_shutdown, at its start);
      any distributed training: backward (zd_dist_autograd_backward,
               and so zd_ps_model_backward), step (zd_dist_optim_step,
               and so zd_ps_model_step);
      a remote model's trainer: forward (a training
               zd_ps_model_forward), checkpoint (zd_ps_model_checkpoint),
               evaluation (zd_ps_trainer_wait_all);
      its stage: forward (each forward it serves), checkpoint (each
               write but the first one of a new run's version 0);
      registry host: evaluation (a trainer's wait_all taken in);
      push/pull: step (each push of a trainer; each step of a shard).
    A phase's points are counted in the library and a program's in the
    program: no process may reach one phase through both (a stop would
    fire twice), so a program keeps hooks only for phases the library
    has no point for in the calls it makes. Always built: without the
    variable a point costs an atomic load. The variable is read at the
    first point and again at each zd_rpc_init (a test's forked child
    sets it before it joins), never on an RPC thread. A process
    tools/launch restarted (ZDIST_RESTART_COUNT above 0) does nothing:
    the fault was its first life's. */
#ifndef ZDIST_CORE_FAULT_POINT_H
#define ZDIST_CORE_FAULT_POINT_H

/*  Rank `rank` reached `phase`: does what ZDIST_FAULT says, if it names
    them, and returns otherwise. */
void zd__fault_point(int rank, const char *phase);

/*  Reads ZDIST_FAULT (and ZDIST_RESTART_COUNT) again: zd_rpc_init, on
    the program's thread, before its rendezvous point. */
void zd__fault_reload(void);

#endif
