/* SPDX-License-Identifier: MIT */
/*  parameter_rrefs.c: RRefs to a module's parameters (SPEC N5), the array
    the DistributedOptimizer takes. */
#include <stdlib.h>

#include <zdist/dist_nn.h>
#include <zdist/error.h>

int zd_dist_nn_parameter_rrefs(const zd_nn_module_t *m, int *n, zd_rref_t ***rrefs)
{
    if (n)
        *n = 0;
    if (rrefs)
        *rrefs = NULL;
    if (!m || !n || !rrefs)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dist_nn_parameter_rrefs: NULL argument");
    int count = zd_nn_module_n_params(m);
    zd_rref_t **out = calloc(count ? (size_t)count : 1, sizeof *out);
    if (!out)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_dist_nn_parameter_rrefs: out of memory");
    for (int i = 0; i < count; i++) {
        zd_value_t *v = zd_value_tensor(zd_nn_module_param(m, i));
        out[i] = v ? zd_rref_new(v) : NULL;
        zd_value_unref(v);
        if (!out[i]) {
            zd_error_wrap("zd_dist_nn_parameter_rrefs: parameter \"%s\" of %s",
                          zd_nn_module_param_name(m, i), zd_nn_module_type(m));
            zd_dist_nn_rrefs_free(i, out);
            return -1;
        }
    }
    *n = count;
    *rrefs = out;
    return 0;
}

void zd_dist_nn_rrefs_free(int n, zd_rref_t **rrefs)
{
    if (!rrefs)
        return;
    for (int i = 0; i < n; i++)
        zd_rref_unref(rrefs[i]);
    free(rrefs);
}
