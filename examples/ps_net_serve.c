/* SPDX-License-Identifier: MIT */
/*  ps_net_serve.c: the parameter server's RPC functions for the forward
    pass, the parameters' RRefs and the gradients, gathered over the shards;
    and ps_net_serve, which sets the shard up and registers every function
    of the server. */
#include "examples/fault.h"
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>

static zd_value_t *tensor_result(int rc, zd_tensor_t *t)
{
    zd_value_t *v = rc == 0 ? zd_value_tensor(t) : NULL;
    zd_tensor_unref(t);
    return v;
}

static zd_value_t *fn_get_parameter_server(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_string("ParameterServer");
}

/*  ps_forward(server, x, training): no graph is recorded for evaluation. */
static zd_value_t *fn_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *server; /* the RRef's value: this process's own */
    zd_tensor_t *x, *out = NULL;
    int64_t training;
    if (ZD_UNPACK(args, &server, &x, &training) < 0 || ps_net_guard_batch(call, x) < 0)
        return NULL;
    if (training)
        ps_net_eval_note_batch(zd_rpc_call_caller_rank(call), zd_tensor_shape(x)[0]);
    fault_point(zd_rpc_rank(), "forward"); /* tests only (fault.h) */
    bool prev = zd_autograd_set_grad_enabled(training != 0);
    int rc = ps_net_forward(x, training != 0, &out);
    zd_autograd_set_grad_enabled(prev);
    return tensor_result(rc, out);
}

static zd_value_t *fn_fc1_part(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *flat, *out = NULL;
    int64_t training;
    if (ZD_UNPACK(args, &flat, &training) < 0 || ps_net_guard_features(call, flat) < 0)
        return NULL;
    fault_point(zd_rpc_rank(), "forward"); /* tests only (fault.h) */
    bool prev = zd_autograd_set_grad_enabled(training != 0);
    int rc = ps_net_fc1_part(flat, training != 0, &out);
    zd_autograd_set_grad_enabled(prev);
    return tensor_result(rc, out);
}

/*  RRefs to this shard's parameters, owned here. */
static int append_local_rrefs(zd_value_t *list)
{
    for (int i = 0; i < ps_shard.n; i++) {
        zd_value_t *tv = zd_value_tensor(ps_shard.params[i]);
        zd_rref_t *r = tv ? zd_rref_new(tv) : NULL;
        zd_value_unref(tv);
        if (!r || zd_list_append(list, zd_value_rref(r)) < 0) {
            zd_rref_unref(r);
            return -1;
        }
        zd_rref_unref(r);
    }
    return 0;
}

static zd_value_t *fn_local_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *list = zd_value_list((size_t)ps_shard.n);
    if (list && append_local_rrefs(list) < 0) {
        zd_value_unref(list);
        return NULL;
    }
    return list;
}

/*  Appends every item of the list returned by fn(args) on each other shard. */
static int gather_from_shards(zd_value_t *list, const char *fn, zd_value_t *args)
{
    for (int s = 1; s < ps_shard.num_shards; s++) {
        zd_value_t *r;
        if (zd_rpc_sync(s, fn, args, ZD_TIMEOUT_DEFAULT, &r) < 0)
            return -1;
        for (size_t i = 0; i < zd_list_len(r); i++)
            if (zd_list_append(list, zd_value_ref(zd_list_get(r, i))) < 0) {
                zd_value_unref(r);
                return -1;
            }
        zd_value_unref(r);
    }
    return 0;
}

static zd_value_t *fn_get_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    zd_value_t *list = fn_local_param_rrefs(call, args, arg);
    if (list && gather_from_shards(list, "ps_local_param_rrefs", NULL) < 0) {
        zd_value_unref(list);
        return NULL;
    }
    return list;
}

/*  [[name, gradient], ...] of this shard's parameters in context cid, or
    with sizes [[name, elements], ...]: what the trainer's check asks, the
    same question without moving 4.8 MB per batch. */
static zd_value_t *local_gradients(zd_value_t *args, bool sizes)
{
    int64_t cid;
    size_t at = zd_list_len(args) == 2 ? 1 : 0; /* (server, cid) or (cid) */
    if (zd_rpc_arg_int(args, at, &cid) < 0)
        return NULL;
    zd_value_t *list = zd_value_list((size_t)ps_shard.n);
    for (int i = 0; list && i < ps_shard.n; i++) {
        zd_tensor_t *g;
        if (zd_dist_autograd_get_gradient(cid, ps_shard.params[i], &g) < 0) {
            zd_value_unref(list);
            return NULL;
        }
        zd_value_t *item = !g ? NULL
            : sizes           ? ZD_ARGS(ps_shard.names[i], zd_tensor_numel(g))
                              : ZD_ARGS(ps_shard.names[i], g);
        if (g && zd_list_append(list, item) < 0)
            zd_value_unref(list), list = NULL;
        zd_tensor_unref(g);
    }
    return list;
}

static zd_value_t *fn_local_dist_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return local_gradients(args, false);
}

static zd_value_t *fn_local_dist_gradient_sizes(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return local_gradients(args, true);
}

/*  The local list, then every other shard's (fn there). */
static zd_value_t *all_gradients(zd_value_t *args, bool sizes, const char *fn)
{
    int64_t cid;
    if (zd_rpc_arg_int(args, 1, &cid) < 0)
        return NULL;
    zd_value_t *list = local_gradients(args, sizes);
    zd_value_t *cargs = ZD_ARGS(cid);
    if (list && (!cargs || gather_from_shards(list, fn, cargs) < 0)) {
        zd_value_unref(list);
        list = NULL;
    }
    zd_value_unref(cargs);
    return list;
}

static zd_value_t *fn_get_dist_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return all_gradients(args, false, "ps_local_dist_gradients");
}

static zd_value_t *fn_dist_gradient_sizes(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return all_gradients(args, true, "ps_local_dist_gradient_sizes");
}

int ps_net_serve(int shard, int num_shards, uint64_t seed, bool use_dropout, const char *data_dir,
                 FILE *out)
{
    if (ps_net_model_build(shard, num_shards, seed, use_dropout, out) < 0)
        return -1;
    struct {
        const char *name;
        zd_rpc_handler_fn *fn;
    } fns[] = {
        {"get_parameter_server", fn_get_parameter_server},
        {"ps_forward", fn_forward},
        {"ps_fc1_part", fn_fc1_part},
        {"ps_get_param_rrefs", fn_get_param_rrefs},
        {"ps_local_param_rrefs", fn_local_param_rrefs},
        {"ps_get_dist_gradients", fn_get_dist_gradients},
        {"ps_local_dist_gradients", fn_local_dist_gradients},
        {"ps_dist_gradient_sizes", fn_dist_gradient_sizes},
        {"ps_local_dist_gradient_sizes", fn_local_dist_gradient_sizes},
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (zd_rpc_register(fns[i].name, fns[i].fn, NULL) < 0)
            return -1;
    if (ps_net_checkpoint_register() < 0 || ps_net_export_register() < 0)
        return -1;
    /* A forward here runs on a copy of the parameters (ps_net_snapshot), so
       the backward passes read nothing a step writes: they need not hold
       steps off, as zd_dist_optim_init's guard has them do. With it, a step
       waited for every backward running (one core each) while the forwards
       and backwards arriving waited for the step: a core stood idle about
       5 % of the main job. */
    if (zd_dist_autograd_set_backward_guard(NULL, NULL) < 0)
        return -1;
    return ps_net_eval_register(data_dir);
}
