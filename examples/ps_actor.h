/*  ps_actor.h: Ray-style actors on the RPC layer: C objects created on a
    worker with rpc_remote() and used through the RRef.

    RPC values cannot hold a C object, so the value behind an actor's RRef
    is an integer handle into a table of this process. A constructor
    handler builds its object and returns ps_actor_new(cls, obj); a method
    handler, which receives that value as its first argument (the RRef's
    value, see rpc_rref_rpc_async), looks the object up with
    ps_actor_get() and gives it back with ps_actor_put().

    Lifetime: the owner of an RRef frees its *value* when the last user
    lets go, but the value is only the integer, so the object itself is
    freed by an explicit call: the registered method "Actor.free"
    (ps_actor_free_remote) or ps_actor_free_all() at the end of a process.
    A method running at that moment finishes first. */
#ifndef ZDIST_EXAMPLES_PS_ACTOR_H
#define ZDIST_EXAMPLES_PS_ACTOR_H

#include <stdbool.h>

#include "rpc/rpc.h"

typedef struct {
    const char *name;           /* "ParameterServer": for error messages */
    void (*free)(void *obj);    /* frees obj */
} ps_actor_class_t;

typedef struct ps_actor ps_actor_t;

/*  Registers "Actor.free" in this process. Call before rpc_init. 0, or -1. */
int ps_actor_register(void);

/*  Adds obj to the table and returns its handle value (a new reference),
    the result a constructor handler returns. On failure (out of memory)
    frees obj with cls->free and returns NULL. */
rpc_value_t *ps_actor_new(const ps_actor_class_t *cls, void *obj);

/*  The actor whose handle is args[0], checked to be of class cls, with a
    reference that ps_actor_put() drops. NULL with an error naming the
    class when the handle is unknown, freed or of another class. */
ps_actor_t *ps_actor_get(const rpc_value_t *args, const ps_actor_class_t *cls);
void ps_actor_put(ps_actor_t *a);

/*  The object, and the actor's lock: methods that change the object hold
    it, so that they run one at a time as a Ray actor's methods do. */
void *ps_actor_object(const ps_actor_t *a);
void ps_actor_lock(ps_actor_t *a);
void ps_actor_unlock(ps_actor_t *a);

/*  Asks the owner of r to free the actor behind it ("Actor.free"); waits.
    0, or -1. NULL-safe (returns 0). */
int ps_actor_free_remote(rpc_rref_t *r);

/*  Frees every actor of this process (after rpc_shutdown). */
void ps_actor_free_all(void);

/*  Number of live actors in this process. */
int ps_actor_count(void);

#endif
