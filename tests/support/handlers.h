/* SPDX-License-Identifier: MIT */
/*  handlers.h: RPC handlers and helpers several tests serve alike. A test
    registers the ones it needs under names of its choosing. */
#ifndef ZDIST_TESTS_HANDLERS_H
#define ZDIST_TESTS_HANDLERS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <zdist/rpc.h>

/*  add(a, b) = a + b on ints. */
zd_value_t *world_h_add(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  echo(v) = v (None without arguments). */
zd_value_t *world_h_echo(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  Fails with the message registered as arg (a const char *). */
zd_value_t *world_h_fail(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  How many values this process owns for RRefs. */
zd_value_t *world_h_owner_count(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  A call held until it is released, so that a test keeps a call in flight
    without sleeping: register world_h_hold (async) and world_h_release, both
    with a pointer to the same world_hold_t as arg. */
typedef struct {
    _Atomic(zd_future_t *) call; /* the call held, NULL when none */
    int64_t answer;              /* what the held call answers, */
    bool answer_none;            /* or no value at all when set */
    zd_future_t *arrived;        /* when not NULL, completed as a call is held */
} world_hold_t;

/*  Holds the call: its future completes at world_hold_release. */
zd_future_t *world_h_hold(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  Answers the held call: 1 when there was one, 0 when none has arrived yet. */
int world_hold_release(world_hold_t *h);

/*  world_hold_release as a handler: answers its int. */
zd_value_t *world_h_release(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  The int fn answers on rank `to` without arguments, or -1 when the call
    fails. */
int64_t world_call_int(int to, const char *fn);
/*  Calls "echo" (world_h_echo) on rank `to` with v within timeout_ms: 0
    when it answers v, or -1 with the error set (the call's, or what it
    answered instead). */
int world_echo_int(int to, int64_t v, int timeout_ms);

#endif
