/* SPDX-License-Identifier: MIT */
/*  The library's log: levels, ZDIST_LOG_LEVEL, the sink, the stderr format,
    the rate limit, and the worker's name on the lines of a real world. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/log_private.h"
#include <zdist/rpc.h>
#include "tests/support/world.h"

/*  ---- a sink that records ---- */

#define MAX_LINES 512

typedef struct {
    zd_log_level_t level;
    char who[64];
    char line[256];
} rec_t;

static pthread_mutex_t g_rec_lock = PTHREAD_MUTEX_INITIALIZER;
static rec_t g_rec[MAX_LINES];
static int g_n_rec;

static void record(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    int *calls = arg;
    pthread_mutex_lock(&g_rec_lock);
    if (calls)
        ++*calls;
    if (g_n_rec < MAX_LINES) {
        g_rec[g_n_rec].level = level;
        snprintf(g_rec[g_n_rec].who, sizeof g_rec[g_n_rec].who, "%s", who);
        snprintf(g_rec[g_n_rec].line, sizeof g_rec[g_n_rec].line, "%s", line);
        g_n_rec++;
    }
    pthread_mutex_unlock(&g_rec_lock);
}

/*  The first recorded line containing text, or NULL. */
static const rec_t *find(const char *text)
{
    const rec_t *r = NULL;
    pthread_mutex_lock(&g_rec_lock);
    for (int i = 0; i < g_n_rec && !r; i++)
        if (strstr(g_rec[i].line, text))
            r = &g_rec[i];
    pthread_mutex_unlock(&g_rec_lock);
    return r;
}

static int count(const char *text)
{
    int n = 0;
    pthread_mutex_lock(&g_rec_lock);
    for (int i = 0; i < g_n_rec; i++)
        n += strstr(g_rec[i].line, text) != NULL;
    pthread_mutex_unlock(&g_rec_lock);
    return n;
}

static int setup(void **state)
{
    (void)state;
    g_n_rec = 0;
    unsetenv("ZDIST_LOG_LEVEL");
    zd__log_reset();
    zd__log_set_who(NULL);
    zd_log_set_sink(record, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    zd_log_set_sink(NULL, NULL);
    zd__log_set_who(NULL);
    zd__log_reset();
    return 0;
}

/*  ---- levels ---- */

static void test_levels_filter(void **state)
{
    (void)state;
    assert_int_equal(zd_log_get_level(), ZD_LOG_WARN); /* the default */
    zd__log(ZD_LOG_DEBUG, "line %s", "debug");
    zd__log(ZD_LOG_INFO, "line %s", "info");
    zd__log(ZD_LOG_WARN, "line %s", "warn");
    zd__log(ZD_LOG_ERROR, "line %s", "error");
    assert_int_equal(g_n_rec, 2);
    assert_int_equal(g_rec[0].level, ZD_LOG_WARN);
    assert_string_equal(g_rec[0].line, "line warn");
    assert_int_equal(g_rec[1].level, ZD_LOG_ERROR);

    zd_log_set_level(ZD_LOG_DEBUG);
    assert_true(zd_log_enabled(ZD_LOG_DEBUG));
    zd__log(ZD_LOG_DEBUG, "now debug");
    assert_non_null(find("now debug"));
    zd_log_set_level(ZD_LOG_ERROR);
    assert_false(zd_log_enabled(ZD_LOG_WARN));
    assert_true(zd_log_enabled(ZD_LOG_ERROR));
    zd__log(ZD_LOG_WARN, "hidden");
    assert_null(find("hidden"));
    zd_log_set_level((zd_log_level_t)42); /* clamped */
    assert_int_equal(zd_log_get_level(), ZD_LOG_DEBUG);
}

/*  ---- ZDIST_LOG_LEVEL ---- */

static void test_env_level(void **state)
{
    (void)state;
    static const struct {
        const char *value;
        zd_log_level_t level;
    } cases[] = {
        {"error", ZD_LOG_ERROR}, {"WARN", ZD_LOG_WARN}, {"Info", ZD_LOG_INFO},
        {"dEbUg", ZD_LOG_DEBUG}, {"", ZD_LOG_WARN},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("ZDIST_LOG_LEVEL", cases[i].value, 1);
        zd__log_reset();
        assert_int_equal(zd_log_get_level(), cases[i].level);
    }
    assert_int_equal(g_n_rec, 0); /* no warning for a known value */

    /* An unknown value: the default and one warning, however often read. */
    setenv("ZDIST_LOG_LEVEL", "loud", 1);
    zd__log_reset();
    assert_int_equal(zd_log_get_level(), ZD_LOG_WARN);
    assert_int_equal(zd_log_get_level(), ZD_LOG_WARN);
    zd__log(ZD_LOG_WARN, "after");
    assert_int_equal(count("ZDIST_LOG_LEVEL=\"loud\""), 1);
    assert_int_equal(find("ZDIST_LOG_LEVEL")->level, ZD_LOG_WARN);

    /* Read once: changing the environment later changes nothing... */
    setenv("ZDIST_LOG_LEVEL", "debug", 1);
    assert_int_equal(zd_log_get_level(), ZD_LOG_WARN);
    /* ...and zd_log_set_level before the first read wins over it. */
    zd__log_reset();
    zd_log_set_level(ZD_LOG_ERROR);
    assert_int_equal(zd_log_get_level(), ZD_LOG_ERROR);
    unsetenv("ZDIST_LOG_LEVEL");
}

/*  ---- the sink ---- */

static void test_sink_gets_level_who_line(void **state)
{
    (void)state;
    int calls = 0;
    zd_log_set_sink(record, &calls);
    zd__log_set_who("worker1/1");
    zd__log(ZD_LOG_WARN, "hello %d", 7);
    assert_int_equal(calls, 1);
    assert_int_equal(g_rec[0].level, ZD_LOG_WARN);
    assert_string_equal(g_rec[0].who, "worker1/1");
    assert_string_equal(g_rec[0].line, "hello 7");
    zd__log_set_who(NULL);
    zd__log(ZD_LOG_ERROR, "bye");
    assert_int_equal(calls, 2);
    assert_string_equal(g_rec[1].who, "");
    assert_int_equal(g_rec[1].level, ZD_LOG_ERROR);
}

/*  Runs zd__log with stderr sent to a temporary file; returns what it got. */
static void capture_stderr(char *out, size_t size, void (*fn)(void))
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(2);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), 2) == 2);
    fn();
    fflush(stderr);
    assert_true(dup2(saved, 2) == 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, size - 1, tmp);
    out[n] = 0;
    fclose(tmp);
}

static void log_two_lines(void)
{
    zd__log_set_who("worker1/1");
    zd__log(ZD_LOG_WARN, "rpc: dropped %d bytes", 12);
    zd__log_set_who(NULL);
    zd__log(ZD_LOG_ERROR, "no worker here");
}

static void test_null_sink_restores_stderr(void **state)
{
    (void)state;
    zd_log_set_sink(NULL, NULL);
    char text[1024];
    capture_stderr(text, sizeof text, log_two_lines);
    assert_int_equal(g_n_rec, 0); /* the old sink is no longer called */
    regex_t re;
    assert_int_equal(regcomp(&re,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                             "WARN  zdist \\[worker1/1\\] rpc: dropped 12 bytes\n"
                             "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
                             "ERROR zdist no worker here\n$",
                             REG_EXTENDED),
                     0);
    int rc = regexec(&re, text, 0, NULL, 0);
    regfree(&re);
    if (rc != 0)
        fail_msg("stderr was:\n%s", text);
}

/*  ---- the rate limit ---- */

static int64_t mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
}

/*  The lines that pass when each of `kinds` kinds (at most 10) is logged
    `each` times, through zd__log_as: one kind per element of kind_ids. */
static int log_kinds(int kinds, int each)
{
    static const char kind_ids[10];
    for (int i = 0; i < each; i++)
        for (int k = 0; k < kinds; k++)
            zd__log_as(ZD_LOG_WARN, &kind_ids[k], "spam %d %d", k, i);
    return count("spam ");
}

/*  Runs log_kinds(kinds, each) until it ran within one second of the
    monotonic clock (a loaded machine may pause it across a boundary;
    the loop takes microseconds): the lines that passed. */
static int log_kinds_in_one_second(int kinds, int each)
{
    for (int tries = 0;; tries++) {
        zd__log_reset();
        g_n_rec = 0;
        int64_t t0 = mono_s();
        int passed = log_kinds(kinds, each);
        if (mono_s() == t0 || tries == 20)
            return passed;
    }
}

static void test_rate_limit(void **state)
{
    (void)state;
    /* a flood of one kind: that kind's budget */
    assert_int_equal(log_kinds_in_one_second(1, 10 * ZD_LOG_BUDGET), ZD_LOG_BUDGET_KIND);
    /* floods of many kinds: the process's budget */
    assert_int_equal(log_kinds_in_one_second(10, 10 * ZD_LOG_BUDGET), ZD_LOG_BUDGET);
    /* two call sites with the same text are two kinds */
    zd__log_reset();
    g_n_rec = 0;
    int64_t t1 = mono_s();
    for (int i = 0; i < ZD_LOG_BUDGET; i++)
        zd__log(ZD_LOG_WARN, "same text %d", i);
    for (int i = 0; i < ZD_LOG_BUDGET; i++)
        zd__log(ZD_LOG_WARN, "same text %d", i);
    if (mono_s() == t1)
        assert_int_equal(count("same text "), 2 * ZD_LOG_BUDGET_KIND);
    /* a flood of one kind does not hide a line of another */
    zd__log_reset();
    g_n_rec = 0;
    int64_t t0 = mono_s();
    for (int i = 0; i < 10 * ZD_LOG_BUDGET; i++)
        zd__log(ZD_LOG_WARN, "flood %d", i);
    zd__log(ZD_LOG_WARN, "the other kind");
    if (mono_s() == t0)
        assert_int_equal(count("flood "), ZD_LOG_BUDGET_KIND);
    assert_int_equal(count("the other kind"), 1);
    /* Errors are never dropped. */
    for (int i = 0; i < 10 * ZD_LOG_BUDGET; i++)
        zd__log(ZD_LOG_ERROR, "error %d", i);
    assert_int_equal(count("error "), 10 * ZD_LOG_BUDGET);
}

/*  ---- a real world: the worker's name on its lines ---- */

static int world_logs_join(const world_t *w)
{
    g_n_rec = 0;
    zd_log_set_level(ZD_LOG_INFO);
    zd_log_set_sink(record, NULL);
    zd_rpc_options_t o = world_rpc_options(w->port);
    char name[32], who[48], joined[64];
    snprintf(name, sizeof name, "worker%d", w->rank);
    snprintf(who, sizeof who, "worker%d/%d", w->rank, w->rank);
    snprintf(joined, sizeof joined, "rpc: joined the world of %d as rank %d at tcp://",
             w->world_size, w->rank);
    WCHECK(zd_rpc_init(name, w->rank, w->world_size, &o) == 0);
    const rec_t *r = find(joined);
    WCHECK(r != NULL);
    WCHECK(r->level == ZD_LOG_INFO);
    WCHECK(strcmp(r->who, who) == 0);
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    r = find("rpc: shutdown complete");
    WCHECK(r != NULL && r->level == ZD_LOG_INFO && strcmp(r->who, who) == 0);
    /* Once RPC is down the lines carry no worker. */
    zd__log(ZD_LOG_WARN, "after shutdown");
    r = find("after shutdown");
    WCHECK(r != NULL && r->who[0] == 0);
    zd_log_set_sink(NULL, NULL);
    return 0;
}

static void test_world_join_line(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_logs_join, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_levels_filter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_env_level, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sink_gets_level_who_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_sink_restores_stderr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rate_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_world_join_line, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
