/* SPDX-License-Identifier: MIT */
/*  golden_models.c: the "net" and "convnet" golden cases. The forward pass is
    composed here from the ops exactly as golden/README.md spells it out, so
    every intermediate activation can be compared; then the loss is
    backpropagated, and the optimizers are stepped from the stored
    parameters and gradients. */
#include <stdio.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include "tools/golden_check.h"

#define MAX_PARAMS 16

typedef struct {
    int n;
    const char *names[MAX_PARAMS];
    zd_tensor_t *p[MAX_PARAMS];
} params_t;

static int params_load(golden_case_t *c, params_t *ps, const char *const *names, int n)
{
    ps->n = 0;
    for (int i = 0; i < n; i++) {
        ps->names[i] = names[i];
        if (!(ps->p[i] = golden_leaf(c, "param", names[i])))
            return -1;
        ps->n++;
    }
    return 0;
}

static void params_free(params_t *ps)
{
    for (int i = 0; i < ps->n; i++)
        zd_tensor_unref_p(&ps->p[i]);
    ps->n = 0;
}

/*  Unref helper so a chain of ops reads top to bottom. */
#define STEP(call)                                                                                 \
    do {                                                                                           \
        if ((call) < 0)                                                                            \
            goto out;                                                                              \
    } while (0)

/*  net: conv1 -> relu -> conv2 -> max_pool 2 -> flatten -> fc1 -> relu -> fc2 ->
    log_softmax. Records act.* when r is non-NULL. */
static int net_forward(zd_tensor_t *const *p, zd_tensor_t *x, results_t *r, zd_tensor_t **logprobs)
{
    zd_tensor_t *c1 = NULL, *h1 = NULL, *h2 = NULL, *h3 = NULL, *flat = NULL, *f1 = NULL,
                *a1 = NULL, *f2 = NULL;
    int rc = -1;
    STEP(zd_nn_conv2d(x, p[0], p[1], 1, 0, &c1));
    STEP(zd_nn_relu(c1, &h1));
    STEP(zd_nn_conv2d(h1, p[2], p[3], 1, 0, &h2));
    STEP(zd_nn_max_pool2d(h2, 2, 2, &h3));
    STEP(zd_nn_flatten(h3, &flat));
    STEP(zd_nn_linear(flat, p[4], p[5], &f1));
    STEP(zd_nn_relu(f1, &a1));
    STEP(zd_nn_linear(a1, p[6], p[7], &f2));
    STEP(zd_nn_log_softmax(f2, 1, logprobs));
    if (r) {
        results_put(r, "output", "act.flatten", flat);
        results_put(r, "output", "act.fc1", f1);
        results_put(r, "output", "act.fc2", f2);
    }
    rc = 0;
out:;
    zd_tensor_t *all[] = {c1, h1, h2, h3, flat, f1, a1, f2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
    return rc;
}

/*  convnet: conv1 -> max_pool 3 -> relu -> flatten -> fc -> log_softmax. */
static int convnet_forward(zd_tensor_t *const *p, zd_tensor_t *x, results_t *r,
                           zd_tensor_t **logprobs)
{
    zd_tensor_t *c1 = NULL, *pool = NULL, *h = NULL, *flat = NULL, *fc = NULL;
    int rc = -1;
    STEP(zd_nn_conv2d(x, p[0], p[1], 1, 0, &c1));
    STEP(zd_nn_max_pool2d(c1, 3, 3, &pool));
    STEP(zd_nn_relu(pool, &h));
    STEP(zd_nn_flatten(h, &flat));
    STEP(zd_nn_linear(flat, p[2], p[3], &fc));
    STEP(zd_nn_log_softmax(fc, 1, logprobs));
    if (r) {
        results_put(r, "output", "act.conv1", c1);
        results_put(r, "output", "act.flatten", flat);
        results_put(r, "output", "act.fc", fc);
    }
    rc = 0;
out:;
    zd_tensor_t *all[] = {c1, pool, h, flat, fc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref(all[i]);
    return rc;
}

typedef int(forward_fn)(zd_tensor_t *const *p, zd_tensor_t *x, results_t *r,
                        zd_tensor_t **logprobs);

static int loss_of(forward_fn *fwd, zd_tensor_t *const *p, zd_tensor_t *x, zd_tensor_t *target,
                   results_t *r, zd_tensor_t **loss)
{
    zd_tensor_t *logprobs = NULL;
    if (fwd(p, x, r, &logprobs) < 0)
        return -1;
    if (r)
        results_put(r, "output", "logprobs", logprobs);
    int rc = zd_nn_nll_loss(logprobs, target, loss);
    zd_tensor_unref(logprobs);
    return rc;
}

/*  Steps an optimizer `steps` times from the stored parameters with the
    stored gradients (the same gradient every step, as the README says) and
    records "<prefix>.stepK.<name>". Where the stored gradient holds only
    some rows, the optimizer runs on those rows of the parameter. */
static int optimizer_outputs(golden_case_t *c, results_t *r, const params_t *ps,
                             const zd_optim_config_t *cfg, const char *prefix, int steps)
{
    zd_tensor_t *p[MAX_PARAMS] = {0}, *g[MAX_PARAMS] = {0};
    zd_optim_t *opt = NULL;
    int rc = -1;
    for (int i = 0; i < ps->n; i++) {
        golden_entry_t *ge = golden_find(c, "grad", ps->names[i]);
        zd_tensor_t *full = golden_tensor(c, "param", ps->names[i]);
        if (!ge || !full) {
            zd_error_set("golden: no stored gradient for %s", ps->names[i]);
            goto out;
        }
        g[i] = zd_tensor_ref(ge->value);
        if (!ge->n_rows) {
            p[i] = zd_tensor_detach_copy(full);
        } else {
            int64_t row = zd_tensor_numel(full) / zd_tensor_size(full, 0);
            int64_t shape[ZD_TENSOR_MAX_DIMS];
            memcpy(shape, zd_tensor_shape(full), sizeof(int64_t) * (size_t)zd_tensor_ndim(full));
            shape[0] = ge->n_rows;
            p[i] = zd_tensor_empty(ZD_FLOAT32, shape, zd_tensor_ndim(full));
            for (int k = 0; p[i] && k < ge->n_rows; k++)
                memcpy(zd_tensor_data(p[i]) + k * row, zd_tensor_data(full) + ge->rows[k] * row,
                       sizeof(float) * (size_t)row);
        }
        if (!p[i])
            goto out;
    }
    if (!(opt = zd_optim_new(cfg, p, ps->n)))
        goto out;
    for (int s = 1; s <= steps; s++) {
        if (zd_optim_step(opt, g) < 0)
            goto out;
        for (int i = 0; i < ps->n; i++) {
            char name[160];
            snprintf(name, sizeof name, "%s.step%d.%s", prefix, s, ps->names[i]);
            zd_tensor_t *snapshot = zd_tensor_detach_copy(p[i]);
            golden_entry_t *ge = golden_find(c, "grad", ps->names[i]);
            if (ge && ge->n_rows)
                results_put_subset(r, "output", name, snapshot);
            else
                results_put(r, "output", name, snapshot);
            zd_tensor_unref(snapshot);
        }
    }
    rc = 0;
out:
    zd_optim_free(opt);
    for (int i = 0; i < ps->n; i++) {
        zd_tensor_unref(p[i]);
        zd_tensor_unref(g[i]);
    }
    return rc;
}

static int run_model(golden_case_t *c, results_t *r, forward_fn *fwd, const char *const *names,
                     int n)
{
    params_t ps = {0};
    zd_tensor_t *loss = NULL, *loss2 = NULL;
    zd_tensor_t *stepped[MAX_PARAMS] = {0};
    zd_tensor_t *x = golden_tensor(c, "input", "x");
    zd_tensor_t *target = golden_tensor(c, "input", "target");
    int rc = -1;
    if (!x || !target) {
        zd_error_set("golden: the case needs inputs x and target");
        goto out;
    }
    STEP(params_load(c, &ps, names, n));
    STEP(loss_of(fwd, ps.p, x, target, r, &loss));
    results_put(r, "output", "loss", loss);
    STEP(zd_autograd_backward(loss, NULL, false));
    results_put_grads(r, ps.n, ps.p, ps.names);

    /* loss.after_sgd: one plain SGD step with this process's own gradients
       (the full fc1.weight gradient is not stored), then a new forward. */
    zd_optim_config_t sgd = zd_optim_sgd_defaults(golden_attr(c, "sgd_lr", 0.03));
    bool prev = zd_autograd_set_grad_enabled(false);
    for (int i = 0; i < ps.n; i++) {
        zd_tensor_t *g = zd_tensor_grad(ps.p[i]);
        stepped[i] = zd_tensor_detach_copy(ps.p[i]);
        if (!g || !stepped[i]) {
            zd_tensor_unref(g);
            zd_autograd_set_grad_enabled(prev);
            zd_error_set("golden: no gradient for %s", ps.names[i]);
            goto out;
        }
        float *d = zd_tensor_data(stepped[i]);
        for (int64_t k = 0; k < zd_tensor_numel(g); k++)
            d[k] -= (float)sgd.lr * zd_tensor_data(g)[k];
        zd_tensor_unref(g);
    }
    int lrc = loss_of(fwd, stepped, x, target, NULL, &loss2);
    zd_autograd_set_grad_enabled(prev);
    STEP(lrc);
    results_put(r, "output", "loss.after_sgd", loss2);

    STEP(optimizer_outputs(c, r, &ps, &sgd, "sgd", 1));
    zd_optim_config_t mom = sgd;
    mom.momentum = golden_attr(c, "momentum", 0.9);
    mom.weight_decay = golden_attr(c, "weight_decay", 1e-4);
    STEP(optimizer_outputs(c, r, &ps, &mom, "momentum", 2));
    zd_optim_config_t adam = zd_optim_adam_defaults();
    adam.lr = golden_attr(c, "adam_lr", 1e-3);
    adam.beta1 = golden_attr(c, "adam_beta1", 0.9);
    adam.beta2 = golden_attr(c, "adam_beta2", 0.999);
    adam.eps = golden_attr(c, "adam_eps", 1e-8);
    STEP(optimizer_outputs(c, r, &ps, &adam, "adam", 2));
    rc = 0;
out:
    for (int i = 0; i < MAX_PARAMS; i++)
        zd_tensor_unref(stepped[i]);
    zd_tensor_unref(loss);
    zd_tensor_unref(loss2);
    params_free(&ps);
    return rc;
}

int golden_run_net(golden_case_t *c, results_t *r)
{
    static const char *const names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                        "fc1.weight",   "fc1.bias",   "fc2.weight",   "fc2.bias"};
    return run_model(c, r, net_forward, names, 8);
}

int golden_run_convnet(golden_case_t *c, results_t *r)
{
    static const char *const names[] = {"conv1.weight", "conv1.bias", "fc.weight", "fc.bias"};
    return run_model(c, r, convnet_forward, names, 4);
}
