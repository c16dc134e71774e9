/* SPDX-License-Identifier: MIT */
/*  module_safetensors.c: weights in and out of safetensors files under
    PyTorch's names (<zdist/safetensors.h>): a module's state dict saved,
    a file loaded into existing tensors, strict or not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/safetensors.h>

/*  Appends name to list (a NULL list: nothing to keep). */
static int push_name(zd_strings_t *list, const char *name)
{
    return list ? zd_strings_append(list, name) : 0;
}

int zd_safetensors_load(const zd_named_tensors_t *dst, const char *path, bool strict,
                        zd_strings_t **skipped)
{
    if (skipped)
        *skipped = NULL;
    if (!path || !dst)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_safetensors_load: NULL %s",
                                 !path ? "path" : "destination");
    zd_named_tensors_t *file = zd_safetensors_read(path, NULL);
    if (!file)
        return -1;
    zd_strings_t *list = NULL;
    int rc = -1;
    if (skipped && !(list = zd_strings_new()))
        goto oom;
    int n_dst = zd_named_tensors_len(dst), n_file = zd_named_tensors_len(file);

    /* Everything is checked before anything is copied: a bad file leaves
       the weights as they were. */
    for (int i = 0; i < n_dst; i++) {
        const char *name = zd_named_tensors_name(dst, i);
        zd_tensor_t *d = zd_named_tensors_tensor(dst, i), *s = zd_named_tensors_find(file, name);
        if (!s) {
            if (strict) {
                zd_error_set_code(ZD_ERR_ARGUMENT,
                                  "%s: no tensor \"%s\" in the file (strict "
                                  "loading)",
                                  path, name);
                goto out;
            }
            if (push_name(list, name) < 0)
                goto oom;
            continue;
        }
        if (zd_tensor_dtype(s) != zd_tensor_dtype(d) || !zd_tensor_same_shape(s, d)) {
            char want[96], got[96];
            zd_error_set_code(ZD_ERR_ARGUMENT, "%s: tensor \"%s\" is %s %s, the model's is %s %s",
                              path, name, zd_tensor_dtype_name(zd_tensor_dtype(s)),
                              zd_tensor_shape_str(s, got, sizeof got),
                              zd_tensor_dtype_name(zd_tensor_dtype(d)),
                              zd_tensor_shape_str(d, want, sizeof want));
            goto out;
        }
    }
    for (int i = 0; i < n_file; i++) {
        const char *name = zd_named_tensors_name(file, i);
        if (zd_named_tensors_find(dst, name))
            continue;
        if (strict) {
            zd_error_set_code(ZD_ERR_ARGUMENT,
                              "%s: tensor \"%s\" is not one of the model's "
                              "(strict loading)",
                              path, name);
            goto out;
        }
        if (push_name(list, name) < 0)
            goto oom;
    }
    for (int i = 0; i < n_dst; i++) {
        zd_tensor_t *s = zd_named_tensors_find(file, zd_named_tensors_name(dst, i));
        if (s && zd_tensor_copy_(zd_named_tensors_tensor(dst, i), s) < 0)
            goto out; /* checked above: cannot happen */
    }
    if (skipped) {
        *skipped = list;
        list = NULL;
    }
    rc = 0;
    goto out;
oom:
    zd_error_wrap("%s", path);
out:
    zd_strings_free(list);
    zd_named_tensors_free(file);
    return rc;
}

int zd_nn_module_save_safetensors(const zd_nn_module_t *m, const char *path,
                                  const zd_strings_t *meta)
{
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_save_safetensors: NULL module");
    zd_named_tensors_t *nt = zd_nn_module_state_dict(m); /* a tied weight under each name */
    if (!nt)
        return -1;
    int rc = zd_safetensors_write(nt, path, meta);
    zd_named_tensors_free(nt);
    return rc;
}

int zd_nn_module_load_safetensors(zd_nn_module_t *m, const char *path, bool strict,
                                  zd_strings_t **skipped)
{
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_load_safetensors: NULL module");
    zd_named_tensors_t *nt = zd_nn_module_state_dict(m);
    if (!nt)
        return -1;
    int rc = zd_safetensors_load(nt, path, strict, skipped);
    zd_named_tensors_free(nt);
    return rc;
}
