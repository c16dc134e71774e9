/* SPDX-License-Identifier: MIT */
/*  options.c: zd_rpc_init's options, completed from the environment
    (the launcher's variables through zd_rpc_env_resolve, launch_env.c;
    $ZDIST_BUSY_POLL_US, $ZDIST_HEARTBEAT_S, $ZDIST_MASTER_WAIT_S) and
    checked, and the address this process listens on. */
#include "rpc/world/options.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "core/sized.h"
#include "rpc/net/address.h"
#include "rpc/net/wire.h"

/*  The IP this process should bind and advertise: the one the kernel would
    use to reach the master (a UDP "connect" sends nothing); loopback for a
    master on this machine's loopback. */
int zd__agent_listen_ip(const char *master, char *ip, size_t size)
{
    char addr[1][ZD_ADDR_MAX];
    if (zd__addr_resolve(master, addr, 1) < 0 || zd__addr_route_from(addr[0], ip, size) < 0)
        return zd_error_wrap("zd_rpc_init: master address \"%s\"", master);
    return 0;
}

/*  The address to listen on from the options or $ZDIST_LISTEN_ADDR, into
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
                                 "of this host's interfaces (like 10.0.0.5 or fd00::5)",
                                 from, s);
    return 0;
}

/*  The largest value of each duration field (more is refused): a day, a
    week, a second. */
#define HEARTBEAT_MAX_MS   (ZD__DAY_S * ZD__MS_PER_S)
#define MASTER_WAIT_MAX_MS (ZD__WEEK_S * ZD__MS_PER_S)
#define BUSY_POLL_MAX_US   ZD__US_PER_S

/*  A duration field of zd_rpc_options_t, read by error.h's rule. */
typedef struct {
    const char *field;
    int64_t max;         /* the largest value the field may have */
    int64_t dflt;        /* what ZD_TIMEOUT_DEFAULT means without the variable */
    const char *env;     /* the variable that fills the default, or NULL */
    long env_lo, env_hi; /* its range, in its own unit */
    int64_t env_unit;    /* its unit in the field's: 1000 for seconds into ms */
} duration_t;

static const duration_t
    rpc_timeout = {"rpc_timeout_ms", INT64_MAX, RPC_TIMEOUT_DEFAULT_MS, NULL, 0, 0, 0},
    init_timeout = {"init_timeout_ms", INT64_MAX, RPC_INIT_TIMEOUT_DEFAULT_MS, NULL, 0, 0, 0},
    /* ZeroMQ's heartbeats (transport.c) take an int of ms: at most a day. */
    heartbeat = {"heartbeat_ms", HEARTBEAT_MAX_MS, HEARTBEAT_DEFAULT_MS, "ZDIST_HEARTBEAT_S", 1,
                 ZD__DAY_S,      ZD__MS_PER_S},
    master_wait = {"master_wait_ms", MASTER_WAIT_MAX_MS, 0, "ZDIST_MASTER_WAIT_S", 0,
                   ZD__WEEK_S,       ZD__MS_PER_S},
    busy_poll = {"busy_poll_us",
                 BUSY_POLL_MAX_US,
                 BUSY_POLL_DEFAULT_US,
                 "ZDIST_BUSY_POLL_US",
                 0,
                 BUSY_POLL_MAX_US,
                 1};

/*  The one reading of a duration field: ZD_TIMEOUT_DEFAULT (< 0) becomes
    the variable's value when it is set, else the default; ZD_TIMEOUT_NONE
    (0) and positive values stay, up to max. *defaulted (may be NULL): the
    field came from neither the caller nor the variable. 0, or -1. */
static int duration(const duration_t *d, int64_t *v, bool *defaulted)
{
    if (defaulted)
        *defaulted = false;
    if (*v > d->max)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: %s %lld is over %lld", d->field,
                                 (long long)*v, (long long)d->max);
    if (*v >= 0)
        return 0;
    long e = 0;
    int rc = d->env ? zd__rpc_env_long(d->env, d->env_lo, d->env_hi, &e) : 0;
    if (rc < 0)
        return zd_error_wrap("zd_rpc_init");
    *v = rc == 1 ? e * d->env_unit : d->dflt;
    if (defaulted)
        *defaulted = rc != 1;
    return 0;
}

int zd__agent_init_params(const char *name, int rank, int world, const zd_rpc_options_t *opts,
                          init_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->o = zd_rpc_options_default();
    if (opts &&
        zd__sized_read(&p->o, sizeof p->o, opts, ZD__SIZE_THROUGH(zd_rpc_options_t, master_wait_ms),
                       "zd_rpc_options_t", "zd_rpc_options_default()") < 0)
        return zd_error_wrap("zd_rpc_init");
    zd_rpc_env_t env;
    if (zd_rpc_env_resolve(rank, world, p->o.master_addr, p->o.master_port, &env, sizeof env) < 0)
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
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: world size %d (at most %d)", world,
                                 RPC_WIRE_MAX_RANK + 1);
    if (rank >= world)
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "zd_rpc_init: rank %d is outside the world of size %d", rank, world);
    p->rank = rank;
    p->world = world;
    if (name)
        snprintf(p->name, sizeof p->name, "%s", name);
    else
        snprintf(p->name, sizeof p->name, "worker%d", rank);
    if (!zd__rpc_wire_name_ok(name ? name : p->name, ZD_RPC_MAX_NAME))
        return zd_error_set_code(
            ZD_ERR_ARGUMENT,
            "zd_rpc_init: bad worker name \"%s\" (1 to %d printable characters, "
            "no spaces)",
            name, ZD_RPC_MAX_NAME);
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
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: %d worker threads (1 to 1024)",
                                 p->o.num_worker_threads);
    /* Waiting for rank 0 without limit is asked for with ZD_TIMEOUT_NONE;
       the agent's master_wait_ms 0 means not at all (agent.h). */
    bool wait_forever = p->o.master_wait_ms == ZD_TIMEOUT_NONE;
    if (duration(&rpc_timeout, &p->o.rpc_timeout_ms, NULL) < 0 ||
        duration(&init_timeout, &p->o.init_timeout_ms, NULL) < 0 ||
        duration(&busy_poll, &p->o.busy_poll_us, &p->busy_poll_default) < 0 ||
        duration(&heartbeat, &p->o.heartbeat_ms, NULL) < 0 ||
        duration(&master_wait, &p->o.master_wait_ms, NULL) < 0)
        return -1;
    if (wait_forever)
        p->o.master_wait_ms = INT64_MAX;
    zd__log(ZD_LOG_INFO, "rpc: %s", env.summary);
    return 0;
}
