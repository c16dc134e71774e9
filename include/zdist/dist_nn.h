/* SPDX-License-Identifier: MIT */
/*  dist_nn.h: modules over RPC, in the image of torch.distributed.nn:
    RRefs to a module's parameters for the DistributedOptimizer, and
    RemoteModule, a module created on another worker and used through an
    RRef.

        // every process, before zd_rpc_init:
        zd_dist_autograd_init();
        zd_dist_optim_init();
        zd_dist_nn_init();
        zd_dist_nn_register_module("Linear", make_linear, NULL);
        ...
        zd_remote_module_t *rm = zd_remote_module_new(zd_rpc_worker("ps"), "Linear",
                                                      ZD_ARGS(4, 2));
        zd_rref_list_t *params = zd_remote_module_remote_parameters(rm);
        zd_optim_config_t cfg = zd_optim_sgd_defaults(0.05);
        zd_dist_optim_t *opt = zd_dist_optim_new(&cfg, params);
        zd_rref_list_free(params);
        ZD_DIST_AUTOGRAD_CONTEXT(ctx) {
            zd_tensor_t *y;
            zd_remote_module_forward(rm, &x, 1, &y, 1); // runs on "ps", recorded
            ...loss..., zd_dist_autograd_backward(ctx, &loss, 1, false);
            zd_dist_optim_step(opt, ctx);              // steps the module on "ps"
        }
        zd_dist_optim_free(opt);
        zd_remote_module_free(rm);

    Module types are constructors registered by name on the processes that
    create modules (like registered RPC functions): a remote process names
    the type and passes arguments; the owner builds the module and keeps it
    until the last RRef to it is released.

    The forward's tensors travel as any RPC's: inside a distributed-autograd
    context the caller's send and the owner's receive functions are
    recorded, and the backward pass reaches the module's parameters on the
    owner, whose gradients stay in the context there (the
    DistributedOptimizer steps them). */
#ifndef ZDIST_DIST_NN_H
#define ZDIST_DIST_NN_H

#include <stdint.h>

#include <zdist/future.h>
#include <zdist/module.h>
#include <zdist/rpc.h>
#include <zdist/value.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  ---- RRefs to parameters (PyTorch's _parameter_rrefs) ---- */

/*  RRefs owned by this process, one per parameter of m in
    zd_nn_module_param order (a tensor registered twice, a tied weight,
    once, where first seen), for zd_dist_optim_new: a new object
    (zd_rref_list_free). RPC must be running. NULL on failure
    (ZD_ERR_ARGUMENT: m NULL; RPC not running; out of memory). */
ZD_API zd_rref_list_t *zd_dist_nn_parameter_rrefs(const zd_nn_module_t *m);

/*  ---- module types ---- */

/*  Builds a module from the creator's arguments (borrowed; an empty list
    when none were given). Returns a new object (zd_nn_module_free; the
    RemoteModule owns it), or NULL with zd_error_set(): the creator gets
    the message. */
typedef zd_nn_module_t *(zd_dist_nn_module_ctor_fn)(zd_value_t *args, void *arg);

/*  Registers the internal functions RemoteModule calls on owners. Call
    before zd_rpc_init in every process that may own remote modules;
    calling it again does nothing. Returns 0, or -1. */
ZD_API int zd_dist_nn_init(void);

/*  Registers (or replaces) the module type called type_name in this
    process. Returns 0, or -1 on a bad name or out of memory. */
ZD_API int zd_dist_nn_register_module(const char *type_name, zd_dist_nn_module_ctor_fn *ctor,
                                      void *arg);

/*  ---- RemoteModule ---- */

typedef struct zd_remote_module zd_remote_module_t;

/*  Creates a module of type type_name on worker `to` with args (a list;
    taken over and released in every case, so ZD_ARGS(...) can be written
    in place; NULL: no arguments) and waits until it exists. Returns the
    handle, a new object (zd_remote_module_free), or NULL with an error naming
    the worker: unknown type, the constructor's own error, unreachable
    worker, zd_dist_nn_init() missing there (ZD_ERR_NOT_INITIALIZED). */
ZD_API zd_remote_module_t *zd_remote_module_new(int to, const char *type_name, zd_value_t *args);

/*  Runs the module's forward on its owner with the n_in tensors (borrowed)
    and waits, as zd_nn_module_forward does there, with the owner's
    DistributedOptimizer steps held off (dist_optim.h; so the module's
    forward must not wait on a call its own process serves, such as
    another RemoteModule there): the first n_out outputs
    (at least 1; more than the module gives is the owner's error), each a
    new reference, in out[0..n_out-1], and 0; or -1 with the owner's error
    and every out[i] NULL. */
ZD_API int zd_remote_module_forward(zd_remote_module_t *rm, zd_tensor_t *const *in, int n_in,
                                    zd_tensor_t **out, int n_out);

/*  The same without waiting: a future (new reference) that completes with
    a tensor value (n_out == 1) or a list value of the n_out tensors, or the
    error; NULL when the call could not be made. */
ZD_API zd_future_t *zd_remote_module_forward_async(zd_remote_module_t *rm, zd_tensor_t *const *in,
                                                   int n_in, int n_out);

/*  RRefs to the module's parameters, owned by its owner (PyTorch's
    RemoteModule.remote_parameters()), for zd_dist_optim_new, as
    zd_dist_nn_parameter_rrefs lists them there: a new object
    (zd_rref_list_free), or NULL with the owner's error. */
ZD_API zd_rref_list_t *zd_remote_module_remote_parameters(zd_remote_module_t *rm);

/*  The RRef to the module (borrowed: valid while rm lives; its value is an
    object of type "RemoteModule", for functions of one's own called
    through it), and the owner's rank. */
ZD_API zd_rref_t *zd_remote_module_rref(const zd_remote_module_t *rm);
ZD_API int zd_remote_module_owner(const zd_remote_module_t *rm);

/*  On the owner, in a function called through zd_remote_module_rref: the
    module inside such an object value (borrowed: valid while the value
    lives). 0, or -1 (ZD_ERR_ARGUMENT) when object is not a RemoteModule. */
ZD_API int zd_remote_module_local(zd_value_t *object, zd_nn_module_t **module);

/*  Releases the handle: the owner frees the module once no other RRef to
    it remains. NULL-safe. */
ZD_API void zd_remote_module_free(zd_remote_module_t *rm);

ZD_END_DECLS

#endif
