/* SPDX-License-Identifier: MIT */
/*  optim.c: the optimizer object: parameters, state, steps, state export. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "optim/optim_private.h"

static const char *const slot_names[][OPTIM_SLOTS] = {
    [ZD_OPTIM_SGD] = {"momentum_buffer", NULL, NULL},
    [ZD_OPTIM_ADAM] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    [ZD_OPTIM_ADAMW] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
    [ZD_OPTIM_ADAGRAD] = {"sum", NULL, NULL},
    [ZD_OPTIM_RMSPROP] = {"square_avg", "momentum_buffer", "grad_avg"},
};

const char *zd__optim_slot_name(zd_optim_kind_t kind, int s)
{
    if (kind < ZD_OPTIM_SGD || kind > ZD_OPTIM_RMSPROP || s < 0 || s >= OPTIM_SLOTS)
        return NULL;
    return slot_names[kind][s];
}

bool zd__optim_slot_used(const zd_optim_config_t *c, int s)
{
    switch (c->kind) {
    case ZD_OPTIM_SGD:
        return s == 0 && c->momentum != 0;
    case ZD_OPTIM_ADAM:
    case ZD_OPTIM_ADAMW:
        return s < 2 || (s == 2 && c->amsgrad);
    case ZD_OPTIM_ADAGRAD:
        return s == 0;
    case ZD_OPTIM_RMSPROP:
        return s == 0 || (s == 1 && c->momentum > 0) || (s == 2 && c->centered);
    }
    return false;
}

bool zd__optim_counts_steps(zd_optim_kind_t kind)
{
    return kind != ZD_OPTIM_SGD;
}

/*  "parameter 3 ('fc1.weight')" or "parameter 3". */
static const char *param_label(const zd_optim_t *o, int i, char *buf, size_t size)
{
    const char *name = zd_tensor_name(o->params[i]);
    if (*name)
        snprintf(buf, size, "parameter %d ('%s')", i, name);
    else
        snprintf(buf, size, "parameter %d", i);
    return buf;
}

static void pstate_clear(optim_pstate_t *st)
{
    for (int s = 0; s < OPTIM_SLOTS; s++)
        zd_tensor_unref_p(&st->slot[s]);
    st->started = false;
    st->step = 0;
}

zd_optim_t *zd_optim_new(const zd_optim_config_t *in, zd_tensor_t *const *params, int n)
{
    if (!params && n > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_new: NULL params");
        return NULL;
    }
    zd_optim_config_t cv, *cfg = &cv;
    if (zd__optim_config_read(cfg, in) < 0 || zd_optim_config_check(cfg) < 0)
        return NULL;
    if (n <= 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "%s: optimizer got an empty parameter list",
                          zd_optim_kind_name(cfg->kind));
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!params[i]) {
            zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer: parameter %d is NULL", i);
            return NULL;
        }
        if (zd_tensor_dtype(params[i]) != ZD_FLOAT32) {
            zd_error_set_code(
                ZD_ERR_ARGUMENT,
                "optimizer: parameter %d is %s; only float32 tensors can be optimized", i,
                zd_tensor_dtype_name(zd_tensor_dtype(params[i])));
            return NULL;
        }
        if (!zd_tensor_is_leaf(params[i])) {
            zd_error_set_code(ZD_ERR_ARGUMENT,
                              "optimizer: can't optimize a non-leaf tensor (parameter %d)", i);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (params[j] == params[i]) {
                zd_error_set_code(ZD_ERR_ARGUMENT,
                                  "optimizer: parameter %d is the same tensor as parameter %d", i,
                                  j);
                return NULL;
            }
    }
    zd_optim_t *o = calloc(1, sizeof *o);
    if (o) {
        o->params = calloc((size_t)n, sizeof *o->params);
        o->state = calloc((size_t)n, sizeof *o->state);
    }
    if (!o || !o->params || !o->state) {
        if (o) {
            free(o->params);
            free(o->state);
        }
        free(o);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "optimizer: out of memory");
        return NULL;
    }
    o->cfg = *cfg;
    o->n = n;
    for (int i = 0; i < n; i++)
        o->params[i] = zd_tensor_ref(params[i]);
    pthread_mutex_init(&o->lock, NULL);
    return o;
}

void zd_optim_free(zd_optim_t *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n; i++) {
        pstate_clear(&o->state[i]);
        zd_tensor_unref(o->params[i]);
    }
    free(o->params);
    free(o->state);
    pthread_mutex_destroy(&o->lock);
    free(o);
}

/*  Creates the slots of a parameter's first step. */
static int pstate_init(const zd_optim_t *o, int i)
{
    optim_pstate_t *st = &o->state[i];
    const zd_tensor_t *p = o->params[i];
    for (int s = 0; s < OPTIM_SLOTS; s++) {
        if (!zd__optim_slot_used(&o->cfg, s) || st->slot[s])
            continue;
        st->slot[s] = zd_tensor_new(ZD_FLOAT32, zd_tensor_shape(p), zd_tensor_ndim(p));
        if (!st->slot[s])
            return -1;
        if (o->cfg.kind == ZD_OPTIM_ADAGRAD)
            zd_tensor_fill_(st->slot[s], (float)o->cfg.initial_accumulator_value);
    }
    return 0;
}

static int step_locked(zd_optim_t *o, zd_tensor_t *const *grads)
{
    char label[160], a[96], b[96];
    /* Check everything and allocate every new state first, so that a failure
       leaves every parameter as it was. */
    for (int i = 0; i < o->n; i++) {
        const zd_tensor_t *g = grads[i];
        if (!g)
            continue;
        if (zd_tensor_dtype(g) != ZD_FLOAT32 || !zd_tensor_same_shape(g, o->params[i]))
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "optimizer step: the gradient of %s is %s %s, the parameter "
                                     "float32 %s",
                                     param_label(o, i, label, sizeof label),
                                     zd_tensor_dtype_name(zd_tensor_dtype(g)),
                                     zd_tensor_shape_str(g, a, sizeof a),
                                     zd_tensor_shape_str(o->params[i], b, sizeof b));
        if (!o->state[i].started && pstate_init(o, i) < 0)
            return zd_error_wrap("optimizer step: state of %s",
                                 param_label(o, i, label, sizeof label));
    }
    for (int i = 0; i < o->n; i++) {
        if (!grads[i])
            continue;
        optim_pstate_t *st = &o->state[i];
        st->step++;
        zd__optim_update(&o->cfg, zd_tensor_data(o->params[i]), zd_tensor_data(grads[i]),
                         zd_tensor_numel(o->params[i]), st);
        st->started = true;
    }
    return 0;
}

int zd_optim_step(zd_optim_t *o, zd_tensor_t *const *grads)
{
    if (!o)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_step: NULL optimizer");
    if (!grads)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer step: no gradient array");
    pthread_mutex_lock(&o->lock);
    int rc = step_locked(o, grads);
    pthread_mutex_unlock(&o->lock);
    return rc;
}

int zd_optim_step_grad(zd_optim_t *o)
{
    if (!o)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_step_grad: NULL optimizer");
    zd_tensor_t **grads = calloc((size_t)o->n, sizeof *grads);
    if (!grads)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "optimizer: out of memory");
    for (int i = 0; i < o->n; i++)
        grads[i] = zd_tensor_grad(o->params[i]);
    int rc = zd_optim_step(o, grads);
    for (int i = 0; i < o->n; i++)
        zd_tensor_unref(grads[i]);
    free(grads);
    return rc;
}

void zd_optim_zero_grad(zd_optim_t *o, bool set_to_none)
{
    pthread_mutex_lock(&o->lock);
    for (int i = 0; i < o->n; i++) {
        if (set_to_none) {
            zd_tensor_clear_grad(o->params[i]);
            continue;
        }
        zd_tensor_t *g = zd_tensor_grad(o->params[i]);
        if (g)
            zd_tensor_zero_(g);
        zd_tensor_unref(g);
    }
    pthread_mutex_unlock(&o->lock);
}

int zd_optim_config(zd_optim_t *o, zd_optim_config_t *out, size_t size)
{
    if (!o)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_config: the optimizer is NULL");
    pthread_mutex_lock(&o->lock);
    zd_optim_config_t c = o->cfg;
    pthread_mutex_unlock(&o->lock);
    return zd__optim_config_write(out, size, &c, "zd_optim_config: zd_optim_config_t");
}

int zd_optim_n_params(const zd_optim_t *o)
{
    return o->n;
}
zd_tensor_t *zd_optim_param(const zd_optim_t *o, int i)
{
    if (o && i >= 0 && i < o->n)
        return o->params[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer: no parameter %d (it has %d)", i, o ? o->n : 0);
    return NULL;
}

int zd_optim_set_lr(zd_optim_t *o, double lr)
{
    if (!o)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_set_lr: NULL optimizer");
    if (!(lr >= 0.0))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer: Invalid learning rate: %g", lr);
    pthread_mutex_lock(&o->lock);
    o->cfg.lr = lr;
    pthread_mutex_unlock(&o->lock);
    return 0;
}
