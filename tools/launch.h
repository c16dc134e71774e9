/* SPDX-License-Identifier: MIT */
/*  launch.h: what tools/launch.c (flags, starting the ranks) and
    tools/launch_world.c (relaying output, stopping, reaping) share. Private
    to the launch program. */
#ifndef ZDIST_TOOLS_LAUNCH_H
#define ZDIST_TOOLS_LAUNCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define MAX_PROCS       1024 /* on one node */
#define MAX_NODES       1024
#define MAX_RESTARTS    1000000 /* per rank */
#define MASTER_WAIT_S   "60"    /* ZDIST_MASTER_WAIT_S with --max_restarts */
#define READ_CHUNK      65536
#define LINE_MAX_BYTES  (1 << 20)  /* longer lines are relayed in pieces this long */
#define DRAIN_MAX_BYTES (16 << 20) /* read at most this much from a dead rank's pipe */
#define KILL_WAIT_S     5.0        /* how long SIGKILLed processes get to disappear */
#define TAIL_LINES      20         /* of a failed rank's log shown with --log_dir */
#define TAIL_BYTES      16384      /* at most this much of it */
#define EXIT_USAGE      2
#define EXIT_TIMEOUT    124 /* as timeout(1) */

typedef struct {
    int fd;    /* read end of the child's pipe; -1 once closed */
    int out;   /* where its lines go: STDOUT_FILENO or STDERR_FILENO */
    char *buf; /* the current partial line */
    size_t len, cap;
} stream_t;

typedef struct {
    pid_t pid;    /* 0: not started */
    bool alive;   /* started and not yet reaped */
    int restarts; /* times it was restarted after failing (--max_restarts) */
    stream_t streams[2];
    char *log_path; /* with --log_dir: where its output goes (its streams stay closed) */
} proc_t;

typedef enum { RUNNING, STOPPING, KILLING } phase_t;

typedef struct {
    /* flags */
    int nproc; /* processes on this node (--nproc, --nproc_per_node) */
    int nnodes, node_rank;
    int rank_base; /* global rank of this node's first process: node_rank * nproc */
    const char *log_dir;
    bool addr_given;
    const char *master_addr;
    int master_port;
    bool rank_flags;
    double grace_s, timeout_s;
    int max_restarts; /* per rank; 0: the first failure stops the world */
    bool add_resume;  /* the program has --checkpoint and no --resume: restarts get one */
    char **prog_argv; /* program and its flags (points into main's argv) */
    int prog_argc;
    char *prog_path; /* the program's resolved path */
    /* state */
    proc_t procs[MAX_PROCS];
    int started, alive; /* ranks started; started and not yet reaped */
    int sigfd;
    int devnull; /* the ranks' stdin, kept open for restarts */
    sigset_t orig_mask;
    double start;
    phase_t phase;
    double deadline;  /* end of the STOPPING / KILLING phase */
    int stop_sig;     /* what STOPPING began with (SIGTERM, or a forwarded signal) */
    bool leftovers;   /* every rank is gone but processes they started are not */
    int exit_code;    /* -1 until the first failure, signal or timeout sets it */
    bool out_dead[3]; /* writing to launch's stdout/stderr failed: drop lines */
} launch_t;

/*  "process" or "processes" for n. */
const char *launch_processes(int n);

/*  Seconds on the monotonic clock. */
double launch_now(void);

/*  Starts stopping the world: sig (SIGTERM, or a signal launch received and
    forwards) to every running rank's process group, SIGKILL --grace_s
    later; SIGKILL at once when sig is SIGKILL or --grace_s is 0. */
void launch_stop(launch_t *L, int sig);

/*  The global rank of this node's i-th process. */
static inline int launch_rank(const launch_t *L, int i)
{
    return L->rank_base + i;
}

/*  Starts (or, when its restarts count is above 0, restarts in place) this
    node's i-th process: same rank, flags and environment, plus --resume on
    a restart when add_resume. 0, or -1 with a message printed. */
int launch_start_rank(launch_t *L, int i);

/*  Runs the world until every rank and everything they started is reaped
    (or has not died KILL_WAIT_S after SIGKILL): relays output, restarts a
    failed rank while it has restarts left, else reports the failure and
    stops the others. Closes every stream before returning. */
void launch_run(launch_t *L);

/*  launch_key.c: unless the user chose a key or --insecure, or the world
    spans several nodes, makes a fresh world key (0700 folder, 0600 file),
    passes it to the processes in ZDIST_KEY_FILE and removes it at exit.
    0, or -1 with a message printed. */
int launch_key_prepare(const launch_t *L);

#endif
