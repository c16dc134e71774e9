/* SPDX-License-Identifier: MIT */
/*  options.c: zd_rpc_init's options, completed from the environment
    (the launcher's variables through zd_rpc_env_resolve, launch_env.c;
    $ZDIST_BUSY_POLL_US) and checked, and the address this process listens
    on. */
#include "rpc/agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include "rpc/address.h"

zd_rpc_options_t zd_rpc_options_default(void)
{
    zd_rpc_options_t o = {
        .rpc_timeout_ms = 60000,
        .num_worker_threads = 16,
        .init_timeout_ms = 300000,
        .master_addr = NULL,
        .master_port = 0,
        .listen_addr = NULL,
        .busy_poll_us = -1,
        .key_file = NULL,
        .insecure = false,
        .heartbeat_ms = 0,
        .master_wait_ms = 0,
    };
    return o;
}

/* The IP this process should bind and advertise: the one the kernel would
   use to reach the master (a UDP "connect" sends nothing); loopback for a
   master on this machine's loopback. */
int zd__agent_listen_ip(const char *master, char *ip, size_t size)
{
    char addr[1][ZD_ADDR_MAX];
    if (zd__addr_resolve(master, addr, 1) < 0 || zd__addr_route_from(addr[0], ip, size) < 0)
        return zd_error_wrap("zd_rpc_init: master address \"%s\"", master);
    return 0;
}

/* The address to listen on from the options or $ZDIST_LISTEN_ADDR, into
   p->listen ("" when neither gives one). */
static int listen_addr(init_params_t *p)
{
    const char *s = p->o.listen_addr, *from = "options.listen_addr";
    if (!s || !*s) {
        s = getenv("ZDIST_LISTEN_ADDR");
        from = "ZDIST_LISTEN_ADDR";
    }
    if (!s || !*s)
        return 0;
    /* A literal only: a name could resolve to several addresses, and the
       endpoint a process advertises has to be one its peers can dial. */
    if (zd__addr_normalize(s, p->listen, sizeof p->listen) < 0 || !strcmp(p->listen, "0.0.0.0") ||
        !strcmp(p->listen, "::"))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: %s=\"%s\" is not the IPv4 or IPv6 address of one "
                                 "of this host's interfaces (like 10.0.0.5 or fd00::5)", from, s);
    return 0;
}

/* The heartbeat timeout: the option, else $ZDIST_HEARTBEAT_S, else 30 s
   (ZeroMQ's heartbeats, transport.c). */
static int agent_heartbeat(zd_rpc_options_t *o)
{
    if (o->heartbeat_ms < 0 || o->heartbeat_ms > 86400000)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: heartbeat_ms %lld is not in "
                                 "[0, 86400000]", (long long)o->heartbeat_ms);
    if (o->heartbeat_ms)
        return 0;
    long v;
    int rc = zd__rpc_env_long("ZDIST_HEARTBEAT_S", 1, 86400, &v);
    if (rc < 0)
        return zd_error_wrap("zd_rpc_init");
    o->heartbeat_ms = rc == 1 ? v * 1000 : 30000;
    return 0;
}

/* How long members wait for a lost rank 0: the option, else
   $ZDIST_MASTER_WAIT_S, else not at all. */
static int master_wait(zd_rpc_options_t *o)
{
    if (o->master_wait_ms < 0 || o->master_wait_ms > 604800000)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: master_wait_ms %lld is not in "
                                 "[0, 604800000]", (long long)o->master_wait_ms);
    if (o->master_wait_ms)
        return 0;
    long v;
    int rc = zd__rpc_env_long("ZDIST_MASTER_WAIT_S", 0, 604800, &v);
    if (rc < 0)
        return zd_error_wrap("zd_rpc_init");
    o->master_wait_ms = rc == 1 ? v * 1000 : 0;
    return 0;
}

int zd__agent_init_params(const char *name, int rank, int world, const zd_rpc_options_t *opts,
                       init_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->o = opts ? *opts : zd_rpc_options_default();
    long v = 0;
    int rc;
    zd_rpc_env_t env;
    if (zd_rpc_env_resolve(rank, world, p->o.master_addr, p->o.master_port, &env) < 0)
        return zd_error_wrap("zd_rpc_init");
    if (!env.rank_from)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: no rank given, and no launcher variable gives one "
                                 "(RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, SLURM_PROCID)");
    if (!env.world_size_from)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: no world size given, and no launcher variable gives "
                                 "one (WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS)");
    rank = env.rank;
    world = env.world_size;
    if (world > RPC_WIRE_MAX_RANK + 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: world size %d (at most %d)", world, RPC_WIRE_MAX_RANK + 1);
    if (rank >= world)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: rank %d is outside the world of size %d", rank, world);
    p->rank = rank;
    p->world = world;
    if (name)
        snprintf(p->name, sizeof p->name, "%s", name);
    else
        snprintf(p->name, sizeof p->name, "worker%d", rank);
    if (!zd__rpc_wire_name_ok(name ? name : p->name, ZD_RPC_MAX_NAME))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: bad worker name \"%s\" (1 to %d printable characters, "
                                 "no spaces)", name, ZD_RPC_MAX_NAME);
    /* Rank 0 may go without: its rendezvous then listens on every
       interface, as PyTorch's TCPStore does (rendezvous.c). */
    if (!env.master_addr_from && rank != 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: no master address: set options.master_addr or "
                                 "MASTER_ADDR");
    snprintf(p->master, sizeof p->master, "%s", env.master_addr_from ? env.master_addr : "");
    if (listen_addr(p) < 0)
        return -1;
    if (!env.master_port_from)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: no master port: set options.master_port or "
                                 "MASTER_PORT");
    p->port = env.master_port;
    if (p->port < 1 || p->port > 65535)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: master port %d is not in [1, 65535]", p->port);
    if (p->o.num_worker_threads < 1 || p->o.num_worker_threads > 1024)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_init: %d worker threads (1 to 1024)", p->o.num_worker_threads);
    if (p->o.rpc_timeout_ms < 0 || p->o.init_timeout_ms < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: negative timeout");
    if (p->o.busy_poll_us < 0) {
        p->o.busy_poll_us = 100;
        if ((rc = zd__rpc_env_long("ZDIST_BUSY_POLL_US", 0, 1000000, &v)) < 0)
            return zd_error_wrap("zd_rpc_init");
        if (rc == 1)
            p->o.busy_poll_us = v;
        p->busy_poll_default = rc != 1;
    }
    if (p->o.busy_poll_us > 1000000)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: busy_poll_us %lld is over 1000000",
                                 (long long)p->o.busy_poll_us);
    if (agent_heartbeat(&p->o) < 0 || master_wait(&p->o) < 0)
        return -1;
    zd__log(ZD_LOG_INFO, "rpc: %s", env.summary);
    return 0;
}
