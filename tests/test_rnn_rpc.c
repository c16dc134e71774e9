/* SPDX-License-Identifier: MIT */
/*  rnn_rpc (the RPC tutorial's distributed RNN: RemoteModules on a
    parameter server, the LSTM on the trainers) in worlds of real processes
    started through the launcher, as a user would: the loss falls, several
    trainers share one server, bad input is refused clearly, the model goes
    out to a safetensors file under PyTorch's names and back in
    (--save_model, --init_from). Programs are found in ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/safetensors.h>
#include "tests/support/fixtures.h"
#include "tests/support/program.h"

/*  "launch --nproc=n -- rnn_rpc flags" to its end: its exit status and
    output (to free). */
static int run_world(int n, const char *flags, bool expect_ok, char **output)
{
    return program_run_world("examples/rnn_rpc", n, flags, expect_ok, output);
}

/*  "<who>: loss went from A (mean of the first 10 steps) to B (...)". */
static void loss_fell(const char *out, const char *who, double margin)
{
    char key[64];
    snprintf(key, sizeof key, "%s: loss went from ", who);
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("no \"%s\" line", key);
    double first, last;
    assert_int_equal(
        sscanf(p + strlen(key), "%lf (mean of the first 10 steps) to %lf", &first, &last), 2);
    fprintf(stderr, "%s: loss %.4f -> %.4f\n", who, first, last);
    if (!(last < first - margin))
        fail_msg("%s: loss %.4f -> %.4f, expected a fall of more than %g", who, first, last,
                 margin);
}

/*  One ps, one trainer, 100 steps of a small model: from a guess (ln 76 =
    4.33 for the GPL's 76 characters) the loss falls by 0.75 in this run
    (deterministic: one trainer, seeded weights, masks and data); asking
    for half that leaves room for another BLAS's rounding. The trained
    model then writes its line through the RemoteModules. */
static void test_loss_falls(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(
        run_world(2, "--iterations=100 --nhid=64 --bptt=20 --log_interval=50", true, &out), 0);
    assert_non_null(strstr(out, "trainer1: 35149 characters of"));
    assert_non_null(strstr(out, "parameter tensors on 2 owners"));
    assert_non_null(strstr(out, "trainer1: step   100/100"));
    assert_non_null(strstr(out, "trainer1: the model writes: \""));
    loss_fell(out, "trainer1", 0.35);
    assert_non_null(strstr(out, "launch: 2 processes finished"));
    free(out);
}

/*  Two trainers, each with its own RemoteModules on the one ps. */
static void test_two_trainers_share_the_ps(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(run_world(3,
                               "--iterations=60 --nhid=32 --nlayers=1 --bptt=20 "
                               "--log_interval=30 --sample=false",
                               true, &out),
                     0);
    loss_fell(out, "trainer1", 0.2);
    loss_fell(out, "trainer2", 0.2);
    assert_non_null(strstr(out, "launch: 3 processes finished"));
    free(out);
}

/*  A missing text and a world without a trainer fail, saying why. */
static void test_bad_input(void **state)
{
    (void)state;
    char *out;
    assert_int_not_equal(run_world(2, "--data=/nonexistent/text --iterations=5", false, &out), 0);
    assert_non_null(strstr(out, "cannot open the text /nonexistent/text"));
    free(out);
    assert_int_not_equal(run_world(1, "--iterations=5", false, &out), 0);
    assert_non_null(strstr(out, "needs a world of 2 processes at least"));
    free(out);
    assert_int_not_equal(run_world(2, "--dropout=1.5", false, &out), 0);
    assert_non_null(strstr(out, "--dropout in [0, 1)"));
    free(out);
}

static zd_named_tensors_t *read_file(const char *path, zd_strings_t **meta)
{
    zd_named_tensors_t *nt = zd_safetensors_read(path, meta);
    if (!nt)
        fail_msg("%s", zd_error_last());
    return nt;
}

/*  Whether tensor `name` holds the same bytes in a and b. */
static bool same_tensor(const zd_named_tensors_t *a, const zd_named_tensors_t *b, const char *name)
{
    zd_tensor_t *x = zd_named_tensors_find(a, name), *y = zd_named_tensors_find(b, name);
    if (!x || !y)
        fail_msg("no tensor \"%s\"", name);
    return zd_tensor_dtype(x) == zd_tensor_dtype(y) && zd_tensor_same_shape(x, y) &&
        memcmp(zd_tensor_raw(x), zd_tensor_raw(y), zd_tensor_nbytes(x)) == 0;
}

/*  --save_model after a few steps writes the whole model (the embedding
    and decoder fetched from ps) under PyTorch's names; --init_from of that
    file with no training step saves the same tensors again, bit for bit,
    where the seed alone gives other weights (so the remote parts were
    loaded on ps, not only the local LSTM). A file of another model (the
    Net) and bad file names are refused, naming what is wrong. */
static void test_save_model_init_from(void **state)
{
    (void)state;
    char a[700], b[700], seed[700], flags[2400];
    snprintf(a, sizeof a, "%s", tmp_path("a.safetensors"));
    snprintf(b, sizeof b, "%s", tmp_path("b.safetensors"));
    snprintf(seed, sizeof seed, "%s", tmp_path("seed.safetensors"));
    const char *model = "--nhid=32 --nlayers=2 --bptt=10 --sample=false";
    char *out;

    snprintf(flags, sizeof flags, "%s --iterations=5 --save_model=%s", model, a);
    assert_int_equal(run_world(2, flags, true, &out), 0);
    assert_contains(out, "trainer1: saved model ");
    free(out);
    snprintf(flags, sizeof flags, "%s --iterations=0 --init_from=%s --save_model=%s", model, a, b);
    assert_int_equal(run_world(2, flags, true, &out), 0);
    assert_contains(out, "trainer1: initial weights from ");
    assert_contains(out, "trainer1: saved model ");
    free(out);
    snprintf(flags, sizeof flags, "%s --iterations=0 --save_model=%s", model, seed);
    assert_int_equal(run_world(2, flags, true, &out), 0);
    free(out);

    zd_strings_t *meta;
    zd_named_tensors_t *ta = read_file(a, &meta);
    assert_non_null(zd_strings_value(meta, "step"));
    assert_string_equal(zd_strings_value(meta, "step"), "5");
    assert_string_equal(zd_strings_value(meta, "ntoken"), "76");
    assert_string_equal(zd_strings_value(meta, "nlayers"), "2");
    assert_non_null(zd_strings_value(meta, "vocab"));
    zd_strings_free(meta);
    zd_named_tensors_t *tb = read_file(b, NULL), *ts = read_file(seed, NULL);
    static const char *const names[] = {
        "encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0",
        "rnn.bias_hh_l0", "rnn.weight_ih_l1", "rnn.weight_hh_l1", "rnn.bias_ih_l1",
        "rnn.bias_hh_l1", "decoder.weight",   "decoder.bias",
    };
    int n = (int)(sizeof names / sizeof names[0]);
    assert_int_equal(zd_named_tensors_len(ta), n);
    assert_int_equal(zd_named_tensors_len(tb), n);
    /* the embedding is (ntoken, ninp): the GPL's 76 characters, --ninp's 32 */
    zd_tensor_t *e = zd_named_tensors_find(ta, "encoder.weight");
    assert_non_null(e);
    assert_int_equal(zd_tensor_size(e, 0), 76);
    assert_int_equal(zd_tensor_size(e, 1), 32);
    for (int i = 0; i < n; i++) {
        if (!same_tensor(ta, tb, names[i]))
            fail_msg("\"%s\" saved after --init_from differs from the file given", names[i]);
        if (same_tensor(ta, ts, names[i]))
            fail_msg("\"%s\" of the seed's weights equals the trained one", names[i]);
    }
    zd_named_tensors_free(ta);
    zd_named_tensors_free(tb);
    zd_named_tensors_free(ts);

    /* the Net's file: the first tensor of the model it lacks */
    snprintf(flags, sizeof flags, "%s --iterations=1 --init_from=%s/safetensors/net.safetensors",
             model, tests_dir());
    assert_int_not_equal(run_world(2, flags, false, &out), 0);
    assert_contains(out, "no tensor \"encoder.weight\" in the file");
    free(out);
    /* another LSTM size: the tensor and both shapes */
    snprintf(flags, sizeof flags, "--nhid=64 --sample=false --iterations=1 --init_from=%s", a);
    assert_int_not_equal(run_world(2, flags, false, &out), 0);
    assert_contains(out,
                    "tensor \"rnn.weight_ih_l0\" is float32 (128, 32), the model's is "
                    "float32 (256, 32)");
    free(out);
    assert_int_not_equal(run_world(2, "--init_from=/nonexistent.safetensors", false, &out), 0);
    assert_contains(out, "--init_from=/nonexistent.safetensors: No such file");
    free(out);
    assert_int_not_equal(run_world(2, "--save_model=/nonexistent/zdist/m.safetensors", false, &out),
                         0);
    assert_contains(out, "cannot write in /nonexistent/zdist");
    free(out);
    assert_int_not_equal(run_world(2, "--save_model=", false, &out), 0);
    assert_contains(out, "take a file name");
    free(out);
}

static int setup(void **state)
{
    (void)state;
    return tmpdir_setup("rnn_rpc");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_two_trainers_share_the_ps),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_save_model_init_from),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
