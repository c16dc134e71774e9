/* SPDX-License-Identifier: MIT */
/*  simd_avx2.h: the small helpers the AVX2 kernels share (private to nn/).

    AVX2 has no mask registers: a partial vector is read and written with
    vmaskmovps under a vector of lane masks (masked-off lanes are neither
    read nor written, so they may lie past the end of a buffer). These
    helpers give the AVX2 kernels the AVX-512 ones' "first n lanes" loads
    and stores, so that both read alike. Everything here is compiled for
    AVX2 and FMA only (NN_AVX2_BEGIN): call it from such functions. */
#ifndef ZDIST_NN_SIMD_AVX2_H
#define ZDIST_NN_SIMD_AVX2_H

#include <immintrin.h>
#include <stdint.h>

#include "nn/nn_private.h"

NN_AVX2_BEGIN
/*  The lane mask of the first n of 8 lanes (none for n <= 0, all from 8). */
static inline __m256i avx2_lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/*  p[0 .. n), zeros in the other lanes; reads nothing past p[n - 1], and
    nothing at all for n <= 0 (AMD's CPUs take a slow microcode assist for
    a masked load whose masked-off lanes point at unmapped memory: the
    partial loads here always start inside the buffer). */
static inline __m256 avx2_loadn(const float *p, int n)
{
    if (n >= 8)
        return _mm256_loadu_ps(p);
    return n > 0 ? _mm256_maskload_ps(p, avx2_lanes(n)) : _mm256_setzero_ps();
}

/*  p[0 .. n) = the first n lanes of v; writes nothing past p[n - 1]. */
static inline void avx2_storen(float *p, int n, __m256 v)
{
    if (n >= 8)
        _mm256_storeu_ps(p, v);
    else if (n > 0)
        _mm256_maskstore_ps(p, avx2_lanes(n), v);
}

/*  The same for 32-bit integers. */
static inline void avx2_storen_epi32(int32_t *p, int n, __m256i v)
{
    if (n >= 8)
        _mm256_storeu_si256((__m256i *)p, v);
    else if (n > 0)
        _mm256_maskstore_epi32((int *)p, avx2_lanes(n), v);
}

/*  r[j] = column j of the 8 x 8 tile whose rows are r[0..7]. */
static inline void avx2_transpose8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}
NN_AVX2_END

#endif
