/* SPDX-License-Identifier: MIT */
/*  golden_manifest.h: reading one case folder of tests/golden.

    A case is a manifest (kind, attributes, one line per tensor) and IDX
    files; its format is specified in tests/golden/README.md. Names may
    carry a row subset, "fc1.weight[rows=0,15,117,127]", kept apart here as
    `rows`. */
#ifndef ZDIST_GOLDEN_MANIFEST_H
#define ZDIST_GOLDEN_MANIFEST_H

#include <zdist/tensor.h>

#define GOLDEN_MAX_ENTRIES 256
#define GOLDEN_MAX_ATTRS   32
#define GOLDEN_MAX_ROWS    64

typedef struct {
    char role[32];  /* input, param, output, grad */
    char name[128]; /* without the [rows=...] suffix */
    int n_rows;     /* 0: the whole tensor */
    int64_t rows[GOLDEN_MAX_ROWS];
    zd_tensor_t *value; /* loaded from the case's IDX file */
} golden_entry_t;

typedef struct {
    char dir[1024];
    char kind[64];
    int n_attrs;
    char attr_key[GOLDEN_MAX_ATTRS][64];
    char attr_val[GOLDEN_MAX_ATTRS][64];
    int n;
    golden_entry_t entries[GOLDEN_MAX_ENTRIES];
} golden_case_t;

/*  Reads dir/manifest.txt and every IDX file it names. Returns a new case
    (free with golden_case_free), or NULL with zd_error_last() naming the file
    and line that is wrong. */
golden_case_t *golden_case_load(const char *dir);
void golden_case_free(golden_case_t *c);

/*  The entry with this role and name, or NULL. Borrowed. */
golden_entry_t *golden_find(golden_case_t *c, const char *role, const char *name);

/*  The tensor of that entry (borrowed), or NULL. */
zd_tensor_t *golden_tensor(golden_case_t *c, const char *role, const char *name);

/*  Attribute value as a number; `fallback` when absent. */
double golden_attr(const golden_case_t *c, const char *key, double fallback);

#endif
