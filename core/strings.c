/* SPDX-License-Identifier: MIT */
/*  strings.c: an ordered list of strings (<zdist/strings.h>). */
#include <zdist/strings.h>

#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

struct zd_strings {
    int n, cap;
    char **items;
};

zd_strings_t *zd_strings_new(void)
{
    zd_strings_t *s = calloc(1, sizeof *s);
    if (!s)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "strings: out of memory");
    return s;
}

zd_strings_t *zd_strings_from(const char *const *items, int n)
{
    if (n < 0 || (n > 0 && !items)) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_strings_from: %d items%s", n,
                          items ? "" : " from NULL");
        return NULL;
    }
    zd_strings_t *s = zd_strings_new();
    for (int i = 0; s && i < n; i++)
        if (zd_strings_append(s, items[i]) < 0) {
            zd_strings_free(s);
            s = NULL;
        }
    return s;
}

void zd_strings_free(zd_strings_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        free(s->items[i]);
    free(s->items);
    free(s);
}

int zd_strings_append(zd_strings_t *s, const char *str)
{
    if (!s || !str)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_strings_append: NULL %s",
                                 !s ? "list" : "string");
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        char **items = realloc(s->items, (size_t)cap * sizeof *items);
        if (!items)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "strings: out of memory");
        s->items = items;
        s->cap = cap;
    }
    char *copy = strdup(str);
    if (!copy)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "strings: out of memory");
    s->items[s->n++] = copy;
    return 0;
}

int zd_strings_len(const zd_strings_t *s)
{
    return s ? s->n : 0;
}

const char *zd_strings_get(const zd_strings_t *s, int i)
{
    if (s && i >= 0 && i < s->n)
        return s->items[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "strings: no item %d (there are %d)", i, s ? s->n : 0);
    return NULL;
}

const char *zd_strings_value(const zd_strings_t *s, const char *key)
{
    for (int i = 0; s && key && i + 1 < s->n; i += 2)
        if (strcmp(s->items[i], key) == 0)
            return s->items[i + 1];
    zd_error_set_code(ZD_ERR_ARGUMENT, "strings: no key \"%s\"", key ? key : "(null)");
    return NULL;
}
