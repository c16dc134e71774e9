/* SPDX-License-Identifier: MIT */
/*  golden_toolkit.c: the single-op kinds of tests/golden-toolkit
    (element-wise functions, softmax, layer_norm, mse_loss, embedding,
    permute, broadcasting add and mul). Each computes the case's one output
    y from its inputs and params, then backpropagates the case's dy, so the
    gradients are those of L = sum(y * dy). The recurrent kinds (lstm_cell,
    gru_cell, rnn_tanh_cell, lstm) are not handled here. */
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "tools/golden_check.h"

#define MAX_IN 4

/*  in[k] is the tensor the case names roles[k]:names[k], a leaf copy that
    requires grad when float (NULL when the case has no such tensor). */
typedef int(fwd_fn)(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y);

static int run(golden_case_t *c, results_t *r, fwd_fn *fwd, int n, const char *const *roles,
               const char *const *names)
{
    zd_tensor_t *in[MAX_IN] = {NULL}, *y = NULL;
    zd_tensor_t *dy = golden_tensor(c, "input", "dy");
    int rc = -1;
    for (int k = 0; k < n; k++)
        if (golden_tensor(c, roles[k], names[k]) && !(in[k] = golden_leaf(c, roles[k], names[k])))
            goto out;
    if (!dy) {
        zd_error_set("golden: the case has no input \"dy\"");
        goto out;
    }
    if (fwd(c, in, &y) < 0)
        goto out;
    results_put(r, "output", "y", y);
    if (zd_autograd_backward(y, dy, false) < 0)
        goto out;
    results_put_grads(r, n, in, names);
    rc = 0;
out:
    zd_tensor_unref(y);
    for (int k = 0; k < n; k++)
        zd_tensor_unref(in[k]);
    return rc;
}

/*  The raw text of attribute key, or NULL. */
static const char *attr_str(const golden_case_t *c, const char *key)
{
    for (int i = 0; i < c->n_attrs; i++)
        if (!strcmp(c->attr_key[i], key))
            return c->attr_val[i];
    return NULL;
}

static int need(zd_tensor_t *t, const char *name)
{
    return t ? 0 : zd_error_set("golden: the case has no input \"%s\"", name);
}

static const char *const X_ROLES[] = {"input"}, *const X_NAMES[] = {"x"};

static int fwd_tanh(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    (void)c;
    return need(in[0], "x") < 0 ? -1 : zd_tensor_tanh(in[0], y);
}

static int fwd_sigmoid(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    (void)c;
    return need(in[0], "x") < 0 ? -1 : zd_tensor_sigmoid(in[0], y);
}

static int fwd_exp(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    (void)c;
    return need(in[0], "x") < 0 ? -1 : zd_tensor_exp(in[0], y);
}

static int fwd_log(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    (void)c;
    return need(in[0], "x") < 0 ? -1 : zd_tensor_log(in[0], y);
}

static int fwd_gelu(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    const char *approx = attr_str(c, "approximate");
    if (approx && strcmp(approx, "none"))
        return zd_error_set("gelu: only approximate=none is supported, not %s", approx);
    return need(in[0], "x") < 0 ? -1 : zd_nn_gelu(in[0], y);
}

static int fwd_softmax(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    return need(in[0], "x") < 0 ? -1 : zd_nn_softmax(in[0], (int)golden_attr(c, "dim", -1), y);
}

static int fwd_permute(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    const char *spec = attr_str(c, "dims");
    if (!spec)
        return zd_error_set("permute: the case has no attribute dims");
    int dims[ZD_TENSOR_MAX_DIMS], n = 0;
    for (const char *p = spec; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || n == ZD_TENSOR_MAX_DIMS || (*end && *end != ','))
            return zd_error_set("permute: bad dims \"%s\"", spec);
        dims[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return need(in[0], "x") < 0 ? -1 : zd_tensor_permute(in[0], dims, n, y);
}

static int fwd_layer_norm(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    if (need(in[0], "x") < 0)
        return -1;
    /* the normalised dimensions are weight's; without weight, the last one */
    int norm_ndim = in[1] ? zd_tensor_ndim(in[1]) : (int)golden_attr(c, "normalized_ndim", 1);
    return zd_nn_layer_norm(in[0], norm_ndim, in[1], in[2], (float)golden_attr(c, "eps", 1e-5), y);
}

static int fwd_mse(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    const char *reduction = attr_str(c, "reduction");
    if (reduction && strcmp(reduction, "mean"))
        return zd_error_set("mse_loss: only reduction=mean is supported, not %s", reduction);
    if (need(in[0], "x") < 0 || need(in[1], "target") < 0)
        return -1;
    return zd_nn_mse_loss(in[0], in[1], y);
}

static int fwd_embedding(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    if (need(in[0], "idx") < 0)
        return -1;
    if (!in[1])
        return zd_error_set("golden: the case has no param \"weight\"");
    const char *pad = attr_str(c, "padding_idx");
    int64_t padding = pad && strcmp(pad, "None") ? strtoll(pad, NULL, 10) : ZD_NN_NO_PADDING;
    return zd_nn_embedding(in[0], in[1], padding, y);
}

static int fwd_add(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    (void)c;
    if (need(in[0], "x") < 0 || need(in[1], "y") < 0)
        return -1;
    return zd_tensor_add(in[0], in[1], y);
}

static int fwd_mul(golden_case_t *c, zd_tensor_t *const *in, zd_tensor_t **y)
{
    (void)c;
    if (need(in[0], "x") < 0 || need(in[1], "y") < 0)
        return -1;
    return zd_tensor_mul(in[0], in[1], y);
}

static const char *const XY_ROLES[] = {"input", "input"}, *const XY_NAMES[] = {"x", "y"};
static const char *const MSE_NAMES[] = {"x", "target"};
static const char *const LN_ROLES[] = {"input", "param", "param"},
                         *const LN_NAMES[] = {"x", "weight", "bias"};
static const char *const EMB_ROLES[] = {"input", "param"}, *const EMB_NAMES[] = {"idx", "weight"};

/*  golden_run_<kind>: the forward function and the tensors it takes. */
#define KIND(kind, fwd, n, roles, names)                                                           \
    int golden_run_##kind(golden_case_t *c, results_t *r)                                          \
    {                                                                                              \
        return run(c, r, fwd, n, roles, names);                                                    \
    }

KIND(tanh, fwd_tanh, 1, X_ROLES, X_NAMES)
KIND(sigmoid, fwd_sigmoid, 1, X_ROLES, X_NAMES)
KIND(exp, fwd_exp, 1, X_ROLES, X_NAMES)
KIND(log, fwd_log, 1, X_ROLES, X_NAMES)
KIND(gelu, fwd_gelu, 1, X_ROLES, X_NAMES)
KIND(softmax, fwd_softmax, 1, X_ROLES, X_NAMES)
KIND(permute, fwd_permute, 1, X_ROLES, X_NAMES)
KIND(layer_norm, fwd_layer_norm, 3, LN_ROLES, LN_NAMES)
KIND(mse_loss, fwd_mse, 2, XY_ROLES, MSE_NAMES)
KIND(embedding, fwd_embedding, 2, EMB_ROLES, EMB_NAMES)
KIND(add_broadcast, fwd_add, 2, XY_ROLES, XY_NAMES)
KIND(mul_broadcast, fwd_mul, 2, XY_ROLES, XY_NAMES)
