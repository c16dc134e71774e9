/* SPDX-License-Identifier: MIT */
/*  module_flat.c: a module's parameters, or their gradients, as one flat
    vector and back (PyTorch's parameters_to_vector and
    vector_to_parameters), in the order of zd_nn_module_param. Built on the
    public module and tensor functions only. */
#include <string.h>

#include <zdist/error.h>
#include <zdist/module.h>

/*  A new vector of every parameter (or gradient, zeros where a parameter
    has none) one after the other. */
static int module_to_vector(const zd_nn_module_t *m, bool grads, zd_tensor_t **out)
{
    const char *api = grads ? "zd_nn_module_grads_to_vector" : "zd_nn_module_params_to_vector";
    if (out)
        *out = NULL;
    if (!m || !out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL %s", api, m ? "out" : "module");
    int n_params = zd_nn_module_n_params(m);
    int64_t n = zd_nn_module_numel(m);
    zd_tensor_t *v = zd_tensor_empty(ZD_FLOAT32, &n, 1);
    if (!v)
        return -1;
    float *d = zd_tensor_data(v);
    for (int i = 0; i < n_params; i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i);
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

int zd_nn_module_params_to_vector(const zd_nn_module_t *m, zd_tensor_t **out)
{
    return module_to_vector(m, false, out);
}

int zd_nn_module_grads_to_vector(const zd_nn_module_t *m, zd_tensor_t **out)
{
    return module_to_vector(m, true, out);
}

int zd_nn_module_vector_to_params(zd_nn_module_t *m, const zd_tensor_t *v)
{
    if (!m || !v)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_vector_to_params: NULL %s",
                                 m ? "vector" : "module");
    int64_t numel = zd_nn_module_numel(m);
    if (zd_tensor_dtype(v) != ZD_FLOAT32 || zd_tensor_ndim(v) != 1 || zd_tensor_numel(v) != numel) {
        char shape[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "vector_to_params: the %s has %lld parameter "
                                 "values; the vector is %s %s",
                                 zd_nn_module_type(m), (long long)numel,
                                 zd_tensor_dtype_name(zd_tensor_dtype(v)),
                                 zd_tensor_shape_str(v, shape, sizeof shape));
    }
    const float *d = zd_tensor_data(v);
    int n_params = zd_nn_module_n_params(m);
    for (int i = 0; i < n_params; i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i);
        memcpy(zd_tensor_data(p), d, zd_tensor_nbytes(p));
        d += zd_tensor_numel(p);
    }
    return 0;
}
