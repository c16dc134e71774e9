/* SPDX-License-Identifier: MIT */
/*  rng.h: a small seeded random number generator (xoshiro256**, seeded with
    splitmix64).

    The generator is an explicit object: each user keeps its own state, so
    threads never share hidden state, and a seed reproduces a run exactly.
    Used for weight initialisation, dropout masks and data shuffling. */
#ifndef ZDIST_NN_RNG_H
#define ZDIST_NN_RNG_H

#include <stddef.h>
#include <stdint.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct {
    uint64_t s[4];
} zd_rng_t;

/*  Seeds r; every seed (0 included) gives a valid, distinct stream. */
ZD_API void zd_rng_seed(zd_rng_t *r, uint64_t seed);

/*  Next 64 random bits. */
ZD_API uint64_t zd_rng_u64(zd_rng_t *r);

/*  Uniform integer in [0, n) without modulo bias; 0 when n == 0. */
ZD_API uint64_t zd_rng_below(zd_rng_t *r, uint64_t n);

/*  Uniform float in [0, 1) (24 random bits). */
ZD_API float zd_rng_uniform(zd_rng_t *r);

/*  Uniform float in [lo, hi). */
ZD_API float zd_rng_uniform_range(zd_rng_t *r, float lo, float hi);

/*  Normal deviate with the given mean and standard deviation (Box-Muller,
    computed in double). */
ZD_API float zd_rng_normal(zd_rng_t *r, float mean, float std);

/*  Shuffles a[0..n) in place (Fisher-Yates). */
ZD_API void zd_rng_shuffle_i64(zd_rng_t *r, int64_t *a, size_t n);

/*  Fills perm[0..n) with a random permutation of 0..n-1. */
ZD_API void zd_rng_permutation(zd_rng_t *r, int64_t *perm, size_t n);

/*  Advances r by 2^128 draws: call it k times on copies of one generator to
    get k streams that never overlap (one per worker). */
ZD_API void zd_rng_jump(zd_rng_t *r);

ZD_END_DECLS

#endif
