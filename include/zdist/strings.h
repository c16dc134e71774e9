/* SPDX-License-Identifier: MIT */
/*  strings.h: an ordered list of strings, for the names and texts the
    library hands back: the names a non-strict load skipped, a safetensors
    file's "__metadata__" (key, value, key, value, ...).

        zd_strings_t *meta = NULL;
        zd_named_tensors_t *w = zd_safetensors_read("model.safetensors", &meta);
        const char *format = zd_strings_value(meta, "format");   // "pt", or NULL
        zd_strings_free(meta);

    It holds a copy of each string. */
#ifndef ZDIST_STRINGS_H
#define ZDIST_STRINGS_H

#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_strings zd_strings_t;

/*  A new, empty list: a new object (zd_strings_free), or NULL when out of
    memory. */
ZD_API zd_strings_t *zd_strings_new(void);

/*  A new list holding copies of items[0..n): a new object
    (zd_strings_free), or NULL (ZD_ERR_ARGUMENT: a NULL item, n < 0;
    ZD_ERR_NO_MEMORY). */
ZD_API zd_strings_t *zd_strings_from(const char *const *items, int n);

/*  Frees the list and its copies. NULL-safe. */
ZD_API void zd_strings_free(zd_strings_t *s);

/*  Appends a copy of str. 0, or -1 (ZD_ERR_ARGUMENT: s or str NULL;
    ZD_ERR_NO_MEMORY). */
ZD_API int zd_strings_append(zd_strings_t *s, const char *str);

/*  How many strings (0 for NULL). */
ZD_API int zd_strings_len(const zd_strings_t *s);

/*  String i: borrowed, valid while the list lives; NULL when i is out of
    range. */
ZD_API const char *zd_strings_get(const zd_strings_t *s, int i);

/*  In a list of key, value pairs: the value after the first key equal to
    key, borrowed as above; NULL when there is none. */
ZD_API const char *zd_strings_value(const zd_strings_t *s, const char *key);

ZD_END_DECLS

#endif
