/* SPDX-License-Identifier: MIT */
/*  rnn_private.h: what the recurrent cells (rnn_lstm.c, rnn_cells.c) share. */
#ifndef ZDIST_NN_RNN_PRIVATE_H
#define ZDIST_NN_RNN_PRIVATE_H

#include <math.h>
#include <stdint.h>

#include <zdist/tensor.h>

static inline float rnn_sigmoid(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

/*  The sizes of a recurrent layer's weights, after zd__rnn_check_weights. */
typedef struct {
    int64_t N, I, H;
} rnn_dims_t;

/*  Checks w_ih (gates*H, I), w_hh (gates*H, H), the biases (gates*H) or
    NULL, and x (..., N, I) whose last two dimensions are the batch and
    the features (x_ndim dimensions in all), filling *d. `op` names the
    function in the message. 0, or -1 with zd_error_set. */
int zd__rnn_check_weights(const char *op, int gates, const zd_tensor_t *x, int x_ndim,
                          const zd_tensor_t *w_ih, const zd_tensor_t *w_hh,
                          const zd_tensor_t *b_ih, const zd_tensor_t *b_hh, rnn_dims_t *d);

/*  Checks that a state (h or c) is NULL or float32 of shape (lead..., N, H)
    with `ndim` dimensions, the leading ones of size 1. */
int zd__rnn_check_state(const char *what, const zd_tensor_t *s, int ndim, const rnn_dims_t *d);

/*  rows x cols matrix g: out[j] = sum_r g[r][j]. */
void zd__rnn_col_sum(const float *g, int64_t rows, int64_t cols, float *out);

/*  Adds b_ih + b_hh (either may be NULL) to every row of g (rows x cols). */
void zd__rnn_add_bias(float *g, int64_t rows, int64_t cols, const zd_tensor_t *b_ih,
                      const zd_tensor_t *b_hh);

/*  New tensor with the data of col_sum(g) for bias gradients, or NULL
    (zd_error_set). */
zd_tensor_t *zd__rnn_bias_grad(const float *g, int64_t rows, int64_t cols);

#endif
