/* SPDX-License-Identifier: MIT */
/*  log.c: the library's log lines: level, rate limit, stderr or a sink. */
#include "core/log_private.h"
#include "core/clock.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define LEVEL_UNSET (-1)

static atomic_int g_level = LEVEL_UNSET;

/*  One lock for who, the sink and the writing itself: a line is written (or
    given to the sink) whole, and once zd_log_set_sink returns the old sink is
    not running, so its arg may be freed. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static zd_log_sink_fn *g_sink;
static void *g_sink_arg;
static char g_who[96];

/*  The rate limit: one process-wide budget per second of the monotonic
    clock. Process-wide rather than per agent because the log is: a flood is
    a flood wherever it comes from, and lines logged outside an agent's life
    (nn/, optim/) must be bounded too. Within it, each kind of line (its
    call site) has a budget of its own, so that a peer flooding
    one kind cannot hide the lines of another (the evidence of a second
    attack, say) behind it. Errors are exempt: they are rare by nature, and
    the one that explains a failure must never be the one lost. */
#define KIND_SLOTS 64 /* 1 << 6: the hash's top 6 bits */
#define KIND_PROBE 8

static pthread_mutex_t g_budget_lock = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_window = -1; /* the second the counts are of */
static int g_used, g_dropped;
static struct {
    const void *kind; /* what zd__log_as was given: zd__log's call site */
    int64_t window;
    int used;
} g_kinds[KIND_SLOTS];

static const char *level_name(zd_log_level_t level)
{
    switch (level) {
    case ZD_LOG_ERROR:
        return "ERROR";
    case ZD_LOG_WARN:
        return "WARN";
    case ZD_LOG_INFO:
        return "INFO";
    case ZD_LOG_DEBUG:
        return "DEBUG";
    }
    return "?";
}

static int clamp(int level)
{
    return level < ZD_LOG_ERROR ? ZD_LOG_ERROR : level > ZD_LOG_DEBUG ? ZD_LOG_DEBUG : level;
}

static void emit(zd_log_level_t level, const char *text)
{
    pthread_mutex_lock(&g_lock);
    if (g_sink) {
        g_sink(level, g_who, text, g_sink_arg);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char stamp[40];
        size_t n = strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(stamp + n, sizeof stamp - n, ".%03dZ", (int)(ts.tv_nsec / ZD__NS_PER_MS));
        char line[1400];
        snprintf(line, sizeof line, "%s %-5s zdist%s%s%s %s\n", stamp, level_name(level),
                 g_who[0] ? " [" : "", g_who, g_who[0] ? "]" : "", text);
        /* One call per line: stderr is unbuffered, and lines of other
           processes sharing the terminal stay whole too. */
        fputs(line, stderr);
    }
    pthread_mutex_unlock(&g_lock);
}

/*  The count of lines of this kind this second: the slot it holds, else a free
    one near its hash (a table full of this second's kinds shares the
    hash's slot: a shared budget, never none). Under g_budget_lock. */
static int *kind_used(const void *kind, int64_t window)
{
    /* Fibonacci hashing: the sites' texts lie side by side in .rodata */
    size_t h = (size_t)(((uint64_t)(uintptr_t)kind * UINT64_C(0x9E3779B97F4A7C15)) >> 58);
    for (int i = 0; i < KIND_PROBE; i++) {
        size_t k = (h + (size_t)i) % KIND_SLOTS;
        if (g_kinds[k].window == window && g_kinds[k].kind == kind)
            return &g_kinds[k].used;
    }
    for (int i = 0; i < KIND_PROBE; i++) {
        size_t k = (h + (size_t)i) % KIND_SLOTS;
        if (g_kinds[k].window != window) {
            g_kinds[k].kind = kind;
            g_kinds[k].window = window;
            g_kinds[k].used = 0;
            return &g_kinds[k].used;
        }
    }
    return &g_kinds[h].used;
}

/*  Whether a line of this kind below ERROR may pass this second. The first
    line of a new second reports how many the previous ones dropped. */
static int within_budget(const void *kind)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t window = ts.tv_sec;
    pthread_mutex_lock(&g_budget_lock);
    int dropped = 0;
    if (window != g_window) {
        g_window = window;
        g_used = 0;
        dropped = g_dropped;
        g_dropped = 0;
    }
    int *used = kind_used(kind, window);
    int ok = g_used < ZD_LOG_BUDGET && *used < ZD_LOG_BUDGET_KIND;
    if (ok) {
        g_used++;
        (*used)++;
    } else {
        g_dropped++;
    }
    pthread_mutex_unlock(&g_budget_lock);
    if (dropped > 0) {
        char text[128];
        snprintf(text, sizeof text,
                 "log: %d line(s) dropped by the rate limit (%d a second, %d of a kind)", dropped,
                 ZD_LOG_BUDGET, ZD_LOG_BUDGET_KIND);
        emit(ZD_LOG_WARN, text);
    }
    return ok;
}

zd_log_level_t zd_log_get_level(void)
{
    int level = atomic_load(&g_level);
    if (level != LEVEL_UNSET)
        return (zd_log_level_t)level;
    static const char *const names[] = {"error", "warn", "info", "debug"};
    const char *env = getenv("ZDIST_LOG_LEVEL");
    int parsed = ZD_LOG_WARN;
    int bad = 0;
    if (env && *env) {
        bad = 1;
        for (int i = 0; i < 4; i++)
            if (strcasecmp(env, names[i]) == 0) {
                parsed = i;
                bad = 0;
            }
    }
    int expected = LEVEL_UNSET;
    /* Only the thread that sets the level warns, so the warning is written
       once however many threads log first. */
    if (atomic_compare_exchange_strong(&g_level, &expected, parsed)) {
        if (bad)
            zd__log(ZD_LOG_WARN,
                    "log: ZDIST_LOG_LEVEL=\"%.40s\" is not error, warn, info or "
                    "debug: using warn",
                    env);
        return (zd_log_level_t)parsed;
    }
    return (zd_log_level_t)expected;
}

void zd_log_set_level(zd_log_level_t level)
{
    atomic_store(&g_level, clamp((int)level));
}

int zd_log_enabled(zd_log_level_t level)
{
    return (int)level <= (int)zd_log_get_level();
}

void zd_log_set_sink(zd_log_sink_fn *fn, void *arg)
{
    pthread_mutex_lock(&g_lock);
    g_sink = fn;
    g_sink_arg = fn ? arg : NULL;
    pthread_mutex_unlock(&g_lock);
}

void zd__log_set_who(const char *who)
{
    pthread_mutex_lock(&g_lock);
    snprintf(g_who, sizeof g_who, "%s", who ? who : "");
    pthread_mutex_unlock(&g_lock);
}

void zd__log_as(zd_log_level_t level, const void *kind, const char *fmt, ...)
{
    level = (zd_log_level_t)clamp((int)level);
    if (!zd_log_enabled(level))
        return;
    if (level != ZD_LOG_ERROR && !within_budget(kind))
        return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    emit(level, text);
}

void zd__log_reset(void)
{
    atomic_store(&g_level, LEVEL_UNSET);
    pthread_mutex_lock(&g_budget_lock);
    g_window = -1;
    g_used = 0;
    g_dropped = 0;
    memset(g_kinds, 0, sizeof g_kinds);
    pthread_mutex_unlock(&g_budget_lock);
}
