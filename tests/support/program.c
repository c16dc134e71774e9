/* SPDX-License-Identifier: MIT */
/*  program.c: running the built programs, as program.h says. */
#define _GNU_SOURCE /* syscall */
#include "tests/support/program.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

const char *program_path(const char *rel)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    const char *dir = getenv("ZDIST_BUILD_DIR");
    snprintf(b, sizeof bufs[0], "%s/%s", dir && *dir ? dir : ".", rel);
    return b;
}

double program_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int program_start(program_t *p, char *const argv[])
{
    int fds[2];
    memset(p, 0, sizeof *p);
    if (pipe(fds) < 0)
        return -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    int rc = posix_spawn(&p->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return -1;
    }
    p->fd = fds[0];
    return 0;
}

int program_read(program_t *p, const char *until, double deadline)
{
    for (;;) {
        if (until && p->out && strstr(p->out, until))
            return 1;
        double left = deadline - program_now_s();
        if (left <= 0)
            return 0;
        struct pollfd pfd = {p->fd, POLLIN, 0};
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        if (p->len + 4097 > p->cap) {
            p->cap = p->cap ? p->cap * 2 : 65536;
            p->out = realloc(p->out, p->cap);
        }
        ssize_t n = read(p->fd, p->out + p->len, 4096);
        if (n <= 0)
            return until ? 0 : 1;
        p->len += (size_t)n;
        p->out[p->len] = '\0';
    }
}

int program_wait(program_t *p, double deadline)
{
    program_read(p, NULL, deadline);
    int status, pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    struct pollfd pfd = {pidfd, POLLIN, 0};
    double left = deadline - program_now_s();
    if (pidfd < 0 || poll(&pfd, 1, left > 0 ? (int)(left * 1000) + 1 : 0) <= 0)
        kill(p->pid, SIGKILL); /* out of time */
    waitpid(p->pid, &status, 0);
    if (pidfd >= 0)
        close(pidfd);
    close(p->fd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int program_run(char *const argv[], int timeout_s, bool expect_ok, char **output)
{
    program_t p;
    int rc = -1;
    if (program_start(&p, argv) == 0)
        rc = program_wait(&p, program_now_s() + timeout_s);
    *output = p.out ? p.out : strdup("");
    if ((rc == 0) != expect_ok) {
        fprintf(stderr, "exited with %d:", rc);
        for (int i = 0; argv[i]; i++)
            fprintf(stderr, " %s", argv[i]);
        fprintf(stderr, "\n%s\n", *output);
    }
    return rc;
}

int program_run_world(const char *prog, int nproc, const char *flags, bool expect_ok, char **output)
{
    char nproc_flag[32], words[2048];
    char *argv[64];
    int n = 0;
    snprintf(nproc_flag, sizeof nproc_flag, "--nproc=%d", nproc);
    argv[n++] = (char *)program_path("tools/launch");
    argv[n++] = nproc_flag;
    argv[n++] = "--timeout_s=600";
    argv[n++] = "--";
    argv[n++] = (char *)program_path(prog);
    if (snprintf(words, sizeof words, "%s", flags) >= (int)sizeof words) {
        fprintf(stderr, "program_run_world: flags too long: %s\n", flags);
        *output = strdup("");
        return -1;
    }
    for (char *save, *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
        if (n == 63) {
            fprintf(stderr, "program_run_world: too many flags: %s\n", flags);
            *output = strdup("");
            return -1;
        }
        argv[n++] = w;
    }
    argv[n] = NULL;
    /* launch stops the world at 600 s; the minute more is for launch itself */
    return program_run(argv, 660, expect_ok, output);
}
