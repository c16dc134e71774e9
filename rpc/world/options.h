/* SPDX-License-Identifier: MIT */
/*  options.h: zd_rpc_init's arguments completed from the options and the
    environment (private to rpc/): options.c, and the launchers' variables,
    launch_env.c. Neither needs the running agent. */
#ifndef ZDIST_RPC_OPTIONS_H
#define ZDIST_RPC_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <zdist/rpc.h>

/*  ---- options.c ---- */

/*  What ZD_TIMEOUT_DEFAULT means in zd_rpc_options_t's timeouts. */
#define RPC_TIMEOUT_DEFAULT_MS      60000
#define RPC_INIT_TIMEOUT_DEFAULT_MS 300000
/*  ... and in the other durations, without their variables. */
#define HEARTBEAT_DEFAULT_MS 30000
#define BUSY_POLL_DEFAULT_US 100

/*  zd_rpc_init's arguments, completed and checked. Every duration of o is
    resolved (no ZD_TIMEOUT_DEFAULT left; 0 = none), except master_wait_ms:
    0 = do not wait for rank 0, INT64_MAX = no limit. */
typedef struct {
    char name[ZD_RPC_MAX_NAME + 1];
    int rank, world;
    zd_rpc_options_t o;
    char master[256]; /* "": none given (rank 0 only) */
    int port;
    char listen[64];        /* options.listen_addr or $ZDIST_LISTEN_ADDR; "": none */
    bool busy_poll_default; /* busy_poll_us came from neither the option nor the
                                   environment (agent.c may turn it off) */
} init_params_t;

/*  Fills p from the arguments and the environment: 0, or -1 naming what is
    missing or wrong. */
int zd__agent_init_params(const char *name, int rank, int world, const zd_rpc_options_t *opts,
                          init_params_t *p);

/*  The IP this process binds and advertises: the one that routes to the
    master (127.0.0.1 for a local one). 0, or -1. */
int zd__agent_listen_ip(const char *master, char *ip, size_t size);

/*  ---- launch_env.c ---- */

/*  An integer environment variable: 1 when set and in [lo, hi], 0 when
    unset or empty, -1 (error set, naming it and its value) otherwise. */
int zd__rpc_env_long(const char *var, long lo, long hi, long *out);

#endif
