/* SPDX-License-Identifier: MIT */
/*  named_tensors.c: an ordered list of (name, tensor) pairs
    (<zdist/named_tensors.h>). Lookups by name are linear: the lists are
    state dicts of a few to a few hundred tensors, read once per save,
    load or step. */
#include <zdist/named_tensors.h>

#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

struct zd_named_tensors {
    int n, cap;
    char **names;
    zd_tensor_t **tensors;
};

zd_named_tensors_t *zd_named_tensors_new(void)
{
    zd_named_tensors_t *nt = calloc(1, sizeof *nt);
    if (!nt)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "named tensors: out of memory");
    return nt;
}

void zd_named_tensors_free(zd_named_tensors_t *nt)
{
    if (!nt)
        return;
    for (int i = 0; i < nt->n; i++) {
        free(nt->names[i]);
        zd_tensor_unref(nt->tensors[i]);
    }
    free(nt->names);
    free(nt->tensors);
    free(nt);
}

int zd_named_tensors_index(const zd_named_tensors_t *nt, const char *name)
{
    for (int i = 0; nt && name && i < nt->n; i++)
        if (strcmp(nt->names[i], name) == 0)
            return i;
    return -1;
}

int zd_named_tensors_add(zd_named_tensors_t *nt, const char *name, zd_tensor_t *t)
{
    if (!nt || !t || !name || !*name)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "named tensors: add needs a list, a name and "
                                 "a tensor");
    if (zd_named_tensors_index(nt, name) >= 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "named tensors: \"%s\" is there already",
                                 name);
    if (nt->n == nt->cap) {
        int cap = nt->cap ? 2 * nt->cap : 8;
        char **names = realloc(nt->names, (size_t)cap * sizeof *names);
        if (names)
            nt->names = names;
        zd_tensor_t **tensors = names ? realloc(nt->tensors, (size_t)cap * sizeof *tensors) : NULL;
        if (tensors)
            nt->tensors = tensors;
        if (!names || !tensors)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "named tensors: out of memory");
        nt->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "named tensors: out of memory");
    nt->names[nt->n] = copy;
    nt->tensors[nt->n++] = zd_tensor_ref(t);
    return 0;
}

int zd_named_tensors_len(const zd_named_tensors_t *nt)
{
    return nt ? nt->n : 0;
}

const char *zd_named_tensors_name(const zd_named_tensors_t *nt, int i)
{
    return nt && i >= 0 && i < nt->n ? nt->names[i] : NULL;
}

zd_tensor_t *zd_named_tensors_tensor(const zd_named_tensors_t *nt, int i)
{
    return nt && i >= 0 && i < nt->n ? nt->tensors[i] : NULL;
}

zd_tensor_t *zd_named_tensors_find(const zd_named_tensors_t *nt, const char *name)
{
    return zd_named_tensors_tensor(nt, zd_named_tensors_index(nt, name));
}
