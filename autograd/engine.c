/* SPDX-License-Identifier: MIT */
/*  engine.c: the local backward pass.

    Two phases. First a walk from the roots finds every node that can receive
    a gradient and counts, for each, how many edges lead into it. Then nodes
    run as their count drops to zero, each with the sum of the gradients its
    consumers sent; so a node shared by several paths runs once, after all of
    them, exactly as PyTorch's engine does. */
#include "autograd/autograd_private.h"
#include "core/sized.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>

static _Thread_local bool grad_disabled;

bool zd_autograd_set_grad_enabled(bool enabled)
{
    bool prev = !grad_disabled;
    grad_disabled = !enabled;
    return prev;
}

bool zd_autograd_is_grad_enabled(void)
{
    return !grad_disabled;
}

/*  Per-node state of one task, in a pointer-keyed open-addressing table. */
typedef struct {
    zd_autograd_node_t *node;
    int deps;   /* edges from not-yet-run nodes of the task */
    bool start; /* runs only once fed from outside */
    bool fed;
    bool done;
    zd_tensor_t **grads; /* n_outputs buffered input gradients */
} task_entry_t;

typedef struct {
    task_entry_t *slots;
    size_t cap; /* power of two */
    size_t used;
} task_map_t;

static size_t ptr_hash(const void *p)
{
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static task_entry_t *map_find(task_map_t *m, zd_autograd_node_t *n)
{
    size_t i = ptr_hash(n) & (m->cap - 1);
    while (m->slots[i].node && m->slots[i].node != n)
        i = (i + 1) & (m->cap - 1);
    return &m->slots[i];
}

static int map_grow(task_map_t *m)
{
    task_map_t bigger = {calloc(m->cap * 2, sizeof(task_entry_t)), m->cap * 2, m->used};
    if (!bigger.slots)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].node)
            *map_find(&bigger, m->slots[i].node) = m->slots[i];
    free(m->slots);
    *m = bigger;
    return 0;
}

/*  Entry for n, or NULL when n is not part of the task. */
static task_entry_t *map_lookup(task_map_t *m, zd_autograd_node_t *n)
{
    task_entry_t *e = map_find(m, n);
    return e->node ? e : NULL;
}

/*  Entry for n, created when absent (*created tells which). Grows the table
    only when inserting, so entry pointers stay valid across look-ups of
    nodes that are already present. */
static task_entry_t *map_get(task_map_t *m, zd_autograd_node_t *n, bool *created)
{
    task_entry_t *e = map_find(m, n);
    *created = e->node == NULL;
    if (!*created)
        return e;
    if ((m->used + 1) * 2 > m->cap) {
        if (map_grow(m) < 0)
            return NULL;
        e = map_find(m, n);
    }
    e->grads = calloc((size_t)(n->n_outputs > 0 ? n->n_outputs : 1), sizeof(zd_tensor_t *));
    if (!e->grads) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
        return NULL;
    }
    e->node = zd_autograd_node_ref(n);
    m->used++;
    return e;
}

static void map_free(task_map_t *m)
{
    for (size_t i = 0; i < m->cap; i++) {
        task_entry_t *e = &m->slots[i];
        if (!e->node)
            continue;
        for (int k = 0; k < e->node->n_outputs; k++)
            zd_tensor_unref(e->grads[k]);
        free(e->grads);
        zd_autograd_node_unref(e->node);
    }
    free(m->slots);
}

typedef struct {
    zd_autograd_node_t **items;
    size_t len, cap;
} node_stack_t;

static int stack_push(node_stack_t *s, zd_autograd_node_t *n)
{
    if (s->len == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        zd_autograd_node_t **ni = realloc(s->items, ncap * sizeof *ni);
        if (!ni)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
        s->items = ni;
        s->cap = ncap;
    }
    s->items[s->len++] = n;
    return 0;
}

static void shape_str(char *buf, size_t size, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(buf, size, "[");
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, d ? ",%lld" : "%lld", (long long)shape[d]);
    if (at < size)
        snprintf(buf + at, size - at, "]");
}

/*  Whether two shapes are the same but for dimensions of size 1 ([1] and
    [], [n,1] and [n]): the same elements in the same order. */
static bool same_layout(int na, const int64_t *a, int nb, const int64_t *b)
{
    int i = 0, j = 0;
    for (;;) {
        while (i < na && a[i] == 1)
            i++;
        while (j < nb && b[j] == 1)
            j++;
        if (i == na || j == nb)
            return i == na && j == nb;
        if (a[i++] != b[j++])
            return false;
    }
}

/*  A gradient for output i of n must be float32 and, where the output's
    shape was recorded, of that shape (up to dimensions of size 1, as a
    gradient of shape [1] for a scalar loss): backward functions read as
    many elements as their output had, whatever the gradient holds (a
    gradient from another process is checked exactly before it gets here).
    code: ZD_ERR_ARGUMENT for a gradient the caller gave, ZD_ERR_OTHER for
    one a backward function produced. */
static int check_grad(const zd_autograd_node_t *n, int i, const zd_tensor_t *g,
                      zd_error_code_t code)
{
    if (g->dtype != ZD_FLOAT32)
        return zd_error_set_code(code,
                                 "autograd: a gradient of dtype %s for output %d of %s (float32 "
                                 "expected)",
                                 zd_tensor_dtype_name(g->dtype), i, n->ops->name);
    if (i >= n->outputs_set || i >= n->n_outputs)
        return 0;
    int ndim = n->out_ndim[i];
    const int64_t *shape = n->out_dims + (size_t)i * ZD_TENSOR_MAX_DIMS;
    if (same_layout(ndim, shape, g->ndim, g->shape))
        return 0;
    char want[128], got[128];
    shape_str(want, sizeof want, ndim, shape);
    shape_str(got, sizeof got, g->ndim, g->shape);
    return zd_error_set_code(
        code, "autograd: a gradient of shape %s for output %d of %s, whose shape is %s", got, i,
        n->ops->name, want);
}

/*  Adds g into *slot, taking a reference; sums in place only into a buffer
    nobody else can see. */
static int grad_add(zd_tensor_t **slot, zd_tensor_t *g)
{
    if (!*slot) {
        *slot = zd_tensor_ref(g);
        return 0;
    }
    zd_tensor_t *acc = *slot;
    if (acc->numel != g->numel)
        return zd_error_set("autograd: gradients of %lld and %lld elements meet at one tensor",
                            (long long)acc->numel, (long long)g->numel);
    bool exclusive = atomic_load(&acc->refcount) == 1 &&
        atomic_load(&acc->storage->refcount) == 1 && !acc->storage->release;
    if (!exclusive) {
        zd_tensor_t *copy = zd_tensor_detach_copy(acc);
        if (!copy)
            return -1;
        zd_tensor_unref(acc);
        *slot = acc = copy;
    }
    float *d = zd_tensor_data(acc);
    const float *s = zd_tensor_data(g);
    for (int64_t i = 0; i < acc->numel; i++)
        d[i] += s[i];
    return 0;
}

static int default_accumulate(void *arg, zd_tensor_t *leaf, zd_tensor_t *grad)
{
    (void)arg;
    return zd_tensor_accumulate_grad(leaf, grad);
}

static int leaf_accumulate(const zd_autograd_options_t *o, zd_tensor_t *leaf, zd_tensor_t *grad,
                           zd_error_code_t code)
{
    if (grad->dtype != leaf->dtype || grad->dtype != ZD_FLOAT32)
        return zd_error_set_code(code, "autograd: a gradient of dtype %s for a %s leaf",
                                 zd_tensor_dtype_name(grad->dtype),
                                 zd_tensor_dtype_name(leaf->dtype));
    if (grad->numel != leaf->numel)
        return zd_error_set_code(code, "autograd: gradient of %lld elements for a leaf of %lld",
                                 (long long)grad->numel, (long long)leaf->numel);
    zd_autograd_accumulate_fn *fn = o->accumulate ? o->accumulate : default_accumulate;
    return fn(o->accumulate_arg, leaf, grad);
}

struct zd_autograd_task {
    pthread_mutex_t lock;
    zd_autograd_options_t opts;
    task_map_t map;
    node_stack_t ready;
    int error; /* a failed node poisons the task */
};

/*  Walks the graph below the start nodes and counts dependencies. */
static int count_dependencies(task_map_t *map, zd_autograd_node_t *const *starts, int n_starts)
{
    node_stack_t todo = {0};
    int rc = 0;
    for (int i = 0; i < n_starts && rc == 0; i++) {
        bool created;
        task_entry_t *e = map_get(map, starts[i], &created);
        if (!e) {
            rc = -1;
            break;
        }
        e->start = true;
        if (created)
            rc = stack_push(&todo, starts[i]);
    }
    while (rc == 0 && todo.len > 0) {
        zd_autograd_node_t *n = todo.items[--todo.len];
        for (int j = 0; j < n->n_inputs && rc == 0; j++) {
            zd_autograd_node_t *next = n->edges[j].node;
            if (!next)
                continue;
            bool created;
            task_entry_t *e = map_get(map, next, &created);
            if (!e) {
                rc = -1;
                break;
            }
            e->deps++;
            if (created)
                rc = stack_push(&todo, next);
        }
    }
    free(todo.items);
    return rc;
}

static zd_tensor_t *zeros_for_output(zd_autograd_node_t *n, int i)
{
    int ndim;
    const int64_t *shape = zd_autograd_node_output_shape(n, i, &ndim);
    return zd_tensor_new(ZD_FLOAT32, shape, ndim);
}

static bool entry_ready(const task_entry_t *e)
{
    return !e->done && e->deps == 0 && (!e->start || e->fed);
}

/*  One fewer pending producer for the node behind edge. */
static int edge_done(zd_autograd_task_t *t, zd_autograd_node_t *node)
{
    task_entry_t *next = map_lookup(&t->map, node);
    if (!next)
        return zd_error_set("autograd: internal error: %s is not part of the task",
                            node->ops->name);
    next->deps--;
    return entry_ready(next) ? stack_push(&t->ready, node) : 0;
}

static int run_node(zd_autograd_task_t *t, task_entry_t *e)
{
    zd_autograd_node_t *n = e->node;
    const zd_autograd_options_t *o = &t->opts;
    int rc = 0;
    e->done = true;
    if (n->released && n->has_state)
        return zd_error_set("autograd: trying to backward through %s a second time; the graph's "
                            "saved tensors were freed by the first backward (pass retain_graph)",
                            n->ops->name);
    if (n->lost_saved)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "autograd: %s cannot run backward: out of "
                                 "memory when its forward saved a tensor",
                                 n->ops->name);
    for (int i = 0; i < n->n_outputs; i++)
        if (!e->grads[i] && !(e->grads[i] = zeros_for_output(n, i)))
            return -1;
    zd_tensor_t **gin = calloc((size_t)(n->n_inputs > 0 ? n->n_inputs : 1), sizeof *gin);
    if (!gin)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
    if (n->ops->backward(n, e->grads, gin) < 0) {
        rc = zd_error_wrap("autograd: %s failed", n->ops->name);
        goto done;
    }
    /* Let go of the outputs' gradients first: a node that passes one on as
       an input's (a snapshot's, an identity) then hands a leaf a gradient
       nobody else holds, which it keeps instead of copying. */
    for (int i = 0; i < n->n_outputs; i++)
        zd_tensor_unref_p(&e->grads[i]);
    for (int j = 0; j < n->n_inputs && rc == 0; j++) {
        const zd_autograd_edge_t *edge = &n->edges[j];
        if (edge->leaf && gin[j]) {
            rc = leaf_accumulate(o, edge->leaf, gin[j], ZD_ERR_OTHER);
        } else if (edge->node) {
            task_entry_t *next = map_lookup(&t->map, edge->node);
            if (gin[j] && next)
                rc = check_grad(edge->node, edge->output_nr, gin[j], ZD_ERR_OTHER);
            if (gin[j] && next && rc == 0)
                rc = grad_add(&next->grads[edge->output_nr], gin[j]);
            if (rc == 0)
                rc = edge_done(t, edge->node);
        }
    }
done:
    for (int j = 0; j < n->n_inputs; j++)
        zd_tensor_unref(gin[j]);
    free(gin);
    for (int i = 0; i < n->n_outputs; i++)
        zd_tensor_unref_p(&e->grads[i]);
    if (!o->retain_graph)
        zd__autograd_node_release_saved(n);
    return rc;
}

static int drain(zd_autograd_task_t *t)
{
    while (t->error == 0 && t->ready.len > 0) {
        zd_autograd_node_t *n = t->ready.items[--t->ready.len];
        task_entry_t *e = map_lookup(&t->map, n);
        if (e && !e->done && run_node(t, e) < 0)
            t->error = -1;
    }
    return t->error;
}

/*  The caller's options over the defaults, as far as its size reaches. */
static int read_options(const zd_autograd_options_t *opts, zd_autograd_options_t *o)
{
    *o = zd_autograd_options_default();
    if (opts &&
        zd__sized_read(o, sizeof *o, opts, ZD__SIZE_THROUGH(zd_autograd_options_t, accumulate_arg),
                       "zd_autograd_options_t", "zd_autograd_options_default()") < 0)
        return zd_error_wrap("autograd");
    return 0;
}

zd_autograd_task_t *zd_autograd_task_new(zd_autograd_node_t *const *starts, int n_starts,
                                         const zd_autograd_options_t *opts)
{
    if (!starts && n_starts > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_task_new: NULL starts");
        return NULL;
    }
    zd_autograd_options_t o;
    if (read_options(opts, &o) < 0)
        return NULL;
    zd_autograd_task_t *t = calloc(1, sizeof *t);
    if (!t) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->opts = o;
    t->map.cap = 64;
    t->map.slots = calloc(t->map.cap, sizeof(task_entry_t));
    if (!t->map.slots || count_dependencies(&t->map, starts, n_starts) < 0) {
        if (!t->map.slots)
            zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
        zd_autograd_task_free(t);
        return NULL;
    }
    return t;
}

static int feed_locked(zd_autograd_task_t *t, zd_autograd_node_t *node, zd_tensor_t *const *grads)
{
    task_entry_t *e = map_lookup(&t->map, node);
    if (!e || !e->start)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "autograd: %s was not given as a start of this backward pass",
                                 node->ops->name);
    if (e->done)
        return zd_error_set("autograd: %s already ran in this backward pass", node->ops->name);
    for (int k = 0; k < node->n_outputs; k++)
        if (grads && grads[k] &&
            (check_grad(node, k, grads[k], ZD_ERR_ARGUMENT) < 0 ||
             grad_add(&e->grads[k], grads[k]) < 0))
            return -1;
    e->fed = true;
    if (entry_ready(e) && stack_push(&t->ready, node) < 0)
        return -1;
    return 0;
}

int zd_autograd_task_feed(zd_autograd_task_t *t, zd_autograd_node_t *node,
                          zd_tensor_t *const *grads)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_task_feed: NULL task");
    if (!node)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_task_feed: NULL node");
    pthread_mutex_lock(&t->lock);
    int rc = t->error ? zd_error_set("autograd: the backward pass already failed") : 0;
    if (rc == 0 && (rc = feed_locked(t, node, grads)) == 0)
        rc = drain(t);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/*  The not-yet-run node holding gradients with the highest sequence number,
    and how many such nodes there are. */
static task_entry_t *pending_max(zd_autograd_task_t *t, int *count)
{
    task_entry_t *best = NULL;
    *count = 0;
    for (size_t i = 0; i < t->map.cap; i++) {
        task_entry_t *e = &t->map.slots[i];
        if (!e->node || e->done || (e->start && !e->fed))
            continue;
        bool has = e->fed;
        for (int k = 0; k < e->node->n_outputs && !has; k++)
            has = e->grads[k] != NULL;
        if (!has)
            continue;
        (*count)++;
        if (!best || e->node->seq > best->node->seq)
            best = e;
    }
    return best;
}

int zd_autograd_task_pending(zd_autograd_task_t *t, uint64_t *max_seq)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_task_pending: NULL task");
    pthread_mutex_lock(&t->lock);
    int count;
    task_entry_t *e = pending_max(t, &count);
    if (max_seq)
        *max_seq = e ? e->node->seq : 0;
    pthread_mutex_unlock(&t->lock);
    return count;
}

int zd_autograd_task_flush_one(zd_autograd_task_t *t)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_task_flush_one: NULL task");
    pthread_mutex_lock(&t->lock);
    int count, rc = t->error;
    task_entry_t *e = rc == 0 ? pending_max(t, &count) : NULL;
    if (e) {
        if (run_node(t, e) < 0)
            t->error = -1;
        else
            drain(t);
        rc = t->error;
    }
    pthread_mutex_unlock(&t->lock);
    return rc < 0 ? -1 : e != NULL;
}

int zd_autograd_task_flush(zd_autograd_task_t *t, int *ran)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_task_flush: NULL task");
    int count = 0, rc;
    while ((rc = zd_autograd_task_flush_one(t)) > 0)
        count++;
    if (ran)
        *ran = count;
    return rc;
}

void zd_autograd_task_free(zd_autograd_task_t *t)
{
    if (!t)
        return;
    if (t->map.slots)
        map_free(&t->map);
    free(t->ready.items);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int zd_autograd_run(const zd_autograd_root_t *roots, int n_roots, const zd_autograd_options_t *opts)
{
    if (!roots && n_roots > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_run: NULL roots");
    zd_autograd_options_t o;
    if (read_options(opts, &o) < 0)
        return -1;
    zd_autograd_node_t **starts = calloc((size_t)(n_roots > 0 ? n_roots : 1), sizeof *starts);
    zd_tensor_t *ones = NULL;
    zd_autograd_task_t *t = NULL;
    int n_starts = 0, rc = 0;
    if (!starts)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "autograd: out of memory");
    for (int i = 0; i < n_roots; i++) {
        const zd_autograd_root_t *r = &roots[i];
        if (r->node) {
            starts[n_starts++] = r->node;
            continue;
        }
        if (!r->tensor) {
            rc = zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_run: NULL tensor in root %d", i);
            goto out;
        }
        if (!r->tensor->requires_grad) {
            rc =
                zd_error_set_code(ZD_ERR_ARGUMENT,
                                  "autograd: element %d of the roots does not require grad and has "
                                  "no grad_fn",
                                  i);
            goto out;
        }
        if (!r->grad && r->tensor->numel != 1) {
            rc = zd_error_set_code(
                ZD_ERR_ARGUMENT,
                "autograd: grad can be implicitly created only for scalar outputs "
                "(root %d has %lld elements)",
                i, (long long)r->tensor->numel);
            goto out;
        }
        if (r->grad && r->grad->numel != r->tensor->numel) {
            rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                                   "autograd: root %d has %lld elements but its gradient %lld", i,
                                   (long long)r->tensor->numel, (long long)r->grad->numel);
            goto out;
        }
        if (r->tensor->grad_fn)
            starts[n_starts++] = r->tensor->grad_fn;
    }
    if (!(t = zd_autograd_task_new(starts, n_starts, &o))) {
        rc = -1;
        goto out;
    }
    /* Seed every root before running anything: two roots may share nodes. */
    for (int i = 0; i < n_roots && rc == 0; i++) {
        const zd_autograd_root_t *r = &roots[i];
        if (r->node) {
            rc = feed_locked(t, r->node, r->node_grads);
            continue;
        }
        zd_tensor_t *g = r->grad;
        if (!g) {
            if (!ones && !(ones = zd_tensor_empty(ZD_FLOAT32, r->tensor->shape, r->tensor->ndim))) {
                rc = -1;
                break;
            }
            zd_tensor_fill_(ones, 1.0f);
            g = ones;
        }
        if (!r->tensor->grad_fn) {
            rc = leaf_accumulate(&o, r->tensor, g, ZD_ERR_ARGUMENT);
            continue;
        }
        zd_autograd_node_t *n = r->tensor->grad_fn;
        task_entry_t *e = map_lookup(&t->map, n);
        rc = check_grad(n, r->tensor->output_nr, g, ZD_ERR_ARGUMENT);
        if (rc == 0)
            rc = grad_add(&e->grads[r->tensor->output_nr], g);
        if (rc == 0 && !e->fed) {
            e->fed = true;
            if (entry_ready(e))
                rc = stack_push(&t->ready, n);
        }
    }
    if (rc == 0)
        rc = drain(t);
out:
    zd_tensor_unref(ones);
    zd_autograd_task_free(t);
    free(starts);
    return rc;
}

int zd_autograd_backward(zd_tensor_t *root, zd_tensor_t *grad, bool retain_graph)
{
    if (!root)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_autograd_backward: NULL root");
    zd_autograd_root_t r = {.tensor = root, .grad = grad};
    zd_autograd_options_t o = zd_autograd_options_default();
    o.retain_graph = retain_graph;
    return zd_autograd_run(&r, 1, &o);
}
