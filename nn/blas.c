/* SPDX-License-Identifier: MIT */
/*  blas.c: the GEMM used by every layer, and the process set-up that
    programs running the layers ask for (zd_nn_process_setup): the choice
    of OpenBLAS kernels and glibc's allocator policy. Nothing here runs at
    load time: a library that changes its host process's allocator and BLAS
    behind its back, in every process that merely links it, is a bad
    neighbour; the programs that want it say so, first thing in main().

    OpenBLAS 0.3.21 (Debian 12) picks its kernels by CPU model number at
    load time; CPUs newer than the release (Emerald Rapids, for one) fall back
    to the generic SSE3 "Prescott" kernels, four times slower than the
    AVX-512 ones the CPU can run. OpenBLAS lets OPENBLAS_CORETYPE override
    the choice, but only before it loads; so when that variable is unset and
    the generic kernels were chosen on a CPU with AVX-512 (or AVX2),
    ZD_NN_SETUP_BLAS redoes OpenBLAS's own initialisation
    (gotoblas_dynamic_quit/init, exported by DYNAMIC_ARCH builds) with the
    variable set. No BLAS call may be in flight meanwhile: hence "first
    thing in main()". Builds without those symbols are left alone.

    Allocator: a training step allocates and frees tensors of several MB.
    glibc serves those with mmap, or trims its heap after the frees, so each
    step touches fresh pages: the page faults (and the kernel zeroing the
    pages) cost about 30% of a Net training step here. ZD_NN_SETUP_ALLOCATOR
    keeps such blocks in the heap instead (mallopt: mmap above 32 MB only,
    trim above 128 MB of free heap top), unless the user set glibc's own
    MALLOC_*_ or GLIBC_TUNABLES variables. */
#include "nn/nn_private.h"

#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <zdist/error.h>
#include "core/log_private.h"
#include <zdist/nn.h>

typedef char *(corename_fn)(void);
typedef void(dynamic_fn)(void);

static corename_fn *lookup_corename(void)
{
    corename_fn *fn;
    *(void **)&fn = dlsym(RTLD_DEFAULT, "openblas_get_corename");
    return fn;
}

static const char *better_coretype(void)
{
    const unsigned f = zd__nn_cpu_features();
    if ((f & NN_CPU_AVX512) && (f & NN_CPU_AVX512CD))
        return "SkylakeX";
    if (f & NN_CPU_AVX2)
        return "Haswell";
    return NULL;
}

static void keep_big_blocks(void)
{
    if (getenv("GLIBC_TUNABLES") || getenv("MALLOC_MMAP_THRESHOLD_") ||
        getenv("MALLOC_TRIM_THRESHOLD_"))
        return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
}

static void choose_blas_kernels(void)
{
    if (getenv("OPENBLAS_CORETYPE"))
        return;
    corename_fn *corename = lookup_corename();
    dynamic_fn *quit, *init;
    *(void **)&quit = dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit");
    *(void **)&init = dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init");
    if (!corename || !quit || !init)
        return;
    const char *now = corename();
    const char *want = better_coretype();
    if (!now || strcasecmp(now, "Prescott") != 0 || !want)
        return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    quit();
    init();
    unsetenv("OPENBLAS_CORETYPE");
}

/*  ZDIST_NUM_THREADS: the layers' thread count, for launchers that share a
    node's cores out between its processes (tools/launch sets it). Values
    above what the layers support are taken as their maximum; a value that
    is no number is reported and ignored. */
static void threads_from_env(void)
{
    const char *env = getenv("ZDIST_NUM_THREADS");
    if (!env || !*env)
        return;
    char *end;
    errno = 0;
    long n = strtol(env, &end, 10);
    if (end == env || *end || errno || n < 1) {
        zd__log(ZD_LOG_WARN, "nn: ZDIST_NUM_THREADS=\"%s\" is not a number >= 1: ignored", env);
        return;
    }
    if (zd_nn_set_num_threads(n > NN_MAX_THREADS ? NN_MAX_THREADS : (int)n) < 0)
        zd__log(ZD_LOG_WARN, "nn: ZDIST_NUM_THREADS ignored: %s", zd_error_last());
}

int zd_nn_process_setup(unsigned flags)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    const unsigned unknown = flags & ~(unsigned)ZD_NN_SETUP_ALL;
    if (unknown)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_process_setup: unknown flags 0x%x",
                                 unknown);
    pthread_mutex_lock(&lock);
    if (flags & ZD_NN_SETUP_ALLOCATOR)
        keep_big_blocks();
    if (flags & ZD_NN_SETUP_BLAS)
        choose_blas_kernels();
    threads_from_env();
    pthread_mutex_unlock(&lock);
    return 0;
}

const char *zd_nn_blas_corename(void)
{
    corename_fn *corename = lookup_corename();
    const char *name = corename ? corename() : NULL;
    return name ? name : "unknown";
}

/*  Plain loops for tiny products, arranged so the innermost loop runs over
    contiguous memory of C and B. */
static void small_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
                       const float *b, int ldb, float beta, float *c, int ldc)
{
    for (int i = 0; i < m; i++) {
        float *ci = c + (size_t)i * ldc;
        if (beta == 0.0f)
            memset(ci, 0, sizeof(float) * (size_t)n);
        else if (beta != 1.0f)
            for (int j = 0; j < n; j++)
                ci[j] *= beta;
        if (!tb) {
            for (int p = 0; p < k; p++) {
                float av = alpha * (ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
                const float *bp = b + (size_t)p * ldb;
                for (int j = 0; j < n; j++)
                    ci[j] += av * bp[j];
            }
        } else {
            for (int j = 0; j < n; j++) {
                const float *bj = b + (size_t)j * ldb;
                float acc = 0.0f;
                if (!ta) {
                    const float *ai = a + (size_t)i * lda;
                    for (int p = 0; p < k; p++)
                        acc += ai[p] * bj[p];
                } else {
                    for (int p = 0; p < k; p++)
                        acc += a[(size_t)p * lda + i] * bj[p];
                }
                ci[j] += alpha * acc;
            }
        }
    }
}

void zd__nn_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        small_gemm(false, false, m, n, 0, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    if ((int64_t)m * n * k <= 4096) {
        small_gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/*  ---- small shared helpers ---- */

int zd__nn_check_f32(const char *what, const zd_tensor_t *t)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s is NULL", what);
    if (zd_tensor_dtype(t) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: expected float32, got %s", what,
                                 zd_tensor_dtype_name(zd_tensor_dtype(t)));
    return 0;
}

int zd__nn_check_ndim(const char *what, const zd_tensor_t *t, int ndim)
{
    if (zd_tensor_ndim(t) != ndim) {
        char s[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: expected %d dimensions, got shape %s", what,
                                 ndim, zd_tensor_shape_str(t, s, sizeof s));
    }
    return 0;
}

void zd__nn_free_ctx(zd_autograd_node_t *n)
{
    free(zd_autograd_node_ctx(n));
}

int zd__nn_record(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *in, int n_in,
                  zd_tensor_t *y, zd_tensor_t *s0, zd_tensor_t *s1, zd_tensor_t *s2, void *ctx)
{
    zd_tensor_t *saved[3] = {s0, s1, s2};
    return zd_autograd_record(ops, in, n_in, y, saved, 3, ctx);
}
