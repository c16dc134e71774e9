/* SPDX-License-Identifier: MIT */
/*  The two shards of the pipelined Net, and the driver's view of them
    (pipeline_core.h). The training loop is in pipeline_driver.c. */
#include "examples/pipeline_core.h"
#include "examples/fault.h"

#include <stdlib.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include "examples/actor.h"
#include "examples/train_common.h"
#include <zdist/model.h>
#include <zdist/dist_optim.h>

/*  ---- the shard actor ---- */

typedef struct {
    int stage;                                  /* 1 or 2 */
    zd_nn_module_t *net;                        /* the whole Net; only the stage's half is used */
    zd_tensor_t *params[PIPELINE_STAGE_PARAMS]; /* borrowed from net */
    double busy;                                /* seconds spent in forward since the last stats */
    int64_t calls;
} shard_t;

static void shard_free(void *obj)
{
    shard_t *s = obj;
    zd_nn_module_free(s->net);
    free(s);
}

static const actor_class_t shard_class = {"NetShard", shard_free};

/*  "NetShard"(stage, seed, dropout) */
static zd_value_t *fn_shard_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t stage, seed, dropout;
    if (ZD_UNPACK(args, &stage, &seed, &dropout) < 0)
        return NULL;
    if (stage != 1 && stage != 2) {
        zd_error_set("NetShard: stage must be 1 or 2, got %lld", (long long)stage);
        return NULL;
    }
    shard_t *s = calloc(1, sizeof *s);
    if (!s || !(s->net = zd_nn_net_new((uint64_t)seed))) {
        if (!s)
            zd_error_set("out of memory");
        free(s);
        return NULL;
    }
    s->stage = (int)stage;
    zd_nn_module_train(s->net, dropout != 0);
    /* Stage 1 holds conv1 and conv2, stage 2 fc1 and fc2. */
    for (int i = 0; i < PIPELINE_STAGE_PARAMS; i++)
        s->params[i] = zd_nn_module_param(s->net, (s->stage - 1) * PIPELINE_STAGE_PARAMS + i);
    return actor_new(&shard_class, s);
}

/*  "NetShard.forward"(x_rref) */
static zd_value_t *fn_shard_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    fault_point(zd_rpc_rank(), "forward"); /* tests only (fault.h) */
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &shard_class);
    if (!a)
        return NULL;
    shard_t *s = actor_object(a);
    zd_rref_t *in_rref;
    zd_value_t *in = NULL, *v = NULL;
    zd_tensor_t *x, *y = NULL;
    /* Fetching the input is not the shard's work: outside the lock. Under
       the caller's context, the fetch is recorded for backward. */
    if (zd_rpc_arg_rref(args, 1, &in_rref) < 0 ||
        zd_rref_to_here(in_rref, ZD_TIMEOUT_DEFAULT, &in) < 0 || zd_value_get_tensor(in, &x) < 0) {
        zd_error_wrap("NetShard.forward (stage %d): input", s->stage);
        goto out;
    }
    /* Without a context nobody can run backward: do not record. */
    bool grad = zd_autograd_set_grad_enabled(zd_dist_autograd_current_context() >= 0);
    actor_lock(a);
    double t0 = train_now();
    int rc =
        s->stage == 1 ? zd_nn_net_forward_conv(s->net, x, &y) : zd_nn_net_forward_fc(s->net, x, &y);
    s->busy += train_now() - t0;
    s->calls++;
    actor_unlock(a);
    zd_autograd_set_grad_enabled(grad);
    if (rc == 0)
        v = zd_value_tensor(y);
    else
        zd_error_wrap("NetShard.forward (stage %d)", s->stage);
out:
    zd_tensor_unref(y);
    zd_value_unref(in);
    return v;
}

/*  "NetShard.parameter_rrefs"() -> [RRef(param), ...] */
static zd_value_t *fn_shard_param_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &shard_class);
    if (!a)
        return NULL;
    shard_t *s = actor_object(a);
    zd_value_t *l = zd_value_list(PIPELINE_STAGE_PARAMS);
    for (int i = 0; l && i < PIPELINE_STAGE_PARAMS; i++) {
        zd_value_t *pv = zd_value_tensor(s->params[i]);
        zd_rref_t *r = pv ? zd_rref_new(pv) : NULL;
        zd_value_unref(pv);
        if (!r || zd_list_append(l, zd_value_rref(r)) < 0) {
            zd_value_unref(l);
            l = NULL;
        }
        zd_rref_unref(r);
    }
    return l;
}

/*  "NetShard.train"(on) */
static zd_value_t *fn_shard_train(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t on;
    actor_t *a = actor_get(args, &shard_class);
    if (!a)
        return NULL;
    zd_value_t *v = NULL;
    if (zd_rpc_arg_int(args, 1, &on) == 0) {
        actor_lock(a);
        zd_nn_module_train(((shard_t *)actor_object(a))->net, on != 0);
        actor_unlock(a);
        v = zd_value_none();
    }
    return v;
}

/*  "NetShard.gradients"(context_id) -> [grad or none, ...] */
static zd_value_t *fn_shard_gradients(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t ctx;
    actor_t *a = actor_get(args, &shard_class);
    if (!a)
        return NULL;
    shard_t *s = actor_object(a);
    zd_value_t *l = NULL;
    if (zd_rpc_arg_int(args, 1, &ctx) == 0)
        l = zd_value_list(PIPELINE_STAGE_PARAMS);
    for (int i = 0; l && i < PIPELINE_STAGE_PARAMS; i++) {
        zd_tensor_t *g;
        if (zd_dist_autograd_get_gradient(ctx, s->params[i], &g) < 0 ||
            zd_list_append(l, g ? zd_value_tensor(g) : zd_value_none()) < 0) {
            zd_value_unref(l);
            l = NULL;
        }
        zd_tensor_unref(g);
    }
    return l;
}

/*  "NetShard.stats"() -> [seconds in forward, forwards], both since the
    previous call (which resets them). */
static zd_value_t *fn_shard_stats(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    actor_t *a = actor_get(args, &shard_class);
    if (!a)
        return NULL;
    shard_t *s = actor_object(a);
    actor_lock(a);
    zd_value_t *v = ZD_ARGS(s->busy, s->calls);
    s->busy = 0;
    s->calls = 0;
    actor_unlock(a);
    return v;
}

int pipeline_register(void)
{
    if (zd_dist_autograd_init() < 0 || zd_dist_optim_init() < 0 || actor_register() < 0 ||
        zd_rpc_register("NetShard", fn_shard_new, NULL) < 0 ||
        zd_rpc_register("NetShard.forward", fn_shard_forward, NULL) < 0 ||
        zd_rpc_register("NetShard.parameter_rrefs", fn_shard_param_rrefs, NULL) < 0 ||
        zd_rpc_register("NetShard.train", fn_shard_train, NULL) < 0 ||
        zd_rpc_register("NetShard.gradients", fn_shard_gradients, NULL) < 0 ||
        zd_rpc_register("NetShard.stats", fn_shard_stats, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- the driver's side ---- */

struct pipeline_net {
    zd_rref_t *shard[2];
    zd_rref_list_t *params; /* the replies of parameter_rrefs, in order */
};

pipeline_net_t *pipeline_net_new(int rank1, int rank2, uint64_t seed, bool dropout)
{
    pipeline_net_t *n = calloc(1, sizeof *n);
    if (!n) {
        zd_error_set("out of memory");
        return NULL;
    }
    int ranks[2] = {rank1, rank2};
    for (int k = 0; k < 2; k++) {
        zd_value_t *a = ZD_ARGS(k + 1, seed, dropout);
        n->shard[k] = a ? zd_rpc_remote(ranks[k], "NetShard", a, ZD_TIMEOUT_DEFAULT) : NULL;
        zd_value_unref(a);
        if (!n->shard[k]) {
            pipeline_net_free(n);
            return NULL;
        }
    }
    return n;
}

void pipeline_net_free(pipeline_net_t *n)
{
    if (!n)
        return;
    zd_rref_list_free(n->params);
    for (int k = 0; k < 2; k++)
        zd_rref_unref(n->shard[k]); /* the last RRef: the shard is freed */
    free(n);
}

/*  Starts micro-batch x through both stages; returns the future of stage
    2's output. */
static zd_future_t *start_micro_batch(pipeline_net_t *n, zd_tensor_t *x)
{
    zd_value_t *xv = zd_value_tensor(x), *a = NULL;
    zd_rref_t *x_rref = xv ? zd_rref_new(xv) : NULL, *y_rref = NULL;
    zd_future_t *f = NULL;
    zd_value_unref(xv);
    if (x_rref && (a = ZD_ARGS(x_rref)))
        y_rref = zd_rref_remote(n->shard[0], "NetShard.forward", a, ZD_TIMEOUT_DEFAULT);
    zd_value_unref(a);
    a = NULL;
    if (y_rref && (a = ZD_ARGS(y_rref)))
        f = zd_rref_rpc_async(n->shard[1], "NetShard.forward", a, ZD_TIMEOUT_DEFAULT);
    zd_value_unref(a);
    zd_rref_unref(y_rref);
    zd_rref_unref(x_rref);
    return f;
}

int pipeline_net_forward(pipeline_net_t *n, zd_tensor_t *x, int num_split, zd_tensor_t **logprobs)
{
    *logprobs = NULL;
    if (!x || zd_tensor_ndim(x) != 4 || zd_tensor_dtype(x) != ZD_FLOAT32 ||
        zd_tensor_size(x, 0) < 1)
        return zd_error_set("pipeline forward: x must be a float32 (N, 1, 28, 28) batch");
    int64_t N = zd_tensor_size(x, 0);
    if (num_split < 1 || num_split > N)
        return zd_error_set("pipeline forward: %d micro-batches of a batch of %lld", num_split,
                            (long long)N);
    int64_t size = (N + num_split - 1) / num_split;
    int m = (int)((N + size - 1) / size);
    zd_future_t **f = calloc((size_t)m, sizeof *f);
    zd_tensor_t **outs = calloc((size_t)m, sizeof *outs);
    int rc = f && outs ? 0 : zd_error_set("out of memory");
    for (int i = 0; rc == 0 && i < m; i++) {
        int64_t lo = i * size, len = lo + size < N ? size : N - lo;
        zd_tensor_t *xi = NULL;
        if (zd_tensor_narrow(x, 0, lo, len, &xi) < 0 || !(f[i] = start_micro_batch(n, xi)))
            rc = -1;
        zd_tensor_unref(xi);
    }
    for (int i = 0; i < m; i++) {
        zd_tensor_t *t;
        if (f && f[i] && zd_future_wait(f[i], ZD_TIMEOUT_DEFAULT) == 0 && rc == 0 &&
            zd_value_get_tensor(zd_future_value(f[i]), &t) == 0)
            outs[i] = zd_tensor_ref(t);
        else if (rc == 0)
            rc = -1;
        if (f)
            zd_future_unref(f[i]);
    }
    if (rc == 0)
        rc = m == 1 ? (*logprobs = zd_tensor_ref(outs[0]), 0) : zd_tensor_cat(outs, m, 0, logprobs);
    for (int i = 0; outs && i < m; i++)
        zd_tensor_unref(outs[i]);
    free(outs);
    free(f);
    return rc;
}

const zd_rref_list_t *pipeline_net_parameter_rrefs(pipeline_net_t *n)
{
    zd_rref_list_t *params = n->params ? NULL : zd_rref_list_new();
    for (int k = 0; params && k < 2; k++) {
        zd_value_t *l = NULL;
        int rc =
            zd_rref_rpc_sync(n->shard[k], "NetShard.parameter_rrefs", NULL, ZD_TIMEOUT_DEFAULT, &l);
        if (rc == 0 && zd_list_len(l) != PIPELINE_STAGE_PARAMS)
            rc = zd_error_set("NetShard.parameter_rrefs: %zu RRefs, expected %d", zd_list_len(l),
                              PIPELINE_STAGE_PARAMS);
        for (int i = 0; rc == 0 && i < PIPELINE_STAGE_PARAMS; i++) {
            zd_rref_t *r;
            rc = zd_rpc_arg_rref(l, (size_t)i, &r) < 0 ? -1 : zd_rref_list_append(params, r);
        }
        zd_value_unref(l);
        if (rc < 0) {
            zd_rref_list_free(params);
            return NULL;
        }
    }
    if (params)
        n->params = params;
    return n->params;
}

int pipeline_net_train(pipeline_net_t *n, bool training)
{
    zd_value_t *a = ZD_ARGS(training), *v = NULL;
    int rc = a ? 0 : -1;
    for (int k = 0; rc == 0 && k < 2; k++) {
        rc = zd_rref_rpc_sync(n->shard[k], "NetShard.train", a, ZD_TIMEOUT_DEFAULT, &v);
        zd_value_unref(v);
    }
    zd_value_unref(a);
    return rc;
}

int pipeline_net_gradients(pipeline_net_t *n, int64_t context_id, zd_tensor_t **grads)
{
    zd_value_t *a = ZD_ARGS(context_id);
    int rc = a ? 0 : -1;
    for (int i = 0; i < 2 * PIPELINE_STAGE_PARAMS; i++)
        grads[i] = NULL;
    for (int k = 0; rc == 0 && k < 2; k++) {
        zd_value_t *l;
        if ((rc = zd_rref_rpc_sync(n->shard[k], "NetShard.gradients", a, ZD_TIMEOUT_DEFAULT, &l)) <
            0)
            break;
        for (int i = 0; i < PIPELINE_STAGE_PARAMS && i < (int)zd_list_len(l); i++) {
            zd_tensor_t *g;
            if (zd_value_get_tensor(zd_list_get(l, (size_t)i), &g) == 0)
                grads[k * PIPELINE_STAGE_PARAMS + i] = zd_tensor_ref(g);
        }
        zd_value_unref(l);
    }
    zd_value_unref(a);
    return rc;
}

int pipeline_net_busy(pipeline_net_t *n, double *seconds)
{
    for (int k = 0; k < 2; k++) {
        zd_value_t *v;
        if (zd_rref_rpc_sync(n->shard[k], "NetShard.stats", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
            return -1;
        int rc = zd_rpc_arg_float(v, 0, &seconds[k]);
        zd_value_unref(v);
        if (rc < 0)
            return -1;
    }
    return 0;
}
