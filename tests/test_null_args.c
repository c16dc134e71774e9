/* SPDX-License-Identifier: MIT */
/*  NULL arguments: every fallible public function of autograd, the
    tensors, nn, optim and data (idx, data sets, checkpoints, safetensors)
    given NULL for a pointer it needs fails with ZD_ERR_ARGUMENT (-1 or
    NULL) instead of crashing; and the bad arguments that are not NULL
    (shapes or dtypes that do not match, a dimension or an index out of
    range, a bad hyper-parameter) carry ZD_ERR_ARGUMENT too.

    Built with -DZD_NULL_SWEEP, each call runs in a child process and the
    program lists the calls that crash or fail otherwise, instead of
    stopping at the first. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/autograd.h>
#include <zdist/checkpoint.h>
#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/function.h>
#include <zdist/idx.h>
#include <zdist/model.h>
#include <zdist/module.h>
#include <zdist/named_tensors.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/rnn.h>
#include <zdist/safetensors.h>
#include <zdist/tensor.h>
#include "tests/support/fixtures.h"

#ifdef ZD_NULL_SWEEP
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static int sweep_bad;

static void sweep_report(const char *call, int status)
{
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    sweep_bad++;
    if (WIFSIGNALED(status))
        printf("CRASH (signal %d): %s\n", WTERMSIG(status), call);
    else if (WEXITSTATUS(status) == 2)
        printf("WRONG CODE: %s\n", call);
    else
        printf("NOT REFUSED: %s\n", call);
}

#define SWEEP(call, failed)                                                                        \
    do {                                                                                           \
        fflush(stdout);                                                                            \
        pid_t pid_ = fork();                                                                       \
        if (pid_ == 0) {                                                                           \
            signal(SIGSEGV, SIG_DFL); /* cmocka's handler would carry on in the child */           \
            signal(SIGBUS, SIG_DFL);                                                               \
            signal(SIGABRT, SIG_DFL);                                                              \
            zd_error_clear();                                                                      \
            bool failed_ = (failed);                                                               \
            _exit(!failed_ ? 3 : zd_error_code() == ZD_ERR_ARGUMENT ? 0 : 2);                      \
        }                                                                                          \
        int st_ = 0;                                                                               \
        waitpid(pid_, &st_, 0);                                                                    \
        sweep_report(call, st_);                                                                   \
    } while (0)
/*  -1 with ZD_ERR_ARGUMENT */
#define REFUSED(call) SWEEP(#call, (call) == -1)
/*  NULL with ZD_ERR_ARGUMENT */
#define REFUSED_NULL(call) SWEEP(#call, (call) == NULL)
#else
#define REFUSED(call)                                                                              \
    do {                                                                                           \
        zd_error_clear();                                                                          \
        if ((call) != -1)                                                                          \
            fail_msg("not refused: %s", #call);                                                    \
        if (zd_error_code() != ZD_ERR_ARGUMENT)                                                    \
            fail_msg("%s: code %s (%s)", #call, zd_error_code_name(zd_error_code()),               \
                     zd_error_last());                                                             \
    } while (0)
#define REFUSED_NULL(call)                                                                         \
    do {                                                                                           \
        zd_error_clear();                                                                          \
        if ((call) != NULL)                                                                        \
            fail_msg("not refused: %s", #call);                                                    \
        if (zd_error_code() != ZD_ERR_ARGUMENT)                                                    \
            fail_msg("%s: code %s (%s)", #call, zd_error_code_name(zd_error_code()),               \
                     zd_error_last());                                                             \
    } while (0)
#endif

static zd_tensor_t *vec(int64_t n)
{
    zd_tensor_t *t = zd_tensor_zeros1(n);
    assert_non_null(t);
    return t;
}

static zd_tensor_t *mat(int64_t r, int64_t c)
{
    zd_tensor_t *t = zd_tensor_zeros2(r, c);
    assert_non_null(t);
    return t;
}

static int null_backward(zd_autograd_node_t *node, zd_tensor_t *const *gout, zd_tensor_t **gin)
{
    (void)node;
    (void)gout;
    (void)gin;
    return 0;
}

static void test_autograd_and_tensor(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *a = mat(2, 2), *b = mat(2, 2), *o = NULL;
    assert_int_equal(zd_tensor_set_requires_grad(a, true), 0);
    zd_tensor_t *s;
    assert_int_equal(zd_tensor_sum(a, &s), 0);
    zd_autograd_node_t *node = zd_tensor_grad_fn(s);
    assert_non_null(node);
    zd_autograd_task_t *task = zd_autograd_task_new(&node, 1, NULL);
    assert_non_null(task);
    int64_t shape[2] = {2, 2};
    float data[4] = {0};
    int dims[2] = {1, 0};
    uint64_t max_seq;
    int ran;
    /* max_seq and ran may be NULL (not wanted) */

    REFUSED(zd_autograd_run(NULL, 1, NULL));
    REFUSED_NULL(zd_autograd_task_new(NULL, 1, NULL));
    REFUSED(zd_autograd_task_feed(NULL, node, NULL));
    REFUSED(zd_autograd_task_feed(task, NULL, NULL));
    REFUSED(zd_autograd_task_pending(NULL, &max_seq));
    REFUSED(zd_autograd_task_flush_one(NULL));
    REFUSED(zd_autograd_task_flush(NULL, &ran));
    REFUSED(zd_autograd_backward(NULL, NULL, false));

    int (*binary[])(zd_tensor_t *, zd_tensor_t *, zd_tensor_t **) = {
        zd_tensor_add, zd_tensor_sub, zd_tensor_mul, zd_tensor_div, zd_tensor_matmul};
    for (size_t i = 0; i < sizeof binary / sizeof *binary; i++) {
        REFUSED(binary[i](NULL, b, &o));
        REFUSED(binary[i](a, NULL, &o));
        REFUSED(binary[i](a, b, NULL));
    }
    int (*unary[])(zd_tensor_t *, zd_tensor_t **) = {
        zd_tensor_sum,     zd_tensor_mean, zd_tensor_clone, zd_tensor_tanh,
        zd_tensor_sigmoid, zd_tensor_exp,  zd_tensor_log};
    for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) {
        REFUSED(unary[i](NULL, &o));
        REFUSED(unary[i](a, NULL));
    }
    REFUSED(zd_tensor_scale(NULL, 2.0f, &o));
    REFUSED(zd_tensor_scale(a, 2.0f, NULL));
    zd_tensor_t *pair[2] = {a, NULL};
    REFUSED(zd_tensor_cat(NULL, 1, 0, &o));
    REFUSED(zd_tensor_cat(pair, 2, 0, &o));
    REFUSED(zd_tensor_cat(pair, 1, 0, NULL));
    REFUSED(zd_tensor_narrow(NULL, 0, 0, 1, &o));
    REFUSED(zd_tensor_narrow(a, 0, 0, 1, NULL));
    REFUSED(zd_tensor_permute(NULL, dims, 2, &o));
    REFUSED(zd_tensor_permute(a, NULL, 2, &o));
    REFUSED(zd_tensor_permute(a, dims, 2, NULL));
    REFUSED(zd_tensor_transpose(NULL, 0, 1, &o));
    REFUSED(zd_tensor_transpose(a, 0, 1, NULL));

    REFUSED_NULL(zd_tensor_new(ZD_FLOAT32, NULL, 2));
    REFUSED_NULL(zd_tensor_empty(ZD_FLOAT32, NULL, 2));
    REFUSED_NULL(zd_tensor_from_data(ZD_FLOAT32, NULL, 2, data));
    REFUSED_NULL(zd_tensor_from_data(ZD_FLOAT32, shape, 2, NULL));
    REFUSED_NULL(zd_tensor_wrap(ZD_FLOAT32, NULL, 2, data, sizeof data, NULL, NULL));
    REFUSED_NULL(zd_tensor_wrap(ZD_FLOAT32, shape, 2, NULL, sizeof data, NULL, NULL));
    REFUSED_NULL(zd_tensor_detach_copy(NULL));
    REFUSED_NULL(zd_tensor_detach(NULL));
    REFUSED(zd_tensor_copy_(NULL, b));
    REFUSED(zd_tensor_copy_(b, NULL));
    REFUSED(zd_tensor_reshape(NULL, shape, 2, &o));
    REFUSED(zd_tensor_reshape(a, NULL, 2, &o));
    REFUSED(zd_tensor_reshape(a, shape, 2, NULL));
    REFUSED(zd_tensor_set_requires_grad(NULL, true));
    REFUSED(zd_tensor_accumulate_grad(NULL, b));
    REFUSED(zd_tensor_accumulate_grad(a, NULL));
    REFUSED(zd_tensor_set_name(NULL, "x"));

    static const zd_autograd_node_ops_t ops =
        ZD_AUTOGRAD_NODE_OPS("NullBackward", null_backward, NULL);
    zd_autograd_node_t *made = NULL;
    zd_tensor_t *in[1] = {a};
    REFUSED(zd_autograd_node_new(NULL, in, 1, 1, &made));
    REFUSED(zd_autograd_node_new(&ops, NULL, 1, 1, &made));
    REFUSED(zd_autograd_node_new(&ops, in, 1, 1, NULL));
    REFUSED(zd_autograd_record(NULL, in, 1, zd_tensor_clone(b, &o) == 0 ? o : NULL, NULL, 0, NULL));
    REFUSED(
        zd_autograd_record(&ops, NULL, 1, zd_tensor_clone(b, &o) == 0 ? o : NULL, NULL, 0, NULL));
    REFUSED(zd_autograd_record(&ops, in, 1, NULL, NULL, 0, NULL));

    zd_named_tensors_t *nt = zd_named_tensors_new();
    assert_non_null(nt);
    REFUSED(zd_named_tensors_add(NULL, "a", a));
    REFUSED(zd_named_tensors_add(nt, NULL, a));
    REFUSED(zd_named_tensors_add(nt, "a", NULL));
    REFUSED_NULL(zd_named_tensors_find(nt, NULL));
    REFUSED(zd_named_tensors_index(nt, NULL));
    zd_named_tensors_free(nt);

    zd_autograd_task_free(task);
    zd_tensor_unref(s);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_nn(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_rng_t rng;
    zd_rng_seed(&rng, 1);
    zd_tensor_t *x = zd_tensor_zeros4(1, 1, 4, 4), *w = zd_tensor_zeros4(1, 1, 3, 3), *o = NULL;
    zd_tensor_t *m2 = mat(2, 3), *w2 = mat(4, 3), *t1 = vec(2);
    assert_non_null(x);
    assert_non_null(w);
    int64_t tshape[1] = {2};
    zd_tensor_t *target = zd_tensor_new(ZD_INT64, tshape, 1);
    assert_non_null(target);

    REFUSED(zd_nn_conv2d(NULL, w, NULL, 1, 0, &o));
    REFUSED(zd_nn_conv2d(x, NULL, NULL, 1, 0, &o));
    REFUSED(zd_nn_conv2d(x, w, NULL, 1, 0, NULL));
    REFUSED(zd_nn_conv2d_relu(NULL, w, NULL, 1, 0, &o));
    REFUSED(zd_nn_conv2d_relu(x, NULL, NULL, 1, 0, &o));
    REFUSED(zd_nn_conv2d_relu(x, w, NULL, 1, 0, NULL));
    REFUSED(zd_nn_conv2d_max_pool2d(NULL, w, NULL, 1, 0, 2, 2, &o));
    REFUSED(zd_nn_conv2d_max_pool2d(x, NULL, NULL, 1, 0, 2, 2, &o));
    REFUSED(zd_nn_conv2d_max_pool2d(x, w, NULL, 1, 0, 2, 2, NULL));
    REFUSED(zd_nn_linear(NULL, w2, NULL, &o));
    REFUSED(zd_nn_linear(m2, NULL, NULL, &o));
    REFUSED(zd_nn_linear(m2, w2, NULL, NULL));
    REFUSED(zd_nn_max_pool2d(NULL, 2, 2, &o));
    REFUSED(zd_nn_max_pool2d(x, 2, 2, NULL));
    REFUSED(zd_nn_dropout(NULL, 0.5f, true, &rng, &o));
    REFUSED(zd_nn_dropout(m2, 0.5f, true, NULL, &o));
    REFUSED(zd_nn_dropout(m2, 0.5f, true, &rng, NULL));
    REFUSED(zd_nn_dropout2d(NULL, 0.5f, true, &rng, &o));
    REFUSED(zd_nn_dropout2d(x, 0.5f, true, NULL, &o));
    REFUSED(zd_nn_dropout2d(x, 0.5f, true, &rng, NULL));
    int (*unary[])(zd_tensor_t *, zd_tensor_t **) = {zd_nn_relu, zd_nn_flatten, zd_nn_gelu,
                                                     zd_nn_argmax};
    for (size_t i = 0; i < sizeof unary / sizeof *unary; i++) {
        REFUSED(unary[i](NULL, &o));
        REFUSED(unary[i](m2, NULL));
    }
    REFUSED(zd_nn_softmax(NULL, 1, &o));
    REFUSED(zd_nn_softmax(m2, 1, NULL));
    REFUSED(zd_nn_log_softmax(NULL, 1, &o));
    REFUSED(zd_nn_log_softmax(m2, 1, NULL));
    REFUSED(zd_nn_layer_norm(NULL, 1, NULL, NULL, 1e-5f, &o));
    REFUSED(zd_nn_layer_norm(m2, 1, NULL, NULL, 1e-5f, NULL));
    REFUSED(zd_nn_embedding(NULL, w2, -1, &o));
    REFUSED(zd_nn_embedding(target, NULL, -1, &o));
    REFUSED(zd_nn_embedding(target, w2, -1, NULL));
    int (*loss[])(zd_tensor_t *, zd_tensor_t *,
                  zd_tensor_t **) = {zd_nn_nll_loss, zd_nn_cross_entropy, zd_nn_mse_loss};
    for (size_t i = 0; i < sizeof loss / sizeof *loss; i++) {
        REFUSED(loss[i](NULL, target, &o));
        REFUSED(loss[i](m2, NULL, &o));
        REFUSED(loss[i](m2, target, NULL));
    }
    REFUSED(zd_nn_accuracy(NULL, target));
    REFUSED(zd_nn_accuracy(m2, NULL));
    REFUSED(zd_nn_init_uniform(NULL, 0, 1, &rng));
    REFUSED(zd_nn_init_uniform(m2, 0, 1, NULL));
    REFUSED(zd_nn_init_normal(NULL, 0, 1, &rng));
    REFUSED(zd_nn_init_normal(m2, 0, 1, NULL));
    REFUSED(zd_nn_init_default(NULL, t1, &rng));
    REFUSED(zd_nn_init_default(m2, t1, NULL));

    /* The recurrent cells and the LSTM (rnn.h). */
    zd_tensor_t *xi = mat(1, 3), *h = mat(1, 2), *c = mat(1, 2), *o2 = NULL;
    zd_tensor_t *wih4 = mat(8, 3), *whh4 = mat(8, 2), *wih3 = mat(6, 3), *whh3 = mat(6, 2);
    zd_tensor_t *wih1 = mat(2, 3), *whh1 = mat(2, 2);
    REFUSED(zd_nn_lstm_cell(NULL, h, c, wih4, whh4, NULL, NULL, &o, &o2));
    REFUSED(zd_nn_lstm_cell(xi, h, c, NULL, whh4, NULL, NULL, &o, &o2));
    REFUSED(zd_nn_lstm_cell(xi, h, c, wih4, NULL, NULL, NULL, &o, &o2));
    REFUSED(zd_nn_lstm_cell(xi, h, c, wih4, whh4, NULL, NULL, NULL, &o2));
    REFUSED(zd_nn_lstm_cell(xi, h, c, wih4, whh4, NULL, NULL, &o, NULL));
    REFUSED(zd_nn_gru_cell(NULL, h, wih3, whh3, NULL, NULL, &o));
    REFUSED(zd_nn_gru_cell(xi, h, NULL, whh3, NULL, NULL, &o));
    REFUSED(zd_nn_gru_cell(xi, h, wih3, NULL, NULL, NULL, &o));
    REFUSED(zd_nn_gru_cell(xi, h, wih3, whh3, NULL, NULL, NULL));
    REFUSED(zd_nn_rnn_tanh_cell(NULL, h, wih1, whh1, NULL, NULL, &o));
    REFUSED(zd_nn_rnn_tanh_cell(xi, h, NULL, whh1, NULL, NULL, &o));
    REFUSED(zd_nn_rnn_tanh_cell(xi, h, wih1, NULL, NULL, NULL, &o));
    REFUSED(zd_nn_rnn_tanh_cell(xi, h, wih1, whh1, NULL, NULL, NULL));
    zd_tensor_t *seq = zd_tensor_zeros4(1, 1, 1, 3);
    zd_tensor_t *lstm_params[4] = {wih4, whh4, NULL, NULL};
    REFUSED(zd_nn_lstm(NULL, NULL, NULL, lstm_params, 1, 0, false, NULL, &o, NULL, NULL));
    REFUSED(zd_nn_lstm(seq, NULL, NULL, NULL, 1, 0, false, NULL, &o, NULL, NULL));
    REFUSED(zd_nn_lstm(seq, NULL, NULL, lstm_params, 1, 0, false, NULL, NULL, NULL, NULL));

    zd_tensor_t *ts[] = {x, w,    m2,   w2,   t1,   target, xi,   h,
                         c, wih4, whh4, wih3, whh3, wih1,   whh1, seq};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        zd_tensor_unref(ts[i]);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_modules(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_rng_t rng;
    zd_rng_seed(&rng, 2);
    zd_nn_module_t *m = zd_nn_linear_new(3, 2, true, &rng), *net = zd_nn_net_new(1);
    assert_non_null(m);
    assert_non_null(net);
    zd_tensor_t *x = mat(1, 3), *v = NULL, *o = NULL, *outs[1];
    zd_tensor_t *img = zd_tensor_zeros4(1, 1, 28, 28);
    int64_t shape[1] = {2};
    const char *path = tmp_path("m.bin");

    REFUSED_NULL(zd_nn_tutorial_model_new(NULL, 1));
    REFUSED(zd_nn_net_seed_dropout(NULL, 1));
    REFUSED(zd_nn_net_forward_conv(NULL, img, &o));
    REFUSED(zd_nn_net_forward_conv(net, NULL, &o));
    REFUSED(zd_nn_net_forward_conv(net, img, NULL));
    REFUSED(zd_nn_net_forward_fc(NULL, x, &o));
    REFUSED(zd_nn_net_forward_fc(net, NULL, &o));
    REFUSED(zd_nn_net_forward_fc(net, x, NULL));

    REFUSED(zd_nn_module_register_parameter(NULL, "p", x));
    REFUSED(zd_nn_module_register_parameter(m, NULL, x));
    REFUSED(zd_nn_module_register_parameter(m, "p", NULL));
    REFUSED_NULL(zd_nn_module_add_parameter(NULL, "p", shape, 1));
    REFUSED_NULL(zd_nn_module_add_parameter(m, NULL, shape, 1));
    REFUSED_NULL(zd_nn_module_add_parameter(m, "p", NULL, 1));
    REFUSED(zd_nn_module_register_module(NULL, "c", zd_nn_linear_new(1, 1, false, &rng)));
    REFUSED(zd_nn_module_register_module(m, NULL, zd_nn_linear_new(1, 1, false, &rng)));
    REFUSED(zd_nn_module_register_module(m, "c", NULL));
    REFUSED_NULL(zd_nn_module_child(NULL, "c"));
    REFUSED_NULL(zd_nn_module_child(m, NULL));
    REFUSED_NULL(zd_nn_module_param(NULL, 0));
    REFUSED_NULL(zd_nn_module_param_name(NULL, 0));
    REFUSED_NULL(zd_nn_module_find(NULL, "weight"));
    REFUSED_NULL(zd_nn_module_find(m, NULL));
    REFUSED(zd_nn_module_param_index(NULL, "weight"));
    REFUSED(zd_nn_module_param_index(m, NULL));
    REFUSED_NULL(zd_nn_module_state_dict(NULL));
    REFUSED(zd_nn_module_params_to_vector(NULL, &v));
    REFUSED(zd_nn_module_params_to_vector(m, NULL));
    REFUSED(zd_nn_module_grads_to_vector(NULL, &v));
    REFUSED(zd_nn_module_grads_to_vector(m, NULL));
    REFUSED(zd_nn_module_vector_to_params(NULL, x));
    REFUSED(zd_nn_module_vector_to_params(m, NULL));
    REFUSED(zd_nn_module_forward(NULL, &x, 1, outs, 1));
    REFUSED(zd_nn_module_forward(m, NULL, 1, outs, 1));
    REFUSED(zd_nn_module_forward(m, &x, 1, NULL, 1));
    REFUSED(zd_nn_module_save(NULL, path));
    REFUSED(zd_nn_module_save(m, NULL));
    REFUSED(zd_nn_module_load(NULL, path));
    REFUSED(zd_nn_module_load(m, NULL));
    REFUSED(zd_nn_module_save_safetensors(NULL, path, NULL));
    REFUSED(zd_nn_module_save_safetensors(m, NULL, NULL));
    REFUSED(zd_nn_module_load_safetensors(NULL, path, true, NULL));
    REFUSED(zd_nn_module_load_safetensors(m, NULL, true, NULL));
    REFUSED_NULL(zd_nn_linear_new(3, 2, true, NULL));

    zd_nn_module_free(m);
    zd_nn_module_free(net);
    zd_tensor_unref(x);
    zd_tensor_unref(img);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_optim(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *p = vec(2);
    assert_int_equal(zd_tensor_set_requires_grad(p, true), 0);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.1), got;
    zd_optim_t *opt = zd_optim_new(&cfg, &p, 1);
    assert_non_null(opt);
    zd_optim_kind_t kind;
    char buf[256];
    zd_named_tensors_t *st = zd_optim_state_export(opt);
    assert_non_null(st);

    REFUSED(zd_optim_kind_from_name(NULL, &kind));
    REFUSED(zd_optim_kind_from_name("sgd", NULL));
    REFUSED(zd_optim_config_check(NULL));
    REFUSED(zd_optim_config_format(NULL, buf, sizeof buf));
    REFUSED(zd_optim_config_format(&cfg, NULL, sizeof buf));
    REFUSED(zd_optim_config_parse(NULL, &got, sizeof got));
    REFUSED(zd_optim_config_parse("sgd lr=0.1", NULL, sizeof got));
    REFUSED_NULL(zd_optim_new(NULL, &p, 1));
    REFUSED_NULL(zd_optim_new(&cfg, NULL, 1));
    REFUSED(zd_optim_step(NULL, &p));
    REFUSED(zd_optim_step(opt, NULL));
    REFUSED(zd_optim_step_grad(NULL));
    REFUSED(zd_optim_config(NULL, &got, sizeof got));
    REFUSED(zd_optim_config(opt, NULL, sizeof got));
    REFUSED_NULL(zd_optim_param(NULL, 0));
    REFUSED(zd_optim_set_lr(NULL, 0.1));
    REFUSED_NULL(zd_optim_state_export(NULL));
    REFUSED(zd_optim_state_import(NULL, st));
    REFUSED(zd_optim_state_import(opt, NULL));

    zd_named_tensors_free(st);
    zd_optim_free(opt);
    zd_tensor_unref(p);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_data(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    int64_t ishape[3] = {2, 2, 2}, lshape[1] = {2};
    zd_tensor_t *images = zd_tensor_new(ZD_UINT8, ishape, 3);
    zd_tensor_t *labels = zd_tensor_new(ZD_UINT8, lshape, 1);
    assert_non_null(images);
    assert_non_null(labels);
    char ipath[512], lpath[512], buf[512];
    snprintf(ipath, sizeof ipath, "%s", tmp_path("images"));
    snprintf(lpath, sizeof lpath, "%s", tmp_path("labels"));
    if (zd_idx_save(images, ipath) < 0 || zd_idx_save(labels, lpath) < 0)
        fail_msg("%s", zd_error_last());
    zd_dataset_t *ds = zd_dataset_load_files(ipath, lpath);
    if (!ds)
        fail_msg("%s", zd_error_last());
    zd_tensor_t *x = NULL, *y = NULL;
    zd_named_tensors_t *nt = zd_named_tensors_new();
    assert_non_null(nt);
    assert_int_equal(zd_named_tensors_add(nt, "images", images), 0);
    const char *path = tmp_path("nt.bin");

    REFUSED_NULL(zd_idx_read(NULL));
    REFUSED(zd_idx_save(NULL, path));
    REFUSED(zd_idx_save(images, NULL));
    REFUSED(zd_idx_save_f32(NULL, path));
    REFUSED(zd_idx_save_f32(images, NULL));

    REFUSED(zd_dataset_find_dir(NULL, 16));
    REFUSED(zd_dataset_find_file(NULL, ZD_DATASET_TRAIN, "images", buf, sizeof buf));
    REFUSED(zd_dataset_find_file(tmpdir(), ZD_DATASET_TRAIN, NULL, buf, sizeof buf));
    REFUSED(zd_dataset_find_file(tmpdir(), ZD_DATASET_TRAIN, "images", NULL, sizeof buf));
    REFUSED_NULL(zd_dataset_load_files(NULL, lpath));
    REFUSED_NULL(zd_dataset_load_files(ipath, NULL));
    REFUSED(zd_dataset_limit(NULL, 1));
    REFUSED(zd_dataset_normalise(NULL, &x));
    REFUSED(zd_dataset_normalise(images, NULL));
    REFUSED_NULL(zd_dataset_order(NULL, 1));
    REFUSED(zd_dataset_batch(NULL, NULL, 0, 1, &x, &y));
    REFUSED(zd_dataset_batch(ds, NULL, 0, 1, NULL, &y));
    REFUSED(zd_dataset_batch(ds, NULL, 0, 1, &x, NULL));

    REFUSED(zd_checkpoint_save(NULL, path));
    REFUSED(zd_checkpoint_save(nt, NULL));
    REFUSED(zd_checkpoint_load(NULL, path));
    REFUSED(zd_checkpoint_load(nt, NULL));
    REFUSED_NULL(zd_checkpoint_read(NULL));

    REFUSED_NULL(zd_safetensors_read(NULL, NULL));
    REFUSED(zd_safetensors_write(NULL, path, NULL));
    REFUSED(zd_safetensors_write(nt, NULL, NULL));
    REFUSED(zd_safetensors_load(NULL, path, true, NULL));
    REFUSED(zd_safetensors_load(nt, NULL, true, NULL));

    zd_named_tensors_free(nt);
    zd_dataset_free(ds);
    zd_tensor_unref(images);
    zd_tensor_unref(labels);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  Bad arguments that are not NULL: shapes that do not match, a dimension
    out of range, a bad hyper-parameter, an index out of range. */
static void test_bad_arguments(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *a = vec(2), *b = vec(3), *m = mat(2, 3), *w = mat(3, 2), *o = NULL;
    int64_t six[1] = {6}, five[1] = {5};
    int dims_bad[2] = {0, 2};

    /* shapes that do not match */
    REFUSED(zd_tensor_add(a, b, &o));
    REFUSED(zd_tensor_mul(a, b, &o));
    REFUSED(zd_tensor_matmul(m, m, &o));
    REFUSED(zd_tensor_copy_(a, b));
    REFUSED(zd_nn_linear(m, w, NULL, &o));
    REFUSED(zd_nn_mse_loss(a, b, &o));
    /* a dimension out of range, a reshape to a wrong size */
    REFUSED(zd_tensor_transpose(m, 0, 2, &o));
    REFUSED(zd_tensor_permute(m, dims_bad, 2, &o));
    REFUSED(zd_tensor_narrow(m, 2, 0, 1, &o));
    REFUSED(zd_tensor_narrow(m, 1, 2, 2, &o));
    zd_tensor_t *pair[2] = {m, m};
    REFUSED(zd_tensor_cat(pair, 2, 2, &o));
    REFUSED(zd_nn_softmax(m, 2, &o));
    REFUSED(zd_tensor_reshape(m, five, 1, &o));
    assert_int_equal(zd_tensor_reshape(m, six, 1, &o), 0);
    zd_tensor_unref_p(&o);
    REFUSED_NULL(zd_tensor_new(ZD_FLOAT32, (int64_t[]){-1}, 1));
    /* a dtype that does not fit */
    int64_t two[1] = {2};
    zd_tensor_t *ints = zd_tensor_new(ZD_INT64, two, 1);
    assert_non_null(ints);
    REFUSED(zd_tensor_sum(ints, &o));
    REFUSED(zd_tensor_add(ints, a, &o));
    /* a backward pass given a gradient that does not fit its root */
    zd_tensor_t *leaf = vec(2), *sum = NULL;
    assert_int_equal(zd_tensor_set_requires_grad(leaf, true), 0);
    assert_int_equal(zd_tensor_sum(leaf, &sum), 0);
    REFUSED(zd_autograd_backward(sum, b, true));
    zd_tensor_t *one_int = zd_tensor_new(ZD_INT64, (int64_t[]){1}, 1);
    assert_non_null(one_int);
    REFUSED(zd_autograd_backward(sum, one_int, true));
    REFUSED(zd_autograd_backward(leaf, NULL, true)); /* not a scalar */
    zd_tensor_unref(one_int);
    zd_tensor_unref(sum);
    zd_tensor_unref(leaf);
    /* an index out of range */
    int64_t *idx = zd_tensor_data_i64(ints);
    idx[0] = 0;
    idx[1] = 7;
    REFUSED(zd_nn_nll_loss(m, ints, &o));
    REFUSED(zd_nn_embedding(ints, m, -1, &o));

    /* bad hyper-parameters */
    zd_optim_config_t cfg = zd_optim_sgd_defaults(-0.1);
    REFUSED(zd_optim_config_check(&cfg));
    cfg = zd_optim_sgd_defaults(0.1);
    cfg.momentum = -1;
    REFUSED_NULL(zd_optim_new(&cfg, &a, 1));
    cfg = zd_optim_adam_defaults();
    cfg.beta1 = 1.5;
    REFUSED(zd_optim_config_check(&cfg));
    zd_optim_config_t got;
    REFUSED(zd_optim_config_parse("sgd lr=0.1 bogus=1", &got, sizeof got));
    zd_rng_t rng;
    zd_rng_seed(&rng, 3);
    REFUSED(zd_nn_dropout(a, 1.5f, true, &rng, &o));
    REFUSED(zd_nn_max_pool2d(m, 0, 1, &o));

    zd_tensor_unref(ints);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    zd_tensor_unref(m);
    zd_tensor_unref(w);
    assert_int_equal(zd_tensor_live_count(), live);
}

static int setup(void **state)
{
    (void)state;
    return tmpdir_setup("test_null_args");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_autograd_and_tensor),
        cmocka_unit_test(test_nn),
        cmocka_unit_test(test_modules),
        cmocka_unit_test(test_optim),
        cmocka_unit_test(test_data),
        cmocka_unit_test(test_bad_arguments),
    };
#ifdef ZD_NULL_SWEEP
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    printf("%d calls not refused with ZD_ERR_ARGUMENT\n", sweep_bad);
    return rc || sweep_bad;
#else
    return cmocka_run_group_tests(tests, setup, teardown);
#endif
}
