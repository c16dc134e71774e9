/* SPDX-License-Identifier: MIT */
/*  rnn.h: recurrent layers: LSTM, GRU and Elman (tanh) cells, and a
    multi-layer LSTM over a sequence, as PyTorch computes them.

    Each cell is one fused autograd node: the gate pre-activations come from
    two GEMMs, x w_ih^T + b_ih + h w_hh^T + b_hh, the nonlinearities run in
    one pass, and the backward pass gives every input its gradient at once.
    Weights are laid out as PyTorch's: w_ih (gates*H, I), w_hh (gates*H, H),
    biases (gates*H), the gates stacked in PyTorch's order:

        LSTM  input, forget, cell, output (4 gates)
        GRU   reset, update, new (3 gates); n = tanh(x W_in^T + b_in
              + r * (h W_hn^T + b_hn)), h' = (1 - z) * n + z * h
        tanh  one gate: h' = tanh(x w_ih^T + b_ih + h w_hh^T + b_hh)

    Conventions as in <zdist/nn.h>: float32 contiguous tensors, inputs
    borrowed, 0 and new references in the out-parameters, or -1 with the
    out-parameters NULL and zd_error_last() saying why (a shape mismatch is
    an error, never a crash). Biases may be NULL (no bias); a NULL hidden
    or cell state means zeros, as PyTorch's default. */
#ifndef ZDIST_NN_RNN_H
#define ZDIST_NN_RNN_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/rng.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  ---- cells: one time step, x (N, I), h and c (N, H) ---- */

/*  PyTorch's lstm_cell: w_ih (4H, I), w_hh (4H, H), b_ih, b_hh (4H) or NULL;
    gives h' and c' (N, H), new references. */
ZD_API int zd_nn_lstm_cell(zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *c, zd_tensor_t *w_ih,
                           zd_tensor_t *w_hh, zd_tensor_t *b_ih, zd_tensor_t *b_hh,
                           zd_tensor_t **h_out, zd_tensor_t **c_out);

/*  PyTorch's gru_cell: w_ih (3H, I), w_hh (3H, H), b_ih, b_hh (3H) or NULL;
    gives h' (N, H), a new reference. */
ZD_API int zd_nn_gru_cell(zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *w_ih, zd_tensor_t *w_hh,
                          zd_tensor_t *b_ih, zd_tensor_t *b_hh, zd_tensor_t **h_out);

/*  PyTorch's rnn_tanh_cell: w_ih (H, I), w_hh (H, H), b_ih, b_hh (H) or
    NULL; gives h' (N, H), a new reference. */
ZD_API int zd_nn_rnn_tanh_cell(zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *w_ih, zd_tensor_t *w_hh,
                               zd_tensor_t *b_ih, zd_tensor_t *b_hh, zd_tensor_t **h_out);

/*  ---- a multi-layer LSTM over a sequence (torch.nn.LSTM) ---- */

/*  x (T, N, I) sequence-first; h0, c0 (L, N, H) or NULL; params holds 4 per
    layer, in PyTorch's order: weight_ih_l<k> (4H, in), weight_hh_l<k> (4H,
    H), bias_ih_l<k>, bias_hh_l<k> (4H, or NULL), where in is I for layer 0
    and H above. When training and dropout > 0, each layer's output but the
    last goes through dropout(p = dropout) with masks from rng. Gives out
    (T, N, H) (the last layer's h at every step), and, when the pointers are
    non-NULL, h_n and c_n (L, N, H): new references. Each layer's whole
    sequence is one autograd node (backward through time runs inside it). */
ZD_API int zd_nn_lstm(zd_tensor_t *x, zd_tensor_t *h0, zd_tensor_t *c0, zd_tensor_t *const *params,
                      int num_layers, float dropout, bool training, zd_nn_rng_t *rng,
                      zd_tensor_t **out, zd_tensor_t **h_n, zd_tensor_t **c_n);

/*  ---- the LSTM as an object owning its parameters (nn.LSTM) ---- */

typedef struct zd_nn_lstm zd_nn_lstm_t;

/*  New LSTM with biases, every parameter uniform in +-1/sqrt(hidden_size)
    as PyTorch initialises it, drawn in parameter order from `seed`, which
    also seeds the dropout masks. Starts in training mode. A new object
    (zd_nn_lstm_free), or NULL with zd_error_last() on bad sizes or out of
    memory. */
ZD_API zd_nn_lstm_t *zd_nn_lstm_new(int64_t input_size, int64_t hidden_size, int num_layers,
                                    float dropout, uint64_t seed);

/*  Frees m and drops its references to its parameters. NULL-safe. */
ZD_API void zd_nn_lstm_free(zd_nn_lstm_t *m);

/*  zd_nn_lstm with m's parameters, dropout and mode. Draws dropout masks
    from m's own generator: calls that may draw (training, dropout > 0) must
    not run concurrently on one m. Outputs: new references. */
ZD_API int zd_nn_lstm_forward(zd_nn_lstm_t *m, zd_tensor_t *x, zd_tensor_t *h0, zd_tensor_t *c0,
                              zd_tensor_t **out, zd_tensor_t **h_n, zd_tensor_t **c_n);

/*  Parameters: leaf tensors that require grad, 4 per layer, named and
    ordered as PyTorch's ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
    "bias_hh_l0", "weight_ih_l1", ...). param and param_name are borrowed,
    NULL when i is out of range. */
ZD_API int zd_nn_lstm_n_params(const zd_nn_lstm_t *m);
ZD_API zd_tensor_t *zd_nn_lstm_param(const zd_nn_lstm_t *m, int i);
ZD_API const char *zd_nn_lstm_param_name(const zd_nn_lstm_t *m, int i);

/*  The n_params parameters as one array (borrowed, valid until
    zd_nn_lstm_free), in the order zd_nn_lstm takes them. */
ZD_API zd_tensor_t *const *zd_nn_lstm_params(const zd_nn_lstm_t *m);

/*  Drops every parameter's .grad. */
ZD_API void zd_nn_lstm_zero_grad(zd_nn_lstm_t *m);

/*  Training mode (dropout active) or evaluation mode; returns the previous
    mode. */
ZD_API bool zd_nn_lstm_train(zd_nn_lstm_t *m, bool training);
ZD_API bool zd_nn_lstm_is_training(const zd_nn_lstm_t *m);

/*  Sizes given at creation. */
ZD_API int64_t zd_nn_lstm_input_size(const zd_nn_lstm_t *m);
ZD_API int64_t zd_nn_lstm_hidden_size(const zd_nn_lstm_t *m);
ZD_API int zd_nn_lstm_num_layers(const zd_nn_lstm_t *m);

/*  ---- single cells as objects (nn.LSTMCell, nn.GRUCell, nn.RNNCell) ---- */

typedef struct zd_nn_rnn_cell zd_nn_rnn_cell_t;

/*  New cells with biases, parameters uniform in +-1/sqrt(hidden_size) drawn
    from `seed` in the order weight_ih, weight_hh, bias_ih, bias_hh (the
    names they get). A new object (zd_nn_rnn_cell_free), or NULL with
    zd_error_last() on bad sizes or out of memory. */
ZD_API zd_nn_rnn_cell_t *zd_nn_lstm_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed);
ZD_API zd_nn_rnn_cell_t *zd_nn_gru_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed);
ZD_API zd_nn_rnn_cell_t *zd_nn_rnn_tanh_cell_new(int64_t input_size, int64_t hidden_size,
                                                 uint64_t seed);

/*  Frees m and drops its references to its parameters. NULL-safe. */
ZD_API void zd_nn_rnn_cell_free(zd_nn_rnn_cell_t *m);

/*  One step of m's cell: h' from x and h (NULL: zeros); an LSTM cell also
    takes c and gives c' (c_out non-NULL), the others take c NULL and
    c_out NULL. Outputs: new references. */
ZD_API int zd_nn_rnn_cell_forward(zd_nn_rnn_cell_t *m, zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *c,
                                  zd_tensor_t **h_out, zd_tensor_t **c_out);

/*  The 4 parameters, as for zd_nn_lstm_t (borrowed; NULL out of range). */
ZD_API int zd_nn_rnn_cell_n_params(const zd_nn_rnn_cell_t *m);
ZD_API zd_tensor_t *zd_nn_rnn_cell_param(const zd_nn_rnn_cell_t *m, int i);
ZD_API const char *zd_nn_rnn_cell_param_name(const zd_nn_rnn_cell_t *m, int i);

ZD_END_DECLS

#endif
