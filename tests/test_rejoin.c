/* SPDX-License-Identifier: MIT */
/*  A process restarted with the rank and name of a lost peer joins the
    running world (issue 12 point 3; membership.c), in worlds of real
    processes: a worker killed and started again, and rank 0 itself killed
    and started again while the others wait for it (master_wait_ms). The
    restarted process knows it rejoined, everyone can call it and it can
    call everyone, the others' peer_joined callbacks run, what the old
    process held was released, and the whole world then shuts down
    gracefully, the newcomer counted in the barrier. Each also with a world
    key: the restarted process comes with a keypair of its own, which every
    member's ZAP handler must take in place of the old one.

    The first incarnation of the restarted rank is a child that rank's
    process forks before any ZeroMQ context exists; it dies by SIGKILL at
    a point the test picks, and the rank's process, having reaped it, joins
    as the second incarnation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

#include "rpc/net/security.h"
#include "tests/support/fixtures.h"
#include "tests/support/handlers.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define WAIT_MS 30000

static zd_future_t *joined;
static char g_key[256];    /* the world key file (made in the parent) */
static zd_rref_t *g_kept;  /* rank 0: an RRef the first life of rank 2 made and owned */
static zd_rref_t *g_made;  /* rank 0: an RRef it made, owned by the first life of rank 2 */
static atomic_int g_ready; /* the first life of rank 0: ranks through their zd_rpc_init */

/*  [] -> None: the caller's zd_rpc_init returned. */
static zd_value_t *fn_ready(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    atomic_fetch_add(&g_ready, 1);
    return zd_value_none();
}

/*  [rref] -> None: keeps the RRef, and makes one on its owner, whose value
    it fetches (it exists there) before answering. */
static zd_value_t *fn_keep(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_rref_t *r;
    zd_value_t *v = NULL;
    if (zd_rpc_arg_rref(args, 0, &r) < 0)
        return NULL;
    zd_rref_unref(g_kept);
    g_kept = zd_rref_ref(r);
    zd_rref_unref(g_made);
    zd_value_t *five = ZD_ARGS(5);
    g_made = five ? zd_rpc_remote(zd_rref_owner(r), "echo", five, WAIT_MS) : NULL;
    zd_value_unref(five);
    if (!g_made || zd_rref_to_here(g_made, WAIT_MS, &v) < 0)
        return NULL;
    zd_value_unref(v);
    return zd_value_none();
}

static void on_joined(void *arg, int peer, const char *name)
{
    (void)arg;
    fprintf(stderr, "test: \"%s\" (rank %d) rejoined\n", name, peer);
    zd_future_set_value(joined, NULL);
}

static zd_rpc_options_t options(const world_t *w)
{
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.master_wait_ms = WAIT_MS;
    o.init_timeout_ms = WAIT_MS;
    o.key_file = w->arg; /* NULL: none (a loopback world) */
    return o;
}

static int init(const world_t *w)
{
    zd_rpc_options_t o = options(w);
    char name[16];
    snprintf(name, sizeof name, "w%d", w->rank);
    joined = zd_future_new();
    WCHECK(joined && zd_rpc_register("echo", world_h_echo, NULL) == 0 &&
           zd_rpc_register("keep", fn_keep, NULL) == 0 &&
           zd_rpc_register_inline("ready", fn_ready, NULL) == 0 &&
           zd_rpc_register_peer_joined(on_joined, NULL) == 0);
    WCHECK(zd_rpc_init(name, w->rank, w->world_size, &o) == 0);
    return 0;
}

static int echo(int to, int64_t v)
{
    return world_echo_int(to, v, WAIT_MS);
}

/*  The first incarnation: joins, shows it works, then dies without a word.
    Rank 0 dies only once every other rank's zd_rpc_init has returned (each
    says so): killed sooner, its answers to their init barrier may die
    with it, and a rank still in its init does not rejoin a restarted rank
    0 (it fails at its init timeout, saying so); this test is of a world
    that formed. */
static void first_life(const world_t *w, int peer)
{
    if (init(w) != 0 || echo(peer, 7) != 0)
        _exit(1);
    int64_t until = world_now_ms() + WAIT_MS;
    while (w->rank == 0 && atomic_load(&g_ready) < w->world_size - 1) {
        if (world_now_ms() > until)
            _exit(1);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    raise(SIGKILL);
}

/*  A first incarnation that gives rank 0 an RRef of its own, then dies. */
static void first_life_giving(const world_t *w)
{
    zd_rref_t *r = NULL;
    zd_value_t *v = NULL;
    if (init(w) != 0 || !(r = zd_rref_new(zd_value_int(42))) ||
        zd_rpc_sync(0, "keep", ZD_ARGS(r), WAIT_MS, &v) != 0)
        _exit(1);
    raise(SIGKILL);
}

/*  The rank's process: forks the first incarnation, reaps it, then joins as
    the second. */
static int restart(const world_t *w, int peer)
{
    pid_t pid = fork();
    WCHECK(pid >= 0);
    if (pid == 0 && peer < 0)
        first_life_giving(w);
    else if (pid == 0)
        first_life(w, peer);
    int status = 0;
    WCHECK(waitpid(pid, &status, 0) == pid);
    WCHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    return init(w);
}

/*  The restarted rank: it knows, and every other rank answers it. */
static int newcomer(const world_t *w)
{
    WCHECK(zd_rpc_rejoined());
    for (int i = 0; i < w->world_size; i++)
        if (i != w->rank)
            WTRY(echo(i, 100 + i));
    /* it formed no world: nobody rejoined it */
    for (int i = 0; i < w->world_size; i++)
        WCHECK(zd_rpc_peer_joins(i) == 0);
    WCHECK(zd_rpc_peer_joins(-1) == -1 && zd_rpc_peer_joins(w->world_size) == -1);
    return 0;
}

/*  The others: told of the newcomer, they call it. */
static int survivor(const world_t *w, int back)
{
    WCHECK(!zd_rpc_rejoined());
    WTRY(zd_future_wait(joined, WAIT_MS));
    WTRY(zd_rpc_wait_peer(back, WAIT_MS));
    WCHECK(!zd_rpc_peer_is_lost(back));
    /* counted before the callbacks ran */
    WCHECK(zd_rpc_peer_joins(back) == 1 && zd_rpc_peer_joins(w->rank) == 0);
    WTRY(echo(back, 200 + w->rank));
    return 0;
}

static int shutdown_all(void)
{
    WTRY(zd_rpc_shutdown(true, WAIT_MS));
    zd_future_unref(joined);
    return 0;
}

static int worker_restarts(const world_t *w)
{
    if (w->rank == 2) {
        WTRY(restart(w, 0));
        WTRY(newcomer(w));
    } else {
        WTRY(init(w));
        WTRY(survivor(w, 2));
    }
    return shutdown_all();
}

/*  Whether r fails at once, saying that its owner was lost: read
    (to_here), and sent to rank 1 as an argument. */
static int fails_restarted(const world_t *w, zd_rref_t *r, const char *which)
{
    zd_value_t *v = NULL;
    WCHECK(r && zd_rref_owner(r) == 2);
    if (zd_rref_to_here(r, WAIT_MS, &v) == 0)
        return world_fail(w, "%s gave a value", which);
    if (zd_error_code() != ZD_ERR_PEER || !strstr(zd_error_last(), "was lost since the RRef"))
        return world_fail(w, "%s: %s", which, zd_error_last());
    zd_value_t *args = ZD_ARGS(r);
    WCHECK(args != NULL);
    int sent = zd_rpc_sync(1, "echo", args, WAIT_MS, &v);
    zd_value_unref(args);
    zd_value_unref(v);
    if (sent == 0)
        return world_fail(w, "%s was sent", which);
    if (!strstr(zd_error_last(), "was lost since the RRef"))
        return world_fail(w, "%s sent: %s", which, zd_error_last());
    return 0;
}

/*  Rank 0 keeps an RRef the first process of rank 2 made and owned, and
    one it made itself on that process; once rank 2 is back, reading
    either, or sending it, fails at once, saying why (they used to wait for
    a value that could never come, until the call's timeout). */
static int old_rref_after_restart(const world_t *w)
{
    if (w->rank == 2) {
        WTRY(restart(w, -1));
        WTRY(newcomer(w));
        return shutdown_all();
    }
    WTRY(init(w));
    WTRY(survivor(w, 2));
    int rc = 0;
    if (w->rank == 0) {
        if (fails_restarted(w, g_kept, "the old process's RRef") < 0 ||
            fails_restarted(w, g_made, "the RRef made on the old process") < 0)
            rc = -1;
        zd_rref_unref(g_kept);
        zd_rref_unref(g_made);
        g_kept = g_made = NULL;
    }
    if (shutdown_all() < 0)
        rc = -1;
    return rc;
}

static void test_an_rref_of_the_old_process_fails_at_once(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 90, old_rref_after_restart, NULL), 0);
}

static void test_a_restarted_worker_rejoins(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 90, worker_restarts, NULL), 0);
}

static void test_a_restarted_worker_rejoins_with_a_key(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 90, worker_restarts, g_key), 0);
}

static int master_restarts(const world_t *w)
{
    if (w->rank == 0) {
        WTRY(restart(w, 1));
        WTRY(newcomer(w));
    } else {
        WTRY(init(w));
        /* The first life of rank 0 waits for this; counted, it may die
           before its answer leaves: lost then is as good as answered. */
        zd_value_t *r = NULL;
        WCHECK(zd_rpc_sync(0, "ready", NULL, WAIT_MS, &r) == 0 || zd_error_code() == ZD_ERR_PEER);
        zd_value_unref(r);
        WTRY(survivor(w, 0));
        WTRY(echo(3 - w->rank, 300)); /* and the members still reach each other */
    }
    return shutdown_all();
}

static void test_a_restarted_rank_0_gets_the_world_back(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 90, master_restarts, NULL), 0);
}

static void test_a_restarted_rank_0_gets_the_world_back_with_a_key(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 90, master_restarts, g_key), 0);
}

/*  Registrations at a running world's rank 0 that must not take a place: a
    rank whose process is alive (asked to wait: it may be a restart whose
    old process is not noticed gone yet), another name for a rank, a
    running member's status naming ranks outside the world. The world goes
    on untouched. */
static zd_future_t *strangers_done;

static zd_value_t *h_done(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_future_set_value(strangers_done, NULL);
    return zd_value_none();
}

static int strangers(const world_t *w)
{
    strangers_done = zd_future_new();
    WCHECK(strangers_done && zd_rpc_register_inline("done", h_done, NULL) == 0);
    WTRY(init(w));
    if (w->rank != 1) { /* rank 0's desk stays open until rank 1 is through */
        WTRY(zd_future_wait(strangers_done, WAIT_MS));
    } else {
        void *ctx = zmq_ctx_new(), *sock = raw_rendezvous_dealer(ctx, w->port);
        WCHECK(sock != NULL);
        static const struct {
            const char *frames[7];
            int n;
            const char *tag, *answer;
        } cases[] = {
            {{"ZDREG1", "2", "3", "w2", "tcp://127.0.0.1:9", ""}, 6, "ZDBSY1", "still connected"},
            {{"ZDREG1", "2", "3", "evil", "tcp://127.0.0.1:9", ""},
             6,
             "ZDERR1",
             "which is \"w2\" in this world"},
            {{"ZDREG1", "1", "3", "w1", "tcp://127.0.0.1:9", ""}, 6, "ZDBSY1", "still connected"},
            {{"ZDREG1", "2", "3", "w2", "tcp://127.0.0.1:9", "", "running:7"},
             7,
             "ZDERR1",
             "a bad status"},
            {{"ZDREG1", "2", "3", "w2", "tcp://127.0.0.1:9", "", "walking"},
             7,
             "ZDERR1",
             "a bad status"},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            WCHECK(raw_send_frames(sock, cases[i].frames, cases[i].n) == 0);
            WCHECK(raw_rendezvous_answer(sock, cases[i].tag, cases[i].answer) == 0);
        }
        zmq_close(sock);
        zmq_ctx_term(ctx);
        WTRY(echo(2, 5));
        WTRY(echo(0, 6));
        for (int i = 0; i < 3; i += 2) {
            zd_value_t *r = NULL;
            WTRY(zd_rpc_sync(i, "done", NULL, WAIT_MS, &r));
            zd_value_unref(r);
        }
    }
    zd_future_unref(strangers_done);
    WCHECK(!zd_rpc_peer_is_lost((w->rank + 1) % 3) && !zd_future_done(joined));
    return shutdown_all();
}

static void test_strangers_take_no_place(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(3, 60, strangers, NULL), 0);
}

int main(void)
{
    char dir[] = "/tmp/zd-rejoin-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    snprintf(g_key, sizeof g_key, "%s/world.key", dir);
    if (zd__security_keygen(g_key, false) < 0) {
        fprintf(stderr, "%s\n", zd_error_last());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_restarted_worker_rejoins),
        cmocka_unit_test(test_an_rref_of_the_old_process_fails_at_once),
        cmocka_unit_test(test_a_restarted_rank_0_gets_the_world_back),
        cmocka_unit_test(test_a_restarted_worker_rejoins_with_a_key),
        cmocka_unit_test(test_a_restarted_rank_0_gets_the_world_back_with_a_key),
        cmocka_unit_test(test_strangers_take_no_place),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(g_key);
    rmdir(dir);
    return rc;
}
