/* SPDX-License-Identifier: MIT */
/*  dist_fixtures.h: pieces the distributed autograd and optimizer tests
    share. Header-only, so that each test program takes what it uses. */
#ifndef ZDIST_TEST_DIST_FIXTURES_H
#define ZDIST_TEST_DIST_FIXTURES_H

#include <zdist/autograd.h>
#include <zdist/rpc.h>

/*  x * w for the tensor x that is args[0]: what "mul_w" serves. Returns a
    new value (the caller's), or NULL with the error set. */
static inline zd_value_t *dist_mul_by(zd_value_t *args, zd_tensor_t *w)
{
    zd_tensor_t *x, *y;
    if (zd_rpc_arg_tensor(args, 0, &x) < 0 || zd_tensor_mul(x, w, &y) < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(y);
    zd_tensor_unref(y);
    return v;
}

#endif
