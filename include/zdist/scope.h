/* SPDX-License-Identifier: MIT */
/*  scope.h: scopes for temporary tensors, so that model code does not drop
    every intermediate result by hand, on every way out.

        zd_scope_t *s = zd_scope_begin();
        zd_tensor_t *h, *r, *y = NULL;
        int rc = -1;
        if (zd_nn_linear(x, w1, b1, &h) < 0 || !zd_scope_add(h) ||
            zd_nn_relu(h, &r) < 0 || !zd_scope_add(r) ||
            zd_nn_linear(r, w2, b2, &y) < 0 || !zd_scope_add(y))
            goto out;
        *result = zd_scope_keep(y);   // y leaves the scope with the caller
        rc = 0;
    out:
        zd_scope_end(s);              // drops h and r (and y on failure)
        return rc;

    A scope holds references handed to it with zd_scope_add and drops them
    all, newest first, when it ends. Scopes are per thread and nest: add
    hands to the thread's innermost open scope; keep moves a tensor to the
    enclosing scope (so a function can return a result into its caller's
    scope), or, from the outermost, back to the caller. Graph nodes hold
    their own references to what backward needs, so dropping a forward's
    temporaries at the end of a scope never breaks a later backward.

    Why the tensors are handed over, rather than every tensor created while
    the scope is open being collected: the library itself creates tensors
    and keeps the creation reference (an optimizer's state, a .grad copy, a
    graph node's saved view), and drops temporaries that a graph node holds
    on to; a scope that took those would free what the library still uses.
    A reference handed over is unambiguous.

    Nothing in the tensor functions looks at scopes: with no scope open
    they cost nothing. */
#ifndef ZDIST_SCOPE_H
#define ZDIST_SCOPE_H

#include <stddef.h>

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef struct zd_scope zd_scope_t;

/*  Opens a scope, the calling thread's innermost from now on: a new object
    that zd_scope_end frees. NULL when out of memory. */
ZD_API zd_scope_t *zd_scope_begin(void);

/*  Ends s and the scopes opened inside it that are still open (innermost
    first), dropping every reference they hold, newest first. s must be an
    open scope of the calling thread. Returns 0, or -1 (then nothing
    changed). NULL-safe (returns 0). */
ZD_API int zd_scope_end(zd_scope_t *s);

/*  Hands the caller's reference to t to the thread's innermost scope and
    returns t (borrowed from the scope now). The reference is taken in
    every case: returns NULL, having dropped it, when t is NULL, no scope is
    open on this thread, or out of memory. */
ZD_API zd_tensor_t *zd_scope_add(zd_tensor_t *t);

/*  Takes t (its newest entry) out of the innermost scope that holds it and
    hands the reference to the enclosing scope, or, when that scope is the
    outermost, to the caller. Returns t (borrowed from the enclosing scope,
    or the caller's new reference from the outermost), or NULL (nothing
    changed) when no open scope of this thread holds t or out of memory. */
ZD_API zd_tensor_t *zd_scope_keep(zd_tensor_t *t);

/*  The thread's innermost open scope (borrowed: valid until it ends), or
    NULL. */
ZD_API zd_scope_t *zd_scope_current(void);

/*  Number of references s holds. */
ZD_API size_t zd_scope_len(const zd_scope_t *s);

ZD_END_DECLS

#endif
