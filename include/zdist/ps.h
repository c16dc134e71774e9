/* SPDX-License-Identifier: MIT */
/*  ps.h: parameter servers for any model, over N server shards: push/pull
    (Ray's and ps-lite's pattern, here) and the remote model (PyTorch's
    parameter-server tutorial, zd_ps_model_*, below).

        // every shard process, before zd_rpc_init:
        zd_optim_config_t sgd = zd_optim_sgd_defaults(0.05);
        zd_ps_server_t *srv = zd_ps_server_new(params, shard, n_shards, &sgd, &opts);
        // every trainer, after zd_rpc_init, holding a replica of the model:
        zd_ps_client_t *ps = zd_ps_client_new(replica, shard_ranks, n_shards, &opts);
        for (...) {
            zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT);   // the shards' parameters, into the replica
            ... forward, zd_autograd_backward ...
            zd_ps_client_push(ps, ZD_TIMEOUT_DEFAULT);   // the replica's .grad, to the shards
        }

    The parameters are named tensors (a module's: zd_ps_server_new_module,
    zd_ps_client_new_module). They are split over the shards by size, the
    same way in every process (zd_ps_split), and each shard steps its part
    with a local optimizer of its own (optim.h, any kind).

    Two modes (zd_ps_options_t.mode):
    - ZD_PS_SYNC, synchronous rounds (PyTorch's batch-update parameter
      server): a shard answers the pushes of a round when all num_trainers
      gradients are in, after one step with their mean; a push must carry
      the version of the parameters its trainer pulled. A trainer the
      shard heard from and that is then lost (zd_rpc_register_peer_lost)
      is no longer waited for, while min_trainers remain; it is waited for
      again once it calls again (it rejoined).
    - ZD_PS_ASYNC: every push is one step at once. A push computed on
      parameters older than the shard's version minus max_staleness is
      refused with ZD_ERR_STALE (pull and compute again).

    Checkpoints (checkpoint_path, checkpoint_every, resume): a shard
    writes its parameters, its optimizer's state and its version every
    checkpoint_every steps, each time as a new generation that replaces
    the last only once it is whole on disk (the one before is kept as
    ".prev"); a shard made with resume starts from the newest generation
    it can read (the older one when the newest is damaged, saying so),
    or from the given parameters when there is none. A shard made with a
    checkpoint_path first removes the temporary files its writes left
    there when their process died, and fails at once (ZD_ERR_ARGUMENT)
    when it cannot write there. A shard killed and
    started again this way rejoins the world (zd_rpc_init) and serves from
    its checkpoint's version: a trainer's push computed on a version it
    does not have is refused with ZD_ERR_STALE, and the trainer pulls.
    Synchronous shards, which write at the same versions, are brought to
    one generation: where one resumed from an older one than the others,
    a trainer's zd_ps_client_wait_shards (after the loss), its next pull
    (a shard that died and came back unseen) or
    zd_ps_client_resume_position (before the resumed run's first step)
    sends the others back to that version's checkpoint. A synchronous
    shard of a new run writes its version 0 when it is made, so that one
    started again before the first checkpoint can be joined at 0.

    Every push is checked on the shard before anything changes: names it
    serves, each once, all of them, float32 of the served shapes, finite
    (the error names the tensor and the element); a step that leaves a
    parameter not finite (a learning rate too high: the model diverges)
    is undone, from a copy of the parameters the shard keeps, and its
    pushes refused with ZD_ERR_ARGUMENT naming the tensor and element
    (a synchronous round whose mean overflows too). A refused round still
    counts as one (the version moves on, so that the shards, whose other
    parts of it were taken, keep one version per round), and the
    positions its pushes set go back. The optimizer's state (momentum)
    keeps the refused step: the trainers should stop on it. Trainer calls fail with
    a code a program can act on: ZD_ERR_PEER (a shard lost), ZD_ERR_STALE
    (a push refused as stale), ZD_ERR_STOPPED (the shard was told to stop:
    zd_ps_server_stop), ZD_ERR_TIMEOUT, ZD_ERR_ARGUMENT (a push refused:
    the text names the tensor). */
#ifndef ZDIST_PS_H
#define ZDIST_PS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <zdist/module.h>
#include <zdist/named_tensors.h>
#include <zdist/optim.h>
#include <zdist/rpc.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef enum {
    ZD_PS_ASYNC = 1, /* every push is a step at once, bounded by max_staleness */
    ZD_PS_SYNC,      /* a step per round of num_trainers pushes, with their mean */
} zd_ps_mode_t;

/*  The options shards and trainers share (both must use the same mode).
    Start from zd_ps_options_default(). */
typedef struct {
    size_t size;           /* set by zd_ps_options_default() */
    zd_ps_mode_t mode;     /* ZD_PS_ASYNC */
    int num_trainers;      /* ZD_PS_SYNC: pushes per round (1) */
    int64_t max_staleness; /* ZD_PS_ASYNC: a push may be this many versions behind the
                                shard; -1 (the default): any number */
    int min_trainers;      /* ZD_PS_SYNC: the fewest live trainers a round completes with,
                              once others were lost (1) */
    /* shards only: */
    const char *checkpoint_path; /* checkpoints go to "<checkpoint_path>.shard<K>" (NULL:
                                    none; copied) */
    int64_t checkpoint_every;    /* one every this many versions (0: only when
                                    zd_ps_server_checkpoint is called) */
    bool resume;                 /* start from the newest checkpoint there is, if any */
    /* Called after each step of the shard, with its new version (NULL:
       none), for progress and metrics (a synchronous round refused as
       diverged counts: the version moves on). It runs on an RPC thread with the
       shard locked: it must be short and must not call the shard's own
       zd_ps_server_* functions. */
    void (*on_step)(void *arg, int shard, int64_t version);
    void *on_step_arg;
    /* remote model (zd_ps_model_*), shards only: */
    int stage_outputs;       /* the tensors this shard's stage hands to the next stage (1) */
    int64_t max_input_numel; /* the most elements a forward's inputs may hold in all: a
                                peer cannot make the shard allocate without bound (1 << 24) */
    /* trainers only (zd_ps_client_step): */
    int64_t server_wait_ms; /* how long a step waits for a lost shard to come back
                               (ZD_TIMEOUT_DEFAULT: it does not wait; ZD_TIMEOUT_NONE: no
                               limit) */
    /* remote model, shards only: training forwards held at once until their
       backward reaches the stage or their graph is dropped; later ones wait
       in line, at most the RPC timeout (0: no limit). A trainer running k
       training forwards through a stage before its backward needs k slots:
       with fewer, its own next forward waits for the timeout. */
    int max_inflight;
    /* remote model, shards only: called for each forward the stage ran
       for a trainer, before its outputs go back: the caller's rank,
       whether it trains, and the inputs (borrowed, not to be changed);
       a forward refused (bad inputs, stale, stopped) or failed is not
       counted. For metrics and a program's book of its trainers
       (zd_ps_trainers_note_batch: samples per trainer). It runs on the
       forward's RPC thread, several at once, with nothing locked (NULL:
       none). */
    void (*on_forward)(void *arg, int shard, int caller, bool training, zd_tensor_t *const *in,
                       int n_in);
    void *on_forward_arg;
    /* shards with checkpoint_path: the run's configuration as text (say
       "--batch_size=32 --seed=7"), at most 4096 bytes, written into each
       checkpoint; a resume from a file of another one, or of none, is
       refused (ZD_ERR_ARGUMENT naming the file and both), so that a run
       does not go on from another's parameters and positions (NULL or
       "": none written, none checked; copied) */
    const char *run_tag;
    /* remote model, shards only: the stage's forward takes
       zd_dist_optim_read_lock() itself wherever it reads the parameters
       (a training forward that computes with a copy of them, taken under
       the lock once per step, as examples/ps_stages.c does; an evaluation
       that reads them all along). The shard then holds the steps off only
       while it checks and records a forward, not for the whole forward,
       and steps run beside forwards (false: for the whole forward) */
    bool stage_locks_reads;
} zd_ps_options_t;

/*  Asynchronous mode, no bound on staleness, with size set (inline: this
    program's size). Returns the struct. */
static inline zd_ps_options_t zd_ps_options_default(void)
{
    zd_ps_options_t o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.mode = ZD_PS_ASYNC;
    o.num_trainers = 1;
    o.max_staleness = -1;
    o.min_trainers = 1;
    o.stage_outputs = 1;
    o.max_input_numel = (int64_t)1 << 24;
    o.server_wait_ms = ZD_TIMEOUT_DEFAULT;
    return o;
}

/*  The split of params over n_shards, balanced by size: fills shard_of[i]
    (n entries, n = zd_named_tensors_len(params)) with the shard of
    tensor i. Depends on the names and sizes only, not on their order, so
    every process computes the same split. 0, or -1 (ZD_ERR_ARGUMENT). */
ZD_API int zd_ps_split(const zd_named_tensors_t *params, int n_shards, int *shard_of, int n);

/*  ---- server side ---- */

typedef struct zd_ps_server zd_ps_server_t;

/*  A server of shard `shard` of n_shards of params (float32; copied: the
    shard's part only, and held three times: the parameters, a round's
    sum, and the parameters before a step, to undo one that diverges),
    stepped by an optimizer made from optim, with opts (NULL: the
    defaults). Registers the shard's RPC functions, so call it before
    zd_rpc_init; free it after zd_rpc_shutdown. A process may serve
    several shards. A new object (zd_ps_server_free), or NULL
    (ZD_ERR_ARGUMENT: a bad shard, a tensor given twice (tied), a shard
    left without tensors, a bad config, a checkpoint_path it cannot
    write). */
ZD_API zd_ps_server_t *zd_ps_server_new(const zd_named_tensors_t *params, int shard, int n_shards,
                                        const zd_optim_config_t *optim,
                                        const zd_ps_options_t *opts);

/*  zd_ps_server_new over a module's parameters (each tensor once, under
    the name it was first seen with): a new object (zd_ps_server_free), or
    NULL. */
ZD_API zd_ps_server_t *zd_ps_server_new_module(const zd_nn_module_t *m, int shard, int n_shards,
                                               const zd_optim_config_t *optim,
                                               const zd_ps_options_t *opts);

/*  Writes the shard's checkpoint now: its parameters, its optimizer's
    state and its version, as the newest generation of
    "<checkpoint_path>.shard<K>" (the one before kept as ".prev"); nothing
    when the newest on disk is of this version already. 0, or -1:
    ZD_ERR_ARGUMENT (no checkpoint_path), or the file's error. */
ZD_API int zd_ps_server_checkpoint(zd_ps_server_t *s);

/*  Stops the shard: pushes waiting for their round, and every later push
    and pull, are answered with ZD_ERR_STOPPED. 0, or -1 for NULL. */
ZD_API int zd_ps_server_stop(zd_ps_server_t *s);

/*  The shard's version: the number of steps it took (and of synchronous
    rounds it refused as diverged, which count as rounds), counting those
    of the checkpoint it resumed or was sent back to. */
ZD_API int64_t zd_ps_server_version(zd_ps_server_t *s);

/*  What a shard did since it was made, for metrics (zd_ps_server_stats). */
typedef struct {
    int64_t version;  /* zd_ps_server_version */
    int64_t steps;    /* steps taken in this process (a synchronous round's is one) */
    int64_t pushes;   /* pushes whose gradients went into a step (push_pulls among them) */
    int64_t pulls;    /* pulls answered with the parameters */
    int64_t stale;    /* pushes refused as stale (ZD_ERR_STALE) */
    int64_t refused;  /* pushes refused as bad (ZD_ERR_ARGUMENT): a name, shape or dtype,
                         a value not finite, a push too many in a round */
    int64_t diverged; /* steps refused as diverged: undone, having left a parameter not
                         finite, or a synchronous round's mean not finite (their pushes
                         counted in neither of the above) */
    int64_t waiting;  /* ZD_PS_SYNC: pushes waiting for their round now */
} zd_ps_server_stats_t;

/*  The shard's counters into *out, a struct of size bytes (sizeof *out),
    written no further than size: zd_ps_server_stats(s, &st, sizeof st).
    0, or -1 (ZD_ERR_ARGUMENT: NULL, a size below this struct's; out is
    then left alone). */
ZD_API int zd_ps_server_stats(zd_ps_server_t *s, zd_ps_server_stats_t *out, size_t size);

/*  A copy of the shard's current parameters: a new object
    (zd_named_tensors_free), or NULL. */
ZD_API zd_named_tensors_t *zd_ps_server_params(zd_ps_server_t *s);

/*  Unregisters the shard's functions and frees it (NULL-safe). After
    zd_rpc_shutdown, or before zd_rpc_init. */
ZD_API void zd_ps_server_free(zd_ps_server_t *s);

/*  ---- trainer side ---- */

typedef struct zd_ps_client zd_ps_client_t;

/*  A trainer's client for the replica params (the list is borrowed; the
    client takes a reference to each tensor, pulls into it and pushes its
    .grad), served by the shards whose ranks are shard_ranks[0..n_shards-1]
    (NULL: ranks 0 to n_shards-1), with opts (NULL: the defaults; the
    shards' mode). Sends nothing yet. A new object (zd_ps_client_free), or
    NULL (ZD_ERR_ARGUMENT). */
ZD_API zd_ps_client_t *zd_ps_client_new(const zd_named_tensors_t *params, const int *shard_ranks,
                                        int n_shards, const zd_ps_options_t *opts);

/*  zd_ps_client_new over a module's parameters (each tensor once): a new
    object (zd_ps_client_free), or NULL. */
ZD_API zd_ps_client_t *zd_ps_client_new_module(zd_nn_module_t *m, const int *shard_ranks,
                                               int n_shards, const zd_ps_options_t *opts);

/*  Fetches the current parameters from every shard at once, waits for all
    (each answer up to timeout_ms; default zd_rpc_get_timeout()), checks
    them, and copies them into the replica. 0, or -1 with the replica
    unchanged: ZD_ERR_PEER (a shard lost: the text names it),
    ZD_ERR_STOPPED, ZD_ERR_TIMEOUT, ZD_ERR_REMOTE (a bad answer). */
ZD_API int zd_ps_client_pull(zd_ps_client_t *c, int64_t timeout_ms);

/*  Sends the replica's gradients (.grad of each tensor; all must have one)
    to their shards, tagged with the versions last pulled, and waits for
    every shard's answer (up to timeout_ms each; default
    zd_rpc_get_timeout()): in ZD_PS_SYNC mode, until the round is complete.
    0, or -1: ZD_ERR_STALE, ZD_ERR_PEER, ZD_ERR_STOPPED, ZD_ERR_TIMEOUT,
    ZD_ERR_ARGUMENT (refused: the text names the tensor). A shard that
    refused took nothing; the others may have taken theirs. */
ZD_API int zd_ps_client_push(zd_ps_client_t *c, int64_t timeout_ms);

/*  zd_ps_client_push, each shard answering with its parameters after the
    step its push was part of (ps-lite's PushPull; PyTorch's batch-update
    tutorial's update_and_fetch_model): the replica then holds them, as
    after zd_ps_client_pull, in one exchange instead of two (a shard short
    of memory answers as to a push, and they are pulled). 0, or -1 as
    zd_ps_client_push, or zd_ps_client_pull's errors for the answers (the
    replica unchanged when the push was refused). */
ZD_API int zd_ps_client_push_pull(zd_ps_client_t *c, int64_t timeout_ms);

/*  Waits until every shard is a live member of the world (after
    ZD_ERR_PEER: a lost shard started again, see Checkpoints above), up
    to timeout_ms in all (ZD_TIMEOUT_DEFAULT and ZD_TIMEOUT_NONE: no
    limit); pull next. In ZD_PS_SYNC mode, shards ahead of one that
    resumed from an older checkpoint then go back to that version's (see
    Checkpoints above; each call of that up to the RPC timeout). 0, or
    -1: ZD_ERR_TIMEOUT (naming the shard not back), ZD_ERR_NOT_INITIALIZED,
    ZD_ERR_ARGUMENT (a shard without that checkpoint, named), or a call's
    error (ZD_ERR_PEER, ZD_ERR_REMOTE, ZD_ERR_NO_MEMORY). */
ZD_API int zd_ps_client_wait_shards(zd_ps_client_t *c, int64_t timeout_ms);

/*  A trainer's work on the replica between a pull and a push: the
    forward and the backward, leaving each tensor's .grad. 0, or -1 with
    the error set. */
typedef int(zd_ps_compute_fn)(void *arg);

/*  One training step with the layer's recovery: clears the replica's
    gradients, pulls, runs compute(arg), pushes (each call up to
    timeout_ms). A push refused as stale is computed again on a new pull
    (up to 100 times in a row); after ZD_ERR_PEER the step waits up to
    opts.server_wait_ms for the shards to be back (logging which one it
    waits for), then starts again; compute's own failure ends it. 0, or
    -1 with the code of the call that failed last (ZD_ERR_STALE,
    ZD_ERR_PEER, ZD_ERR_STOPPED, ZD_ERR_TIMEOUT, ZD_ERR_ARGUMENT) or
    compute's error. */
ZD_API int zd_ps_client_step(zd_ps_client_t *c, zd_ps_compute_fn *compute, void *arg,
                             int64_t timeout_ms);

/*  Sets where the trainer is in its data (the batch it computes next,
    say): every later push carries it, each shard keeps the last one it
    took from this trainer's rank and writes it into its checkpoints. 0,
    or -1 (ZD_ERR_ARGUMENT: NULL, a negative position). */
ZD_API int zd_ps_client_set_position(zd_ps_client_t *c, int64_t position);

/*  Asks every shard where this trainer's rank was at its last push the
    shard took (kept through a shard's checkpoint and resume), for a
    trainer started again, or a run resumed, to go on from there: the
    smallest of the shards' answers into *position, or -1 when a shard
    has none (start from the beginning); synchronous shards of a resumed
    run none stepped in yet, or with a process new since this client last
    looked, are first brought to one generation (Checkpoints above). Each call up to
    timeout_ms (default zd_rpc_get_timeout()). 0, or -1 with *position
    -1: ZD_ERR_PEER, ZD_ERR_TIMEOUT, ZD_ERR_REMOTE, ZD_ERR_ARGUMENT (NULL;
    a shard without the generation, named). */
ZD_API int zd_ps_client_resume_position(zd_ps_client_t *c, int64_t timeout_ms, int64_t *position);

/*  How many pushes zd_ps_client_step saw refused as stale and computed
    again, in all (0 for NULL). */
ZD_API int64_t zd_ps_client_stale_pushes(const zd_ps_client_t *c);

/*  How many pulls found a shard's version lower than this client had
    seen it reach (0 for NULL): it resumed from a checkpoint, or was
    brought back to one, and the batches since are lost on it. A trainer that sees the count
    move asks zd_ps_client_resume_position where to go back to. */
ZD_API int64_t zd_ps_client_rollbacks(const zd_ps_client_t *c);

/*  The version of shard `shard`'s parameters in the replica: the last
    pull's (-1 before the first pull, or for a bad shard). */
ZD_API int64_t zd_ps_client_version(const zd_ps_client_t *c, int shard);

/*  Frees the client (NULL-safe); the replica stays the caller's. */
ZD_API void zd_ps_client_free(zd_ps_client_t *c);

/*  ---- remote model (PyTorch's parameter-server tutorial) ----

    The model lives on the shards, cut into stages run in order: shard K
    serves stage K, a module of its own (with one shard, the whole model,
    as in the tutorial). A trainer runs the forward through RPC, stage
    after stage (each stage's outputs are the next one's inputs), inside a
    distributed-autograd context; its backward reaches every stage, and a
    DistributedOptimizer over every stage's parameters steps them on their
    shards:

        // every shard process, before zd_rpc_init:
        zd_ps_model_server_t *srv = zd_ps_model_server_new(stage, shard, n_shards, &opts);
        // every trainer, before zd_rpc_init:
        zd_ps_model_t *model = zd_ps_model_new(shard_ranks, n_shards, &sgd, &opts);
        ZD_DIST_AUTOGRAD_CONTEXT(ctx) {
            zd_ps_model_forward(model, &x, 1, &y, 1, ZD_TIMEOUT_DEFAULT);
            ... loss ..., zd_ps_model_backward(model, ctx, loss);
            zd_ps_model_step(model, ctx);
        }

    Forwards of several trainers run at once; each reads the stage's
    parameters with the DistributedOptimizer's steps held off
    (zd_dist_optim_read_lock), so it never sees half a step; its backward
    on the shard holds them off too (zd_dist_optim_init installs that
    guard), so a step waits for the backwards running there. A backward
    after another trainer's step uses the new weights, as in PyTorch's
    asynchronous tutorial, but never a weight half written. Every
    forward's inputs are checked on the shard before the stage runs: at
    most 64 tensors, float32 (finite: the error names
    the input and the element) or int64 (indices), max_input_numel
    elements in all. A forward in evaluation mode (zd_ps_model_train)
    waits for the training forwards running, and they for it: a stage's
    mode is the module's. Trainer calls fail with ZD_ERR_PEER (a shard
    lost, named), ZD_ERR_STOPPED, ZD_ERR_TIMEOUT, ZD_ERR_ARGUMENT (inputs
    refused, the text says why) or ZD_ERR_REMOTE (the stage's own error,
    its text).

    Checkpoints (checkpoint_path, checkpoint_every, resume) work as for
    push/pull shards, on the stage's parameters: a shard writes one at
    the first forward once its version reaches a multiple of
    checkpoint_every, with the steps held off while it writes, and one
    made with resume starts its stage from the newest generation it can
    read, with the trainers' positions (zd_ps_model_set_position); the
    other stages go back to that generation (zd_ps_model_wait_shards),
    and a forward that meets a stage started again or gone back fails
    with ZD_ERR_PEER, so that every trainer goes back to its position.
    The optimizers' own state (momentum) lives in the trainers'
    DistributedOptimizers, not in it. */

typedef struct zd_ps_model_server zd_ps_model_server_t;

/*  Serves stage (borrowed: it must outlive the server, which runs and
    steps it in place) as stage `shard` of n_shards, with opts (NULL: the
    defaults). Installs distributed autograd and the DistributedOptimizer's
    functions and registers the stage's own; call it before zd_rpc_init,
    free it after zd_rpc_shutdown. With checkpoint_path and nothing to
    resume it writes the stage's version 0 there (an earlier run's files
    renamed ".earlier" first). A new object (zd_ps_model_server_free), or
    NULL (ZD_ERR_ARGUMENT: a bad shard, a stage without forward, bad
    options, a checkpoint_path it cannot write; a checkpoint file's or a
    registration's error). */
ZD_API zd_ps_model_server_t *zd_ps_model_server_new(zd_nn_module_t *stage, int shard, int n_shards,
                                                    const zd_ps_options_t *opts);

/*  Stops the stage: every later forward is answered with ZD_ERR_STOPPED
    (those running finish). 0, or -1 for NULL. */
ZD_API int zd_ps_model_server_stop(zd_ps_model_server_t *s);

/*  Writes the stage's checkpoint now (its parameters at its version, as
    the newest generation of "<checkpoint_path>.shard<K>": with
    checkpoint_every, its interval's, in place of one written in that
    interval; without, the one after its newest), with the steps held
    off while it writes; a no-op when another thread is writing one at
    that moment, when that version is on disk already, or while a
    trainer is bringing the stages to one generation. 0, or -1:
    ZD_ERR_ARGUMENT (NULL, no checkpoint_path), or the file's error. */
ZD_API int zd_ps_model_server_checkpoint(zd_ps_model_server_t *s);

/*  The stage's version: the steps the DistributedOptimizers took in this
    process (zd_dist_optim_version), plus the version it resumed from; -1
    for NULL. */
ZD_API int64_t zd_ps_model_server_version(zd_ps_model_server_t *s);

/*  The training forwards holding one of the stage's max_inflight slots
    now, and into *waiting (if not NULL) those waiting for one; 0 and 0
    without a limit or for NULL. */
ZD_API int zd_ps_model_server_inflight(zd_ps_model_server_t *s, int *waiting);

/*  The forwards the stage ran (training and evaluation), or -1 for NULL. */
ZD_API int64_t zd_ps_model_server_forwards(zd_ps_model_server_t *s);

/*  A copy of the stage's parameters now, under their names in the stage
    (no step half taken in it): for a program to save or export the
    trained stage. A new object (zd_named_tensors_free), or NULL
    (ZD_ERR_ARGUMENT for NULL, ZD_ERR_NO_MEMORY). */
ZD_API zd_named_tensors_t *zd_ps_model_server_params(zd_ps_model_server_t *s);

/*  Unregisters the stage's functions and frees the server, not the stage
    (NULL-safe). After zd_rpc_shutdown, or before zd_rpc_init. */
ZD_API void zd_ps_model_server_free(zd_ps_model_server_t *s);

typedef struct zd_ps_model zd_ps_model_t;

/*  A trainer's handle on the model whose stages the shards at
    shard_ranks[0..n_shards-1] (NULL: ranks 0 to n_shards-1) serve,
    stepped by a DistributedOptimizer made from optim. Installs
    distributed autograd, so call it before zd_rpc_init; it sends nothing
    yet (the first forward or step fetches the parameters' RRefs and makes
    the optimizer). One thread at a time. A new object (zd_ps_model_free),
    or NULL (ZD_ERR_ARGUMENT). */
ZD_API zd_ps_model_t *zd_ps_model_new(const int *shard_ranks, int n_shards,
                                      const zd_optim_config_t *optim, const zd_ps_options_t *opts);

/*  Runs the model's forward on the n_in inputs (borrowed), stage after
    stage, each call up to timeout_ms (default zd_rpc_get_timeout()), and
    gives the last stage's first n_out outputs in out (new references).
    Recorded by distributed autograd inside a context. The first forward,
    and the first after ZD_ERR_PEER, first bring the stages to one
    generation (zd_ps_model_wait_shards). 0, or -1 with out NULL: the
    codes above, the text naming the stage's shard (ZD_ERR_PEER also for
    a stage started again, or gone back to a checkpoint, since this
    trainer's optimizer was made). */
ZD_API int zd_ps_model_forward(zd_ps_model_t *m, zd_tensor_t *const *in, int n_in,
                               zd_tensor_t **out, int n_out, int64_t timeout_ms);

/*  Runs distributed autograd's backward from loss (borrowed, a scalar of
    the last forward) in context_id through every stage that forward
    went to (PyTorch's dist_autograd.backward(context_id, [loss])),
    leaving the gradients on the stages' shards for zd_ps_model_step. 0,
    or -1: ZD_ERR_ARGUMENT (NULL), ZD_ERR_PEER naming a stage lost
    (recover as after a forward's), or zd_dist_autograd_backward's
    error. */
ZD_API int zd_ps_model_backward(zd_ps_model_t *m, int64_t context_id, zd_tensor_t *loss);

/*  Steps every stage's parameters with the gradients of context_id, on
    their shards (zd_dist_optim_step). 0, or -1 naming the shard
    (ZD_ERR_PEER also for a stage gone back to a checkpoint since the
    batch's forward, which refuses the step). */
ZD_API int zd_ps_model_step(zd_ps_model_t *m, int64_t context_id);

/*  Waits until every shard is a live member of the world (after
    ZD_ERR_PEER: a lost shard started again, its stage resumed from its
    checkpoint), up to timeout_ms in all (ZD_TIMEOUT_DEFAULT and
    ZD_TIMEOUT_NONE: no limit), then sends the other stages back to the
    generation it resumed from (their newest checkpoint or the one
    before), each call up to the RPC timeout: go on from
    zd_ps_model_resume_position. A shard's new process is known by its
    answers, and the next forward makes the DistributedOptimizer again
    over its parameters (its state, momentum, starts over). 0, or -1:
    ZD_ERR_TIMEOUT (the shard not back, named; the stages kept changing),
    ZD_ERR_NOT_INITIALIZED, ZD_ERR_ARGUMENT (NULL; a stage without that
    generation, or of 1.0, named; stages of different checkpoint_every),
    or a call's error (ZD_ERR_PEER, ZD_ERR_STOPPED, ZD_ERR_REMOTE,
    ZD_ERR_NO_MEMORY). */
ZD_API int zd_ps_model_wait_shards(zd_ps_model_t *m, int64_t timeout_ms);

/*  Sets where the trainer is in its data (the batch it computes next,
    say): every later training forward carries it, each stage keeps the
    last one it served this trainer's rank and writes it into its
    checkpoints. Call it before each batch's forward, after the step of
    the batch before: a stage then holds every batch before the position
    it keeps, as long as it was not started again meanwhile (after
    zd_ps_model_wait_shards, ask zd_ps_model_resume_position and go back
    there: the restarted stage lost the batches after its checkpoint). 0,
    or -1 (ZD_ERR_ARGUMENT: NULL, a negative position). */
ZD_API int zd_ps_model_set_position(zd_ps_model_t *m, int64_t position);

/*  A checkpoint the trainer asks for, of stages whose shards write only
    those (checkpoint_every 0): every stage records that this trainer is
    at `position` of its data (the batch it computes next: call it after
    a batch's step) and writes its generation now (again, in place, when
    its version is on disk but a position moved), as PyTorch programs
    call torch.save. Every stage is first asked whether it would, so
    that none writes when one refuses. A run resumed from these files
    goes on from `position` (zd_ps_model_resume_position). The files of
    one call are one generation (one after the newest when every stage
    holds it; else the newest, completed), even at versions another
    trainer's steps between the writes made differ. Sets the position
    the next forwards carry too. Each call up to timeout_ms (default
    zd_rpc_get_timeout()). 0, or -1 naming the first stage that failed:
    ZD_ERR_ARGUMENT (NULL, a negative position, a stage without
    checkpoint_path or with checkpoint_every), ZD_ERR_STALE (no step yet
    over the stages as they are: a new handle, or a stage lost, started
    again or gone back since, or going back now: zd_ps_model_wait_shards
    and zd_ps_model_resume_position, a batch, then a checkpoint; another
    trainer's newer generation met by three tries in a row: call it
    again),
    ZD_ERR_REMOTE (a stage's write failed: a full disk, its text; the
    stages before it wrote theirs, a generation the others lack: call it
    again, which completes it, until it succeeds, or stop),
    ZD_ERR_STOPPED, ZD_ERR_PEER, ZD_ERR_TIMEOUT. */
ZD_API int zd_ps_model_checkpoint(zd_ps_model_t *m, int64_t position, int64_t timeout_ms);

/*  Asks every stage where this trainer's rank was at its last training
    forward there (kept through a stage's checkpoint and resume), for a
    trainer started again, or a run resumed, to go on from there: the
    smallest of the stages' answers into *position, or -1 when a stage
    has none (start from the beginning); stages of a resumed run at
    different generations are first brought to the oldest (as
    zd_ps_model_wait_shards does). Each call up to timeout_ms (default
    zd_rpc_get_timeout()). 0, or -1 with *position -1: ZD_ERR_PEER,
    ZD_ERR_TIMEOUT, ZD_ERR_REMOTE, ZD_ERR_ARGUMENT (NULL; a stage without
    the generation, named). */
ZD_API int zd_ps_model_resume_position(zd_ps_model_t *m, int64_t timeout_ms, int64_t *position);

/*  After a call failed: the stage whose shard was lost, or started again
    (zd_rpc_peer_joins), since the stages were last brought to one
    generation, waiting up to timeout_ms (ZD_TIMEOUT_NONE and
    ZD_TIMEOUT_DEFAULT: no limit) for RPC to declare a shard whose
    connection just dropped lost. The stage, or -1: ZD_ERR_TIMEOUT (none:
    the failure was not a shard's loss), ZD_ERR_ARGUMENT (NULL). */
ZD_API int zd_ps_model_lost_shard(zd_ps_model_t *m, int64_t timeout_ms);

/*  After ZD_ERR_PEER: zd_ps_model_wait_shards, then
    zd_ps_model_resume_position, asked again (a shard just back may not
    take calls from everyone yet, or was lost again) until both succeed
    or timeout_ms is up (ZD_TIMEOUT_NONE and ZD_TIMEOUT_DEFAULT: no
    limit): 0 with *position where this trainer goes on from (0: its
    beginning), or -1 with *position -1: ZD_ERR_TIMEOUT (the last
    error's text), ZD_ERR_ARGUMENT (NULL; a stage without the
    generation), ZD_ERR_NOT_INITIALIZED, ZD_ERR_STOPPED, ZD_ERR_REMOTE. */
ZD_API int zd_ps_model_recover(zd_ps_model_t *m, int64_t timeout_ms, int64_t *position);

/*  Sets the mode the next forwards run the stages in (training: dropout
    on; PyTorch's model.train(mode)); returns the previous one. Training
    is the default. */
ZD_API bool zd_ps_model_train(zd_ps_model_t *m, bool training);

/*  Releases the optimizer and the parameters' RRefs and frees the handle
    (NULL-safe); before zd_rpc_shutdown, so that the shards free their
    optimizers. */
ZD_API void zd_ps_model_free(zd_ps_model_t *m);

/*  ---- the trainers' registry ----

    One process of the servers (rank 0, say) keeps the book of the
    trainers (ranks first_trainer and up): which started, finished,
    failed (saying why) or were lost and came back. With it a server
    knows when every trainer is done, lost ones included, instead of
    waiting out a timeout; a trainer can be held at most `bound` batches
    ahead of the slowest one still training (the stale-synchronous
    bound); and every trainer's last call gets one shared result,
    computed once when the last of them asks (the final evaluation):

        // the host, before zd_rpc_init:
        zd_ps_trainers_options_t to = zd_ps_trainers_options_default();
        to.first_trainer = n_shards;
        to.shared_result = evaluate;        // zd_value_t *evaluate(void *arg, const zd_value_t *request)
        zd_ps_trainers_t *reg = zd_ps_trainers_new(&to);
        ... serve ...; zd_ps_trainers_wait(reg, lost_wait_ms, ZD_TIMEOUT_NONE);
        // every trainer:
        zd_ps_trainer_started(0, ZD_TIMEOUT_DEFAULT);
        for (b = 0; ...; b++) { zd_ps_trainer_gate(0, b, 2, ZD_TIMEOUT_DEFAULT, NULL); ... }
        zd_ps_trainer_finished(0, ZD_TIMEOUT_DEFAULT);
        zd_ps_trainer_wait_all(0, request, ZD_TIMEOUT_DEFAULT, &accuracy);

    A trainer restarted in a lost one's place (it rejoined) counts again,
    from 0 batches; one that said it failed (zd_ps_trainer_failed) is no
    longer waited for. */

typedef enum {
    ZD_PS_TRAINER_STARTED = 1, /* zd_ps_trainer_started */
    ZD_PS_TRAINER_FINISHED,    /* zd_ps_trainer_finished */
    ZD_PS_TRAINER_FAILED,      /* zd_ps_trainer_failed: info->why, info->failed_at */
    ZD_PS_TRAINER_LOST,        /* declared lost (zd_rpc_register_peer_lost) */
    ZD_PS_TRAINER_REJOINED,    /* a process in its place joined (info: the state it was
                                  lost in) */
    ZD_PS_TRAINER_WAITING,     /* zd_ps_trainer_wait_all arrived */
} zd_ps_trainer_event_t;

/*  What the registry knows of one trainer. */
typedef struct {
    int rank;
    bool started, finished, failed, lost, rejoined;
    int64_t batches;   /* zd_ps_trainers_note_batch calls since it (re)joined */
    int64_t failed_at; /* the batch it said it failed at */
    char why[400];     /* its failure's text (control bytes replaced by '?') */
} zd_ps_trainer_info_t;

/*  The registry's options. Start from zd_ps_trainers_options_default(). */
typedef struct {
    size_t size;       /* set by zd_ps_trainers_options_default() */
    int first_trainer; /* the trainers are ranks first_trainer and up; the ranks below
                          are servers (1) */
    /* Called at each event with the trainer's state and its worker name,
       on an RPC thread with the registry locked: short, and no calls of
       the registry (NULL: none). */
    void (*on_event)(void *arg, const zd_ps_trainer_info_t *info, const char *name,
                     zd_ps_trainer_event_t event);
    void *on_event_arg;
    /* The result every zd_ps_trainer_wait_all gets, computed once when
       each trainer is waiting, failed or lost, from the last caller's
       request (borrowed): a new value, or NULL with the error set, which
       each waiting trainer gets. Runs on an RPC thread (the one that
       brought the last news: a trainer's call, or a loss), with the
       registry unlocked: it may call zd_ps_trainers_get; a trainer that
       asks again meanwhile may start another (NULL: none is the
       result). */
    zd_value_t *(*shared_result)(void *arg, const zd_value_t *request);
    void *shared_result_arg;
} zd_ps_trainers_options_t;

/*  first_trainer 1, no callbacks, with size set (inline: this program's
    size). Returns the struct. */
static inline zd_ps_trainers_options_t zd_ps_trainers_options_default(void)
{
    zd_ps_trainers_options_t o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.first_trainer = 1;
    return o;
}

typedef struct zd_ps_trainers zd_ps_trainers_t;

/*  The registry of this process (one at a time), with opts (NULL: the
    defaults); registers its functions, so call it before zd_rpc_init. A
    new object (zd_ps_trainers_free), or NULL (ZD_ERR_ARGUMENT: bad
    options, a registry already; ZD_ERR_NO_MEMORY; a registration's
    error). */
ZD_API zd_ps_trainers_t *zd_ps_trainers_new(const zd_ps_trainers_options_t *opts);

/*  Counts one batch of `samples` for trainer rank (the server calls it
    as it serves one, RPC running): the batch count the events carry, and
    the throughput. Ranks that are not trainers are ignored (with the
    error set). */
ZD_API void zd_ps_trainers_note_batch(zd_ps_trainers_t *r, int rank, int64_t samples);

/*  Waits until every trainer has finished, said it failed, or was lost
    and has not come back within lost_wait_ms, up to timeout_ms
    (ZD_TIMEOUT_NONE and ZD_TIMEOUT_DEFAULT: no limit); call it before a
    graceful zd_rpc_shutdown, which stops taking back restarted trainers.
    0, or -1: ZD_ERR_PEER (another server rank lost for longer than
    lost_wait_ms and 1 s: its trainers gave up), ZD_ERR_TIMEOUT,
    ZD_ERR_ARGUMENT (NULL), ZD_ERR_NO_MEMORY. */
ZD_API int zd_ps_trainers_wait(zd_ps_trainers_t *r, int64_t lost_wait_ms, int64_t timeout_ms);

/*  What the registry knows of trainer rank, into *info. 0, or -1
    (ZD_ERR_ARGUMENT: NULL, not a trainer; ZD_ERR_NOT_INITIALIZED: no
    trainer called yet and RPC is not running; ZD_ERR_NO_MEMORY). */
ZD_API int zd_ps_trainers_get(zd_ps_trainers_t *r, int rank, zd_ps_trainer_info_t *info);

/*  The samples of every noted batch (lost trainers' too), and the seconds
    from the first trainer's start to the last finish or noted batch,
    whichever came later, into *samples and *seconds (0 before any, and
    for a NULL registry). */
ZD_API void zd_ps_trainers_throughput(zd_ps_trainers_t *r, int64_t *samples, double *seconds);

/*  Unregisters the registry's functions, fails the calls still waiting
    ("the server stopped") and frees it (NULL-safe). After
    zd_rpc_shutdown, or before zd_rpc_init: its handlers must not be
    running. */
ZD_API void zd_ps_trainers_free(zd_ps_trainers_t *r);

/*  A trainer tells the registry on rank host it started. 0, or -1 with
    the call's error (each call below too; timeout_ms as zd_rpc_sync).
    The calls below but zd_ps_trainer_failed then fail with ZD_ERR_PEER,
    sending nothing, once host was lost and started again
    (zd_rpc_peer_joins): its new book never heard of this trainer, which
    calls zd_ps_trainer_started again. */
ZD_API int zd_ps_trainer_started(int host, int64_t timeout_ms);

/*  A trainer tells the registry it finished its batches. 0, or -1. */
ZD_API int zd_ps_trainer_finished(int host, int64_t timeout_ms);

/*  A trainer tells the registry its run failed at batch `batches`, with
    why (its error's text): it is no longer waited for. 0, or -1. */
ZD_API int zd_ps_trainer_failed(int host, int64_t batches, const char *why, int64_t timeout_ms);

/*  Waits until this trainer, having done `done` batches, is at most
    bound (>= 0) batches ahead of the slowest trainer still training
    (finished, failed and lost ones do not count); its lead then into
    *lead (if not NULL). A trainer that went on after a timeout parks its
    next gate in place of the old one. 0, or -1: ZD_ERR_TIMEOUT (the
    slowest did not catch up in time), ZD_ERR_PEER, ZD_ERR_REMOTE (the
    registry refused: the text says why). */
ZD_API int zd_ps_trainer_gate(int host, int64_t done, int64_t bound, int64_t timeout_ms,
                              int64_t *lead);

/*  Waits for the shared result (zd_ps_trainers_options_t.shared_result),
    sending request (borrowed; NULL: none) for it; a rank waits once at
    a time (its next call replaces the first). 0 with *result a new
    reference, or -1 (ZD_ERR_REMOTE: the result's error). */
ZD_API int zd_ps_trainer_wait_all(int host, zd_value_t *request, int64_t timeout_ms,
                                  zd_value_t **result);

/*  ---- a trainer's loop (the tutorial's run_training_loop) ----

    zd_ps_model_run trains a remote model batch after batch, the program
    giving each batch's loss, with what a long run needs around the
    batches: the registry told of the start, the end and a failure; the
    stale-synchronous gate; checkpoints every checkpoint_every batches;
    and, after a shard is lost or started again, the wait for it and the
    way back to where the stages say this trainer was:

        zd_ps_run_options_t ro = zd_ps_run_options_default();
        ro.batches = n;  ro.loss = batch_loss;  ro.event = on_event;  ro.arg = &me;
        ro.registry = 0;  ro.checkpoint_every = 100;  ro.recover = true;
        if (zd_ps_model_run(model, &ro, &done) < 0) ... the error ...

    A position counts batches: the batch at position p is the (p+1)th this
    trainer trains, and after it p+1 batches are done. */

typedef enum {
    ZD_PS_RUN_START = 1, /* about to train from position (resumed, or 0) */
    ZD_PS_RUN_BATCH,     /* a batch stepped: position batches done, loss its loss */
    ZD_PS_RUN_LOST,      /* a call failed at position: shard lost (-1: unnamed), why */
    ZD_PS_RUN_BACK,      /* the shards are back after seconds: on from position */
    ZD_PS_RUN_DONE,      /* every batch trained (position of them): the registry is told next */
} zd_ps_run_event_kind_t;

/*  An event of zd_ps_model_run, given to the program's event callback. */
typedef struct {
    zd_ps_run_event_kind_t kind;
    int64_t position;
    float loss;      /* ZD_PS_RUN_BATCH */
    int shard;       /* ZD_PS_RUN_LOST: the stage lost or started again, or -1 */
    const char *why; /* ZD_PS_RUN_LOST: the failure's text (borrowed for the call) */
    double seconds;  /* ZD_PS_RUN_BACK: how long the trainer waited */
} zd_ps_run_event_t;

/*  The batch at position: runs its forward through m (zd_ps_model_forward,
    inside the batch's context) and gives its loss, a scalar, in *loss (a
    new reference; float32). 0, or -1 with the error set (recovered from
    only for ZD_ERR_PEER, ZD_ERR_TIMEOUT and ZD_ERR_STALE: a lost shard's
    codes). */
typedef int zd_ps_loss_fn(void *arg, zd_ps_model_t *m, int64_t position, zd_tensor_t **loss);

/*  Called after the batch's backward, before its step, with its context
    (to look at the gradients on the shards, say). 0, or -1 to fail the
    run. */
typedef int zd_ps_backward_fn(void *arg, int64_t position, int64_t context_id);

/*  Called at each event. 0, or -1 with the error set to fail the run
    (a diverging loss, an evaluation that failed). */
typedef int zd_ps_run_event_fn(void *arg, const zd_ps_run_event_t *event);

/*  What zd_ps_model_run does. Start from zd_ps_run_options_default(). */
typedef struct {
    size_t size;                 /* set by zd_ps_run_options_default() */
    int64_t batches;             /* train up to this position (0: none; the registry told) */
    zd_ps_loss_fn *loss;         /* required */
    zd_ps_backward_fn *backward; /* NULL: none */
    zd_ps_run_event_fn *event;   /* NULL: none */
    void *arg;                   /* the callbacks' */
    int registry;                /* the rank hosting zd_ps_trainers_t (-1: none) */
    int64_t max_staleness;       /* zd_ps_trainer_gate's bound (0: none; needs registry) */
    int64_t checkpoint_every;    /* zd_ps_model_checkpoint every N batches (0: none) */
    bool resume;                 /* start at zd_ps_model_resume_position (else 0) */
    bool recover;                /* after a shard lost: wait, go back (else fail) */
    int64_t recover_ms;          /* at most this long (ZD_TIMEOUT_NONE: no limit) */
    int64_t timeout_ms;          /* each call (ZD_TIMEOUT_DEFAULT: the RPC timeout) */
    /* A loss above loss_limit, or loss_growth times this run's first,
       stops the run: the model is diverging while still finite (0: no
       such bound; a loss not finite always stops it, before its step). */
    double loss_limit, loss_growth;
    const char *diverging_hint; /* added to those errors (a remedy; NULL: none) */
} zd_ps_run_options_t;

/*  No registry, no checkpoints, no recovery, with size set (inline: this
    program's size). Returns the struct. */
static inline zd_ps_run_options_t zd_ps_run_options_default(void)
{
    zd_ps_run_options_t o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.registry = -1;
    o.timeout_ms = ZD_TIMEOUT_DEFAULT;
    return o;
}

/*  Trains m from position 0 (resume: where the stages say) to
    opts->batches, each batch inside its own distributed-autograd context
    (loss, a finite one, then backward, the backward callback, step),
    then tells the registry it finished. With recover, a failure that a
    lost or restarted shard (or registry) explains (ZD_ERR_PEER,
    ZD_ERR_TIMEOUT, ZD_ERR_STALE, and the shard lost) is waited for up to
    recover_ms, and training goes on from where the stages then say
    (events ZD_PS_RUN_LOST and ZD_PS_RUN_BACK); a staleness gate that
    times out is logged and passed. On failure it tells the registry why
    (zd_ps_trainer_failed). 0 with *position (if not NULL) the batches
    done, or -1 with the error: ZD_ERR_ARGUMENT (NULL, bad options; a
    resumed position beyond batches; a diverging loss, named with its
    batch; the callbacks' own),
    ZD_ERR_TIMEOUT (a shard not back in time, named), or a call's
    error. */
ZD_API int zd_ps_model_run(zd_ps_model_t *m, const zd_ps_run_options_t *opts, int64_t *position);

ZD_END_DECLS

#endif
