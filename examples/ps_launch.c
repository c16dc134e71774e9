#include "examples/ps_launch.h"

#include <stdio.h>

#include <zdist/error.h>

int ps_world_init(const flags_world_t *w, const char *name, const char *prog)
{
    zd_rpc_options_t opts = zd_rpc_options_default();
    opts.master_addr = w->master_addr;
    opts.master_port = (int)w->master_port;
    if (zd_rpc_init(name, (int)w->rank, (int)w->world_size, &opts) < 0) {
        fprintf(stderr, "%s: rank %lld: zd_rpc_init: %s\n", prog, (long long)w->rank,
                zd_error_last());
        return -1;
    }
    return 0;
}
