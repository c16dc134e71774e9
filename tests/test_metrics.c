/* SPDX-License-Identifier: MIT */
/*  ZDIST_METRICS (rpc/agent/metrics_out.c) and tools/metrics_summary: a world of
    three forked processes with distributed autograd makes RPC calls and a
    distributed backward pass with ZDIST_METRICS set; each process must
    leave a file of JSON lines, periodic ones and a final one, with its
    calls counted, and metrics_summary ($ZDIST_BUILD_DIR/tools/metrics_summary,
    which parses every line with jansson) must read them into one table.

    Two worker names need care: one holds a quote and a backslash (escaped
    in the JSON), one a slash (replaced by '_' in the file name). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include "tests/support/fixtures.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define CALLS   5
#define WAIT_MS 30000

static char top[64], dir[96]; /* the test's folder, and the metrics folder in it */
static const char *const names[3] = {"ps", "odd\"name\\x", "w/2"};
static const char *const files[3] = {"rank0.ps.jsonl", "rank1.odd_name_x.jsonl", "rank2.w_2.jsonl"};

static zd_value_t *fn_square(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x, *y;
    if (zd_rpc_arg_tensor(args, 0, &x) < 0 || zd_tensor_mul(x, x, &y) < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(y);
    zd_tensor_unref(y);
    return v;
}

static int count_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/*  A distributed forward and backward through the next rank. */
static int square_remotely(const world_t *w, int to)
{
    int64_t ctx, n = 4;
    float v[4] = {1, 2, 3, 4};
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        return world_fail(w, "begin: %s", zd_error_last());
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, &n, 1, v), *y = NULL, *loss = NULL;
    zd_tensor_set_requires_grad(x, true);
    zd_value_t *a = zd__rpc_args("t", x), *r = NULL;
    int rc = zd_rpc_sync(to, "square", a, -1, &r);
    if (rc == 0 && zd_value_get_tensor(r, &y) == 0 && zd_tensor_sum(y, &loss) == 0)
        rc = zd_dist_autograd_backward(ctx, &loss, 1, false);
    else
        rc = -1;
    if (rc < 0)
        world_fail(w, "square on %d: %s", to, zd_error_last());
    zd_tensor_unref(loss);
    zd_value_unref(r);
    zd_value_unref(a);
    zd_tensor_unref(x);
    if (zd_dist_autograd_context_end(ctx, -1) < 0 && rc == 0)
        rc = world_fail(w, "end: %s", zd_error_last());
    return rc;
}

static int body(const world_t *w)
{
    if (zd_dist_autograd_init() < 0 || zd_rpc_register("square", fn_square, NULL) < 0)
        return world_fail(w, "set-up: %s", zd_error_last());
    zd_rpc_options_t o = world_rpc_options(w->port);
    if (zd_rpc_init(names[w->rank], w->rank, w->world_size, &o) < 0)
        return world_fail(w, "init: %s", zd_error_last());
    int to = (w->rank + 1) % w->world_size, rc = 0;
    for (int i = 0; i < CALLS && rc == 0; i++)
        rc = square_remotely(w, to);
    /* Wait (bounded) for a periodic line, then for every peer to be done
       calling us: the shutdown barrier does that. */
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, files[w->rank]);
    int64_t until = world_now_ms() + world_scaled_ms(WAIT_MS);
    while (rc == 0 && count_lines(path) < 1 && world_now_ms() < until) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    if (rc == 0 && count_lines(path) < 1)
        rc = world_fail(w, "no periodic line in %s after %lld ms", path,
                        (long long)world_scaled_ms(WAIT_MS));
    if (zd_rpc_shutdown(true, -1) < 0 && rc == 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    return rc;
}

/*  The integer after "key": in s (the first one: the totals come before
    the per-peer counters), or -1. */
static long long field(const char *s, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(s, k);
    return p ? atoll(p + strlen(k)) : -1;
}

static void test_world_writes_json_lines_and_the_summary_reads_them(void **state)
{
    (void)state;
    strcpy(top, "/tmp/zdist-metrics-XXXXXX");
    assert_non_null(mkdtemp(top));
    snprintf(dir, sizeof dir, "%s/m", top); /* created by the processes */
    setenv("ZDIST_METRICS", dir, 1);
    setenv("ZDIST_METRICS_INTERVAL_S", "0.05", 1);
    int rc = world_run_simple(3, 60, body, NULL);
    unsetenv("ZDIST_METRICS");
    unsetenv("ZDIST_METRICS_INTERVAL_S");
    assert_int_equal(rc, 0);

    for (int r = 0; r < 3; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", dir, files[r]);
        char *text = read_text(path);
        if (!text)
            fail_msg("no file %s", path);
        int lines = 0;
        char *last = text;
        for (char *l = text; *l;) {
            char *nl = strchr(l, '\n');
            assert_non_null(nl);
            assert_int_equal(strncmp(l, "{\"time\":", 8), 0);
            assert_int_equal(nl[-1], '}');
            last = l;
            lines++;
            l = nl + 1;
        }
        printf("%s: %d lines\n", files[r], lines);
        assert_true(lines >= 2); /* at least one periodic line, and the last */
        /* the last line, and only it, is final */
        assert_ptr_equal(strstr(text, "\"final\":true"), strstr(last, "\"final\":true"));
        assert_non_null(strstr(last, "\"final\":true"));
        assert_int_equal(field(last, "rank"), r);
        assert_int_equal(field(last, "world_size"), 3);
        /* every rank sent CALLS calls forward, and gradients flowed back */
        assert_true(field(last, "calls_sent") >= CALLS);
        assert_true(field(last, "calls_served") >= CALLS);
        assert_true(field(last, "bytes_sent") > 0);
        assert_int_equal(field(last, "errors"), 0);
        assert_int_equal(field(last, "total_backward_calls"), CALLS);
        assert_true(field(last, "total_grad_messages") >= CALLS);
        assert_true(field(last, "total_autograd_contexts") >= CALLS);
        assert_int_equal(field(last, "num_autograd_contexts"), 0);
        if (r == 1)
            assert_non_null(strstr(last, "\"worker\":\"odd\\\"name\\\\x\""));
        free(text);
    }

    /* The summary parses every line (a malformed one fails it). */
    char cmd[512];
    const char *build = getenv("ZDIST_BUILD_DIR");
    snprintf(cmd, sizeof cmd, "%s/tools/metrics_summary %s 2>&1", build ? build : "..", dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char out[8192] = "";
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    printf("%s", out);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s failed (build the metrics_summary target; it needs libjansson-dev):\n%s", cmd,
                 out);
    assert_int_equal(strncmp(out, "worker ", 7), 0);
    const char *rows[] = {"\nps ", "\nodd\"name\\x ", "\nw/2 ", "\n(total) "};
    const char *prev = out;
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(out, rows[i]);
        if (!at || at < prev)
            fail_msg("expected the row \"%s\" in order in:\n%s", rows[i] + 1, out);
        prev = at;
    }
    assert_null(strstr(out, "running"));

    /* A malformed line is reported with its place. */
    char bad[128];
    snprintf(bad, sizeof bad, "%s/%s", dir, files[2]);
    FILE *f = fopen(bad, "a");
    assert_non_null(f);
    fputs("{\"time\":1,\"worker\":\"w\n", f);
    fclose(f);
    p = popen(cmd, "r");
    assert_non_null(p);
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    st = pclose(p);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char want[160];
    snprintf(want, sizeof want, "%s:", bad);
    if (!strstr(out, want))
        fail_msg("expected \"%s\" in:\n%s", want, out);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    assert_int_equal(system(cmd), 0);
}

static int bad_interval_body(const world_t *w)
{
    zd_rpc_options_t o = world_rpc_options(w->port);
    if (zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0) {
        zd_rpc_shutdown(false, -1);
        return world_fail(w, "zd_rpc_init accepted ZDIST_METRICS_INTERVAL_S=soon");
    }
    if (!strstr(zd_error_last(), "ZDIST_METRICS_INTERVAL_S=\"soon\""))
        return world_fail(w, "unclear error: %s", zd_error_last());
    return 0;
}

static void test_bad_interval_fails_init(void **state)
{
    (void)state;
    setenv("ZDIST_METRICS", "/tmp/zdist-metrics-unused", 1);
    setenv("ZDIST_METRICS_INTERVAL_S", "soon", 1);
    int rc = world_run_simple(1, 30, bad_interval_body, NULL);
    unsetenv("ZDIST_METRICS");
    unsetenv("ZDIST_METRICS_INTERVAL_S");
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_writes_json_lines_and_the_summary_reads_them),
        cmocka_unit_test(test_bad_interval_fails_init),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
