/* SPDX-License-Identifier: MIT */
/*  conv.c: 2-D convolution, one sample at a time, with an optional fused
    relu or max pool after it: the op, its checks and its bookkeeping, and
    the im2col path.

    Stride-1 convolutions (the Net's) take the taps path on AVX-512 and
    AVX2 (conv_taps.c): the input planes are multiplied directly, without
    unfolding them; through a fused pool the backward pass runs over the
    pool's winners only (conv_sparse.c); 3x3 shapes with enough channels
    (the Net's conv2) run their forward pass by Winograd's F(2x2, 3x3)
    (winograd.c). The others run as im2col + GEMM: per sample, the input
    patches are unfolded into a (C*kH*kW) x (Ho*Wo) matrix `col`, so that
    the output is one GEMM, weight (O x C*kH*kW) by col, written straight
    into the sample's NCHW slice. The backward pass unfolds again (cheaper
    than keeping every sample's col alive) for the weight gradient
    dW += dY_n col^T, and folds W^T dY_n back onto the input (col2im) for
    the input gradient. Samples are spread over the pool's threads
    (parallel.c); the unfolding itself is in conv_unfold.c.

    The fused forms keep the convolution's own output in per-thread scratch
    (relu: in the output itself) and never store it for the whole batch;
    their backward rebuilds the convolution's output gradient per sample. */
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "core/blocks.h"
#include "nn/conv_private.h"
#include "nn/winograd.h"

/*  A 1x1 kernel with stride 1 and no padding needs no unfolding: the
    sample itself is the col matrix. */
static bool is_pointwise(const nn_conv_geom_t *g)
{
    return g->kh == 1 && g->kw == 1 && g->stride == 1 && g->padding == 0;
}

static void conv_release(zd_autograd_node_t *n)
{
    conv_ctx_t *ctx = zd_autograd_node_ctx(n);
    if (ctx)
        zd__mem_free(ctx->argmax);
    free(ctx);
}

/*  ---- forward ---- */

/*  scratch: col (K*P, unless pointwise), then the conv output (O*P) when
    pooling. */
static void im2col_fwd_chunk(void *arg, int c, float *scratch)
{
    const conv_fwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const int O = ctx->O, P = g->Ho * g->Wo, K = g->C * g->kh * g->kw;
    const bool pointwise = is_pointwise(g);
    float *col = pointwise ? NULL : scratch;
    float *conv_out = pointwise ? scratch : scratch + (size_t)K * P;
    const int64_t per_out = conv_out_per_sample(ctx);
    int64_t lo, hi;
    nn_chunk_range(ctx->N, j->n_chunks, c, &lo, &hi);
    for (int64_t s = lo; s < hi; s++) {
        const float *xs = j->x + (size_t)s * g->C * g->H * g->W;
        float *ys = j->y + s * per_out;
        float *dst = ctx->epi == EPI_POOL ? conv_out : ys;
        if (col)
            zd__nn_im2col(g, xs, col);
        if (j->b)
            for (int o = 0; o < O; o++)
                for (int p = 0; p < P; p++)
                    dst[(size_t)o * P + p] = j->b[o];
        zd__nn_sgemm(false, false, O, P, K, 1.0f, j->w, K, col ? col : xs, P, j->b ? 1.0f : 0.0f,
                     dst, P);
        if (ctx->epi == EPI_RELU) {
            for (size_t i = 0; i < (size_t)O * P; i++)
                dst[i] = dst[i] > 0.0f ? dst[i] : 0.0f;
        } else if (ctx->epi == EPI_POOL) {
            const int pp = ctx->Hp * ctx->Wp;
            for (int o = 0; o < O; o++)
                zd__nn_pool_plane(dst + (size_t)o * P, g->Ho, g->Wo, g->Wo, g->Wo, ctx->pool_k,
                                  ctx->pool_s, ys + (size_t)o * pp, ctx->argmax + (s * O + o) * pp);
        }
    }
}

/*  ---- backward ---- */

/*  The gradient of the convolution's own output for sample s: dy itself,
    or rebuilt in buf through the relu or the pool. */
static const float *conv_out_grad(const conv_bwd_job_t *j, int64_t s, float *buf)
{
    const conv_ctx_t *ctx = j->ctx;
    const int O = ctx->O, P = ctx->g.Ho * ctx->g.Wo;
    const float *dys = j->dy + s * conv_out_per_sample(ctx);
    if (ctx->epi == EPI_NONE)
        return dys;
    if (ctx->epi == EPI_RELU) {
        const float *restrict ys = j->y + (size_t)s * O * P;
        float *restrict d = buf;
        for (size_t i = 0; i < (size_t)O * P; i++) {
            float v = dys[i];
            d[i] = ys[i] > 0.0f ? v : 0.0f;
        }
        return buf;
    }
    const int pp = ctx->Hp * ctx->Wp;
    for (int o = 0; o < O; o++)
        zd__nn_pool_plane_backward(dys + (size_t)o * pp, ctx->argmax + (s * O + o) * pp, ctx->g.Ho,
                                   ctx->g.Wo, ctx->pool_k, ctx->pool_s, buf + (size_t)o * P);
    return buf;
}

/*  scratch: col (K*P), then the conv output gradient (O*P) with an
    epilogue. */
static void im2col_bwd_chunk(void *arg, int c, float *scratch)
{
    const conv_bwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const nn_conv_geom_t *g = &ctx->g;
    const int O = ctx->O, P = g->Ho * g->Wo, K = g->C * g->kh * g->kw, CHW = g->C * g->H * g->W;
    const bool pointwise = is_pointwise(g);
    float *col = pointwise ? NULL : scratch;
    float *dyc_buf = pointwise ? scratch : scratch + (size_t)K * P;
    int64_t lo, hi;
    nn_chunk_range(ctx->N, j->n_chunks, c, &lo, &hi);
    if (j->dw_part && lo == hi)
        memset(j->dw_part[c], 0, sizeof(float) * (size_t)O * K);
    if (j->db_part)
        memset(j->db_part + (size_t)c * O, 0, sizeof(float) * (size_t)O);
    for (int64_t s = lo; s < hi; s++) {
        const float *dys = conv_out_grad(j, s, dyc_buf);
        const float *xs = j->x + (size_t)s * CHW;
        if (j->dw_part) {
            if (!pointwise)
                zd__nn_im2col(g, xs, col);
            zd__nn_sgemm(false, true, O, K, P, 1.0f, dys, P, pointwise ? xs : col, P,
                         s == lo ? 0.0f : 1.0f, j->dw_part[c], K);
        }
        if (j->db_part) {
            float *db = j->db_part + (size_t)c * O;
            for (int o = 0; o < O; o++)
                db[o] += conv_sum_row(dys + (size_t)o * P, P);
        }
        if (j->dx) {
            float *dxs = j->dx + (size_t)s * CHW;
            if (pointwise) {
                zd__nn_sgemm(false, false, K, P, O, 1.0f, j->wt, O, dys, P, 0.0f, dxs, P);
            } else {
                zd__nn_sgemm(false, false, K, P, O, 1.0f, j->wt, O, dys, P, 0.0f, col, P);
                memset(dxs, 0, sizeof(float) * (size_t)CHW);
                zd__nn_col2im(g, col, dxs);
            }
        }
    }
}

static size_t scratch_floats(const conv_ctx_t *ctx, bool backward, bool need_w, bool need_x)
{
    if (ctx->taps)
        return backward ? zd__conv_taps_bwd_scratch(ctx, need_w, need_x)
                        : zd__conv_taps_fwd_scratch(ctx);
    const nn_conv_geom_t *g = &ctx->g;
    size_t P = (size_t)g->Ho * g->Wo, K = (size_t)g->C * g->kh * g->kw;
    return (is_pointwise(g) ? 0 : K * P) + (ctx->epi != EPI_NONE ? (size_t)ctx->O * P : 0);
}

/*  The forward pass takes one sample per chunk; the backward pass, which
    keeps a partial weight gradient per chunk, two samples per chunk (at
    least a few chunks per thread; one chunk without helper threads).
    Threads take chunks as they come, so one slowed down (by another
    process, say) does not hold the other up for more than a chunk. */
#define MIN_BWD_CHUNKS_PER_THREAD 4
#define MAX_BWD_CHUNKS            64

static int conv_chunks(int N, bool backward)
{
    const int threads = zd__nn_parallel_chunks();
    int chunks = N;
    if (backward) {
        chunks = threads == 1 ? 1 : (N + 1) / 2;
        if (threads > 1 && chunks < MIN_BWD_CHUNKS_PER_THREAD * threads)
            chunks = MIN_BWD_CHUNKS_PER_THREAD * threads;
        if (chunks > MAX_BWD_CHUNKS)
            chunks = MAX_BWD_CHUNKS;
    }
    return chunks > N ? (N > 0 ? N : 1) : chunks;
}

static int conv_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const conv_ctx_t *ctx = zd_autograd_node_ctx(n);
    zd_tensor_t *x = zd_autograd_node_saved(n, 0), *w = zd_autograd_node_saved(n, 1);
    const int O = ctx->O, K = ctx->g.C * ctx->g.kh * ctx->g.kw;
    const bool need_x = zd_autograd_node_needs_grad(n, 0);
    const bool need_w = zd_autograd_node_needs_grad(n, 1);
    const bool need_b = zd_autograd_node_needs_grad(n, 2);
    const int chunks = conv_chunks(ctx->N, true);
    conv_bwd_job_t job = {
        .ctx = ctx,
        .n_chunks = chunks,
        .x = zd_tensor_data(x),
        .dy = zd_tensor_data(gout[0]),
        .y = ctx->epi == EPI_RELU ? zd_tensor_data(zd_autograd_node_saved(n, 2)) : NULL,
    };
    float *parts[MAX_BWD_CHUNKS] = {0}, *wt = NULL;
    int32_t *offs = NULL;
    int rc = -1;

    if (need_x && !(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), 4)))
        goto out;
    if (need_w && !(gin[1] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(w), 4)))
        goto out;
    if (need_b && !(gin[2] = zd_tensor_empty(ZD_FLOAT32, (int64_t[]){O}, 1)))
        goto out;
    if (need_w) {
        /* the taps path's partial sums are transposed (K x O) */
        parts[0] = ctx->taps ? NULL : zd_tensor_data(gin[1]);
        for (int c = parts[0] ? 1 : 0; c < chunks; c++)
            if (!(parts[c] = malloc(sizeof(float) * (size_t)O * K)))
                goto oom;
        job.dw_part = parts;
    }
    if (need_b && !(job.db_part = malloc(sizeof(float) * (size_t)chunks * O)))
        goto oom;
    if (need_x)
        job.dx = zd_tensor_data(gin[0]);
    if (ctx->taps && (need_w || need_x)) {
        if (!(offs = malloc(sizeof(int32_t) * zd__conv_taps_bwd_ints(ctx))))
            goto oom;
        if (need_x && !(wt = zd__nn_alloc_floats(zd__conv_taps_bwd_wfloats(ctx))))
            goto oom;
        if (zd__conv_taps_bwd_prepare(&job, zd_tensor_data(w), offs, wt) < 0)
            goto out;
    } else if (need_x) {
        if (!(wt = zd__nn_alloc_floats((size_t)K * O + 1)))
            goto oom;
        const float *wd = zd_tensor_data(w);
        for (int o = 0; o < O; o++)
            for (int k = 0; k < K; k++)
                wt[(size_t)k * O + o] = wd[(size_t)o * K + k];
        job.wt = wt;
    }
    if (zd__nn_parallel_run(chunks, scratch_floats(ctx, true, need_w, need_x),
                            ctx->taps ? zd__conv_taps_bwd_chunk : im2col_bwd_chunk, &job) < 0)
        goto out;
    for (int c = 1; need_w && c < chunks; c++)
        for (size_t i = 0; i < (size_t)O * K; i++)
            parts[0][i] += parts[c][i];
    if (need_w && ctx->taps) {
        float *dw = zd_tensor_data(gin[1]);
        for (int k = 0; k < K; k++)
            for (int o = 0; o < O; o++)
                dw[(size_t)o * K + k] = parts[0][(size_t)k * O + o];
    }
    if (need_b) {
        float *db = zd_tensor_data(gin[2]);
        for (int o = 0; o < O; o++) {
            float acc = 0.0f;
            for (int c = 0; c < chunks; c++)
                acc += job.db_part[(size_t)c * O + o];
            db[o] = acc;
        }
    }
    rc = 0;
    goto out;
oom:
    zd_error_set_code(ZD_ERR_NO_MEMORY, "conv2d backward: out of memory");
out:
    for (int c = ctx->taps ? 0 : 1; c < chunks; c++)
        free(parts[c]);
    free(job.db_part);
    zd__nn_free_floats(wt);
    free(offs);
    return rc;
}

static const zd_autograd_node_ops_t conv_ops =
    ZD_AUTOGRAD_NODE_OPS("ConvolutionBackward", conv_backward, conv_release);

/*  ---- entry points ---- */

/*  Checks the arguments and fills ctx->g, N, O. */
static int conv_setup(const char *op, zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias,
                      int stride, int padding, conv_ctx_t *ctx)
{
    char sx[96], sw[96];
    if (zd__nn_check_f32("conv2d: input", x) < 0 || zd__nn_check_ndim("conv2d: input", x, 4) < 0 ||
        zd__nn_check_f32("conv2d: weight", weight) < 0 ||
        zd__nn_check_ndim("conv2d: weight", weight, 4) < 0)
        return -1;
    if (bias &&
        (zd__nn_check_f32("conv2d: bias", bias) < 0 ||
         zd__nn_check_ndim("conv2d: bias", bias, 1) < 0))
        return -1;
    zd_tensor_shape_str(x, sx, sizeof sx);
    zd_tensor_shape_str(weight, sw, sizeof sw);
    if (stride < 1 || padding < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: stride %d must be >= 1 and padding %d >= 0",
                                 op, stride, padding);
    const int64_t *xs = zd_tensor_shape(x), *ws = zd_tensor_shape(weight);
    if (xs[1] != ws[1])
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: input %s has %lld channels but weight %s expects %lld", op,
                                 sx, (long long)xs[1], sw, (long long)ws[1]);
    if (bias && zd_tensor_size(bias, 0) != ws[0])
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: bias has %lld entries for %lld output channels", op,
                                 (long long)zd_tensor_size(bias, 0), (long long)ws[0]);
    for (int d = 0; d < 4; d++)
        if (xs[d] > INT32_MAX / 4 || ws[d] > INT32_MAX / 4)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: shapes %s, %s too large", op, sx, sw);
    if (ws[0] < 1 || ws[2] < 1 || ws[3] < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: empty weight %s", op, sw);
    int64_t hp = xs[2] + 2 * (int64_t)padding, wp = xs[3] + 2 * (int64_t)padding;
    if (hp < ws[2] || wp < ws[3])
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: kernel %lldx%lld larger than the padded input %lldx%lld "
                                 "(input %s, padding %d)",
                                 op, (long long)ws[2], (long long)ws[3], (long long)hp,
                                 (long long)wp, sx, padding);
    ctx->g = (nn_conv_geom_t){
        .C = (int)xs[1],
        .H = (int)xs[2],
        .W = (int)xs[3],
        .kh = (int)ws[2],
        .kw = (int)ws[3],
        .stride = stride,
        .padding = padding,
        .Ho = (int)((hp - ws[2]) / stride + 1),
        .Wo = (int)((wp - ws[3]) / stride + 1),
    };
    ctx->N = (int)xs[0];
    ctx->O = (int)ws[0];
    int64_t P = (int64_t)ctx->g.Ho * ctx->g.Wo, K = xs[1] * ws[2] * ws[3];
    if (K * P > INT32_MAX || ctx->O * P > INT32_MAX)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: input %s with weight %s is too large", op,
                                 sx, sw);
    return 0;
}

/*  Winograd's forward pass (winograd.c) hands each sample's raw output here:
    relu in place, or pooled into the output with the winners numbered as
    the taps path numbers them (rows t.Wp apart), for conv_sparse.c. */
static void winograd_epilogue(void *arg, int n, float *y_n)
{
    const conv_fwd_job_t *j = arg;
    const conv_ctx_t *ctx = j->ctx;
    const int O = ctx->O, Ho = ctx->g.Ho, Wo = ctx->g.Wo;
    const size_t P = (size_t)Ho * Wo;
    if (ctx->epi == EPI_RELU) {
        for (size_t i = 0; i < (size_t)O * P; i++)
            y_n[i] = y_n[i] > 0.0f ? y_n[i] : 0.0f;
        return;
    }
    const int pp = ctx->Hp * ctx->Wp;
    float *ys = j->y + (int64_t)n * conv_out_per_sample(ctx);
    for (int o = 0; o < O; o++)
        zd__nn_pool_plane(y_n + o * P, Ho, Wo, Wo, ctx->t.Wp, ctx->pool_k, ctx->pool_s,
                          ys + (size_t)o * pp, ctx->argmax + ((int64_t)n * O + o) * pp);
}

/*  Runs the forward pass described by ctx (owned: freed on failure, else
    handed to the node) and records it. */
static int conv_run(conv_ctx_t *ctx, zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias,
                    zd_tensor_t **out)
{
    int64_t shape[4] = {ctx->N, ctx->O, ctx->g.Ho, ctx->g.Wo};
    if (ctx->epi == EPI_POOL) {
        shape[2] = ctx->Hp;
        shape[3] = ctx->Wp;
        ctx->argmax =
            zd__mem_alloc(sizeof(int32_t) * ((size_t)ctx->N * ctx->O * ctx->Hp * ctx->Wp + 1));
    }
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, shape, 4);
    if (!y || (ctx->epi == EPI_POOL && !ctx->argmax)) {
        zd_tensor_unref(y);
        zd__mem_free(ctx->argmax);
        free(ctx);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "conv2d: out of memory");
    }
    conv_fwd_job_t job = {
        .ctx = ctx,
        .n_chunks = conv_chunks(ctx->N, false),
        .x = zd_tensor_data(x),
        .w = zd_tensor_data(weight),
        .b = bias ? zd_tensor_data(bias) : NULL,
        .y = zd_tensor_data(y),
    };
    const int K = ctx->g.C * ctx->g.kh * ctx->g.kw;
    float *wpack = NULL;
    int32_t *offs = NULL;
    int rc = 0;
    const nn_conv_geom_t *g = &ctx->g;
    if (ctx->taps &&
        zd__nn_winograd_applies(g->C, ctx->O, g->H, g->W, g->kh, g->kw, g->stride, g->padding, 1,
                                false)) {
        rc = zd__nn_winograd_forward(job.x, ctx->N, g->C, g->H, g->W, job.w, ctx->O, job.b,
                                     g->padding, ctx->epi == EPI_POOL ? NULL : job.y,
                                     ctx->epi == EPI_NONE ? NULL : winograd_epilogue, &job);
    } else if (ctx->taps) {
        wpack = zd__nn_alloc_floats(zd__nn_taps_packed_floats(ctx->O, K));
        offs = malloc(sizeof(int32_t) * (size_t)K);
        if (!wpack || !offs) {
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "conv2d: out of memory");
        } else {
            zd__nn_taps_pack(job.w, ctx->O, K, K, NULL, wpack);
            zd__conv_taps_offsets(ctx, offs);
            job.wpack = wpack;
            job.offs = offs;
        }
    }
    if (rc == 0 && (wpack || !ctx->taps))
        rc = zd__nn_parallel_run(job.n_chunks, scratch_floats(ctx, false, false, false),
                                 ctx->taps ? zd__conv_taps_fwd_chunk : im2col_fwd_chunk, &job);
    zd__nn_free_floats(wpack);
    free(offs);
    if (rc < 0) {
        zd_tensor_unref(y);
        zd__mem_free(ctx->argmax);
        free(ctx);
        return zd_error_wrap("conv2d");
    }
    zd_tensor_t *in[3] = {x, weight, bias};
    zd_autograd_node_t *n;
    if (zd_autograd_node_new(&conv_ops, in, 3, 1, &n) < 0) {
        zd_tensor_unref(y);
        zd__mem_free(ctx->argmax);
        free(ctx);
        return -1;
    }
    if (n) {
        zd_autograd_node_save(n, 0, x);
        zd_autograd_node_save(n, 1, weight);
        zd_autograd_node_set_ctx(n, ctx);
        if (ctx->epi == EPI_RELU)
            zd_autograd_node_save(n, 2, y); /* the output: kept as a view, no cycle */
        zd_autograd_node_set_output(n, y);
        zd_autograd_node_unref(n);
    } else {
        zd__mem_free(ctx->argmax);
        free(ctx);
    }
    *out = y;
    return 0;
}

static int conv_entry(const char *op, zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias,
                      int stride, int padding, conv_epilogue_t epi, int pool_k, int pool_s,
                      zd_tensor_t **out)
{
    *out = NULL;
    conv_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", op);
    if (conv_setup(op, x, weight, bias, stride, padding, ctx) < 0) {
        free(ctx);
        return -1;
    }
    ctx->epi = epi;
    if (epi == EPI_POOL) {
        if (pool_s == 0)
            pool_s = pool_k;
        if (pool_k < 1 || pool_s < 1 || ctx->g.Ho < pool_k || ctx->g.Wo < pool_k) {
            zd_error_set_code(
                ZD_ERR_ARGUMENT,
                "%s: pool kernel %d, stride %d do not fit the %dx%d convolution output", op, pool_k,
                pool_s, ctx->g.Ho, ctx->g.Wo);
            free(ctx);
            return -1;
        }
        ctx->pool_k = pool_k;
        ctx->pool_s = pool_s;
        ctx->Hp = (ctx->g.Ho - pool_k) / pool_s + 1;
        ctx->Wp = (ctx->g.Wo - pool_k) / pool_s + 1;
    }
    zd__conv_taps_plan(ctx);
    return conv_run(ctx, x, weight, bias, out);
}

int zd_nn_conv2d(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, int stride, int padding,
                 zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_conv2d: NULL out");
    return conv_entry("conv2d", x, weight, bias, stride, padding, EPI_NONE, 0, 0, out);
}

int zd_nn_conv2d_relu(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, int stride,
                      int padding, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_conv2d_relu: NULL out");
    return conv_entry("conv2d_relu", x, weight, bias, stride, padding, EPI_RELU, 0, 0, out);
}

int zd_nn_conv2d_max_pool2d(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, int stride,
                            int padding, int pool_kernel, int pool_stride, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_conv2d_max_pool2d: NULL out");
    return conv_entry("conv2d_max_pool2d", x, weight, bias, stride, padding, EPI_POOL, pool_kernel,
                      pool_stride, out);
}
