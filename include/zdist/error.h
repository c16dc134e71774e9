/* SPDX-License-Identifier: MIT */
/*  error.h: the last error of the calling thread, and the timeout
    convention every layer shares.

    Every fallible function in the project returns 0 on success and -1 on
    failure (or NULL for constructors) and leaves a human-readable reason here,
    with a code saying what kind of failure it was (zd_error_code), for
    programs that must react to a timeout or a lost peer without reading the
    text. Text and code are per thread, so concurrent RPC handlers do not
    overwrite each other's errors. */
#ifndef ZDIST_ERROR_H
#define ZDIST_ERROR_H

#include <stdarg.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  Every public function taking `int64_t timeout_ms` reads it the same way:
    ZD_TIMEOUT_DEFAULT (any negative value) is that function's documented
    default, ZD_TIMEOUT_NONE (0) is no limit (as in PyTorch), and a positive
    value is that many milliseconds. */
#define ZD_TIMEOUT_DEFAULT (-1)
#define ZD_TIMEOUT_NONE    0

/*  What kind of failure the thread's last error is. */
typedef enum {
    ZD_OK = 0,
    ZD_ERR_OTHER,           /* anything not listed below */
    ZD_ERR_TIMEOUT,         /* a timeout passed */
    ZD_ERR_PEER,            /* the peer is unreachable, or was lost */
    ZD_ERR_REMOTE,          /* the remote handler failed (its text follows) */
    ZD_ERR_NO_FUNCTION,     /* the peer has no function of that name */
    ZD_ERR_ARGUMENT,        /* a bad argument: NULL, bad rank, unknown worker name... */
    ZD_ERR_NOT_INITIALIZED, /* RPC is not running, or a module's init call is missing */
    ZD_ERR_NO_MEMORY,       /* out of memory */
    ZD_ERR_SHUTDOWN,        /* RPC shut down (or is shutting down) under the call */
    ZD_ERR_STALE,           /* refused as stale: computed on parameters too old (ps.h) */
    ZD_ERR_STOPPED,         /* the server was told to stop (ps.h) */
} zd_error_code_t;

/*  Sets the calling thread's last error (printf-style). Always returns -1, so
    that `return zd_error_set("...")` reads naturally. The code is
    ZD_ERR_OTHER. */
ZD_API int zd_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*  Like zd_error_set, with the given code. Always returns -1. */
ZD_API int zd_error_set_code(zd_error_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*  Like zd_error_set, but keeps the previous text after a prefix:
    "prefix: previous text", and keeps the previous code (ZD_ERR_OTHER when
    there was no error). Used to add context while an error travels up. */
ZD_API int zd_error_wrap(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*  The calling thread's last error text; "" when none. Borrowed: valid until
    the thread's next zd_error_set/zd_error_wrap. */
ZD_API const char *zd_error_last(void);

/*  The code of the calling thread's last error; ZD_OK when none. */
ZD_API zd_error_code_t zd_error_code(void);

/*  A short name for code: "timeout", "peer", ... ("ok" for ZD_OK). Static. */
ZD_API const char *zd_error_code_name(zd_error_code_t code);

/*  Forgets the calling thread's last error (text and code). */
ZD_API void zd_error_clear(void);

ZD_END_DECLS

#endif
