/* SPDX-License-Identifier: MIT */
/*  module.h: a parameter container, in the image of PyTorch's nn.Module.

    A module holds named parameters (leaf float32 tensors that require
    grad), submodules whose parameters appear under dotted names
    ("fc1.weight"), a training/evaluation mode, and a forward function with
    the user's own state, so that a model is defined in C as a Module
    subclass is in Python:

        typedef struct { zd_tensor_t *w, *b; } mlp_t;   // borrowed from m
        static int mlp_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in,
                               zd_tensor_t **out, int n_out)
        {
            mlp_t *s = zd_nn_module_state(m);
            return zd_nn_linear(in[0], s->w, s->b, out);
        }
        ...
        zd_nn_module_t *m = zd_nn_module_new("Mlp", mlp_forward, s, free);
        s->w = zd_nn_module_add_parameter(m, "weight", (int64_t[]){10, 4}, 2);

    Parameters are listed as PyTorch's named_parameters() lists them: the
    module's own, in registration order, then each submodule's, in the order
    the submodules were registered. A tensor registered under several names
    (a tied weight: an embedding's weight registered again as the decoder's)
    is one parameter: zd_nn_module_n_params, _param, _param_name, _numel,
    _zero_grad and zd_dist_nn_parameter_rrefs see it once, under the name
    it was first seen with, as PyTorch's parameters(); the state_dict (and
    so save, load and safetensors) and zd_nn_module_find have it under each
    name, as PyTorch's state_dict(). Accessors return borrowed pointers,
    valid while the module lives and no parameter or submodule is added.

    Forward passes may run concurrently on one module from several threads
    (an RPC server's pool); registering, switching mode, loading and freeing
    must not race with them. */
#ifndef ZDIST_NN_MODULE_H
#define ZDIST_NN_MODULE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/named_tensors.h>
#include <zdist/strings.h>
#include <zdist/tensor.h>
#include <zdist/rng.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_nn_module zd_nn_module_t;

/*  A module's forward: n_in borrowed inputs give the first n_out of its
    outputs in out[0..n_out-1] (new references; the LSTM gives output, h_n,
    c_n); asked for more outputs than it has, it fails. Returns 0, or -1
    with zd_error_set(). */
typedef int(zd_nn_module_forward_fn)(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in,
                                     zd_tensor_t **out, int n_out);

/*  Frees the user state of a module. */
typedef void(zd_nn_module_free_fn)(void *state);

/*  A new, empty module in training mode: a new object (zd_nn_module_free).
    type_name ("Linear", copied) names it in errors; forward may be NULL (a
    pure container); free_state(state) runs when the module is freed (NULL:
    the module does not own state). NULL when out of memory (free_state(state)
    has run then). */
ZD_API zd_nn_module_t *zd_nn_module_new(const char *type_name, zd_nn_module_forward_fn *forward,
                                        void *state, zd_nn_module_free_fn *free_state);

/*  Frees the module, its submodules and its user state, and drops its
    references to the parameters (tensors still referenced elsewhere live
    on). NULL-safe. */
ZD_API void zd_nn_module_free(zd_nn_module_t *m);

/*  The type name given to zd_nn_module_new. Borrowed. */
ZD_API const char *zd_nn_module_type(const zd_nn_module_t *m);

/*  The user state given to zd_nn_module_new. Borrowed. */
ZD_API void *zd_nn_module_state(const zd_nn_module_t *m);

/*  Registers t as the parameter called name (no dots; unique among the
    module's parameters and submodules): takes its own reference, marks it
    as requiring grad (t must be a float32 leaf) and names the tensor with
    its dotted name when it has none yet. t may already be a parameter of
    this module or another (a tied weight, listed once). Returns 0, or -1
    (t untouched). */
ZD_API int zd_nn_module_register_parameter(zd_nn_module_t *m, const char *name, zd_tensor_t *t);

/*  A new zero-filled float32 parameter of that shape, registered as name.
    Returns it (borrowed from the module), or NULL. */
ZD_API zd_tensor_t *zd_nn_module_add_parameter(zd_nn_module_t *m, const char *name,
                                               const int64_t *shape, int ndim);

/*  Makes child a submodule called name: its parameters are listed as
    "name.<its names>". Takes ownership of child (freed with m), also on
    failure. A module can be the child of one parent only. Returns 0, or
    -1. */
ZD_API int zd_nn_module_register_module(zd_nn_module_t *m, const char *name, zd_nn_module_t *child);

/*  The submodule called name (a direct child; borrowed), or NULL with
    zd_error_last(). */
ZD_API zd_nn_module_t *zd_nn_module_child(const zd_nn_module_t *m, const char *name);

/*  ---- parameters, submodules included ---- */

/*  Number of parameters, each tensor once. */
ZD_API int zd_nn_module_n_params(const zd_nn_module_t *m);

/*  Parameter i (borrowed), or NULL with zd_error_last() for a bad index. */
ZD_API zd_tensor_t *zd_nn_module_param(const zd_nn_module_t *m, int i);

/*  The dotted name of parameter i ("fc1.weight"; borrowed), or NULL. */
ZD_API const char *zd_nn_module_param_name(const zd_nn_module_t *m, int i);

/*  The parameter with that dotted name (borrowed), or NULL with
    zd_error_last() naming it. */
ZD_API zd_tensor_t *zd_nn_module_find(const zd_nn_module_t *m, const char *name);

/*  Index of the parameter with that dotted name, or -1 with
    zd_error_last() (ZD_ERR_ARGUMENT) naming it. */
ZD_API int zd_nn_module_param_index(const zd_nn_module_t *m, const char *name);

/*  PyTorch's state_dict(): every parameter under its dotted name (a tied
    tensor under each of its names, as there): a new object
    (zd_named_tensors_free) holding new references to the module's own
    tensors, so writing into them writes its weights; NULL on failure. */
ZD_API zd_named_tensors_t *zd_nn_module_state_dict(const zd_nn_module_t *m);

/*  Total number of parameter elements, each tensor once. */
ZD_API int64_t zd_nn_module_numel(const zd_nn_module_t *m);

/*  Drops every parameter's .grad (PyTorch's zero_grad(set_to_none=True)). */
ZD_API void zd_nn_module_zero_grad(zd_nn_module_t *m);

/*  ---- the parameters as one flat vector ----
    Every parameter flattened, one after the other in the order above, as
    PyTorch's torch.nn.utils.parameters_to_vector lays them out. */

/*  A new float32 vector of zd_nn_module_numel(m) values: a copy of the
    parameters, or of their gradients (zeros for a parameter without one).
    0 and *out (a new reference), or -1. */
ZD_API int zd_nn_module_params_to_vector(const zd_nn_module_t *m, zd_tensor_t **out);
ZD_API int zd_nn_module_grads_to_vector(const zd_nn_module_t *m, zd_tensor_t **out);

/*  Copies v (float32, shape (zd_nn_module_numel(m))) into the parameters,
    in place and not recorded by autograd (PyTorch's vector_to_parameters);
    must not race with forward passes. 0, or -1 (ZD_ERR_ARGUMENT) naming
    both sizes. */
ZD_API int zd_nn_module_vector_to_params(zd_nn_module_t *m, const zd_tensor_t *v);

/*  ---- mode and forward ---- */

/*  Training (true) or evaluation mode, for the module and its submodules;
    returns the module's previous mode. */
ZD_API bool zd_nn_module_train(zd_nn_module_t *m, bool training);
ZD_API bool zd_nn_module_is_training(const zd_nn_module_t *m);

/*  Runs the module's forward on the n_in inputs (borrowed), asking for its
    first n_out >= 1 outputs. Returns 0 and out[0..n_out-1] (new
    references), or -1 with them NULL (a module without forward, more
    outputs than it gives, or the forward's error prefixed with the
    module's type). */
ZD_API int zd_nn_module_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in,
                                zd_tensor_t **out, int n_out);

/*  ---- checkpoints (the format of <zdist/checkpoint.h>) ---- */

/*  Saves every parameter under its dotted name. 0, or -1. */
ZD_API int zd_nn_module_save(const zd_nn_module_t *m, const char *path);

/*  Loads the parameters in place from a file holding exactly these names,
    shapes and dtypes (all or nothing). 0, or -1. */
ZD_API int zd_nn_module_load(zd_nn_module_t *m, const char *path);

/*  ---- ready-made modules (the recurrent ones are in <zdist/rnn.h>) ---- */

/*  PyTorch's nn.Linear(in_features, out_features, bias): parameters
    "weight" (out, in) and "bias" (out) when bias is true, initialised as
    PyTorch does from rng; forward takes one input (..., in). A new object
    (zd_nn_module_free), or NULL on bad sizes or out of memory. */
ZD_API zd_nn_module_t *zd_nn_linear_new(int64_t in_features, int64_t out_features, bool bias,
                                        zd_rng_t *rng);

/*  PyTorch's nn.Embedding(num_embeddings, embedding_dim, padding_idx):
    type "Embedding", parameter "weight" (num_embeddings, embedding_dim)
    drawn N(0, 1) from `seed`, row padding_idx zeroed unless it is
    ZD_NN_NO_PADDING (-1; <zdist/nn.h>). Forward: one input, int64 or
    uint8 indices (S...), gives (S..., embedding_dim) as zd_nn_embedding
    does, the padding row getting no gradient. A new object
    (zd_nn_module_free), or NULL with zd_error_last() (ZD_ERR_ARGUMENT: bad
    sizes or padding_idx). */
ZD_API zd_nn_module_t *zd_nn_embedding_new(int64_t num_embeddings, int64_t embedding_dim,
                                           int64_t padding_idx, uint64_t seed);

/*  ---- weights in and out of safetensors files ----

    Modules save under their dotted parameter names, which are PyTorch's
    state_dict() names for the same model ("conv1.weight", "fc2.bias",
    the LSTM's "weight_ih_l0"), so a file goes between zdist and PyTorch's
    model.load_state_dict(st.load(path)[0]) / load_file() as it is.
    Loading goes as zd_safetensors_load (<zdist/safetensors.h>) says. */

/*  Writes every parameter of m under its dotted name, with meta's key,
    value pairs as zd_safetensors_write takes them (meta may be NULL). 0,
    or -1 (path untouched). */
ZD_API int zd_nn_module_save_safetensors(const zd_nn_module_t *m, const char *path,
                                         const zd_strings_t *meta);

/*  Loads m's parameters from the file, as zd_safetensors_load does:
    0 with, when skipped is non-NULL, *skipped a new object
    (zd_strings_free) listing the names skipped, or -1. */
ZD_API int zd_nn_module_load_safetensors(zd_nn_module_t *m, const char *path, bool strict,
                                         zd_strings_t **skipped);

ZD_END_DECLS

#endif
