/* SPDX-License-Identifier: MIT */
/*  init.c: PyTorch's default initialisation of Conv2d and Linear, and normal(). */
#include <math.h>

#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

int zd_nn_init_uniform(zd_tensor_t *t, float lo, float hi, zd_rng_t *rng)
{
    if (zd__nn_check_f32("init_uniform", t) < 0)
        return -1;
    if (!rng)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "init_uniform: random generator is NULL");
    if (!(lo <= hi))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "init_uniform: empty range [%g, %g)", (double)lo,
                                 (double)hi);
    float *d = zd_tensor_data(t);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        d[i] = zd_rng_uniform_range(rng, lo, hi);
    return 0;
}

int zd_nn_init_default(zd_tensor_t *weight, zd_tensor_t *bias, zd_rng_t *rng)
{
    if (zd__nn_check_f32("init: weight", weight) < 0)
        return -1;
    if (zd_tensor_ndim(weight) < 2)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "init: weight needs at least 2 dimensions");
    int64_t fan_in =
        zd_tensor_size(weight, 0) ? zd_tensor_numel(weight) / zd_tensor_size(weight, 0) : 0;
    if (fan_in <= 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "init: weight has no inputs (fan_in 0)");
    /* kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain *
       sqrt(3 / fan_in), which is 1 / sqrt(fan_in); the bias uses that bound
       too. */
    const float bound = (float)(sqrt(2.0 / 6.0) * sqrt(3.0 / (double)fan_in));
    if (zd_nn_init_uniform(weight, -bound, bound, rng) < 0)
        return -1;
    if (bias && zd_nn_init_uniform(bias, -bound, bound, rng) < 0)
        return -1;
    return 0;
}

int zd_nn_init_normal(zd_tensor_t *t, float mean, float std, zd_rng_t *rng)
{
    if (zd__nn_check_f32("init_normal", t) < 0)
        return -1;
    if (!rng)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "init_normal: random generator is NULL");
    if (!(std >= 0.0f))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "init_normal: standard deviation %g is negative",
                                 (double)std);
    float *d = zd_tensor_data(t);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        d[i] = zd_rng_normal(rng, mean, std);
    return 0;
}
