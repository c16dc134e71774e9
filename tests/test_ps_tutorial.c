/* SPDX-License-Identifier: MIT */
/*  ps_tutorial (PyTorch's parameter-server tutorial on the remote model of
    <zdist/ps.h>) in a world of real processes started through the
    launcher: one server and three trainers, 60 batches each on the default
    data (Fashion-MNIST). Every trainer reaches an accuracy far above
    chance (10 %), the server ran every forward (training and evaluation)
    the trainers sent, and the tutorial's lines are printed; the same with
    the Net in two stages on two servers (--num_servers=2). Programs are
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

/*  60 batches of 32 by each of three trainers at lr 0.03 are 5760 samples,
    a tenth of an epoch; rpc_ps's Net scores 70-80 % on the first 1000 test
    images after that (seeds 1-3). 50 % is five times chance and leaves a
    wide margin. */
#define MIN_ACCURACY 50.0

/*  Trainer rank's "test accuracy" line in out is above MIN_ACCURACY. */
static void check_accuracy(const char *out, int rank)
{
    char key[64];
    snprintf(key, sizeof key, "Rank %d test accuracy ", rank);
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("no \"%s\" line", key);
    double acc = atof(p + strlen(key));
    fprintf(stderr, "trainer %d: %.2f %%\n", rank, acc);
    if (!(acc > MIN_ACCURACY))
        fail_msg("trainer %d: accuracy %.2f %%, expected more than %.0f %%", rank, acc,
                 MIN_ACCURACY);
}

static void test_one_server_three_trainers(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(program_run_world("examples/ps_tutorial", 4,
                                       "--max_batches=60 --eval_samples=1000 --log_interval=20",
                                       true, &out),
                     0);
    for (int rank = 1; rank <= 3; rank++) {
        check_accuracy(out, rank);
        char key[64];
        snprintf(key, sizeof key, "Rank %d training batch 40 loss ", rank);
        assert_non_null(strstr(out, key));
    }
    /* 3 x 60 training forwards and 3 x 2 evaluation forwards of 500. */
    assert_non_null(strstr(out, "parameter server: 186 forwards served"));
    assert_non_null(strstr(out, "Training complete!"));
    assert_non_null(strstr(out, "launch: 4 processes finished"));
    free(out);
}

/*  --num_servers=2: the Net in two stages, its convolutions on rank 0
    and its linear layers on rank 1, two trainers. Each stage ran every
    forward (2 x 60 training and 2 x 2 evaluation), and the trainers learn
    as with one server: 3840 samples gave 73.4 % on the first 1000 test
    images (seed 1), MIN_ACCURACY still far below. */
static void test_two_stages_two_trainers(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(program_run_world("examples/ps_tutorial", 4,
                                       "--num_servers=2 --max_batches=60 --eval_samples=1000 "
                                       "--log_interval=20",
                                       true, &out),
                     0);
    for (int rank = 2; rank <= 3; rank++)
        check_accuracy(out, rank);
    assert_non_null(strstr(out, "parameter server 0: 124 forwards served"));
    assert_non_null(strstr(out, "parameter server 1: 124 forwards served"));
    assert_non_null(strstr(out, "launch: 4 processes finished"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_server_three_trainers),
        cmocka_unit_test(test_two_stages_two_trainers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
