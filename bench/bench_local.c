/* SPDX-License-Identifier: MIT */
/*  bench_local: training-step throughput of the two models in one process.

    One step = forward (training mode, dropout on) + nll_loss + backward +
    plain SGD (p -= lr * g) on a batch of random images. After a warm-up,
    the step runs in several timed rounds; the median round is reported.

        bench_local [--csv] [--batch N] [--seconds S] [--model NAME] [--threads N]
                    [--ops] [--no-taps]

    --csv prints `local_<model>_samples_per_s,<value>,samples/s` lines, and
    `lstm_seq_steps_per_s,<value>,steps/s`: a 2-layer LSTM (input and hidden
    256, batch 32, 35 steps), forward + backward of sum(output * dy), in
    time steps per second (35 x iterations per second); --model lstm runs
    only that.
    --threads sets zd_nn_set_num_threads (a parameter server with several
    trainers runs each request on 1). --ops times each layer of the Net on
    its own instead: forward, and forward + backward, in ms per batch (the
    fastest of several rounds). --no-taps keeps the layers to im2col and
    BLAS (zd__nn_use_taps(false)), to compare. The kernels are the CPU's
    best, or those ZDIST_CPU names (generic, avx2, avx512).

    safetensors (--model safetensors runs only it): a 400 MB file of 100
    float32 tensors (1000 x 1000) in $TMPDIR (default /tmp), medians of
    ROUNDS rounds. safetensors_save_GBps: zd_safetensors_write, flushed to
    disk as it always is; safetensors_load_GBps: zd_safetensors_read of the
    file just written (from the page cache) and one read per 4 KiB page of
    every tensor, which maps each page; beside them, for the same 400 MB:
    read_400MB_GBps, read() of the whole file into a buffer already written
    (the page cache's copy, without page faults), read_fresh_400MB_GBps,
    the same into newly allocated memory (what a loader that copies pays),
    and memcpy_400MB_GBps, one memcpy between two buffers already written. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/rng.h>
#include <zdist/rnn.h>
#include <zdist/safetensors.h>
#include "nn/nn_private.h"

#define ROUNDS 5

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*  CPU seconds used by the process so far (all threads). */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
        1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static int step(zd_nn_module_t *m, zd_tensor_t *x, zd_tensor_t *target, float lr)
{
    zd_tensor_t *lp = NULL, *loss = NULL;
    int rc = zd_nn_module_forward(m, &x, 1, &lp, 1);
    if (rc == 0)
        rc = zd_nn_nll_loss(lp, target, &loss);
    if (rc == 0)
        rc = zd_autograd_backward(loss, NULL, false);
    zd_tensor_unref(loss);
    zd_tensor_unref(lp);
    for (int i = 0; rc == 0 && i < zd_nn_module_n_params(m); i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i), *g = zd_tensor_grad(p);
        float *restrict pd = zd_tensor_data(p);
        const float *restrict gd = zd_tensor_data(g);
        const int64_t n = zd_tensor_numel(p);
        for (int64_t k = 0; k < n; k++)
            pd[k] -= lr * gd[k];
        zd_tensor_unref(g);
    }
    zd_nn_module_zero_grad(m);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/*  Median samples/s over ROUNDS rounds of about seconds/ROUNDS each; also
    the CPU time per step (all threads), which other load on the machine
    disturbs less than the wall-clock rate. */
static double bench_model(const char *name, int batch, double seconds, double *ms_per_step,
                          double *cpu_ms_per_step)
{
    zd_nn_module_t *m = zd_nn_tutorial_model_new(name, 1);
    if (!m)
        return -1;
    zd_rng_t rng;
    zd_rng_seed(&rng, 2);
    zd_tensor_t *x = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){batch, 1, 28, 28}, 4);
    zd_tensor_t *t = zd_tensor_empty(ZD_INT64, (int64_t[]){batch}, 1);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        zd_tensor_data(x)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    for (int i = 0; i < batch; i++)
        zd_tensor_data_i64(t)[i] = (int64_t)zd_rng_below(&rng, 10);
    double rate[ROUNDS];
    /* warm-up, and an estimate of the steps per round */
    double t0 = now();
    int warm = 0;
    while (now() - t0 < 0.3 || warm < 3) {
        if (step(m, x, t, 0.01f) < 0) {
            fprintf(stderr, "bench_local: %s: %s\n", name, zd_error_last());
            exit(1);
        }
        warm++;
    }
    int per_round = (int)(warm / (now() - t0) * seconds / ROUNDS) + 1;
    double cpu0 = cpu_seconds();
    for (int r = 0; r < ROUNDS; r++) {
        t0 = now();
        for (int i = 0; i < per_round; i++)
            step(m, x, t, 0.01f);
        rate[r] = (double)per_round * batch / (now() - t0);
    }
    *cpu_ms_per_step = 1e3 * (cpu_seconds() - cpu0) / (ROUNDS * per_round);
    qsort(rate, ROUNDS, sizeof *rate, cmp_double);
    *ms_per_step = 1e3 * batch / rate[ROUNDS / 2];
    zd_tensor_unref(t);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    return rate[ROUNDS / 2];
}

/*  ---- a 2-layer LSTM over a sequence ---- */

/*  PyTorch's word-language-model sizes: nn.LSTM(256, 256, 2) over 35 steps
    of a batch of 32, forward + backward of sum(output * dy). */
enum { LSTM_T = 35, LSTM_N = 32, LSTM_IN = 256, LSTM_H = 256, LSTM_LAYERS = 2 };

static int lstm_iteration(zd_nn_module_t *m, zd_tensor_t *x, zd_tensor_t *dy)
{
    zd_tensor_t *out = NULL;
    int rc = zd_nn_module_forward(m, &x, 1, &out, 1);
    if (rc == 0)
        rc = zd_autograd_backward(out, dy, false);
    zd_tensor_unref(out);
    zd_nn_module_zero_grad(m);
    return rc;
}

/*  Median time steps per second (35 per iteration) over ROUNDS rounds;
    also the CPU time per iteration. */
static double bench_lstm(double seconds, double *ms_per_iter, double *cpu_ms_per_iter)
{
    zd_nn_module_t *m = zd_nn_lstm_new(LSTM_IN, LSTM_H, LSTM_LAYERS, 0.0f, 1);
    if (!m)
        return -1;
    zd_rng_t rng;
    zd_rng_seed(&rng, 4);
    zd_tensor_t *x = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){LSTM_T, LSTM_N, LSTM_IN}, 3);
    zd_tensor_t *dy = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){LSTM_T, LSTM_N, LSTM_H}, 3);
    for (int64_t i = 0; i < zd_tensor_numel(x); i++)
        zd_tensor_data(x)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    for (int64_t i = 0; i < zd_tensor_numel(dy); i++)
        zd_tensor_data(dy)[i] = zd_rng_normal(&rng, 0.0f, 1.0f);
    double rate[ROUNDS], t0 = now();
    int warm = 0;
    while (now() - t0 < 0.3 || warm < 3) {
        if (lstm_iteration(m, x, dy) < 0) {
            fprintf(stderr, "bench_local: lstm: %s\n", zd_error_last());
            exit(1);
        }
        warm++;
    }
    int per_round = (int)(warm / (now() - t0) * seconds / ROUNDS) + 1;
    double cpu0 = cpu_seconds();
    for (int r = 0; r < ROUNDS; r++) {
        t0 = now();
        for (int i = 0; i < per_round; i++)
            lstm_iteration(m, x, dy);
        rate[r] = (double)per_round * LSTM_T / (now() - t0);
    }
    *cpu_ms_per_iter = 1e3 * (cpu_seconds() - cpu0) / (ROUNDS * per_round);
    qsort(rate, ROUNDS, sizeof *rate, cmp_double);
    *ms_per_iter = 1e3 * LSTM_T / rate[ROUNDS / 2];
    zd_tensor_unref(dy);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    return rate[ROUNDS / 2];
}

/*  ---- --ops: the Net's layers one at a time ---- */

enum { L_CONV1, L_CONV2, L_DROP2D, L_FC1, L_REST, N_LAYERS };

static const char *layer_names[N_LAYERS] = {
    "conv1+relu", "conv2+pool", "dropout2d+flatten", "fc1", "relu+drop+fc2+lsm+nll",
};

typedef struct {
    zd_nn_module_t *m;
    zd_rng_t rng;
    zd_tensor_t *in[N_LAYERS];   /* each layer's input (leaf; grad from conv2 on) */
    zd_tensor_t *gout[N_LAYERS]; /* ones in the shape of each layer's output (made once) */
    zd_tensor_t *target;
} ops_bench_t;

/*  Runs layer l forward; with backward, also its backward pass from a
    fixed output gradient (ones), clearing the gradients it leaves. */
static int run_layer(ops_bench_t *b, int l, bool backward)
{
    zd_tensor_t *h = zd_tensor_ref(b->in[l]), *next = NULL;
    zd_nn_module_t *m = b->m;
    int rc = 0;
#define L(call)                                                                                    \
    do {                                                                                           \
        if (rc == 0)                                                                               \
            rc = (call);                                                                           \
        zd_tensor_unref(h);                                                                        \
        h = next;                                                                                  \
        next = NULL;                                                                               \
    } while (0)
    switch (l) {
    case L_CONV1:
        L(zd_nn_conv2d_relu(h, zd_nn_module_param(m, 0), zd_nn_module_param(m, 1), 1, 0, &next));
        break;
    case L_CONV2:
        L(zd_nn_conv2d_max_pool2d(h, zd_nn_module_param(m, 2), zd_nn_module_param(m, 3), 1, 0, 2, 2,
                                  &next));
        break;
    case L_DROP2D:
        L(zd_nn_dropout2d(h, 0.25f, true, &b->rng, &next));
        L(zd_nn_flatten(h, &next));
        break;
    case L_FC1:
        L(zd_nn_linear(h, zd_nn_module_param(m, 4), zd_nn_module_param(m, 5), &next));
        break;
    default:
        L(zd_nn_relu(h, &next));
        L(zd_nn_dropout(h, 0.5f, true, &b->rng, &next));
        L(zd_nn_linear(h, zd_nn_module_param(m, 6), zd_nn_module_param(m, 7), &next));
        L(zd_nn_log_softmax(h, 1, &next));
        L(zd_nn_nll_loss(h, b->target, &next));
        break;
    }
#undef L
    if (rc == 0 && backward) {
        if (!b->gout[l] && zd_tensor_numel(h) > 1) {
            b->gout[l] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(h), zd_tensor_ndim(h));
            zd_tensor_fill_(b->gout[l], 1.0f);
        }
        rc = zd_autograd_backward(h, b->gout[l], false);
        zd_nn_module_zero_grad(m);
        zd_tensor_clear_grad(b->in[l]);
    }
    zd_tensor_unref(h);
    return rc;
}

/*  Fastest of OPS_ROUNDS rounds, in ms per call of run_layer: layers take
    a millisecond or so, and the fastest round is the one other load on the
    machine disturbed least. */
#define OPS_ROUNDS 15

static double time_layer(ops_bench_t *b, int l, bool backward, double seconds)
{
    double t0 = now(), best = 1e30;
    int warm = 0;
    while (now() - t0 < 0.1 || warm < 3) {
        if (run_layer(b, l, backward) < 0)
            return -1;
        warm++;
    }
    int per_round = (int)(warm / (now() - t0) * seconds / OPS_ROUNDS) + 1;
    for (int r = 0; r < OPS_ROUNDS; r++) {
        t0 = now();
        for (int i = 0; i < per_round; i++)
            run_layer(b, l, backward);
        double ms = 1e3 * (now() - t0) / per_round;
        best = ms < best ? ms : best;
    }
    return best;
}

static int bench_ops(int batch, double seconds)
{
    static const int64_t shapes[N_LAYERS][4] = {
        {0, 1, 28, 28}, {0, 32, 26, 26}, {0, 64, 12, 12}, {0, 9216}, {0, 128},
    };
    ops_bench_t b = {.m = zd_nn_tutorial_model_new("net", 1)};
    if (!b.m)
        return -1;
    zd_rng_seed(&b.rng, 3);
    for (int l = 0; l < N_LAYERS; l++) {
        int64_t shape[4];
        memcpy(shape, shapes[l], sizeof shape);
        shape[0] = batch;
        b.in[l] = zd_tensor_empty(ZD_FLOAT32, shape, l >= L_FC1 ? 2 : 4);
        for (int64_t i = 0; i < zd_tensor_numel(b.in[l]); i++)
            zd_tensor_data(b.in[l])[i] = zd_rng_normal(&b.rng, 0.0f, 1.0f);
        if (l != L_CONV1)
            zd_tensor_set_requires_grad(b.in[l], true);
    }
    b.target = zd_tensor_empty(ZD_INT64, (int64_t[]){batch}, 1);
    for (int i = 0; i < batch; i++)
        zd_tensor_data_i64(b.target)[i] = (int64_t)zd_rng_below(&b.rng, 10);
    printf("Net layers, batch %d, %d threads, kernels %s (ms per batch)\n%-24s %9s %9s %9s\n",
           batch, zd_nn_get_num_threads(), zd__nn_cpu_name(), "layer", "forward", "backward",
           "total");
    double sum_f = 0, sum_t = 0;
    int rc = 0;
    for (int l = 0; l < N_LAYERS && rc == 0; l++) {
        double f = time_layer(&b, l, false, seconds / N_LAYERS / 2);
        double t = time_layer(&b, l, true, seconds / N_LAYERS / 2);
        if (f < 0 || t < 0) {
            fprintf(stderr, "bench_local: %s: %s\n", layer_names[l], zd_error_last());
            rc = -1;
            break;
        }
        printf("%-24s %9.3f %9.3f %9.3f\n", layer_names[l], f, t - f, t);
        sum_f += f;
        sum_t += t;
    }
    if (rc == 0)
        printf("%-24s %9.3f %9.3f %9.3f\n", "sum", sum_f, sum_t - sum_f, sum_t);
    for (int l = 0; l < N_LAYERS; l++) {
        zd_tensor_unref(b.in[l]);
        zd_tensor_unref(b.gout[l]);
    }
    zd_tensor_unref(b.target);
    zd_nn_module_free(b.m);
    return rc;
}

#define ST_TENSORS 100
#define ST_SIDE    1000 /* 100 tensors of 1000 x 1000 float32: 400 MB */

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/*  Reads one byte per 4 KiB page of every tensor (mapping the pages of a
    borrowed one). */
static unsigned touch_pages(const zd_named_tensors_t *nt)
{
    unsigned sum = 0;
    for (int i = 0; i < zd_named_tensors_len(nt); i++) {
        const volatile unsigned char *p = zd_tensor_raw(zd_named_tensors_tensor(nt, i));
        size_t n = zd_tensor_nbytes(zd_named_tensors_tensor(nt, i));
        for (size_t k = 0; k < n; k += 4096)
            sum += p[k];
    }
    return sum;
}

static int read_whole(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    size_t got = 0;
    ssize_t r = 1;
    while (got < size && (r = read(fd, buf + got, size - got)) > 0)
        got += (size_t)r;
    close(fd);
    return got == size ? 0 : -1;
}

/*  The safetensors figures (see the top of the file); GB/s, medians. */
static int bench_safetensors(bool csv)
{
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[512];
    snprintf(path, sizeof path, "%s/bench_local_%ld.safetensors", dir, (long)getpid());
    zd_named_tensors_t *nt = zd_named_tensors_new();
    for (int i = 0; nt && i < ST_TENSORS; i++) {
        zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){ST_SIDE, ST_SIDE}, 2);
        char name[32];
        snprintf(name, sizeof name, "layers.%d.weight", i);
        if (!t || zd_named_tensors_add(nt, name, t) < 0) {
            zd_tensor_unref(t);
            zd_named_tensors_free(nt);
            return -1;
        }
        for (int64_t k = 0; k < zd_tensor_numel(t); k++)
            zd_tensor_data(t)[k] = (float)i + (float)k * 1e-6f;
        zd_tensor_unref(t);
    }
    if (!nt)
        return -1;
    double save[ROUNDS], load[ROUNDS], rd[ROUNDS], fresh[ROUNDS], cp[ROUNDS];
    size_t size = 0;
    char *a = NULL, *b = NULL;
    volatile unsigned sink = 0;
    int rc = 0;
    for (int r = 0; r < ROUNDS && rc == 0; r++) {
        double t0 = now();
        rc = zd_safetensors_write(nt, path, NULL);
        save[r] = now() - t0;
        struct stat st;
        if (rc < 0 || stat(path, &st) < 0) {
            rc = -1;
            break;
        }
        size = (size_t)st.st_size;
        if (!a) {
            a = malloc(size);
            b = malloc(size);
            if (!a || !b) {
                rc = zd_error_set("bench_local: out of memory for %zu bytes", size);
                break;
            }
            memset(a, 1, size); /* written once: no page faults in the timings */
            memset(b, 2, size);
        }
        t0 = now();
        zd_named_tensors_t *in = zd_safetensors_read(path, NULL);
        if (!in) {
            rc = -1;
            break;
        }
        sink += touch_pages(in);
        load[r] = now() - t0;
        zd_named_tensors_free(in);
        t0 = now();
        if (read_whole(path, a, size) < 0) {
            rc = zd_error_set("bench_local: cannot read %s", path);
            break;
        }
        rd[r] = now() - t0;
        char *c = malloc(size);
        t0 = now();
        if (!c || read_whole(path, c, size) < 0) {
            free(c);
            rc = zd_error_set("bench_local: cannot read %s into new memory", path);
            break;
        }
        fresh[r] = now() - t0;
        free(c);
        t0 = now();
        memcpy(b, a, size);
        __asm__ volatile("" : : "r"(b) : "memory");
        cp[r] = now() - t0;
    }
    unlink(path);
    free(a);
    free(b);
    zd_named_tensors_free(nt);
    if (rc < 0)
        return -1;
    double gb = (double)size * 1e-9;
    double fs = gb / median(save, ROUNDS), fl = gb / median(load, ROUNDS);
    double fr = gb / median(rd, ROUNDS), ff = gb / median(fresh, ROUNDS);
    double fc = gb / median(cp, ROUNDS);
    if (csv)
        printf("safetensors_save_GBps,%.2f,GB/s\nsafetensors_load_GBps,%.2f,GB/s\n"
               "read_400MB_GBps,%.2f,GB/s\nread_fresh_400MB_GBps,%.2f,GB/s\n"
               "memcpy_400MB_GBps,%.2f,GB/s\n",
               fs, fl, fr, ff, fc);
    else
        printf("safetensors, %d float32 tensors, %.0f MB in %s (GB/s, median of %d)\n"
               "%-30s %8.2f\n%-30s %8.2f\n%-30s %8.2f\n%-30s %8.2f\n%-30s %8.2f\n",
               ST_TENSORS, gb * 1e3, dir, ROUNDS, "save (write + fsync)", fs,
               "load (map + touch pages)", fl, "read() into written memory", fr,
               "read() into new memory", ff, "memcpy", fc);
    return 0;
}

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    bool csv = false;
    int batch = 32;
    double seconds = 4.0;
    const char *only = NULL;
    bool ops = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0)
            csv = true;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--ops") == 0)
            ops = true;
        else if (strcmp(argv[i], "--no-taps") == 0)
            zd__nn_use_taps(false);
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            if (zd_nn_set_num_threads(atoi(argv[++i])) < 0) {
                fprintf(stderr, "bench_local: %s\n", zd_error_last());
                return 2;
            }
        } else {
            fprintf(stderr,
                    "usage: %s [--csv] [--batch N] [--seconds S] [--model NAME] "
                    "[--threads N] [--ops] [--no-taps]\n",
                    argv[0]);
            return 2;
        }
    }
    if (batch < 1 || seconds <= 0) {
        fprintf(stderr, "bench_local: batch and seconds must be positive\n");
        return 2;
    }
    if (ops)
        return bench_ops(batch, seconds) < 0 ? 1 : 0;
    const char *models[] = {"net", "convnet"};
    /* fwd + bwd floating-point work per sample, for the GFLOP/s column */
    const double mflop[] = {71.6, 0.25};
    const bool any_model = !only || strcmp(only, "net") == 0 || strcmp(only, "convnet") == 0;
    if (!csv && any_model)
        printf("training step, batch %d, %d threads, kernels %s, OpenBLAS kernels %s\n"
               "%-8s %10s %10s %14s %10s\n",
               batch, zd_nn_get_num_threads(), zd__nn_cpu_name(), zd_nn_blas_corename(), "model",
               "ms/step", "cpu ms", "samples/s", "GFLOP/s");
    for (int i = 0; i < 2; i++) {
        if (only && strcmp(only, models[i]) != 0)
            continue;
        double ms, cpu_ms;
        double r = bench_model(models[i], batch, seconds, &ms, &cpu_ms);
        if (r < 0) {
            fprintf(stderr, "bench_local: %s\n", zd_error_last());
            return 1;
        }
        if (csv)
            printf("local_%s_samples_per_s,%.0f,samples/s\n", models[i], r);
        else
            printf("%-8s %10.3f %10.3f %14.0f %10.1f\n", models[i], ms, cpu_ms, r,
                   r * mflop[i] * 1e-3);
    }
    if (!only || strcmp(only, "lstm") == 0) {
        double ms, cpu_ms;
        double r = bench_lstm(seconds, &ms, &cpu_ms);
        if (r < 0) {
            fprintf(stderr, "bench_local: %s\n", zd_error_last());
            return 1;
        }
        if (csv)
            printf("lstm_seq_steps_per_s,%.0f,steps/s\n", r);
        else
            printf(
                "%sLSTM %d layers, input %d, hidden %d, batch %d, %d steps, fwd+bwd, %d threads\n"
                "%-8s %10s %10s %14s\n%-8s %10.3f %10.3f %14.0f\n",
                any_model ? "\n" : "", LSTM_LAYERS, LSTM_IN, LSTM_H, LSTM_N, LSTM_T,
                zd_nn_get_num_threads(), "model", "ms/iter", "cpu ms", "steps/s", "lstm", ms,
                cpu_ms, r);
    }
    if (!only || strcmp(only, "safetensors") == 0) {
        if (!csv && !only)
            printf("\n");
        if (bench_safetensors(csv) < 0) {
            fprintf(stderr, "bench_local: %s\n", zd_error_last());
            return 1;
        }
    }
    return 0;
}
