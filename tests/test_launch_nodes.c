/* SPDX-License-Identifier: MIT */
/*  tools/launch across nodes (--nnodes, --node_rank), --log_dir and the
    compute threads it shares out: runs the built binaries
    ($ZDIST_BUILD_DIR/tools/launch, examples/rpc_ps, tools/metrics_summary).

    Two launches on this machine play node 0 and node 1 of one world of 4
    rpc_ps processes: node 0 picks the port and prints it, the test reads
    it from node 0's stderr (waiting on that, with a deadline) and starts
    node 1 with it. Both must exit 0, each rank's output must be in its own
    log file, and the processes' metrics (ZDIST_METRICS) must add up to one
    world in metrics_summary's table.

    "test_launch_nodes --netns" (ctest's test_launch_netns) runs the same
    world across two network namespaces joined by a veth pair (10.77.R.1
    and 10.77.R.2, R from the test's pid), so that node 1 reaches node 0
    only through a real (virtual) link. It needs root and the ip tool, and
    exits 77 (skipped) without them. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "rpc/net/security.h"
#include "tests/support/fixtures.h"

extern char **environ;

#define WAIT_MS 240000 /* bound on a whole world; a passing one takes seconds */

typedef struct {
    char dir[64];
    char script[128];
    char ns[2][32]; /* network namespaces to delete at teardown */
} fixture_t;

static char launch_bin[512], ps_bin[512], summary_bin[512];

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    strcpy(f->dir, "/tmp/zdist-nodes-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->script, sizeof f->script, "%s/rank.sh", f->dir);
    const char *b = getenv("ZDIST_BUILD_DIR");
    b = b && *b ? b : "..";
    snprintf(launch_bin, sizeof launch_bin, "%s/tools/launch", b);
    snprintf(ps_bin, sizeof ps_bin, "%s/examples/rpc_ps", b);
    snprintf(summary_bin, sizeof summary_bin, "%s/tools/metrics_summary", b);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    char cmd[256];
    for (int k = 0; k < 2; k++)
        if (f->ns[k][0]) {
            snprintf(cmd, sizeof cmd, "ip netns del %s", f->ns[k]);
            if (system(cmd) != 0)
                fprintf(stderr, "cannot delete the network namespace %s\n", f->ns[k]);
        }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    free(f);
    return rc == 0 ? 0 : -1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*  Runs argv (NULL-terminated) with stdout and stderr to files out and err. */
static pid_t spawn(char *const *argv, const char *out, const char *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        fail_msg("cannot run %s: %s", argv[0], strerror(rc));
    return pid;
}

/*  Exit status of pid (128 + signal), waiting until the deadline; kills it
    (its process group too: launch's ranks lead their own) when it is late. */
static int wait_exit(pid_t pid, int64_t deadline)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    assert_true(fd >= 0);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int64_t left = deadline - now_ms();
    int rc = poll(&p, 1, left > 0 ? (int)left : 0);
    close(fd);
    if (rc <= 0) {
        kill(pid, SIGTERM); /* launch stops its world */
        waitpid(pid, NULL, 0);
        fail_msg("process %d did not exit in time", (int)pid);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/*  Waits (bounded) until path holds key, and returns the number after it. */
static int wait_number_after(const char *path, const char *key, pid_t alive)
{
    int64_t until = now_ms() + 30000;
    while (now_ms() < until) {
        char *s = read_text(path);
        const char *p = s ? strstr(s, key) : NULL;
        int v = p ? atoi(p + strlen(key)) : 0;
        free(s);
        if (v > 0)
            return v;
        if (waitpid(alive, NULL, WNOHANG) == alive)
            fail_msg("node 0's launch exited before printing \"%s\"", key);
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    fail_msg("no \"%s\" in %s within 30 s", key, path);
    return -1;
}

static void assert_log(const char *path, const char *needle)
{
    struct stat st;
    if (stat(path, &st) < 0)
        fail_msg("no log %s: %s", path, strerror(errno));
    assert_int_equal(st.st_mode & 0777, 0644);
    char *s = read_text(path);
    assert_contains(s, needle);
    assert_null(strstr(s, "[rank ")); /* the program's own lines, unprefixed */
    free(s);
}

/*  The command of node k (into argv): launch with its flags and rpc_ps,
    inside network namespace ns ("ip netns exec ns ...") unless ns is NULL. */
static void node_argv(char **argv, const char *ns, int k, char *addr_flag, char *log_flag,
                      char *port_flag)
{
    int n = 0;
    if (ns) {
        argv[n++] = "/sbin/ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = (char *)ns;
    }
    argv[n++] = launch_bin;
    argv[n++] = "--nnodes=2";
    argv[n++] = k ? "--node_rank=1" : "--node_rank=0";
    argv[n++] = addr_flag;
    argv[n++] = "--nproc_per_node=2";
    argv[n++] = log_flag;
    if (port_flag)
        argv[n++] = port_flag;
    argv[n++] = "--";
    argv[n++] = ps_bin;
    argv[n++] = "--max_batches=20";
    argv[n++] = "--eval_samples=200";
    argv[n++] = "--log_interval=5";
    argv[n] = NULL;
}

/*  The world of 4 on two "nodes": ns0/ns1 run each launch inside a network
    namespace ("ip netns exec NS"), or NULL for this machine's. */
static void run_two_nodes(fixture_t *f, const char *ns0, const char *ns1, const char *addr)
{
    char out[2][128], err[2][128], logs[2][128], metrics[128], port_flag[32];
    for (int k = 0; k < 2; k++) {
        snprintf(out[k], sizeof out[k], "%s/out%d.txt", f->dir, k);
        snprintf(err[k], sizeof err[k], "%s/err%d.txt", f->dir, k);
        snprintf(logs[k], sizeof logs[k], "--log_dir=%s/logs/node%d", f->dir, k);
    }
    snprintf(metrics, sizeof metrics, "%s/metrics", f->dir);
    setenv("ZDIST_METRICS", metrics, 1);
    setenv("ZDIST_METRICS_INTERVAL_S", "1", 1);
    /* A world over several nodes shares a key, as users do (launch makes
       one only for a world on one node); off loopback it needs one. */
    char key[160];
    snprintf(key, sizeof key, "%s/world.key", f->dir);
    assert_int_equal(zd__security_keygen(key, true), 0);
    setenv("ZDIST_KEY_FILE", key, 1);
    char addr_flag[64];
    snprintf(addr_flag, sizeof addr_flag, "--master_addr=%s", addr);
    char *node0[24], *node1[24];
    node_argv(node0, ns0, 0, addr_flag, logs[0], NULL);
    pid_t p0 = spawn(node0, out[0], err[0]);
    int port = wait_number_after(err[0], "launch: picked master port ", p0);
    snprintf(port_flag, sizeof port_flag, "--master_port=%d", port);
    node_argv(node1, ns1, 1, addr_flag, logs[1], port_flag);
    pid_t p1 = spawn(node1, out[1], err[1]);
    int64_t deadline = now_ms() + WAIT_MS;
    int rc1 = wait_exit(p1, deadline), rc0 = wait_exit(p0, deadline);
    unsetenv("ZDIST_METRICS");
    unsetenv("ZDIST_METRICS_INTERVAL_S");
    unsetenv("ZDIST_KEY_FILE");
    char *e0 = read_text(err[0]), *e1 = read_text(err[1]);
    if (rc0 != 0 || rc1 != 0)
        fail_msg("node 0 exited %d, node 1 %d\nnode 0:\n%s\nnode 1:\n%s", rc0, rc1, e0, e1);
    char want[1024];
    snprintf(want, sizeof want, "(ranks 0..1 of 4, node 0 of 2) of %s, master %s:%d", ps_bin, addr,
             port);
    assert_contains(e0, want);
    snprintf(want, sizeof want, "(ranks 2..3 of 4, node 1 of 2) of %s, master %s:%d", ps_bin, addr,
             port);
    assert_contains(e1, want);
    snprintf(want, sizeof want,
             "launch: output of rank 2 in %s/logs/node1/rank_02.log ... "
             "%s/logs/node1/rank_03.log\n",
             f->dir, f->dir);
    assert_contains(e1, want);
    assert_contains(e0, "launch: 2 processes finished in ");
    assert_contains(e1, "launch: 2 processes finished in ");
    free(e0);
    free(e1);

    /* Each rank's output in its own file: the server's on node 0, a
       trainer's on each node. */
    char path[192];
    snprintf(path, sizeof path, "%s/logs/node0/rank_00.log", f->dir);
    assert_log(path, "aggregate throughput");
    for (int r = 1; r < 4; r++) {
        snprintf(path, sizeof path, "%s/logs/node%d/rank_%02d.log", f->dir, r / 2, r);
        snprintf(want, sizeof want, "Rank %d test accuracy ", r);
        assert_log(path, want);
    }
    /* Nothing but launch's own lines reached the terminal. */
    for (int k = 0; k < 2; k++) {
        char *o = read_text(out[k]);
        assert_string_equal(o, "");
        free(o);
    }

    /* One metrics file per process, and one table of the world. */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", summary_bin, metrics);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char table[8192];
    size_t n = fread(table, 1, sizeof table - 1, p);
    table[n] = '\0';
    int st = pclose(p);
    printf("%s", table);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s failed:\n%s", cmd, table);
    const char *rows[] = {"\nparameter_server ", "\ntrainer_1 ", "\ntrainer_2 ", "\ntrainer_3 ",
                          "\n(total) "};
    for (int i = 0; i < 5; i++)
        assert_contains(table, rows[i]);
    assert_null(strstr(table, "files for a world"));
    /* every trainer called the server: its row has calls and no errors */
    for (int r = 1; r < 4; r++) {
        snprintf(want, sizeof want, "\ntrainer_%d ", r);
        long long rank, sent, served, errors;
        assert_int_equal(sscanf(strstr(table, want) + strlen(want), "%lld %lld %lld %lld", &rank,
                                &sent, &served, &errors),
                         4);
        assert_int_equal(rank, r);
        assert_true(sent > 0);
        assert_int_equal(errors, 0);
    }
}

static void test_two_nodes_form_one_world(void **state)
{
    run_two_nodes(*state, NULL, NULL, "127.0.0.1");
}

/*  ---- the same across two network namespaces ---- */

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool netns_unavailable; /* root, but namespaces refused (a container): skip */

static void test_two_nodes_in_two_network_namespaces(void **state)
{
    fixture_t *f = *state;
    int id = (int)(getpid() % 200) + 20;
    char *ns0 = f->ns[0], *ns1 = f->ns[1], addr[32];
    snprintf(ns0, sizeof f->ns[0], "zdnode0-%d", (int)getpid());
    snprintf(ns1, sizeof f->ns[1], "zdnode1-%d", (int)getpid());
    snprintf(addr, sizeof addr, "10.77.%d.1", id);
    int rc = sh("ip netns add %s && ip netns add %s && "
                "ip link add zdv0-%d type veth peer name zdv1-%d && "
                "ip link set zdv0-%d netns %s && ip link set zdv1-%d netns %s && "
                "ip -n %s addr add 10.77.%d.1/24 dev zdv0-%d && "
                "ip -n %s addr add 10.77.%d.2/24 dev zdv1-%d && "
                "ip -n %s link set zdv0-%d up && ip -n %s link set zdv1-%d up && "
                "ip -n %s link set lo up && ip -n %s link set lo up",
                ns0, ns1, id, id, id, ns0, id, ns1, ns0, id, id, ns1, id, id, ns0, id, ns1, id, ns0,
                ns1);
    if (rc != 0) {
        sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns0, ns1);
        ns0[0] = ns1[0] = '\0';
        printf("skipped: cannot create network namespaces here (ip exited %d)\n", rc);
        netns_unavailable = true;
        return;
    }
    run_two_nodes(f, ns0, ns1, addr);
    /* teardown deletes the namespaces, and with them the veth pair */
}

/*  ---- threads, logs of a failure, bad flags ---- */

static long cores(void)
{
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                       : sysconf(_SC_NPROCESSORS_ONLN);
}

static int run_launch(fixture_t *f, char *const *args, char **out, char **err)
{
    char o[128], e[128];
    snprintf(o, sizeof o, "%s/out.txt", f->dir);
    snprintf(e, sizeof e, "%s/err.txt", f->dir);
    char *argv[24] = {launch_bin};
    int n = 1;
    for (; args[n - 1]; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    int rc = wait_exit(spawn(argv, o, e), now_ms() + 60000);
    *out = read_text(o);
    *err = read_text(e);
    return rc;
}

static void test_processes_share_the_cores(void **state)
{
    fixture_t *f = *state;
    write_script(f->script, "echo \"threads $RANK $OPENBLAS_NUM_THREADS $ZDIST_NUM_THREADS\"\n");
    unsetenv("OPENBLAS_NUM_THREADS");
    unsetenv("ZDIST_NUM_THREADS");
    char *out, *err, want[128];
    long c = cores(), t = c / 3 < 1 ? 1 : c / 3;
    assert_int_equal(run_launch(f, (char *[]){"--nproc=3", f->script, NULL}, &out, &err), 0);
    for (int r = 0; r < 3; r++) {
        snprintf(want, sizeof want, "[rank %d] threads %d %ld %ld\n", r, r, t, t);
        assert_contains(out, want);
    }
    snprintf(want, sizeof want,
             "launch: %ld compute thread%s per process (%ld core%s, "
             "3 processes on this node)\n",
             t, t == 1 ? "" : "s", c, c == 1 ? "" : "s");
    assert_contains(err, want);
    free(out);
    free(err);
    /* The user's choice wins, and sets the other variable too. */
    setenv("OPENBLAS_NUM_THREADS", "3", 1);
    assert_int_equal(run_launch(f, (char *[]){"--nproc=2", f->script, NULL}, &out, &err), 0);
    unsetenv("OPENBLAS_NUM_THREADS");
    assert_contains(out, "[rank 1] threads 1 3 3\n");
    assert_contains(err, "launch: 3 compute threads per process (OPENBLAS_NUM_THREADS set)\n");
    free(out);
    free(err);
}

/*  Rank 1 writes 30 lines and fails: launch shows the last 20 of its log. */
static void test_failed_rank_log_tail(void **state)
{
    fixture_t *f = *state;
    /* Ranks 0 and 2 write their line, say so through a FIFO and wait to be
       stopped; rank 1 fails once they have. */
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/ready", f->dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    char body[1024];
    snprintf(body, sizeof body,
             "if [ \"$RANK\" = 1 ]; then\n"
             "  exec 3<>%s; read a <&3; read b <&3\n"
             "  i=0; while [ $i -lt 30 ]; do echo \"line $i\"; i=$((i + 1)); done\n"
             "  echo 'rank 1 gives up' >&2; exit 3\n"
             "fi\n"
             "echo \"rank $RANK is fine\"\n"
             "echo $RANK > %s\n"
             "exec sleep 300\n",
             fifo, fifo);
    write_script(f->script, body);
    char logdir[128], flag[160], *out, *err, want[256];
    snprintf(logdir, sizeof logdir, "%s/new/logs", f->dir);
    snprintf(flag, sizeof flag, "--log_dir=%s", logdir);
    assert_int_equal(run_launch(f,
                                (char *[]){"--nproc=3", flag, "--no_rank_flags", f->script, NULL},
                                &out, &err),
                     3);
    snprintf(want, sizeof want,
             "launch: last lines of %s/rank_01.log:\n"
             "[rank 1] line 11\n",
             logdir);
    assert_contains(err, want);
    assert_contains(err, "[rank 1] line 29\n[rank 1] rank 1 gives up\n");
    assert_null(strstr(err, "line 10\n"));
    snprintf(want, sizeof want, "%s/rank_00.log", logdir);
    assert_log(want, "rank 0 is fine\n");
    assert_string_equal(out, "");
    free(out);
    free(err);
}

static void test_bad_node_flags(void **state)
{
    fixture_t *f = *state;
    static const struct {
        const char *args[8];
        const char *message;
    } cases[] = {
        {{"--nnodes=2", "--node_rank=2", "--master_addr=10.0.0.1", "--master_port=29500",
          "--nproc=2", "/bin/true"},
         "launch: --node_rank=2 but --nnodes=2: node ranks are 0..1\n"},
        {{"--nnodes=2", "--node_rank=1", "--master_addr=10.0.0.1", "--nproc_per_node=2",
          "/bin/true"},
         "launch: --node_rank=1 needs --master_port: only node 0 may pick a free port"},
        {{"--nnodes=2", "--node_rank=0", "--nproc=2", "/bin/true"},
         "launch: --nnodes > 1 needs --master_addr"},
        {{"--nnodes=0", "--nproc=2", "/bin/true"},
         "launch: --nnodes expects an integer in 1..1024, got \"0\""},
        {{"--node_rank=-1", "--nproc=2", "/bin/true"},
         "launch: --node_rank expects an integer in 0..1023"},
        {{"--nproc_per_node=1025", "/bin/true"},
         "launch: --nproc_per_node expects an integer in 1..1024"},
        {{"--nproc=1", "--log_dir=", "/bin/true"}, "launch: --log_dir needs a non-empty value"},
        {{"--nproc=1", "--log_dir=/dev/null/x", "/bin/true"},
         "launch: cannot create the folder /dev/null/x: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        int rc = run_launch(f, (char **)cases[i].args, &out, &err);
        assert_contains(err, cases[i].message);
        assert_int_equal(rc, i + 1 < sizeof cases / sizeof cases[0] ? 2 : 1);
        assert_string_equal(out, "");
        free(out);
        free(err);
    }
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--netns")) {
        if (geteuid() != 0 || access("/sbin/ip", X_OK) != 0) {
            printf("skipped: network namespaces need root and /sbin/ip (iproute2)\n");
            return 77;
        }
        const struct CMUnitTest netns[] = {
            cmocka_unit_test_setup_teardown(test_two_nodes_in_two_network_namespaces, setup,
                                            teardown),
        };
        int rc = cmocka_run_group_tests(netns, NULL, NULL);
        return netns_unavailable ? 77 : rc;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_nodes_form_one_world, setup, teardown),
        cmocka_unit_test_setup_teardown(test_processes_share_the_cores, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_rank_log_tail, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_node_flags, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
