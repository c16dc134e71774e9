/*  ps_launch.h: the world flags the example programs share (--rank,
    --world_size, --master_addr, --master_port), with the environment
    variables torchrun, Slurm scripts and tools/launch set as defaults. */
#ifndef ZDIST_EXAMPLES_PS_LAUNCH_H
#define ZDIST_EXAMPLES_PS_LAUNCH_H

#include <stdint.h>

#include "examples/flags.h"
#include "rpc/rpc.h"

typedef struct {
    int64_t rank;               /* -1: $RANK */
    int64_t world_size;         /* 0: $WORLD_SIZE, else the program's own layout */
    const char *master_addr;    /* NULL: $MASTER_ADDR, else "localhost" */
    int64_t master_port;        /* 0: $MASTER_PORT, else 29500 */
} ps_world_flags_t;

#define PS_WORLD_FLAGS(w)                                                                   \
    {"rank", FLAG_INT, &(w).rank, "this process's rank (default: $RANK)"},                  \
    {"world_size", FLAG_INT, &(w).world_size,                                               \
     "number of processes (default: $WORLD_SIZE, else what the layout needs)"},             \
    {"master_addr", FLAG_STRING, &(w).master_addr,                                          \
     "rank 0's address (default: $MASTER_ADDR, else localhost)"},                           \
    {"master_port", FLAG_INT, &(w).master_port,                                             \
     "rank 0's rendezvous port (default: $MASTER_PORT, else 29500)"}

ps_world_flags_t ps_world_flags_default(void);

/*  Fills in what the flags left out from the environment, then the
    defaults (layout_size for the world size). Returns 0, or -1 with a
    message on stderr (no rank anywhere, a malformed variable). */
int ps_world_resolve(ps_world_flags_t *w, int64_t layout_size, const char *prog);

/*  rpc_init with the resolved flags, and name for this process. 0, or -1
    with a message on stderr. */
int ps_world_init(const ps_world_flags_t *w, const char *name, const char *prog);

#endif
