/* SPDX-License-Identifier: MIT */
/*  serve.c: the function registry and incoming requests.

    The I/O thread decodes each request (always, even one it will refuse, so
    that RRefs inside it follow their protocol) and then either runs the
    handler at once (ZD_RPC_FN_INLINE) or queues it for the pool. The answer is
    sent by whichever thread finishes the call: the handler's thread, or the
    thread that completes an async handler's future.

    Nothing the peer says about itself is trusted: whether a call is
    internal (the RPC layer's own, like the shutdown barrier: no hooks, not
    a user call in metrics or the shutdown drain) is what this registry
    says of the function, never RPC_WIRE_F_INTERNAL; and a peer has at most
    max_calls_per_peer() calls queued or running here, beyond which it is
    answered "busy" instead of queued. */
#include "rpc/agent/agent.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/sized.h"
#include "rpc/world/membership.h"
#include "rpc/agent/rref.h"

/*  ---- registry (process-wide, kept across inits) ---- */

typedef struct entry {
    char *name;
    zd_rpc_function_t f;
    const char *what; /* internal (the RPC layer's own): what it is, for users */
    struct entry *next;
} entry_t;

#define REGISTRY_BUCKETS 256
static entry_t *registry[REGISTRY_BUCKETS];
static pthread_rwlock_t registry_lock = PTHREAD_RWLOCK_INITIALIZER;

static size_t name_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211u;
    return (size_t)(h % REGISTRY_BUCKETS);
}

/*  Copies the function called name[0..len) into *out; false when unknown. */
static bool registry_find(const char *name, size_t len, zd_rpc_function_t *out)
{
    bool found = false;
    pthread_rwlock_rdlock(&registry_lock);
    for (entry_t *e = registry[name_hash(name, len)]; e; e = e->next)
        if (strlen(e->name) == len && memcmp(e->name, name, len) == 0) {
            *out = e->f;
            found = true;
            break;
        }
    pthread_rwlock_unlock(&registry_lock);
    return found;
}

int zd_rpc_register_function(const char *name, const zd_rpc_function_t *in)
{
    zd_rpc_function_t fn = zd_rpc_function_default(), *f = in ? &fn : NULL;
    if (in &&
        zd__sized_read(&fn, sizeof fn, in, ZD__SIZE_THROUGH(zd_rpc_function_t, flags),
                       "zd_rpc_function_t", "zd_rpc_function_default()") < 0)
        return zd_error_wrap("zd_rpc_register(\"%s\")", name ? name : "(null)");
    size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > ZD_RPC_MAX_FUNCTION)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_register: bad function name (1 to %d characters)",
                                 ZD_RPC_MAX_FUNCTION);
    for (size_t i = 0; i < len; i++)
        if (name[i] < 0x21 || name[i] > 0x7e)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "zd_rpc_register: function name \"%s\" has a space or a "
                                     "non-printable character",
                                     name);
    if (!f || (!f->fn == !f->async_fn))
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "zd_rpc_register(\"%s\"): give exactly one of fn and async_fn", name);
    if (f->flags & ~ZD_RPC_FN_INLINE)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_register(\"%s\"): unknown flags 0x%x",
                                 name, f->flags);
    pthread_rwlock_wrlock(&registry_lock);
    size_t b = name_hash(name, len);
    for (entry_t *e = registry[b]; e; e = e->next)
        if (strcmp(e->name, name) == 0) {
            e->f = *f;
            pthread_rwlock_unlock(&registry_lock);
            return 0;
        }
    entry_t *e = malloc(sizeof *e);
    char *copy = strdup(name);
    if (!e || !copy) {
        pthread_rwlock_unlock(&registry_lock);
        free(e);
        free(copy);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rpc_register: out of memory");
    }
    e->name = copy;
    e->f = *f;
    e->what = NULL;
    e->next = registry[b];
    registry[b] = e;
    pthread_rwlock_unlock(&registry_lock);
    return 0;
}

int zd_rpc_register(const char *name, zd_rpc_handler_fn *fn, void *arg)
{
    zd_rpc_function_t f = zd_rpc_function_default();
    f.fn = fn;
    f.arg = arg;
    return zd_rpc_register_function(name, &f);
}

int zd_rpc_register_async(const char *name, zd_rpc_async_handler_fn *fn, void *arg)
{
    zd_rpc_function_t f = zd_rpc_function_default();
    f.async_fn = fn;
    f.arg = arg;
    return zd_rpc_register_function(name, &f);
}

int zd_rpc_register_inline(const char *name, zd_rpc_handler_fn *fn, void *arg)
{
    zd_rpc_function_t f = zd_rpc_function_default();
    f.fn = fn;
    f.arg = arg;
    f.flags = ZD_RPC_FN_INLINE;
    return zd_rpc_register_function(name, &f);
}

int zd_rpc_unregister(const char *name)
{
    if (!name)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_unregister: NULL name");
    pthread_rwlock_wrlock(&registry_lock);
    entry_t **pp = &registry[name_hash(name, strlen(name))];
    while (*pp && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    entry_t *e = *pp;
    if (e)
        *pp = e->next;
    pthread_rwlock_unlock(&registry_lock);
    if (!e)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_unregister: no function called \"%s\"",
                                 name);
    free(e->name);
    free(e);
    return 0;
}

/*  Marks name, registered, as the RPC layer's own, described to users as what. */
static void registry_mark_internal(const char *name, const char *what)
{
    pthread_rwlock_wrlock(&registry_lock);
    for (entry_t *e = registry[name_hash(name, strlen(name))]; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            e->what = what;
    pthread_rwlock_unlock(&registry_lock);
}

/*  The description of an internal function name[0..len), or NULL when it is
    unknown or not internal. */
static const char *registry_internal(const char *name, size_t len)
{
    const char *what = NULL;
    pthread_rwlock_rdlock(&registry_lock);
    for (entry_t *e = registry[name_hash(name, len)]; e; e = e->next)
        if (strlen(e->name) == len && memcmp(e->name, name, len) == 0) {
            what = e->what;
            break;
        }
    pthread_rwlock_unlock(&registry_lock);
    return what;
}

int zd__serve_register_internal(void)
{
    zd_rpc_function_t barrier = zd_rpc_function_default();
    barrier.async_fn = zd__shutdown_barrier_handler;
    barrier.flags = ZD_RPC_FN_INLINE;
    if (zd_rpc_register_function("__zd_barrier", &barrier) < 0)
        return -1;
    registry_mark_internal("__zd_barrier", "the shutdown barrier");
    if (zd_rpc_register("__zd_member", zd__membership_handler, NULL) < 0)
        return -1;
    registry_mark_internal("__zd_member", "a restarted process's new address");
    if (zd_rpc_register("__zd_lost", zd__membership_lost_handler, NULL) < 0)
        return -1;
    registry_mark_internal("__zd_lost", "a peer rank 0 lost");
    return 0;
}

/*  Calls one peer may have queued or running here at once (ZDIST_RPC_MAX_CALLS_PER_PEER,
    default RPC_MAX_CALLS_PER_PEER). Far above what a program makes (a
    trainer of rpc_ps has a handful in flight), low enough that a flood
    is refused rather than queued without end. */
#define RPC_MAX_CALLS_PER_PEER 4096
static int64_t max_calls;
static pthread_once_t max_calls_once = PTHREAD_ONCE_INIT;

static void max_calls_init(void)
{
    max_calls = RPC_MAX_CALLS_PER_PEER;
    const char *v = getenv("ZDIST_RPC_MAX_CALLS_PER_PEER");
    if (!v)
        return;
    char *end;
    long long n = strtoll(v, &end, 10);
    if (end != v && !*end && n > 0)
        max_calls = n;
    else
        zd__log(ZD_LOG_WARN,
                "rpc: ZDIST_RPC_MAX_CALLS_PER_PEER=\"%s\" is not a positive "
                "number: using %d",
                v, RPC_MAX_CALLS_PER_PEER);
}

int64_t zd__serve_max_calls_per_peer(void)
{
    pthread_once(&max_calls_once, max_calls_init);
    return max_calls;
}

/*  ---- incoming calls ---- */

struct zd_rpc_call {
    agent_t *a; /* valid only while a is running with gen */
    unsigned gen;
    int src;
    uint64_t id;
    uint8_t type;
    uint16_t flags;
    bool internal;
    const char *what; /* internal: the description for users */
    bool found;
    bool hooked; /* on_recv_request ran: on_send_reply is due */
    char fn[ZD_RPC_MAX_FUNCTION + 1];
    zd_rpc_function_t f;
    zd_value_t *args;
    uint8_t *extra;
    size_t extra_len;
    void *hook_state;
    uint64_t rref_id, fork_id;
    uint32_t timeout_ms;
    zd_future_t *owner_value;            /* REMOTE: to complete; FETCH: to wait for */
    zd_future_t *waiting;                /* an async handler's future, or a deref wait */
    zd_rpc_hooks_t hooks;                /* a copy: a call may outlive its agent */
    uint8_t route[RPC_WIRE_SYNC_ID_LEN]; /* answer on the caller's zd_rpc_sync socket */
    size_t route_len;
    struct zd_rpc_call *wprev, *wnext; /* in g_waiting while waiting is pending */
    bool listed;
};

/*  Calls whose answer waits for a future (an async handler's, an RRef's
    value): when their caller is lost, nobody will read the answer, and
    whatever the future stands for is work for nobody (cancel_peer). */
static pthread_mutex_t g_waiting_lock = PTHREAD_MUTEX_INITIALIZER;
static zd_rpc_call_t *g_waiting;

static void waiting_add(zd_rpc_call_t *c)
{
    pthread_mutex_lock(&g_waiting_lock);
    c->wprev = NULL;
    c->wnext = g_waiting;
    if (g_waiting)
        g_waiting->wprev = c;
    g_waiting = c;
    c->listed = true;
    pthread_mutex_unlock(&g_waiting_lock);
}

static void waiting_remove(zd_rpc_call_t *c)
{
    pthread_mutex_lock(&g_waiting_lock);
    if (c->listed) {
        if (c->wprev)
            c->wprev->wnext = c->wnext;
        else
            g_waiting = c->wnext;
        if (c->wnext)
            c->wnext->wprev = c->wprev;
        c->listed = false;
    }
    pthread_mutex_unlock(&g_waiting_lock);
}

static void future_done(zd_future_t *f, void *arg);
static void finish_error(zd_rpc_call_t *c, const char *text, zd_error_code_t code);

int zd__serve_cancel_peer(agent_t *a, int src, const char *text)
{
    int n = 0, cap = 16;
    zd_rpc_call_t **cs = malloc((size_t)cap * sizeof *cs);
    zd_future_t **fs = malloc((size_t)cap * sizeof *fs);
    pthread_mutex_lock(&g_waiting_lock);
    for (zd_rpc_call_t *c = g_waiting; c && cs && fs; c = c->wnext) {
        if (c->a != a || c->src != src)
            continue;
        if (n == cap) {
            zd_rpc_call_t **more_c = realloc(cs, (size_t)cap * 2 * sizeof *cs);
            if (more_c)
                cs = more_c;
            zd_future_t **more_f = more_c ? realloc(fs, (size_t)cap * 2 * sizeof *fs) : NULL;
            if (!more_f)
                break;
            fs = more_f;
            cap *= 2;
        }
        cs[n] = c;
        fs[n++] = zd_future_ref(c->waiting);
    }
    pthread_mutex_unlock(&g_waiting_lock);
    /* Outside the lock. A call whose callback is still pending is ours
       once it is taken out (nothing else frees it); one whose future is
       completing finishes by itself. The future stays the application's. */
    int cancelled = 0;
    for (int i = 0; i < n; i++) {
        if (zd__future_unthen(fs[i], future_done, cs[i])) {
            waiting_remove(cs[i]);
            finish_error(cs[i], text, ZD_ERR_PEER);
            cancelled++;
        }
        zd_future_unref(fs[i]);
    }
    free(cs);
    free(fs);
    return cancelled;
}

int zd_rpc_call_caller_rank(const zd_rpc_call_t *call)
{
    return call ? call->src : -1;
}

const char *zd_rpc_call_caller_name(const zd_rpc_call_t *call)
{
    return call ? call->a->net.peers[call->src].name : "";
}

const char *zd_rpc_call_function(const zd_rpc_call_t *call)
{
    return call ? call->fn : "";
}

void zd_rpc_call_set_hook_state(zd_rpc_call_t *call, void *state)
{
    if (call)
        call->hook_state = state;
}

void *zd_rpc_call_hook_state(const zd_rpc_call_t *call)
{
    return call ? call->hook_state : NULL;
}

zd_rpc_call_kind_t zd_rpc_call_kind(const zd_rpc_call_t *call)
{
    if (call && call->type == RPC_MSG_REMOTE)
        return ZD_RPC_KIND_REMOTE;
    if (call && call->type == RPC_MSG_RREF_FETCH)
        return ZD_RPC_KIND_FETCH;
    return ZD_RPC_KIND_CALL;
}

/*  How texts for users name c's function: quoted, or what an internal one is. */
static const char *call_name(const zd_rpc_call_t *c, char *buf, size_t size)
{
    if (c->what)
        return c->what;
    snprintf(buf, size, "\"%s\"", c->fn);
    return buf;
}

static void call_free(zd_rpc_call_t *c, bool counted)
{
    agent_t *a = c->a;
    int src = c->src;
    bool internal = c->internal;
    zd_value_unref(c->args);
    zd_future_unref(c->owner_value);
    zd_future_unref(c->waiting);
    free(c->extra);
    free(c);
    /* Counted out only now: whoever sees no call being served (shutdown's
       count of work, a test counting objects back) sees its objects gone. */
    if (counted && !internal) {
        atomic_fetch_sub_explicit(&a->net.peers[src].m.serving, 1, memory_order_release);
        atomic_fetch_add_explicit(&a->net.peers[src].m.calls_served, 1, memory_order_relaxed);
    }
    if (counted)
        atomic_fetch_sub_explicit(&a->serving, 1, memory_order_release);
}

/*  Runs the reply hook; returns its extra bytes (or none). */
static zd_rpc_bytes_t reply_hook(zd_rpc_call_t *c, zd_value_t **result)
{
    zd_rpc_bytes_t extra = {NULL, 0};
    if (c->hooked && c->hooks.on_send_reply) {
        c->hooked = false;
        if (c->hooks.on_send_reply(c->hooks.arg, c, result, &extra) < 0 && *result) {
            zd_value_unref(*result);
            *result = NULL;
        }
        if (extra.len > RPC_WIRE_MAX_EXTRA) {
            free(extra.data);
            extra = (zd_rpc_bytes_t){NULL, 0};
        }
    }
    return extra;
}

/*  The agent to answer through (one more user), or NULL when the call
    outlived it: an async handler's future completed during or after
    shutdown. Such a call is only freed (its hook state released). */
static agent_t *answer_begin(zd_rpc_call_t *c)
{
    agent_t *a = zd__agent_acquire_gen(c->gen);
    if (a)
        return a;
    zd_value_t *none = NULL;
    zd_rpc_bytes_t extra = reply_hook(c, &none);
    free(extra.data);
    call_free(c, false);
    return NULL;
}

static void answer_value(agent_t *a, zd_rpc_call_t *c, zd_value_t *value);

/*  Answers with an ERROR: text, and code in field a (wire.h) for the caller's
    zd_error_code(). */
static void answer_error(agent_t *a, zd_rpc_call_t *c, const char *text, zd_error_code_t code)
{
    if (c->type == RPC_MSG_REMOTE && c->owner_value) {
        /* The owner knows the fork now: the failure becomes the value's (to_here
           reports it) and the caller gets its acknowledgement. */
        zd_future_set_error_code(c->owner_value, code, "%s", text);
        answer_value(a, c, NULL);
        return;
    }
    zd_value_t *none = NULL;
    zd_rpc_bytes_t extra = reply_hook(c, &none);
    zd_value_unref(none);
    size_t len = strlen(text);
    if (len > 65536)
        len = 65536;
    rpc_wire_header_t h = {.type = RPC_MSG_ERROR,
                           .id = c->id,
                           .a = (uint64_t)code,
                           .extra = extra.data,
                           .extra_len = extra.len,
                           .meta = (const uint8_t *)text,
                           .meta_len = len ? len : 1};
    if (!len)
        h.meta = (const uint8_t *)"?";
    if (zd__transport_send_routed(&a->net, c->src, c->route, c->route_len, &h, NULL, 0) < 0)
        zd__log(ZD_LOG_WARN, "rpc: cannot answer \"%s\" to rank %d: %s", c->fn, c->src,
                zd_error_last());
    free(extra.data);
    call_free(c, true);
}

/*  Answers with value (taken over). A result that cannot be sent is released
    before the error goes out, so that a caller who sees the error also sees
    the handler's objects freed, if it held the only reference. */
static void answer_value(agent_t *a, zd_rpc_call_t *c, zd_value_t *value)
{
    zd_value_t *v;
    if (c->type == RPC_MSG_REMOTE) {
        if (c->owner_value && value)
            zd_future_set_value(c->owner_value, value);
        zd_value_unref(value);
        v = zd_value_none();
    } else {
        v = value;
    }
    zd_rpc_bytes_t extra = reply_hook(c, &v);
    if (!v) {
        free(extra.data);
        if (c->type == RPC_MSG_REMOTE) {
            zd_future_unref(c->owner_value); /* answer with an ERROR */
            c->owner_value = NULL;
        }
        answer_error(a, c, "out of memory, or the reply hook failed", ZD_ERR_REMOTE);
        return;
    }
    rref_txn_t txn;
    zd__rref_txn_init(&txn, a);
    rpc_rref_codec_t codec = zd__rref_txn_codec(&txn);
    rpc_encoded_t enc = {0};
    if (zd__value_encode(v, &codec, c->src, &enc) < 0) {
        char text[512];
        char name[ZD_RPC_MAX_FUNCTION + 3];
        snprintf(text, sizeof text, "cannot send the result of %s: %s",
                 call_name(c, name, sizeof name), zd_error_last());
        zd__rref_txn_rollback(&txn);
        zd_value_unref(v);
        free(extra.data);
        answer_error(a, c, text, ZD_ERR_REMOTE);
        return;
    }
    rpc_wire_header_t h = {.type = RPC_MSG_REPLY,
                           .id = c->id,
                           .extra = extra.data,
                           .extra_len = extra.len,
                           .meta = enc.meta,
                           .meta_len = enc.meta_len};
    if (zd__transport_send_routed(&a->net, c->src, c->route, c->route_len, &h, enc.tensors,
                                  enc.n_tensors) < 0) {
        zd__log(ZD_LOG_WARN, "rpc: cannot answer \"%s\" to rank %d: %s", c->fn, c->src,
                zd_error_last());
        zd__rref_txn_rollback(&txn);
    } else {
        zd__rref_txn_commit(&txn);
    }
    zd__rpc_encoded_clear(&enc);
    zd_value_unref(v);
    free(extra.data);
    call_free(c, true);
}

static void finish_error(zd_rpc_call_t *c, const char *text, zd_error_code_t code)
{
    agent_t *a = answer_begin(c);
    if (a) {
        answer_error(a, c, text, code);
        zd__agent_release(a);
    }
}

/*  value taken over. */
static void finish_value(zd_rpc_call_t *c, zd_value_t *value)
{
    agent_t *a = answer_begin(c);
    if (a) {
        answer_value(a, c, value);
        zd__agent_release(a);
    } else {
        zd_value_unref(value);
    }
}

static void future_done(zd_future_t *f, void *arg)
{
    zd_rpc_call_t *c = arg;
    waiting_remove(c);
    if (zd_future_value(f))
        finish_value(c, zd_value_ref(zd_future_value(f)));
    else
        finish_error(c, zd_future_error(f), ZD_ERR_REMOTE);
}

static void run_call(void *arg);

static void drop_call(void *arg)
{
    finish_error(arg, "RPC shut down before the call could run", ZD_ERR_SHUTDOWN);
}

/*  Runs c now (inline functions) or on the pool. Also called from future
    callbacks, possibly while the agent shuts down (then c is dropped). */
static void schedule(zd_rpc_call_t *c)
{
    agent_t *a = answer_begin(c);
    if (!a)
        return;
    if (atomic_load(&a->net.closing))
        answer_error(a, c, "RPC shut down before the call could run", ZD_ERR_SHUTDOWN);
    else if (c->f.flags & ZD_RPC_FN_INLINE)
        run_call(c);
    else if (zd__pool_submit(a->pool, run_call, drop_call, c) < 0) {
        /* drop_call answered it */
    }
    zd__agent_release(a);
}

static void deref_ready(zd_future_t *f, void *arg)
{
    (void)f;
    schedule(arg);
}

/*  Replaces the RRef in args[0] by its value. 1 when done, 0 when the value
    is not there yet (run_call comes back later), -1 when it failed. */
static int deref_first(zd_rpc_call_t *c)
{
    zd_rref_t *r;
    if (zd_rpc_arg_rref(c->args, 0, &r) < 0)
        return -1;
    if (!r->is_owner)
        return zd_error_set("the RRef in the first argument is owned by rank %d, not here",
                            r->owner);
    if (!zd_future_done(r->value)) {
        if (c->waiting)
            return zd_error_set("RRef value still missing after its creation completed");
        c->waiting = zd_future_ref(r->value);
        zd_future_then(c->waiting, deref_ready, c);
        return 0;
    }
    if (!zd_future_value(r->value))
        return zd_error_set("%s", zd_future_error(r->value));
    size_t n = zd_list_len(c->args);
    zd_value_t *args = zd_value_list(n);
    if (!args)
        return -1;
    zd_list_append(args, zd_value_ref(zd_future_value(r->value)));
    for (size_t i = 1; i < n; i++)
        zd_list_append(args, zd_value_ref(zd_list_get(c->args, i)));
    zd_value_unref(c->args);
    c->args = args;
    c->flags &= (uint16_t)~RPC_WIRE_F_DEREF_FIRST;
    return 1;
}

static void run_call(void *arg)
{
    zd_rpc_call_t *c = arg;
    agent_t *a = c->a;
    char text[1024], name[ZD_RPC_MAX_FUNCTION + 3];
    if (c->flags & RPC_WIRE_F_DEREF_FIRST) {
        int rc = deref_first(c);
        if (rc == 0)
            return;
        if (rc < 0) {
            snprintf(text, sizeof text, "RRef argument of %s: %s", call_name(c, name, sizeof name),
                     zd_error_last());
            finish_error(c, text, ZD_ERR_REMOTE);
            return;
        }
    }
    if (!c->internal && c->extra_len > 0 && !(a->has_hooks && c->hooks.on_recv_request)) {
        /* The caller's module (distributed autograd) counts on this process
           to take part; ignoring its metadata would lose its work silently.
           The caller names the module and its init call (call.c). */
        snprintf(text, sizeof text,
                 "worker \"%s\" (rank %d) received hook metadata but has no "
                 "hooks installed (a module's init was not called before zd_rpc_init())",
                 a->name, a->net.rank);
        /* Said here too, not only to the caller: this is the process
           whose set-up is wrong. Only the caller knows which module's
           init is missing (its hooks name it). WARN, not ERROR: a peer
           can send this at will, and warnings are rate limited. */
        zd__log(ZD_LOG_WARN,
                "rpc: request \"%s\" from rank %d carries hook metadata but no "
                "hooks are installed here: call the init of the caller's module (its error "
                "names it) before zd_rpc_init() in this process",
                c->fn, c->src);
        finish_error(c, text, ZD_ERR_NOT_INITIALIZED);
        return;
    }
    if (!c->internal && a->has_hooks) {
        if (c->hooks.on_recv_request &&
            c->hooks.on_recv_request(c->hooks.arg, c, c->extra, c->extra_len, &c->args) < 0) {
            snprintf(text, sizeof text, "request hook failed: %s", zd_error_last());
            finish_error(c, text, ZD_ERR_REMOTE);
            return;
        }
        c->hooked = true;
    }
    if (c->type == RPC_MSG_RREF_FETCH) {
        c->waiting = zd_future_ref(c->owner_value);
        waiting_add(c);
        zd_future_then(c->waiting, future_done, c);
        return;
    }
    zd_error_clear();
    if (c->f.fn) {
        zd_value_t *result = c->f.fn(c, c->args, c->f.arg);
        if (c->hooks.on_handler_return && c->hooked)
            c->hooks.on_handler_return(c->hooks.arg, c);
        if (result) {
            finish_value(c, result);
        } else {
            snprintf(text, sizeof text, "%s",
                     zd_error_last()[0] ? zd_error_last() : "handler failed (no reason given)");
            finish_error(c, text, ZD_ERR_REMOTE);
        }
        return;
    }
    zd_future_t *f = c->f.async_fn(c, c->args, c->f.arg);
    if (c->hooks.on_handler_return && c->hooked)
        c->hooks.on_handler_return(c->hooks.arg, c);
    if (!f) {
        snprintf(text, sizeof text, "%s",
                 zd_error_last()[0] ? zd_error_last() : "handler failed (no reason given)");
        finish_error(c, text, ZD_ERR_REMOTE);
        return;
    }
    zd_future_unref(c->waiting);
    c->waiting = f; /* keeps it alive until it completes */
    waiting_add(c);
    zd_future_then(f, future_done, c);
}

/*  Whether to log that src is refused as busy now: once a second per peer
    at most (the I/O thread alone calls this). */
static bool busy_log_due(agent_t *a, int src)
{
    static int64_t *last;
    static int n_last;
    static unsigned gen;
    if (!last || n_last < a->net.world || gen != a->net.gen) {
        free(last);
        last = calloc((size_t)a->net.world, sizeof *last);
        n_last = last ? a->net.world : 0;
        gen = a->net.gen;
        if (!last)
            return true;
    }
    int64_t now = zd__net_now_ns();
    if (now - last[src] < ZD__NS_PER_S)
        return false;
    last[src] = now;
    return true;
}

void zd__serve_request(agent_t *a, inmsg_t *m)
{
    const rpc_wire_header_t *h = &m->h;
    rpc_frame_t *frames = m->frames;
    int n = m->n;
    zd_rpc_call_t *c = calloc(1, sizeof *c);
    uint8_t *extra = h->extra_len ? malloc(h->extra_len) : NULL;
    if (!c || (h->extra_len && !extra)) {
        free(c);
        free(extra);
        for (int i = 0; i < n; i++)
            frames[i].release(frames[i].data, frames[i].release_arg);
        zd__transport_answer_error(&a->net, m, h->id, "out of memory");
        return;
    }
    c->a = a;
    memcpy(c->route, m->route, m->route_len);
    c->route_len = m->route_len;
    c->gen = a->net.gen;
    c->hooks = a->hooks;
    c->src = h->src;
    c->id = h->id;
    c->type = h->type;
    c->flags = h->flags;
    if (h->type == RPC_MSG_CALL)
        c->what = registry_internal(h->fn, h->fn_len);
    c->internal = c->what != NULL;
    if ((h->flags & RPC_WIRE_F_INTERNAL) && !c->internal)
        zd__log(ZD_LOG_WARN,
                "rpc: from \"%s\" (rank %d): a %s of \"%.*s\" marked internal, "
                "which it is not here: served as a user call",
                a->net.peers[h->src].name, h->src, zd__rpc_wire_type_name(h->type), (int)h->fn_len,
                h->fn);
    c->rref_id = h->a;
    c->fork_id = h->b;
    c->timeout_ms = h->timeout_ms;
    if (extra)
        memcpy(extra, h->extra, h->extra_len);
    c->extra = extra;
    c->extra_len = h->extra_len;
    /* Counted before the look, so that the count is what this call would
       make it: at most max_calls_per_peer queued or running. */
    atomic_fetch_add_explicit(&a->serving, 1, memory_order_relaxed);
    bool busy = false;
    if (!c->internal)
        busy = atomic_fetch_add_explicit(&a->net.peers[c->src].m.serving, 1,
                                         memory_order_relaxed) >= zd__serve_max_calls_per_peer();
    char text[1024], name[ZD_RPC_MAX_FUNCTION + 3];
    if (busy)
        snprintf(text, sizeof text,
                 "busy: too many calls from rank %d in flight on \"%s\" "
                 "(rank %d; at most %lld, ZDIST_RPC_MAX_CALLS_PER_PEER)",
                 c->src, a->name, a->net.rank, (long long)zd__serve_max_calls_per_peer());
    if (busy && busy_log_due(a, c->src))
        zd__log(ZD_LOG_WARN, "rpc: from \"%s\" (rank %d): %s", a->net.peers[c->src].name, c->src,
                text);
    if (h->type == RPC_MSG_RREF_FETCH) {
        snprintf(c->fn, sizeof c->fn, "__to_here");
        c->what = "to_here";
        c->f.flags = ZD_RPC_FN_INLINE; /* only waits for a future */
        if (busy) {
            finish_error(c, text, ZD_ERR_REMOTE);
            return;
        }
        c->owner_value = zd__rref_owner_value_for(a, h->a, h->timeout_ms, h->src);
        if (!c->owner_value) {
            /* An RRef this process does not hold and never will (freed, or
               made by its earlier process: ZD_ERR_ARGUMENT) is the caller's
               news, answered; a line each would flood the log after a
               restart, and push the rate limit past lines that matter. */
            snprintf(text, sizeof text, "to_here: %s", zd_error_last());
            zd__log(zd_error_code() == ZD_ERR_ARGUMENT ? ZD_LOG_DEBUG : ZD_LOG_WARN,
                    "rpc: from \"%s\" (rank %d): %s", a->net.peers[c->src].name, c->src, text);
            finish_error(c, text, ZD_ERR_REMOTE);
            return;
        }
        run_call(c);
        return;
    }
    memcpy(c->fn, h->fn, h->fn_len);
    c->fn[h->fn_len] = 0;
    /* Decoded first, whatever happens next: see the top of this file. */
    int rc = zd__value_decode(h->meta, h->meta_len, frames, n, &a->rref_codec, h->src, &c->args);
    if (rc < 0 && !busy)
        snprintf(text, sizeof text, "bad arguments for %s: %s", call_name(c, name, sizeof name),
                 zd_error_last());
    if (h->type == RPC_MSG_REMOTE) {
        /* Even when busy: the owner entry takes the failure, the RRef
           protocol goes on (answer_error). */
        c->owner_value = zd__rref_owner_remote(a, h->a, h->b, h->src);
        if (!c->owner_value) {
            snprintf(text, sizeof text, "remote %s: %s", call_name(c, name, sizeof name),
                     zd_error_last());
            finish_error(c, text, ZD_ERR_REMOTE);
            return;
        }
    }
    if (busy) {
        finish_error(c, text, ZD_ERR_REMOTE);
        return;
    }
    if (rc < 0) {
        zd__log(ZD_LOG_WARN, "rpc: from \"%s\" (rank %d): %s", a->net.peers[c->src].name, c->src,
                text);
        finish_error(c, text, ZD_ERR_REMOTE);
        return;
    }
    if (zd_value_kind(c->args) != ZD_VALUE_LIST) {
        finish_error(c, "arguments are not a list", ZD_ERR_REMOTE);
        return;
    }
    c->found = registry_find(c->fn, strlen(c->fn), &c->f);
    if (!c->found) {
        snprintf(text, sizeof text, "unknown function \"%s\" on \"%s\" (rank %d)", c->fn, a->name,
                 a->net.rank);
        finish_error(c, text, ZD_ERR_NO_FUNCTION);
        return;
    }
    schedule(c);
}
