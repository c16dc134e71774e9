/* SPDX-License-Identifier: MIT */
/*  loss.c: log_softmax, nll_loss, cross_entropy, mse_loss, argmax, accuracy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

/*  ---- log_softmax ---- */

static int log_softmax_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *y = zd_autograd_node_saved(n, 0);
    const int64_t rows = zd_tensor_size(y, 0), cols = zd_tensor_size(y, 1);
    if (!(gin[0] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(y), 2)))
        return -1;
    const float *yd = zd_tensor_data(y), *dy = zd_tensor_data(gout[0]);
    float *dx = zd_tensor_data(gin[0]);
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = yd + r * cols, *dyr = dy + r * cols;
        float *dxr = dx + r * cols;
        float sum = 0.0f;
        for (int64_t c = 0; c < cols; c++)
            sum += dyr[c];
        for (int64_t c = 0; c < cols; c++)
            dxr[c] = dyr[c] - expf(yr[c]) * sum;
    }
    return 0;
}

static const zd_autograd_node_ops_t log_softmax_ops =
    ZD_AUTOGRAD_NODE_OPS("LogSoftmaxBackward", log_softmax_backward, NULL);

int zd_nn_log_softmax(zd_tensor_t *x, int dim, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_log_softmax: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("log_softmax: input", x) < 0 ||
        zd__nn_check_ndim("log_softmax: input", x, 2) < 0)
        return -1;
    if (dim != 1 && dim != -1)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "log_softmax: only dim 1 of a 2-D input is supported, got dim %d",
                                 dim);
    const int64_t rows = zd_tensor_size(x, 0), cols = zd_tensor_size(x, 1);
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), 2);
    if (!y)
        return -1;
    const float *xd = zd_tensor_data(x);
    float *yd = zd_tensor_data(y);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = xd + r * cols;
        float *yr = yd + r * cols;
        float mx = -INFINITY;
        for (int64_t c = 0; c < cols; c++)
            mx = xr[c] > mx ? xr[c] : mx;
        if (isinf(mx) && mx < 0)
            mx = 0.0f; /* a row of -inf: keep it -inf instead of NaN */
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            sum += exp((double)(xr[c] - mx));
        const float lse = (float)log(sum);
        for (int64_t c = 0; c < cols; c++)
            yr[c] = xr[c] - mx - lse;
    }
    if (zd__nn_record(&log_softmax_ops, &x, 1, y, y, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/*  ---- targets ---- */

/*  Class index of sample i of a (N) int64 or uint8 target. */
static int64_t target_at(const zd_tensor_t *t, int64_t i)
{
    if (zd_tensor_dtype(t) == ZD_INT64)
        return zd_tensor_data_i64(t)[i];
    return ((const uint8_t *)zd_tensor_raw(t))[i];
}

/*  target must be (N) int64/uint8 matching scores; its classes are checked
    by check_classes on the copy the op will use. */
static int check_target_shape(const char *op, const zd_tensor_t *scores, const zd_tensor_t *target)
{
    char ss[96], st[96];
    if (!target)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: target is NULL", op);
    if (zd_tensor_dtype(target) != ZD_INT64 && zd_tensor_dtype(target) != ZD_UINT8)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: target must be int64 or uint8 class indices, got %s", op,
                                 zd_tensor_dtype_name(zd_tensor_dtype(target)));
    if (zd_tensor_ndim(target) != 1 || zd_tensor_size(target, 0) != zd_tensor_size(scores, 0))
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "%s: target %s does not match input %s (expected (%lld))", op,
            zd_tensor_shape_str(target, st, sizeof st), zd_tensor_shape_str(scores, ss, sizeof ss),
            (long long)zd_tensor_size(scores, 0));
    return 0;
}

/*  Every class of idx[0..n) in [0, C). */
static int check_classes(const char *op, const int64_t *idx, int64_t n, int64_t C)
{
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= C)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "%s: target[%lld] = %lld is out of range for %lld classes", op,
                                     (long long)i, (long long)idx[i], (long long)C);
    return 0;
}

/*  The targets are read once, into idx, and only the copy is checked and
    used: a target tensor whose memory changes under the op (shared with
    another process, another thread) cannot pass the check with one value
    and index with another. */
static int read_target(const char *op, const zd_tensor_t *scores, const zd_tensor_t *target,
                       int64_t *idx)
{
    const int64_t N = zd_tensor_size(target, 0);
    for (int64_t i = 0; i < N; i++)
        idx[i] = target_at(target, i);
    return check_classes(op, idx, N, zd_tensor_size(scores, 1));
}

/*  ---- nll_loss ---- */

typedef struct {
    int64_t shape[2];
    int64_t target[];
} nll_ctx_t;

static int nll_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const nll_ctx_t *ctx = zd_autograd_node_ctx(n);
    if (!(gin[0] = zd_tensor_new(ZD_FLOAT32, ctx->shape, 2)))
        return -1;
    const int64_t N = ctx->shape[0], C = ctx->shape[1];
    const float g = -zd_tensor_data(gout[0])[0] / (float)N;
    float *dx = zd_tensor_data(gin[0]);
    for (int64_t i = 0; i < N; i++)
        dx[i * C + ctx->target[i]] = g;
    return 0;
}

static const zd_autograd_node_ops_t nll_ops =
    ZD_AUTOGRAD_NODE_OPS("NllLossBackward", nll_backward, zd__nn_free_ctx);

int zd_nn_nll_loss(zd_tensor_t *logprobs, zd_tensor_t *target, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_nll_loss: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("nll_loss: input", logprobs) < 0 ||
        zd__nn_check_ndim("nll_loss: input", logprobs, 2) < 0 ||
        check_target_shape("nll_loss", logprobs, target) < 0)
        return -1;
    const int64_t N = zd_tensor_size(logprobs, 0), C = zd_tensor_size(logprobs, 1);
    nll_ctx_t *ctx = malloc(sizeof *ctx + sizeof(int64_t) * (size_t)N);
    if (!ctx)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "nll_loss: out of memory");
    if (read_target("nll_loss", logprobs, target, ctx->target) < 0) {
        free(ctx);
        return -1;
    }
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, NULL, 0);
    if (!y) {
        free(ctx);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "nll_loss: out of memory");
    }
    ctx->shape[0] = N;
    ctx->shape[1] = C;
    const float *lp = zd_tensor_data(logprobs);
    double acc = 0.0;
    for (int64_t i = 0; i < N; i++)
        acc += lp[i * C + ctx->target[i]];
    zd_tensor_data(y)[0] = (float)(-acc / (double)N); /* N == 0 gives NaN, as in PyTorch */
    if (zd__nn_record(&nll_ops, &logprobs, 1, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

int zd_nn_cross_entropy(zd_tensor_t *logits, zd_tensor_t *target, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_cross_entropy: NULL out");
    zd_tensor_t *lp;
    *out = NULL;
    if (zd_nn_log_softmax(logits, 1, &lp) < 0)
        return zd_error_wrap("cross_entropy");
    int rc = zd_nn_nll_loss(lp, target, out);
    zd_tensor_unref(lp);
    return rc < 0 ? zd_error_wrap("cross_entropy") : 0;
}

/*  ---- argmax / accuracy ---- */

static int64_t row_argmax(const float *r, int64_t C)
{
    int64_t best = 0;
    for (int64_t c = 1; c < C; c++)
        if (r[c] > r[best])
            best = c;
    return best;
}

int zd_nn_argmax(zd_tensor_t *x, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_argmax: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("argmax: input", x) < 0 || zd__nn_check_ndim("argmax: input", x, 2) < 0)
        return -1;
    const int64_t N = zd_tensor_size(x, 0), C = zd_tensor_size(x, 1);
    if (C < 1 && N > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "argmax: input has no columns");
    zd_tensor_t *y = zd_tensor_empty(ZD_INT64, &N, 1);
    if (!y)
        return -1;
    for (int64_t i = 0; i < N; i++)
        zd_tensor_data_i64(y)[i] = row_argmax(zd_tensor_data(x) + i * C, C);
    *out = y;
    return 0;
}

int64_t zd_nn_accuracy(zd_tensor_t *scores, zd_tensor_t *target)
{
    if (zd__nn_check_f32("accuracy: input", scores) < 0 ||
        zd__nn_check_ndim("accuracy: input", scores, 2) < 0 ||
        check_target_shape("accuracy", scores, target) < 0)
        return -1;
    const int64_t N = zd_tensor_size(scores, 0), C = zd_tensor_size(scores, 1);
    int64_t correct = 0;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = target_at(target, i); /* read once: checked and compared */
        if (check_classes("accuracy", &t, 1, C) < 0)
            return zd_error_set_code(
                ZD_ERR_ARGUMENT, "accuracy: target[%lld] = %lld is out of range for %lld classes",
                (long long)i, (long long)t, (long long)C);
        correct += row_argmax(zd_tensor_data(scores) + i * C, C) == t;
    }
    return correct;
}

/*  ---- mse_loss ---- */

/*  d/dx mean((x - t)^2) = 2 (x - t) / N, and the opposite for t. */
static int mse_backward(zd_autograd_node_t *n, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    zd_tensor_t *x = zd_autograd_node_saved(n, 0), *t = zd_autograd_node_saved(n, 1);
    const int64_t N = zd_tensor_numel(x);
    const float scale = 2.0f * zd_tensor_data(gout[0])[0] / (float)N;
    const float *px = zd_tensor_data(x), *pt = zd_tensor_data(t);
    for (int j = 0; j < 2; j++) {
        if (!zd_autograd_node_needs_grad(n, j))
            continue;
        if (!(gin[j] = zd_tensor_empty(ZD_FLOAT32, zd_tensor_shape(x), zd_tensor_ndim(x))))
            return -1;
        const float s = j == 0 ? scale : -scale;
        float *d = zd_tensor_data(gin[j]);
        for (int64_t i = 0; i < N; i++)
            d[i] = s * (px[i] - pt[i]);
    }
    return 0;
}

static const zd_autograd_node_ops_t mse_ops =
    ZD_AUTOGRAD_NODE_OPS("MseLossBackward", mse_backward, NULL);

int zd_nn_mse_loss(zd_tensor_t *x, zd_tensor_t *target, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_mse_loss: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("mse_loss: input", x) < 0 ||
        zd__nn_check_f32("mse_loss: target", target) < 0)
        return -1;
    if (!zd_tensor_same_shape(x, target)) {
        char sx[96], st[96];
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "mse_loss: input %s and target %s differ in shape",
            zd_tensor_shape_str(x, sx, sizeof sx), zd_tensor_shape_str(target, st, sizeof st));
    }
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, NULL, 0);
    if (!y)
        return -1;
    const float *px = zd_tensor_data(x), *pt = zd_tensor_data(target);
    const int64_t N = zd_tensor_numel(x);
    double acc = 0.0;
    for (int64_t i = 0; i < N; i++) {
        const double d = (double)px[i] - pt[i];
        acc += d * d;
    }
    zd_tensor_data(y)[0] = (float)(acc / (double)N); /* N == 0 gives NaN, as in PyTorch */
    zd_tensor_t *in[2] = {x, target};
    if (zd__nn_record(&mse_ops, in, 2, y, x, target, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}
