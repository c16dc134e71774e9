/*  model.c: what every model shares: parameters, names, modes. */
#include "nn/model_private.h"

#include <stdlib.h>
#include <string.h>

#include "autograd/error.h"

nn_model_t *nn_model_alloc(const char *name, nn_forward_fn *forward, uint64_t seed)
{
    nn_model_t *m = calloc(1, sizeof *m);
    if (!m) {
        error_set("model %s: out of memory", name);
        return NULL;
    }
    m->name = name;
    m->forward = forward;
    atomic_init(&m->training, true);
    pthread_mutex_init(&m->rng_lock, NULL);
    /* A stream distinct from the initialisation's, which uses the seed
       itself. */
    nn_rng_seed(&m->rng, seed ^ 0xd1b54a32d192ed03ULL);
    return m;
}

tensor_t *nn_model_add_param(nn_model_t *m, const char *name, int ndim, const int64_t *shape)
{
    if (m->n_params == NN_MODEL_MAX_PARAMS) {
        error_set("model %s: too many parameters", m->name);
        return NULL;
    }
    tensor_t *t = tensor_new(TENSOR_F32, ndim, shape);
    if (!t)
        return NULL;
    tensor_set_name(t, name);
    if (tensor_set_requires_grad(t, true) < 0) {
        tensor_unref(t);
        return NULL;
    }
    m->params[m->n_params++] = t;
    return t;
}

void nn_model_dropout_rng(nn_model_t *m, nn_rng_t *out)
{
    pthread_mutex_lock(&m->rng_lock);
    uint64_t seed = nn_rng_u64(&m->rng);
    pthread_mutex_unlock(&m->rng_lock);
    nn_rng_seed(out, seed);
}

void nn_model_free(nn_model_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++)
        tensor_unref(m->params[i]);
    pthread_mutex_destroy(&m->rng_lock);
    free(m);
}

nn_model_t *nn_model_new(const char *name, uint64_t seed)
{
    if (name && strcmp(name, "net") == 0)
        return nn_net_new(seed);
    if (name && strcmp(name, "convnet") == 0)
        return nn_convnet_new(seed);
    error_set("unknown model '%s' (known: net, convnet)", name ? name : "(null)");
    return NULL;
}

const char *nn_model_name(const nn_model_t *m)
{
    return m->name;
}

bool nn_model_train(nn_model_t *m, bool training)
{
    return atomic_exchange(&m->training, training);
}

bool nn_model_is_training(const nn_model_t *m)
{
    return atomic_load(&((nn_model_t *)m)->training);
}

void nn_model_seed_dropout(nn_model_t *m, uint64_t seed)
{
    pthread_mutex_lock(&m->rng_lock);
    nn_rng_seed(&m->rng, seed);
    pthread_mutex_unlock(&m->rng_lock);
}

int nn_model_forward(nn_model_t *m, tensor_t *x, tensor_t **logprobs)
{
    *logprobs = NULL;
    if (!m)
        return error_set("model forward: model is NULL");
    if (m->forward(m, x, logprobs) < 0)
        return error_wrap("%s forward", m->name);
    return 0;
}

int nn_model_n_params(const nn_model_t *m)
{
    return m->n_params;
}

tensor_t *nn_model_param(const nn_model_t *m, int i)
{
    if (i < 0 || i >= m->n_params) {
        error_set("model %s: parameter index %d outside [0, %d)", m->name, i, m->n_params);
        return NULL;
    }
    return m->params[i];
}

const char *nn_model_param_name(const nn_model_t *m, int i)
{
    tensor_t *p = nn_model_param(m, i);
    return p ? tensor_name(p) : NULL;
}

int nn_model_param_index(const nn_model_t *m, const char *name)
{
    for (int i = 0; name && i < m->n_params; i++)
        if (strcmp(tensor_name(m->params[i]), name) == 0)
            return i;
    return error_set("model %s has no parameter '%s'", m->name, name ? name : "(null)");
}

tensor_t *nn_model_find_param(const nn_model_t *m, const char *name)
{
    int i = nn_model_param_index(m, name);
    return i < 0 ? NULL : m->params[i];
}

int64_t nn_model_numel(const nn_model_t *m)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_params; i++)
        n += tensor_numel(m->params[i]);
    return n;
}

void nn_model_zero_grad(nn_model_t *m)
{
    for (int i = 0; i < m->n_params; i++)
        tensor_clear_grad(m->params[i]);
}
