/* SPDX-License-Identifier: MIT */
/*  metrics.c: per-peer counters and round-trip latency.

    Latencies go into a log-scale histogram (16 buckets per octave from
    1 us, so a percentile is known within 2^(1/32) ~ 2%); counters are
    atomics updated on the call path without locks. */
#include "rpc/agent/agent.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/sized.h"
#include "rpc/net/stream.h"

#define PER_OCTAVE 16
#define DEBUG_MAX  64 /* counters printed or searched */

void zd__metrics_init(peer_metrics_t *m)
{
    atomic_init(&m->lat, NULL);
}

void zd__metrics_destroy(peer_metrics_t *m)
{
    peer_latency_t *l = atomic_load(&m->lat);
    if (l) {
        pthread_mutex_destroy(&l->lock);
        free(l);
    }
}

/*  m's latencies, made by the first thread to record one; NULL when out of
    memory (that latency goes unrecorded). */
static peer_latency_t *latency_of(peer_metrics_t *m)
{
    peer_latency_t *l = atomic_load_explicit(&m->lat, memory_order_acquire);
    if (l)
        return l;
    peer_latency_t *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return NULL;
    pthread_mutex_init(&fresh->lock, NULL);
    if (atomic_compare_exchange_strong(&m->lat, &l, fresh))
        return fresh;
    pthread_mutex_destroy(&fresh->lock); /* another thread's came first: l */
    free(fresh);
    return l;
}

static int bucket_of(double us)
{
    if (us <= 1.0)
        return 0;
    int b = (int)(log2(us) * PER_OCTAVE);
    return b >= RPC_LAT_BUCKETS ? RPC_LAT_BUCKETS - 1 : b;
}

/*  The geometric middle of bucket b. */
static double bucket_value(int b)
{
    return exp2((b + 0.5) / PER_OCTAVE);
}

void zd__metrics_latency(peer_metrics_t *m, int64_t ns)
{
    double us = (double)ns / (double)ZD__NS_PER_US;
    int b = bucket_of(us);
    peer_latency_t *l = latency_of(m);
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->count++;
    l->sum_us += us;
    l->hist[b]++;
    pthread_mutex_unlock(&l->lock);
}

static double percentile(const uint32_t *hist, int64_t count, double q)
{
    if (count == 0)
        return 0;
    int64_t rank = (int64_t)ceil(q * (double)count);
    if (rank < 1)
        rank = 1;
    int64_t seen = 0;
    for (int b = 0; b < RPC_LAT_BUCKETS; b++) {
        seen += hist[b];
        if (seen >= rank)
            return bucket_value(b);
    }
    return bucket_value(RPC_LAT_BUCKETS - 1);
}

/*  Adds one peer's numbers into out (counters) and hist (latencies). */
static void add_peer(peer_metrics_t *m, zd_rpc_metrics_t *out, uint32_t *hist, double *sum,
                     int64_t *count)
{
    out->calls_sent += atomic_load(&m->calls_sent);
    out->calls_served += atomic_load(&m->calls_served);
    out->errors += atomic_load(&m->errors);
    out->bytes_sent += atomic_load(&m->bytes_sent);
    out->bytes_received += atomic_load(&m->bytes_received);
    out->in_flight += atomic_load(&m->in_flight);
    out->serving += atomic_load(&m->serving);
    peer_latency_t *l = atomic_load_explicit(&m->lat, memory_order_acquire);
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    for (int b = 0; b < RPC_LAT_BUCKETS; b++)
        hist[b] += l->hist[b];
    *sum += l->sum_us;
    *count += l->count;
    pthread_mutex_unlock(&l->lock);
}

void zd__metrics_collect(agent_t *a, int peer, zd_rpc_metrics_t *out)
{
    static __thread uint32_t hist[RPC_LAT_BUCKETS];
    memset(out, 0, sizeof *out);
    memset(hist, 0, sizeof hist);
    double sum = 0;
    int64_t count = 0;
    for (int i = 0; i < a->net.world; i++)
        if (peer < 0 || i == peer)
            add_peer(&a->net.peers[i].m, out, hist, &sum, &count);
    if (count) {
        out->latency_mean_us = sum / (double)count;
        out->latency_p50_us = percentile(hist, count, 0.50);
        out->latency_p99_us = percentile(hist, count, 0.99);
    }
}

int zd_rpc_metrics_get(int peer, zd_rpc_metrics_t *out, size_t size)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    int rc = 0;
    zd_rpc_metrics_t m;
    if (peer >= a->net.world) {
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "zd_rpc_metrics_get: no worker with rank %d "
                               "(world size %d)",
                               peer, a->net.world);
    } else {
        zd__metrics_collect(a, peer, &m);
        rc = zd__sized_write(out, size, &m, sizeof m,
                             ZD__SIZE_THROUGH(zd_rpc_metrics_t, latency_p99_us),
                             "zd_rpc_metrics_get");
    }
    zd__agent_release(a);
    return rc;
}

static void print_line(FILE *f, const char *who, int rank, const zd_rpc_metrics_t *m)
{
    fprintf(f, "%-16s %5d %9lld %9lld %6lld %12lld %12lld %6lld %6lld %10.1f %10.1f %10.1f\n", who,
            rank, (long long)m->calls_sent, (long long)m->calls_served, (long long)m->errors,
            (long long)m->bytes_sent, (long long)m->bytes_received, (long long)m->in_flight,
            (long long)m->serving, m->latency_mean_us, m->latency_p50_us, m->latency_p99_us);
}

void zd_rpc_metrics_print(FILE *f)
{
    agent_t *a = zd__agent_acquire();
    if (!a) {
        fprintf(f, "rpc metrics: RPC is not running\n");
        return;
    }
    fprintf(f, "rpc metrics of \"%s\" (rank %d)\n", a->name, a->net.rank);
    fprintf(f, "%-16s %5s %9s %9s %6s %12s %12s %6s %6s %10s %10s %10s\n", "peer", "rank", "sent",
            "served", "errors", "bytes_out", "bytes_in", "flight", "serve", "mean_us", "p50_us",
            "p99_us");
    zd_rpc_metrics_t m;
    for (int i = 0; i < a->net.world; i++) {
        zd__metrics_collect(a, i, &m);
        print_line(f, a->net.peers[i].name, i, &m);
    }
    zd__metrics_collect(a, -1, &m);
    print_line(f, "(all)", -1, &m);
    zd__agent_release(a);
    zd_rpc_debug_item_t items[DEBUG_MAX];
    int n = zd_rpc_get_debug_info(items, DEBUG_MAX);
    for (int i = 0; i < n && i < DEBUG_MAX; i++)
        fprintf(f, "%s%s=%lld%s", i ? " " : "debug: ", items[i].name, (long long)items[i].value,
                i + 1 == n || i + 1 == DEBUG_MAX ? "\n" : "");
}

/*  ---- debug counters ---- */

static int add_item(zd_rpc_debug_item_t *items, int max, int n, const char *name, int64_t value)
{
    if (n < max) {
        snprintf(items[n].name, sizeof items[n].name, "%s", name);
        items[n].value = value;
    }
    return n + 1;
}

int zd_rpc_get_debug_info(zd_rpc_debug_item_t *items, int max)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    if (!items || max < 0)
        max = 0;
    zd_rpc_metrics_t m;
    zd__metrics_collect(a, -1, &m);
    int threads, idle;
    zd__pool_stats(a->pool, &threads, &idle);
    int n = 0;
    n = add_item(items, max, n, "num_pending_requests", m.in_flight);
    n = add_item(items, max, n, "num_serving", m.serving);
    n = add_item(items, max, n, "thread_pool_size", a->n_threads);
    n = add_item(items, max, n, "num_pool_threads", threads);
    n = add_item(items, max, n, "num_idle_threads", idle);
    n = add_item(items, max, n, "num_owner_rrefs", zd_rpc_debug_owner_rrefs());
    n = add_item(items, max, n, "num_pending_streams", zd__transport_stream_pending());
    if (a->has_hooks && a->hooks.debug_info) {
        int more =
            a->hooks.debug_info(a->hooks.arg, n < max ? items + n : NULL, n < max ? max - n : 0);
        n += more > 0 ? more : 0;
    }
    zd__agent_release(a);
    return n;
}

int zd_rpc_get_debug_value(const char *name, int64_t *value)
{
    if (!name || !value)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_debug_value: NULL argument");
    int n = zd_rpc_get_debug_info(NULL, 0);
    zd_rpc_debug_item_t *items = n > 0 ? calloc((size_t)n, sizeof *items) : NULL;
    if (n > 0 && !items)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rpc_get_debug_value: out of memory");
    /* Counters come and go with the module's state: read what fits now. */
    int got = n > 0 ? zd_rpc_get_debug_info(items, n) : n;
    int found = -1;
    for (int i = 0; i < got && i < n && found < 0; i++)
        if (strcmp(items[i].name, name) == 0) {
            *value = items[i].value;
            found = i;
        }
    free(items);
    if (got < 0)
        return -1;
    return found >= 0 ? 0 : zd_error_set("zd_rpc_get_debug_value: no counter \"%s\"", name);
}
