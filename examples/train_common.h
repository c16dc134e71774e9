/* SPDX-License-Identifier: MIT */
/*  train_common.h: pieces the training programs share. */
#ifndef ZDIST_EXAMPLES_TRAIN_COMMON_H
#define ZDIST_EXAMPLES_TRAIN_COMMON_H

#include <zdist/dataset.h>
#include <zdist/model.h>
#include <zdist/ps.h>

/*  Accuracy of m on the whole of ds, in evaluation mode (dropout off) and
    without recording gradients; m's mode is restored. Returns 0 and sets
    *accuracy in [0, 1], or -1. */
int train_evaluate(zd_nn_module_t *m, const zd_dataset_t *ds, double *accuracy);

/*  The tutorials' get_accuracy for a model served by parameter servers:
    the first `limit` images of ds (0: all), `batch` at a time, through
    model's stages in evaluation mode (zd_ps_model_train; its mode
    restored). Returns 0 and sets *accuracy in [0, 1], or -1. */
int train_ps_accuracy(zd_ps_model_t *model, const zd_dataset_t *ds, int64_t limit, int64_t batch,
                      double *accuracy);

/*  Where a run that had done `done` batches of `per_epoch` each goes on:
    the epoch and the batch within it (the epoch's order depends only on
    the seed and the epoch, so the same batches follow). per_epoch 0 gives
    epoch 0, batch 0. */
void train_resume_position(int64_t done, int64_t per_epoch, int64_t *epoch, int64_t *batch);

/*  Seconds on the monotonic clock: for timing. */
double train_now(void);

#endif
