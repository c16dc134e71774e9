/* SPDX-License-Identifier: MIT */
/*  model_net.c: the parameter-server tutorial Net and the small ConvNet. */
#include "nn/model_private.h"

#include <string.h>

#include <zdist/error.h>
#include <zdist/nn.h>

/*  Runs one layer: `call` reads h and writes next; h is then replaced. */
#define STEP(call)                     \
    do {                               \
        zd_tensor_t *next = NULL;         \
        int rc_ = (call);              \
        zd_tensor_unref(h);               \
        h = next;                      \
        if (rc_ < 0)                   \
            return -1;                 \
    } while (0)

static int check_images(const char *model, zd_tensor_t *x)
{
    char s[96];
    if (!x)
        return zd_error_set("%s: input is NULL", model);
    if (zd_tensor_dtype(x) != ZD_FLOAT32 || zd_tensor_ndim(x) != 4 || zd_tensor_size(x, 1) != 1 ||
        zd_tensor_size(x, 2) != 28 || zd_tensor_size(x, 3) != 28)
        return zd_error_set("%s: input must be float32 (N, 1, 28, 28), got %s %s", model,
                         zd_tensor_dtype_name(zd_tensor_dtype(x)), zd_tensor_shape_str(x, s, sizeof s));
    return 0;
}

static int check_net(const zd_nn_model_t *m)
{
    if (!m || strcmp(m->name, "net") != 0)
        return zd_error_set("model %s is not a net", m ? m->name : "(null)");
    return 0;
}

/* ---- net ---- */

enum { CONV1_W, CONV1_B, CONV2_W, CONV2_B, FC1_W, FC1_B, FC2_W, FC2_B };

int zd_nn_net_forward_conv(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **flat)
{
    *flat = NULL;
    if (check_net(m) < 0 || check_images("net", x) < 0)
        return -1;
    const bool training = zd_nn_model_is_training(m);
    zd_nn_rng_t rng;
    if (training)
        zd__nn_model_dropout_rng(m, &rng);
    zd_tensor_t **p = m->params;
    zd_tensor_t *h = zd_tensor_ref(x);
    /* conv1 -> relu and conv2 -> max_pool 2, each as one fused op */
    STEP(zd_nn_conv2d_relu(h, p[CONV1_W], p[CONV1_B], 1, 0, &next));
    STEP(zd_nn_conv2d_max_pool2d(h, p[CONV2_W], p[CONV2_B], 1, 0, 2, 2, &next));
    STEP(zd_nn_dropout2d(h, 0.25f, training, &rng, &next));
    STEP(zd_nn_flatten(h, &next));
    *flat = h;
    return 0;
}

int zd_nn_net_forward_fc(zd_nn_model_t *m, zd_tensor_t *flat, zd_tensor_t **logprobs)
{
    *logprobs = NULL;
    if (check_net(m) < 0)
        return -1;
    if (!flat || zd_tensor_ndim(flat) != 2 || zd_tensor_size(flat, 1) != 9216) {
        char s[96];
        return zd_error_set("net fc stage: input must be (N, 9216), got %s",
                         flat ? zd_tensor_shape_str(flat, s, sizeof s) : "NULL");
    }
    const bool training = zd_nn_model_is_training(m);
    zd_nn_rng_t rng;
    if (training)
        zd__nn_model_dropout_rng(m, &rng);
    zd_tensor_t **p = m->params;
    zd_tensor_t *h = zd_tensor_ref(flat);
    STEP(zd_nn_linear(h, p[FC1_W], p[FC1_B], &next));
    STEP(zd_nn_relu(h, &next));
    STEP(zd_nn_dropout(h, 0.5f, training, &rng, &next));
    STEP(zd_nn_linear(h, p[FC2_W], p[FC2_B], &next));
    STEP(zd_nn_log_softmax(h, 1, &next));
    *logprobs = h;
    return 0;
}

static int net_forward(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **out)
{
    zd_tensor_t *h = NULL;
    STEP(zd_nn_net_forward_conv(m, x, &next));
    STEP(zd_nn_net_forward_fc(m, h, &next));
    *out = h;
    return 0;
}

/*  Initialises each (weight, bias) pair in order from one generator. */
static zd_nn_model_t *init_layers(zd_nn_model_t *m, uint64_t seed)
{
    zd_nn_rng_t rng;
    zd_nn_rng_seed(&rng, seed);
    for (int i = 0; i + 1 < m->n_params; i += 2) {
        if (zd_nn_init_default(m->params[i], m->params[i + 1], &rng) < 0) {
            zd_nn_model_free(m);
            return NULL;
        }
    }
    return m;
}

zd_nn_model_t *zd_nn_net_new(uint64_t seed)
{
    zd_nn_model_t *m = zd__nn_model_alloc("net", net_forward, seed);
    if (!m)
        return NULL;
    if (!zd__nn_model_add_param(m, "conv1.weight", 4, (int64_t[]){32, 1, 3, 3}) ||
        !zd__nn_model_add_param(m, "conv1.bias", 1, (int64_t[]){32}) ||
        !zd__nn_model_add_param(m, "conv2.weight", 4, (int64_t[]){64, 32, 3, 3}) ||
        !zd__nn_model_add_param(m, "conv2.bias", 1, (int64_t[]){64}) ||
        !zd__nn_model_add_param(m, "fc1.weight", 2, (int64_t[]){128, 9216}) ||
        !zd__nn_model_add_param(m, "fc1.bias", 1, (int64_t[]){128}) ||
        !zd__nn_model_add_param(m, "fc2.weight", 2, (int64_t[]){10, 128}) ||
        !zd__nn_model_add_param(m, "fc2.bias", 1, (int64_t[]){10})) {
        zd_nn_model_free(m);
        return NULL;
    }
    return init_layers(m, seed);
}

/* ---- convnet ---- */

static int convnet_forward(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **out)
{
    if (check_images("convnet", x) < 0)
        return -1;
    zd_tensor_t **p = m->params;
    zd_tensor_t *h = zd_tensor_ref(x);
    STEP(zd_nn_conv2d_max_pool2d(h, p[0], p[1], 1, 0, 3, 3, &next));
    STEP(zd_nn_relu(h, &next));
    STEP(zd_nn_flatten(h, &next));
    STEP(zd_nn_linear(h, p[2], p[3], &next));
    STEP(zd_nn_log_softmax(h, 1, &next));
    *out = h;
    return 0;
}

zd_nn_model_t *zd_nn_convnet_new(uint64_t seed)
{
    zd_nn_model_t *m = zd__nn_model_alloc("convnet", convnet_forward, seed);
    if (!m)
        return NULL;
    if (!zd__nn_model_add_param(m, "conv1.weight", 4, (int64_t[]){3, 1, 3, 3}) ||
        !zd__nn_model_add_param(m, "conv1.bias", 1, (int64_t[]){3}) ||
        !zd__nn_model_add_param(m, "fc.weight", 2, (int64_t[]){10, 192}) ||
        !zd__nn_model_add_param(m, "fc.bias", 1, (int64_t[]){10})) {
        zd_nn_model_free(m);
        return NULL;
    }
    return init_layers(m, seed);
}
