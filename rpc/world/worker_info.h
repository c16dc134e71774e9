/* SPDX-License-Identifier: MIT */
/*  worker_info.h: the world table as users see it, and the check of ranks
    given by users (worker_info.c; private to rpc/). It reads the running
    agent's peers through zd__net_t, reached by the hooks the agent
    installs (zd__world_info_hooks), never through the agent itself;
    peer_lost.c and membership.c reach it the same way. */
#ifndef ZDIST_RPC_WORKER_INFO_H
#define ZDIST_RPC_WORKER_INFO_H

#include "rpc/net/net.h"

/*  The error of an entry point called while RPC is not running. */
#define ZD__RPC_NOT_RUNNING                                                                        \
    "RPC is not running (call zd_rpc_init first, and not after zd_rpc_shutdown)"

/*  How the public functions of worker_info.c reach the running agent's
    net: acquire gives it with one more user (NULL: none runs, no error
    set), release gives it back. Installed by the agent at init, before it
    is published; until then, nothing runs. */
void zd__world_info_hooks(zd__net_t *(*acquire)(void), void (*release)(zd__net_t *n));

/*  Through them: the running agent's net with one more user, or NULL (none
    runs; no error set), and its release (NULL: nothing to give back). */
zd__net_t *zd__world_try_acquire(void);
void zd__world_release(zd__net_t *n);
/*  The same, setting the agent's own "RPC is not running" error when none
    runs. */
zd__net_t *zd__world_acquire(void);

/*  Checks a rank given by the user: 0 or -1 ("no worker with rank 7", or
    the name whose lookup gave -1). */
int zd__world_check_rank(const zd__net_t *n, int rank, const char *api);

/*  Publishes this process's rank, world size and name for zd_rpc_rank and
    friends, which read them without taking the agent (NULL: not running). */
void zd__world_publish_identity(const zd__net_t *n);

#endif
