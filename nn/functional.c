/* SPDX-License-Identifier: MIT */
/*  functional.c: linear, relu, dropout, dropout2d, flatten. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "core/fault_inject.h"
#include "nn/nn_private.h"

/*  ---- linear ---- */

/*  Rows of a (..., in) input: the product of its leading dimensions (even
    when in is 0). */
static int64_t leading_rows(const zd_tensor_t *x)
{
    int64_t rows = 1;
    for (int d = 0; d + 1 < zd_tensor_ndim(x); d++)
        rows *= zd_tensor_size(x, d);
    return rows;
}

/*  Linear layers split by blocks of columns of the result (features), so
    each chunk writes its own part of the output and nothing is reduced. */
typedef struct {
    int which; /* 0: y = x W^T, 1: dx = dy W, 2: dW = dy^T x */
    int rows, in_f, out_f, n_chunks;
    const float *x, *w, *dy;
    float *out;
    /* the taps paths (see linear_taps and linear_forward_taps) */
    const float *packed; /* dy (which 1) or dy^T (which 2), packed by zd__nn_taps_pack */
    const int32_t *offs; /* rows of W (which 0, 1) or of x (which 2) */
    const float *xt;     /* which 0: x transposed, in_f x ldr */
    float *yt;           /* which 0: y transposed, out_f x ldr */
    int ldr;
} linear_job_t;

#define LINEAR_RUN 512

static void linear_chunk(void *arg, int c, float *scratch)
{
    const linear_job_t *j = arg;
    (void)scratch;
    int64_t lo, hi;
    switch (j->which) {
    case 0:
        nn_chunk_range(j->out_f, j->n_chunks, c, &lo, &hi);
        if (j->xt) {
            /* runs of LINEAR_RUN inputs, each summed apart and then added to
               y: shorter chains of float additions than one of in_f */
            const int nrun = j->in_f / LINEAR_RUN, rest = j->in_f % LINEAR_RUN;
            const int64_t done = (int64_t)nrun * LINEAR_RUN;
            if (nrun)
                zd__nn_taps_gemm_bt(j->offs + lo, (int)(hi - lo), j->w, j->xt, j->ldr, j->rows,
                                    nrun, LINEAR_RUN, LINEAR_RUN, j->yt + lo * j->ldr, j->ldr);
            if (rest)
                zd__nn_taps_gemm_bt(j->offs + lo, (int)(hi - lo), j->w + done,
                                    j->xt + done * j->ldr, j->ldr, j->rows, 1, rest, rest,
                                    j->yt + lo * j->ldr, j->ldr);
        } else
            zd__nn_sgemm(false, true, j->rows, (int)(hi - lo), j->in_f, 1.0f, j->x, j->in_f,
                         j->w + lo * j->in_f, j->in_f, 1.0f, j->out + lo, j->out_f);
        break;
    case 1:
        nn_chunk_range(j->in_f, j->n_chunks, c, &lo, &hi);
        if (j->packed)
            zd__nn_taps_gemm(j->packed, j->rows, j->out_f, j->offs, j->w + lo, (int)(hi - lo), NULL,
                             j->out + lo, j->in_f);
        else
            zd__nn_sgemm(false, false, j->rows, (int)(hi - lo), j->out_f, 1.0f, j->dy, j->out_f,
                         j->w + lo, j->in_f, 0.0f, j->out + lo, j->in_f);
        break;
    default:
        if (j->packed) {
            nn_chunk_range(j->in_f, j->n_chunks, c, &lo, &hi);
            zd__nn_taps_gemm(j->packed, j->out_f, j->rows, j->offs, j->x + lo, (int)(hi - lo), NULL,
                             j->out + lo, j->in_f);
            break;
        }
        nn_chunk_range(j->out_f, j->n_chunks, c, &lo, &hi);
        zd__nn_sgemm(true, false, (int)(hi - lo), j->in_f, j->rows, 1.0f, j->dy + lo, j->out_f,
                     j->x, j->in_f, 0.0f, j->out + lo * j->in_f, j->in_f);
        break;
    }
}

/*  One chunk for small products; otherwise one per thread, if each gets
    a block of at least 16 features (the taps paths: 48 input features, or
    12 output features). */
static int linear_run(linear_job_t *j)
{
    int64_t flops = (int64_t)j->rows * j->in_f * j->out_f;
    int span = j->which == 1 || j->packed ? j->in_f : j->out_f;
    int min_span = j->packed ? 48 : j->xt ? 12 : 16;
    j->n_chunks = flops >= (1 << 20) ? zd__nn_parallel_chunks() : 1;
    while (j->n_chunks > 1 && span / j->n_chunks < min_span)
        j->n_chunks--;
    return zd__nn_parallel_run(j->n_chunks, 0, linear_chunk, j);
}

/*  The backward products of a large layer (fc1's) run on the taps kernels
    (nn/conv_direct.c): dx = dy W is, for each input feature q, the sum over
    outputs k of dy[., k] * W[k][q], a "tap" k reading row k of W; and
    dW = dy^T x likewise with taps on the rows of x. W is then read once,
    in L1-sized panels, and no BLAS packing runs. With the AVX-512 or AVX2
    kernels only, and for products of at least 2^20 multiply-adds. Fills
    job->packed (dy packed, or dy^T for which 2) and job->offs into `mem`;
    returns false when the layer keeps to BLAS. */
static bool linear_taps(linear_job_t *j, float **mem)
{
    *mem = NULL;
    const int m = j->which == 1 ? j->rows : j->out_f, k = j->which == 1 ? j->out_f : j->rows;
    if (!zd__nn_taps_enabled() || (int64_t)j->rows * j->in_f * j->out_f < (1 << 20) ||
        (int64_t)k * j->in_f > INT32_MAX)
        return false;
    size_t packed = zd__nn_taps_packed_floats(m, k);
    ZD_FAULT_BENIGN(true);
    float *p = malloc(sizeof(float) * packed + sizeof(int32_t) * 2 * (size_t)k);
    ZD_FAULT_BENIGN(false);
    if (!p)
        return false; /* BLAS needs no memory of ours */
    int32_t *offs = (int32_t *)(p + packed), *cols = offs + k;
    for (int i = 0; i < k; i++) {
        offs[i] = i * j->in_f;
        cols[i] = i * j->out_f;
    }
    if (j->which == 1) /* a(r, k) = dy[r][k] */
        zd__nn_taps_pack(j->dy, m, k, j->out_f, NULL, p);
    else /* a(o, r) = dy[r][o] */
        zd__nn_taps_pack(j->dy, m, k, 1, cols, p);
    j->packed = p;
    j->offs = offs;
    *mem = p;
    return true;
}

/*  The forward product of a large layer with a small batch (fc1's), on the
    taps kernel too: y^T = W x^T, taps on the rows of W, the batch (x
    transposed, positions x rows) as the register block's columns. W is
    read once. Returns 1 when the layer keeps to BLAS (small, wide batch,
    portable kernels), else 0 or -1 (zd_error_set). */
static int linear_forward_taps(linear_job_t *j, const float *bias)
{
    if (!zd__nn_taps_enabled() || (int64_t)j->rows * j->in_f * j->out_f < (1 << 20) ||
        j->rows > 64 || (int64_t)j->out_f * j->in_f > INT32_MAX)
        return 1;
    const int ldr = (j->rows + 15) / 16 * 16;
    float *xt = zd__nn_alloc_floats((size_t)ldr * (j->in_f + j->out_f));
    int32_t *offs = malloc(sizeof(int32_t) * (size_t)j->out_f);
    if (!xt || !offs) {
        zd__nn_free_floats(xt);
        free(offs);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "linear: out of memory");
    }
    float *yt = xt + (size_t)ldr * j->in_f;
    zd__nn_transpose(j->x, j->rows, j->in_f, j->in_f, xt, ldr);
    for (int o = 0; o < j->out_f; o++) {
        offs[o] = o * j->in_f;
        for (int r = 0; r < j->rows; r++)
            yt[(size_t)o * ldr + r] = bias ? bias[o] : 0.0f;
    }
    j->xt = xt;
    j->yt = yt;
    j->ldr = ldr;
    j->offs = offs;
    int rc = linear_run(j);
    if (rc == 0)
        zd__nn_transpose(yt, j->out_f, j->rows, ldr, j->out, j->out_f);
    zd__nn_free_floats(xt);
    free(offs);
    return rc;
}

static int linear_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *x = zd_autograd_node_saved(n, 0), *w = zd_autograd_node_saved(n, 1);
    const int out_f = (int)zd_tensor_size(w, 0), in_f = (int)zd_tensor_size(w, 1);
    const int rows = (int)leading_rows(x);
    const float *dy = zd_tensor_data(gout[0]);
    linear_job_t job = {.rows = rows,
                        .in_f = in_f,
                        .out_f = out_f,
                        .x = zd_tensor_data(x),
                        .w = zd_tensor_data(w),
                        .dy = dy};
    float *mem;
    int rc;
    if (zd_autograd_node_needs_grad(n, 0)) { /* dx = dy W */
        if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x))))
            return -1;
        job.which = 1;
        job.out = zd_tensor_data(gin[0]);
        linear_taps(&job, &mem);
        rc = linear_run(&job);
        free(mem);
        if (rc < 0)
            return -1;
    }
    if (zd_autograd_node_needs_grad(n, 1)) { /* dW = dy^T x */
        if (!(gin[1] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(w), 2)))
            return -1;
        job.which = 2;
        job.packed = NULL;
        job.out = zd_tensor_data(gin[1]);
        linear_taps(&job, &mem);
        rc = linear_run(&job);
        free(mem);
        if (rc < 0)
            return -1;
    }
    if (zd_autograd_node_needs_grad(n, 2)) { /* db = column sums of dy */
        if (!(gin[2] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){out_f}, 1)))
            return -1;
        float *db = zd_tensor_data(gin[2]);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < out_f; o++)
                db[o] += dy[(size_t)r * out_f + o];
    }
    return 0;
}

static const zd_autograd_node_ops_t linear_ops =
    ZD_AUTOGRAD_NODE_OPS("LinearBackward", linear_backward, NULL);

int zd_nn_linear(zd_tensor_t *x, zd_tensor_t *weight, zd_tensor_t *bias, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_linear: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("linear: input", x) < 0 ||
        zd__nn_check_f32("linear: weight", weight) < 0 ||
        zd__nn_check_ndim("linear: weight", weight, 2) < 0)
        return -1;
    if (bias &&
        (zd__nn_check_f32("linear: bias", bias) < 0 ||
         zd__nn_check_ndim("linear: bias", bias, 1) < 0))
        return -1;
    char sx[96], sw[96];
    const int64_t out_f = zd_tensor_size(weight, 0), in_f = zd_tensor_size(weight, 1);
    if (zd_tensor_ndim(x) < 1 || zd_tensor_size(x, -1) != in_f)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "linear: input %s does not end in %lld features (weight %s)",
                                 zd_tensor_shape_str(x, sx, sizeof sx), (long long)in_f,
                                 zd_tensor_shape_str(weight, sw, sizeof sw));
    if (bias && zd_tensor_size(bias, 0) != out_f)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "linear: bias has %lld entries for %lld outputs",
                                 (long long)zd_tensor_size(bias, 0), (long long)out_f);
    const int64_t rows = leading_rows(x);
    if (rows > INT32_MAX || in_f > INT32_MAX || out_f > INT32_MAX)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "linear: input %s too large",
                                 zd_tensor_shape_str(x, sx, sizeof sx));
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    memcpy(shape, zd_tensor_shape(x), sizeof(int64_t) * (size_t)zd_tensor_ndim(x));
    shape[zd_tensor_ndim(x) - 1] = out_f;
    zd_tensor_t *y = (bias ? zd_tensor_empty : zd_tensor_new)(ZD_FLOAT32, shape, zd_tensor_ndim(x));
    if (!y)
        return -1;
    float *yd = zd_tensor_data(y);
    linear_job_t job = {.which = 0,
                        .rows = (int)rows,
                        .in_f = (int)in_f,
                        .out_f = (int)out_f,
                        .x = zd_tensor_data(x),
                        .w = zd_tensor_data(weight),
                        .out = yd};
    int rc = linear_forward_taps(&job, bias ? zd_tensor_data(bias) : NULL);
    if (rc == 1) { /* not taken: BLAS, over the bias */
        if (bias) {
            const float *b = zd_tensor_data(bias);
            for (int64_t r = 0; r < rows; r++)
                memcpy(yd + r * out_f, b, sizeof(float) * (size_t)out_f);
        }
        rc = linear_run(&job);
    }
    if (rc < 0) {
        zd_tensor_unref(y);
        return -1;
    }
    zd_tensor_t *in[3] = {x, weight, bias};
    if (zd__nn_record(&linear_ops, in, 3, y, x, weight, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- relu ---- */

typedef struct {
    int64_t n;
    int n_chunks;
    const float *a, *b; /* forward: x; backward: y and dy */
    float *out;
} elem_job_t;

static void relu_chunk(void *arg, int c, float *scratch)
{
    const elem_job_t *j = arg;
    (void)scratch;
    int64_t lo, hi;
    nn_chunk_range(j->n, j->n_chunks, c, &lo, &hi);
    const float *restrict x = j->a;
    float *restrict y = j->out;
    for (int64_t i = lo; i < hi; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void relu_backward_chunk(void *arg, int c, float *scratch)
{
    const elem_job_t *j = arg;
    (void)scratch;
    int64_t lo, hi;
    nn_chunk_range(j->n, j->n_chunks, c, &lo, &hi);
    const float *restrict y = j->a, *restrict dy = j->b;
    float *restrict dx = j->out;
    for (int64_t i = lo; i < hi; i++) {
        float d = dy[i]; /* loaded unconditionally: the loop vectorises */
        dx[i] = y[i] > 0.0f ? d : 0.0f;
    }
}

static int relu_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *y = zd_autograd_node_saved(n, 0);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(y), zd_tensor_ndim(y))))
        return -1;
    elem_job_t job = {.n = zd_tensor_numel(y),
                      .a = zd_tensor_data(y),
                      .b = zd_tensor_data(gout[0]),
                      .out = zd_tensor_data(gin[0])};
    job.n_chunks = nn_elem_chunks(job.n);
    return zd__nn_parallel_run(job.n_chunks, 0, relu_backward_chunk, &job);
}

static const zd_autograd_node_ops_t relu_ops =
    ZD_AUTOGRAD_NODE_OPS("ReluBackward", relu_backward, NULL);

int zd_nn_relu(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_relu: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("relu: input", x) < 0)
        return -1;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x));
    if (!y)
        return -1;
    elem_job_t job = {.n = zd_tensor_numel(x), .a = zd_tensor_data(x), .out = zd_tensor_data(y)};
    job.n_chunks = nn_elem_chunks(job.n);
    if (zd__nn_parallel_run(job.n_chunks, 0, relu_chunk, &job) < 0) {
        zd_tensor_unref(y);
        return -1;
    }
    if (zd__nn_record(&relu_ops, &x, 1, y, y, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- dropout / dropout2d ---- */

typedef struct {
    int64_t per;  /* consecutive elements sharing one mask entry */
    float mask[]; /* 0 or 1/(1-p) */
} dropout_ctx_t;

static int dropout_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const dropout_ctx_t *ctx = zd_autograd_node_ctx(n);
    zd_tensor_t *g = gout[0];
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(g), zd_tensor_ndim(g))))
        return -1;
    const float *dy = zd_tensor_data(g);
    float *dx = zd_tensor_data(gin[0]);
    const int64_t numel = zd_tensor_numel(g);
    const int64_t per = ctx->per, groups = per ? numel / per : 0;
    for (int64_t k = 0; k < groups; k++) {
        const float m = ctx->mask[k];
        for (int64_t i = k * per; i < (k + 1) * per; i++)
            dx[i] = dy[i] * m;
    }
    return 0;
}

static const zd_autograd_node_ops_t dropout_ops =
    ZD_AUTOGRAD_NODE_OPS("DropoutBackward", dropout_backward, zd__nn_free_ctx);

static int dropout_impl(const char *name, zd_tensor_t *x, float p, zd_rng_t *rng, int64_t per,
                        zd_tensor_t **out)
{
    const int64_t numel = zd_tensor_numel(x);
    const int64_t groups = per ? numel / per : 0;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x));
    dropout_ctx_t *ctx = malloc(sizeof *ctx + sizeof(float) * (size_t)groups);
    if (!y || !ctx) {
        zd_tensor_unref(y);
        free(ctx);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", name);
    }
    ctx->per = per;
    const float keep = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
    for (int64_t k = 0; k < groups; k++)
        ctx->mask[k] = zd_rng_uniform(rng) < p ? 0.0f : keep;
    const float *xd = zd_tensor_data(x);
    float *yd = zd_tensor_data(y);
    for (int64_t k = 0; k < groups; k++) {
        const float m = ctx->mask[k];
        for (int64_t i = k * per; i < (k + 1) * per; i++)
            yd[i] = xd[i] * m;
    }
    if (zd__nn_record(&dropout_ops, &x, 1, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

static int dropout_check(const char *name, zd_tensor_t *x, float p, bool training, zd_rng_t *rng)
{
    if (zd__nn_check_f32(name, x) < 0)
        return -1;
    if (!(p >= 0.0f && p <= 1.0f))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: probability %g outside [0, 1]", name,
                                 (double)p);
    if (training && p > 0.0f && !rng)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: training needs a random generator", name);
    return 0;
}

int zd_nn_dropout(zd_tensor_t *x, float p, bool training, zd_rng_t *rng, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_dropout: NULL out");
    *out = NULL;
    if (dropout_check("dropout", x, p, training, rng) < 0)
        return -1;
    if (!training || p == 0.0f) {
        *out = zd_tensor_ref(x);
        return 0;
    }
    return dropout_impl("dropout", x, p, rng, 1, out);
}

int zd_nn_dropout2d(zd_tensor_t *x, float p, bool training, zd_rng_t *rng, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_dropout2d: NULL out");
    *out = NULL;
    if (dropout_check("dropout2d", x, p, training, rng) < 0)
        return -1;
    if (zd_tensor_ndim(x) < 2) {
        char sx[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "dropout2d: input %s needs (N, C, ...) dimensions",
                                 zd_tensor_shape_str(x, sx, sizeof sx));
    }
    if (!training || p == 0.0f) {
        *out = zd_tensor_ref(x);
        return 0;
    }
    int64_t per = 1;
    for (int d = 2; d < zd_tensor_ndim(x); d++)
        per *= zd_tensor_size(x, d);
    return dropout_impl("dropout2d", x, p, rng, per, out);
}

/*  ---- flatten ---- */

int zd_nn_flatten(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_flatten: NULL out");
    *out = NULL;
    if (!x)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "flatten: input is NULL");
    if (zd_tensor_ndim(x) < 2) {
        char sx[96];
        return zd_error_set_code(ZD_ERR_ARGUMENT, "flatten: input %s needs at least 2 dimensions",
                                 zd_tensor_shape_str(x, sx, sizeof sx));
    }
    int64_t rest = 1;
    for (int d = 1; d < zd_tensor_ndim(x); d++)
        rest *= zd_tensor_size(x, d);
    return zd_tensor_reshape(x, (int64_t[]){zd_tensor_size(x, 0), rest}, 2, out);
}
