/* SPDX-License-Identifier: MIT */
/*  blocks.c: the memory of large tensors.

    glibc serves blocks below its mmap threshold (32 MB once nn's allocator
    set-up ran) from heaps it shares with every small allocation. A server
    whose trainers' batches live and die out of step (activations of 1 to
    5 MB each) fragments those heaps, and memory freed in their middle is
    never given back: rpc_ps's server of 1 + 16 trainers held 108 MB at its
    peak and was 270 MB resident, 100 MB more than with 4 trainers for 8 MB
    more data. Blocks above the threshold are fresh mappings instead, whose
    pages the kernel faults in and zeroes on first touch: about 30 % of a
    training step.

    So a large tensor's block (ZD_BLOCK_MIN bytes and more) is a mapping of
    its own, its size rounded up to one of eight classes per power of two.
    Freed, it waits among the idle blocks, pages still mapped, for the next
    request: of its class first (the last freed first: its pages are the
    likeliest in cache), else the smallest at most twice the request's
    size, so that a step that allocates what the last one freed finds it
    mapped. A request none fits first unmaps, the oldest first, idle blocks
    no request took for BLOCKS_STALE requests (up to its own size): what
    the process has mapped then follows what it holds, as the server's
    phases change, without unmapping what the next step wants back (doing
    that on every miss halved a local training step). The idle blocks are
    also bounded (BLOCKS_IDLE_BYTES, BLOCKS_IDLE_COUNT).

    Under AddressSanitizer nothing is kept: a block is unmapped when freed,
    so that a use after free still faults. */
#define _GNU_SOURCE
#include "core/blocks.h"
#include "core/fault_inject.h"

#include <pthread.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define BLOCKS_IDLE_BYTES ((size_t)256 << 20)
#define BLOCKS_IDLE_COUNT 64
#define BLOCKS_STALE      256

typedef struct {
    void *data;
    size_t size;
    uint64_t freed_at; /* blocks.clock then */
} idle_t;

static struct {
    pthread_mutex_t lock;
    idle_t idle[BLOCKS_IDLE_COUNT]; /* oldest first */
    int n;
    size_t bytes;
    uint64_t clock; /* requests so far */
} blocks = {.lock = PTHREAD_MUTEX_INITIALIZER};

/*  The class of a block of `bytes` (>= ZD_BLOCK_MIN): rounded up to a
    multiple of an eighth of the power of two below it (whole pages, then). */
static size_t class_size(size_t bytes)
{
    int log2 = 63 - __builtin_clzll((unsigned long long)bytes);
    size_t step = (size_t)1 << (log2 - 3);
    return (bytes + step - 1) / step * step;
}

/*  Removes idle block i (under the lock). */
static idle_t take(int i)
{
    idle_t b = blocks.idle[i];
    blocks.bytes -= b.size;
    memmove(&blocks.idle[i], &blocks.idle[i + 1], sizeof b * (size_t)(blocks.n - i - 1));
    blocks.n--;
    return b;
}

/*  The idle block to reuse for a block of class size, or -1 (under the
    lock). */
static int fit(size_t size)
{
    int best = -1;
    for (int i = blocks.n - 1; i >= 0; i--) {
        size_t s = blocks.idle[i].size;
        if (s == size)
            return i;
        if (s > size && s / 2 <= size && (best < 0 || s < blocks.idle[best].size))
            best = i;
    }
    return best;
}

/*  A fork while another thread holds the lock would leave the child's copy
    locked for good: the lock is taken around fork, as malloc's are. */
static void fork_lock(void)
{
    pthread_mutex_lock(&blocks.lock);
}

static void fork_unlock(void)
{
    pthread_mutex_unlock(&blocks.lock);
}

static void install_fork_handlers(void)
{
    pthread_atfork(fork_lock, fork_unlock, fork_unlock);
}

void *zd__block_alloc(size_t bytes, size_t *size)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, install_fork_handlers);
    size_t want = class_size(bytes);
    idle_t gone[BLOCKS_IDLE_COUNT];
    int n_gone = 0;
    size_t freed = 0;
    pthread_mutex_lock(&blocks.lock);
    blocks.clock++;
    int i = fit(want);
    if (i >= 0) {
        idle_t b = take(i);
        pthread_mutex_unlock(&blocks.lock);
        *size = b.size;
        return b.data;
    }
    while (blocks.n > 0 && freed < want && blocks.clock - blocks.idle[0].freed_at > BLOCKS_STALE) {
        gone[n_gone] = take(0);
        freed += gone[n_gone++].size;
    }
    pthread_mutex_unlock(&blocks.lock);
    for (int k = 0; k < n_gone; k++)
        munmap(gone[k].data, gone[k].size);
#ifdef ZDIST_FAULT_INJECT
    if (zd__fault_fail())
        return NULL;
#endif
    void *data = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
        return NULL;
    *size = want;
    return data;
}

void zd__block_free(void *data, size_t size)
{
    if (!data)
        return;
    idle_t gone[BLOCKS_IDLE_COUNT + 1];
    int n_gone = 0;
    pthread_mutex_lock(&blocks.lock);
    if (!ZD_BLOCKS_KEEP || size > BLOCKS_IDLE_BYTES) {
        gone[n_gone++] = (idle_t){data, size, 0};
    } else {
        while (blocks.n > 0 &&
               (blocks.n >= BLOCKS_IDLE_COUNT || blocks.bytes + size > BLOCKS_IDLE_BYTES))
            gone[n_gone++] = take(0);
        blocks.idle[blocks.n++] = (idle_t){data, size, blocks.clock};
        blocks.bytes += size;
    }
    pthread_mutex_unlock(&blocks.lock);
    for (int i = 0; i < n_gone; i++)
        munmap(gone[i].data, gone[i].size);
}

/*  Kernels' scratch and what a graph keeps beside its tensors (a
    pooling's argmax) come and go with the activations, from 64 kB to a
    few MB, and fragmented malloc's heaps as much: in blocks, rpc_ps's
    server of 16 trainers peaked about 40 MB lower. The 64 bytes before
    the memory hold the block's size (0: malloc's). A block's memory
    starts MEM_OFFSET into its first page: at the start of a page (plus
    the 64), it shared its cache sets with the page-aligned tensors a
    kernel streams beside it, and a local training step of the Net was
    about 4 % slower. */
#define MEM_ALIGN  64
#define MEM_OFFSET (1024 + MEM_ALIGN)

void *zd__mem_alloc(size_t bytes)
{
    if (bytes > SIZE_MAX - MEM_OFFSET)
        return NULL;
    size_t size = 0;
    char *base = NULL, *p;
    if (bytes >= ZD_MEM_BLOCK_MIN) {
        size_t want = bytes + MEM_OFFSET < ZD_BLOCK_MIN ? ZD_BLOCK_MIN : bytes + MEM_OFFSET;
        if (!(base = zd__block_alloc(want, &size)))
            return NULL;
        p = base + MEM_OFFSET;
    } else {
        void *m = NULL;
        if (posix_memalign(&m, MEM_ALIGN, bytes + MEM_ALIGN) != 0)
            return NULL;
        p = (char *)m + MEM_ALIGN;
    }
    memcpy(p - MEM_ALIGN, &size, sizeof size);
    return p;
}

void zd__mem_free(void *p)
{
    if (!p)
        return;
    size_t size;
    memcpy(&size, (char *)p - MEM_ALIGN, sizeof size);
    if (size)
        zd__block_free((char *)p - MEM_OFFSET, size);
    else
        free((char *)p - MEM_ALIGN);
}

void zd__blocks_trim(void)
{
    pthread_mutex_lock(&blocks.lock);
    idle_t gone[BLOCKS_IDLE_COUNT];
    int n = blocks.n;
    memcpy(gone, blocks.idle, sizeof gone[0] * (size_t)n);
    blocks.n = 0;
    blocks.bytes = 0;
    pthread_mutex_unlock(&blocks.lock);
    for (int i = 0; i < n; i++)
        munmap(gone[i].data, gone[i].size);
}

size_t zd__blocks_idle_bytes(void)
{
    pthread_mutex_lock(&blocks.lock);
    size_t b = blocks.bytes;
    pthread_mutex_unlock(&blocks.lock);
    return b;
}
