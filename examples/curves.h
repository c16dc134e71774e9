/* SPDX-License-Identifier: MIT */
/*  curves.h: training curves of the example programs (--curves=PREFIX),
    written while the run goes on.

    PREFIX.csv gets a row per point as it comes (appended and flushed, so a
    killed run keeps every point it had):

        batch,epoch,loss,samples_per_s,test_accuracy
        50,1,0.8123,1490.2,             a training point
        100,1,,,0.7712                  an evaluation

    batch counts the batches done across epochs, epoch is the (1-based)
    epoch of the last of them; loss is the mean over the batches since the
    previous point. PREFIX.png is the plot, drawn with cairo: the loss, the
    test accuracy (when there are evaluations) and the throughput in panels
    over a shared batch axis, with ticks, gridlines, axis titles, legends
    and the epoch boundaries. It is redrawn at every evaluation and by
    curves_draw, written to a temporary file renamed over the old one, so
    a reader never sees half a PNG. */
#ifndef ZDIST_EXAMPLES_CURVES_H
#define ZDIST_EXAMPLES_CURVES_H

#include <stdint.h>

#define CURVES_PNG_WIDTH  960
#define CURVES_PNG_HEIGHT 720

typedef struct curves curves_t;

/*  Creates (or truncates) prefix.csv and writes its header; the plot will
    be prefix.png, titled title. per_epoch: batches in an epoch (for the
    epoch column and the boundaries; 0: one endless epoch). NULL, with an
    error naming the file, when it cannot be written. */
curves_t *curves_open(const char *prefix, const char *title, int64_t per_epoch);

/*  Closes the CSV and frees c (NULL-safe); the PNG stays as last drawn. */
void curves_close(curves_t *c);

/*  A training point after `batch` batches: the mean loss since the
    previous point and the samples/s (NaN: not known). Appended to the CSV
    at once. 0, or -1 with an error. */
int curves_add(curves_t *c, int64_t batch, double loss, double samples_per_s);

/*  Batches gathered into training points: every `every` batches, the mean
    loss and the samples/s since the previous point. */
typedef struct {
    int64_t every, n;
    double loss, since;
} curves_points_t;

void curves_points_init(curves_points_t *p, int64_t every, double now);

/*  One batch's loss and samples at time now, `done` batches in all; adds a
    point to c (NULL: none kept) when done is a multiple of every. 0, or -1
    with an error. */
int curves_batch(curves_t *c, curves_points_t *p, int64_t done, double loss, int64_t samples,
                 double now);

/*  Leaves seconds spent elsewhere (an evaluation) out of the throughput. */
void curves_points_skip(curves_points_t *p, double seconds);

/*  The test accuracy in [0, 1] after `batch` batches: appended to the
    CSV, then the PNG is redrawn. 0, or -1 with an error. */
int curves_add_accuracy(curves_t *c, int64_t batch, double accuracy);

/*  Draws the PNG from every point so far (atomically: a temporary file,
    then rename). 0, or -1 with an error naming the file. */
int curves_draw(const curves_t *c);

/*  The PNG's path (owned by c). */
const char *curves_png_path(const curves_t *c);

typedef enum { CURVES_LOSS, CURVES_ACCURACY, CURVES_SPEED } curves_panel_t;

/*  Where the PNG as curves_draw would draw it now puts the point (batch,
    value) of a panel's series (accuracy in [0, 1]), in pixels from the top
    left corner: for tests. 0, or -1 when that panel is not drawn (the
    accuracy panel without evaluations). */
int curves_locate(const curves_t *c, curves_panel_t panel, int64_t batch, double value, double *x,
                  double *y);

#endif
