/* SPDX-License-Identifier: MIT */
/*  model_private.h: the model structure, shared by model*.c only. */
#ifndef ZDIST_NN_MODEL_PRIVATE_H
#define ZDIST_NN_MODEL_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>

#include <zdist/model.h>
#include <zdist/rng.h>

#define NN_MODEL_MAX_PARAMS 16

typedef int (nn_forward_fn)(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **out);

struct zd_nn_model {
    const char *name;
    nn_forward_fn *forward;
    int n_params;
    zd_tensor_t *params[NN_MODEL_MAX_PARAMS];
    atomic_bool training;
    pthread_mutex_t rng_lock;     /* guards rng */
    zd_nn_rng_t rng;                 /* seeds of per-forward dropout streams */
};

/*  A model with no parameters yet; the seed goes to the dropout stream. */
zd_nn_model_t *zd__nn_model_alloc(const char *name, nn_forward_fn *forward, uint64_t seed);

/*  Adds a zero-filled parameter of the given shape, named, requiring grad.
    Returns it (borrowed), or NULL. */
zd_tensor_t *zd__nn_model_add_param(zd_nn_model_t *m, const char *name, int ndim, const int64_t *shape);

/*  Seeds a fresh generator for one forward pass's dropout masks. */
void zd__nn_model_dropout_rng(zd_nn_model_t *m, zd_nn_rng_t *out);

#endif
