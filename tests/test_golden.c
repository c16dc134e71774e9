/* SPDX-License-Identifier: MIT */
/*  Runs tools/golden_check over every case folder of the golden directory
    (ZDIST_GOLDEN_DIR): folders are listed at run time, so new cases of known
    kinds are checked without any code change. */
#include "tests/support/golden_cases.h"

typedef struct {
    int failed;
} tally_t;

static void check_case(const char *dir, void *arg)
{
    tally_t *t = arg;
    int rc = golden_check_run(dir);
    if (rc != 0) {
        print_error("golden case %s failed (exit %d)\n", dir, rc);
        t->failed++;
    }
}

static void test_every_golden_case_passes(void **state)
{
    (void)state;
    tally_t t = {0};
    int cases = golden_each_dir(golden_root(), check_case, &t);
    if (cases < 0)
        fail_msg("cannot open the golden folder %s (set ZDIST_GOLDEN_DIR)", golden_root());
    assert_true(cases > 0);
    assert_int_equal(t.failed, 0);
}

/*  The checker must fail on a case whose numbers are wrong: a copy of a
    case with its expected output's last float corrupted. */
static void test_checker_catches_a_wrong_value(void **state)
{
    (void)state;
    golden_expect_caught(golden_root(), "relu", "output.y.idx", -4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_golden_case_passes),
        cmocka_unit_test(test_checker_catches_a_wrong_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
