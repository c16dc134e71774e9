/* SPDX-License-Identifier: MIT */
/*  finite.h: finding an element that is not finite in a float array, for
    the checks of gradients and of stepped parameters (private; every
    layer may include it). They run over every gradient a server takes,
    so they run at the speed of vector code: x * 0 is 0 for a finite x and
    nan for inf or nan, and a sum keeps a nan, so eight sums side by side
    over a block (which the compiler turns into vector operations; a
    branch per element runs at a quarter to a fifth of the speed) say
    whether the block holds one, and only such a block is looked through
    element by element. */
#ifndef ZDIST_CORE_FINITE_H
#define ZDIST_CORE_FINITE_H

#include <math.h>
#include <stdint.h>

/*  The index of the first element of d[0..n) that is not finite, or -1. */
static inline int64_t zd__first_not_finite(const float *d, int64_t n)
{
    enum { BLOCK = 4096 };
    for (int64_t b = 0; b < n; b += BLOCK) {
        const int64_t e = n - b < BLOCK ? n : b + BLOCK;
        float sum[8] = {0}, t = 0;
        int64_t k = b;
        for (; k + 8 <= e; k += 8)
            for (int j = 0; j < 8; j++)
                sum[j] += d[k + j] * 0.0f;
        for (; k < e; k++)
            t += d[k] * 0.0f;
        for (int j = 0; j < 8; j++)
            t += sum[j];
        if (t == 0)
            continue;
        for (k = b; k < e; k++)
            if (!isfinite(d[k]))
                return k;
    }
    return -1;
}

#endif
