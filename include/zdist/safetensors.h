/* SPDX-License-Identifier: MIT */
/*  safetensors.h: named tensors in and out of safetensors files, the
    format PyTorch's and Hugging Face's tools share.

        zd_strings_t *meta;
        zd_named_tensors_t *w = zd_safetensors_read("model.safetensors", &meta);
        if (!w)
            fprintf(stderr, "%s\n", zd_error_last());   // names the file and the problem

    The format (https://github.com/huggingface/safetensors): an unsigned
    64-bit little-endian N, N bytes of UTF-8 JSON starting with '{', then
    the tensors' bytes, row-major and little-endian. The JSON maps each
    name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin,
    end]} (offsets from the first byte after the header; the tensors cover
    that data without gap or overlap, up to the end of the file), and the
    optional key "__metadata__" to an object of string values.

    dtypes: F32, I64 and U8 are read and written as zdist's float32, int64
    and uint8; F64, F16 and BF16 are read and converted to float32 (zdist
    has no such tensors), rounding to nearest. Any other dtype is refused.

    Reading maps the file: a tensor whose data is aligned for its dtype in
    the file (every tensor of a file written by safetensors or by zdist)
    borrows the mapping instead of being copied, and the mapping goes away
    with the last tensor that borrows it. The mapping is private: writing
    into such a tensor (training the weights) changes this process's copy,
    never the file. Tensors of converted dtypes, and misaligned ones, are
    copies. Do not shorten or rewrite the file in place while tensors
    borrow it or a read is under way: a shortened file kills the process
    with SIGBUS, and pages not yet written here follow the file. Writers
    that truncate and rewrite the same file do that (safetensors' own
    save_file, torch.save); zd_safetensors_write is safe, it makes a new
    file and renames it over the path.

    Writing does what safetensors' own writer (the Python package's
    save_file) does, so that the two write alike: tensors laid out by dtype
    (I64, then F32, then U8: its order, by alignment) then by name, the
    JSON compact with "__metadata__" first, padded with spaces to a
    multiple of 8 bytes. The file is written to a temporary name beside
    path, flushed to disk and renamed over path.

    Bad files are refused with an error naming the file and what is wrong,
    without reading outside it or allocating more than the header's size
    calls for; the limits below bound what a file may ask for. */
#ifndef ZDIST_SAFETENSORS_H
#define ZDIST_SAFETENSORS_H

#include <stdbool.h>

#include <zdist/named_tensors.h>
#include <zdist/strings.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_SAFETENSORS_MAX_HEADER  100000000 /* bytes of JSON: the format's own limit */
#define ZD_SAFETENSORS_MAX_TENSORS 20000     /* tensors in one file */
#define ZD_SAFETENSORS_MAX_NAME    1024      /* bytes of a tensor's name */
#define ZD_SAFETENSORS_MAX_META    4096      /* entries of "__metadata__" */

/*  Reads every tensor of the file, in the order of their data in it: a
    new object (zd_named_tensors_free), or NULL with zd_error_last() naming
    the file and the problem. When meta is non-NULL, *meta receives the
    "__metadata__" entries as key, value, key, value ... (a new object,
    zd_strings_free; empty when there are none; zd_strings_value finds a
    key's value). */
ZD_API zd_named_tensors_t *zd_safetensors_read(const char *path, zd_strings_t **meta);

/*  Writes nt's tensors (float32, int64 or uint8) under their names, and
    meta's strings as "__metadata__" entries: key, value, key, value ...
    (meta NULL or empty: none). Names, keys and values are UTF-8; a name
    may not be "__metadata__", a key may not repeat. Returns 0, or -1
    with zd_error_last() naming the file (path is then left as it was). */
ZD_API int zd_safetensors_write(const zd_named_tensors_t *nt, const char *path,
                                const zd_strings_t *meta);

/*  ---- loading into existing tensors ----

    Loading copies into the existing tensors (not recorded by autograd),
    all or nothing: the file is checked whole before any tensor changes.
    strict: a tensor of the destination missing from the file, or one of
    the file the destination lacks, is an error naming it. Not strict:
    both are skipped, and named in *skipped when skipped is non-NULL (the
    destination's names it left as they were and the file's names it
    ignored, in that order). A tensor of another shape or dtype is an error
    in both modes, as in PyTorch's load_state_dict. F64, F16 and BF16 data
    loads into float32 tensors (converted on reading). Loading must not
    race with forward passes on the same tensors. */

/*  Copies the file's tensors into dst's tensors of the same names, as
    above. 0 with, when skipped is non-NULL, *skipped a new object
    (zd_strings_free) listing the names skipped (empty when none), or -1
    with zd_error_last() naming the file and the tensor (dst untouched). */
ZD_API int zd_safetensors_load(const zd_named_tensors_t *dst, const char *path, bool strict,
                               zd_strings_t **skipped);

ZD_END_DECLS

#endif
