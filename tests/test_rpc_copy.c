/* SPDX-License-Identifier: MIT */
/*  Large copies shared with a helper thread (rpc/value/copy.c): every byte
    arrives and none beyond, at any size and alignment; the helper takes
    chunks once allowed and none after it is stopped; callers in several
    threads at once each get their own bytes; a forked child copies alone
    and can start its own helper. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rpc/value/copy.h"
#include "tests/support/world.h"

#define BIG ((size_t)33 << 20)

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (uint8_t)(seed >> 24);
    }
}

/*  Copies n bytes from src + off to dst + off of buffers of n + 2 * off and
    checks them, and that the off bytes either side were left alone. */
static bool copy_checked(uint8_t *dst, uint8_t *src, size_t n, size_t off, uint32_t seed)
{
    fill(src, n + 2 * off, seed);
    memset(dst, 0xee, n + 2 * off);
    zd__rpc_copy(dst + off, src + off, n);
    for (size_t i = 0; i < off; i++)
        if (dst[i] != 0xee || dst[off + n + i] != 0xee)
            return false;
    return memcmp(dst + off, src + off, n) == 0;
}

static void test_sizes(void **state)
{
    (void)state;
    uint8_t *src = malloc(BIG + 64), *dst = malloc(BIG + 64);
    assert_non_null(src);
    assert_non_null(dst);
    static const size_t sizes[] = {0,
                                   1,
                                   RPC_COPY_CHUNK - 1,
                                   RPC_COPY_SHARED_MIN - 1,
                                   RPC_COPY_SHARED_MIN,
                                   RPC_COPY_SHARED_MIN + 1,
                                   RPC_COPY_SHARED_MIN + RPC_COPY_CHUNK - 3,
                                   BIG};
    for (int on = 0; on < 2; on++) {
        zd__rpc_copy_enable(on);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (size_t off = 0; off < 8; off += 7)
                assert_true(copy_checked(dst, src, sizes[k], off, (uint32_t)(k * 31 + off)));
    }
    zd__rpc_copy_enable(false);
    free(src);
    free(dst);
}

static void test_helper_takes_part_until_stopped(void **state)
{
    (void)state;
    uint8_t *src = malloc(BIG), *dst = malloc(BIG);
    assert_non_null(src);
    assert_non_null(dst);
    /* Not allowed: copies alone. */
    long before = zd__rpc_copy_helped();
    for (int i = 0; i < 3; i++)
        assert_true(copy_checked(dst, src, BIG, 0, (uint32_t)i));
    assert_int_equal(zd__rpc_copy_helped(), before);

    /* Allowed: the helper wakes during some copy (how soon is the
       scheduler's business, so copies go on until it has). */
    zd__rpc_copy_enable(true);
    int64_t deadline = world_now_ms() + world_scaled_ms(30000);
    while (zd__rpc_copy_helped() == before && world_now_ms() < deadline)
        assert_true(copy_checked(dst, src, BIG, 0, 7));
    assert_true(zd__rpc_copy_helped() > before);

    /* Stopped: joined, and the copies are the caller's alone again. */
    zd__rpc_copy_enable(false);
    before = zd__rpc_copy_helped();
    for (int i = 0; i < 3; i++)
        assert_true(copy_checked(dst, src, BIG, 0, (uint32_t)i));
    assert_int_equal(zd__rpc_copy_helped(), before);
    free(src);
    free(dst);
}

typedef struct {
    uint32_t seed;
    bool ok;
} copier_t;

static void *copier(void *arg)
{
    copier_t *c = arg;
    size_t n = RPC_COPY_SHARED_MIN * 2 + c->seed * 4099;
    uint8_t *src = malloc(n + 16), *dst = malloc(n + 16);
    c->ok = src && dst;
    for (int i = 0; c->ok && i < 20; i++)
        c->ok = copy_checked(dst, src, n, c->seed % 8, c->seed * 100 + (uint32_t)i);
    free(src);
    free(dst);
    return NULL;
}

static void test_callers_at_once(void **state)
{
    (void)state;
    zd__rpc_copy_enable(true);
    pthread_t th[4];
    copier_t c[4];
    for (int i = 0; i < 4; i++) {
        c[i] = (copier_t){.seed = (uint32_t)i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, copier, &c[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(c[i].ok);
    }
    zd__rpc_copy_enable(false);
}

static void test_forked_child(void **state)
{
    (void)state;
    uint8_t *src = malloc(BIG), *dst = malloc(BIG);
    assert_non_null(src);
    assert_non_null(dst);
    zd__rpc_copy_enable(true);
    assert_true(copy_checked(dst, src, BIG, 0, 1)); /* the helper runs now */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* A child that hung waiting for a helper it does not have dies here. */
        alarm((unsigned)(world_scaled_ms(60000) / 1000));
        bool ok = copy_checked(dst, src, BIG, 0, 2);
        long before = zd__rpc_copy_helped();
        ok = ok && copy_checked(dst, src, BIG, 0, 3) && zd__rpc_copy_helped() == before;
#ifndef __SANITIZE_THREAD__
        /* TSan's bookkeeping keeps the parent's helper alive in the child
           and refuses a new thread that gets its id. */
        zd__rpc_copy_enable(true);
        int64_t deadline = world_now_ms() + world_scaled_ms(30000);
        while (ok && zd__rpc_copy_helped() == before && world_now_ms() < deadline)
            ok = copy_checked(dst, src, BIG, 0, 4);
        ok = ok && zd__rpc_copy_helped() > before;
        zd__rpc_copy_enable(false);
#endif
        free(src);
        free(dst);
        exit(ok ? 0 : 1);
    }
    assert_true(pid > 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_true(copy_checked(dst, src, BIG, 0, 5));
    zd__rpc_copy_enable(false);
    free(src);
    free(dst);
}

#ifndef __SANITIZE_THREAD__
static atomic_bool copying;

static void *copy_loop(void *arg)
{
    (void)arg;
    uint8_t *src = malloc(BIG), *dst = malloc(BIG);
    bool ok = src && dst;
    while (ok && atomic_load(&copying))
        ok = copy_checked(dst, src, BIG, 0, 9);
    free(src);
    free(dst);
    return (void *)(intptr_t)ok;
}

/*  Forks while another thread is in shared copies: whatever state the
    helper and the lock were in, the child copies alone and does not hang. */
static void test_fork_during_copies(void **state)
{
    (void)state;
    uint8_t *src = malloc(BIG), *dst = malloc(BIG);
    assert_non_null(src);
    assert_non_null(dst);
    zd__rpc_copy_enable(true);
    atomic_store(&copying, true);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, copy_loop, NULL), 0);
    long before = zd__rpc_copy_helped();
    int64_t deadline = world_now_ms() + world_scaled_ms(30000);
    while (zd__rpc_copy_helped() == before && world_now_ms() < deadline)
        sched_yield();
    assert_true(zd__rpc_copy_helped() > before);
    for (int i = 0; i < 20; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            alarm((unsigned)(world_scaled_ms(60000) / 1000));
            long h = zd__rpc_copy_helped();
            bool ok = copy_checked(dst, src, BIG, 0, (uint32_t)i) && zd__rpc_copy_helped() == h;
            _exit(ok ? 0 : 1);
        }
        assert_true(pid > 0);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
    atomic_store(&copying, false);
    void *ok;
    pthread_join(th, &ok);
    assert_true(ok != NULL);
    zd__rpc_copy_enable(false);
    free(src);
    free(dst);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_helper_takes_part_until_stopped),
        cmocka_unit_test(test_callers_at_once),
        cmocka_unit_test(test_forked_child),
#ifndef __SANITIZE_THREAD__
        /* TSan's runtime does not promise a usable child of a fork taken
           while other threads run. */
        cmocka_unit_test(test_fork_during_copies),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
