/* SPDX-License-Identifier: MIT */
/*  worker_info.c: the world table as users see it (zd_rpc_get_worker_info*,
    zd_rpc_worker, zd_rpc_rank...), and the check of ranks given by users,
    which names the worker when a name lookup failed. */
#include "rpc/agent/agent.h"

#include <stdio.h>
#include <string.h>

#include <zdist/error.h>

/* The name of this thread's last zd_rpc_worker lookup that failed, so that
   zd_rpc_sync(zd_rpc_worker("nope"), ...) can say "nope" rather than -1. */
static _Thread_local char t_unknown_name[ZD_RPC_MAX_NAME + 1];

int zd__agent_check_rank(agent_t *a, int rank, const char *api)
{
    if (rank == -1 && t_unknown_name[0])
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: no worker called \"%s\" (zd_rpc_worker "
                                 "returned -1)",
                                 api, t_unknown_name);
    if (rank < 0 || rank >= a->net.world)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no worker with rank %d (world size %d)", api,
                                 rank, a->net.world);
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
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    int rc = -1;
    if (!out) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info: NULL output");
    } else if (!name) {
        fill_info(&a->net.peers[a->net.rank], out);
        rc = 0;
    } else {
        for (int i = 0; i < a->net.world; i++)
            if (strcmp(a->net.peers[i].name, name) == 0) {
                fill_info(&a->net.peers[i], out);
                rc = 0;
                break;
            }
        if (rc < 0)
            zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info: no worker called \"%s\"",
                              name);
    }
    zd__agent_release(a);
    return rc;
}

int zd_rpc_get_worker_info_by_rank(int rank, zd_rpc_worker_info_t *out)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    int rc = -1;
    if (!out)
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info_by_rank: NULL output");
    else if (zd__agent_check_rank(a, rank, "zd_rpc_get_worker_info_by_rank") == 0) {
        fill_info(&a->net.peers[rank], out);
        rc = 0;
    }
    zd__agent_release(a);
    return rc;
}

int zd_rpc_get_worker_infos(zd_rpc_worker_info_t *out, int max)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    for (int i = 0; out && i < a->net.world && i < max; i++)
        fill_info(&a->net.peers[i], &out[i]);
    int n = a->net.world;
    zd__agent_release(a);
    return n;
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

/* Read without taking the agent: these never fail and never set errors. */
static atomic_int g_rank = -1, g_world = -1;
static char g_name[ZD_RPC_MAX_NAME + 1];

void zd__agent_publish_identity(agent_t *a)
{
    if (a)
        snprintf(g_name, sizeof g_name, "%s", a->name);
    else
        g_name[0] = 0;
    atomic_store(&g_rank, a ? a->net.rank : -1);
    atomic_store(&g_world, a ? a->net.world : -1);
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
