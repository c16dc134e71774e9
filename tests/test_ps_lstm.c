/* SPDX-License-Identifier: MIT */
/*  ps_lstm (rnn_rpc's language model on sharded push/pull parameter
    servers) in a world of real processes started through the launcher:
    2 shards and 3 trainers, asynchronous; every trainer's loss falls from
    a guess (ln 76 = 4.33 for the GPL's 76 characters), and the shards
    took every push that was not refused. Programs are found in
    ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/program.h"

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

static void test_three_trainers_two_shards(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(program_run_world("examples/ps_lstm", 5, "--iterations=100", true, &out), 0);
    loss_fell(out, "trainer0", 0.3);
    loss_fell(out, "trainer1", 0.3);
    loss_fell(out, "trainer2", 0.3);
    assert_non_null(strstr(out, "ps0: "));
    assert_non_null(strstr(out, "ps1: "));
    assert_non_null(strstr(out, "launch: 5 processes finished"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_trainers_two_shards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
