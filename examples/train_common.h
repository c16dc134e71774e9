/*  train_common.h: pieces the training programs share. */
#ifndef ZDIST_EXAMPLES_TRAIN_COMMON_H
#define ZDIST_EXAMPLES_TRAIN_COMMON_H

#include "nn/dataset.h"
#include "nn/model.h"

/*  Accuracy of m on the whole of ds, in evaluation mode (dropout off) and
    without recording gradients; m's mode is restored. Returns 0 and sets
    *accuracy in [0, 1], or -1. */
int train_evaluate(nn_model_t *m, const dataset_t *ds, double *accuracy);

/*  Saves / loads m's named parameters (nn/checkpoint.h format). */
int train_checkpoint_save(nn_model_t *m, const char *path);
int train_checkpoint_load(nn_model_t *m, const char *path);

#endif
