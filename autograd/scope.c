/* SPDX-License-Identifier: MIT */
/*  scope.c: per-thread stacks of scopes holding tensor references. */
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/scope.h>

struct zd_scope {
    zd_scope_t *parent; /* the enclosing scope on the same thread */
    zd_tensor_t **items;
    size_t n, cap;
};

static _Thread_local zd_scope_t *top;

zd_scope_t *zd_scope_begin(void)
{
    zd_scope_t *s = calloc(1, sizeof *s);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_scope_begin: out of memory");
        return NULL;
    }
    s->parent = top;
    top = s;
    return s;
}

static int push(zd_scope_t *s, zd_tensor_t *t)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        zd_tensor_t **items = realloc(s->items, cap * sizeof *items);
        if (!items)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "scope: out of memory");
        s->items = items;
        s->cap = cap;
    }
    s->items[s->n++] = t;
    return 0;
}

int zd_scope_end(zd_scope_t *s)
{
    if (!s)
        return 0;
    zd_scope_t *c = top;
    while (c && c != s)
        c = c->parent;
    if (!c)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_scope_end: not an open scope of this "
                                 "thread (ended already, or begun on another thread)");
    zd_scope_t *end;
    do {
        end = top;
        top = end->parent;
        while (end->n > 0)
            zd_tensor_unref(end->items[--end->n]);
        free(end->items);
        free(end);
    } while (end != s);
    return 0;
}

zd_tensor_t *zd_scope_add(zd_tensor_t *t)
{
    if (!t)
        return NULL; /* the failed call's error stays */
    if (!top) {
        zd_tensor_unref(t);
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_scope_add: no scope is open on this thread");
        return NULL;
    }
    if (push(top, t) < 0) {
        zd_tensor_unref(t);
        return NULL;
    }
    return t;
}

zd_tensor_t *zd_scope_keep(zd_tensor_t *t)
{
    for (zd_scope_t *s = top; t && s; s = s->parent) {
        for (size_t i = s->n; i-- > 0;) {
            if (s->items[i] != t)
                continue;
            if (s->parent && push(s->parent, t) < 0)
                return NULL;
            memmove(&s->items[i], &s->items[i + 1], (s->n - i - 1) * sizeof *s->items);
            s->n--;
            return t;
        }
    }
    zd_error_set_code(ZD_ERR_ARGUMENT,
                      "zd_scope_keep: no open scope of this thread holds "
                      "this tensor");
    return NULL;
}

zd_scope_t *zd_scope_current(void)
{
    return top;
}
size_t zd_scope_len(const zd_scope_t *s)
{
    return s ? s->n : 0;
}
