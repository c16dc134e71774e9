/* SPDX-License-Identifier: MIT */
/*  gradcheck.h: finite-difference gradient checks for the cmocka tests of
    the autograd and nn ops, and the random tensors they are fed.

    For a function f of some inputs and fixed random r_k (one per output,
    normal, drawn once), L(inputs) = sum_k sum(f_k(inputs) * r_k) in double.
    The analytic gradient comes from one backward pass from every output
    with gradient r_k; the numeric one from central differences
    (L(x + eps) - L(x - eps)) / 2eps in float32, element by element, with
    gradients off. Outputs a perturbation does not touch are bit-identical
    between the two evaluations, so the rounding noise stays around 1e-4
    with eps = 1e-2. For the parent process only (cmocka's fail_msg). */
#ifndef ZDIST_TESTS_GRADCHECK_H
#define ZDIST_TESTS_GRADCHECK_H

#include <stdint.h>

#include <zdist/rng.h>
#include <zdist/tensor.h>

#define GRADCHECK_EPS     1e-2f
#define GRADCHECK_ATOL    2e-3
#define GRADCHECK_RTOL    1e-2
#define GRADCHECK_MAX_OUT 4

/*  The function under test: its outputs from arg into outs (at most
    GRADCHECK_MAX_OUT, new references); returns how many, or -1 with the
    error set. Called with gradients on once, then off for every probe. */
typedef int(gradcheck_fn)(void *arg, zd_tensor_t **outs);

typedef struct {
    const char *name; /* in failure messages */
    gradcheck_fn *fn;
    void *arg;
    zd_tensor_t *const *inputs; /* float32; NULLs skipped; those requiring
                                      grad are checked (at least one), the
                                      others must get no gradient */
    int n_inputs;
    float eps;                /* 0: GRADCHECK_EPS */
    double atol, rtol;        /* both 0: GRADCHECK_ATOL, GRADCHECK_RTOL */
    int max_probes;           /* 0: every element of every input; else
                                      at most this many per input, random
                                      ones when it has more */
    zd_tensor_t *zero_row_of; /* an input whose row zero_row (along
                                      dim 0) must get a gradient of exactly
                                      0 and is not probed (embedding's
                                      padding_idx); NULL: none */
    int64_t zero_row;
} gradcheck_t;

/*  Fails the running test unless every probed element's analytic and
    numeric gradients agree within atol + rtol * |analytic|, or when f
    fails, an input requiring grad gets no gradient or one of another
    shape, or a tensor leaks. Leaves the inputs' values as they were and
    their gradients cleared. */
void gradcheck(const gradcheck_t *g);

/*  Reseeds the generator every helper here draws from (the tests' only
    one, so that a test's draws are reproducible from its seed). */
void gradcheck_seed(uint64_t seed);

/*  That generator, for the tests' own draws. */
zd_rng_t *gradcheck_rng(void);

/*  A new float32 tensor of normal values (mean 0, std scale). */
zd_tensor_t *randn(int ndim, const int64_t *shape, float scale);

/*  t, made a leaf requiring grad. */
zd_tensor_t *leaf(zd_tensor_t *t);

#endif
