/* SPDX-License-Identifier: MIT */
/*  ps_private.h: a push/pull shard, shared by shard.c (serving) and
    checkpoint.c (its files), and what the shard, the client (client.c)
    and the remote model (model.c) share (ps.c). */
#ifndef ZDIST_PS_PRIVATE_H
#define ZDIST_PS_PRIVATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <zdist/ps.h>

struct zd_ps_server {
    int shard, n_shards;
    zd_ps_options_t opts;
    char fn_pull[32], fn_push[32], fn_push_pull[32], fn_where[32], fn_back[32];
    int n;                /* tensors served */
    char **names;         /* theirs */
    zd_tensor_t **params; /* the shard's own copies, stepped by opt */
    zd_tensor_t **before; /* theirs before the step being taken: a refused step goes back */
    bool *all;            /* n times true: every name is expected */
    zd_optim_t *opt;

    pthread_mutex_t lock; /* everything below; steps and pulls too */
    int64_t version;
    zd_ps_server_stats_t stats; /* the counters (version and waiting: filled when read) */
    bool stopped;
    /* ZD_PS_SYNC: the round being gathered */
    zd_tensor_t **sums;    /* the round's sum of gradients, per tensor */
    int n_pushed;          /* pushes in the round (at most 2 x num_trainers) */
    int *pushed_by;        /* their callers' ranks; -1: a process since lost */
    zd_future_t **waiting; /* their answers, completed with the round */
    bool *fetch;           /* theirs: answered with the parameters (push_pull) */
    int *round_rank;       /* theirs: the caller's rank (kept when it is lost) */
    int64_t *round_was;    /* theirs: the caller's position before the push, put back
                              when the round is refused */
    /* ZD_PS_SYNC: the trainers this shard has heard from, by rank, and
       how many of them are lost now (not waited for) */
    uint8_t *trainer; /* TRAINER_*; world size entries, made at the first call */
    int n_ranks;
    int n_lost;
    zd_ps_server_t *next; /* in the list of shards told of lost peers */
    /* checkpoints (checkpoint.c) */
    char *ckpt_path;      /* "<checkpoint_path>.shard<K>", or NULL: none */
    char *run_tag;        /* the options' run_tag (a copy), or NULL: none */
    int64_t ckpt_version; /* the version last written or resumed from; -1: none */
    int64_t ckpt_before;  /* the version of the generation before it; -1: none */
    bool fresh;           /* resumed (or gone back) from a checkpoint, no push taken since */
    int64_t epoch;        /* times it resumed or went back: a compare-and-set's tag */
    /* where each trainer was in its data at its last push taken
       (zd_ps_client_set_position), by rank; -1: none. Checkpointed. */
    int64_t *positions;
    int n_positions;
    /* ZD_PS_SYNC, resumed: the ranks its checkpoint knew as trainers,
       marked in the trainer table when it is made (the lost ones lost:
       this process never heard of their loss) */
    int64_t *known;
    int n_known;
};

enum { TRAINER_UNKNOWN, TRAINER_LIVE, TRAINER_LOST };

/*  The most tensors a remote model's forward takes or gives at a stage. */
#define ZD__PS_MAX_TENSORS 64
/*  The longest run_tag (zd_ps_options_t), in bytes. */
#define ZD__PS_MAX_TAG 4096

/*  A remote-model stage's slots for training forwards (inflight.c). */
typedef struct zd__ps_gate zd__ps_gate_t;

/*  A gate of max > 0 slots: a new reference (zd__ps_gate_unref), or NULL. */
zd__ps_gate_t *zd__ps_gate_new(int max);
void zd__ps_gate_unref(zd__ps_gate_t *g);

/*  Takes a slot, waiting in line (at most the RPC timeout) when all are
    taken: true when the caller holds one, false when it goes ahead
    without (it waited the timeout; logged once, naming the stage). */
bool zd__ps_gate_enter(zd__ps_gate_t *g, int shard);

/*  Gives a slot back: to the first waiting forward, else to the gate. */
void zd__ps_gate_leave(zd__ps_gate_t *g);

/*  The stage stopped: every waiting forward goes on at once without a
    slot (to be answered ZD_ERR_STOPPED), and later ones do not wait. */
void zd__ps_gate_stop(zd__ps_gate_t *g);

/*  Slots held, and (into *waiting, if not NULL) forwards waiting for one. */
int zd__ps_gate_used(zd__ps_gate_t *g, int *waiting);

/*  Hands the caller's slot to a node over the forward's outputs out[0..n)
    (those that require grad are replaced by views recorded through it),
    which gives it back when the backward reaches them or the graph goes;
    when none requires grad, gives it back at once. 0, or -1 (out of
    memory; the slot given back, out unchanged). */
int zd__ps_gate_hold(zd__ps_gate_t *g, zd_tensor_t **out, int n);

/*  A push/pull shard's functions, each name followed by the shard's
    number (shard.c serves them, client.c calls them). */
#define ZD__PS_FN_PULL      "__zd_ps_pull_"
#define ZD__PS_FN_PUSH      "__zd_ps_push_"
#define ZD__PS_FN_PUSH_PULL "__zd_ps_pushpull_"
#define ZD__PS_FN_WHERE     "__zd_ps_where_"
#define ZD__PS_FN_BACK      "__zd_ps_back_"

/*  The tensors a process gives to serve or to replicate, checked:
    float32, each tensor once (a tied tensor under two names would be
    stepped twice). who names the caller in the error. 0, or -1. */
int zd__ps_check_params(const zd_named_tensors_t *params, const char *who);

/*  zd_ps_split of params, checked to leave no shard empty: a new array
    (free), or NULL. */
int *zd__ps_split_checked(const zd_named_tensors_t *params, int n_shards, const char *who);

/*  A module's parameters, each tensor once: a new object, or NULL. */
zd_named_tensors_t *zd__ps_module_params(const zd_nn_module_t *m);

/*  Reads the (name, tensor) pairs of list from item `from` on, for the
    n tensors `names`/`like` (want[i] false: not expected here, as an
    unknown name): got[i] borrowed from list. Each expected name exactly
    once, each tensor float32 of its like's shape and finite. 0, or -1
    (ZD_ERR_ARGUMENT naming what is wrong). */
int zd__ps_read_pairs(const zd_value_t *list, size_t from, char *const *names,
                      zd_tensor_t *const *like, const bool *want, int n, zd_tensor_t **got);

/*  *o: the defaults, overwritten by in (NULL: none) up to its size, then
    checked. 0, or -1 (ZD_ERR_ARGUMENT naming the field). */
int zd__ps_options_read(zd_ps_options_t *o, const zd_ps_options_t *in);

/*  Waits until the n ranks are live members, up to timeout_ms in all
    (ZD_TIMEOUT_DEFAULT and ZD_TIMEOUT_NONE: no limit): 0, or -1 naming
    the shard not back. */
int zd__ps_wait_ranks(const int *ranks, int n, int64_t timeout_ms);

/*  zd__ps_wait_ranks, then agree(arg) (the shards brought to one
    generation), again while agree fails with ZD_ERR_PEER (a shard just
    back may take no calls yet) and the time lasts. 0, or -1. */
int zd__ps_wait_shards(const int *ranks, int n, int64_t timeout_ms, int (*agree)(void *),
                       void *arg);

/*  The first element of the float32 tensor t that is not finite, or -1. */
int64_t zd__ps_first_not_finite(const zd_tensor_t *t);

/*  What a checkpoint holds of a shard (checkpoint.c): its parameters,
    under their names, and its optimizer's state (opt NULL: none). Both
    kinds of shard describe themselves this way: the push/pull shard its
    own copies and optimizer, the remote model's its stage's parameters,
    stepped by the DistributedOptimizer's optimizers. */
typedef struct {
    const char *path; /* "<checkpoint_path>.shard<K>" */
    int shard, n_shards;
    int n;
    char *const *names;
    zd_tensor_t *const *params;
    zd_optim_t *opt;
    /* the trainers' positions (NULL: none kept); a resume replaces the
       array with the file's */
    int64_t **positions;
    int *n_positions;
    /* a synchronous shard's trainers: by rank, TRAINER_* (NULL: none
       kept); a resume (want -1) gives the ranks it knew as trainers in
       *known (malloc'ed, *n_known of them) */
    const uint8_t *trainer;
    int n_ranks;
    int64_t **known;
    int *n_known;
    /* A remote model's stage numbers its generations (a trainer's
       checkpoints name theirs: zd_ps_model_checkpoint): by_gen writes
       gen into each file and keys the files by it where the functions
       below say version (a file of a build before keyed by version /
       every, or its version for every 0); else by version. */
    bool by_gen;
    int64_t gen, every;
    /* the run's tag (zd_ps_options_t.run_tag), written into each file
       and, on a resume, matched by the file's (NULL: none) */
    const char *tag;
} zd__ps_ckpt_t;

/*  Writes the shard's checkpoint at version, as the newest generation of
    c->path, the one before kept as ".prev" (the caller keeps the
    parameters and the optimizer still); with replace, in place of the
    current file, of that same key (by_gen: gen; else version), the
    ".prev" one left as it is. 0, or -1 with the error set (the older
    generations left as they were). */
int zd__ps_checkpoint_write(const zd__ps_ckpt_t *c, int64_t version, bool replace);

/*  Takes a generation of the checkpoint into the shard's parameters,
    optimizer and positions (before it serves, or under its lock): the
    newest readable one (want -1), or the one of key want (by_gen: a
    generation; else a version), whose newer generations are then
    removed and which becomes the current file: 0 with *version its
    version, *key (if not NULL) its key and *older (if not NULL) the key
    of the newest older generation left (-1: none); -1 when there is no
    file (a new run; want -1 only); -2 with the error set when none can
    be taken (want: naming the keys there are). */
int zd__ps_checkpoint_load(const zd__ps_ckpt_t *c, int64_t want, int64_t *version, int64_t *key,
                           int64_t *older);

/*  Before a shard serves with checkpoints: removes the temporary files
    its writes left in c->path's folder when their process died mid-write
    (logging each), then checks that it can write there (a probe file
    created, written, removed). 0, or -1 (ZD_ERR_ARGUMENT naming the
    path and why). */
int zd__ps_checkpoint_prepare(const zd__ps_ckpt_t *c);

/*  Renames the files of c->path (of an earlier run, when a new one
    starts without resume) to "<name>.earlier", so that a restart resumes
    from none of them; logs each. */
void zd__ps_checkpoint_set_aside(const zd__ps_ckpt_t *c);

/*  Whether a whole generation of key `want` can be read there, as
    zd__ps_checkpoint_load would take it: 0, or -1 (ZD_ERR_ARGUMENT
    naming the files there and their keys or damage). */
int zd__ps_checkpoint_check(const zd__ps_ckpt_t *c, int64_t want);

/*  Records that the trainer of rank `rank` is at `position` of its data
    in *positions (*n entries, grown up to the world's size; -1: none),
    under its owner's lock; a negative position or rank records nothing.
    Out of memory, the record is missed: a resumed trainer then starts
    earlier in its data, never later. */
void zd__ps_positions_record(int64_t **positions, int *n, int rank, int64_t position);

/*  "<prefix>.shard<shard>": a new string (free), or NULL. */
char *zd__ps_checkpoint_path(const char *prefix, int shard);

/*  The rank of the model's shard s (run.c names it), or -1. */
int zd__ps_model_rank(const zd_ps_model_t *m, int s);

#endif
