/* SPDX-License-Identifier: MIT */
/*  golden_ops.c: single-op golden cases. Each computes y from x (and weight
    and bias), then backpropagates the case's upstream gradient dy, so the
    gradients are those of L = sum(y * dy). */
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "tools/golden_check.h"

typedef int(op_fn)(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                   zd_tensor_t **y);

static int run_op(golden_case_t *c, results_t *r, op_fn *op, bool has_params)
{
    zd_tensor_t *x = golden_leaf(c, "input", "x");
    zd_tensor_t *w = has_params ? golden_leaf(c, "param", "weight") : NULL;
    zd_tensor_t *b =
        has_params && golden_tensor(c, "param", "bias") ? golden_leaf(c, "param", "bias") : NULL;
    zd_tensor_t *dy = golden_tensor(c, "input", "dy");
    zd_tensor_t *y = NULL;
    int rc = -1;
    if (!x || !dy || (has_params && !w))
        goto out;
    if (op(c, x, w, b, &y) < 0)
        goto out;
    results_put(r, "output", "y", y);
    if (zd_autograd_backward(y, dy, false) < 0)
        goto out;
    zd_tensor_t *leaves[3] = {x, w, b};
    const char *names[3] = {"x", "weight", "bias"};
    results_put_grads(r, 3, leaves, names);
    rc = 0;
out:
    zd_tensor_unref(y);
    zd_tensor_unref(x);
    zd_tensor_unref(w);
    zd_tensor_unref(b);
    return rc;
}

static int conv2d(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b, zd_tensor_t **y)
{
    if (golden_attr(c, "dilation", 1) != 1 || golden_attr(c, "groups", 1) != 1)
        return zd_error_set("conv2d: only dilation=1 groups=1 are supported");
    return zd_nn_conv2d(x, w, b, (int)golden_attr(c, "stride", 1),
                        (int)golden_attr(c, "padding", 0), y);
}

static int max_pool2d(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                      zd_tensor_t **y)
{
    (void)w, (void)b;
    if (golden_attr(c, "padding", 0) != 0 || golden_attr(c, "ceil_mode", 0) != 0)
        return zd_error_set("max_pool2d: only padding=0 ceil_mode=0 are supported");
    int k = (int)golden_attr(c, "kernel_size", 2);
    return zd_nn_max_pool2d(x, k, (int)golden_attr(c, "stride", k), y);
}

static int linear(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b, zd_tensor_t **y)
{
    (void)c;
    return zd_nn_linear(x, w, b, y);
}

static int relu(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b, zd_tensor_t **y)
{
    (void)c, (void)w, (void)b;
    return zd_nn_relu(x, y);
}

static int log_softmax(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                       zd_tensor_t **y)
{
    (void)w, (void)b;
    return zd_nn_log_softmax(x, (int)golden_attr(c, "dim", 1), y);
}

static int nll_loss(golden_case_t *c, zd_tensor_t *x, zd_tensor_t *w, zd_tensor_t *b,
                    zd_tensor_t **y)
{
    (void)w, (void)b;
    zd_tensor_t *target = golden_tensor(c, "input", "target");
    if (!target)
        return zd_error_set("nll_loss: the case has no input \"target\"");
    const char *reduction = "mean";
    for (int i = 0; i < c->n_attrs; i++)
        if (!strcmp(c->attr_key[i], "reduction"))
            reduction = c->attr_val[i];
    if (strcmp(reduction, "mean"))
        return zd_error_set("nll_loss: only reduction=mean is supported, not %s", reduction);
    return zd_nn_nll_loss(x, target, y);
}

int golden_run_conv2d(golden_case_t *c, results_t *r)
{
    return run_op(c, r, conv2d, true);
}
int golden_run_max_pool2d(golden_case_t *c, results_t *r)
{
    return run_op(c, r, max_pool2d, false);
}
int golden_run_linear(golden_case_t *c, results_t *r)
{
    return run_op(c, r, linear, true);
}
int golden_run_relu(golden_case_t *c, results_t *r)
{
    return run_op(c, r, relu, false);
}
int golden_run_log_softmax(golden_case_t *c, results_t *r)
{
    return run_op(c, r, log_softmax, false);
}
int golden_run_nll_loss(golden_case_t *c, results_t *r)
{
    return run_op(c, r, nll_loss, false);
}
