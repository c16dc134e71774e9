/* SPDX-License-Identifier: MIT */
/*  args.h: argument lists from a format string (private to rpc/ and the
    tests). Users build with ZD_ARGS and read with ZD_UNPACK (value.h); the
    library's own messages and the tests' hostile frames use these, which
    can also make bytes and none items. */
#ifndef ZDIST_RPC_ARGS_H
#define ZDIST_RPC_ARGS_H

#include <zdist/value.h>

/*  A list built from a printf-like spec:
      'i' int64_t, 'f' double, 's' const char *, 't' zd_tensor_t *,
      'r' zd_rref_t *, 'n' none, 'v' zd_value_t * (reference taken over),
      'b' const void *, size_t (bytes).
    Unchecked: every 'i' is read as an int64_t, so an int is undefined
    behaviour (cast it: (int64_t)3), and 'f' needs a floating value. A new
    reference, or NULL; the 'v' values are released then too (unless the
    spec itself holds an unknown letter). */
zd_value_t *zd__rpc_args(const char *spec, ...);

/*  Unpacks args by a spec, one letter per output: 'i' int64_t *, 'f'
    double *, 's' const char **, 't' zd_tensor_t **, 'r' zd_rref_t **, 'v'
    zd_value_t ** (results borrowed from args). Checks the arity like
    ZD_UNPACK; the pointer types are not checked. 0, or -1. */
int zd__rpc_unpack(const zd_value_t *args, const char *spec, ...);

#endif
