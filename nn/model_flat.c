/* SPDX-License-Identifier: MIT */
/*  model_flat.c: a model's parameters, or their gradients, as one flat
    vector and back (PyTorch's parameters_to_vector and
    vector_to_parameters), in the order of zd_nn_model_param. Built on the
    public model and tensor functions only. */
#include <string.h>

#include <zdist/error.h>
#include <zdist/model.h>

/*  A new vector of every parameter (or gradient, zeros where a parameter
    has none) one after the other. */
static int model_to_vector(const zd_nn_model_t *m, bool grads, zd_tensor_t **out)
{
    *out = NULL;
    if (!m)
        return zd_error_set("%s_to_vector: NULL model", grads ? "grads" : "params");
    int64_t n = zd_nn_model_numel(m);
    zd_tensor_t *v = zd_tensor_empty(ZD_FLOAT32, &n, 1);
    if (!v)
        return -1;
    float *d = zd_tensor_data(v);
    for (int i = 0; i < zd_nn_model_n_params(m); i++) {
        zd_tensor_t *p = zd_nn_model_param(m, i);
        zd_tensor_t *src = grads ? zd_tensor_grad(p) : zd_tensor_ref(p);
        if (src)
            memcpy(d, zd_tensor_data(src), zd_tensor_nbytes(p));
        else
            memset(d, 0, zd_tensor_nbytes(p));
        zd_tensor_unref(src);
        d += zd_tensor_numel(p);
    }
    *out = v;
    return 0;
}

int zd_nn_model_params_to_vector(const zd_nn_model_t *m, zd_tensor_t **out)
{
    return model_to_vector(m, false, out);
}

int zd_nn_model_grads_to_vector(const zd_nn_model_t *m, zd_tensor_t **out)
{
    return model_to_vector(m, true, out);
}

int zd_nn_model_vector_to_params(zd_nn_model_t *m, const zd_tensor_t *v)
{
    if (!m || !v)
        return zd_error_set("vector_to_params: NULL %s", m ? "vector" : "model");
    if (zd_tensor_dtype(v) != ZD_FLOAT32 || zd_tensor_ndim(v) != 1 ||
        zd_tensor_numel(v) != zd_nn_model_numel(m)) {
        char shape[96];
        return zd_error_set("vector_to_params: the %s has %lld parameter values; the vector is "
                         "%s %s", zd_nn_model_name(m), (long long)zd_nn_model_numel(m),
                         zd_tensor_dtype_name(zd_tensor_dtype(v)),
                         zd_tensor_shape_str(v, shape, sizeof shape));
    }
    const float *d = zd_tensor_data(v);
    for (int i = 0; i < zd_nn_model_n_params(m); i++) {
        zd_tensor_t *p = zd_nn_model_param(m, i);
        memcpy(zd_tensor_data(p), d, zd_tensor_nbytes(p));
        d += zd_tensor_numel(p);
    }
    return 0;
}
