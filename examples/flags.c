/* SPDX-License-Identifier: MIT */
#include "examples/flags.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

void flags_usage(const char *prog, const flag_t *flags, int n, const char *summary)
{
    fprintf(stderr, "usage: %s [flags]\n%s\n\nflags:\n", prog, summary);
    for (int i = 0; i < n; i++) {
        const flag_t *f = &flags[i];
        char def[64] = "";
        switch (f->type) {
        case FLAG_INT: snprintf(def, sizeof def, "%" PRId64, *(int64_t *)f->ptr); break;
        case FLAG_DOUBLE: snprintf(def, sizeof def, "%g", *(double *)f->ptr); break;
        case FLAG_STRING: {
            const char *v = *(const char **)f->ptr;
            snprintf(def, sizeof def, "%s", v ? v : "");
            break;
        }
        case FLAG_BOOL: snprintf(def, sizeof def, "%s", *(bool *)f->ptr ? "true" : "false"); break;
        }
        fprintf(stderr, "  --%-16s %s (default: %s)\n", f->name, f->help, def);
    }
}

static int set_value(const char *prog, const flag_t *f, const char *v)
{
    char *end;
    errno = 0;
    switch (f->type) {
    case FLAG_INT: {
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || errno) {
            fprintf(stderr, "%s: --%s expects an integer, got \"%s\"\n", prog, f->name, v);
            return -1;
        }
        *(int64_t *)f->ptr = x;
        return 0;
    }
    case FLAG_DOUBLE: {
        double x = strtod(v, &end);
        if (end == v || *end || errno) {
            fprintf(stderr, "%s: --%s expects a number, got \"%s\"\n", prog, f->name, v);
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
            fprintf(stderr, "%s: unexpected argument \"%s\" (flags look like --name=value; "
                            "--help lists them)\n", prog, arg);
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
    return (flags_world_t){.rank = -1, .world_size = 0, .master_addr = NULL,
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

/*  *value from the environment variable when unset (<= unset), else
    fallback. 0, or -1 (malformed). */
static int env_or(const char *name, int64_t *value, int64_t unset, int64_t fallback,
                  const char *prog)
{
    if (*value > unset)
        return 0;
    int r = env_int(name, value, prog);
    if (r == 0)
        *value = fallback;
    return r < 0 ? -1 : 0;
}

int flags_world_resolve(flags_world_t *w, int64_t default_size, const char *prog)
{
    if (w->rank < 0) {
        int r = env_int("RANK", &w->rank, prog);
        if (r == 0)
            fprintf(stderr, "%s: no rank: pass --rank=N or set RANK (tools/launch does)\n",
                    prog);
        if (r <= 0)
            return -1;
    }
    if (env_or("WORLD_SIZE", &w->world_size, 0, default_size, prog) < 0 ||
        env_or("MASTER_PORT", &w->master_port, 0, 29500, prog) < 0)
        return -1;
    if (!w->master_addr) {
        const char *v = getenv("MASTER_ADDR");
        w->master_addr = v && *v ? v : "localhost";
    }
    if (w->rank < 0 || w->rank >= w->world_size) {
        fprintf(stderr, "%s: rank %lld is outside a world of %lld processes\n", prog,
                (long long)w->rank, (long long)w->world_size);
        return -1;
    }
    if (w->master_port < 1 || w->master_port > 65535) {
        fprintf(stderr, "%s: master port %lld is not a TCP port (1..65535)\n", prog,
                (long long)w->master_port);
        return -1;
    }
    return 0;
}

int flags_world_init(const flags_world_t *w, const char *name, int64_t init_timeout_ms,
                     const char *prog)
{
    /* The library reads the folder from the environment at zd_rpc_init. */
    if (w->metrics && *w->metrics && setenv("ZDIST_METRICS", w->metrics, 1) < 0) {
        fprintf(stderr, "%s: --metrics: %s\n", prog, strerror(errno));
        return -1;
    }
    zd_rpc_options_t opts = zd_rpc_options_default();
    opts.master_addr = w->master_addr;
    opts.master_port = (int)w->master_port;
    if (init_timeout_ms >= 0)
        opts.init_timeout_ms = init_timeout_ms;
    if (zd_rpc_init(name, (int)w->rank, (int)w->world_size, &opts) < 0) {
        fprintf(stderr, "%s: rank %lld: zd_rpc_init: %s\n", prog, (long long)w->rank,
                zd_error_last());
        return -1;
    }
    return 0;
}
