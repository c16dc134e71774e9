/* SPDX-License-Identifier: MIT */
/*  rnn_module.c: nn.LSTM, nn.LSTMCell, nn.GRUCell and nn.RNNCell as
    modules: parameters registered under PyTorch's names, in its order, and
    a forward that passes the state's array of them (borrowed from the
    module) to the functional form, with no lookup per call. */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include <zdist/rnn.h>

/*  Registers 4 parameters per layer (names[k] with suffix) uniform in
    +-1/sqrt(H), PyTorch's reset_parameters, drawn in order from init. */
static int add_rnn_params(zd_nn_module_t *m, zd_tensor_t **params, int n_layers, int64_t gates,
                          int64_t input_size, int64_t hidden_size, bool suffix, zd_rng_t *init)
{
    static const char *const kinds[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    const float bound = (float)(1.0 / sqrt((double)hidden_size));
    const int64_t G = gates * hidden_size;
    for (int i = 0; i < 4 * n_layers; i++) {
        const int l = i / 4, k = i % 4;
        const int64_t in = l == 0 ? input_size : hidden_size;
        int64_t shape[2] = {G, k == 0 ? in : hidden_size};
        char name[32];
        if (suffix)
            snprintf(name, sizeof name, "%s_l%d", kinds[k], l);
        else
            snprintf(name, sizeof name, "%s", kinds[k]);
        params[i] = zd_nn_module_add_parameter(m, name, shape, k < 2 ? 2 : 1);
        if (!params[i] || zd_nn_init_uniform(params[i], -bound, bound, init) < 0)
            return -1;
    }
    return 0;
}

static int check_sizes(const char *type, int64_t input_size, int64_t hidden_size, int num_layers)
{
    if (input_size < 1 || hidden_size < 1 || num_layers < 1 || hidden_size > INT32_MAX / 4 ||
        input_size > INT32_MAX)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: sizes input %lld, hidden %lld, layers %d: "
                                 "each must be >= 1",
                                 type, (long long)input_size, (long long)hidden_size, num_layers);
    return 0;
}

/*  ---- nn.LSTM ---- */

typedef struct {
    int num_layers;
    float dropout;
    pthread_mutex_t rng_lock; /* forwards that draw masks take turns */
    zd_rng_t rng;             /* dropout masks */
    zd_tensor_t *params[];    /* 4 per layer, borrowed from the module */
} lstm_state_t;

static void lstm_state_free(void *state)
{
    lstm_state_t *s = state;
    pthread_mutex_destroy(&s->rng_lock);
    free(s);
}

/*  (x[, h0, c0]) -> (output[, h_n[, c_n]]) */
static int lstm_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                        int n_out)
{
    lstm_state_t *s = zd_nn_module_state(m);
    if ((n_in != 1 && n_in != 3) || n_out > 3)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "takes (x) or (x, h0, c0) and gives up to 3 "
                                 "outputs (output, h_n, c_n), asked %d -> %d",
                                 n_in, n_out);
    /* A module may serve several callers at once (a RemoteModule's owner
       runs each call on a pool thread): forwards that draw dropout masks
       run one at a time, so that the stream stays whole and one seed still
       gives one sequence of masks; the others run side by side. */
    bool training = zd_nn_module_is_training(m), draws = training && s->dropout > 0.0f;
    if (draws)
        pthread_mutex_lock(&s->rng_lock);
    int rc = zd_nn_lstm(in[0], n_in == 3 ? in[1] : NULL, n_in == 3 ? in[2] : NULL, s->params,
                        s->num_layers, s->dropout, training, &s->rng, &out[0],
                        n_out > 1 ? &out[1] : NULL, n_out > 2 ? &out[2] : NULL);
    if (draws)
        pthread_mutex_unlock(&s->rng_lock);
    return rc;
}

zd_nn_module_t *zd_nn_lstm_new(int64_t input_size, int64_t hidden_size, int num_layers,
                               float dropout, uint64_t seed)
{
    if (check_sizes("LSTM", input_size, hidden_size, num_layers) < 0)
        return NULL;
    if (!(dropout >= 0.0f && dropout <= 1.0f)) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "LSTM: dropout %g is not in [0, 1]", (double)dropout);
        return NULL;
    }
    lstm_state_t *s = calloc(1, sizeof *s + 4 * (size_t)num_layers * sizeof s->params[0]);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "LSTM: out of memory");
        return NULL;
    }
    s->num_layers = num_layers;
    s->dropout = dropout;
    pthread_mutex_init(&s->rng_lock, NULL);
    zd_nn_module_t *m = zd_nn_module_new("LSTM", lstm_forward, s, lstm_state_free);
    if (!m)
        return NULL;
    zd_rng_t init;
    zd_rng_seed(&init, seed);
    s->rng = init;
    zd_rng_jump(&s->rng); /* a stream of its own, apart from the weights' */
    if (add_rnn_params(m, s->params, num_layers, 4, input_size, hidden_size, true, &init) < 0) {
        zd_error_wrap("LSTM");
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

/*  ---- single cells ---- */

typedef struct {
    zd_tensor_t *p[4]; /* weight_ih, weight_hh, bias_ih, bias_hh; borrowed */
} cell_state_t;

/*  (x[, h[, c]]) -> (h'[, c']) */
static int lstm_cell_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                             int n_out)
{
    cell_state_t *s = zd_nn_module_state(m);
    if (n_in < 1 || n_in > 3 || n_out > 2)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "takes (x[, h[, c]]) and gives up to 2 outputs "
                                 "(h', c'), asked %d -> %d",
                                 n_in, n_out);
    zd_tensor_t *c_out = NULL;
    int rc = zd_nn_lstm_cell(in[0], n_in > 1 ? in[1] : NULL, n_in > 2 ? in[2] : NULL, s->p[0],
                             s->p[1], s->p[2], s->p[3], &out[0], &c_out);
    if (n_out > 1)
        out[1] = c_out;
    else
        zd_tensor_unref(c_out);
    return rc;
}

/*  (x[, h]) -> h' */
static int gru_cell_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                            int n_out)
{
    cell_state_t *s = zd_nn_module_state(m);
    if (n_in < 1 || n_in > 2 || n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes (x[, h]) and gives h', asked %d -> %d",
                                 n_in, n_out);
    return zd_nn_gru_cell(in[0], n_in > 1 ? in[1] : NULL, s->p[0], s->p[1], s->p[2], s->p[3], out);
}

static int tanh_cell_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                             int n_out)
{
    cell_state_t *s = zd_nn_module_state(m);
    if (n_in < 1 || n_in > 2 || n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes (x[, h]) and gives h', asked %d -> %d",
                                 n_in, n_out);
    return zd_nn_rnn_tanh_cell(in[0], n_in > 1 ? in[1] : NULL, s->p[0], s->p[1], s->p[2], s->p[3],
                               out);
}

static zd_nn_module_t *cell_new(const char *type, zd_nn_module_forward_fn *forward, int gates,
                                int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    if (check_sizes(type, input_size, hidden_size, 1) < 0)
        return NULL;
    cell_state_t *s = calloc(1, sizeof *s);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", type);
        return NULL;
    }
    zd_nn_module_t *m = zd_nn_module_new(type, forward, s, free);
    if (!m)
        return NULL;
    zd_rng_t init;
    zd_rng_seed(&init, seed);
    if (add_rnn_params(m, s->p, 1, gates, input_size, hidden_size, false, &init) < 0) {
        zd_error_wrap("%s", type);
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

zd_nn_module_t *zd_nn_lstm_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    return cell_new("LSTMCell", lstm_cell_forward, 4, input_size, hidden_size, seed);
}

zd_nn_module_t *zd_nn_gru_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    return cell_new("GRUCell", gru_cell_forward, 3, input_size, hidden_size, seed);
}

zd_nn_module_t *zd_nn_rnn_tanh_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    return cell_new("RNNCell", tanh_cell_forward, 1, input_size, hidden_size, seed);
}
