/* SPDX-License-Identifier: MIT */
#include "examples/flags.h"

#include <errno.h>
#include <limits.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/rpc.h>

/*  The range of an integer flag's type: [lo, hi], and how to say it. */
static void int_range(flag_type_t type, long long *lo, long long *hi, const char **what)
{
    *lo = LLONG_MIN, *hi = LLONG_MAX, *what = "an integer";
    if (type == FLAG_COUNT)
        *lo = 1, *what = "an integer of at least 1";
    else if (type == FLAG_INDEX)
        *lo = 0, *what = "an integer of at least 0";
    else if (type == FLAG_PORT)
        *lo = 1, *hi = 65535, *what = "a port from 1 to 65535";
}

void flags_usage(const char *prog, const flag_t *flags, int n, const char *summary)
{
    fprintf(stderr, "usage: %s [flags]\n%s\n\nflags:\n", prog, summary);
    for (int i = 0; i < n; i++) {
        const flag_t *f = &flags[i];
        char def[64] = "";
        switch (f->type) {
        case FLAG_INT:
            snprintf(def, sizeof def, "%" PRId64, *(int64_t *)f->ptr);
            break;
        case FLAG_COUNT:
        case FLAG_INDEX:
        case FLAG_PORT: {
            long long lo, hi, v = *(int64_t *)f->ptr;
            const char *what;
            int_range(f->type, &lo, &hi, &what);
            if (v < lo || v > hi)
                snprintf(def, sizeof def, "unset");
            else
                snprintf(def, sizeof def, "%lld", v);
            break;
        }
        case FLAG_DOUBLE:
            snprintf(def, sizeof def, "%g", *(double *)f->ptr);
            break;
        case FLAG_STRING: {
            const char *v = *(const char **)f->ptr;
            snprintf(def, sizeof def, "%s", v ? v : "");
            break;
        }
        case FLAG_BOOL:
            snprintf(def, sizeof def, "%s", *(bool *)f->ptr ? "true" : "false");
            break;
        }
        fprintf(stderr, "  --%-16s %s (default: %s)\n", f->name, f->help, def);
    }
}

static int set_value(const char *prog, const flag_t *f, const char *v)
{
    char *end;
    errno = 0;
    switch (f->type) {
    case FLAG_INT:
    case FLAG_COUNT:
    case FLAG_INDEX:
    case FLAG_PORT: {
        long long lo, hi, x = strtoll(v, &end, 10);
        const char *what;
        int_range(f->type, &lo, &hi, &what);
        if (end == v || *end || errno || x < lo || x > hi) {
            /* The value a variable holds for "unset" is no value to type:
               it would silently become the default. */
            fprintf(stderr, "%s: --%s expects %s, got \"%s\"%s\n", prog, f->name, what, v,
                    f->type == FLAG_INT ? ""
                                        : " (leave the flag out: the launcher's value, else "
                                          "the default)");
            return -1;
        }
        *(int64_t *)f->ptr = x;
        return 0;
    }
    case FLAG_DOUBLE: {
        double x = strtod(v, &end);
        /* nan passes every "x <= 0" check a program makes, and inf is
           applied as it is (a learning rate of inf diverges at once). */
        if (end == v || *end || errno || !isfinite(x)) {
            fprintf(stderr, "%s: --%s expects a finite number, got \"%s\"\n", prog, f->name, v);
            return -1;
        }
        *(double *)f->ptr = x;
        return 0;
    }
    case FLAG_STRING:
        *(const char **)f->ptr = v;
        return 0;
    case FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true")) {
            *(bool *)f->ptr = true;
        } else if (!strcmp(v, "0") || !strcmp(v, "false")) {
            *(bool *)f->ptr = false;
        } else {
            fprintf(stderr, "%s: --%s expects true or false, got \"%s\"\n", prog, f->name, v);
            return -1;
        }
        return 0;
    }
    return -1;
}

int flags_parse(int argc, char **argv, const flag_t *flags, int n, const char *summary)
{
    const char *prog = argv[0];
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            flags_usage(prog, flags, n, summary);
            return 1;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(stderr,
                    "%s: unexpected argument \"%s\" (flags look like --name=value; "
                    "--help lists them)\n",
                    prog, arg);
            return -1;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag_t *f = NULL;
        for (int k = 0; k < n; k++)
            if (strlen(flags[k].name) == len && !strncmp(flags[k].name, name, len))
                f = &flags[k];
        if (!f) {
            fprintf(stderr, "%s: unknown flag --%.*s (--help lists the flags)\n", prog, (int)len,
                    name);
            return -1;
        }
        const char *value = eq ? eq + 1 : NULL;
        if (!value && f->type == FLAG_BOOL) {
            *(bool *)f->ptr = true;
            continue;
        }
        if (!value) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --%s needs a value\n", prog, f->name);
                return -1;
            }
            value = argv[++i];
        }
        if (set_value(prog, f, value) < 0)
            return -1;
    }
    return 0;
}

flags_world_t flags_world_default(void)
{
    return (flags_world_t){
        .rank = -1, .world_size = 0, .master_addr = NULL, .master_port = 0, .listen_addr = NULL};
}

int flags_world_resolve(flags_world_t *w, int64_t default_size, const char *prog)
{
    if (w->rank > INT32_MAX || w->world_size > INT32_MAX || w->master_port < 0 ||
        w->master_port > 65535) {
        fprintf(stderr, "%s: --rank, --world_size or --master_port out of range\n", prog);
        return -1;
    }
    /* The variable lets a harness stretch every example's calls at once
       (the tests under ThreadSanitizer, whose processes run ten times
       slower) without a flag in each command line. */
    const char *t = getenv("ZDIST_RPC_TIMEOUT_S");
    if (w->rpc_timeout_s == 0 && t && *t) {
        char *end;
        errno = 0;
        long long v = strtoll(t, &end, 10);
        if (errno || *end || v < 0) {
            fprintf(stderr, "%s: ZDIST_RPC_TIMEOUT_S=\"%s\" is not a number of seconds\n", prog, t);
            return -1;
        }
        w->rpc_timeout_s = v;
    }
    if (w->rpc_timeout_s < 0 || w->rpc_timeout_s > 604800) {
        fprintf(stderr, "%s: --rpc_timeout_s=%lld is outside 0..604800 seconds\n", prog,
                (long long)w->rpc_timeout_s);
        return -1;
    }
    zd_rpc_env_t *e = &w->env;
    if (zd_rpc_env_resolve(w->rank < 0 ? -1 : (int)w->rank,
                           w->world_size < 0 ? 0 : (int)w->world_size, w->master_addr,
                           (int)w->master_port, e, sizeof *e) < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        return -1;
    }
    if (!e->rank_from) {
        fprintf(stderr,
                "%s: no rank: pass --rank=N, set RANK, or start it with a launcher "
                "(tools/launch, torchrun, srun, mpirun)\n",
                prog);
        return -1;
    }
    w->rank = e->rank;
    w->world_size = e->world_size_from ? e->world_size : default_size;
    /* Rank 0 without a master address listens on every interface (as
       PyTorch's TCPStore does): what the one-line recipe for several hosts,
       "--rank=0" on the server and "--master_addr=HOST" elsewhere, needs. */
    w->master_addr = e->master_addr_from ? e->master_addr : w->rank == 0 ? NULL : "localhost";
    w->master_port = e->master_port_from ? e->master_port : 29500;
    if (w->rank >= w->world_size) {
        fprintf(stderr, "%s: rank %lld is outside a world of %lld processes\n", prog,
                (long long)w->rank, (long long)w->world_size);
        return -1;
    }
    return 0;
}

/*  What the environment gave (rather than a flag or a default). */
static bool from_env(const char *from)
{
    return from && strcmp(from, "the arguments") != 0;
}

int flags_world_init(const flags_world_t *w, const char *name, int64_t init_timeout_ms,
                     const char *prog)
{
    /* The library reads the folder from the environment at zd_rpc_init. */
    if (w->metrics && *w->metrics && setenv("ZDIST_METRICS", w->metrics, 1) < 0) {
        fprintf(stderr, "%s: --metrics: %s\n", prog, strerror(errno));
        return -1;
    }
    const zd_rpc_env_t *e = &w->env;
    zd_rpc_options_t opts = zd_rpc_options_default();
    opts.master_addr = from_env(e->master_addr_from) ? NULL : w->master_addr;
    opts.master_port = from_env(e->master_port_from) ? 0 : (int)w->master_port;
    opts.listen_addr = w->listen_addr; /* NULL: $ZDIST_LISTEN_ADDR, else the route's */
    if (init_timeout_ms >= 0)
        opts.init_timeout_ms = init_timeout_ms;
    opts.key_file = w->key_file;
    opts.insecure = w->insecure;
    if (w->rpc_timeout_s > 0)
        opts.rpc_timeout_ms = w->rpc_timeout_s * 1000;
    if (zd_rpc_init(name, from_env(e->rank_from) ? -1 : (int)w->rank,
                    from_env(e->world_size_from) ? 0 : (int)w->world_size, &opts) < 0) {
        fprintf(stderr, "%s: rank %lld: zd_rpc_init: %s\n", prog, (long long)w->rank,
                zd_error_last());
        return -1;
    }
    /* Where rank, world and master came from, once per process: the
       library logs it at info level, below the default one, and a user of
       srun or mpirun wants to see it without asking. */
    if (!zd_log_enabled(ZD_LOG_INFO))
        printf("%s: %s\n", prog, e->summary);
    return 0;
}
