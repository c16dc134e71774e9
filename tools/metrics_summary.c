/* SPDX-License-Identifier: MIT */
/*  metrics_summary: one table of a world's counters, from the folder its
    processes wrote with ZDIST_METRICS=DIR (rpc/agent/metrics_out.c):

        metrics_summary DIR

    Every line of every .jsonl file in DIR must be a JSON object (a file
    with a malformed line is reported with its line number, and the exit
    status is 1); the last line of each file gives its row: one per worker,
    ordered by rank, then a total. A file whose last line is not its final
    one (the process was still running, or died) is marked "running".
    JSON is parsed with jansson. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *file;
    json_t *last; /* the last line's object */
    int rank;
} row_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: metrics_summary DIR\n"
            "Prints one table of the counters in DIR/*.jsonl, written by the processes of\n"
            "a world run with ZDIST_METRICS=DIR: one row per process (from the last line\n"
            "of its file), then the total. Exit status 1 when a file is unreadable or a\n"
            "line is not valid JSON.\n");
}

static long long int_of(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (long long)json_integer_value(v) : 0;
}

static double num_of(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : 0.0;
}

/*  Reads path line by line; keeps the last line's object in *last. Returns
    the number of lines, or -1 with a message. */
static int read_file(const char *path, json_t **last)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "metrics_summary: %s: %s\n", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    int n = 0, rc = 0;
    while (getline(&line, &cap, f) >= 0) {
        n++;
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o || !json_is_object(o)) {
            fprintf(stderr, "metrics_summary: %s:%d: %s\n", path, n,
                    o ? "not a JSON object" : err.text);
            json_decref(o);
            rc = -1;
            break;
        }
        json_decref(*last);
        *last = o;
    }
    free(line);
    fclose(f);
    if (rc == 0 && n == 0)
        fprintf(stderr, "metrics_summary: %s: no lines yet\n", path);
    return rc < 0 ? -1 : n;
}

static int by_rank(const void *x, const void *y)
{
    const row_t *a = x, *b = y;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static bool is_jsonl(const char *name)
{
    size_t n = strlen(name);
    return n > 6 && !strcmp(name + n - 6, ".jsonl");
}

#define HEADER "%-20s %5s %10s %10s %7s %13s %13s %10s %10s %10s %9s  %s\n"
#define ROW    "%-20s %5s %10lld %10lld %7lld %13lld %13lld %10.1f %10.1f %10.1f %9.1f  %s\n"
#define TOTAL  "%-20s %5s %10lld %10lld %7lld %13lld %13lld %10.1f %10s %10.1f %9.1f\n"

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (argc != 2) {
        usage(stderr);
        return 2;
    }
    const char *dir = argv[1];
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "metrics_summary: %s: %s\n", dir, strerror(errno));
        return 1;
    }
    row_t *rows = NULL;
    int n = 0, cap = 0, status = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_jsonl(e->d_name))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            row_t *r = realloc(rows, cap * sizeof *rows);
            if (!r) {
                fprintf(stderr, "metrics_summary: out of memory\n");
                return 1;
            }
            rows = r;
        }
        row_t *r = &rows[n];
        *r = (row_t){.last = NULL};
        if (asprintf(&r->file, "%s/%s", dir, e->d_name) < 0) {
            fprintf(stderr, "metrics_summary: out of memory\n");
            return 1;
        }
        if (read_file(r->file, &r->last) <= 0) {
            status = 1;
            json_decref(r->last);
            free(r->file);
            continue;
        }
        r->rank = (int)int_of(r->last, "rank");
        n++;
    }
    closedir(d);
    if (n == 0) {
        fprintf(stderr, "metrics_summary: no metrics in %s (no *.jsonl file with a line)\n", dir);
        free(rows);
        return 1;
    }
    qsort(rows, n, sizeof *rows, by_rank);

    printf(HEADER, "worker", "rank", "calls_sent", "served", "errors", "bytes_sent", "bytes_recv",
           "mean_us", "p50_us", "p99_us", "uptime_s", "state");
    long long tot[5] = {0};
    double lat_weighted = 0, p99_max = 0, uptime_max = 0;
    long long world = 0;
    for (int i = 0; i < n; i++) {
        json_t *o = rows[i].last;
        const char *worker = json_string_value(json_object_get(o, "worker"));
        char rank[16];
        snprintf(rank, sizeof rank, "%d", rows[i].rank);
        long long c[5] = {int_of(o, "calls_sent"), int_of(o, "calls_served"), int_of(o, "errors"),
                          int_of(o, "bytes_sent"), int_of(o, "bytes_received")};
        double mean = num_of(o, "latency_mean_us"), p99 = num_of(o, "latency_p99_us");
        double up = num_of(o, "uptime_s");
        printf(ROW, worker ? worker : "?", rank, c[0], c[1], c[2], c[3], c[4], mean,
               num_of(o, "latency_p50_us"), p99, up,
               json_is_true(json_object_get(o, "final")) ? "done" : "running");
        for (int k = 0; k < 5; k++)
            tot[k] += c[k];
        lat_weighted += mean * (double)c[0];
        p99_max = p99 > p99_max ? p99 : p99_max;
        uptime_max = up > uptime_max ? up : uptime_max;
        if (int_of(o, "world_size") > world)
            world = int_of(o, "world_size");
    }
    /* The total's mean weighs each worker's by its calls; its p99 is the
       worst worker's (percentiles do not add up). */
    printf(TOTAL, "(total)", "", tot[0], tot[1], tot[2], tot[3], tot[4],
           tot[0] ? lat_weighted / (double)tot[0] : 0.0, "-", p99_max, uptime_max);
    if (world != n)
        fprintf(stderr, "metrics_summary: %d %s for a world of %lld\n", n,
                n == 1 ? "file" : "files", world);
    for (int i = 0; i < n; i++) {
        json_decref(rows[i].last);
        free(rows[i].file);
    }
    free(rows);
    return status;
}
