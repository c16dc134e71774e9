/* SPDX-License-Identifier: MIT */
/*  safetensors_private.h: the safetensors reader and writer without the
    file around them (data/safetensors.c), for the file functions and for
    tools/fuzz_safetensors.c, which hands the reader exact-size heap copies
    of its inputs so that AddressSanitizer sees any read past the end. */
#ifndef ZDIST_NN_SAFETENSORS_PRIVATE_H
#define ZDIST_NN_SAFETENSORS_PRIVATE_H

#include <stddef.h>
#include <stdio.h>

#include <zdist/safetensors.h>

/*  Called once with the parsed bytes when the parse is over and the last
    tensor borrowing them is gone. */
typedef void(zd__safetensors_release_fn)(void *data, size_t size);

/*  Reads size bytes at data as a whole safetensors file (label names it in
    errors), as zd_safetensors_read reads a file. Takes data in every case:
    tensors borrow it where aligned, and release(data, size) runs when the
    last of them, or the parse, is done. */
zd_named_tensors_t *zd__safetensors_parse(const char *label, void *data, size_t size,
                                          zd__safetensors_release_fn *release, zd_strings_t **meta);

/*  Writes the bytes of a safetensors file to f, as zd_safetensors_write
    does (label names the file in errors): 0, or -1. */
int zd__safetensors_write_stream(FILE *f, const char *label, const zd_named_tensors_t *nt,
                                 const zd_strings_t *meta);

#endif
