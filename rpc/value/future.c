/* SPDX-License-Identifier: MIT */
/*  future.c: futures with timed waits, callbacks, wait-all and wait-any.

    Completion publishes the result under the future's lock and then runs the
    callbacks outside it, in the order they were added. wait_all / wait_any
    do not poll: they register a callback on each pending future that signals
    one shared waiter, and unregister it when they leave.

    A thread that sleeps in a wait tells the RPC agent first, through the
    hooks it installs (rpc/value/future_hook.h): on a pool thread the pool starts
    another thread meanwhile, so waits inside handlers cannot deadlock it. */
#include <zdist/future.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "rpc/value/future_hook.h"

typedef struct callback {
    zd_future_fn *cb;
    void (*drop)(void *arg); /* if the future dies before running cb */
    void *arg;
    struct callback *next;
} callback_t;

struct zd_future {
    atomic_int refcount;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    atomic_bool done; /* set (release) after value/error are written */
    zd_value_t *value;
    char *error;           /* NULL while pending or after a value */
    zd_error_code_t code;  /* the error's kind */
    callback_t *callbacks; /* pending callbacks, in order */
    callback_t **tail;
};

static char oom_error[] = "out of memory";

static _Atomic(const rpc_future_wait_hooks_t *) g_wait_hooks;

void zd__future_set_wait_hooks(const rpc_future_wait_hooks_t *hooks)
{
    atomic_store(&g_wait_hooks, hooks);
}

static void block_begin(const rpc_future_wait_hooks_t *h)
{
    if (h && h->block_begin)
        h->block_begin();
}

static void block_end(const rpc_future_wait_hooks_t *h)
{
    if (h && h->block_end)
        h->block_end();
}

/*  ---- monotonic deadlines ---- */

typedef struct {
    bool forever;
    struct timespec at; /* CLOCK_MONOTONIC */
} deadline_t;

/*  Beyond a century "later" is as good as never, and cannot overflow. */
#define CENTURY_MS (ZD__MS_PER_S * 3600 * 24 * 365 * 100)

/*  timeout_ms as in error.h: <= 0 (default or none) is no limit for waits. */
static deadline_t deadline_in(int64_t timeout_ms)
{
    deadline_t d = {timeout_ms <= 0, {0, 0}};
    if (d.forever)
        return d;
    if (timeout_ms > CENTURY_MS)
        timeout_ms = CENTURY_MS;
    d.at = zd__timespec_in(CLOCK_MONOTONIC, timeout_ms);
    return d;
}

/*  Waits on cond until signalled or the deadline; false once it has passed. */
static bool cond_wait_until(pthread_cond_t *cond, pthread_mutex_t *lock, const deadline_t *d)
{
    if (d->forever) {
        pthread_cond_wait(cond, lock);
        return true;
    }
    return pthread_cond_timedwait(cond, lock, &d->at) != ETIMEDOUT;
}

static int cond_init_monotonic(pthread_cond_t *cond)
{
    pthread_condattr_t attr;
    if (pthread_condattr_init(&attr) != 0)
        return -1;
    int rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cond, &attr);
    pthread_condattr_destroy(&attr);
    return rc == 0 ? 0 : -1;
}

/*  ---- futures ---- */

zd_future_t *zd_future_new(void)
{
    zd_future_t *f = calloc(1, sizeof *f);
    if (!f) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "rpc future: out of memory");
        return NULL;
    }
    if (cond_init_monotonic(&f->cond) < 0) {
        free(f);
        zd_error_set("rpc future: cannot create a condition variable");
        return NULL;
    }
    pthread_mutex_init(&f->lock, NULL);
    atomic_init(&f->refcount, 1);
    atomic_init(&f->done, false);
    f->tail = &f->callbacks;
    return f;
}

zd_future_t *zd_future_ref(zd_future_t *f)
{
    if (f)
        atomic_fetch_add_explicit(&f->refcount, 1, memory_order_relaxed);
    return f;
}

void zd_future_unref(zd_future_t *f)
{
    if (!f || atomic_fetch_sub_explicit(&f->refcount, 1, memory_order_acq_rel) != 1)
        return;
    /* Never completed: its callbacks will never run, but internal ones own
       references that must go. */
    callback_t *c = f->callbacks;
    while (c) {
        callback_t *next = c->next;
        if (c->drop)
            c->drop(c->arg);
        free(c);
        c = next;
    }
    zd_value_unref(f->value);
    if (f->error != oom_error)
        free(f->error);
    pthread_cond_destroy(&f->cond);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/*  Publishes the result (value or error, ownership taken) and runs callbacks.
    Returns -1 and gives nothing back when f was already complete. */
static int future_complete(zd_future_t *f, zd_value_t *value, char *error, zd_error_code_t code)
{
    pthread_mutex_lock(&f->lock);
    if (atomic_load_explicit(&f->done, memory_order_relaxed)) {
        pthread_mutex_unlock(&f->lock);
        return zd_error_set("rpc future: already completed");
    }
    f->value = value;
    f->error = error;
    f->code = error ? (code == ZD_OK ? ZD_ERR_OTHER : code) : ZD_OK;
    atomic_store_explicit(&f->done, true, memory_order_release);
    callback_t *c = f->callbacks;
    f->callbacks = NULL;
    f->tail = &f->callbacks;
    pthread_cond_broadcast(&f->cond);
    /* A callback may drop the last outside reference to f. */
    zd_future_ref(f);
    pthread_mutex_unlock(&f->lock);
    while (c) {
        callback_t *next = c->next;
        c->cb(f, c->arg);
        free(c);
        c = next;
    }
    zd_future_unref(f);
    return 0;
}

int zd_future_set_value(zd_future_t *f, zd_value_t *value)
{
    if (!f)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_future_set_value: NULL future");
    if (zd_future_done(f)) /* cheap early refusal; future_complete decides */
        return zd_error_set("rpc future: already completed");
    zd_value_t *v = value ? zd_value_ref(value) : zd_value_none();
    if (!v)
        return future_complete(f, NULL, oom_error, ZD_ERR_NO_MEMORY);
    if (future_complete(f, v, NULL, ZD_OK) < 0) {
        zd_value_unref(v);
        return -1;
    }
    return 0;
}

/*  A malloc'ed copy of the formatted text (never empty: that would read as
    "no error"), or oom_error. */
static char *format_error(const char *fmt, va_list ap)
{
    if (!fmt || !fmt[0])
        fmt = "unknown error";
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!text)
        return oom_error;
    vsnprintf(text, (size_t)n + 1, fmt, ap);
    if (!text[0]) {
        free(text);
        text = strdup("unknown error");
    }
    return text ? text : oom_error;
}

static int set_error(zd_future_t *f, zd_error_code_t code, const char *fmt, va_list ap)
{
    if (!f)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_future_set_error: NULL future");
    if (zd_future_done(f))
        return zd_error_set("rpc future: already completed");
    char *text = format_error(fmt, ap);
    if (future_complete(f, NULL, text, text == oom_error ? ZD_ERR_NO_MEMORY : code) < 0) {
        if (text != oom_error)
            free(text);
        return -1;
    }
    return 0;
}

int zd_future_set_error(zd_future_t *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = set_error(f, ZD_ERR_OTHER, fmt, ap);
    va_end(ap);
    return rc;
}

int zd_future_set_error_code(zd_future_t *f, zd_error_code_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = set_error(f, code, fmt, ap);
    va_end(ap);
    return rc;
}

bool zd_future_done(const zd_future_t *f)
{
    return f && atomic_load_explicit(&((zd_future_t *)f)->done, memory_order_acquire);
}

zd_value_t *zd_future_value(const zd_future_t *f)
{
    return zd_future_done(f) ? f->value : NULL;
}

const char *zd_future_error(const zd_future_t *f)
{
    return zd_future_done(f) && f->error ? f->error : "";
}

zd_error_code_t zd_future_error_code(const zd_future_t *f)
{
    return zd_future_done(f) && f->error ? f->code : ZD_OK;
}

/*  The outcome of a completed future as a return code (error text set). */
static int future_result(const zd_future_t *f)
{
    if (f->error)
        return zd_error_set_code(f->code, "%s", f->error);
    return 0;
}

int zd_future_wait(zd_future_t *f, int64_t timeout_ms)
{
    if (!f)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_future_wait: NULL future");
    if (zd_future_done(f))
        return future_result(f);
    const rpc_future_wait_hooks_t *h = atomic_load(&g_wait_hooks);
    int64_t max_ns = timeout_ms > 0 && timeout_ms < ZD__NEVER / ZD__NS_PER_MS
        ? timeout_ms * ZD__NS_PER_MS
        : ZD__NEVER;
    if (h && h->poll && h->poll(f, max_ns))
        return future_result(f);
    deadline_t d = deadline_in(timeout_ms);
    int rc = 0;
    block_begin(h);
    pthread_mutex_lock(&f->lock);
    while (!atomic_load_explicit(&f->done, memory_order_relaxed))
        if (!cond_wait_until(&f->cond, &f->lock, &d) &&
            !atomic_load_explicit(&f->done, memory_order_relaxed)) {
            rc = zd_error_set_code(ZD_ERR_TIMEOUT, "timed out after %" PRId64 " ms", timeout_ms);
            break;
        }
    pthread_mutex_unlock(&f->lock);
    block_end(h);
    return rc < 0 ? rc : future_result(f);
}

/*  Adds a callback; runs it at once (outside the lock) when f is complete. */
static int future_add(zd_future_t *f, zd_future_fn *cb, void (*drop)(void *), void *arg,
                      callback_t **added)
{
    if (added)
        *added = NULL;
    if (zd_future_done(f)) {
        cb(f, arg);
        return 0;
    }
    callback_t *c = malloc(sizeof *c);
    if (!c)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_future_then: out of memory");
    c->cb = cb;
    c->drop = drop;
    c->arg = arg;
    c->next = NULL;
    pthread_mutex_lock(&f->lock);
    if (atomic_load_explicit(&f->done, memory_order_relaxed)) {
        pthread_mutex_unlock(&f->lock);
        free(c);
        cb(f, arg);
        return 0;
    }
    *f->tail = c;
    f->tail = &c->next;
    pthread_mutex_unlock(&f->lock);
    if (added)
        *added = c;
    return 0;
}

/*  Takes c out of f's pending callbacks. False when completion already took it
    (it has run or is about to run). */
static bool future_remove(zd_future_t *f, callback_t *c)
{
    bool found = false;
    pthread_mutex_lock(&f->lock);
    for (callback_t **p = &f->callbacks; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            if (f->tail == &c->next)
                f->tail = p;
            found = true;
            break;
        }
    pthread_mutex_unlock(&f->lock);
    if (found)
        free(c);
    return found;
}

bool zd__future_unthen(zd_future_t *f, zd_future_fn *cb, void *arg)
{
    callback_t *found = NULL;
    pthread_mutex_lock(&f->lock);
    for (callback_t *c = f->callbacks; c; c = c->next)
        if (c->cb == cb && c->arg == arg) {
            found = c;
            break;
        }
    pthread_mutex_unlock(&f->lock);
    return found && future_remove(f, found);
}

int zd_future_then(zd_future_t *f, zd_future_fn *cb, void *arg)
{
    if (!f || !cb)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_future_then: NULL %s",
                                 f ? "callback" : "future");
    return future_add(f, cb, NULL, arg, NULL);
}

/*  ---- waiting for several futures ---- */

/*  Shared by one wait_all/wait_any call and the callbacks it registered; each
    holds a reference, since a callback may run after the call has returned. */
typedef struct {
    atomic_int refcount;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    callback_t **added; /* per future: registered callback or NULL */
} waiter_t;

static void waiter_unref(void *arg)
{
    waiter_t *w = arg;
    if (atomic_fetch_sub_explicit(&w->refcount, 1, memory_order_acq_rel) != 1)
        return;
    pthread_cond_destroy(&w->cond);
    pthread_mutex_destroy(&w->lock);
    free(w->added);
    free(w);
}

static void waiter_signal(zd_future_t *f, void *arg)
{
    (void)f;
    waiter_t *w = arg;
    /* Locking orders the signal after the waiter's check of the futures. */
    pthread_mutex_lock(&w->lock);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    waiter_unref(w);
}

/*  Unregisters from every future; callbacks already taken by a completion
    keep their reference and drop it when they run. */
static void waiter_leave(waiter_t *w, zd_future_t *const *fs, int n)
{
    for (int i = 0; i < n; i++)
        if (w->added[i] && future_remove(fs[i], w->added[i]))
            waiter_unref(w);
    waiter_unref(w);
}

static waiter_t *waiter_join(zd_future_t *const *fs, int n)
{
    waiter_t *w = calloc(1, sizeof *w);
    if (w)
        w->added = calloc((size_t)n, sizeof *w->added);
    if (!w || !w->added || cond_init_monotonic(&w->cond) < 0) {
        if (w)
            free(w->added);
        free(w);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "rpc future: out of memory for a waiter");
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    atomic_init(&w->refcount, 1);
    for (int i = 0; i < n; i++) {
        if (zd_future_done(fs[i]))
            continue;
        atomic_fetch_add(&w->refcount, 1);
        if (future_add(fs[i], waiter_signal, waiter_unref, w, &w->added[i]) < 0) {
            waiter_unref(w);
            waiter_leave(w, fs, i);
            return NULL;
        }
    }
    return w;
}

static int check_array(const char *fn, zd_future_t *const *fs, int n)
{
    if (n < 0 || (n > 0 && !fs))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: bad array of %d futures", fn, n);
    for (int i = 0; i < n; i++)
        if (!fs[i])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: future %d is NULL", fn, i);
    return 0;
}

/*  wait_all's verdict so far: 1 all done with values, -1 a failure (error set),
    0 still waiting. */
static int all_state(zd_future_t *const *fs, int n, int *n_done)
{
    *n_done = 0;
    for (int i = 0; i < n; i++) {
        if (!zd_future_done(fs[i]))
            continue;
        if (fs[i]->error)
            return future_result(fs[i]);
        (*n_done)++;
    }
    return *n_done == n ? 1 : 0;
}

int zd_future_wait_all(zd_future_t *const *fs, int n, int64_t timeout_ms)
{
    if (check_array("zd_future_wait_all", fs, n) < 0)
        return -1;
    int n_done;
    int state = all_state(fs, n, &n_done);
    if (state != 0)
        return state > 0 ? 0 : -1;
    deadline_t d = deadline_in(timeout_ms);
    waiter_t *w = waiter_join(fs, n);
    if (!w)
        return -1;
    const rpc_future_wait_hooks_t *h = atomic_load(&g_wait_hooks);
    block_begin(h);
    pthread_mutex_lock(&w->lock);
    while ((state = all_state(fs, n, &n_done)) == 0)
        if (!cond_wait_until(&w->cond, &w->lock, &d) && (state = all_state(fs, n, &n_done)) == 0) {
            zd_error_set_code(ZD_ERR_TIMEOUT,
                              "timed out after %" PRId64 " ms (%d of %d futures done)", timeout_ms,
                              n_done, n);
            state = -1;
            break;
        }
    pthread_mutex_unlock(&w->lock);
    block_end(h);
    waiter_leave(w, fs, n);
    return state > 0 ? 0 : -1;
}

static int first_done(zd_future_t *const *fs, int n)
{
    for (int i = 0; i < n; i++)
        if (zd_future_done(fs[i]))
            return i;
    return -1;
}

int zd_future_wait_any(zd_future_t *const *fs, int n, int64_t timeout_ms, int *index)
{
    if (check_array("zd_future_wait_any", fs, n) < 0)
        return -1;
    if (n == 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_future_wait_any: no futures");
    int i = first_done(fs, n);
    if (i < 0) {
        deadline_t d = deadline_in(timeout_ms);
        waiter_t *w = waiter_join(fs, n);
        if (!w)
            return -1;
        const rpc_future_wait_hooks_t *h = atomic_load(&g_wait_hooks);
        block_begin(h);
        pthread_mutex_lock(&w->lock);
        while ((i = first_done(fs, n)) < 0)
            if (!cond_wait_until(&w->cond, &w->lock, &d) && (i = first_done(fs, n)) < 0)
                break;
        pthread_mutex_unlock(&w->lock);
        block_end(h);
        waiter_leave(w, fs, n);
        if (i < 0)
            return zd_error_set_code(ZD_ERR_TIMEOUT,
                                     "timed out after %" PRId64 " ms (none of %d futures done)",
                                     timeout_ms, n);
    }
    if (index)
        *index = i;
    return 0;
}

/*  ---- collecting the values of several futures ---- */

typedef struct collect collect_t;

typedef struct {
    collect_t *c;
    int i;
} collect_slot_t;

/*  Shared by the callbacks of one zd_future_collect_all; the last of them
    (or the call itself, which counts as one more) completes and frees it. */
struct collect {
    atomic_int left;
    atomic_bool failed; /* error and code hold the first failure */
    char *error;
    zd_error_code_t code;
    zd_future_t *out;
    zd_value_t **values;
    collect_slot_t *slots;
    int n;
};

static void collect_fail(collect_t *c, zd_error_code_t code, const char *text)
{
    if (atomic_exchange(&c->failed, true))
        return;
    c->error = strdup(text);
    c->code = c->error ? code : ZD_ERR_NO_MEMORY;
}

static void collect_arrive(collect_t *c)
{
    if (atomic_fetch_sub(&c->left, 1) != 1)
        return;
    if (atomic_load(&c->failed)) {
        zd_future_set_error_code(c->out, c->code, "%s", c->error ? c->error : "out of memory");
    } else {
        zd_value_t *list = zd_value_list((size_t)c->n);
        for (int i = 0; list && i < c->n; i++) {
            if (zd_list_append(list, c->values[i]) < 0) {
                zd_value_unref(list);
                list = NULL;
            }
            c->values[i] = NULL;
        }
        if (list)
            zd_future_set_value(c->out, list);
        else
            zd_future_set_error_code(c->out, ZD_ERR_NO_MEMORY,
                                     "zd_future_collect_all: out of memory");
        zd_value_unref(list);
    }
    free(c->error);
    for (int i = 0; i < c->n; i++)
        zd_value_unref(c->values[i]);
    zd_future_unref(c->out);
    free(c->values);
    free(c->slots);
    free(c);
}

static void collect_one(zd_future_t *f, void *arg)
{
    collect_slot_t *slot = arg;
    if (f->error)
        collect_fail(slot->c, f->code, f->error);
    else
        slot->c->values[slot->i] = zd_value_ref(f->value);
    collect_arrive(slot->c);
}

/*  A future dropped before it completed: its value will never come. */
static void collect_drop(void *arg)
{
    collect_slot_t *slot = arg;
    char text[128];
    snprintf(text, sizeof text, "zd_future_collect_all: future %d was freed before it completed",
             slot->i);
    collect_fail(slot->c, ZD_ERR_OTHER, text);
    collect_arrive(slot->c);
}

zd_future_t *zd_future_collect_all(zd_future_t *const *fs, int n)
{
    if (check_array("zd_future_collect_all", fs, n) < 0)
        return NULL;
    zd_future_t *out = zd_future_new();
    collect_t *c = calloc(1, sizeof *c);
    if (c) {
        c->values = calloc((size_t)n + 1, sizeof *c->values);
        c->slots = calloc((size_t)n + 1, sizeof *c->slots);
    }
    if (!out || !c || !c->values || !c->slots) {
        if (c) {
            free(c->values);
            free(c->slots);
        }
        free(c);
        zd_future_unref(out);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_future_collect_all: out of memory");
        return NULL;
    }
    c->out = zd_future_ref(out);
    c->n = n;
    atomic_init(&c->left, n + 1);
    atomic_init(&c->failed, false);
    for (int i = 0; i < n; i++) {
        c->slots[i].c = c;
        c->slots[i].i = i;
        if (future_add(fs[i], collect_one, collect_drop, &c->slots[i], NULL) < 0) {
            collect_fail(c, ZD_ERR_NO_MEMORY, "zd_future_collect_all: out of memory");
            collect_arrive(c);
        }
    }
    collect_arrive(c);
    return out;
}
