/* SPDX-License-Identifier: MIT */
/*  ps_net_client.h: a trainer's end of the Net's parameter server
    (ps_net.h): the RRefs and the DistributedOptimizer it holds, and what
    an operator's run needs around the tutorial's loop: the position a
    trainer resumes from, a lost server shard waited for and taken again,
    the --max_staleness gate, checkpoints, the shared final evaluation,
    and a failure told to the servers.

        ps_net_client_hooks();                    // before zd_rpc_init
        ps_net_client_t *ps = ps_net_client_new(&cfg);
        if (ps_net_client_attach(ps) < 0) ...
        ZD_DIST_AUTOGRAD_CONTEXT(cid) {
            ps_net_client_forward(ps, x, true, &out);  ... loss ...
            ps_net_client_backward(ps, cid, loss);
            ps_net_client_step(ps, cid);
        }
        when a call to the servers failed:
            ps_net_client_recover(ps, done, &start) == 1: go on from start

    Its calls are where a test's ZDIST_FAULT reaches a trainer's phases
    (fault.h): forward (a training forward), backward, step, checkpoint
    and evaluation (the shared final one, not --eval_every's). One thread
    at a time. */
#ifndef ZDIST_EXAMPLES_PS_NET_CLIENT_H
#define ZDIST_EXAMPLES_PS_NET_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/rpc.h>
#include <zdist/tensor.h>

/*  The most server shards a client takes. */
#define PS_NET_MAX_SERVERS 16

typedef struct {
    int trainer;            /* this trainer's number (its rank minus num_servers) */
    int num_servers;        /* shards: ranks 0 to num_servers - 1 */
    double lr;              /* the SGD learning rate (the servers refuse another) */
    const char *checkpoint; /* the servers' checkpoint prefix (borrowed), or NULL */
    int64_t server_wait_s;  /* how long a lost shard may take to come back */
    int64_t positions;      /* batches of the whole run: a resume point beyond is refused */
    int64_t epochs;         /* for the message refusing one */
} ps_net_client_config_t;

typedef struct ps_net_client ps_net_client_t;

/*  Counts the ranks that rejoin the world (a shard that came back before
    the trainer saw it lost). Call once, before zd_rpc_init. 0, or -1. */
int ps_net_client_hooks(void);

/*  A trainer's client with cfg (copied; checkpoint borrowed): a new object
    (ps_net_client_free), or NULL. Sends nothing. */
ps_net_client_t *ps_net_client_new(const ps_net_client_config_t *cfg);

/*  Takes an RRef to the server and to its parameters, makes the
    DistributedOptimizer over them and tells shard 0 that this trainer
    trains. 0, or -1 with nothing held. */
int ps_net_client_attach(ps_net_client_t *c);

/*  The RRef to the server (borrowed; NULL before attach and after a
    shard was lost). */
zd_rref_t *ps_net_client_server(const ps_net_client_t *c);

/*  The server's model on x (borrowed): log-probabilities into *out (a new
    reference), recorded by distributed autograd inside a context when
    training (dropout on). 0, or -1 with *out NULL. */
int ps_net_client_forward(ps_net_client_t *c, zd_tensor_t *x, bool training, zd_tensor_t **out);

/*  The distributed backward of loss (borrowed) in context_id, through
    the server. 0, or -1. */
int ps_net_client_backward(ps_net_client_t *c, int64_t context_id, zd_tensor_t *loss);

/*  Steps the server's parameters with the gradients of context_id (the
    DistributedOptimizer). 0, or -1. */
int ps_net_client_step(ps_net_client_t *c, int64_t context_id);

/*  Where this trainer was at the last checkpoint (shard 0 keeps it): its
    batches done, refused beyond cfg.positions. 0, or -1 with *start
    unchanged. */
int ps_net_client_resume_point(ps_net_client_t *c, int64_t *start);

/*  A call to the servers failed at batch `done`. With a checkpoint prefix,
    when a shard was lost (or came back since attach), waits up to
    server_wait_s for every shard to be a member again, attaches anew
    (what the old process owned is gone) and sets *start to this
    trainer's checkpointed position: returns 1. Otherwise -1 with the
    call's error kept (no server went away), or one naming the shard that
    did not come back. Prints what it waits for and when they are back. */
int ps_net_client_recover(ps_net_client_t *c, int64_t done, int64_t *start);

/*  --max_staleness=K: waits until this trainer, with `done` batches, is
    at most K batches ahead of the slowest trainer still training. Past
    the RPC timeout it says so on stderr and goes on. 0, or -1. */
int ps_net_client_staleness_gate(ps_net_client_t *c, int64_t done, int64_t k);

/*  Has the servers checkpoint with this trainer at `done` batches. 0, or -1. */
int ps_net_client_checkpoint(ps_net_client_t *c, int64_t done);

/*  Tells shard 0 that this trainer finished its batches. 0, or -1. */
int ps_net_client_finished(ps_net_client_t *c);

/*  The test accuracy of the final weights, evaluated once on shard 0 for
    every trainer (it answers when the last one is done) over `samples`
    test images (0: all). 0, or -1. */
int ps_net_client_shared_accuracy(ps_net_client_t *c, int64_t samples, double *acc);

/*  Tells shard 0 that this run failed at batch `done`, with the error set
    now: the servers stop waiting for it and name it. Best effort; the
    error stays set. */
void ps_net_client_report_failure(ps_net_client_t *c, int64_t done);

/*  Releases what the client holds and frees it (NULL-safe). */
void ps_net_client_free(ps_net_client_t *c);

#endif
