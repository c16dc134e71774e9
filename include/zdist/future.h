/* SPDX-License-Identifier: MIT */
/*  future.h: a value that becomes available later.

    A future completes once, with either a value or an error (a text and a
    zd_error_code_t). Waiters block, by default without limit (the call
    behind a future carries its own timeout); a pool thread that waits lets
    the RPC pool start another thread meanwhile, so handlers may wait too.
    Callbacks added with zd_future_then run exactly once, on the thread
    that completes the future (or at once on the calling thread if it is
    already complete), so they must not block.

    Reference counted: the creator and every holder keep a reference; the
    future lives until the last one is dropped. */
#ifndef ZDIST_RPC_FUTURE_H
#define ZDIST_RPC_FUTURE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/error.h>
#include <zdist/value.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_future zd_future_t;

/*  Called when the future completes; `arg` is the pointer given to _then. */
typedef void(zd_future_fn)(zd_future_t *f, void *arg);

/*  A new incomplete future (a new reference), or NULL when out of memory. */
ZD_API zd_future_t *zd_future_new(void);

/*  zd_future_ref takes one more reference and returns f (the new reference);
    zd_future_unref drops one. Both NULL-safe. */
ZD_API zd_future_t *zd_future_ref(zd_future_t *f);
ZD_API void zd_future_unref(zd_future_t *f);

/*  Completes f with value (a reference is taken) or with an error text
    (copied; code ZD_ERR_OTHER, or the given code). Only the first
    completion counts: later ones return -1 and change nothing. Runs the
    callbacks. */
ZD_API int zd_future_set_value(zd_future_t *f, zd_value_t *value);
ZD_API int zd_future_set_error(zd_future_t *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
ZD_API int zd_future_set_error_code(zd_future_t *f, zd_error_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*  Waits until f completes or timeout_ms passes (ZD_TIMEOUT_DEFAULT and
    ZD_TIMEOUT_NONE: no limit). Returns 0 when f completed with a value, -1
    when it failed (zd_error_last() and zd_error_code() hold its error) or
    timed out ("timed out after N ms", ZD_ERR_TIMEOUT). To look without
    waiting, use zd_future_done. */
ZD_API int zd_future_wait(zd_future_t *f, int64_t timeout_ms);

/*  True once f completed (with a value or an error); never waits. */
ZD_API bool zd_future_done(const zd_future_t *f);

/*  The value of a completed future and its error text ("" if none), both
    borrowed: valid while f lives. The value is NULL if failed or pending. */
ZD_API zd_value_t *zd_future_value(const zd_future_t *f);
ZD_API const char *zd_future_error(const zd_future_t *f);

/*  The code of a failed future's error; ZD_OK if it has a value or is
    pending. */
ZD_API zd_error_code_t zd_future_error_code(const zd_future_t *f);

/*  Runs cb(f, arg) once f completes. Returns 0, or -1 when out of memory. */
ZD_API int zd_future_then(zd_future_t *f, zd_future_fn *cb, void *arg);

/*  Waits for all futures (up to timeout_ms in total; default: no limit).
    Returns 0 when all completed with values, else -1 with the first error
    found or the timeout. */
ZD_API int zd_future_wait_all(zd_future_t *const *fs, int n, int64_t timeout_ms);

/*  Waits until any future completes (up to timeout_ms; default: no limit);
    sets *index to the first completed one. Returns 0 (whether that future
    holds a value or an error: check it), or -1 on timeout. */
ZD_API int zd_future_wait_any(zd_future_t *const *fs, int n, int64_t timeout_ms, int *index);

/*  A new future (a new reference) that completes once all n futures have
    (PyTorch's torch.futures.collect_all, except that it completes with the
    values, not the futures): with a list of their values
    in order (n == 0: an empty list, at once), or, when any failed, with the
    error (text and code) of the first to fail. The futures are not held:
    dropping one before it completes counts as its failure. NULL on a bad
    array or out of memory. */
ZD_API zd_future_t *zd_future_collect_all(zd_future_t *const *fs, int n);

ZD_END_DECLS

#endif
