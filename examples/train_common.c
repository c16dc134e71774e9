/* SPDX-License-Identifier: MIT */
#include "examples/train_common.h"

#include <time.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>

#define EVAL_BATCH 1000

int train_evaluate(zd_nn_module_t *m, const zd_dataset_t *ds, double *accuracy)
{
    bool was_training = zd_nn_module_train(m, false);
    bool grad = zd_autograd_set_grad_enabled(false);
    int64_t correct = 0, n = zd_dataset_len(ds);
    int rc = 0;
    for (int64_t start = 0; start < n && rc == 0; start += EVAL_BATCH) {
        zd_tensor_t *x = NULL, *y = NULL, *logprobs = NULL;
        rc = zd_dataset_batch(ds, NULL, start, EVAL_BATCH, &x, &y);
        if (rc == 0)
            rc = zd_nn_module_forward(m, &x, 1, &logprobs, 1);
        if (rc == 0) {
            int64_t c = zd_nn_accuracy(logprobs, y);
            if (c < 0)
                rc = -1;
            else
                correct += c;
        }
        zd_tensor_unref(logprobs);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_autograd_set_grad_enabled(grad);
    zd_nn_module_train(m, was_training);
    if (rc == 0)
        *accuracy = n ? (double)correct / (double)n : 0.0;
    return rc;
}

int train_ps_accuracy(zd_ps_model_t *model, const zd_dataset_t *ds, int64_t limit, int64_t batch,
                      double *accuracy)
{
    int64_t n = zd_dataset_len(ds), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    bool was = zd_ps_model_train(model, false);
    int rc = 0;
    for (int64_t start = 0; rc == 0 && start < n; start += batch) {
        zd_tensor_t *x, *y, *out = NULL;
        if ((rc = zd_dataset_batch(ds, NULL, start, n - start < batch ? n - start : batch, &x,
                                   &y)) < 0)
            break;
        rc = zd_ps_model_forward(model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT);
        int64_t c = rc == 0 ? zd_nn_accuracy(out, y) : -1;
        rc = c < 0 ? -1 : 0;
        correct += c;
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_ps_model_train(model, was);
    if (rc == 0)
        *accuracy = n ? (double)correct / (double)n : 0;
    return rc;
}

void train_resume_position(int64_t done, int64_t per_epoch, int64_t *epoch, int64_t *batch)
{
    *epoch = per_epoch > 0 ? done / per_epoch : 0;
    *batch = per_epoch > 0 ? done % per_epoch : 0;
}

double train_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
