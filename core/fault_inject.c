/* SPDX-License-Identifier: MIT */
/*  fault_inject.c: the allocators behind fault_inject.h's macros, built with
    -DZDIST_FAULT_INJECT=ON only. The cost is a check of a thread-local
    counter per allocation. */
#include "core/fault_inject.h"

#include <errno.h>
#include <execinfo.h>
#include <stdarg.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

static _Thread_local long armed; /* the allocation that fails; 0: none */
static _Thread_local long count; /* allocations since armed */
static _Thread_local bool fired;
static _Thread_local int benign; /* depth of zd__fault_benign brackets */
static _Thread_local bool fired_benign;

void zd__fault_arm(long n)
{
    armed = n > 0 ? n : 0;
    count = 0;
    fired = false;
    fired_benign = false;
}

long zd__fault_count(void)
{
    return count;
}

bool zd__fault_fired(void)
{
    return fired;
}

void zd__fault_benign(bool begin)
{
    benign += begin ? 1 : -1;
}

bool zd__fault_fired_benign(void)
{
    return fired_benign;
}

bool zd__fault_fail(void)
{
    if (!armed)
        return false;
    if (++count != armed)
        return false;
    fired = true;
    fired_benign = benign > 0;
    /* ZDIST_FAULT_STACK=N (or "all"): where failing allocation N was asked for. */
    const char *stack = getenv("ZDIST_FAULT_STACK");
    if (stack && (strcmp(stack, "all") == 0 || atol(stack) == count)) {
        fprintf(stderr, "fault_inject: allocation %ld fails here:\n", count);
#if defined(__SANITIZE_ADDRESS__)
        __sanitizer_print_stack_trace();
#else
        void *frames[32];
        backtrace_symbols_fd(frames, backtrace(frames, 32), STDERR_FILENO);
#endif
    }
    errno = ENOMEM;
    return true;
}

void *zd__fi_malloc(size_t n)
{
    return zd__fault_fail() ? NULL : malloc(n);
}

void *zd__fi_calloc(size_t n, size_t size)
{
    return zd__fault_fail() ? NULL : calloc(n, size);
}

void *zd__fi_realloc(void *p, size_t n)
{
    return zd__fault_fail() ? NULL : realloc(p, n);
}

char *zd__fi_strdup(const char *s)
{
    return zd__fault_fail() ? NULL : strdup(s);
}

char *zd__fi_strndup(const char *s, size_t n)
{
    return zd__fault_fail() ? NULL : strndup(s, n);
}

void *zd__fi_aligned_alloc(size_t align, size_t n)
{
    return zd__fault_fail() ? NULL : aligned_alloc(align, n);
}

int zd__fi_posix_memalign(void **p, size_t align, size_t n)
{
    return zd__fault_fail() ? ENOMEM : posix_memalign(p, align, n);
}

int zd__fi_asprintf(char **out, const char *fmt, ...)
{
    if (zd__fault_fail())
        return -1;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(out, fmt, ap);
    va_end(ap);
    return n;
}

FILE *zd__fi_open_memstream(char **buf, size_t *len)
{
    return zd__fault_fail() ? NULL : open_memstream(buf, len);
}

int zd__fi_zmq_msg_init_size(zmq_msg_t *m, size_t n)
{
    return zd__fault_fail() ? -1 : zmq_msg_init_size(m, n);
}

int zd__fi_zmq_msg_init_data(zmq_msg_t *m, void *data, size_t n, zmq_free_fn *ffn, void *hint)
{
    return zd__fault_fail() ? -1 : zmq_msg_init_data(m, data, n, ffn, hint);
}
