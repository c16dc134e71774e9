/* SPDX-License-Identifier: MIT */
/*  dist_optim.h: the DistributedOptimizer, in the image of
    torch.distributed.optim.DistributedOptimizer.

        zd_optim_config_t cfg = zd_optim_sgd_defaults(0.03);
        zd_dist_optim_t *opt = zd_dist_optim_new(&cfg, params);   // RRefs to tensors anywhere
        if (!opt)
            ...zd_error_last() names the owner that refused...
        ... zd_dist_autograd_backward(ctx, &loss, 1, false);
        zd_dist_optim_step(opt, ctx);                     // every owner, at once
        zd_dist_optim_free(opt);

    params is a zd_rref_list_t (rpc.h): zd_dist_nn_parameter_rrefs and
    zd_remote_module_remote_parameters return one, zd_rref_list_extend
    gathers several. The constructor groups the parameters by owner and creates one local
    optimizer per owner, on that owner (optim.h, any kind, the same
    hyper-parameters), and keeps an RRef to each, as PyTorch's keeps RRefs
    to its _LocalOptimizer objects. A step calls every owner's optimizer
    through its RRef with the context id, all at once, and waits for all;
    each owner takes that context's gradients of its parameters
    (zd_dist_autograd_get_gradient) and steps its local optimizer. Parameters
    without a gradient in the context are skipped, as PyTorch skips
    parameters whose .grad is None.

    Owners guard the parameters they share. Each local optimizer is made
    from its caller's config, so a caller with an absurd learning rate
    would ruin the parameters for every caller with finite gradients.
    An owner therefore publishes a step only when every parameter it
    stepped is finite (and, with a max_change set, moved no more than
    that): otherwise it puts the parameters back as they were before the
    step and refuses it, naming the caller, the parameter and the element;
    the other callers go on. (Gradients that are not finite are refused
    before the step.) zd_dist_optim_set_owner_limits goes further: callers
    must then use exactly the owner's config.

    Concurrency: steps on one owner are serialised by the local optimizer's
    lock, so concurrent trainers never interleave inside one update. Each
    owner also has one readers-writer lock (per process) that writers
    (steps) take exclusively: zd_dist_optim_read_lock() lets a forward pass copy the
    parameters without seeing half an update, and zd_dist_optim_init() makes
    every distributed backward run here, and every RemoteModule forward
    run here (dist_nn.h), take it too (zd_dist_autograd_set_backward_guard),
    as both read weights.

    Requires zd_dist_autograd_init() and zd_dist_optim_init() before zd_rpc_init on
    every process that owns parameters (it registers the "__dist_optim_*"
    functions). */
#ifndef ZDIST_DIST_OPTIM_H
#define ZDIST_DIST_OPTIM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <zdist/optim.h>
#include <zdist/rpc.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_dist_optim zd_dist_optim_t;

/*  Registers the functions owners serve. Call before zd_rpc_init. 0, or -1. */
ZD_API int zd_dist_optim_init(void);

/*  What this process, as an owner, accepts from the callers that create
    optimizers over its parameters (zd_dist_optim_set_owner_limits). Start
    from zd_dist_optim_owner_limits_default(). */
typedef struct {
    size_t size;                     /* set by zd_dist_optim_owner_limits_default() */
    const zd_optim_config_t *config; /* callers must use exactly this config
                                          (NULL: any valid one) */
    double max_change;               /* a step may move a parameter by at most this
                                          times max(its RMS, 1), in RMS (0: no bound) */
} zd_dist_optim_owner_limits_t;

/*  No limits, with size set (inline: this program's size). Returns the
    struct. */
static inline zd_dist_optim_owner_limits_t zd_dist_optim_owner_limits_default(void)
{
    zd_dist_optim_owner_limits_t l;
    memset(&l, 0, sizeof l);
    l.size = sizeof l;
    return l;
}

/*  On an owner: callers must use exactly limits->config (copied; others
    are refused, naming the caller and the field) and steps are bounded by
    max_change; NULL: no limits. 0, or -1 (ZD_ERR_ARGUMENT) for invalid
    limits or a size that no zd_dist_optim_owner_limits_default() set. */
ZD_API int zd_dist_optim_set_owner_limits(const zd_dist_optim_owner_limits_t *limits);

/*  Creates one optimizer per owner over the parameters params lists
    (RRefs whose values are float32 tensors; the list is borrowed). A new
    object (zd_dist_optim_free), or NULL with an error naming the owner
    that refused (bad hyper-parameters, a value that is not a tensor, an
    unreachable owner; ZD_ERR_NOT_INITIALIZED: zd_dist_optim_init() not
    called there). */
ZD_API zd_dist_optim_t *zd_dist_optim_new(const zd_optim_config_t *cfg,
                                          const zd_rref_list_t *params);

/*  Steps every owner with the gradients of context_id and waits for all.
    Returns 0, or -1 with the error of the first owner that failed, named
    ("step on \"ps\" (rank 0): ..."); an owner that refused the step (a
    gradient or a stepped parameter not finite, a change over its
    max_change) left its parameters as they were. */
ZD_API int zd_dist_optim_step(zd_dist_optim_t *opt, int64_t context_id);

/*  Releases the RRefs to the local optimizers, so that their owners free
    them (as soon as the release reaches them), and frees opt. NULL-safe. */
ZD_API void zd_dist_optim_free(zd_dist_optim_t *opt);

/*  Number of owners (local optimizers) behind opt. */
ZD_API int zd_dist_optim_num_owners(const zd_dist_optim_t *opt);

/*  On an owner: hold while reading parameters that distributed optimizers
    may step, to see each update whole. Steps wait for readers, and new
    readers for a waiting step. Taken again on a thread that holds it (a
    distributed backward run or a RemoteModule forward already does), it
    only counts; each lock needs its unlock, and an unlock on a thread
    that holds nothing does nothing. */
ZD_API void zd_dist_optim_read_lock(void);
ZD_API void zd_dist_optim_read_unlock(void);

/*  On an owner: how many steps distributed optimizers have applied here
    (PyTorch's tensor._version, for all parameters at once). Read under
    zd_dist_optim_read_lock(), an unchanged count means unchanged
    parameters: a copy taken at that count is still current. */
ZD_API uint64_t zd_dist_optim_version(void);

/*  On an owner: runs update(arg) as a step runs, every step, forward and
    backward reading the parameters held off meanwhile, to change them in
    place (a checkpoint taken back into them). update returns 1 when it
    changed them (zd_dist_optim_version counts that as a step, and the
    owner's local optimizers made before refuse their steps, saying why:
    the DistributedOptimizers over them are to be made again), 0 when
    not, -1 with the error set. Returns what update returned, or -1
    (ZD_ERR_ARGUMENT: NULL, or a thread holding zd_dist_optim_read_lock(),
    which would wait for itself). */
ZD_API int zd_dist_optim_update_params(int (*update)(void *arg), void *arg);

ZD_END_DECLS

#endif
