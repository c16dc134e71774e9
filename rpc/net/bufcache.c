/* SPDX-License-Identifier: MIT */
/*  bufcache.c: the cache of large receive buffers (bufcache.h).

    Buffers are anonymous mappings rounded up to 2 MiB and advised for
    transparent huge pages (this machine runs THP in "madvise" mode): a
    fresh buffer then takes 32 faults instead of 16384 per 64 MiB, and the
    copy into it and the math on it miss the TLB less. The cache is a short
    list in order of return; a full cache drops the buffer returned longest
    ago. A request takes the smallest cached buffer that fits it without
    wasting more than half the request's size. */
#define _DEFAULT_SOURCE
#include "rpc/net/bufcache.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <zdist/error.h>

#define BUF_ALIGN ((size_t)2 << 20)
#define PAGE      ((size_t)4096)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static rpc_buf_t *cached[RPC_BUFCACHE_MAX_BUFFERS]; /* oldest first */
static int n_cached;
static size_t cached_bytes;
static bool enabled;
static long n_hits, n_misses;

static void buf_free(rpc_buf_t *b)
{
    munmap(b->data, b->cap);
    free(b);
}

/*  The size of a buffer for size bytes: whole huge pages from 2 MiB on. */
static size_t rounded(size_t size)
{
    size_t align = size >= BUF_ALIGN ? BUF_ALIGN : PAGE;
    return (size + align - 1) / align * align;
}

static rpc_buf_t *buf_new(size_t size)
{
    if (size > SIZE_MAX - BUF_ALIGN) {
        zd_error_set("bufcache: %zu bytes is too large", size);
        return NULL;
    }
    rpc_buf_t *b = malloc(sizeof *b);
    if (!b) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "bufcache: out of memory");
        return NULL;
    }
    b->cap = rounded(size);
    b->data = mmap(NULL, b->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->data == MAP_FAILED) {
        zd_error_set("bufcache: cannot map %zu bytes", b->cap);
        free(b);
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    if (b->cap >= BUF_ALIGN)
        madvise(b->data, b->cap, MADV_HUGEPAGE); /* advice: failure is harmless */
#endif
    return b;
}

/*  Removes entry i, keeping the order of the others. Locked. */
static rpc_buf_t *take(int i)
{
    rpc_buf_t *b = cached[i];
    for (int k = i; k + 1 < n_cached; k++)
        cached[k] = cached[k + 1];
    n_cached--;
    cached_bytes -= b->cap;
    return b;
}

rpc_buf_t *zd__rpc_bufcache_get(size_t size)
{
    rpc_buf_t *b = NULL;
    pthread_mutex_lock(&lock);
    int best = -1;
    size_t want = rounded(size);
    for (int i = 0; i < n_cached; i++) {
        size_t cap = cached[i]->cap;
        if (cap >= want && cap - want <= want / 2 && (best < 0 || cap < cached[best]->cap))
            best = i;
    }
    if (best >= 0) {
        b = take(best);
        n_hits++;
    } else {
        n_misses++;
    }
    pthread_mutex_unlock(&lock);
    return b ? b : buf_new(size);
}

void zd__rpc_bufcache_put(rpc_buf_t *b)
{
    if (!b)
        return;
    rpc_buf_t *drop[RPC_BUFCACHE_MAX_BUFFERS + 1];
    int n_drop = 0;
    pthread_mutex_lock(&lock);
    if (!enabled || b->cap > RPC_BUFCACHE_MAX_BYTES) {
        drop[n_drop++] = b;
    } else {
        while (n_cached == RPC_BUFCACHE_MAX_BUFFERS ||
               cached_bytes + b->cap > RPC_BUFCACHE_MAX_BYTES)
            drop[n_drop++] = take(0);
        cached[n_cached++] = b;
        cached_bytes += b->cap;
    }
    pthread_mutex_unlock(&lock);
    /* Unmapping 64 MiB takes a while: not under the lock. */
    for (int i = 0; i < n_drop; i++)
        buf_free(drop[i]);
}

void zd__rpc_bufcache_release(void *data, void *arg)
{
    (void)data;
    zd__rpc_bufcache_put(arg);
}

void zd__rpc_bufcache_enable(bool on)
{
    rpc_buf_t *drop[RPC_BUFCACHE_MAX_BUFFERS];
    int n_drop = 0;
    pthread_mutex_lock(&lock);
    enabled = on;
    if (!on)
        while (n_cached > 0)
            drop[n_drop++] = take(0);
    pthread_mutex_unlock(&lock);
    for (int i = 0; i < n_drop; i++)
        buf_free(drop[i]);
}

void zd__rpc_bufcache_stats(long *hits, long *misses, int *n, size_t *bytes)
{
    pthread_mutex_lock(&lock);
    if (hits)
        *hits = n_hits;
    if (misses)
        *misses = n_misses;
    if (n)
        *n = n_cached;
    if (bytes)
        *bytes = cached_bytes;
    pthread_mutex_unlock(&lock);
}
