/* SPDX-License-Identifier: MIT */
/*  autograd_private.h: the structures behind zd_tensor_t and zd_autograd_node_t,
    shared by tensor.c, node.c and engine.c only. */
#ifndef ZDIST_AUTOGRAD_PRIVATE_H
#define ZDIST_AUTOGRAD_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>

#include <zdist/function.h>
#include <zdist/tensor.h>

#include "core/blocks.h"

typedef struct {
    atomic_int refcount;
    void *data;
    size_t bytes;
    zd_tensor_release_fn *release; /* NULL: data is the tensor's own */
    void *release_arg;
    size_t block; /* data's size from zd__block_alloc; 0: malloc */
} tensor_storage_t;

struct zd_tensor {
    atomic_int refcount;
    zd_tensor_dtype_t dtype;
    int ndim;
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    int64_t numel;
    tensor_storage_t *storage;
    size_t offset; /* bytes into storage */
    uint64_t id;

    /* autograd */
    bool requires_grad;
    zd_autograd_node_t *grad_fn; /* owned reference; NULL for leaves */
    int output_nr;
    pthread_mutex_t grad_lock; /* guards grad */
    zd_tensor_t *grad;
    char *name;
};

struct zd_autograd_node {
    atomic_int refcount;
    const zd_autograd_node_ops_t *ops;
    uint64_t seq; /* creation order: later nodes run first */
    int n_inputs;
    int n_outputs;
    int outputs_set;
    zd_autograd_edge_t *edges; /* n_inputs */
    int64_t *out_dims;         /* n_outputs * ZD_TENSOR_MAX_DIMS */
    int *out_ndim;
    zd_tensor_t *saved[ZD_AUTOGRAD_MAX_SAVED];
    void *ctx;
    bool has_state;       /* saved tensors or ctx were recorded */
    bool released;        /* saved tensors freed by a backward pass */
    bool lost_saved;      /* a tensor to save was lost (out of memory) */
    pthread_mutex_t lock; /* guards released/saved during a run */
};

/*  Frees the saved tensors and private state of n (idempotent). */
void zd__autograd_node_release_saved(zd_autograd_node_t *n);

#endif
