/* SPDX-License-Identifier: MIT */
/*  Pieces the training programs share: where a resumed run goes on, at
    and around epoch boundaries (rpc_ps --resume). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>

#include "examples/train_common.h"

static void test_resume_position(void **state)
{
    (void)state;
    const struct {
        int64_t done, per_epoch, epoch, batch;
    } cases[] = {
        {0, 1875, 0, 0},    {10, 1875, 0, 10},          {1874, 1875, 0, 1874}, {1875, 1875, 1, 0},
        {1876, 1875, 1, 1}, {2 * 1875 + 5, 1875, 2, 5}, {7, 1, 7, 0},          {5, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t epoch = -1, batch = -1;
        train_resume_position(cases[i].done, cases[i].per_epoch, &epoch, &batch);
        assert_int_equal(epoch, cases[i].epoch);
        assert_int_equal(batch, cases[i].batch);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_position),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
