/* SPDX-License-Identifier: MIT */
/*  Bad input on the command line and in the files a process is given
    (issue 24 points 8 to 12), each case an attack that worked before:
      - a key file that is a FIFO: zd_rpc_init blocked in open() for ever,
        past its init timeout; now refused at once;
      - --world_size=0 or -1, --master_port=0, --rank=-1: silently the
        defaults (a world of 4 on port 29500 that waited out the init
        timeout); now refused at parse time, in every example;
      - --lr=nan (passed every "lr > 0" check) and --lr=inf (applied):
        now refused at parse time, like every numeric flag that is not
        finite, in every example;
      - keygen --force PATH where PATH is a hard link to another file (or a
        symbolic link): the other file got the key and mode 0600; now PATH
        is replaced as a name and the other file is left alone;
      - an example's output into a pipe (as under launch) came only at its
        exit; now every example line-buffers it, and a line is in the pipe
        while the process still runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/net/security.h"
#include "tests/support/program.h"
#include "tests/support/world.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 4
#else
#define SLOW 1
#endif

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zdist_inputXXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/*  ---- point 8: a key file that is a FIFO ---- */

static int world_fifo_key(const world_t *w)
{
    char path[128], pub[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT];
    snprintf(path, sizeof path, "%s/fifo.key", g_dir);
    WCHECK(mkfifo(path, 0600) == 0);
    /* Nobody ever writes to it: opening it to read blocked for ever. */
    int64_t t0 = world_now_ms();
    WCHECK(zd__security_key_load(path, pub, sec) == -1 &&
           strstr(zd_error_last(), "is not a regular file"));
    zd_rpc_options_t o = world_rpc_options(w->port);
    o.key_file = path;
    WCHECK(zd_rpc_init(NULL, 0, 1, &o) == -1 && strstr(zd_error_last(), path) &&
           strstr(zd_error_last(), "is not a regular file"));
    /* The same through the environment. */
    setenv("ZDIST_KEY_FILE", path, 1);
    o.key_file = NULL;
    WCHECK(zd_rpc_init(NULL, 0, 1, &o) == -1 && strstr(zd_error_last(), "is not a regular file"));
    unsetenv("ZDIST_KEY_FILE");
    int64_t took = world_now_ms() - t0;
    printf("a FIFO key file refused in %lld ms\n", (long long)took);
    WCHECK(took < world_scaled_ms(2000));
    unlink(path);
    return 0;
}

static void test_key_file_fifo_refused_at_once(void **state)
{
    (void)state;
    /* The harness kills what outlives 20 s: the old code never returned. */
    assert_int_equal(world_run_simple(1, 20, world_fifo_key, NULL), 0);
}

/*  ---- points 9 and 10: flags refused at parse time ---- */

/*  Runs prog (in the build folder) with its arguments: it must exit 2 at
    once, saying want. */
static void refused(const char *prog, const char *const *args, const char *want)
{
    char *argv[16] = {(char *)program_path(prog)};
    int k = 1;
    for (int i = 0; args[i]; i++)
        argv[k++] = (char *)args[i];
    argv[k] = NULL;
    char *output = NULL;
    double t0 = program_now_s();
    int rc = program_run(argv, 30 * SLOW, false, &output);
    double took = program_now_s() - t0;
    if (rc != 2 || !output || !strstr(output, want))
        fail_msg("%s %s: exit %d after %.1f s, wanted 2 and \"%s\"; it said:\n%s", prog, args[0],
                 rc, took, want, output ? output : "");
    assert_true(took < 10 * SLOW); /* at parse time, not after an init timeout */
    free(output);
}

static const char *const examples[] = {
    "examples/rpc_ps", "examples/pipeline", "examples/ps_sync_async", "examples/rnn_rpc",
    "examples/rl_rpc", "examples/ps_lstm",  "examples/ps_batch",      "examples/ps_tutorial"};

static void test_world_flags_refused(void **state)
{
    (void)state;
    char port[32];
    snprintf(port, sizeof port, "--master_port=%d", world_free_port());
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        /* Everything else a world needs is there: before, these started
           one with the defaults (4 processes, port 29500) and waited. */
        refused(examples[i],
                (const char *const[]){"--world_size=0", "--rank=0", "--master_addr=127.0.0.1", port,
                                      NULL},
                "--world_size expects an integer of at least 1, got \"0\"");
        refused(examples[i],
                (const char *const[]){"--world_size=-1", "--rank=0", "--master_addr=127.0.0.1",
                                      port, NULL},
                "--world_size expects an integer of at least 1, got \"-1\"");
        refused(examples[i],
                (const char *const[]){"--master_port=0", "--rank=0", "--world_size=3", NULL},
                "--master_port expects a port from 1 to 65535, got \"0\"");
        refused(examples[i], (const char *const[]){"--master_port", "70000", NULL},
                "--master_port expects a port from 1 to 65535, got \"70000\"");
        refused(examples[i], (const char *const[]){"--rank=-1", "--world_size=3", port, NULL},
                "--rank expects an integer of at least 0, got \"-1\"");
    }
}

static void test_non_finite_numbers_refused(void **state)
{
    (void)state;
    const char *const progs[] = {
        "examples/rpc_ps", "examples/pipeline",    "examples/ps_sync_async", "examples/rnn_rpc",
        "examples/rl_rpc", "examples/train_local", "examples/ps_tutorial"};
    const char *const bad[] = {"nan", "inf", "-inf", "NaN", "infinity"};
    for (size_t i = 0; i < sizeof progs / sizeof progs[0]; i++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            char flag[64], want[96];
            snprintf(flag, sizeof flag, "--lr=%s", bad[b]);
            snprintf(want, sizeof want, "--lr expects a finite number, got \"%s\"", bad[b]);
            refused(progs[i], (const char *const[]){flag, NULL}, want);
        }
    refused("examples/ps_sync_async", (const char *const[]){"--progress_s=inf", NULL},
            "--progress_s expects a finite number, got \"inf\"");
    refused("examples/rl_rpc", (const char *const[]){"--gamma=nan", NULL},
            "--gamma expects a finite number, got \"nan\"");
    refused("examples/rnn_rpc", (const char *const[]){"--dropout=nan", NULL},
            "--dropout expects a finite number, got \"nan\"");
    refused("examples/ps_batch", (const char *const[]){"--mode=xx", NULL},
            "ps_batch: --mode is ps or rl (--mode=xx");
    refused("examples/ps_batch", (const char *const[]){"--steps=0", NULL},
            "ps_batch: --steps must be at least 1");
    refused("examples/ps_tutorial", (const char *const[]){"--num_servers=3", NULL},
            "--num_servers 1 or 2");
    refused("examples/ps_tutorial",
            (const char *const[]){"--num_servers=2", "--world_size=2", "--rank=1", NULL},
            "ps_tutorial: a world of 2 with 2 servers has no trainer");
    refused("examples/train_local", (const char *const[]){"--progress_s=-inf", NULL},
            "--progress_s expects a finite number, got \"-inf\"");
    /* Out of a double's range, as before. */
    refused("examples/rpc_ps", (const char *const[]){"--lr=1e999", NULL},
            "--lr expects a finite number, got \"1e999\"");
}

/*  ---- point 11: keygen --force over a link ---- */

static void write_text(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    assert_int_equal(chmod(path, mode), 0);
}

static void assert_text(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    assert_string_equal(buf, text);
}

static void keygen_force(const char *path)
{
    char *argv[] = {(char *)program_path("tools/keygen"), "--force", (char *)path, NULL};
    char *output = NULL;
    assert_int_equal(program_run(argv, 30, true, &output), 0);
    free(output);
}

/*  path is a world key of its own: a regular file, mode 0600, one link. */
static void assert_own_key(const char *path)
{
    struct stat st;
    char pub[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT];
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_nlink, 1);
    assert_int_equal(zd__security_key_load(path, pub, sec), 0);
}

static void test_keygen_force_replaces_links_not_their_targets(void **state)
{
    (void)state;
    char other[128], key[128], target[128], sym[128];
    /* A hard link: keygen --force world.key where world.key and notes.txt
       are one file. */
    snprintf(other, sizeof other, "%s/notes.txt", g_dir);
    snprintf(key, sizeof key, "%s/world.key", g_dir);
    write_text(other, "somebody's notes\n", 0644);
    assert_int_equal(link(other, key), 0);
    keygen_force(key);
    assert_text(other, "somebody's notes\n");
    struct stat st;
    assert_int_equal(stat(other, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    assert_int_equal(st.st_nlink, 1);
    assert_own_key(key);
    /* A symbolic link: replaced by the key, its target untouched. */
    snprintf(target, sizeof target, "%s/target.txt", g_dir);
    snprintf(sym, sizeof sym, "%s/sym.key", g_dir);
    write_text(target, "the target\n", 0644);
    assert_int_equal(symlink(target, sym), 0);
    keygen_force(sym);
    assert_text(target, "the target\n");
    assert_own_key(sym);
    /* --force again over its own key: a new key, nothing else left. */
    char pub1[SECURITY_KEY_TXT], pub2[SECURITY_KEY_TXT], sec[SECURITY_KEY_TXT];
    assert_int_equal(zd__security_key_load(key, pub1, sec), 0);
    keygen_force(key);
    assert_int_equal(zd__security_key_load(key, pub2, sec), 0);
    assert_string_not_equal(pub1, pub2);
    /* Without --force an existing path stays as it was. */
    char *argv[] = {(char *)program_path("tools/keygen"), other, NULL};
    char *output = NULL;
    assert_int_not_equal(program_run(argv, 30, false, &output), 0);
    assert_non_null(strstr(output, "already exists"));
    free(output);
    assert_text(other, "somebody's notes\n");
    /* No temporary file behind. */
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            printf("left: %s\n", e->d_name);
            n++;
        }
    closedir(d);
    assert_int_equal(n, 4); /* notes.txt, world.key, target.txt, sym.key */
}

/*  ---- point 12: output into a pipe, line by line ---- */

/*  Starts ranks 0..n-1 of prog with flags (every rank's); rank `watch`
    must have its "prog: rank R of N ..." line (printed once it joined) in
    the pipe while it is still running. Then everything is killed. */
static void line_reaches_pipe_while_running(const char *prog, int n, const char *const *flags,
                                            int watch)
{
    program_t p[4];
    char a_world[32], a_port[32], a_rank[4][32], want[64];
    assert_true(n <= 4);
    int port = world_free_port();
    snprintf(a_world, sizeof a_world, "--world_size=%d", n);
    snprintf(a_port, sizeof a_port, "--master_port=%d", port);
    for (int r = 0; r < n; r++) {
        snprintf(a_rank[r], sizeof a_rank[r], "--rank=%d", r);
        char *argv[16] = {(char *)program_path(prog), a_rank[r], a_world, "--master_addr=127.0.0.1",
                          a_port};
        int k = 5;
        for (int i = 0; flags[i]; i++)
            argv[k++] = (char *)flags[i];
        argv[k] = NULL;
        assert_int_equal(program_start(&p[r], argv), 0);
    }
    const char *base = strrchr(prog, '/') + 1;
    snprintf(want, sizeof want, "%s: rank %d of %d", base, watch, n);
    double deadline = program_now_s() + 30 * SLOW;
    int found = program_read(&p[watch], want, deadline);
    /* Still running: the line came through the pipe, not at exit. */
    int alive = kill(p[watch].pid, 0) == 0;
    for (int r = 0; r < n; r++) {
        kill(p[r].pid, SIGKILL);
        program_wait(&p[r], program_now_s() + 30);
    }
    printf("%s rank %d: %s\n", prog, watch, p[watch].out ? p[watch].out : "(nothing)");
    for (int r = 0; r < n; r++)
        free(p[r].out);
    assert_int_equal(found, 1);
    assert_true(alive);
}

static void test_examples_line_buffer_into_a_pipe(void **state)
{
    (void)state;
    /* A stage and a parameter server frozen where they serve: what they
       printed before is in the pipe, or in a buffer that never flushes. */
    setenv("ZDIST_FAULT", "1:shutdown:stop", 1);
    line_reaches_pipe_while_running(
        "examples/pipeline", 3, (const char *const[]){"--iterations=5", "--test_size=0", NULL}, 1);
    line_reaches_pipe_while_running("examples/ps_sync_async", 4,
                                    (const char *const[]){"--iterations=5", "--progress_s=0", NULL},
                                    1);
    unsetenv("ZDIST_FAULT");
    /* rnn_rpc's parameter server serves while its trainer trains. */
    line_reaches_pipe_while_running("examples/rnn_rpc", 2,
                                    (const char *const[]){"--iterations=1000000", NULL}, 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_file_fifo_refused_at_once),
        cmocka_unit_test(test_world_flags_refused),
        cmocka_unit_test(test_non_finite_numbers_refused),
        cmocka_unit_test(test_keygen_force_replaces_links_not_their_targets),
        cmocka_unit_test(test_examples_line_buffer_into_a_pipe),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
