/* SPDX-License-Identifier: MIT */
/*  program.h: run the built programs (tools/launch, the examples) as a
    user would and capture what they print: whole runs with a deadline, or
    a run followed as it goes (read until a line appears, then act on the
    processes, then wait). Programs are found in $ZDIST_BUILD_DIR, which
    ctest sets. */
#ifndef ZDIST_TESTS_PROGRAM_H
#define ZDIST_TESTS_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct {
    pid_t pid;
    int fd;    /* stdout and stderr of the child, merged */
    char *out; /* everything read so far, NUL-terminated (NULL: nothing); the caller frees */
    size_t len, cap;
} program_t;

/*  $ZDIST_BUILD_DIR/rel ("./rel" without it), in one of eight rotating
    buffers, so that one call may take several. */
const char *program_path(const char *rel);

/*  Seconds on the monotonic clock: deadlines for program_read and
    program_wait. */
double program_now_s(void);

/*  Starts argv[0] (a path) with argv, stdout and stderr into one pipe: 0,
    or -1. */
int program_start(program_t *p, char *const argv[]);

/*  Reads output until `until` appears in it (NULL: until end of file) or
    the deadline: 1 when found (or at end of file), 0 on timeout. */
int program_read(program_t *p, const char *until, double deadline);

/*  Reads to the end and waits for the child, killing it at the deadline;
    returns its exit status (128 + N for death by signal N). */
int program_wait(program_t *p, double deadline);

/*  Runs argv to its end within timeout_s: its exit status (-1 when it
    could not start) and its output (*output, to free). Prints the command
    and the output when the status is not the one expected (0 when
    expect_ok, else not 0). */
int program_run(char *const argv[], int timeout_s, bool expect_ok, char **output);

/*  program_run of "tools/launch --nproc=nproc --timeout_s=600 -- prog
    flags", prog relative to the build directory ("examples/rl_rpc"), flags
    separated by spaces (no quoting). */
int program_run_world(const char *prog, int nproc, const char *flags, bool expect_ok,
                      char **output);

#endif
