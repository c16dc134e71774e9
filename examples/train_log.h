/* SPDX-License-Identifier: MIT */
/*  train_log.h: what a training loop reports as it goes, in one place:
    the progress line (progress.h), the curves (curves.h) and their
    points, and the time evaluations take, left out of the rates.

        train_log_t log;
        train_log_open(&log, &(train_log_config_t){...}, train_now());
        for each batch:   train_log_batch(&log, done, loss, train_now());
        an evaluation:    t = train_now(); ...; train_log_accuracy(&log, done, acc, t);
        at the end:       seconds = train_log_end(&log, train_now());
        always:           train_log_close(&log, failed);
*/
#ifndef ZDIST_EXAMPLES_TRAIN_LOG_H
#define ZDIST_EXAMPLES_TRAIN_LOG_H

#include <stdbool.h>
#include <stdint.h>

#include "examples/curves.h"
#include "examples/progress.h"

typedef struct {
    const char *label;       /* the progress line's ("Rank 1"; copied), or NULL */
    const char *curves;      /* the curves' files, PREFIX.csv and .png; NULL: none */
    const char *title;       /* the plot's title */
    int64_t first;           /* batches done before this run (a resume) */
    int64_t total;           /* batches of the whole run, first included */
    int64_t per_epoch;       /* batches in an epoch */
    int64_t epochs;          /* epochs of the run */
    int64_t batch_size;      /* samples in a batch (the rates' unit) */
    int64_t points_every;    /* batches a curve point gathers */
    double progress_every_s; /* seconds between progress lines (0: none) */
} train_log_config_t;

typedef struct {
    progress_t progress;
    curves_t *curves; /* NULL: none */
    curves_points_t points;
    int64_t batch_size;
    double t0;        /* when the run started */
    double eval_secs; /* spent evaluating since */
} train_log_t;

/*  Starts the log at time now (the curves' files made). 0, or -1 with the
    error (a file that cannot be written, named). */
int train_log_open(train_log_t *l, const train_log_config_t *c, double now);

/*  A trained batch, `done` in all, its loss, at time now: the progress
    line and the curve points. 0, or -1 with the error. */
int train_log_batch(train_log_t *l, int64_t done, float loss, double now);

/*  Clears the progress line, for a line of the program's own. */
void train_log_clear(train_log_t *l);

/*  The test accuracy after `done` batches, evaluated from time since to
    now: onto the curves, and that time left out of the rates. 0, or -1. */
int train_log_accuracy(train_log_t *l, int64_t done, double accuracy, double since);

/*  Ends the progress line; the seconds spent training (evaluations left
    out) since train_log_open. */
double train_log_end(train_log_t *l, double now);

/*  Closes the curves' files, drawing the plot of what there is first
    when the run failed. */
void train_log_close(train_log_t *l, bool failed);

#endif
