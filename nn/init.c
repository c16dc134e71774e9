/*  init.c: PyTorch's default initialisation of Conv2d and Linear. */
#include <math.h>

#include "autograd/error.h"
#include "nn/nn.h"
#include "nn/nn_private.h"

int nn_init_uniform(tensor_t *t, float lo, float hi, nn_rng_t *rng)
{
    if (nn_check_f32("init_uniform", t) < 0)
        return -1;
    if (!rng)
        return error_set("init_uniform: random generator is NULL");
    if (!(lo <= hi))
        return error_set("init_uniform: empty range [%g, %g)", (double)lo, (double)hi);
    float *d = tensor_data(t);
    for (int64_t i = 0; i < tensor_numel(t); i++)
        d[i] = nn_rng_uniform_range(rng, lo, hi);
    return 0;
}

int nn_init_default(tensor_t *weight, tensor_t *bias, nn_rng_t *rng)
{
    if (nn_check_f32("init: weight", weight) < 0)
        return -1;
    if (tensor_ndim(weight) < 2)
        return error_set("init: weight needs at least 2 dimensions");
    int64_t fan_in = tensor_size(weight, 0) ? tensor_numel(weight) / tensor_size(weight, 0) : 0;
    if (fan_in <= 0)
        return error_set("init: weight has no inputs (fan_in 0)");
    /* kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain *
       sqrt(3 / fan_in), which is 1 / sqrt(fan_in); the bias uses that bound
       too. */
    const float bound = (float)(sqrt(2.0 / 6.0) * sqrt(3.0 / (double)fan_in));
    if (nn_init_uniform(weight, -bound, bound, rng) < 0)
        return -1;
    if (bias && nn_init_uniform(bias, -bound, bound, rng) < 0)
        return -1;
    return 0;
}
