/* SPDX-License-Identifier: MIT */
/*  node.c: graph nodes recorded by differentiable operations. */
#include "autograd/autograd_private.h"

#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "core/sized.h"

static atomic_uint_fast64_t next_seq = 1;

uint64_t zd_autograd_seq_current(void)
{
    return atomic_load(&next_seq);
}

/*  A peer's clock is only believed this far ahead of ours: a hostile or
    broken one sending UINT64_MAX would otherwise wrap ours to 0, and a node
    numbered 0 reads as "nothing pending" to the distributed engine. */
#define SEQ_MAX_JUMP (UINT64_C(1) << 32)
/*  And never past this: a clock moved 2^32 at a time by a flood of
    messages still stays far from wrapping (no process makes 2^62 nodes). */
#define SEQ_CEILING (UINT64_C(1) << 62)

bool zd_autograd_seq_plausible(uint64_t remote_seq)
{
    uint64_t cur = atomic_load(&next_seq);
    return remote_seq < SEQ_CEILING && (remote_seq <= cur || remote_seq - cur <= SEQ_MAX_JUMP);
}

void zd_autograd_seq_observe(uint64_t remote_seq)
{
    uint_fast64_t cur = atomic_load(&next_seq);
    for (;;) {
        uint64_t to = remote_seq;
        if (to < cur)
            return;
        if (to - cur > SEQ_MAX_JUMP)
            to = cur + SEQ_MAX_JUMP;
        if (to >= SEQ_CEILING)
            return;
        if (atomic_compare_exchange_weak(&next_seq, &cur, to + 1))
            return;
    }
}

int zd_autograd_node_new(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *inputs,
                         int n_inputs, int n_outputs, zd_autograd_node_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_node_new: NULL out");
    *out = NULL;
    /* Checked before anything else, so a bad table fails even when grad mode is off. The
       library reads no field past release, all of the first version's. */
    if (!ops || ops->size < ZD__SIZE_THROUGH(zd_autograd_node_ops_t, release))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_autograd_node_new: zd_autograd_node_ops_t.size is %zu, not "
                                 "the size of a zd_autograd_node_ops_t: build it with "
                                 "ZD_AUTOGRAD_NODE_OPS(name, backward, release)",
                                 ops ? ops->size : 0);
    if (!inputs && n_inputs > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_node_new: NULL inputs");
    if (!zd_autograd_is_grad_enabled())
        return 0;
    bool any = false;
    for (int j = 0; j < n_inputs; j++)
        if (inputs[j] && inputs[j]->requires_grad)
            any = true;
    if (!any && n_inputs > 0)
        return 0;

    zd_autograd_node_t *n = calloc(1, sizeof *n);
    if (!n)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", ops->name);
    n->edges = calloc((size_t)(n_inputs > 0 ? n_inputs : 1), sizeof *n->edges);
    n->out_dims =
        calloc((size_t)(n_outputs > 0 ? n_outputs : 1) * ZD_TENSOR_MAX_DIMS, sizeof *n->out_dims);
    n->out_ndim = calloc((size_t)(n_outputs > 0 ? n_outputs : 1), sizeof *n->out_ndim);
    if (!n->edges || !n->out_dims || !n->out_ndim) {
        free(n->edges);
        free(n->out_dims);
        free(n->out_ndim);
        free(n);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", ops->name);
    }
    atomic_init(&n->refcount, 1);
    pthread_mutex_init(&n->lock, NULL);
    n->ops = ops;
    n->seq = atomic_fetch_add(&next_seq, 1);
    n->n_inputs = n_inputs;
    n->n_outputs = n_outputs;
    for (int j = 0; j < n_inputs; j++) {
        zd_tensor_t *x = inputs[j];
        if (!x || !x->requires_grad)
            continue;
        if (x->grad_fn) {
            n->edges[j].node = zd_autograd_node_ref(x->grad_fn);
            n->edges[j].output_nr = x->output_nr;
        } else {
            n->edges[j].leaf = zd_tensor_ref(x);
        }
    }
    *out = n;
    return 0;
}

int zd_autograd_record(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *in, int n_in,
                       zd_tensor_t *y, zd_tensor_t *const *saved, int n_saved, void *ctx)
{
    zd_autograd_node_t *n;
    if (!y) {
        free(ctx);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_record: NULL y");
    }
    if (zd_autograd_node_new(ops, in, n_in, 1, &n) < 0) {
        free(ctx);
        zd_tensor_unref(y);
        return -1;
    }
    if (!n) {
        free(ctx);
        return 0;
    }
    for (int i = 0; i < n_saved; i++)
        if (saved[i])
            zd_autograd_node_save(n, i, saved[i]);
    if (ctx)
        zd_autograd_node_set_ctx(n, ctx);
    zd_autograd_node_set_output(n, y);
    zd_autograd_node_unref(n);
    return 0;
}

zd_autograd_node_t *zd_autograd_node_ref(zd_autograd_node_t *n)
{
    if (n)
        atomic_fetch_add(&n->refcount, 1);
    return n;
}

void zd__autograd_node_release_saved(zd_autograd_node_t *n)
{
    pthread_mutex_lock(&n->lock);
    for (int i = 0; i < ZD_AUTOGRAD_MAX_SAVED; i++)
        zd_tensor_unref_p(&n->saved[i]);
    if (n->ops->release && n->ctx)
        n->ops->release(n);
    n->ctx = NULL;
    n->released = true;
    pthread_mutex_unlock(&n->lock);
}

/*  Long chains (an RNN unrolled for 10,000 steps) would overflow the stack if
    freeing recursed through edges, so nodes whose count drops to zero go on
    an explicit work list. */
void zd_autograd_node_unref(zd_autograd_node_t *n)
{
    zd_autograd_node_t *stack_buf[64];
    zd_autograd_node_t **stack = stack_buf;
    size_t cap = 64, top = 0;
    if (!n || atomic_fetch_sub(&n->refcount, 1) != 1)
        return;
    stack[top++] = n;
    while (top > 0) {
        zd_autograd_node_t *m = stack[--top];
        for (int j = 0; j < m->n_inputs; j++) {
            zd_tensor_unref(m->edges[j].leaf);
            zd_autograd_node_t *next = m->edges[j].node;
            if (!next || atomic_fetch_sub(&next->refcount, 1) != 1)
                continue;
            if (top == cap) {
                size_t ncap = cap * 2;
                zd_autograd_node_t **ns = malloc(ncap * sizeof *ns);
                if (!ns) {
                    /* Out of memory while freeing: leaking beats crashing. */
                    continue;
                }
                memcpy(ns, stack, top * sizeof *ns);
                if (stack != stack_buf)
                    free(stack);
                stack = ns;
                cap = ncap;
            }
            stack[top++] = next;
        }
        zd__autograd_node_release_saved(m);
        pthread_mutex_destroy(&m->lock);
        free(m->edges);
        free(m->out_dims);
        free(m->out_ndim);
        free(m);
    }
    if (stack != stack_buf)
        free(stack);
}

void zd_autograd_node_save(zd_autograd_node_t *n, int i, zd_tensor_t *t)
{
    if (i < 0 || i >= ZD_AUTOGRAD_MAX_SAVED)
        return;
    zd_tensor_unref(n->saved[i]);
    /* An op that saves its own output (exp, relu) would make the output own
       the node and the node own the output: keep a view without history
       instead, sharing the data, so the cycle never forms. Out of memory,
       nothing is kept and the node's backward fails. */
    bool own_output = t && t->grad_fn == n;
    n->saved[i] = own_output ? zd_tensor_detach(t) : zd_tensor_ref(t);
    if (own_output && !n->saved[i])
        n->lost_saved = true;
    n->has_state = true;
}

zd_tensor_t *zd_autograd_node_saved(const zd_autograd_node_t *n, int i)
{
    return i >= 0 && i < ZD_AUTOGRAD_MAX_SAVED ? n->saved[i] : NULL;
}

void zd_autograd_node_set_ctx(zd_autograd_node_t *n, void *ctx)
{
    n->ctx = ctx;
    n->has_state = true;
}
void *zd_autograd_node_ctx(const zd_autograd_node_t *n)
{
    return n->ctx;
}

void zd_autograd_node_set_output(zd_autograd_node_t *n, zd_tensor_t *out)
{
    int i = n->outputs_set++;
    if (i < n->n_outputs) {
        n->out_ndim[i] = out->ndim;
        memcpy(n->out_dims + (size_t)i * ZD_TENSOR_MAX_DIMS, out->shape,
               sizeof(int64_t) * (size_t)out->ndim);
    }
    for (int k = 0; k < ZD_AUTOGRAD_MAX_SAVED; k++) {
        if (n->saved[k] == out) {
            /* saved before it became the output: a view, no cycle (as in
               zd_autograd_node_save) */
            n->saved[k] = zd_tensor_detach(out);
            n->lost_saved |= !n->saved[k];
            zd_tensor_unref(out);
        }
    }
    zd_autograd_node_unref(out->grad_fn);
    out->grad_fn = zd_autograd_node_ref(n);
    out->output_nr = i;
    out->requires_grad = true;
}

void zd_autograd_node_set_output_shape(zd_autograd_node_t *n, const zd_tensor_t *like)
{
    int i = n->outputs_set++;
    if (i < n->n_outputs) {
        n->out_ndim[i] = like->ndim;
        memcpy(n->out_dims + (size_t)i * ZD_TENSOR_MAX_DIMS, like->shape,
               sizeof(int64_t) * (size_t)like->ndim);
    }
}

bool zd_autograd_node_needs_grad(const zd_autograd_node_t *n, int j)
{
    return j >= 0 && j < n->n_inputs && (n->edges[j].node || n->edges[j].leaf);
}

int zd_autograd_node_n_inputs(const zd_autograd_node_t *n)
{
    return n->n_inputs;
}
int zd_autograd_node_n_outputs(const zd_autograd_node_t *n)
{
    return n->n_outputs;
}
const char *zd_autograd_node_name(const zd_autograd_node_t *n)
{
    return n->ops->name;
}

const zd_autograd_edge_t *zd_autograd_node_edge(const zd_autograd_node_t *n, int j)
{
    return j >= 0 && j < n->n_inputs ? &n->edges[j] : NULL;
}

const int64_t *zd_autograd_node_output_shape(const zd_autograd_node_t *n, int i, int *ndim)
{
    if (i < 0 || i >= n->n_outputs) {
        *ndim = 0;
        return NULL;
    }
    *ndim = n->out_ndim[i];
    return n->out_dims + (size_t)i * ZD_TENSOR_MAX_DIMS;
}
