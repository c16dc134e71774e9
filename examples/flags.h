/*  flags.h: command-line flags of the example programs, "--name=value" or
    "--name value", as the PyTorch tutorials' argparse accepts them. */
#ifndef ZDIST_EXAMPLES_FLAGS_H
#define ZDIST_EXAMPLES_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

typedef enum { FLAG_INT, FLAG_DOUBLE, FLAG_STRING, FLAG_BOOL } flag_type_t;

typedef struct {
    const char *name;       /* without the leading "--" */
    flag_type_t type;
    void *ptr;              /* int64_t *, double *, const char **, bool * */
    const char *help;
} flag_t;

/*  Parses argv into the flags' variables (which hold the defaults). Prints
    usage and returns 1 for --help; prints a clear message naming the flag
    and returns -1 for an unknown flag, a missing value or a malformed
    number; returns 0 otherwise. */
int flags_parse(int argc, char **argv, const flag_t *flags, int n, const char *summary);

/*  Prints the flags with their defaults/current values. */
void flags_usage(const char *prog, const flag_t *flags, int n, const char *summary);

#endif
