/* SPDX-License-Identifier: MIT */
/*  rnn_gemm.c: the recurrent layers' per-step products with a weight
    matrix packed once per layer.

    An LSTM step multiplies a small h (batch rows, 32 in the benchmark) by
    the same w_hh (4H x H) T times forward and T times backward. Handed to
    OpenBLAS each product packs all of w_hh again (1 MB at H = 256) for a
    product that reads h only a few times; the packing and OpenBLAS's
    thread hand-off cost about as much as the arithmetic. Here w_hh is
    packed once per layer into panels of 16 columns, and each step's
    product runs on the layers' pool (panels split between the threads)
    with a register-blocked kernel: rows of A broadcast, a panel row
    loaded, rows x 16 sums kept in registers over the whole K. Only the
    AVX-512 kernels use it: with AVX2 (half the register width, 16 of
    them) the same scheme measured 5 % slower for the whole LSTM than
    OpenBLAS's product (bench_local --model lstm, ZDIST_CPU=avx2,
    alternated, 2026-11-29), so AVX2 and the portable kernels keep it. */
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "nn/nn_private.h"
#include "nn/rnn_private.h"

#define PANEL 16

/*  Real columns of a group's panel q. */
static int panel_cols(const rnn_packed_t *pk, int q)
{
    const int left = pk->N / pk->groups - q * PANEL;
    return left < PANEL ? left : PANEL;
}

bool zd__rnn_packed_wanted(void)
{
    return zd__nn_cpu_isa() == NN_ISA_AVX512;
}

int zd__rnn_pack(rnn_packed_t *pk, const float *w, int K, int N, int groups, bool trans)
{
    const int ng = N / groups;
    pk->K = K;
    pk->N = N;
    pk->groups = groups;
    pk->per_group = (ng + PANEL - 1) / PANEL;
    const int panels = groups * pk->per_group;
    pk->p = zd__nn_alloc_floats((size_t)panels * K * PANEL);
    if (!pk->p)
        return -1;
    for (int q = 0; q < panels; q++) {
        float *p = pk->p + (size_t)q * K * PANEL;
        const int j0 = q / pk->per_group * ng + q % pk->per_group * PANEL; /* first column */
        const int n = panel_cols(pk, q % pk->per_group);
        if (n < PANEL)
            memset(p, 0, sizeof(float) * (size_t)K * PANEL);
        if (trans) { /* B(k, j) = w[j][k]: w is N x K */
            for (int c = 0; c < n; c++) {
                const float *wj = w + (size_t)(j0 + c) * K;
                for (int k = 0; k < K; k++)
                    p[(size_t)k * PANEL + c] = wj[k];
            }
        } else { /* B(k, j) = w[k][j]: w is K x N */
            for (int k = 0; k < K; k++)
                memcpy(p + (size_t)k * PANEL, w + (size_t)k * N + j0, sizeof(float) * (size_t)n);
        }
    }
    return 0;
}

void zd__rnn_packed_free(rnn_packed_t *pk)
{
    zd__nn_free_floats(pk->p);
    pk->p = NULL;
}

#define NN_BODY static inline __attribute__((always_inline))

/*  AVX-512: one register holds a panel row; eight rows at a time. */
NN_AVX512_BEGIN
NN_BODY void block_avx512(int mr, const float *a, int lda, const float *bp, int K, bool acc,
                          float *c, int ldc, int n)
{
    const __mmask16 m = (__mmask16)(n >= 16 ? 0xffff : (1u << n) - 1);
    __m512 s[8];
    for (int r = 0; r < mr; r++)
        s[r] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++, bp += PANEL) {
        const __m512 b = _mm512_load_ps(bp);
        for (int r = 0; r < mr; r++)
            s[r] = _mm512_fmadd_ps(_mm512_set1_ps(a[(size_t)r * lda + k]), b, s[r]);
    }
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * ldc;
        if (acc)
            s[r] = _mm512_add_ps(s[r], _mm512_maskz_loadu_ps(m, cr));
        _mm512_mask_storeu_ps(cr, m, s[r]);
    }
}

static void panel_avx512(int M, const float *a, int lda, const float *bp, int K, bool acc, float *c,
                         int ldc, int n)
{
    int i = 0;
    for (; i + 8 <= M; i += 8)
        block_avx512(8, a + (size_t)i * lda, lda, bp, K, acc, c + (size_t)i * ldc, ldc, n);
    for (; i < M; i++)
        block_avx512(1, a + (size_t)i * lda, lda, bp, K, acc, c + (size_t)i * ldc, ldc, n);
}
NN_AVX512_END

typedef void(panel_fn)(int M, const float *a, int lda, const float *bp, int K, bool acc, float *c,
                       int ldc, int n);

typedef struct {
    panel_fn *fn;
    int M, lda, ldc, n_chunks;
    const float *a;
    const rnn_packed_t *pk;
    bool acc;
    float *c;
    rnn_cols_fn *then;
    void *then_arg;
} job_t;

static void run_chunk(void *arg, int chunk, float *scratch)
{
    (void)scratch;
    const job_t *j = arg;
    const rnn_packed_t *pk = j->pk;
    const int ng = pk->N / pk->groups;
    int64_t lo, hi;
    nn_chunk_range(pk->per_group, j->n_chunks, chunk, &lo, &hi);
    if (lo == hi)
        return;
    for (int g = 0; g < pk->groups; g++)
        for (int64_t q = lo; q < hi; q++)
            j->fn(j->M, j->a, j->lda, pk->p + (size_t)(g * pk->per_group + q) * pk->K * PANEL,
                  pk->K, j->acc, j->c + g * ng + q * PANEL, j->ldc, panel_cols(pk, (int)q));
    if (j->then)
        j->then(j->then_arg, (int)lo * PANEL, hi * PANEL < ng ? (int)hi * PANEL : ng);
}

void zd__rnn_gemm_packed(int M, const float *a, int lda, const rnn_packed_t *pk, bool acc, float *c,
                         int ldc, rnn_cols_fn *then, void *then_arg)
{
    job_t j = {.fn = panel_avx512,
               .M = M,
               .lda = lda,
               .ldc = ldc,
               .a = a,
               .pk = pk,
               .acc = acc,
               .c = c,
               .then = then,
               .then_arg = then_arg};
    /* below about a million multiply-adds, waking the pool costs more than it saves */
    const int64_t work = (int64_t)M * pk->K * pk->N;
    j.n_chunks = work < (1 << 20) ? 1 : zd__nn_parallel_chunks();
    if (j.n_chunks > pk->per_group)
        j.n_chunks = pk->per_group;
    zd__nn_parallel_run(j.n_chunks, 0, run_chunk, &j); /* without scratch it cannot fail */
}
