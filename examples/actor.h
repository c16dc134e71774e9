/* SPDX-License-Identifier: MIT */
/*  actor.h: Ray-style actors on the RPC layer: C objects created on a
    worker with zd_rpc_remote() and used through the RRef.

    A constructor handler builds its object and returns actor_new(cls,
    obj), a local object value (<zdist/value.h>) that zd_rpc_remote() keeps on
    that worker as the RRef's value. A method handler receives that value
    as its first argument (see zd_rref_rpc_async) and takes the actor with
    actor_get(); methods that change the object hold the actor's lock,
    so that they run one at a time as a Ray actor's methods do.

    Lifetime: the actor is the RRef's value, so the owner frees it when the
    last RRef to it anywhere has been released (the RPC layer's distributed
    reference counting), as with PyTorch's RRefs; that is the one way an
    actor ends, and nothing needs freeing by hand. A method running at that
    moment finishes first, since it holds the value. */
#ifndef ZDIST_EXAMPLES_ACTOR_H
#define ZDIST_EXAMPLES_ACTOR_H

#include <zdist/rpc.h>

typedef struct {
    const char *name;        /* "ParameterServer": the object's type, for errors */
    void (*free)(void *obj); /* frees obj; must not block */
} actor_class_t;

typedef struct actor actor_t;

/*  Registers "Actor.ready" in this process. Call before zd_rpc_init. 0, or -1. */
int actor_register(void);

/*  The actor value holding obj (a new reference), the result a
    constructor handler returns. On failure (out of memory) frees obj with
    cls->free and returns NULL. */
zd_value_t *actor_new(const actor_class_t *cls, void *obj);

/*  The actor args[0] holds, checked to be of class cls; borrowed, valid
    while args is (the method's call holds the value). NULL with an error
    naming the class when args[0] is not an actor or is of another class. */
actor_t *actor_get(const zd_value_t *args, const actor_class_t *cls);

/*  The object, and the actor's lock: methods that change the object hold
    it, so that they run one at a time as a Ray actor's methods do. */
void *actor_object(const actor_t *a);
void actor_lock(actor_t *a);
void actor_unlock(actor_t *a);

/*  Waits until the actor behind r exists (its constructor may take a
    while, loading data): 0, or -1 with the constructor's error. */
int actor_wait(zd_rref_t *r);

/*  Number of live actors (objects not yet freed) in this process. */
int actor_count(void);

#endif
