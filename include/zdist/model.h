/* SPDX-License-Identifier: MIT */
/*  model.h: the two models of the programs, with named parameters.

    "net"     the parameter-server tutorial Net:
              conv1 (1->32, 3x3) -> relu -> conv2 (32->64, 3x3) -> max_pool 2
              -> dropout2d 0.25 -> flatten -> fc1 (9216->128) -> relu
              -> dropout 0.5 -> fc2 (128->10) -> log_softmax
    "convnet" the small ConvNet:
              conv1 (1->3, 3x3) -> max_pool 3 -> relu -> flatten (192)
              -> fc (192->10) -> log_softmax

    Both take x (N,1,28,28) float32 and give log-probabilities (N,10).
    Parameters are leaf tensors that require grad, named and ordered as
    PyTorch's named_parameters() ("conv1.weight", "conv1.bias", ...), and
    initialised like PyTorch's defaults from the constructor's seed.

    A model starts in training mode (dropout active), like PyTorch.
    Forward passes may run concurrently on one model from several threads
    (each draws its own dropout masks); switching mode or freeing must not
    race with them. */
#ifndef ZDIST_NN_MODEL_H
#define ZDIST_NN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_nn_model zd_nn_model_t;

/*  New models, each a new object (zd_nn_model_free); NULL (zd_error_last())
    when out of memory. The seed fixes the initial parameters and the
    stream of dropout masks. */
ZD_API zd_nn_model_t *zd_nn_net_new(uint64_t seed);
ZD_API zd_nn_model_t *zd_nn_convnet_new(uint64_t seed);

/*  A model by name ("net" or "convnet"), a new object (zd_nn_model_free);
    NULL with a message naming the known models otherwise. */
ZD_API zd_nn_model_t *zd_nn_model_new(const char *name, uint64_t seed);

/*  Frees the model and drops its parameters (tensors still referenced
    elsewhere live on). NULL-safe. */
ZD_API void zd_nn_model_free(zd_nn_model_t *m);

/*  "net" or "convnet". Borrowed. */
ZD_API const char *zd_nn_model_name(const zd_nn_model_t *m);

/*  Training mode (dropout on) or evaluation mode (dropout is the
    identity); returns the previous mode. */
ZD_API bool zd_nn_model_train(zd_nn_model_t *m, bool training);
ZD_API bool zd_nn_model_is_training(const zd_nn_model_t *m);

/*  Re-seeds the dropout masks (reproducible training runs). */
ZD_API void zd_nn_model_seed_dropout(zd_nn_model_t *m, uint64_t seed);

/*  Forward pass: x (N,1,28,28) gives log-probabilities (N,10), recorded by
    autograd when grad mode is on. 0 and *logprobs (new reference), or -1. */
ZD_API int zd_nn_model_forward(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **logprobs);

/*  The Net in two stages, so that it can be split between processes:
    forward_conv is conv1 .. flatten, x (N,1,28,28) -> flat (N,9216);
    forward_fc is fc1 .. log_softmax, flat (N,9216) -> (N,10).
    zd_nn_model_forward of a "net" is exactly their composition. Each gives
    0 and a new reference, or -1; both fail on a model that is not a "net". */
ZD_API int zd_nn_net_forward_conv(zd_nn_model_t *m, zd_tensor_t *x, zd_tensor_t **flat);
ZD_API int zd_nn_net_forward_fc(zd_nn_model_t *m, zd_tensor_t *flat, zd_tensor_t **logprobs);

/*  Parameters, in PyTorch's order. zd_nn_model_param and zd_nn_model_find_param
    return borrowed tensors (valid while the model lives; take a reference
    to keep one longer); NULL with zd_error_last() for a bad index or an
    unknown name. */
ZD_API int zd_nn_model_n_params(const zd_nn_model_t *m);
ZD_API zd_tensor_t *zd_nn_model_param(const zd_nn_model_t *m, int i);
ZD_API const char *zd_nn_model_param_name(const zd_nn_model_t *m, int i);
ZD_API zd_tensor_t *zd_nn_model_find_param(const zd_nn_model_t *m, const char *name);

/*  Index of the parameter called name, or -1 (with zd_error_last()). */
ZD_API int zd_nn_model_param_index(const zd_nn_model_t *m, const char *name);

/*  Total number of parameter elements. */
ZD_API int64_t zd_nn_model_numel(const zd_nn_model_t *m);

/*  Drops every parameter's .grad (zero_grad(set_to_none=True)). */
ZD_API void zd_nn_model_zero_grad(zd_nn_model_t *m);

/*  ---- the parameters as one flat vector (nn/model_flat.c) ----
    Every parameter flattened, one after the other in the order above, as
    PyTorch's parameters_to_vector lays them out. */

/*  A new float32 vector of zd_nn_model_numel(m) values: a copy of the
    parameters, or of their gradients (zeros for a parameter without one).
    0 and *out (a new reference), or -1. */
ZD_API int zd_nn_model_params_to_vector(const zd_nn_model_t *m, zd_tensor_t **out);
ZD_API int zd_nn_model_grads_to_vector(const zd_nn_model_t *m, zd_tensor_t **out);

/*  Copies v (float32, shape (zd_nn_model_numel(m))) into the parameters, in
    place and not recorded by autograd (PyTorch's vector_to_parameters);
    must not race with forward passes. 0, or -1 naming both sizes. */
ZD_API int zd_nn_model_vector_to_params(zd_nn_model_t *m, const zd_tensor_t *v);

ZD_END_DECLS

#endif
