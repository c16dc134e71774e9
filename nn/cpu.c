/* SPDX-License-Identifier: MIT */
/*  cpu.c: which kernels the layers run, chosen at run time.

    Builds no longer assume the build machine's CPU: the AVX-512 and AVX2
    kernels are compiled with the instruction sets enabled per function
    (see NN_AVX512_BEGIN, NN_AVX2_BEGIN) and taken when the CPU has them,
    the best first. The choice is made at the first call, not at load time,
    and kept. ZDIST_CPU=generic forces the portable kernels and
    ZDIST_CPU=avx2 the AVX2 ones (to test them, or to compare, on a CPU with
    more); "avx512", "auto" or none lets the CPU decide. Kernels the CPU
    lacks, or a value that names none, are reported and the CPU decides.

    The features come from CPUID and XGETBV directly rather than from
    __builtin_cpu_supports, whose libgcc support code brings a constructor
    of its own into the library (nothing of ours runs at load time). */
#include <cpuid.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/log_private.h"
#include "nn/nn_private.h"

/*  NN_ISA_* + 1 once chosen, 0 until the first call. */
static atomic_int chosen;

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
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX) || !(c & bit_FMA))
        return 0;
    const uint64_t xcr0 = os_saved_state();
    if ((xcr0 & 0x6) != 0x6 || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0; /* no YMM state: no AVX at all */
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

/*  The best kernels this CPU runs. */
static nn_isa_t best(void)
{
    const unsigned f = zd__nn_cpu_features();
    return f & NN_CPU_AVX512 ? NN_ISA_AVX512 : f & NN_CPU_AVX2 ? NN_ISA_AVX2 : NN_ISA_GENERIC;
}

static const char *const names[] = {"generic", "avx2", "avx512"};
static const char *const needs[] = {"", "AVX2 and FMA", "AVX-512 (F, BW, DQ, VL)"};

/*  The kernels `name` asks for, or -1 for a name that is none of them. */
static int by_name(const char *name)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(name, names[i]) == 0)
            return i;
    return -1;
}

static nn_isa_t detect(void)
{
    const char *env = getenv("ZDIST_CPU");
    const nn_isa_t cpu = best();
    if (!env || !*env || strcmp(env, "auto") == 0)
        return cpu;
    const int want = by_name(env);
    /* a misspelt "generic" would otherwise run the fast kernels while the
       user believes the portable ones ran */
    if (want < 0) {
        zd__log(ZD_LOG_WARN,
                "nn: ZDIST_CPU=\"%.40s\" is not generic, avx2, avx512 or auto: "
                "the CPU decides (%s)",
                env, names[cpu]);
        return cpu;
    }
    if ((nn_isa_t)want > cpu) {
        zd__log(ZD_LOG_WARN, "nn: ZDIST_CPU=%s, but this CPU lacks %s: the %s kernels run", env,
                needs[want], names[cpu]);
        return cpu;
    }
    return (nn_isa_t)want;
}

nn_isa_t zd__nn_cpu_isa(void)
{
    int c = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (c == 0) {
        /* two first calls at once detect the same; the first store wins */
        int expected = 0;
        c = (int)detect() + 1;
        if (!atomic_compare_exchange_strong(&chosen, &expected, c))
            c = expected;
    }
    return (nn_isa_t)(c - 1);
}

bool zd__nn_cpu_avx512(void)
{
    return zd__nn_cpu_isa() == NN_ISA_AVX512;
}

const char *zd__nn_cpu_name(void)
{
    return names[zd__nn_cpu_isa()];
}

int zd__nn_cpu_set(const char *name)
{
    nn_isa_t isa;
    if (!name || strcmp(name, "auto") == 0) {
        isa = detect();
    } else {
        const int want = by_name(name);
        if (want < 0)
            return zd_error_set("zd__nn_cpu_set: unknown kernels '%s' (generic, avx2, avx512, "
                                "auto)",
                                name);
        if ((nn_isa_t)want > best())
            return zd_error_set("zd__nn_cpu_set: this CPU lacks %s", needs[want]);
        isa = (nn_isa_t)want;
    }
    atomic_store(&chosen, (int)isa + 1);
    return 0;
}
