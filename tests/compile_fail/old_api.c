/* SPDX-License-Identifier: MIT */
/*  The 0.2 calls whose function kept its name but changed its arguments
    in 1.0 (NEWS.md): each must fail to compile, not run with a new
    meaning. ctest compiles this file once per CASE_... and expects the
    compiler's error for it; CASE_OK, written as 1.0 wants, must compile.
    Never linked: only -fsyntax-only. */
#include <stddef.h>
#include <stdint.h>
#include <zdist/checkpoint.h>
#include <zdist/dataset.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_nn.h>
#include <zdist/dist_optim.h>
#include <zdist/idx.h>
#include <zdist/optim.h>
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
    zd_dataset_free(zd_dataset_load(NULL, ZD_DATASET_TEST));
    zd_dataset_free(zd_dataset_load_files("images.idx", "labels.idx"));
    zd_tensor_unref(zd_idx_load("x.idx"));
    zd_named_tensors_t *nt = zd_checkpoint_read("x.ckpt");
    int rc = zd_checkpoint_save("y.ckpt", nt) + zd_checkpoint_load("y.ckpt", nt);
    zd_named_tensors_free(nt);
    zd_optim_t *opt = NULL;
    zd_named_tensors_t *state = zd_optim_state_export(opt);
    rc += zd_optim_state_import(opt, state);
    zd_named_tensors_free(state);
    zd_rpc_metrics_t mt;
    zd_dist_autograd_stats_t st;
    return rc + zd_rpc_metrics_get(-1, &mt, sizeof mt) + zd_dist_autograd_stats(&st, sizeof st);
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
#elif defined(CASE_dataset_load)
    zd_dataset_t *ds;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_dataset_load(NULL, ZD_DATASET_TEST, &ds) < 0 ? -1 : 0;
#elif defined(CASE_dataset_load_files)
    zd_dataset_t *ds;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_dataset_load_files("images.idx", "labels.idx", &ds) < 0 ? -1 : 0;
#elif defined(CASE_idx_load)
    zd_tensor_t *t;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_idx_load("x.idx", &t) < 0 ? -1 : 0;
#elif defined(CASE_checkpoint_save)
    const char *names[1] = {"w"};
    zd_tensor_t *tensors[1] = {NULL};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_checkpoint_save("x.ckpt", 1, names, tensors);
#elif defined(CASE_checkpoint_load)
    const char *names[1] = {"w"};
    zd_tensor_t *tensors[1] = {NULL};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_checkpoint_load("x.ckpt", 1, names, tensors);
#elif defined(CASE_checkpoint_read)
    int n;
    char **names;
    zd_tensor_t **tensors;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_checkpoint_read("x.ckpt", &n, &names, &tensors) < 0 ? -1 : 0;
#elif defined(CASE_checkpoint_free_list)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_checkpoint_free_list(0, NULL, NULL);
    return 0;
#elif defined(CASE_optim_state_export)
    zd_optim_t *opt = NULL;
    int n;
    char **names;
    zd_tensor_t **tensors;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_optim_state_export(opt, &n, &names, &tensors) < 0 ? -1 : 0;
#elif defined(CASE_optim_state_import)
    zd_optim_t *opt = NULL;
    const char *names[1] = {"0.step"};
    zd_tensor_t *tensors[1] = {NULL};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_optim_state_import(opt, 1, names, tensors);
#elif defined(CASE_optim_state_free)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_optim_state_free(0, NULL, NULL);
    return 0;
#elif defined(CASE_rpc_args)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_value_unref(zd_rpc_args("i", (int64_t)3));
    return 0;
#else
#error "no CASE_ defined"
#endif
}
