/* SPDX-License-Identifier: MIT */
/*  rref_backward.c: RRef.backward: a backward pass started from
    a loss that lives behind an RRef, run by the RRef's owner. */
#include "dist_autograd/dist_private.h"

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/rpc.h>
#include <zdist/value.h>

#define FN_RREF_BACKWARD "__rref_backward"

/*  context_id -1: local autograd, as PyTorch's RRef.backward(-1). */
static int backward_value(zd_value_t *v, int64_t context_id, bool retain_graph)
{
    zd_tensor_t *loss;
    if (zd_value_get_tensor(v, &loss) < 0)
        return zd_error_wrap("RRef.backward: the RRef's value");
    if (context_id == -1)
        return zd_autograd_backward(loss, NULL, retain_graph);
    return zd_dist_autograd_backward(context_id, &loss, 1, retain_graph);
}

/*  [value, context_id, retain_graph] on the owner. */
static zd_value_t *handle_rref_backward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    zd_value_t *v;
    int64_t ctx, retain;
    if (ZD_UNPACK(args, &v, &ctx, &retain) < 0)
        return NULL;
    /* A backward of a context only for a rank that took part in it. */
    dist_context_t *c = ctx == -1 ? NULL : zd__dist_context_get(ctx);
    bool allowed = !c || zd__dist_context_is_participant(c, zd_rpc_call_caller_rank(call));
    zd__dist_context_unref(c);
    if (!allowed) {
        char who[160];
        zd_error_set("RRef.backward of context %lld from %s, which took no part in it",
                     (long long)ctx,
                     zd__dist_peer_desc(zd_rpc_call_caller_rank(call), who, sizeof who));
        return NULL;
    }
    if (backward_value(v, ctx, retain != 0) < 0)
        return NULL;
    return zd_value_none();
}

int zd__dist_rref_backward_register(void)
{
    return zd_rpc_register(FN_RREF_BACKWARD, handle_rref_backward, NULL);
}

int zd_rref_backward(zd_rref_t *r, int64_t context_id, bool retain_graph)
{
    if (!r)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "RRef.backward: NULL RRef");
    if (context_id < -1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "RRef.backward: bad context id %lld",
                                 (long long)context_id);
    zd_value_t *v = NULL;
    int rc;
    if (zd_rref_is_owner(r)) {
        rc = zd_rref_local_value(r, &v);
        if (rc == 0)
            rc = backward_value(v, context_id, retain_graph);
    } else {
        rc = zd_rref_rpc_sync_take(r, FN_RREF_BACKWARD, ZD_ARGS(context_id, retain_graph),
                                   ZD_TIMEOUT_DEFAULT, &v);
    }
    zd_value_unref(v);
    return rc;
}
