/*  model_private.h: the model structure, shared by model*.c only. */
#ifndef ZDIST_NN_MODEL_PRIVATE_H
#define ZDIST_NN_MODEL_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>

#include "nn/model.h"
#include "nn/rng.h"

#define NN_MODEL_MAX_PARAMS 16

typedef int (nn_forward_fn)(nn_model_t *m, tensor_t *x, tensor_t **out);

struct nn_model {
    const char *name;
    nn_forward_fn *forward;
    int n_params;
    tensor_t *params[NN_MODEL_MAX_PARAMS];
    atomic_bool training;
    pthread_mutex_t rng_lock;     /* guards rng */
    nn_rng_t rng;                 /* seeds of per-forward dropout streams */
};

/*  A model with no parameters yet; the seed goes to the dropout stream. */
nn_model_t *nn_model_alloc(const char *name, nn_forward_fn *forward, uint64_t seed);

/*  Adds a zero-filled parameter of the given shape, named, requiring grad.
    Returns it (borrowed), or NULL. */
tensor_t *nn_model_add_param(nn_model_t *m, const char *name, int ndim, const int64_t *shape);

/*  Seeds a fresh generator for one forward pass's dropout masks. */
void nn_model_dropout_rng(nn_model_t *m, nn_rng_t *out);

#endif
