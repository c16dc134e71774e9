/* SPDX-License-Identifier: MIT */
/*  bench_worlds.c: rpc_ps worlds of separate programs (bench_worlds.h).

    Every rank writes its stdout into one pipe (lines are short, so each
    arrives whole); a trainer's first batch is its tutorial loss line of
    batch 0 (--log_interval larger than the run prints that one only). The
    peak resident set of each rank comes from wait4. */
#define _GNU_SOURCE /* pipe2 */
#include "bench/bench_worlds.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/world.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pid_t start_rank(const char *exe, int rank, const bench_world_options_t *o, int port,
                        int out)
{
    char a[7][64];
    int world_size = o->world_size;
    int64_t batches = o->max_batches;
    snprintf(a[0], sizeof a[0], "--rank=%d", rank);
    snprintf(a[1], sizeof a[1], "--world_size=%d", world_size);
    snprintf(a[2], sizeof a[2], "--master_port=%d", port);
    snprintf(a[3], sizeof a[3], "--max_batches=%lld", (long long)batches);
    snprintf(a[4], sizeof a[4], "--log_interval=%lld", (long long)batches + 1000000);
    snprintf(a[5], sizeof a[5], "--init_timeout_s=%d", 300);
    if (o->lr > 0)
        snprintf(a[6], sizeof a[6], "--lr=%g", o->lr);
    else
        snprintf(a[6], sizeof a[6], "--progress_s=0");
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out, STDOUT_FILENO);
        execl(exe, exe, a[0], a[1], "--master_addr=127.0.0.1", a[2], a[3], a[4], a[5], a[6],
              "--progress_s=0", "--eval_samples=500", (char *)NULL);
        fprintf(stderr, "bench: cannot run %s: %s\n", exe, strerror(errno));
        _exit(127);
    }
    return pid;
}

/*  The trainer rank of a "Rank R training batch 0 " line, or -1. */
static int first_batch_rank(const char *line)
{
    int r;
    char tail[32];
    if (sscanf(line, "Rank %d training batch 0 %31s", &r, tail) == 2 && strcmp(tail, "loss") == 0)
        return r;
    return -1;
}

int bench_rpc_ps_world(const char *exe, const bench_world_options_t *o, bench_world_t *out)
{
    const int world_size = o->world_size, timeout_s = o->timeout_s;
    memset(out, 0, sizeof *out);
    if (world_size < 2 || world_size > BENCH_WORLD_MAX)
        return -1;
    int port = world_free_port(), fds[2];
    if (port < 0 || pipe2(fds, O_CLOEXEC) < 0)
        return -1;
    /* the cores shared out between the processes, as tools/launch does
       (more processes than cores: one thread each) */
    bool set_ob = !getenv("OPENBLAS_NUM_THREADS"), set_zd = !getenv("ZDIST_NUM_THREADS");
    if (set_ob)
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
    if (set_zd)
        setenv("ZDIST_NUM_THREADS", "1", 1);
    pid_t pids[BENCH_WORLD_MAX];
    bool seen[BENCH_WORLD_MAX] = {false};
    int trainers = world_size - 1, first = 0;
    fflush(NULL);
    double t0 = now_s();
    for (int r = 0; r < world_size; r++)
        pids[r] = start_rank(exe, r, o, port, fds[1]);
    close(fds[1]);
    if (set_ob)
        unsetenv("OPENBLAS_NUM_THREADS");
    if (set_zd)
        unsetenv("ZDIST_NUM_THREADS");
    char buf[65536];
    size_t have = 0;
    bool timed_out = false;
    /* the world's first other lines, said if it fails: why it did */
    enum { N_SAID = 6 };
    char said[N_SAID][160];
    int n_said = 0;
    for (;;) {
        double left = t0 + timeout_s - now_s();
        if (left <= 0) {
            timed_out = true;
            break;
        }
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        if (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR)
            break;
        ssize_t n = read(fds[0], buf + have, sizeof buf - 1 - have);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            break; /* every rank has closed its stdout */
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n'))) {
            *nl = '\0';
            int r = first_batch_rank(line);
            if (r < 0 && n_said < N_SAID && line[0])
                snprintf(said[n_said++], sizeof said[0], "%s", line);
            if (r > 0 && r < world_size && !seen[r]) {
                seen[r] = true;
                if (++first == trainers)
                    out->first_batch_s = now_s() - t0;
            }
            line = nl + 1;
        }
        have = strlen(line);
        memmove(buf, line, have);
        if (have == sizeof buf - 1)
            have = 0; /* a line longer than the buffer: dropped */
        if (o->start_only && first == trainers)
            break;
    }
    close(fds[0]);
    int rc = timed_out || first < trainers ? -1 : 0;
    for (int r = 0; r < world_size && (timed_out || o->start_only); r++)
        if (pids[r] > 0)
            kill(pids[r], SIGKILL);
    for (int r = 0; r < world_size; r++) {
        if (pids[r] <= 0) {
            rc = -1;
            continue;
        }
        int status;
        struct rusage ru;
        while (wait4(pids[r], &status, 0, &ru) < 0 && errno == EINTR)
            ;
        out->peak_rss_kb[r] = ru.ru_maxrss;
        out->cpu_s[r] = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
            (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
        if (!o->start_only && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
            fprintf(stderr, "bench: rpc_ps rank %d of %d failed (status 0x%x)\n", r, world_size,
                    status);
            rc = -1;
        }
    }
    out->total_s = now_s() - t0;
    if (timed_out)
        fprintf(stderr, "bench: the rpc_ps world of %d took longer than %d s\n", world_size,
                timeout_s);
    else if (first < trainers)
        fprintf(stderr, "bench: %d of %d trainers reported a first batch\n", first, trainers);
    for (int i = 0; rc < 0 && i < n_said; i++)
        fprintf(stderr, "bench: the world said: %s\n", said[i]);
    return rc;
}
