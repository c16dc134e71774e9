/* SPDX-License-Identifier: MIT */
/*  golden_check: checks one case folder of tests/golden against this
    project's ops, models and optimizers.

        golden_check [--quiet] CASE_DIR

    Prints one line per tensor of the manifest (inputs are only read) and a
    summary; exits 0 only when every output and gradient matches within the
    tolerances of the golden README (rtol, atol; read from README.md in the
    case folder or its parent, else 1e-4 and 1e-5). The case kind and
    attributes come from the manifest, never from the folder's name, so new
    folders of known kinds need no code change. Exits 1 when a case failed,
    3 when none failed but some case's kind has no code here. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "tools/golden_check.h"
#include "tools/golden_manifest.h"

/*  ---- computed tensors, by "role:name" ---- */

void results_put(results_t *r, const char *role, const char *name, zd_tensor_t *t)
{
    if (!t || r->n == RESULTS_MAX)
        return;
    snprintf(r->key[r->n], sizeof r->key[0], "%s:%s", role, name);
    r->value[r->n++] = zd_tensor_ref(t);
}

void results_put_subset(results_t *r, const char *role, const char *name, zd_tensor_t *t)
{
    results_put(r, role, name, t);
    if (t && r->n > 0)
        r->subset[r->n - 1] = true;
}

static zd_tensor_t *results_get(const results_t *r, const char *role, const char *name,
                                bool *subset)
{
    char key[160];
    snprintf(key, sizeof key, "%s:%s", role, name);
    for (int i = r->n - 1; i >= 0; i--)
        if (!strcmp(r->key[i], key)) {
            *subset = r->subset[i];
            return r->value[i];
        }
    return NULL;
}

static void results_clear(results_t *r)
{
    for (int i = 0; i < r->n; i++)
        zd_tensor_unref(r->value[i]);
    r->n = 0;
}

/*  A leaf copy of a golden tensor that requires grad, so the golden data is
    never touched by a backward pass. */
zd_tensor_t *golden_leaf(golden_case_t *c, const char *role, const char *name)
{
    zd_tensor_t *t = golden_tensor(c, role, name);
    if (!t) {
        zd_error_set("golden: the case has no %s \"%s\"", role, name);
        return NULL;
    }
    zd_tensor_t *copy = zd_tensor_detach_copy(t);
    if (copy && zd_tensor_dtype(copy) == ZD_FLOAT32 && zd_tensor_set_requires_grad(copy, true) < 0)
        zd_tensor_unref_p(&copy);
    return copy;
}

/*  Records the gradient of each leaf under its name. */
void results_put_grads(results_t *r, int n, zd_tensor_t *const *leaves, const char *const *names)
{
    for (int i = 0; i < n; i++) {
        if (!leaves[i])
            continue;
        zd_tensor_t *g = zd_tensor_grad(leaves[i]);
        results_put(r, "grad", names[i], g);
        zd_tensor_unref(g);
    }
}

/*  ---- tolerances ---- */

static void read_tolerances(const char *dir, double *rtol, double *atol)
{
    *rtol = 1e-4;
    *atol = 1e-5;
    const char *candidates[] = {"%s/README.md", "%s/../README.md"};
    for (int i = 0; i < 2; i++) {
        char path[1200];
        snprintf(path, sizeof path, candidates[i], dir);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char line[512];
        bool found = false;
        while (fgets(line, sizeof line, f)) {
            char *p = strstr(line, "rtol = "), *q = strstr(line, "atol = ");
            if (p && q) {
                *rtol = strtod(p + 7, NULL);
                *atol = strtod(q + 7, NULL);
                found = true;
                break;
            }
        }
        fclose(f);
        if (found)
            return;
    }
}

/*  ---- comparison ---- */

typedef struct {
    int checked, passed, failed;
} tally_t;

static void compare_entry(const golden_entry_t *e, const zd_tensor_t *actual, bool subset,
                          double rtol, double atol, bool quiet, tally_t *tally)
{
    char shape[96];
    const char *rows = e->n_rows ? " (rows)" : "";
    tally->checked++;
    if (!actual) {
        printf("FAIL %-6s %-40s not computed%s%s\n", e->role, e->name,
               zd_error_last()[0] ? ": " : "", zd_error_last());
        tally->failed++;
        return;
    }
    int64_t row_len =
        zd_tensor_ndim(actual) ? zd_tensor_numel(actual) / zd_tensor_size(actual, 0) : 1;
    int n_rows = subset ? 0 : e->n_rows; /* a subset result is compared as it is */
    int64_t want = n_rows ? n_rows * row_len : zd_tensor_numel(actual);
    if (zd_tensor_numel(e->value) != want) {
        printf("FAIL %-6s %-40s expected %lld elements%s, computed %lld %s\n", e->role, e->name,
               (long long)zd_tensor_numel(e->value), rows, (long long)want,
               zd_tensor_shape_str(actual, shape, sizeof shape));
        tally->failed++;
        return;
    }
    const float *a = zd_tensor_data(actual), *x = zd_tensor_data(e->value);
    double worst = 0;
    int64_t worst_i = 0;
    for (int64_t i = 0; i < want; i++) {
        int64_t src = n_rows ? e->rows[i / row_len] * row_len + i % row_len : i;
        if (n_rows && e->rows[i / row_len] >= zd_tensor_size(actual, 0)) {
            worst = INFINITY;
            break;
        }
        double err = fabs((double)a[src] - (double)x[i]) / (atol + rtol * fabs((double)x[i]));
        if (!(err <= worst)) { /* also catches NaN */
            worst = isnan(err) ? INFINITY : err;
            worst_i = i;
        }
    }
    bool ok = worst <= 1.0;
    if (!ok || !quiet)
        printf("%s %-6s %-40s %s%s used %.3f of the tolerance%s\n", ok ? "ok  " : "FAIL", e->role,
               e->name, zd_tensor_shape_str(e->value, shape, sizeof shape), rows, worst,
               ok ? "" : " (worst element below)");
    if (!ok)
        printf("     element %lld: expected %.8g\n", (long long)worst_i, (double)x[worst_i]);
    if (ok)
        tally->passed++;
    else
        tally->failed++;
}

/*  ---- kinds ---- */

typedef int(kind_fn)(golden_case_t *c, results_t *r);

static const struct {
    const char *kind;
    kind_fn *run;
} kinds[] = {
    {"conv2d", golden_run_conv2d},
    {"max_pool2d", golden_run_max_pool2d},
    {"linear", golden_run_linear},
    {"relu", golden_run_relu},
    {"log_softmax", golden_run_log_softmax},
    {"nll_loss", golden_run_nll_loss},
    {"net", golden_run_net},
    {"convnet", golden_run_convnet},
    {"tanh", golden_run_tanh},
    {"sigmoid", golden_run_sigmoid},
    {"exp", golden_run_exp},
    {"log", golden_run_log},
    {"gelu", golden_run_gelu},
    {"softmax", golden_run_softmax},
    {"permute", golden_run_permute},
    {"layer_norm", golden_run_layer_norm},
    {"mse_loss", golden_run_mse_loss},
    {"embedding", golden_run_embedding},
    {"add_broadcast", golden_run_add_broadcast},
    {"mul_broadcast", golden_run_mul_broadcast},
};

int golden_check_dir(const char *dir, bool quiet)
{
    golden_case_t *c = golden_case_load(dir);
    if (!c) {
        printf("FAIL %s: %s\n", dir, zd_error_last());
        return -1;
    }
    double rtol, atol;
    read_tolerances(dir, &rtol, &atol);
    kind_fn *run = NULL;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(kinds[i].kind, c->kind))
            run = kinds[i].run;
    results_t *r = calloc(1, sizeof *r);
    tally_t tally = {0};
    int rc = 0;
    if (!run) {
        printf("FAIL %s: kind \"%s\" not handled here (no code for it in golden_check)\n", dir,
               c->kind);
        rc = GOLDEN_UNKNOWN_KIND;
    } else if (!r) {
        printf("FAIL %s: out of memory\n", dir);
        rc = -1;
    } else {
        zd_error_clear();
        if (run(c, r) < 0)
            printf("FAIL %s: %s\n", dir, zd_error_last());
        for (int i = 0; i < c->n; i++) {
            golden_entry_t *e = &c->entries[i];
            bool subset = false;
            if (!strcmp(e->role, "output") || !strcmp(e->role, "grad")) {
                zd_tensor_t *actual = results_get(r, e->role, e->name, &subset);
                compare_entry(e, actual, subset, rtol, atol, quiet, &tally);
            }
        }
        printf("%s: kind %s, %d tensors checked, %d passed, %d failed (rtol %g, atol %g)\n", dir,
               c->kind, tally.checked, tally.passed, tally.failed, rtol, atol);
        rc = tally.failed || tally.checked == 0 ? -1 : 0;
    }
    if (r)
        results_clear(r);
    free(r);
    golden_case_free(c);
    return rc;
}

int main(int argc, char **argv)
{
    bool quiet = false;
    int first = 1;
    if (argc > 1 && !strcmp(argv[1], "--quiet")) {
        quiet = true;
        first = 2;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: %s [--quiet] CASE_DIR...\n", argv[0]);
        return 2;
    }
    int failed = 0, unknown = 0;
    for (int i = first; i < argc; i++) {
        int rc = golden_check_dir(argv[i], quiet);
        failed += rc == -1;
        unknown += rc == GOLDEN_UNKNOWN_KIND;
    }
    return failed ? 1 : unknown ? 3 : 0;
}
