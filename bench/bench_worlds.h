/* SPDX-License-Identifier: MIT */
/*  bench_worlds.h: rpc_ps worlds run as separate programs, as a user runs
    them, for the figures of start time and memory (bench_examples). */
#ifndef ZDIST_BENCH_WORLDS_H
#define ZDIST_BENCH_WORLDS_H

#include <stdbool.h>
#include <stdint.h>

#define BENCH_WORLD_MAX 1024

typedef struct {
    double first_batch_s;                 /* start to every trainer's first batch done */
    double total_s;                       /* start to every process's exit */
    int64_t peak_rss_kb[BENCH_WORLD_MAX]; /* per rank, from wait4's ru_maxrss */
    double cpu_s[BENCH_WORLD_MAX];        /* per rank: user + system time */
} bench_world_t;

typedef struct {
    int world_size;      /* 1 server, world_size - 1 trainers */
    int64_t max_batches; /* per trainer */
    double lr;           /* 0: rpc_ps's default */
    bool start_only;     /* stop the world once every trainer did its first batch */
    int timeout_s;
} bench_world_options_t;

/*  Starts ranks 0..world_size-1 of the rpc_ps program at exe on 127.0.0.1
    at once, the compute threads shared out as tools/launch does, and waits
    for them. 0 when every trainer did its first batch and (unless
    start_only) every rank exited 0, within timeout_s; else -1 (said on
    stderr). */
int bench_rpc_ps_world(const char *exe, const bench_world_options_t *o, bench_world_t *out);

#endif
