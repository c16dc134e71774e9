/*  dist_fixtures.h: pieces the distributed autograd and optimizer tests
    share. Header-only, so that each test program takes what it uses. */
#ifndef ZDIST_TEST_DIST_FIXTURES_H
#define ZDIST_TEST_DIST_FIXTURES_H

#include "autograd/autograd.h"
#include "rpc/rpc.h"

/*  x * w for the tensor x that is args[0]: what "mul_w" serves. Returns a
    new value (the caller's), or NULL with the error set. */
static inline rpc_value_t *dist_mul_by(rpc_value_t *args, tensor_t *w)
{
    tensor_t *x, *y;
    if (rpc_arg_tensor(args, 0, &x) < 0 || tensor_mul(x, w, &y) < 0)
        return NULL;
    rpc_value_t *v = rpc_value_tensor(y);
    tensor_unref(y);
    return v;
}

#endif
