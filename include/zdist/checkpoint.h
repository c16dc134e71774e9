/* SPDX-License-Identifier: MIT */
/*  checkpoint.h: saving and loading named tensors (a model's parameters,
    an optimizer's state) to a file.

    File format, version 1. All integers are unsigned little-endian.

        offset  size      content
        0       8         magic "ZDCKPT\r\n" (5A 44 43 4B 50 54 0D 0A)
        8       4         version = 1
        12      4         count: number of tensors (at most 1,000,000)
        16      ...       count records, one per tensor, in the list's order:
                  4         name length L (1 to 4096)
                  L         name, bytes without a terminating NUL
                  4         dtype: 1 float32, 2 int64, 3 uint8 (zd_tensor_dtype_t)
                  4         ndim (0 to 8)
                  8*ndim    dimensions, u64 each, outermost first
                  numel*es  the elements, row-major, little-endian
        end-4   4         CRC-32 (zlib's crc32) of every byte before it

    Saving writes "<path>.tmp.<pid>.<n>" in the same directory, flushes it
    to disk and renames it over path, so a crash leaves either the old file
    or the new one, never half of one.

    Loading reads into tensors the caller already has (a model's
    parameters), matched by name, and refuses the whole file without
    touching any tensor when anything is off: bad magic or version, CRC
    mismatch, truncated file, a requested name missing, a name in the file
    that was not requested, a dtype or shape mismatch. */
#ifndef ZDIST_CHECKPOINT_H
#define ZDIST_CHECKPOINT_H

#include <zdist/named_tensors.h>
#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_CHECKPOINT_MAGIC     "ZDCKPT\r\n"
#define ZD_CHECKPOINT_VERSION   1
#define ZD_CHECKPOINT_MAX_NAME  4096
#define ZD_CHECKPOINT_MAX_COUNT 1000000

/*  Writes the tensors of the list (any dtype) under their names (1 to
    4096 bytes). Not recorded by autograd. Returns 0, or -1 with
    zd_error_last() naming the file and the problem (then path is left as
    it was). */
ZD_API int zd_checkpoint_save(const zd_named_tensors_t *tensors, const char *path);

/*  Reads the file into the list's tensors, each under its name: the file
    must hold exactly these names (in any order), each with the tensor's
    dtype and shape. Data is copied in place (no autograd record). All or
    nothing: returns 0, or -1 with zd_error_last() naming the file (and the
    tensor and both shapes for a shape mismatch) and no tensor changed. */
ZD_API int zd_checkpoint_load(const zd_named_tensors_t *into, const char *path);

/*  Reads every tensor of the file without knowing them in advance (for
    tools and inspection), in the file's order: a new object
    (zd_named_tensors_free), or NULL as zd_checkpoint_load fails. */
ZD_API zd_named_tensors_t *zd_checkpoint_read(const char *path);

ZD_END_DECLS

#endif
