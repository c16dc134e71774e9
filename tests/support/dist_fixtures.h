/* SPDX-License-Identifier: MIT */
/*  dist_fixtures.h: pieces the distributed autograd and optimizer tests
    share. Header-only, so that each test program takes what it uses. */
#ifndef ZDIST_TEST_DIST_FIXTURES_H
#define ZDIST_TEST_DIST_FIXTURES_H

#include <zdist/autograd.h>
#include <zdist/dist_optim.h>
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

/*  A new list of the n RRefs (borrowed), for zd_dist_optim_new; NULL on
    failure. */
static inline zd_rref_list_t *dist_rref_list(zd_rref_t *const *rrefs, int n)
{
    zd_rref_list_t *l = zd_rref_list_new();
    for (int i = 0; l && i < n; i++)
        if (zd_rref_list_append(l, rrefs[i]) < 0) {
            zd_rref_list_free(l);
            l = NULL;
        }
    return l;
}

/*  zd_dist_optim_new over the n RRefs (borrowed). */
static inline zd_dist_optim_t *dist_optim_over(const zd_optim_config_t *cfg,
                                               zd_rref_t *const *rrefs, int n)
{
    zd_rref_list_t *l = dist_rref_list(rrefs, n);
    zd_dist_optim_t *opt = l ? zd_dist_optim_new(cfg, l) : NULL;
    zd_rref_list_free(l);
    return opt;
}

#endif
