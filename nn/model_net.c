/*  model_net.c: the parameter-server tutorial Net and the small ConvNet. */
#include "nn/model_private.h"

#include <string.h>

#include "autograd/error.h"
#include "nn/nn.h"

/*  Runs one layer: `call` reads h and writes next; h is then replaced. */
#define STEP(call)                     \
    do {                               \
        tensor_t *next = NULL;         \
        int rc_ = (call);              \
        tensor_unref(h);               \
        h = next;                      \
        if (rc_ < 0)                   \
            return -1;                 \
    } while (0)

static int check_images(const char *model, tensor_t *x)
{
    char s[96];
    if (!x)
        return error_set("%s: input is NULL", model);
    if (tensor_dtype(x) != TENSOR_F32 || tensor_ndim(x) != 4 || tensor_size(x, 1) != 1 ||
        tensor_size(x, 2) != 28 || tensor_size(x, 3) != 28)
        return error_set("%s: input must be float32 (N, 1, 28, 28), got %s %s", model,
                         tensor_dtype_name(tensor_dtype(x)), tensor_shape_str(x, s, sizeof s));
    return 0;
}

static int check_net(const nn_model_t *m)
{
    if (!m || strcmp(m->name, "net") != 0)
        return error_set("model %s is not a net", m ? m->name : "(null)");
    return 0;
}

/* ---- net ---- */

enum { CONV1_W, CONV1_B, CONV2_W, CONV2_B, FC1_W, FC1_B, FC2_W, FC2_B };

int nn_net_forward_conv(nn_model_t *m, tensor_t *x, tensor_t **flat)
{
    *flat = NULL;
    if (check_net(m) < 0 || check_images("net", x) < 0)
        return -1;
    const bool training = nn_model_is_training(m);
    nn_rng_t rng;
    if (training)
        nn_model_dropout_rng(m, &rng);
    tensor_t **p = m->params;
    tensor_t *h = tensor_ref(x);
    /* conv1 -> relu and conv2 -> max_pool 2, each as one fused op */
    STEP(nn_conv2d_relu(h, p[CONV1_W], p[CONV1_B], 1, 0, &next));
    STEP(nn_conv2d_max_pool2d(h, p[CONV2_W], p[CONV2_B], 1, 0, 2, 2, &next));
    STEP(nn_dropout2d(h, 0.25f, training, &rng, &next));
    STEP(nn_flatten(h, &next));
    *flat = h;
    return 0;
}

int nn_net_forward_fc(nn_model_t *m, tensor_t *flat, tensor_t **logprobs)
{
    *logprobs = NULL;
    if (check_net(m) < 0)
        return -1;
    if (!flat || tensor_ndim(flat) != 2 || tensor_size(flat, 1) != 9216) {
        char s[96];
        return error_set("net fc stage: input must be (N, 9216), got %s",
                         flat ? tensor_shape_str(flat, s, sizeof s) : "NULL");
    }
    const bool training = nn_model_is_training(m);
    nn_rng_t rng;
    if (training)
        nn_model_dropout_rng(m, &rng);
    tensor_t **p = m->params;
    tensor_t *h = tensor_ref(flat);
    STEP(nn_linear(h, p[FC1_W], p[FC1_B], &next));
    STEP(nn_relu(h, &next));
    STEP(nn_dropout(h, 0.5f, training, &rng, &next));
    STEP(nn_linear(h, p[FC2_W], p[FC2_B], &next));
    STEP(nn_log_softmax(h, 1, &next));
    *logprobs = h;
    return 0;
}

static int net_forward(nn_model_t *m, tensor_t *x, tensor_t **out)
{
    tensor_t *h = NULL;
    STEP(nn_net_forward_conv(m, x, &next));
    STEP(nn_net_forward_fc(m, h, &next));
    *out = h;
    return 0;
}

/*  Initialises each (weight, bias) pair in order from one generator. */
static nn_model_t *init_layers(nn_model_t *m, uint64_t seed)
{
    nn_rng_t rng;
    nn_rng_seed(&rng, seed);
    for (int i = 0; i + 1 < m->n_params; i += 2) {
        if (nn_init_default(m->params[i], m->params[i + 1], &rng) < 0) {
            nn_model_free(m);
            return NULL;
        }
    }
    return m;
}

nn_model_t *nn_net_new(uint64_t seed)
{
    nn_model_t *m = nn_model_alloc("net", net_forward, seed);
    if (!m)
        return NULL;
    if (!nn_model_add_param(m, "conv1.weight", 4, (int64_t[]){32, 1, 3, 3}) ||
        !nn_model_add_param(m, "conv1.bias", 1, (int64_t[]){32}) ||
        !nn_model_add_param(m, "conv2.weight", 4, (int64_t[]){64, 32, 3, 3}) ||
        !nn_model_add_param(m, "conv2.bias", 1, (int64_t[]){64}) ||
        !nn_model_add_param(m, "fc1.weight", 2, (int64_t[]){128, 9216}) ||
        !nn_model_add_param(m, "fc1.bias", 1, (int64_t[]){128}) ||
        !nn_model_add_param(m, "fc2.weight", 2, (int64_t[]){10, 128}) ||
        !nn_model_add_param(m, "fc2.bias", 1, (int64_t[]){10})) {
        nn_model_free(m);
        return NULL;
    }
    return init_layers(m, seed);
}

/* ---- convnet ---- */

static int convnet_forward(nn_model_t *m, tensor_t *x, tensor_t **out)
{
    if (check_images("convnet", x) < 0)
        return -1;
    tensor_t **p = m->params;
    tensor_t *h = tensor_ref(x);
    STEP(nn_conv2d_max_pool2d(h, p[0], p[1], 1, 0, 3, 3, &next));
    STEP(nn_relu(h, &next));
    STEP(nn_flatten(h, &next));
    STEP(nn_linear(h, p[2], p[3], &next));
    STEP(nn_log_softmax(h, 1, &next));
    *out = h;
    return 0;
}

nn_model_t *nn_convnet_new(uint64_t seed)
{
    nn_model_t *m = nn_model_alloc("convnet", convnet_forward, seed);
    if (!m)
        return NULL;
    if (!nn_model_add_param(m, "conv1.weight", 4, (int64_t[]){3, 1, 3, 3}) ||
        !nn_model_add_param(m, "conv1.bias", 1, (int64_t[]){3}) ||
        !nn_model_add_param(m, "fc.weight", 2, (int64_t[]){10, 192}) ||
        !nn_model_add_param(m, "fc.bias", 1, (int64_t[]){10})) {
        nn_model_free(m);
        return NULL;
    }
    return init_layers(m, seed);
}
