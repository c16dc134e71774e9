/* SPDX-License-Identifier: MIT */
/*  rnn_rpc (the RPC tutorial's distributed RNN: RemoteModules on a
    parameter server, the LSTM on the trainers) in worlds of real processes
    started through the launcher, as a user would: the loss falls, several
    trainers share one server, bad input is refused clearly. Programs are
    found in ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    assert_int_equal(sscanf(p + strlen(key), "%lf (mean of the first 10 steps) to %lf", &first,
                            &last), 2);
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
    assert_int_equal(run_world(2, "--iterations=100 --nhid=64 --bptt=20 --log_interval=50",
                               true, &out), 0);
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
    assert_int_equal(run_world(3, "--iterations=60 --nhid=32 --nlayers=1 --bptt=20 "
                                  "--log_interval=30 --sample=false",
                               true, &out), 0);
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
    assert_int_not_equal(run_world(2, "--data=/nonexistent/text --iterations=5", false, &out),
                         0);
    assert_non_null(strstr(out, "cannot open the text /nonexistent/text"));
    free(out);
    assert_int_not_equal(run_world(1, "--iterations=5", false, &out), 0);
    assert_non_null(strstr(out, "needs a world of 2 processes at least"));
    free(out);
    assert_int_not_equal(run_world(2, "--dropout=1.5", false, &out), 0);
    assert_non_null(strstr(out, "--dropout in [0, 1)"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_falls),
        cmocka_unit_test(test_two_trainers_share_the_ps),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
