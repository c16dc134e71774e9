#include "examples/ps_launch.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "autograd/error.h"

ps_world_flags_t ps_world_flags_default(void)
{
    return (ps_world_flags_t){.rank = -1, .world_size = 0, .master_addr = NULL,
                              .master_port = 0};
}

/*  An integer from the environment: 1 if set and well formed, 0 if unset,
    -1 (with a message) if malformed. */
static int env_int(const char *name, int64_t *out, const char *prog)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return 0;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (*end || errno) {
        fprintf(stderr, "%s: %s=\"%s\" is not an integer\n", prog, name, v);
        return -1;
    }
    *out = x;
    return 1;
}

int ps_world_resolve(ps_world_flags_t *w, int64_t layout_size, const char *prog)
{
    if (w->rank < 0 && env_int("RANK", &w->rank, prog) <= 0) {
        fprintf(stderr, "%s: no rank: pass --rank=N or set RANK (tools/launch does)\n", prog);
        return -1;
    }
    if (w->world_size <= 0) {
        int r = env_int("WORLD_SIZE", &w->world_size, prog);
        if (r < 0)
            return -1;
        if (r == 0)
            w->world_size = layout_size;
    }
    if (!w->master_addr) {
        const char *v = getenv("MASTER_ADDR");
        w->master_addr = v && *v ? v : "localhost";
    }
    if (w->master_port <= 0) {
        int r = env_int("MASTER_PORT", &w->master_port, prog);
        if (r < 0)
            return -1;
        if (r == 0)
            w->master_port = 29500;
    }
    if (w->rank < 0 || w->rank >= w->world_size) {
        fprintf(stderr, "%s: rank %lld is outside a world of %lld processes\n", prog,
                (long long)w->rank, (long long)w->world_size);
        return -1;
    }
    if (w->master_port > 65535) {
        fprintf(stderr, "%s: master port %lld is not a TCP port\n", prog,
                (long long)w->master_port);
        return -1;
    }
    return 0;
}

int ps_world_init(const ps_world_flags_t *w, const char *name, const char *prog)
{
    rpc_options_t opts = rpc_options_default();
    opts.master_addr = w->master_addr;
    opts.master_port = (int)w->master_port;
    if (rpc_init(name, (int)w->rank, (int)w->world_size, &opts) < 0) {
        fprintf(stderr, "%s: rank %lld: rpc_init: %s\n", prog, (long long)w->rank,
                error_last());
        return -1;
    }
    return 0;
}
