/* SPDX-License-Identifier: MIT */
/*  The recurrent layers (<zdist/rnn.h>): PyTorch's numbers for every cell
    and for a 2-layer LSTM (the golden-toolkit cases, outputs and every
    gradient), finite-difference gradient checks on small random sizes
    (biases or not, zero states, dropout with a fixed mask), a layer
    against its own cell stepped by hand, the LSTM object, and the error
    paths.

    Gradient checks as in test_nn_gradcheck.c: L = sum_k sum(out_k * r_k)
    for fixed random r_k, analytic gradients from one backward pass from
    every output, numeric ones from float32 central differences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/rng.h>
#include <zdist/rnn.h>
#include "tools/golden_manifest.h"

#define MAX_PROBES  40
#define GOLDEN_RTOL 1e-4
#define GOLDEN_ATOL 1e-5
#define MAX_OUT     3

#include "tests/support/gradcheck.h"

/*  ---- golden cases ---- */

static const char *toolkit_dir(void)
{
    const char *d = getenv("ZDIST_GOLDEN_TOOLKIT_DIR");
    return d && *d ? d : ZD_TEST_GOLDEN_TOOLKIT_DEFAULT;
}

/*  Every element of `got` within the README's tolerance of `want`. */
static void expect_close(const char *where, const char *name, zd_tensor_t *got, zd_tensor_t *want)
{
    if (!got)
        fail_msg("%s: %s: nothing computed", where, name);
    if (!want)
        fail_msg("%s: %s: not in the manifest", where, name);
    if (zd_tensor_numel(got) != zd_tensor_numel(want))
        fail_msg("%s: %s: %lld elements, expected %lld", where, name,
                 (long long)zd_tensor_numel(got), (long long)zd_tensor_numel(want));
    const float *a = zd_tensor_data(got), *e = zd_tensor_data(want);
    for (int64_t i = 0; i < zd_tensor_numel(got); i++)
        if (!(fabs((double)a[i] - e[i]) <= GOLDEN_ATOL + GOLDEN_RTOL * fabs((double)e[i])))
            fail_msg("%s: %s[%lld] = %.8g, PyTorch %.8g", where, name, (long long)i, (double)a[i],
                     (double)e[i]);
}

/*  A copy of the case's tensor, a leaf requiring grad; NULL when absent. */
static zd_tensor_t *golden_leaf(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_tensor(c, role, name);
    return t ? leaf(zd_tensor_detach_copy(t)) : NULL;
}

static void check_grad(golden_case_t *c, const char *name, zd_tensor_t *t)
{
    zd_tensor_t *g = zd_tensor_grad(t);
    expect_close(c->dir, name, g, golden_tensor(c, "grad", name));
    zd_tensor_unref(g);
}

/*  Backward from every output k with gradient dy.<name_k> (or dy). */
static void backward_from(golden_case_t *c, int n, zd_tensor_t **outs, const char *const *names)
{
    zd_autograd_root_t roots[MAX_OUT] = {{0}};
    for (int k = 0; k < n; k++) {
        char dy[64];
        snprintf(dy, sizeof dy, n == 1 ? "dy" : "dy.%s", names[k]);
        roots[k].tensor = outs[k];
        roots[k].grad = golden_tensor(c, "input", dy);
        if (!roots[k].grad)
            fail_msg("%s: no input %s", c->dir, dy);
    }
    if (zd_autograd_run(roots, n, NULL) < 0)
        fail_msg("%s: backward: %s", c->dir, zd_error_last());
}

static int run_cell_case(golden_case_t *c)
{
    static const char *const pnames[4] = {"w_ih", "w_hh", "b_ih", "b_hh"};
    const bool lstm = strcmp(c->kind, "lstm_cell") == 0;
    zd_tensor_t *x = golden_leaf(c, "input", "x"), *h = golden_leaf(c, "input", "h");
    zd_tensor_t *cs = lstm ? golden_leaf(c, "input", "c") : NULL, *p[4];
    for (int k = 0; k < 4; k++)
        p[k] = golden_leaf(c, "param", pnames[k]);
    zd_tensor_t *outs[2] = {NULL, NULL};
    int rc;
    if (lstm)
        rc = zd_nn_lstm_cell(x, h, cs, p[0], p[1], p[2], p[3], &outs[0], &outs[1]);
    else if (strcmp(c->kind, "gru_cell") == 0)
        rc = zd_nn_gru_cell(x, h, p[0], p[1], p[2], p[3], &outs[0]);
    else
        rc = zd_nn_rnn_tanh_cell(x, h, p[0], p[1], p[2], p[3], &outs[0]);
    if (rc < 0)
        fail_msg("%s: %s", c->dir, zd_error_last());
    static const char *const lstm_out[2] = {"h", "c"}, *const one_out[1] = {"y"};
    const char *const *onames = lstm ? lstm_out : one_out;
    const int n_out = lstm ? 2 : 1;
    for (int k = 0; k < n_out; k++)
        expect_close(c->dir, onames[k], outs[k], golden_tensor(c, "output", onames[k]));
    backward_from(c, n_out, outs, onames);
    check_grad(c, "x", x);
    check_grad(c, "h", h);
    if (lstm)
        check_grad(c, "c", cs);
    for (int k = 0; k < 4; k++)
        check_grad(c, pnames[k], p[k]);
    for (int k = 0; k < n_out; k++)
        zd_tensor_unref(outs[k]);
    zd_tensor_unref(x);
    zd_tensor_unref(h);
    zd_tensor_unref(cs);
    for (int k = 0; k < 4; k++)
        zd_tensor_unref(p[k]);
    return 0;
}

static void run_lstm_case(golden_case_t *c)
{
    const int L = (int)golden_attr(c, "num_layers", 1);
    assert_true(L >= 1 && L <= 8);
    assert_int_equal((int)golden_attr(c, "batch_first", 0), 0);
    assert_true(golden_attr(c, "dropout", 0) == 0);
    zd_tensor_t *x = golden_leaf(c, "input", "x");
    zd_tensor_t *h0 = golden_leaf(c, "input", "h0"), *c0 = golden_leaf(c, "input", "c0");
    zd_tensor_t *p[32];
    char pn[32][32];
    static const char *const kinds[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int i = 0; i < 4 * L; i++) {
        snprintf(pn[i], sizeof pn[i], "%s_l%d", kinds[i % 4], i / 4);
        p[i] = golden_leaf(c, "param", pn[i]);
        if (!p[i])
            fail_msg("%s: no param %s", c->dir, pn[i]);
    }
    zd_tensor_t *outs[3];
    if (zd_nn_lstm(x, h0, c0, p, L, 0.0f, false, NULL, &outs[0], &outs[1], &outs[2]) < 0)
        fail_msg("%s: %s", c->dir, zd_error_last());
    static const char *const onames[3] = {"output", "h_n", "c_n"};
    for (int k = 0; k < 3; k++)
        expect_close(c->dir, onames[k], outs[k], golden_tensor(c, "output", onames[k]));
    backward_from(c, 3, outs, onames);
    check_grad(c, "x", x);
    check_grad(c, "h0", h0);
    check_grad(c, "c0", c0);
    for (int i = 0; i < 4 * L; i++)
        check_grad(c, pn[i], p[i]);
    for (int k = 0; k < 3; k++)
        zd_tensor_unref(outs[k]);
    zd_tensor_unref(x);
    zd_tensor_unref(h0);
    zd_tensor_unref(c0);
    for (int i = 0; i < 4 * L; i++)
        zd_tensor_unref(p[i]);
}

/*  Every case of the toolkit folder of a recurrent kind; each kind must be
    there at least once. */
static void test_golden_cases(void **state)
{
    (void)state;
    const int64_t live = zd_tensor_live_count();
    static const char *const kinds[4] = {"lstm_cell", "gru_cell", "rnn_tanh_cell", "lstm"};
    int seen[4] = {0};
    DIR *d = opendir(toolkit_dir());
    if (!d)
        fail_msg("cannot open the golden toolkit folder %s", toolkit_dir());
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        char path[2048], manifest[2100];
        struct stat st;
        if (ent->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", toolkit_dir(), ent->d_name);
        snprintf(manifest, sizeof manifest, "%s/manifest.txt", path);
        if (stat(manifest, &st) != 0)
            continue;
        golden_case_t *c = golden_case_load(path);
        if (!c)
            fail_msg("%s: %s", path, zd_error_last());
        for (int k = 0; k < 4; k++) {
            if (strcmp(c->kind, kinds[k]) != 0)
                continue;
            if (k < 3)
                run_cell_case(c);
            else
                run_lstm_case(c);
            seen[k]++;
        }
        golden_case_free(c);
    }
    closedir(d);
    for (int k = 0; k < 4; k++)
        if (!seen[k])
            fail_msg("no golden case of kind %s in %s", kinds[k], toolkit_dir());
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- finite-difference gradient checks ---- */

typedef struct check check_t;
/*  Fills outs with up to MAX_OUT outputs; returns how many, or -1. */
typedef int(fn_t)(check_t *c, zd_tensor_t **outs);

struct check {
    const char *name;
    fn_t *fn;
    int n_in;
    zd_tensor_t *in[16]; /* NULL allowed; those requiring grad are checked */
    int layers;
    float dropout;
    uint64_t mask_seed;
};

static int run(void *arg, zd_tensor_t **outs)
{
    check_t *c = arg;
    return c->fn(c, outs);
}

static void check(check_t *c)
{
    gradcheck(&(gradcheck_t){.name = c->name,
                             .fn = run,
                             .arg = c,
                             .inputs = c->in,
                             .n_inputs = c->n_in,
                             .max_probes = MAX_PROBES});
}

static void release(check_t *c)
{
    for (int i = 0; i < c->n_in; i++)
        zd_tensor_unref(c->in[i]);
}

/*  in: x, h, c (lstm only, else NULL), w_ih, w_hh, b_ih, b_hh */
static int fn_lstm_cell(check_t *c, zd_tensor_t **outs)
{
    zd_tensor_t **a = c->in;
    return zd_nn_lstm_cell(a[0], a[1], a[2], a[3], a[4], a[5], a[6], &outs[0], &outs[1]) < 0 ? -1
                                                                                             : 2;
}

static int fn_gru_cell(check_t *c, zd_tensor_t **outs)
{
    zd_tensor_t **a = c->in;
    return zd_nn_gru_cell(a[0], a[1], a[3], a[4], a[5], a[6], &outs[0]) < 0 ? -1 : 1;
}

static int fn_rnn_tanh_cell(check_t *c, zd_tensor_t **outs)
{
    zd_tensor_t **a = c->in;
    return zd_nn_rnn_tanh_cell(a[0], a[1], a[3], a[4], a[5], a[6], &outs[0]) < 0 ? -1 : 1;
}

/*  in: x, h0, c0, then 4 per layer. The dropout mask is the same at every
    evaluation: the generator restarts from mask_seed. */
static int fn_lstm(check_t *c, zd_tensor_t **outs)
{
    zd_rng_t masks;
    zd_rng_seed(&masks, c->mask_seed);
    return zd_nn_lstm(c->in[0], c->in[1], c->in[2], c->in + 3, c->layers, c->dropout, true, &masks,
                      &outs[0], &outs[1], &outs[2]) < 0
        ? -1
        : 3;
}

static void cell_case(const char *name, fn_t *fn, int gates, int N, int I, int H, bool bias,
                      bool state)
{
    char label[128];
    snprintf(label, sizeof label, "%s N%d I%d H%d%s%s", name, N, I, H, bias ? "" : " no bias",
             state ? "" : " zero state");
    check_t c = {.name = label, .fn = fn, .n_in = 7};
    c.in[0] = leaf(randn(2, (int64_t[]){N, I}, 1.0f));
    if (state) {
        c.in[1] = leaf(randn(2, (int64_t[]){N, H}, 1.0f));
        if (fn == fn_lstm_cell)
            c.in[2] = leaf(randn(2, (int64_t[]){N, H}, 1.0f));
    }
    c.in[3] = leaf(randn(2, (int64_t[]){gates * H, I}, 0.5f));
    c.in[4] = leaf(randn(2, (int64_t[]){gates * H, H}, 0.5f));
    if (bias) {
        c.in[5] = leaf(randn(1, (int64_t[]){gates * H}, 0.5f));
        c.in[6] = leaf(randn(1, (int64_t[]){gates * H}, 0.5f));
    }
    check(&c);
    release(&c);
}

static void test_gradcheck_cells(void **state)
{
    (void)state;
    for (int b = 0; b < 2; b++) {
        cell_case("lstm_cell", fn_lstm_cell, 4, 3, 4, 5, b, true);
        cell_case("gru_cell", fn_gru_cell, 3, 3, 4, 5, b, true);
        cell_case("rnn_tanh_cell", fn_rnn_tanh_cell, 1, 3, 4, 5, b, true);
    }
    cell_case("lstm_cell", fn_lstm_cell, 4, 2, 3, 4, true, false);
    cell_case("gru_cell", fn_gru_cell, 3, 2, 3, 4, true, false);
    cell_case("rnn_tanh_cell", fn_rnn_tanh_cell, 1, 2, 3, 4, true, false);
    cell_case("lstm_cell", fn_lstm_cell, 4, 1, 1, 1, true, true); /* sizes of 1 */
    cell_case("gru_cell", fn_gru_cell, 3, 5, 2, 1, true, true);
}

static void lstm_case_scaled(int T, int N, int I, int H, int L, bool bias, bool states,
                             float dropout, float wscale)
{
    char label[128];
    snprintf(label, sizeof label, "lstm T%d N%d I%d H%d L%d%s%s dropout %g", T, N, I, H, L,
             bias ? "" : " no bias", states ? "" : " zero states", (double)dropout);
    check_t c = {.name = label,
                 .fn = fn_lstm,
                 .n_in = 3 + 4 * L,
                 .layers = L,
                 .dropout = dropout,
                 .mask_seed = 11};
    c.in[0] = leaf(randn(3, (int64_t[]){T, N, I}, 1.0f));
    if (states) {
        c.in[1] = leaf(randn(3, (int64_t[]){L, N, H}, 1.0f));
        c.in[2] = leaf(randn(3, (int64_t[]){L, N, H}, 1.0f));
    }
    for (int l = 0; l < L; l++) {
        zd_tensor_t **p = c.in + 3 + 4 * l;
        p[0] = leaf(randn(2, (int64_t[]){4 * H, l ? H : I}, wscale));
        p[1] = leaf(randn(2, (int64_t[]){4 * H, H}, wscale));
        if (bias) {
            p[2] = leaf(randn(1, (int64_t[]){4 * H}, 0.5f));
            p[3] = leaf(randn(1, (int64_t[]){4 * H}, 0.5f));
        }
    }
    check(&c);
    release(&c);
}

static void lstm_case(int T, int N, int I, int H, int L, bool bias, bool states, float dropout)
{
    lstm_case_scaled(T, N, I, H, L, bias, states, dropout, 0.5f);
}

static void test_gradcheck_lstm(void **state)
{
    (void)state;
    lstm_case(4, 3, 5, 6, 2, true, true, 0.0f); /* the golden case's sizes */
    lstm_case(5, 2, 3, 4, 2, true, true, 0.0f);
    lstm_case(3, 2, 4, 3, 2, false, false, 0.0f);
    lstm_case(1, 1, 2, 2, 1, true, true, 0.0f); /* one step */
    lstm_case(6, 2, 3, 3, 3, true, true, 0.0f); /* three layers */
    lstm_case(4, 2, 3, 4, 2, true, true, 0.4f); /* dropout between layers */
    /* a wider one, where OpenBLAS runs the products on its own kernels */
    lstm_case_scaled(3, 16, 8, 128, 1, true, true, 0.0f, 0.1f);
}

/*  ---- a layer against its own cell ---- */

/*  One layer over T steps gives what T calls of zd_nn_lstm_cell give, and
    the same gradients (up to the order of float sums). */
static void test_layer_matches_cell_steps(void **state)
{
    (void)state;
    const int T = 5, N = 3, I = 4, H = 6;
    const int64_t live = zd_tensor_live_count();
    zd_tensor_t *x = leaf(randn(3, (int64_t[]){T, N, I}, 1.0f));
    zd_tensor_t *h0 = leaf(randn(3, (int64_t[]){1, N, H}, 1.0f));
    zd_tensor_t *c0 = leaf(randn(3, (int64_t[]){1, N, H}, 1.0f));
    zd_tensor_t *p[4] = {
        leaf(randn(2, (int64_t[]){4 * H, I}, 0.5f)), leaf(randn(2, (int64_t[]){4 * H, H}, 0.5f)),
        leaf(randn(1, (int64_t[]){4 * H}, 0.5f)), leaf(randn(1, (int64_t[]){4 * H}, 0.5f))};
    zd_tensor_t *dy = randn(3, (int64_t[]){T, N, H}, 1.0f);

    zd_tensor_t *out, *hn, *cn;
    assert_int_equal(zd_nn_lstm(x, h0, c0, p, 1, 0.0f, false, NULL, &out, &hn, &cn), 0);
    assert_int_equal(zd_autograd_backward(out, dy, false), 0);
    zd_tensor_t *g_layer[7];
    zd_tensor_t *all[7] = {x, h0, c0, p[0], p[1], p[2], p[3]};
    for (int k = 0; k < 7; k++) {
        g_layer[k] = zd_tensor_grad(all[k]);
        assert_non_null(g_layer[k]);
        zd_tensor_clear_grad(all[k]);
    }

    /* by hand: the states (N, H) as views of h0, c0; x[t] by narrow */
    zd_tensor_t *h, *c;
    assert_int_equal(zd_tensor_reshape(h0, (int64_t[]){N, H}, 2, &h), 0);
    assert_int_equal(zd_tensor_reshape(c0, (int64_t[]){N, H}, 2, &c), 0);
    for (int t = 0; t < T; t++) {
        zd_tensor_t *xt3, *xt, *hn2, *cn2, *ht3;
        assert_int_equal(zd_tensor_narrow(x, 0, t, 1, &xt3), 0);
        assert_int_equal(zd_tensor_reshape(xt3, (int64_t[]){N, I}, 2, &xt), 0);
        assert_int_equal(zd_nn_lstm_cell(xt, h, c, p[0], p[1], p[2], p[3], &hn2, &cn2), 0);
        /* same numbers forward */
        const float *a = zd_tensor_data(hn2), *e = zd_tensor_data(out) + (int64_t)t * N * H;
        for (int k = 0; k < N * H; k++)
            assert_true(fabsf(a[k] - e[k]) <= 1e-5f);
        /* backward one step at a time would need the graph kept; sum the
           steps' losses instead: L = sum_t sum(h_t * dy_t) */
        zd_tensor_t *dyt;
        assert_int_equal(zd_tensor_narrow(dy, 0, t, 1, &dyt), 0);
        assert_int_equal(zd_tensor_reshape(hn2, (int64_t[]){1, N, H}, 3, &ht3), 0);
        zd_tensor_t *prod, *s;
        assert_int_equal(zd_tensor_mul(ht3, dyt, &prod), 0);
        assert_int_equal(zd_tensor_sum(prod, &s), 0);
        assert_int_equal(zd_autograd_backward(s, NULL, true), 0);
        zd_tensor_unref(s);
        zd_tensor_unref(prod);
        zd_tensor_unref(ht3);
        zd_tensor_unref(dyt);
        zd_tensor_unref(xt);
        zd_tensor_unref(xt3);
        zd_tensor_unref(h);
        zd_tensor_unref(c);
        h = hn2;
        c = cn2;
    }
    zd_tensor_unref(h);
    zd_tensor_unref(c);
    for (int k = 0; k < 7; k++) {
        zd_tensor_t *g = zd_tensor_grad(all[k]);
        assert_non_null(g);
        for (int64_t i = 0; i < zd_tensor_numel(g); i++) {
            float a = zd_tensor_data(g)[i], e = zd_tensor_data(g_layer[k])[i];
            if (!(fabsf(a - e) <= 1e-4f + 1e-4f * fabsf(e)))
                fail_msg("input %d [%lld]: steps %g, layer %g", k, (long long)i, (double)a,
                         (double)e);
        }
        zd_tensor_unref(g);
        zd_tensor_unref(g_layer[k]);
    }
    zd_tensor_unref(out);
    zd_tensor_unref(hn);
    zd_tensor_unref(cn);
    zd_tensor_unref(dy);
    for (int k = 0; k < 7; k++)
        zd_tensor_unref(all[k]);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- the object ---- */

static void test_lstm_object(void **state)
{
    (void)state;
    const int64_t live = zd_tensor_live_count();
    zd_nn_module_t *m = zd_nn_lstm_new(5, 7, 2, 0.5f, 3);
    assert_non_null(m);
    assert_string_equal(zd_nn_module_type(m), "LSTM");
    assert_int_equal(zd_nn_module_n_params(m), 8);
    static const char *const names[8] = {"weight_ih_l0", "weight_hh_l0", "bias_ih_l0",
                                         "bias_hh_l0",   "weight_ih_l1", "weight_hh_l1",
                                         "bias_ih_l1",   "bias_hh_l1"};
    const int64_t cols[8] = {5, 7, 0, 0, 7, 7, 0, 0};
    const float bound = 1.0f / sqrtf(7.0f);
    for (int i = 0; i < 8; i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i);
        assert_string_equal(zd_nn_module_param_name(m, i), names[i]);
        assert_string_equal(zd_tensor_name(p), names[i]);
        assert_true(zd_tensor_requires_grad(p) && zd_tensor_is_leaf(p));
        assert_int_equal(zd_tensor_size(p, 0), 28);
        assert_int_equal(zd_tensor_ndim(p), cols[i] ? 2 : 1);
        if (cols[i])
            assert_int_equal(zd_tensor_size(p, 1), cols[i]);
        float lo = 1, hi = -1;
        for (int64_t k = 0; k < zd_tensor_numel(p); k++) {
            float v = zd_tensor_data(p)[k];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        assert_true(lo >= -bound && hi < bound && hi - lo > bound); /* spread over the range */
    }
    assert_null(zd_nn_module_param(m, 8));
    assert_null(zd_nn_module_param_name(m, -1));
    assert_int_equal(zd_nn_module_numel(m), 28 * (5 + 7 + 1 + 1) + 28 * (7 + 7 + 1 + 1));

    /* the same seed, the same parameters */
    zd_nn_module_t *m2 = zd_nn_lstm_new(5, 7, 2, 0.5f, 3);
    assert_non_null(m2);
    for (int i = 0; i < 8; i++)
        assert_memory_equal(zd_tensor_data(zd_nn_module_param(m, i)),
                            zd_tensor_data(zd_nn_module_param(m2, i)),
                            zd_tensor_nbytes(zd_nn_module_param(m, i)));

    zd_tensor_t *x = randn(3, (int64_t[]){4, 2, 5}, 1.0f);
    zd_tensor_t *o1, *o2, *hn, *cn, *outs[3];
    /* training: dropout differs between calls; eval: identical, no dropout */
    assert_true(zd_nn_module_is_training(m));
    assert_int_equal(zd_nn_module_forward(m, &x, 1, outs, 3), 0);
    o1 = outs[0], hn = outs[1], cn = outs[2];
    assert_int_equal(zd_tensor_ndim(o1), 3);
    assert_int_equal(zd_tensor_size(o1, 0), 4);
    assert_int_equal(zd_tensor_size(o1, 1), 2);
    assert_int_equal(zd_tensor_size(o1, 2), 7);
    assert_int_equal(zd_tensor_size(hn, 0), 2);
    assert_int_equal(zd_tensor_size(cn, 2), 7);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &o2, 1), 0);
    assert_memory_not_equal(zd_tensor_data(o1), zd_tensor_data(o2), zd_tensor_nbytes(o1));
    /* gradients reach every parameter */
    zd_tensor_t *s;
    assert_int_equal(zd_tensor_sum(o2, &s), 0);
    assert_int_equal(zd_autograd_backward(s, NULL, false), 0);
    zd_tensor_unref(s);
    for (int i = 0; i < 8; i++) {
        zd_tensor_t *g = zd_tensor_grad(zd_nn_module_param(m, i));
        assert_non_null(g);
        zd_tensor_unref(g);
    }
    zd_nn_module_zero_grad(m);
    for (int i = 0; i < 8; i++)
        assert_null(zd_tensor_grad(zd_nn_module_param(m, i)));
    zd_tensor_unref(o1);
    zd_tensor_unref(o2);
    zd_tensor_unref(hn);
    zd_tensor_unref(cn);
    assert_true(zd_nn_module_train(m, false));
    assert_false(zd_nn_module_is_training(m));
    zd_nn_module_train(m2, false);
    assert_int_equal(zd_nn_module_forward(m, &x, 1, &o1, 1), 0);
    assert_int_equal(zd_nn_module_forward(m2, &x, 1, &o2, 1), 0);
    assert_memory_equal(zd_tensor_data(o1), zd_tensor_data(o2), zd_tensor_nbytes(o1));
    zd_tensor_unref(o1);
    zd_tensor_unref(o2);
    /* zero states given explicitly are the NULL default */
    zd_tensor_t *z = zd_tensor_new(ZD_FLOAT32, (int64_t[]){2, 2, 7}, 3);
    assert_int_equal(zd_nn_module_forward(m, (zd_tensor_t *[]){x, z, z}, 3, &o1, 1), 0);
    assert_int_equal(zd_nn_module_forward(m, (zd_tensor_t *[]){x, NULL, NULL}, 3, &o2, 1), 0);
    assert_memory_equal(zd_tensor_data(o1), zd_tensor_data(o2), zd_tensor_nbytes(o1));
    zd_tensor_unref(o1);
    zd_tensor_unref(o2);
    zd_tensor_unref(z);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    zd_nn_module_free(m2);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  The cell objects: PyTorch's shapes, names and bound, and the same
    numbers as the functions with their parameters. */
/*  Forwards that draw dropout masks, from two threads on one LSTM (a
    RemoteModule's owner runs each call on a pool thread): each output is
    one the same model gives in some sequential order of the 2 x N calls,
    as the masks come from one stream drawn whole by one forward at a time
    (ThreadSanitizer sees the draws in the threaded test builds). */
enum { CONC_N = 8 };

typedef struct {
    zd_nn_module_t *m;
    zd_tensor_t *x;
    zd_tensor_t *out[CONC_N];
    int rc;
} conc_arg_t;

static void *conc_worker(void *p)
{
    conc_arg_t *a = p;
    for (int i = 0; i < CONC_N && a->rc == 0; i++)
        a->rc = zd_nn_module_forward(a->m, &a->x, 1, &a->out[i], 1);
    return NULL;
}

static void test_lstm_concurrent_forwards(void **state)
{
    (void)state;
    zd_nn_module_t *m = zd_nn_lstm_new(5, 7, 2, 0.5f, 11), *ref = zd_nn_lstm_new(5, 7, 2, 0.5f, 11);
    assert_non_null(m);
    assert_non_null(ref);
    zd_tensor_t *x = randn(3, (int64_t[]){4, 2, 5}, 1.0f);
    zd_tensor_t *seq[2 * CONC_N];
    for (int i = 0; i < 2 * CONC_N; i++)
        assert_int_equal(zd_nn_module_forward(ref, &x, 1, &seq[i], 1), 0);
    conc_arg_t a[2] = {{.m = m, .x = x}, {.m = m, .x = x}};
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        assert_int_equal(pthread_create(&t[k], NULL, conc_worker, &a[k]), 0);
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    bool used[2 * CONC_N] = {false};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(a[k].rc, 0);
        for (int i = 0; i < CONC_N; i++) {
            int found = -1;
            for (int j = 0; j < 2 * CONC_N && found < 0; j++)
                if (!used[j] &&
                    memcmp(zd_tensor_data(a[k].out[i]), zd_tensor_data(seq[j]),
                           zd_tensor_nbytes(seq[j])) == 0)
                    found = j;
            assert_true(found >= 0); /* masks a sequential run draws too */
            used[found] = true;
            zd_tensor_unref(a[k].out[i]);
        }
    }
    for (int i = 0; i < 2 * CONC_N; i++)
        zd_tensor_unref(seq[i]);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    zd_nn_module_free(ref);
}

static void test_cell_objects(void **state)
{
    (void)state;
    const int64_t live = zd_tensor_live_count();
    zd_nn_module_t *cells[3] = {zd_nn_lstm_cell_new(3, 5, 1), zd_nn_gru_cell_new(3, 5, 1),
                                zd_nn_rnn_tanh_cell_new(3, 5, 1)};
    const int gates[3] = {4, 3, 1};
    static const char *const types[3] = {"LSTMCell", "GRUCell", "RNNCell"};
    static const char *const names[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    zd_tensor_t *x = randn(2, (int64_t[]){2, 3}, 1.0f), *h = randn(2, (int64_t[]){2, 5}, 1.0f);
    for (int k = 0; k < 3; k++) {
        zd_nn_module_t *m = cells[k];
        assert_non_null(m);
        assert_string_equal(zd_nn_module_type(m), types[k]);
        assert_int_equal(zd_nn_module_n_params(m), 4);
        assert_null(zd_nn_module_param(m, 4));
        zd_tensor_t *p[4];
        for (int i = 0; i < 4; i++) {
            p[i] = zd_nn_module_param(m, i);
            assert_string_equal(zd_nn_module_param_name(m, i), names[i]);
            assert_true(zd_tensor_requires_grad(p[i]));
            assert_int_equal(zd_tensor_size(p[i], 0), gates[k] * 5);
            for (int64_t j = 0; j < zd_tensor_numel(p[i]); j++)
                assert_true(fabsf(zd_tensor_data(p[i])[j]) <= 1.0f / sqrtf(5.0f));
        }
        assert_int_equal(zd_tensor_size(p[0], 1), 3);
        assert_int_equal(zd_tensor_size(p[1], 1), 5);
        zd_tensor_t *a = NULL, *b = NULL, *ca = NULL, *cb = NULL, *outs[3] = {NULL};
        zd_tensor_t *xhh[3] = {x, h, h};
        if (k == 0) {
            assert_int_equal(zd_nn_module_forward(m, xhh, 3, outs, 2), 0);
            a = outs[0], ca = outs[1];
            assert_int_equal(zd_nn_lstm_cell(x, h, h, p[0], p[1], p[2], p[3], &b, &cb), 0);
            assert_memory_equal(zd_tensor_data(ca), zd_tensor_data(cb), zd_tensor_nbytes(ca));
            /* h' alone; and no third output */
            zd_tensor_t *h1 = NULL;
            assert_int_equal(zd_nn_module_forward(m, xhh, 3, &h1, 1), 0);
            assert_memory_equal(zd_tensor_data(h1), zd_tensor_data(b), zd_tensor_nbytes(b));
            zd_tensor_unref(h1);
            zd_error_clear();
            assert_int_equal(zd_nn_module_forward(m, xhh, 3, outs, 3), -1);
            assert_true(zd_error_code() == ZD_ERR_ARGUMENT);
            assert_true(!outs[0] && !outs[1] && !outs[2]);
        } else {
            assert_int_equal(zd_nn_module_forward(m, xhh, 2, &a, 1), 0);
            if (k == 1)
                assert_int_equal(zd_nn_gru_cell(x, h, p[0], p[1], p[2], p[3], &b), 0);
            else
                assert_int_equal(zd_nn_rnn_tanh_cell(x, h, p[0], p[1], p[2], p[3], &b), 0);
            /* no cell state in or out */
            assert_int_equal(zd_nn_module_forward(m, xhh, 3, outs, 1), -1);
            assert_int_equal(zd_nn_module_forward(m, xhh, 2, outs, 2), -1);
            assert_true(!outs[0] && !outs[1]);
        }
        assert_memory_equal(zd_tensor_data(a), zd_tensor_data(b), zd_tensor_nbytes(a));
        zd_tensor_unref(a);
        zd_tensor_unref(b);
        zd_tensor_unref(ca);
        zd_tensor_unref(cb);
        zd_nn_module_free(m);
    }
    assert_null(zd_nn_gru_cell_new(0, 5, 1));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_tensor_unref(x);
    zd_tensor_unref(h);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- error paths ---- */

/*  The call failed with a message, and left its outputs NULL. */
#define EXPECT_FAIL(call, ...)                                                                     \
    do {                                                                                           \
        zd_error_clear();                                                                          \
        assert_int_equal((call), -1);                                                              \
        assert_true(zd_error_last()[0] != '\0');                                                   \
        zd_tensor_t *outs_[] = {__VA_ARGS__};                                                      \
        for (size_t k_ = 0; k_ < sizeof outs_ / sizeof *outs_; k_++)                               \
            assert_null(outs_[k_]);                                                                \
    } while (0)

static void test_errors(void **state)
{
    (void)state;
    const int64_t live = zd_tensor_live_count();
    const int N = 2, I = 3, H = 4;
    zd_tensor_t *x = randn(2, (int64_t[]){N, I}, 1.0f), *h = randn(2, (int64_t[]){N, H}, 1.0f);
    zd_tensor_t *w4i = randn(2, (int64_t[]){4 * H, I}, 1.0f),
                *w4h = randn(2, (int64_t[]){4 * H, H}, 1.0f);
    zd_tensor_t *w3i = randn(2, (int64_t[]){3 * H, I}, 1.0f),
                *w3h = randn(2, (int64_t[]){3 * H, H}, 1.0f);
    zd_tensor_t *b4 = randn(1, (int64_t[]){4 * H}, 1.0f), *b3 = randn(1, (int64_t[]){3 * H}, 1.0f);
    zd_tensor_t *bad_x = randn(2, (int64_t[]){N, I + 1}, 1.0f);
    zd_tensor_t *bad_h = randn(2, (int64_t[]){N + 1, H}, 1.0f);
    zd_tensor_t *x3 = randn(3, (int64_t[]){1, N, I}, 1.0f);
    zd_tensor_t *ints = zd_tensor_new(ZD_INT64, (int64_t[]){N, I}, 2);
    zd_tensor_t *o = NULL, *o2 = NULL, *o3 = NULL;

    EXPECT_FAIL(zd_nn_lstm_cell(bad_x, h, h, w4i, w4h, b4, b4, &o, &o2), o, o2);
    EXPECT_FAIL(zd_nn_lstm_cell(x, bad_h, h, w4i, w4h, b4, b4, &o, &o2), o, o2);
    EXPECT_FAIL(zd_nn_lstm_cell(x, h, bad_h, w4i, w4h, b4, b4, &o, &o2), o, o2);
    EXPECT_FAIL(zd_nn_lstm_cell(x, h, h, w3i, w3h, b4, b4, &o, &o2), o, o2);  /* 3 gates */
    EXPECT_FAIL(zd_nn_lstm_cell(x, h, h, w4i, w4h, b3, b4, &o, &o2), o, o2);  /* bias size */
    EXPECT_FAIL(zd_nn_lstm_cell(x3, h, h, w4i, w4h, b4, b4, &o, &o2), o, o2); /* 3-D x */
    EXPECT_FAIL(zd_nn_lstm_cell(ints, h, h, w4i, w4h, b4, b4, &o, &o2), o, o2);
    EXPECT_FAIL(zd_nn_lstm_cell(x, h, h, NULL, w4h, b4, b4, &o, &o2), o, o2);
    EXPECT_FAIL(zd_nn_gru_cell(x, h, w4i, w4h, b4, b4, &o), o); /* 4 gates */
    EXPECT_FAIL(zd_nn_gru_cell(x, bad_h, w3i, w3h, b3, b3, &o), o);
    EXPECT_FAIL(zd_nn_gru_cell(bad_x, h, w3i, w3h, b3, b3, &o), o);
    EXPECT_FAIL(zd_nn_rnn_tanh_cell(x, h, w3i, w3h, NULL, NULL, &o), o); /* 3H rows */
    EXPECT_FAIL(zd_nn_rnn_tanh_cell(x, h, w4h, w4h, NULL, NULL, &o), o); /* w_ih columns */

    /* the sequence: x (T, N, I), params per layer, states (L, N, H) */
    zd_tensor_t *seq = randn(3, (int64_t[]){3, N, I}, 1.0f);
    zd_tensor_t *w1i = randn(2, (int64_t[]){4 * H, H}, 1.0f);
    zd_tensor_t *p2[8] = {w4i, w4h, b4, b4, w1i, w4h, b4, b4};
    zd_tensor_t *p2_bad[8] = {w4i, w4h, b4, b4, w4i, w4h, b4, b4}; /* layer 1 takes I, not H */
    zd_tensor_t *s2 = randn(3, (int64_t[]){2, N, H}, 1.0f),
                *s1 = randn(3, (int64_t[]){1, N, H}, 1.0f);
    zd_rng_t r;
    zd_rng_seed(&r, 1);
    EXPECT_FAIL(zd_nn_lstm(seq, s2, s2, p2_bad, 2, 0, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(seq, s1, s2, p2, 2, 0, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(seq, s2, s1, p2, 2, 0, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(x, NULL, NULL, p2, 2, 0, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(seq, NULL, NULL, p2, 0, 0, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(seq, NULL, NULL, NULL, 2, 0, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(seq, NULL, NULL, p2, 2, 1.5f, false, NULL, &o, &o2, &o3), o, o2, o3);
    EXPECT_FAIL(zd_nn_lstm(seq, NULL, NULL, p2, 2, 0.5f, true, NULL, &o, &o2, &o3), o, o2, o3);
    /* and what works after all that: dropout needs no generator in eval */
    assert_int_equal(zd_nn_lstm(seq, s2, s2, p2, 2, 0.5f, false, NULL, &o, &o2, &o3), 0);
    zd_tensor_unref(o);
    zd_tensor_unref(o2);
    zd_tensor_unref(o3);
    assert_int_equal(zd_nn_lstm(seq, NULL, NULL, p2, 2, 0.5f, true, &r, &o, NULL, NULL), 0);
    zd_tensor_unref(o);

    zd_error_clear();
    assert_null(zd_nn_lstm_new(0, 4, 1, 0, 1));
    assert_true(zd_error_last()[0] != '\0');
    assert_null(zd_nn_lstm_new(3, 4, 0, 0, 1));
    assert_null(zd_nn_lstm_new(3, 4, 1, -0.5f, 1));
    zd_nn_module_t *m = zd_nn_lstm_new(3, 4, 2, 0, 1);
    assert_non_null(m);
    zd_tensor_t *outs[4] = {NULL};
    EXPECT_FAIL(zd_nn_module_forward(m, &bad_x, 1, outs, 3), outs[0], outs[1], outs[2]);
    EXPECT_FAIL(zd_nn_module_forward(m, &seq, 1, outs, 4), outs[0], outs[1], outs[2], outs[3]);
    EXPECT_FAIL(zd_nn_module_forward(m, (zd_tensor_t *[]){seq, s2}, 2, outs, 1), outs[0]);
    EXPECT_FAIL(zd_nn_module_forward(m, &seq, 1, outs, 0), outs[0]);
    EXPECT_FAIL(zd_nn_module_forward(NULL, &seq, 1, outs, 1), outs[0]);
    zd_nn_module_free(m);

    zd_tensor_t *all[] = {x,     h,     w4i, w4h,  w3i, w3h, b4, b3,
                          bad_x, bad_h, x3,  ints, seq, w1i, s2, s1};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        zd_tensor_unref(all[k]);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  A NaN in the input comes out as NaN where it reaches (as in PyTorch),
    not as a number made up by the fast exp. */
static void test_nan_propagates(void **state)
{
    (void)state;
    const int N = 2, I = 3, H = 4;
    zd_tensor_t *x = randn(2, (int64_t[]){N, I}, 1.0f);
    zd_tensor_t *w_ih = randn(2, (int64_t[]){4 * H, I}, 0.5f),
                *w_hh = randn(2, (int64_t[]){4 * H, H}, 0.5f);
    zd_tensor_t *g_ih = randn(2, (int64_t[]){3 * H, I}, 0.5f),
                *g_hh = randn(2, (int64_t[]){3 * H, H}, 0.5f);
    zd_tensor_t *r_ih = randn(2, (int64_t[]){H, I}, 0.5f),
                *r_hh = randn(2, (int64_t[]){H, H}, 0.5f);
    zd_tensor_data(x)[0] = NAN; /* row 0 only */
    zd_tensor_t *h, *c, *hg, *hr;
    assert_int_equal(zd_nn_lstm_cell(x, NULL, NULL, w_ih, w_hh, NULL, NULL, &h, &c), 0);
    assert_int_equal(zd_nn_gru_cell(x, NULL, g_ih, g_hh, NULL, NULL, &hg), 0);
    assert_int_equal(zd_nn_rnn_tanh_cell(x, NULL, r_ih, r_hh, NULL, NULL, &hr), 0);
    zd_tensor_t *outs[4] = {h, c, hg, hr};
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < H; j++) {
            assert_true(isnan(zd_tensor_data(outs[k])[j]));        /* row 0 */
            assert_true(isfinite(zd_tensor_data(outs[k])[H + j])); /* row 1 */
        }
    for (int k = 0; k < 4; k++)
        zd_tensor_unref(outs[k]);
    zd_tensor_t *all[] = {x, w_ih, w_hh, g_ih, g_hh, r_ih, r_hh};
    for (size_t k = 0; k < sizeof all / sizeof *all; k++)
        zd_tensor_unref(all[k]);
}

int main(void)
{
    gradcheck_seed(2024);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_cases),   cmocka_unit_test(test_gradcheck_cells),
        cmocka_unit_test(test_gradcheck_lstm), cmocka_unit_test(test_layer_matches_cell_steps),
        cmocka_unit_test(test_lstm_object),    cmocka_unit_test(test_lstm_concurrent_forwards),
        cmocka_unit_test(test_cell_objects),   cmocka_unit_test(test_errors),
        cmocka_unit_test(test_nan_propagates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
