/* SPDX-License-Identifier: MIT */
/*  rpc_ps's checkpoints across server shards (issue 12 point 4), run
    through the launcher as a user would:
      - shard 1 killed in a checkpoint after shard 0 wrote its part
        (ZDIST_FAULT=1:checkpoint:kill:2): the resume brings shard 0 back
        to the last generation every shard holds (its .prev file) and goes
        on with the losses of a run that never stopped; temporary files a
        killed write left behind are removed, other files kept;
      - files of two different checkpoints, none both hold: the resume is
        refused, naming the stage and the generation it lacks.
    Programs are found in ZDIST_BUILD_DIR. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/program.h"

#define BATCHES 20

/*  Every number after `key` in text, in order (at most max). */
static int numbers_after(const char *text, const char *key, double *out, int max)
{
    int n = 0;
    for (const char *p = text; n < max && (p = strstr(p, key)); p += strlen(key))
        out[n++] = strtod(p + strlen(key), NULL);
    return n;
}

static void touch(const char *dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("half a checkpoint", f);
    fclose(f);
}

static bool exists(const char *dir, const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void copy(const char *dir, const char *from, const char *to)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cp %s/%s %s/%s", dir, from, dir, to);
    assert_int_equal(system(cmd), 0);
}

/*  Files in dir whose name holds ".tmp" other than the two planted ones
    this world does not own. */
static int own_temps(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp") && strcmp(e->d_name, "c.notes.tmp.1.0") != 0 &&
            strcmp(e->d_name, "c.shard7.tmp.1.0") != 0) {
            printf("left behind: %s\n", e->d_name);
            n++;
        }
    closedir(d);
    return n;
}

static void test_shard_killed_mid_checkpoint_resumes_last_whole_one(void **state)
{
    (void)state;
    char dir[] = "/tmp/zdist_gensXXXXXX", ck[64], *whole, *crash, *rest, *mixed;
    assert_non_null(mkdtemp(dir));
    snprintf(ck, sizeof ck, "--checkpoint=%s/c", dir);
    const char *launch = program_path("tools/launch"), *ps = program_path("examples/rpc_ps");
#define WORLD                                                                                      \
    (char *)launch, "--nproc=3", "--", (char *)ps, "--num_servers=2", "--no_dropout",              \
        "--log_interval=1", "--seed=7", "--eval_samples=100", "--progress_s=0", "--max_batches=20"
    char *whole_argv[] = {WORLD, NULL};
    char *ck_argv[] = {WORLD, ck, "--checkpoint_every=5", NULL};
    char *resume_argv[] = {WORLD, ck, "--checkpoint_every=5", "--resume", NULL};
#undef WORLD
    assert_int_equal(program_run(whole_argv, 300, true, &whole), 0);

    /* Shard 1 dies at its second checkpoint (batch 10), after shard 0
       wrote generation 2: shard 0 holds 2 (and 1 as .prev), shard 1
       holds 1 (and the run's start, 0, as .prev). */
    setenv("ZDIST_FAULT", "1:checkpoint:kill:2", 1);
    assert_int_not_equal(program_run(ck_argv, 300, false, &crash), 0);
    unsetenv("ZDIST_FAULT");
    assert_non_null(strstr(crash, "ZDIST_FAULT: rank 1: kill at checkpoint #2"));
    assert_true(exists(dir, "c.shard0") && exists(dir, "c.shard0.prev") && exists(dir, "c.shard1"));
    copy(dir, "c.shard1", "gen1.shard1"); /* for the mix below */

    /* Writes killed half-way left these (the names zd_checkpoint_save
       gives the file, or the .new one it writes first); the last two are
       not this world's. */
    touch(dir, "c.shard0.tmp.4242.0");
    touch(dir, "c.shard1.tmp.4243.7");
    touch(dir, "c.shard1.new.tmp.4243.1");
    touch(dir, "c.notes.tmp.1.0");
    touch(dir, "c.shard7.tmp.1.0");
    /* (the layer says at level info how a stage goes back) */
    setenv("ZDIST_LOG_LEVEL", "info", 1);
    assert_int_equal(program_run(resume_argv, 300, true, &rest), 0);
    unsetenv("ZDIST_LOG_LEVEL");
    assert_non_null(strstr(rest, "ps: stage 0 went back from version 10 to 5 (generation 1)"));
    assert_non_null(strstr(rest, "resuming at batch 5 (5 batches done)"));
    assert_non_null(strstr(rest, "c.shard0.tmp.4242.0, left by a write that did not finish"));
    assert_false(exists(dir, "c.shard0.tmp.4242.0"));
    assert_false(exists(dir, "c.shard1.tmp.4243.7"));
    assert_false(exists(dir, "c.shard1.new.tmp.4243.1"));
    assert_true(exists(dir, "c.notes.tmp.1.0") && exists(dir, "c.shard7.tmp.1.0"));
    assert_int_equal(own_temps(dir), 0);

    /* The resumed run takes the steps of the one that never stopped. */
    double a[BATCHES], b[BATCHES];
    assert_int_equal(numbers_after(whole, " loss ", a, BATCHES), BATCHES);
    assert_int_equal(numbers_after(rest, " loss ", b, BATCHES), BATCHES - 5);
    for (int i = 5; i < BATCHES; i++) {
        printf("batch %2d: without a stop %.6f, resumed %.6f\n", i, a[i], b[i - 5]);
        assert_true(fabs(a[i] - b[i - 5]) <= 1e-6 * (1 + fabs(a[i])));
    }

    /* Both shards now hold generations 4 and 3; shard 1's files replaced
       by generation 1: no generation both hold. */
    copy(dir, "gen1.shard1", "c.shard1");
    copy(dir, "gen1.shard1", "c.shard1.prev");
    assert_int_not_equal(program_run(resume_argv, 300, false, &mixed), 0);
    assert_non_null(strstr(mixed, "has no checkpoint of generation 1"));
    assert_null(strstr(mixed, "test accuracy"));

    free(whole);
    free(crash);
    free(rest);
    free(mixed);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_killed_mid_checkpoint_resumes_last_whole_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
