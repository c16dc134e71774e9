/* SPDX-License-Identifier: MIT */
/*  world.c: the world harness of world.h. */
#include "tests/support/world.h"

#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>

/*  A port that was free and closed at once can be taken before rank 0 binds
    it: by another test's world, or as the local end of any connection made
    meanwhile (both draw from the kernel's ephemeral range). So the port stays
    bound, with SO_REUSEADDR and never listening, until the process exits:
    the kernel hands it to no other bind and no outgoing connection, while
    ZeroMQ's listener (which sets SO_REUSEADDR too) can still bind it. */
#define RESERVED_MAX 64
static int reserved[RESERVED_MAX];
static int n_reserved;

int world_free_port(void)
{
    return world_free_port_at("127.0.0.1");
}

int world_free_port_at(const char *ip)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && inet_pton(AF_INET, ip, &a.sin_addr) == 1 &&
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (port < 0 || fd < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (n_reserved == RESERVED_MAX) { /* the oldest world is long over */
        close(reserved[0]);
        memmove(reserved, reserved + 1, sizeof reserved[0] * (RESERVED_MAX - 1));
        n_reserved--;
    }
    reserved[n_reserved++] = fd;
    return port;
}

/*  This process's rank in the world it runs in; -1 in the parent. */
static int current_rank = -1;

int64_t world_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double world_time_scale(void)
{
    const char *s = getenv("ZDIST_TEST_TIME_SCALE");
    char *end;
    double v = s && *s ? strtod(s, &end) : 1;
    return s && *s && *end == '\0' && v >= 1 && v <= 100 ? v : 1;
}

int64_t world_scaled_ms(int64_t ms)
{
    return (int64_t)((double)ms * world_time_scale());
}

zd_rpc_options_t world_rpc_options(int port)
{
    zd_rpc_options_t o = zd_rpc_options_default();
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    o.init_timeout_ms = world_scaled_ms(10000);
    o.rpc_timeout_ms = world_scaled_ms(10000);
    return o;
}

int world_join(const world_t *w)
{
    zd_rpc_options_t opts = world_rpc_options(w->port);
    char name[32];
    snprintf(name, sizeof name, "worker%d", w->rank);
    return zd_rpc_init(name, w->rank, w->world_size, &opts);
}

int world_check_failed(const char *file, int line, const char *what, const char *expr)
{
    fprintf(stderr, "[rank %d] %s:%d: %s: %s (last error: %s)\n", current_rank, file, line, what,
            expr, zd_error_last());
    return 1;
}

int world_fail(const world_t *w, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "rank %d: %s\n", w->rank, buf);
    return -1;
}

int64_t world_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long long size = 0, rss = 0;
    if (!f)
        return -1;
    if (fscanf(f, "%lld %lld", &size, &rss) != 2)
        rss = -1;
    fclose(f);
    return rss < 0 ? -1 : (int64_t)rss * sysconf(_SC_PAGESIZE);
}

#if defined(__SANITIZE_THREAD__)
size_t __sanitizer_get_current_allocated_bytes(void);
#endif

int64_t world_held_bytes(void)
{
#if defined(__SANITIZE_THREAD__)
    return (int64_t)__sanitizer_get_current_allocated_bytes();
#else
    return world_rss_bytes();
#endif
}

static int child(const world_options_t *o, int rank, int port)
{
    world_t w = {o->world_size, rank, o->arg, port};
    current_rank = rank;
    if (o->dist_autograd && zd_dist_autograd_init() < 0)
        return world_fail(&w, "zd_dist_autograd_init: %s", zd_error_last()), 1;
    if (o->setup && o->setup(&w) < 0)
        return world_fail(&w, "setup failed: %s", zd_error_last()), 1;
    if (o->own_init)
        return o->fn(&w) ? 1 : 0;
    zd_rpc_options_t opts = zd_rpc_options_default();
    opts.master_addr = "127.0.0.1";
    opts.master_port = port;
    opts.init_timeout_ms = world_scaled_ms(30000);
    if (o->rpc_timeout_ms)
        opts.rpc_timeout_ms = world_scaled_ms(o->rpc_timeout_ms);
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    if (zd_rpc_init(name, rank, o->world_size, &opts) < 0) {
        world_fail(&w, "zd_rpc_init: %s", zd_error_last());
        if (o->teardown)
            o->teardown(&w);
        return 1;
    }
    int rc = o->fn(&w);
    if (rc != 0)
        fprintf(stderr, "rank %d: failed (last error: %s)\n", rank, zd_error_last());
    /* Ranks that finish early wait here for the others: as long as the run. */
    int64_t wait_ms = world_scaled_ms((int64_t)(o->timeout_s > 0 ? o->timeout_s : 60) * 1000);
    if (zd_rpc_is_running() && zd_rpc_shutdown(true, wait_ms) < 0) {
        fprintf(stderr, "rank %d: shutdown: %s\n", rank, zd_error_last());
        rc = rc ? rc : 1;
    }
    if (o->teardown && o->teardown(&w) < 0 && rc == 0)
        rc = world_fail(&w, "teardown failed: %s", zd_error_last());
    return rc ? 1 : 0;
}

int world_run(const world_options_t *o)
{
    int n = o->world_size;
    double timeout = (o->timeout_s > 0 ? o->timeout_s : 60) * world_time_scale();
    pid_t pids[16];
    int status[16];
    bool done[16] = {0};
    if (n < 1 || n > 16)
        return -1;
    int port = world_free_port_at(o->port_addr ? o->port_addr : "127.0.0.1");
    if (port < 0)
        return -1;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, &old);
    fflush(NULL);
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            sigprocmask(SIG_SETMASK, &old, NULL);
            /* exit(), not _exit(): LeakSanitizer checks the child at exit. */
            exit(child(o, r, port));
        }
    }
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int left = n;
    while (left > 0) {
        for (int r = 0; r < n; r++) {
            if (done[r] || pids[r] <= 0)
                continue;
            if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
                done[r] = true;
                left--;
            }
        }
        if (left == 0)
            break;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited =
            (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) * 1e-9;
        if (waited >= timeout)
            break;
        /* Sleep until a child changes state (or the deadline). Another
           thread of this process that does not block SIGCHLD (OpenBLAS's,
           say) may take the signal instead: look again every 100 ms. */
        double rest = timeout - waited;
        if (rest > 0.1)
            rest = 0.1;
        struct timespec ts = {(time_t)rest, (long)((rest - (double)(time_t)rest) * 1e9)};
        sigtimedwait(&set, NULL, &ts);
    }
    int rc = 0;
    for (int r = 0; r < n; r++) {
        if (!done[r]) {
            fprintf(stderr, "world: rank %d did not finish within %.0f s: killed\n", r, timeout);
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status[r], 0);
            rc = -1;
            continue;
        }
        int want = o->expect_exit[r];
        int got = WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : 128 + WTERMSIG(status[r]);
        if (got != want) {
            fprintf(stderr, "world: rank %d exited with %d (expected %d)\n", r, got, want);
            rc = -1;
        }
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}

int world_run_simple(int n, int timeout_s, world_fn *fn, void *arg)
{
    world_options_t o = {
        .world_size = n, .fn = fn, .arg = arg, .timeout_s = timeout_s, .own_init = true};
    return world_run(&o);
}
