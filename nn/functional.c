/*  functional.c: linear, relu, max_pool2d, dropout, dropout2d, flatten. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/nn.h"
#include "nn/nn_private.h"

/* ---- linear ---- */

static int linear_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    tensor_t *x = autograd_node_saved(n, 0), *w = autograd_node_saved(n, 1);
    const int out_f = (int)tensor_size(w, 0), in_f = (int)tensor_size(w, 1);
    const int rows = in_f ? (int)(tensor_numel(x) / in_f) : 0;
    const float *dy = tensor_data(gout[0]);
    if (autograd_node_needs_grad(n, 0)) {          /* dx = dy W */
        if (!(gin[0] = tensor_empty(TENSOR_F32, tensor_ndim(x), tensor_shape(x))))
            return -1;
        nn_sgemm(false, false, rows, in_f, out_f, 1.0f, dy, out_f, tensor_data(w), in_f, 0.0f,
                 tensor_data(gin[0]), in_f);
    }
    if (autograd_node_needs_grad(n, 1)) {          /* dW = dy^T x */
        if (!(gin[1] = tensor_empty(TENSOR_F32, 2, tensor_shape(w))))
            return -1;
        nn_sgemm(true, false, out_f, in_f, rows, 1.0f, dy, out_f, tensor_data(x), in_f, 0.0f,
                 tensor_data(gin[1]), in_f);
    }
    if (autograd_node_needs_grad(n, 2)) {          /* db = column sums of dy */
        if (!(gin[2] = tensor_new(TENSOR_F32, 1, (int64_t[]){out_f})))
            return -1;
        float *db = tensor_data(gin[2]);
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < out_f; o++)
                db[o] += dy[(size_t)r * out_f + o];
    }
    return 0;
}

static const autograd_node_ops_t linear_ops = {"LinearBackward", linear_backward, NULL};

int nn_linear(tensor_t *x, tensor_t *weight, tensor_t *bias, tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("linear: input", x) < 0 || nn_check_f32("linear: weight", weight) < 0 ||
        nn_check_ndim("linear: weight", weight, 2) < 0)
        return -1;
    if (bias && (nn_check_f32("linear: bias", bias) < 0 ||
                 nn_check_ndim("linear: bias", bias, 1) < 0))
        return -1;
    char sx[96], sw[96];
    const int64_t out_f = tensor_size(weight, 0), in_f = tensor_size(weight, 1);
    if (tensor_ndim(x) < 1 || tensor_size(x, -1) != in_f)
        return error_set("linear: input %s does not end in %lld features (weight %s)",
                         tensor_shape_str(x, sx, sizeof sx), (long long)in_f,
                         tensor_shape_str(weight, sw, sizeof sw));
    if (bias && tensor_size(bias, 0) != out_f)
        return error_set("linear: bias has %lld entries for %lld outputs",
                         (long long)tensor_size(bias, 0), (long long)out_f);
    const int64_t rows = in_f ? tensor_numel(x) / in_f : 0;
    if (rows > INT32_MAX || in_f > INT32_MAX || out_f > INT32_MAX)
        return error_set("linear: input %s too large", tensor_shape_str(x, sx, sizeof sx));
    int64_t shape[TENSOR_MAX_DIMS];
    memcpy(shape, tensor_shape(x), sizeof(int64_t) * (size_t)tensor_ndim(x));
    shape[tensor_ndim(x) - 1] = out_f;
    tensor_t *y = tensor_empty(TENSOR_F32, tensor_ndim(x), shape);
    if (!y)
        return -1;
    float *yd = tensor_data(y);
    if (bias) {
        const float *b = tensor_data(bias);
        for (int64_t r = 0; r < rows; r++)
            memcpy(yd + r * out_f, b, sizeof(float) * (size_t)out_f);
    }
    nn_sgemm(false, true, (int)rows, (int)out_f, (int)in_f, 1.0f, tensor_data(x), (int)in_f,
             tensor_data(weight), (int)in_f, bias ? 1.0f : 0.0f, yd, (int)out_f);
    tensor_t *in[3] = {x, weight, bias};
    if (nn_record(&linear_ops, 3, in, y, x, weight, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- relu ---- */

static int relu_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    tensor_t *y = autograd_node_saved(n, 0);
    if (!(gin[0] = tensor_empty(TENSOR_F32, tensor_ndim(y), tensor_shape(y))))
        return -1;
    const float *yd = tensor_data(y), *dy = tensor_data(gout[0]);
    float *dx = tensor_data(gin[0]);
    for (int64_t i = 0; i < tensor_numel(y); i++)
        dx[i] = yd[i] > 0.0f ? dy[i] : 0.0f;
    return 0;
}

static const autograd_node_ops_t relu_ops = {"ReluBackward", relu_backward, NULL};

int nn_relu(tensor_t *x, tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("relu: input", x) < 0)
        return -1;
    tensor_t *y = tensor_empty(TENSOR_F32, tensor_ndim(x), tensor_shape(x));
    if (!y)
        return -1;
    const float *xd = tensor_data(x);
    float *yd = tensor_data(y);
    for (int64_t i = 0; i < tensor_numel(x); i++)
        yd[i] = xd[i] > 0.0f ? xd[i] : 0.0f;
    if (nn_record(&relu_ops, 1, &x, y, y, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- max_pool2d ---- */

typedef struct {
    int64_t shape[4];     /* input (N,C,H,W) */
    int64_t n_out;        /* N*C*Ho*Wo */
    int32_t argmax[];     /* per output: index inside its input plane */
} pool_ctx_t;

static int pool_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const pool_ctx_t *ctx = autograd_node_ctx(n);
    if (!(gin[0] = tensor_new(TENSOR_F32, 4, ctx->shape)))
        return -1;
    const int64_t planes = ctx->shape[0] * ctx->shape[1];
    const int64_t hw = ctx->shape[2] * ctx->shape[3];
    const int64_t per = planes ? ctx->n_out / planes : 0;
    const float *dy = tensor_data(gout[0]);
    float *dx = tensor_data(gin[0]);
    for (int64_t p = 0; p < planes; p++) {
        float *dxp = dx + p * hw;
        const float *dyp = dy + p * per;
        const int32_t *am = ctx->argmax + p * per;
        for (int64_t i = 0; i < per; i++)
            dxp[am[i]] += dyp[i];
    }
    return 0;
}

static const autograd_node_ops_t pool_ops = {"MaxPool2DBackward", pool_backward, nn_free_ctx};

int nn_max_pool2d(tensor_t *x, int kernel, int stride, tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("max_pool2d: input", x) < 0 ||
        nn_check_ndim("max_pool2d: input", x, 4) < 0)
        return -1;
    if (stride == 0)
        stride = kernel;
    char sx[96];
    tensor_shape_str(x, sx, sizeof sx);
    if (kernel < 1 || stride < 1)
        return error_set("max_pool2d: kernel %d and stride %d must be >= 1", kernel, stride);
    const int64_t *s = tensor_shape(x);
    if (s[2] < kernel || s[3] < kernel)
        return error_set("max_pool2d: kernel %d larger than input %s", kernel, sx);
    if (s[2] * s[3] > INT32_MAX)
        return error_set("max_pool2d: input planes of %s too large", sx);
    const int64_t H = s[2], W = s[3];
    const int64_t Ho = (H - kernel) / stride + 1, Wo = (W - kernel) / stride + 1;
    const int64_t planes = s[0] * s[1], per = Ho * Wo;
    tensor_t *y = tensor_empty(TENSOR_F32, 4, (int64_t[]){s[0], s[1], Ho, Wo});
    pool_ctx_t *ctx = malloc(sizeof *ctx + sizeof(int32_t) * (size_t)(planes * per));
    if (!y || !ctx) {
        tensor_unref(y);
        free(ctx);
        return error_set("max_pool2d: out of memory");
    }
    memcpy(ctx->shape, s, sizeof ctx->shape);
    ctx->n_out = planes * per;
    const float *xd = tensor_data(x);
    float *yd = tensor_data(y);
    for (int64_t p = 0; p < planes; p++) {
        const float *xp = xd + p * H * W;
        float *yp = yd + p * per;
        int32_t *am = ctx->argmax + p * per;
        for (int64_t oh = 0; oh < Ho; oh++) {
            for (int64_t ow = 0; ow < Wo; ow++) {
                int64_t h0 = oh * stride, w0 = ow * stride;
                int64_t best_i = h0 * W + w0;
                float best = xp[best_i];
                for (int64_t i = h0; i < h0 + kernel; i++) {
                    for (int64_t j = w0; j < w0 + kernel; j++) {
                        float v = xp[i * W + j];
                        /* NaN wins and sticks, as in PyTorch */
                        if (v > best || (isnan(v) && !isnan(best))) {
                            best = v;
                            best_i = i * W + j;
                        }
                    }
                }
                yp[oh * Wo + ow] = best;
                am[oh * Wo + ow] = (int32_t)best_i;
            }
        }
    }
    if (nn_record(&pool_ops, 1, &x, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- dropout / dropout2d ---- */

typedef struct {
    int64_t per;          /* consecutive elements sharing one mask entry */
    float mask[];         /* 0 or 1/(1-p) */
} dropout_ctx_t;

static int dropout_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const dropout_ctx_t *ctx = autograd_node_ctx(n);
    tensor_t *g = gout[0];
    if (!(gin[0] = tensor_empty(TENSOR_F32, tensor_ndim(g), tensor_shape(g))))
        return -1;
    const float *dy = tensor_data(g);
    float *dx = tensor_data(gin[0]);
    const int64_t per = ctx->per, groups = per ? tensor_numel(g) / per : 0;
    for (int64_t k = 0; k < groups; k++) {
        const float m = ctx->mask[k];
        for (int64_t i = k * per; i < (k + 1) * per; i++)
            dx[i] = dy[i] * m;
    }
    return 0;
}

static const autograd_node_ops_t dropout_ops = {"DropoutBackward", dropout_backward,
                                                 nn_free_ctx};

static int dropout_impl(const char *name, tensor_t *x, float p, nn_rng_t *rng, int64_t per,
                        tensor_t **out)
{
    const int64_t numel = tensor_numel(x);
    const int64_t groups = per ? numel / per : 0;
    tensor_t *y = tensor_empty(TENSOR_F32, tensor_ndim(x), tensor_shape(x));
    dropout_ctx_t *ctx = malloc(sizeof *ctx + sizeof(float) * (size_t)groups);
    if (!y || !ctx) {
        tensor_unref(y);
        free(ctx);
        return error_set("%s: out of memory", name);
    }
    ctx->per = per;
    const float keep = p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
    for (int64_t k = 0; k < groups; k++)
        ctx->mask[k] = nn_rng_uniform(rng) < p ? 0.0f : keep;
    const float *xd = tensor_data(x);
    float *yd = tensor_data(y);
    for (int64_t k = 0; k < groups; k++) {
        const float m = ctx->mask[k];
        for (int64_t i = k * per; i < (k + 1) * per; i++)
            yd[i] = xd[i] * m;
    }
    if (nn_record(&dropout_ops, 1, &x, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

static int dropout_check(const char *name, tensor_t *x, float p, bool training, nn_rng_t *rng)
{
    if (nn_check_f32(name, x) < 0)
        return -1;
    if (!(p >= 0.0f && p <= 1.0f))
        return error_set("%s: probability %g outside [0, 1]", name, (double)p);
    if (training && p > 0.0f && !rng)
        return error_set("%s: training needs a random generator", name);
    return 0;
}

int nn_dropout(tensor_t *x, float p, bool training, nn_rng_t *rng, tensor_t **out)
{
    *out = NULL;
    if (dropout_check("dropout", x, p, training, rng) < 0)
        return -1;
    if (!training || p == 0.0f) {
        *out = tensor_ref(x);
        return 0;
    }
    return dropout_impl("dropout", x, p, rng, 1, out);
}

int nn_dropout2d(tensor_t *x, float p, bool training, nn_rng_t *rng, tensor_t **out)
{
    *out = NULL;
    if (dropout_check("dropout2d", x, p, training, rng) < 0)
        return -1;
    if (tensor_ndim(x) < 2) {
        char sx[96];
        return error_set("dropout2d: input %s needs (N, C, ...) dimensions",
                         tensor_shape_str(x, sx, sizeof sx));
    }
    if (!training || p == 0.0f) {
        *out = tensor_ref(x);
        return 0;
    }
    int64_t per = 1;
    for (int d = 2; d < tensor_ndim(x); d++)
        per *= tensor_size(x, d);
    return dropout_impl("dropout2d", x, p, rng, per, out);
}

/* ---- flatten ---- */

int nn_flatten(tensor_t *x, tensor_t **out)
{
    *out = NULL;
    if (!x)
        return error_set("flatten: input is NULL");
    if (tensor_ndim(x) < 2) {
        char sx[96];
        return error_set("flatten: input %s needs at least 2 dimensions",
                         tensor_shape_str(x, sx, sizeof sx));
    }
    int64_t rest = 1;
    for (int d = 1; d < tensor_ndim(x); d++)
        rest *= tensor_size(x, d);
    return tensor_reshape(x, 2, (int64_t[]){tensor_size(x, 0), rest}, out);
}
