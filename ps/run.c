/* SPDX-License-Identifier: MIT */
/*  run.c: a trainer's loop over a remote model (zd_ps_model_run). The
    program gives each batch's loss; around the batches this file keeps
    the registry's book and gate, the checkpoints the trainer asks for,
    and the way back after a shard was lost: wait for it, then go on from
    where the stages say this trainer was, since a restarted stage lost
    every batch after its checkpoint. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <time.h>

#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "core/sized.h"
#include "ps/ps_private.h"

/*  RPC declares a peer lost about 1 s after its connection dropped: a
    call may fail before that, so a failure waits this long for a loss to
    explain it. */
#define LOST_WAIT_MS 5000

typedef struct {
    zd_ps_model_t *m;
    zd_ps_run_options_t o;
    int64_t done;     /* the position: batches done */
    int64_t trained;  /* batches this call trained */
    float first_loss; /* the first one's loss */
} run_t;

static bool may_be_loss(zd_error_code_t code)
{
    return code == ZD_ERR_PEER || code == ZD_ERR_TIMEOUT || code == ZD_ERR_STALE;
}

static int emit(run_t *r, zd_ps_run_event_t ev)
{
    return r->o.event ? r->o.event(r->o.arg, &ev) : 0;
}

/*  Sets the error to text and code: a failure keeps its own error
    through the calls made after it (a context's release, a report). */
static int keep_error(zd_error_code_t code, const char *text)
{
    return zd_error_set_code(code == ZD_OK ? ZD_ERR_OTHER : code, "%s", text);
}

/*  The batch at r->done in a context of its own; its loss into *loss. A
    loss that is not finite is refused before the backward: a model that
    diverged must not spread nan to every trainer through the shared
    weights. 0, or -1. */
static int batch(run_t *r, float *loss)
{
    zd_tensor_t *l = NULL;
    int64_t cid;
    if (zd_dist_autograd_context_begin(&cid) < 0)
        return -1;
    int rc = zd_ps_model_set_position(r->m, r->done);
    if (rc == 0)
        rc = r->o.loss(r->o.arg, r->m, r->done, &l);
    if (rc == 0 && (!l || zd_tensor_numel(l) != 1 || zd_tensor_dtype(l) != ZD_FLOAT32))
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "zd_ps_model_run: the loss callback gave no float32 scalar");
    if (rc == 0 && !isfinite(*loss = zd_tensor_data(l)[0]))
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "batch %" PRId64 ": the loss is %g: the model diverged, and this "
                               "batch's gradients were not applied%s%s",
                               r->done + 1, (double)*loss, r->o.diverging_hint ? ". " : "",
                               r->o.diverging_hint ? r->o.diverging_hint : "");
    if (rc == 0)
        rc = zd_ps_model_backward(r->m, cid, l);
    if (rc == 0 && r->o.backward)
        rc = r->o.backward(r->o.arg, r->done, cid);
    if (rc == 0)
        rc = zd_ps_model_step(r->m, cid);
    zd_tensor_unref(l);
    zd_error_code_t code = zd_error_code();
    char why[1024];
    snprintf(why, sizeof why, "%s", zd_error_last());
    /* the peers free the context while the next batch starts */
    if (zd_dist_autograd_context_release(cid) < 0 && rc == 0)
        return -1;
    return rc < 0 ? keep_error(code, why) : 0;
}

/*  A call failed. When a shard lost or started again (or the registry's
    host: ZD_ERR_PEER naming no shard) explains it and recover is set:
    waits for the shards to be back and at one generation, and for the
    registry to take this trainer again; then 1, r->done where the stages
    say. Else -1, the failure's error kept. */
static int recover(run_t *r)
{
    zd_error_code_t code = zd_error_code();
    char why[1024];
    snprintf(why, sizeof why, "%s", zd_error_last());
    /* A lost or restarted shard fails a call with these (a frozen one
       with a timeout; a checkpoint with ZD_ERR_STALE); any other failure
       (a shard's refusal, a callback's own) is no loss. */
    if (!r->o.recover || !may_be_loss(code))
        return keep_error(code, why);
    int shard = zd_ps_model_lost_shard(r->m, LOST_WAIT_MS);
    if (shard < 0 && code != ZD_ERR_PEER)
        return keep_error(code, why);
    zd_ps_run_event_t lost = {
        .kind = ZD_PS_RUN_LOST, .position = r->done, .shard = shard, .why = why};
    if (emit(r, lost) < 0)
        return -1;
    int64_t t0 = zd__now_ns(), deadline = zd__deadline_after(t0, r->o.recover_ms);
    /* the releases of contexts the old process held fail: it is gone */
    if (zd_dist_autograd_wait_releases(1000) < 0)
        zd__log(ZD_LOG_INFO, "ps: contexts of a lost shard's process not released: %s",
                zd_error_last());
    int64_t start = 0;
    for (;;) {
        bool never = deadline == ZD__NEVER;
        int64_t left = never ? ZD_TIMEOUT_NONE : zd__ms_left(zd__now_ns(), deadline);
        if (!never && left <= 0) {
            char who[48] = "a server shard";
            if (shard >= 0)
                snprintf(who, sizeof who, "server shard %d (rank %d)", shard,
                         zd__ps_model_rank(r->m, shard));
            return zd_error_set_code(ZD_ERR_TIMEOUT, "%s lost (%s) and not back within %.0f s: %s",
                                     who, why, (double)r->o.recover_ms / 1000, zd_error_last());
        }
        /* the registry's host, just back, may not take its calls yet */
        if (zd_ps_model_recover(r->m, left, &start) == 0 &&
            (r->o.registry < 0 ||
             zd_ps_trainer_started(r->o.registry, never ? ZD_TIMEOUT_DEFAULT : left) == 0))
            break;
        if (!may_be_loss(zd_error_code())) /* (a stage stopped, without the generation) */
            return -1;
        nanosleep(&(struct timespec){0, 100000000}, NULL);
    }
    zd_ps_run_event_t back = {
        .kind = ZD_PS_RUN_BACK, .position = start, .seconds = (double)(zd__now_ns() - t0) / 1e9};
    r->done = start;
    return emit(r, back) < 0 ? -1 : 1;
}

/*  The batches from r->done: 0 when they are done, 1 when a shard was
    lost and is back (r->done moved), -1. */
static int train(run_t *r)
{
    const zd_ps_run_options_t *o = &r->o;
    while (r->done < o->batches) {
        if (o->max_staleness > 0 &&
            zd_ps_trainer_gate(o->registry, r->done, o->max_staleness, o->timeout_ms, NULL) < 0) {
            if (zd_error_code() != ZD_ERR_TIMEOUT)
                return recover(r);
            zd__log(ZD_LOG_WARN,
                    "ps: waited the RPC timeout for the slowest trainer (max_staleness %" PRId64
                    "); going on",
                    o->max_staleness);
        }
        float loss = 0;
        if (batch(r, &loss) < 0)
            return recover(r);
        r->done++;
        if (++r->trained == 1)
            r->first_loss = loss;
        if ((o->loss_limit > 0 && loss > o->loss_limit) ||
            (o->loss_growth > 0 && r->first_loss > 0 && loss > o->loss_growth * r->first_loss))
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "batch %" PRId64 ": the loss is %g (the first batch's was "
                                     "%g): the model is diverging%s%s",
                                     r->done, (double)loss, (double)r->first_loss,
                                     o->diverging_hint ? ". " : "",
                                     o->diverging_hint ? o->diverging_hint : "");
        if (emit(r,
                 (zd_ps_run_event_t){.kind = ZD_PS_RUN_BATCH, .position = r->done, .loss = loss}) <
            0)
            return -1;
        if (o->checkpoint_every > 0 && r->done % o->checkpoint_every == 0 &&
            zd_ps_model_checkpoint(r->m, r->done, o->timeout_ms) < 0)
            return recover(r);
    }
    return 0;
}

/*  After the last batch: every context released, the registry told. 0,
    1 (a shard came back: train from r->done again), or -1. */
static int finish(run_t *r)
{
    if (emit(r, (zd_ps_run_event_t){.kind = ZD_PS_RUN_DONE, .position = r->done}) < 0)
        return -1;
    if (zd_dist_autograd_wait_releases(ZD_TIMEOUT_DEFAULT) < 0)
        return recover(r);
    if (r->o.registry >= 0 && zd_ps_trainer_finished(r->o.registry, r->o.timeout_ms) < 0)
        return recover(r);
    return 0;
}

static int check_options(const zd_ps_run_options_t *o)
{
    const char *bad = !o->loss                            ? "no loss callback"
        : o->batches < 0                                  ? "batches < 0"
        : o->registry < -1                                ? "registry < -1"
        : o->max_staleness < 0                            ? "max_staleness < 0"
        : o->max_staleness > 0 && o->registry < 0         ? "max_staleness without a registry"
        : o->checkpoint_every < 0                         ? "checkpoint_every < 0"
        : !(o->loss_limit >= 0) || !(o->loss_growth >= 0) ? "loss_limit or loss_growth < 0"
                                                          : NULL;
    return bad ? zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_run: %s", bad) : 0;
}

int zd_ps_model_run(zd_ps_model_t *m, const zd_ps_run_options_t *opts, int64_t *position)
{
    if (position)
        *position = 0;
    if (!m || !opts)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_ps_model_run: NULL");
    run_t r = {.m = m, .o = zd_ps_run_options_default()};
    if (zd__sized_read(&r.o, sizeof r.o, opts,
                       ZD__SIZE_THROUGH(zd_ps_run_options_t, diverging_hint), "zd_ps_run_options_t",
                       "zd_ps_run_options_default()") < 0 ||
        check_options(&r.o) < 0)
        return -1;
    int rc = 0;
    if (r.o.registry >= 0)
        rc = zd_ps_trainer_started(r.o.registry, r.o.timeout_ms);
    if (rc == 0 && r.o.resume && zd_ps_model_resume_position(m, r.o.timeout_ms, &r.done) < 0)
        rc = -1;
    r.done = r.done < 0 ? 0 : r.done;
    if (rc == 0 && r.done > r.o.batches)
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "resumed at batch %" PRId64 " (where the stages say this trainer "
                               "was), beyond the run's %" PRId64 " batches",
                               r.done, r.o.batches);
    if (rc == 0)
        rc = emit(&r, (zd_ps_run_event_t){.kind = ZD_PS_RUN_START, .position = r.done});
    while (rc == 0) {
        rc = train(&r);
        if (rc == 0 && (rc = finish(&r)) == 0)
            break;
        if (rc == 1)
            rc = 0;
    }
    if (rc < 0 && r.o.registry >= 0 && !zd_rpc_peer_is_lost(r.o.registry)) {
        /* the registry stops waiting for this trainer and names its error */
        zd_error_code_t code = zd_error_code();
        char why[1024];
        snprintf(why, sizeof why, "%s", zd_error_last());
        if (zd_ps_trainer_failed(r.o.registry, r.done, why, r.o.timeout_ms) < 0)
            zd__log(ZD_LOG_WARN, "ps: could not tell the server (rank %d) that this run failed: %s",
                    r.o.registry, zd_error_last());
        keep_error(code, why);
    }
    if (position)
        *position = r.done;
    return rc < 0 ? -1 : 0;
}
