/* SPDX-License-Identifier: MIT */
/*  The remote model (ps.h: zd_ps_model_*) in worlds of real processes: a
    model of two stages (tests/support/ps_two_stages.h), a hidden layer on
    shard 0 and a head on shard 1, trained by trainers through RPC under
    distributed autograd.
    - one trainer: every step's loss and the stages' parameters after five
      steps are what the same model gives trained locally with autograd
      and SGD; a forward in evaluation mode runs the stages in evaluation
      mode, and training mode comes back after it;
    - inputs a shard must refuse (a NaN, named with its element; a dtype
      it does not take; more elements than max_input_numel; more outputs
      than a stage may give) are refused with ZD_ERR_ARGUMENT before the
      stage runs; a stopped shard answers ZD_ERR_STOPPED, naming its stage;
    - two trainers at once, mixing training and evaluation forwards: both
      lower their loss, and every forward of theirs ran, each seen by the
      shards' on_forward with its caller, its mode and its samples;
    - a shard killed: the next forward fails with ZD_ERR_PEER naming the
      stage;
    - checkpoints every 2 steps: a second run with resume starts each
      stage at the last generation of the first (version 4, the parameters
      of 4 local steps), and a damaged newest generation is passed over
      for the one before (version 2);
    - a shard killed and started again with resume into the running
      world: the trainer's step fails with ZD_ERR_PEER, it waits for the
      shard (zd_ps_model_wait_shards), and its next steps step the new
      process's stage, resumed from its checkpoint; killed and started
      again while the trainer calls nothing, the trainer's next step
      steps the new process too;
    - checkpoints the trainer asks for are numbered generations: a call
      that failed on a stage, called again, completes that generation
      (the stages that wrote it keep the older one the others hold); a
      stage of a generation at another version than the others' (another
      trainer's step between the writes) resumes with them, neither
      going back, and a stage refuses an older generation than its own;
    - the library's fault points (ZDIST_FAULT): the trainer killed at its
      third training forward (not counting an evaluation one), backward
      or step leaves the stages at version 2 with the forwards that
      moment gives; a stage killed at a forward or at a checkpoint write
      (not the new run's version 0) fails the trainer's call with
      ZD_ERR_PEER naming it. */
#define _GNU_SOURCE /* pipe2 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zdist/checkpoint.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>

#include "tests/support/ps_two_stages.h"
#include "tests/support/world.h"

#define N_STEPS 5

typedef struct {
    int n_trainers;
    int64_t max_input_numel; /* 0: the default */
    bool kill_shard;         /* trainer 0 has shard 1 killed at the end */
    const char *checkpoint;  /* the shards' checkpoint_path (every 2 steps), or NULL */
    bool resume;
    int max_inflight;  /* the shards' (0: no limit) */
    int told[2];       /* test_shard_restarted: the trainer tells shard 1's parent to restart it */
    int lives;         /* shard 1's processes there (0: SHARD_LIVES) */
    int every1;        /* shard 1's checkpoint_every (0: 2, as shard 0's) */
    bool by_hand;      /* checkpoint_every 0: only those the trainer asks for */
    const char *fault; /* test_fault_points: ZDIST_FAULT, set in rank fault_rank's process */
    int fault_rank;
    int64_t forwards_at_loss;  /* test_fault_points: what a shard served before the trainer died */
    world_fn *first, *resumed; /* run_by_hand_twice: the trainer's two runs */
} setup_t;

/*  ---- the shards ---- */

static zd_value_t *fn_stop(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_ps_model_server_stop(ps2_server()) < 0 ? NULL : zd_value_none();
}

static zd_value_t *fn_forwards(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(zd_ps_model_server_forwards(ps2_server()));
}

/*  "test_inflight"() -> [slots held, forwards waiting for one]. */
static zd_value_t *fn_inflight(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    int waiting, held = zd_ps_model_server_inflight(ps2_server(), &waiting);
    return ZD_ARGS((int64_t)held, (int64_t)waiting);
}

/*  What on_forward saw (zd_ps_options_t): forwards by trainer (ranks 2
    and 3) and mode (1: training), and the samples of them all. */
static atomic_int g_seen[2][2], g_seen_samples;

static void on_forward(void *arg, int shard, int caller, bool training, zd_tensor_t *const *in,
                       int n_in)
{
    (void)arg, (void)shard;
    if (caller >= 2 && caller < 4)
        atomic_fetch_add(&g_seen[caller - 2][training], 1);
    if (n_in > 0)
        atomic_fetch_add(&g_seen_samples, (int)zd_tensor_shape(in[0])[0]);
}

/*  "test_on_forward"() -> [rank 2's training forwards, its evaluation
    ones, rank 3's training ones, its evaluation ones, the samples]. */
static zd_value_t *fn_on_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return ZD_ARGS(atomic_load(&g_seen[0][1]), atomic_load(&g_seen[0][0]),
                   atomic_load(&g_seen[1][1]), atomic_load(&g_seen[1][0]),
                   atomic_load(&g_seen_samples));
}

/*  test_fault_points: a shard waits for the trainer's loss, then holds
    what it served and stepped against what the fault's moment leaves. */
static int after_trainer_lost(const world_t *w)
{
    const setup_t *su = w->arg;
    if (su->fault_rank != 2)
        return 0;
    int64_t until = world_now_ms() + world_scaled_ms(30000);
    while (!zd_rpc_peer_is_lost(2) && world_now_ms() < until)
        poll(NULL, 0, 10);
    int64_t version = zd_ps_model_server_version(ps2_server());
    int64_t forwards = zd_ps_model_server_forwards(ps2_server());
    if (!zd_rpc_peer_is_lost(2) || version != 2 || forwards != su->forwards_at_loss)
        return world_fail(w,
                          "%s: the trainer %slost; version %lld (2 wanted), %lld forwards "
                          "(%lld wanted)",
                          su->fault, zd_rpc_peer_is_lost(2) ? "" : "not ", (long long)version,
                          (long long)forwards, (long long)su->forwards_at_loss);
    return 0;
}

static int run_shard(const world_t *w)
{
    const setup_t *su = w->arg;
    ps2_shard_t o = {.options = zd_ps_options_default(),
                     .serving = su->fault ? after_trainer_lost : NULL,
                     .shutdown_may_fail = su->kill_shard};
    if (su->max_input_numel)
        o.options.max_input_numel = su->max_input_numel;
    o.options.checkpoint_path = su->checkpoint;
    o.options.checkpoint_every =
        su->checkpoint && !su->by_hand ? (w->rank == 1 && su->every1 ? su->every1 : 2) : 0;
    o.options.resume = su->resume;
    o.options.max_inflight = su->max_inflight;
    o.options.on_forward = on_forward;
    WTRY(zd_rpc_register("test_stop", fn_stop, NULL));
    WTRY(zd_rpc_register("test_forwards", fn_forwards, NULL));
    WTRY(zd_rpc_register("test_inflight", fn_inflight, NULL));
    WTRY(zd_rpc_register("test_on_forward", fn_on_forward, NULL));
    return ps2_run_shard(w, &o);
}

/*  ---- the trainers ---- */

static const int shard_ranks[2] = {0, 1};

/*  One training step through the shards: 0 with the loss's value in
    *loss (if not NULL), or -1 with the error as the calls left it. */
static int try_step(zd_ps_model_t *model, int trainer, int step, float *loss)
{
    zd_tensor_t *x, *y, *out = NULL, *l = NULL;
    ps2_make_batch(trainer, step, &x, &y);
    int rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        if (zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) == 0 &&
            zd_nn_mse_loss(out, y, &l) == 0 && zd_ps_model_backward(model, ctx, l) == 0 &&
            zd_ps_model_step(model, ctx) == 0)
            rc = 0;
    }
    if (rc == 0 && loss)
        *loss = zd_tensor_data(l)[0];
    zd_tensor_unref(l);
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

/*  try_step, a failure the world's. */
static int remote_step(const world_t *w, zd_ps_model_t *model, int trainer, int step, float *loss)
{
    if (try_step(model, trainer, step, loss) < 0)
        return world_fail(w, "step %d: %s", step, zd_error_last());
    return 0;
}

/*  A training step at position `step` (zd_ps_model_set_position
    first), a failure the world's. */
static int step_at(const world_t *w, zd_ps_model_t *model, int step)
{
    if (zd_ps_model_set_position(model, step) < 0)
        return world_fail(w, "set_position: %s", zd_error_last());
    return remote_step(w, model, 0, step, NULL);
}

/*  A forward asking for the head's mode as a second output: 1 or 0, or
    -1 when it failed. */
static int stage_mode(const world_t *w, zd_ps_model_t *model)
{
    zd_tensor_t *x, *y, *out[2];
    ps2_make_batch(0, 0, &x, &y);
    int mode = -1;
    if (zd_ps_model_forward(model, &x, 1, out, 2, ZD_TIMEOUT_DEFAULT) < 0) {
        world_fail(w, "forward for the mode: %s", zd_error_last());
    } else {
        mode = (int)zd_tensor_data(out[1])[0];
        zd_tensor_unref(out[0]);
        zd_tensor_unref(out[1]);
    }
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return mode;
}

static int exact_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    for (int step = 0; rc == 0 && step < N_STEPS; step++) {
        float remote, want;
        if (remote_step(w, model, 0, step, &remote) < 0 || ps2_local_step(&lm, step, &want) < 0)
            rc = world_fail(w, "step %d: %s", step, zd_error_last());
        else if (fabsf(remote - want) > 1e-6f * (1 + want))
            rc = world_fail(w, "step %d: loss %.9g, trained locally %.9g", step, remote, want);
    }
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    /* Evaluation mode reaches the stages, and training mode comes back. */
    if (rc == 0 && stage_mode(w, model) != 1)
        rc = world_fail(w, "the stages did not train in training mode");
    bool was = zd_ps_model_train(model, false);
    if (rc == 0 && (!was || stage_mode(w, model) != 0))
        rc = world_fail(w, "evaluation mode did not reach the stages");
    zd_ps_model_train(model, true);
    if (rc == 0 && stage_mode(w, model) != 1)
        rc = world_fail(w, "training mode did not come back");
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

static int exact_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w) : exact_trainer(w);
}

static void test_exact(void **state)
{
    (void)state;
    setup_t su = {.n_trainers = 1};
    world_options_t o = {
        .world_size = 3, .fn = exact_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- refused inputs, a stopped shard ---- */

/*  The forward of in must fail with code, its error holding text. */
static int expect_refused(const world_t *w, zd_ps_model_t *model, zd_tensor_t *in,
                          zd_error_code_t code, const char *text)
{
    zd_tensor_t *out = NULL;
    if (zd_ps_model_forward(model, &in, 1, &out, 1, ZD_TIMEOUT_DEFAULT) == 0) {
        zd_tensor_unref(out);
        return world_fail(w, "a forward that should fail with \"%s\" ran", text);
    }
    if (zd_error_code() != code || !strstr(zd_error_last(), text))
        return world_fail(w, "expected %s \"%s\", got %s: %s", zd_error_code_name(code), text,
                          zd_error_code_name(zd_error_code()), zd_error_last());
    return 0;
}

/*  A raw forward to stage 1 with args (taken) must be refused with
    ZD_ERR_ARGUMENT, its text holding text. */
static int raw_refused(const world_t *w, zd_value_t *args, const char *text)
{
    zd_value_t *v = NULL;
    if (zd_rpc_sync_take(1, "__zd_psm_forward_1", args, ZD_TIMEOUT_DEFAULT, &v) < 0)
        return world_fail(w, "the raw forward: %s", zd_error_last());
    const char *got = "";
    int64_t code = -1;
    int rc = 0;
    if (zd_rpc_arg_int(v, 0, &code) < 0 || zd_rpc_arg_string(v, 1, &got) < 0 ||
        code != ZD_ERR_ARGUMENT || !strstr(got, text))
        rc = world_fail(w, "expected \"%s\": code %lld, \"%s\"", text, (long long)code, got);
    zd_value_unref(v);
    return rc;
}

static int refusing_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    zd_tensor_t *x, *y;
    ps2_make_batch(0, 0, &x, &y);
    WCHECK(x && y);
    zd_tensor_data(x)[3] = NAN;
    int rc = expect_refused(w, model, x, ZD_ERR_ARGUMENT,
                            "stage 0 refused the forward: input 0 "
                            "element 3 is nan, not finite");
    zd_tensor_t *bytes = zd_tensor_new(ZD_UINT8, (int64_t[]){PS2_BATCH, PS2_IN}, 2);
    zd_tensor_t *big = zd_tensor_new(ZD_FLOAT32, (int64_t[]){200, PS2_IN}, 2);
    WCHECK(bytes && big);
    if (rc == 0)
        rc = expect_refused(w, model, bytes, ZD_ERR_ARGUMENT, "input 0 is uint8");
    if (rc == 0) /* the shards' max_input_numel is 500 */
        rc = expect_refused(w, model, big, ZD_ERR_ARGUMENT, "max_input_numel = 500");
    /* More outputs than a stage may give, and a negative position, asked
       of it directly: [training, n_out, position, inputs...]. */
    zd_value_t *v = NULL;
    if (rc == 0)
        rc = raw_refused(w, ZD_ARGS(1, 1000, -1, y), "1000 outputs (1 to 64)");
    if (rc == 0)
        rc = raw_refused(w, ZD_ARGS(1, 1, -5, y), "refused the forward: position -5");
    /* Nothing refused reached a stage. */
    if (rc == 0 && zd_rpc_sync(0, "test_forwards", NULL, ZD_TIMEOUT_DEFAULT, &v) == 0) {
        int64_t n = -1;
        if (zd_value_get_int(v, &n) < 0 || n != 0)
            rc = world_fail(w, "stage 0 ran %lld forwards", (long long)n);
        zd_value_unref(v);
    }
    /* A good forward still runs; then shard 1 stops. */
    zd_tensor_data(x)[3] = 0.25f;
    zd_tensor_t *out = NULL;
    if (rc == 0 && zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "a good forward: %s", zd_error_last());
    zd_tensor_unref(out);
    if (rc == 0 && zd_rpc_sync(1, "test_stop", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
        rc = world_fail(w, "stop: %s", zd_error_last());
    zd_value_unref(v);
    if (rc == 0)
        rc = expect_refused(w, model, x, ZD_ERR_STOPPED, "stage 1 (rank 1): stage 1 stopped");
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    zd_tensor_unref(bytes);
    zd_tensor_unref(big);
    return ps2_leave(w, model, rc);
}

static int refusing_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w) : refusing_trainer(w);
}

static void test_refused_and_stopped(void **state)
{
    (void)state;
    setup_t su = {.n_trainers = 1, .max_input_numel = 500};
    world_options_t o = {
        .world_size = 3, .fn = refusing_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- two trainers, then a shard lost ---- */

#define SHARED_STEPS 30

static atomic_int g_others_done; /* trainer 0: trainers that said they are done */

static zd_value_t *fn_done(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    atomic_fetch_add(&g_others_done, 1);
    return zd_value_none();
}

static int sharing_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    int trainer = w->rank - 2;
    if (trainer == 0)
        WTRY(zd_rpc_register("test_done", fn_done, NULL));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    float first = 0, last = 0;
    for (int step = 0; rc == 0 && step < SHARED_STEPS; step++) {
        /* The same batch every step, so that the loss must fall. */
        rc = remote_step(w, model, trainer, 0, step == 0 ? &first : &last);
        /* An evaluation forward between steps: the other trainer's
           training forwards and this one take turns at the stages. */
        if (rc == 0 && step % 3 == trainer) {
            zd_ps_model_train(model, false);
            if (stage_mode(w, model) != 0)
                rc = world_fail(w, "an evaluation forward ran in training mode");
            zd_ps_model_train(model, true);
        }
    }
    if (rc == 0 && !(last < first))
        rc = world_fail(w, "the loss went from %g to %g", first, last);
    /* stages without a checkpoint_path refuse a checkpoint, naming it */
    if (rc == 0 &&
        (zd_ps_model_checkpoint(model, SHARED_STEPS, ZD_TIMEOUT_DEFAULT) == 0 ||
         zd_error_code() != ZD_ERR_ARGUMENT ||
         !strstr(zd_error_last(),
                 "stage 0 refused the checkpoint: it has no "
                 "checkpoint_path")))
        rc = world_fail(w, "a checkpoint without checkpoint_path: %s", zd_error_last());
    /* Trainer 0 has shard 1 killed once the other trainer is done. */
    zd_value_t *v = NULL;
    if (trainer != 0 && zd_rpc_sync(2, "test_done", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
        rc = world_fail(w, "telling trainer 0: %s", zd_error_last());
    zd_value_unref(v);
    int64_t deadline = world_now_ms() + world_scaled_ms(30000);
    while (rc == 0 && trainer == 0 && su->kill_shard && atomic_load(&g_others_done) < 1) {
        if (world_now_ms() > deadline)
            rc = world_fail(w, "trainer 1 never said it was done");
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    /* Both trainers done: each shard's on_forward saw every forward of
       theirs, by caller and mode, and their samples. */
    for (int s = 0; rc == 0 && su->kill_shard && trainer == 0 && s < 2; s++) {
        int64_t seen[5] = {0};
        const int64_t want[5] = {SHARED_STEPS, SHARED_STEPS / 3, SHARED_STEPS, SHARED_STEPS / 3,
                                 2 * PS2_BATCH * (SHARED_STEPS + SHARED_STEPS / 3)};
        v = NULL;
        if (zd_rpc_sync(s, "test_on_forward", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0 ||
            ZD_UNPACK(v, &seen[0], &seen[1], &seen[2], &seen[3], &seen[4]) < 0)
            rc = world_fail(w, "test_on_forward: %s", zd_error_last());
        for (int k = 0; rc == 0 && k < 5; k++)
            if (seen[k] != want[k])
                rc = world_fail(w,
                                "shard %d's on_forward saw [%lld %lld %lld %lld %lld], not "
                                "[%lld %lld %lld %lld %lld]",
                                s, (long long)seen[0], (long long)seen[1], (long long)seen[2],
                                (long long)seen[3], (long long)seen[4], (long long)want[0],
                                (long long)want[1], (long long)want[2], (long long)want[3],
                                (long long)want[4]);
        zd_value_unref(v);
    }
    if (rc == 0 && su->kill_shard && trainer == 0) {
        v = NULL;
        zd_rpc_sync(1, "test_die", NULL, world_scaled_ms(5000), &v);
        zd_value_unref(v);
        zd_tensor_t *x, *y;
        ps2_make_batch(0, 0, &x, &y);
        rc = expect_refused(w, model, x, ZD_ERR_PEER, "stage 1 (rank 1) lost");
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_ps_model_free(model);
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0 && !su->kill_shard)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    return rc;
}

static int sharing_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w) : sharing_trainer(w);
}

static void test_two_trainers_then_lost(void **state)
{
    (void)state;
    setup_t su = {.n_trainers = 2, .kill_shard = true};
    world_options_t o = {.world_size = 4,
                         .fn = sharing_world,
                         .arg = &su,
                         .own_init = true,
                         .timeout_s = 90,
                         .expect_exit = {[1] = 128 + SIGKILL}};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- max_inflight ---- */

/*  Waits until shard s holds `held` slots with `waiting` forwards in line
    (either -1: any number). 0, or -1 after 30 s. */
static int wait_inflight(const world_t *w, int s, int held, int waiting)
{
    int64_t deadline = world_now_ms() + world_scaled_ms(30000), h = -1, q = -1;
    while (world_now_ms() < deadline) {
        zd_value_t *v = NULL;
        if (zd_rpc_sync(s, "test_inflight", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
            return world_fail(w, "test_inflight: %s", zd_error_last());
        int rc = zd_rpc_arg_int(v, 0, &h) | zd_rpc_arg_int(v, 1, &q);
        zd_value_unref(v);
        if (rc < 0)
            return world_fail(w, "test_inflight: %s", zd_error_last());
        if ((held < 0 || h == held) && (waiting < 0 || q == waiting))
            return 0;
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    return world_fail(w, "stage %d: %lld slots held and %lld waiting, expected %d and %d", s,
                      (long long)h, (long long)q, held, waiting);
}

/*  Trainer 0 holds each stage's one slot with a training forward; trainer
    1's forward waits in line at stage 0 until trainer 0's backward went
    through, while trainer 0's evaluation forward takes no slot. A forward
    whose context is released without a backward gives its slot back. */
static int inflight_trainer(const world_t *w)
{
    int trainer = w->rank - 2, rc = 0;
    zd_optim_config_t sgd = zd_optim_sgd_defaults(PS2_LR);
    zd_ps_model_t *model = zd_ps_model_new(NULL, 2, &sgd, NULL); /* ranks 0 and 1 */
    WCHECK(model);
    WTRY(world_join(w));
    float loss;
    if (trainer == 1) {
        rc = wait_inflight(w, 0, 1, -1);
        if (rc == 0)
            rc = remote_step(w, model, trainer, 0, &loss);
    } else {
        zd_tensor_t *x, *y, *out = NULL, *l = NULL, *eval = NULL;
        ps2_make_batch(0, 0, &x, &y);
        int64_t ctx = -1;
        if (zd_dist_autograd_context_begin(&ctx) < 0 ||
            zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "forward: %s", zd_error_last());
        if (rc == 0)
            rc = wait_inflight(w, 1, 1, 0) | wait_inflight(w, 0, 1, 1);
        zd_ps_model_train(model, false);
        if (rc == 0 && zd_ps_model_forward(model, &x, 1, &eval, 1, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "an evaluation forward: %s", zd_error_last());
        zd_ps_model_train(model, true);
        if (rc == 0 &&
            (zd_nn_mse_loss(out, y, &l) < 0 || zd_dist_autograd_backward(ctx, &l, 1, false) < 0 ||
             zd_ps_model_step(model, ctx) < 0))
            rc = world_fail(w, "backward: %s", zd_error_last());
        /* the backward gave the slot to trainer 1, before the context ends */
        if (rc == 0)
            rc = wait_inflight(w, 0, -1, 0);
        if (ctx != -1 && zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "context end: %s", zd_error_last());
        /* trainer 1 went through and is done: no slot held anywhere */
        if (rc == 0)
            rc = wait_inflight(w, 0, 0, 0) | wait_inflight(w, 1, 0, 0);
        zd_tensor_unref_p(&out);
        if (rc == 0 &&
            (zd_dist_autograd_context_begin(&ctx) < 0 ||
             zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0))
            rc = world_fail(w, "forward: %s", zd_error_last());
        if (rc == 0)
            rc = wait_inflight(w, 0, 1, 0);
        if (rc == 0 && zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "context end: %s", zd_error_last());
        if (rc == 0)
            rc = wait_inflight(w, 0, 0, 0) | wait_inflight(w, 1, 0, 0);
        zd_tensor_t *ts[] = {x, y, out, l, eval};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            zd_tensor_unref(ts[i]);
    }
    return ps2_leave(w, model, rc);
}

static int inflight_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w) : inflight_trainer(w);
}

static void test_max_inflight(void **state)
{
    (void)state;
    setup_t su = {.n_trainers = 2, .max_inflight = 1};
    world_options_t o = {
        .world_size = 4, .fn = inflight_world, .arg = &su, .own_init = true, .timeout_s = 90};
    assert_int_equal(world_run(&o), 0);
}

/*  A stopped stage lets go of the forwards waiting for a slot at once:
    trainer 1's forward, in line behind trainer 0's, is answered
    ZD_ERR_STOPPED, not left to time out. */
static int stop_waiting_trainer(const world_t *w)
{
    int trainer = w->rank - 2, rc = 0;
    zd_optim_config_t sgd = zd_optim_sgd_defaults(PS2_LR);
    zd_ps_model_t *model = zd_ps_model_new(NULL, 2, &sgd, NULL);
    WCHECK(model);
    WTRY(world_join(w));
    zd_tensor_t *x, *y, *out = NULL;
    ps2_make_batch(trainer, 0, &x, &y);
    if (trainer == 1) {
        rc = wait_inflight(w, 0, 1, -1);
        if (rc == 0)
            rc = expect_refused(w, model, x, ZD_ERR_STOPPED, "stage 0 stopped");
    } else {
        int64_t ctx = -1;
        zd_value_t *v = NULL;
        if (zd_dist_autograd_context_begin(&ctx) < 0 ||
            zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "forward: %s", zd_error_last());
        if (rc == 0)
            rc = wait_inflight(w, 0, 1, 1);
        if (rc == 0 && zd_rpc_sync(0, "test_stop", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
            rc = world_fail(w, "test_stop: %s", zd_error_last());
        zd_value_unref(v);
        if (rc == 0)
            rc = wait_inflight(w, 0, 1, 0);
        if (ctx != -1 && zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT) < 0)
            rc = world_fail(w, "context end: %s", zd_error_last());
    }
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return ps2_leave(w, model, rc);
}

static int stop_waiting_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w) : stop_waiting_trainer(w);
}

static void test_stop_lets_waiting_forwards_go(void **state)
{
    (void)state;
    setup_t su = {.n_trainers = 2, .max_inflight = 1};
    world_options_t o = {
        .world_size = 4, .fn = stop_waiting_world, .arg = &su, .own_init = true, .timeout_s = 90};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- checkpoints ---- */

/*  The first run: five steps, each forward carrying the trainer's
    position (the step's number); the shards write a generation at the
    forwards after steps 2 and 4 (versions 2 and 4, positions 2 and 4). */
static int ckpt_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    float loss;
    int64_t none = 7;
    if (zd_ps_model_set_position(model, -1) == 0 || zd_error_code() != ZD_ERR_ARGUMENT ||
        zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, NULL) == 0)
        rc = world_fail(w, "a negative position, or no place for it, was taken");
    /* before any training forward, the stages know none */
    if (rc == 0 &&
        (zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, &none) < 0 || none != -1))
        rc = world_fail(w, "the position before any forward: %lld", (long long)none);
    for (int step = 0; rc == 0 && step < N_STEPS; step++) {
        if (zd_ps_model_set_position(model, step) < 0)
            rc = world_fail(w, "set_position: %s", zd_error_last());
        if (rc == 0)
            rc = remote_step(w, model, 0, step, &loss);
    }
    /* an evaluation forward's position is not kept */
    zd_tensor_t *x = NULL, *y = NULL, *out = NULL;
    ps2_make_batch(0, 0, &x, &y);
    zd_ps_model_train(model, false);
    if (rc == 0 &&
        (zd_ps_model_set_position(model, 99) < 0 ||
         zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0))
        rc = world_fail(w, "an evaluation forward: %s", zd_error_last());
    zd_ps_model_train(model, true);
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    /* the live stages know the last training one */
    int64_t at = -2;
    if (rc == 0 &&
        (zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, &at) < 0 || at != N_STEPS - 1))
        rc = world_fail(w, "the live stages' position: %lld (%s)", (long long)at, zd_error_last());
    return ps2_leave(w, model, rc);
}

/*  Where stage s says this trainer was, asked of it directly; -2 when it
    answered badly. */
static int64_t stage_position(int s)
{
    char fn[32];
    snprintf(fn, sizeof fn, "__zd_psm_where_%d", s);
    zd_value_t *v = NULL;
    int64_t code = -1, at = -2;
    if (zd_rpc_sync(s, fn, NULL, ZD_TIMEOUT_DEFAULT, &v) < 0 || zd_rpc_arg_int(v, 0, &code) < 0 ||
        code != ZD_OK || zd_rpc_arg_int(v, 3, &at) < 0)
        at = -2;
    zd_value_unref(v);
    return at;
}

/*  The second run, resumed: shard 0 from version 4, shard 1 (whose
    newest generation was damaged) from version 2. Before the trainer's
    first batch shard 0 goes back to its generation of version 2, the one
    of shard 1, and drops its newer one; the trainer goes on from
    position 2 (both stages' position there), and the batches from there
    train both stages exactly as locally. */
static int resumed_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    int64_t at = -2;
    if (stage_position(0) != 4 || stage_position(1) != 2 || ps2_shard_version(0) != 4)
        rc = world_fail(w,
                        "the stages resumed at positions %lld and %lld (not 4 and 2), stage 0 "
                        "at version %lld (not 4)",
                        (long long)stage_position(0), (long long)stage_position(1),
                        (long long)ps2_shard_version(0));
    if (rc == 0 && (zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, &at) < 0 || at != 2))
        rc = world_fail(w, "resumed at position %lld, not 2 (%s)", (long long)at, zd_error_last());
    if (rc == 0 &&
        (stage_position(0) != 2 || ps2_shard_version(0) != 2 || ps2_shard_version(1) != 2))
        rc = world_fail(w,
                        "stage 0 at position %lld, the stages at versions %lld and %lld, "
                        "not 2 and 2 and 2",
                        (long long)stage_position(0), (long long)ps2_shard_version(0),
                        (long long)ps2_shard_version(1));
    /* the generation given up is gone from the disk: a later restart
       cannot resume from it */
    char path[96];
    snprintf(path, sizeof path, "%s.shard0", ((const setup_t *)w->arg)->checkpoint);
    zd_named_tensors_t *file = rc == 0 ? zd_checkpoint_read(path) : NULL;
    zd_tensor_t *meta = file ? zd_named_tensors_find(file, "ps.meta") : NULL;
    /* (ps.meta: format 2, shard, shards, version, generation) */
    if (rc == 0 &&
        (!meta || zd_tensor_numel(meta) != 5 || zd_tensor_data_i64(meta)[3] != 2 ||
         zd_tensor_data_i64(meta)[4] != 1))
        rc = world_fail(w, "%s is not generation 1, of version 2", path);
    zd_named_tensors_free(file);
    snprintf(path, sizeof path, "%s.shard0.prev", ((const setup_t *)w->arg)->checkpoint);
    if (rc == 0 && access(path, F_OK) == 0)
        rc = world_fail(w, "%s is still there", path);
    for (int step = 0; rc == 0 && step < 2; step++)
        if (ps2_local_step(&lm, step, NULL) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    for (int step = 2; rc == 0 && step < 5; step++) {
        if (ps2_local_step(&lm, step, NULL) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
        if (rc == 0 && zd_ps_model_set_position(model, step) < 0)
            rc = world_fail(w, "set_position: %s", zd_error_last());
        if (rc == 0)
            rc = remote_step(w, model, 0, step, NULL);
    }
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

static int ckpt_world(const world_t *w)
{
    const setup_t *su = w->arg;
    if (w->rank < 2)
        return run_shard(w);
    return su->resume ? resumed_trainer(w) : ckpt_trainer(w);
}

static void test_checkpoint_resume(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    setup_t su = {.n_trainers = 1, .checkpoint = prefix};
    world_options_t o = {
        .world_size = 3, .fn = ckpt_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
    /* Shard 1's newest generation, cut short: passed over for the one before. */
    snprintf(path, sizeof path, "%s.shard1", prefix);
    assert_int_equal(truncate(path, 100), 0);
    su.resume = true;
    assert_int_equal(world_run(&o), 0);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    assert_int_equal(system(path), 0);
}

/*  ---- checkpoints a trainer asks for ---- */

/*  ---- checkpoints the trainer asks for ---- */

/*  "__zd_psm_ckpt_<s>"(position, instance, 0, gen) sent directly, as
    zd_ps_model_checkpoint sends it to each stage in turn: the code the
    stage answered (-1: the call failed). */
static int64_t raw_checkpoint(int s, int64_t position, int64_t gen)
{
    char fn[32];
    snprintf(fn, sizeof fn, "__zd_psm_where_%d", s);
    zd_value_t *v = NULL;
    int64_t code = -1, instance = 0;
    if (zd_rpc_sync(s, fn, NULL, ZD_TIMEOUT_DEFAULT, &v) == 0)
        zd_rpc_arg_int(v, 2, &instance);
    zd_value_unref(v);
    v = NULL;
    snprintf(fn, sizeof fn, "__zd_psm_ckpt_%d", s);
    if (zd_rpc_sync_take(s, fn, ZD_ARGS(position, instance, (int64_t)0, gen), ZD_TIMEOUT_DEFAULT,
                         &v) == 0)
        zd_rpc_arg_int(v, 0, &code);
    zd_value_unref(v);
    return code;
}

/*  Stage s's file of that suffix ("": the newest; ".prev": the one
    before): its version into *version, its generation returned (-1:
    none, or not of format 2). */
static int64_t file_generation(const world_t *w, int s, const char *suffix, int64_t *version)
{
    char path[96];
    snprintf(path, sizeof path, "%s.shard%d%s", ((const setup_t *)w->arg)->checkpoint, s, suffix);
    zd_named_tensors_t *file = zd_checkpoint_read(path);
    zd_tensor_t *meta = file ? zd_named_tensors_find(file, "ps.meta") : NULL;
    int64_t gen = -1;
    *version = -1;
    if (meta && zd_tensor_dtype(meta) == ZD_INT64 && zd_tensor_numel(meta) == 5) {
        *version = zd_tensor_data_i64(meta)[3];
        gen = zd_tensor_data_i64(meta)[4];
    }
    zd_named_tensors_free(file);
    return gen;
}

/*  The checkpoint at position 3: twice with a folder where stage 1's
    new generation goes, which its write cannot replace (even as root),
    so that the call fails naming the stage and the file; stage 0 wrote
    generation 1 and, the second time, wrote it again in place, keeping
    generation 0, stage 1's newest (a resume then goes back there).
    Then again, the folder gone. 0, or world_fail's -1. */
static int checkpoint_after_a_failed_write(const world_t *w, zd_ps_model_t *model)
{
    char in_the_way[96];
    snprintf(in_the_way, sizeof in_the_way, "%s.shard1.new", ((const setup_t *)w->arg)->checkpoint);
    if (mkdir(in_the_way, 0700) < 0)
        return world_fail(w, "mkdir %s: %s", in_the_way, strerror(errno));
    for (int again = 0; again < 2; again++) {
        int r = zd_ps_model_checkpoint(model, 3, ZD_TIMEOUT_DEFAULT);
        if (r == 0 || zd_error_code() != ZD_ERR_REMOTE || !strstr(zd_error_last(), "stage 1") ||
            !strstr(zd_error_last(), in_the_way))
            return world_fail(w, "a checkpoint whose write fails: %s",
                              r == 0 ? "taken" : zd_error_last());
    }
    printf("a write that fails: %s\n", zd_error_last());
    int64_t v, older, g = file_generation(w, 0, "", &v),
                      g_older = file_generation(w, 0, ".prev", &older);
    if (g != 1 || g_older != 0 || v != 3 || older != 0)
        return world_fail(w,
                          "stage 0 after two failed calls: generations %lld and %lld, versions "
                          "%lld and %lld (not 1 and 0, 3 and 0)",
                          (long long)g, (long long)g_older, (long long)v, (long long)older);
    if (rmdir(in_the_way) < 0 || zd_ps_model_checkpoint(model, 3, ZD_TIMEOUT_DEFAULT) < 0)
        return world_fail(w, "checkpoint: %s", zd_error_last());
    g = file_generation(w, 1, "", &v);
    if (g != 1 || v != 3)
        return world_fail(w, "stage 1 at generation %lld, version %lld (not 1 and 3)", (long long)g,
                          (long long)v);
    return 0;
}

/*  The first run, the shards writing only when asked (checkpoint_every
    0): five steps, the stages told after the third that the trainer is
    at position 3 and to write their checkpoints (a write that fails
    fails the call); a negative position, and a checkpoint before any
    step, are refused. */
static int by_hand_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    if (zd_ps_model_checkpoint(model, -1, ZD_TIMEOUT_DEFAULT) == 0 ||
        zd_error_code() != ZD_ERR_ARGUMENT)
        rc = world_fail(w, "a checkpoint at position -1 was taken");
    /* before any step, a position claims nothing the stages hold: not
       even after an evaluation forward (which makes the optimizer) */
    if (rc == 0 &&
        (zd_ps_model_checkpoint(model, 0, ZD_TIMEOUT_DEFAULT) == 0 ||
         zd_error_code() != ZD_ERR_STALE))
        rc = world_fail(w, "a checkpoint before any step: %s", zd_error_last());
    zd_ps_model_train(model, false);
    if (rc == 0 &&
        (stage_mode(w, model) != 0 || zd_ps_model_checkpoint(model, 0, ZD_TIMEOUT_DEFAULT) == 0 ||
         zd_error_code() != ZD_ERR_STALE))
        rc = world_fail(w, "a checkpoint after an evaluation forward: %s", zd_error_last());
    zd_ps_model_train(model, true);
    for (int step = 0; rc == 0 && step < N_STEPS; step++) {
        if (zd_ps_model_set_position(model, step) < 0)
            rc = world_fail(w, "set_position: %s", zd_error_last());
        if (rc == 0)
            rc = remote_step(w, model, 0, step, NULL);
        if (rc == 0 && step == 2)
            rc = checkpoint_after_a_failed_write(w, model);
    }
    return ps2_leave(w, model, rc);
}

/*  The second run, resumed: both stages at version 3 and position 3, the
    parameters of three local steps; the trainer goes on from batch 3 as
    locally. */
static int by_hand_resumed(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    int64_t at = -2;
    if (zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, &at) < 0 || at != 3 ||
        stage_position(0) != 3 || stage_position(1) != 3 || ps2_shard_version(0) != 3 ||
        ps2_shard_version(1) != 3)
        rc = world_fail(w,
                        "resumed at position %lld (%s), the stages at %lld and %lld, versions "
                        "%lld and %lld: not all 3",
                        (long long)at, zd_error_last(), (long long)stage_position(0),
                        (long long)stage_position(1), (long long)ps2_shard_version(0),
                        (long long)ps2_shard_version(1));
    for (int step = 0; rc == 0 && step < N_STEPS; step++) {
        if (ps2_local_step(&lm, step, NULL) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
        if (rc == 0 && step == 2)
            rc = ps2_same_params(w, &lm);
        if (rc == 0 && step >= 3 && zd_ps_model_set_position(model, step) < 0)
            rc = world_fail(w, "set_position: %s", zd_error_last());
        if (rc == 0 && step >= 3)
            rc = remote_step(w, model, 0, step, NULL);
    }
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

/*  Two runs of the two shards writing only when asked and one trainer,
    the second resumed: its first (a world_fn) and its resumed side. */
static int by_hand_world(const world_t *w)
{
    const setup_t *su = w->arg;
    if (w->rank < 2)
        return run_shard(w);
    return su->resume ? su->resumed(w) : su->first(w);
}

static void run_by_hand_twice(world_fn *first, world_fn *resumed)
{
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], cmd[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    setup_t su = {
        .n_trainers = 1, .checkpoint = prefix, .by_hand = true, .first = first, .resumed = resumed};
    world_options_t o = {
        .world_size = 3, .fn = by_hand_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
    su.resume = true;
    assert_int_equal(world_run(&o), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_checkpoint_by_the_trainer(void **state)
{
    (void)state;
    run_by_hand_twice(by_hand_trainer, by_hand_resumed);
}

/*  ---- one generation, stages at different versions ---- */

/*  The first run: another trainer's step between the two stages'
    writes of one checkpoint, played by this trainer (each stage asked
    directly, as zd_ps_model_checkpoint asks them): stage 0 writes
    generation 1 at version 3, stage 1 at version 4. A write of an older
    generation than the one on disk is refused as stale. */
static int across_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    for (int step = 0; rc == 0 && step < 4; step++) {
        rc = step_at(w, model, step);
        int64_t code = rc == 0 && step >= 2 ? raw_checkpoint(step - 2, step + 1, 1) : ZD_OK;
        if (code != ZD_OK)
            rc = world_fail(w, "stage %d's checkpoint of generation 1: code %lld", step - 2,
                            (long long)code);
    }
    int64_t code = rc == 0 ? raw_checkpoint(0, 4, 0) : ZD_ERR_STALE;
    if (code != ZD_ERR_STALE)
        rc = world_fail(w, "a checkpoint of generation 0 over 1: code %lld, not stale",
                        (long long)code);
    int64_t v0, v1, g0 = file_generation(w, 0, "", &v0), g1 = file_generation(w, 1, "", &v1);
    if (rc == 0 && (g0 != 1 || g1 != 1 || v0 != 3 || v1 != 4))
        rc = world_fail(w, "the files: generations %lld and %lld at versions %lld and %lld",
                        (long long)g0, (long long)g1, (long long)v0, (long long)v1);
    return ps2_leave(w, model, rc);
}

/*  The second run, resumed: the stages are one generation, at versions
    3 and 4; neither goes back, and the trainer goes on from position 3,
    the smaller of theirs (batch 3 is on stage 1 already: trained again
    there, never skipped). After a step, stage 0 alone writes generation
    2 (as a call cut short would leave it): the trainer's checkpoint
    completes generation 2, stage 0's in place (both keep generation 1
    before it); the next, after another step, is generation 3 on both. */
static int across_resumed(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    int64_t at = -2;
    if (zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, &at) < 0 || at != 3 ||
        ps2_shard_version(0) != 3 || ps2_shard_version(1) != 4)
        rc = world_fail(w, "resumed at position %lld (%s), the stages at versions %lld and %lld",
                        (long long)at, zd_error_last(), (long long)ps2_shard_version(0),
                        (long long)ps2_shard_version(1));
    if (rc == 0)
        rc = step_at(w, model, 3);
    if (rc == 0 && raw_checkpoint(0, 4, 2) != ZD_OK)
        rc = world_fail(w, "stage 0's checkpoint of generation 2 refused");
    if (rc == 0 && zd_ps_model_checkpoint(model, 4, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "checkpoint: %s", zd_error_last());
    int64_t v0, v1, g0 = file_generation(w, 0, "", &v0), g1 = file_generation(w, 1, "", &v1);
    int64_t p0, p1, h0 = file_generation(w, 0, ".prev", &p0),
                    h1 = file_generation(w, 1, ".prev", &p1);
    if (rc == 0 && (g0 != 2 || g1 != 2 || v0 != 4 || v1 != 5 || h0 != 1 || h1 != 1))
        rc = world_fail(w,
                        "the files: generations %lld and %lld at versions %lld and %lld, "
                        "before them %lld and %lld",
                        (long long)g0, (long long)g1, (long long)v0, (long long)v1, (long long)h0,
                        (long long)h1);
    if (rc == 0)
        rc = step_at(w, model, 4);
    if (rc == 0 && zd_ps_model_checkpoint(model, 5, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "checkpoint: %s", zd_error_last());
    g0 = file_generation(w, 0, "", &v0), g1 = file_generation(w, 1, "", &v1);
    if (rc == 0 && (g0 != 3 || g1 != 3 || v0 != 5 || v1 != 6))
        rc = world_fail(w, "the files: generations %lld and %lld at versions %lld and %lld",
                        (long long)g0, (long long)g1, (long long)v0, (long long)v1);
    return ps2_leave(w, model, rc);
}

static void test_checkpoint_one_generation_across_versions(void **state)
{
    (void)state;
    run_by_hand_twice(across_trainer, across_resumed);
}

/*  Stage 0 sent back to its generation of version 2 (by a direct call,
    as another trainer's agreement would) while the trainer holds batch 4
    between its backward and its step: the step fails with ZD_ERR_PEER
    (stage 0 refuses the optimizer made before, and only its new number
    tells the trainer why), stage 0 stays at 2, stage 1 took it (5). */
static int went_back_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    for (int step = 0; rc == 0 && step < 4; step++) {
        if (zd_ps_model_set_position(model, step) < 0)
            rc = world_fail(w, "set_position: %s", zd_error_last());
        if (rc == 0)
            rc = remote_step(w, model, 0, step, NULL);
    }
    zd_tensor_t *x, *y, *out = NULL, *l = NULL;
    ps2_make_batch(0, 4, &x, &y);
    if (rc == 0)
        ZD_DIST_AUTOGRAD_CONTEXT(ctx)
        {
            if (zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0 ||
                zd_nn_mse_loss(out, y, &l) < 0 || zd_dist_autograd_backward(ctx, &l, 1, false) < 0)
                rc = world_fail(w, "batch 4: %s", zd_error_last());
            zd_value_t *v = NULL;
            int64_t code = -1, instance = 0;
            if (rc == 0 &&
                (zd_rpc_sync(0, "__zd_psm_where_0", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0 ||
                 zd_rpc_arg_int(v, 2, &instance) < 0))
                rc = world_fail(w, "stage 0's instance: %s", zd_error_last());
            zd_value_unref(v);
            v = NULL;
            if (rc == 0 &&
                (zd_rpc_sync_take(
                     0, "__zd_psm_back_0",
                     ZD_ARGS(instance, (int64_t)1, (int64_t)12345, (int64_t)0, (int64_t)0),
                     ZD_TIMEOUT_DEFAULT, &v) < 0 ||
                 zd_rpc_arg_int(v, 0, &code) < 0 || code != ZD_OK))
                rc = world_fail(w, "sending stage 0 back: %s (code %lld)", zd_error_last(),
                                (long long)code);
            zd_value_unref(v);
            if (rc == 0 && (zd_ps_model_step(model, ctx) == 0 || zd_error_code() != ZD_ERR_PEER))
                rc = world_fail(w, "the step after stage 0 went back: %s, not ZD_ERR_PEER",
                                zd_error_last());
        }
    zd_tensor_unref(l);
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    if (rc == 0 && (ps2_shard_version(0) != 2 || ps2_shard_version(1) != 5))
        rc = world_fail(w, "the stages at versions %lld and %lld, not 2 and 5",
                        (long long)ps2_shard_version(0), (long long)ps2_shard_version(1));
    return ps2_leave(w, model, rc);
}

/*  Stages that write checkpoints every 2 and every 3 steps: the
    trainer's first forward fails, naming both. */
static int apart_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    if (try_step(model, 0, 0, NULL) == 0 || zd_error_code() != ZD_ERR_ARGUMENT ||
        !strstr(zd_error_last(), "every 2 and 3 steps"))
        rc = world_fail(w, "a forward over stages apart: %s", zd_error_last());
    return ps2_leave(w, model, rc);
}

static int went_back_world(const world_t *w)
{
    const setup_t *su = w->arg;
    if (w->rank < 2)
        return run_shard(w);
    return su->every1 ? apart_trainer(w) : went_back_trainer(w);
}

static void test_stage_gone_back_refuses_a_step(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], cmd[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    setup_t su = {.n_trainers = 1, .checkpoint = prefix};
    world_options_t o = {
        .world_size = 3, .fn = went_back_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
    su.every1 = 3;
    assert_int_equal(world_run(&o), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  ---- a shard killed and started again ---- */

/*  Has shard 1's parent (restarted_shard) start it again, after
    ps2_kill_shard_1. */
static int restart_shard_1(const world_t *w)
{
    const setup_t *su = w->arg;
    if (write(su->told[1], "r", 1) != 1)
        return world_fail(w, "cannot tell shard 1's parent: %s", strerror(errno));
    return 0;
}

/*  The recovery a trainer runs after ZD_ERR_PEER: shard 1 named as the
    one lost or started again, then zd_ps_model_recover (the shards
    waited for, brought to one generation) says where to go on from,
    which must be `want` (-1: none, so 0), and both stages must be at
    `version`. */
static int recover_at(const world_t *w, zd_ps_model_t *model, int64_t want, int64_t version)
{
    int64_t at = -2;
    int lost = zd_ps_model_lost_shard(model, world_scaled_ms(30000));
    if (lost != 1)
        return world_fail(w, "the shard lost: %d, not 1 (%s)", lost, zd_error_last());
    if (zd_ps_model_recover(model, world_scaled_ms(30000), &at) < 0 || at != (want < 0 ? 0 : want))
        return world_fail(w, "resume position %lld, not %lld (%s)", (long long)at, (long long)want,
                          zd_error_last());
    /* the stages as they are now are the ones it compares with */
    if (zd_ps_model_lost_shard(model, 1) != -1 || zd_error_code() != ZD_ERR_TIMEOUT)
        return world_fail(w, "a shard still seen lost after the recovery: %s", zd_error_last());
    if (ps2_shard_version(0) != version || ps2_shard_version(1) != version)
        return world_fail(w, "after the restart the stages are at versions %lld and %lld, not %lld",
                          (long long)ps2_shard_version(0), (long long)ps2_shard_version(1),
                          (long long)version);
    /* each stage's own answer: the failed forward recorded nothing on
       the stage that refused it */
    if (stage_position(0) != want || stage_position(1) != want)
        return world_fail(w, "the stages hold positions %lld and %lld, not %lld",
                          (long long)stage_position(0), (long long)stage_position(1),
                          (long long)want);
    return 0;
}

/*  Shard 1 killed twice, each time started again with resume, its
    checkpoints every 2 steps:
    - after four steps: step 4 fails with ZD_ERR_PEER, the trainer waits
      for the shard (zd_ps_model_wait_shards; it is started again only
      then, as a restart can be quicker than the trainer's next call).
      Shard 1 resumed at version 2; shard 0, at 4, goes back to its
      generation of version 2 with it; the trainer goes on from position
      2, each batch from there trained once on each stage;
    - after step 6: the trainer calls nothing of the model until the
      shard is back (zd_rpc_wait_peer), so no call of its own failed; its
      next forward meets the new process and fails with ZD_ERR_PEER (its
      batches since the checkpoint are gone from that stage), and the
      same recovery brings both stages to version 6.
    At the end both stages hold exactly what steps 0 to 8, each once,
    give the model trained locally. */
static int restart_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    for (int step = 0; rc == 0 && step < 9; step++)
        if (ps2_local_step(&lm, step, NULL) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
    for (int step = 0; rc == 0 && step < 4; step++)
        rc = step_at(w, model, step);
    if (rc == 0 && ps2_kill_shard_1() < 0)
        rc = world_fail(w, "shard 1 answered test_die");
    if (rc == 0 &&
        (zd_ps_model_set_position(model, 4) < 0 || try_step(model, 0, 4, NULL) == 0 ||
         zd_error_code() != ZD_ERR_PEER))
        rc = world_fail(w, "a step with shard 1 killed: %s, not ZD_ERR_PEER", zd_error_last());
    if (rc == 0)
        rc = restart_shard_1(w);
    if (rc == 0)
        rc = recover_at(w, model, 2, 2);
    for (int step = 2; rc == 0 && step < 7; step++)
        rc = step_at(w, model, step);
    /* both stages wrote version 6 at step 6's forward */
    if (rc == 0 && ps2_kill_shard_1() < 0)
        rc = world_fail(w, "shard 1 answered test_die the second time");
    if (rc == 0)
        rc = restart_shard_1(w);
    if (rc == 0 && zd_rpc_wait_peer(1, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shard 1 not back the second time: %s", zd_error_last());
    if (rc == 0 &&
        (zd_ps_model_set_position(model, 7) < 0 || try_step(model, 0, 7, NULL) == 0 ||
         zd_error_code() != ZD_ERR_PEER))
        rc = world_fail(w, "a step after the unseen restart: %s, not ZD_ERR_PEER",
                        rc == 0 ? zd_error_last() : "");
    if (rc == 0)
        rc = recover_at(w, model, 6, 6);
    for (int step = 6; rc == 0 && step < 9; step++)
        rc = step_at(w, model, step);
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

/*  The setup is the whole world's: each of shard 1's processes takes a
    copy saying whether it resumes. */
static int shard_life(const world_t *w, bool resume)
{
    setup_t su = *(const setup_t *)w->arg;
    world_t again = *w;
    su.resume = resume;
    again.arg = &su;
    return run_shard(&again);
}

/*  Rank 1 serves from a child process; each time one is killed, the next,
    made with resume, joins the running world in its place once the
    trainer says so. */
#define SHARD_LIVES 3

static int restarted_shard(const world_t *w)
{
    const setup_t *su = w->arg;
    return ps2_restarted_shard(w, su->lives ? su->lives : SHARD_LIVES, su->told[0], shard_life);
}

static int restart_world(const world_t *w)
{
    if (w->rank == 0)
        return run_shard(w);
    return w->rank == 1 ? restarted_shard(w) : restart_trainer(w);
}

/*  A world of fn with shard 1 started again `lives` - 1 times, the
    stages' checkpoints at prefix. 0, or -1. */
static int run_restart_world_at(int (*fn)(const world_t *), int world_size, int lives,
                                const char *prefix)
{
    setup_t su = {.n_trainers = world_size - 2, .checkpoint = prefix, .lives = lives};
    if (pipe2(su.told, O_CLOEXEC) < 0)
        return -1;
    world_options_t o = {
        .world_size = world_size, .fn = fn, .arg = &su, .own_init = true, .timeout_s = 90};
    int rc = world_run(&o);
    close(su.told[0]);
    close(su.told[1]);
    return rc;
}

/*  The same in a directory of its own. */
static int run_restart_world(int (*fn)(const world_t *), int world_size, int lives)
{
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], cmd[96];
    if (!mkdtemp(dir))
        return -1;
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    int rc = run_restart_world_at(fn, world_size, lives, prefix);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? rc : -1;
}

static void test_shard_restarted(void **state)
{
    (void)state;
    assert_int_equal(run_restart_world(restart_world, 3, SHARD_LIVES), 0);
}

/*  Shard 1 killed after one step, before the first checkpoint (every 2
    steps): it resumes from version 0, the parameters every stage wrote
    when it started; stage 0, at 1, goes back there with it; the
    generation holds no position, so the trainer starts over, and three
    steps from there end exactly as three steps trained locally. */
static int early_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = step_at(w, model, 0);
    if (rc == 0 && ps2_kill_shard_1() < 0)
        rc = world_fail(w, "shard 1 answered test_die");
    if (rc == 0 &&
        (zd_ps_model_set_position(model, 1) < 0 || try_step(model, 0, 1, NULL) == 0 ||
         zd_error_code() != ZD_ERR_PEER))
        rc = world_fail(w, "a step with shard 1 killed: %s, not ZD_ERR_PEER", zd_error_last());
    if (rc == 0)
        rc = restart_shard_1(w);
    if (rc == 0)
        rc = recover_at(w, model, -1, 0);
    for (int step = 0; rc == 0 && step < 3; step++) {
        if (ps2_local_step(&lm, step, NULL) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
        if (rc == 0)
            rc = step_at(w, model, step);
    }
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

static int early_world(const world_t *w)
{
    if (w->rank == 0)
        return run_shard(w);
    return w->rank == 1 ? restarted_shard(w) : early_trainer(w);
}

/*  The same where an earlier run left its generations (versions 4 and
    2): the new run sets them aside when it starts, and the restarted
    stage resumes from the new run's version 0, not from them. */
static void test_shard_restarted_before_a_checkpoint(void **state)
{
    (void)state;
    assert_int_equal(run_restart_world(early_world, 3, 2), 0);
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], path[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    setup_t su = {.n_trainers = 1, .checkpoint = prefix};
    world_options_t o = {
        .world_size = 3, .fn = ckpt_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
    assert_int_equal(run_restart_world_at(early_world, 3, 2, prefix), 0);
    snprintf(path, sizeof path, "%s.shard1.earlier", prefix);
    assert_int_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "rm -rf %s", dir);
    assert_int_equal(system(path), 0);
}

/*  ---- a restart, and a trainer that did not see it ---- */

/*  Waits up to 30 s (scaled) for *flag to reach `want`, set by the other
    trainer's call; 0, or -1 the world's failure. */
static int wait_flag(const world_t *w, atomic_int *flag, int want, const char *what)
{
    int64_t deadline = world_now_ms() + world_scaled_ms(30000);
    while (atomic_load(flag) < want) {
        if (world_now_ms() > deadline)
            return world_fail(w, "%s never came", what);
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    return 0;
}

/*  Tells trainer `rank` through test_done (its g_others_done). */
static int tell(const world_t *w, int rank)
{
    zd_value_t *v = NULL;
    int rc = zd_rpc_sync(rank, "test_done", NULL, ZD_TIMEOUT_DEFAULT, &v);
    zd_value_unref(v);
    return rc < 0 ? world_fail(w, "telling rank %d: %s", rank, zd_error_last()) : 0;
}

/*  Trainer 0 (rank 2) has shard 1 killed and started again, and brings
    the stages to one generation, while trainer 1 (rank 3) holds a batch
    between its backward and its step. Checkpoints every 2 steps:
    - trainer 1: batches 0 and 1 (versions 1, 2), the forward and
      backward of batch 2 (the stages write version 2 at its forward,
      with its position 2), then it says so;
    - trainer 0: batches 0 to 3 (versions 3 to 6; the stages write
      version 4 at its batch 2); shard 1 killed; its batch 4 writes
      version 6 on stage 0 and fails with ZD_ERR_PEER; shard 1 resumes at
      4, stage 0 goes back to 4 with it; trainer 0 goes on from 2
      (version 5), then tells trainer 1;
    - trainer 1's step of batch 2 fails with ZD_ERR_PEER and steps
      nothing: stage 0 refuses the optimizer made before it went back,
      and the new shard 1 never saw the batch; its own wait finds the
      stages at one generation, stepped since, and sends none back again
      (both stay at version 5); it goes on from 2, its position in that
      generation, and its batch there steps both stages. */
static int told_trainer(const world_t *w)
{
    int trainer = w->rank - 2, rc = 0;
    WTRY(zd_rpc_register("test_done", fn_done, NULL));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    if (trainer == 1) {
        for (int step = 0; rc == 0 && step < 2; step++)
            rc = step_at(w, model, step);
        zd_tensor_t *x, *y, *out = NULL, *l = NULL;
        ps2_make_batch(1, 2, &x, &y);
        if (rc == 0)
            ZD_DIST_AUTOGRAD_CONTEXT(ctx)
            {
                if (zd_ps_model_set_position(model, 2) < 0 ||
                    zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0 ||
                    zd_nn_mse_loss(out, y, &l) < 0 ||
                    zd_dist_autograd_backward(ctx, &l, 1, false) < 0)
                    rc = world_fail(w, "batch 2: %s", zd_error_last());
                if (rc == 0)
                    rc = tell(w, 2);
                if (rc == 0)
                    rc = wait_flag(w, &g_others_done, 1, "trainer 0's word");
                if (rc == 0 &&
                    (zd_ps_model_step(model, ctx) == 0 || zd_error_code() != ZD_ERR_PEER))
                    rc = world_fail(w,
                                    "the step of batch 2 after stage 0 went back: %s, not "
                                    "ZD_ERR_PEER",
                                    zd_error_last());
            }
        zd_tensor_unref(l);
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
        int64_t at = -2;
        if (rc == 0 && zd_ps_model_wait_shards(model, world_scaled_ms(30000)) < 0)
            rc = world_fail(w, "wait_shards: %s", zd_error_last());
        if (rc == 0 && (ps2_shard_version(0) != 5 || ps2_shard_version(1) != 5))
            rc = world_fail(w,
                            "after the second look the stages are at versions %lld and %lld, "
                            "not 5 and 5",
                            (long long)ps2_shard_version(0), (long long)ps2_shard_version(1));
        if (rc == 0 && (zd_ps_model_resume_position(model, ZD_TIMEOUT_DEFAULT, &at) < 0 || at != 2))
            rc = world_fail(w, "trainer 1 resumes at %lld, not 2 (%s)", (long long)at,
                            zd_error_last());
        if (rc == 0)
            rc = step_at(w, model, 2);
        if (rc == 0 && (ps2_shard_version(0) != 6 || ps2_shard_version(1) != 6))
            rc = world_fail(w, "after trainer 1's step the stages are at %lld and %lld, not 6",
                            (long long)ps2_shard_version(0), (long long)ps2_shard_version(1));
    } else {
        rc = wait_flag(w, &g_others_done, 1, "trainer 1's batches");
        for (int step = 0; rc == 0 && step < 4; step++)
            rc = step_at(w, model, step);
        if (rc == 0 && ps2_kill_shard_1() < 0)
            rc = world_fail(w, "shard 1 answered test_die");
        if (rc == 0 &&
            (zd_ps_model_set_position(model, 4) < 0 || try_step(model, 0, 4, NULL) == 0 ||
             zd_error_code() != ZD_ERR_PEER))
            rc = world_fail(w, "a step with shard 1 killed: %s, not ZD_ERR_PEER", zd_error_last());
        if (rc == 0)
            rc = restart_shard_1(w);
        if (rc == 0)
            rc = recover_at(w, model, 2, 4);
        if (rc == 0)
            rc = step_at(w, model, 2);
        if (rc == 0)
            rc = tell(w, 3);
    }
    return ps2_leave(w, model, rc);
}

static int told_world(const world_t *w)
{
    if (w->rank == 0)
        return run_shard(w);
    return w->rank == 1 ? restarted_shard(w) : told_trainer(w);
}

static void test_restart_unseen_by_a_trainer(void **state)
{
    (void)state;
    assert_int_equal(run_restart_world(told_world, 4, 2), 0);
}

/*  ---- bad arguments, no world ---- */

/*  ---- the library's fault points (core/fault_point.h) ---- */

/*  An evaluation forward (no point of the trainer's: it is not training),
    then three steps, the last one failing where the fault is, and a
    checkpoint after the second: a stage killed makes the call fail with
    ZD_ERR_PEER naming it, after two whole steps. */
static int fault_trainer(const world_t *w)
{
    const setup_t *su = w->arg;
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    zd_tensor_t *x, *y, *out = NULL;
    ps2_make_batch(0, 0, &x, &y);
    zd_ps_model_train(model, false);
    if (zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) < 0)
        rc = world_fail(w, "evaluation forward: %s", zd_error_last());
    zd_ps_model_train(model, true);
    zd_tensor_unref(out), zd_tensor_unref(x), zd_tensor_unref(y);
    for (int step = 0; rc == 0 && step < 2; step++)
        rc = remote_step(w, model, 0, step, NULL);
    int failed = rc < 0 ? 0 : try_step(model, 0, 2, NULL);
    if (rc == 0 && failed == 0 && su->by_hand)
        failed = zd_ps_model_checkpoint(model, 3, ZD_TIMEOUT_DEFAULT);
    if (rc == 0 &&
        (failed == 0 || zd_error_code() != ZD_ERR_PEER ||
         !strstr(zd_error_last(), "stage 1 (rank 1)")))
        rc = world_fail(w, "%s: the last call %s", su->fault,
                        failed == 0 ? "succeeded" : zd_error_last());
    if (rc == 0)
        printf("%s: %s\n", su->fault, zd_error_last());
    if (rc == 0 && ps2_shard_version(0) != (su->by_hand ? 3 : 2))
        rc = world_fail(w, "%s: stage 0 at version %lld", su->fault,
                        (long long)ps2_shard_version(0));
    zd_ps_model_free(model);
    zd_rpc_shutdown(true, world_scaled_ms(30000)); /* (a shard is gone) */
    return rc;
}

static int fault_world(const world_t *w)
{
    const setup_t *su = w->arg;
    if (w->rank == su->fault_rank && setenv("ZDIST_FAULT", su->fault, 1) < 0)
        return world_fail(w, "setenv: %s", strerror(errno));
    return w->rank < 2 ? run_shard(w) : fault_trainer(w);
}

/*  ZDIST_FAULT pins a crash to a phase of the layer's work, the program
    having no hook: the trainer killed at its third training forward
    (the evaluation forward before does not count), backward or step; a
    stage killed at its fourth forward (the evaluation one counts there:
    the third batch's), or at its first checkpoint write
    (its new run's version 0 is no such write). */
static void test_fault_points(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], cmd[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    const struct {
        const char *fault;
        int rank;
        int64_t forwards; /* a shard's forwards when the trainer died */
        bool by_hand;
    } rows[] = {
        {"2:forward:kill:3", 2, 3, false},   {"2:backward:kill:3", 2, 4, false},
        {"2:step:kill:3", 2, 4, false},      {"1:forward:kill:4", 1, 0, false},
        {"1:checkpoint:kill:1", 1, 0, true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        setup_t su = {.n_trainers = 1,
                      .fault = rows[i].fault,
                      .fault_rank = rows[i].rank,
                      .forwards_at_loss = rows[i].forwards,
                      .kill_shard = true,
                      .by_hand = rows[i].by_hand,
                      .checkpoint = rows[i].by_hand ? prefix : NULL};
        world_options_t o = {
            .world_size = 3, .fn = fault_world, .arg = &su, .own_init = true, .timeout_s = 60};
        o.expect_exit[rows[i].rank] = 128 + SIGKILL;
        fprintf(stderr, "ZDIST_FAULT=%s\n", rows[i].fault);
        assert_int_equal(world_run(&o), 0);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  A stage's checkpoints carry the run's tag: a resume with another
    tag is refused naming the file and both, as is one with a tag from a
    file without one; the same tag, or none, resumes. A tag over 4096
    bytes is refused. */
static void test_run_tag(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_model_XXXXXX", prefix[64], want[256], cmd[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/c", dir);
    zd_nn_module_t *stage = ps2_make_stage(0);
    zd_ps_options_t o = zd_ps_options_default();
    o.checkpoint_path = prefix;
    o.run_tag = "--lr=0.1 --seed=7";
    zd_ps_model_server_t *srv = zd_ps_model_server_new(stage, 0, 1, &o); /* writes version 0 */
    assert_non_null(srv);
    zd_ps_model_server_free(srv);
    o.resume = true;
    o.run_tag = "--lr=0.2 --seed=7";
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    snprintf(want, sizeof want,
             "%s.shard0 was written by a run with \"--lr=0.1 --seed=7\"; this one has "
             "\"--lr=0.2 --seed=7\"",
             prefix);
    assert_non_null(strstr(zd_error_last(), want));
    const char *resumes[] = {"--lr=0.1 --seed=7", NULL, ""};
    for (int i = 0; i < 3; i++) {
        o.run_tag = resumes[i];
        assert_non_null(srv = zd_ps_model_server_new(stage, 0, 1, &o));
        zd_ps_model_server_free(srv);
    }
    /* a new run without a tag; then a resume that has one */
    o.resume = false;
    o.run_tag = NULL;
    assert_non_null(srv = zd_ps_model_server_new(stage, 0, 1, &o));
    zd_ps_model_server_free(srv);
    o.resume = true;
    o.run_tag = "--lr=0.1 --seed=7";
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_non_null(strstr(zd_error_last(), "was written by a run with no tag"));
    /* long tags that part late: shown from a little before there */
    char tag_a[320], tag_b[320];
    memset(tag_a, 'a', 300);
    memcpy(tag_b, tag_a, 300);
    snprintf(tag_a + 300, 20, "X");
    snprintf(tag_b + 300, 20, "Y");
    o.resume = false;
    o.run_tag = tag_a;
    assert_non_null(srv = zd_ps_model_server_new(stage, 0, 1, &o));
    zd_ps_model_server_free(srv);
    o.resume = true;
    o.run_tag = tag_b;
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_non_null(strstr(zd_error_last(), "a run with \"...aaaa"));
    assert_non_null(strstr(zd_error_last(), "aaX\"; this one has \"...aaaa"));
    assert_non_null(strstr(zd_error_last(), "aaY\": resume"));
    char *long_tag = malloc(4098);
    assert_non_null(long_tag);
    memset(long_tag, 'x', 4097);
    long_tag[4097] = 0;
    o.run_tag = long_tag;
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_non_null(strstr(zd_error_last(), "run_tag of 4097 bytes (at most 4096)"));
    free(long_tag);
    zd_nn_module_free(stage);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_arguments(void **state)
{
    (void)state;
    zd_nn_module_t *stage = ps2_make_stage(0);
    zd_optim_config_t sgd = zd_optim_sgd_defaults(PS2_LR);
    assert_null(zd_ps_model_server_new(NULL, 0, 1, NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_null(zd_ps_model_server_new(stage, 2, 2, NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_ps_options_t o = zd_ps_options_default();
    o.stage_outputs = 0;
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_non_null(strstr(zd_error_last(), "stage_outputs must be in [1, 64]"));
    o = zd_ps_options_default();
    o.max_inflight = -1;
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_non_null(strstr(zd_error_last(), "max_inflight must be >= 0"));
    /* checkpoints in a folder that is not there: refused at once, named */
    o = zd_ps_options_default();
    o.checkpoint_path = "/nonexistent/zd_ps_model/c";
    assert_null(zd_ps_model_server_new(stage, 0, 1, &o));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(
        strstr(zd_error_last(), "cannot write /nonexistent/zd_ps_model/c.shard0.probe."));
    assert_int_equal(zd_ps_model_server_inflight(NULL, NULL), 0);
    assert_null(zd_ps_model_new(shard_ranks, 0, &sgd, NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_null(zd_ps_model_new((int[]){0, -1}, 2, &sgd, NULL));
    assert_non_null(strstr(zd_error_last(), "shard 1 has rank -1"));
    zd_optim_config_t unsized = {.kind = ZD_OPTIM_SGD, .lr = PS2_LR};
    assert_null(zd_ps_model_new(shard_ranks, 2, &unsized, NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_tensor_t *out = NULL;
    assert_int_equal(zd_ps_model_forward(NULL, NULL, 0, &out, 1, ZD_TIMEOUT_DEFAULT), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(zd_ps_model_step(NULL, 1), -1);
    assert_int_equal(zd_ps_model_server_forwards(NULL), -1);
    assert_null(zd_ps_model_server_params(NULL));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    /* (a model's own bad position: ckpt_trainer, in its world) */
    assert_int_equal(zd_ps_model_set_position(NULL, 0), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    int64_t at = 7;
    assert_int_equal(zd_ps_model_resume_position(NULL, ZD_TIMEOUT_DEFAULT, &at), -1);
    assert_int_equal(at, -1);
    at = 7;
    assert_int_equal(zd_ps_model_recover(NULL, 1, &at), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(at, -1);
    assert_int_equal(zd_ps_model_lost_shard(NULL, 1), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_ps_model_free(NULL);
    zd_ps_model_server_free(NULL);
    zd_nn_module_free(stage);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_run_tag),
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_refused_and_stopped),
        cmocka_unit_test(test_two_trainers_then_lost),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_checkpoint_by_the_trainer),
        cmocka_unit_test(test_checkpoint_one_generation_across_versions),
        cmocka_unit_test(test_stage_gone_back_refuses_a_step),
        cmocka_unit_test(test_shard_restarted),
        cmocka_unit_test(test_restart_unseen_by_a_trainer),
        cmocka_unit_test(test_shard_restarted_before_a_checkpoint),
        cmocka_unit_test(test_max_inflight),
        cmocka_unit_test(test_stop_lets_waiting_forwards_go),
        cmocka_unit_test(test_fault_points),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
