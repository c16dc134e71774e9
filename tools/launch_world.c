/* SPDX-License-Identifier: MIT */
/*  launch_world.c: the running world of tools/launch: one poll() loop over
    the ranks' pipes and a signalfd. Output is relayed line by line with a
    "[rank R] " prefix; a rank that fails is started again while it has
    restarts left (--max_restarts), else it is reported and the others are
    stopped (SIGTERM to each rank's process group, SIGKILL --grace_s later).
    launch is a child subreaper, so what the ranks started is reparented to
    it when they die; the loop ends only when waitpid() says no child is left,
    so nothing outlives launch. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tools/launch.h"

const char *launch_processes(int n)
{
    return n == 1 ? "process" : "processes";
}

double launch_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/*  ---- relaying output ---- */

/*  Writes all of iov. Blocks while the reader is slow, which in turn slows
    the children down: nothing is dropped. launch is the only writer of its
    stdout/stderr and writes whole lines, so lines never mix. */
static void write_all(launch_t *L, int fd, struct iovec *v, int cnt)
{
    while (cnt > 0 && !L->out_dead[fd]) {
        ssize_t w = writev(fd, v, cnt);
        if (w < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, -1);
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            L->out_dead[fd] = true; /* e.g. EPIPE: nobody reads any more */
            return;
        }
        while (cnt > 0 && (size_t)w >= v->iov_len) {
            w -= v->iov_len;
            v++;
            cnt--;
        }
        if (cnt > 0) {
            v->iov_base = (char *)v->iov_base + w;
            v->iov_len -= w;
        }
    }
}

/*  Lines of one stream gathered for one writev: one system call per read
    rather than per line. */
#define BATCH_LINES 256

typedef struct {
    char prefix[32];
    size_t prefix_len;
    struct iovec iov[2 * BATCH_LINES];
    int n;
} batch_t;

/*  i: the process's index on this node; the prefix names its global rank. */
static void batch_init(const launch_t *L, batch_t *b, int i)
{
    b->prefix_len = (size_t)snprintf(b->prefix, sizeof b->prefix, "[rank %d] ", launch_rank(L, i));
    b->n = 0;
}

static void batch_flush(launch_t *L, int fd, batch_t *b)
{
    write_all(L, fd, b->iov, b->n);
    b->n = 0;
}

/*  data[0..n) is a line with its newline. */
static void batch_add(launch_t *L, int fd, batch_t *b, const char *data, size_t n)
{
    if (b->n + 2 > 2 * BATCH_LINES)
        batch_flush(L, fd, b);
    b->iov[b->n++] = (struct iovec){b->prefix, b->prefix_len};
    b->iov[b->n++] = (struct iovec){(void *)data, n};
}

/*  Writes "[rank R] " data "\n" for data without a newline of its own. */
static void write_line(launch_t *L, int fd, int rank, const char *data, size_t n)
{
    batch_t b;
    batch_init(L, &b, rank);
    b.iov[0] = (struct iovec){b.prefix, b.prefix_len};
    b.iov[1] = (struct iovec){(void *)data, n};
    b.iov[2] = (struct iovec){"\n", 1};
    write_all(L, fd, b.iov, 3);
}

static void stream_close(launch_t *L, int rank, stream_t *s)
{
    if (s->len > 0)
        write_line(L, s->out, rank, s->buf, s->len); /* the last line had no newline */
    if (s->fd >= 0)
        close(s->fd);
    free(s->buf);
    *s = (stream_t){.fd = -1, .out = s->out};
}

/*  Reads what is available once and relays the complete lines. Returns the
    bytes read, 0 if none were ready, -1 at end of file (the stream is then
    closed). */
static ssize_t stream_read(launch_t *L, int rank, stream_t *s)
{
    if (s->cap - s->len < READ_CHUNK) {
        size_t cap = s->len + 2 * READ_CHUNK;
        char *b = realloc(s->buf, cap);
        if (!b) {
            stream_close(L, rank, s);
            fprintf(stderr, "launch: out of memory: no more output relayed from rank %d\n",
                    launch_rank(L, rank));
            return -1;
        }
        s->buf = b;
        s->cap = cap;
    }
    ssize_t n = read(s->fd, s->buf + s->len, s->cap - s->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 0;
    if (n <= 0) {
        stream_close(L, rank, s);
        return -1;
    }
    size_t start = 0;
    char *nl = s->buf + s->len, *end = nl + n;
    batch_t b;
    batch_init(L, &b, rank);
    while ((nl = memchr(nl, '\n', end - nl)) != NULL) {
        nl++;
        batch_add(L, s->out, &b, s->buf + start, nl - (s->buf + start));
        start = nl - s->buf;
    }
    batch_flush(L, s->out, &b);
    s->len += n;
    while (s->len - start >= LINE_MAX_BYTES) {
        write_line(L, s->out, rank, s->buf + start, LINE_MAX_BYTES);
        start += LINE_MAX_BYTES;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    return n;
}

/*  A reaped rank's output is all in its pipes already: relay it before
    reporting how the rank ended. A process it left behind may still hold the
    pipe open, hence the bound instead of waiting for end of file. */
static void drain(launch_t *L, int rank)
{
    for (int k = 0; k < 2; k++) {
        stream_t *s = &L->procs[rank].streams[k];
        size_t total = 0;
        while (s->fd >= 0 && total < DRAIN_MAX_BYTES) {
            ssize_t n = stream_read(L, rank, s);
            if (n <= 0)
                break;
            total += n;
        }
        if (s->fd >= 0)
            stream_close(L, rank, s);
    }
}

/*  With --log_dir the failing rank's output is in its file, not on the
    terminal: show its last lines, where the reason usually is. */
static void print_log_tail(launch_t *L, int i)
{
    const char *path = L->procs[i].log_path;
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "launch: cannot read %s: %s\n", path, strerror(errno));
        return;
    }
    static char buf[TAIL_BYTES + 1];
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    long from = size > TAIL_BYTES ? size - TAIL_BYTES : 0;
    size_t n = size >= 0 && fseek(f, from, SEEK_SET) == 0 ? fread(buf, 1, TAIL_BYTES, f) : 0;
    fclose(f);
    buf[n] = '\0';
    while (n > 0 && buf[n - 1] == '\n')
        buf[--n] = '\0';
    size_t start = n;
    int lines = 0;
    while (start > 0 && lines < TAIL_LINES)
        lines += buf[--start] == '\n';
    if (buf[start] == '\n')
        start++;
    if (n == 0) {
        fprintf(stderr, "launch: %s is empty\n", path);
        return;
    }
    fprintf(stderr, "launch: last lines of %s:\n", path);
    for (char *l = buf + start; l < buf + n;) {
        char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        write_line(L, STDERR_FILENO, i, l, len);
        l += len + 1;
    }
}

/*  ---- stopping ---- */

static const char *sig_name(int sig)
{
    static char buf[32];
    const char *abbrev = sigabbrev_np(sig);
    if (abbrev)
        snprintf(buf, sizeof buf, "SIG%s", abbrev);
    else
        snprintf(buf, sizeof buf, "signal %d", sig);
    return buf;
}

static void signal_world(launch_t *L, int sig)
{
    for (int r = 0; r < L->started; r++) {
        proc_t *p = &L->procs[r];
        if (!p->alive && !L->leftovers)
            continue;
        /* The group holds the rank and what it started; a rank that left its
           group is still signalled itself. */
        if (kill(-p->pid, sig) < 0 && errno == ESRCH && p->alive)
            kill(p->pid, sig);
    }
}

void launch_stop(launch_t *L, int sig)
{
    if (L->grace_s > 0 && sig != SIGKILL) {
        signal_world(L, sig);
        L->stop_sig = sig;
        L->phase = STOPPING;
        L->deadline = launch_now() + L->grace_s;
    } else {
        signal_world(L, SIGKILL);
        L->phase = KILLING;
        L->deadline = launch_now() + KILL_WAIT_S;
    }
}

static void on_signal(launch_t *L, int sig)
{
    if (L->phase == RUNNING) {
        fprintf(stderr, "launch: received %s; stopping %d %s\n", sig_name(sig), L->alive,
                launch_processes(L->alive));
        if (L->exit_code < 0)
            L->exit_code = 128 + sig;
        launch_stop(L, sig); /* forwarded as it is: programs may handle SIGINT */
    } else if (L->phase == STOPPING) {
        fprintf(stderr, "launch: received %s again; killing %d %s\n", sig_name(sig), L->alive,
                launch_processes(L->alive));
        launch_stop(L, SIGKILL);
    }
}

/*  The failure that stops the world. */
static void report_failure(launch_t *L, int rank, int status)
{
    proc_t *p = &L->procs[rank];
    if (WIFEXITED(status))
        fprintf(stderr, "launch: rank %d exited with status %d (pid %d)\n", launch_rank(L, rank),
                WEXITSTATUS(status), (int)p->pid);
    else
        fprintf(stderr, "launch: rank %d killed by signal %d (%s, pid %d)\n", launch_rank(L, rank),
                WTERMSIG(status), sig_name(WTERMSIG(status)), (int)p->pid);
    if (p->log_path)
        print_log_tail(L, rank);
    if (L->max_restarts > 0)
        fprintf(stderr, "launch: rank %d has no restarts left (--max_restarts=%d)\n",
                launch_rank(L, rank), L->max_restarts);
}

/*  --max_restarts: the failed rank starts again in place while the others
    keep running. Whatever it started goes first (SIGKILL to its process
    group): orphans of a dead rank may hold its ports or files, and the new
    process starts its own. Returns 1 when the rank runs again, 0 when it has
    no restarts left, -1 when it could not be started again (said why). */
static int restart(launch_t *L, int rank, int status)
{
    proc_t *p = &L->procs[rank];
    if (p->restarts >= L->max_restarts)
        return 0;
    p->restarts++;
    if (WIFEXITED(status))
        fprintf(stderr,
                "launch: rank %d (pid %d) exited with status %d; restarting it "
                "(restart %d of %d)\n",
                launch_rank(L, rank), (int)p->pid, WEXITSTATUS(status), p->restarts,
                L->max_restarts);
    else
        fprintf(stderr,
                "launch: rank %d (pid %d) was killed by %s; restarting it "
                "(restart %d of %d)\n",
                launch_rank(L, rank), (int)p->pid, sig_name(WTERMSIG(status)), p->restarts,
                L->max_restarts);
    if (p->log_path)
        print_log_tail(L, rank);
    kill(-p->pid, SIGKILL);
    if (launch_start_rank(L, rank) < 0)
        return -1;
    fprintf(stderr, "launch: rank %d restarted as pid %d%s\n", launch_rank(L, rank), (int)p->pid,
            L->add_resume ? " with --resume" : "");
    return 1;
}

static void on_exit_status(launch_t *L, int rank, int status)
{
    proc_t *p = &L->procs[rank];
    p->alive = false;
    L->alive--;
    drain(L, rank);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (L->phase != RUNNING || code == 0)
        return; /* after a stop began, exits are the stop's doing */
    int restarted = restart(L, rank, status);
    if (restarted == 1)
        return;
    if (restarted == 0)
        report_failure(L, rank, status);
    L->exit_code = code;
    if (L->alive > 0) {
        fprintf(stderr, "launch: stopping the other %d %s\n", L->alive, launch_processes(L->alive));
        launch_stop(L, SIGTERM);
    }
}

/*  Reaps every exited child: ranks, and orphans reparented to launch.
    Returns whether any child is left. */
static bool reap(launch_t *L)
{
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid == 0)
            return true;
        if (pid < 0)
            return errno != ECHILD;
        for (int r = 0; r < L->started; r++)
            if (L->procs[r].pid == pid && L->procs[r].alive)
                on_exit_status(L, r, status);
    }
}

/*  ---- the loop ---- */

static void check_deadlines(launch_t *L)
{
    double t = launch_now();
    if (L->phase == RUNNING && L->timeout_s > 0 && t >= L->start + L->timeout_s) {
        fprintf(stderr, "launch: still running after --timeout_s=%g; stopping %d %s\n",
                L->timeout_s, L->alive, launch_processes(L->alive));
        if (L->exit_code < 0)
            L->exit_code = EXIT_TIMEOUT;
        launch_stop(L, SIGTERM);
    } else if (L->phase == STOPPING && t >= L->deadline) {
        for (int r = 0; r < L->started; r++)
            if (L->procs[r].alive)
                fprintf(stderr,
                        "launch: rank %d still running %g s after %s; "
                        "sending SIGKILL\n",
                        launch_rank(L, r), L->grace_s, sig_name(L->stop_sig));
        if (L->leftovers)
            fprintf(stderr,
                    "launch: processes left behind still running %g s after "
                    "%s; sending SIGKILL\n",
                    L->grace_s, sig_name(L->stop_sig));
        launch_stop(L, SIGKILL);
    }
}

static int poll_timeout_ms(launch_t *L)
{
    double until = -1;
    if (L->phase != RUNNING)
        until = L->deadline;
    else if (L->timeout_s > 0)
        until = L->start + L->timeout_s;
    if (until < 0)
        return -1; /* nothing to do until a child exits or a signal comes */
    double ms = ceil((until - launch_now()) * 1000);
    return ms < 0 ? 0 : ms > 3600e3 ? 3600000 : (int)ms;
}

static void read_signals(launch_t *L)
{
    struct signalfd_siginfo si;
    while (read(L->sigfd, &si, sizeof si) == (ssize_t)sizeof si)
        if (si.ssi_signo != SIGCHLD)
            on_signal(L, (int)si.ssi_signo);
    /* SIGCHLD needs nothing here: the loop reaps at every turn. */
}

static void loop(launch_t *L)
{
    struct pollfd pfd[1 + 2 * MAX_PROCS];
    int who[1 + 2 * MAX_PROCS]; /* rank * 2 + stream for each pfd after the first */
    for (;;) {
        bool children = reap(L);
        if (!children)
            return;
        if (L->alive == 0 && !L->leftovers) {
            /* Every rank is gone but something one of them started is not:
               from now on their process groups are signalled too. */
            L->leftovers = true;
            if (L->phase == RUNNING) {
                fprintf(stderr, "launch: stopping processes the world left behind\n");
                launch_stop(L, SIGTERM);
            } else {
                signal_world(L, L->phase == KILLING ? SIGKILL : L->stop_sig);
            }
        }
        check_deadlines(L);
        if (L->phase == KILLING && launch_now() >= L->deadline) {
            fprintf(stderr, "launch: giving up: processes still there %g s after SIGKILL\n",
                    KILL_WAIT_S);
            return;
        }
        int n = 0;
        pfd[n++] = (struct pollfd){.fd = L->sigfd, .events = POLLIN};
        for (int r = 0; r < L->started; r++)
            for (int k = 0; k < 2; k++)
                if (L->procs[r].streams[k].fd >= 0) {
                    who[n] = r * 2 + k;
                    pfd[n++] = (struct pollfd){.fd = L->procs[r].streams[k].fd, .events = POLLIN};
                }
        int rc = poll(pfd, n, poll_timeout_ms(L));
        if (rc < 0 && errno != EINTR) {
            fprintf(stderr, "launch: poll: %s\n", strerror(errno));
            if (L->exit_code < 0)
                L->exit_code = 1;
            launch_stop(L, SIGKILL);
            continue;
        }
        if (rc <= 0)
            continue;
        if (pfd[0].revents)
            read_signals(L);
        for (int i = 1; i < n; i++) {
            stream_t *s = &L->procs[who[i] / 2].streams[who[i] % 2];
            if (pfd[i].revents && s->fd == pfd[i].fd)
                stream_read(L, who[i] / 2, s);
        }
    }
}

void launch_run(launch_t *L)
{
    loop(L);
    for (int r = 0; r < L->started; r++)
        for (int k = 0; k < 2; k++)
            if (L->procs[r].streams[k].fd >= 0)
                stream_close(L, r, &L->procs[r].streams[k]);
}
