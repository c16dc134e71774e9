/* SPDX-License-Identifier: MIT */
/*  Which kernels nn/ runs (nn/cpu.c): the AVX-512 ones exactly when
    /proc/cpuinfo lists AVX-512 F, BW, DQ and VL and ZDIST_CPU is neither
    "generic" nor "avx2", else the AVX2 ones when it lists AVX2 and FMA and
    ZDIST_CPU is not "generic" (ctest runs this test all three ways), so
    that a broken choice cannot pass unnoticed by falling back to lesser
    kernels; and zd__nn_cpu_set for the tests that compare them; and the
    process set-up (zd_nn_process_setup), which nothing runs at load time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

/*  Whether the "flags" line of /proc/cpuinfo has the word `flag`. */
static bool cpuinfo_has(const char *flag)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    assert_non_null(f);
    char line[8192];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        for (char *tok = strtok(strchr(line, ':'), " :\n"); tok; tok = strtok(NULL, " \n"))
            if (strcmp(tok, flag) == 0)
                found = true;
        break;
    }
    fclose(f);
    return found;
}

static bool cpu_has_avx512(void)
{
    return cpuinfo_has("avx512f") && cpuinfo_has("avx512bw") && cpuinfo_has("avx512dq") &&
        cpuinfo_has("avx512vl");
}

static bool cpu_has_avx2(void)
{
    return cpuinfo_has("avx2") && cpuinfo_has("fma");
}

/*  The best kernels of this CPU. */
static const char *best(void)
{
    return cpu_has_avx512() ? "avx512" : cpu_has_avx2() ? "avx2" : "generic";
}

static const char *expected(void)
{
    const char *env = getenv("ZDIST_CPU");
    if (env && strcmp(env, "generic") == 0)
        return "generic";
    if (env && strcmp(env, "avx2") == 0 && cpu_has_avx2())
        return "avx2";
    return best();
}

static void test_choice(void **state)
{
    (void)state;
    const char *env = getenv("ZDIST_CPU");
    print_message("ZDIST_CPU=%s, kernels: %s\n", env ? env : "(unset)", zd__nn_cpu_name());
    assert_string_equal(zd__nn_cpu_name(), expected());
    assert_int_equal(zd__nn_cpu_avx512(), strcmp(expected(), "avx512") == 0);
    assert_int_equal(zd__nn_cpu_isa(),
                     strcmp(expected(), "avx512") == 0     ? NN_ISA_AVX512
                         : strcmp(expected(), "avx2") == 0 ? NN_ISA_AVX2
                                                           : NN_ISA_GENERIC);
    /* the layers' own view of it */
    assert_int_equal(zd__nn_conv_direct_available(), strcmp(expected(), "generic") != 0);
}

static void test_set(void **state)
{
    (void)state;
    assert_int_equal(zd__nn_cpu_set("generic"), 0);
    assert_string_equal(zd__nn_cpu_name(), "generic");
    assert_false(zd__nn_taps_enabled());
    if (cpu_has_avx2()) {
        assert_int_equal(zd__nn_cpu_set("avx2"), 0);
        assert_string_equal(zd__nn_cpu_name(), "avx2");
        assert_true(zd__nn_taps_enabled());
    } else {
        assert_int_equal(zd__nn_cpu_set("avx2"), -1);
        assert_non_null(strstr(zd_error_last(), "AVX2"));
    }
    if (cpu_has_avx512()) {
        assert_int_equal(zd__nn_cpu_set("avx512"), 0);
        assert_string_equal(zd__nn_cpu_name(), "avx512");
        assert_true(zd__nn_taps_enabled());
    } else {
        assert_int_equal(zd__nn_cpu_set("avx512"), -1);
        assert_non_null(strstr(zd_error_last(), "AVX-512"));
    }
    assert_int_equal(zd__nn_cpu_set("sse9"), -1);
    assert_non_null(strstr(zd_error_last(), "sse9"));
    assert_int_equal(zd__nn_cpu_set(NULL), 0); /* back to the CPU's and ZDIST_CPU's */
    assert_string_equal(zd__nn_cpu_name(), expected());
    assert_int_equal(zd__nn_cpu_set("auto"), 0);
    assert_string_equal(zd__nn_cpu_name(), expected());
}

/*  Runs first: no BLAS call has been made in this process yet. */
static void test_process_setup(void **state)
{
    (void)state;
    assert_int_equal(zd_nn_process_setup(0x80), -1);
    assert_non_null(strstr(zd_error_last(), "0x80"));
    assert_int_equal(zd_nn_process_setup(ZD_NN_SETUP_ALL), 0);
    assert_int_equal(zd_nn_process_setup(ZD_NN_SETUP_ALL), 0); /* again: harmless */
    const char *core = zd_nn_blas_corename();
    print_message("OpenBLAS kernels: %s\n", core);
    /* OpenBLAS's generic kernels only where the CPU has nothing better,
       or the user asked for them */
    if (!getenv("OPENBLAS_CORETYPE") && (zd__nn_cpu_features() & NN_CPU_AVX2))
        assert_true(strcmp(core, "Prescott") != 0);
}

static char warned[256];

static void keep_line(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)who, (void)arg;
    if (level == ZD_LOG_WARN)
        snprintf(warned, sizeof warned, "%s", line);
}

/*  A ZDIST_CPU the library does not know is reported, not silently taken
    for "let the CPU decide" (a misspelt generic would test the wrong
    kernels); the known values say nothing. */
static void test_unknown_env_warns(void **state)
{
    (void)state;
    const char *was = getenv("ZDIST_CPU");
    char *saved = was ? strdup(was) : NULL;
    zd_log_set_sink(keep_line, NULL);
    setenv("ZDIST_CPU", "genric", 1);
    warned[0] = '\0';
    assert_int_equal(zd__nn_cpu_set(NULL), 0);
    assert_non_null(strstr(warned, "ZDIST_CPU=\"genric\" is not generic, avx2, avx512 or auto"));
    assert_string_equal(zd__nn_cpu_name(), best());
    /* kernels the CPU lacks: said so, and the best it has run */
    if (!cpu_has_avx512()) {
        setenv("ZDIST_CPU", "avx512", 1);
        warned[0] = '\0';
        assert_int_equal(zd__nn_cpu_set(NULL), 0);
        assert_non_null(strstr(warned, "lacks AVX-512"));
        assert_string_equal(zd__nn_cpu_name(), best());
    }
    const char *quiet[] = {"generic", "auto", "", cpu_has_avx2() ? "avx2" : "generic"};
    for (int i = 0; i < 4; i++) {
        setenv("ZDIST_CPU", quiet[i], 1);
        warned[0] = '\0';
        assert_int_equal(zd__nn_cpu_set(NULL), 0);
        assert_string_equal(warned, "");
    }
    zd_log_set_sink(NULL, NULL);
    if (saved)
        setenv("ZDIST_CPU", saved, 1);
    else
        unsetenv("ZDIST_CPU");
    free(saved);
    assert_int_equal(zd__nn_cpu_set(NULL), 0);
    assert_string_equal(zd__nn_cpu_name(), expected());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_process_setup),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_set),
        cmocka_unit_test(test_unknown_env_warns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
