/* SPDX-License-Identifier: MIT */
/*  nn.h: neural-network layers as differentiable functions, and PyTorch's
    default initialisation.

    Every op takes float32, contiguous, row-major tensors (images NCHW),
    borrows its inputs, and on success returns 0 and sets *out to a new
    reference the caller drops with zd_tensor_unref(). When autograd records
    (grad mode on and an input requires grad) the result carries a grad_fn,
    so zd_autograd_backward() reaches the inputs. On failure an op returns -1,
    sets *out to NULL and leaves the reason in zd_error_last(); it never crashes
    on a bad shape or dtype.

    Class targets are int64 (or uint8) tensors of shape (N). */
#ifndef ZDIST_NN_H
#define ZDIST_NN_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/rng.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  ---- layers ---- */

/*  2-D cross-correlation with zero padding (PyTorch's conv2d, dilation 1,
    groups 1): x (N,C,H,W), weight (O,C,kH,kW), bias (O) or NULL, gives
    (N,O,Ho,Wo) with Ho = (H + 2*padding - kH) / stride + 1 (same for W).
    stride >= 1, padding >= 0. *out: a new reference. */
ZD_API int zd_nn_conv2d(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, int stride,
                        int padding, zd_tensor_t **out);

/*  Fused forms, for less memory traffic: the same numbers as
    zd_nn_relu(zd_nn_conv2d(...)) and zd_nn_max_pool2d(zd_nn_conv2d(...), pool_kernel,
    pool_stride), without storing the convolution's own output for the
    batch. pool_stride 0 means pool_kernel. *out: a new reference; 0, or
    -1. */
ZD_API int zd_nn_conv2d_relu(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, int stride,
                             int padding, zd_tensor_t **out);
ZD_API int zd_nn_conv2d_max_pool2d(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias,
                                   int stride, int padding, int pool_kernel, int pool_stride,
                                   zd_tensor_t **out);

/*  y = x weight^T + bias: x (..., in), weight (out, in), bias (out) or NULL,
    gives (..., out). *out: a new reference. */
ZD_API int zd_nn_linear(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, zd_tensor_t **out);

/*  y = max(x, 0), any shape. *out: a new reference; 0, or -1. */
ZD_API int zd_nn_relu(zd_tensor_t *x, zd_tensor_t **out);

/*  Max pooling over kernel x kernel windows moved by stride (0 means
    stride = kernel), no padding, floor mode (windows that do not fit are
    dropped): x (N,C,H,W) gives (N,C,(H-k)/s+1,(W-k)/s+1). The gradient of a
    window goes to its maximum (the first one on ties).
    *out: a new reference; 0, or -1. */
ZD_API int zd_nn_max_pool2d(zd_tensor_t *x, int kernel, int stride, zd_tensor_t **out);

/*  Inverted dropout: when training, each element is zeroed with
    probability p and the others are scaled by 1/(1-p); the mask is drawn
    from rng (which must be non-NULL when training and 0 < p). When not
    training, returns a new reference to x itself. 0 <= p <= 1. */
ZD_API int zd_nn_dropout(zd_tensor_t *x, float p, bool training, zd_rng_t *rng, zd_tensor_t **out);

/*  Like zd_nn_dropout but zeroes whole channels: x (N,C,...) draws one mask
    value per (n, c). *out: a new reference; 0, or -1. */
ZD_API int zd_nn_dropout2d(zd_tensor_t *x, float p, bool training, zd_rng_t *rng,
                           zd_tensor_t **out);

/*  (N, ...) viewed as (N, rest): shares x's storage. *out: a new reference;
    0, or -1. */
ZD_API int zd_nn_flatten(zd_tensor_t *x, zd_tensor_t **out);

/*  softmax(x) along dim (negative counts from the end), any shape.
    *out: a new reference; 0, or -1. */
ZD_API int zd_nn_softmax(zd_tensor_t *x, int dim, zd_tensor_t **out);

/*  GELU, the exact form x/2 (1 + erf(x / sqrt 2)) (PyTorch's approximate='none'), any shape.
    *out: a new reference; 0, or -1. */
ZD_API int zd_nn_gelu(zd_tensor_t *x, zd_tensor_t **out);

/*  PyTorch's layer_norm over x's last norm_ndim dimensions; weight, bias: NULL or those sizes.
    *out: a new reference. */
ZD_API int zd_nn_layer_norm(zd_tensor_t *x, int norm_ndim, zd_tensor_t *weight, zd_tensor_t *bias,
                            float eps, zd_tensor_t **out);

/*  No padding row for zd_nn_embedding (PyTorch's padding_idx=None). */
#define ZD_NN_NO_PADDING (-1)

/*  Rows of weight (V, D) at int64/uint8 indices (S...): (S..., D); row padding_idx gets no grad.
    *out: a new reference; 0, or -1. */
ZD_API int zd_nn_embedding(zd_tensor_t *indices, zd_tensor_t *weight, int64_t padding_idx,
                           zd_tensor_t **out);

/*  ---- losses and outputs ---- */

/*  Numerically stable log(softmax(x)) of a 2-D x along dim 1 (-1 is
    accepted as the same dimension). *out: a new reference. */
ZD_API int zd_nn_log_softmax(zd_tensor_t *x, int dim, zd_tensor_t **out);

/*  Mean negative log-likelihood: logprobs (N,C), target (N) class indices
    (int64 or uint8) gives a scalar (shape ()). Fails naming the offending
    sample when a target is outside [0, C). *out: a new reference. */
ZD_API int zd_nn_nll_loss(zd_tensor_t *logprobs, zd_tensor_t *target, zd_tensor_t **out);

/*  nll_loss(log_softmax(logits, 1), target). *out: a new reference; 0, or
    -1. */
ZD_API int zd_nn_cross_entropy(zd_tensor_t *logits, zd_tensor_t *target, zd_tensor_t **out);

/*  mean((x - target)^2) over same-shaped float tensors, a scalar; target may require grad.
    *out: a new reference; 0, or -1. */
ZD_API int zd_nn_mse_loss(zd_tensor_t *x, zd_tensor_t *target, zd_tensor_t **out);

/*  Index of the largest entry of each row of x (N,C): an int64 tensor (N),
    not recorded by autograd. *out: a new reference; 0, or -1. */
ZD_API int zd_nn_argmax(zd_tensor_t *x, zd_tensor_t **out);

/*  How many rows of scores (N,C) (logits or log-probabilities) have their
    largest entry at target's class. Returns the count, or -1. */
ZD_API int64_t zd_nn_accuracy(zd_tensor_t *scores, zd_tensor_t *target);

/*  ---- initialisation (PyTorch's defaults for Conv2d and Linear) ---- */

/*  Fills t with uniform values in [lo, hi), not recorded by autograd. 0,
    or -1 (ZD_ERR_ARGUMENT) on a non-float32 tensor. The three fills alike. */
ZD_API int zd_nn_init_uniform(zd_tensor_t *t, float lo, float hi, zd_rng_t *rng);

/*  Fills t with normal(mean, std) values (PyTorch's normal_, nn.Embedding's init: 0, 1).
    0, or -1 (ZD_ERR_ARGUMENT) on a non-float32 tensor. */
ZD_API int zd_nn_init_normal(zd_tensor_t *t, float mean, float std, zd_rng_t *rng);

/*  kaiming_uniform_(weight, a=sqrt(5)): uniform in +-1/sqrt(fan_in) with
    fan_in = numel / size(0) (in_features, or C*kH*kW); then, when bias is
    non-NULL, bias uniform in the same bound. Weight is drawn first. */
ZD_API int zd_nn_init_default(zd_tensor_t *weight, zd_tensor_t *bias, zd_rng_t *rng);

/*  ---- threads (PyTorch's torch.set_num_threads) ---- */

/*  How many threads the layers of this process use (default: the cores, or
    OPENBLAS_NUM_THREADS). Several processes sharing a machine, or a server
    running several trainers' passes at once, do better with 1: no thread
    then spins waiting for another. Must be called before the first layer
    runs; returns 0, or -1 afterwards (naming the number in use). */
ZD_API int zd_nn_set_num_threads(int n);
ZD_API int zd_nn_get_num_threads(void);

/*  ---- the process set-up ----
    Linking the library changes nothing in a process until it calls
    zd_nn_process_setup. The layers choose their own kernels at run time,
    AVX-512 ones when the CPU has AVX-512 F/BW/DQ/VL (ZDIST_CPU=generic in
    the environment forces the portable ones). */

/*  What zd_nn_process_setup does: keep large freed blocks (tensors of a
    training step) in glibc's heap instead of giving them back to the
    system and faulting fresh zeroed pages in on the next step: about 30%
    of a Net training step (mallopt: mmap above 32 MB only, trim above 128
    MB; skipped when MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or
    GLIBC_TUNABLES is set). */
#define ZD_NN_SETUP_ALLOCATOR 1u
/*  Use OpenBLAS's AVX-512 (or AVX2) kernels where OpenBLAS 0.3.21 does not
    recognise the CPU and fell back to its generic "Prescott" ones, four
    times slower (skipped when OPENBLAS_CORETYPE is set: choose yourself). */
#define ZD_NN_SETUP_BLAS 2u
#define ZD_NN_SETUP_ALL  (ZD_NN_SETUP_ALLOCATOR | ZD_NN_SETUP_BLAS)

/*  Sets up this process for training with the layers (flags: ZD_NN_SETUP_*);
    call it first thing in main(), before other threads start and before any
    BLAS call (it may restart OpenBLAS); calling it again is harmless.
    When ZDIST_NUM_THREADS is set (zdist-launch sets it), also sets the
    layers' thread count to it (zd_nn_set_num_threads; at most the layers'
    maximum, 16). Returns 0, or -1 for unknown flags. */
ZD_API int zd_nn_process_setup(unsigned flags);

/*  Name of the OpenBLAS kernel set in use ("SkylakeX", "Haswell", ...;
    after zd_nn_process_setup with ZD_NN_SETUP_BLAS, the upgraded one).
    Static. */
ZD_API const char *zd_nn_blas_corename(void);

ZD_END_DECLS

#endif
