/* SPDX-License-Identifier: MIT */
/*  blocks.h: large tensors' memory, mappings kept for reuse once freed
    (the allocator under tensor.c). */
#ifndef ZDIST_CORE_BLOCKS_H
#define ZDIST_CORE_BLOCKS_H

#include <stddef.h>

/*  Large tensors' memory (blocks.c): a tensor of ZD_BLOCK_MIN bytes or more
    gets a mapping of its own, reused once freed. */
#define ZD_BLOCK_MIN ((size_t)256 << 10)
/*  1 when freed blocks are kept for reuse; 0 under AddressSanitizer, so
    that a use after free still faults. */
#if defined(__SANITIZE_ADDRESS__)
#define ZD_BLOCKS_KEEP 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZD_BLOCKS_KEEP 0
#endif
#endif
#ifndef ZD_BLOCKS_KEEP
#define ZD_BLOCKS_KEEP 1
#endif

/*  At least bytes (>= ZD_BLOCK_MIN) of page-aligned memory, contents
    undefined, its whole size in *size; NULL when out of memory. */
void *zd__block_alloc(size_t bytes, size_t *size);
/*  Gives back a block of zd__block_alloc and its *size. NULL-safe. */
void zd__block_free(void *data, size_t size);
/*  At least bytes of 64-byte-aligned scratch memory, contents undefined:
    a block (of ZD_BLOCK_MIN bytes at least: the pages never touched cost
    nothing) for ZD_MEM_BLOCK_MIN bytes and more, else malloc's; give it
    back with zd__mem_free. NULL when out of memory. */
#define ZD_MEM_BLOCK_MIN ((size_t)64 << 10)
void *zd__mem_alloc(size_t bytes);
/*  Gives back zd__mem_alloc's memory. NULL-safe. */
void zd__mem_free(void *p);
/*  Bytes of the idle blocks kept for reuse (tests). */
size_t zd__blocks_idle_bytes(void);
/*  Unmaps every idle block (tests). */
void zd__blocks_trim(void);

#endif
