/* SPDX-License-Identifier: MIT */
/*  A trainer's loop over the remote model (ps.h: zd_ps_model_run) in
    worlds of real processes, on the model of two stages of
    tests/support/ps_two_stages.h (test_ps_model.c's): a hidden layer on
    shard 0 and a head on shard 1.
    - one trainer, five batches: the events are START at 0, BATCH 1 to 5
      and DONE at 5, in order; each batch's loss, and the stages'
      parameters after the run, are what the same model trained locally
      with autograd and SGD gives; the loss callback and the backward
      callback see each batch's position, inside a context of the batch's
      own;
    - a diverging run: a loss that is nan at position 2 stops the run
      before its step (the stages at version 2), naming batch 3 and the
      hint; a finite loss above loss_limit, or above loss_growth times the
      run's first, stops it after its step ("the model is diverging"); a
      checkpoint the stages refuse (no checkpoint_path) fails the run
      though recover is set; a backward callback that fails fails the
      run, its batch not stepped. The diverging losses are the batch's loss
      plus a constant, so the steps taken are the local model's steps and
      the stages end as it does;
    - with a trainers' registry on rank 0: a run that ends is told to it
      as finished; an event callback that fails at BATCH 3 fails the run
      with its own error at position 3, and the registry has the trainer
      failed at 3 with that text;
    - a shard killed mid-run (after BATCH 5; the run asks for checkpoints
      every 2 batches) and started again with resume: with recover the
      run sees LOST at 5 naming shard 1, then BACK at 4 (the last
      checkpoint), and trains to the end; every batch's loss, and the
      stages after it, are those of the model trained locally, each batch
      once;
    - bad options, without a world: NULL, no loss callback, negative
      numbers, max_staleness without a registry, a struct whose size is
      not set, each refused with ZD_ERR_ARGUMENT, no callback called. */
#define _GNU_SOURCE /* pipe2 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>

#include "tests/support/ps_two_stages.h"
#include "tests/support/world.h"

typedef struct {
    const char *checkpoint; /* the shards' checkpoint_path (written only when asked), or NULL */
    bool registry;          /* rank 0 keeps the trainers' book too */
    int told[2];            /* test_recover: the trainer tells shard 1's parent to restart it */
} setup_t;

/*  ---- the shards ---- */

static zd_ps_trainers_t *g_registry; /* rank 0, with setup_t.registry */

/*  "test_trainer"() -> what the registry knows of the trainer (rank 2):
    [started, finished, failed, failed_at, why]. */
static zd_value_t *fn_trainer(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_ps_trainer_info_t info;
    if (zd_ps_trainers_get(g_registry, 2, &info) < 0)
        return NULL;
    return ZD_ARGS(info.started, info.finished, info.failed, info.failed_at, info.why);
}

/*  Serves stage w->rank (resumed from its checkpoint with resume) until
    the world shuts down. */
static int run_shard(const world_t *w, bool resume)
{
    const setup_t *su = w->arg;
    ps2_shard_t o = {.options = zd_ps_options_default()};
    o.options.checkpoint_path = su->checkpoint; /* checkpoint_every 0: the trainer's only */
    o.options.resume = resume;
    if (su->registry && w->rank == 0) {
        zd_ps_trainers_options_t to = zd_ps_trainers_options_default();
        to.first_trainer = 2;
        WCHECK(g_registry = zd_ps_trainers_new(&to));
        WTRY(zd_rpc_register("test_trainer", fn_trainer, NULL));
    }
    int rc = ps2_run_shard(w, &o);
    zd_ps_trainers_free(g_registry);
    return rc;
}

/*  ---- the trainer's side ---- */

static const int shard_ranks[2] = {0, 1};

/*  Both stages at `version` (the steps they took), or the world's failure. */
static int versions_are(const world_t *w, int64_t version, const char *when)
{
    int64_t v0 = ps2_shard_version(0), v1 = ps2_shard_version(1);
    if (v0 != version || v1 != version)
        return world_fail(w, "%s: the stages at versions %lld and %lld, not %lld", when,
                          (long long)v0, (long long)v1, (long long)version);
    return 0;
}

/*  ---- the trainer's side: the run's callbacks ---- */

#define MAX_SEEN 32

/*  What a run's callbacks do, and what they saw. */
typedef struct {
    const world_t *w;
    /* the loss callback: at position shift_at (-1: never) the loss is
       the batch's plus shift, a constant (nan: a loss not finite; a
       finite one: the same gradients, the step as the local one) */
    int64_t shift_at;
    float shift;
    int64_t refuse_at;  /* the event callback fails at BATCH of this position (0: never) */
    int64_t unsound_at; /* the backward callback fails at this position (-1: never) */
    int64_t kill_at;    /* at BATCH of this position it has shard 1 killed, once (0: never) */
    bool restart;       /* at LOST it has shard 1's parent start it again */
    /* seen: */
    zd_ps_run_event_t ev[MAX_SEEN];
    int n_ev;
    char lost_why[512];
    int64_t loss_pos[MAX_SEEN], loss_ctx[MAX_SEEN];
    int n_loss;
    int64_t back_pos[MAX_SEEN], back_ctx[MAX_SEEN];
    int n_back;
} trainer_t;

/*  A trainer that does nothing out of the way; for world w (NULL: none). */
static trainer_t trainer_plain(const world_t *w)
{
    return (trainer_t){.w = w, .shift_at = -1, .unsound_at = -1};
}

/*  zd_ps_loss_fn: the batch's forward through the stages and its mean
    squared error (plus t->shift at t->shift_at). */
static int batch_loss(void *arg, zd_ps_model_t *m, int64_t position, zd_tensor_t **loss)
{
    trainer_t *t = arg;
    if (t->n_loss < MAX_SEEN) {
        t->loss_pos[t->n_loss] = position;
        t->loss_ctx[t->n_loss] = zd_dist_autograd_current_context();
    }
    t->n_loss++;
    zd_tensor_t *x, *y, *out = NULL, *l = NULL, *shift = NULL;
    ps2_make_batch(0, position, &x, &y);
    int rc = x && y ? zd_ps_model_forward(m, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) : -1;
    if (rc == 0)
        rc = zd_nn_mse_loss(out, y, &l);
    if (rc == 0 && position == t->shift_at) {
        zd_tensor_t *shifted = NULL;
        if (!(shift = zd_tensor_new(ZD_FLOAT32, NULL, 0)))
            rc = -1;
        else
            zd_tensor_data(shift)[0] = t->shift;
        if (rc == 0)
            rc = zd_tensor_add(l, shift, &shifted);
        zd_tensor_unref(l);
        l = shifted;
    }
    if (rc < 0)
        zd_tensor_unref_p(&l);
    *loss = l;
    zd_tensor_unref(shift);
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

/*  zd_ps_backward_fn: notes the batch and its context; fails at
    t->unsound_at. */
static int on_backward(void *arg, int64_t position, int64_t context_id)
{
    trainer_t *t = arg;
    if (t->n_back < MAX_SEEN) {
        t->back_pos[t->n_back] = position;
        t->back_ctx[t->n_back] = context_id;
    }
    t->n_back++;
    if (position == t->unsound_at)
        return zd_error_set("the gradients of batch %lld are unsound", (long long)position + 1);
    return 0;
}

/*  zd_ps_run_event_fn: notes the event, then does what t says. */
static int on_event(void *arg, const zd_ps_run_event_t *ev)
{
    trainer_t *t = arg;
    if (t->n_ev < MAX_SEEN) {
        t->ev[t->n_ev] = *ev;
        t->ev[t->n_ev].why = NULL; /* borrowed for the call only */
    }
    t->n_ev++;
    if (ev->kind == ZD_PS_RUN_LOST)
        snprintf(t->lost_why, sizeof t->lost_why, "%s", ev->why ? ev->why : "(none)");
    if (ev->kind == ZD_PS_RUN_LOST && t->restart) {
        const setup_t *su = t->w->arg;
        if (write(su->told[1], "r", 1) != 1)
            return zd_error_set("cannot tell shard 1's parent: %s", strerror(errno));
    }
    if (ev->kind == ZD_PS_RUN_BATCH && ev->position == t->kill_at) {
        t->kill_at = 0; /* once: BATCH 5 comes again after the shard is back */
        if (ps2_kill_shard_1() < 0)
            return zd_error_set("shard 1 answered test_die");
    }
    if (ev->kind == ZD_PS_RUN_BATCH && ev->position == t->refuse_at)
        return zd_error_set("the evaluation after batch %lld failed", (long long)ev->position);
    return 0;
}

/*  Options calling t's callbacks, for `batches` batches. */
static zd_ps_run_options_t run_options(trainer_t *t, int64_t batches)
{
    zd_ps_run_options_t o = zd_ps_run_options_default();
    o.batches = batches;
    o.loss = batch_loss;
    o.backward = on_backward;
    o.event = on_event;
    o.arg = t;
    return o;
}

/*  The events t saw, as "START 0, BATCH 1, ..., LOST 5 shard 1, BACK 4,
    ..., DONE 8", into buf. */
static void events_text(const trainer_t *t, char *buf, size_t size)
{
    static const char *const names[] = {[ZD_PS_RUN_START] = "START",
                                        [ZD_PS_RUN_BATCH] = "BATCH",
                                        [ZD_PS_RUN_LOST] = "LOST",
                                        [ZD_PS_RUN_BACK] = "BACK",
                                        [ZD_PS_RUN_DONE] = "DONE"};
    buf[0] = '\0';
    for (int i = 0; i < t->n_ev && i < MAX_SEEN; i++) {
        const zd_ps_run_event_t *e = &t->ev[i];
        char one[64], shard[16] = "";
        if (e->kind == ZD_PS_RUN_LOST)
            snprintf(shard, sizeof shard, " shard %d", e->shard);
        snprintf(one, sizeof one, "%s%s %lld%s", i ? ", " : "",
                 e->kind >= ZD_PS_RUN_START && e->kind <= ZD_PS_RUN_DONE ? names[e->kind] : "?",
                 (long long)e->position, shard);
        strncat(buf, one, size - strlen(buf) - 1);
    }
    if (t->n_ev > MAX_SEEN)
        strncat(buf, ", ...", size - strlen(buf) - 1);
}

/*  The events t saw must be `want` (as events_text writes them). */
static int events_are(const world_t *w, const trainer_t *t, const char *want)
{
    char got[1024];
    events_text(t, got, sizeof got);
    if (strcmp(got, want) != 0)
        return world_fail(w, "the events were\n  %s\nnot\n  %s", got, want);
    return 0;
}

/*  A run that must fail with code, its error holding text (and text2,
    unless NULL), with *position `at`. */
static int run_fails(const world_t *w, zd_ps_model_t *model, const zd_ps_run_options_t *o,
                     int64_t at, zd_error_code_t code, const char *text, const char *text2)
{
    int64_t done = -1;
    if (zd_ps_model_run(model, o, &done) == 0)
        return world_fail(w, "a run that should fail (\"%s\") succeeded at %lld", text,
                          (long long)done);
    if (zd_error_code() != code || !strstr(zd_error_last(), text) ||
        (text2 && !strstr(zd_error_last(), text2)))
        return world_fail(w, "expected %s \"%s\"%s%s, got %s: %s", zd_error_code_name(code), text,
                          text2 ? " and " : "", text2 ? text2 : "",
                          zd_error_code_name(zd_error_code()), zd_error_last());
    printf("a run failed as it should: %s\n", zd_error_last());
    if (done != at)
        return world_fail(w, "the failed run stopped at position %lld, not %lld", (long long)done,
                          (long long)at);
    return 0;
}

/*  Every BATCH event's loss against the local model's at that batch
    (want[p]: the loss of the batch at position p). */
static int losses_are(const world_t *w, const trainer_t *t, const float *want, int n_want)
{
    for (int i = 0; i < t->n_ev && i < MAX_SEEN; i++) {
        const zd_ps_run_event_t *e = &t->ev[i];
        if (e->kind != ZD_PS_RUN_BATCH)
            continue;
        if (e->position < 1 || e->position > n_want)
            return world_fail(w, "a BATCH event at position %lld", (long long)e->position);
        float local = want[e->position - 1];
        if (fabsf(e->loss - local) > 1e-6f * (1 + local))
            return world_fail(w, "BATCH %lld: loss %.9g, trained locally %.9g",
                              (long long)e->position, e->loss, local);
    }
    return 0;
}

/*  ---- one trainer, five batches, exactly as locally ---- */

#define N_BATCHES 5

static int exact_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    float want[N_BATCHES];
    for (int step = 0; rc == 0 && step < N_BATCHES; step++)
        if (ps2_local_step(&lm, step, &want[step]) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
    trainer_t t = trainer_plain(w);
    zd_ps_run_options_t o = run_options(&t, N_BATCHES);
    int64_t done = -1;
    if (rc == 0 && (zd_ps_model_run(model, &o, &done) < 0 || done != N_BATCHES))
        rc = world_fail(w, "the run: %s (position %lld)", zd_error_last(), (long long)done);
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1, BATCH 2, BATCH 3, BATCH 4, BATCH 5, DONE 5");
    if (rc == 0)
        rc = losses_are(w, &t, want, N_BATCHES);
    /* Each batch's loss, then its backward callback, at its position, in
       a context of its own. */
    if (rc == 0 && (t.n_loss != N_BATCHES || t.n_back != N_BATCHES))
        rc = world_fail(w, "%d loss and %d backward calls, not %d", t.n_loss, t.n_back, N_BATCHES);
    for (int i = 0; rc == 0 && i < N_BATCHES; i++)
        if (t.loss_pos[i] != i || t.back_pos[i] != i || t.loss_ctx[i] < 0 ||
            t.back_ctx[i] != t.loss_ctx[i] || (i > 0 && t.loss_ctx[i] == t.loss_ctx[i - 1]))
            rc = world_fail(w,
                            "call %d: the loss at position %lld in context %lld, the backward "
                            "at %lld in context %lld (the batch before's: %lld)",
                            i, (long long)t.loss_pos[i], (long long)t.loss_ctx[i],
                            (long long)t.back_pos[i], (long long)t.back_ctx[i],
                            (long long)(i > 0 ? t.loss_ctx[i - 1] : -1));
    /* no context left open on this thread */
    if (rc == 0 && zd_dist_autograd_current_context() != -1)
        rc = world_fail(w, "context %lld still current after the run",
                        (long long)zd_dist_autograd_current_context());
    if (rc == 0)
        rc = versions_are(w, N_BATCHES, "after the run");
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

static int exact_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w, false) : exact_trainer(w);
}

static void test_exact(void **state)
{
    (void)state;
    setup_t su = {0};
    world_options_t o = {
        .world_size = 3, .fn = exact_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a diverging run ---- */

#define HINT "Remedy: a lower learning rate"

/*  Five runs on one model, each from position 0 (no resume):
    - a loss of nan at position 2: refused before its step, naming batch
      3 and the hint; the stages at version 2;
    - loss_limit 100, the loss 1000 higher at position 1: stopped after
      that batch's step (position 2, version 4);
    - loss_growth 100, the loss 1000 higher at position 2: stopped after
      its step (position 3, version 7);
    - a checkpoint every batch, which the stages (no checkpoint_path)
      refuse: not recovered from, recover set (position 1, version 8);
    - a backward callback that fails at position 1: the run fails with
      its error, that batch not stepped (position 1, version 9).
    The stages then hold the local model trained on the batches at
    positions 0 1, 0 1, 0 1 2, 0, 0. */
static int diverging_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;

    trainer_t t = trainer_plain(w);
    t.shift_at = 2;
    t.shift = NAN;
    zd_ps_run_options_t o = run_options(&t, N_BATCHES);
    o.diverging_hint = HINT;
    o.loss_limit = 100; /* a loss not finite stops the run whatever the bounds */
    rc = run_fails(w, model, &o, 2, ZD_ERR_ARGUMENT, "batch 3: the loss is nan", ". " HINT);
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1, BATCH 2");
    if (rc == 0 && (t.n_loss != 3 || t.n_back != 2))
        rc = world_fail(w, "%d loss and %d backward calls, not 3 and 2", t.n_loss, t.n_back);
    if (rc == 0)
        rc = versions_are(w, 2, "after a loss of nan at position 2");

    t = trainer_plain(w);
    t.shift_at = 1;
    t.shift = 1000;
    o = run_options(&t, N_BATCHES);
    o.diverging_hint = HINT;
    o.loss_limit = 100;
    if (rc == 0)
        rc = run_fails(w, model, &o, 2, ZD_ERR_ARGUMENT, "batch 2: the loss is 100",
                       "the model is diverging. " HINT);
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1");
    if (rc == 0)
        rc = versions_are(w, 4, "after a loss above loss_limit");

    t = trainer_plain(w);
    t.shift_at = 2;
    t.shift = 1000;
    o = run_options(&t, N_BATCHES);
    o.loss_growth = 100; /* no hint: none added */
    if (rc == 0)
        rc = run_fails(w, model, &o, 3, ZD_ERR_ARGUMENT, "batch 3: the loss is 100",
                       "the model is diverging");
    if (rc == 0 && strstr(zd_error_last(), "Remedy"))
        rc = world_fail(w, "a hint without diverging_hint: %s", zd_error_last());
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1, BATCH 2");
    if (rc == 0)
        rc = versions_are(w, 7, "after a loss above loss_growth times the first");

    t = trainer_plain(w);
    o = run_options(&t, N_BATCHES);
    o.checkpoint_every = 1;
    o.recover = true;
    if (rc == 0)
        rc = run_fails(w, model, &o, 1, ZD_ERR_ARGUMENT, "stage 0", "checkpoint_path");
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1");
    if (rc == 0)
        rc = versions_are(w, 8, "after a checkpoint refused");

    t = trainer_plain(w);
    t.unsound_at = 1;
    o = run_options(&t, N_BATCHES);
    if (rc == 0)
        rc = run_fails(w, model, &o, 1, ZD_ERR_OTHER, "the gradients of batch 2 are unsound", NULL);
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1");
    if (rc == 0)
        rc = versions_are(w, 9, "after the backward callback refused batch 2");

    const int64_t trained[] = {0, 1, 0, 1, 0, 1, 2, 0, 0};
    for (size_t i = 0; rc == 0 && i < sizeof trained / sizeof trained[0]; i++)
        if (ps2_local_step(&lm, trained[i], NULL) < 0)
            rc = world_fail(w, "local step %zu: %s", i, zd_error_last());
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

static int diverging_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w, false) : diverging_trainer(w);
}

static void test_diverging(void **state)
{
    (void)state;
    setup_t su = {0};
    world_options_t o = {
        .world_size = 3, .fn = diverging_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- the registry, and an event callback that fails the run ---- */

/*  What the registry on rank 0 knows of this trainer, against what it
    should (why: a text its why must hold, or NULL for any). */
static int registry_says(const world_t *w, bool finished, bool failed, int64_t failed_at,
                         const char *why)
{
    zd_value_t *v = NULL;
    int64_t started = -1, fin = -1, fail = -1, at = -2;
    const char *text = "";
    if (zd_rpc_sync(0, "test_trainer", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0 ||
        ZD_UNPACK(v, &started, &fin, &fail, &at, &text) < 0) {
        zd_value_unref(v);
        return world_fail(w, "test_trainer: %s", zd_error_last());
    }
    int rc = 0;
    if (started != 1 || fin != finished || fail != failed || (failed && at != failed_at) ||
        (why && !strstr(text, why)))
        rc = world_fail(w,
                        "the registry has the trainer started %lld, finished %lld, failed %lld "
                        "at %lld (\"%s\"), not 1, %d, %d at %lld (\"%s\")",
                        (long long)started, (long long)fin, (long long)fail, (long long)at, text,
                        finished, failed, (long long)failed_at, why ? why : "");
    zd_value_unref(v);
    return rc;
}

/*  A run of two batches through the gate (max_staleness 1), told to the
    registry: finished. Then a run whose event callback fails at BATCH 3:
    the run fails with the callback's own error at position 3 (the batch
    stepped: version 5), and the registry has the trainer failed at 3
    with that text. */
static int refusing_trainer(const world_t *w)
{
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    trainer_t t = trainer_plain(w);
    zd_ps_run_options_t o = run_options(&t, 2);
    o.registry = 0;
    o.max_staleness = 1;
    int64_t done = -1;
    if (zd_ps_model_run(model, &o, &done) < 0 || done != 2)
        rc = world_fail(w, "the run with a registry: %s (position %lld)", zd_error_last(),
                        (long long)done);
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1, BATCH 2, DONE 2");
    if (rc == 0)
        rc = registry_says(w, true, false, 0, NULL);

    t = trainer_plain(w);
    t.refuse_at = 3;
    o = run_options(&t, N_BATCHES);
    o.registry = 0;
    if (rc == 0)
        rc = run_fails(w, model, &o, 3, ZD_ERR_OTHER, "the evaluation after batch 3 failed", NULL);
    if (rc == 0 && strcmp(zd_error_last(), "the evaluation after batch 3 failed") != 0)
        rc = world_fail(w, "the callback's error became \"%s\"", zd_error_last());
    if (rc == 0)
        rc = events_are(w, &t, "START 0, BATCH 1, BATCH 2, BATCH 3");
    if (rc == 0)
        rc = versions_are(w, 5, "after the callback refused BATCH 3");
    if (rc == 0)
        rc = registry_says(w, true, true, 3, "the evaluation after batch 3 failed");
    return ps2_leave(w, model, rc);
}

static int refusing_world(const world_t *w)
{
    return w->rank < 2 ? run_shard(w, false) : refusing_trainer(w);
}

static void test_registry_and_a_refusing_event(void **state)
{
    (void)state;
    setup_t su = {.registry = true};
    world_options_t o = {
        .world_size = 3, .fn = refusing_world, .arg = &su, .own_init = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a shard killed and started again: recover ---- */

#define RECOVER_BATCHES 8

/*  Eight batches, a checkpoint every 2 (the shards write only those).
    The event callback has shard 1 killed at BATCH 5 and, at LOST, its
    parent start it again with resume: the batch at position 5 fails,
    the run names shard 1 lost at 5, waits for it, and goes back to 4
    (the checkpoint at BATCH 4: shard 1 resumed from it, shard 0 sent
    back to it), then trains 4 to 7 again. Every batch's loss is the
    local model's at that batch, and the stages end as it does after
    eight batches, each once. */
static int recover_trainer(const world_t *w)
{
    ps2_local_t lm;
    WTRY(ps2_local_new(&lm));
    zd_ps_model_t *model = ps2_trainer_join(w);
    WCHECK(model);
    int rc = 0;
    float want[RECOVER_BATCHES];
    for (int step = 0; rc == 0 && step < RECOVER_BATCHES; step++)
        if (ps2_local_step(&lm, step, &want[step]) < 0)
            rc = world_fail(w, "local step %d: %s", step, zd_error_last());
    trainer_t t = trainer_plain(w);
    t.kill_at = 5;
    t.restart = true;
    zd_ps_run_options_t o = run_options(&t, RECOVER_BATCHES);
    o.checkpoint_every = 2;
    o.recover = true;
    o.recover_ms = world_scaled_ms(30000);
    int64_t done = -1;
    if (rc == 0 && (zd_ps_model_run(model, &o, &done) < 0 || done != RECOVER_BATCHES))
        rc = world_fail(w, "the run: %s (position %lld)", zd_error_last(), (long long)done);
    if (rc == 0)
        rc = events_are(w, &t,
                        "START 0, BATCH 1, BATCH 2, BATCH 3, BATCH 4, BATCH 5, LOST 5 shard 1, "
                        "BACK 4, BATCH 5, BATCH 6, BATCH 7, BATCH 8, DONE 8");
    if (rc == 0 && !strstr(t.lost_why, "stage 1 (rank 1)"))
        rc = world_fail(w, "LOST's why does not name stage 1: %s", t.lost_why);
    for (int i = 0; rc == 0 && i < t.n_ev && i < MAX_SEEN; i++)
        if (t.ev[i].kind == ZD_PS_RUN_BACK && !(t.ev[i].seconds >= 0))
            rc = world_fail(w, "BACK after %g s", t.ev[i].seconds);
    if (rc == 0)
        printf("shard 1 lost (%s); back after %.2f s\n", t.lost_why, t.ev[7].seconds);
    if (rc == 0)
        rc = losses_are(w, &t, want, RECOVER_BATCHES);
    if (rc == 0)
        rc = versions_are(w, RECOVER_BATCHES, "after the run");
    if (rc == 0)
        rc = ps2_same_params(w, &lm);
    ps2_local_free(&lm);
    return ps2_leave(w, model, rc);
}

/*  Rank 1 serves from a child process; when it is killed, the next one,
    made with resume, joins the running world in its place once the
    trainer says so. */
static int restarted_shard(const world_t *w)
{
    const setup_t *su = w->arg;
    return ps2_restarted_shard(w, 2, su->told[0], run_shard);
}

static int recover_world(const world_t *w)
{
    if (w->rank == 0)
        return run_shard(w, false);
    return w->rank == 1 ? restarted_shard(w) : recover_trainer(w);
}

static void test_recover(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_run_XXXXXX", prefix[64], cmd[96];
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/ck", dir);
    setup_t su = {.checkpoint = prefix};
    assert_int_equal(pipe2(su.told, O_CLOEXEC), 0);
    world_options_t o = {
        .world_size = 3, .fn = recover_world, .arg = &su, .own_init = true, .timeout_s = 90};
    int rc = world_run(&o);
    close(su.told[0]);
    close(su.told[1]);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(rc, 0);
}

/*  ---- bad options, no world ---- */

/*  Options spoilt the i-th way, and the text of their refusal; NULL
    past the last. */
static const char *spoil(zd_ps_run_options_t *o, int i)
{
    switch (i) {
    case 0:
        o->loss = NULL;
        return "zd_ps_model_run: no loss callback";
    case 1:
        o->batches = -1;
        return "zd_ps_model_run: batches < 0";
    case 2:
        o->registry = -2;
        return "zd_ps_model_run: registry < -1";
    case 3:
        o->max_staleness = 2; /* registry -1 */
        return "zd_ps_model_run: max_staleness without a registry";
    case 4:
        o->registry = 0;
        o->max_staleness = -1;
        return "zd_ps_model_run: max_staleness < 0";
    case 5:
        o->checkpoint_every = -2;
        return "zd_ps_model_run: checkpoint_every < 0";
    case 6:
        o->loss_limit = -1;
        return "zd_ps_model_run: loss_limit or loss_growth < 0";
    case 7:
        o->loss_growth = NAN;
        return "zd_ps_model_run: loss_limit or loss_growth < 0";
    case 8: /* a struct no zd_ps_run_options_default() set */
        o->size = 0;
        return "zd_ps_run_options_t.size is 0, not the size of a zd_ps_run_options_t";
    case 9: /* one that holds its size only */
        o->size = sizeof o->size;
        return "start from zd_ps_run_options_default()";
    default:
        return NULL;
    }
}

/*  Each way spoilt refused with ZD_ERR_ARGUMENT, its text saying what
    is wrong, *position 0, no callback called; NULL too. A model made
    before zd_rpc_init, as a trainer makes it: the refusals come before
    any call. (Run last: the model installs distributed autograd in this
    process, which the worlds' processes fork from.) */
static void test_bad_options(void **state)
{
    (void)state;
    zd_optim_config_t sgd = zd_optim_sgd_defaults(PS2_LR);
    zd_ps_model_t *model = zd_ps_model_new(shard_ranks, 2, &sgd, NULL);
    assert_non_null(model);
    trainer_t t = trainer_plain(NULL);
    const zd_ps_run_options_t good = run_options(&t, N_BATCHES);
    zd_ps_run_options_t o = good;
    const char *text;
    for (int i = 0; (text = spoil(&o, i)) != NULL; i++, o = good) {
        int64_t at = 7;
        zd_error_clear();
        assert_int_equal(zd_ps_model_run(model, &o, &at), -1);
        if (zd_error_code() != ZD_ERR_ARGUMENT || !strstr(zd_error_last(), text))
            fail_msg("way %d: expected \"%s\", got %s: %s", i, text,
                     zd_error_code_name(zd_error_code()), zd_error_last());
        assert_int_equal(at, 0);
        assert_int_equal(zd_ps_model_run(model, &o, NULL), -1); /* no position: the same */
        assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    }
    int64_t at = 7;
    assert_int_equal(zd_ps_model_run(NULL, &good, &at), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_ps_model_run: NULL"));
    assert_int_equal(at, 0);
    at = 7;
    assert_int_equal(zd_ps_model_run(model, NULL, &at), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(at, 0);
    assert_int_equal(t.n_ev + t.n_loss + t.n_back, 0);
    zd_ps_model_free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_diverging),
        cmocka_unit_test(test_registry_and_a_refusing_event),
        cmocka_unit_test(test_recover),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
