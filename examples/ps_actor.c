#include "examples/ps_actor.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "autograd/error.h"

struct ps_actor {
    int64_t handle;
    const ps_actor_class_t *cls;
    void *obj;
    int refs;                   /* the table's + one per ps_actor_get */
    pthread_mutex_t lock;       /* held by methods: one at a time */
};

/*  A handful of actors per process: a linear table is plenty. Handles are
    never reused, so a stale handle cannot reach a newer object. */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static ps_actor_t **table;
static int table_len, table_cap;
static int64_t next_handle = 1;

static void actor_destroy(ps_actor_t *a)
{
    a->cls->free(a->obj);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

rpc_value_t *ps_actor_new(const ps_actor_class_t *cls, void *obj)
{
    ps_actor_t *a = calloc(1, sizeof *a);
    if (!a) {
        cls->free(obj);
        error_set("%s: out of memory", cls->name);
        return NULL;
    }
    a->cls = cls;
    a->obj = obj;
    a->refs = 1;
    pthread_mutex_init(&a->lock, NULL);
    pthread_mutex_lock(&table_lock);
    if (table_len == table_cap) {
        int cap = table_cap ? 2 * table_cap : 8;
        ps_actor_t **t = realloc(table, (size_t)cap * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&table_lock);
            actor_destroy(a);
            error_set("%s: out of memory", cls->name);
            return NULL;
        }
        table = t;
        table_cap = cap;
    }
    a->handle = next_handle++;
    table[table_len++] = a;
    pthread_mutex_unlock(&table_lock);
    rpc_value_t *v = rpc_value_int(a->handle);
    if (!v) {
        /* Nobody can know the handle yet: take it out again. */
        pthread_mutex_lock(&table_lock);
        table[--table_len] = NULL;
        pthread_mutex_unlock(&table_lock);
        actor_destroy(a);
    }
    return v;
}

ps_actor_t *ps_actor_get(const rpc_value_t *args, const ps_actor_class_t *cls)
{
    int64_t h;
    if (rpc_arg_int(args, 0, &h) < 0) {
        error_wrap("%s: the first argument must be the actor (an RRef's value)", cls->name);
        return NULL;
    }
    ps_actor_t *found = NULL;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < table_len; i++) {
        if (table[i]->handle == h) {
            found = table[i];
            break;
        }
    }
    if (found && found->cls == cls)
        found->refs++;
    pthread_mutex_unlock(&table_lock);
    if (!found) {
        error_set("%s: no actor %lld in this process (freed already?)", cls->name,
                  (long long)h);
        return NULL;
    }
    if (found->cls != cls) {
        error_set("%s: actor %lld is a %s", cls->name, (long long)h, found->cls->name);
        return NULL;
    }
    return found;
}

void ps_actor_put(ps_actor_t *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&table_lock);
    bool last = --a->refs == 0;
    pthread_mutex_unlock(&table_lock);
    if (last)
        actor_destroy(a);
}

void *ps_actor_object(const ps_actor_t *a) { return a->obj; }
void ps_actor_lock(ps_actor_t *a) { pthread_mutex_lock(&a->lock); }
void ps_actor_unlock(ps_actor_t *a) { pthread_mutex_unlock(&a->lock); }

/*  Takes the actor out of the table; it is destroyed when the last method
    running on it returns. */
static int actor_remove(int64_t h)
{
    ps_actor_t *a = NULL;
    pthread_mutex_lock(&table_lock);
    for (int i = 0; i < table_len; i++) {
        if (table[i]->handle == h) {
            a = table[i];
            table[i] = table[--table_len];
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    if (!a)
        return error_set("Actor.free: no actor %lld in this process", (long long)h);
    ps_actor_put(a);
    return 0;
}

static rpc_value_t *fn_actor_free(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t h;
    if (rpc_arg_int(args, 0, &h) < 0 || actor_remove(h) < 0)
        return NULL;
    return rpc_value_none();
}

int ps_actor_register(void)
{
    return rpc_register("Actor.free", fn_actor_free, NULL);
}

int ps_actor_free_remote(rpc_rref_t *r)
{
    if (!r)
        return 0;
    rpc_value_t *res = NULL;
    int rc = rpc_rref_rpc_sync(r, "Actor.free", NULL, -1, &res);
    rpc_value_unref(res);
    return rc;
}

void ps_actor_free_all(void)
{
    for (;;) {
        pthread_mutex_lock(&table_lock);
        int64_t h = table_len ? table[table_len - 1]->handle : 0;
        pthread_mutex_unlock(&table_lock);
        if (!h)
            break;
        actor_remove(h);
    }
    pthread_mutex_lock(&table_lock);
    if (table_len == 0) {
        free(table);
        table = NULL;
        table_cap = 0;
    }
    pthread_mutex_unlock(&table_lock);
}

int ps_actor_count(void)
{
    pthread_mutex_lock(&table_lock);
    int n = table_len;
    pthread_mutex_unlock(&table_lock);
    return n;
}
