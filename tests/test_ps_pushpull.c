/* SPDX-License-Identifier: MIT */
/*  The push/pull parameter server (ps.h) in worlds of real processes: a
    small module of four tensors served by one shard and by two, with two
    trainers.
    - synchronous rounds give exactly the SGD step with the mean of the
      trainers' gradients (every value is a multiple of 1/16, so the float
      arithmetic is exact whatever the order), and a stopped shard answers
      ZD_ERR_STOPPED;
    - asynchronous with max_staleness 0 refuses a push computed on an old
      version with ZD_ERR_STALE and leaves the shard as it was;
      zd_ps_client_step computes such a step again on new parameters, and
      a computation that fails ends the step without a push;
    - a push of a wrong shape, a wrong dtype, an unknown or missing name,
      or a NaN is refused, naming the tensor, and changes nothing;
    - a step that leaves a parameter not finite is undone and its pushes
      refused (ZD_ERR_ARGUMENT, naming the tensor), in both modes, also
      when a trainer's loss completes the synchronous round; the round
      still counts on every shard, and its positions go back;
    - a shard killed: its trainers' calls fail with ZD_ERR_PEER naming it;
    - a trainer killed in synchronous mode: once it is declared lost, the
      rounds complete with the trainers left (exactly the mean of theirs);
    - checkpoints: a shard killed between two generations resumes from the
      last one written (parameters and version), a damaged newest
      generation is passed over for the one before, and a push computed on
      a version the resumed shard never had is refused as stale; the
      trainer's position in its data comes back with the generation
      (zd_ps_client_resume_position), and a push whose position is below
      0 or not an integer is refused;
    - synchronous shards at one generation: a resumed run where one
      shard's newest file is damaged sends the other back to the older
      generation (or fails naming what it has, when it has not that
      one), and a shard killed and started again while the other went a
      round further has the other sent back by the trainer's wait. */
#define _GNU_SOURCE /* pipe2 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/checkpoint.h>
#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>

#include "tests/support/world.h"

#define LR 0.5

typedef struct {
    int n_shards;
    zd_ps_mode_t mode;
    int64_t max_staleness;
    bool lossy;       /* a member dies: the survivors' shutdown may report it */
    int num_trainers; /* 0: 2 */
    double lr;        /* the shards' SGD learning rate (0: LR) */
    /* the counters a shard must end with, into *want (NULL: not checked) */
    void (*want_stats)(zd_ps_server_t *srv, zd_ps_mode_t mode, zd_ps_server_stats_t *want);
} setup_t;

/*  The first of st's counters that differs from want's (version, steps,
    pushes, pulls, stale, refused, diverged), into *got and *wanted, or
    NULL when they are all the same. */
static const char *stats_differ(const zd_ps_server_stats_t *st, const zd_ps_server_stats_t *want,
                                int64_t *got, int64_t *wanted)
{
    const struct {
        const char *name;
        int64_t got, want;
    } c[] = {{"version", st->version, want->version},   {"steps", st->steps, want->steps},
             {"pushes", st->pushes, want->pushes},      {"pulls", st->pulls, want->pulls},
             {"stale", st->stale, want->stale},         {"refused", st->refused, want->refused},
             {"diverged", st->diverged, want->diverged}};
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
        if (c[i].got != c[i].want) {
            *got = c[i].got;
            *wanted = c[i].want;
            return c[i].name;
        }
    return NULL;
}

static const char *const names[] = {"a.weight", "a.bias", "b.weight", "b.bias"};
static const int64_t shapes[][2] = {{4, 3}, {3, 0}, {3, 2}, {2, 0}};

/*  The model: a container of two containers, each with a weight and a
    bias, filled with multiples of 1/8. */
static zd_nn_module_t *make_model(void)
{
    zd_nn_module_t *m = zd_nn_module_new("Small", NULL, NULL, NULL);
    zd_nn_module_t *a = zd_nn_module_new("Part", NULL, NULL, NULL);
    zd_nn_module_t *b = zd_nn_module_new("Part", NULL, NULL, NULL);
    if (!m || !a || !b || zd_nn_module_register_module(m, "a", a) < 0 ||
        zd_nn_module_register_module(m, "b", b) < 0) {
        zd_nn_module_free(m);
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        zd_nn_module_t *part = i < 2 ? a : b;
        int ndim = shapes[i][1] ? 2 : 1;
        zd_tensor_t *t =
            zd_nn_module_add_parameter(part, i % 2 ? "bias" : "weight", shapes[i], ndim);
        if (!t) {
            zd_nn_module_free(m);
            return NULL;
        }
        float *p = zd_tensor_data(t);
        for (int64_t k = 0; k < zd_tensor_numel(t); k++)
            p[k] = (float)((k + 1) % 7) / 8.0f - (float)i;
    }
    return m;
}

/*  Trainer r's gradient of tensor i, element k, in round: multiples of 1/4. */
static float grad_value(int r, int round, int i, int64_t k)
{
    return (float)((r + 1) * (k + 1 + round) % 9 - i) / 4.0f;
}

static int set_grads(zd_nn_module_t *m, int r, int round)
{
    for (int i = 0; i < 4; i++) {
        zd_tensor_t *t = zd_nn_module_find(m, names[i]);
        zd_tensor_t *g = zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(t), zd_tensor_ndim(t));
        if (!g)
            return -1;
        for (int64_t k = 0; k < zd_tensor_numel(g); k++)
            zd_tensor_data(g)[k] = grad_value(r, round, i, k);
        zd_tensor_clear_grad(t);
        int rc = zd_tensor_accumulate_grad(t, g);
        zd_tensor_unref(g);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/*  expected -= LR * mean of trainers 0..n-1's gradients of round. */
static void sgd_mean(zd_nn_module_t *expected, int n, int round)
{
    for (int i = 0; i < 4; i++) {
        zd_tensor_t *t = zd_nn_module_find(expected, names[i]);
        float *p = zd_tensor_data(t);
        for (int64_t k = 0; k < zd_tensor_numel(t); k++) {
            float sum = 0;
            for (int r = 0; r < n; r++)
                sum += grad_value(r, round, i, k);
            p[k] -= (float)LR * (sum / (float)n);
        }
    }
}

/*  The first tensor of m that differs from want, bit for bit, or NULL. */
static const char *differs(zd_nn_module_t *m, zd_nn_module_t *want)
{
    for (int i = 0; i < 4; i++) {
        zd_tensor_t *a = zd_nn_module_find(m, names[i]), *b = zd_nn_module_find(want, names[i]);
        if (memcmp(zd_tensor_data(a), zd_tensor_data(b), zd_tensor_nbytes(a)) != 0)
            return names[i];
    }
    return NULL;
}

static zd_ps_options_t options(const setup_t *su)
{
    zd_ps_options_t o = zd_ps_options_default();
    o.mode = su->mode;
    o.num_trainers = su->num_trainers ? su->num_trainers : 2;
    o.max_staleness = su->max_staleness;
    return o;
}

/*  Shards are ranks first_shard .. first_shard + n_shards - 1. */
static void shard_ranks(int first_shard, int n, int *ranks)
{
    for (int s = 0; s < n; s++)
        ranks[s] = first_shard + s;
}

/*  Waits until the shard's version reaches v (up to ms). */
static int wait_version(zd_ps_server_t *srv, int64_t v, int64_t ms)
{
    int64_t deadline = world_now_ms() + world_scaled_ms(ms);
    while (zd_ps_server_version(srv) < v) {
        if (world_now_ms() > deadline)
            return -1;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    return 0;
}

/*  "test.waiting"() -> the pushes the shard of this process holds for its
    round (zd_ps_server_stats), for a trainer to wait until another's push
    is in. */
static zd_value_t *fn_waiting(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args;
    zd_ps_server_stats_t st;
    return zd_ps_server_stats(arg, &st, sizeof st) < 0 ? NULL : zd_value_int(st.waiting);
}

/*  A shard process: serves until its trainers are done (the graceful
    shutdown waits for them); stops at version stop_at (0: never), dies
    at version die_at (0: never). */
static int run_shard(const world_t *w, int shard, int64_t stop_at, int64_t die_at)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(su->lr > 0 ? su->lr : LR);
    zd_nn_module_t *m = make_model();
    WCHECK(m);
    zd_ps_server_t *srv = zd_ps_server_new_module(m, shard, su->n_shards, &sgd, &o);
    zd_nn_module_free(m); /* the shard keeps copies */
    WCHECK(srv && zd_rpc_register("test.waiting", fn_waiting, srv) == 0);
    WTRY(world_join(w));
    int rc = 0;
    if (die_at > 0) {
        if (wait_version(srv, die_at, 20000) < 0)
            rc = world_fail(w, "shard %d never reached version %lld", shard, (long long)die_at);
        else
            raise(SIGKILL);
    }
    if (stop_at > 0) {
        if (wait_version(srv, stop_at, 20000) < 0)
            rc = world_fail(w, "shard %d never reached version %lld", shard, (long long)stop_at);
        zd_ps_server_stop(srv);
    }
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0 && !su->lossy)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    zd_ps_server_stats_t st, want = {0};
    int64_t got = 0, wanted = 0;
    const char *what = NULL;
    if (su->want_stats) {
        su->want_stats(srv, su->mode, &want);
        if (zd_ps_server_stats(srv, &st, sizeof st) < 0 ||
            (what = stats_differ(&st, &want, &got, &wanted)))
            rc = world_fail(w, "shard %d's stats: %s %lld, expected %lld", shard,
                            what ? what : zd_error_last(), (long long)got, (long long)wanted);
    }
    zd_ps_server_free(srv);
    return rc;
}

/*  A trainer's end: leaves the world (a failure to is the test's), frees
    its client and models, and returns rc or that failure. */
static int trainer_leave(const world_t *w, int rc, zd_ps_client_t *ps, zd_nn_module_t *m,
                         zd_nn_module_t *want)
{
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    zd_ps_client_free(ps);
    zd_nn_module_free(m);
    zd_nn_module_free(want);
    return rc;
}

/*  ---- synchronous rounds ---- */

/*  Rounds first .. rounds-1 of pull (checked against want, whose steps
    are the mean of trainers 0 and 1), set the gradients, push; with
    fetch, the push is a push_pull, whose answer is checked too. 0, or
    world_fail's -1. */
static int sync_rounds(const world_t *w, zd_ps_client_t *ps, zd_nn_module_t *m,
                       zd_nn_module_t *want, int first, int rounds, const char *step, bool fetch)
{
    int rc = 0;
    for (int round = first; round < rounds && rc == 0; round++) {
        const char *bad;
        if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "pull of round %d: %s", round, zd_error_last());
        else if ((bad = differs(m, want)))
            rc = world_fail(w, "round %d: %s is not %s", round, bad, step);
        else if (zd_ps_client_version(ps, 0) != round)
            rc = world_fail(w, "round %d: version %lld", round,
                            (long long)zd_ps_client_version(ps, 0));
        else if (set_grads(m, w->rank, round) < 0 ||
                 (fetch ? zd_ps_client_push_pull : zd_ps_client_push)(ps, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "push of round %d: %s", round, zd_error_last());
        sgd_mean(want, 2, round);
        if (rc == 0 && fetch && (bad = differs(m, want)))
            rc = world_fail(w, "round %d: the push_pull brought %s, not %s", round, bad, step);
    }
    return rc;
}

static int sync_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    int ranks[2];
    shard_ranks(2, su->n_shards, ranks);
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    /* The replica starts elsewhere than the shards: a pull must fetch all. */
    for (int i = 0; i < 4; i++)
        zd_tensor_fill_(zd_nn_module_find(m, names[i]), 99.0f);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, su->n_shards, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = 0;
    if (rc == 0)
        rc = sync_rounds(w, ps, m, want, 0, 3, "the mean-gradient SGD step", false);
    /* Pushing again at the version of the round just done is stale. */
    if (rc == 0 &&
        (zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) == 0 ||
         (zd_error_code() != ZD_ERR_STALE && zd_error_code() != ZD_ERR_STOPPED)))
        rc = world_fail(w, "a push of an old round: %s", zd_error_last());
    /* The shards stop at version 3: pulls are refused from then on. */
    int64_t deadline = world_now_ms() + world_scaled_ms(20000);
    while (rc == 0 && zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) == 0)
        if (world_now_ms() > deadline)
            rc = world_fail(w, "the shards never stopped");
    if (rc == 0 && (zd_error_code() != ZD_ERR_STOPPED || !strstr(zd_error_last(), "stopped")))
        rc = world_fail(w, "after the stop: %s (%s)", zd_error_last(),
                        zd_error_code_name(zd_error_code()));
    return trainer_leave(w, rc, ps, m, want);
}

static int sync_world(const world_t *w)
{
    if (w->rank < 2)
        return sync_trainer(w);
    return run_shard(w, w->rank - 2, 3, 0);
}

static void run_sync(int n_shards)
{
    setup_t su = {.n_shards = n_shards, .mode = ZD_PS_SYNC, .max_staleness = -1};
    world_options_t o = {.world_size = 2 + n_shards,
                         .fn = sync_world,
                         .arg = &su,
                         .own_init = true,
                         .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

static void test_sync_one_shard(void **state)
{
    (void)state;
    run_sync(1);
}

static void test_sync_two_shards(void **state)
{
    (void)state;
    run_sync(2);
}

/*  ---- push_pull: the parameters in the push's answer ---- */

/*  Rounds where trainer 0 takes the parameters with its push
    (zd_ps_client_push_pull) and trainer 1 pushes, then pulls: both
    replicas hold the round's step right after, at the round's version;
    one trainer's fetch does not change the other's answer. In
    asynchronous mode (one trainer, w->arg's mode) each push_pull brings
    its own step; a refused one leaves the replica as it was. */
static int push_pull_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    const int trainers = su->mode == ZD_PS_SYNC ? 2 : 1;
    int ranks[2];
    shard_ranks(trainers, su->n_shards, ranks);
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, su->n_shards, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = 0;
    if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "pull: %s", zd_error_last());
    for (int round = 0; round < 3 && rc == 0; round++) {
        const char *bad;
        sgd_mean(want, trainers, round);
        int r = set_grads(m, w->rank, round);
        if (r == 0 && w->rank == 0)
            r = zd_ps_client_push_pull(ps, ZD_TIMEOUT_DEFAULT);
        else if (r == 0)
            r = zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0
                ? -1
                : zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT);
        if (r < 0)
            rc = world_fail(w, "round %d: %s", round, zd_error_last());
        else if ((bad = differs(m, want)))
            rc = world_fail(w, "round %d: %s is not the round's step", round, bad);
        for (int s = 0; rc == 0 && s < su->n_shards; s++)
            if (zd_ps_client_version(ps, s) != round + 1)
                rc = world_fail(w, "round %d: shard %d's version %lld", round, s,
                                (long long)zd_ps_client_version(ps, s));
    }
    if (rc == 0 && su->mode == ZD_PS_ASYNC) {
        /* a gradient that is not finite: refused, nothing fetched */
        set_grads(m, 0, 3);
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_find(m, names[2]));
        zd_tensor_data(g)[1] = NAN;
        zd_tensor_unref(g);
        const char *bad;
        if (zd_ps_client_push_pull(ps, ZD_TIMEOUT_DEFAULT) == 0 ||
            zd_error_code() != ZD_ERR_ARGUMENT || !strstr(zd_error_last(), names[2]))
            rc = world_fail(w, "a push_pull of nan: %s", zd_error_last());
        else if ((bad = differs(m, want)) || zd_ps_client_version(ps, 0) != 3)
            rc = world_fail(w, "after a refused push_pull: %s changed, version %lld",
                            bad ? bad : "nothing", (long long)zd_ps_client_version(ps, 0));
    }
    return trainer_leave(w, rc, ps, m, want);
}

static int push_pull_world(const world_t *w)
{
    const setup_t *su = w->arg;
    const int trainers = su->mode == ZD_PS_SYNC ? 2 : 1;
    if (w->rank < trainers)
        return push_pull_trainer(w);
    return run_shard(w, w->rank - trainers, 0, 0);
}

static void test_push_pull(void **state)
{
    (void)state;
    for (int sync = 1; sync >= 0; sync--) {
        setup_t su = {.n_shards = 2,
                      .mode = sync ? ZD_PS_SYNC : ZD_PS_ASYNC,
                      .max_staleness = -1,
                      .num_trainers = 2};
        world_options_t o = {.world_size = (sync ? 2 : 1) + su.n_shards,
                             .fn = push_pull_world,
                             .arg = &su,
                             .own_init = true,
                             .timeout_s = 60};
        assert_int_equal(world_run(&o), 0);
    }
}

/*  ---- asynchronous, stale pushes, hostile pushes ---- */

/*  Calls shard 0's push directly with args (taken over): 0 with the
    answer's code and text, or -1 when the call failed. */
static int raw_push(zd_value_t *args, int64_t *code, char *text, size_t size)
{
    zd_value_t *v = NULL;
    if (zd_rpc_sync_take(1, "__zd_ps_push_0", args, ZD_TIMEOUT_DEFAULT, &v) < 0)
        return -1;
    const char *t = "";
    int rc = zd_rpc_arg_int(v, 0, code) == 0 && zd_rpc_arg_string(v, 2, &t) == 0 ? 0 : -1;
    snprintf(text, size, "%s", t);
    zd_value_unref(v);
    return rc;
}

static zd_tensor_t *filled(zd_tensor_dtype_t dtype, int64_t d0, int64_t d1, float value)
{
    int64_t shape[2] = {d0, d1};
    zd_tensor_t *t = zd_tensor_new(dtype, shape, d1 ? 2 : 1);
    if (t && dtype == ZD_FLOAT32)
        zd_tensor_fill_(t, value);
    return t;
}

/*  A push of all four tensors at version 0, with the one called name
    replaced by odd (NULL: left out), or odd added under name when no
    tensor has it: the list [0, name, t, ...]. */
static zd_value_t *push_with(const char *name, zd_tensor_t *odd)
{
    zd_value_t *v = zd_value_list(11);
    bool found = false;
    zd_list_append(v, zd_value_int(0));
    for (int i = 0; i < 4; i++) {
        zd_tensor_t *t = filled(ZD_FLOAT32, shapes[i][0], shapes[i][1], 0.25f);
        if (strcmp(names[i], name) == 0) {
            found = true;
            zd_tensor_unref(t);
            t = odd ? zd_tensor_ref(odd) : NULL;
        }
        if (t) {
            zd_list_append(v, zd_value_string(names[i]));
            zd_list_append(v, zd_value_tensor(t));
        }
        zd_tensor_unref(t);
    }
    if (!found) {
        zd_list_append(v, zd_value_string(name));
        zd_list_append(v, zd_value_tensor(odd));
    }
    return v;
}

/*  Expects the push to be refused with ZD_ERR_ARGUMENT, naming what. */
static int expect_refused(const world_t *w, zd_value_t *args, const char *what)
{
    int64_t code = 0;
    char text[512];
    if (raw_push(args, &code, text, sizeof text) < 0)
        return world_fail(w, "push expecting \"%s\": %s", what, zd_error_last());
    if (code != ZD_ERR_ARGUMENT || !strstr(text, what))
        return world_fail(w, "expected a refusal with \"%s\", got code %lld: %s", what,
                          (long long)code, text);
    printf("refused: %s\n", text);
    return 0;
}

/*  zd_ps_client_step's computation for trainer a: the replica's
    gradients of round 2; the first time, trainer b takes a step (round
    3's gradients) in between, which makes a's push stale. */
typedef struct {
    zd_nn_module_t *ma, *mb;
    zd_ps_client_t *b;
    int calls;
    bool fail; /* fail instead, with an error of its own */
} step_arg_t;

static int step_compute(void *arg)
{
    step_arg_t *sa = arg;
    if (sa->fail)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "no data left");
    if (++sa->calls == 1 &&
        (zd_ps_client_pull(sa->b, ZD_TIMEOUT_DEFAULT) < 0 || set_grads(sa->mb, 0, 3) < 0 ||
         zd_ps_client_push(sa->b, ZD_TIMEOUT_DEFAULT) < 0))
        return -1;
    return set_grads(sa->ma, 0, 2);
}

/*  From version 2: a step of a made stale once by b's step is computed
    again and taken (versions 3 and 4); a computation that fails ends the
    step with its error and pushes nothing. */
static int client_step(const world_t *w, zd_ps_client_t *a, zd_ps_client_t *b, zd_nn_module_t *ma,
                       zd_nn_module_t *mb, zd_nn_module_t *want)
{
    step_arg_t sa = {.ma = ma, .mb = mb, .b = b};
    if (zd_ps_client_step(a, step_compute, &sa, ZD_TIMEOUT_DEFAULT) < 0)
        return world_fail(w, "step: %s", zd_error_last());
    sgd_mean(want, 1, 3);
    sgd_mean(want, 1, 2);
    const char *bad;
    if (sa.calls != 2 || zd_ps_client_stale_pushes(a) != 1)
        return world_fail(w, "step: %d computations, %lld stale pushes; expected 2 and 1", sa.calls,
                          (long long)zd_ps_client_stale_pushes(a));
    if (zd_ps_client_pull(a, ZD_TIMEOUT_DEFAULT) < 0 || (bad = differs(ma, want)) ||
        zd_ps_client_version(a, 0) != 4)
        return world_fail(w, "after the step: version %lld", (long long)zd_ps_client_version(a, 0));
    sa.fail = true;
    if (zd_ps_client_step(a, step_compute, &sa, ZD_TIMEOUT_DEFAULT) == 0 ||
        zd_error_code() != ZD_ERR_ARGUMENT || !strstr(zd_error_last(), "ps: step: no data left"))
        return world_fail(w, "a failed computation: %s", zd_error_last());
    if (zd_ps_client_pull(a, ZD_TIMEOUT_DEFAULT) < 0 || zd_ps_client_version(a, 0) != 4)
        return world_fail(w, "a failed computation pushed: version %lld",
                          (long long)zd_ps_client_version(a, 0));
    return 0;
}

static int async_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    int ranks[1] = {1};
    zd_nn_module_t *ma = make_model(), *mb = make_model(), *want = make_model();
    WCHECK(ma && mb && want);
    zd_ps_client_t *a = zd_ps_client_new_module(ma, ranks, 1, &o);
    zd_ps_client_t *b = zd_ps_client_new_module(mb, ranks, 1, &o);
    WCHECK(a && b);
    WTRY(world_join(w));
    int rc = 0;
    /* Hostile pushes first: each refused, naming the tensor, and nothing moves. */
    zd_tensor_t *nan = filled(ZD_FLOAT32, 3, 0, 0.5f), *wrong = filled(ZD_FLOAT32, 2, 3, 0.5f);
    zd_tensor_t *ints = filled(ZD_INT64, 3, 2, 0);
    zd_tensor_t *extra = filled(ZD_FLOAT32, 1, 0, 0.5f);
    WCHECK(nan && wrong && ints && extra);
    zd_tensor_data(nan)[1] = NAN;
    if (expect_refused(w, push_with("b.weight", wrong),
                       "\"b.weight\" has shape (2, 3), not (3, 2)") < 0 ||
        expect_refused(w, push_with("b.weight", ints), "\"b.weight\" is int64") < 0 ||
        expect_refused(w, push_with("a.bias", nan), "\"a.bias\" element 1 is nan") < 0 ||
        expect_refused(w, push_with("a.bias", NULL), "\"a.bias\" missing") < 0 ||
        expect_refused(w, push_with("c.bias", extra), "no tensor \"c.bias\"") < 0 ||
        expect_refused(w, ZD_ARGS("zero"), "argument 0") < 0)
        rc = -1;
    zd_tensor_unref(nan);
    zd_tensor_unref(wrong);
    zd_tensor_unref(ints);
    zd_tensor_unref(extra);
    /* The same NaN through the client: refused by the shard, named. */
    if (rc == 0 && (zd_ps_client_pull(a, ZD_TIMEOUT_DEFAULT) < 0 || set_grads(ma, 0, 0) < 0))
        rc = world_fail(w, "pull: %s", zd_error_last());
    if (rc == 0) {
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_find(ma, "b.bias"));
        zd_tensor_data(g)[0] = INFINITY;
        zd_tensor_unref(g);
        if (zd_ps_client_push(a, ZD_TIMEOUT_DEFAULT) == 0 || zd_error_code() != ZD_ERR_ARGUMENT ||
            !strstr(zd_error_last(), "\"b.bias\" element 0 is inf"))
            rc = world_fail(w, "a push with inf: %s", zd_error_last());
    }
    /* Two trainers pull version 0; the first push makes it 1, the second
       is then stale (max_staleness 0) and refused. */
    const char *bad;
    if (rc == 0 &&
        (zd_ps_client_pull(a, ZD_TIMEOUT_DEFAULT) < 0 ||
         zd_ps_client_pull(b, ZD_TIMEOUT_DEFAULT) < 0))
        rc = world_fail(w, "pull: %s", zd_error_last());
    else if (rc == 0 && ((bad = differs(ma, want)) || (bad = differs(mb, want))))
        rc = world_fail(w, "%s moved under refused pushes", bad);
    if (rc == 0 && (set_grads(ma, 0, 0) < 0 || zd_ps_client_push(a, ZD_TIMEOUT_DEFAULT) < 0))
        rc = world_fail(w, "push: %s", zd_error_last());
    if (rc == 0 &&
        (set_grads(mb, 1, 0) < 0 || zd_ps_client_push(b, ZD_TIMEOUT_DEFAULT) == 0 ||
         zd_error_code() != ZD_ERR_STALE ||
         !strstr(zd_error_last(), "computed on version 0, the shard is at 1")))
        rc = world_fail(w, "a stale push: %s (%s)", zd_error_last(),
                        zd_error_code_name(zd_error_code()));
    if (rc == 0)
        printf("stale: %s\n", zd_error_last());
    /* Pulled again, the second trainer's push is taken: two plain steps. */
    sgd_mean(want, 1, 0);
    if (rc == 0 && (zd_ps_client_pull(b, ZD_TIMEOUT_DEFAULT) < 0 || (bad = differs(mb, want))))
        rc = world_fail(w, "after one step: %s", zd_error_last());
    if (rc == 0 &&
        (set_grads(mb, 0, 1) < 0 || zd_ps_client_push(b, ZD_TIMEOUT_DEFAULT) < 0 ||
         zd_ps_client_pull(a, ZD_TIMEOUT_DEFAULT) < 0))
        rc = world_fail(w, "second push: %s", zd_error_last());
    sgd_mean(want, 1, 1);
    if (rc == 0 && ((bad = differs(ma, want)) || zd_ps_client_version(a, 0) != 2))
        rc = world_fail(w, "after two steps: version %lld", (long long)zd_ps_client_version(a, 0));
    if (rc == 0)
        rc = client_step(w, a, b, ma, mb, want);
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    zd_ps_client_free(a);
    zd_ps_client_free(b);
    zd_nn_module_free(ma);
    zd_nn_module_free(mb);
    zd_nn_module_free(want);
    return rc;
}

static int async_world(const world_t *w)
{
    return w->rank == 0 ? async_trainer(w) : run_shard(w, 0, 0, 0);
}

/*  The shard's count of what async_trainer does: 4 pushes taken (a, b,
    and client_step's b and a), 2 refused as stale (b's, and a's first in
    client_step), 7 refused as bad (6 raw, 1 inf), 11 pulls (5 before
    client_step, 3 in its first step, 1 after, 1 in the failing step, 1
    after it). */
static void async_stats(zd_ps_server_t *srv, zd_ps_mode_t mode, zd_ps_server_stats_t *want)
{
    (void)srv;
    (void)mode;
    *want = (zd_ps_server_stats_t){
        .version = 4, .steps = 4, .pushes = 4, .pulls = 11, .stale = 2, .refused = 7};
}

static void test_async_stale_and_refused(void **state)
{
    (void)state;
    setup_t su = {
        .n_shards = 1, .mode = ZD_PS_ASYNC, .max_staleness = 0, .want_stats = async_stats};
    world_options_t o = {
        .world_size = 2, .fn = async_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a step that diverges ---- */

/*  The replica's gradients all 0, but element 1 of b.weight: big. */
static int diverging_grads(zd_nn_module_t *m, float big)
{
    if (set_grads(m, 0, 0) < 0)
        return -1;
    for (int i = 0; i < 4; i++) {
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_find(m, names[i]));
        zd_tensor_zero_(g);
        if (i == 2)
            zd_tensor_data(g)[1] = big;
        zd_tensor_unref(g);
    }
    return 0;
}

/*  A push at position `position` with b.weight[1]'s gradient big: refused
    with ZD_ERR_ARGUMENT and a text holding what, or (what NULL) taken.
    Then the replica pulled equals want (every other gradient is 0), each
    shard at `version`, and the shards keep the position before (refused:
    the last one taken, `was`) or this one. */
static int diverging_push(const world_t *w, zd_ps_client_t *ps, zd_nn_module_t *m,
                          zd_nn_module_t *want, int n_shards, float big, int64_t position,
                          int64_t was, const char *what, int64_t version)
{
    int64_t at = -2;
    const char *bad = NULL;
    if (diverging_grads(m, big) < 0 || zd_ps_client_set_position(ps, position) < 0)
        return world_fail(w, "set: %s", zd_error_last());
    int r = zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT);
    if (what ? r == 0 || zd_error_code() != ZD_ERR_ARGUMENT || !strstr(zd_error_last(), what)
             : r < 0)
        return world_fail(w, "push of %g: %s (expected %s)", (double)big,
                          r == 0 ? "taken" : zd_error_last(), what ? what : "taken");
    if (what)
        printf("diverging: %s\n", zd_error_last());
    if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 || (bad = differs(m, want)))
        return world_fail(w, "after the push of %g: %s", (double)big, bad ? bad : zd_error_last());
    for (int k = 0; k < n_shards; k++)
        if (zd_ps_client_version(ps, k) != version)
            return world_fail(w, "after the push of %g: shard %d at version %lld, not %lld",
                              (double)big, k, (long long)zd_ps_client_version(ps, k),
                              (long long)version);
    if (zd_ps_client_resume_position(ps, ZD_TIMEOUT_DEFAULT, &at) < 0 ||
        at != (what ? was : position))
        return world_fail(w, "after the push of %g: the shards keep position %lld, not %lld (%s)",
                          (double)big, (long long)at, (long long)(what ? was : position),
                          zd_error_last());
    return 0;
}

/*  At the shards' learning rate of 1e30, b.weight[1]'s gradient of 1e10
    makes it -inf: the step is undone and refused, naming the tensor and
    the element, the parameters as they were; a synchronous round still
    counts as one on every shard (the version moves on together), and its
    position goes back. A push of zeros is then taken: the shard goes on.
    In synchronous rounds, gradients whose sum overflows a float are
    refused the same way before any step. */
static int diverging_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    const bool sync = su->mode == ZD_PS_SYNC;
    zd_ps_options_t o = options(su);
    int ranks[2];
    shard_ranks(sync ? 2 : 1, su->n_shards, ranks);
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, su->n_shards, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    const int n = su->n_shards;
    int rc = zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0
        ? world_fail(w, "pull: %s", zd_error_last())
        : 0;
    if (rc == 0)
        rc = diverging_push(w, ps, m, want, n, 1e10f, 5, -1, "made \"b.weight\" -inf at element 1",
                            sync ? 1 : 0);
    if (rc == 0)
        rc = diverging_push(w, ps, m, want, n, 0, 6, -1, NULL, sync ? 2 : 1);
    if (rc == 0 && sync)
        rc =
            diverging_push(w, ps, m, want, n, FLT_MAX, 7, 6,
                           "gradients of \"b.weight\" is inf at element 1 (their sum overflows", 3);
    if (rc == 0 && sync)
        rc = diverging_push(w, ps, m, want, n, 0, 8, 6, NULL, 4);
    return trainer_leave(w, rc, ps, m, want);
}

/*  What a shard ends with: the one holding b.weight refused the diverged
    rounds (sync: 2 of 4 rounds of 2 trainers, each trainer pulling 5
    times; async: 1 of 2 pushes, 3 pulls), the other took every round. */
static void diverging_stats(zd_ps_server_t *srv, zd_ps_mode_t mode, zd_ps_server_stats_t *want)
{
    const bool sync = mode == ZD_PS_SYNC;
    const int64_t trainers = sync ? 2 : 1, rounds = sync ? 4 : 2;
    zd_named_tensors_t *mine = zd_ps_server_params(srv);
    const int64_t refused = mine && zd_named_tensors_find(mine, "b.weight") ? rounds / 2 : 0;
    zd_named_tensors_free(mine);
    *want = (zd_ps_server_stats_t){.version = sync ? 4 : 1,
                                   .steps = rounds - refused,
                                   .pushes = (rounds - refused) * trainers,
                                   .pulls = (sync ? 5 : 3) * trainers,
                                   .diverged = refused};
}

static int diverging_world(const world_t *w)
{
    const setup_t *su = w->arg;
    const int trainers = su->mode == ZD_PS_SYNC ? 2 : 1;
    return w->rank < trainers ? diverging_trainer(w) : run_shard(w, w->rank - trainers, 0, 0);
}

static void test_diverging_step_refused(void **state)
{
    (void)state;
    for (int sync = 1; sync >= 0; sync--) {
        setup_t su = {.n_shards = sync ? 2 : 1,
                      .mode = sync ? ZD_PS_SYNC : ZD_PS_ASYNC,
                      .max_staleness = -1,
                      .num_trainers = 2,
                      .lr = 1e30,
                      .want_stats = diverging_stats};
        world_options_t o = {.world_size = (sync ? 2 : 1) + su.n_shards,
                             .fn = diverging_world,
                             .arg = &su,
                             .own_init = true,
                             .timeout_s = 60};
        assert_int_equal(world_run(&o), 0);
    }
}

/*  A synchronous round that diverges, completed by a trainer's loss:
    trainer 1 pulls (the shard knows it), waits until trainer 0's push of
    a diverging gradient is in the round, and dies; the loss completes
    the round (the shard's peer-lost path, not a push's), whose step is
    refused and undone: trainer 0 is told so (ZD_ERR_ARGUMENT naming the
    tensor), the version moves on, its position goes back. The next
    round completes with trainer 0 alone. */
static int lost_diverging_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    int shard = 2;
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, &shard, 1, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0
        ? world_fail(w, "pull: %s", zd_error_last())
        : 0;
    if (w->rank == 1) {
        int64_t deadline = world_now_ms() + world_scaled_ms(20000), waiting = 0;
        while (rc == 0 && waiting < 1) {
            zd_value_t *v = NULL;
            if (zd_rpc_sync_take(shard, "test.waiting", ZD_ARGS(), ZD_TIMEOUT_DEFAULT, &v) < 0 ||
                zd_value_get_int(v, &waiting) < 0)
                rc = world_fail(w, "test.waiting: %s", zd_error_last());
            else if (waiting < 1 && world_now_ms() > deadline)
                rc = world_fail(w, "trainer 0's push never reached the round");
            else if (waiting < 1)
                nanosleep(&(struct timespec){0, 2000000}, NULL);
            zd_value_unref(v);
        }
        if (rc == 0)
            raise(SIGKILL);
        return trainer_leave(w, rc, ps, m, want);
    }
    if (rc == 0)
        rc = diverging_push(w, ps, m, want, 1, 1e10f, 5, -1, "made \"b.weight\" -inf at element 1",
                            1);
    if (rc == 0)
        rc = diverging_push(w, ps, m, want, 1, 0, 6, -1, NULL, 2);
    return trainer_leave(w, rc, ps, m, want);
}

/*  The shard refused one round of two, took the other (trainer 0's push
    alone); trainer 0 pulled three times, trainer 1 once. */
static void lost_diverging_stats(zd_ps_server_t *srv, zd_ps_mode_t mode, zd_ps_server_stats_t *want)
{
    (void)srv, (void)mode;
    *want =
        (zd_ps_server_stats_t){.version = 2, .steps = 1, .pushes = 1, .pulls = 4, .diverged = 1};
}

static int lost_diverging_world(const world_t *w)
{
    return w->rank < 2 ? lost_diverging_trainer(w) : run_shard(w, 0, 0, 0);
}

static void test_diverging_round_completed_by_loss(void **state)
{
    (void)state;
    setup_t su = {.n_shards = 1,
                  .mode = ZD_PS_SYNC,
                  .max_staleness = -1,
                  .num_trainers = 2,
                  .lr = 1e30,
                  .lossy = true,
                  .want_stats = lost_diverging_stats};
    world_options_t o = {.world_size = 3,
                         .fn = lost_diverging_world,
                         .arg = &su,
                         .own_init = true,
                         .timeout_s = 60,
                         .expect_exit = {0, 128 + SIGKILL, 0}};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a checkpoint folder made ready ---- */

/*  A shard made with checkpoints removes what its own writes left when
    their process died (temporary files of a save, a probe), and nothing
    else; a folder it cannot write is refused at once, naming the path. */
static void test_checkpoint_folder_prepared(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_prep_XXXXXX", path[128], prefix[96];
    assert_non_null(mkdtemp(dir));
    const char *const stale[] = {"c.shard0.new.tmp.4242.0", "c.shard0.tmp.17.3",
                                 "c.shard0.probe.99"};
    const char *const kept[] = {"c.shard0.new.tmpx",    "c.shard1.new.tmp.1.1", "c.shard0.new.tmp.",
                                "d.shard0.tmp.1.1",     "c.shard0.tmp.1.x",     "c.shard01.tmp.1.1",
                                "c.shard00.new.tmp.1.1"};
    const int n_stale = 3, n_kept = 7;
    for (int i = 0; i < n_stale + n_kept; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, i < n_stale ? stale[i] : kept[i - n_stale]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
    }
    zd_nn_module_t *m = make_model();
    assert_non_null(m);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    zd_ps_options_t o = zd_ps_options_default();
    snprintf(prefix, sizeof prefix, "%s/c", dir);
    o.checkpoint_path = prefix;
    zd_ps_server_t *srv = zd_ps_server_new_module(m, 0, 2, &sgd, &o);
    assert_non_null(srv);
    zd_ps_server_free(srv);
    for (int i = 0; i < n_stale + n_kept; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, i < n_stale ? stale[i] : kept[i - n_stale]);
        if ((access(path, F_OK) == 0) != (i >= n_stale))
            fail_msg("%s was %s", path, i < n_stale ? "left" : "removed");
        unlink(path);
    }
    /* a folder that is not there */
    snprintf(prefix, sizeof prefix, "%s/none/c", dir);
    assert_null(zd_ps_server_new_module(m, 0, 1, &sgd, &o));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "/none/c.shard0.probe."));
    assert_non_null(strstr(zd_error_last(), "No such file or directory"));
    zd_nn_module_free(m);
    assert_int_equal(rmdir(dir), 0);
}

/*  A push/pull shard's checkpoints carry the run's tag too: a resume
    with another is refused, naming the file and both; with the same, it
    resumes. */
static void test_run_tag(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_tag_XXXXXX", prefix[96], cmd[128];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/c", dir);
    zd_nn_module_t *m = make_model();
    assert_non_null(m);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    zd_ps_options_t o = zd_ps_options_default();
    o.checkpoint_path = prefix;
    o.run_tag = "--batch_size=32";
    zd_ps_server_t *srv = zd_ps_server_new_module(m, 0, 1, &sgd, &o);
    assert_non_null(srv);
    assert_int_equal(zd_ps_server_checkpoint(srv), 0);
    zd_ps_server_free(srv);
    o.resume = true;
    o.run_tag = "--batch_size=64";
    assert_null(zd_ps_server_new_module(m, 0, 1, &sgd, &o));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(),
                           "c.shard0 was written by a run with "
                           "\"--batch_size=32\"; this one has "
                           "\"--batch_size=64\""));
    o.run_tag = "--batch_size=32";
    assert_non_null(srv = zd_ps_server_new_module(m, 0, 1, &sgd, &o));
    zd_ps_server_free(srv);
    zd_nn_module_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  ---- a shard lost ---- */

static int lost_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    int ranks[2];
    shard_ranks(2, 2, ranks);
    zd_nn_module_t *m = make_model();
    WCHECK(m);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, 2, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = 0;
    /* Shard 1 dies at its version 2 (one push of each trainer): pull and
       push until the calls fail. */
    int64_t deadline = world_now_ms() + world_scaled_ms(20000);
    for (int round = 0; rc == 0; round++) {
        if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 || set_grads(m, w->rank, round) < 0 ||
            zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0)
            break;
        if (world_now_ms() > deadline)
            rc = world_fail(w, "shard 1 never went");
    }
    if (rc == 0 &&
        (zd_error_code() != ZD_ERR_PEER || !strstr(zd_error_last(), "shard 1 (rank 3) lost")))
        rc = world_fail(w, "expected shard 1 lost, got %s: %s", zd_error_code_name(zd_error_code()),
                        zd_error_last());
    if (rc == 0)
        printf("rank %d: %s\n", w->rank, zd_error_last());
    /* The survivors leave without it. */
    zd_rpc_shutdown(true, world_scaled_ms(20000));
    zd_ps_client_free(ps);
    zd_nn_module_free(m);
    return rc;
}

static int lost_world(const world_t *w)
{
    if (w->rank < 2)
        return lost_trainer(w);
    return run_shard(w, w->rank - 2, 0, w->rank == 3 ? 2 : 0);
}

static void test_shard_lost(void **state)
{
    (void)state;
    setup_t su = {.n_shards = 2, .mode = ZD_PS_ASYNC, .max_staleness = -1, .lossy = true};
    world_options_t o = {.world_size = 4,
                         .fn = lost_world,
                         .arg = &su,
                         .own_init = true,
                         .timeout_s = 60,
                         .expect_exit = {0, 0, 0, 128 + SIGKILL}};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a trainer lost in synchronous mode ---- */

/*  Trainers 0 and 1 train four rounds; trainer 2 pulls once (the shard
    knows it from then on) and dies. Each round waits for it until it is
    declared lost, then completes with the other two: the mean of theirs.
    Trainer 0 pushes with push_pull, its first round through the shard's
    function itself (raw_push_pull_round0). */
/*  Trainer 0's round 0 through the shard's push_pull function called
    directly: the answer must carry the parameters after the round's
    step whatever completed the round (here, nearly always, the loss of
    trainer 2), not a push's bare answer, which the client would mend by
    pulling. 0, or world_fail's -1. */
static int raw_push_pull_round0(const world_t *w, zd_ps_client_t *ps, zd_nn_module_t *m,
                                zd_nn_module_t *want, int shard_rank)
{
    if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 || set_grads(m, w->rank, 0) < 0)
        return world_fail(w, "round 0: %s", zd_error_last());
    zd_value_t *args = zd_value_list(9), *v = NULL;
    WCHECK(args && zd_list_append(args, zd_value_int(0)) == 0);
    for (int i = 0; i < 4; i++) {
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_find(m, names[i]));
        WCHECK(g && zd_list_append(args, zd_value_string(names[i])) == 0 &&
               zd_list_append(args, zd_value_tensor(g)) == 0);
        zd_tensor_unref(g);
    }
    if (zd_rpc_sync_take(shard_rank, "__zd_ps_pushpull_0", args, ZD_TIMEOUT_DEFAULT, &v) < 0)
        return world_fail(w, "round 0's push_pull: %s", zd_error_last());
    sgd_mean(want, 2, 0);
    int64_t code = -1;
    int rc = zd_rpc_arg_int(v, 0, &code) == 0 && code == ZD_OK && zd_list_len(v) == 3 + 2 * 4
        ? 0
        : world_fail(w,
                     "round 0's push_pull answered code %lld with %zu items, not the "
                     "parameters",
                     (long long)code, zd_list_len(v));
    for (int i = 0; rc == 0 && i < 4; i++) {
        const char *name = NULL;
        zd_tensor_t *t = NULL, *e;
        if (zd_rpc_arg_string(v, 3 + 2 * (size_t)i, &name) < 0 ||
            zd_rpc_arg_tensor(v, 4 + 2 * (size_t)i, &t) < 0 ||
            !(e = zd_nn_module_find(want, name)) || zd_tensor_nbytes(t) != zd_tensor_nbytes(e) ||
            memcmp(zd_tensor_data(t), zd_tensor_data(e), zd_tensor_nbytes(e)) != 0)
            rc = world_fail(w, "round 0's push_pull: tensor %d is not the round's step", i);
    }
    zd_value_unref(v);
    return rc;
}

static int three_trainers(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_options_t o = options(su);
    int shard = 3;
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, &shard, 1, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = 0;
    if (w->rank == 2) {
        if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "pull: %s", zd_error_last());
        else
            raise(SIGKILL);
    }
    if (rc == 0)
        rc = w->rank == 0 ? raw_push_pull_round0(w, ps, m, want, shard) : 0;
    if (rc == 0)
        rc = sync_rounds(w, ps, m, want, w->rank == 0 ? 1 : 0, 4,
                         "the step with the survivors' mean", w->rank == 0);
    if (rc == 0 && (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 || differs(m, want)))
        rc = world_fail(w, "after the last round: %s", zd_error_last());
    zd_rpc_shutdown(true, world_scaled_ms(20000)); /* may report the lost trainer */
    zd_ps_client_free(ps);
    zd_nn_module_free(m);
    zd_nn_module_free(want);
    return rc;
}

static int trainer_lost_world(const world_t *w)
{
    if (w->rank < 3)
        return three_trainers(w);
    return run_shard(w, 0, 0, 0);
}

static void test_sync_trainer_lost(void **state)
{
    (void)state;
    setup_t su = {
        .n_shards = 1, .mode = ZD_PS_SYNC, .max_staleness = -1, .lossy = true, .num_trainers = 3};
    world_options_t o = {.world_size = 4,
                         .fn = trainer_lost_world,
                         .arg = &su,
                         .own_init = true,
                         .timeout_s = 60,
                         .expect_exit = {0, 0, 128 + SIGKILL, 0}};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- checkpoints ---- */

typedef struct {
    char prefix[256]; /* checkpoint_path */
    int rounds;       /* the trainer's pushes (async, one step each) */
    int64_t die_at;   /* the shard dies at this version (0: never) */
    int64_t resumed;  /* the version the shard must start from */
} ckpt_setup_t;

static zd_ps_options_t ckpt_options(const ckpt_setup_t *cs)
{
    zd_ps_options_t o = zd_ps_options_default();
    o.checkpoint_path = cs->prefix;
    o.checkpoint_every = 2;
    o.resume = true;
    return o;
}

/*  want -= LR * trainer 0's gradient of each round before `rounds`. */
static void async_steps(zd_nn_module_t *want, int rounds)
{
    for (int round = 0; round < rounds; round++)
        sgd_mean(want, 1, round);
}

static int ckpt_shard(const world_t *w)
{
    const ckpt_setup_t *cs = w->arg;
    zd_ps_options_t o = ckpt_options(cs);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    zd_nn_module_t *m = make_model();
    WCHECK(m);
    zd_ps_server_t *srv = zd_ps_server_new_module(m, 0, 1, &sgd, &o);
    zd_nn_module_free(m);
    WCHECK(srv);
    int rc = 0;
    if (zd_ps_server_version(srv) != cs->resumed)
        rc = world_fail(w, "resumed at version %lld, not %lld",
                        (long long)zd_ps_server_version(srv), (long long)cs->resumed);
    WTRY(world_join(w));
    if (rc == 0 && cs->die_at > 0) {
        if (wait_version(srv, cs->die_at, 20000) < 0)
            rc = world_fail(w, "never reached version %lld", (long long)cs->die_at);
        else
            raise(SIGKILL);
    }
    zd_rpc_shutdown(true, world_scaled_ms(30000));
    zd_ps_server_free(srv);
    return rc;
}

static int ckpt_trainer(const world_t *w)
{
    const ckpt_setup_t *cs = w->arg;
    zd_ps_options_t o = ckpt_options(cs);
    int shard = 1;
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, &shard, 1, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    async_steps(want, (int)cs->resumed);
    int rc = 0;
    const char *bad;
    /* Each push says the round after it is next (100 + round + 1): the
       checkpoint of version v holds 100 + v, none before a checkpoint. */
    int64_t position, expect = cs->resumed ? 100 + cs->resumed : -1;
    if (zd_ps_client_resume_position(ps, ZD_TIMEOUT_DEFAULT, &position) < 0)
        rc = world_fail(w, "resume position: %s", zd_error_last());
    else if (position != expect)
        rc =
            world_fail(w, "resume position %lld, not %lld", (long long)position, (long long)expect);
    if (rc == 0 && zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "first pull: %s", zd_error_last());
    else if (zd_ps_client_version(ps, 0) != cs->resumed || (bad = differs(m, want)))
        rc = world_fail(w, "the shard started at version %lld, not the checkpoint's %lld",
                        (long long)zd_ps_client_version(ps, 0), (long long)cs->resumed);
    for (int round = (int)cs->resumed; rc == 0 && round < cs->rounds; round++) {
        if (set_grads(m, 0, round) < 0 || zd_ps_client_set_position(ps, 100 + round + 1) < 0)
            rc = world_fail(w, "set_grads: %s", zd_error_last());
        else if (zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0) {
            /* the shard may die before it answers the push that kills it */
            if (round + 1 < cs->die_at || zd_error_code() != ZD_ERR_PEER)
                rc = world_fail(w, "push of round %d: %s", round, zd_error_last());
            break;
        } else if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 && round + 1 < cs->die_at) {
            rc = world_fail(w, "pull of round %d: %s", round, zd_error_last());
        }
    }
    zd_rpc_shutdown(true, world_scaled_ms(20000)); /* may report the dead shard */
    zd_ps_client_free(ps);
    zd_nn_module_free(m);
    zd_nn_module_free(want);
    return rc;
}

/*  Pushes tagged with a version the shard never had: stale. */
static int ahead_trainer(const world_t *w)
{
    WTRY(world_join(w));
    zd_value_t *args = zd_value_list(9);
    zd_list_append(args, zd_value_int(99));
    for (int i = 0; i < 4; i++) {
        zd_list_append(args, zd_value_string(names[i]));
        zd_tensor_t *t = filled(ZD_FLOAT32, shapes[i][0], shapes[i][1], 0.25f);
        zd_list_append(args, zd_value_tensor(t));
        zd_tensor_unref(t);
    }
    int64_t code = 0;
    char text[256];
    int rc = 0;
    if (!args || raw_push(args, &code, text, sizeof text) < 0)
        rc = world_fail(w, "push: %s", zd_error_last());
    else if (code != ZD_ERR_STALE || !strstr(text, "computed on version 99"))
        rc = world_fail(w, "a push of version 99: code %lld, %s", (long long)code, text);
    /* A position below 0 is refused, and so is one of another kind. */
    const zd_value_kind_t kinds[2] = {ZD_VALUE_INT, ZD_VALUE_FLOAT};
    for (int k = 0; rc == 0 && k < 2; k++) {
        zd_value_t *bad = zd_value_list(10);
        zd_list_append(bad, zd_value_int(0));
        zd_list_append(bad, kinds[k] == ZD_VALUE_INT ? zd_value_int(-5) : zd_value_float(1.5));
        for (int i = 0; i < 4; i++) {
            zd_list_append(bad, zd_value_string(names[i]));
            zd_tensor_t *t = filled(ZD_FLOAT32, shapes[i][0], shapes[i][1], 0.25f);
            zd_list_append(bad, zd_value_tensor(t));
            zd_tensor_unref(t);
        }
        if (raw_push(bad, &code, text, sizeof text) < 0)
            rc = world_fail(w, "push: %s", zd_error_last());
        else if (code != ZD_ERR_ARGUMENT ||
                 !strstr(text, k == 0 ? "position -5" : "refused by shard 0"))
            rc = world_fail(w, "a push with a bad position: code %lld, %s", (long long)code, text);
    }
    if (zd_rpc_shutdown(true, world_scaled_ms(20000)) < 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    return rc;
}

static int ckpt_world(const world_t *w)
{
    const ckpt_setup_t *cs = w->arg;
    if (w->rank == 1)
        return ckpt_shard(w);
    return cs->rounds ? ckpt_trainer(w) : ahead_trainer(w);
}

static void ckpt_run(ckpt_setup_t *cs, bool shard_dies)
{
    world_options_t o = {.world_size = 2,
                         .fn = ckpt_world,
                         .arg = cs,
                         .own_init = true,
                         .timeout_s = 60,
                         .expect_exit = {0, shard_dies ? 128 + SIGKILL : 0}};
    assert_int_equal(world_run(&o), 0);
}

static void test_checkpoint_resume(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_ckpt_XXXXXX";
    assert_non_null(mkdtemp(dir));
    ckpt_setup_t cs = {.rounds = 5, .die_at = 5, .resumed = 0};
    snprintf(cs.prefix, sizeof cs.prefix, "%s/ps", dir);
    /* No checkpoint yet: the shard starts anew, writes versions 2 and 4,
       and dies at 5. */
    ckpt_run(&cs, true);
    char cur[300], prev[300];
    snprintf(cur, sizeof cur, "%s.shard0", cs.prefix);
    snprintf(prev, sizeof prev, "%s.shard0.prev", cs.prefix);
    assert_int_equal(access(cur, F_OK), 0);
    assert_int_equal(access(prev, F_OK), 0);
    /* Started again, it serves version 4's parameters, and trains on. */
    cs = (ckpt_setup_t){.rounds = 5, .die_at = 0, .resumed = 4, .prefix = ""};
    snprintf(cs.prefix, sizeof cs.prefix, "%s/ps", dir);
    ckpt_run(&cs, false);
    /* A push of a version it never had is stale. */
    cs.rounds = 0;
    ckpt_run(&cs, false);
    /* The newest generation damaged (one byte of its tensors): version 2. */
    FILE *f = fopen(cur, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    fputc(c ^ 0x55, f);
    fclose(f);
    cs = (ckpt_setup_t){.rounds = 3, .die_at = 0, .resumed = 2, .prefix = ""};
    snprintf(cs.prefix, sizeof cs.prefix, "%s/ps", dir);
    ckpt_run(&cs, false);
    /* A shard of another split is refused, naming what it found. */
    zd_nn_module_t *m = make_model();
    zd_ps_options_t o = ckpt_options(&cs);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    zd_ps_server_t *srv = zd_ps_server_new_module(m, 0, 2, &sgd, &o);
    assert_null(srv);
    /* A new run (no resume) there sets the earlier run's files aside: a
       restart before its own checkpoints must not resume from them. */
    o.resume = false;
    assert_non_null(srv = zd_ps_server_new_module(m, 0, 1, &sgd, &o));
    zd_ps_server_free(srv);
    char aside[320];
    snprintf(aside, sizeof aside, "%s.earlier", cur);
    assert_int_equal(access(cur, F_OK), -1);
    assert_int_equal(access(aside, F_OK), 0);
    /* A synchronous one writes its version 0 at once: a path it cannot
       write fails it, by name. */
    o.mode = ZD_PS_SYNC;
    o.checkpoint_path = "/proc/zd_no_such_dir/ps";
    assert_null(zd_ps_server_new_module(m, 0, 1, &sgd, &o));
    assert_non_null(strstr(zd_error_last(), "/proc/zd_no_such_dir/ps"));
    zd_nn_module_free(m);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  ---- synchronous shards brought to one generation ---- */

typedef struct {
    char prefix[256];
    int told[2];        /* test_sync_shard_restarted: the trainer tells shard 1's parent */
    int rounds;         /* the trainer trains up to this round */
    int64_t resumed[2]; /* each shard's own newest readable version */
    int64_t agreed;     /* the version they must agree on (-1: they cannot) */
    bool new_run;       /* shards made without resume */
} gen_setup_t;

static zd_ps_options_t gen_options(const gen_setup_t *gs)
{
    zd_ps_options_t o = zd_ps_options_default();
    o.mode = ZD_PS_SYNC;
    o.checkpoint_path = gs->prefix;
    o.checkpoint_every = 2;
    o.resume = !gs->new_run;
    return o;
}

static int gen_shard(const world_t *w)
{
    const gen_setup_t *gs = w->arg;
    int shard = w->rank - 1;
    zd_ps_options_t o = gen_options(gs);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    zd_nn_module_t *m = make_model();
    WCHECK(m);
    zd_ps_server_t *srv = zd_ps_server_new_module(m, shard, 2, &sgd, &o);
    zd_nn_module_free(m);
    WCHECK(srv);
    int rc = 0;
    if (zd_ps_server_version(srv) != gs->resumed[shard])
        rc = world_fail(w, "shard %d resumed at version %lld, not %lld", shard,
                        (long long)zd_ps_server_version(srv), (long long)gs->resumed[shard]);
    WTRY(world_join(w));
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    zd_ps_server_free(srv);
    return rc;
}

static int gen_trainer(const world_t *w)
{
    const gen_setup_t *gs = w->arg;
    zd_ps_options_t o = gen_options(gs);
    int ranks[2] = {1, 2};
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, 2, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = 0;
    int64_t position, start = gs->agreed > 0 ? gs->agreed : 0;
    int r = zd_ps_client_resume_position(ps, ZD_TIMEOUT_DEFAULT, &position);
    if (gs->agreed < 0) {
        /* shard 0 has no generation of shard 1's version: named */
        if (r == 0 || zd_error_code() != ZD_ERR_ARGUMENT ||
            !strstr(zd_error_last(), "shard 0 has no checkpoint of version 2 (it holds 4 only)"))
            rc = world_fail(w, "resume position with no common generation: %d, %s", r,
                            zd_error_last());
        goto out;
    }
    /* Each push says the round after it is next: the generation of
       version v holds 100 + v. */
    if (r < 0 || position != (start ? 100 + start : -1)) {
        rc = world_fail(w, "resume position %lld: %s", (long long)position,
                        r < 0 ? zd_error_last() : "not the agreed generation's");
        goto out;
    }
    async_steps(want, (int)start); /* one trainer: a round is its step */
    const char *bad;
    if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "first pull: %s", zd_error_last());
    else if (zd_ps_client_version(ps, 0) != start || zd_ps_client_version(ps, 1) != start)
        rc = world_fail(w, "the shards are at versions %lld and %lld, not both at %lld",
                        (long long)zd_ps_client_version(ps, 0),
                        (long long)zd_ps_client_version(ps, 1), (long long)start);
    else if ((bad = differs(m, want)))
        rc = world_fail(w, "%s is not the agreed generation's", bad);
    for (int round = (int)start; rc == 0 && round < gs->rounds; round++) {
        if (set_grads(m, 0, round) < 0 || zd_ps_client_set_position(ps, 100 + round + 1) < 0 ||
            zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0 ||
            zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "round %d: %s", round, zd_error_last());
    }
    for (int round = (int)start; rc == 0 && round < gs->rounds; round++)
        sgd_mean(want, 1, round);
    if (rc == 0 && (bad = differs(m, want)))
        rc = world_fail(w, "after round %d: %s differs", gs->rounds, bad);
out:
    return trainer_leave(w, rc, ps, m, want);
}

static int gen_world(const world_t *w)
{
    return w->rank == 0 ? gen_trainer(w) : gen_shard(w);
}

static void gen_run(const gen_setup_t *gs)
{
    world_options_t o = {
        .world_size = 3, .fn = gen_world, .arg = (void *)gs, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

static void damage(const char *path)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, 40, SEEK_SET), 0);
    fputc(c ^ 0x55, f);
    fclose(f);
}

/*  The version of the generation in the file prefix + suffix, or -1. */
static int64_t file_version(const char *prefix, const char *suffix)
{
    char path[300];
    snprintf(path, sizeof path, "%s%s", prefix, suffix);
    zd_named_tensors_t *nt = zd_checkpoint_read(path);
    zd_tensor_t *meta = nt ? zd_named_tensors_find(nt, "ps.meta") : NULL;
    int64_t v = meta && zd_tensor_numel(meta) == 4 ? zd_tensor_data_i64(meta)[3] : -1;
    zd_named_tensors_free(nt);
    return v;
}

/*  A new run in a new folder: both shards write versions 0, 2 and 4. The
    folder, into dir. */
static void gen_fresh_run(char *dir, gen_setup_t *gs)
{
    strcpy(dir, "/tmp/zd_ps_gen_XXXXXX");
    assert_non_null(mkdtemp(dir));
    *gs = (gen_setup_t){.rounds = 5, .resumed = {0, 0}, .agreed = 0};
    snprintf(gs->prefix, sizeof gs->prefix, "%s/ps", dir);
    gen_run(gs);
}

static void gen_remove(const char *dir)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_sync_shards_one_generation(void **state)
{
    (void)state;
    char dir[32], path[300];
    gen_setup_t gs;
    /* Shard 1's newest generation damaged: it resumes at 2, shard 0 at
       4; shard 0 goes back to its generation 2, positions and all, and
       the run trains on from there exactly. */
    gen_fresh_run(dir, &gs);
    snprintf(path, sizeof path, "%s.shard1", gs.prefix);
    damage(path);
    gs.rounds = 4;
    gs.resumed[0] = 4, gs.resumed[1] = 2, gs.agreed = 2;
    gen_run(&gs);
    /* On disk, both hold the generations 4 (written again) and 2: shard
       0's given-up 4 is gone, shard 1's damaged file was put aside. */
    for (int k = 0; k < 2; k++) {
        char shard[300];
        snprintf(shard, sizeof shard, "%s.shard%d", gs.prefix, k);
        assert_int_equal(file_version(shard, ""), 4);
        assert_int_equal(file_version(shard, ".prev"), 2);
    }
    snprintf(path, sizeof path, "%s.shard1.damaged", gs.prefix);
    assert_int_equal(access(path, F_OK), 0);
    gen_remove(dir);
    /* The same with shard 0 left without its generation 2: they cannot
       agree, and the error names the versions shard 0 has. */
    gen_fresh_run(dir, &gs);
    snprintf(path, sizeof path, "%s.shard1", gs.prefix);
    damage(path);
    snprintf(path, sizeof path, "%s.shard0.prev", gs.prefix);
    assert_int_equal(unlink(path), 0);
    gs.resumed[0] = 4, gs.resumed[1] = 2, gs.agreed = -1;
    gen_run(&gs);
    gen_remove(dir);
}

/*  "test_die"(): this shard process dies. */
static zd_value_t *fn_die(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    raise(SIGKILL);
    return NULL;
}

static int gen_shard_mortal(const world_t *w)
{
    WTRY(zd_rpc_register("test_die", fn_die, NULL));
    return gen_shard(w);
}

/*  The rank's shard serves from `lives` child processes in turn, life(w,
    k) in the k-th: each but the last is killed, and the next, made with
    resume, joins the running world once the trainer says so (told). The
    rank's own process never starts RPC, so forking it is safe. */
static int serve_lives(const world_t *w, int lives, int (*life)(const world_t *, int))
{
    const gen_setup_t *gs = w->arg;
    for (int k = 0; k < lives; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
            return world_fail(w, "fork: %s", strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            exit(life(w, k) == 0 ? 0 : 1); /* exit: LeakSanitizer's check */
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (k == lives - 1)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0
                ? 0
                : world_fail(w, "the shard's last life ended with status %d", status);
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
            return world_fail(w, "the shard's life %d ended with status %d", k, status);
        struct pollfd p = {.fd = gs->told[0], .events = POLLIN};
        char c;
        if (poll(&p, 1, (int)world_scaled_ms(30000)) != 1 || read(gs->told[0], &c, 1) != 1)
            return world_fail(w, "the trainer did not say when to restart the shard");
    }
    return 0;
}

/*  Shard 1 (rank 2), life k: resumed at 0, 4, then 6. */
static int gen_shard_life(const world_t *w, int k)
{
    gen_setup_t gs = *(const gen_setup_t *)w->arg;
    world_t again = *w;
    again.arg = &gs;
    gs.resumed[1] = k == 0 ? 0 : k == 1 ? 4 : 6;
    return gen_shard_mortal(&again);
}

static int restarted_gen_shard(const world_t *w)
{
    return serve_lives(w, 3, gen_shard_life);
}

static atomic_int g_rejoined; /* the trainer saw shard 1 rejoin this often */

static void count_rejoin(void *arg, int peer, const char *name)
{
    (void)arg, (void)name;
    if (peer == 2)
        atomic_fetch_add(&g_rejoined, 1);
}

/*  Kills shard 1 and has its parent start it again. 0, or world_fail's. */
static int kill_and_restart_shard_1(const world_t *w, const gen_setup_t *gs)
{
    zd_value_t *v = NULL;
    int rc = zd_rpc_sync(2, "test_die", NULL, ZD_TIMEOUT_DEFAULT, &v) == 0 ? -1 : 0;
    zd_value_unref(v);
    if (rc < 0)
        return world_fail(w, "shard 1 answered test_die");
    if (write(gs->told[1], "r", 1) != 1)
        return world_fail(w, "cannot tell shard 1's parent: %s", strerror(errno));
    return 0;
}

/*  A pull once a shard just started again takes calls (it fails with
    ZD_ERR_PEER while the shard's connections are being made), up to 30
    s. 0, or world_fail's naming `what`. */
static int pull_when_back(const world_t *w, zd_ps_client_t *ps, const char *what)
{
    for (int64_t until = world_now_ms() + world_scaled_ms(30000);;) {
        if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) == 0)
            return 0;
        if (zd_error_code() != ZD_ERR_PEER || world_now_ms() > until)
            return world_fail(w, "pull after %s: %s", what, zd_error_last());
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
}

/*  Shard 1 killed and started again while the trainer calls nothing
    (count_rejoin registered): waits until the trainer saw it rejoin,
    then pulls (pull_when_back). 0, or world_fail's. */
static int restart_shard_1_unseen(const world_t *w, const gen_setup_t *gs, zd_ps_client_t *ps)
{
    int joins = atomic_load(&g_rejoined);
    int rc = kill_and_restart_shard_1(w, gs);
    for (int64_t until = world_now_ms() + world_scaled_ms(30000);
         rc == 0 && atomic_load(&g_rejoined) == joins;)
        if (world_now_ms() > until)
            rc = world_fail(w, "shard 1 did not rejoin");
        else
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    return rc == 0 ? pull_when_back(w, ps, "the unseen restart") : rc;
}

/*  Five rounds (both shards write versions 2 and 4), shard 1 killed; the
    sixth round reaches shard 0 only (version 6, written), and fails with
    ZD_ERR_PEER. Shard 1 started again resumes at 4; the trainer's wait
    for it sends shard 0 back to 4 (its generation before the newest);
    the resumed position is 4's, and two more rounds are exact (both
    write version 6). One more round (7), and shard 1 killed and started
    again while the trainer calls nothing: its next pull sends shard 0
    back to 6, the version shard 1 resumed at. */
static int restart_gen_trainer(const world_t *w)
{
    const gen_setup_t *gs = w->arg;
    zd_ps_options_t o = gen_options(gs);
    int ranks[2] = {1, 2};
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, 2, &o);
    WCHECK(ps);
    /* after the client's own: run after it */
    WTRY(zd_rpc_register_peer_joined(count_rejoin, NULL));
    WTRY(world_join(w));
    int rc = 0;
    const char *bad;
    for (int round = 0; rc == 0 && round < 6; round++) {
        if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 || set_grads(m, 0, round) < 0 ||
            zd_ps_client_set_position(ps, 100 + round + 1) < 0)
            rc = world_fail(w, "round %d: %s", round, zd_error_last());
        else if (round == 5) {
            zd_value_t *v = NULL;
            if (zd_rpc_sync(2, "test_die", NULL, ZD_TIMEOUT_DEFAULT, &v) == 0)
                rc = world_fail(w, "shard 1 answered test_die");
            zd_value_unref(v);
            if (rc == 0 &&
                (zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) == 0 || zd_error_code() != ZD_ERR_PEER))
                rc = world_fail(w, "a push with shard 1 killed: %s", zd_error_last());
        } else if (zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "push of round %d: %s", round, zd_error_last());
    }
    /* the push to shard 0 may still be on its way (the call to the dead
       shard failed at once): shard 0 at 6 first, as the case means */
    for (int64_t v = 0, until = world_now_ms() + world_scaled_ms(30000); rc == 0 && v != 6;) {
        zd_value_t *r = NULL;
        if (zd_rpc_sync(1, "__zd_ps_where_0", NULL, ZD_TIMEOUT_DEFAULT, &r) < 0 ||
            zd_rpc_arg_int(r, 1, &v) < 0 || (v != 6 && world_now_ms() > until))
            rc = world_fail(w, "shard 0 not at version 6: %s", zd_error_last());
        zd_value_unref(r);
        if (rc == 0 && v != 6)
            nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    if (rc == 0 && write(gs->told[1], "r", 1) != 1)
        rc = world_fail(w, "cannot tell shard 1's parent: %s", strerror(errno));
    if (rc == 0 && zd_ps_client_wait_shards(ps, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shard 1 not back: %s", zd_error_last());
    int64_t position = -1;
    if (rc == 0 &&
        (zd_ps_client_resume_position(ps, ZD_TIMEOUT_DEFAULT, &position) < 0 || position != 104))
        rc = world_fail(w, "resume position %lld, not 104: %s", (long long)position,
                        zd_error_last());
    async_steps(want, 4);
    if (rc == 0 && zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "pull after the restart: %s", zd_error_last());
    else if (rc == 0 && (zd_ps_client_version(ps, 0) != 4 || zd_ps_client_version(ps, 1) != 4))
        rc = world_fail(w, "versions %lld and %lld after the restart, not 4 and 4",
                        (long long)zd_ps_client_version(ps, 0),
                        (long long)zd_ps_client_version(ps, 1));
    else if (rc == 0 && (bad = differs(m, want)))
        rc = world_fail(w, "%s is not generation 4's", bad);
    for (int round = 4; rc == 0 && round < 6; round++) {
        sgd_mean(want, 1, round);
        if (set_grads(m, 0, round) < 0 || zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0 ||
            zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "round %d after the restart: %s", round, zd_error_last());
    }
    if (rc == 0 && (bad = differs(m, want)))
        rc = world_fail(w, "after the restart's rounds: %s differs", bad);
    /* round 6: both at 7; then the restart the trainer does not see */
    if (rc == 0 && (set_grads(m, 0, 6) < 0 || zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0))
        rc = world_fail(w, "round 6: %s", zd_error_last());
    if (rc == 0)
        rc = restart_shard_1_unseen(w, gs, ps);
    if (rc == 0 && (zd_ps_client_version(ps, 0) != 6 || zd_ps_client_version(ps, 1) != 6))
        rc = world_fail(w, "versions %lld and %lld after the unseen restart, not 6 and 6",
                        (long long)zd_ps_client_version(ps, 0),
                        (long long)zd_ps_client_version(ps, 1));
    else if (rc == 0 && (bad = differs(m, want)))
        rc = world_fail(w, "%s is not generation 6's", bad);
    else if (rc == 0 && zd_ps_client_rollbacks(ps) != 2)
        rc = world_fail(w, "%lld rollbacks seen, not 2", (long long)zd_ps_client_rollbacks(ps));
    return trainer_leave(w, rc, ps, m, want);
}

static int restart_gen_world(const world_t *w)
{
    if (w->rank == 0)
        return restart_gen_trainer(w);
    return w->rank == 1 ? gen_shard(w) : restarted_gen_shard(w);
}

static void test_sync_shard_restarted(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_gen_XXXXXX";
    assert_non_null(mkdtemp(dir));
    gen_setup_t gs = {.rounds = 0, .resumed = {0, 0}, .agreed = 4};
    snprintf(gs.prefix, sizeof gs.prefix, "%s/ps", dir);
    assert_int_equal(pipe2(gs.told, O_CLOEXEC), 0);
    world_options_t o = {
        .world_size = 3, .fn = restart_gen_world, .arg = &gs, .own_init = true, .timeout_s = 90};
    int rc = world_run(&o);
    close(gs.told[0]);
    close(gs.told[1]);
    gen_remove(dir);
    assert_int_equal(rc, 0);
}

/*  ---- a run first started without resume, a shard restarted before
    the first checkpoint ---- */

/*  Shard 1 (rank 2): a new run's shard, then one made with resume. */
static int new_run_shard_life(const world_t *w, int k)
{
    gen_setup_t gs = *(const gen_setup_t *)w->arg;
    world_t again = *w;
    again.arg = &gs;
    gs.new_run = k == 0;
    return gen_shard_mortal(&again);
}

/*  One round (both shards at version 1; their first checkpoint is at 2),
    then shard 1 killed and started with resume, the trainer calling
    nothing meanwhile: shard 1 resumes the version 0 it wrote when the
    run began, and the trainer's next pull sends shard 0 back to its own
    version 0. Without that file (a new run wrote none before) shard 0
    would hold no generation to go back to, and the run could not go
    on. */
static int new_run_trainer(const world_t *w)
{
    const gen_setup_t *gs = w->arg;
    zd_ps_options_t o = gen_options(gs);
    int ranks[2] = {1, 2};
    zd_nn_module_t *m = make_model(), *want = make_model();
    WCHECK(m && want);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, ranks, 2, &o);
    WCHECK(ps);
    WTRY(zd_rpc_register_peer_joined(count_rejoin, NULL));
    WTRY(world_join(w));
    int rc = 0;
    const char *bad;
    if (zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0 || set_grads(m, 0, 0) < 0 ||
        zd_ps_client_set_position(ps, 101) < 0 || zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "round 0: %s", zd_error_last());
    if (rc == 0)
        rc = restart_shard_1_unseen(w, gs, ps);
    if (rc == 0 && (zd_ps_client_version(ps, 0) != 0 || zd_ps_client_version(ps, 1) != 0))
        rc = world_fail(w, "versions %lld and %lld after the restart, not 0 and 0",
                        (long long)zd_ps_client_version(ps, 0),
                        (long long)zd_ps_client_version(ps, 1));
    else if (rc == 0 && (bad = differs(m, want)))
        rc = world_fail(w, "%s is not the initial one", bad);
    else if (rc == 0 && zd_ps_client_rollbacks(ps) != 1)
        rc = world_fail(w, "%lld rollbacks seen, not 1", (long long)zd_ps_client_rollbacks(ps));
    /* the round again, exactly */
    sgd_mean(want, 1, 0);
    if (rc == 0 &&
        (set_grads(m, 0, 0) < 0 || zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT) < 0 ||
         zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0))
        rc = world_fail(w, "round 0 again: %s", zd_error_last());
    else if (rc == 0 && (bad = differs(m, want)))
        rc = world_fail(w, "after round 0 again: %s differs", bad);
    return trainer_leave(w, rc, ps, m, want);
}

static int new_run_world(const world_t *w)
{
    if (w->rank == 0)
        return new_run_trainer(w);
    return w->rank == 1 ? gen_shard(w) : serve_lives(w, 2, new_run_shard_life);
}

static void test_sync_new_run_restarted_before_checkpoint(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_gen_XXXXXX";
    assert_non_null(mkdtemp(dir));
    gen_setup_t gs = {.new_run = true};
    snprintf(gs.prefix, sizeof gs.prefix, "%s/ps", dir);
    assert_int_equal(pipe2(gs.told, O_CLOEXEC), 0);
    world_options_t o = {
        .world_size = 3, .fn = new_run_world, .arg = &gs, .own_init = true, .timeout_s = 90};
    int rc = world_run(&o);
    close(gs.told[0]);
    close(gs.told[1]);
    gen_remove(dir);
    assert_int_equal(rc, 0);
}

/*  ---- a synchronous shard started again after a trainer was lost ---- */

static zd_ps_options_t known_options(const gen_setup_t *gs)
{
    zd_ps_options_t o = gen_options(gs);
    o.num_trainers = 2;
    return o;
}

/*  Rank 2: the one shard, in a child process (a second one, made with
    resume, once the trainer says so). */
static int known_shard(const world_t *w)
{
    const gen_setup_t *gs = w->arg;
    zd_ps_options_t o = known_options(gs);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    zd_nn_module_t *m = make_model();
    WCHECK(m);
    zd_ps_server_t *srv = zd_ps_server_new_module(m, 0, 1, &sgd, &o);
    zd_nn_module_free(m);
    WCHECK(srv);
    WTRY(zd_rpc_register("test_die", fn_die, NULL));
    WTRY(world_join(w));
    int rc = 0;
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    zd_ps_server_free(srv);
    return rc;
}

static int known_shard_life(const world_t *w, int k)
{
    (void)k;
    return known_shard(w);
}

static int restarted_known_shard(const world_t *w)
{
    return serve_lives(w, 2, known_shard_life);
}

/*  Rounds of this trainer: pull, gradients, push. */
static int known_rounds(const world_t *w, zd_ps_client_t *ps, zd_nn_module_t *m, int from, int to,
                        int64_t timeout_ms)
{
    for (int round = from; round < to; round++)
        if (zd_ps_client_pull(ps, timeout_ms) < 0 || set_grads(m, w->rank, round) < 0 ||
            zd_ps_client_push(ps, timeout_ms) < 0)
            return world_fail(w, "round %d: %s", round, zd_error_last());
    return 0;
}

/*  Trainer 1 dies after four rounds; trainer 0's fifth waits for it until
    it is lost, the sixth writes version 6 (which knows both trainers).
    The shard killed and started again resumes at 6 and counts trainer 1
    lost, though it never heard of the loss: the rounds go on with
    trainer 0 alone instead of waiting for a push that cannot come. */
static int known_trainer(const world_t *w)
{
    const gen_setup_t *gs = w->arg;
    zd_ps_options_t o = known_options(gs);
    int shard_rank = 2;
    zd_nn_module_t *m = make_model();
    WCHECK(m);
    zd_ps_client_t *ps = zd_ps_client_new_module(m, &shard_rank, 1, &o);
    WCHECK(ps);
    WTRY(world_join(w));
    int rc = known_rounds(w, ps, m, 0, 4, ZD_TIMEOUT_DEFAULT);
    if (w->rank == 1) {
        fflush(NULL);
        raise(SIGKILL);
    }
    if (rc == 0)
        rc = known_rounds(w, ps, m, 4, 6, ZD_TIMEOUT_DEFAULT);
    zd_value_t *v = NULL;
    if (rc == 0 && zd_rpc_sync(2, "test_die", NULL, ZD_TIMEOUT_DEFAULT, &v) == 0)
        rc = world_fail(w, "the shard answered test_die");
    zd_value_unref(v);
    if (rc == 0 && write(gs->told[1], "r", 1) != 1)
        rc = world_fail(w, "cannot tell the shard's parent: %s", strerror(errno));
    if (rc == 0 && zd_ps_client_wait_shards(ps, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "the shard not back: %s", zd_error_last());
    if (rc == 0)
        rc = pull_when_back(w, ps, "the restart");
    if (rc == 0 && zd_ps_client_version(ps, 0) != 6)
        rc = world_fail(w, "the shard resumed at %lld, not 6",
                        (long long)zd_ps_client_version(ps, 0));
    if (rc == 0)
        rc = known_rounds(w, ps, m, 6, 8, world_scaled_ms(10000));
    if (rc == 0 && zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "the last pull: %s", zd_error_last());
    else if (rc == 0 && zd_ps_client_version(ps, 0) != 8)
        rc = world_fail(w, "version %lld after two rounds alone, not 8",
                        (long long)zd_ps_client_version(ps, 0));
    zd_rpc_shutdown(true, world_scaled_ms(30000)); /* may report trainer 1 */
    zd_ps_client_free(ps);
    zd_nn_module_free(m);
    return rc;
}

static int known_world(const world_t *w)
{
    return w->rank == 2 ? restarted_known_shard(w) : known_trainer(w);
}

static void test_sync_shard_restarted_knows_lost_trainers(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_gen_XXXXXX";
    assert_non_null(mkdtemp(dir));
    gen_setup_t gs = {.rounds = 0};
    snprintf(gs.prefix, sizeof gs.prefix, "%s/ps", dir);
    assert_int_equal(pipe2(gs.told, O_CLOEXEC), 0);
    world_options_t o = {.world_size = 3,
                         .fn = known_world,
                         .arg = &gs,
                         .own_init = true,
                         .timeout_s = 90,
                         .expect_exit = {0, 128 + SIGKILL, 0}};
    int rc = world_run(&o);
    close(gs.told[0]);
    close(gs.told[1]);
    gen_remove(dir);
    assert_int_equal(rc, 0);
}

/*  ---- the split ---- */

static void test_split(void **state)
{
    (void)state;
    zd_nn_module_t *m = make_model();
    assert_non_null(m);
    zd_named_tensors_t *sd = zd_nn_module_state_dict(m);
    assert_non_null(sd);
    int shard_of[4];
    /* sizes 12, 3, 6, 2: the largest alone, the three others together */
    assert_int_equal(zd_ps_split(sd, 2, shard_of, 4), 0);
    assert_int_equal(shard_of[0], 0);
    assert_int_equal(shard_of[1], 1);
    assert_int_equal(shard_of[2], 1);
    assert_int_equal(shard_of[3], 1);
    assert_int_equal(zd_ps_split(sd, 2, shard_of, 3), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    /* Five shards for four tensors would leave one empty. */
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    assert_null(zd_ps_server_new(sd, 0, 5, &sgd, NULL));
    assert_non_null(strstr(zd_error_last(), "shard 4 of 5 empty"));
    /* A tied tensor, under two names, is refused. */
    zd_named_tensors_t *tied = zd_named_tensors_new();
    assert_int_equal(zd_named_tensors_add(tied, "x", zd_named_tensors_tensor(sd, 0)), 0);
    assert_int_equal(zd_named_tensors_add(tied, "y", zd_named_tensors_tensor(sd, 0)), 0);
    assert_null(zd_ps_server_new(tied, 0, 1, &sgd, NULL));
    assert_non_null(strstr(zd_error_last(), "the same tensor (tied)"));
    zd_ps_options_t bad = {0};
    assert_null(zd_ps_server_new(sd, 0, 1, &sgd, &bad));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    /* min_trainers past num_trainers could never complete a round. */
    bad = zd_ps_options_default();
    bad.mode = ZD_PS_SYNC;
    bad.num_trainers = 2;
    bad.min_trainers = 3;
    assert_null(zd_ps_server_new(sd, 0, 1, &sgd, &bad));
    assert_non_null(strstr(zd_error_last(), "min_trainers must be in [1, num_trainers = 2]"));
    /* So is a config that no zd_optim_*_defaults() made. */
    zd_optim_config_t unsized = {.kind = ZD_OPTIM_SGD, .lr = LR};
    assert_null(zd_ps_server_new(sd, 0, 1, &unsized, NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_optim_config_t.size is 0"));
    zd_named_tensors_free(tied);
    zd_named_tensors_free(sd);
    zd_nn_module_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_sync_one_shard),
        cmocka_unit_test(test_sync_two_shards),
        cmocka_unit_test(test_push_pull),
        cmocka_unit_test(test_async_stale_and_refused),
        cmocka_unit_test(test_diverging_step_refused),
        cmocka_unit_test(test_diverging_round_completed_by_loss),
        cmocka_unit_test(test_checkpoint_folder_prepared),
        cmocka_unit_test(test_run_tag),
        cmocka_unit_test(test_shard_lost),
        cmocka_unit_test(test_sync_trainer_lost),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_sync_shards_one_generation),
        cmocka_unit_test(test_sync_shard_restarted),
        cmocka_unit_test(test_sync_new_run_restarted_before_checkpoint),
        cmocka_unit_test(test_sync_shard_restarted_knows_lost_trainers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
