/* SPDX-License-Identifier: MIT */
/*  dataset_cache.h: uint8 IDX files read in place, from a per-host cache of
    their decompressed bytes (dataset_cache.c). For data/dataset.c only. */
#ifndef ZDIST_NN_DATASET_CACHE_H
#define ZDIST_NN_DATASET_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*  A uint8 IDX file open for reading in place: the cache file of a gzip
    source, or a plain source itself. The whole file is mapped read-only
    (shared pages, nothing resident until touched); the elements start at
    map + data_off, and read at that offset of fd too. */
typedef struct {
    int fd;
    int64_t data_off;
    int ndim;
    int64_t dims[8];
    size_t data_bytes;
    void *map;
    size_t map_len;
} zd__idx_view_t;

/*  Opens path (a uint8 IDX file, plain or gzip) as a view, building its
    cache file first when path is gzip and the cache holds no good copy.
    Returns 0 with *v open (close with zd__idx_view_close), or 1 when there
    is no view to be had: the cache is off or unusable, or path is not a
    well-formed uint8 IDX file. Then the caller reads path into memory
    (zd_idx_read), which also says what is wrong with a bad file. Never
    fails otherwise, and leaves the thread's last error as it was. */
int zd__idx_view_open(const char *path, zd__idx_view_t *v);

/*  Closes fd and unmaps (either may already be done: -1 / NULL). */
void zd__idx_view_close(zd__idx_view_t *v);

/*  The cache directory in use: $ZDIST_CACHE_DIR, else
    ${XDG_CACHE_HOME:-$HOME/.cache}/zdist; "" when the cache is off
    (ZDIST_CACHE_DIR=off, or no home). Copies it into buf. */
void zd__dataset_cache_dir(char *buf, size_t size);

/*  Reads exactly n bytes at off (retrying short reads and EINTR): true, or
    false at an error (errno set) or the end of the file (errno as it was). */
bool zd__pread_full(int fd, void *buf, size_t n, off_t off);

#endif
