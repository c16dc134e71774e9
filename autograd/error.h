/*  error.h: the last error of the calling thread.

    Every fallible function in the project returns 0 on success and -1 on
    failure (or NULL for constructors) and leaves a human-readable reason here.
    The text is per thread, so concurrent RPC handlers do not overwrite each
    other's messages. */
#ifndef ZDIST_ERROR_H
#define ZDIST_ERROR_H

#include <stdarg.h>

/*  Sets the calling thread's last error (printf-style). Always returns -1, so
    that `return error_set("...")` reads naturally. */
int error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*  Like error_set, but keeps the previous text after a prefix:
    "prefix: previous text". Used to add context while an error travels up. */
int error_wrap(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*  The calling thread's last error text; "" when none. Borrowed: valid until
    the thread's next error_set/error_wrap. */
const char *error_last(void);

/*  Forgets the calling thread's last error. */
void error_clear(void);

#endif
