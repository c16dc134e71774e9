/* SPDX-License-Identifier: MIT */
/*  named_tensors.c: an ordered list of (name, tensor) pairs
    (<zdist/named_tensors.h>), with a hash index of the names beside it:
    the lists are mostly state dicts of a few hundred tensors, but a file
    read from elsewhere may name a million, and checking each new name
    against the others must not take quadratic time. */
#include <zdist/named_tensors.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

struct zd_named_tensors {
    int n, cap;
    char **names;
    zd_tensor_t **tensors;
    int *slots;     /* open addressing: index + 1 into names, 0 = empty */
    size_t n_slots; /* a power of two, at least twice n */
};

/*  FNV-1a. */
static size_t name_hash(const char *s)
{
    uint64_t h = 14695981039346656037ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return (size_t)h;
}

/*  The slot holding name, or the empty slot where it would go. */
static size_t slot_of(const zd_named_tensors_t *nt, const char *name)
{
    size_t mask = nt->n_slots - 1, k = name_hash(name) & mask;
    while (nt->slots[k] && strcmp(nt->names[nt->slots[k] - 1], name) != 0)
        k = (k + 1) & mask;
    return k;
}

/*  Room in the index for n names: 0, or -1 (out of memory, index as it was). */
static int index_reserve(zd_named_tensors_t *nt, int n)
{
    size_t want = 16;
    while (want < 2 * (size_t)n)
        want *= 2;
    if (want <= nt->n_slots)
        return 0;
    int *slots = calloc(want, sizeof *slots);
    if (!slots)
        return -1;
    free(nt->slots);
    nt->slots = slots;
    nt->n_slots = want;
    for (int i = 0; i < nt->n; i++)
        nt->slots[slot_of(nt, nt->names[i])] = i + 1;
    return 0;
}

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
    free(nt->slots);
    free(nt);
}

static int index_of(const zd_named_tensors_t *nt, const char *name)
{
    if (!nt || !name || !nt->n_slots)
        return -1;
    return nt->slots[slot_of(nt, name)] - 1;
}

int zd_named_tensors_index(const zd_named_tensors_t *nt, const char *name)
{
    int i = index_of(nt, name);
    if (i < 0)
        zd_error_set_code(ZD_ERR_ARGUMENT, "named tensors: no tensor named \"%s\"",
                          name ? name : "(null)");
    return i;
}

int zd_named_tensors_add(zd_named_tensors_t *nt, const char *name, zd_tensor_t *t)
{
    if (!nt || !t || !name || !*name)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "named tensors: add needs a list, a name and "
                                 "a tensor");
    if (index_of(nt, name) >= 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "named tensors: \"%s\" is there already", name);
    if (nt->n == INT32_MAX - 1 || index_reserve(nt, nt->n + 1) < 0)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "named tensors: out of memory");
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
    nt->tensors[nt->n] = zd_tensor_ref(t);
    size_t k = slot_of(nt, copy);
    nt->slots[k] = ++nt->n;
    return 0;
}

int zd_named_tensors_len(const zd_named_tensors_t *nt)
{
    return nt ? nt->n : 0;
}

/*  An index out of range is a bad argument, said like the others. */
static bool in_range(const zd_named_tensors_t *nt, int i)
{
    if (nt && i >= 0 && i < nt->n)
        return true;
    zd_error_set_code(ZD_ERR_ARGUMENT, "named tensors: no tensor %d (there are %d)", i,
                      nt ? nt->n : 0);
    return false;
}

const char *zd_named_tensors_name(const zd_named_tensors_t *nt, int i)
{
    return in_range(nt, i) ? nt->names[i] : NULL;
}

zd_tensor_t *zd_named_tensors_tensor(const zd_named_tensors_t *nt, int i)
{
    return in_range(nt, i) ? nt->tensors[i] : NULL;
}

zd_tensor_t *zd_named_tensors_find(const zd_named_tensors_t *nt, const char *name)
{
    int i = zd_named_tensors_index(nt, name);
    return i < 0 ? NULL : nt->tensors[i];
}
