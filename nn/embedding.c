/* SPDX-License-Identifier: MIT */
/*  embedding.c: rows of a table picked by indices; the backward pass adds
    each output row's gradient into a dense gradient of the whole table. */
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include "nn/nn_private.h"

typedef struct {
    int64_t rows, dim;   /* the table's shape */
    int64_t padding_idx; /* < 0: none */
    int64_t n;
    int64_t idx[];
} emb_ctx_t;

static int emb_backward(zd_autograd_node_t *node, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    const emb_ctx_t *c = zd_autograd_node_ctx(node);
    if (!(gin[0] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){c->rows, c->dim}, 2)))
        return -1;
    const float *g = zd_tensor_data(gout[0]);
    float *dw = zd_tensor_data(gin[0]);
    for (int64_t i = 0; i < c->n; i++) {
        if (c->idx[i] == c->padding_idx)
            continue;
        float *row = dw + c->idx[i] * c->dim;
        const float *gr = g + i * c->dim;
        for (int64_t k = 0; k < c->dim; k++)
            row[k] += gr[k];
    }
    return 0;
}

static const zd_autograd_node_ops_t emb_ops =
    ZD_AUTOGRAD_NODE_OPS("EmbeddingBackward", emb_backward, zd__nn_free_ctx);

int zd_nn_embedding(zd_tensor_t *indices, zd_tensor_t *weight, int64_t padding_idx,
                    zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_embedding: NULL out");
    *out = NULL;
    if (zd__nn_check_f32("embedding: weight", weight) < 0 ||
        zd__nn_check_ndim("embedding: weight", weight, 2) < 0)
        return -1;
    if (!indices)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "embedding: indices are NULL");
    const zd_tensor_dtype_t dt = zd_tensor_dtype(indices);
    if (dt != ZD_INT64 && dt != ZD_UINT8)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "embedding: indices must be int64 or uint8, got %s",
                                 zd_tensor_dtype_name(dt));
    const int nd = zd_tensor_ndim(indices);
    if (nd + 1 > ZD_TENSOR_MAX_DIMS)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "embedding: indices have %d dimensions, at most %d fit", nd,
                                 ZD_TENSOR_MAX_DIMS - 1);
    const int64_t rows = zd_tensor_size(weight, 0), dim = zd_tensor_size(weight, 1);
    if (padding_idx < ZD_NN_NO_PADDING || padding_idx >= rows)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "embedding: padding_idx %lld out of range for %lld rows",
                                 (long long)padding_idx, (long long)rows);
    const int64_t n = zd_tensor_numel(indices);
    emb_ctx_t *c = malloc(sizeof *c + sizeof(int64_t) * (size_t)n);
    if (!c)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "embedding: out of memory");
    c->rows = rows;
    c->dim = dim;
    c->padding_idx = padding_idx;
    c->n = n;
    for (int64_t i = 0; i < n; i++) {
        c->idx[i] = dt == ZD_INT64 ? zd_tensor_data_i64(indices)[i]
                                   : ((const uint8_t *)zd_tensor_raw(indices))[i];
        if (c->idx[i] < 0 || c->idx[i] >= rows) {
            zd_error_set_code(ZD_ERR_ARGUMENT,
                              "embedding: index %lld (element %lld) out of range for %lld rows",
                              (long long)c->idx[i], (long long)i, (long long)rows);
            free(c);
            return -1;
        }
    }
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    memcpy(shape, zd_tensor_shape(indices), sizeof(int64_t) * (size_t)nd);
    shape[nd] = dim;
    zd_tensor_t *y = zd_tensor_empty(ZD_FLOAT32, shape, nd + 1);
    if (!y) {
        free(c);
        return -1;
    }
    const float *w = zd_tensor_data(weight);
    float *py = zd_tensor_data(y);
    for (int64_t i = 0; i < n; i++)
        memcpy(py + i * dim, w + c->idx[i] * dim, sizeof(float) * (size_t)dim);
    if (zd__nn_record(&emb_ops, &weight, 1, y, NULL, NULL, NULL, c) < 0)
        return -1;
    *out = y;
    return 0;
}
