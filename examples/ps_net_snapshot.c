/* SPDX-License-Identifier: MIT */
/*  ps_net_snapshot.c: the parameters a forward computes with, and how many
    training forwards the server holds at once.

    Snapshots. A trainer's backward must use the weights its forward saw,
    while other trainers' steps change the shared ones in place: a forward
    computes with copies, and gradients flow back to the shared parameters
    through a node that passes them on unchanged (as a clone's would). The
    copies themselves are shared: a forward takes views of the last copy of
    each parameter, and a new copy is made only once a step has changed
    the parameters since (zd_dist_optim_version). At most one copy per
    optimizer step, then, instead of one per forward; a copy goes when the
    last graph that saved it does.

    Batches in flight. A training forward leaves its activations and its
    snapshot on the server until its backward has gone through here, about
    10 MB for a batch of 32, and every trainer's forward used to start at
    once (a handler thread each): the server's memory grew by that much per
    trainer. A training forward now first takes one of a few slots
    (ps_net_set_max_inflight), given back when its snapshot node lets go of
    its state: right after the backward went through it, or when the graph
    is dropped unused (the context released, the trainer lost). Forwards
    past the limit wait in the order they came, holding only their input;
    the server keeps its cores as busy (a few batches in flight are enough
    for them) and each batch is done sooner. A forward that waited the RPC
    timeout goes ahead anyway: slot holders frozen until the heartbeat
    declares them lost must not stop the others for good. */
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/function.h>
#include <zdist/future.h>
#include <zdist/rpc.h>

/*  ---- the slots ---- */

typedef struct waiter {
    zd_future_t *admitted; /* completed when a leaving forward hands its slot over */
    struct waiter *next;
} waiter_t;

static struct {
    pthread_mutex_t lock;
    int max; /* 0: no limit */
    int used;
    waiter_t *head, *tail;
    bool warned;
} gate = {.lock = PTHREAD_MUTEX_INITIALIZER};

void ps_net_set_max_inflight(int n)
{
    if (n == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        n = 2 * (cores < 1 ? 1 : (int)cores);
    }
    pthread_mutex_lock(&gate.lock);
    gate.max = n < 0 ? 0 : n;
    pthread_mutex_unlock(&gate.lock);
}

/*  Removes w from the queue (under gate.lock); false when it is not there. */
static bool unqueue(waiter_t *w)
{
    for (waiter_t **p = &gate.head, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
        if (*p != w)
            continue;
        *p = w->next;
        if (gate.tail == w)
            gate.tail = prev;
        return true;
    }
    return false;
}

/*  Takes a slot, waiting for one when all are taken. true when the caller
    holds a slot (give it back with gate_leave), false when it goes ahead
    without one (no limit, or it waited the RPC timeout). */
static bool gate_enter(void)
{
    pthread_mutex_lock(&gate.lock);
    if (gate.max == 0 || gate.used < gate.max) {
        bool counted = gate.max > 0;
        gate.used += counted;
        pthread_mutex_unlock(&gate.lock);
        return counted;
    }
    waiter_t w = {zd_future_new(), NULL};
    if (!w.admitted) {
        pthread_mutex_unlock(&gate.lock);
        return false; /* out of memory: ungated beats failing the batch */
    }
    if (gate.tail)
        gate.tail->next = &w;
    else
        gate.head = &w;
    gate.tail = &w;
    pthread_mutex_unlock(&gate.lock);
    /* zd_future_wait tells the RPC pool that this thread waits, so the
       backward passes that free the slots still find threads */
    zd_future_wait(w.admitted, zd_rpc_get_timeout());
    pthread_mutex_lock(&gate.lock);
    /* handed a slot, or still queued: decided under the lock */
    bool admitted = !unqueue(&w);
    bool warn = !admitted && !gate.warned;
    gate.warned |= warn;
    int max = gate.max;
    pthread_mutex_unlock(&gate.lock);
    zd_future_unref(w.admitted);
    if (warn)
        fprintf(stderr,
                "ps_net: a training forward waited the RPC timeout for one of the %d "
                "batches in flight (--max_inflight); it goes ahead without (said once)\n",
                max);
    return admitted;
}

/*  Gives a slot back: to the first waiting forward, else to the pool. */
static void gate_leave(void)
{
    pthread_mutex_lock(&gate.lock);
    waiter_t *w = gate.head;
    if (w) {
        gate.head = w->next;
        if (!gate.head)
            gate.tail = NULL;
        zd_value_t *none = zd_value_none();
        zd_future_set_value(w->admitted, none);
        zd_value_unref(none);
    } else {
        gate.used--;
    }
    pthread_mutex_unlock(&gate.lock);
}

/*  ---- the shared copies ---- */

/*  Copies come from buffers kept for them, per parameter, once their last
    user is gone: with many trainers nearly every forward follows a step
    and makes a copy, and 4.7 MB blocks taken from malloc and given back at
    that rate, among the activations' blocks, fragment the heap (1 + 16
    trainers, 50 batches each: the server's peak 280 -> 269 MB). */
#define SPARE_BUFFERS 4

static struct {
    pthread_mutex_t lock;
    zd_tensor_t *copy[PS_NET_MAX_PARAMS]; /* of ps_shard.params[i], or NULL */
    uint64_t version[PS_NET_MAX_PARAMS];  /* zd_dist_optim_version when taken */
    pthread_mutex_t spare_lock;           /* inner: taken under lock, or alone */
    void *spare[PS_NET_MAX_PARAMS][SPARE_BUFFERS];
    int n_spare[PS_NET_MAX_PARAMS];
} shared = {.lock = PTHREAD_MUTEX_INITIALIZER, .spare_lock = PTHREAD_MUTEX_INITIALIZER};

/*  The release of a copy's buffer (arg: the parameter's index). */
static void buffer_release(void *data, void *arg)
{
    int i = (int)(intptr_t)arg;
    pthread_mutex_lock(&shared.spare_lock);
    if (shared.n_spare[i] < SPARE_BUFFERS) {
        shared.spare[i][shared.n_spare[i]++] = data;
        data = NULL;
    }
    pthread_mutex_unlock(&shared.spare_lock);
    free(data);
}

/*  A copy of parameter i in a spare buffer, or a new one (a new
    reference), or NULL. Under shared.lock. */
static zd_tensor_t *copy_of(int i)
{
    zd_tensor_t *p = ps_shard.params[i];
    size_t bytes = zd_tensor_nbytes(p);
    pthread_mutex_lock(&shared.spare_lock);
    void *data = shared.n_spare[i] > 0 ? shared.spare[i][--shared.n_spare[i]] : NULL;
    pthread_mutex_unlock(&shared.spare_lock);
    if (!data)
        data = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!data)
        return NULL;
    memcpy(data, zd_tensor_data(p), bytes);
    return zd_tensor_wrap(zd_tensor_dtype(p), zd_tensor_shape(p), zd_tensor_ndim(p), data, bytes,
                          buffer_release, (void *)(intptr_t)i);
}

static int param_index(const char *name)
{
    for (int i = 0; i < ps_shard.n; i++)
        if (!strcmp(ps_shard.names[i], name))
            return i;
    return -1;
}

/*  The current copy of parameter i (a new reference), or NULL. Called
    under zd_dist_optim_read_lock. */
static zd_tensor_t *current_copy(int i, uint64_t version)
{
    pthread_mutex_lock(&shared.lock);
    if (!shared.copy[i] || shared.version[i] != version) {
        zd_tensor_t *c = copy_of(i);
        if (c) {
            zd_tensor_unref(shared.copy[i]);
            shared.copy[i] = c;
            shared.version[i] = version;
        }
    }
    zd_tensor_t *c = zd_tensor_ref(shared.copy[i]);
    pthread_mutex_unlock(&shared.lock);
    if (!c)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps_net: out of memory copying %s", ps_shard.names[i]);
    return c;
}

/*  ---- the node ---- */

typedef struct {
    bool holds_slot;
} snapshot_ctx_t;

static int snapshot_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    for (int i = 0; i < zd_autograd_node_n_inputs(n); i++)
        if (zd_autograd_node_needs_grad(n, i))
            gin[i] = zd_tensor_ref(gout[i]);
    return 0;
}

static void snapshot_release(zd_autograd_node_t *n)
{
    snapshot_ctx_t *ctx = zd_autograd_node_ctx(n);
    if (ctx->holds_slot)
        gate_leave();
    free(ctx);
}

static const zd_autograd_node_ops_t snapshot_ops =
    ZD_AUTOGRAD_NODE_OPS("SnapshotBackward", snapshot_backward, snapshot_release);

int ps_net_snapshot(const char *const *names, int n, bool training, zd_tensor_t **out)
{
    int idx[PS_NET_MAX_PARAMS];
    zd_tensor_t *copies[PS_NET_MAX_PARAMS] = {0};
    memset(out, 0, sizeof *out * (size_t)n);
    if (n < 1 || n > PS_NET_MAX_PARAMS)
        return zd_error_set("ps_net: a snapshot of %d parameters", n);
    for (int i = 0; i < n; i++)
        if ((idx[i] = param_index(names[i])) < 0)
            return zd_error_set("no parameter %s on this shard", names[i]);
    bool slot = training && gate_enter();
    int rc = 0;
    zd_dist_optim_read_lock();
    uint64_t version = zd_dist_optim_version();
    for (int i = 0; i < n && rc == 0; i++)
        rc = (copies[i] = current_copy(idx[i], version)) ? 0 : -1;
    zd_dist_optim_read_unlock();
    /* views of the copies, each forward its own, recorded as the outputs of
       one node over the shared parameters */
    for (int i = 0; i < n && rc == 0; i++)
        if (!(out[i] = zd_tensor_detach(copies[i])))
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "ps_net: out of memory");
    zd_tensor_t *params[PS_NET_MAX_PARAMS];
    for (int i = 0; i < n; i++)
        params[i] = ps_shard.params[idx[i]];
    zd_autograd_node_t *node = NULL;
    snapshot_ctx_t *ctx = NULL;
    if (rc == 0 && !(ctx = malloc(sizeof *ctx)))
        rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "ps_net: out of memory");
    if (rc == 0)
        rc = zd_autograd_node_new(&snapshot_ops, params, n, n, &node);
    if (rc == 0 && node) {
        /* from here the node gives the slot back, whatever becomes of it */
        ctx->holds_slot = slot;
        slot = false;
        zd_autograd_node_set_ctx(node, ctx);
        ctx = NULL;
        for (int i = 0; i < n; i++)
            zd_autograd_node_set_output(node, out[i]);
        zd_autograd_node_unref(node);
    }
    free(ctx);
    if (slot) /* nothing recorded (no gradients wanted) or a failure */
        gate_leave();
    for (int i = 0; i < n; i++) {
        zd_tensor_unref(copies[i]);
        if (rc < 0)
            zd_tensor_unref_p(&out[i]);
    }
    return rc;
}

void ps_net_snapshot_drop(void)
{
    zd_tensor_t *copies[PS_NET_MAX_PARAMS];
    pthread_mutex_lock(&shared.lock);
    for (int i = 0; i < PS_NET_MAX_PARAMS; i++) {
        copies[i] = shared.copy[i];
        shared.copy[i] = NULL;
    }
    pthread_mutex_unlock(&shared.lock);
    for (int i = 0; i < PS_NET_MAX_PARAMS; i++) /* (a forward using one keeps it) */
        zd_tensor_unref(copies[i]);
}

void ps_net_snapshot_free(void)
{
    ps_net_snapshot_drop(); /* (their buffers come back as spares) */
    pthread_mutex_lock(&shared.spare_lock);
    for (int i = 0; i < PS_NET_MAX_PARAMS; i++)
        while (shared.n_spare[i] > 0)
            free(shared.spare[i][--shared.n_spare[i]]);
    pthread_mutex_unlock(&shared.spare_lock);
}
