#include "examples/train_common.h"

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/checkpoint.h"
#include "nn/nn.h"

#define EVAL_BATCH 1000
#define MAX_PARAMS 32

int train_evaluate(nn_model_t *m, const dataset_t *ds, double *accuracy)
{
    bool was_training = nn_model_train(m, false);
    bool grad = autograd_set_grad_enabled(false);
    int64_t correct = 0, n = dataset_size(ds);
    int rc = 0;
    for (int64_t start = 0; start < n && rc == 0; start += EVAL_BATCH) {
        tensor_t *x = NULL, *y = NULL, *logprobs = NULL;
        rc = dataset_batch(ds, NULL, start, EVAL_BATCH, &x, &y);
        if (rc == 0)
            rc = nn_model_forward(m, x, &logprobs);
        if (rc == 0) {
            int64_t c = nn_accuracy(logprobs, y);
            if (c < 0)
                rc = -1;
            else
                correct += c;
        }
        tensor_unref(logprobs);
        tensor_unref(x);
        tensor_unref(y);
    }
    autograd_set_grad_enabled(grad);
    nn_model_train(m, was_training);
    if (rc == 0)
        *accuracy = n ? (double)correct / (double)n : 0.0;
    return rc;
}

static int collect(nn_model_t *m, const char **names, tensor_t **tensors)
{
    int n = nn_model_n_params(m);
    if (n > MAX_PARAMS)
        return error_set("model has %d parameters, more than %d", n, MAX_PARAMS);
    for (int i = 0; i < n; i++) {
        names[i] = nn_model_param_name(m, i);
        tensors[i] = nn_model_param(m, i);
    }
    return n;
}

int train_checkpoint_save(nn_model_t *m, const char *path)
{
    const char *names[MAX_PARAMS];
    tensor_t *tensors[MAX_PARAMS];
    int n = collect(m, names, tensors);
    return n < 0 ? -1 : checkpoint_save(path, n, names, tensors);
}

int train_checkpoint_load(nn_model_t *m, const char *path)
{
    const char *names[MAX_PARAMS];
    tensor_t *tensors[MAX_PARAMS];
    int n = collect(m, names, tensors);
    return n < 0 ? -1 : checkpoint_load(path, n, names, tensors);
}

void train_resume_position(int64_t done, int64_t per_epoch, int64_t *epoch, int64_t *batch)
{
    *epoch = per_epoch > 0 ? done / per_epoch : 0;
    *batch = per_epoch > 0 ? done % per_epoch : 0;
}
