/* SPDX-License-Identifier: MIT */
/*  rpc_ps with --checkpoint when a run fails on its own, no process killed
    or frozen (issue 24 point 7). Before, a trainer whose run failed waited
    in zd_rpc_shutdown's barrier for rank 0, which waited for that
    trainer to finish (zd_ps_trainers_wait): nothing ever exited.
    Every case checks that every process ends within a bound, non-zero,
    and that the server names the cause too:
      - a prefix that cannot be written (a folder that is not there, a path
        under a regular file): the server refuses it at start, naming the
        path, alone and under tools/launch;
      - divergence (--lr=1000): both trainers fail, say so to the server,
        and the world ends; under tools/launch --max_restarts too;
    and, as root in a mount namespace of its own (`--tmpfs`, 77 otherwise):
      - a disk that fills mid-run (a tmpfs with room for two checkpoint
        files: the run's start and the first checkpoint): the second
        checkpoint fails, the trainers fail naming the error, the server
        names it, and the failed write left the first generation alone:
        no .prev equal to the current file, no temporary file behind;
      - a read-only file system: refused at start.
    Ranks are processes of their own, started as a user would. */
#define _GNU_SOURCE /* unshare */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/support/program.h"
#include "tests/support/world.h"

#if defined(__SANITIZE_ADDRESS__)
#define SLOW 4 /* the sanitizers' processes run three to four times slower */
#else
#define SLOW 1
#endif
/*  Every world ends within this (seconds): a trainer that fails waits at
    most 5 s to learn whether a server was lost (rpc_ps's recover), its
    report and its shutdown are quick when the server is alive. */
#define BOUND_S (40 * SLOW)

#define MAX_RANKS 3

typedef struct {
    program_t p[MAX_RANKS];
    int rc[MAX_RANKS];
    int n;
} ranks_t;

/*  Starts ranks 0..n-1 of rpc_ps (n_started of them) on a fresh port, each
    with the flags in extra (NULL-terminated). */
static void start_world(ranks_t *w, int n, int n_started, const char *const *extra)
{
    int port = world_free_port();
    assert_true(port > 0);
    w->n = n_started;
    for (int r = 0; r < n_started; r++) {
        char a_rank[32], a_world[32], a_port[32];
        snprintf(a_rank, sizeof a_rank, "--rank=%d", r);
        snprintf(a_world, sizeof a_world, "--world_size=%d", n);
        snprintf(a_port, sizeof a_port, "--master_port=%d", port);
        char *argv[32] = {(char *)program_path("examples/rpc_ps"), a_rank, a_world,
                          "--master_addr=127.0.0.1", a_port};
        int k = 5;
        for (int i = 0; extra && extra[i]; i++)
            argv[k++] = (char *)extra[i];
        argv[k] = NULL;
        assert_int_equal(program_start(&w->p[r], argv), 0);
    }
}

/*  Waits for every process up to the bound (killing what is left then)
    and prints what each said. The time the world took. */
static double wait_world(ranks_t *w, double t0)
{
    for (int r = 0; r < w->n; r++)
        w->rc[r] = program_wait(&w->p[r], t0 + BOUND_S);
    double took = program_now_s() - t0;
    for (int r = 0; r < w->n; r++)
        printf("---- rank %d exited with %d:\n%s\n", r, w->rc[r], w->p[r].out ? w->p[r].out : "");
    printf("world ended in %.1f s (bound %d s)\n", took, BOUND_S);
    return took;
}

static const char *out(const ranks_t *w, int r)
{
    return w->p[r].out ? w->p[r].out : "";
}

static void free_world(ranks_t *w)
{
    for (int r = 0; r < w->n; r++)
        free(w->p[r].out);
}

/*  A scratch folder of the test's own. */
static void scratch(char *dir, size_t size)
{
    snprintf(dir, size, "/tmp/zdist_ckfailXXXXXX");
    assert_non_null(mkdtemp(dir));
}

/*  ---- a prefix that cannot be written ---- */

/*  The server alone (its trainers never start): it refuses the prefix
    before it joins, naming it, instead of waiting for the world. */
static void server_refuses(const char *prefix)
{
    char flag[1200], want[1200];
    snprintf(flag, sizeof flag, "--checkpoint=%s", prefix);
    const char *const extra[] = {flag, "--init_timeout_s=30", NULL};
    ranks_t w;
    double t0 = program_now_s();
    start_world(&w, 3, 1, extra);
    double took = wait_world(&w, t0);
    assert_int_equal(w.rc[0], 1);
    assert_true(took < 20 * SLOW); /* not the init timeout */
    snprintf(want, sizeof want, "cannot write %s.shard0.probe.", prefix);
    assert_non_null(strstr(out(&w, 0), want));
    free_world(&w);
}

static void test_prefix_unwritable_server_refuses(void **state)
{
    (void)state;
    server_refuses("/nonexistent/dir/ck");
    /* a path under a regular file */
    char dir[64], file[128], prefix[160];
    scratch(dir, sizeof dir);
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(prefix, sizeof prefix, "%s/ck", file);
    server_refuses(prefix);
    unlink(file);
    rmdir(dir);
}

/*  The same under tools/launch: the world stops at once, non-zero, and
    what launch prints names the path. */
static void test_prefix_unwritable_under_launch(void **state)
{
    (void)state;
    char *argv[] = {(char *)program_path("tools/launch"),
                    "--nproc=3",
                    "--timeout_s=120",
                    "--",
                    (char *)program_path("examples/rpc_ps"),
                    "--checkpoint=/nonexistent/dir/ck",
                    "--max_batches=20",
                    "--progress_s=0",
                    NULL};
    char *output = NULL;
    double t0 = program_now_s();
    int rc = program_run(argv, BOUND_S, false, &output);
    double took = program_now_s() - t0;
    printf("%s\nlaunch exited with %d after %.1f s\n", output ? output : "", rc, took);
    assert_true(rc > 0 && rc < 128 && rc != 124); /* failed, not stopped by time */
    assert_true(took < BOUND_S);
    assert_non_null(output);
    assert_non_null(strstr(output, "cannot write /nonexistent/dir/ck.shard0.probe."));
    free(output);
}

/*  ---- divergence ---- */

static void test_divergence_ends_the_world(void **state)
{
    (void)state;
    char dir[64], flag[128];
    scratch(dir, sizeof dir);
    snprintf(flag, sizeof flag, "--checkpoint=%s/ck", dir);
    const char *const extra[] = {flag, "--lr=1000", "--max_batches=50", "--progress_s=0", NULL};
    ranks_t w;
    double t0 = program_now_s();
    start_world(&w, 3, 3, extra);
    double took = wait_world(&w, t0);
    assert_true(took < BOUND_S);
    for (int r = 0; r < 3; r++)
        assert_int_equal(w.rc[r], 1);
    /* Each trainer said why; the server names both, and fails naming a
       cause, not only a count. */
    assert_non_null(strstr(out(&w, 0), "trainer \"trainer_1\" (rank 1) failed at batch "));
    assert_non_null(strstr(out(&w, 0), "trainer \"trainer_2\" (rank 2) failed at batch "));
    assert_non_null(strstr(out(&w, 0), "trainer rank 1 failed at batch "));
    const char *last = strstr(out(&w, 0),
                              "only 0 trainer(s) finished, fewer than "
                              "--min_trainers=1; trainer rank ");
    assert_non_null(last);
    assert_non_null(strstr(last, " failed at batch "));
    for (int r = 1; r < 3; r++)
        assert_null(strstr(out(&w, r), "could not tell the server"));
    free_world(&w);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  Under tools/launch --max_restarts, restarted ranks fail again the same
    way: launch gives up after its restarts, within the bound. */
static void test_divergence_under_launch_restarts(void **state)
{
    (void)state;
    char dir[64], flag[128];
    scratch(dir, sizeof dir);
    snprintf(flag, sizeof flag, "--checkpoint=%s/ck", dir);
    char *argv[] = {(char *)program_path("tools/launch"),
                    "--nproc=3",
                    "--max_restarts=1",
                    "--timeout_s=300",
                    "--",
                    (char *)program_path("examples/rpc_ps"),
                    flag,
                    "--lr=1000",
                    "--max_batches=50",
                    "--progress_s=0",
                    NULL};
    char *output = NULL;
    double t0 = program_now_s();
    int rc = program_run(argv, 2 * BOUND_S, false, &output);
    double took = program_now_s() - t0;
    printf("%s\nlaunch exited with %d after %.1f s\n", output ? output : "", rc, took);
    assert_true(rc > 0 && rc < 128 && rc != 124); /* failed, not stopped by time */
    assert_true(took < 2 * BOUND_S);
    assert_non_null(output);
    assert_non_null(strstr(output, "failed at batch "));
    assert_non_null(strstr(output, "no restarts left"));
    free(output);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  ---- a disk that fills, a read-only file system (root, --tmpfs) ---- */

static char g_mnt[64];

/*  Mounts a tmpfs of size_kb (read-only when ro) at a fresh folder, in this
    process's own mount namespace (its children see it; nobody else does,
    and it goes away with them). */
static void mount_tmpfs(int size_kb, bool ro)
{
    scratch(g_mnt, sizeof g_mnt);
    char opts[64];
    snprintf(opts, sizeof opts, "size=%dk,mode=0755", size_kb);
    if (mount("tmpfs", g_mnt, "tmpfs", ro ? MS_RDONLY : 0, opts) < 0)
        fail_msg("mount tmpfs at %s: %s", g_mnt, strerror(errno));
}

static void unmount_tmpfs(void)
{
    umount2(g_mnt, MNT_DETACH);
    rmdir(g_mnt);
}

/*  The names in g_mnt, space-separated, into buf. */
static void list_mnt(char *buf, size_t size)
{
    DIR *d = opendir(g_mnt);
    assert_non_null(d);
    buf[0] = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            snprintf(buf + strlen(buf), size - strlen(buf), "%s ", e->d_name);
    closedir(d);
}

static bool same_file_content(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb)
            same = false;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static void test_disk_fills(void **state)
{
    (void)state;
    /* Room for two shard files (4.8 MB each) but not three: the run's
       start (version 0) and the first checkpoint are written, the second
       finds the disk full. */
    mount_tmpfs(12 * 1024, false);
    char flag[128];
    snprintf(flag, sizeof flag, "--checkpoint=%s/ck", g_mnt);
    const char *const extra[] = {
        flag, "--checkpoint_every=5", "--max_batches=40", "--eval_samples=500", "--progress_s=0",
        NULL};
    ranks_t w;
    double t0 = program_now_s();
    start_world(&w, 3, 3, extra);
    double took = wait_world(&w, t0);
    assert_true(took < BOUND_S);
    for (int r = 0; r < 3; r++)
        assert_int_equal(w.rc[r], 1);
    /* The trainers fail naming the error; so does the server, as each
       trainer tells it and at the end. */
    const char *enospc = "No space left on device";
    assert_non_null(strstr(out(&w, 1), enospc));
    assert_non_null(strstr(out(&w, 2), enospc));
    const char *told = strstr(out(&w, 0), "(rank 1) failed at batch ");
    assert_non_null(told);
    assert_non_null(strstr(told, enospc));
    const char *last = strstr(out(&w, 0), "only 0 trainer(s) finished");
    assert_non_null(last);
    assert_non_null(strstr(last, enospc));
    /* The failed write kept generation 1 as it was: no .prev that is a copy
       of it, nothing half-written behind. */
    char names[1024], cur[160], prev[160];
    list_mnt(names, sizeof names);
    printf("left in the tmpfs: %s\n", names);
    snprintf(cur, sizeof cur, "%s/ck.shard0", g_mnt);
    snprintf(prev, sizeof prev, "%s/ck.shard0.prev", g_mnt);
    assert_int_equal(access(cur, F_OK), 0);
    assert_false(access(prev, F_OK) == 0 && same_file_content(cur, prev));
    assert_null(strstr(names, ".tmp"));
    assert_null(strstr(names, ".new"));
    assert_null(strstr(names, ".probe"));
    free_world(&w);
    unmount_tmpfs();
}

static void test_read_only_file_system(void **state)
{
    (void)state;
    mount_tmpfs(1024, true);
    char prefix[128];
    snprintf(prefix, sizeof prefix, "%s/ck", g_mnt);
    char flag[160];
    snprintf(flag, sizeof flag, "--checkpoint=%s", prefix);
    const char *const extra[] = {flag, "--init_timeout_s=30", NULL};
    ranks_t w;
    double t0 = program_now_s();
    start_world(&w, 3, 1, extra);
    double took = wait_world(&w, t0);
    assert_int_equal(w.rc[0], 1);
    assert_true(took < 20 * SLOW);
    assert_non_null(strstr(out(&w, 0), "Read-only file system"));
    assert_non_null(strstr(out(&w, 0), prefix));
    free_world(&w);
    unmount_tmpfs();
}

/*  A mount namespace of this process's own, its mounts private: 0, or -1
    when it cannot be had (not root, or no CAP_SYS_ADMIN here). */
static int own_mount_namespace(void)
{
    if (geteuid() != 0) {
        fprintf(stderr, "not root: the tmpfs cases are skipped\n");
        return -1;
    }
    if (unshare(CLONE_NEWNS) < 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        fprintf(stderr, "no mount namespace of our own (%s): the tmpfs cases are skipped\n",
                strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc > 1 && !strcmp(argv[1], "--tmpfs")) {
        if (own_mount_namespace() < 0)
            return 77;
        const struct CMUnitTest tests[] = {
            cmocka_unit_test(test_disk_fills),
            cmocka_unit_test(test_read_only_file_system),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_unwritable_server_refuses),
        cmocka_unit_test(test_prefix_unwritable_under_launch),
        cmocka_unit_test(test_divergence_ends_the_world),
        cmocka_unit_test(test_divergence_under_launch_restarts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
