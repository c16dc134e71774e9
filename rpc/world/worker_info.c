/* SPDX-License-Identifier: MIT */
/*  worker_info.c: the world table as users see it (zd_rpc_get_worker_info*,
    zd_rpc_worker, zd_rpc_rank...), and the check of ranks given by users,
    which names the worker when a name lookup failed. It takes the net
    (the peers' table), not the agent: the public functions reach the
    running one through the hooks the agent installs at init. */
#include "rpc/world/worker_info.h"

#include <stdio.h>
#include <string.h>

#include <zdist/error.h>

static zd__net_t *(*_Atomic g_acquire)(void);
static void (*_Atomic g_release)(zd__net_t *n);

void zd__world_info_hooks(zd__net_t *(*acquire)(void), void (*release)(zd__net_t *n))
{
    atomic_store(&g_acquire, acquire);
    atomic_store(&g_release, release);
}

zd__net_t *zd__world_try_acquire(void)
{
    zd__net_t *(*acquire)(void) = atomic_load(&g_acquire);
    return acquire ? acquire() : NULL; /* no hooks yet: no init yet */
}

void zd__world_release(zd__net_t *n)
{
    if (n)
        atomic_load (&g_release)(n);
}

zd__net_t *zd__world_acquire(void)
{
    zd__net_t *n = zd__world_try_acquire();
    if (!n)
        zd_error_set_code(ZD_ERR_NOT_INITIALIZED, ZD__RPC_NOT_RUNNING);
    return n;
}

/*  The name of this thread's last zd_rpc_worker lookup that failed, so that
    zd_rpc_sync(zd_rpc_worker("nope"), ...) can say "nope" rather than -1. */
static _Thread_local char t_unknown_name[ZD_RPC_MAX_NAME + 1];

int zd__world_check_rank(const zd__net_t *n, int rank, const char *api)
{
    if (rank == -1 && t_unknown_name[0])
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: no worker called \"%s\" (zd_rpc_worker "
                                 "returned -1)",
                                 api, t_unknown_name);
    if (rank < 0 || rank >= n->world)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no worker with rank %d (world size %d)", api,
                                 rank, n->world);
    return 0;
}

static void fill_info(const peer_t *p, zd_rpc_worker_info_t *out)
{
    snprintf(out->name, sizeof out->name, "%s", p->name);
    out->rank = p->rank;
    snprintf(out->endpoint, sizeof out->endpoint, "%s", p->endpoint);
}

int zd_rpc_get_worker_info(const char *name, zd_rpc_worker_info_t *out)
{
    zd__net_t *n = zd__world_acquire();
    if (!n)
        return -1;
    int rc = -1;
    if (!out) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info: NULL output");
    } else if (!name) {
        fill_info(&n->peers[n->rank], out);
        rc = 0;
    } else {
        for (int i = 0; i < n->world; i++)
            if (strcmp(n->peers[i].name, name) == 0) {
                fill_info(&n->peers[i], out);
                rc = 0;
                break;
            }
        if (rc < 0)
            zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info: no worker called \"%s\"",
                              name);
    }
    zd__world_release(n);
    return rc;
}

int zd_rpc_get_worker_info_by_rank(int rank, zd_rpc_worker_info_t *out)
{
    zd__net_t *n = zd__world_acquire();
    if (!n)
        return -1;
    int rc = -1;
    if (!out)
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info_by_rank: NULL output");
    else if (zd__world_check_rank(n, rank, "zd_rpc_get_worker_info_by_rank") == 0) {
        fill_info(&n->peers[rank], out);
        rc = 0;
    }
    zd__world_release(n);
    return rc;
}

int zd_rpc_get_worker_infos(zd_rpc_worker_info_t *out, int max)
{
    zd__net_t *n = zd__world_acquire();
    if (!n)
        return -1;
    for (int i = 0; out && i < n->world && i < max; i++)
        fill_info(&n->peers[i], &out[i]);
    int world = n->world;
    zd__world_release(n);
    return world;
}

int zd_rpc_worker(const char *name)
{
    zd_rpc_worker_info_t info;
    if (zd_rpc_get_worker_info(name, &info) < 0) {
        snprintf(t_unknown_name, sizeof t_unknown_name, "%s", name ? name : "(null)");
        return -1;
    }
    t_unknown_name[0] = 0;
    return info.rank;
}

/*  Read without taking the agent: these never fail and never set errors. */
static atomic_int g_rank = -1, g_world = -1;
static char g_name[ZD_RPC_MAX_NAME + 1];

void zd__world_publish_identity(const zd__net_t *n)
{
    if (n)
        snprintf(g_name, sizeof g_name, "%s", n->name);
    else
        g_name[0] = 0;
    atomic_store(&g_rank, n ? n->rank : -1);
    atomic_store(&g_world, n ? n->world : -1);
}

int zd_rpc_rank(void)
{
    return atomic_load(&g_rank);
}

int zd_rpc_world_size(void)
{
    return atomic_load(&g_world);
}

const char *zd_rpc_name(void)
{
    return g_name;
}
