/* SPDX-License-Identifier: MIT */
/*  parameter_rrefs.c: RRefs to a module's parameters, the list the
    DistributedOptimizer takes (PyTorch's _parameter_rrefs). */
#include <zdist/dist_nn.h>
#include <zdist/error.h>

zd_rref_list_t *zd_dist_nn_parameter_rrefs(const zd_nn_module_t *m)
{
    if (!m) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dist_nn_parameter_rrefs: NULL module");
        return NULL;
    }
    zd_rref_list_t *list = zd_rref_list_new();
    int count = zd_nn_module_n_params(m);
    for (int i = 0; list && i < count; i++) {
        zd_tensor_t *p = zd_nn_module_param(m, i);
        /* A tensor registered twice (a tied weight) gets one RRef, where it
           was first seen: two RRefs to one tensor would step it twice. */
        bool seen = false;
        for (int j = 0; j < i && !seen; j++)
            seen = zd_nn_module_param(m, j) == p;
        if (seen)
            continue;
        zd_value_t *v = zd_value_tensor(p);
        zd_rref_t *r = v ? zd_rref_new(v) : NULL;
        zd_value_unref(v);
        if (!r || zd_rref_list_append(list, r) < 0) {
            zd_error_wrap("zd_dist_nn_parameter_rrefs: parameter \"%s\" of %s",
                          zd_nn_module_param_name(m, i), zd_nn_module_type(m));
            zd_rref_list_free(list);
            list = NULL;
        }
        zd_rref_unref(r);
    }
    return list;
}
