/* SPDX-License-Identifier: MIT */
/*  bufcache.h: a small cache of large receive buffers (private to rpc/).

    A large tensor that arrives streamed, in pieces sent as separate
    messages (stream.h), is copied into one contiguous buffer taken from
    here, and the buffer comes back here when the tensor dies
    (zd__rpc_bufcache_release is its storage's release callback). Reusing a buffer whose pages are already mapped is what makes
    large tensors fast: a fresh 64 MiB buffer costs 16384 page faults, more
    than the copy into it.

    The cache is process-wide, thread-safe and bounded (RPC_BUFCACHE_MAX_BUFFERS
    buffers, RPC_BUFCACHE_MAX_BYTES in all). It only keeps buffers while it
    is enabled, which the agent does from zd_rpc_init to zd_rpc_shutdown; disabling
    it frees what it holds, and buffers returned afterwards are freed at
    once. Tensors may outlive the agent: their buffers are freed when they
    die. */
#ifndef ZDIST_RPC_BUFCACHE_H
#define ZDIST_RPC_BUFCACHE_H

#include <stdbool.h>
#include <stddef.h>

#define RPC_BUFCACHE_MAX_BUFFERS 4
#define RPC_BUFCACHE_MAX_BYTES   ((size_t)512 << 20)

/*  A buffer of cap >= the requested bytes, page aligned. */
typedef struct rpc_buf {
    void *data;
    size_t cap;
} rpc_buf_t;

/*  A buffer of at least size bytes (size > 0): a cached one when one fits,
    else a new one. Its contents are undefined. Owned by the caller until
    zd__rpc_bufcache_put. NULL (error set) when out of memory. */
rpc_buf_t *zd__rpc_bufcache_get(size_t size);

/*  Gives b back: kept for reuse, or freed. NULL-safe. */
void zd__rpc_bufcache_put(rpc_buf_t *b);

/*  zd_tensor_release_fn for a tensor wrapping b->data: zd__rpc_bufcache_put(arg). */
void zd__rpc_bufcache_release(void *data, void *arg);

/*  Turns caching on or off; off frees every cached buffer. */
void zd__rpc_bufcache_enable(bool on);

/*  Counters since the process started, for tests and benchmarks: buffers
    handed out from the cache (hits) and newly made (misses), and what the
    cache holds now. Any pointer may be NULL. */
void zd__rpc_bufcache_stats(long *hits, long *misses, int *cached, size_t *cached_bytes);

#endif
