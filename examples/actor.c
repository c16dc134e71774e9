/* SPDX-License-Identifier: MIT */
/*  actor.c: actors as local object values (see actor.h). */
#include "examples/actor.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

struct actor {
    const actor_class_t *cls;
    pthread_mutex_t lock; /* held by methods: one at a time */
    void *obj;
};

static atomic_int live;

/*  The classes actors were made of, so that "Actor.*" can tell an actor
    from another kind of object by its type name. */
#define MAX_CLASSES 16
static pthread_mutex_t classes_lock = PTHREAD_MUTEX_INITIALIZER;
static const actor_class_t *classes[MAX_CLASSES];
static int n_classes;

static int class_add(const actor_class_t *cls)
{
    int rc = 0, i = 0;
    pthread_mutex_lock(&classes_lock);
    while (i < n_classes && classes[i] != cls)
        i++;
    if (i == n_classes && n_classes < MAX_CLASSES)
        classes[n_classes++] = cls;
    else if (i == n_classes)
        rc = zd_error_set("%s: more than %d actor classes", cls->name, MAX_CLASSES);
    pthread_mutex_unlock(&classes_lock);
    return rc;
}

static bool class_known(const char *name)
{
    bool found = false;
    pthread_mutex_lock(&classes_lock);
    for (int i = 0; i < n_classes && !found; i++)
        found = strcmp(classes[i]->name, name) == 0;
    pthread_mutex_unlock(&classes_lock);
    return found;
}

/*  The value's free function. No method is running: each holds the value. */
static void actor_release(void *p)
{
    actor_t *a = p;
    a->cls->free(a->obj);
    atomic_fetch_sub(&live, 1);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

zd_value_t *actor_new(const actor_class_t *cls, void *obj)
{
    actor_t *a = NULL;
    if (class_add(cls) == 0 && !(a = calloc(1, sizeof *a)))
        zd_error_set("%s: out of memory", cls->name);
    if (!a) {
        cls->free(obj);
        return NULL;
    }
    a->cls = cls;
    a->obj = obj;
    pthread_mutex_init(&a->lock, NULL);
    atomic_fetch_add(&live, 1);
    return zd_value_object(a, actor_release, cls->name); /* frees a on failure */
}

actor_t *actor_get(const zd_value_t *args, const actor_class_t *cls)
{
    void *p;
    if (zd_rpc_arg_object(args, 0, cls->name, &p) < 0) {
        zd_error_wrap("%s: the first argument must be the actor (an RRef's value)", cls->name);
        return NULL;
    }
    return p;
}

void *actor_object(const actor_t *a)
{
    return a->obj;
}
void actor_lock(actor_t *a)
{
    pthread_mutex_lock(&a->lock);
}
void actor_unlock(actor_t *a)
{
    pthread_mutex_unlock(&a->lock);
}

/*  args[0] as an actor of any class. */
static actor_t *any_actor(const zd_value_t *args, const char *fn)
{
    const zd_value_t *v = zd_list_get(args, 0);
    const char *type = zd_value_object_type(v);
    void *p = NULL;
    if (type && class_known(type) && zd_value_get_object(v, type, &p) == 0)
        return p;
    zd_error_set("%s: the first argument must be an actor (an RRef's value), not %s", fn,
                 type ? type : zd_value_kind_name(zd_value_kind(v)));
    return NULL;
}

static zd_value_t *fn_actor_ready(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return any_actor(args, "Actor.ready") ? zd_value_none() : NULL;
}

int actor_register(void)
{
    return zd_rpc_register("Actor.ready", fn_actor_ready, NULL);
}

int actor_wait(zd_rref_t *r)
{
    zd_value_t *res = NULL;
    int rc = zd_rref_rpc_sync(r, "Actor.ready", NULL, ZD_TIMEOUT_DEFAULT, &res);
    zd_value_unref(res);
    return rc;
}

int actor_count(void)
{
    return atomic_load(&live);
}
