/* SPDX-License-Identifier: MIT */
/*  The 0.2 calls whose function kept its name but changed its arguments
    in 1.0 (NEWS.md): each must fail to compile, not run with a new
    meaning. ctest compiles this file once per CASE_... and expects the
    compiler's error for it; CASE_OK, written as 1.0 wants, must compile.
    Never linked: only -fsyntax-only. */
#include <stddef.h>
#include <stdint.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_nn.h>
#include <zdist/dist_optim.h>
#include <zdist/rpc.h>

int use(const zd_optim_config_t *cfg, zd_nn_module_t *m, zd_remote_module_t *rm, int64_t ctx);

int use(const zd_optim_config_t *cfg, zd_nn_module_t *m, zd_remote_module_t *rm, int64_t ctx)
{
#if defined(CASE_OK)
    zd_rref_list_t *params = zd_dist_nn_parameter_rrefs(m), *more;
    if (params && (more = zd_remote_module_remote_parameters(rm))) {
        zd_rref_list_extend(params, more);
        zd_rref_list_free(more);
    }
    zd_dist_optim_free(zd_dist_optim_new(cfg, params));
    zd_rref_list_free(params);
    zd_named_tensors_free(zd_dist_autograd_get_gradients(ctx));
    zd_rpc_metrics_t mt;
    zd_dist_autograd_stats_t st;
    return zd_rpc_metrics_get(-1, &mt, sizeof mt) + zd_dist_autograd_stats(&st, sizeof st);
#elif defined(CASE_dist_optim_new)
    zd_rref_t **params = NULL;
    zd_dist_optim_t *opt;
    (void)m, (void)rm, (void)ctx;
    return zd_dist_optim_new(cfg, params, 1, &opt);
#elif defined(CASE_parameter_rrefs)
    int n;
    zd_rref_t **rrefs;
    (void)cfg, (void)rm, (void)ctx;
    return zd_dist_nn_parameter_rrefs(m, &n, &rrefs);
#elif defined(CASE_remote_parameters)
    int n;
    zd_rref_t **rrefs;
    (void)cfg, (void)m, (void)ctx;
    return zd_remote_module_remote_parameters(rm, &n, &rrefs);
#elif defined(CASE_get_gradients)
    int n;
    zd_tensor_t **tensors, **grads;
    (void)cfg, (void)m, (void)rm;
    return zd_dist_autograd_get_gradients(ctx, &n, &tensors, &grads);
#elif defined(CASE_metrics_get)
    zd_rpc_metrics_t mt;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_rpc_metrics_get(-1, &mt);
#elif defined(CASE_stats)
    zd_dist_autograd_stats_t st;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_dist_autograd_stats(&st);
    return 0;
#elif defined(CASE_rpc_args)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_value_unref(zd_rpc_args("i", (int64_t)3));
    return 0;
#else
#error "no CASE_ defined"
#endif
}
