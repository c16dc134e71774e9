/* SPDX-License-Identifier: MIT */
/*  tools/launch (SPEC P6): runs the built binary ($ZDIST_BUILD_DIR/tools/launch)
    on small /bin/sh scripts written into a fresh temporary folder.

    The scripts never sleep to let something happen: the ranks that must be
    running before another one fails say so through a FIFO ("ready"), which
    the failing rank (or the test) reads. Long-running ranks "exec sleep 300":
    the test passes only if launch stops them rather than waiting. Every
    process a script starts writes its pid to a file so that the test can
    check that none is left. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "tests/support/fixtures.h"

extern char **environ;

#define WAIT_MS 60000 /* bound on every wait; far beyond what a passing test needs */

typedef struct {
    char dir[64];     /* the temporary folder */
    char script[128]; /* dir/rank.sh */
    char fifo[128];   /* dir/ready */
    char out[128], err[128];
} fixture_t;

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    if (!f)
        return -1;
    strcpy(f->dir, "/tmp/zdist-launch-XXXXXX");
    if (!mkdtemp(f->dir))
        return -1;
    snprintf(f->script, sizeof f->script, "%s/rank.sh", f->dir);
    snprintf(f->fifo, sizeof f->fifo, "%s/ready", f->dir);
    snprintf(f->out, sizeof f->out, "%s/out.txt", f->dir);
    snprintf(f->err, sizeof f->err, "%s/err.txt", f->dir);
    if (mkfifo(f->fifo, 0600) < 0)
        return -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", f->dir);
    int rc = system(cmd);
    while (waitpid(-1, NULL, WNOHANG) > 0) /* orphans reparented to us (subreaper) */
        ;
    free(f);
    return rc == 0 ? 0 : -1;
}

/*  The script every rank runs: $d is the fixture's folder. */
static void write_rank_script(const fixture_t *f, const char *body)
{
    char *text;
    assert_true(asprintf(&text, "d=%s\n%s", f->dir, body) > 0);
    write_script(f->script, text);
    free(text);
}

/*  Starts launch with args (NULL-terminated, without argv[0]); its stdout and
    stderr go to f->out and f->err. */
static pid_t spawn_launch(const fixture_t *f, const char *const *args)
{
    char exe[1024];
    const char *build = getenv("ZDIST_BUILD_DIR");
    snprintf(exe, sizeof exe, "%s/tools/launch", build && *build ? build : "..");
    char *argv[32] = {exe};
    int n = 1;
    while (args[n - 1]) {
        assert_true(n < 31);
        argv[n] = (char *)args[n - 1];
        n++;
    }
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, f->out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, f->err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawn(&pid, exe, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        fail_msg("cannot run %s: %s (build the launch target)", exe, strerror(rc));
    return pid;
}

/*  Waits at most ms for pid to exit. Returns true if it did (and reaps it
    when it is our child: its status goes to *status if not NULL). */
static bool wait_gone(pid_t pid, int ms, int *status)
{
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd >= 0) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int rc = poll(&p, 1, ms);
        close(fd);
        if (rc <= 0)
            return false;
    } else if (errno != ESRCH) {
        fail_msg("pidfd_open(%d): %s", (int)pid, strerror(errno));
    }
    int st = 0;
    if (waitpid(pid, &st, 0) == pid && status)
        *status = st;
    return true;
}

/*  Waits for launch; returns its exit status (128+signal if killed). */
static int wait_launch(pid_t pid)
{
    int st;
    if (!wait_gone(pid, WAIT_MS, &st)) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        fail_msg("launch did not exit within %d ms", WAIT_MS);
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int run_launch(const fixture_t *f, const char *const *args, char **out, char **err)
{
    int rc = wait_launch(spawn_launch(f, args));
    *out = read_text(f->out);
    *err = read_text(f->err);
    assert_non_null(*out);
    assert_non_null(*err);
    return rc;
}

static pid_t read_pid(const fixture_t *f, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", f->dir, name);
    char *s = read_text(path);
    assert_non_null(s);
    pid_t pid = (pid_t)atoi(s);
    free(s);
    assert_true(pid > 1);
    return pid;
}

/*  launch reaps everything it started before it exits, so these processes
    must be gone the moment it has exited (not even zombies). */
static void assert_gone(const fixture_t *f, const char *const *pidfiles)
{
    for (int i = 0; pidfiles[i]; i++) {
        pid_t pid = read_pid(f, pidfiles[i]);
        if (kill(pid, 0) == 0) {
            kill(pid, SIGKILL);
            fail_msg("process %d (%s) outlived launch", (int)pid, pidfiles[i]);
        }
        assert_int_equal(errno, ESRCH);
    }
}

/*  Reads n lines ("rank\n") from the ready FIFO, opened read-write so that
    it neither blocks on open nor sees end of file between writers. */
static void wait_ready(int fd, int n)
{
    int got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_int_equal(poll(&p, 1, WAIT_MS), 1);
        char buf[64];
        ssize_t k = read(fd, buf, sizeof buf);
        assert_true(k > 0);
        for (ssize_t i = 0; i < k; i++)
            got += buf[i] == '\n';
    }
}

static void test_ranks_get_flags_env_and_labelled_lines(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "echo \"env $RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $LOCAL_RANK\" "
                      "\"$LOCAL_WORLD_SIZE args $(printf '<%s>' \"$@\")\"\n"
                      "echo \"to stderr $RANK\" >&2\n"
                      "printf 'no newline %s' \"$RANK\"\n");
    char *out, *err;
    const char *args[] = {"--nproc=3", "--", f->script, "--foo", "two words", NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 0);

    /* launch picked the port: read it from rank 0, then check everyone. */
    const char *p = strstr(out, "[rank 0] env 0 3 127.0.0.1 ");
    assert_non_null(p);
    int port = atoi(p + strlen("[rank 0] env 0 3 127.0.0.1 "));
    assert_true(port > 0 && port < 65536);
    for (int r = 0; r < 3; r++) {
        char want[512];
        snprintf(want, sizeof want,
                 "[rank %d] env %d 3 127.0.0.1 %d %d 3 args <--foo>"
                 "<two words><--rank=%d><--world_size=3><--master_addr=127.0.0.1>"
                 "<--master_port=%d>\n",
                 r, r, port, r, r, port);
        assert_contains(out, want);
        snprintf(want, sizeof want, "[rank %d] no newline %d\n", r, r);
        assert_contains(out, want);
        snprintf(want, sizeof want, "[rank %d] to stderr %d\n", r, r);
        assert_contains(err, want);
    }
    assert_null(strstr(out, "to stderr"));
    /* stdout holds nothing but the ranks' lines: 2 per rank */
    int lines = 0;
    for (const char *l = out; *l; lines++) {
        assert_int_equal(strncmp(l, "[rank ", 6), 0);
        const char *nl = strchr(l, '\n');
        assert_non_null(nl);
        l = nl + 1;
    }
    assert_int_equal(lines, 6);
    assert_contains(err, "launch: 3 processes finished in ");
    free(out);
    free(err);
}

static void test_no_rank_flags_given_port_and_address(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "echo \"env $RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $LOCAL_RANK\" "
                      "\"args $(printf '<%s>' \"$@\")\"\n");
    /* Inherited values of the variables launch sets must not leak through. */
    setenv("RANK", "99", 1);
    setenv("MASTER_PORT", "1", 1);
    char *out, *err;
    const char *args[] = {"--nproc",
                          "2",
                          "--no_rank_flags",
                          "--master_port=29533",
                          "--master_addr=127.0.0.2",
                          f->script,
                          "--foo",
                          NULL};
    int rc = run_launch(f, args, &out, &err);
    unsetenv("RANK");
    unsetenv("MASTER_PORT");
    assert_int_equal(rc, 0);
    assert_contains(out, "[rank 0] env 0 2 127.0.0.2 29533 0 args <--foo>\n");
    assert_contains(out, "[rank 1] env 1 2 127.0.0.2 29533 1 args <--foo>\n");
    free(out);
    free(err);
}

/*  Many long lines written at once by every rank, and one very long line
    that takes many reads: each must come out whole, labelled once. */
static void test_long_lines_are_never_mixed(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "s=$(head -c 3000 /dev/zero | tr '\\0' \"$RANK\")\n"
                      "i=0\n"
                      "while [ $i -lt 200 ]; do echo \"$s\"; i=$((i + 1)); done\n"
                      "if [ \"$RANK\" = 1 ]; then head -c 300000 /dev/zero | tr '\\0' x >&2; fi\n");
    char *out, *err;
    const char *args[] = {"--nproc=3", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 0);
    int count[3] = {0};
    for (char *l = out; *l;) {
        char *nl = strchr(l, '\n');
        assert_non_null(nl);
        assert_int_equal(nl - l, 9 + 3000);
        assert_int_equal(strncmp(l, "[rank ", 6), 0);
        int r = l[6] - '0';
        assert_true(r >= 0 && r < 3);
        assert_int_equal(strncmp(l + 7, "] ", 2), 0);
        for (int i = 0; i < 3000; i++)
            assert_int_equal(l[9 + i], '0' + r);
        count[r]++;
        l = nl + 1;
    }
    for (int r = 0; r < 3; r++)
        assert_int_equal(count[r], 200);
    const char *x = strstr(err, "[rank 1] xxx");
    assert_non_null(x);
    assert_int_equal(strspn(x + 9, "x"), 300000);
    assert_int_equal(x[9 + 300000], '\n');
    free(out);
    free(err);
}

/*  Ranks 0 and 2 would run for minutes (rank 2 also started a child of its
    own); rank 1 exits 3 once they run, right after much output. */
static void test_failure_stops_the_others(void **state)
{
    fixture_t *f = *state;
    write_rank_script(
        f,
        "echo $$ > $d/pid.$RANK\n"
        "if [ \"$RANK\" = 1 ]; then\n"
        "    exec 3<>$d/ready\n"
        "    read a <&3; read b <&3\n"
        "    i=0\n"
        "    while [ $i -lt 3000 ]; do echo \"last words $i\"; i=$((i + 1)); done >&2\n"
        "    echo 'rank 1 gives up' >&2\n"
        "    exit 3\n"
        "fi\n"
        "if [ \"$RANK\" = 2 ]; then sleep 300 & echo $! > $d/child.2; fi\n"
        "echo $RANK > $d/ready\n"
        "exec sleep 300\n");
    char *out, *err;
    const char *args[] = {"--nproc=3", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 3);
    char want[128];
    snprintf(want, sizeof want, "launch: rank 1 exited with status 3 (pid %d)\n",
             (int)read_pid(f, "pid.1"));
    assert_contains(err, want);
    /* all it wrote comes before the report of its exit */
    const char *last = strstr(err, "[rank 1] rank 1 gives up\n");
    assert_non_null(last);
    assert_true(last < strstr(err, want));
    assert_contains(err, "launch: stopping the other 2 processes\n");
    assert_contains(err, "exit status 3\n");
    /* the others were stopped, not reported as failures of their own */
    assert_null(strstr(err, "launch: rank 0 "));
    assert_null(strstr(err, "launch: rank 2 "));
    assert_gone(f, (const char *const[]){"pid.0", "pid.1", "pid.2", "child.2", NULL});
    free(out);
    free(err);
}

static void test_signal_death_is_128_plus_signal(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "echo $$ > $d/pid.$RANK\n"
                      "if [ \"$RANK\" = 0 ]; then\n"
                      "    exec 3<>$d/ready\n"
                      "    read a <&3; read b <&3\n"
                      "    kill -9 $$\n"
                      "fi\n"
                      "echo $RANK > $d/ready\n"
                      "exec sleep 300\n");
    char *out, *err;
    const char *args[] = {"--nproc=3", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 137);
    char want[128];
    snprintf(want, sizeof want, "launch: rank 0 killed by signal 9 (SIGKILL, pid %d)\n",
             (int)read_pid(f, "pid.0"));
    assert_contains(err, want);
    assert_gone(f, (const char *const[]){"pid.0", "pid.1", "pid.2", NULL});
    free(out);
    free(err);
}

/*  Rank 1 ignores SIGTERM (and so does the sleep it execs): launch must
    SIGKILL it after --grace_s, and only it. */
static void test_sigterm_ignored_gets_sigkill_after_grace(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "echo $$ > $d/pid.$RANK\n"
                      "if [ \"$RANK\" = 0 ]; then\n"
                      "    exec 3<>$d/ready\n"
                      "    read a <&3; read b <&3\n"
                      "    exit 1\n"
                      "fi\n"
                      "if [ \"$RANK\" = 1 ]; then trap '' TERM; fi\n"
                      "echo $RANK > $d/ready\n"
                      "exec sleep 300\n");
    char *out, *err;
    const char *args[] = {"--nproc=3", "--grace_s=0.5", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 1);
    assert_contains(err, "launch: rank 0 exited with status 1 (pid ");
    assert_contains(err, "launch: rank 1 still running 0.5 s after SIGTERM; sending SIGKILL\n");
    assert_null(strstr(err, "rank 2 still running"));
    assert_gone(f, (const char *const[]){"pid.0", "pid.1", "pid.2", NULL});
    free(out);
    free(err);
}

static const char *const sleepers = "echo $$ > $d/pid.$RANK\n"
                                    "echo $RANK > $d/ready\n"
                                    "exec sleep 300\n";

static void test_sigterm_to_launch_stops_the_world(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, sleepers);
    int ready = open(f->fifo, O_RDWR | O_CLOEXEC);
    assert_true(ready >= 0);
    const char *args[] = {"--nproc=3", "--no_rank_flags", f->script, NULL};
    pid_t pid = spawn_launch(f, args);
    wait_ready(ready, 3);
    close(ready);
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_int_equal(wait_launch(pid), 143);
    char *err = read_text(f->err);
    assert_contains(err, "launch: received SIGTERM; stopping 3 processes\n");
    assert_gone(f, (const char *const[]){"pid.0", "pid.1", "pid.2", NULL});
    free(err);
}

/*  launch cannot do anything about SIGKILL: its ranks die of their
    PR_SET_PDEATHSIG. This test process is a subreaper (see main), so they
    become its children and it can see them die. */
static void test_sigkill_to_launch_kills_the_ranks(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, sleepers);
    int ready = open(f->fifo, O_RDWR | O_CLOEXEC);
    assert_true(ready >= 0);
    const char *args[] = {"--nproc=2", "--no_rank_flags", f->script, NULL};
    pid_t pid = spawn_launch(f, args);
    wait_ready(ready, 2);
    close(ready);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(wait_launch(pid), 137);
    for (int r = 0; r < 2; r++) {
        char name[16];
        snprintf(name, sizeof name, "pid.%d", r);
        pid_t child = read_pid(f, name);
        int st = 0;
        assert_true(wait_gone(child, WAIT_MS, &st));
        assert_true(WIFSIGNALED(st));
        assert_int_equal(WTERMSIG(st), SIGKILL);
    }
}

/*  SIGINT is forwarded as it is, so that programs can wind down their own
    way: here each rank stops its background sleep and exits 0. */
static void test_sigint_is_forwarded(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "trap 'echo \"rank $RANK got INT\"; kill $child; exit 0' INT\n"
                      "sleep 300 &\n"
                      "child=$!\n"
                      "echo $child > $d/child.$RANK\n"
                      "echo $RANK > $d/ready\n"
                      "wait $child\n");
    int ready = open(f->fifo, O_RDWR | O_CLOEXEC);
    assert_true(ready >= 0);
    const char *args[] = {"--nproc=2", "--no_rank_flags", f->script, NULL};
    pid_t pid = spawn_launch(f, args);
    wait_ready(ready, 2);
    close(ready);
    assert_int_equal(kill(pid, SIGINT), 0);
    assert_int_equal(wait_launch(pid), 130);
    char *out = read_text(f->out), *err = read_text(f->err);
    assert_contains(out, "[rank 0] rank 0 got INT\n");
    assert_contains(out, "[rank 1] rank 1 got INT\n");
    assert_contains(err, "launch: received SIGINT; stopping 2 processes\n");
    assert_null(strstr(err, "SIGKILL"));
    assert_gone(f, (const char *const[]){"child.0", "child.1", NULL});
    free(out);
    free(err);
}

/*  Ranks that exit 0 but leave a process running: the world is over, so
    launch stops what they left and still exits 0. */
static void test_processes_left_behind_are_stopped(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      "sleep 300 &\n"
                      "echo $! > $d/child.$RANK\n");
    char *out, *err;
    const char *args[] = {"--nproc=2", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 0);
    assert_contains(err, "launch: stopping processes the world left behind\n");
    assert_contains(err, "launch: 2 processes finished in ");
    assert_gone(f, (const char *const[]){"child.0", "child.1", NULL});
    free(out);
    free(err);
}

static void test_timeout_stops_the_world(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, sleepers);
    char *out, *err;
    const char *args[] = {"--nproc=2", "--timeout_s=0.2", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 124);
    assert_contains(err, "launch: still running after --timeout_s=0.2; stopping ");
    free(out);
    free(err);
}

/*  A rank that cannot be executed (bad interpreter) is a failing rank. */
static void test_exec_failure_is_a_failure(void **state)
{
    fixture_t *f = *state;
    FILE *fp = fopen(f->script, "w");
    assert_non_null(fp);
    fputs("#!/nonexistent/interpreter\n", fp);
    fclose(fp);
    assert_int_equal(chmod(f->script, 0755), 0);
    char *out, *err;
    const char *args[] = {"--nproc=1", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 127);
    assert_contains(err, "[rank 0] launch: exec failed: ");
    assert_contains(err, "launch: rank 0 exited with status 127 (pid ");
    free(out);
    free(err);
}

/*  ---- --max_restarts ---- */

/*  The pids a rank's lives wrote, one a line, into pids (at most max);
    returns how many. */
static int read_lives(const fixture_t *f, int rank, pid_t *pids, int max)
{
    char path[256];
    snprintf(path, sizeof path, "%s/pids.%d", f->dir, rank);
    char *s = read_text(path);
    assert_non_null(s);
    int n = 0;
    for (char *l = s; *l && n < max; n++) {
        pids[n] = (pid_t)strtol(l, &l, 10);
        assert_true(pids[n] > 1);
        l += *l == '\n';
    }
    free(s);
    return n;
}

/*  Every life of a rank appends its pid to pids.R and numbers itself. */
#define LIVES                                                                                      \
    "echo $$ >> $d/pids.$RANK\n"                                                                   \
    "life=$(wc -l < $d/pids.$RANK)\n"                                                              \
    "env | sort > $d/env.$RANK.$life\n"                                                            \
    "echo \"rank $RANK life $life args $(printf '<%s>' \"$@\")\"\n"

/*  Rank 1 exits 5 and rank 2 is killed by SIGKILL in their first lives;
    their second lives succeed. Rank 0 must still be running then (it exits
    only once both second lives said ready): restarting one rank stops
    nobody. Rank 1's first life leaves a process behind that holds a lock
    its second life waits for: launch must kill it before the restart. */
static void test_failed_ranks_restart_in_place(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      LIVES
                      "case \"$RANK.$life\" in\n"
                      "0.1) exec 3<>$d/ready; read a <&3; read b <&3; exit 0 ;;\n"
                      "1.1) exec 9>$d/lock; flock 9; sleep 300 & echo $! > $d/child.1; exit 5 ;;\n"
                      "1.2) flock $d/lock true; echo 1 > $d/ready; exit 0 ;;\n"
                      "2.1) kill -9 $$ ;;\n"
                      "2.2) echo 2 > $d/ready; exit 0 ;;\n"
                      "esac\n"
                      "exit 9\n");
    char ck[160];
    snprintf(ck, sizeof ck, "--checkpoint=%s/ck", f->dir);
    char *out, *err;
    const char *args[] = {"--nproc=3", "--max_restarts=2", "--", f->script, ck, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 0);

    pid_t p0[4], p1[4], p2[4];
    assert_int_equal(read_lives(f, 0, p0, 4), 1); /* exited 0: never restarted */
    assert_int_equal(read_lives(f, 1, p1, 4), 2);
    assert_int_equal(read_lives(f, 2, p2, 4), 2);
    char want[512];
    snprintf(want, sizeof want,
             "launch: rank 1 (pid %d) exited with status 5; restarting it "
             "(restart 1 of 2)\n",
             (int)p1[0]);
    assert_contains(err, want);
    snprintf(want, sizeof want, "launch: rank 1 restarted as pid %d with --resume\n", (int)p1[1]);
    assert_contains(err, want);
    snprintf(want, sizeof want,
             "launch: rank 2 (pid %d) was killed by SIGKILL; restarting it "
             "(restart 1 of 2)\n",
             (int)p2[0]);
    assert_contains(err, want);
    snprintf(want, sizeof want, "launch: rank 2 restarted as pid %d with --resume\n", (int)p2[1]);
    assert_contains(err, want);
    assert_contains(err, " after 2 restarts\n");
    assert_contains(err, "launch: 3 processes finished in ");
    assert_null(strstr(err, "stopping"));

    /* Same rank, flags and environment (the world key launch made too),
       plus --resume since the program takes --checkpoint. */
    for (int r = 1; r <= 2; r++) {
        snprintf(want, sizeof want,
                 "[rank %d] rank %d life 1 args <%s><--rank=%d>"
                 "<--world_size=3><--master_addr=127.0.0.1><--master_port=",
                 r, r, ck, r);
        assert_contains(out, want);
        snprintf(want, sizeof want,
                 "[rank %d] rank %d life 2 args <%s><--resume><--rank=%d>"
                 "<--world_size=3><--master_addr=127.0.0.1><--master_port=",
                 r, r, ck, r);
        assert_contains(out, want);
        char a[256], b[256];
        snprintf(a, sizeof a, "%s/env.%d.1", f->dir, r);
        snprintf(b, sizeof b, "%s/env.%d.2", f->dir, r);
        char *env1 = read_text(a), *env2 = read_text(b);
        assert_non_null(env1);
        assert_non_null(env2);
        /* The same, but for the count of restarts. */
        char *count = strstr(env2, "\nZDIST_RESTART_COUNT=1\n");
        assert_non_null(count);
        assert_contains(env1, "\nZDIST_RESTART_COUNT=0\n");
        count[strlen("\nZDIST_RESTART_COUNT=")] = '0';
        assert_string_equal(env1, env2);
        assert_contains(env1, "ZDIST_KEY_FILE=");
        snprintf(want, sizeof want, "\nRANK=%d\n", r);
        assert_contains(env1, want);
        free(env1);
        free(env2);
    }
    assert_gone(f, (const char *const[]){"child.1", NULL});
    pid_t all[] = {p0[0], p1[0], p1[1], p2[0], p2[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_true(kill(all[i], 0) < 0 && errno == ESRCH);
    free(out);
    free(err);
}

/*  Rank 1 fails every time: after its 2 restarts the world is stopped as
    without --max_restarts, with the last failure's status. No --checkpoint:
    no --resume. */
static void test_restarts_run_out(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      LIVES "if [ \"$RANK\" = 0 ]; then echo 0 > $d/ready; exec sleep 300; fi\n"
                            "if [ \"$life\" = 1 ]; then exec 3<>$d/ready; read a <&3; fi\n"
                            "echo \"rank 1 gives up\" >&2\n"
                            "exit 4\n");
    char *out, *err;
    const char *args[] = {"--nproc=2", "--max_restarts=2", f->script, "--flag", NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 4);
    pid_t p0[4], p1[4];
    assert_int_equal(read_lives(f, 0, p0, 4), 1);
    assert_int_equal(read_lives(f, 1, p1, 4), 3);
    char want[256];
    snprintf(want, sizeof want,
             "launch: rank 1 (pid %d) exited with status 4; restarting it "
             "(restart 1 of 2)\nlaunch: rank 1 restarted as pid %d\n",
             (int)p1[0], (int)p1[1]);
    assert_contains(err, want);
    snprintf(want, sizeof want,
             "launch: rank 1 (pid %d) exited with status 4; restarting it "
             "(restart 2 of 2)\nlaunch: rank 1 restarted as pid %d\n",
             (int)p1[1], (int)p1[2]);
    assert_contains(err, want);
    snprintf(want, sizeof want,
             "launch: rank 1 exited with status 4 (pid %d)\n"
             "launch: rank 1 has no restarts left (--max_restarts=2)\n"
             "launch: stopping the other 1 process\n",
             (int)p1[2]);
    assert_contains(err, want);
    assert_contains(err, "exit status 4\n");
    assert_null(strstr(err, "restart 3"));
    assert_null(strstr(out, "--resume"));
    assert_contains(out, "[rank 1] rank 1 life 3 args <--flag><--rank=1>");
    assert_gone(f, (const char *const[]){"pids.0", NULL});
    free(out);
    free(err);
}

/*  A rank killed by a signal every time: the world's status is 128+signal. */
static void test_restarts_run_out_on_signals(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, LIVES "kill -9 $$\n");
    char *out, *err;
    const char *args[] = {"--nproc=1", "--max_restarts=1", "--no_rank_flags", f->script, NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 137);
    pid_t p[4];
    assert_int_equal(read_lives(f, 0, p, 4), 2);
    char want[256];
    snprintf(want, sizeof want,
             "launch: rank 0 (pid %d) was killed by SIGKILL; restarting it "
             "(restart 1 of 1)\n",
             (int)p[0]);
    assert_contains(err, want);
    snprintf(want, sizeof want,
             "launch: rank 0 killed by signal 9 (SIGKILL, pid %d)\n"
             "launch: rank 0 has no restarts left (--max_restarts=1)\n",
             (int)p[1]);
    assert_contains(err, want);
    free(out);
    free(err);
}

/*  Which programs get --resume on a restart: those given --checkpoint (in
    either flag form, with a value) and not --resume already. */
static void test_resume_only_with_checkpoints(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, LIVES "[ \"$life\" = 2 ] || exit 1\n");
    static const struct {
        const char *flags[3];
        const char *second_life; /* the restarted process's arguments */
    } cases[] = {
        {{"--checkpoint=ck"}, "<--checkpoint=ck><--resume>"},
        {{"--checkpoint", "ck"}, "<--checkpoint><ck><--resume>"},
        {{"--checkpoint=ck", "--resume"}, "<--checkpoint=ck><--resume>"},
        {{"--resume=false", "--checkpoint=ck"}, "<--resume=false><--checkpoint=ck>"},
        {{"--checkpoint_every=5"}, "<--checkpoint_every=5>"},
        {{"--checkpoint="}, "<--checkpoint=>"},
        {{NULL}, "<>"}, /* printf's format used once with no arguments */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char pids[256];
        snprintf(pids, sizeof pids, "%s/pids.0", f->dir);
        unlink(pids);
        const char *args[8] = {"--nproc=1", "--max_restarts=1", "--no_rank_flags", f->script};
        int n = 4;
        for (int k = 0; k < 3 && cases[i].flags[k]; k++)
            args[n++] = cases[i].flags[k];
        args[n] = NULL;
        char *out, *err;
        assert_int_equal(run_launch(f, args, &out, &err), 0);
        char want[256];
        snprintf(want, sizeof want, "[rank 0] rank 0 life 2 args %s\n", cases[i].second_life);
        assert_contains(out, want);
        bool resumed = strstr(cases[i].second_life, "<--resume>") &&
            !strstr(cases[i].flags[1] ? cases[i].flags[1] : "", "--resume");
        if (resumed)
            assert_contains(err, " with --resume\n");
        else
            assert_null(strstr(err, " with --resume"));
        free(out);
        free(err);
    }
}

/*  With --log_dir a restarted rank appends to its log, after a line that
    says so, and launch shows the tail of the failed life. */
static void test_restart_appends_to_the_log(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f,
                      LIVES "if [ \"$life\" = 1 ]; then echo 'first life dies' >&2; exit 3; fi\n");
    char logs[128];
    snprintf(logs, sizeof logs, "--log_dir=%s/logs", f->dir);
    char *out, *err;
    const char *args[] = {"--nproc=1", "--max_restarts=1", "--no_rank_flags",
                          logs,        f->script,          NULL};
    assert_int_equal(run_launch(f, args, &out, &err), 0);
    assert_string_equal(out, "");
    char path[256];
    snprintf(path, sizeof path, "%s/logs/rank_00.log", f->dir);
    char *log = read_text(path);
    assert_non_null(log);
    assert_string_equal(log,
                        "rank 0 life 1 args <>\nfirst life dies\n"
                        "launch: rank 0 restarted (restart 1 of 1)\nrank 0 life 2 args <>\n");
    char want[512];
    snprintf(want, sizeof want,
             "launch: last lines of %s:\n[rank 0] rank 0 life 1 args <>\n"
             "[rank 0] first life dies\n",
             path);
    assert_contains(err, want);
    free(log);
    free(out);
    free(err);
}

/*  Ranks that die because launch stops the world are not restarted. */
static void test_no_restarts_while_stopping(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, sleepers);
    int ready = open(f->fifo, O_RDWR | O_CLOEXEC);
    assert_true(ready >= 0);
    const char *args[] = {"--nproc=2", "--max_restarts=3", "--no_rank_flags", f->script, NULL};
    pid_t pid = spawn_launch(f, args);
    wait_ready(ready, 2);
    close(ready);
    assert_int_equal(kill(pid, SIGTERM), 0);
    assert_int_equal(wait_launch(pid), 143);
    char *err = read_text(f->err);
    assert_contains(err, "launch: received SIGTERM; stopping 2 processes\n");
    assert_null(strstr(err, "restart"));
    assert_gone(f, (const char *const[]){"pid.0", "pid.1", NULL});
    free(err);
}

static void test_bad_flags_and_missing_program(void **state)
{
    fixture_t *f = *state;
    write_rank_script(f, "exit 0\n");
    static const struct {
        const char *args[6];
        const char *message;
    } cases[] = {
        {{"--nproc=0", "/bin/true"}, "launch: --nproc expects an integer in 1..1024, got \"0\""},
        {{"--nproc=1025", "/bin/true"}, "launch: --nproc expects an integer in 1..1024"},
        {{"--nproc=two", "/bin/true"}, "launch: --nproc expects an integer"},
        {{"/bin/true"}, "launch: --nproc=N is required"},
        {{"--nproc=2"}, "launch: no program to run"},
        {{"--nproc=2", "--bogus=1", "/bin/true"}, "launch: unknown flag --bogus"},
        {{"--nproc=2", "--grace_s=-1", "/bin/true"}, "launch: --grace_s expects a number"},
        {{"--nproc=2", "--master_port=70000", "/bin/true"}, "launch: --master_port expects"},
        {{"--nproc=2", "--master_port"}, "launch: --master_port needs a value"},
        {{"--nproc=2", "--max_restarts=-1", "/bin/true"},
         "launch: --max_restarts expects an integer in 0..1000000, got \"-1\""},
        {{"--nproc=2", "/nonexistent/program"}, "launch: cannot run \"/nonexistent/program\""},
        {{"--nproc=2", "no-such-program-zdist"}, "not found in PATH"},
        {{"--nproc=2", "/tmp"}, "launch: cannot run \"/tmp\": not an executable file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        assert_int_equal(run_launch(f, cases[i].args, &out, &err), 2);
        assert_contains(err, cases[i].message);
        assert_string_equal(out, "");
        free(out);
        free(err);
    }
    char *out, *err;
    const char *help[] = {"--help", NULL};
    assert_int_equal(run_launch(f, help, &out, &err), 0);
    assert_contains(out, "usage: launch --nproc=N");
    assert_contains(out, "  --max_restarts=N ");
    assert_contains(out, "at most N times per rank");
    free(out);
    free(err);
}

int main(void)
{
    /* Orphans of the worlds below are reparented to this process, so that
       the test of PR_SET_PDEATHSIG can wait for the ranks of a killed launch. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
        perror("prctl(PR_SET_CHILD_SUBREAPER)");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ranks_get_flags_env_and_labelled_lines, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_no_rank_flags_given_port_and_address, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_lines_are_never_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_stops_the_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_signal_death_is_128_plus_signal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_ignored_gets_sigkill_after_grace, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sigterm_to_launch_stops_the_world, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigkill_to_launch_kills_the_ranks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sigint_is_forwarded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_processes_left_behind_are_stopped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_timeout_stops_the_world, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exec_failure_is_a_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_ranks_restart_in_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarts_run_out, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarts_run_out_on_signals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_only_with_checkpoints, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_appends_to_the_log, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_restarts_while_stopping, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_flags_and_missing_program, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
