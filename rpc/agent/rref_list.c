/* SPDX-License-Identifier: MIT */
/*  rref_list.c: lists of RRefs (<zdist/rpc.h>), PyTorch's list of
    parameter RRefs for the DistributedOptimizer. An RRef is listed once
    per value: two handles with the same owner and RRef id (the same
    handle twice, or two forks of it) name the same value. Two RRefs made
    apart to one tensor (two RemoteModules sharing a weight, each making
    its own) have two ids and are both listed. The lookup is linear: lists
    are a module's parameters, a few to a few hundred, built once. */
#include "rpc/agent/rref.h"

#include <stdlib.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

struct zd_rref_list {
    int n, cap;
    zd_rref_t **items;
};

zd_rref_list_t *zd_rref_list_new(void)
{
    zd_rref_list_t *l = calloc(1, sizeof *l);
    if (!l)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rref_list_new: out of memory");
    return l;
}

void zd_rref_list_free(zd_rref_list_t *l)
{
    if (!l)
        return;
    for (int i = 0; i < l->n; i++)
        zd_rref_unref(l->items[i]);
    free(l->items);
    free(l);
}

static bool listed(const zd_rref_list_t *l, const zd_rref_t *r)
{
    for (int i = 0; i < l->n; i++)
        if (l->items[i] == r ||
            (l->items[i]->rref_id == r->rref_id && l->items[i]->owner == r->owner))
            return true;
    return false;
}

int zd_rref_list_append(zd_rref_list_t *l, zd_rref_t *r)
{
    if (!l || !r)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rref_list_append: NULL %s",
                                 l ? "RRef" : "list");
    if (listed(l, r))
        return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 16;
        zd_rref_t **items = realloc(l->items, (size_t)cap * sizeof *items);
        if (!items)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rref_list_append: out of memory");
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = zd_rref_ref(r);
    return 0;
}

int zd_rref_list_extend(zd_rref_list_t *l, const zd_rref_list_t *other)
{
    if (!l || !other)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rref_list_extend: NULL list");
    /* other may be l itself: its length does not change then (all listed). */
    for (int i = 0, n = other->n; i < n; i++)
        if (zd_rref_list_append(l, other->items[i]) < 0)
            return zd_error_wrap("zd_rref_list_extend: RRef %d of %d", i, n);
    return 0;
}

int zd_rref_list_len(const zd_rref_list_t *l)
{
    return l ? l->n : 0;
}

zd_rref_t *zd_rref_list_get(const zd_rref_list_t *l, int i)
{
    if (l && i >= 0 && i < l->n)
        return l->items[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "RRef list: no item %d (there are %d)", i, l ? l->n : 0);
    return NULL;
}
