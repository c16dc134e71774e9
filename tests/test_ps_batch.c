/* SPDX-License-Identifier: MIT */
/*  ps_batch (the tutorial "Batch RPC Processing Using Asynchronous
    Executions") in worlds of real processes started through the launcher:
    --mode=ps with a server and 3 trainers, where every trainer finishes its
    batches and the server steps exactly once per round; --mode=rl with an
    agent and 3 observers, where the agent runs exactly one policy forward
    per step of all observers. Programs are found in ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/program.h"

static void test_ps_one_step_per_round(void **state)
{
    (void)state;
    char *out, key[64];
    assert_int_equal(
        program_run_world("examples/ps_batch", 4, "--mode=ps --num_batches=5", true, &out), 0);
    for (int r = 1; r <= 3; r++) {
        snprintf(key, sizeof key, "trainer%d: finished 5 batches", r);
        if (!strstr(out, key))
            fail_msg("no \"%s\" line", key);
        /* every batch's pull got the model of that round's step */
        snprintf(key, sizeof key, "trainer%d: batch 5  loss", r);
        const char *p = strstr(out, key);
        assert_non_null(p);
        assert_non_null(strstr(p, "model version 5\n"));
    }
    assert_non_null(strstr(out, "ps: 5 optimizer steps, one per round of 3 trainers"));
    assert_non_null(strstr(out, "launch: 4 processes finished"));
    free(out);
}

static void test_rl_one_forward_per_step(void **state)
{
    (void)state;
    char *out;
    assert_int_equal(
        program_run_world("examples/ps_batch", 4, "--mode=rl --episodes=3 --steps=40", true, &out),
        0);
    assert_non_null(strstr(out, "Episode 0\tLast reward: "));
    assert_non_null(strstr(out, "Episode 2\tLast reward: "));
    const char *p = strstr(out, "agent: ");
    long long forwards, calls, observers, episodes, steps;
    assert_non_null(p);
    assert_int_equal(sscanf(p,
                            "agent: %lld policy forwards for %lld select_action calls of %lld "
                            "observers, %lld episodes of %lld steps",
                            &forwards, &calls, &observers, &episodes, &steps),
                     5);
    assert_int_equal(observers, 3);
    assert_int_equal(episodes, 3);
    assert_int_equal(steps, 40);
    assert_int_equal(forwards, episodes * steps); /* one forward per step of all observers */
    assert_int_equal(calls, forwards * observers);
    assert_non_null(strstr(out, "launch: 4 processes finished"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ps_one_step_per_round),
        cmocka_unit_test(test_rl_one_forward_per_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
