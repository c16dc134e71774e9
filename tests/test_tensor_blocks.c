/* SPDX-License-Identifier: MIT */
/*  Large tensors' memory (core/blocks.c): a freed block is reused by the
    next tensor of its size, zeroed when the tensor asks for zeros, its idle
    blocks are bounded, and a request none fits gives back blocks that sat
    unused. Under AddressSanitizer nothing is kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdint.h>
#include <string.h>

#include "autograd/autograd_private.h"
#include <zdist/tensor.h>

static zd_tensor_t *floats(int64_t n, bool zero)
{
    zd_tensor_t *t = zero ? zd_tensor_new(ZD_FLOAT32, &n, 1) : zd_tensor_empty(ZD_FLOAT32, &n, 1);
    assert_non_null(t);
    return t;
}

static uintptr_t page_of(const zd_tensor_t *t)
{
    return (uintptr_t)zd_tensor_raw(t) & ~(uintptr_t)4095;
}

static void test_freed_block_is_reused_and_zeroed(void **state)
{
    (void)state;
    zd__blocks_trim();
    zd_tensor_t *a = floats(100000, false); /* 400 kB */
    assert_int_equal((uintptr_t)zd_tensor_raw(a) % 64, 0);
    float *d = zd_tensor_data(a);
    for (int i = 0; i < 100000; i++)
        d[i] = 1.0f;
    uintptr_t page = page_of(a);
    zd_tensor_unref(a);
    assert_int_equal(zd__blocks_idle_bytes() > 0, ZD_BLOCKS_KEEP);

    zd_tensor_t *b = floats(100000, true); /* zd_tensor_new: zeros */
    if (ZD_BLOCKS_KEEP) {
        assert_int_equal(page_of(b), page);
        assert_int_equal(zd__blocks_idle_bytes(), 0);
    }
    d = zd_tensor_data(b);
    for (int i = 0; i < 100000; i++)
        assert_true(d[i] == 0.0f);
    zd_tensor_unref(b);

    /* A smaller one of the same block's half or more takes it too; a small
       tensor never comes from a block. */
    zd_tensor_t *c = floats(70000, false);
    if (ZD_BLOCKS_KEEP)
        assert_int_equal(page_of(c), page);
    zd_tensor_unref(c);
    size_t idle = zd__blocks_idle_bytes();
    zd_tensor_t *small = floats(1000, false);
    assert_int_equal(zd__blocks_idle_bytes(), idle);
    zd_tensor_unref(small);
}

static void test_idle_blocks_are_bounded(void **state)
{
    (void)state;
    zd__blocks_trim();
    /* 100 tensors of 4 MB, all alive at once, then all freed: 400 MB of
       blocks against a bound of 64 blocks and 256 MB. Untouched pages: only
       address space. */
    zd_tensor_t *t[100];
    for (int i = 0; i < 100; i++)
        t[i] = floats(1 << 20, false);
    for (int i = 0; i < 100; i++)
        zd_tensor_unref(t[i]);
    size_t idle = zd__blocks_idle_bytes();
    assert_true(idle <= (size_t)256 << 20);
    if (ZD_BLOCKS_KEEP)
        assert_true(idle >= (size_t)200 << 20);
    else
        assert_int_equal(idle, 0);
}

static void test_stale_blocks_make_room(void **state)
{
    (void)state;
    zd__blocks_trim();
    zd_tensor_unref(floats(300000, false)); /* 1.2 MB, then idle */
    size_t old = zd__blocks_idle_bytes();
    /* A working set reused in place: no request misses, nothing leaves. */
    for (int i = 0; i < 300; i++)
        zd_tensor_unref(floats(500000, false));
    size_t both = zd__blocks_idle_bytes();
    if (!ZD_BLOCKS_KEEP) {
        assert_int_equal(both, 0);
        return;
    }
    assert_true(both > old);
    /* A size no idle block fits: the block unused for 300 requests goes;
       the one just freed stays. */
    zd_tensor_t *big = floats(1250000, false);
    assert_int_equal(zd__blocks_idle_bytes(), both - old);
    zd_tensor_unref(big);
}

/*  Scratch memory (zd__mem_alloc): 64-byte aligned, writable to its end,
    a large one a block that goes back among the idle ones, a small one
    malloc's; every size given back whole (ASan checks the ends). */
static void test_scratch_memory(void **state)
{
    (void)state;
    zd__blocks_trim();
    const size_t sizes[] = {1,       64, 1000, ZD_MEM_BLOCK_MIN - 1, ZD_MEM_BLOCK_MIN, ZD_BLOCK_MIN,
                            3u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        unsigned char *p = zd__mem_alloc(sizes[i]);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 64, 0);
        memset(p, 0xab, sizes[i]);
        size_t idle = zd__blocks_idle_bytes();
        zd__mem_free(p);
        bool block = sizes[i] >= ZD_MEM_BLOCK_MIN;
        assert_int_equal(zd__blocks_idle_bytes() > idle, block && ZD_BLOCKS_KEEP);
    }
    zd__mem_free(NULL);
    assert_null(zd__mem_alloc(SIZE_MAX - 10));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_freed_block_is_reused_and_zeroed),
        cmocka_unit_test(test_idle_blocks_are_bounded),
        cmocka_unit_test(test_stale_blocks_make_room),
        cmocka_unit_test(test_scratch_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
