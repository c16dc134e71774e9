/* SPDX-License-Identifier: MIT */
/*  ps_lstm (rnn_rpc's language model on sharded push/pull parameter
    servers) in a world of real processes started through the launcher:
    2 shards and 3 trainers, asynchronous; every trainer's loss falls from
    a guess (ln 76 = 4.33 for the GPL's 76 characters), and the shards
    took every push that was not refused. With --checkpoint, a second run
    with --resume starts each shard at its last checkpoint of the first;
    a shard killed at its 25th step (ZDIST_FAULT) and started again by
    the launcher (--max_restarts, which adds --resume) serves from its
    checkpoint of step 20 while the trainers wait for it, and every
    trainer finishes. Programs are found in ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/program.h"

/*  The number after "<who>: <what> " in out. */
static long long after(const char *out, const char *who, const char *what)
{
    char key[96];
    snprintf(key, sizeof key, "%s: %s ", who, what);
    const char *p = strstr(out, key);
    if (!p)
        fail_msg("no \"%s\" line", key);
    return atoll(p + strlen(key));
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

/*  "ps0: 87 steps taken": the shard's version at its end. */
static long long steps_taken(const char *out, const char *who)
{
    char key[64];
    snprintf(key, sizeof key, "%s: ", who);
    for (const char *p = strstr(out, key); p; p = strstr(p + 1, key)) {
        long long n;
        char word[16];
        if (sscanf(p + strlen(key), "%lld %15s taken", &n, word) == 2 && !strcmp(word, "steps"))
            return n;
    }
    fail_msg("no \"%ssteps taken\" line", key);
    return -1;
}

static void test_checkpoint_resume(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_lstm_XXXXXX", flags[256];
    assert_non_null(mkdtemp(dir));
    snprintf(flags, sizeof flags, "--iterations=30 --checkpoint=%s/ck --checkpoint_every=20", dir);
    char *out;
    assert_int_equal(program_run_world("examples/ps_lstm", 5, flags, true, &out), 0);
    long long first[2] = {steps_taken(out, "ps0"), steps_taken(out, "ps1")};
    free(out);
    snprintf(flags, sizeof flags,
             "--iterations=10 --checkpoint=%s/ck --checkpoint_every=20 --resume", dir);
    assert_int_equal(program_run_world("examples/ps_lstm", 5, flags, true, &out), 0);
    const char *who[2] = {"ps0", "ps1"};
    for (int s = 0; s < 2; s++) {
        long long start = after(out, who[s], "starting at step");
        fprintf(stderr, "%s: %lld steps in the first run, resumed at %lld\n", who[s], first[s],
                start);
        assert_true(first[s] >= 20);
        assert_int_equal(start, first[s] / 20 * 20);
    }
    free(out);
    snprintf(flags, sizeof flags, "rm -rf %s", dir);
    assert_int_equal(system(flags), 0);
}

static void test_shard_killed_and_resumed(void **state)
{
    (void)state;
    char dir[] = "/tmp/zd_ps_lstm_XXXXXX", ck[64];
    assert_non_null(mkdtemp(dir));
    snprintf(ck, sizeof ck, "--checkpoint=%s/ck", dir);
    char *argv[] = {(char *)program_path("tools/launch"),
                    "--nproc=5",
                    "--timeout_s=600",
                    "--max_restarts=1",
                    "--",
                    (char *)program_path("examples/ps_lstm"),
                    "--iterations=40",
                    ck,
                    "--checkpoint_every=10",
                    "--server_wait_s=120",
                    NULL};
    setenv("ZDIST_FAULT", "1:step:kill:25", 1);
    char *out;
    int status = program_run(argv, 660, true, &out);
    unsetenv("ZDIST_FAULT");
    assert_int_equal(status, 0);
    /* the first life of shard 1 started at 0, the second at its checkpoint */
    assert_int_equal(after(out, "ps1", "starting at step"), 0);
    const char *second = strstr(strstr(out, "ps1: starting at step") + 1, "ps1: starting at step");
    assert_non_null(second);
    assert_int_equal(after(second, "ps1", "starting at step"), 20);
    assert_non_null(strstr(out, "waiting up to 120 s for it"));
    loss_fell(out, "trainer0", 0.2);
    loss_fell(out, "trainer1", 0.2);
    loss_fell(out, "trainer2", 0.2);
    free(out);
    char rm[64];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    assert_int_equal(system(rm), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_trainers_two_shards),
        cmocka_unit_test(test_checkpoint_resume),
        cmocka_unit_test(test_shard_killed_and_resumed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
