/* SPDX-License-Identifier: MIT */
/*  fuzz_check.h: the fuzz targets' CHECK(cond, fmt, ...). A failed check
    prints why and aborts, which libFuzzer reports with the input that did
    it. Define FUZZ_NAME (the target's name, a string) before including. */
#ifndef ZDIST_TOOLS_FUZZ_CHECK_H
#define ZDIST_TOOLS_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, FUZZ_NAME ": check failed: " __VA_ARGS__);                             \
            fprintf(stderr, "\n");                                                                 \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
