/* SPDX-License-Identifier: MIT */
/*  corpus.h: a text as a character-level corpus, for the language-model
    examples (rnn_rpc, ps_lstm): one token per distinct byte, numbered in
    byte order so that every host numbers a text the same way. */
#ifndef ZDIST_EXAMPLES_CORPUS_H
#define ZDIST_EXAMPLES_CORPUS_H

#include <stdint.h>

#include <zdist/tensor.h>

typedef struct {
    uint8_t *tokens; /* the text as token ids */
    int64_t n;
    int ntoken;
    unsigned char chars[256]; /* token id -> byte */
} corpus_t;

/*  Reads up to 64 MiB of path into c: 0, or -1 with the error set (no
    file, out of memory, under 1000 bytes: too short to learn from). */
int corpus_load(const char *path, corpus_t *c);

/*  Frees what corpus_load made (c itself is the caller's). */
void corpus_free(corpus_t *c);

/*  Batch `it`: `batch` streams, each reading its own stretch of the text,
    bptt characters a step, carried from step to step as the hidden state
    is (the tutorial's "detach and go on"). Fills x (bptt, batch) int64 and
    y (bptt * batch) int64 with the next characters. */
void corpus_batch(const corpus_t *c, int64_t it, int64_t bptt, int64_t batch, zd_tensor_t *x,
                  zd_tensor_t *y);

#endif
