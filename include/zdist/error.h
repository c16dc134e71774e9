/*  error.h: the last error of the calling thread.

    Every fallible function in the project returns 0 on success and -1 on
    failure (or NULL for constructors) and leaves a human-readable reason here.
    The text is per thread, so concurrent RPC handlers do not overwrite each
    other's messages. */
#ifndef ZDIST_ERROR_H
#define ZDIST_ERROR_H

#include <stdarg.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  Sets the calling thread's last error (printf-style). Always returns -1, so
    that `return zd_error_set("...")` reads naturally. */
ZD_API int zd_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*  Like zd_error_set, but keeps the previous text after a prefix:
    "prefix: previous text". Used to add context while an error travels up. */
ZD_API int zd_error_wrap(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*  The calling thread's last error text; "" when none. Borrowed: valid until
    the thread's next zd_error_set/zd_error_wrap. */
ZD_API const char *zd_error_last(void);

/*  Forgets the calling thread's last error. */
ZD_API void zd_error_clear(void);

ZD_END_DECLS

#endif
