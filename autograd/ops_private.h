/* SPDX-License-Identifier: MIT */
/*  ops_private.h: what the autograd/ op files share. */
#ifndef ZDIST_OPS_PRIVATE_H
#define ZDIST_OPS_PRIVATE_H

#include <zdist/tensor.h>

typedef enum { ZD__BIN_ADD, ZD__BIN_SUB, ZD__BIN_MUL, ZD__BIN_DIV } zd__bin_op_t;

/*  a op b for float32 tensors whose shapes broadcast (NumPy's rules: shapes
    aligned at their last dimension, sizes equal or 1), recorded by autograd
    with gradients summed back to each input's shape. 0 and *out, or -1
    (zd_error_set) when the shapes do not broadcast. */
int zd__tensor_binary(zd__bin_op_t op, zd_tensor_t *a, zd_tensor_t *b, zd_tensor_t **out);

#endif
