/* SPDX-License-Identifier: MIT */
/*  One trainer against the parameters every trainer shares (issue 24
    point 6), in worlds of real processes.

    Library: rank 0 owns a parameter w; rank 1 trains it with SGD at lr
    0.125 (exact in binary, so w is checked exactly); rank 2 steps it with
    finite gradients and an absurd learning rate:
      1. 1e38, no owner limits: the step makes an element of w inf; it is
         undone and refused, naming rank 2, the parameter and the element;
         w is as it was, and rank 1's steps before and after apply exactly;
      2. the owner takes only SGD at 0.125 (zd_dist_optim_set_owner_limits):
         rank 2's optimizer is refused at its creation, naming it and the
         field (lr=1e+30); rank 1's, old and new, go on;
      3. the owner bounds a step's change (max_change 1): rank 2 at lr 100
         (finite, 270 times too far) is undone and refused; rank 1 goes on.
    rpc_ps: a server and two trainers, one started with --lr=1e30. The
    server takes only its own --lr: that trainer exits 1 with a message
    naming the field, the server logs it, the other trainer finishes and
    the world ends 0 for it and the server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/rpc.h>
#include "tests/support/dist_fixtures.h"
#include "tests/support/program.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define N  4
#define LR 0.125

static zd_tensor_t *w_param;

static float w0(int i)
{
    return 1.0f + 0.5f * (float)i;
}
static float x_at(int i)
{
    return (float)(i + 1);
}

/*  ---- rank 0: the owner ---- */

static zd_value_t *fn_mul_w(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_dist_optim_read_lock();
    zd_value_t *v = dist_mul_by(args, w_param);
    zd_dist_optim_read_unlock();
    return v;
}

static zd_value_t *fn_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *tv = zd_value_tensor(w_param);
    zd_rref_t *r = zd_rref_new(tv);
    zd_value_unref(tv);
    zd_value_t *list = zd_value_list(1);
    zd_list_append(list, zd_value_rref(r));
    zd_rref_unref(r);
    return list;
}

static zd_value_t *fn_get_w(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_dist_optim_read_lock();
    zd_tensor_t *copy = zd_tensor_detach_copy(w_param);
    zd_dist_optim_read_unlock();
    zd_value_t *v = zd_value_tensor(copy);
    zd_tensor_unref(copy);
    return v;
}

/*  "set_limits"(lr, max_change): the owner takes only SGD at lr (lr < 0:
    any config) and bounds steps by max_change. */
static zd_value_t *fn_set_limits(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    double lr, max_change;
    if (zd_rpc_arg_float(args, 0, &lr) < 0 || zd_rpc_arg_float(args, 1, &max_change) < 0)
        return NULL;
    zd_optim_config_t cfg = zd_optim_sgd_defaults(lr);
    zd_dist_optim_owner_limits_t l = zd_dist_optim_owner_limits_default();
    l.config = lr < 0 ? NULL : &cfg;
    l.max_change = max_change;
    return zd_dist_optim_set_owner_limits(&l) < 0 ? NULL : zd_value_none();
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[64 * 1024];
static size_t log_len;

static void log_sink(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level, (void)who, (void)arg;
    pthread_mutex_lock(&log_lock);
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s\n", line);
    if (n > 0 && log_len + (size_t)n < sizeof log_text)
        log_len += (size_t)n;
    pthread_mutex_unlock(&log_lock);
}

/*  "logged"(a, b): 1 when one of the owner's log lines holds both. */
static zd_value_t *fn_logged(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *a, *b;
    if (zd_rpc_arg_string(args, 0, &a) < 0 || zd_rpc_arg_string(args, 1, &b) < 0)
        return NULL;
    bool found = false;
    pthread_mutex_lock(&log_lock);
    for (const char *p = log_text; p && *p && !found;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        found = strstr(line, a) && strstr(line, b);
        p = end ? end + 1 : NULL;
    }
    pthread_mutex_unlock(&log_lock);
    return zd_value_int(found);
}

static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static bool done;

/*  "done": the driver has finished. */
static zd_value_t *fn_done(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&done_lock);
    done = true;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
    return zd_value_none();
}

/*  ---- the trainers ---- */

static zd_rref_t *param_rref(void)
{
    zd_value_t *r;
    zd_rref_t *ref = NULL;
    if (zd_rpc_sync(0, "param_rrefs", NULL, -1, &r) == 0) {
        if (zd_rpc_arg_rref(r, 0, &ref) == 0)
            zd_rref_ref(ref);
        zd_value_unref(r);
    }
    return ref;
}

/*  One iteration: loss = sum(x * w), so w's gradient is x. */
static int iteration(zd_dist_optim_t *opt)
{
    float xv[N];
    for (int i = 0; i < N; i++)
        xv[i] = x_at(i);
    int64_t ctx, n = N;
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        return -1;
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, &n, 1, xv), *y, *s = NULL;
    zd_value_t *a = zd__rpc_args("t", x), *r = NULL;
    int rc = zd_rpc_sync(0, "mul_w", a, -1, &r) == 0 && zd_value_get_tensor(r, &y) == 0 &&
            zd_tensor_sum(y, &s) == 0
        ? 0
        : -1;
    if (rc == 0)
        rc = zd_dist_autograd_backward(ctx, &s, 1, false);
    if (rc == 0)
        rc = zd_dist_optim_step(opt, ctx);
    char error[1024];
    snprintf(error, sizeof error, "%s", zd_error_last());
    zd_value_unref(a);
    zd_value_unref(r);
    zd_tensor_unref(s);
    zd_tensor_unref(x);
    zd_dist_autograd_context_end(ctx, -1);
    if (rc < 0)
        zd_error_set("%s", error);
    return rc;
}

/*  One step at lr: 0, -1 when the optimizer was refused, -2 when the step
    was; the error in zd_error_last(). */
static int step_with(double lr)
{
    zd_rref_t *p = param_rref();
    if (!p)
        return -3;
    zd_optim_config_t cfg = zd_optim_sgd_defaults(lr);
    zd_dist_optim_t *opt = NULL;
    int rc = !(opt = dist_optim_over(&cfg, &p, 1)) ? -1 : iteration(opt) < 0 ? -2 : 0;
    char error[1024];
    snprintf(error, sizeof error, "%s", zd_error_last());
    zd_dist_optim_free(opt);
    zd_rref_unref(p);
    if (rc < 0)
        zd_error_set("%s", error);
    return rc;
}

/*  "step_with"(lr) on rank 2 -> [rc, error] */
static zd_value_t *fn_step_with(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    double lr;
    if (zd_rpc_arg_float(args, 0, &lr) < 0)
        return NULL;
    int rc = step_with(lr);
    return zd__rpc_args("is", (int64_t)rc, rc < 0 ? zd_error_last() : "");
}

static int setup(const world_t *w)
{
    if (w->rank == 0) {
        float v[N];
        for (int i = 0; i < N; i++)
            v[i] = w0(i);
        int64_t n = N;
        w_param = zd_tensor_from_data(ZD_FLOAT32, &n, 1, v);
        zd_tensor_set_requires_grad(w_param, true);
        zd_log_set_sink(log_sink, NULL);
    }
    if (zd_dist_optim_init() < 0)
        return -1;
    return zd_rpc_register("mul_w", fn_mul_w, NULL) |
        zd_rpc_register("param_rrefs", fn_param_rrefs, NULL) |
        zd_rpc_register("get_w", fn_get_w, NULL) |
        zd_rpc_register("set_limits", fn_set_limits, NULL) |
        zd_rpc_register("logged", fn_logged, NULL) |
        zd_rpc_register("step_with", fn_step_with, NULL) | zd_rpc_register("done", fn_done, NULL);
}

/*  ---- rank 1 drives ---- */

/*  Rank 2 steps at lr: its rc, and its error in text. */
static int64_t bad_step(double lr, char *text, size_t size)
{
    zd_value_t *args = zd__rpc_args("f", lr), *r = NULL;
    int64_t rc = 1;
    const char *s = "";
    if (zd_rpc_sync(2, "step_with", args, -1, &r) == 0 && zd_rpc_arg_int(r, 0, &rc) == 0)
        zd_rpc_arg_string(r, 1, &s);
    snprintf(text, size, "%s", s);
    zd_value_unref(args);
    zd_value_unref(r);
    return rc;
}

static int set_limits(double lr, double max_change)
{
    zd_value_t *args = zd__rpc_args("ff", lr, max_change), *r = NULL;
    int rc = zd_rpc_sync(0, "set_limits", args, -1, &r);
    zd_value_unref(args);
    zd_value_unref(r);
    return rc;
}

static int logged(const char *a, const char *b)
{
    zd_value_t *args = zd__rpc_args("ss", a, b), *r = NULL;
    int64_t found = 0;
    if (zd_rpc_sync(0, "logged", args, -1, &r) == 0)
        zd_value_get_int(r, &found);
    zd_value_unref(args);
    zd_value_unref(r);
    return (int)found;
}

/*  w on the owner is w0 - steps * LR * x, exactly. */
static int check_w(const world_t *w, int steps)
{
    zd_value_t *r = NULL;
    zd_tensor_t *t;
    WCHECK(zd_rpc_sync(0, "get_w", NULL, -1, &r) == 0 && zd_value_get_tensor(r, &t) == 0);
    int rc = 0;
    for (int i = 0; i < N; i++) {
        float want = w0(i) - (float)steps * (float)LR * x_at(i), got = zd_tensor_data(t)[i];
        if (got != want)
            rc = world_fail(w, "w[%d] is %g after %d good steps, expected %g", i, (double)got,
                            steps, (double)want);
    }
    zd_value_unref(r);
    return rc;
}

static int expect(const world_t *w, const char *text, const char *part)
{
    if (strstr(text, part))
        return 0;
    return world_fail(w, "the error \"%s\" lacks \"%s\"", text, part);
}

static int driver(const world_t *w)
{
    char text[1024];
    zd_rref_t *p = param_rref();
    WCHECK(p != NULL);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(LR);
    zd_dist_optim_t *good = NULL;
    WCHECK((good = dist_optim_over(&cfg, &p, 1)) != NULL);

    /* 1: finite gradients, a step that makes w[3] inf (2 - 1e38 x 4) is
       undone. */
    WTRY(iteration(good));
    WTRY(check_w(w, 1));
    int64_t rc = bad_step(1e38, text, sizeof text);
    if (rc != -2)
        return world_fail(w, "a step at lr 1e38: rc %lld (%s), expected a refused step",
                          (long long)rc, text);
    WTRY(expect(w, text, "the step of worker \"worker2\" (rank 2)"));
    WTRY(expect(w, text, "made parameter 0 -inf at element 3 (it was 2)"));
    WTRY(expect(w, text, "refused and undone"));
    WTRY(check_w(w, 1)); /* as before, bit for bit */
    WTRY(iteration(good));
    WTRY(check_w(w, 2));
    WCHECK(logged("the step of worker \"worker2\" (rank 2)", "step refused and undone"));

    /* 2: the owner takes only its own config. */
    WTRY(set_limits(LR, 0));
    rc = bad_step(1e30, text, sizeof text);
    if (rc != -1)
        return world_fail(w,
                          "an optimizer at lr 1e30 under the owner's config: rc %lld (%s), "
                          "expected it refused",
                          (long long)rc, text);
    WTRY(expect(w, text,
                "refuses the optimizer of worker \"worker2\" (rank 2): its "
                "lr=1e+30, where this owner takes lr=0.125"));
    WCHECK(logged("refused the optimizer of worker \"worker2\" (rank 2)", "lr=1e+30"));
    WTRY(iteration(good)); /* made before the limits: goes on */
    WTRY(check_w(w, 3));
    zd_dist_optim_t *again = NULL;
    WCHECK((again = dist_optim_over(&cfg, &p, 1)) != NULL); /* the owner's config: taken */
    WTRY(iteration(again));
    WTRY(check_w(w, 4));
    zd_dist_optim_free(again);

    /* 3: a bound on a step's change; lr 100 stays finite. */
    WTRY(set_limits(-1, 1.0));
    rc = bad_step(100, text, sizeof text);
    if (rc != -2)
        return world_fail(w,
                          "a step at lr 100 under max_change 1: rc %lld (%s), expected a "
                          "refused step",
                          (long long)rc, text);
    WTRY(expect(w, text, "the step of worker \"worker2\" (rank 2)"));
    WTRY(expect(w, text, "moved parameter 0 by"));
    WTRY(expect(w, text, "more than max_change 1"));
    WTRY(check_w(w, 4));
    WTRY(iteration(good));
    WTRY(check_w(w, 5));

    WTRY(set_limits(-1, 0));
    zd_dist_optim_free(good);
    zd_rref_unref(p);
    return 0;
}

/*  The owner serves until the driver is done, then lets go of w. */
static int owner(const world_t *w)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += world_scaled_ms(100000) / 1000;
    pthread_mutex_lock(&done_lock);
    while (!done && pthread_cond_timedwait(&done_cond, &done_lock, &until) == 0)
        ;
    bool ok = done;
    pthread_mutex_unlock(&done_lock);
    zd_log_set_sink(NULL, NULL);
    zd_tensor_unref(w_param);
    w_param = NULL;
    (void)w;
    return ok ? 0 : 1;
}

/*  The driver tells the owner it is done, failed or not. */
static int drive(const world_t *w)
{
    int rc = driver(w);
    zd_value_t *r = NULL;
    if (zd_rpc_sync(0, "done", NULL, -1, &r) < 0)
        rc = world_fail(w, "done: %s", zd_error_last());
    zd_value_unref(r);
    return rc;
}

static int run(const world_t *w)
{
    return w->rank == 0 ? owner(w) : w->rank == 1 ? drive(w) : 0;
}

static void test_a_caller_cannot_ruin_the_shared_parameters(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 3, .setup = setup, .fn = run, .timeout_s = 120, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- rpc_ps with a trainer at --lr=1e30 ---- */

static void test_rpc_ps_refuses_a_trainer_with_another_lr(void **state)
{
    (void)state;
    int port = world_free_port();
    assert_true(port > 0);
    char a_port[32];
    snprintf(a_port, sizeof a_port, "--master_port=%d", port);
    program_t p[3];
    for (int r = 0; r < 3; r++) {
        char a_rank[32];
        snprintf(a_rank, sizeof a_rank, "--rank=%d", r);
        char *argv[] = {(char *)program_path("examples/rpc_ps"),
                        a_rank,
                        "--world_size=3",
                        "--master_addr=127.0.0.1",
                        a_port,
                        "--max_batches=4",
                        "--eval_samples=200",
                        "--progress_s=0",
                        r == 2 ? "--lr=1e30" : "--lr=0.03",
                        NULL};
        assert_int_equal(program_start(&p[r], argv), 0);
    }
    double deadline = program_now_s() + world_scaled_ms(300000) / 1000.0;
    int rc[3];
    for (int r = 0; r < 3; r++) {
        rc[r] = program_wait(&p[r], deadline);
        printf("---- rank %d exited with %d:\n%s\n", r, rc[r], p[r].out ? p[r].out : "");
    }
    const char *trainer2 = p[2].out ? p[2].out : "", *server = p[0].out ? p[0].out : "";
    assert_int_equal(rc[0], 0);
    assert_int_equal(rc[1], 0);
    assert_int_equal(rc[2], 1);
    assert_non_null(strstr(trainer2,
                           "refuses the optimizer of worker \"trainer_2\" (rank 2): "
                           "its lr=1e+30, where this owner takes lr=0.03"));
    assert_non_null(strstr(server, "refused the optimizer of worker \"trainer_2\" (rank 2)"));
    assert_non_null(strstr(p[1].out ? p[1].out : "", "Rank 1 test accuracy"));
    for (int r = 0; r < 3; r++)
        free(p[r].out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_caller_cannot_ruin_the_shared_parameters),
        cmocka_unit_test(test_rpc_ps_refuses_a_trainer_with_another_lr),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
