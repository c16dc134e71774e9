/* SPDX-License-Identifier: MIT */
/*  curves.h: training curves (SPEC B4), written as CSV and drawn as a PNG.

    A program adds points as it trains (batch, loss, samples/s) and, at
    the end, its test accuracy; curves_write then writes PATH.csv, one row
    a point, and PATH.png, the loss and the throughput over the batches in
    two panels, with the accuracy in the title. The PNG is encoded here with
    zlib (already needed for .gz data sets): no other library. */
#ifndef ZDIST_EXAMPLES_CURVES_H
#define ZDIST_EXAMPLES_CURVES_H

#include <stdint.h>

typedef struct curves curves_t;

/*  An empty set of curves titled title (copied). NULL (error set) when out
    of memory. */
curves_t *curves_new(const char *title);

/*  Frees c and its points (NULL-safe). */
void curves_free(curves_t *c);

/*  One point: after `batch` batches, the loss and the throughput so far.
    0, or -1 when out of memory. */
int curves_add(curves_t *c, int64_t batch, double loss, double samples_per_s);

/*  The final test accuracy, in [0, 1]: the CSV's last row, the title's end. */
void curves_set_accuracy(curves_t *c, double accuracy);

/*  Writes path_prefix.csv ("batch,loss,samples_per_s,test_accuracy", then
    the points, then a row with the accuracy) and path_prefix.png (640x480).
    0, or -1 with an error naming the file that could not be written. */
int curves_write(const curves_t *c, const char *path_prefix);

/*  The PNG encoder on its own: w x h pixels, 3 bytes (RGB) each, rows top
    to bottom. 0, or -1 with an error naming the file. */
int curves_png_write(const char *path, const uint8_t *rgb, int w, int h);

#endif
