/* SPDX-License-Identifier: MIT */
/*  files.h: what the file formats of data/ share: little-endian numbers,
    a shape in an error text, and replacing a file whole (checkpoints and
    safetensors files are written to a temporary beside the target and
    renamed over it, so that a reader or a crash never sees half a file). */
#ifndef ZDIST_DATA_FILES_H
#define ZDIST_DATA_FILES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

static inline uint32_t zd__le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t zd__le64(const unsigned char *p)
{
    return (uint64_t)zd__le32(p) | (uint64_t)zd__le32(p + 4) << 32;
}

static inline void zd__put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

/*  "(2, 3)": a shape read from a file (not yet a tensor's), cut at size. */
void zd__shape_str(const int64_t *shape, int ndim, char *buf, size_t size);

/*  Writes f's contents: 0, or -1 with the error set. */
typedef int(zd__file_write_fn)(FILE *f, void *arg);

/*  Replaces path with what write puts in a new file: written to a
    temporary beside it, synced, renamed over it. Errors name the format
    ("checkpoint", "safetensors") and the path. 0, or -1 with the error set
    (the temporary removed). */
int zd__file_replace(const char *format, const char *path, zd__file_write_fn *write, void *arg);

#endif
