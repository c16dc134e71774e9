/* SPDX-License-Identifier: MIT */
/*  fault_inject.h: allocation failure injection, SQLite's way (private).

    Built with -DZDIST_FAULT_INJECT=ON, every library source is compiled
    with -include of this header (CMakeLists.txt, zd_layer): the macros below
    send the library's allocations (malloc and its kin, the ZeroMQ messages
    it makes itself) through one counter per thread, and a test arms it so
    that the N-th allocation of its thread fails (tests/test_fault_alloc.c
    runs each scenario for N = 1, 2, 3, ... until nothing fails). The
    counter is per thread so that a failure surfaces as the error of the
    call the test made, not as a message lost on the I/O thread. Allocators
    the macros cannot reach ask zd__fault_fail() (core/blocks.c; jansson's,
    through its allocator hook, in data/safetensors.c).

    Not routed: czmq's (the rendezvous at init, the membership and ZAP
    threads: never the thread of a call, and czmq aborts when its own
    allocations fail) and the C library's internal ones (FILE buffers).

    Without ZDIST_FAULT_INJECT this header is empty. fault_inject.c and the
    test driver define ZD_FAULT_INJECT_API_ONLY: the functions, no macros. */
#ifndef ZDIST_FAULT_INJECT_H
#define ZDIST_FAULT_INJECT_H

#ifdef ZDIST_FAULT_INJECT
/*  This header comes before a source's first line: the sources that want
    _GNU_SOURCE (pthread_timedjoin_np, asprintf...) must still get it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>
/*  <features.h> defined it as 1 for _GNU_SOURCE: a source defining it
    again (empty) would redefine it. Its work is done. */
#undef _DEFAULT_SOURCE

/*  The n-th allocation of the calling thread from now on fails (once);
    n = 0 disarms. Resets the count and the fired flag. */
void zd__fault_arm(long n);
/*  Allocations of the calling thread since it was last armed. */
long zd__fault_count(void);
/*  Whether the armed failure happened. */
bool zd__fault_fired(void);
/*  Counts one allocation of the calling thread: true when it must fail. */
bool zd__fault_fail(void);
/*  Brackets allocations whose failure the code survives by design (a
    cache, a name for messages, a faster path): a call may then succeed
    although the failure happened (SQLite's benign mallocs). Nests. */
void zd__fault_benign(bool begin);
/*  Whether the failure that happened was inside such brackets. */
bool zd__fault_fired_benign(void);

void *zd__fi_malloc(size_t n);
void *zd__fi_calloc(size_t n, size_t size);
void *zd__fi_realloc(void *p, size_t n);
char *zd__fi_strdup(const char *s);
char *zd__fi_strndup(const char *s, size_t n);
void *zd__fi_aligned_alloc(size_t align, size_t n);
int zd__fi_posix_memalign(void **p, size_t align, size_t n);
int zd__fi_asprintf(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
FILE *zd__fi_open_memstream(char **buf, size_t *len);
int zd__fi_zmq_msg_init_size(zmq_msg_t *m, size_t n);
int zd__fi_zmq_msg_init_data(zmq_msg_t *m, void *data, size_t n, zmq_free_fn *ffn, void *hint);

#ifndef ZD_FAULT_INJECT_API_ONLY
#define malloc(n)                                zd__fi_malloc(n)
#define calloc(n, size)                          zd__fi_calloc(n, size)
#define realloc(p, n)                            zd__fi_realloc(p, n)
#define strdup(s)                                zd__fi_strdup(s)
#define strndup(s, n)                            zd__fi_strndup(s, n)
#define aligned_alloc(align, n)                  zd__fi_aligned_alloc(align, n)
#define posix_memalign(p, align, n)              zd__fi_posix_memalign(p, align, n)
#define asprintf(...)                            zd__fi_asprintf(__VA_ARGS__)
#define open_memstream(buf, len)                 zd__fi_open_memstream(buf, len)
#define zmq_msg_init_size(m, n)                  zd__fi_zmq_msg_init_size(m, n)
#define zmq_msg_init_data(m, data, n, ffn, hint) zd__fi_zmq_msg_init_data(m, data, n, ffn, hint)
#endif

#endif /* ZDIST_FAULT_INJECT */

/*  zd__fault_benign for library code, nothing without injection. */
#ifdef ZDIST_FAULT_INJECT
#define ZD_FAULT_BENIGN(begin) zd__fault_benign(begin)
#else
#define ZD_FAULT_BENIGN(begin) ((void)0)
#endif

#endif
