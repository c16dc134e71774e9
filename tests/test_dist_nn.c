/* SPDX-License-Identifier: MIT */
/*  Modules over RPC between real processes: parameter RRefs and RemoteModule
    (SPEC N5, R14) trained by distributed autograd and the
    DistributedOptimizer, with the numbers SGD gives checked on the owner;
    RRef.backward (R15) from a loss held by another process and by this
    one; a RemoteModule forward with several outputs; the errors of
    RemoteModule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_nn.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include <zdist/rnn.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"

#define LR 0.125

/*  Deterministic values, so that the test computes the expected numbers. */
static float w_init(int which, int i, int j)
{
    return 0.25f * (float)(i + 1) - 0.125f * (float)j + (float)which;
}
static float b_init(int which, int i)
{
    return 0.5f * (float)i - (float)which;
}

static void fill_linear(zd_nn_module_t *m, int which)
{
    zd_tensor_t *w = zd_nn_module_find(m, "weight"), *b = zd_nn_module_find(m, "bias");
    int64_t out = zd_tensor_size(w, 0), in = zd_tensor_size(w, 1);
    for (int64_t i = 0; i < out; i++) {
        for (int64_t j = 0; j < in; j++)
            zd_tensor_data(w)[i * in + j] = w_init(which, (int)i, (int)j);
        zd_tensor_data(b)[i] = b_init(which, (int)i);
    }
}

/*  "Linear"(in, out, which): a Linear with the values above. */
static zd_nn_module_t *make_linear(zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t in, out, which;
    if (ZD_UNPACK(args, &in, &out, &which) < 0)
        return NULL;
    zd_rng_t rng;
    zd_rng_seed(&rng, 1);
    zd_nn_module_t *m = zd_nn_linear_new(in, out, true, &rng);
    if (m)
        fill_linear(m, (int)which);
    return m;
}

/*  "LSTM"(in, hidden, seed): PyTorch's nn.LSTM, one layer, whose forward
    gives three outputs (output, h_n, c_n). */
static zd_nn_module_t *make_lstm(zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t in, hidden, seed;
    if (ZD_UNPACK(args, &in, &hidden, &seed) < 0)
        return NULL;
    return zd_nn_lstm_new(in, hidden, 1, 0.0f, (uint64_t)seed);
}

static zd_nn_module_t *make_refusing(zd_value_t *args, void *arg)
{
    (void)args, (void)arg;
    zd_error_set("this constructor says no");
    return NULL;
}

/*  Called through a RemoteModule's RRef: copies of the module's parameters. */
static zd_value_t *fn_read_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_nn_module_t *m;
    if (zd_remote_module_local(zd_list_get(args, 0), &m) < 0)
        return NULL;
    zd_value_t *list = zd_value_list(2);
    for (int i = 0; i < zd_nn_module_n_params(m); i++) {
        zd_tensor_t *c = zd_tensor_detach_copy(zd_nn_module_param(m, i));
        zd_list_append(list, zd_value_tensor(c));
        zd_tensor_unref(c);
    }
    return list;
}

/*  R15: loss = sum(x * w_loss), kept where it is computed. */
static zd_tensor_t *w_loss;

static zd_value_t *fn_remote_loss(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x, *p, *loss = NULL;
    if (ZD_UNPACK(args, &x) < 0 || zd_tensor_mul(x, w_loss, &p) < 0)
        return NULL;
    int rc = zd_tensor_sum(p, &loss);
    zd_tensor_unref(p);
    if (rc < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(loss);
    zd_tensor_unref(loss);
    return v;
}

/*  The gradient of w_loss in a context, read on its owner. */
static zd_value_t *fn_w_loss_grad(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t ctx;
    zd_tensor_t *g;
    if (ZD_UNPACK(args, &ctx) < 0 || zd_dist_autograd_get_gradient(ctx, w_loss, &g) < 0)
        return NULL;
    if (!g)
        return zd_value_none();
    zd_value_t *v = zd_value_tensor(g);
    zd_tensor_unref(g);
    return v;
}

/*  "Probe"(in, out, which): the Linear above, whose forward also takes the
    steps' read lock itself (as a forward that copies parameters does:
    inside the guard that only counts, where a second lock behind a
    waiting step deadlocked), after watching the steps' count for a while:
    a step that ran meanwhile is its error. Without the guard the other
    trainer's steps land in that window. */
#define PROBE_WATCH_NS 3000000

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int probe_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                         int n_out)
{
    zd_nn_module_t *linear = zd_nn_module_state(m);
    uint64_t before = zd_dist_optim_version();
    int64_t until = now_ns() + PROBE_WATCH_NS;
    while (now_ns() < until)
        if (zd_dist_optim_version() != before)
            return zd_error_set("a step ran during the forward");
    zd_dist_optim_read_lock();
    int rc = zd_nn_module_forward(linear, in, n_in, out, n_out);
    zd_dist_optim_read_unlock();
    return rc;
}

static void probe_free(void *linear)
{
    zd_nn_module_free(linear);
}

static zd_nn_module_t *make_probe(zd_value_t *args, void *arg)
{
    zd_nn_module_t *linear = make_linear(args, arg);
    zd_nn_module_t *m =
        linear ? zd_nn_module_new("Probe", probe_forward, linear, probe_free) : NULL;
    if (m &&
        (zd_nn_module_register_parameter(m, "weight", zd_nn_module_find(linear, "weight")) < 0 ||
         zd_nn_module_register_parameter(m, "bias", zd_nn_module_find(linear, "bias")) < 0)) {
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

static int setup(const world_t *w)
{
    int64_t n = 3;
    float v[3] = {2.0f + (float)w->rank, -1.0f, 0.5f};
    w_loss = zd_tensor_from_data(ZD_FLOAT32, &n, 1, v);
    zd_tensor_set_requires_grad(w_loss, true);
    if (zd_dist_optim_init() < 0 || zd_dist_nn_init() < 0 ||
        zd_dist_nn_register_module("Linear", make_linear, NULL) < 0 ||
        zd_dist_nn_register_module("LSTM", make_lstm, NULL) < 0 ||
        zd_dist_nn_register_module("Refusing", make_refusing, NULL) < 0 ||
        zd_dist_nn_register_module("Probe", make_probe, NULL) < 0)
        return -1;
    return zd_rpc_register("read_params", fn_read_params, NULL) |
        zd_rpc_register("remote_loss", fn_remote_loss, NULL) |
        zd_rpc_register("w_loss_grad", fn_w_loss_grad, NULL);
}

static bool near(double a, double b)
{
    return fabs(a - b) <= 1e-5 * (1.0 + fabs(b));
}

/*  x (1,3) -> local Linear(3,4) on rank 0 -> h (1,4) -> RemoteModule
    Linear(4,2) on rank 1 -> y (1,2) -> loss = sum(y); one SGD step over
    both modules' parameters through one DistributedOptimizer. */
static int train_step_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    const float xv[3] = {1.0f, -2.0f, 0.5f};
    zd_rng_t rng;
    zd_rng_seed(&rng, 1);
    zd_nn_module_t *local = zd_nn_linear_new(3, 4, true, &rng);
    WCHECK(local);
    fill_linear(local, 0);
    zd_remote_module_t *rm = zd_remote_module_new(1, "Linear", ZD_ARGS(4, 2, 1));
    WCHECK(rm);
    WCHECK(zd_remote_module_owner(rm) == 1);

    /* A tied weight (one tensor registered twice) gets one RRef, as
       PyTorch's parameters() lists it once. */
    int64_t two = 2;
    zd_nn_module_t *tied = zd_nn_module_new("Tied", NULL, NULL, NULL);
    zd_tensor_t *tw = zd_tensor_new(ZD_FLOAT32, &two, 1);
    WCHECK(tied && tw);
    WTRY(zd_nn_module_register_parameter(tied, "a", tw));
    WTRY(zd_nn_module_register_parameter(tied, "b", tw));
    zd_rref_list_t *tl = zd_dist_nn_parameter_rrefs(tied);
    WCHECK(tl && zd_rref_list_len(tl) == 1);
    zd_rref_list_free(tl);
    zd_tensor_unref(tw);
    zd_nn_module_free(tied);
    WCHECK(!zd_dist_nn_parameter_rrefs(NULL) && zd_error_code() == ZD_ERR_ARGUMENT);

    /* The optimizer over both: local RRefs and the remote module's,
       gathered as PyTorch's params.extend(m.remote_parameters()). */
    zd_rref_list_t *lr = zd_dist_nn_parameter_rrefs(local);
    zd_rref_list_t *rr = zd_remote_module_remote_parameters(rm);
    zd_rref_list_t *all = zd_rref_list_new();
    WCHECK(lr && rr && all);
    WCHECK(zd_rref_list_len(lr) == 2 && zd_rref_list_len(rr) == 2);
    WCHECK(zd_rref_is_owner(zd_rref_list_get(lr, 0)));
    WCHECK(!zd_rref_is_owner(zd_rref_list_get(rr, 0)) &&
           zd_rref_owner(zd_rref_list_get(rr, 0)) == 1);
    WTRY(zd_rref_list_extend(all, lr));
    WTRY(zd_rref_list_extend(all, rr));
    WCHECK(zd_rref_list_len(all) == 4 && zd_rref_list_get(all, 2) == zd_rref_list_get(rr, 0));
    /* The same RRefs again change nothing: each value is listed once. */
    WTRY(zd_rref_list_extend(all, rr));
    WTRY(zd_rref_list_append(all, zd_rref_list_get(lr, 1)));
    WCHECK(zd_rref_list_len(all) == 4 && !zd_rref_list_get(all, 4) && !zd_rref_list_get(all, -1));
    zd_optim_config_t cfg = zd_optim_sgd_defaults(LR);
    zd_dist_optim_t *opt = zd_dist_optim_new(&cfg, all);
    WCHECK(opt);
    WCHECK(zd_dist_optim_num_owners(opt) == 2);

    /* Expected numbers, in doubles. */
    double h[4], dh[4];
    for (int k = 0; k < 4; k++) {
        h[k] = b_init(0, k);
        for (int j = 0; j < 3; j++)
            h[k] += (double)w_init(0, k, j) * xv[j];
        dh[k] = 0;
        for (int i = 0; i < 2; i++)
            dh[k] += w_init(1, i, k);
    }
    double y[2];
    for (int i = 0; i < 2; i++) {
        y[i] = b_init(1, i);
        for (int k = 0; k < 4; k++)
            y[i] += (double)w_init(1, i, k) * h[k];
    }

    int rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        int64_t one_three[2] = {1, 3};
        zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, one_three, 2, xv), *hh = NULL, *yy = NULL,
                    *loss = NULL;
        if (zd_nn_module_forward(local, &x, 1, &hh, 1) == 0 &&
            zd_remote_module_forward(rm, &hh, 1, &yy, 1) == 0 && zd_tensor_sum(yy, &loss) == 0 &&
            near(zd_tensor_data(yy)[0], y[0]) && near(zd_tensor_data(yy)[1], y[1]) &&
            zd_dist_autograd_backward(ctx, &loss, 1, false) == 0 &&
            zd_dist_optim_step(opt, ctx) == 0)
            rc = 0;
        else
            world_fail(w, "step: %s", zd_error_last());
        zd_tensor_unref(loss);
        zd_tensor_unref(yy);
        zd_tensor_unref(hh);
        zd_tensor_unref(x);
    }
    WTRY(rc);

    /* The local parameters, stepped here. */
    zd_tensor_t *w0 = zd_nn_module_find(local, "weight"), *b0 = zd_nn_module_find(local, "bias");
    for (int k = 0; k < 4; k++) {
        for (int j = 0; j < 3; j++)
            WCHECK(near(zd_tensor_data(w0)[k * 3 + j], w_init(0, k, j) - LR * dh[k] * xv[j]));
        WCHECK(near(zd_tensor_data(b0)[k], b_init(0, k) - LR * dh[k]));
    }
    /* The remote ones, read on their owner: dL/dW1[i][k] = h[k], dL/db1 = 1. */
    zd_value_t *p;
    WTRY(zd_rref_rpc_sync(zd_remote_module_rref(rm), "read_params", NULL, ZD_TIMEOUT_DEFAULT, &p));
    zd_tensor_t *w1, *b1;
    WTRY(zd_rpc_arg_tensor(p, 0, &w1));
    WTRY(zd_rpc_arg_tensor(p, 1, &b1));
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < 4; k++)
            WCHECK(near(zd_tensor_data(w1)[i * 4 + k], w_init(1, i, k) - LR * h[k]));
        WCHECK(near(zd_tensor_data(b1)[i], b_init(1, i) - LR));
    }
    zd_value_unref(p);

    /* forward_async: the stepped module's output, as a future. */
    int64_t one_four[2] = {1, 4};
    float ones[4] = {1, 1, 1, 1};
    zd_tensor_t *x1 = zd_tensor_from_data(ZD_FLOAT32, one_four, 2, ones);
    zd_future_t *f = zd_remote_module_forward_async(rm, &x1, 1, 1);
    WCHECK(f);
    WTRY(zd_future_wait(f, ZD_TIMEOUT_NONE));
    zd_tensor_t *ya;
    WTRY(zd_value_get_tensor(zd_future_value(f), &ya));
    for (int i = 0; i < 2; i++) {
        double e = b_init(1, i) - LR;
        for (int k = 0; k < 4; k++)
            e += w_init(1, i, k) - LR * h[k];
        WCHECK(near(zd_tensor_data(ya)[i], e));
    }
    zd_future_unref(f);
    zd_tensor_unref(x1);

    zd_dist_optim_free(opt);
    zd_rref_list_free(all);
    zd_rref_list_free(lr);
    zd_rref_list_free(rr);
    zd_remote_module_free(rm);
    zd_nn_module_free(local);
    zd_tensor_unref(w_loss);
    return 0;
}

static void test_remote_module_trains_with_dist_optim(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = setup, .fn = train_step_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  Whether a and b hold the same numbers (to rounding). */
static bool same_numbers(const zd_tensor_t *a, const zd_tensor_t *b)
{
    if (!a || !b || zd_tensor_numel(a) != zd_tensor_numel(b))
        return false;
    for (int64_t i = 0; i < zd_tensor_numel(a); i++)
        if (!near(zd_tensor_data(a)[i], zd_tensor_data(b)[i]))
            return false;
    return true;
}

/*  loss = sum(outs[0]) + sum(outs[1]). 0 and *loss, or -1. */
static int sum_two(zd_tensor_t *const *outs, zd_tensor_t **loss)
{
    zd_tensor_t *s0 = NULL, *s1 = NULL;
    int rc = zd_tensor_sum(outs[0], &s0) == 0 && zd_tensor_sum(outs[1], &s1) == 0 &&
            zd_tensor_add(s0, s1, loss) == 0
        ? 0
        : -1;
    zd_tensor_unref(s0);
    zd_tensor_unref(s1);
    return rc;
}

/*  A forward with several outputs on another process: an LSTM on rank 1
    gives the first n_out of (output, h_n, c_n) with the numbers of the same
    LSTM here; forward_async's future completes with a list of them; more
    outputs than the module gives is the owner's error; a loss over two
    outputs back-propagates through the owner to the input here, giving
    the local LSTM's gradient. */
static int multi_output_body(const world_t *w)
{
    if (w->rank != 0)
        return 0; /* serves; w_loss stays for the handlers */
    enum { T = 3, N = 2, I = 4, H = 5 };
    zd_nn_module_t *local = zd_nn_lstm_new(I, H, 1, 0.0f, 7);
    zd_remote_module_t *rm = zd_remote_module_new(1, "LSTM", ZD_ARGS(I, H, 7));
    WCHECK(local && rm);
    int64_t shape[3] = {T, N, I};
    float xv[T * N * I];
    for (int i = 0; i < T * N * I; i++)
        xv[i] = 0.125f * (float)(i % 7) - 0.375f;
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, shape, 3, xv);
    WCHECK(x);
    zd_tensor_t *want[3] = {NULL, NULL, NULL}, *got[3] = {NULL, NULL, NULL};
    WTRY(zd_nn_module_forward(local, &x, 1, want, 3));

    WTRY(zd_remote_module_forward(rm, &x, 1, got, 2));
    WCHECK(same_numbers(got[0], want[0]) && same_numbers(got[1], want[1]) && !got[2]);
    zd_tensor_unref_p(&got[0]);
    zd_tensor_unref_p(&got[1]);
    WTRY(zd_remote_module_forward(rm, &x, 1, got, 3));
    for (int k = 0; k < 3; k++) {
        WCHECK(same_numbers(got[k], want[k]));
        zd_tensor_unref_p(&got[k]);
    }

    /* The LSTM gives three: a fourth is the owner's error, and no output. */
    zd_tensor_t *four[4];
    WCHECK(zd_remote_module_forward(rm, &x, 1, four, 4) == -1);
    WCHECK(!four[0] && !four[1] && !four[2] && !four[3]);
    WCHECK(strstr(zd_error_last(), "RemoteModule LSTM forward"));
    WCHECK(zd_remote_module_forward(rm, &x, 1, four, 0) == -1 &&
           zd_error_code() == ZD_ERR_ARGUMENT);
    WCHECK(!zd_remote_module_forward_async(rm, &x, 1, 0) && zd_error_code() == ZD_ERR_ARGUMENT);

    /* forward_async: a list value of the n_out tensors */
    zd_future_t *f = zd_remote_module_forward_async(rm, &x, 1, 2);
    WCHECK(f);
    WTRY(zd_future_wait(f, ZD_TIMEOUT_NONE));
    zd_tensor_t *a0, *a1;
    WCHECK(zd_list_len(zd_future_value(f)) == 2);
    WTRY(zd_rpc_arg_tensor(zd_future_value(f), 0, &a0));
    WTRY(zd_rpc_arg_tensor(zd_future_value(f), 1, &a1));
    WCHECK(same_numbers(a0, want[0]) && same_numbers(a1, want[1]));
    zd_future_unref(f);

    /* Backward through both outputs: dL/dx as the local LSTM gives it. */
    zd_tensor_t *xl = zd_tensor_detach_copy(x), *lo[2] = {NULL, NULL}, *loss = NULL, *gl = NULL;
    WCHECK(xl);
    zd_tensor_set_requires_grad(xl, true);
    WTRY(zd_nn_module_forward(local, &xl, 1, lo, 2));
    WTRY(sum_two(lo, &loss));
    WTRY(zd_autograd_backward(loss, NULL, false));
    WCHECK((gl = zd_tensor_grad(xl)));
    zd_tensor_unref_p(&loss);
    int rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        zd_tensor_t *xr = zd_tensor_detach_copy(x), *ro[2] = {NULL, NULL}, *rl = NULL, *g = NULL;
        if (xr)
            zd_tensor_set_requires_grad(xr, true);
        if (xr && zd_remote_module_forward(rm, &xr, 1, ro, 2) == 0 && sum_two(ro, &rl) == 0 &&
            zd_dist_autograd_backward(ctx, &rl, 1, false) == 0 &&
            zd_dist_autograd_get_gradient(ctx, xr, &g) == 0 && same_numbers(g, gl))
            rc = 0;
        else
            world_fail(w, "backward through two outputs: %s", zd_error_last());
        zd_tensor_unref(g);
        zd_tensor_unref(rl);
        zd_tensor_unref(ro[0]);
        zd_tensor_unref(ro[1]);
        zd_tensor_unref(xr);
    }
    WTRY(rc);

    zd_tensor_unref(gl);
    zd_tensor_unref(lo[0]);
    zd_tensor_unref(lo[1]);
    zd_tensor_unref(xl);
    for (int k = 0; k < 3; k++)
        zd_tensor_unref(want[k]);
    zd_tensor_unref(x);
    zd_remote_module_free(rm);
    zd_nn_module_free(local);
    zd_tensor_unref(w_loss);
    return 0;
}

static void test_remote_module_multi_output(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = setup, .fn = multi_output_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  Errors: each names the worker and the cause; nothing is left behind. */
static int errors_body(const world_t *w)
{
    if (w->rank != 0)
        return 0; /* serves; w_loss stays for the handlers */
    WCHECK(!zd_remote_module_new(1, "Conv9d", ZD_ARGS(1)));
    WCHECK(strstr(zd_error_last(), "unknown module type \"Conv9d\""));
    WCHECK(strstr(zd_error_last(), "registered: "));
    WCHECK(!zd_remote_module_new(1, "Refusing", NULL));
    WCHECK(strstr(zd_error_last(), "this constructor says no"));
    WCHECK(!zd_remote_module_new(1, "Linear", ZD_ARGS("four", 2, 0)));
    WCHECK(strstr(zd_error_last(), "argument 0"));
    WCHECK(!zd_remote_module_new(7, "Linear", ZD_ARGS(4, 2, 0)));
    WCHECK(!zd_remote_module_new(1, NULL, ZD_ARGS(4, 2, 0)));

    zd_tensor_t *out = NULL;
    WCHECK(zd_remote_module_forward(NULL, NULL, 0, &out, 1) == -1 && !out);
    WCHECK(zd_error_code() == ZD_ERR_ARGUMENT);
    WCHECK(!zd_remote_module_forward_async(NULL, NULL, 0, 1));

    zd_remote_module_t *rm = zd_remote_module_new(1, "Linear", ZD_ARGS(4, 2, 0));
    WCHECK(rm);
    /* the owner's forward error comes back: two inputs, a wrong shape */
    int64_t s[2] = {1, 3};
    zd_tensor_t *x = zd_tensor_new(ZD_FLOAT32, s, 2), *two[2] = {x, x};
    WCHECK(zd_remote_module_forward(rm, two, 2, &out, 1) == -1 && !out);
    WCHECK(strstr(zd_error_last(), "Linear forward: takes 1 input, got 2"));
    WCHECK(zd_remote_module_forward(rm, &x, 1, &out, 1) == -1);
    WCHECK(strstr(zd_error_last(), "RemoteModule Linear forward"));
    /* a function called with the module RRef that wants another object */
    zd_value_t *r;
    WCHECK(zd_rref_rpc_sync(zd_remote_module_rref(rm), "w_loss_grad", NULL, -1, &r) == -1);
    /* the module dies with its last handle: its owner frees it */
    zd_remote_module_free(rm);
    zd_tensor_unref(x);
    WTRY(zd_rref_drain(10000));
    int64_t owned = -1;
    for (int64_t t0 = world_now_ms(); world_now_ms() - t0 < 10000;) {
        zd_value_t *v;
        WTRY(zd_rpc_sync(1, "owned", NULL, -1, &v));
        zd_value_get_int(v, &owned);
        zd_value_unref(v);
        if (owned == 0)
            break;
    }
    WCHECK(owned == 0);
    zd_tensor_unref(w_loss);
    return 0;
}

static zd_value_t *fn_owned(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(zd_rpc_debug_owner_rrefs());
}

static int errors_setup(const world_t *w)
{
    return setup(w) | zd_rpc_register("owned", fn_owned, NULL);
}

static void test_remote_module_errors(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = errors_setup, .fn = errors_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  R15: loss = sum(x * w_loss[1]) computed on rank 1 and kept there
    (rpc_remote); backward through the RRef from rank 0 brings dL/dx =
    w_loss[1] to rank 0's context and dL/dw = x to rank 1's. Then the same
    with a loss this process owns, in a context and with local autograd. */
static int rref_backward_body(const world_t *w)
{
    if (w->rank != 0)
        return 0; /* serves; w_loss stays for the handlers */
    int64_t n = 3;
    const float xv[3] = {1.5f, -2.0f, 4.0f};
    const float w1[3] = {3.0f, -1.0f, 0.5f}; /* rank 1's w_loss */
    int rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, &n, 1, xv), *g = NULL;
        zd_tensor_set_requires_grad(x, true);
        zd_rref_t *loss = zd_rpc_remote_take(1, "remote_loss", ZD_ARGS(x), ZD_TIMEOUT_DEFAULT);
        zd_value_t *wg = NULL;
        zd_tensor_t *wgt;
        if (loss && zd_rref_backward(loss, ctx, false) == 0 &&
            zd_dist_autograd_get_gradient(ctx, x, &g) == 0 && g &&
            zd_rpc_sync_take(1, "w_loss_grad", ZD_ARGS(ctx), -1, &wg) == 0 &&
            zd_value_get_tensor(wg, &wgt) == 0) {
            rc = 0;
            for (int i = 0; i < 3; i++)
                if (zd_tensor_data(g)[i] != w1[i] || zd_tensor_data(wgt)[i] != xv[i])
                    rc = world_fail(w, "gradient %d: %g %g", i, zd_tensor_data(g)[i],
                                    zd_tensor_data(wgt)[i]);
            /* the graph is gone: a second backward fails, naming why */
            if (rc == 0 && zd_rref_backward(loss, ctx, false) == 0)
                rc = world_fail(w, "a second backward succeeded");
        } else {
            world_fail(w, "remote RRef.backward: %s", zd_error_last());
        }
        zd_value_unref(wg);
        zd_tensor_unref(g);
        zd_rref_unref(loss);
        zd_tensor_unref(x);
    }
    WTRY(rc);

    /* A loss owned here, in a context: backward runs here. */
    rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, &n, 1, xv), *p = NULL, *l = NULL,
                    *g = NULL;
        zd_tensor_set_requires_grad(x, true);
        zd_value_t *lv = NULL;
        zd_rref_t *r = NULL;
        if (zd_tensor_mul(x, x, &p) == 0 && zd_tensor_sum(p, &l) == 0 &&
            (lv = zd_value_tensor(l)) && (r = zd_rref_new(lv)) &&
            zd_rref_backward(r, ctx, true) == 0 && zd_dist_autograd_get_gradient(ctx, x, &g) == 0 &&
            g) {
            rc = 0;
            for (int i = 0; i < 3; i++)
                if (zd_tensor_data(g)[i] != 2 * xv[i])
                    rc = world_fail(w, "local gradient %d: %g", i, zd_tensor_data(g)[i]);
            /* -1: local autograd, into .grad (the graph was retained) */
            zd_tensor_t *lg = NULL;
            if (rc == 0 &&
                (zd_rref_backward(r, -1, false) < 0 || !(lg = zd_tensor_grad(x)) ||
                 zd_tensor_data(lg)[2] != 2 * xv[2]))
                rc = world_fail(w, "RRef.backward(-1): %s", zd_error_last());
            zd_tensor_unref(lg);
        } else {
            world_fail(w, "local RRef.backward: %s", zd_error_last());
        }
        zd_tensor_unref(g);
        zd_rref_unref(r);
        zd_value_unref(lv);
        zd_tensor_unref(l);
        zd_tensor_unref(p);
        zd_tensor_unref(x);
    }
    WTRY(rc);
    WCHECK(zd_rref_backward(NULL, 1, false) == -1);
    zd_tensor_unref(w_loss);
    return 0;
}

/*  An owner that never called zd_dist_nn_init: the error says so. */
static int no_init_setup(const world_t *w)
{
    return w->rank == 1 ? 0 : setup(w);
}

static int no_init_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    WCHECK(!zd_remote_module_new(1, "Linear", ZD_ARGS(4, 2, 0)));
    /* As a missing zd_dist_optim_init(): the same code, the same words. */
    WCHECK(zd_error_code() == ZD_ERR_NOT_INITIALIZED);
    WCHECK(strstr(zd_error_last(),
                  "zd_dist_nn_init() was not called on \"worker1\" before "
                  "zd_rpc_init()"));
    zd_tensor_unref(w_loss);
    return 0;
}

static void test_remote_module_owner_without_init(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = no_init_setup, .fn = no_init_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

static void test_rref_backward(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 2, .setup = setup, .fn = rref_backward_body, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- two trainers' forwards and steps on one RemoteModule at once ---- */

/*  A Probe(256, 256) on rank 0; two threads of rank 1 each run
    SHARED_STEPS of forward, backward and a DistributedOptimizer step of
    their own on it, at once. x is constant and does not need a gradient,
    so the forward on the owner is the only reader of the weight, and
    every step subtracts lr * batch * x from each element whatever the
    order: the numbers are exact (powers of two). Without the guard
    around the owner's forward, the probe saw the other thread's steps
    (and TSan reported the race). */
#define SHARED_DIM   256
#define SHARED_BATCH 8
#define SHARED_STEPS 24
#define SHARED_LR    0.0078125 /* 2^-7 */
#define SHARED_X     0.5f

typedef struct {
    zd_remote_module_t *rm;
    int rc;
    char error[256];
    int extra_forwards; /* before each step's own */
} shared_trainer_t;

static void *shared_trainer(void *arg)
{
    shared_trainer_t *t = arg;
    zd_rref_list_t *params = zd_remote_module_remote_parameters(t->rm);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(SHARED_LR);
    zd_dist_optim_t *opt = params ? zd_dist_optim_new(&cfg, params) : NULL;
    int64_t shape[2] = {SHARED_BATCH, SHARED_DIM};
    zd_tensor_t *x = zd_tensor_new(ZD_FLOAT32, shape, 2);
    t->rc = opt && x ? 0 : -1;
    if (x)
        zd_tensor_fill_(x, SHARED_X);
    for (int s = 0; s < SHARED_STEPS && t->rc == 0; s++) {
        int64_t ctx;
        zd_tensor_t *y = NULL, *loss = NULL;
        if (zd_dist_autograd_context_begin(&ctx) < 0) {
            t->rc = -1;
            break;
        }
        /* The second thread runs an evaluation-like forward first (its
           output unused): the two threads' steps then fall in each
           other's forwards, not in step with them. */
        for (int k = 0; t->rc == 0 && k < t->extra_forwards; k++) {
            zd_tensor_t *unused = NULL;
            if (zd_remote_module_forward(t->rm, &x, 1, &unused, 1) < 0)
                t->rc = -1;
            zd_tensor_unref(unused);
        }
        if (t->rc < 0 || zd_remote_module_forward(t->rm, &x, 1, &y, 1) < 0 ||
            zd_tensor_sum(y, &loss) < 0 || zd_dist_autograd_backward(ctx, &loss, 1, false) < 0 ||
            zd_dist_optim_step(opt, ctx) < 0)
            t->rc = -1;
        if (zd_dist_autograd_context_end(ctx, -1) < 0)
            t->rc = -1;
        zd_tensor_unref(loss);
        zd_tensor_unref(y);
    }
    if (t->rc < 0)
        snprintf(t->error, sizeof t->error, "%s", zd_error_last());
    zd_tensor_unref(x);
    zd_dist_optim_free(opt);
    zd_rref_list_free(params);
    return NULL;
}

static int shared_body(const world_t *w)
{
    if (w->rank != 1)
        return 0;
    zd_remote_module_t *rm = zd_remote_module_new(0, "Probe", ZD_ARGS(SHARED_DIM, SHARED_DIM, 0));
    WCHECK(rm);
    shared_trainer_t t[2] = {{.rm = rm}, {.rm = rm, .extra_forwards = 1}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        WCHECK(pthread_create(&th[i], NULL, shared_trainer, &t[i]) == 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        if (t[i].rc < 0)
            return world_fail(w, "trainer thread %d: %s", i, t[i].error);
    /* Every step of both: dW[i][j] = batch * x, db[i] = batch. */
    const double steps = 2.0 * SHARED_STEPS;
    zd_value_t *p;
    WTRY(zd_rref_rpc_sync(zd_remote_module_rref(rm), "read_params", NULL, ZD_TIMEOUT_DEFAULT, &p));
    zd_tensor_t *wt, *bt;
    WTRY(zd_rpc_arg_tensor(p, 0, &wt));
    WTRY(zd_rpc_arg_tensor(p, 1, &bt));
    for (int i = 0; i < SHARED_DIM; i++) {
        for (int j = 0; j < SHARED_DIM; j += 51)
            WCHECK(zd_tensor_data(wt)[i * SHARED_DIM + j] ==
                   (float)(w_init(0, i, j) - steps * SHARED_LR * SHARED_BATCH * SHARED_X));
        WCHECK(zd_tensor_data(bt)[i] == (float)(b_init(0, i) - steps * SHARED_LR * SHARED_BATCH));
    }
    zd_value_unref(p);
    zd_remote_module_free(rm);
    return 0;
}

static void test_two_trainers_share_a_remote_module(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2,
                         .setup = setup,
                         .fn = shared_body,
                         .dist_autograd = true,
                         .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_remote_module_trains_with_dist_optim),
        cmocka_unit_test(test_remote_module_multi_output),
        cmocka_unit_test(test_remote_module_errors),
        cmocka_unit_test(test_remote_module_owner_without_init),
        cmocka_unit_test(test_rref_backward),
        cmocka_unit_test(test_two_trainers_share_a_remote_module),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
