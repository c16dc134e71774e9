/* SPDX-License-Identifier: MIT */
/*  rnn_module.c: zd_nn_lstm_t, nn.LSTM as an object: its parameters (an
    array of named leaf tensors, in PyTorch's order), its mode and its
    dropout generator; and the single cells as objects. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rnn.h>

struct zd_nn_lstm {
    int64_t input_size, hidden_size;
    int num_layers;
    float dropout;
    bool training;
    zd_nn_rng_t rng;          /* dropout masks */
    int n_params;
    zd_tensor_t **params;     /* 4 per layer */
    char (*names)[32];
};

zd_nn_lstm_t *zd_nn_lstm_new(int64_t input_size, int64_t hidden_size, int num_layers,
                             float dropout, uint64_t seed)
{
    if (input_size < 1 || hidden_size < 1 || num_layers < 1 || hidden_size > (INT32_MAX / 4) ||
        input_size > INT32_MAX) {
        zd_error_set("lstm_new: sizes input %lld, hidden %lld, layers %d: each must be >= 1",
                     (long long)input_size, (long long)hidden_size, num_layers);
        return NULL;
    }
    if (!(dropout >= 0.0f && dropout <= 1.0f)) {
        zd_error_set("lstm_new: dropout %g is not in [0, 1]", (double)dropout);
        return NULL;
    }
    zd_nn_lstm_t *m = calloc(1, sizeof *m);
    if (!m) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "lstm_new: out of memory");
        return NULL;
    }
    m->input_size = input_size;
    m->hidden_size = hidden_size;
    m->num_layers = num_layers;
    m->dropout = dropout;
    m->training = true;
    m->n_params = 4 * num_layers;
    m->params = calloc((size_t)m->n_params, sizeof *m->params);
    m->names = calloc((size_t)m->n_params, sizeof *m->names);
    if (!m->params || !m->names) {
        zd_nn_lstm_free(m);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "lstm_new: out of memory");
        return NULL;
    }
    zd_nn_rng_t init;
    zd_nn_rng_seed(&init, seed);
    m->rng = init;
    zd_nn_rng_jump(&m->rng);   /* a stream of its own, apart from the weights' */
    /* PyTorch's reset_parameters: every parameter uniform(-1/sqrt(H), 1/sqrt(H)) */
    const float bound = (float)(1.0 / sqrt((double)hidden_size));
    static const char *const kinds[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    const int64_t G = 4 * hidden_size;
    for (int i = 0; i < m->n_params; i++) {
        const int l = i / 4, k = i % 4;
        const int64_t in = l == 0 ? input_size : hidden_size;
        zd_tensor_t *p = k < 2 ? zd_tensor_zeros2(G, k == 0 ? in : hidden_size)
                               : zd_tensor_zeros1(G);
        m->params[i] = p;
        snprintf(m->names[i], sizeof m->names[i], "%s_l%d", kinds[k], l);
        if (!p || zd_nn_init_uniform(p, -bound, bound, &init) < 0 ||
            zd_tensor_set_requires_grad(p, true) < 0) {
            zd_nn_lstm_free(m);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "lstm_new: out of memory");
            return NULL;
        }
        zd_tensor_set_name(p, m->names[i]);
    }
    return m;
}

void zd_nn_lstm_free(zd_nn_lstm_t *m)
{
    if (!m)
        return;
    for (int i = 0; m->params && i < m->n_params; i++)
        zd_tensor_unref(m->params[i]);
    free(m->params);
    free(m->names);
    free(m);
}

int zd_nn_lstm_forward(zd_nn_lstm_t *m, zd_tensor_t *x, zd_tensor_t *h0, zd_tensor_t *c0,
                       zd_tensor_t **out, zd_tensor_t **h_n, zd_tensor_t **c_n)
{
    if (!m) {
        *out = NULL;
        if (h_n)
            *h_n = NULL;
        if (c_n)
            *c_n = NULL;
        return zd_error_set("lstm_forward: model is NULL");
    }
    return zd_nn_lstm(x, h0, c0, m->params, m->num_layers, m->dropout, m->training, &m->rng, out,
                      h_n, c_n);
}

int zd_nn_lstm_n_params(const zd_nn_lstm_t *m)
{
    return m ? m->n_params : 0;
}

zd_tensor_t *zd_nn_lstm_param(const zd_nn_lstm_t *m, int i)
{
    return m && i >= 0 && i < m->n_params ? m->params[i] : NULL;
}

const char *zd_nn_lstm_param_name(const zd_nn_lstm_t *m, int i)
{
    return m && i >= 0 && i < m->n_params ? m->names[i] : NULL;
}

zd_tensor_t *const *zd_nn_lstm_params(const zd_nn_lstm_t *m)
{
    return m ? m->params : NULL;
}

void zd_nn_lstm_zero_grad(zd_nn_lstm_t *m)
{
    for (int i = 0; m && i < m->n_params; i++)
        zd_tensor_clear_grad(m->params[i]);
}

bool zd_nn_lstm_train(zd_nn_lstm_t *m, bool training)
{
    bool prev = m->training;
    m->training = training;
    return prev;
}

bool zd_nn_lstm_is_training(const zd_nn_lstm_t *m) { return m->training; }
int64_t zd_nn_lstm_input_size(const zd_nn_lstm_t *m) { return m->input_size; }
int64_t zd_nn_lstm_hidden_size(const zd_nn_lstm_t *m) { return m->hidden_size; }
int zd_nn_lstm_num_layers(const zd_nn_lstm_t *m) { return m->num_layers; }

/* ---- single cells ---- */

typedef enum { CELL_LSTM, CELL_GRU, CELL_TANH } cell_kind_t;

struct zd_nn_rnn_cell {
    cell_kind_t kind;
    zd_tensor_t *params[4];   /* weight_ih, weight_hh, bias_ih, bias_hh */
};

static const char *const cell_names[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};

static zd_nn_rnn_cell_t *cell_new(cell_kind_t kind, int gates, int64_t input_size,
                                  int64_t hidden_size, uint64_t seed)
{
    if (input_size < 1 || hidden_size < 1 || hidden_size > INT32_MAX / 4 ||
        input_size > INT32_MAX) {
        zd_error_set("rnn_cell_new: sizes input %lld, hidden %lld: each must be >= 1",
                     (long long)input_size, (long long)hidden_size);
        return NULL;
    }
    zd_nn_rnn_cell_t *m = calloc(1, sizeof *m);
    if (!m) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "rnn_cell_new: out of memory");
        return NULL;
    }
    m->kind = kind;
    zd_nn_rng_t rng;
    zd_nn_rng_seed(&rng, seed);
    const float bound = (float)(1.0 / sqrt((double)hidden_size));
    const int64_t G = gates * hidden_size;
    for (int k = 0; k < 4; k++) {
        zd_tensor_t *p = k < 2 ? zd_tensor_zeros2(G, k == 0 ? input_size : hidden_size)
                               : zd_tensor_zeros1(G);
        m->params[k] = p;
        if (!p || zd_nn_init_uniform(p, -bound, bound, &rng) < 0 ||
            zd_tensor_set_requires_grad(p, true) < 0) {
            zd_nn_rnn_cell_free(m);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "rnn_cell_new: out of memory");
            return NULL;
        }
        zd_tensor_set_name(p, cell_names[k]);
    }
    return m;
}

zd_nn_rnn_cell_t *zd_nn_lstm_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    return cell_new(CELL_LSTM, 4, input_size, hidden_size, seed);
}

zd_nn_rnn_cell_t *zd_nn_gru_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    return cell_new(CELL_GRU, 3, input_size, hidden_size, seed);
}

zd_nn_rnn_cell_t *zd_nn_rnn_tanh_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed)
{
    return cell_new(CELL_TANH, 1, input_size, hidden_size, seed);
}

void zd_nn_rnn_cell_free(zd_nn_rnn_cell_t *m)
{
    if (!m)
        return;
    for (int k = 0; k < 4; k++)
        zd_tensor_unref(m->params[k]);
    free(m);
}

int zd_nn_rnn_cell_forward(zd_nn_rnn_cell_t *m, zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *c,
                           zd_tensor_t **h_out, zd_tensor_t **c_out)
{
    *h_out = NULL;
    if (c_out)
        *c_out = NULL;
    if (!m)
        return zd_error_set("rnn_cell_forward: cell is NULL");
    zd_tensor_t *const *p = m->params;
    if (m->kind == CELL_LSTM) {
        if (!c_out)
            return zd_error_set("rnn_cell_forward: an LSTM cell needs c_out");
        return zd_nn_lstm_cell(x, h, c, p[0], p[1], p[2], p[3], h_out, c_out);
    }
    if (c || c_out)
        return zd_error_set("rnn_cell_forward: only an LSTM cell has a cell state c");
    return m->kind == CELL_GRU ? zd_nn_gru_cell(x, h, p[0], p[1], p[2], p[3], h_out)
                               : zd_nn_rnn_tanh_cell(x, h, p[0], p[1], p[2], p[3], h_out);
}

int zd_nn_rnn_cell_n_params(const zd_nn_rnn_cell_t *m)
{
    return m ? 4 : 0;
}

zd_tensor_t *zd_nn_rnn_cell_param(const zd_nn_rnn_cell_t *m, int i)
{
    return m && i >= 0 && i < 4 ? m->params[i] : NULL;
}

const char *zd_nn_rnn_cell_param_name(const zd_nn_rnn_cell_t *m, int i)
{
    return m && i >= 0 && i < 4 ? cell_names[i] : NULL;
}
