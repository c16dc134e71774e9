/* SPDX-License-Identifier: MIT */
/*  future_hook.h: how the RPC agent takes part in waits on futures
    (private to rpc/).

    future.c knows nothing of the agent; the agent installs these when it
    starts (zd_rpc_init), so that every zd_future_wait* behaves as a wait
    inside the agent should: it busy-polls first when answers are expected
    soon (rpc/net/poll.c), and a pool thread that sleeps lets the pool start
    another thread (rpc/agent/pool.c), so nested calls never deadlock. */
#ifndef ZDIST_RPC_FUTURE_HOOK_H
#define ZDIST_RPC_FUTURE_HOOK_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/future.h>

typedef struct {
    /* Polls f for up to max_ns before the waiter sleeps; true once done. */
    bool (*poll)(zd_future_t *f, int64_t max_ns);
    /* Bracket the sleep of a waiter (no-ops off pool threads). */
    void (*block_begin)(void);
    void (*block_end)(void);
} rpc_future_wait_hooks_t;

/*  Installs hooks (static storage; NULL removes them). Any thread. */
void zd__future_set_wait_hooks(const rpc_future_wait_hooks_t *hooks);

/*  Takes cb(arg), given to zd_future_then, out of f's pending callbacks:
    true, or false when it has run or is about to (completion took it). */
bool zd__future_unthen(zd_future_t *f, zd_future_fn *cb, void *arg);

#endif
