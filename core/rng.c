/* SPDX-License-Identifier: MIT */
/*  rng.c: xoshiro256** by Blackman and Vigna, seeded through splitmix64. */
#include <zdist/rng.h>

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void zd_rng_seed(zd_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

uint64_t zd_rng_u64(zd_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t zd_rng_below(zd_rng_t *r, uint64_t n)
{
    if (n == 0)
        return 0;
    /* Rejection on the top of the range keeps every value equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do {
        v = zd_rng_u64(r);
    } while (v >= limit);
    return v % n;
}

float zd_rng_uniform(zd_rng_t *r)
{
    return (float)(zd_rng_u64(r) >> 40) * (1.0f / 16777216.0f);
}

float zd_rng_uniform_range(zd_rng_t *r, float lo, float hi)
{
    float v = lo + (hi - lo) * zd_rng_uniform(r);
    return v < hi ? v : lo; /* rounding of lo + (hi-lo)*u can reach hi */
}

float zd_rng_normal(zd_rng_t *r, float mean, float std)
{
    /* u1 in (0, 1] so that log() stays finite. */
    double u1 = ((double)(zd_rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = (double)(zd_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    return (float)(mean + std * z);
}

void zd_rng_shuffle_i64(zd_rng_t *r, int64_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)zd_rng_below(r, i);
        int64_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

void zd_rng_permutation(zd_rng_t *r, int64_t *perm, size_t n)
{
    for (size_t i = 0; i < n; i++)
        perm[i] = (int64_t)i;
    zd_rng_shuffle_i64(r, perm, n);
}

void zd_rng_jump(zd_rng_t *r)
{
    static const uint64_t jump[] = {0x180ec6d33cfd0abaULL, 0xd5a61266f0c9392cULL,
                                    0xa9582618e03fc9aaULL, 0x39abdc4529b1661cULL};
    uint64_t t[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
        for (int b = 0; b < 64; b++) {
            if (jump[i] & (1ULL << b))
                for (int k = 0; k < 4; k++)
                    t[k] ^= r->s[k];
            zd_rng_u64(r);
        }
    }
    for (int k = 0; k < 4; k++)
        r->s[k] = t[k];
}
