/* SPDX-License-Identifier: MIT */
/*  inflight.c: how many training forwards a remote-model stage holds at
    once (max_inflight).

    A training forward leaves its activations on the shard until its
    backward has gone through the stage. Every trainer's forward starts at
    once (a handler thread each), so without a bound the shard's memory
    grows by a batch's activations per trainer. A forward first takes one
    of max_inflight slots; forwards past the limit wait in the order they
    came, holding only their inputs. A slot comes back when the backward
    reaches the stage's outputs, or when the graph is dropped unused (the
    context released, the trainer lost): a node over the outputs gives it
    back, whichever comes first. A forward that waited the RPC timeout goes
    ahead anyway, said once: slot holders frozen until the heartbeat
    declares them lost must not stop the others for good. */
#include <stdatomic.h>
#include <stdlib.h>

#include <zdist/error.h>
#include <zdist/function.h>
#include <zdist/future.h>
#include <zdist/rpc.h>
#include "core/log_private.h"
#include "ps/ps_private.h"

typedef struct waiter {
    zd_future_t *admitted; /* completed when it is handed a slot, or the stage stops */
    bool granted;          /* handed a slot (under the gate's lock) */
    struct waiter *next;
} waiter_t;

struct zd__ps_gate {
    atomic_int refs; /* the stage's, and one per node holding a slot */
    pthread_mutex_t lock;
    int max, used;
    waiter_t *head, *tail;
    bool warned;
    bool stopped; /* zd__ps_gate_stop: nobody waits any more */
};

zd__ps_gate_t *zd__ps_gate_new(int max)
{
    zd__ps_gate_t *g = calloc(1, sizeof *g);
    if (!g) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
        return NULL;
    }
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->lock, NULL);
    g->max = max;
    return g;
}

void zd__ps_gate_unref(zd__ps_gate_t *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/*  Removes w from the queue (under g->lock); false when it is not there. */
static bool unqueue(zd__ps_gate_t *g, waiter_t *w)
{
    for (waiter_t **p = &g->head, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
        if (*p != w)
            continue;
        *p = w->next;
        if (g->tail == w)
            g->tail = prev;
        return true;
    }
    return false;
}

bool zd__ps_gate_enter(zd__ps_gate_t *g, int shard)
{
    pthread_mutex_lock(&g->lock);
    if (g->stopped) {
        pthread_mutex_unlock(&g->lock);
        return false;
    }
    if (g->used < g->max) {
        g->used++;
        pthread_mutex_unlock(&g->lock);
        return true;
    }
    waiter_t w = {zd_future_new(), false, NULL};
    if (!w.admitted) {
        pthread_mutex_unlock(&g->lock);
        return false; /* out of memory: ungated beats failing the batch */
    }
    if (g->tail)
        g->tail->next = &w;
    else
        g->head = &w;
    g->tail = &w;
    pthread_mutex_unlock(&g->lock);
    /* zd_future_wait tells the RPC pool that this thread waits, so the
       backward passes that free the slots still find threads */
    zd_future_wait(w.admitted, zd_rpc_get_timeout());
    pthread_mutex_lock(&g->lock);
    /* handed a slot, let go by a stop, or still queued (it waited the
       timeout): decided under the lock */
    bool timed_out = unqueue(g, &w), admitted = w.granted;
    bool warn = timed_out && !g->warned;
    g->warned |= warn;
    pthread_mutex_unlock(&g->lock);
    zd_future_unref(w.admitted);
    if (warn)
        zd__log(ZD_LOG_WARN,
                "ps: stage %d: a training forward waited the RPC timeout for one of the %d "
                "batches in flight (max_inflight); it goes ahead without (said once)",
                shard, g->max);
    return admitted;
}

void zd__ps_gate_leave(zd__ps_gate_t *g)
{
    pthread_mutex_lock(&g->lock);
    waiter_t *w = g->head;
    if (w) {
        g->head = w->next;
        if (!g->head)
            g->tail = NULL;
        w->granted = true;
        zd_value_t *none = zd_value_none();
        zd_future_set_value(w->admitted, none);
        zd_value_unref(none);
    } else {
        g->used--;
    }
    pthread_mutex_unlock(&g->lock);
}

void zd__ps_gate_stop(zd__ps_gate_t *g)
{
    pthread_mutex_lock(&g->lock);
    g->stopped = true;
    for (waiter_t *w = g->head, *next; w; w = next) {
        next = w->next; /* w lives on its waiter's stack until it sees its future */
        zd_value_t *none = zd_value_none();
        zd_future_set_value(w->admitted, none);
        zd_value_unref(none);
    }
    g->head = g->tail = NULL;
    pthread_mutex_unlock(&g->lock);
}

int zd__ps_gate_used(zd__ps_gate_t *g, int *waiting)
{
    pthread_mutex_lock(&g->lock);
    int n = g->used, queued = 0;
    for (const waiter_t *w = g->head; w; w = w->next)
        queued++;
    pthread_mutex_unlock(&g->lock);
    if (waiting)
        *waiting = queued;
    return n;
}

/*  ---- the node that gives a slot back ---- */

typedef struct {
    zd__ps_gate_t *gate; /* a reference */
    atomic_bool holds;
} slot_t;

static void slot_give_back(slot_t *s)
{
    if (atomic_exchange(&s->holds, false))
        zd__ps_gate_leave(s->gate);
}

static int slot_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    slot_give_back(zd_autograd_node_ctx(n));
    for (int i = 0; i < zd_autograd_node_n_inputs(n); i++)
        if (zd_autograd_node_needs_grad(n, i))
            gin[i] = zd_tensor_ref(gout[i]);
    return 0;
}

static void slot_release(zd_autograd_node_t *n)
{
    slot_t *s = zd_autograd_node_ctx(n);
    slot_give_back(s);
    zd__ps_gate_unref(s->gate);
    free(s);
}

static const zd_autograd_node_ops_t slot_ops =
    ZD_AUTOGRAD_NODE_OPS("InflightSlotBackward", slot_backward, slot_release);

int zd__ps_gate_hold(zd__ps_gate_t *g, zd_tensor_t **out, int n)
{
    zd_tensor_t *grad_in[ZD__PS_MAX_TENSORS], *views[ZD__PS_MAX_TENSORS] = {0};
    int idx[ZD__PS_MAX_TENSORS], k = 0, rc = 0;
    for (int i = 0; i < n; i++)
        if (zd_tensor_requires_grad(out[i])) {
            idx[k] = i;
            grad_in[k++] = out[i];
        }
    for (int j = 0; rc == 0 && j < k; j++)
        rc = (views[j] = zd_tensor_detach(grad_in[j])) ? 0 : -1;
    slot_t *s = NULL;
    zd_autograd_node_t *node = NULL;
    if (rc == 0 && k > 0 && !(s = malloc(sizeof *s)))
        rc = -1;
    if (rc == 0 && k > 0)
        rc = zd_autograd_node_new(&slot_ops, grad_in, k, k, &node);
    if (rc < 0 || !node) { /* a failure, or nothing will go back through the stage */
        free(s);
        for (int j = 0; j < k; j++)
            zd_tensor_unref(views[j]);
        zd__ps_gate_leave(g);
        return rc < 0 ? zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory") : 0;
    }
    s->gate = g;
    atomic_fetch_add(&g->refs, 1);
    atomic_init(&s->holds, true);
    zd_autograd_node_set_ctx(node, s);
    for (int j = 0; j < k; j++) {
        zd_autograd_node_set_output(node, views[j]);
        zd_tensor_unref(out[idx[j]]);
        out[idx[j]] = views[j];
    }
    zd_autograd_node_unref(node);
    return 0;
}
