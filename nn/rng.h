/*  rng.h: a small seeded random number generator (xoshiro256**, seeded with
    splitmix64).

    The generator is an explicit object: each user keeps its own state, so
    threads never share hidden state, and a seed reproduces a run exactly.
    Used for weight initialisation, dropout masks and data shuffling. */
#ifndef ZDIST_NN_RNG_H
#define ZDIST_NN_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t s[4];
} nn_rng_t;

/*  Seeds r; every seed (0 included) gives a valid, distinct stream. */
void nn_rng_seed(nn_rng_t *r, uint64_t seed);

/*  Next 64 random bits. */
uint64_t nn_rng_u64(nn_rng_t *r);

/*  Uniform integer in [0, n) without modulo bias; 0 when n == 0. */
uint64_t nn_rng_below(nn_rng_t *r, uint64_t n);

/*  Uniform float in [0, 1) (24 random bits). */
float nn_rng_uniform(nn_rng_t *r);

/*  Uniform float in [lo, hi). */
float nn_rng_uniform_range(nn_rng_t *r, float lo, float hi);

/*  Normal deviate with the given mean and standard deviation (Box-Muller,
    computed in double). */
float nn_rng_normal(nn_rng_t *r, float mean, float std);

/*  Shuffles a[0..n) in place (Fisher-Yates). */
void nn_rng_shuffle_i64(nn_rng_t *r, int64_t *a, size_t n);

/*  Fills perm[0..n) with a random permutation of 0..n-1. */
void nn_rng_permutation(nn_rng_t *r, int64_t *perm, size_t n);

/*  Advances r by 2^128 draws: call it k times on copies of one generator to
    get k streams that never overlap (one per worker). */
void nn_rng_jump(nn_rng_t *r);

#endif
