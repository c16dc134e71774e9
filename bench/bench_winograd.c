/* SPDX-License-Identifier: MIT */
/*  bench_winograd: the Net's conv2 (x [B,32,26,26], w [64,32,3,3], stride 1,
    no padding, y [B,64,24,24]) by Winograd F(2x2, 3x3) (nn/winograd.c)
    against zd_nn_conv2d, forward and input gradient, with 1 and 2 threads.

        bench_winograd [--csv] [--batch N] [--seconds S] [--threads N]
                       [--shape C,O,H,W,padding]

    --shape times another 3x3 stride-1 convolution instead (C input and O
    output channels, H x W input).

    Each thread count runs in a child process of its own, since the pool's
    size is fixed once a layer has run (zd_nn_set_num_threads); --threads runs
    only that one. Times are ms per call, the median (and the best) of
    ROUNDS rounds; the measures take turns within each round, so load from
    elsewhere on the machine hits them alike.

    "conv2d fwd" is zd_nn_conv2d on an input that needs no gradient (no graph
    is recorded); "conv2d dx" is the backward pass of zd_nn_conv2d for an
    input that needs its gradient and a weight that does not (so only dx is
    computed), taken as (forward + backward) - forward. GFLOP/s counts the
    direct convolution's 2*B*O*C*9*Ho*Wo for every method.

    --csv prints `winograd_<what>_t<threads>_ms,<value>,ms` lines, <what> in
    wino_fwd, conv2d_fwd, wino_dx, conv2d_dx. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rng.h>
#include "nn/winograd.h"

#define ROUNDS 7

enum { WINO_FWD, CONV_FWD, WINO_DX, CONV_FWD_BWD, CONV_FWD_G, N_MEASURES };

typedef struct {
    int batch, C, O, H, W, pad, Ho, Wo;
    zd_tensor_t *x, *xg, *w, *b, *dy; /* xg: x with requires_grad */
    float *y, *dx;                    /* Winograd's outputs */
} bench_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int run(bench_t *b, int what)
{
    zd_tensor_t *y = NULL;
    int rc;
    switch (what) {
    case WINO_FWD:
        return zd__nn_winograd_forward(zd_tensor_data(b->x), b->batch, b->C, b->H, b->W,
                                       zd_tensor_data(b->w), b->O, zd_tensor_data(b->b), b->pad,
                                       b->y, NULL, NULL);
    case WINO_DX:
        return zd__nn_winograd_backward_input(zd_tensor_data(b->dy), b->batch, b->O, b->Ho, b->Wo,
                                              zd_tensor_data(b->w), b->C, b->pad, b->dx, NULL,
                                              NULL);
    case CONV_FWD:
        rc = zd_nn_conv2d(b->x, b->w, b->b, 1, b->pad, &y);
        break;
    case CONV_FWD_G:
        rc = zd_nn_conv2d(b->xg, b->w, NULL, 1, b->pad, &y);
        break;
    default:
        rc = zd_nn_conv2d(b->xg, b->w, NULL, 1, b->pad, &y);
        if (rc == 0)
            rc = zd_autograd_backward(y, b->dy, false);
        zd_tensor_clear_grad(b->xg);
        break;
    }
    zd_tensor_unref(y);
    return rc;
}

/*  Largest |a - b| over n floats. */
static double max_diff(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

/*  Both methods once, to show they agree (a benchmark of a wrong result
    is worthless). */
static int agreement(bench_t *b, double *dfwd, double *ddx)
{
    zd_tensor_t *y = NULL, *yg = NULL, *g = NULL;
    int rc = run(b, WINO_FWD) | run(b, WINO_DX) | zd_nn_conv2d(b->x, b->w, b->b, 1, b->pad, &y);
    if (rc == 0 && (rc = zd_nn_conv2d(b->xg, b->w, NULL, 1, b->pad, &yg)) == 0 &&
        (rc = zd_autograd_backward(yg, b->dy, false)) == 0 && (g = zd_tensor_grad(b->xg))) {
        *dfwd = max_diff(b->y, zd_tensor_data(y), zd_tensor_numel(y));
        *ddx = max_diff(b->dx, zd_tensor_data(g), zd_tensor_numel(g));
    }
    zd_tensor_clear_grad(b->xg);
    zd_tensor_unref(g);
    zd_tensor_unref(yg);
    zd_tensor_unref(y);
    return rc == 0 ? 0 : -1;
}

static int bench_threads(int threads, bench_t b, double seconds, bool csv)
{
    if (zd_nn_set_num_threads(threads) < 0)
        return -1;
    zd_rng_t rng;
    zd_rng_seed(&rng, 5);
    const int batch = b.batch;
    b.x = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){batch, b.C, b.H, b.W}, 4);
    b.w = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){b.O, b.C, 3, 3}, 4);
    b.b = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){b.O}, 1);
    b.dy = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){batch, b.O, b.Ho, b.Wo}, 4);
    b.y = malloc(sizeof(float) * (size_t)batch * b.O * b.Ho * b.Wo);
    b.dx = malloc(sizeof(float) * (size_t)batch * b.C * b.H * b.W);
    if (!b.x || !b.w || !b.b || !b.dy || !b.y || !b.dx)
        return zd_error_set("out of memory");
    zd_tensor_t *all[] = {b.x, b.w, b.b, b.dy};
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < zd_tensor_numel(all[t]); i++)
            zd_tensor_data(all[t])[i] = zd_rng_uniform_range(&rng, -1.0f, 1.0f) *
                (t == 1 ? 1.0f / sqrtf(9.0f * b.C) : 1.0f);
    b.xg = zd_tensor_detach_copy(b.x);
    if (!b.xg || zd_tensor_set_requires_grad(b.xg, true) < 0)
        return -1;

    double dfwd = 0, ddx = 0, per_call[N_MEASURES], best[N_MEASURES], ms[N_MEASURES][ROUNDS];
    int per_round[N_MEASURES];
    if (agreement(&b, &dfwd, &ddx) < 0)
        return -1;
    for (int m = 0; m < N_MEASURES; m++) {
        double t0 = now();
        int warm = 0;
        while (now() - t0 < 0.1 || warm < 3) {
            if (run(&b, m) < 0)
                return -1;
            warm++;
        }
        per_call[m] = (now() - t0) / warm;
        per_round[m] = (int)(seconds / ROUNDS / N_MEASURES / per_call[m]) + 1;
    }
    for (int r = 0; r < ROUNDS; r++)
        for (int m = 0; m < N_MEASURES; m++) {
            double t0 = now();
            for (int i = 0; i < per_round[m]; i++)
                run(&b, m);
            ms[m][r] = 1e3 * (now() - t0) / per_round[m];
        }
    for (int m = 0; m < N_MEASURES; m++) {
        qsort(ms[m], ROUNDS, sizeof(double), cmp_double);
        per_call[m] = ms[m][ROUNDS / 2];
        best[m] = ms[m][0];
    }
    const double res[4] = {per_call[WINO_FWD], per_call[CONV_FWD], per_call[WINO_DX],
                           per_call[CONV_FWD_BWD] - per_call[CONV_FWD_G]};
    const double low[4] = {best[WINO_FWD], best[CONV_FWD], best[WINO_DX],
                           best[CONV_FWD_BWD] - best[CONV_FWD_G]};
    const char *names[4] = {"wino_fwd", "conv2d_fwd", "wino_dx", "conv2d_dx"};
    const double gflop = 2.0 * batch * b.O * b.C * 9 * b.Ho * b.Wo * 1e-9;
    if (csv) {
        for (int i = 0; i < 4; i++)
            printf("winograd_%s_t%d_ms,%.3f,ms\n", names[i], threads, res[i]);
    } else {
        printf("conv %dx%dx%dx%d -> %d channels, padding %d, %d threads (max |wino - conv2d|: "
               "y %.2g, dx %.2g)\n%-12s %10s %10s %10s\n",
               batch, b.C, b.H, b.W, b.O, b.pad, threads, dfwd, ddx, "", "median ms", "best ms",
               "GFLOP/s");
        for (int i = 0; i < 4; i++)
            printf("  %-12s %8.3f   %8.3f   %8.1f\n", names[i], res[i], low[i],
                   gflop / res[i] * 1e3);
        printf("  speed-up     fwd %.2fx, dx %.2fx (best: %.2fx, %.2fx)\n", res[1] / res[0],
               res[3] / res[2], low[1] / low[0], low[3] / low[2]);
    }
    fflush(stdout);
    zd_tensor_unref(b.x), zd_tensor_unref(b.xg), zd_tensor_unref(b.w), zd_tensor_unref(b.b);
    zd_tensor_unref(b.dy);
    free(b.y), free(b.dx);
    return 0;
}

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    bool csv = false;
    int only = 0;
    bench_t b = {.batch = 32, .C = 32, .O = 64, .H = 26, .W = 26};
    double seconds = 3.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0)
            csv = true;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            b.batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            only = atoi(argv[++i]);
        else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc &&
                 sscanf(argv[i + 1], "%d,%d,%d,%d,%d", &b.C, &b.O, &b.H, &b.W, &b.pad) == 5)
            i++;
        else {
            fprintf(stderr,
                    "usage: %s [--csv] [--batch N] [--seconds S] [--threads N] "
                    "[--shape C,O,H,W,padding]\n",
                    argv[0]);
            return 2;
        }
    }
    b.Ho = b.H + 2 * b.pad - 2;
    b.Wo = b.W + 2 * b.pad - 2;
    if (b.batch < 1 || seconds <= 0 || only < 0 || b.C < 1 || b.O < 1 || b.pad < 0 || b.pad > 1 ||
        b.Ho < 1 || b.Wo < 1) {
        fprintf(stderr,
                "bench_winograd: batch, seconds, threads and the shape must be "
                "positive, padding 0 or 1, and the kernel must fit\n");
        return 2;
    }
    if (only) {
        if (bench_threads(only, b, seconds, csv) < 0) {
            fprintf(stderr, "bench_winograd: %s\n", zd_error_last());
            return 1;
        }
        return 0;
    }
    /* the parent runs no layer: each child sizes its own pool */
    for (int threads = 1; threads <= 2; threads++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("bench_winograd: fork");
            return 1;
        }
        if (pid == 0) {
            if (bench_threads(threads, b, seconds, csv) < 0) {
                fprintf(stderr, "bench_winograd: %s\n", zd_error_last());
                _exit(1);
            }
            _exit(0);
        }
        int status;
        if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 1;
    }
    return 0;
}
