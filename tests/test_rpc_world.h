/*  test_rpc_world.h: running a world of real processes for the RPC tests.

    run_world() forks one child per rank before any ZeroMQ context exists in
    the parent; each child runs fn and exits with its result (through exit(),
    so that LeakSanitizer checks every child). The parent waits for all with
    a deadline and kills the rest when it passes: no test can hang. cmocka
    asserts must not be used in children (they would jump back into the
    parent's test runner inside the child): use WCHECK, which prints and
    makes fn return 1.

    It also holds the handlers and helpers several RPC tests serve alike
    (world_h_*, world_hold_t, world_call_int). */
#ifndef ZDIST_TEST_RPC_WORLD_H
#define ZDIST_TEST_RPC_WORLD_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

#define WCHECK(cond)                                                                        \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s (last error: %s)\n",         \
                    zd_rpc_rank(), __FILE__, __LINE__, #cond, zd_error_last());                   \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

typedef int (world_fn)(int rank, int world, int port, void *arg);

/* A TCP port that was free a moment ago (the OS picked it). */
static inline int world_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

static inline int64_t world_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Options for a test world on loopback. */
static inline zd_rpc_options_t world_options(int port)
{
    zd_rpc_options_t o = zd_rpc_options_default();
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    o.init_timeout_ms = 10000;
    o.rpc_timeout_ms = 10000;
    return o;
}

/* Runs fn in `world` processes; fills status[r] (exit code, or -1 when killed
   or timed out) when status is not NULL. Returns 0 when every child exited
   0 within timeout_s. */
static inline int run_world_status(int world, int timeout_s, world_fn *fn, void *arg,
                                   int *status)
{
    int port = world_free_port();
    pid_t pids[64];
    if (port < 0 || world > 64)
        return -1;
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            int rc = fn(r, world, port, arg);
            fflush(stdout);
            fflush(stderr);
            exit(rc);
        }
    }
    int64_t deadline = world_now_ms() + timeout_s * 1000;
    int left = world, failed = 0;
    int codes[64];
    for (int r = 0; r < world; r++)
        codes[r] = -2;
    while (left > 0) {
        for (int r = 0; r < world; r++) {
            if (codes[r] != -2)
                continue;
            int st;
            pid_t p = waitpid(pids[r], &st, WNOHANG);
            if (p == pids[r]) {
                codes[r] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
                if (codes[r] != 0)
                    fprintf(stderr, "world: rank %d ended with %s %d\n", r,
                            WIFEXITED(st) ? "status" : "signal",
                            WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
                left--;
            }
        }
        if (left == 0)
            break;
        if (world_now_ms() > deadline) {
            for (int r = 0; r < world; r++)
                if (codes[r] == -2) {
                    fprintf(stderr, "world: rank %d did not finish in %d s: killed\n", r,
                            timeout_s);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    codes[r] = -1;
                }
            break;
        }
        struct timespec ts = {0, 2000000};   /* polling the children, not waiting for them */
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < world; r++) {
        if (status)
            status[r] = codes[r];
        failed |= codes[r] != 0;
    }
    return failed ? -1 : 0;
}

static inline int run_world(int world, int timeout_s, world_fn *fn, void *arg)
{
    return run_world_status(world, timeout_s, fn, arg, NULL);
}

/* ---- handlers several tests serve ---- */

/* add(a, b) = a + b on ints. */
static inline zd_value_t *world_h_add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t a, b;
    if (zd_rpc_arg_int(args, 0, &a) < 0 || zd_rpc_arg_int(args, 1, &b) < 0)
        return NULL;
    return zd_value_int(a + b);
}

/* echo(v) = v (None without arguments). */
static inline zd_value_t *world_h_echo(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_value_t *v = zd_list_get(args, 0);
    return v ? zd_value_ref(v) : zd_value_none();
}

/* Fails with the message registered as arg (a const char *). */
static inline zd_value_t *world_h_fail(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    zd_error_set("%s", (const char *)arg);
    return NULL;
}

/* How many values this process owns for RRefs. */
static inline zd_value_t *world_h_owner_count(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(zd_rpc_debug_owner_rrefs());
}

/* A call held until it is released, so that a test keeps a call in flight
   without sleeping: register world_h_hold (async) and world_h_release, both
   with a pointer to the same world_hold_t as arg. */
typedef struct {
    _Atomic(zd_future_t *) call;   /* the call held, NULL when none */
    int64_t answer;                 /* what the held call answers, */
    bool answer_none;               /* or no value at all when set */
    zd_future_t *arrived;          /* when not NULL, completed as a call is held */
} world_hold_t;

static inline zd_future_t *world_h_hold(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    world_hold_t *h = arg;
    zd_future_t *f = zd_future_new();
    atomic_store(&h->call, zd_future_ref(f));
    if (h->arrived)
        zd_future_set_value(h->arrived, NULL);
    return f;
}

/* Answers the held call: 1 when there was one, 0 when none has arrived yet. */
static inline int world_hold_release(world_hold_t *h)
{
    zd_future_t *f = atomic_exchange(&h->call, NULL);
    if (!f)
        return 0;
    zd_value_t *v = h->answer_none ? NULL : zd_value_int(h->answer);
    zd_future_set_value(f, v);
    zd_value_unref(v);
    zd_future_unref(f);
    return 1;
}

static inline zd_value_t *world_h_release(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    return zd_value_int(world_hold_release(arg));
}

/* The int fn answers on rank `to` without arguments, or -1 when the call fails. */
static inline int64_t world_call_int(int to, const char *fn)
{
    zd_value_t *r = NULL;
    int64_t v = -1;
    if (zd_rpc_sync(to, fn, NULL, -1, &r) == 0)
        zd_value_get_int(r, &v);
    zd_value_unref(r);
    return v;
}

#endif
