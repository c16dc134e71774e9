/*  model_flat.c: a model's parameters, or their gradients, as one flat
    vector and back (PyTorch's parameters_to_vector and
    vector_to_parameters), in the order of nn_model_param. Built on the
    public model and tensor functions only. */
#include <string.h>

#include "autograd/error.h"
#include "nn/model.h"

/*  A new vector of every parameter (or gradient, zeros where a parameter
    has none) one after the other. */
static int model_to_vector(const nn_model_t *m, bool grads, tensor_t **out)
{
    *out = NULL;
    if (!m)
        return error_set("%s_to_vector: NULL model", grads ? "grads" : "params");
    int64_t n = nn_model_numel(m);
    tensor_t *v = tensor_empty(TENSOR_F32, 1, &n);
    if (!v)
        return -1;
    float *d = tensor_data(v);
    for (int i = 0; i < nn_model_n_params(m); i++) {
        tensor_t *p = nn_model_param(m, i);
        tensor_t *src = grads ? tensor_grad(p) : tensor_ref(p);
        if (src)
            memcpy(d, tensor_data(src), tensor_nbytes(p));
        else
            memset(d, 0, tensor_nbytes(p));
        tensor_unref(src);
        d += tensor_numel(p);
    }
    *out = v;
    return 0;
}

int nn_model_params_to_vector(const nn_model_t *m, tensor_t **out)
{
    return model_to_vector(m, false, out);
}

int nn_model_grads_to_vector(const nn_model_t *m, tensor_t **out)
{
    return model_to_vector(m, true, out);
}

int nn_model_vector_to_params(nn_model_t *m, const tensor_t *v)
{
    if (!m || !v)
        return error_set("vector_to_params: NULL %s", m ? "vector" : "model");
    if (tensor_dtype(v) != TENSOR_F32 || tensor_ndim(v) != 1 ||
        tensor_numel(v) != nn_model_numel(m)) {
        char shape[96];
        return error_set("vector_to_params: the %s has %lld parameter values; the vector is "
                         "%s %s", nn_model_name(m), (long long)nn_model_numel(m),
                         tensor_dtype_name(tensor_dtype(v)),
                         tensor_shape_str(v, shape, sizeof shape));
    }
    const float *d = tensor_data(v);
    for (int i = 0; i < nn_model_n_params(m); i++) {
        tensor_t *p = nn_model_param(m, i);
        memcpy(tensor_data(p), d, tensor_nbytes(p));
        d += tensor_numel(p);
    }
    return 0;
}
