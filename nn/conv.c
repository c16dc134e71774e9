/*  conv.c: 2-D convolution as im2col + GEMM, one sample at a time.

    Per sample, the input patches are unfolded into a (C*kH*kW) x (Ho*Wo)
    matrix `col`, so that the output is one GEMM, weight (O x C*kH*kW) by
    col, written straight into the sample's NCHW slice. The backward pass
    unfolds again (cheaper than keeping every sample's col alive) for the
    weight gradient dW += dY_n col^T, and folds W^T dY_n back onto the input
    (col2im) for the input gradient. One sample's col stays within L2, which
    measured faster here than one GEMM over the whole batch. */
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/nn.h"
#include "nn/nn_private.h"

typedef struct {
    int C, H, W;          /* input plane */
    int kh, kw;
    int stride, padding;
    int Ho, Wo;
} conv_geom_t;

/*  Output columns ow whose input column ow*stride - padding + kj lies in
    [0, W): [*lo, *hi). */
static void valid_range(const conv_geom_t *g, int kj, int *lo, int *hi)
{
    int off = kj - g->padding;          /* iw = ow*stride + off */
    int l = off >= 0 ? 0 : (-off + g->stride - 1) / g->stride;
    int last = g->W - 1 - off;          /* need ow*stride <= last */
    int h = last < 0 ? 0 : last / g->stride + 1;
    if (h > g->Wo)
        h = g->Wo;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
}

/*  Row helpers with restrict pointers, so that the compiler vectorises
    them without run-time alias checks. */
static inline void copy_row(float *restrict dst, const float *restrict src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = src[i];
}

static inline void add_row(float *restrict dst, const float *restrict src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] += src[i];
}

/*  Sum in 16 independent lanes (vectorisable; float addition order is
    otherwise fixed by the language). */
static inline float sum_row(const float *restrict d, int n)
{
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 16; k++)
            acc[k] += d[i + k];
    float total = 0.0f;
    for (; i < n; i++)
        total += d[i];
    for (int k = 0; k < 16; k++)
        total += acc[k];
    return total;
}

static void im2col(const conv_geom_t *g, const float *x, float *col)
{
    const int P = g->Ho * g->Wo;
    for (int c = 0; c < g->C; c++) {
        const float *xc = x + (size_t)c * g->H * g->W;
        for (int ki = 0; ki < g->kh; ki++) {
            for (int kj = 0; kj < g->kw; kj++) {
                float *row = col + ((size_t)(c * g->kh + ki) * g->kw + kj) * P;
                int lo, hi;
                valid_range(g, kj, &lo, &hi);
                int off = kj - g->padding;
                for (int oh = 0; oh < g->Ho; oh++) {
                    float *dst = row + (size_t)oh * g->Wo;
                    int ih = oh * g->stride - g->padding + ki;
                    if (ih < 0 || ih >= g->H) {
                        memset(dst, 0, sizeof(float) * (size_t)g->Wo);
                        continue;
                    }
                    const float *src = xc + (size_t)ih * g->W;
                    for (int ow = 0; ow < lo; ow++)
                        dst[ow] = 0.0f;
                    if (g->stride == 1) {
                        copy_row(dst + lo, src + lo + off, hi - lo);
                    } else {
                        for (int ow = lo; ow < hi; ow++)
                            dst[ow] = src[ow * g->stride + off];
                    }
                    for (int ow = hi; ow < g->Wo; ow++)
                        dst[ow] = 0.0f;
                }
            }
        }
    }
}

/*  dx (C,H,W) += fold(dcol); dx must be initialised by the caller. */
static void col2im(const conv_geom_t *g, const float *dcol, float *dx)
{
    const int P = g->Ho * g->Wo;
    for (int c = 0; c < g->C; c++) {
        float *xc = dx + (size_t)c * g->H * g->W;
        for (int ki = 0; ki < g->kh; ki++) {
            for (int kj = 0; kj < g->kw; kj++) {
                const float *row = dcol + ((size_t)(c * g->kh + ki) * g->kw + kj) * P;
                int lo, hi;
                valid_range(g, kj, &lo, &hi);
                int off = kj - g->padding;
                for (int oh = 0; oh < g->Ho; oh++) {
                    int ih = oh * g->stride - g->padding + ki;
                    if (ih < 0 || ih >= g->H)
                        continue;
                    float *dst = xc + (size_t)ih * g->W + off;
                    const float *src = row + (size_t)oh * g->Wo;
                    if (g->stride == 1) {
                        add_row(dst + lo, src + lo, hi - lo);
                    } else {
                        for (int ow = lo; ow < hi; ow++)
                            dst[ow * g->stride] += src[ow];
                    }
                }
            }
        }
    }
}

/*  A 1x1 kernel with stride 1 and no padding needs no unfolding: the
    sample itself is the col matrix. */
static bool is_pointwise(const conv_geom_t *g)
{
    return g->kh == 1 && g->kw == 1 && g->stride == 1 && g->padding == 0;
}

typedef struct {
    conv_geom_t g;
    int N, O;
} conv_ctx_t;

/*  One backward pass, split by samples: chunk c handles its own samples
    with its own col buffer and its own partial dW and db, summed in chunk
    order afterwards (so the result does not depend on thread timing). */
typedef struct {
    const conv_geom_t *g;
    int N, O, n_chunks;
    const float *x, *w, *dy;
    float *dx;            /* NULL: no input gradient */
    float **dw_part;      /* per chunk, O x K; NULL: no weight gradient */
    float *db_part;       /* n_chunks x O; NULL: no bias gradient */
} conv_bwd_job_t;

static void conv_bwd_chunk(void *arg, int c, float *col)
{
    const conv_bwd_job_t *j = arg;
    const conv_geom_t *g = j->g;
    const int O = j->O, P = g->Ho * g->Wo, K = g->C * g->kh * g->kw, CHW = g->C * g->H * g->W;
    const bool pointwise = is_pointwise(g);
    int64_t lo, hi;
    nn_chunk_range(j->N, j->n_chunks, c, &lo, &hi);
    if (j->dw_part && lo == hi)
        memset(j->dw_part[c], 0, sizeof(float) * (size_t)O * K);
    if (j->db_part)
        memset(j->db_part + (size_t)c * O, 0, sizeof(float) * (size_t)O);
    for (int64_t s = lo; s < hi; s++) {
        const float *dys = j->dy + (size_t)s * O * P;
        const float *xs = j->x + (size_t)s * CHW;
        if (j->dw_part) {
            if (!pointwise)
                im2col(g, xs, col);
            nn_sgemm(false, true, O, K, P, 1.0f, dys, P, pointwise ? xs : col, P,
                     s == lo ? 0.0f : 1.0f, j->dw_part[c], K);
        }
        if (j->db_part) {
            float *db = j->db_part + (size_t)c * O;
            for (int o = 0; o < O; o++)
                db[o] += sum_row(dys + (size_t)o * P, P);
        }
        if (j->dx) {
            float *dxs = j->dx + (size_t)s * CHW;
            if (pointwise) {
                nn_sgemm(true, false, K, P, O, 1.0f, j->w, K, dys, P, 0.0f, dxs, P);
            } else {
                nn_sgemm(true, false, K, P, O, 1.0f, j->w, K, dys, P, 0.0f, col, P);
                memset(dxs, 0, sizeof(float) * (size_t)CHW);
                col2im(g, col, dxs);
            }
        }
    }
}

static int conv_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const conv_ctx_t *ctx = autograd_node_ctx(n);
    const conv_geom_t *g = &ctx->g;
    tensor_t *x = autograd_node_saved(n, 0), *w = autograd_node_saved(n, 1);
    const int O = ctx->O, P = g->Ho * g->Wo, K = g->C * g->kh * g->kw;
    const bool need_x = autograd_node_needs_grad(n, 0);
    const bool need_w = autograd_node_needs_grad(n, 1);
    const bool need_b = autograd_node_needs_grad(n, 2);
    int chunks = nn_parallel_chunks();
    if (chunks > ctx->N)
        chunks = ctx->N > 0 ? ctx->N : 1;
    conv_bwd_job_t job = {
        .g = g, .N = ctx->N, .O = O, .n_chunks = chunks,
        .x = tensor_data(x), .w = tensor_data(w), .dy = tensor_data(gout[0]),
    };
    float *parts[NN_MAX_CHUNKS] = {0};
    int rc = -1;

    if (need_x && !(gin[0] = tensor_empty(TENSOR_F32, 4, tensor_shape(x))))
        goto out;
    if (need_w && !(gin[1] = tensor_empty(TENSOR_F32, 4, tensor_shape(w))))
        goto out;
    if (need_b && !(gin[2] = tensor_empty(TENSOR_F32, 1, (int64_t[]){O})))
        goto out;
    if (need_w) {
        parts[0] = tensor_data(gin[1]);
        for (int c = 1; c < chunks; c++)
            if (!(parts[c] = malloc(sizeof(float) * (size_t)O * K)))
                goto oom;
        job.dw_part = parts;
    }
    if (need_b && !(job.db_part = malloc(sizeof(float) * (size_t)chunks * O)))
        goto oom;
    job.dx = need_x ? tensor_data(gin[0]) : NULL;
    size_t scratch = !is_pointwise(g) && (need_x || need_w) ? (size_t)K * P : 0;
    if (nn_parallel_run(chunks, scratch, conv_bwd_chunk, &job) < 0)
        goto out;
    for (int c = 1; need_w && c < chunks; c++)
        for (size_t i = 0; i < (size_t)O * K; i++)
            parts[0][i] += parts[c][i];
    if (need_b) {
        float *db = tensor_data(gin[2]);
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
    error_set("conv2d backward: out of memory");
out:
    for (int c = 1; c < chunks; c++)
        free(parts[c]);
    free(job.db_part);
    return rc;
}

static const autograd_node_ops_t conv_ops = {"ConvolutionBackward", conv_backward,
                                              nn_free_ctx};

typedef struct {
    const conv_geom_t *g;
    int N, O, n_chunks;
    const float *x, *w, *b;
    float *y;
} conv_fwd_job_t;

static void conv_fwd_chunk(void *arg, int c, float *col)
{
    const conv_fwd_job_t *j = arg;
    const conv_geom_t *g = j->g;
    const int O = j->O, P = g->Ho * g->Wo, K = g->C * g->kh * g->kw;
    int64_t lo, hi;
    nn_chunk_range(j->N, j->n_chunks, c, &lo, &hi);
    for (int64_t s = lo; s < hi; s++) {
        const float *xs = j->x + (size_t)s * g->C * g->H * g->W;
        float *ys = j->y + (size_t)s * O * P;
        if (col)
            im2col(g, xs, col);
        if (j->b)
            for (int o = 0; o < O; o++)
                for (int p = 0; p < P; p++)
                    ys[(size_t)o * P + p] = j->b[o];
        nn_sgemm(false, false, O, P, K, 1.0f, j->w, K, col ? col : xs, P, j->b ? 1.0f : 0.0f,
                 ys, P);
    }
}

int nn_conv2d(tensor_t *x, tensor_t *weight, tensor_t *bias, int stride, int padding,
              tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("conv2d: input", x) < 0 || nn_check_f32("conv2d: weight", weight) < 0 ||
        nn_check_ndim("conv2d: input", x, 4) < 0 ||
        nn_check_ndim("conv2d: weight", weight, 4) < 0)
        return -1;
    if (bias && (nn_check_f32("conv2d: bias", bias) < 0 ||
                 nn_check_ndim("conv2d: bias", bias, 1) < 0))
        return -1;
    char sx[96], sw[96];
    tensor_shape_str(x, sx, sizeof sx);
    tensor_shape_str(weight, sw, sizeof sw);
    if (stride < 1 || padding < 0)
        return error_set("conv2d: stride %d must be >= 1 and padding %d >= 0", stride, padding);
    const int64_t *xs = tensor_shape(x), *ws = tensor_shape(weight);
    if (xs[1] != ws[1])
        return error_set("conv2d: input %s has %lld channels but weight %s expects %lld", sx,
                         (long long)xs[1], sw, (long long)ws[1]);
    if (bias && tensor_size(bias, 0) != ws[0])
        return error_set("conv2d: bias has %lld entries for %lld output channels",
                         (long long)tensor_size(bias, 0), (long long)ws[0]);
    for (int d = 0; d < 4; d++)
        if (xs[d] > INT32_MAX / 4 || ws[d] > INT32_MAX / 4)
            return error_set("conv2d: shapes %s, %s too large", sx, sw);
    if (ws[0] < 1 || ws[2] < 1 || ws[3] < 1)
        return error_set("conv2d: empty weight %s", sw);
    int64_t hp = xs[2] + 2 * (int64_t)padding, wp = xs[3] + 2 * (int64_t)padding;
    if (hp < ws[2] || wp < ws[3])
        return error_set("conv2d: kernel %lldx%lld larger than the padded input %lldx%lld "
                         "(input %s, padding %d)", (long long)ws[2], (long long)ws[3],
                         (long long)hp, (long long)wp, sx, padding);
    conv_geom_t g = {
        .C = (int)xs[1], .H = (int)xs[2], .W = (int)xs[3],
        .kh = (int)ws[2], .kw = (int)ws[3], .stride = stride, .padding = padding,
        .Ho = (int)((hp - ws[2]) / stride + 1), .Wo = (int)((wp - ws[3]) / stride + 1),
    };
    const int N = (int)xs[0], O = (int)ws[0], P = g.Ho * g.Wo, K = g.C * g.kh * g.kw;
    if ((int64_t)K * P > INT32_MAX || (int64_t)O * P > INT32_MAX)
        return error_set("conv2d: input %s with weight %s is too large", sx, sw);

    int chunks = nn_parallel_chunks();
    if (chunks > N)
        chunks = N > 0 ? N : 1;
    tensor_t *y = tensor_empty(TENSOR_F32, 4, (int64_t[]){N, O, g.Ho, g.Wo});
    conv_ctx_t *ctx = malloc(sizeof *ctx);
    if (!y || !ctx) {
        tensor_unref(y);
        free(ctx);
        return error_set("conv2d: out of memory");
    }
    conv_fwd_job_t job = {
        .g = &g, .N = N, .O = O, .n_chunks = chunks, .x = tensor_data(x),
        .w = tensor_data(weight), .b = bias ? tensor_data(bias) : NULL, .y = tensor_data(y),
    };
    size_t scratch = is_pointwise(&g) ? 0 : (size_t)K * P;
    if (nn_parallel_run(chunks, scratch, conv_fwd_chunk, &job) < 0) {
        tensor_unref(y);
        free(ctx);
        return error_wrap("conv2d");
    }
    ctx->g = g;
    ctx->N = N;
    ctx->O = O;
    tensor_t *in[3] = {x, weight, bias};
    if (nn_record(&conv_ops, 3, in, y, x, weight, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}
