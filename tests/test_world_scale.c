/* SPDX-License-Identifier: MIT */
/*  Worlds of hundreds of processes (issue 28), each case within a
    generous bound, $ZDIST_TEST_WORLD_N ranks (256; the sanitizer build
    sets 64):

    - (no argument) on one host: the world forms, every rank calls rank 0
      and two peers of its own choosing (one with zd_rpc_sync, on the
      thread's own socket, one with zd_rpc_async, on the shared one: both
      connect on first use), and it shuts down gracefully;
    - --kill: the same world, then a tenth of it (ranks other than 0,
      chosen from $ZDIST_TEST_SEED, 28 by default) SIGKILLed at once. Every
      survivor's calls to the killed fail as calls to lost peers (not by
      timing out), every survivor learns of every loss (rank 0 tells those
      that never called the dead), its calls to rank 0 and to live peers
      are answered, and the survivors shut down gracefully; rank 0's
      peer-lost callback ran once for each killed rank and for no other;
    - --netns: half the ranks on each of two hosts (network namespaces
      joined by a veth pair, made here: root only, 77 means skipped), with
      a world key, so that the first-use connections across the hosts are
      CURVE ones; calls and shutdown as in the first case.

    world.h's harness holds 16 processes: this file forks its own, each
    leaving through exit() like the harness's. */
#define _GNU_SOURCE /* setns */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/net/security.h"
#include "tests/support/world.h"

#define WORLD_N_DEFAULT 256
#define WORLD_N_MAX     1024
#define BOUND_S         300   /* a whole run, times world_time_scale() */
#define SEED_DEFAULT    28    /* which ranks --kill kills */
#define NETNS_PORT      29500 /* each namespace has its own ports */

/*  What every rank of a case knows (set by the parent before it forks). */
typedef struct {
    int n;
    int port;
    const char *master_addr; /* NULL: 127.0.0.1 */
    const char *key_file;    /* NULL: no key (loopback) */
    const char *ns[2];       /* --netns: ranks below n / 2 in ns[0], the others in ns[1] */
    const bool *killed;      /* --kill: the ranks the parent kills */
    int ready[2], go[2];     /* --kill: "phase one done" to the parent; its "go" (EOF) */
} scale_t;

static int world_n(void)
{
    const char *e = getenv("ZDIST_TEST_WORLD_N");
    return e && atoi(e) >= 2 && atoi(e) <= WORLD_N_MAX ? atoi(e) : WORLD_N_DEFAULT;
}

/*  Answers with its own rank times 1000 plus the argument. */
static zd_value_t *whoami(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    int64_t x;
    return ZD_UNPACK(args, &x) < 0 ? NULL : zd_value_int(zd_rpc_rank() * 1000 + x);
}

static int call_sync(int to, int64_t x, int64_t timeout_ms)
{
    zd_value_t *args = ZD_ARGS(x);
    zd_value_t *r = NULL;
    int64_t v = -1;
    int rc = zd_rpc_sync(to, "whoami", args, timeout_ms, &r);
    zd_value_unref(args);
    if (rc == 0)
        rc = zd_value_get_int(r, &v);
    zd_value_unref(r);
    if (rc == 0 && v != (int64_t)to * 1000 + x)
        rc = zd_error_set("rank %d answered %lld", to, (long long)v);
    return rc;
}

static int call_async(int to, int64_t x)
{
    zd_value_t *args = ZD_ARGS(x);
    zd_future_t *f = zd_rpc_async(to, "whoami", args, ZD_TIMEOUT_DEFAULT);
    zd_value_unref(args);
    if (!f)
        return -1;
    int64_t v = -1;
    int rc =
        zd_future_wait(f, ZD_TIMEOUT_DEFAULT) < 0 ? -1 : zd_value_get_int(zd_future_value(f), &v);
    zd_future_unref(f);
    if (rc == 0 && v != (int64_t)to * 1000 + x)
        rc = zd_error_set("rank %d answered %lld", to, (long long)v);
    return rc;
}

/*  A random rank for which pick(s, rank) holds (there is one). */
static int random_rank(const scale_t *s, unsigned *seed, bool (*pick)(const scale_t *, int))
{
    for (;;) {
        int r = (int)(rand_r(seed) % (unsigned)s->n);
        if (pick(s, r))
            return r;
    }
}

static bool any_rank(const scale_t *s, int r)
{
    (void)s, (void)r;
    return true;
}

static bool live_rank(const scale_t *s, int r)
{
    return !s->killed || !s->killed[r];
}

static bool killed_rank(const scale_t *s, int r)
{
    return s->killed && s->killed[r];
}

/*  Rank 0 counts the losses it is told of, per rank (pool threads). */
static atomic_int *lost_seen;

static void on_lost(void *arg, int peer, const char *name)
{
    (void)arg, (void)name;
    if (lost_seen && peer >= 0)
        atomic_fetch_add(&lost_seen[peer], 1);
}

/*  Joins the world, then calls rank 0 and two random peers for which
    pick holds. */
static int join_and_call(const world_t *w, const scale_t *s, unsigned *seed)
{
    WTRY(zd_rpc_register("whoami", whoami, NULL));
    zd_rpc_options_t o = world_rpc_options(s->port);
    o.master_addr = s->master_addr ? s->master_addr : "127.0.0.1";
    o.key_file = s->key_file;
    o.init_timeout_ms = world_scaled_ms(BOUND_S * 1000);
    o.rpc_timeout_ms = world_scaled_ms(120000);
    char name[32];
    snprintf(name, sizeof name, "w%d", w->rank);
    WTRY(zd_rpc_init(name, w->rank, s->n, &o));
    int p1 = random_rank(s, seed, any_rank), p2 = random_rank(s, seed, any_rank);
    if (call_sync(0, w->rank, ZD_TIMEOUT_DEFAULT) < 0 ||
        call_sync(p1, w->rank, ZD_TIMEOUT_DEFAULT) < 0 || call_async(p2, w->rank) < 0)
        return world_fail(w, "calls to 0, %d, %d: %s", p1, p2, zd_error_last()) < 0;
    return 0;
}

static int rank_main(const scale_t *s, int rank)
{
    world_t w = {.world_size = s->n, .rank = rank, .port = s->port};
    unsigned seed = (unsigned)rank * 2654435761u + 12345;
    if (join_and_call(&w, s, &seed) != 0)
        return 1;
    WTRY(zd_rpc_shutdown(true, world_scaled_ms(BOUND_S * 1000)));
    return 0;
}

/*  Waits (bounded) until every killed rank is declared lost here: 0, or
    -1 naming the first that is not. */
static int wait_all_lost(const world_t *w, const scale_t *s, int64_t until)
{
    for (;;) {
        int missing = -1;
        for (int r = 0; r < s->n && missing < 0; r++)
            if (s->killed[r] && !zd_rpc_peer_is_lost(r))
                missing = r;
        if (missing < 0)
            return 0;
        if (world_now_ms() >= until)
            return world_fail(w, "killed rank %d not declared lost within the bound", missing);
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL); /* the losses are declared on other threads */
    }
}

/*  A call to a killed rank fails as a call to a lost peer does. */
static int call_killed(const world_t *w, int to)
{
    int64_t t0 = world_now_ms();
    if (call_sync(to, w->rank, world_scaled_ms(60000)) == 0)
        return world_fail(w, "killed rank %d answered", to);
    if (zd_error_code() != ZD_ERR_PEER)
        return world_fail(w,
                          "the call to killed rank %d failed after %lld ms with \"%s\" (%s), "
                          "not as a call to a lost peer",
                          to, (long long)(world_now_ms() - t0), zd_error_last(),
                          zd_error_code_name(zd_error_code()));
    return 0;
}

/*  --kill: phase one as rank_main's, then (once the parent has killed the
    victims) the survivors' phase two. */
static int rank_main_kill(const scale_t *s, int rank)
{
    world_t w = {.world_size = s->n, .rank = rank, .port = s->port};
    unsigned seed = (unsigned)rank * 2654435761u + 12345;
    close(s->ready[0]);
    close(s->go[1]); /* else the parent's close would not be an end of file here */
    if (rank == 0) {
        lost_seen = calloc((size_t)s->n, sizeof *lost_seen);
        WCHECK(lost_seen && zd_rpc_register_peer_lost(on_lost, NULL) == 0);
    }
    if (join_and_call(&w, s, &seed) != 0)
        return 1;
    WCHECK(write(s->ready[1], "r", 1) == 1);
    close(s->ready[1]);
    /* The victims die here; the survivors go on when the parent closes
       its end of the pipe, after the kills. */
    struct pollfd p = {.fd = s->go[0], .events = POLLIN};
    char c;
    WCHECK(poll(&p, 1, (int)world_scaled_ms(BOUND_S * 1000)) == 1 && read(s->go[0], &c, 1) == 0);
    close(s->go[0]);
    int64_t t0 = world_now_ms(), until = t0 + world_scaled_ms(BOUND_S * 1000) / 3;

    /* A killed rank called at once (before or while it is declared lost,
       connected to or not), all of them declared lost in the end, and
       another killed rank called once they are. */
    if (call_killed(&w, random_rank(s, &seed, killed_rank)) != 0 ||
        wait_all_lost(&w, s, until) != 0 || call_killed(&w, random_rank(s, &seed, killed_rank)))
        return 1;
    /* The living answer as before. */
    int p1 = random_rank(s, &seed, live_rank), p2 = random_rank(s, &seed, live_rank);
    if (call_sync(0, rank, ZD_TIMEOUT_DEFAULT) < 0 || call_sync(p1, rank, ZD_TIMEOUT_DEFAULT) < 0 ||
        call_async(p2, rank) < 0)
        return world_fail(&w, "after the kills, calls to 0, %d, %d: %s", p1, p2, zd_error_last()) <
            0;
    if (rank == 0) {
        /* Its callback ran once per killed rank (all declared lost above,
           so all run or running: wait for the last ones) and for no other. */
        for (int r = 1; r < s->n; r++) {
            int want = s->killed[r] ? 1 : 0;
            while (atomic_load(&lost_seen[r]) < want && world_now_ms() < until) {
                struct timespec ts = {0, 5 * 1000000};
                nanosleep(&ts, NULL);
            }
            if (atomic_load(&lost_seen[r]) != want)
                return world_fail(&w, "peer-lost callback ran %d times for %s rank %d",
                                  atomic_load(&lost_seen[r]), want ? "killed" : "live", r);
        }
        printf("rank 0: every killed rank declared lost %.1f s after the kills\n",
               (double)(world_now_ms() - t0) / 1000.0);
    }
    int64_t t1 = world_now_ms();
    WTRY(zd_rpc_shutdown(true, world_scaled_ms(BOUND_S * 1000) / 3));
    if (rank == 0)
        printf("rank 0: graceful shutdown of the survivors took %.1f s\n",
               (double)(world_now_ms() - t1) / 1000.0);
    free(lost_seen);
    return 0;
}

/*  --netns: the rank moves to its host's namespace, then as rank_main. */
static int rank_main_netns(const scale_t *s, int rank)
{
    world_t w = {.world_size = s->n, .rank = rank, .port = s->port};
    char path[128];
    snprintf(path, sizeof path, "/var/run/netns/%s", s->ns[rank < s->n / 2 ? 0 : 1]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) < 0)
        return world_fail(&w, "cannot enter %s: %s", path, strerror(errno)) < 0;
    close(fd);
    return rank_main(s, rank);
}

typedef int(rank_main_fn)(const scale_t *s, int rank);

/*  Forks ranks 0..n-1 running fn into pids (0 where fork failed). */
static void fork_world(const scale_t *s, rank_main_fn *fn, pid_t *pids)
{
    fflush(NULL);
    for (int r = 0; r < s->n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            free(pids); /* the parent's: LeakSanitizer checks each child at exit */
            exit(fn(s, r));
        }
        if (pids[r] < 0) {
            fprintf(stderr, "fork of rank %d: %s\n", r, strerror(errno));
            pids[r] = 0;
        }
    }
}

/*  Waits until every rank has exited or `until`, killing those left; a
    rank that died of SIGKILL is expected only when killed[r] (NULL: none),
    any other of exit status 0. Returns the number of ranks that did not
    finish as expected, each named on stderr. */
static int reap_world(const scale_t *s, pid_t *pids, int64_t until)
{
    int left = 0, failed = 0;
    for (int r = 0; r < s->n; r++)
        if (pids[r] > 0)
            left++;
        else
            failed++; /* never started */
    while (left > 0 && world_now_ms() < until) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            struct timespec ts = {0, 20 * 1000000};
            nanosleep(&ts, NULL); /* the parent polls its children's exits */
            continue;
        }
        for (int r = 0; r < s->n; r++) {
            if (pids[r] != pid)
                continue;
            pids[r] = 0;
            left--;
            bool as_expected = killed_rank(s, r)
                ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                : WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!as_expected) {
                fprintf(stderr, "rank %d exited with status 0x%x\n", r, status);
                failed++;
            }
        }
    }
    for (int r = 0; r < s->n; r++)
        if (pids[r] > 0) {
            fprintf(stderr, "rank %d still running at the bound: killed\n", r);
            kill(pids[r], SIGKILL);
            waitpid(pids[r], NULL, 0);
            failed++;
        }
    return failed;
}

/*  Runs a world of s->n ranks of fn to its end within the bound. */
static void run_world(const scale_t *s, rank_main_fn *fn, const char *what)
{
    pid_t *pids = calloc((size_t)s->n, sizeof *pids);
    assert_non_null(pids);
    int64_t t0 = world_now_ms();
    fork_world(s, fn, pids);
    int failed = reap_world(s, pids, t0 + world_scaled_ms(BOUND_S * 1000));
    fprintf(stderr, "%s of %d: %d failed or timed out, %.1f s\n", what, s->n, failed,
            (double)(world_now_ms() - t0) / 1000.0);
    free(pids);
    assert_int_equal(failed, 0);
}

static void test_world_of_hundreds(void **state)
{
    (void)state;
    scale_t s = {.n = world_n(), .port = world_free_port()};
    assert_true(s.port > 0);
    run_world(&s, rank_main, "world");
}

/*  ---- --kill ---- */

/*  The ranks to kill: a tenth of the world (at least one), never rank 0,
    drawn from seed (a partial Fisher-Yates shuffle of 1..n-1). */
static int choose_killed(int n, unsigned seed, bool *killed)
{
    int *order = malloc(sizeof *order * (size_t)(n - 1));
    assert_non_null(order);
    for (int i = 0; i < n - 1; i++)
        order[i] = i + 1;
    int k = n / 10 > 0 ? n / 10 : 1;
    fprintf(stderr, "seed %u: killing %d ranks:", seed, k);
    for (int i = 0; i < k; i++) {
        int j = i + (int)(rand_r(&seed) % (unsigned)(n - 1 - i));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
        killed[order[i]] = true;
        fprintf(stderr, " %d", order[i]);
    }
    fprintf(stderr, "\n");
    free(order);
    return k;
}

static void test_tenth_killed_at_once(void **state)
{
    (void)state;
    const char *e = getenv("ZDIST_TEST_SEED");
    unsigned seed = e && *e ? (unsigned)strtoul(e, NULL, 10) : SEED_DEFAULT;
    scale_t s = {.n = world_n(), .port = world_free_port()};
    assert_true(s.port > 0 && s.n >= 3);
    bool *killed = calloc((size_t)s.n, sizeof *killed);
    pid_t *pids = calloc((size_t)s.n, sizeof *pids);
    assert_true(killed && pids);
    int k = choose_killed(s.n, seed, killed);
    s.killed = killed;
    assert_int_equal(pipe(s.ready), 0);
    assert_int_equal(pipe(s.go), 0);
    int *ready = s.ready, *go = s.go;

    int64_t t0 = world_now_ms(), until = t0 + world_scaled_ms(BOUND_S * 1000);
    fork_world(&s, rank_main_kill, pids);
    close(ready[1]);
    close(go[0]);
    /* Every rank says when its first calls are done (a rank that fails
       exits instead: its end of the pipe closes without a byte). */
    int got = 0;
    while (got < s.n) {
        struct pollfd p = {.fd = ready[0], .events = POLLIN};
        char buf[256];
        int64_t wait = until - world_now_ms();
        ssize_t m = wait > 0 && poll(&p, 1, (int)wait) == 1 ? read(ready[0], buf, sizeof buf) : 0;
        if (m <= 0)
            break;
        got += (int)m;
    }
    close(ready[0]);
    int64_t formed = world_now_ms();
    fprintf(stderr, "%d of %d ranks formed the world and made their calls in %.1f s\n", got, s.n,
            (double)(formed - t0) / 1000.0);
    if (got == s.n)
        for (int r = 0; r < s.n; r++)
            if (killed[r] && pids[r] > 0)
                kill(pids[r], SIGKILL);
    close(go[1]); /* the survivors' go */
    int failed = got == s.n ? reap_world(&s, pids, until) : 0;
    if (got < s.n) { /* no kills: every rank of the world was to finish phase one */
        s.killed = NULL;
        for (int r = 0; r < s.n; r++)
            if (pids[r] > 0)
                kill(pids[r], SIGKILL);
        reap_world(&s, pids, world_now_ms() + 10000);
    }
    fprintf(stderr,
            "%d killed at once, the %d others: %d failed or timed out, %.1f s after the kills\n", k,
            s.n - k, failed, (double)(world_now_ms() - formed) / 1000.0);
    free(pids);
    free(killed);
    assert_int_equal(got, s.n);
    assert_int_equal(failed, 0);
}

/*  ---- --netns ---- */

static char ns_names[2][64], key_dir[64];
static bool netns_unavailable; /* root, but namespaces refused (a container): skip */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int netns_teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        if (ns_names[i][0])
            sh("ip netns del %s 2>/dev/null", ns_names[i]);
    if (key_dir[0])
        sh("rm -rf %s", key_dir);
    return 0;
}

static void test_two_hosts_with_a_key(void **state)
{
    (void)state;
    int pid = (int)getpid(), id = pid % 200 + 20;
    char addr[32];
    for (int i = 0; i < 2; i++)
        snprintf(ns_names[i], sizeof ns_names[i], "zdscale%c-%d", 'A' + i, pid);
    snprintf(addr, sizeof addr, "10.78.%d.1", id);
    int rc =
        sh("ip netns add %s && ip netns add %s && "
           "ip link add zws%da type veth peer name zws%db && "
           "ip link set zws%da netns %s && ip link set zws%db netns %s && "
           "ip -n %s addr add 10.78.%d.1/24 dev zws%da && "
           "ip -n %s addr add 10.78.%d.2/24 dev zws%db && "
           "ip -n %s link set zws%da up && ip -n %s link set zws%db up && "
           "ip -n %s link set lo up && ip -n %s link set lo up",
           ns_names[0], ns_names[1], pid, pid, pid, ns_names[0], pid, ns_names[1], ns_names[0], id,
           pid, ns_names[1], id, pid, ns_names[0], pid, ns_names[1], pid, ns_names[0], ns_names[1]);
    if (rc != 0) {
        printf("skipped: cannot create network namespaces here (ip exited %d)\n", rc);
        netns_unavailable = true;
        return;
    }
    snprintf(key_dir, sizeof key_dir, "/tmp/zdist-scale-XXXXXX");
    assert_non_null(mkdtemp(key_dir));
    char key[128];
    snprintf(key, sizeof key, "%s/world.key", key_dir);
    assert_int_equal(zd__security_keygen(key, true), 0);
    scale_t s = {.n = world_n(),
                 .port = NETNS_PORT,
                 .master_addr = addr,
                 .key_file = key,
                 .ns = {ns_names[0], ns_names[1]}};
    fprintf(stderr, "%d ranks on %s, %d on %s (%s), with a world key\n", s.n / 2, ns_names[0],
            s.n - s.n / 2, ns_names[1], addr);
    run_world(&s, rank_main_netns, "two hosts");
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--kill")) {
        const struct CMUnitTest kill[] = {cmocka_unit_test(test_tenth_killed_at_once)};
        return cmocka_run_group_tests(kill, NULL, NULL);
    }
    if (argc > 1 && !strcmp(argv[1], "--netns")) {
        if (geteuid() != 0 || access("/sbin/ip", X_OK) != 0) {
            printf("skipped: network namespaces need root and /sbin/ip (iproute2)\n");
            return 77;
        }
        const struct CMUnitTest netns[] = {
            cmocka_unit_test_teardown(test_two_hosts_with_a_key, netns_teardown)};
        int rc = cmocka_run_group_tests(netns, NULL, NULL);
        return netns_unavailable ? 77 : rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world_of_hundreds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
