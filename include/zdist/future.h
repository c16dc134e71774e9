/*  future.h: a value that becomes available later (SPEC R3).

    A future completes once, with either a value or an error text. Waiters
    block with a timeout; callbacks added with zd_future_then run exactly
    once, on the thread that completes the future (or at once on the calling
    thread if it is already complete), so they must not block.

    Reference counted: the creator and every holder keep a reference; the
    future lives until the last one is dropped. */
#ifndef ZDIST_RPC_FUTURE_H
#define ZDIST_RPC_FUTURE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/value.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_future zd_future_t;

/*  Called when the future completes; `arg` is the pointer given to _then. */
typedef void (zd_future_cb)(zd_future_t *f, void *arg);

/*  A new incomplete future (one reference), or NULL when out of memory. */
ZD_API zd_future_t *zd_future_new(void);

ZD_API zd_future_t *zd_future_ref(zd_future_t *f);
ZD_API void zd_future_unref(zd_future_t *f);

/*  Completes f with value (a reference is taken) or with an error text
    (copied). Only the first completion counts: later ones return -1 and
    change nothing. Runs the callbacks. */
ZD_API int zd_future_set_value(zd_future_t *f, zd_value_t *value);
ZD_API int zd_future_set_error(zd_future_t *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/*  Waits until f completes or timeout_ms passes (< 0: no limit). Returns 0
    when f completed with a value, -1 when it failed (zd_error_last() holds its
    error text) or timed out ("timed out after N ms"). */
ZD_API int zd_future_wait(zd_future_t *f, int64_t timeout_ms);

ZD_API bool zd_future_done(const zd_future_t *f);

/*  The value of a completed future (borrowed; NULL if failed or pending),
    and its error text ("" if none). */
ZD_API zd_value_t *zd_future_value(const zd_future_t *f);
ZD_API const char *zd_future_error(const zd_future_t *f);

/*  Runs cb(f, arg) once f completes. Returns 0, or -1 when out of memory. */
ZD_API int zd_future_then(zd_future_t *f, zd_future_cb *cb, void *arg);

/*  Waits for all futures (up to timeout_ms in total). Returns 0 when all
    completed with values, else -1 with the first error or the timeout. */
ZD_API int zd_future_wait_all(zd_future_t *const *fs, int n, int64_t timeout_ms);

/*  Waits until any future completes; sets *index to the first completed one.
    Returns 0 (whether that future holds a value or an error: check it), or
    -1 on timeout. */
ZD_API int zd_future_wait_any(zd_future_t *const *fs, int n, int64_t timeout_ms, int *index);

ZD_END_DECLS

#endif
