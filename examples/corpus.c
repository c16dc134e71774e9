/* SPDX-License-Identifier: MIT */
/*  corpus.c: a text as a character-level corpus (corpus.h). */
#include "examples/corpus.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

#define MAX_TEXT (64 << 20)
#define MIN_TEXT 1000

int corpus_load(const char *path, corpus_t *c)
{
    memset(c, 0, sizeof *c);
    FILE *f = fopen(path, "rb");
    if (!f)
        return zd_error_set("cannot open the text %s: %s", path, strerror(errno));
    c->tokens = malloc(MAX_TEXT);
    size_t n = c->tokens ? fread(c->tokens, 1, MAX_TEXT, f) : 0;
    fclose(f);
    if (!c->tokens)
        return zd_error_set("out of memory reading %s", path);
    if (n < MIN_TEXT) {
        corpus_free(c);
        return zd_error_set("the text %s has %zu bytes: too short to learn from (%d at least)",
                            path, n, MIN_TEXT);
    }
    int id[256];
    bool seen[256] = {false};
    for (size_t i = 0; i < n; i++)
        seen[c->tokens[i]] = true;
    for (int b = 0; b < 256; b++)
        if (seen[b]) {
            id[b] = c->ntoken;
            c->chars[c->ntoken++] = (unsigned char)b;
        }
    for (size_t i = 0; i < n; i++)
        c->tokens[i] = (uint8_t)id[c->tokens[i]];
    c->n = (int64_t)n;
    return 0;
}

void corpus_free(corpus_t *c)
{
    free(c->tokens);
    c->tokens = NULL;
    c->n = 0;
}

void corpus_batch(const corpus_t *c, int64_t it, int64_t bptt, int64_t batch, zd_tensor_t *x,
                  zd_tensor_t *y)
{
    int64_t stretch = (c->n - 1) / batch, steps = stretch / bptt;
    int64_t base = (it % steps) * bptt;
    int64_t *xd = zd_tensor_data_i64(x), *yd = zd_tensor_data_i64(y);
    for (int64_t t = 0; t < bptt; t++)
        for (int64_t b = 0; b < batch; b++) {
            int64_t at = b * stretch + base + t;
            xd[t * batch + b] = c->tokens[at];
            yd[t * batch + b] = c->tokens[at + 1];
        }
}
