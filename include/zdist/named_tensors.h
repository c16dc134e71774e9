/* SPDX-License-Identifier: MIT */
/*  named_tensors.h: an ordered list of (name, tensor) pairs, PyTorch's
    state_dict (an OrderedDict[str, Tensor]).

        zd_named_tensors_t *sd = zd_nn_module_state_dict(module);   // <zdist/module.h>
        for (int i = 0; sd && i < zd_named_tensors_len(sd); i++)
            printf("%s\n", zd_named_tensors_name(sd, i));   // "fc1.weight", ...
        zd_named_tensors_free(sd);

    The container of named tensors: a module's state dict
    (zd_nn_module_state_dict), a context's gradients
    (zd_dist_autograd_get_gradients), an optimizer's state
    (zd_optim_state_export) and the tensors of a checkpoint
    (zd_checkpoint_read) or a safetensors file (zd_safetensors_read) come
    in it, and checkpoints are saved from and loaded into it. It holds a reference to each tensor
    (a state dict shares the module's tensors, as PyTorch's does) and a
    copy of each name; names are unique, and the order is the order of
    adding. */
#ifndef ZDIST_NAMED_TENSORS_H
#define ZDIST_NAMED_TENSORS_H

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_named_tensors zd_named_tensors_t;

/*  A new, empty list: a new object (zd_named_tensors_free), or NULL when
    out of memory. */
ZD_API zd_named_tensors_t *zd_named_tensors_new(void);

/*  Frees the list and drops its references to the tensors. NULL-safe. */
ZD_API void zd_named_tensors_free(zd_named_tensors_t *nt);

/*  Appends (name, t): the list takes its own reference to t and copies
    name. 0, or -1 (ZD_ERR_ARGUMENT: a NULL or empty name, a name already
    there, t NULL; ZD_ERR_NO_MEMORY). */
ZD_API int zd_named_tensors_add(zd_named_tensors_t *nt, const char *name, zd_tensor_t *t);

/*  How many pairs. */
ZD_API int zd_named_tensors_len(const zd_named_tensors_t *nt);

/*  The name of pair i: borrowed, valid while the list lives; NULL when i
    is out of range. */
ZD_API const char *zd_named_tensors_name(const zd_named_tensors_t *nt, int i);

/*  The tensor of pair i: borrowed, valid while the list lives (take a
    reference to keep it longer); NULL when i is out of range. */
ZD_API zd_tensor_t *zd_named_tensors_tensor(const zd_named_tensors_t *nt, int i);

/*  The tensor named name: borrowed, as above; NULL when there is none. */
ZD_API zd_tensor_t *zd_named_tensors_find(const zd_named_tensors_t *nt, const char *name);

/*  The index of name, or -1 when there is none. */
ZD_API int zd_named_tensors_index(const zd_named_tensors_t *nt, const char *name);

ZD_END_DECLS

#endif
