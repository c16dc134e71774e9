/* SPDX-License-Identifier: MIT */
/*  nn_private.h: helpers shared by the nn/ sources only. */
#ifndef ZDIST_NN_PRIVATE_H
#define ZDIST_NN_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/function.h>
#include <zdist/module.h>
#include <zdist/tensor.h>

/*  ---- the CPU's kernels (cpu.c) ----
    The AVX-512 and AVX2 kernels are compiled in every build, the
    instruction sets enabled for the functions between NN_AVX512_BEGIN and
    NN_AVX512_END (AVX-512 F, BW, DQ, VL and FMA) or NN_AVX2_BEGIN and
    NN_AVX2_END (AVX2 and FMA) only, and called only when zd__nn_cpu_isa()
    says so: one binary runs on any x86-64 CPU and takes the fastest kernels
    it can. Everything inside a region, inline helpers too, carries the
    target (GCC will not inline an AVX-512 function into one without it);
    tests/check_isa.sh checks that no AVX instruction runs outside them,
    and no AVX-512 one inside an AVX2 region. */
/*  _Pragma takes one string literal: clang-format must not split it. */
// clang-format off
#if defined(__clang__)
#define NN_AVX512_BEGIN                                                                            \
    _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512dq,avx512vl,fma\"))), apply_to = function)")
#define NN_AVX512_END _Pragma("clang attribute pop")
#define NN_AVX2_BEGIN                                                                              \
    _Pragma("clang attribute push(__attribute__((target(\"avx2,fma\"))), apply_to = function)")
#define NN_AVX2_END _Pragma("clang attribute pop")
#else
#define NN_AVX512_BEGIN                                                                            \
    _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512dq,avx512vl,fma\")")
#define NN_AVX512_END _Pragma("GCC pop_options")
#define NN_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma\")")
#define NN_AVX2_END   _Pragma("GCC pop_options")
#endif
// clang-format on

/*  What the CPU has, and the OS supports (CPUID, XGETBV): NN_CPU_* bits.
    NN_CPU_AVX2 means AVX2 and FMA with the YMM state saved. */
enum { NN_CPU_AVX2 = 1, NN_CPU_AVX512 = 2, NN_CPU_AVX512CD = 4 };
unsigned zd__nn_cpu_features(void);

/*  The kernels the layers run, best last. */
typedef enum { NN_ISA_GENERIC, NN_ISA_AVX2, NN_ISA_AVX512 } nn_isa_t;

/*  The kernels chosen at the first call (and kept): the best the CPU has
    (AVX-512 F, BW, DQ and VL; else AVX2 and FMA; else the portable ones),
    unless ZDIST_CPU (read then) or zd__nn_cpu_set asks for lesser ones. */
nn_isa_t zd__nn_cpu_isa(void);

/*  zd__nn_cpu_isa() == NN_ISA_AVX512. */
bool zd__nn_cpu_avx512(void);

/*  "avx512", "avx2" or "generic": the kernels zd__nn_cpu_isa picks. Static. */
const char *zd__nn_cpu_name(void);

/*  For tests: "generic", "avx2" or "avx512" forces those kernels, NULL or
    "auto" goes back to the CPU's (and ZDIST_CPU's) choice. Between ops
    only, not while a layer runs. 0, or -1 (zd_error_set) for an unknown
    name or kernels this CPU cannot run. */
int zd__nn_cpu_set(const char *name);

/*  Fails (zd_error_set) unless t is a non-NULL float32 tensor; `what` names
    the argument in the message ("conv2d: weight"). */
int zd__nn_check_f32(const char *what, const zd_tensor_t *t);

/*  Fails unless t has exactly ndim dimensions. */
int zd__nn_check_ndim(const char *what, const zd_tensor_t *t, int ndim);

/*  zd_autograd_record (<zdist/function.h>) with up to three saved tensors
    (NULL slots are skipped); the op's own output may be one of them. */
int zd__nn_record(const zd_autograd_node_ops_t *ops, zd_tensor_t *const *in, int n_in,
                  zd_tensor_t *y, zd_tensor_t *s0, zd_tensor_t *s1, zd_tensor_t *s2, void *ctx);

/*  Release function for nodes whose ctx is one malloc'ed block. */
void zd__nn_free_ctx(zd_autograd_node_t *n);

/*  Row-major C = alpha * op(A) op(B) + beta * C (op = transpose when the
    flag is set), M x N result, K inner. Small products run in plain loops:
    for them OpenBLAS's call and thread hand-off cost more than the math. */
void zd__nn_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
                  int lda, const float *b, int ldb, float beta, float *c, int ldc);

/*  ---- parallel chunks (parallel.c) ---- */

/*  The pool never has more threads than this. */
#define NN_MAX_THREADS 16

/*  n floats (at least one) at a 64-byte boundary, so that vectors of 16
    floats at multiples of 16 from it never straddle cache lines (a
    straddling load or store costs two). Free with zd__nn_free_floats: a
    large buffer is a block of its own (core/blocks.h), not malloc's. NULL
    when out of memory. */
float *zd__nn_alloc_floats(size_t n);
/*  Gives back zd__nn_alloc_floats' memory. NULL-safe. */
void zd__nn_free_floats(float *p);

/*  Work on chunk `chunk`; `scratch` holds the scratch_floats floats asked
    for (private to this call, contents undefined, 64-byte aligned), or is
    NULL. */
typedef void(nn_chunk_fn)(void *arg, int chunk, float *scratch);

/*  How many threads the pool has (OpenBLAS's thread count, so
    OPENBLAS_NUM_THREADS sets both): split heavy work into this many
    chunks, light work into one. */
int zd__nn_parallel_chunks(void);

/*  Runs fn(arg, c, scratch) for every c in [0, n_chunks), on the pool's
    threads when it is free (OpenBLAS single-threaded meanwhile), else one
    after the other on the calling thread. Returns when all chunks have run:
    0, or -1 (zd_error_set) when scratch memory ran out (then no chunk ran). */
int zd__nn_parallel_run(int n_chunks, size_t scratch_floats, nn_chunk_fn *fn, void *arg);

/*  Chunks for elementwise work over n elements: below 64K elements one
    (waking the pool costs more than it saves), else one per thread. */
static inline int nn_elem_chunks(int64_t n)
{
    return n >= (1 << 16) ? zd__nn_parallel_chunks() : 1;
}

/*  [*lo, *hi): chunk c of n_chunks over n items, contiguous and balanced. */
static inline void nn_chunk_range(int64_t n, int n_chunks, int c, int64_t *lo, int64_t *hi)
{
    *lo = n * c / n_chunks;
    *hi = n * (c + 1) / n_chunks;
}

/*  ---- convolution geometry and unfolding (conv_unfold.c) ---- */

typedef struct {
    int C, H, W; /* input plane */
    int kh, kw;
    int stride, padding;
    int Ho, Wo;
} nn_conv_geom_t;

/*  Unfolds one sample x (C,H,W) into col (C*kh*kw rows, Ho*Wo columns),
    zeros where a patch covers padding. */
void zd__nn_im2col(const nn_conv_geom_t *g, const float *x, float *col);

/*  dx (C,H,W) += the fold of dcol (the shape im2col makes): each column's
    entries go back to the input pixels they came from. */
void zd__nn_col2im(const nn_conv_geom_t *g, const float *dcol, float *dx);

/*  ---- stride-1 convolution GEMMs over shifted planes (conv_direct.c) ----
    "Taps" are K offsets into a source buffer: tap k reads the run
    src[offs[k] + q] for q in [0, L). A stride-1 convolution with planes
    Wp wide has one tap per (channel, ki, kj): offs = c*plane + ki*Wp + kj,
    and q = oh*Wp + ow numbers its outputs (see conv_direct.c). */

/*  True when the kernels below are the fast (AVX-512 or AVX2) ones;
    otherwise they are plain loops, correct but slower than im2col + BLAS. */
bool zd__nn_conv_direct_available(void);

/*  Whether stride-1 convolutions and the backward pass of large linear
    layers may use these kernels (the default, when they are the fast ones)
    or must keep to im2col and BLAS: for tests and benchmarks comparing the
    two. Layers read it when they start. */
void zd__nn_use_taps(bool on);
bool zd__nn_taps_enabled(void);

/*  Floats zd__nn_taps_pack writes for an M x K matrix. */
size_t zd__nn_taps_packed_floats(int M, int K);

/*  Packs an M x K matrix for zd__nn_taps_gemm (panels of 8 rows, zero rows
    past M, each stored k-major): element (m, k) is a[m*m_stride + k], or
    a[m*m_stride + k_offs[k]] when k_offs is non-NULL. */
void zd__nn_taps_pack(const float *a, int M, int K, int64_t m_stride, const int32_t *k_offs,
                      float *packed);

/*  c[m][q] = bias[m] (0 without bias) + sum_k a[m][k] * src[offs[k] + q],
    m < M, q < L (row stride ldc); a is packed by zd__nn_taps_pack. Reads only
    src[offs[k] .. offs[k] + L). */
void zd__nn_taps_gemm(const float *packed, int M, int K, const int32_t *offs, const float *src,
                      int L, const float *bias, float *c, int ldc);

/*  c[k][n] += sum_q src[offs[k] + q] * b[q*ldb + n], k < K, n < N (row
    stride ldc), over the positions q = r*stride + i, r < nrun, i < run (a
    convolution's good output columns; nrun 1 for a plain run of `run`):
    the weight gradient's product, with b the output gradient transposed
    (positions x channels). */
void zd__nn_taps_gemm_bt(const int32_t *offs, int K, const float *src, const float *b, int ldb,
                         int N, int nrun, int run, int stride, float *c, int ldc);

/*  dst[c][r] = src[r][c] for r < rows, c < cols (row strides lds, ldd),
    in 16 x 16 tiles. */
void zd__nn_transpose(const float *src, int rows, int cols, int lds, float *dst, int ldd);

/*  ---- max pooling of one plane (pool.c) ---- */

/*  Pools an H x W plane (rows ld floats apart) with k x k windows moved by
    s (floor mode) into y (Ho x Wo), Ho = (H-k)/s+1, Wo = (W-k)/s+1,
    writing to argmax each winner's index row*idx_ld + column (the first
    maximum; NaN wins). */
void zd__nn_pool_plane(const float *x, int H, int W, int ld, int idx_ld, int k, int s, float *y,
                       int32_t *argmax);

/*  Fails (zd_error_set, naming op) unless kernel and stride are >= 1 and a
    window fits in x's (N,C,H,W) planes. */
int zd__nn_pool_check(const char *op, const zd_tensor_t *x, int kernel, int stride);

/*  dx (H x W, any contents) = the gradient of pooling: dy (Ho x Wo) sent to
    the argmax of each window, zero elsewhere. */
void zd__nn_pool_plane_backward(const float *dy, const int32_t *argmax, int H, int W, int k, int s,
                                float *dx);

/*  ---- modules (module.c) ---- */

/*  The forward function m was made with: tells the modules zdist builds
    (model_net.c) from a user's module of the same type name. */
zd_nn_module_forward_fn *zd__nn_module_forward_of(const zd_nn_module_t *m);

#endif
