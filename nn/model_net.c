/* SPDX-License-Identifier: MIT */
/*  model_net.c: the parameter-server tutorial Net and the small ConvNet,
    as modules whose submodules give PyTorch's parameter names. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

/*  Runs one layer: `call` reads h and writes next; h is then replaced. */
#define STEP(call)                                                                                 \
    do {                                                                                           \
        zd_tensor_t *next = NULL;                                                                  \
        int rc_ = (call);                                                                          \
        zd_tensor_unref(h);                                                                        \
        h = next;                                                                                  \
        if (rc_ < 0)                                                                               \
            return -1;                                                                             \
    } while (0)

enum { NET_MAX_PARAMS = 8 };

/*  A Net's or ConvNet's state: its parameters in order (borrowed from the
    submodules, so that forward passes look nothing up), and the stream of
    per-forward dropout seeds. */
typedef struct {
    zd_tensor_t *p[NET_MAX_PARAMS];
    pthread_mutex_t rng_lock; /* guards rng */
    zd_rng_t rng;
} net_state_t;

static void net_state_free(void *state)
{
    net_state_t *s = state;
    if (!s)
        return;
    pthread_mutex_destroy(&s->rng_lock);
    free(s);
}

static int net_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                       int n_out);
static int convnet_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                           int n_out);

/*  The state of a module made here, or NULL with ZD_ERR_ARGUMENT. The
    forward function tells our modules from a user's module of the same
    type name, whose state is something else. */
static net_state_t *our_state(const zd_nn_module_t *m, bool net_only, const char *api)
{
    zd_nn_module_forward_fn *f = m ? zd__nn_module_forward_of(m) : NULL;
    if (f == net_forward || (!net_only && f == convnet_forward))
        return zd_nn_module_state(m);
    zd_error_set_code(ZD_ERR_ARGUMENT, "%s: module %s is not a %s made by zdist", api,
                      m ? zd_nn_module_type(m) : "(null)", net_only ? "Net" : "Net or ConvNet");
    return NULL;
}

/*  Seeds a fresh generator for one forward pass's dropout masks. */
static void dropout_rng(net_state_t *s, zd_rng_t *out)
{
    pthread_mutex_lock(&s->rng_lock);
    uint64_t seed = zd_rng_u64(&s->rng);
    pthread_mutex_unlock(&s->rng_lock);
    zd_rng_seed(out, seed);
}

int zd_nn_net_seed_dropout(zd_nn_module_t *m, uint64_t seed)
{
    net_state_t *s = our_state(m, false, "zd_nn_net_seed_dropout");
    if (!s)
        return -1;
    pthread_mutex_lock(&s->rng_lock);
    zd_rng_seed(&s->rng, seed);
    pthread_mutex_unlock(&s->rng_lock);
    return 0;
}

static int check_images(const char *model, zd_tensor_t *x)
{
    char s[96];
    if (!x)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: input is NULL", model);
    if (zd_tensor_dtype(x) != ZD_FLOAT32 || zd_tensor_ndim(x) != 4 || zd_tensor_size(x, 1) != 1 ||
        zd_tensor_size(x, 2) != 28 || zd_tensor_size(x, 3) != 28)
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "%s: input must be float32 (N, 1, 28, 28), got %s %s", model,
            zd_tensor_dtype_name(zd_tensor_dtype(x)), zd_tensor_shape_str(x, s, sizeof s));
    return 0;
}

/*  A Conv2d submodule (stride 1, no padding), its forward for completeness:
    the Net runs its layers fused. */
static int conv2d_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                          int n_out)
{
    if (n_in != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes 1 input, got %d", n_in);
    if (n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "gives 1 output, asked for %d", n_out);
    return zd_nn_conv2d(in[0], zd_nn_module_find(m, "weight"), zd_nn_module_find(m, "bias"), 1, 0,
                        out);
}

static zd_nn_module_t *conv2d_new(int64_t in_ch, int64_t out_ch, int64_t k, zd_rng_t *rng)
{
    zd_nn_module_t *c = zd_nn_module_new("Conv2d", conv2d_forward, NULL, NULL);
    if (!c)
        return NULL;
    zd_tensor_t *w = zd_nn_module_add_parameter(c, "weight", (int64_t[]){out_ch, in_ch, k, k}, 4);
    zd_tensor_t *b = w ? zd_nn_module_add_parameter(c, "bias", &out_ch, 1) : NULL;
    if (!b || zd_nn_init_default(w, b, rng) < 0) {
        zd_nn_module_free(c);
        return NULL;
    }
    return c;
}

/*  Layer sizes: a conv layer has in, out, kernel; a linear one in, out. */
typedef struct {
    const char *name;
    bool conv;
    int64_t in, out, k;
} layer_t;

/*  A module of those layers, initialised in order from one generator
    seeded with seed (as PyTorch's defaults), its dropout stream from
    another. */
static zd_nn_module_t *build(const char *type, zd_nn_module_forward_fn *forward,
                             const layer_t *layers, int n_layers, uint64_t seed)
{
    net_state_t *s = calloc(1, sizeof *s);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", type);
        return NULL;
    }
    pthread_mutex_init(&s->rng_lock, NULL);
    /* A stream distinct from the initialisation's, which uses the seed
       itself. */
    zd_rng_seed(&s->rng, seed ^ 0xd1b54a32d192ed03ULL);
    zd_nn_module_t *m = zd_nn_module_new(type, forward, s, net_state_free);
    if (!m)
        return NULL;
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    for (int i = 0; i < n_layers; i++) {
        const layer_t *l = &layers[i];
        zd_nn_module_t *c = l->conv ? conv2d_new(l->in, l->out, l->k, &rng)
                                    : zd_nn_linear_new(l->in, l->out, true, &rng);
        if (!c || zd_nn_module_register_module(m, l->name, c) < 0) {
            zd_nn_module_free(m);
            return NULL;
        }
    }
    for (int i = 0; i < 2 * n_layers; i++)
        if (!(s->p[i] = zd_nn_module_param(m, i))) {
            zd_nn_module_free(m);
            return NULL;
        }
    return m;
}

/*  ---- Net ---- */

enum { CONV1_W, CONV1_B, CONV2_W, CONV2_B, FC1_W, FC1_B, FC2_W, FC2_B };

int zd_nn_net_forward_conv(zd_nn_module_t *m, zd_tensor_t *x, zd_tensor_t **flat)
{
    if (!flat)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_net_forward_conv: NULL flat");
    *flat = NULL;
    net_state_t *s = our_state(m, true, "zd_nn_net_forward_conv");
    if (!s || check_images("Net", x) < 0)
        return -1;
    const bool training = zd_nn_module_is_training(m);
    zd_rng_t rng;
    if (training)
        dropout_rng(s, &rng);
    zd_tensor_t **p = s->p;
    zd_tensor_t *h = zd_tensor_ref(x);
    /* conv1 -> relu and conv2 -> max_pool 2, each as one fused op */
    STEP(zd_nn_conv2d_relu(h, p[CONV1_W], p[CONV1_B], 1, 0, &next));
    STEP(zd_nn_conv2d_max_pool2d(h, p[CONV2_W], p[CONV2_B], 1, 0, 2, 2, &next));
    STEP(zd_nn_dropout2d(h, 0.25f, training, &rng, &next));
    STEP(zd_nn_flatten(h, &next));
    *flat = h;
    return 0;
}

int zd_nn_net_forward_fc(zd_nn_module_t *m, zd_tensor_t *flat, zd_tensor_t **logprobs)
{
    if (!logprobs)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_net_forward_fc: NULL logprobs");
    *logprobs = NULL;
    net_state_t *s = our_state(m, true, "zd_nn_net_forward_fc");
    if (!s)
        return -1;
    if (!flat || zd_tensor_ndim(flat) != 2 || zd_tensor_size(flat, 1) != 9216) {
        char sh[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT, "Net fc stage: input must be (N, 9216), got %s",
                                 flat ? zd_tensor_shape_str(flat, sh, sizeof sh) : "NULL");
    }
    const bool training = zd_nn_module_is_training(m);
    zd_rng_t rng;
    if (training)
        dropout_rng(s, &rng);
    zd_tensor_t **p = s->p;
    zd_tensor_t *h = zd_tensor_ref(flat);
    STEP(zd_nn_linear(h, p[FC1_W], p[FC1_B], &next));
    STEP(zd_nn_relu(h, &next));
    STEP(zd_nn_dropout(h, 0.5f, training, &rng, &next));
    STEP(zd_nn_linear(h, p[FC2_W], p[FC2_B], &next));
    STEP(zd_nn_log_softmax(h, 1, &next));
    *logprobs = h;
    return 0;
}

static int net_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                       int n_out)
{
    if (n_in != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes 1 input, got %d", n_in);
    if (n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "gives 1 output, asked for %d", n_out);
    zd_tensor_t *h = NULL;
    STEP(zd_nn_net_forward_conv(m, in[0], &next));
    STEP(zd_nn_net_forward_fc(m, h, &next));
    *out = h;
    return 0;
}

zd_nn_module_t *zd_nn_net_new(uint64_t seed)
{
    static const layer_t layers[] = {
        {"conv1", true, 1, 32, 3},
        {"conv2", true, 32, 64, 3},
        {"fc1", false, 9216, 128, 0},
        {"fc2", false, 128, 10, 0},
    };
    return build("Net", net_forward, layers, 4, seed);
}

/*  ---- ConvNet ---- */

static int convnet_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                           int n_out)
{
    if (n_in != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes 1 input, got %d", n_in);
    if (n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "gives 1 output, asked for %d", n_out);
    if (check_images("ConvNet", in[0]) < 0)
        return -1;
    net_state_t *s = zd_nn_module_state(m);
    zd_tensor_t **p = s->p;
    zd_tensor_t *h = zd_tensor_ref(in[0]);
    STEP(zd_nn_conv2d_max_pool2d(h, p[0], p[1], 1, 0, 3, 3, &next));
    STEP(zd_nn_relu(h, &next));
    STEP(zd_nn_flatten(h, &next));
    STEP(zd_nn_linear(h, p[2], p[3], &next));
    STEP(zd_nn_log_softmax(h, 1, &next));
    *out = h;
    return 0;
}

zd_nn_module_t *zd_nn_convnet_new(uint64_t seed)
{
    static const layer_t layers[] = {
        {"conv1", true, 1, 3, 3},
        {"fc", false, 192, 10, 0},
    };
    return build("ConvNet", convnet_forward, layers, 2, seed);
}

zd_nn_module_t *zd_nn_tutorial_model_new(const char *name, uint64_t seed)
{
    if (name && (strcmp(name, "net") == 0 || strcmp(name, "Net") == 0))
        return zd_nn_net_new(seed);
    if (name && (strcmp(name, "convnet") == 0 || strcmp(name, "ConvNet") == 0))
        return zd_nn_convnet_new(seed);
    zd_error_set_code(ZD_ERR_ARGUMENT, "unknown model '%s' (known: net, convnet)",
                      name ? name : "(null)");
    return NULL;
}
