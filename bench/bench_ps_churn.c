/* SPDX-License-Identifier: MIT */
/*  bench_ps_churn: issue 12's "memory after 100 trainer deaths and
    rejoins (flat)", with the real rpc_ps program.

        bench_ps_churn [--csv] [--cycles=N]

    A world of three rpc_ps processes on this machine, started as a user
    would (no launcher, which stops the world at the first death): the
    server (rank 0) and two trainers, with --checkpoint in a temporary
    directory. Trainer 2 is killed (SIGKILL, pinned with ZDIST_FAULT: at
    the backward of the 15th batch of its life, its forward pass done, so
    that the server holds that batch's autograd context with its
    activations; one checkpoint, at 10 batches, lies behind it) and
    started again with the same flags N times (100); each new life
    rejoins the running world and goes on from the position the server
    kept (that of its last forward: 14 batches on). The last life trains to the end, and every process must
    exit 0. Trainer 1 has as many batches to train but never stops, so it
    finishes early (about the 15th cycle of 100 on a loaded 2-core
    machine) and waits for the shared final evaluation while trainer 2
    goes on dying and coming back.

    After each death, once the server logs that it released what the dead
    trainer held (RRef forks, calls; its autograd contexts go just before),
    the server's VmRSS is read from /proc. Figures:
      ps_server_rss_growth_mb  the server's RSS after the last cycle minus
                               after the middle one (flat: nothing leaks)
      ps_server_rss_mb         the server's RSS after the last cycle
      ps_trainer_rejoin_s_p50  a restarted trainer's start to its first
                               batch in the running world (median)
      cycles                   deaths and rejoins
    Progress goes to stderr. */
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/support/program.h"
#include "tests/support/world.h"

#define RANKS            3
#define VICTIM           2
#define CHECKPOINT_EVERY 10
#define KILL_AT          15    /* batches into a life: one checkpoint behind it */
#define CYCLE_S          120.0 /* the most one death and rejoin may take */
#define MIN_CYCLES       4

static int cycles = 100;
static bool csv;

typedef struct {
    program_t p[RANKS];
    bool live[RANKS]; /* its output is still open */
    char a_world[32], a_port[32], a_ck[96], a_max[48], dir[32];
} ps_world_t;

static void figure(const char *name, double value, const char *unit, const char *what)
{
    if (csv)
        printf("%s,%.2f,%s\n", name, value, unit);
    else
        printf("  %-24s %10.2f %-3s  %s\n", name, value, unit, what);
    fflush(stdout);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int start_rank(ps_world_t *w, int r, const char *fault)
{
    char a_rank[32];
    snprintf(a_rank, sizeof a_rank, "--rank=%d", r);
    char *argv[] = {BENCH_RPC_PS,
                    a_rank,
                    w->a_world,
                    "--master_addr=127.0.0.1",
                    w->a_port,
                    w->a_ck,
                    w->a_max,
                    "--eval_samples=200",
                    "--eval_every=0",
                    "--progress_s=0",
                    "--log_interval=1",
                    "--checkpoint_every=10",
                    NULL};
    if (fault)
        setenv("ZDIST_FAULT", fault, 1);
    int rc = program_start(&w->p[r], argv);
    unsetenv("ZDIST_FAULT");
    w->live[r] = rc == 0;
    return rc;
}

/*  Reads what the processes print (all of them: a full pipe would stop
    one) until `needle` appears in rank r's output at or after `from`, or
    rank r's output ends (needle NULL), or the deadline: 1, or 0 on
    timeout or when the output ended without the needle. */
static int pump(ps_world_t *w, int r, size_t from, const char *needle, double deadline)
{
    for (;;) {
        program_t *p = &w->p[r];
        if (needle && p->out && p->len >= from && strstr(p->out + from, needle))
            return 1;
        if (!w->live[r])
            return needle ? 0 : 1;
        double left = deadline - program_now_s();
        if (left <= 0)
            return 0;
        struct pollfd pfd[RANKS];
        int who[RANKS], n = 0;
        for (int i = 0; i < RANKS; i++)
            if (w->live[i]) {
                pfd[n] = (struct pollfd){w->p[i].fd, POLLIN, 0};
                who[n++] = i;
            }
        if (poll(pfd, (nfds_t)n, (int)(left * 1000) + 1) <= 0)
            continue;
        for (int k = 0; k < n; k++) {
            if (!pfd[k].revents)
                continue;
            program_t *q = &w->p[who[k]];
            if (q->len + 4097 > q->cap) {
                q->cap = q->cap ? q->cap * 2 : 65536;
                q->out = realloc(q->out, q->cap);
                if (!q->out)
                    return 0;
            }
            ssize_t got = read(q->fd, q->out + q->len, 4096);
            if (got <= 0) {
                w->live[who[k]] = false;
                continue;
            }
            q->len += (size_t)got;
            q->out[q->len] = '\0';
        }
    }
}

/*  Rank r's output to its end, then its exit status (128 + N: signal N). */
static int finish(ps_world_t *w, int r, double deadline)
{
    pump(w, r, 0, NULL, deadline);
    return program_wait(&w->p[r], deadline);
}

static double rss_mb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    double kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            kb = strtod(line + 6, NULL);
    if (f)
        fclose(f);
    return kb / 1024;
}

static void dump(const ps_world_t *w, int r, const char *why)
{
    fprintf(stderr, "bench_ps_churn: %s; rank %d printed:\n%s\n", why, r,
            w->p[r].out ? w->p[r].out : "");
}

static int run(ps_world_t *w, double *rss, double *rejoin_s)
{
    double t0 = program_now_s();
    char fault[64];
    snprintf(fault, sizeof fault, "%d:backward:kill:%d", VICTIM, KILL_AT);
    if (start_rank(w, 0, NULL) < 0 || start_rank(w, 1, NULL) < 0 ||
        start_rank(w, VICTIM, fault) < 0)
        return -1;
    char released[64];
    snprintf(released, sizeof released, "(rank %d) held:", VICTIM);
    size_t seen = 0; /* the server's output up to the last release */
    bool other_done = false;
    for (int k = 0; k < cycles; k++) {
        double deadline = program_now_s() + CYCLE_S;
        int rc = finish(w, VICTIM, deadline);
        if (rc != 128 + SIGKILL) {
            dump(w, VICTIM, "the trainer was not killed");
            return -1;
        }
        if (pump(w, 0, seen, released, deadline) != 1) {
            dump(w, 0, "the server did not release the dead trainer");
            return -1;
        }
        /* the release line, for the progress report */
        char what[160] = "";
        long long contexts = -1;
        const char *rel = strstr(w->p[0].out + seen, released);
        sscanf(rel + strlen(released), " %159[^\n]", what);
        const char *ctx = strstr(w->p[0].out + seen, "dist_autograd: released ");
        if (ctx && ctx < rel)
            sscanf(ctx + strlen("dist_autograd: released "), "%lld", &contexts);
        seen = w->p[0].len;
        rss[k] = rss_mb(w->p[0].pid);
        free(w->p[VICTIM].out);
        double started = program_now_s();
        if (start_rank(w, VICTIM, k + 1 < cycles ? fault : NULL) < 0)
            return -1;
        /* its first batch after the rejoin (--log_interval=1) */
        if (pump(w, VICTIM, 0, "rejoined the world; resuming", deadline) != 1) {
            dump(w, VICTIM, "the restarted trainer did not rejoin");
            return -1;
        }
        size_t at = (size_t)(strstr(w->p[VICTIM].out, "rejoined the world") - w->p[VICTIM].out);
        if (pump(w, VICTIM, at, "Rank 2 training batch", deadline) != 1) {
            dump(w, VICTIM, "the restarted trainer trained no batch");
            return -1;
        }
        rejoin_s[k] = program_now_s() - started;
        long long batch = -1;
        const char *res = strstr(w->p[VICTIM].out, "resuming at batch ");
        sscanf(res + strlen("resuming at batch "), "%lld", &batch);
        fprintf(stderr,
                "bench_ps_churn: cycle %d/%d (%.0f s): server RSS %.1f MB after "
                "releasing %lld autograd context(s), %s; the new trainer resumed at batch "
                "%lld, first batch %.2f s after its start\n",
                k + 1, cycles, program_now_s() - t0, rss[k], contexts, what, batch, rejoin_s[k]);
        if (!other_done && w->p[1].out && strstr(w->p[1].out, "Training complete!")) {
            other_done = true;
            fprintf(stderr,
                    "bench_ps_churn: trainer 1 finished its batches before cycle %d; "
                    "it waits for the final evaluation\n",
                    k + 1);
        }
    }
    int bad = 0;
    double deadline = program_now_s() + CYCLE_S * 5;
    for (int r = RANKS - 1; r >= 0; r--) {
        int rc = finish(w, r, deadline);
        if (rc != 0) {
            fprintf(stderr, "bench_ps_churn: rank %d exited with %d\n", r, rc);
            dump(w, r, "a rank failed");
            bad = 1;
        }
    }
    if (!bad && !strstr(w->p[0].out, "2 of 2 trainers finished")) {
        dump(w, 0, "the server did not count both trainers");
        bad = 1;
    }
    fprintf(stderr, "bench_ps_churn: world done in %.0f s\n", program_now_s() - t0);
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0) {
            csv = true;
        } else if (strncmp(argv[i], "--cycles=", 9) == 0 && atoi(argv[i] + 9) >= MIN_CYCLES) {
            cycles = atoi(argv[i] + 9);
        } else {
            fprintf(stderr, "usage: bench_ps_churn [--csv] [--cycles=N (at least %d)]\n",
                    MIN_CYCLES);
            return 2;
        }
    }
    ps_world_t w;
    memset(&w, 0, sizeof w);
    snprintf(w.dir, sizeof w.dir, "/tmp/zdist_churnXXXXXX");
    int port = world_free_port();
    if (!mkdtemp(w.dir) || port <= 0)
        return 1;
    snprintf(w.a_world, sizeof w.a_world, "--world_size=%d", RANKS);
    snprintf(w.a_port, sizeof w.a_port, "--master_port=%d", port);
    snprintf(w.a_ck, sizeof w.a_ck, "--checkpoint=%s/c", w.dir);
    /* Each life moves trainer 2 on by KILL_AT - 1 batches; the last one
       has twice that left. */
    snprintf(w.a_max, sizeof w.a_max, "--max_batches=%d", (cycles + 2) * (KILL_AT - 1));
    double *rss = calloc((size_t)cycles, sizeof *rss);
    double *rejoin_s = calloc((size_t)cycles, sizeof *rejoin_s);
    if (!rss || !rejoin_s)
        return 1;
    if (!csv)
        printf("bench_ps_churn: rpc_ps, a server and two trainers; trainer %d killed and "
               "restarted %d times\n",
               VICTIM, cycles);
    int rc = run(&w, rss, rejoin_s);
    if (rc < 0) { /* what is still running goes */
        for (int r = 0; r < RANKS; r++)
            if (w.p[r].pid > 0 && waitpid(w.p[r].pid, NULL, WNOHANG) == 0) {
                kill(w.p[r].pid, SIGKILL);
                waitpid(w.p[r].pid, NULL, 0);
            }
    } else {
        double last = rss[cycles - 1];
        figure("ps_server_rss_growth_mb", last - rss[cycles / 2 - 1], "MB",
               "the server's memory, after the last death minus after the middle one");
        figure("ps_server_rss_mb", last, "MB", "the server's memory after the last death");
        qsort(rejoin_s, (size_t)cycles, sizeof *rejoin_s, cmp_double);
        figure("ps_trainer_rejoin_s_p50", rejoin_s[cycles / 2], "s",
               "a restarted trainer's start to its first batch");
        figure("cycles", cycles, "", "trainer deaths and rejoins");
    }
    for (int r = 0; r < RANKS; r++)
        free(w.p[r].out);
    free(rss);
    free(rejoin_s);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", w.dir);
    return (system(cmd) == 0 && rc == 0) ? 0 : 1;
}
