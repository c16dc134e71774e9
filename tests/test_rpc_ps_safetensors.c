/* SPDX-License-Identifier: MIT */
/*  rpc_ps --save_model and --init_from (issue 30), run through the
    launcher as a user would:
      - a world of two server shards and a trainer trains 30 batches and
        rank 0 writes the Net, gathered from both shards, to one
        safetensors file; zdist's Net loaded from it scores on the first
        1,000 test images what rpc_ps printed, to the image; PyTorch's Net
        loaded from it (tests/safetensors_models_torch.py, skipped without
        torch) gives the same log-probabilities within 1e-5, the same
        argmax for every image, the same accuracy;
      - the file given back with --init_from (and a learning rate too small
        to move a weight) gives the same test accuracy again;
      - zdist-export makes the same file from the world's sharded
        checkpoint of the last batch;
      - bad --save_model and --init_from values are refused by name.
    Programs are found in ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <zdist/autograd.h>
#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/safetensors.h>
#include "tests/support/fixtures.h"
#include "tests/support/program.h"

#define IMAGES 1000

static char launch_bin[1024], ps_bin[1024], local_bin[1024], export_bin[1024];

/*  The number after the last `key` in text (-1 when none). */
static double number_after(const char *text, const char *key)
{
    double v = -1;
    for (const char *p = text; (p = strstr(p, key)); p += strlen(key))
        v = strtod(p + strlen(key), NULL);
    return v;
}

/*  rpc_ps on 2 shards and 1 trainer with extra flags; its output. */
static char *run_world(const char *flag1, const char *flag2, const char *flag3)
{
    char *out;
    char *argv[] = {launch_bin,    "--nproc=3",       "--",
                    ps_bin,        "--num_servers=2", "--max_batches=30",
                    "--seed=3",    "--progress_s=0",  "--eval_samples=1000",
                    (char *)flag1, (char *)flag2,     (char *)flag3,
                    NULL};
    assert_int_equal(program_run(argv, 300, true, &out), 0);
    return out;
}

static void test_save_model_loads_in_pytorch(void **state)
{
    (void)state;
    need_data();
    char model[700], io_path[700], save[800], init[800], ck[700], ck_flag[800], exported[700];
    snprintf(model, sizeof model, "%s", tmp_path("rpc_ps.safetensors"));
    snprintf(io_path, sizeof io_path, "%s", tmp_path("rpc_ps_io.safetensors"));
    snprintf(ck, sizeof ck, "%s", tmp_path("ck"));
    snprintf(exported, sizeof exported, "%s", tmp_path("exported.safetensors"));
    snprintf(save, sizeof save, "--save_model=%s", model);
    snprintf(ck_flag, sizeof ck_flag, "--checkpoint=%s", ck);

    char *out = run_world(save, ck_flag, "--checkpoint_every=10");
    double acc = number_after(out, "Rank 2 test accuracy ");
    assert_non_null(strstr(out, "saved model"));
    free(out);
    printf("rpc_ps: test accuracy %.2f %% on %d images\n", acc, IMAGES);
    assert_true(acc > 0);

    /* zdist's Net from the file, on the same images */
    zd_strings_t *meta;
    zd_named_tensors_t *w = zd_safetensors_read(model, &meta);
    if (!w)
        fail_msg("%s", zd_error_last());
    assert_int_equal(zd_named_tensors_len(w), 8);
    const char *meta_acc = zd_strings_value(meta, "test_accuracy");
    const char *meta_step = zd_strings_value(meta, "step");
    assert_non_null(meta_acc);
    assert_non_null(meta_step);
    assert_string_equal(meta_step, "30");
    int64_t correct_meta = (int64_t)(atof(meta_acc) * IMAGES + 0.5);
    zd_strings_free(meta);

    /* the checkpoint of batch 30, exported: the same tensors */
    char *eargv[] = {export_bin, ck, exported, NULL};
    assert_int_equal(program_run(eargv, 120, true, &out), 0);
    printf("%s", out);
    free(out);
    zd_named_tensors_t *e = zd_safetensors_read(exported, NULL);
    if (!e)
        fail_msg("%s", zd_error_last());
    assert_int_equal(zd_named_tensors_len(e), 8);
    for (int i = 0; i < 8; i++) {
        zd_tensor_t *a = zd_named_tensors_tensor(w, i);
        zd_tensor_t *b = zd_named_tensors_find(e, zd_named_tensors_name(w, i));
        assert_non_null(b);
        assert_true(zd_tensor_same_shape(a, b));
        if (memcmp(zd_tensor_raw(a), zd_tensor_raw(b), zd_tensor_nbytes(a)) != 0)
            fail_msg("exported \"%s\" differs from --save_model's", zd_named_tensors_name(w, i));
    }
    zd_named_tensors_free(e);
    zd_named_tensors_free(w);

    zd_nn_module_t *net = zd_nn_net_new(1);
    zd_named_tensors_t *sd = zd_named_tensors_new();
    for (int i = 0; i < zd_nn_module_n_params(net); i++)
        assert_int_equal(
            zd_named_tensors_add(sd, zd_nn_module_param_name(net, i), zd_nn_module_param(net, i)),
            0);
    if (zd_safetensors_load(sd, model, true, NULL) < 0)
        fail_msg("%s", zd_error_last());
    zd_named_tensors_free(sd);
    zd_nn_module_train(net, false);
    zd_dataset_t *test = zd_dataset_load(NULL, ZD_DATASET_TEST);
    assert_non_null(test);
    zd_tensor_t *x, *y, *lp;
    assert_int_equal(zd_dataset_batch(test, NULL, 0, IMAGES, &x, &y), 0);
    bool prev = zd_autograd_set_grad_enabled(false);
    assert_int_equal(zd_nn_module_forward(net, &x, 1, &lp, 1), 0);
    zd_autograd_set_grad_enabled(prev);
    int64_t correct = zd_nn_accuracy(lp, y);
    printf("zdist's Net from the file: %lld of %d images, rpc_ps %.2f %%, metadata %lld\n",
           (long long)correct, IMAGES, acc, (long long)correct_meta);
    assert_int_equal(correct, (int64_t)(acc * IMAGES / 100 + 0.5));
    assert_int_equal(correct, correct_meta);

    zd_named_tensors_t *io = zd_named_tensors_new();
    assert_int_equal(zd_named_tensors_add(io, "x", x), 0);
    assert_int_equal(zd_named_tensors_add(io, "logprobs", lp), 0);
    assert_int_equal(zd_named_tensors_add(io, "y", y), 0);
    assert_int_equal(zd_safetensors_write(io, io_path, NULL), 0);
    zd_named_tensors_free(io);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    zd_tensor_unref(lp);
    zd_dataset_free(test);
    zd_nn_module_free(net);

    /* back into rpc_ps: the same weights score the same */
    snprintf(init, sizeof init, "--init_from=%s", model);
    out = run_world(init, "--lr=1e-30", NULL);
    double again = number_after(out, "Rank 2 test accuracy ");
    assert_non_null(strstr(out, "initial weights from"));
    free(out);
    printf("rpc_ps --init_from: test accuracy %.2f %%\n", again);
    assert_true(again == acc);

    /* PyTorch's Net from the file */
    char args[2200], pout[8192];
    snprintf(args, sizeof args, "%s %s", model, io_path);
    torch_script("safetensors_models_torch.py", args, pout, sizeof pout);
    assert_contains(pout, "PyTorch's outputs equal zdist's");
    char want[64];
    snprintf(want, sizeof want, "PyTorch's accuracy: %lld of %d", (long long)correct, IMAGES);
    assert_contains(pout, want);
}

/*  Runs argv (one process, no world): expects exit status `status` and
    `needle` in its output. */
static void expect_refused(char *const argv[], int status, const char *needle)
{
    char *out;
    int rc = program_run(argv, 120, false, &out);
    printf("%s", out ? out : "");
    assert_int_equal(rc, status);
    assert_non_null(out);
    assert_contains(out, needle);
    free(out);
}

static void test_bad_flags_refused(void **state)
{
    (void)state;
    char lstm[1200], bad_dir[64] = "--save_model=/nonexistent/zdist/net.safetensors";
    snprintf(lstm, sizeof lstm, "--init_from=%s/safetensors/lstm.safetensors", tests_dir());
    char *a[] = {ps_bin, "--world_size=2", "--rank=0", bad_dir, NULL};
    expect_refused(a, 2, "cannot write in /nonexistent/zdist");
    char *b[] = {ps_bin, "--world_size=2", "--rank=0", "--init_from=/nonexistent.safetensors",
                 NULL};
    expect_refused(b, 2, "--init_from=/nonexistent.safetensors: No such file");
    char *c[] = {ps_bin, "--world_size=2", "--rank=0", "--save_model=", NULL};
    expect_refused(c, 2, "take a file name");
    /* a file of another model: the server names what is missing */
    char *d[] = {ps_bin, "--world_size=2", "--rank=0", lstm, NULL};
    expect_refused(d, 1, "no tensor \"conv1.weight\" in the file");
    char *e[] = {local_bin, "--init_from=x.safetensors", "--load=x.ckpt", NULL};
    expect_refused(e, 2, "use one");
    char *f[] = {export_bin, "/nonexistent/ck", "out.safetensors", NULL};
    expect_refused(f, 1, "/nonexistent/ck.shard0");
    char *g[] = {export_bin, "only-one-argument", NULL};
    expect_refused(g, 2, "usage");
}

static int setup(void **state)
{
    (void)state;
    snprintf(launch_bin, sizeof launch_bin, "%s", program_path("tools/launch"));
    snprintf(ps_bin, sizeof ps_bin, "%s", program_path("examples/rpc_ps"));
    snprintf(local_bin, sizeof local_bin, "%s", program_path("examples/train_local"));
    snprintf(export_bin, sizeof export_bin, "%s", program_path("tools/zdist-export"));
    return tmpdir_setup("rpc_ps_safetensors");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_flags_refused),
        cmocka_unit_test(test_save_model_loads_in_pytorch),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
