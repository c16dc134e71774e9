/*  optim.c: the optimizer object: parameters, state, steps, state export. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/error.h"
#include "optim/optim_private.h"

static const char *const slot_names[][OPTIM_SLOTS] = {
    [OPTIM_SGD] = { "momentum_buffer", NULL, NULL },
    [OPTIM_ADAM] = { "exp_avg", "exp_avg_sq", "max_exp_avg_sq" },
    [OPTIM_ADAMW] = { "exp_avg", "exp_avg_sq", "max_exp_avg_sq" },
    [OPTIM_ADAGRAD] = { "sum", NULL, NULL },
    [OPTIM_RMSPROP] = { "square_avg", "momentum_buffer", "grad_avg" },
};

const char *optim_slot_name(optim_kind_t kind, int s)
{
    if (kind < OPTIM_SGD || kind > OPTIM_RMSPROP || s < 0 || s >= OPTIM_SLOTS)
        return NULL;
    return slot_names[kind][s];
}

bool optim_slot_used(const optim_config_t *c, int s)
{
    switch (c->kind) {
    case OPTIM_SGD:
        return s == 0 && c->momentum != 0;
    case OPTIM_ADAM:
    case OPTIM_ADAMW:
        return s < 2 || (s == 2 && c->amsgrad);
    case OPTIM_ADAGRAD:
        return s == 0;
    case OPTIM_RMSPROP:
        return s == 0 || (s == 1 && c->momentum > 0) || (s == 2 && c->centered);
    }
    return false;
}

bool optim_counts_steps(optim_kind_t kind)
{
    return kind != OPTIM_SGD;
}

/*  "parameter 3 ('fc1.weight')" or "parameter 3". */
static const char *param_label(const optim_t *o, int i, char *buf, size_t size)
{
    const char *name = tensor_name(o->params[i]);
    if (*name)
        snprintf(buf, size, "parameter %d ('%s')", i, name);
    else
        snprintf(buf, size, "parameter %d", i);
    return buf;
}

static void pstate_clear(optim_pstate_t *st)
{
    for (int s = 0; s < OPTIM_SLOTS; s++)
        tensor_unref_p(&st->slot[s]);
    st->started = false;
    st->step = 0;
}

optim_t *optim_new(const optim_config_t *cfg, int n, tensor_t *const *params)
{
    if (optim_config_check(cfg) < 0)
        return NULL;
    if (n <= 0) {
        error_set("%s: optimizer got an empty parameter list", optim_kind_name(cfg->kind));
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        if (!params[i]) {
            error_set("optimizer: parameter %d is NULL", i);
            return NULL;
        }
        if (tensor_dtype(params[i]) != TENSOR_F32) {
            error_set("optimizer: parameter %d is %s; only float32 tensors can be optimized",
                      i, tensor_dtype_name(tensor_dtype(params[i])));
            return NULL;
        }
        if (!tensor_is_leaf(params[i])) {
            error_set("optimizer: can't optimize a non-leaf tensor (parameter %d)", i);
            return NULL;
        }
        for (int j = 0; j < i; j++)
            if (params[j] == params[i]) {
                error_set("optimizer: parameter %d is the same tensor as parameter %d", i, j);
                return NULL;
            }
    }
    optim_t *o = calloc(1, sizeof *o);
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
        error_set("optimizer: out of memory");
        return NULL;
    }
    o->cfg = *cfg;
    o->n = n;
    for (int i = 0; i < n; i++)
        o->params[i] = tensor_ref(params[i]);
    pthread_mutex_init(&o->lock, NULL);
    return o;
}

void optim_free(optim_t *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->n; i++) {
        pstate_clear(&o->state[i]);
        tensor_unref(o->params[i]);
    }
    free(o->params);
    free(o->state);
    pthread_mutex_destroy(&o->lock);
    free(o);
}

/*  Creates the slots of a parameter's first step. */
static int pstate_init(const optim_t *o, int i)
{
    optim_pstate_t *st = &o->state[i];
    const tensor_t *p = o->params[i];
    for (int s = 0; s < OPTIM_SLOTS; s++) {
        if (!optim_slot_used(&o->cfg, s) || st->slot[s])
            continue;
        st->slot[s] = tensor_new(TENSOR_F32, tensor_ndim(p), tensor_shape(p));
        if (!st->slot[s])
            return -1;
        if (o->cfg.kind == OPTIM_ADAGRAD)
            tensor_fill_(st->slot[s], (float)o->cfg.initial_accumulator_value);
    }
    return 0;
}

static int step_locked(optim_t *o, tensor_t *const *grads)
{
    char label[160], a[96], b[96];
    /* Check everything and allocate every new state first, so that a failure
       leaves every parameter as it was. */
    for (int i = 0; i < o->n; i++) {
        const tensor_t *g = grads[i];
        if (!g)
            continue;
        if (tensor_dtype(g) != TENSOR_F32 || !tensor_same_shape(g, o->params[i]))
            return error_set("optimizer step: the gradient of %s is %s %s, the parameter "
                             "float32 %s", param_label(o, i, label, sizeof label),
                             tensor_dtype_name(tensor_dtype(g)), tensor_shape_str(g, a, sizeof a),
                             tensor_shape_str(o->params[i], b, sizeof b));
        if (!o->state[i].started && pstate_init(o, i) < 0)
            return error_wrap("optimizer step: state of %s",
                              param_label(o, i, label, sizeof label));
    }
    for (int i = 0; i < o->n; i++) {
        if (!grads[i])
            continue;
        optim_pstate_t *st = &o->state[i];
        st->step++;
        optim_update(&o->cfg, tensor_data(o->params[i]), tensor_data(grads[i]),
                     tensor_numel(o->params[i]), st);
        st->started = true;
    }
    return 0;
}

int optim_step(optim_t *o, tensor_t *const *grads)
{
    if (!grads)
        return error_set("optimizer step: no gradient array");
    pthread_mutex_lock(&o->lock);
    int rc = step_locked(o, grads);
    pthread_mutex_unlock(&o->lock);
    return rc;
}

int optim_step_grad(optim_t *o)
{
    tensor_t **grads = calloc((size_t)o->n, sizeof *grads);
    if (!grads)
        return error_set("optimizer: out of memory");
    for (int i = 0; i < o->n; i++)
        grads[i] = tensor_grad(o->params[i]);
    int rc = optim_step(o, grads);
    for (int i = 0; i < o->n; i++)
        tensor_unref(grads[i]);
    free(grads);
    return rc;
}

void optim_zero_grad(optim_t *o, bool set_to_none)
{
    pthread_mutex_lock(&o->lock);
    for (int i = 0; i < o->n; i++) {
        if (set_to_none) {
            tensor_clear_grad(o->params[i]);
            continue;
        }
        tensor_t *g = tensor_grad(o->params[i]);
        if (g)
            tensor_zero_(g);
        tensor_unref(g);
    }
    pthread_mutex_unlock(&o->lock);
}

optim_config_t optim_config(optim_t *o)
{
    pthread_mutex_lock(&o->lock);
    optim_config_t c = o->cfg;
    pthread_mutex_unlock(&o->lock);
    return c;
}

int optim_n_params(const optim_t *o) { return o->n; }
tensor_t *optim_param(const optim_t *o, int i) { return i >= 0 && i < o->n ? o->params[i] : NULL; }

int optim_set_lr(optim_t *o, double lr)
{
    if (!(lr >= 0.0))
        return error_set("optimizer: Invalid learning rate: %g", lr);
    pthread_mutex_lock(&o->lock);
    o->cfg.lr = lr;
    pthread_mutex_unlock(&o->lock);
    return 0;
}
