/*  loss.c: log_softmax, nll_loss, cross_entropy, argmax, accuracy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/autograd.h"
#include "autograd/error.h"
#include "nn/nn.h"
#include "nn/nn_private.h"

/* ---- log_softmax ---- */

static int log_softmax_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    tensor_t *y = autograd_node_saved(n, 0);
    const int64_t rows = tensor_size(y, 0), cols = tensor_size(y, 1);
    if (!(gin[0] = tensor_empty(TENSOR_F32, 2, tensor_shape(y))))
        return -1;
    const float *yd = tensor_data(y), *dy = tensor_data(gout[0]);
    float *dx = tensor_data(gin[0]);
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

static const autograd_node_ops_t log_softmax_ops = {"LogSoftmaxBackward", log_softmax_backward,
                                                     NULL};

int nn_log_softmax(tensor_t *x, int dim, tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("log_softmax: input", x) < 0 ||
        nn_check_ndim("log_softmax: input", x, 2) < 0)
        return -1;
    if (dim != 1 && dim != -1)
        return error_set("log_softmax: only dim 1 of a 2-D input is supported, got dim %d",
                         dim);
    const int64_t rows = tensor_size(x, 0), cols = tensor_size(x, 1);
    tensor_t *y = tensor_empty(TENSOR_F32, 2, tensor_shape(x));
    if (!y)
        return -1;
    const float *xd = tensor_data(x);
    float *yd = tensor_data(y);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = xd + r * cols;
        float *yr = yd + r * cols;
        float mx = -INFINITY;
        for (int64_t c = 0; c < cols; c++)
            mx = xr[c] > mx ? xr[c] : mx;
        if (isinf(mx) && mx < 0)
            mx = 0.0f;    /* a row of -inf: keep it -inf instead of NaN */
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++)
            sum += exp((double)(xr[c] - mx));
        const float lse = (float)log(sum);
        for (int64_t c = 0; c < cols; c++)
            yr[c] = xr[c] - mx - lse;
    }
    if (nn_record(&log_softmax_ops, 1, &x, y, y, NULL, NULL, NULL) < 0)
        return -1;
    *out = y;
    return 0;
}

/* ---- targets ---- */

/*  Class index of sample i of a (N) int64 or uint8 target. */
static int64_t target_at(const tensor_t *t, int64_t i)
{
    if (tensor_dtype(t) == TENSOR_I64)
        return tensor_data_i64(t)[i];
    return ((const uint8_t *)tensor_raw(t))[i];
}

/*  target must be (N) int64/uint8 with every class in [0, C). */
static int check_target(const char *op, const tensor_t *scores, const tensor_t *target)
{
    char ss[96], st[96];
    if (!target)
        return error_set("%s: target is NULL", op);
    if (tensor_dtype(target) != TENSOR_I64 && tensor_dtype(target) != TENSOR_U8)
        return error_set("%s: target must be int64 or uint8 class indices, got %s", op,
                         tensor_dtype_name(tensor_dtype(target)));
    if (tensor_ndim(target) != 1 || tensor_size(target, 0) != tensor_size(scores, 0))
        return error_set("%s: target %s does not match input %s (expected (%lld))", op,
                         tensor_shape_str(target, st, sizeof st),
                         tensor_shape_str(scores, ss, sizeof ss),
                         (long long)tensor_size(scores, 0));
    const int64_t C = tensor_size(scores, 1);
    for (int64_t i = 0; i < tensor_size(target, 0); i++) {
        int64_t t = target_at(target, i);
        if (t < 0 || t >= C)
            return error_set("%s: target[%lld] = %lld is out of range for %lld classes", op,
                             (long long)i, (long long)t, (long long)C);
    }
    return 0;
}

/* ---- nll_loss ---- */

typedef struct {
    int64_t shape[2];
    int64_t target[];
} nll_ctx_t;

static int nll_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    const nll_ctx_t *ctx = autograd_node_ctx(n);
    if (!(gin[0] = tensor_new(TENSOR_F32, 2, ctx->shape)))
        return -1;
    const int64_t N = ctx->shape[0], C = ctx->shape[1];
    const float g = -tensor_data(gout[0])[0] / (float)N;
    float *dx = tensor_data(gin[0]);
    for (int64_t i = 0; i < N; i++)
        dx[i * C + ctx->target[i]] = g;
    return 0;
}

static const autograd_node_ops_t nll_ops = {"NllLossBackward", nll_backward, nn_free_ctx};

int nn_nll_loss(tensor_t *logprobs, tensor_t *target, tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("nll_loss: input", logprobs) < 0 ||
        nn_check_ndim("nll_loss: input", logprobs, 2) < 0 ||
        check_target("nll_loss", logprobs, target) < 0)
        return -1;
    const int64_t N = tensor_size(logprobs, 0), C = tensor_size(logprobs, 1);
    tensor_t *y = tensor_empty(TENSOR_F32, 0, NULL);
    nll_ctx_t *ctx = malloc(sizeof *ctx + sizeof(int64_t) * (size_t)N);
    if (!y || !ctx) {
        tensor_unref(y);
        free(ctx);
        return error_set("nll_loss: out of memory");
    }
    ctx->shape[0] = N;
    ctx->shape[1] = C;
    const float *lp = tensor_data(logprobs);
    double acc = 0.0;
    for (int64_t i = 0; i < N; i++) {
        ctx->target[i] = target_at(target, i);
        acc += lp[i * C + ctx->target[i]];
    }
    tensor_data(y)[0] = (float)(-acc / (double)N);   /* N == 0 gives NaN, as in PyTorch */
    if (nn_record(&nll_ops, 1, &logprobs, y, NULL, NULL, NULL, ctx) < 0)
        return -1;
    *out = y;
    return 0;
}

int nn_cross_entropy(tensor_t *logits, tensor_t *target, tensor_t **out)
{
    tensor_t *lp;
    *out = NULL;
    if (nn_log_softmax(logits, 1, &lp) < 0)
        return error_wrap("cross_entropy");
    int rc = nn_nll_loss(lp, target, out);
    tensor_unref(lp);
    return rc < 0 ? error_wrap("cross_entropy") : 0;
}

/* ---- argmax / accuracy ---- */

static int64_t row_argmax(const float *r, int64_t C)
{
    int64_t best = 0;
    for (int64_t c = 1; c < C; c++)
        if (r[c] > r[best])
            best = c;
    return best;
}

int nn_argmax(tensor_t *x, tensor_t **out)
{
    *out = NULL;
    if (nn_check_f32("argmax: input", x) < 0 || nn_check_ndim("argmax: input", x, 2) < 0)
        return -1;
    const int64_t N = tensor_size(x, 0), C = tensor_size(x, 1);
    if (C < 1 && N > 0)
        return error_set("argmax: input has no columns");
    tensor_t *y = tensor_empty(TENSOR_I64, 1, &N);
    if (!y)
        return -1;
    for (int64_t i = 0; i < N; i++)
        tensor_data_i64(y)[i] = row_argmax(tensor_data(x) + i * C, C);
    *out = y;
    return 0;
}

int64_t nn_accuracy(tensor_t *scores, tensor_t *target)
{
    if (nn_check_f32("accuracy: input", scores) < 0 ||
        nn_check_ndim("accuracy: input", scores, 2) < 0 ||
        check_target("accuracy", scores, target) < 0)
        return -1;
    const int64_t N = tensor_size(scores, 0), C = tensor_size(scores, 1);
    int64_t correct = 0;
    for (int64_t i = 0; i < N; i++)
        correct += row_argmax(tensor_data(scores) + i * C, C) == target_at(target, i);
    return correct;
}
