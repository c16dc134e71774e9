#include "examples/flags.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void flags_usage(const char *prog, const flag_t *flags, int n, const char *summary)
{
    fprintf(stderr, "usage: %s [flags]\n%s\n\nflags:\n", prog, summary);
    for (int i = 0; i < n; i++) {
        const flag_t *f = &flags[i];
        char def[64] = "";
        switch (f->type) {
        case FLAG_INT: snprintf(def, sizeof def, "%" PRId64, *(int64_t *)f->ptr); break;
        case FLAG_DOUBLE: snprintf(def, sizeof def, "%g", *(double *)f->ptr); break;
        case FLAG_STRING: snprintf(def, sizeof def, "%s", *(const char **)f->ptr ? *(const char **)f->ptr : ""); break;
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
