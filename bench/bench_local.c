/*  bench_local: training-step throughput of the two models in one process.

    One step = forward (training mode, dropout on) + nll_loss + backward +
    plain SGD (p -= lr * g) on a batch of random images. After a warm-up,
    the step runs in several timed rounds; the median round is reported.

        bench_local [--csv] [--batch N] [--seconds S]

    --csv prints `local_<model>_samples_per_s,<value>,samples/s` lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/model.h"
#include "nn/nn.h"
#include "nn/rng.h"

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

static int step(nn_model_t *m, tensor_t *x, tensor_t *target, float lr)
{
    tensor_t *lp = NULL, *loss = NULL;
    int rc = nn_model_forward(m, x, &lp);
    if (rc == 0)
        rc = nn_nll_loss(lp, target, &loss);
    if (rc == 0)
        rc = autograd_backward(loss, NULL, false);
    tensor_unref(loss);
    tensor_unref(lp);
    for (int i = 0; rc == 0 && i < nn_model_n_params(m); i++) {
        tensor_t *p = nn_model_param(m, i), *g = tensor_grad(p);
        float *restrict pd = tensor_data(p);
        const float *restrict gd = tensor_data(g);
        const int64_t n = tensor_numel(p);
        for (int64_t k = 0; k < n; k++)
            pd[k] -= lr * gd[k];
        tensor_unref(g);
    }
    nn_model_zero_grad(m);
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
    nn_model_t *m = nn_model_new(name, 1);
    if (!m)
        return -1;
    nn_rng_t rng;
    nn_rng_seed(&rng, 2);
    tensor_t *x = tensor_empty(TENSOR_F32, 4, (int64_t[]){batch, 1, 28, 28});
    tensor_t *t = tensor_empty(TENSOR_I64, 1, (int64_t[]){batch});
    for (int64_t i = 0; i < tensor_numel(x); i++)
        tensor_data(x)[i] = nn_rng_normal(&rng, 0.0f, 1.0f);
    for (int i = 0; i < batch; i++)
        tensor_data_i64(t)[i] = (int64_t)nn_rng_below(&rng, 10);
    double rate[ROUNDS];
    /* warm-up, and an estimate of the steps per round */
    double t0 = now();
    int warm = 0;
    while (now() - t0 < 0.3 || warm < 3) {
        if (step(m, x, t, 0.01f) < 0) {
            fprintf(stderr, "bench_local: %s: %s\n", name, error_last());
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
    tensor_unref(t);
    tensor_unref(x);
    nn_model_free(m);
    return rate[ROUNDS / 2];
}

int main(int argc, char **argv)
{
    bool csv = false;
    int batch = 32;
    double seconds = 4.0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--csv") == 0)
            csv = true;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--csv] [--batch N] [--seconds S] [--model NAME]\n",
                    argv[0]);
            return 2;
        }
    }
    if (batch < 1 || seconds <= 0) {
        fprintf(stderr, "bench_local: batch and seconds must be positive\n");
        return 2;
    }
    const char *models[] = {"net", "convnet"};
    /* fwd + bwd floating-point work per sample, for the GFLOP/s column */
    const double mflop[] = {71.6, 0.25};
    if (!csv)
        printf("training step, batch %d, OpenBLAS kernels %s\n%-8s %10s %10s %14s %10s\n",
               batch, nn_blas_corename(), "model", "ms/step", "cpu ms", "samples/s", "GFLOP/s");
    for (int i = 0; i < 2; i++) {
        if (only && strcmp(only, models[i]) != 0)
            continue;
        double ms, cpu_ms;
        double r = bench_model(models[i], batch, seconds, &ms, &cpu_ms);
        if (r < 0) {
            fprintf(stderr, "bench_local: %s\n", error_last());
            return 1;
        }
        if (csv)
            printf("local_%s_samples_per_s,%.0f,samples/s\n", models[i], r);
        else
            printf("%-8s %10.3f %10.3f %14.0f %10.1f\n", models[i], ms, cpu_ms, r,
                   r * mflop[i] * 1e-3);
    }
    return 0;
}
