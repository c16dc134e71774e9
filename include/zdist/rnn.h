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

#include <zdist/module.h>
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
                      int num_layers, float dropout, bool training, zd_rng_t *rng,
                      zd_tensor_t **out, zd_tensor_t **h_n, zd_tensor_t **c_n);

/*  ---- modules (<zdist/module.h>): nn.LSTM, nn.LSTMCell, nn.GRUCell, nn.RNNCell ----

    Their parameters, leaf tensors that require grad, are listed by
    zd_nn_module_param under PyTorch's names and in its order, each drawn
    uniform in +-1/sqrt(hidden_size) from `seed` in that order, as PyTorch's
    reset_parameters does; they start in training mode. */

/*  nn.LSTM with biases: type "LSTM", 4 parameters per layer,
    "weight_ih_l<k>" (4H, in), "weight_hh_l<k>" (4H, H), "bias_ih_l<k>",
    "bias_hh_l<k>" (4H), in the order zd_nn_lstm takes them. Forward
    (zd_nn_module_forward): inputs (x) or (x, h0, c0) as zd_nn_lstm takes
    them (h0, c0 may be NULL), up to 3 outputs (output, h_n, c_n). In
    training mode with dropout > 0 it draws dropout masks from a stream of
    its own seeded by `seed`; such forwards on one module run one at a
    time (the others concurrently). A new object (zd_nn_module_free), or NULL with
    zd_error_last() (ZD_ERR_ARGUMENT: bad sizes or dropout not in [0, 1]). */
ZD_API zd_nn_module_t *zd_nn_lstm_new(int64_t input_size, int64_t hidden_size, int num_layers,
                                      float dropout, uint64_t seed);

/*  Single cells with biases: types "LSTMCell", "GRUCell", "RNNCell"
    (tanh); parameters "weight_ih", "weight_hh", "bias_ih", "bias_hh".
    Forward: an LSTM cell takes (x[, h[, c]]) and gives up to 2 outputs
    (h', c'); the others take (x[, h]) and give h'. A missing or NULL state
    is zeros. A new object (zd_nn_module_free), or NULL with
    zd_error_last() (ZD_ERR_ARGUMENT: bad sizes). */
ZD_API zd_nn_module_t *zd_nn_lstm_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed);
ZD_API zd_nn_module_t *zd_nn_gru_cell_new(int64_t input_size, int64_t hidden_size, uint64_t seed);
ZD_API zd_nn_module_t *zd_nn_rnn_tanh_cell_new(int64_t input_size, int64_t hidden_size,
                                               uint64_t seed);

ZD_END_DECLS

#endif
