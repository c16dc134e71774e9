/* SPDX-License-Identifier: MIT */
/*  metrics_out.c: ZDIST_METRICS=DIR makes every process write its counters
    as JSON lines to a file of its own in DIR: one line every
    ZDIST_METRICS_INTERVAL_S seconds (10 by default) while RPC runs, and a
    last one (with "final": true) at zd_rpc_shutdown.

    The file is DIR/rank<R>.<worker>.jsonl, the worker name with any
    character other than letters, digits, '.', '_' and '-' replaced by '_';
    it is truncated at zd_rpc_init. A line holds the time, who wrote it, the
    counters of zd_rpc_metrics_get over all peers, those of
    zd_rpc_get_debug_info (the module's too, through its hooks: distributed
    autograd's) and the per-peer counters; docs/observability.md lists the
    fields.

    A thread of its own writes the periodic lines: it only reads the
    counters the call path updates anyway (atomics, and each peer's latency
    lock for a moment), so RPC calls do not wait for the disk. Each line is
    put together in memory and written with one write() to a file opened
    O_APPEND, so that a process killed meanwhile leaves whole lines. */
#define _GNU_SOURCE
#include "rpc/agent/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>

#define DEFAULT_INTERVAL_S 10.0
/*  The range $ZDIST_METRICS_INTERVAL_S may ask for, in s. */
#define MIN_INTERVAL_S 0.001
#define MAX_INTERVAL_S 1e6
#define DEBUG_ITEMS    64

struct metrics_out {
    agent_t *a;
    int fd;
    char *path;
    double interval_s;
    double start; /* monotonic seconds at zd_rpc_init */
    pthread_t thread;
    bool live;    /* RPC runs: shutdown writes the last line */
    bool started; /* the thread runs */
    pthread_mutex_t lock;
    pthread_cond_t wake; /* on the monotonic clock */
    bool stop;
};

static double mono_s(void)
{
    return (double)zd__now_ns() / (double)ZD__NS_PER_S;
}

/*  A JSON string: quotes, backslashes and control characters escaped. */
static void put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/*  A JSON number: JSON has no NaN or infinity. */
static void put_double(FILE *f, double x)
{
    fprintf(f, "%.6g", isfinite(x) ? x : 0.0);
}

static void put_counters(FILE *f, const zd_rpc_metrics_t *m)
{
    fprintf(f,
            "\"calls_sent\":%lld,\"calls_served\":%lld,\"errors\":%lld,"
            "\"bytes_sent\":%lld,\"bytes_received\":%lld,\"in_flight\":%lld,"
            "\"serving\":%lld,\"latency_mean_us\":",
            (long long)m->calls_sent, (long long)m->calls_served, (long long)m->errors,
            (long long)m->bytes_sent, (long long)m->bytes_received, (long long)m->in_flight,
            (long long)m->serving);
    put_double(f, m->latency_mean_us);
    fputs(",\"latency_p50_us\":", f);
    put_double(f, m->latency_p50_us);
    fputs(",\"latency_p99_us\":", f);
    put_double(f, m->latency_p99_us);
}

static int no_line(struct metrics_out *mo)
{
    zd__log(ZD_LOG_WARN, "rpc: metrics: out of memory: a line of %s is missing", mo->path);
    return zd_error_set_code(ZD_ERR_NO_MEMORY, "rpc: metrics: out of memory for a line of %s",
                             mo->path);
}

/*  One line, written whole. Called by the writer thread, or by shutdown
    once that thread is gone: never by two threads at once. 0, or -1 when
    the line could not be made (out of memory) or written (logged). */
static int write_line(struct metrics_out *mo, bool final)
{
    agent_t *a = mo->a;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return no_line(mo);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fprintf(f, "{\"time\":%lld.%03ld,\"worker\":", (long long)now.tv_sec,
            now.tv_nsec / ZD__NS_PER_MS);
    put_string(f, a->name);
    fprintf(f, ",\"rank\":%d,\"world_size\":%d,\"final\":%s,\"uptime_s\":%.3f,", a->net.rank,
            a->net.world, final ? "true" : "false", mono_s() - mo->start);
    zd_rpc_metrics_t m;
    zd__metrics_collect(a, -1, &m);
    put_counters(f, &m);
    zd_rpc_debug_item_t items[DEBUG_ITEMS];
    int n = zd_rpc_get_debug_info(items, DEBUG_ITEMS);
    fputs(",\"debug\":{", f);
    for (int i = 0; i < n && i < DEBUG_ITEMS; i++) {
        if (i)
            fputc(',', f);
        put_string(f, items[i].name);
        fprintf(f, ":%lld", (long long)items[i].value);
    }
    fputs("},\"peers\":[", f);
    for (int i = 0; i < a->net.world; i++) {
        zd__metrics_collect(a, i, &m);
        fprintf(f, "%s{\"rank\":%d,\"worker\":", i ? "," : "", i);
        put_string(f, a->net.peers[i].name);
        fputc(',', f);
        put_counters(f, &m);
        fputc('}', f);
    }
    fputs("]}\n", f);
    int rc = 0;
    if (fclose(f) != 0) {
        rc = no_line(mo);
        len = 0;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(mo->fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            rc = zd_error_set("rpc: metrics: cannot write %s: %s", mo->path, strerror(errno));
            zd__log(ZD_LOG_WARN, "%s", zd_error_last());
            break;
        }
        off += (size_t)w;
    }
    free(buf);
    return rc;
}

int zd__metrics_out_line(void)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return zd_error_set_code(ZD_ERR_NOT_INITIALIZED, "rpc: metrics: RPC is not running");
    int rc = a->metrics_out ? write_line(a->metrics_out, false)
                            : zd_error_set("rpc: metrics: ZDIST_METRICS is not set");
    zd__agent_release(a);
    return rc;
}

static void *writer(void *arg)
{
    struct metrics_out *mo = arg;
    double next = mono_s() + mo->interval_s;
    pthread_mutex_lock(&mo->lock);
    while (!mo->stop) {
        struct timespec ts = {.tv_sec = (time_t)next,
                              .tv_nsec = (long)((next - floor(next)) * (double)ZD__NS_PER_S)};
        if (pthread_cond_timedwait(&mo->wake, &mo->lock, &ts) != ETIMEDOUT || mo->stop)
            continue;
        pthread_mutex_unlock(&mo->lock);
        write_line(mo, false);
        pthread_mutex_lock(&mo->lock);
        /* A slow disk, or a machine that slept, skips lines rather than
           writing a burst of them. */
        double now = mono_s();
        next += mo->interval_s;
        if (next < now)
            next = now + mo->interval_s;
    }
    pthread_mutex_unlock(&mo->lock);
    return NULL;
}

/*  ZDIST_METRICS_INTERVAL_S: seconds, > 0. */
static int interval_from_env(double *out)
{
    const char *env = getenv("ZDIST_METRICS_INTERVAL_S");
    *out = DEFAULT_INTERVAL_S;
    if (!env || !*env)
        return 0;
    char *end;
    errno = 0;
    double x = strtod(env, &end);
    if (end == env || *end || errno || !isfinite(x) || x < MIN_INTERVAL_S || x > MAX_INTERVAL_S)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ZDIST_METRICS_INTERVAL_S=\"%s\": expected "
                                 "a number of seconds from 0.001 to 1e6",
                                 env);
    *out = x;
    return 0;
}

/*  mkdir -p: the processes of a world may race to create DIR. */
static int make_dirs(const char *dir)
{
    char *path = strdup(dir);
    if (!path)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    int rc = 0;
    for (char *p = path + 1;; p++) {
        if (*p && *p != '/')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            rc = zd_error_set("ZDIST_METRICS: cannot create the folder %s: %s", path,
                              strerror(errno));
            break;
        }
        *p = c;
        if (!c)
            break;
    }
    free(path);
    return rc;
}

static char *file_path(const char *dir, const agent_t *a)
{
    char name[ZD_RPC_MAX_NAME + 1];
    size_t i = 0;
    for (; a->name[i] && i < ZD_RPC_MAX_NAME; i++) {
        char c = a->name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '_' || c == '-';
        name[i] = ok ? c : '_';
    }
    name[i] = '\0';
    char *path = NULL;
    if (asprintf(&path, "%s/rank%d.%s.jsonl", dir, a->net.rank, name) < 0)
        return NULL;
    return path;
}

static void metrics_out_free(struct metrics_out *mo)
{
    if (mo->fd >= 0)
        close(mo->fd);
    pthread_cond_destroy(&mo->wake);
    pthread_mutex_destroy(&mo->lock);
    free(mo->path);
    free(mo);
}

int zd__metrics_out_open(agent_t *a)
{
    const char *dir = getenv("ZDIST_METRICS");
    if (!dir || !*dir)
        return 0;
    double interval;
    if (interval_from_env(&interval) < 0 || make_dirs(dir) < 0)
        return -1;
    struct metrics_out *mo = calloc(1, sizeof *mo);
    if (!mo)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ZDIST_METRICS: out of memory");
    mo->a = a;
    mo->fd = -1;
    mo->interval_s = interval;
    mo->start = mono_s();
    pthread_mutex_init(&mo->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&mo->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (!(mo->path = file_path(dir, a))) {
        metrics_out_free(mo);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "ZDIST_METRICS: out of memory");
    }
    mo->fd = open(mo->path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (mo->fd < 0) {
        zd_error_set("ZDIST_METRICS: cannot create %s: %s", mo->path, strerror(errno));
        metrics_out_free(mo);
        return -1;
    }
    a->metrics_out = mo;
    return 0;
}

void zd__metrics_out_start(agent_t *a)
{
    struct metrics_out *mo = a->metrics_out;
    if (!mo)
        return;
    mo->live = true;
    int rc = pthread_create(&mo->thread, NULL, writer, mo);
    mo->started = rc == 0;
    if (rc != 0)
        zd__log(ZD_LOG_WARN, "rpc: metrics: no thread (%s): %s gets its last line only",
                strerror(rc), mo->path);
    zd__log(ZD_LOG_INFO, "rpc: metrics to %s every %g s", mo->path, mo->interval_s);
}

void zd__metrics_out_close(agent_t *a)
{
    struct metrics_out *mo = a->metrics_out;
    if (!mo)
        return;
    a->metrics_out = NULL;
    if (mo->started) {
        pthread_mutex_lock(&mo->lock);
        mo->stop = true;
        pthread_cond_signal(&mo->wake);
        pthread_mutex_unlock(&mo->lock);
        pthread_join(mo->thread, NULL);
    }
    if (mo->live)
        write_line(mo, true);
    metrics_out_free(mo);
}
