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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/tensor.h>
#include "tools/golden_manifest.h"

/*  $ZDIST_GOLDEN_DIR (set by ctest), else the shared folder. */
static inline const char *golden_root(void)
{
    const char *d = getenv("ZDIST_GOLDEN_DIR");
    return d && *d ? d : "/work/shared/golden";
}

/*  Loads each case folder of this kind under the golden root in turn, calls
    fn on it and frees it; returns how many, or -1 when the root cannot be
    read. Folders without a manifest are passed over; a manifest that does
    not load fails the test. */
static inline int golden_each(const char *kind, void (*fn)(golden_case_t *c, void *arg),
                              void *arg)
{
    DIR *d = opendir(golden_root());
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        char dir[2048], manifest[2100];
        snprintf(dir, sizeof dir, "%s/%s", golden_root(), de->d_name);
        snprintf(manifest, sizeof manifest, "%s/manifest.txt", dir);
        if (de->d_name[0] == '.' || access(manifest, F_OK) != 0)
            continue;
        golden_case_t *c = golden_case_load(dir);
        if (!c)
            fail_msg("%s", zd_error_last());
        if (strcmp(c->kind, kind) == 0) {
            fn(c, arg);
            n++;
        }
        golden_case_free(c);
    }
    closedir(d);
    return n;
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
            fail_msg("%s %s[%lld]: %.9g, expected %.9g", c->dir, what, (long long)i,
                     (double)pa[i], (double)pe[i]);
}

#endif
