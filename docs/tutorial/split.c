/* SPDX-License-Identifier: MIT */
/*  split: a small model split over two processes, trained with distributed
    autograd and the DistributedOptimizer.

    worker1 owns the first layer (fc1: 4 -> 16, then relu) and serves it
    behind an RRef; worker0 holds the second layer (fc2: 16 -> 1) and the
    data, and trains:

        h    = relu(fc1(x))        on worker1, through an RPC
        y    = fc2(h)              on worker0
        loss = mean((y - t)^2)

    Run as a world of two processes:  launch --nproc=2 --no_rank_flags -- ./split */
#include <stdio.h>
#include <stdlib.h>
#include <zdist/zdist.h>

#define IN 4
#define HIDDEN 16
#define N 32          /* samples */
#define STEPS 20

/*  A linear layer: weight (out, in) and bias (out), leaves that require
    grad, initialised as PyTorch's nn.Linear. */
typedef struct {
    zd_tensor_t *weight, *bias;
} layer_t;

static void layer_free(void *p)
{
    layer_t *l = p;
    zd_tensor_unref(l->weight);
    zd_tensor_unref(l->bias);
    free(l);
}

static layer_t *layer_create(int64_t in, int64_t out, uint64_t seed)
{
    layer_t *l = calloc(1, sizeof *l);
    if (!l) {
        zd_error_set("out of memory");
        return NULL;
    }
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    l->weight = zd_tensor_zeros2(out, in);
    l->bias = zd_tensor_zeros1(out);
    if (!l->weight || !l->bias || zd_nn_init_default(l->weight, l->bias, &rng) < 0 ||
        zd_tensor_set_requires_grad(l->weight, true) < 0 ||
        zd_tensor_set_requires_grad(l->bias, true) < 0) {
        layer_free(l);
        return NULL;
    }
    return l;
}

/*  An RRef owned by this process, holding t: PyTorch's RRef(param). */
static zd_rref_t *param_rref(zd_tensor_t *t)
{
    zd_value_t *v = zd_value_tensor(t);
    zd_rref_t *r = v ? zd_rref_new(v) : NULL;
    zd_value_unref(v);
    return r;
}

/*  ---- worker1's functions ---- */

/*  "Layer.new"(in, out, seed): a new layer, as an object value. Called with
    zd_rpc_remote, the object stays here and the caller gets an RRef. */
static zd_value_t *layer_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t in, out, seed;
    if (ZD_UNPACK(args, &in, &out, &seed) < 0)
        return NULL;   /* the caller gets "argument 2: expected int, got ..." */
    layer_t *l = layer_create(in, out, (uint64_t)seed);
    return l ? zd_value_object(l, layer_free, "Layer") : NULL;
}

/*  "Layer.forward"(layer, x): relu(x weight^T + bias). Called through the
    RRef, the layer object comes first. Distributed autograd records the
    call: the result's gradient will come back here. */
static zd_value_t *layer_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self;
    void *obj;
    zd_tensor_t *x, *y, *h;
    if (ZD_UNPACK(args, &self, &x) < 0 || zd_value_get_object(self, "Layer", &obj) < 0)
        return NULL;
    layer_t *l = obj;
    if (zd_nn_linear(x, l->weight, l->bias, &y) < 0)
        return NULL;
    int rc = zd_nn_relu(y, &h);
    zd_tensor_unref(y);   /* the graph keeps what backward needs */
    if (rc < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(h);
    zd_tensor_unref(h);
    return v;
}

/*  "Layer.parameter_rrefs"(layer): [RRef(weight), RRef(bias)]. */
static zd_value_t *layer_parameter_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self;
    void *obj;
    if (ZD_UNPACK(args, &self) < 0 || zd_value_get_object(self, "Layer", &obj) < 0)
        return NULL;
    layer_t *l = obj;
    zd_rref_t *w = param_rref(l->weight), *b = param_rref(l->bias);
    zd_value_t *list = w && b ? ZD_ARGS(w, b) : NULL;   /* the list takes its own references */
    zd_rref_unref(w);
    zd_rref_unref(b);
    return list;
}

/*  ---- worker0: the trainer ---- */

/*  Forward and backward of one step in context ctx; *loss_out gets the loss. */
static int forward_backward(int64_t ctx, zd_rref_t *fc1, layer_t *fc2, zd_tensor_t *x,
                            zd_tensor_t *target, float *loss_out)
{
    zd_value_t *reply = NULL;
    zd_tensor_t *h, *y = NULL, *diff = NULL, *sq = NULL, *loss = NULL;
    int rc = -1;
    if (zd_rref_rpc_sync_take(fc1, "Layer.forward", ZD_ARGS(x), ZD_TIMEOUT_DEFAULT,
                              &reply) == 0 &&
        zd_value_get_tensor(reply, &h) == 0 &&   /* h is borrowed from reply */
        zd_nn_linear(h, fc2->weight, fc2->bias, &y) == 0 &&
        zd_tensor_sub(y, target, &diff) == 0 &&
        zd_tensor_mul(diff, diff, &sq) == 0 &&
        zd_tensor_mean(sq, &loss) == 0 &&
        zd_dist_autograd_backward(ctx, &loss, 1, false) == 0) {
        *loss_out = zd_tensor_data(loss)[0];
        rc = 0;
    }
    zd_value_unref(reply);
    zd_tensor_unref(y);
    zd_tensor_unref(diff);
    zd_tensor_unref(sq);
    zd_tensor_unref(loss);
    return rc;
}

/*  Random inputs in [-1, 1) and a target the model can learn:
    t = relu(x0 - x1) + 0.5 x2 x3. */
static int make_data(zd_tensor_t **x, zd_tensor_t **target)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, 7);
    *x = zd_tensor_zeros2(N, IN);
    *target = zd_tensor_zeros2(N, 1);
    if (!*x || !*target || zd_nn_init_uniform(*x, -1.0f, 1.0f, &rng) < 0)
        return -1;
    const float *xv = zd_tensor_data(*x);
    float *tv = zd_tensor_data(*target);
    for (int i = 0; i < N; i++) {
        const float *r = xv + i * IN;
        tv[i] = (r[0] > r[1] ? r[0] - r[1] : 0.0f) + 0.5f * r[2] * r[3];
    }
    return 0;
}

static int train(void)
{
    int rc = -1;
    zd_rref_t *fc1 = NULL, *w1, *b1, *w2 = NULL, *b2 = NULL;
    zd_rref_list_t *params = zd_rref_list_new();
    zd_value_t *reply = NULL;
    zd_dist_optim_t *opt = NULL;
    zd_tensor_t *x = NULL, *target = NULL;
    layer_t *fc2 = layer_create(HIDDEN, 1, 2);

    /* fc1 lives on worker1: zd_rpc_remote_take returns an RRef at once. */
    fc1 = zd_rpc_remote_take(zd_rpc_worker("worker1"), "Layer.new", ZD_ARGS(IN, HIDDEN, 1),
                             ZD_TIMEOUT_DEFAULT);
    if (!params || !fc2 || !fc1 || make_data(&x, &target) < 0)
        goto out;

    /* The parameters to optimise, in one list: RRefs to fc1's (on worker1)
       and fc2's (here). The list takes its own references. */
    if (zd_rref_rpc_sync(fc1, "Layer.parameter_rrefs", NULL, ZD_TIMEOUT_DEFAULT, &reply) < 0 ||
        ZD_UNPACK(reply, &w1, &b1) < 0)
        goto out;
    w2 = param_rref(fc2->weight);
    b2 = param_rref(fc2->bias);
    if (!w2 || !b2 || zd_rref_list_append(params, w1) < 0 ||
        zd_rref_list_append(params, b1) < 0 || zd_rref_list_append(params, w2) < 0 ||
        zd_rref_list_append(params, b2) < 0)
        goto out;
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.1);
    if (!(opt = zd_dist_optim_new(&cfg, params)))
        goto out;

    for (int step = 1; step <= STEPS; step++) {
        float loss = 0;
        int step_rc = -1;   /* stays -1 if the context could not begin */
        /* One context per step, released (here and on worker1) as the block ends. */
        ZD_DIST_AUTOGRAD_CONTEXT(ctx) {
            step_rc = forward_backward(ctx, fc1, fc2, x, target, &loss);
            if (step_rc == 0)
                step_rc = zd_dist_optim_step(opt, ctx);   /* both owners, at once */
        }
        if (step_rc < 0)
            goto out;
        printf("step %2d loss %.4f\n", step, loss);
    }
    /* The releases went out without waiting: check that all arrived. */
    if (zd_dist_autograd_wait_releases(ZD_TIMEOUT_DEFAULT) < 0)
        goto out;
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "train: %s\n", zd_error_last());
    zd_dist_optim_free(opt);
    zd_rref_list_free(params);
    zd_rref_unref(w2);
    zd_rref_unref(b2);
    zd_value_unref(reply);
    zd_rref_unref(fc1);   /* worker1 frees the layer once no one holds it */
    zd_tensor_unref(x);
    zd_tensor_unref(target);
    if (fc2)
        layer_free(fc2);
    return rc;
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);   /* lines as they come, under launch too */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);   /* first thing: tunes malloc and OpenBLAS */
    /* On every process, before zd_rpc_init: the functions it serves, then
       distributed autograd, then the DistributedOptimizer's functions. */
    if (zd_rpc_register("Layer.new", layer_new, NULL) < 0 ||
        zd_rpc_register("Layer.forward", layer_forward, NULL) < 0 ||
        zd_rpc_register("Layer.parameter_rrefs", layer_parameter_rrefs, NULL) < 0 ||
        zd_dist_autograd_init() < 0 || zd_dist_optim_init() < 0 ||
        zd_rpc_init(NULL, -1, 0, NULL) < 0) {
        fprintf(stderr, "split: %s\n", zd_error_last());
        return 1;
    }
    int rc = zd_rpc_rank() == 0 ? train() : 0;   /* worker1 only serves */
    /* Waits for the other worker (by default without limit), then closes. */
    if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, "split: %s\n", zd_error_last());
        rc = -1;
    }
    return rc < 0 ? 1 : 0;
}
