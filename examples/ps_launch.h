/*  ps_launch.h: joining the RPC world with the world flags of flags.h
    (--rank, --world_size, --master_addr, --master_port, and the
    environment variables torchrun, Slurm scripts and tools/launch set). */
#ifndef ZDIST_EXAMPLES_PS_LAUNCH_H
#define ZDIST_EXAMPLES_PS_LAUNCH_H

#include "examples/flags.h"
#include <zdist/rpc.h>

/*  zd_rpc_init with the resolved flags (flags_world_resolve), and name for
    this process. 0, or -1 with a message on stderr. */
int ps_world_init(const flags_world_t *w, const char *name, const char *prog);

#endif
