/* SPDX-License-Identifier: MIT */
/*  The 0.2 calls whose function kept its name but changed its arguments
    in 1.0 (NEWS.md): each must fail to compile, not run with a new
    meaning. ctest compiles this file once per CASE_... and expects the
    compiler's error for it; CASE_OK, written as 1.0 wants, must compile.
    Never linked: only -fsyntax-only. */
#include <stddef.h>
#include <stdint.h>
#include <zdist/autograd.h>
#include <zdist/checkpoint.h>
#include <zdist/dataset.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_nn.h>
#include <zdist/dist_optim.h>
#include <zdist/function.h>
#include <zdist/idx.h>
#include <zdist/model.h>
#include <zdist/module.h>
#include <zdist/optim.h>
#include <zdist/rnn.h>
#include <zdist/rpc.h>
#include <zdist/scope.h>

#if defined(CASE_OK)
static int forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                   int n_out)
{
    (void)m, (void)in, (void)n_in, (void)out, (void)n_out;
    return 0;
}
#elif defined(CASE_forward_fn)
static int forward(zd_nn_module_t *m, int n_in, zd_tensor_t *const *in, zd_tensor_t **out)
{
    (void)m, (void)in, (void)n_in, (void)out;
    return 0;
}
#endif

#if defined(CASE_OK)
static int tensors(zd_nn_module_t *m)
{
    static float data[6];
    const int64_t shape[2] = {2, 3};
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, 2), *r = NULL;
    zd_tensor_unref(zd_tensor_empty(ZD_FLOAT32, shape, 2));
    zd_tensor_unref(zd_tensor_from_data(ZD_FLOAT32, shape, 2, data));
    zd_tensor_unref(zd_tensor_wrap(ZD_FLOAT32, shape, 2, data, sizeof data, NULL, NULL));
    zd_nn_module_add_parameter(m, "w", shape, 2);
    int rc = zd_tensor_reshape(t, (int64_t[]){6}, 1, &r);
    zd_tensor_unref(r);
    zd_tensor_unref(t);
    return rc;
}
#endif

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
    zd_tensor_t *img = zd_idx_read("x.idx");
    zd_named_tensors_t *nt = zd_checkpoint_read("x.ckpt");
    int rc = zd_checkpoint_save(nt, "y.ckpt") + zd_checkpoint_load(nt, "y.ckpt") +
        zd_idx_save(img, "y.idx") + zd_idx_save_f32(img, "z.idx");
    rc += (int)zd_dataset_len(NULL) + (int)zd_scope_len(NULL);
    zd_tensor_unref(img);
    zd_named_tensors_free(nt);
    zd_optim_t *opt = NULL;
    zd_named_tensors_t *state = zd_optim_state_export(opt);
    rc += zd_optim_state_import(opt, state);
    zd_named_tensors_free(state);
    zd_tensor_t *x = NULL, *y = NULL;
    zd_autograd_node_t *node = NULL;
    zd_optim_free(zd_optim_new(cfg, &x, 1));
    zd_nn_module_free(zd_nn_module_new("M", forward, NULL, NULL));
    zd_nn_module_free(zd_nn_lstm_new(4, 8, 1, 0.0f, 1));
    zd_nn_module_free(zd_nn_gru_cell_new(4, 8, 1));
    zd_nn_module_t *net = zd_nn_net_new(1);
    rc += zd_nn_net_forward_conv(net, x, &y);
    zd_nn_module_free(net);
    zd_future_unref(zd_remote_module_forward_async(rm, &x, 1, 1));
    static const zd_autograd_node_ops_t ops = ZD_AUTOGRAD_NODE_OPS("TestBackward", NULL, NULL);
    zd_rpc_metrics_t mt;
    zd_dist_autograd_stats_t st;
    zd_optim_config_t c;
    return rc + zd_rpc_metrics_get(-1, &mt, sizeof mt) + zd_dist_autograd_stats(&st, sizeof st) +
        zd_nn_module_forward(m, &x, 1, &y, 1) + zd_remote_module_forward(rm, &x, 1, &y, 1) +
        zd_autograd_node_new(&ops, &x, 1, 1, &node) +
        zd_autograd_record(&ops, &x, 1, y, NULL, 0, NULL) + tensors(m) +
        zd_optim_config(opt, &c, sizeof c) + zd_optim_config_parse("sgd lr=0.1", &c, sizeof c);
#elif defined(CASE_model_t)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_nn_model_t *net = zd_nn_net_new(1);
    return net != NULL;
#elif defined(CASE_net_forward_conv)
    struct zd_nn_model *net = NULL;
    zd_tensor_t *x = NULL, *flat;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_nn_net_forward_conv(net, x, &flat);
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
#elif defined(CASE_dataset_size)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return (int)zd_dataset_size(NULL);
#elif defined(CASE_scope_size)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return (int)zd_scope_size(NULL);
#elif defined(CASE_idx_save)
    zd_tensor_t *t = NULL;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_idx_save("x.idx", t);
#elif defined(CASE_idx_save_f32)
    zd_tensor_t *t = NULL;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_idx_save_f32("x.idx", t);
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
#elif defined(CASE_optim_new)
    zd_tensor_t *x = NULL;
    (void)m, (void)rm, (void)ctx;
    return zd_optim_new(cfg, 1, &x) != NULL;
#elif defined(CASE_module_forward)
    zd_tensor_t *x = NULL, *y;
    (void)cfg, (void)rm, (void)ctx;
    return zd_nn_module_forward(m, 1, &x, &y);
#elif defined(CASE_module_forward_one)
    zd_tensor_t *x = NULL, *y;
    (void)cfg, (void)rm, (void)ctx;
    return zd_nn_module_forward(m, &x, 1, &y);
#elif defined(CASE_lstm_new)
    zd_tensor_t *x = NULL, *y;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_nn_lstm_forward(zd_nn_lstm_new(4, 8, 1, 0.0f, 1), x, NULL, NULL, &y, NULL, NULL);
#elif defined(CASE_rnn_cell_new)
    zd_tensor_t *x = NULL, *y;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_nn_rnn_cell_forward(zd_nn_gru_cell_new(4, 8, 1), x, NULL, NULL, &y, NULL);
#elif defined(CASE_forward_fn)
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_nn_module_free(zd_nn_module_new("M", forward, NULL, NULL));
    return 0;
#elif defined(CASE_remote_module_forward)
    zd_tensor_t *x = NULL, *y;
    (void)cfg, (void)m, (void)ctx;
    return zd_remote_module_forward(rm, 1, &x, &y);
#elif defined(CASE_remote_module_forward_async)
    zd_tensor_t *x = NULL;
    (void)cfg, (void)m, (void)ctx;
    zd_future_unref(zd_remote_module_forward_async(rm, 1, &x));
    return 0;
#elif defined(CASE_autograd_node_new)
    static const zd_autograd_node_ops_t ops = ZD_AUTOGRAD_NODE_OPS("TestBackward", NULL, NULL);
    zd_tensor_t *x = NULL;
    zd_autograd_node_t *node;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_autograd_node_new(&ops, 1, &x, 1, &node);
#elif defined(CASE_autograd_record)
    static const zd_autograd_node_ops_t ops = ZD_AUTOGRAD_NODE_OPS("TestBackward", NULL, NULL);
    zd_tensor_t *x = NULL, *y = NULL;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_autograd_record(&ops, 1, &x, y, NULL, 0, NULL);
#elif defined(CASE_node_ops)
    /* 0.2's positional table: its name lands in 1.0's first field, size */
    static const zd_autograd_node_ops_t ops = {"TestBackward", NULL, NULL};
    zd_tensor_t *x = NULL;
    zd_autograd_node_t *node;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_autograd_node_new(&ops, &x, 1, 1, &node);
#elif defined(CASE_optim_config)
    zd_optim_t *opt = NULL;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_optim_config(opt).lr > 0;
#elif defined(CASE_optim_config_parse)
    zd_optim_config_t c;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_optim_config_parse("sgd lr=0.1", &c);
#elif defined(CASE_tensor_new)
    const int64_t shape[2] = {2, 3};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_tensor_unref(zd_tensor_new(ZD_FLOAT32, 2, shape));
    return 0;
#elif defined(CASE_tensor_empty)
    const int64_t shape[2] = {2, 3};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_tensor_unref(zd_tensor_empty(ZD_FLOAT32, 2, shape));
    return 0;
#elif defined(CASE_tensor_from_data)
    static float data[6];
    const int64_t shape[2] = {2, 3};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_tensor_unref(zd_tensor_from_data(ZD_FLOAT32, 2, shape, data));
    return 0;
#elif defined(CASE_tensor_wrap)
    static float data[6];
    const int64_t shape[2] = {2, 3};
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_tensor_unref(zd_tensor_wrap(ZD_FLOAT32, 2, shape, data, sizeof data, NULL, NULL));
    return 0;
#elif defined(CASE_tensor_reshape)
    zd_tensor_t *t = NULL, *r;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_tensor_reshape(t, 1, (int64_t[]){6}, &r);
#elif defined(CASE_module_add_parameter)
    (void)cfg, (void)rm, (void)ctx;
    return zd_nn_module_add_parameter(m, "w", 2, (int64_t[]){2, 3}) != NULL;
#elif defined(CASE_tensor_clone)
    /* 0.2's detached copy; 1.0's clone is differentiable, (a, &out) */
    zd_tensor_t *t = NULL;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    zd_tensor_t *c = zd_tensor_clone(t);
    return c != NULL;
#elif defined(CASE_tensor_copy)
    zd_tensor_t *t = NULL, *c;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_tensor_copy(t, &c);
#elif defined(CASE_rpc_wait)
    zd_future_t *f = NULL;
    (void)cfg, (void)m, (void)rm, (void)ctx;
    return zd_rpc_wait(f, 1000);
#else
#error "no CASE_ defined"
#endif
}
