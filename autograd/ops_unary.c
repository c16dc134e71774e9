/* SPDX-License-Identifier: MIT */
/*  ops_unary.c: element-wise tanh, sigmoid, exp and log with gradients. */
#include <math.h>
#include <stdlib.h>

#include <zdist/autograd.h>
#include <zdist/error.h>

typedef enum { U_TANH, U_SIGMOID, U_EXP, U_LOG } unary_t;

static const char *const unary_names[] = {"tanh", "sigmoid", "exp", "log"};

/*  tanh, sigmoid and exp keep their output (their derivatives are
    functions of it: 1 - y^2, y (1 - y), y); log keeps its input (1/x). */
static int unary_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const unary_t op = (unary_t)(intptr_t)zd_autograd_node_ctx(n);
    zd_tensor_t *s = zd_autograd_node_saved(n, 0);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(s), zd_tensor_ndim(s))))
        return -1;
    const float *v = zd_tensor_data(s), *g = zd_tensor_data(gout[0]);
    float *d = zd_tensor_data(gin[0]);
    const int64_t numel = zd_tensor_numel(s);
    switch (op) {
    case U_TANH:
        for (int64_t i = 0; i < numel; i++)
            d[i] = g[i] * (1.0f - v[i] * v[i]);
        break;
    case U_SIGMOID:
        for (int64_t i = 0; i < numel; i++)
            d[i] = g[i] * v[i] * (1.0f - v[i]);
        break;
    case U_EXP:
        for (int64_t i = 0; i < numel; i++)
            d[i] = g[i] * v[i];
        break;
    case U_LOG:
        for (int64_t i = 0; i < numel; i++)
            d[i] = g[i] / v[i];
        break;
    }
    return 0;
}

/*  The op's code travels in the ctx pointer itself: nothing to free. */
static const zd_autograd_node_ops_t unary_ops[] = {
    ZD_AUTOGRAD_NODE_OPS("TanhBackward", unary_backward, NULL),
    ZD_AUTOGRAD_NODE_OPS("SigmoidBackward", unary_backward, NULL),
    ZD_AUTOGRAD_NODE_OPS("ExpBackward", unary_backward, NULL),
    ZD_AUTOGRAD_NODE_OPS("LogBackward", unary_backward, NULL),
};

static int unary(unary_t op, zd_tensor_t *x, zd_tensor_t **out)
{
    *out = NULL;
    if (!x)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL tensor", unary_names[op]);
    if (zd_tensor_dtype(x) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: expected float32, got %s", unary_names[op],
                                 zd_tensor_dtype_name(zd_tensor_dtype(x)));
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x));
    if (!y)
        return -1;
    const float *a = zd_tensor_data(x);
    float *b = zd_tensor_data(y);
    const int64_t numel = zd_tensor_numel(x);
    switch (op) {
    case U_TANH:
        for (int64_t i = 0; i < numel; i++)
            b[i] = tanhf(a[i]);
        break;
    case U_SIGMOID: /* exp(-x) overflows to inf for x < -88: 1/inf is the right 0 */
        for (int64_t i = 0; i < numel; i++)
            b[i] = 1.0f / (1.0f + expf(-a[i]));
        break;
    case U_EXP:
        for (int64_t i = 0; i < numel; i++)
            b[i] = expf(a[i]);
        break;
    case U_LOG: /* log(0) = -inf, log(<0) = NaN, as in PyTorch */
        for (int64_t i = 0; i < numel; i++)
            b[i] = logf(a[i]);
        break;
    }
    zd_tensor_t *saved = op == U_LOG ? x : y;
    zd_autograd_node_t *n;
    if (zd_autograd_node_new(&unary_ops[op], &x, 1, 1, &n) < 0) {
        zd_tensor_unref(y);
        return -1;
    }
    if (n) {
        zd_autograd_node_set_ctx(n, (void *)(intptr_t)op);
        zd_autograd_node_set_output(n, y);
        zd_autograd_node_save(n, 0, saved);
        zd_autograd_node_unref(n);
    }
    *out = y;
    return 0;
}

int zd_tensor_tanh(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_tanh: NULL out");
    return unary(U_TANH, x, out);
}
int zd_tensor_sigmoid(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_sigmoid: NULL out");
    return unary(U_SIGMOID, x, out);
}
int zd_tensor_exp(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_exp: NULL out");
    return unary(U_EXP, x, out);
}
int zd_tensor_log(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_tensor_log: NULL out");
    return unary(U_LOG, x, out);
}
