/* SPDX-License-Identifier: MIT */
/*  bench_dist: what the distributed machinery costs.

        bench_dist [--csv] [--iters=N]

    Starts two processes on this machine (a server, rank 0, and a trainer,
    rank 1) and measures, on the trainer:
      - the tutorial Net, batch 32: forward on the server over RPC, loss on
        the trainer, distributed backward; next to the same forward, loss and
        backward in one process (dist_iter_ms, local_iter_ms; medians);
      - a tiny model (a 10x10 linear layer on the server, one row of input):
        context + forward over RPC + distributed backward + context end
        (dist_tiny_us_p50), and the same plus a DistributedOptimizer step
        (dist_tiny_step_us_p50).
    Contexts end with zd_dist_autograd_context_release, which does not wait
    for the peers' confirmation, as PyTorch's context exit does not; the
    releases still run, at most 16 in flight, and are waited for (untimed)
    after each block of Net iterations and each tiny loop, before its
    figure is printed. The Net loops alternate in blocks, in turns going
    first, the first block of each a warm-up: the first iterations pay for
    page faults on fresh heap pages, which on the server go on for a few
    dozen. (Before 2026-11-22 the Net loop waited for each release and the
    loops ran one after the other: those ratios are not comparable.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/dist_optim.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"

/*  Net iterations per loop, run in alternating blocks of NET_BLOCK; the
    first block of each is a warm-up (see above). */
#define NET_BLOCK 10
static int iters = 2000, net_iters = 60;
static bool csv;
static zd_nn_module_t *net;
static zd_tensor_t *tiny_w, *tiny_b;

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/*  ---- server functions ---- */

static zd_value_t *fn_net_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x, *out;
    if (zd_rpc_arg_tensor(args, 0, &x) < 0 || zd_nn_module_forward(net, &x, 1, &out, 1) < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(out);
    zd_tensor_unref(out);
    return v;
}

static zd_value_t *fn_tiny_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x, *out;
    if (zd_rpc_arg_tensor(args, 0, &x) < 0 || zd_nn_linear(x, tiny_w, tiny_b, &out) < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(out);
    zd_tensor_unref(out);
    return v;
}

static zd_value_t *fn_tiny_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *list = zd_value_list(2);
    zd_tensor_t *ps[2] = {tiny_w, tiny_b};
    for (int i = 0; i < 2; i++) {
        zd_value_t *tv = zd_value_tensor(ps[i]);
        zd_rref_t *r = zd_rref_new(tv);
        zd_value_unref(tv);
        zd_list_append(list, zd_value_rref(r));
        zd_rref_unref(r);
    }
    return list;
}

static int setup(const world_t *w)
{
    (void)w;
    if (!(net = zd_nn_net_new(1)))
        return -1;
    zd_nn_module_train(net, false);
    tiny_w = zd_tensor_zeros2(10, 10);
    tiny_b = zd_tensor_zeros1(10);
    zd_rng_t rng;
    zd_rng_seed(&rng, 3);
    zd_nn_init_default(tiny_w, tiny_b, &rng);
    zd_tensor_set_requires_grad(tiny_w, true);
    zd_tensor_set_requires_grad(tiny_b, true);
    if (zd_dist_optim_init() < 0)
        return -1;
    return zd_rpc_register("net_forward", fn_net_forward, NULL) |
        /* A 10x10 layer returns at once: run it on the I/O thread. */
        zd_rpc_register_inline("tiny_forward", fn_tiny_forward, NULL) |
        zd_rpc_register("tiny_params", fn_tiny_params, NULL);
}

/*  ---- trainer ---- */

static zd_tensor_t *remote_tensor(const char *fn, zd_tensor_t *x)
{
    zd_value_t *a = ZD_ARGS(x), *r = NULL;
    zd_tensor_t *t = NULL;
    if (a && zd_rpc_sync(0, fn, a, -1, &r) == 0 && zd_value_get_tensor(r, &t) == 0)
        zd_tensor_ref(t);
    zd_value_unref(a);
    zd_value_unref(r);
    return t;
}

static int net_iteration(zd_tensor_t *x, zd_tensor_t *y, bool distributed)
{
    int64_t ctx = -1;
    zd_tensor_t *out = NULL, *loss = NULL;
    int rc = distributed ? zd_dist_autograd_context_begin(&ctx) : 0;
    if (rc == 0)
        out = distributed ? remote_tensor("net_forward", x)
                          : (zd_nn_module_forward(net, &x, 1, &out, 1) == 0 ? out : NULL);
    if (!out || zd_nn_nll_loss(out, y, &loss) < 0)
        rc = -1;
    if (rc == 0)
        rc = distributed ? zd_dist_autograd_backward(ctx, &loss, 1, false)
                         : zd_autograd_backward(loss, NULL, false);
    if (!distributed)
        zd_nn_module_zero_grad(net);
    if (ctx != -1 && zd_dist_autograd_context_release(ctx) < 0)
        rc = -1;
    zd_tensor_unref(out);
    zd_tensor_unref(loss);
    return rc;
}

static int tiny_iteration(zd_tensor_t *x, zd_dist_optim_t *opt)
{
    int64_t ctx;
    zd_tensor_t *out = NULL, *loss = NULL;
    int rc = zd_dist_autograd_context_begin(&ctx);
    if (rc == 0 && (!(out = remote_tensor("tiny_forward", x)) || zd_tensor_sum(out, &loss) < 0))
        rc = -1;
    if (rc == 0)
        rc = zd_dist_autograd_backward(ctx, &loss, 1, false);
    if (rc == 0 && opt)
        rc = zd_dist_optim_step(opt, ctx);
    /* Like leaving PyTorch's `with dist_autograd.context()`: no wait for
       the peers' confirmation (bounded: see zd_dist_autograd_context_release). */
    if (zd_dist_autograd_context_release(ctx) < 0)
        rc = -1;
    zd_tensor_unref(out);
    zd_tensor_unref(loss);
    return rc;
}

static void figure(const char *name, double value, const char *unit, const char *label)
{
    if (csv)
        printf("%s,%.4g,%s\n", name, value, unit);
    else
        printf("%-44s %10.3f %s\n", label, value, unit);
}

static int trainer(const world_t *w)
{
    if (w->rank != 1)
        return 0;
    double *t = calloc((size_t)iters, sizeof *t);
    zd_tensor_t *x = zd_tensor_zeros4(32, 1, 28, 28),
                *y = zd_tensor_new(ZD_INT64, (int64_t[]){32}, 1);
    zd_rng_t rng;
    zd_rng_seed(&rng, 5);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        zd_tensor_data(x)[i] = zd_rng_normal(&rng, 0, 1);
    for (int i = 0; i < 32; i++)
        zd_tensor_data_i64(y)[i] = i % 10;
    /* Alternating blocks: a slow patch of a shared machine lands on both
       loops rather than on one. */
    double *nt[2] = {calloc((size_t)net_iters, sizeof(double)),
                     calloc((size_t)net_iters, sizeof(double))},
           med[2];
    if (!t || !nt[0] || !nt[1])
        return world_fail(w, "out of memory");
    for (int i = -NET_BLOCK, first = 0; i < net_iters; i += NET_BLOCK, first = !first)
        for (int j = 0; j < 2; j++) {
            int d = j ^ first; /* who goes first changes every block */
            for (int k = i; k < i + NET_BLOCK && k < net_iters; k++) {
                double t0 = now_us();
                if (net_iteration(x, y, d == 1) < 0)
                    return world_fail(w, "net iteration: %s", zd_error_last());
                if (k >= 0)
                    nt[d][k] = now_us() - t0;
            }
            /* The server's releases run out before the next block, untimed. */
            if (d == 1 && zd_dist_autograd_wait_releases(-1) < 0)
                return world_fail(w, "releases: %s", zd_error_last());
        }
    for (int d = 0; d < 2; d++) {
        med[d] = median(nt[d], net_iters);
        free(nt[d]);
    }
    if (!csv)
        printf("forward + backward, tutorial Net, batch 32 (median of %d)\n", net_iters);
    figure("local_iter_ms", med[0] / 1e3, "ms", "  one process");
    figure("dist_iter_ms", med[1] / 1e3, "ms", "  server + trainer (distributed autograd)");
    if (!csv)
        printf("  ratio %.3f\n", med[1] / med[0]);

    zd_tensor_t *row = zd_tensor_zeros2(1, 10);
    for (int i = 0; i < 10; i++)
        zd_tensor_data(row)[i] = 0.1f * (float)i;
    zd_value_t *list = NULL;
    zd_rref_t *refs[2];
    zd_rref_list_t *params = zd_rref_list_new();
    zd_dist_optim_t *opt = NULL;
    zd_optim_config_t cfg = zd_optim_sgd_defaults(1e-3);
    if (!params || zd_rpc_sync(0, "tiny_params", NULL, -1, &list) < 0 ||
        zd_rpc_arg_rref(list, 0, &refs[0]) < 0 || zd_rpc_arg_rref(list, 1, &refs[1]) < 0 ||
        zd_rref_list_append(params, refs[0]) < 0 || zd_rref_list_append(params, refs[1]) < 0 ||
        !(opt = zd_dist_optim_new(&cfg, params)))
        return world_fail(w, "tiny setup: %s", zd_error_last());
    if (!csv)
        printf("tiny model (10x10 linear on the server, one row), median of %d\n", iters);
    for (int s = 0; s < 2; s++) {
        for (int i = -100; i < iters; i++) {
            double t0 = now_us();
            if (tiny_iteration(row, s ? opt : NULL) < 0)
                return world_fail(w, "tiny iteration: %s", zd_error_last());
            if (i >= 0)
                t[i] = now_us() - t0;
        }
        if (zd_dist_autograd_wait_releases(-1) < 0)
            return world_fail(w, "releases: %s", zd_error_last());
        double m = median(t, iters);
        if (s == 0)
            figure("dist_tiny_us_p50", m, "us", "  context + forward + backward + end");
        else
            figure("dist_tiny_step_us_p50", m, "us", "  the same + DistributedOptimizer step");
    }
    zd_dist_optim_free(opt);
    zd_rref_list_free(params);
    zd_value_unref(list);
    zd_tensor_unref(row);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--csv")) {
            csv = true;
        } else if (!strncmp(argv[i], "--iters=", 8) && atoi(argv[i] + 8) > 0) {
            iters = atoi(argv[i] + 8);
        } else {
            fprintf(stderr, "usage: %s [--csv] [--iters=N]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    world_options_t o = {
        .world_size = 2, .setup = setup, .fn = trainer, .dist_autograd = true, .timeout_s = 600};
    return world_run(&o) == 0 ? 0 : 1;
}
