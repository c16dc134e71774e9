/* SPDX-License-Identifier: MIT */
/*  golden_check.h: pieces shared by the golden-case checker's files. */
#ifndef ZDIST_GOLDEN_CHECK_H
#define ZDIST_GOLDEN_CHECK_H

#include <stdbool.h>

#include "tools/golden_manifest.h"

#define RESULTS_MAX 512

/*  What the checker computed, keyed "role:name" like the manifest. */
typedef struct {
    int n;
    char key[RESULTS_MAX][160];
    zd_tensor_t *value[RESULTS_MAX];
    bool subset[RESULTS_MAX]; /* already holds just the manifest's rows */
} results_t;

/*  Stores a reference to t under role:name (a NULL t is ignored). */
void results_put(results_t *r, const char *role, const char *name, zd_tensor_t *t);

/*  Same, for a tensor computed on the manifest's row subset only. */
void results_put_subset(results_t *r, const char *role, const char *name, zd_tensor_t *t);

/*  Stores the .grad of each non-NULL leaf under "grad:<names[i]>". */
void results_put_grads(results_t *r, int n, zd_tensor_t *const *leaves, const char *const *names);

/*  A float copy of the case's tensor role/name that requires grad (uint8
    tensors are copied as they are); NULL with an error when absent. */
zd_tensor_t *golden_leaf(golden_case_t *c, const char *role, const char *name);

/*  One function per case kind: computes the outputs and gradients the
    manifest can list. Returns -1 when something could not be computed (the
    missing tensors are then reported one by one). */
int golden_run_conv2d(golden_case_t *c, results_t *r);
int golden_run_max_pool2d(golden_case_t *c, results_t *r);
int golden_run_linear(golden_case_t *c, results_t *r);
int golden_run_relu(golden_case_t *c, results_t *r);
int golden_run_log_softmax(golden_case_t *c, results_t *r);
int golden_run_nll_loss(golden_case_t *c, results_t *r);
int golden_run_net(golden_case_t *c, results_t *r);
int golden_run_convnet(golden_case_t *c, results_t *r);

/*  The single-op kinds of tests/golden-toolkit (golden_toolkit.c). */
int golden_run_tanh(golden_case_t *c, results_t *r);
int golden_run_sigmoid(golden_case_t *c, results_t *r);
int golden_run_exp(golden_case_t *c, results_t *r);
int golden_run_log(golden_case_t *c, results_t *r);
int golden_run_gelu(golden_case_t *c, results_t *r);
int golden_run_softmax(golden_case_t *c, results_t *r);
int golden_run_permute(golden_case_t *c, results_t *r);
int golden_run_layer_norm(golden_case_t *c, results_t *r);
int golden_run_mse_loss(golden_case_t *c, results_t *r);
int golden_run_embedding(golden_case_t *c, results_t *r);
int golden_run_add_broadcast(golden_case_t *c, results_t *r);
int golden_run_mul_broadcast(golden_case_t *c, results_t *r);

/*  Checks one case folder, printing a line per tensor; 0 when all match,
    GOLDEN_UNKNOWN_KIND when the checker has no code for the case's kind,
    else -1. */
#define GOLDEN_UNKNOWN_KIND (-2)
int golden_check_dir(const char *dir, bool quiet);

#endif
