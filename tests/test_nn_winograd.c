/* SPDX-License-Identifier: MIT */
/*  Winograd F(2x2, 3x3) convolutions (nn/winograd.c): the forward pass and
    the input gradient against a plain convolution written here (double
    accumulation), on odd and even sizes, padding 0, 1 and 2, rows of more
    than 16 tiles, tiny planes and channel counts, and the Net's conv2;
    then against PyTorch's numbers in the golden cases (every 3x3 stride-1
    conv2d case, and the Net's conv2 inside its forward pass).

    Tolerance: |a - e| <= 1e-5 + 1e-4 |e|, elementwise, the golden cases'
    own. The random cases draw x from U(-1, 1) and w from PyTorch's default
    U(-1/sqrt(9C), 1/sqrt(9C)), so outputs are of order 1 like the golden
    ones; the float32 rounding of the transforms grows with the sum of
    |w x| over the 9C terms, not with |e|, which is why the data are scaled
    so. Each case also prints its largest errors (abs, and relative to that
    sum of magnitudes). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rng.h>
#include "nn/winograd.h"
#include "tests/support/golden_cases.h"

#define ATOL 1e-5
#define RTOL 1e-4

/*  ---- the reference: plain loops in double ---- */

/*  y = conv(x, w) + bias, and mag = sum of |terms| per output (for the
    error report). */
static void ref_forward(const float *x, int N, int C, int H, int W, const float *w, int O,
                        const float *bias, int pad, double *y, double *mag)
{
    const int Ho = H + 2 * pad - 2, Wo = W + 2 * pad - 2;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < Ho; i++)
                for (int j = 0; j < Wo; j++) {
                    double acc = bias ? bias[o] : 0.0, m = bias ? fabs(bias[o]) : 0.0;
                    for (int c = 0; c < C; c++)
                        for (int u = 0; u < 3; u++)
                            for (int v = 0; v < 3; v++) {
                                int r = i + u - pad, q = j + v - pad;
                                if (r < 0 || r >= H || q < 0 || q >= W)
                                    continue;
                                double t = (double)w[((size_t)o * C + c) * 9 + u * 3 + v] *
                                    x[(((size_t)n * C + c) * H + r) * W + q];
                                acc += t;
                                m += fabs(t);
                            }
                    size_t k = (((size_t)n * O + o) * Ho + i) * Wo + j;
                    y[k] = acc;
                    mag[k] = m;
                }
}

/*  dx of the convolution above, for dy [N,O,Ho,Wo], by scattering each
    dy element back along the forward pass's terms. */
static void ref_backward_input(const float *dy, int N, int O, int Ho, int Wo, const float *w, int C,
                               int pad, double *dx, double *mag)
{
    const int H = Ho + 2 - 2 * pad, W = Wo + 2 - 2 * pad;
    memset(dx, 0, sizeof(double) * (size_t)N * C * H * W);
    memset(mag, 0, sizeof(double) * (size_t)N * C * H * W);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++)
            for (int i = 0; i < Ho; i++)
                for (int j = 0; j < Wo; j++) {
                    double g = dy[(((size_t)n * O + o) * Ho + i) * Wo + j];
                    for (int c = 0; c < C; c++)
                        for (int u = 0; u < 3; u++)
                            for (int v = 0; v < 3; v++) {
                                int r = i + u - pad, q = j + v - pad;
                                if (r < 0 || r >= H || q < 0 || q >= W)
                                    continue;
                                size_t k = (((size_t)n * C + c) * H + r) * W + q;
                                double t = g * w[((size_t)o * C + c) * 9 + u * 3 + v];
                                dx[k] += t;
                                mag[k] += fabs(t);
                            }
                }
}

/*  ---- comparing ---- */

typedef struct {
    double abs_err, rel_mag; /* largest |a-e|, and |a-e| / sum|terms| */
    double allowance;        /* largest |a-e| / (ATOL + RTOL |e|) */
} err_t;

static err_t worst; /* over every case, for the final report */

static void check_close(const char *what, const float *a, const double *e, const double *mag,
                        size_t n)
{
    err_t r = {0};
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - e[i]), allow = ATOL + RTOL * fabs(e[i]);
        if (!(d <= allow))
            fail_msg("%s[%zu]: %.9g, expected %.9g", what, i, (double)a[i], e[i]);
        r.abs_err = fmax(r.abs_err, d);
        r.allowance = fmax(r.allowance, d / allow);
        if (mag && mag[i] > 0)
            r.rel_mag = fmax(r.rel_mag, d / mag[i]);
    }
    char rel[32] = "-";
    if (mag)
        snprintf(rel, sizeof rel, "%.3g", r.rel_mag);
    print_message("%-40s max |a-e| %.3g, /sum|terms| %s, of allowance %.3f\n", what, r.abs_err, rel,
                  r.allowance);
    worst.abs_err = fmax(worst.abs_err, r.abs_err);
    worst.rel_mag = fmax(worst.rel_mag, r.rel_mag);
    worst.allowance = fmax(worst.allowance, r.allowance);
}

/*  ---- random cases ---- */

typedef struct {
    int N, C, O, H, W, pad;
    bool bias;
} shape_t;

static float *random_floats(zd_rng_t *r, size_t n, float bound)
{
    float *p = malloc(sizeof(float) * (n ? n : 1));
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = zd_rng_uniform_range(r, -bound, bound);
    return p;
}

static float *nan_floats(size_t n)
{
    float *p = malloc(sizeof(float) * n);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

typedef struct {
    float *copy; /* N x per_sample floats */
    size_t per_sample;
    unsigned char seen[64];
} epi_t;

static void copy_epilogue(void *arg, int n, float *y_n)
{
    epi_t *e = arg;
    memcpy(e->copy + (size_t)n * e->per_sample, y_n, sizeof(float) * e->per_sample);
    e->seen[n] = 1;
}

/*  Odd samples' dy copied into the buffer, even ones given in place. */
typedef struct {
    const float *dy;
    size_t per_sample;
} pro_t;

static const float *dy_prologue(void *arg, int n, float *buf)
{
    const pro_t *p = arg;
    const float *src = p->dy + (size_t)n * p->per_sample;
    if (n % 2 == 0)
        return src;
    memcpy(buf, src, sizeof(float) * p->per_sample);
    return buf;
}

static void run_shape(const shape_t *s, uint64_t seed)
{
    const int Ho = s->H + 2 * s->pad - 2, Wo = s->W + 2 * s->pad - 2;
    const size_t nx = (size_t)s->N * s->C * s->H * s->W, nw = (size_t)s->O * s->C * 9;
    const size_t ny = (size_t)s->N * s->O * Ho * Wo;
    const float wb = 1.0f / sqrtf(9.0f * s->C);
    zd_rng_t r;
    zd_rng_seed(&r, seed);
    float *x = random_floats(&r, nx, 1.0f), *w = random_floats(&r, nw, wb);
    float *b = s->bias ? random_floats(&r, s->O, wb) : NULL;
    float *dy = random_floats(&r, ny, 1.0f);
    float *y = nan_floats(ny), *dx = nan_floats(nx);
    double *ey = malloc(sizeof(double) * ny), *my = malloc(sizeof(double) * ny);
    double *edx = malloc(sizeof(double) * nx), *mdx = malloc(sizeof(double) * nx);
    assert_true(ey && my && edx && mdx);
    char what[128];

    ref_forward(x, s->N, s->C, s->H, s->W, w, s->O, b, s->pad, ey, my);
    assert_int_equal(
        zd__nn_winograd_forward(x, s->N, s->C, s->H, s->W, w, s->O, b, s->pad, y, NULL, NULL), 0);
    snprintf(what, sizeof what, "y  N%d C%d O%d %dx%d p%d%s", s->N, s->C, s->O, s->H, s->W, s->pad,
             s->bias ? " bias" : "");
    check_close(what, y, ey, my, ny);

    /* the epilogue sees each sample's output, with or without y */
    epi_t e = {.copy = nan_floats(ny), .per_sample = ny / s->N};
    assert_true(s->N <= (int)sizeof e.seen);
    assert_int_equal(zd__nn_winograd_forward(x, s->N, s->C, s->H, s->W, w, s->O, b, s->pad, NULL,
                                             copy_epilogue, &e),
                     0);
    for (int n = 0; n < s->N; n++)
        assert_int_equal(e.seen[n], 1);
    assert_memory_equal(e.copy, y, sizeof(float) * ny);
    free(e.copy);

    ref_backward_input(dy, s->N, s->O, Ho, Wo, w, s->C, s->pad, edx, mdx);
    assert_int_equal(
        zd__nn_winograd_backward_input(dy, s->N, s->O, Ho, Wo, w, s->C, s->pad, dx, NULL, NULL), 0);
    snprintf(what, sizeof what, "dx N%d C%d O%d %dx%d p%d", s->N, s->C, s->O, s->H, s->W, s->pad);
    check_close(what, dx, edx, mdx, nx);

    /* the same dy through a prologue: the same bits */
    float *dx2 = nan_floats(nx);
    pro_t pr = {.dy = dy, .per_sample = ny / s->N};
    assert_int_equal(zd__nn_winograd_backward_input(NULL, s->N, s->O, Ho, Wo, w, s->C, s->pad, dx2,
                                                    dy_prologue, &pr),
                     0);
    assert_memory_equal(dx2, dx, sizeof(float) * nx);
    free(dx2);

    free(x), free(w), free(b), free(dy), free(y), free(dx);
    free(ey), free(my), free(edx), free(mdx);
}

static void test_small_shapes(void **state)
{
    (void)state;
    static const shape_t shapes[] = {
        {2, 3, 5, 7, 9, 1, true},                               /* C=3, O=5, odd sizes, padding 1 */
        {2, 3, 5, 8, 8, 0, true},    {1, 1, 1, 3, 3, 0, false}, /* one output */
        {3, 2, 3, 1, 1, 1, true},                               /* one input pixel, padding 1 */
        {1, 4, 2, 2, 5, 2, false},   /* padding 2 (the input gradient's own) */
        {2, 4, 6, 5, 40, 1, true},   /* 20 tiles a row: two runs of lanes */
        {1, 3, 2, 36, 35, 0, false}, /* 17 tiles a row, odd width and height */
        {5, 7, 9, 6, 4, 1, true},    /* more samples than threads' chunks */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        run_shape(&shapes[i], 1000 + i);
}

static void test_large_channels(void **state)
{
    (void)state;
    static const shape_t shapes[] = {
        {2, 16, 17, 9, 11, 0, true},  /* odd outputs 7x9 */
        {2, 32, 64, 26, 26, 0, true}, /* the Net's conv2, batch 2 */
        {2, 32, 24, 13, 13, 1, false},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        run_shape(&shapes[i], 2000 + i);
}

/*  Same inputs, same bits, whatever thread computes a sample and whatever
    batch it comes in: sample 1 of a batch of 3 equals that sample run
    alone, forward and input gradient. */
static void test_deterministic(void **state)
{
    (void)state;
    const int N = 3, C = 20, O = 18, H = 11, W = 10, Ho = 9, Wo = 8;
    zd_rng_t r;
    zd_rng_seed(&r, 7);
    float *x = random_floats(&r, (size_t)N * C * H * W, 1.0f);
    float *w = random_floats(&r, (size_t)O * C * 9, 0.1f), *b = random_floats(&r, O, 0.1f);
    float *y = nan_floats((size_t)N * O * Ho * Wo), *y1 = nan_floats((size_t)O * Ho * Wo);
    assert_int_equal(zd__nn_winograd_forward(x, N, C, H, W, w, O, b, 0, y, NULL, NULL), 0);
    assert_int_equal(
        zd__nn_winograd_forward(x + (size_t)C * H * W, 1, C, H, W, w, O, b, 0, y1, NULL, NULL), 0);
    assert_memory_equal(y + (size_t)O * Ho * Wo, y1, sizeof(float) * O * Ho * Wo);

    /* y as the output gradient: dx [N,C,H,W] */
    float *dx = nan_floats((size_t)N * C * H * W), *dx1 = nan_floats((size_t)C * H * W);
    assert_int_equal(zd__nn_winograd_backward_input(y, N, O, Ho, Wo, w, C, 0, dx, NULL, NULL), 0);
    assert_int_equal(zd__nn_winograd_backward_input(y + (size_t)O * Ho * Wo, 1, O, Ho, Wo, w, C, 0,
                                                    dx1, NULL, NULL),
                     0);
    assert_memory_equal(dx + (size_t)C * H * W, dx1, sizeof(float) * C * H * W);
    free(x), free(w), free(b), free(y), free(y1), free(dx), free(dx1);
}

static void test_applies_and_errors(void **state)
{
    (void)state;
    /* C, O, H, W, kh, kw, stride, padding, dilation, input gradient */
    assert_true(zd__nn_winograd_applies(32, 64, 26, 26, 3, 3, 1, 0, 1, false)); /* Net conv2 */
    assert_true(zd__nn_winograd_applies(32, 64, 26, 26, 3, 3, 1, 0, 1, true));
    assert_true(zd__nn_winograd_applies(32, 64, 8, 8, 3, 3, 1, 1, 1, false));
    assert_false(zd__nn_winograd_applies(1, 32, 28, 28, 3, 3, 1, 0, 1, false));  /* Net conv1 */
    assert_false(zd__nn_winograd_applies(32, 16, 28, 28, 3, 3, 1, 0, 1, false)); /* thin */
    assert_true(zd__nn_winograd_applies(32, 16, 28, 28, 3, 3, 1, 0, 1, true));
    assert_false(zd__nn_winograd_applies(64, 64, 7, 7, 3, 3, 1, 1, 1, false));   /* small */
    assert_false(zd__nn_winograd_applies(32, 64, 26, 26, 3, 3, 2, 1, 1, false)); /* stride 2 */
    assert_false(zd__nn_winograd_applies(32, 64, 26, 26, 3, 3, 1, 2, 1, true));  /* padding 2 */
    assert_false(zd__nn_winograd_applies(32, 64, 26, 26, 5, 5, 1, 0, 1, false));
    assert_false(zd__nn_winograd_applies(32, 64, 26, 26, 3, 3, 1, 0, 2, true)); /* dilation 2 */
    assert_false(zd__nn_winograd_applies(32, 64, 2, 2, 3, 3, 1, 0, 1, true));   /* no output */

    float x[4] = {0}, w[9] = {0}, y[4];
    assert_int_equal(zd__nn_winograd_forward(x, 1, 1, 2, 2, w, 1, NULL, 0, y, NULL, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "does not fit"));
    assert_int_equal(zd__nn_winograd_forward(x, 1, 1, 2, 2, w, 1, NULL, 3, y, NULL, NULL), -1);
    assert_int_equal(zd__nn_winograd_forward(x, 1, 1, 2, 2, w, 1, NULL, 1, NULL, NULL, NULL), -1);
    assert_int_equal(zd__nn_winograd_backward_input(x, 1, 1, 2, 2, w, 1, 3, y, NULL, NULL), -1);
    assert_int_equal(zd__nn_winograd_backward_input(NULL, 1, 1, 2, 2, w, 1, 1, y, NULL, NULL), -1);
    assert_int_equal(zd__nn_winograd_forward(x, 0, 1, 2, 2, w, 1, NULL, 1, y, NULL, NULL), 0);
}

/*  ---- PyTorch's numbers ---- */

static float *golden_floats(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_tensor(c, role, name);
    if (!t)
        fail_msg("%s: no %s %s", c->dir, role, name);
    return zd_tensor_data(t);
}

static double *widen(const float *p, size_t n)
{
    double *d = malloc(sizeof(double) * n);
    assert_non_null(d);
    for (size_t i = 0; i < n; i++)
        d[i] = p[i];
    return d;
}

static int golden_conv_cases;

static void golden_conv(golden_case_t *c, void *arg)
{
    (void)arg;
    zd_tensor_t *xt = golden_tensor(c, "input", "x"), *wt = golden_tensor(c, "param", "weight");
    assert_non_null(xt);
    assert_non_null(wt);
    const int64_t *xs = zd_tensor_shape(xt), *ws = zd_tensor_shape(wt);
    const int pad = (int)golden_attr(c, "padding", 0);
    if (ws[2] != 3 || ws[3] != 3 || golden_attr(c, "stride", 1) != 1 ||
        golden_attr(c, "dilation", 1) != 1 || golden_attr(c, "groups", 1) != 1 || pad > 2)
        return;
    const int N = (int)xs[0], C = (int)xs[1], H = (int)xs[2], W = (int)xs[3], O = (int)ws[0];
    const int Ho = H + 2 * pad - 2, Wo = W + 2 * pad - 2;
    const size_t ny = (size_t)N * O * Ho * Wo, nx = (size_t)N * C * H * W;
    float *y = nan_floats(ny), *dx = nan_floats(nx);
    char what[1200];

    assert_int_equal(zd_tensor_numel(golden_tensor(c, "output", "y")), (int64_t)ny);
    assert_int_equal(zd__nn_winograd_forward(zd_tensor_data(xt), N, C, H, W, zd_tensor_data(wt), O,
                                             golden_floats(c, "param", "bias"), pad, y, NULL, NULL),
                     0);
    double *e = widen(golden_floats(c, "output", "y"), ny);
    snprintf(what, sizeof what, "golden %s y", strrchr(c->dir, '/') + 1);
    check_close(what, y, e, NULL, ny);
    free(e);

    assert_int_equal(zd__nn_winograd_backward_input(golden_floats(c, "input", "dy"), N, O, Ho, Wo,
                                                    zd_tensor_data(wt), C, pad, dx, NULL, NULL),
                     0);
    e = widen(golden_floats(c, "grad", "x"), nx);
    snprintf(what, sizeof what, "golden %s dx", strrchr(c->dir, '/') + 1);
    check_close(what, dx, e, NULL, nx);
    free(e);
    free(y), free(dx);
    golden_conv_cases++;
}

static void test_golden_conv2d(void **state)
{
    (void)state;
    if (golden_each("conv2d", golden_conv, NULL) < 0)
        fail_msg("cannot read %s", golden_root());
    if (golden_conv_cases == 0)
        fail_msg("no 3x3 stride-1 conv2d case under %s", golden_root());
}

/*  The Net: h1 = relu(conv1(x)) by the reference, then conv2 by Winograd,
    pooled 2x2 in the epilogue, against PyTorch's act.flatten. */
typedef struct {
    int O, Ho, Wo;
    float *pooled;
} pool_epi_t;

static void pool_epilogue(void *arg, int n, float *y_n)
{
    pool_epi_t *p = arg;
    const int Hp = p->Ho / 2, Wp = p->Wo / 2;
    for (int o = 0; o < p->O; o++)
        for (int i = 0; i < Hp; i++)
            for (int j = 0; j < Wp; j++) {
                const float *q = y_n + ((size_t)o * p->Ho + 2 * i) * p->Wo + 2 * j;
                float m = fmaxf(fmaxf(q[0], q[1]), fmaxf(q[p->Wo], q[p->Wo + 1]));
                p->pooled[(((size_t)n * p->O + o) * Hp + i) * Wp + j] = m;
            }
}

static int golden_net_cases;

static void golden_net(golden_case_t *c, void *arg)
{
    (void)arg;
    zd_tensor_t *xt = golden_tensor(c, "input", "x"),
                *w1 = golden_tensor(c, "param", "conv1.weight");
    zd_tensor_t *w2 = golden_tensor(c, "param", "conv2.weight");
    assert_true(xt && w1 && w2);
    const int N = (int)zd_tensor_size(xt, 0), H = (int)zd_tensor_size(xt, 2);
    const int C1 = (int)zd_tensor_size(w1, 0), O = (int)zd_tensor_size(w2, 0);
    const int H1 = H - 2, H2 = H1 - 2;
    const size_t n1 = (size_t)N * C1 * H1 * H1, np = (size_t)N * O * (H2 / 2) * (H2 / 2);
    double *h1d = malloc(sizeof(double) * n1), *mag = malloc(sizeof(double) * n1);
    float *h1 = malloc(sizeof(float) * n1);
    assert_true(h1d && mag && h1);
    ref_forward(zd_tensor_data(xt), N, 1, H, H, zd_tensor_data(w1), C1,
                golden_floats(c, "param", "conv1.bias"), 0, h1d, mag);
    for (size_t i = 0; i < n1; i++)
        h1[i] = h1d[i] > 0 ? (float)h1d[i] : 0.0f;
    pool_epi_t pe = {.O = O, .Ho = H2, .Wo = H2, .pooled = nan_floats(np)};
    assert_int_equal(zd__nn_winograd_forward(h1, N, C1, H1, H1, zd_tensor_data(w2), O,
                                             golden_floats(c, "param", "conv2.bias"), 0, NULL,
                                             pool_epilogue, &pe),
                     0);
    zd_tensor_t *flat = golden_tensor(c, "output", "act.flatten");
    assert_non_null(flat);
    assert_int_equal(zd_tensor_numel(flat), (int64_t)np);
    double *e = widen(zd_tensor_data(flat), np);
    check_close("golden net conv2 + pool (act.flatten)", pe.pooled, e, NULL, np);
    free(e), free(pe.pooled), free(h1), free(h1d), free(mag);
    golden_net_cases++;
}

static void test_golden_net(void **state)
{
    (void)state;
    if (golden_each("net", golden_net, NULL) < 0)
        fail_msg("cannot read %s", golden_root());
    if (golden_net_cases == 0)
        fail_msg("no net case under %s", golden_root());
}

static void test_report(void **state)
{
    (void)state;
    print_message("worst over all cases: |a-e| %.3g, /sum|terms| %.3g, of allowance %.3f\n",
                  worst.abs_err, worst.rel_mag, worst.allowance);
}

int main(void)
{
    /* two threads whatever the machine: the pool's chunks then really run
       concurrently (epilogues and prologues included) */
    if (zd_nn_set_num_threads(2) < 0)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_shapes),  cmocka_unit_test(test_large_channels),
        cmocka_unit_test(test_deterministic), cmocka_unit_test(test_applies_and_errors),
        cmocka_unit_test(test_golden_conv2d), cmocka_unit_test(test_golden_net),
        cmocka_unit_test(test_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
