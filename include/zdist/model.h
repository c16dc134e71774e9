/* SPDX-License-Identifier: MIT */
/*  model.h: the two models of the tutorials, as modules (<zdist/module.h>).

    Net       the parameter-server tutorial Net:
              conv1 (1->32, 3x3) -> relu -> conv2 (32->64, 3x3) -> max_pool 2
              -> dropout2d 0.25 -> flatten -> fc1 (9216->128) -> relu
              -> dropout 0.5 -> fc2 (128->10) -> log_softmax
    ConvNet   the small ConvNet:
              conv1 (1->3, 3x3) -> max_pool 3 -> relu -> flatten (192)
              -> fc (192->10) -> log_softmax

    Both are zd_nn_module_t: zd_nn_module_forward(m, &x, 1, &logprobs, 1)
    takes x (N,1,28,28) float32 and gives log-probabilities (N,10); the
    parameters, the mode, state_dict, the flat vector and the checkpoint and
    safetensors functions are the module's. The submodules (Conv2d conv1,
    Linear fc1, ...) give the parameters PyTorch's named_parameters() names
    and order ("conv1.weight", "conv1.bias", ...), initialised like
    PyTorch's defaults from the constructor's seed.

    A model starts in training mode (dropout active), like PyTorch.
    Forward passes may run concurrently on one model from several threads
    (each draws its own dropout masks); switching mode or freeing must not
    race with them. */
#ifndef ZDIST_NN_MODEL_H
#define ZDIST_NN_MODEL_H

#include <stdint.h>

#include <zdist/module.h>
#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  A new Net or ConvNet (type "Net", "ConvNet"): a new object
    (zd_nn_module_free), or NULL (zd_error_last()) when out of memory. The
    seed fixes the initial parameters and the stream of dropout masks. */
ZD_API zd_nn_module_t *zd_nn_net_new(uint64_t seed);
ZD_API zd_nn_module_t *zd_nn_convnet_new(uint64_t seed);

/*  A model by name ("net" or "convnet", or the type names): a new object
    (zd_nn_module_free), or NULL with ZD_ERR_ARGUMENT naming the known
    models. */
ZD_API zd_nn_module_t *zd_nn_tutorial_model_new(const char *name, uint64_t seed);

/*  Re-seeds the dropout masks of a Net or ConvNet made above
    (reproducible training runs). 0, or -1 (ZD_ERR_ARGUMENT) for any other
    module. */
ZD_API int zd_nn_net_seed_dropout(zd_nn_module_t *m, uint64_t seed);

/*  The Net in two stages, so that it can be split between processes:
    forward_conv is conv1 .. flatten, x (N,1,28,28) -> flat (N,9216);
    forward_fc is fc1 .. log_softmax, flat (N,9216) -> (N,10). The Net's
    forward is exactly their composition. Each gives 0 and a new
    reference, or -1; both fail with ZD_ERR_ARGUMENT on a module that is
    not a Net made by zd_nn_net_new. */
ZD_API int zd_nn_net_forward_conv(zd_nn_module_t *m, zd_tensor_t *x, zd_tensor_t **flat);
ZD_API int zd_nn_net_forward_fc(zd_nn_module_t *m, zd_tensor_t *flat, zd_tensor_t **logprobs);

ZD_END_DECLS

#endif
