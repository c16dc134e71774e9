/* SPDX-License-Identifier: MIT */
/*  sized.h: structs that cross the API with their size (private; every
    layer may include it, as tests/check_layers.sh allows).

    An option struct carries `size_t size` as its first field, set by its
    _default() function (inline in the public header, so the size is the
    one the caller was compiled with): the library reads only the fields
    that fit in it and keeps its defaults for the rest, so a program built
    against older headers works with a newer library. An out-struct the
    library fills (metrics, counters) is written only up to the size the
    caller passes. Header only: no symbol crosses a layer. */
#ifndef ZDIST_CORE_SIZED_H
#define ZDIST_CORE_SIZED_H

#include <stddef.h>
#include <string.h>

#include <zdist/error.h>

/*  The size of type up to and including member: the smallest size a caller
    of the first version carrying member can pass. */
#define ZD__SIZE_THROUGH(type, member) (offsetof(type, member) + sizeof(((type *)0)->member))

/*  Copies the caller's struct `in` (its first field is its size) over
    *defaults (a struct of defaults_size bytes, filled by the _default()
    function), as far as both reach, and sets defaults' own size field.
    min_size is the size of the struct's first version. -1 with
    ZD_ERR_ARGUMENT when in's size is below it: a struct that no
    _default() (named by init) initialised. what names the type. */
static inline int zd__sized_read(void *defaults, size_t defaults_size, const void *in,
                                 size_t min_size, const char *what, const char *init)
{
    size_t size;
    memcpy(&size, in, sizeof size);
    if (size < min_size)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s.size is %zu, not the size of a %s: "
                                 "start from %s, then set the fields",
                                 what, size, what, init);
    memcpy(defaults, in, size < defaults_size ? size : defaults_size);
    memcpy(defaults, &defaults_size, sizeof defaults_size);
    return 0;
}

/*  Writes the library's struct src (src_size bytes) into the caller's out
    of size bytes, no further. min_size as above: -1 with ZD_ERR_ARGUMENT
    when size is below it (out is then left alone). */
static inline int zd__sized_write(void *out, size_t size, const void *src, size_t src_size,
                                  size_t min_size, const char *what)
{
    if (!out || size < min_size)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: %s of %zu bytes (pass sizeof of the "
                                 "struct, at least %zu)",
                                 what, out ? "a struct" : "NULL", size, min_size);
    memcpy(out, src, size < src_size ? size : src_size);
    if (size > src_size) /* a newer caller's fields this library does not know */
        memset((char *)out + src_size, 0, size - src_size);
    return 0;
}

#endif
