/* SPDX-License-Identifier: MIT */
/*  update.c: the per-element update rules, following PyTorch 1.13's
    single-tensor implementations (torch/optim/{sgd,adam,adamw,adagrad,
    rmsprop}.py) operation by operation: each tensor op there is a float32
    operation here, its Python-float scalars computed in double and then
    used as float32, so results agree with PyTorch to the last bit or so. */
#include <math.h>

#include "optim/optim_private.h"

static float *slot(optim_pstate_t *st, int s)
{
    return st->slot[s] ? zd_tensor_data(st->slot[s]) : NULL;
}

static void sgd(const zd_optim_config_t *c, float *p, const float *g, int64_t n, optim_pstate_t *st)
{
    const float wd = (float)c->weight_decay, mom = (float)c->momentum;
    const float one_minus_damp = (float)(1.0 - c->dampening), neg_lr = (float)-c->lr;
    const bool maximize = c->maximize, decay = c->weight_decay != 0;
    const bool momentum = c->momentum != 0, nesterov = c->nesterov, started = st->started;
    float *buf = slot(st, 0);
    if (!maximize && !decay && !momentum) {
        /* Plain SGD, the parameter server's case: a loop the compiler
           vectorises (the general one below it does not). */
        for (int64_t i = 0; i < n; i++)
            p[i] = p[i] + neg_lr * g[i];
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        float d = maximize ? -g[i] : g[i];
        if (decay)
            d = d + wd * p[i];
        if (momentum) {
            /* The buffer starts as a copy of the first gradient, not zero. */
            buf[i] = started ? buf[i] * mom + one_minus_damp * d : d;
            d = nesterov ? d + mom * buf[i] : buf[i];
        }
        p[i] = p[i] + neg_lr * d;
    }
}

static void adam(const zd_optim_config_t *c, float *p, const float *g, int64_t n,
                 optim_pstate_t *st)
{
    const bool decoupled = c->kind == ZD_OPTIM_ADAMW;
    const double step = (double)st->step;
    const double bc1 = 1.0 - pow(c->beta1, step), bc2 = 1.0 - pow(c->beta2, step);
    const float b1 = (float)c->beta1, b2 = (float)c->beta2;
    const float one_minus_b1 = (float)(1.0 - c->beta1), one_minus_b2 = (float)(1.0 - c->beta2);
    const float wd = (float)c->weight_decay, decay = (float)(1.0 - c->lr * c->weight_decay);
    const float neg_step_size = (float)-(c->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    const float eps = (float)c->eps;
    const bool maximize = c->maximize, l2 = !decoupled && c->weight_decay != 0;
    const bool amsgrad = c->amsgrad;
    float *m = slot(st, 0), *v = slot(st, 1), *vmax = slot(st, 2);
    for (int64_t i = 0; i < n; i++) {
        float gi = maximize ? -g[i] : g[i];
        if (decoupled)
            p[i] = p[i] * decay;
        else if (l2)
            gi = gi + wd * p[i];
        m[i] = m[i] * b1 + one_minus_b1 * gi;
        v[i] = v[i] * b2 + one_minus_b2 * gi * gi;
        float vv = v[i];
        if (amsgrad) {
            vmax[i] = vmax[i] > v[i] ? vmax[i] : v[i];
            vv = vmax[i];
        }
        /* eps after the bias correction of sqrt(v), as PyTorch does. */
        float denom = sqrtf(vv) / bc2_sqrt + eps;
        p[i] = p[i] + neg_step_size * m[i] / denom;
    }
}

static void adagrad(const zd_optim_config_t *c, float *p, const float *g, int64_t n,
                    optim_pstate_t *st)
{
    const float wd = (float)c->weight_decay, eps = (float)c->eps;
    const float neg_clr = (float)-(c->lr / (1.0 + (double)(st->step - 1) * c->lr_decay));
    const bool maximize = c->maximize, l2 = c->weight_decay != 0;
    float *sum = slot(st, 0);
    for (int64_t i = 0; i < n; i++) {
        float gi = maximize ? -g[i] : g[i];
        if (l2)
            gi = gi + wd * p[i];
        sum[i] = sum[i] + gi * gi;
        float std = sqrtf(sum[i]) + eps;
        p[i] = p[i] + neg_clr * gi / std;
    }
}

static void rmsprop(const zd_optim_config_t *c, float *p, const float *g, int64_t n,
                    optim_pstate_t *st)
{
    const float wd = (float)c->weight_decay, eps = (float)c->eps;
    const float alpha = (float)c->alpha, one_minus_alpha = (float)(1.0 - c->alpha);
    const float mom = (float)c->momentum, neg_lr = (float)-c->lr;
    const bool maximize = c->maximize, l2 = c->weight_decay != 0;
    const bool centered = c->centered, momentum = c->momentum > 0;
    float *sq = slot(st, 0), *buf = slot(st, 1), *gavg = slot(st, 2);
    for (int64_t i = 0; i < n; i++) {
        float gi = maximize ? -g[i] : g[i];
        if (l2)
            gi = gi + wd * p[i];
        sq[i] = sq[i] * alpha + one_minus_alpha * gi * gi;
        float avg;
        if (centered) {
            gavg[i] = gavg[i] * alpha + one_minus_alpha * gi;
            avg = sqrtf(sq[i] + -1.0f * gavg[i] * gavg[i]);
        } else {
            avg = sqrtf(sq[i]);
        }
        avg = avg + eps;
        if (momentum) {
            buf[i] = buf[i] * mom + gi / avg;
            p[i] = p[i] + neg_lr * buf[i];
        } else {
            p[i] = p[i] + neg_lr * gi / avg;
        }
    }
}

void zd__optim_update(const zd_optim_config_t *cfg, float *p, const float *g, int64_t n,
                      optim_pstate_t *st)
{
    switch (cfg->kind) {
    case ZD_OPTIM_SGD:
        sgd(cfg, p, g, n, st);
        break;
    case ZD_OPTIM_ADAM:
    case ZD_OPTIM_ADAMW:
        adam(cfg, p, g, n, st);
        break;
    case ZD_OPTIM_ADAGRAD:
        adagrad(cfg, p, g, n, st);
        break;
    case ZD_OPTIM_RMSPROP:
        rmsprop(cfg, p, g, n, st);
        break;
    }
}
