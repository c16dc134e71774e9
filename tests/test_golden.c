/* SPDX-License-Identifier: MIT */
/*  Runs tools/golden_check over every case folder of the golden directory
    (ZDIST_GOLDEN_DIR): folders are listed at run time, so new cases of known
    kinds are checked without any code change. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

extern char **environ;

static const char *golden_dir(void)
{
    const char *d = getenv("ZDIST_GOLDEN_DIR");
    return d && *d ? d : "../shared/golden";
}

static int run_checker(const char *case_dir)
{
    char exe[1024];
    const char *build = getenv("ZDIST_BUILD_DIR");
    snprintf(exe, sizeof exe, "%s/tools/golden_check", build ? build : ".");
    char *argv[] = {exe, "--quiet", (char *)case_dir, NULL};
    pid_t pid;
    if (posix_spawn(&pid, exe, NULL, NULL, argv, environ) != 0)
        return -1;
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_every_golden_case_passes(void **state)
{
    (void)state;
    DIR *d = opendir(golden_dir());
    assert_non_null(d);
    int cases = 0, failed = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        char path[2048], manifest[2100];
        struct stat st;
        if (ent->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", golden_dir(), ent->d_name);
        snprintf(manifest, sizeof manifest, "%s/manifest.txt", path);
        if (stat(manifest, &st) != 0)
            continue;
        cases++;
        int rc = run_checker(path);
        if (rc != 0) {
            print_error("golden case %s failed (exit %d)\n", path, rc);
            failed++;
        }
    }
    closedir(d);
    assert_true(cases > 0);
    assert_int_equal(failed, 0);
}

/*  The checker must fail on a case whose numbers are wrong: copy a case,
    corrupt its expected output, and expect a non-zero exit. */
static void test_checker_catches_a_wrong_value(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/zdist-golden-XXXXXX";
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp %s/relu/* %s/ && chmod u+w %s/*", golden_dir(), dir, dir);
    assert_int_equal(system(cmd), 0);
    char out[2048];
    snprintf(out, sizeof out, "%s/output.y.idx", dir);
    FILE *f = fopen(out, "r+b");
    assert_non_null(f);
    /* the last float: its 4 bytes end the file */
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size - 4, SEEK_SET);
    unsigned char bad[4] = {0x42, 0x28, 0, 0};   /* 42.0 big-endian */
    fwrite(bad, 1, 4, f);
    fclose(f);
    assert_int_not_equal(run_checker(dir), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_golden_case_passes),
        cmocka_unit_test(test_checker_catches_a_wrong_value),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
