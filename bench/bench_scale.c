/* SPDX-License-Identifier: MIT */
/*  bench_scale: how a world of many processes on one host forms (issue 28).

    For each size N, N processes are forked (before any ZeroMQ context
    exists here), each calls zd_rpc_init on a free port of 127.0.0.1 (no
    key), reports its resident set and thread count on a pipe as soon as
    init returned, waits for the word to leave, and calls
    zd_rpc_shutdown(graceful). world_form_s_N is the time from the first
    fork to the last report: every rank's init returned. The figures at
    the largest size are the mean per rank at that moment.

        bench_scale [--sizes=64,128,256,512] [--rounds=R] [--csv] [--scale]

    A table by default; --csv prints name,value,unit lines. --scale is the
    default set of sizes. With --rounds every size runs R times, the sizes
    taking turns, and each figure is the median of its R values: on 2
    cores one 512-rank world's start varies by a third from run to run.
    world_form_growth is the largest size's median over the smallest's. A
    round that failed is left out of the medians (and said). */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

#include "tests/support/world.h"

#define MAX_SIZES  8
#define MAX_WORLD  1024
#define TIMEOUT_S  600
#define MAX_ROUNDS 99

typedef struct {
    int rank;
    long rss_kb;
    int threads;
    double cpu_ms; /* user + system time of the process until init returned */
} report_t;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*  This process's VmRSS (kB) and Threads from /proc/self/status. */
static void self_status(long *rss_kb, int *threads)
{
    *rss_kb = -1;
    *threads = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0)
            *rss_kb = strtol(line + 6, NULL, 10);
        else if (strncmp(line, "Threads:", 8) == 0)
            *threads = (int)strtol(line + 8, NULL, 10);
    }
    fclose(f);
}

/*  A rank: init, report, wait until the parent closes `go`, shut down. */
static int run_rank(int rank, int n, int port, int report_fd, int go_fd)
{
    zd_rpc_options_t o = zd_rpc_options_default();
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    o.init_timeout_ms = (int64_t)TIMEOUT_S * 1000;
    char name[32];
    snprintf(name, sizeof name, "w%d", rank);
    if (zd_rpc_init(name, rank, n, &o) < 0) {
        fprintf(stderr, "bench_scale: rank %d of %d: %s\n", rank, n, zd_error_last());
        return 1;
    }
    report_t r = {.rank = rank};
    self_status(&r.rss_kb, &r.threads);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    r.cpu_ms = 1e3 * ((double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec) +
        1e-3 * ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec);
    if (write(report_fd, &r, sizeof r) != (ssize_t)sizeof r)
        return 1;
    close(report_fd);
    char c;
    while (read(go_fd, &c, 1) < 0 && errno == EINTR) {
    }
    if (zd_rpc_shutdown(true, (int64_t)TIMEOUT_S * 1000) < 0) {
        fprintf(stderr, "bench_scale: rank %d of %d: %s\n", rank, n, zd_error_last());
        return 1;
    }
    return 0;
}

typedef struct {
    double form_s, total_s, spawn_s; /* spawn: until the last fork returned */
    double rss_mb, threads, cpu_ms;  /* means per rank */
    int ok;
} result_t;

static int run_world(int n, result_t *res)
{
    memset(res, 0, sizeof *res);
    int rep[2], go[2];
    int port = world_free_port();
    if (port < 0 || pipe2(rep, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(go, O_CLOEXEC) < 0) {
        close(rep[0]);
        close(rep[1]);
        return -1;
    }
    static pid_t pids[MAX_WORLD];
    fflush(NULL);
    double t0 = now_s();
    int spawned = 0;
    for (; spawned < n; spawned++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "bench_scale: world of %d: fork of rank %d: %s\n", n, spawned,
                    strerror(errno));
            break;
        }
        if (pid == 0) {
            close(rep[0]);
            close(go[1]);
            _exit(run_rank(spawned, n, port, rep[1], go[0]));
        }
        pids[spawned] = pid;
    }
    res->spawn_s = now_s() - t0;
    close(rep[1]);
    close(go[0]);
    int got = 0;
    long rss = 0, threads = 0;
    double cpu = 0;
    report_t r;
    size_t have = 0;
    char *buf = (char *)&r;
    while (got < spawned && spawned == n) {
        double left = t0 + TIMEOUT_S - now_s();
        struct pollfd p = {.fd = rep[0], .events = POLLIN};
        if (left <= 0 || (poll(&p, 1, (int)(left * 1000) + 1) < 0 && errno != EINTR))
            break;
        ssize_t k = read(rep[0], buf + have, sizeof r - have);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break; /* every rank closed its end: some failed */
        have += (size_t)k;
        if (have < sizeof r)
            continue;
        have = 0;
        got++;
        rss += r.rss_kb;
        threads += r.threads;
        cpu += r.cpu_ms;
    }
    res->form_s = now_s() - t0;
    close(go[1]); /* everyone may leave */
    close(rep[0]);
    int failed = n - spawned;
    for (int i = 0; i < spawned; i++) {
        if (got < n)
            kill(pids[i], SIGKILL);
        int status;
        while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {
        }
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    res->total_s = now_s() - t0;
    res->rss_mb = got ? (double)rss / got / 1024.0 : 0;
    res->threads = got ? (double)threads / got : 0;
    res->cpu_ms = got ? cpu / got : 0;
    res->ok = got == n && failed == 0;
    if (!res->ok)
        fprintf(stderr, "bench_scale: world of %d: %d of %d inits returned, %d ranks failed\n", n,
                got, n, failed);
    return res->ok ? 0 : -1;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/*  The median of field `off` (a double of result_t) over n results. */
static double median(const result_t *r, int n, size_t off)
{
    double v[MAX_ROUNDS];
    for (int i = 0; i < n; i++)
        memcpy(&v[i], (const char *)&r[i] + off, sizeof v[i]);
    qsort(v, (size_t)n, sizeof v[0], by_value);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int sizes[MAX_SIZES] = {64, 128, 256, 512}, n_sizes = 4, rounds = 1;
    bool csv = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0) {
            csv = true;
        } else if (strcmp(argv[i], "--scale") == 0) {
            /* the default sizes */
        } else if (strncmp(argv[i], "--rounds=", 9) == 0) {
            char *end;
            long v = strtol(argv[i] + 9, &end, 10);
            if (*end || v < 1 || v > MAX_ROUNDS) {
                fprintf(stderr, "bench_scale: --rounds from 1 to %d\n", MAX_ROUNDS);
                return 2;
            }
            rounds = (int)v;
        } else if (strncmp(argv[i], "--sizes=", 8) == 0) {
            n_sizes = 0;
            for (char *s = argv[i] + 8; *s && n_sizes < MAX_SIZES;) {
                int v = (int)strtol(s, &s, 10);
                if (v < 2 || v > MAX_WORLD) {
                    fprintf(stderr, "bench_scale: sizes from 2 to %d\n", MAX_WORLD);
                    return 2;
                }
                sizes[n_sizes++] = v;
                if (*s == ',')
                    s++;
            }
        } else {
            fprintf(stderr, "usage: %s [--scale] [--sizes=64,128,256,512] [--rounds=R] [--csv]\n",
                    argv[0]);
            return 2;
        }
    }
    if (n_sizes == 0) {
        fprintf(stderr, "bench_scale: --sizes names no size\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    static result_t res[MAX_SIZES][MAX_ROUNDS];
    int n_ok[MAX_SIZES] = {0};
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < n_sizes; i++) {
            /* the rounds that worked first: the medians are theirs */
            result_t r;
            if (run_world(sizes[i], &r) == 0)
                res[i][n_ok[i]++] = r;
            if (rounds > 1)
                fprintf(stderr, "bench_scale: round %d of %d, %d ranks: %.3f s%s\n", k + 1, rounds,
                        sizes[i], r.form_s, r.ok ? "" : " (failed)");
        }
    int rc = 0;
    if (!csv)
        printf("%-8s %10s %10s %10s %12s %13s %13s\n", "ranks", "form_s", "spawn_s", "total_s",
               "rss_mb/rank", "threads/rank", "init_cpu_ms");
    int small = 0, large = 0;
    result_t med[MAX_SIZES] = {0};
    for (int i = 0; i < n_sizes; i++) {
        result_t *m = &med[i];
        int k = n_ok[i];
        m->ok = k > 0;
        if (k < rounds)
            rc = 1;
        if (m->ok) {
            m->form_s = median(res[i], k, offsetof(result_t, form_s));
            m->spawn_s = median(res[i], k, offsetof(result_t, spawn_s));
            m->total_s = median(res[i], k, offsetof(result_t, total_s));
            m->rss_mb = median(res[i], k, offsetof(result_t, rss_mb));
            m->threads = median(res[i], k, offsetof(result_t, threads));
            m->cpu_ms = median(res[i], k, offsetof(result_t, cpu_ms));
        }
        if (csv)
            printf("world_form_s_N%d,%.3f,s\n", sizes[i], m->ok ? m->form_s : -1.0);
        else if (!m->ok)
            printf("%-8d  (failed in every round)\n", sizes[i]);
        else
            printf("%-8d %10.3f %10.3f %10.3f %12.2f %13.1f %13.1f", sizes[i], m->form_s,
                   m->spawn_s, m->total_s, m->rss_mb, m->threads, m->cpu_ms);
        if (!csv && m->ok && k < rounds)
            printf("  (%d of %d rounds failed)", rounds - k, rounds);
        if (!csv && m->ok)
            printf("\n");
        small = sizes[i] < sizes[small] ? i : small;
        large = sizes[i] >= sizes[large] ? i : large;
    }
    double growth = med[small].ok && med[large].ok && med[small].form_s > 0
        ? med[large].form_s / med[small].form_s
        : -1.0;
    if (csv) {
        printf("world_rss_mb_per_rank_N%d,%.2f,MB\n", sizes[large], med[large].rss_mb);
        printf("world_threads_per_rank_N%d,%.1f,threads\n", sizes[large], med[large].threads);
        printf("world_init_cpu_ms_per_rank_N%d,%.1f,ms\n", sizes[large], med[large].cpu_ms);
        if (small != large)
            printf("world_form_growth_N%d_N%d,%.2f,x\n", sizes[small], sizes[large], growth);
    } else if (small != large) {
        printf("from %d to %d ranks: %.2fx the time (the ratio of the medians of %d round%s)\n",
               sizes[small], sizes[large], growth, rounds, rounds == 1 ? "" : "s");
    }
    return rc;
}
