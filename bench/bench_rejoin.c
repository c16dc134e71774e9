/* SPDX-License-Identifier: MIT */
/*  bench_rejoin: what a restart costs (issue 12's figures).

        bench_rejoin [--csv] [--cycles=N]

    Two worlds of two processes on this machine.
      - A worker that dies and comes back N times (100): each incarnation of
        rank 1 joins the running world, takes four 1 MiB RRefs owned by rank
        0 and a call, and is killed (SIGKILL). Rank 0 releases what each one
        held. Figures: rejoin_ms_p50 (the new process's zd_rpc_init, start
        to return), rank0_rss_growth_mb (rank 0's resident memory after the
        last cycle minus after the middle one: flat means nothing leaks;
        the first cycles do grow it, by about 20 MB, as malloc's per-thread
        arenas each keep some of the freed blocks for reuse).
      - Rank 0 killed and started again while rank 1 waits for it
        (master_wait_ms): master_back_ms, from the kill to rank 1's
        peer_joined callback (the new rank 0 is in service), and
        master_rejoin_ms, the new rank 0's zd_rpc_init. The kill is noticed
        one second later (a lost peer's grace), which master_back_ms holds.
    Times are CLOCK_MONOTONIC, which every process of a machine shares. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include <zdist/tensor.h>
#include "tests/support/world.h"

#define WAIT_MS    60000
#define MIN_CYCLES 10

static int cycles = 100;
static bool csv;

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void figure(const char *name, double value, const char *unit, const char *what)
{
    if (csv)
        printf("%s,%.2f,%s\n", name, value, unit);
    else
        printf("  %-22s %10.2f %-3s  %s\n", name, value, unit, what);
    fflush(stdout);
}

/*  ---- rank 0's functions ---- */

static double *init_ms; /* per cycle, reported by each incarnation */
static int reports;
static double rss_warm_mb, rss_last_mb;
static zd_future_t *all_in;

static zd_value_t *h_block(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_tensor_t *t = zd_tensor_zeros1(256 * 1024); /* 1 MiB of float32 */
    zd_value_t *v = t ? zd_value_tensor(t) : NULL;
    zd_tensor_unref(t);
    return v;
}

static zd_value_t *h_report(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    double ms;
    if (zd_rpc_arg_float(args, 0, &ms) < 0)
        return NULL;
    if (reports < cycles)
        init_ms[reports] = ms;
    reports++;
    double rss = (double)world_rss_bytes() / (1 << 20);
    if (reports == cycles / 2)
        rss_warm_mb = rss;
    rss_last_mb = rss;
    if (reports == cycles)
        zd_future_set_value(all_in, NULL);
    return zd_value_none();
}

static int setup(const world_t *w)
{
    (void)w;
    return zd_rpc_register("block", h_block, NULL) | zd_rpc_register("report", h_report, NULL);
}

static int join(const world_t *w)
{
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.init_timeout_ms = WAIT_MS;
    o.master_wait_ms = WAIT_MS;
    char name[16];
    snprintf(name, sizeof name, "w%d", w->rank);
    return zd_rpc_init(name, w->rank, w->world_size, &o);
}

/*  One incarnation of rank 1: joins, holds, reports, dies (the last one
    leaves properly). */
static void incarnation(const world_t *w, int k)
{
    double t0 = now_ms();
    if (setup(w) != 0 || join(w) != 0) {
        fprintf(stderr, "bench_rejoin: cycle %d: %s\n", k, zd_error_last());
        _exit(1);
    }
    double took = now_ms() - t0;
    zd_rref_t *held[4] = {0};
    for (int i = 0; i < 4; i++)
        held[i] = zd_rpc_remote(0, "block", NULL, WAIT_MS);
    zd_value_t *args = ZD_ARGS(took), *r = NULL;
    int rc = zd_rpc_sync(0, "report", args, WAIT_MS, &r);
    zd_value_unref(args);
    zd_value_unref(r);
    if (rc < 0) {
        fprintf(stderr, "bench_rejoin: cycle %d: %s\n", k, zd_error_last());
        _exit(1);
    }
    if (k + 1 < cycles)
        raise(SIGKILL);
    for (int i = 0; i < 4; i++)
        zd_rref_unref(held[i]);
    _exit(zd_rpc_shutdown(true, WAIT_MS) == 0 ? 0 : 1);
}

static int world_worker_cycles(const world_t *w)
{
    if (w->rank == 0) {
        all_in = zd_future_new();
        WCHECK(setup(w) == 0 && join(w) == 0);
        WTRY(zd_future_wait(all_in, (int64_t)cycles * WAIT_MS));
        WTRY(zd_rpc_shutdown(true, WAIT_MS));
        zd_future_unref(all_in);
        qsort(init_ms, (size_t)cycles, sizeof *init_ms, cmp_double);
        figure("rejoin_ms_p50", init_ms[cycles / 2], "ms", "a restarted worker's zd_rpc_init");
        figure("rank0_rss_growth_mb", rss_last_mb - rss_warm_mb, "MB",
               "rank 0's memory, last cycle minus the middle one");
        return 0;
    }
    for (int k = 0; k < cycles; k++) {
        pid_t pid = fork();
        WCHECK(pid >= 0);
        if (pid == 0)
            incarnation(w, k);
        int status = 0;
        WCHECK(waitpid(pid, &status, 0) == pid);
        WCHECK(k + 1 < cycles ? WIFSIGNALED(status) : WIFEXITED(status) && !WEXITSTATUS(status));
    }
    return 0;
}

/*  ---- rank 0 killed and started again ---- */

static double joined_at;
static zd_future_t *joined;

static void on_joined(void *arg, int peer, const char *name)
{
    (void)arg, (void)peer, (void)name;
    joined_at = now_ms();
    zd_future_set_value(joined, NULL);
}

static zd_value_t *h_back(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_float(joined_at);
}

static int world_master_restarts(const world_t *w)
{
    if (w->rank == 1) {
        joined = zd_future_new();
        WCHECK(zd_rpc_register("back", h_back, NULL) == 0 &&
               zd_rpc_register_peer_joined(on_joined, NULL) == 0 && join(w) == 0);
        WTRY(zd_future_wait(joined, WAIT_MS));
        WTRY(zd_rpc_shutdown(true, WAIT_MS));
        zd_future_unref(joined);
        return 0;
    }
    int fd[2];
    WCHECK(pipe(fd) == 0);
    pid_t pid = fork();
    WCHECK(pid >= 0);
    if (pid == 0) { /* the first rank 0: joins, then dies, saying when */
        if (join(w) != 0)
            _exit(1);
        double t = now_ms();
        if (write(fd[1], &t, sizeof t) != (ssize_t)sizeof t)
            _exit(1);
        raise(SIGKILL);
    }
    close(fd[1]);
    double killed = 0;
    int status = 0;
    WCHECK(read(fd[0], &killed, sizeof killed) == (ssize_t)sizeof killed);
    close(fd[0]);
    WCHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
    double t0 = now_ms();
    WTRY(join(w));
    double took = now_ms() - t0;
    zd_value_t *r = NULL;
    double back = 0;
    WTRY(zd_rpc_sync(1, "back", NULL, WAIT_MS, &r));
    WTRY(zd_value_get_float(r, &back));
    zd_value_unref(r);
    WTRY(zd_rpc_shutdown(true, WAIT_MS));
    figure("master_back_ms", back - killed, "ms",
           "rank 0 killed and started again: kill to back in service");
    figure("master_rejoin_ms", took, "ms", "the new rank 0's zd_rpc_init");
    return 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0) {
            csv = true;
        } else if (strncmp(argv[i], "--cycles=", 9) == 0 && atoi(argv[i] + 9) >= MIN_CYCLES) {
            cycles = atoi(argv[i] + 9);
        } else {
            fprintf(stderr, "usage: bench_rejoin [--csv] [--cycles=N (at least %d)]\n", MIN_CYCLES);
            return 2;
        }
    }
    init_ms = calloc((size_t)cycles, sizeof *init_ms);
    if (!init_ms)
        return 1;
    if (!csv)
        printf("bench_rejoin: %d deaths and rejoins of a worker; rank 0 killed and restarted\n",
               cycles);
    int timeout_s = cycles * 5 + 60;
    int rc = world_run_simple(2, timeout_s, world_worker_cycles, NULL) |
        world_run_simple(2, 120, world_master_restarts, NULL);
    free(init_ms);
    return rc ? 1 : 0;
}
