/* SPDX-License-Identifier: MIT */
/*  idx.h: reading and writing IDX files (the MNIST file format), plain or gzip.

    Layout: bytes 00 00, an element type byte
    (0x08 uint8, 0x0D float32), a byte ndims, ndims big-endian u32 dimensions
    (outermost first), then the elements row-major, big-endian. A file is
    exactly 4 + 4*ndims + count*elemsize bytes: anything shorter or longer is
    an error.

    A file starting with the gzip magic (1f 8b) is decompressed on the fly,
    whatever its name; any other file is read as it is.

    Error texts name the file and what is wrong with it ("idx: <path>: ..."). */
#ifndef ZDIST_IDX_H
#define ZDIST_IDX_H

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_IDX_TYPE_U8  0x08
#define ZD_IDX_TYPE_F32 0x0D

/*  Reads an IDX file (plain or gzip). uint8 data becomes a ZD_UINT8 tensor,
    float32 data a ZD_FLOAT32 tensor, both with the file's shape. Other
    element types, a bad magic, 0 or more than 8 dimensions, dimensions
    whose product overflows, and a size that disagrees with the dimensions
    (truncated or trailing data) are refused. Returns the tensor, a new
    reference, or NULL with zd_error_last() set. */
ZD_API zd_tensor_t *zd_idx_read(const char *path);

/*  Writes t (ZD_UINT8 or ZD_FLOAT32, 1 to 8 dimensions, each < 2^32) as an
    IDX file: gzip-compressed when path ends in ".gz", plain otherwise.
    Returns 0, or -1 with zd_error_last() set (a partial file may remain). */
ZD_API int zd_idx_save(const zd_tensor_t *t, const char *path);

/*  zd_idx_save for float32 tensors only: 0, or -1 (any other dtype is
    refused). */
ZD_API int zd_idx_save_f32(const zd_tensor_t *t, const char *path);

ZD_END_DECLS

#endif
