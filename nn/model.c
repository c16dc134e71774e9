/* SPDX-License-Identifier: MIT */
/*  model.c: what every model shares: parameters, names, modes. */
#include "nn/model_private.h"

#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

zd_nn_model_t *zd__nn_model_alloc(const char *name, nn_forward_fn *forward, uint64_t seed)
{
    zd_nn_model_t *m = calloc(1, sizeof *m);
    if (!m) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "model %s: out of memory", name);
        return NULL;
    }
    m->name = name;
    m->forward = forward;
    atomic_init(&m->training, true);
    pthread_mutex_init(&m->rng_lock, NULL);
    /* A stream distinct from the initialisation's, which uses the seed
       itself. */
    zd_nn_rng_seed(&m->rng, seed ^ 0xd1b54a32d192ed03ULL);
    return m;
}

zd_tensor_t *zd__nn_model_add_param(zd_nn_model_t *m, const char *name, int ndim, const int64_t *shape)
{
    if (m->n_params == NN_MODEL_MAX_PARAMS) {
        zd_error_set("model %s: too many parameters", m->name);
        return NULL;
    }
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, ndim);
    if (!t)
        return NULL;
    zd_tensor_set_name(t, name);
    if (zd_tensor_set_requires_grad(t, true) < 0) {
        zd_tensor_unref(t);
        return NULL;
    }
    m->params[m->n_params++] = t;
    return t;
}

void zd__nn_model_dropout_rng(zd_nn_model_t *m, zd_nn_rng_t *out)
{
    pthread_mutex_lock(&m->rng_lock);
    uint64_t seed = zd_nn_rng_u64(&m->rng);
    pthread_mutex_unlock(&m->rng_lock);
    zd_nn_rng_seed(out, seed);
}

void zd_nn_model_free(zd_nn_model_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++)
        zd_tensor_unref(m->params[i]);
    pthread_mutex_destroy(&m->rng_lock);
    free(m);
}

zd_nn_model_t *zd_nn_model_new(const char *name, uint64_t seed)
{
    if (name && strcmp(name, "net") == 0)
        return zd_nn_net_new(seed);
    if (name && strcmp(name, "convnet") == 0)
        return zd_nn_convnet_new(seed);
    zd_error_set("unknown model '%s' (known: net, convnet)", name ? name : "(null)");
    return NULL;
}

const char *zd_nn_model_name(const zd_nn_model_t *m)
{
    return m->name;
}

bool zd_nn_model_train(zd_nn_model_t *m, bool training)
{
    return atomic_exchange(&m->training, training);
}

bool zd_nn_model_is_training(const zd_nn_model_t *m)
{
    return atomic_load(&((zd_nn_model_t *)m)->training);
}

void zd_nn_model_seed_dropout(zd_nn_model_t *m, uint64_t seed)
{
    pthread_mutex_lock(&m->rng_lock);
    zd_nn_rng_seed(&m->rng, seed);
    pthread_mutex_unlock(&m->rng_lock);
}

int zd_nn_model_forward(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **logprobs)
{
    *logprobs = NULL;
    if (!m)
        return zd_error_set("model forward: model is NULL");
    if (m->forward(m, x, logprobs) < 0)
        return zd_error_wrap("%s forward", m->name);
    return 0;
}

int zd_nn_model_n_params(const zd_nn_model_t *m)
{
    return m->n_params;
}

zd_tensor_t *zd_nn_model_param(const zd_nn_model_t *m, int i)
{
    if (i < 0 || i >= m->n_params) {
        zd_error_set("model %s: parameter index %d outside [0, %d)", m->name, i, m->n_params);
        return NULL;
    }
    return m->params[i];
}

const char *zd_nn_model_param_name(const zd_nn_model_t *m, int i)
{
    zd_tensor_t *p = zd_nn_model_param(m, i);
    return p ? zd_tensor_name(p) : NULL;
}

int zd_nn_model_param_index(const zd_nn_model_t *m, const char *name)
{
    for (int i = 0; name && i < m->n_params; i++)
        if (strcmp(zd_tensor_name(m->params[i]), name) == 0)
            return i;
    return zd_error_set("model %s has no parameter '%s'", m->name, name ? name : "(null)");
}

zd_tensor_t *zd_nn_model_find_param(const zd_nn_model_t *m, const char *name)
{
    int i = zd_nn_model_param_index(m, name);
    return i < 0 ? NULL : m->params[i];
}

int64_t zd_nn_model_numel(const zd_nn_model_t *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += zd_tensor_numel(m->params[i]);
    return n;
}

void zd_nn_model_zero_grad(zd_nn_model_t *m)
{
    for (int i = 0; i < m->n_params; i++)
        zd_tensor_clear_grad(m->params[i]);
}
