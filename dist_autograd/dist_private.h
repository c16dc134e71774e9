/* SPDX-License-Identifier: MIT */
/*  dist_private.h: contexts and their tables, shared by the files of
    distributed autograd (dist_context.c, dist_record.c, dist_engine.c). */
#ifndef ZDIST_DIST_PRIVATE_H
#define ZDIST_DIST_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/rpc.h>

/*  A recorded send or receive function: the node, the message id it was
    recorded under, and the peer on the other end. */
typedef struct {
    uint64_t msg_id;
    zd_autograd_node_t *node;
    int peer;
} dist_fn_t;

typedef struct {
    zd_tensor_t *tensor; /* the leaf (a reference) */
    zd_tensor_t *grad;   /* owned, summed in place */
} dist_grad_t;

typedef struct dist_context {
    atomic_int refs;
    int64_t id;

    /* `lock` guards the tables below; held only briefly (it is taken on the
       I/O thread when a reply records a receive function). */
    pthread_mutex_t lock;
    dist_fn_t *sends;
    int n_sends, cap_sends;
    dist_fn_t *recvs;
    int n_recvs, cap_recvs;
    int *peers; /* ranks that took part with this process */
    int n_peers, cap_peers;
    int64_t last_query; /* dedup of flooded pending queries */

    /* `grad_lock` guards the gradient map. */
    pthread_mutex_t grad_lock;
    dist_grad_t *grads;
    int n_grads, cap_grads;

    /* `pass_lock` serialises the backward work of this context here: the
       task of the current pass and everything it runs. */
    pthread_mutex_t pass_lock;
    int64_t pass_id; /* 0: no pass yet */
    zd_autograd_task_t *task;

    /* Who may act on it (dist_context.c, under registry_lock): the peer
       whose request made it here (-1: begun here), and when it was last
       looked up (for the idle expiry of peers' contexts). */
    int made_by;
    _Atomic int64_t last_used_ms;
} dist_context_t;

/*  What a receive function needs to send its gradients back. */
typedef struct {
    int64_t ctx_id;
    uint64_t msg_id;
    int peer;
} dist_recv_info_t;

/*  The two node kinds (dist_engine.c). */
extern const zd_autograd_node_ops_t zd__dist_send_ops, zd__dist_recv_ops;

/*  ---- registry (dist_context.c) ---- */

/*  The context with that id (a new reference), or NULL. */
dist_context_t *zd__dist_context_get(int64_t id);

/*  The context with that id, created when absent (a new reference). */
dist_context_t *zd__dist_context_get_or_create(int64_t id);

/*  The context with that id for a request from peer: created when absent,
    if the id is one a world member could have made and the peer is within
    its caps (zd_dist_autograd_limits_t). A new reference, or NULL with the
    error set (naming the peer). */
dist_context_t *zd__dist_context_get_or_create_for(int64_t id, int peer);

/*  Whether peer took part in the context here (sent to or received from
    us under it) or made its id. */
bool zd__dist_context_is_participant(dist_context_t *c, int peer);

/*  Whether peer may release the context here: its creator (by id), or the
    peer whose request made it here while the creator never came itself. */
bool zd__dist_context_may_release(dist_context_t *c, int peer);

/*  "worker \"name\" (rank N)" for a peer, into buf. */
const char *zd__dist_peer_desc(int rank, char *buf, size_t size);

/*  Removes the context from the registry (its memory goes with the last
    reference). Returns it (the registry's reference, now the caller's), or
    NULL when absent. */
dist_context_t *zd__dist_context_remove(int64_t id);

void zd__dist_context_unref(dist_context_t *c);

/*  Removes the contexts a lost peer leaves behind: those it created, and
    those whose participants are all lost. Returns how many, or -1. */
int64_t zd__dist_context_release_lost(int lost);

/*  Records peer as a participant (idempotent). 0, or -1. */
int zd__dist_context_add_peer(dist_context_t *c, int peer);

/*  Copies of the participant list (caller frees *peers). 0, or -1. */
int zd__dist_context_peers(dist_context_t *c, int **peers, int *n);

/*  Adds a send / receive function (the context takes a node reference). */
int zd__dist_context_add_fn(dist_context_t *c, bool send, uint64_t msg_id, zd_autograd_node_t *node,
                            int peer);

/*  The send function recorded under msg_id (borrowed; valid while the
    context lives), or NULL. */
zd_autograd_node_t *zd__dist_context_find_send(dist_context_t *c, uint64_t msg_id);

/*  The peer the send function recorded under msg_id sent to, or -1. */
int zd__dist_context_send_peer(dist_context_t *c, uint64_t msg_id);

/*  The accumulate hook of the engine: adds grad into the context's map. */
int zd__dist_context_accumulate(void *arg, zd_tensor_t *leaf, zd_tensor_t *grad);

/*  Globally unique 64-bit ids: rank << 48 | counter. */
uint64_t zd__dist_next_id(void);

/*  The calling thread's current context id (-1: none). */
extern _Thread_local int64_t zd__dist_current_ctx;

/*  Counters behind zd_dist_autograd_stats(). */
extern atomic_int_fast64_t zd__dist_stat_sends, zd__dist_stat_recvs, zd__dist_stat_passes,
    zd__dist_stat_flushed;
/*  Running totals since the process started (for metrics over time). */
extern atomic_int_fast64_t zd__dist_total_contexts, zd__dist_total_backward,
    zd__dist_total_grad_messages, zd__dist_total_sends;

/*  ---- recording (dist_record.c) ---- */

/*  The RPC hooks that record send/receive functions. */
zd_rpc_hooks_t zd__dist_record_hooks(void);

/*  ---- backward (dist_engine.c) ---- */

/*  Registers the internal functions ("__dist_*"). 0, or -1. */
int zd__dist_engine_register(void);

/*  Registers the function RRef.backward calls on owners (rref_backward.c). */
int zd__dist_rref_backward_register(void);

/*  True once zd_dist_autograd_init has installed the hooks: a context begun
    without them would record nothing, and its backward would silently skip
    every other process. */
bool zd__dist_installed(void);

#endif
