/*  world.h: run a function in a world of real processes over loopback.

    world_run forks world_size children (before any ZeroMQ context exists in
    the parent), each of which joins an RPC world on a free port of
    127.0.0.1, runs fn, shuts down gracefully and exits with fn's status.
    The parent waits for all of them, up to timeout_s, killing everything
    left when the time is up; a test never hangs. */
#ifndef ZDIST_TESTS_WORLD_H
#define ZDIST_TESTS_WORLD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int world_size;
    int rank;
    void *arg;
} world_t;

/*  Runs in every process after zd_rpc_init; returns 0 for success. */
typedef int (world_fn)(const world_t *w);

/*  Called in every process before zd_rpc_init (register functions here). */
typedef int (world_setup_fn)(const world_t *w);

typedef struct {
    int world_size;
    world_setup_fn *setup;        /* may be NULL */
    world_fn *fn;
    void *arg;
    int timeout_s;                /* whole run (default 60) */
    int64_t rpc_timeout_ms;       /* 0: the RPC default */
    bool dist_autograd;           /* call zd_dist_autograd_init before zd_rpc_init */
    int expect_exit[16];          /* per rank: expected exit status (default 0) */
} world_options_t;

/*  0 when every process exited with its expected status; -1 otherwise, with
    a message on stderr naming the ranks that failed or timed out. */
int world_run(const world_options_t *o);

/*  A free TCP port on 127.0.0.1 (bound, read and closed). */
int world_free_port(void);

/*  Prints "rank N: message" to stderr and returns -1: for test bodies. */
int world_fail(const world_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*  Resident set size of this process in bytes (from /proc/self/statm). */
int64_t world_rss_bytes(void);

#endif
