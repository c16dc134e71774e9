/*  nn_private.h: helpers shared by the nn/ sources only. */
#ifndef ZDIST_NN_PRIVATE_H
#define ZDIST_NN_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include "autograd/function.h"
#include "autograd/tensor.h"

/*  Fails (error_set) unless t is a non-NULL float32 tensor; `what` names
    the argument in the message ("conv2d: weight"). */
int nn_check_f32(const char *what, const tensor_t *t);

/*  Fails unless t has exactly ndim dimensions. */
int nn_check_ndim(const char *what, const tensor_t *t, int ndim);

/*  Records a node with ops over inputs for output y, saving up to three
    tensors (NULL slots are skipped) and taking ownership of ctx (freed by
    ops->release, or here when nothing is recorded or on failure). On
    failure also drops y. */
int nn_record(const autograd_node_ops_t *ops, int n_in, tensor_t *const *in, tensor_t *y,
              tensor_t *s0, tensor_t *s1, tensor_t *s2, void *ctx);

/*  Release function for nodes whose ctx is one malloc'ed block. */
void nn_free_ctx(autograd_node_t *n);

/*  Row-major C = alpha * op(A) op(B) + beta * C (op = transpose when the
    flag is set), M x N result, K inner. Small products run in plain loops:
    for them OpenBLAS's call and thread hand-off cost more than the math. */
void nn_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float *a,
              int lda, const float *b, int ldb, float beta, float *c, int ldc);

#endif
