/* SPDX-License-Identifier: MIT */
/*  golden_cases.h: finding and comparing golden cases in cmocka tests.

    tools/golden_manifest.h reads one case folder; the tests that run every
    case of a kind also need to find those folders under the golden root,
    and to compare with PyTorch's tolerance. Header-only (static inline) so
    that each test program compiles its own copy without a library of its
    own; failures are cmocka failures of the calling test. */
#ifndef ZDIST_TESTS_GOLDEN_CASES_H
#define ZDIST_TESTS_GOLDEN_CASES_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/tensor.h>
#include "tools/golden_manifest.h"

/*  $ZDIST_GOLDEN_DIR (set by ctest), else the shared folder. */
static inline const char *golden_root(void)
{
    const char *d = getenv("ZDIST_GOLDEN_DIR");
    return d && *d ? d : ZD_TEST_GOLDEN_DEFAULT;
}

/*  $ZDIST_GOLDEN_TOOLKIT_DIR (set by ctest), else the golden root's sibling. */
static inline const char *golden_toolkit_root(void)
{
    const char *d = getenv("ZDIST_GOLDEN_TOOLKIT_DIR");
    return d && *d ? d : ZD_TEST_GOLDEN_TOOLKIT_DEFAULT;
}

/*  Calls fn on the path of each case folder under root (those with a
    manifest.txt), in directory order; returns how many, or -1 when root
    cannot be read. */
static inline int golden_each_dir(const char *root, void (*fn)(const char *dir, void *arg),
                                  void *arg)
{
    DIR *d = opendir(root);
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        char dir[2048], manifest[2100];
        snprintf(dir, sizeof dir, "%s/%s", root, de->d_name);
        snprintf(manifest, sizeof manifest, "%s/manifest.txt", dir);
        if (de->d_name[0] == '.' || access(manifest, F_OK) != 0)
            continue;
        fn(dir, arg);
        n++;
    }
    closedir(d);
    return n;
}

typedef struct {
    const char *kind;
    void (*fn)(golden_case_t *c, void *arg);
    void *arg;
    int n;
} golden_each_t;

static inline void golden_each_one(const char *dir, void *arg)
{
    golden_each_t *e = arg;
    golden_case_t *c = golden_case_load(dir);
    if (!c)
        fail_msg("%s", zd_error_last());
    if (strcmp(c->kind, e->kind) == 0) {
        e->fn(c, e->arg);
        e->n++;
    }
    golden_case_free(c);
}

/*  Loads each case folder of this kind under the golden root in turn, calls
    fn on it and frees it; returns how many, or -1 when the root cannot be
    read. Folders without a manifest are passed over; a manifest that does
    not load fails the test. */
static inline int golden_each(const char *kind, void (*fn)(golden_case_t *c, void *arg), void *arg)
{
    golden_each_t e = {.kind = kind, .fn = fn, .arg = arg};
    return golden_each_dir(golden_root(), golden_each_one, &e) < 0 ? -1 : e.n;
}

/*  Runs tools/golden_check --quiet on a case folder (the program from
    $ZDIST_BUILD_DIR): its exit status (0 all match, 1 a mismatch, 3 a kind
    it does not know; 128 for a signal), or -1 when it cannot run. */
static inline int golden_check_run(const char *case_dir)
{
    extern char **environ;
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

/*  Copies case `name` of root to a temporary folder, checks that the copy
    passes, writes 42.0 over the float at byte `at` of `file` (negative:
    from the end) and expects golden_check to report a mismatch (exit 1). */
static inline void golden_expect_caught(const char *root, const char *name, const char *file,
                                        long at)
{
    char tmpl[] = "/tmp/zdist-golden-XXXXXX";
    char *dir = mkdtemp(tmpl);
    assert_non_null(dir);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp %s/%s/* %s/ && chmod u+w %s/*", root, name, dir, dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(golden_check_run(dir), 0); /* the copy itself passes */
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, at, at < 0 ? SEEK_END : SEEK_SET), 0);
    const unsigned char bad[4] = {0x42, 0x28, 0, 0}; /* 42.0 big-endian */
    assert_int_equal(fwrite(bad, 1, 4, f), 4);
    fclose(f);
    assert_int_equal(golden_check_run(dir), 1);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/*  |a - e| <= 1e-5 + 1e-4 |e| everywhere, same element count; a failure
    names the case folder, `what` and the first element that is off. */
static inline void golden_assert_close(const char *what, const golden_case_t *c, zd_tensor_t *a,
                                       zd_tensor_t *e)
{
    char sa[96], se[96];
    assert_non_null(a);
    if (zd_tensor_numel(a) != zd_tensor_numel(e))
        fail_msg("%s %s: shape %s, expected %s", c->dir, what, zd_tensor_shape_str(a, sa, 96),
                 zd_tensor_shape_str(e, se, 96));
    const float *pa = zd_tensor_data(a), *pe = zd_tensor_data(e);
    for (int64_t i = 0; i < zd_tensor_numel(e); i++)
        if (!(fabsf(pa[i] - pe[i]) <= 1e-5f + 1e-4f * fabsf(pe[i])))
            fail_msg("%s %s[%lld]: %.9g, expected %.9g", c->dir, what, (long long)i, (double)pa[i],
                     (double)pe[i]);
}

#endif
