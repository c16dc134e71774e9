/* SPDX-License-Identifier: MIT */
/*  world.h: run a function in a world of real processes over loopback.

    world_run forks world_size children (before any ZeroMQ context exists in
    the parent), each of which joins an RPC world on a free port of
    127.0.0.1, runs fn, shuts down gracefully and exits 0 when fn returned 0
    (1 otherwise). With own_init set, the harness leaves RPC to fn instead:
    fn calls zd_rpc_init itself (world_rpc_options(w->port) gives the test
    defaults) and shuts down itself; that is for tests of init and shutdown
    and for worlds that register or configure differently per rank.

    Children leave through exit(), so that LeakSanitizer checks each of them.
    The parent waits for all of them, up to timeout_s, killing everything
    left when the time is up; a test never hangs. cmocka asserts must not be
    used in children (they would jump back into the parent's test runner
    inside the child): use WCHECK and WTRY, or world_fail. */
#ifndef ZDIST_TESTS_WORLD_H
#define ZDIST_TESTS_WORLD_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/rpc.h>

typedef struct {
    int world_size;
    int rank;
    void *arg;
    int port; /* the master's port (on 127.0.0.1 unless port_addr) */
} world_t;

/*  Runs in every process (after zd_rpc_init unless own_init); returns 0 for
    success. */
typedef int(world_fn)(const world_t *w);

/*  Called in every process before zd_rpc_init (register functions here). */
typedef int(world_setup_fn)(const world_t *w);

typedef struct {
    int world_size;
    world_setup_fn *setup; /* may be NULL */
    world_fn *fn;
    /* Called in every process after the harness's zd_rpc_shutdown, to
       free what setup made (may be NULL; not with own_init). */
    world_fn *teardown;
    void *arg;
    int timeout_s;          /* whole run (default 60), times world_time_scale() */
    int64_t rpc_timeout_ms; /* 0: the RPC default */
    bool dist_autograd;     /* call zd_dist_autograd_init before zd_rpc_init */
    int expect_exit[16];    /* per rank: expected exit status (default 0;
                                     128 + N for death by signal N) */
    bool own_init;          /* fn inits and shuts down RPC itself */
    const char *port_addr;  /* where to reserve the master's port
                                     (default 127.0.0.1); see world_free_port_at */
} world_options_t;

/*  0 when every process exited with its expected status; -1 otherwise, with
    a message on stderr naming the ranks that failed or timed out. */
int world_run(const world_options_t *o);

/*  world_run for the plain case: n processes each running fn, which joins
    and leaves the RPC world itself (own_init), each expected to exit 0
    within timeout_s. */
int world_run_simple(int n, int timeout_s, world_fn *fn, void *arg);

/*  The options a test world uses on 127.0.0.1:port (short init and call
    timeouts, 10 s times world_time_scale()); for own_init worlds and for
    tests of zd_rpc_init. */
zd_rpc_options_t world_rpc_options(int port);

/*  For own_init worlds: joins as "worker<rank>" with world_rpc_options.
    zd_rpc_init's return. */
int world_join(const world_t *w);

/*  A free TCP port on 127.0.0.1, kept reserved (bound, not listening) for
    this process's life so that nothing else takes it before rank 0 binds it. */
int world_free_port(void);

/*  The same on the IPv4 address ip. A world whose rank 0 listens on another
    address of this host reserves its port there: a reservation on 127.0.0.1
    does not keep the kernel from handing the same port to an ephemeral bind
    on that other address (rank 0's own RPC socket, say). */
int world_free_port_at(const char *ip);

/*  Prints "rank N: message" to stderr and returns -1: for test bodies. */
int world_fail(const world_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*  Resident set size of this process in bytes (from /proc/self/statm). */
int64_t world_rss_bytes(void);

/*  What this process holds, for bounds on growth: its RSS, but under
    ThreadSanitizer the bytes its allocator has handed out and not got
    back (TSan's shadow memory grows with each page the program touches
    and is never returned, so RSS grows with how busy the heap was). */
int64_t world_held_bytes(void);

/*  Milliseconds on the monotonic clock. */
int64_t world_now_ms(void);

/*  How much longer than usual a test may wait: $ZDIST_TEST_TIME_SCALE (a
    number from 1 to 100), 1 without it. ctest sets it in the
    ThreadSanitizer build, whose processes run 5 to 15 times slower; the
    harness scales its own deadlines and the timeouts of
    world_rpc_options, and a test scales its bounds with world_scaled_ms. */
double world_time_scale(void);

/*  ms times world_time_scale(). */
int64_t world_scaled_ms(int64_t ms);

/*  Prints "[rank N] file:line: what (last error: ...)" to stderr and
    returns 1: what WCHECK and WTRY do on failure. */
int world_check_failed(const char *file, int line, const char *what, const char *expr);

/*  In a world fn: returns 1 from it unless cond holds. */
#define WCHECK(cond)                                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return world_check_failed(__FILE__, __LINE__, "check failed", #cond);                  \
    } while (0)

/*  In a world fn: returns 1 from it when call returns < 0. */
#define WTRY(call)                                                                                 \
    do {                                                                                           \
        if ((call) < 0)                                                                            \
            return world_check_failed(__FILE__, __LINE__, "failed", #call);                        \
    } while (0)

/*  WORLD_UNDER_TSAN is defined in a ThreadSanitizer build: for the few
    cases too slow there (whole training runs), which the other builds run. */
#if defined(__SANITIZE_THREAD__)
#define WORLD_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define WORLD_UNDER_TSAN 1
#endif
#endif

#endif
