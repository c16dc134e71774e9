/* SPDX-License-Identifier: MIT */
/*  A process joining a running world while another member is down
    (membership.c, transport.c): found by tools/chaos.sh, where two ranks
    restarting at once each waited at init for the other, which was not
    reachable, failed, and were restarted again, for ever. A joining
    process needs rank 0 to answer; a member that does not is lost to it
    (calls to it fail at once, naming it) until the member's connection
    comes up or it rejoins itself.

    A world of 4 of real processes, ranks 2 and 3 started as children of
    their rank's process (as in test_rejoin.c): rank 3's first incarnation
    freezes (SIGSTOP), so that rank 0 still counts it alive; rank 2's is
    killed and its rank joins again, while rank 3 cannot answer. Then
    either rank 3's is killed and its rank joins again too (both ranks
    were down at once), or it wakes up. Both joins must succeed within a
    bound, and afterwards every rank calls every other. The processes
    coordinate through flags in memory shared before the fork. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

#include "rpc/net/security.h"
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define WORLD         4
#define WAIT_MS       30000
#define INIT_MS       20000 /* a join that waits for the frozen rank fails here */
#define JOIN_BOUND_MS 15000 /* a join takes far less: rank 0's 5 s for the frozen one, 2 s */

typedef struct {
    char key[256];           /* the world key file, "" for none */
    bool wake;               /* rank 3's first incarnation wakes up rather than dies */
    atomic_int up[WORLD];    /* the first incarnations called everyone */
    atomic_int frozen;       /* rank 3's first incarnation is stopped */
    atomic_int joined2;      /* rank 2 joined again, rank 3 still frozen */
    atomic_int lost2;        /* rank 0 case: rank 1 lost rank 2 */
    atomic_int back0;        /* rank 0 case: rank 0 joined again */
    atomic_int ready[WORLD]; /* every rank back */
} shared_t;

static zd_future_t *joined[WORLD];

static void on_joined(void *arg, int peer, const char *name)
{
    (void)arg;
    fprintf(stderr, "test: \"%s\" (rank %d) rejoined\n", name, peer);
    if (peer >= 0 && peer < WORLD)
        zd_future_set_value(joined[peer], NULL);
}

static bool wait_flag(atomic_int *flag, int64_t timeout_ms)
{
    int64_t until = world_now_ms() + world_scaled_ms(timeout_ms);
    while (!atomic_load(flag)) {
        if (world_now_ms() >= until)
            return false;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return true;
}

static bool wait_all(const world_t *w, atomic_int *flags)
{
    for (int i = 0; i < w->world_size; i++)
        if (!wait_flag(&flags[i], WAIT_MS))
            return false;
    return true;
}

static int init(const world_t *w)
{
    const shared_t *sh = w->arg;
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.master_wait_ms = WAIT_MS;
    o.init_timeout_ms = world_scaled_ms(INIT_MS);
    o.key_file = sh->key[0] ? sh->key : NULL;
    char name[16];
    snprintf(name, sizeof name, "w%d", w->rank);
    for (int i = 0; i < WORLD; i++)
        WCHECK((joined[i] = zd_future_new()) != NULL);
    WCHECK(zd_rpc_register("echo", world_h_echo, NULL) == 0 &&
           zd_rpc_register_peer_joined(on_joined, NULL) == 0);
    WCHECK(zd_rpc_init(name, w->rank, w->world_size, &o) == 0);
    return 0;
}

static int echo(int to, int64_t v)
{
    return world_echo_int(to, v, WAIT_MS);
}

static int echo_all(const world_t *w, int64_t base)
{
    for (int i = 0; i < w->world_size; i++)
        if (i != w->rank)
            WTRY(echo(i, base + 10 * w->rank + i));
    return 0;
}

/*  Every rank back: each waits for the others, then calls every one. */
static int all_pairs(const world_t *w)
{
    shared_t *sh = w->arg;
    atomic_store(&sh->ready[w->rank], 1);
    WCHECK(wait_all(w, sh->ready));
    WCHECK(echo_all(w, 1000) == 0);
    return 0;
}

static int finish(void)
{
    WTRY(zd_rpc_shutdown(true, WAIT_MS));
    for (int i = 0; i < WORLD; i++)
        zd_future_unref(joined[i]);
    return 0;
}

/*  A first incarnation: joins, calls everyone, then dies (rank 2) or
    freezes (rank 3) when the test says. Rank 3's, woken, goes on as a
    member that missed rank 2's return while it was frozen. */
static void first_life(const world_t *w)
{
    shared_t *sh = w->arg;
    if (init(w) != 0 || echo_all(w, 0) != 0)
        _exit(1);
    atomic_store(&sh->up[w->rank], 1);
    if (w->rank == 2) {
        if (!wait_flag(&sh->frozen, WAIT_MS))
            _exit(1);
        raise(SIGKILL);
    }
    if (!wait_all(w, sh->up))
        _exit(1);
    raise(SIGSTOP);
    /* Woken (the test's wake case): rank 2 came back meanwhile. */
    int rc = zd_future_wait(joined[2], WAIT_MS) < 0 || zd_rpc_wait_peer(2, WAIT_MS) < 0 ||
        all_pairs(w) != 0 || finish() != 0;
    if (rc)
        fprintf(stderr, "[rank 3] woken: %s\n", zd_error_last());
    exit(rc);
}

static int timed_init(const world_t *w)
{
    int64_t t0 = world_now_ms();
    WCHECK(init(w) == 0);
    int64_t took = world_now_ms() - t0;
    fprintf(stderr, "test: rank %d joined again in %lld ms\n", w->rank, (long long)took);
    WCHECK(took < world_scaled_ms(JOIN_BOUND_MS));
    WCHECK(zd_rpc_rejoined());
    return 0;
}

/*  Rank 2: joins again while rank 3 is frozen, and must get in. */
static int rank_2(const world_t *w)
{
    shared_t *sh = w->arg;
    pid_t pid = fork();
    WCHECK(pid >= 0);
    if (pid == 0)
        first_life(w);
    int status = 0;
    WCHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    WCHECK(timed_init(w) == 0);
    /* Rank 3 did not answer: lost here, and a call fails at once naming it. */
    WCHECK(zd_rpc_peer_is_lost(3));
    int64_t t0 = world_now_ms();
    WCHECK(echo(3, 5) < 0 && zd_error_code() == ZD_ERR_PEER &&
           strstr(zd_error_last(), "\"w3\"") != NULL);
    WCHECK(world_now_ms() - t0 < world_scaled_ms(1000));
    atomic_store(&sh->joined2, 1);
    if (!sh->wake) /* rank 3 joins again: rank 0 tells this process */
        WTRY(zd_future_wait(joined[3], WAIT_MS));
    /* Else woken, it reaches this process: a connection, no rejoin. */
    WTRY(zd_rpc_wait_peer(3, WAIT_MS));
    WCHECK(all_pairs(w) == 0);
    return finish();
}

/*  Rank 3: its first incarnation frozen; once rank 2 is in, killed and
    joined again (both were down at once), or woken. */
static int rank_3(const world_t *w)
{
    shared_t *sh = w->arg;
    pid_t pid = fork();
    WCHECK(pid >= 0);
    if (pid == 0)
        first_life(w);
    int status = 0;
    WCHECK(waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status));
    atomic_store(&sh->frozen, 1);
    if (!wait_flag(&sh->joined2, INIT_MS + 5000)) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return world_fail(w, "rank 2 did not join again while rank 3 was frozen");
    }
    if (sh->wake) {
        WCHECK(kill(pid, SIGCONT) == 0);
        WCHECK(waitpid(pid, &status, 0) == pid);
        WCHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        return 0;
    }
    WCHECK(kill(pid, SIGKILL) == 0);
    WCHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status));
    WCHECK(timed_init(w) == 0);
    WCHECK(all_pairs(w) == 0);
    return finish();
}

/*  Ranks 0 and 1: they see rank 2 (and rank 3) come back. */
static int survivor(const world_t *w)
{
    shared_t *sh = w->arg;
    WCHECK(init(w) == 0);
    WCHECK(echo_all(w, 0) == 0);
    atomic_store(&sh->up[w->rank], 1);
    WTRY(zd_future_wait(joined[2], WAIT_MS));
    if (!sh->wake)
        WTRY(zd_future_wait(joined[3], WAIT_MS));
    WTRY(zd_rpc_wait_peer(2, WAIT_MS));
    WTRY(zd_rpc_wait_peer(3, WAIT_MS));
    WCHECK(all_pairs(w) == 0);
    return finish();
}

static int body(const world_t *w)
{
    return w->rank == 2 ? rank_2(w) : w->rank == 3 ? rank_3(w) : survivor(w);
}

/*  Rank 0 restarted while a member is gone (lost to the others): rank 0
    forms the world from the members that wait for it, without a key for
    the gone rank, which rejoins afterwards. World of 3, with a key. */
static int r0_first_life(const world_t *w)
{
    shared_t *sh = w->arg;
    if (init(w) != 0 || echo_all(w, 0) != 0)
        _exit(1);
    atomic_store(&sh->up[w->rank], 1);
    if (!wait_flag(&sh->lost2, WAIT_MS))
        _exit(1);
    raise(SIGKILL);
    return 1;
}

static int r0_body(const world_t *w)
{
    shared_t *sh = w->arg;
    if (w->rank == 1) {
        WCHECK(init(w) == 0);
        WCHECK(echo_all(w, 0) == 0);
        atomic_store(&sh->up[1], 1);
        int64_t until = world_now_ms() + world_scaled_ms(WAIT_MS);
        while (!zd_rpc_peer_is_lost(2) && world_now_ms() < until) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        WCHECK(zd_rpc_peer_is_lost(2));
        atomic_store(&sh->lost2, 1);
        WTRY(zd_future_wait(joined[0], WAIT_MS));
        WTRY(zd_future_wait(joined[2], WAIT_MS));
        WTRY(zd_rpc_wait_peer(0, WAIT_MS));
        WTRY(zd_rpc_wait_peer(2, WAIT_MS));
        WCHECK(all_pairs(w) == 0);
        return finish();
    }
    pid_t pid = fork();
    WCHECK(pid >= 0);
    if (pid == 0) {
        if (w->rank == 0)
            r0_first_life(w);
        if (init(w) != 0 || echo_all(w, 0) != 0)
            _exit(1);
        atomic_store(&sh->up[2], 1);
        if (!wait_all(w, sh->up))
            _exit(1);
        raise(SIGKILL);
    }
    int status = 0;
    WCHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (w->rank == 0) {
        WCHECK(timed_init(w) == 0);
        atomic_store(&sh->back0, 1);
        WCHECK(zd_rpc_peer_is_lost(2));
        WTRY(zd_future_wait(joined[2], WAIT_MS));
    } else {
        WCHECK(wait_flag(&sh->back0, INIT_MS + 5000));
        WCHECK(timed_init(w) == 0);
    }
    WCHECK(all_pairs(w) == 0);
    return finish();
}

static shared_t *g_shared;
static char g_key[256];

static int run(bool key, bool wake)
{
    memset(g_shared, 0, sizeof *g_shared);
    if (key)
        snprintf(g_shared->key, sizeof g_shared->key, "%s", g_key);
    g_shared->wake = wake;
    return world_run_simple(WORLD, 120, body, g_shared);
}

static void test_two_ranks_down_at_once_both_join_again(void **state)
{
    (void)state;
    assert_int_equal(run(false, false), 0);
}

static void test_two_ranks_down_at_once_both_join_again_with_a_key(void **state)
{
    (void)state;
    assert_int_equal(run(true, false), 0);
}

static void test_a_rank_joins_while_another_is_frozen_which_wakes_up(void **state)
{
    (void)state;
    assert_int_equal(run(true, true), 0);
}

static void test_rank_0_rejoins_while_a_member_is_gone_with_a_key(void **state)
{
    (void)state;
    memset(g_shared, 0, sizeof *g_shared);
    snprintf(g_shared->key, sizeof g_shared->key, "%s", g_key);
    assert_int_equal(world_run_simple(3, 120, r0_body, g_shared), 0);
}

int main(void)
{
    g_shared =
        mmap(NULL, sizeof *g_shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char dir[] = "/tmp/zd-rejoin-pair-XXXXXX";
    if (g_shared == MAP_FAILED || !mkdtemp(dir))
        return 1;
    snprintf(g_key, sizeof g_key, "%s/world.key", dir);
    if (zd__security_keygen(g_key, false) < 0) {
        fprintf(stderr, "%s\n", zd_error_last());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_down_at_once_both_join_again),
        cmocka_unit_test(test_two_ranks_down_at_once_both_join_again_with_a_key),
        cmocka_unit_test(test_a_rank_joins_while_another_is_frozen_which_wakes_up),
        cmocka_unit_test(test_rank_0_rejoins_while_a_member_is_gone_with_a_key),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(g_key);
    rmdir(dir);
    munmap(g_shared, sizeof *g_shared);
    return rc;
}
