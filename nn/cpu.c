/* SPDX-License-Identifier: MIT */
/*  cpu.c: which kernels the layers run, chosen at run time.

    Builds no longer assume the build machine's CPU: the AVX-512 kernels
    are compiled with the instruction sets enabled per function (see
    NN_AVX512_BEGIN) and taken when the CPU has them. The choice is made at
    the first call, not at load time, and kept. ZDIST_CPU=generic forces
    the portable kernels (to test them, or to compare); "avx512", "auto" or
    none lets the CPU decide, and any other value does too, with a warning.

    The features come from CPUID and XGETBV directly rather than from
    __builtin_cpu_supports, whose libgcc support code brings a constructor
    of its own into the library (nothing of ours runs at load time). */
#include <cpuid.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include "nn/nn_private.h"

enum { CPU_UNKNOWN, CPU_GENERIC, CPU_AVX512 };

static atomic_int chosen;      /* CPU_UNKNOWN until the first call */

/*  The register state the OS saves on a context switch (XCR0). */
static uint64_t os_saved_state(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}

unsigned zd__nn_cpu_features(void)
{
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX) ||
        !(c & bit_FMA))
        return 0;
    const uint64_t xcr0 = os_saved_state();
    if ((xcr0 & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;                   /* no YMM state: no AVX at all */
    if (b & bit_AVX2)
        f |= NN_CPU_AVX2;
    /* AVX-512 also needs the opmask and ZMM state saved (bits 5-7) */
    const unsigned avx512 = bit_AVX512F | bit_AVX512BW | bit_AVX512DQ | bit_AVX512VL;
    if ((xcr0 & 0xe6) == 0xe6 && (b & avx512) == avx512) {
        f |= NN_CPU_AVX512;
        if (b & bit_AVX512CD)
            f |= NN_CPU_AVX512CD;
    }
    return f;
}

static bool has_avx512(void)
{
    return zd__nn_cpu_features() & NN_CPU_AVX512;
}

static int detect(void)
{
    const char *env = getenv("ZDIST_CPU");
    if (env && strcmp(env, "generic") == 0)
        return CPU_GENERIC;
    bool avx512 = has_avx512();
    /* a misspelt "generic" would otherwise run the AVX-512 kernels while
       the user believes the portable ones ran */
    if (env && strcmp(env, "avx512") == 0 && !avx512)
        zd__log(ZD_LOG_WARN, "nn: ZDIST_CPU=avx512, but this CPU lacks AVX-512 (F, BW, DQ, "
                             "VL): the generic kernels run");
    else if (env && *env && strcmp(env, "auto") != 0 && strcmp(env, "avx512") != 0)
        zd__log(ZD_LOG_WARN, "nn: ZDIST_CPU=\"%.40s\" is not generic, avx512 or auto: the "
                             "CPU decides", env);
    return avx512 ? CPU_AVX512 : CPU_GENERIC;
}

static int current(void)
{
    int c = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (c == CPU_UNKNOWN) {
        /* two first calls at once detect the same; the first store wins */
        int expected = CPU_UNKNOWN;
        c = detect();
        if (!atomic_compare_exchange_strong(&chosen, &expected, c))
            c = expected;
    }
    return c;
}

bool zd__nn_cpu_avx512(void)
{
    return current() == CPU_AVX512;
}

const char *zd__nn_cpu_name(void)
{
    return current() == CPU_AVX512 ? "avx512" : "generic";
}

int zd__nn_cpu_set(const char *name)
{
    int c;
    if (!name || strcmp(name, "auto") == 0)
        c = detect();
    else if (strcmp(name, "generic") == 0)
        c = CPU_GENERIC;
    else if (strcmp(name, "avx512") == 0 && has_avx512())
        c = CPU_AVX512;
    else if (strcmp(name, "avx512") == 0)
        return zd_error_set("zd__nn_cpu_set: this CPU lacks AVX-512 (F, BW, DQ, VL)");
    else
        return zd_error_set("zd__nn_cpu_set: unknown kernels '%s' (generic, avx512, auto)", name);
    atomic_store(&chosen, c);
    return 0;
}
