/* SPDX-License-Identifier: MIT */
/*  progress.h: the progress line of the training programs.

        Rank 1 epoch 1/2 batch 2400/3750 64% 1520 samples/s loss(avg) 0.4127 elapsed 52s left 29s

    printed every few seconds (not every N batches, so a fast and a slow
    run both print a readable amount). The batch counts across epochs and
    from the start of the run (a resumed run starts where it stopped); the
    rate is that of the last interval, the time left is the batches still
    to do at the average rate of this run; the loss is the mean over the
    batches since the previous line (the tutorials' "running loss").
    On a terminal it is one line rewritten in place (carriage return, then
    clear to the end of the line); into a pipe or a file, plain lines.

    Time is an argument of every call (seconds on any monotonic clock), so
    that tests drive it with a fake clock. */
#ifndef ZDIST_EXAMPLES_PROGRESS_H
#define ZDIST_EXAMPLES_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *label;        /* "Rank 1", "train_local", ... (copied) */
    const char *unit;         /* "batch" (NULL), "iteration", ... (a literal: not copied) */
    int64_t first;            /* steps done before this run (resume) */
    int64_t total;            /* steps of the whole run, first included; 0: unknown */
    int64_t per_epoch;        /* steps an epoch; 0: no epoch shown */
    int64_t epochs;           /* shown as epoch E/epochs; 0: just E */
    int64_t samples_per_step; /* samples a step stands for (the rate's unit) */
    double every_s;           /* seconds between lines; <= 0: never print */
} progress_config_t;

typedef struct {
    progress_config_t c;
    char label[48];
    FILE *out;
    bool tty;          /* rewrite one line in place */
    int64_t done;      /* steps done, counting c.first */
    double t0;         /* when the run started */
    double last_t;     /* when the previous line was printed */
    int64_t last_done; /* steps done then */
    double loss_sum;   /* losses since the previous line */
    int64_t loss_n;
    double shown_loss; /* the mean printed last (NaN: none yet) */
    bool shown;        /* a tty line is on the screen */
    bool redraw;       /* the line was cleared: show it again at the next step */
} progress_t;

/*  Starts a progress report on out at time now. tty: rewrite one line in
    place (pass isatty(fileno(out))). */
void progress_init(progress_t *p, FILE *out, bool tty, const progress_config_t *c, double now);

/*  One more step done at time now, with its loss (NaN: none). Prints the
    line when every_s has passed since the previous one. */
void progress_step(progress_t *p, double now, double loss);

/*  Takes `seconds` of time not spent on steps (an evaluation) out of the
    current interval's rate. The time left still counts it: a run that
    evaluates now will likely evaluate again. */
void progress_skip(progress_t *p, double seconds);

/*  Formats the line as it would be printed at time now (no \r, no \n) into
    buf; returns buf. */
char *progress_format(const progress_t *p, double now, char *buf, size_t size);

/*  Formats a duration: "42s", "3m07s", "2h05m". */
char *progress_duration(double seconds, char *buf, size_t size);

/*  Before printing anything else to the same terminal: takes the line off
    the screen (it comes back at the next step). No-op into a pipe. */
void progress_clear(progress_t *p);

/*  The end of the run: on a terminal, the final state stays on screen and
    the cursor goes to the next line. No-op into a pipe (the program prints
    its own summary). */
void progress_end(progress_t *p, double now);

#endif
