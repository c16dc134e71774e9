/* SPDX-License-Identifier: MIT */
/*  bench_rpc: figures of the RPC agent between two processes on this machine.

        bench_rpc [--raw] [--csv] [--iters N] [--bw] [--bw-reps N] [--no-curve]

    Prints zd_rpc_sync round trips (no tensor, a 1x10 tensor), remote + to_here,
    one-way throughput of 1, 16 and 64 MiB tensors (the best of 20, 8 and 6
    calls, or of N with --bw-reps; between these two processes of one host
    they go through shared memory unless ZDIST_SHM=0) beside a single-threaded
    memcpy of the same sizes taking turns with them (memcpy_*_GBps), 1 MiB
    tensors with 4 zd_rpc_async calls in flight (rpc_bw_1MiB_window4_GBps:
    the round trips overlap), and calls per second with 64 calls in
    flight; --bw prints the throughput figures only. --raw also measures
    plain libzmq in the same run (REQ/REP round trip of one byte, one 64 MiB
    message one way, sent without copy) in the same processes, in blocks
    taking turns with the RPC measurements, so that both see the same
    machine. --csv prints one line per figure: name,value,unit. The two
    processes are forked; the figures come back to the parent through a
    pipe. Then a second world of two, with a fresh world key (every
    connection CURVE: authenticated and encrypted), measures the round trip
    and the 64 MiB throughput again (rpc_rtt_curve_us_p50,
    rpc_bw_64MiB_curve_GBps, over ZeroMQ as between hosts: shared memory
    off); --no-curve leaves it out. The first world
    runs without a key whatever the user's default key file says. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/net/security.h"
#include "tests/support/world.h"

#define MAX_FIGURES 32

typedef struct {
    char name[48];
    double value;
    char unit[12];
} figure_t;

typedef struct {
    figure_t f[MAX_FIGURES];
    int n;
} figures_t;

static void add(figures_t *fs, const char *name, double value, const char *unit)
{
    if (fs->n < MAX_FIGURES) {
        figure_t *f = &fs->f[fs->n++];
        snprintf(f->name, sizeof f->name, "%s", name);
        f->value = value;
        snprintf(f->unit, sizeof f->unit, "%s", unit);
    }
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)ceil(q * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/*  ---- the server ---- */

static zd_value_t *h_echo(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)arg;
    zd_value_t *v = zd_list_get(args, 0);
    return v ? zd_value_ref(v) : zd_value_none();
}

static zd_value_t *h_sink(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_none();
}

static zd_value_t *h_small(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call;
    (void)args;
    (void)arg;
    return zd_value_int(1);
}

/*  Raw libzmq REP, on its own context and thread: answers one byte to
    anything, stops on "q". */
static void *raw_server(void *arg)
{
    void *ctx = zmq_ctx_new();
    void *rep = zmq_socket(ctx, ZMQ_REP);
    zmq_bind(rep, arg);
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, rep, 0) < 0)
            break;
        bool quit = zmq_msg_size(&m) == 1 && *(char *)zmq_msg_data(&m) == 'q';
        zmq_msg_close(&m);
        zmq_send(rep, "", 1, 0);
        if (quit)
            break;
    }
    zmq_close(rep);
    zmq_ctx_term(ctx);
    return NULL;
}

static const char *g_key_file; /* the CURVE world's key, NULL for the plain one */

static int setup(int rank, int port)
{
    zd_rpc_register_inline("echo", h_echo, NULL);
    zd_rpc_register("echo_pool", h_echo, NULL);
    zd_rpc_register_inline("sink", h_sink, NULL);
    zd_rpc_register_inline("small", h_small, NULL);
    zd_rpc_options_t o = zd_rpc_options_default();
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    o.init_timeout_ms = 30000;
    o.key_file = g_key_file;
    o.insecure = g_key_file == NULL;
    if (zd_rpc_init(rank ? "server" : "client", rank, 2, &o) < 0) {
        fprintf(stderr, "bench_rpc: %s\n", zd_error_last());
        return -1;
    }
    return 0;
}

/*  ---- the client ---- */

typedef struct {
    double *t;
    int n, cap;
} samples_t;

static void sample(samples_t *s, double v)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->t = realloc(s->t, sizeof *s->t * (size_t)s->cap);
    }
    s->t[s->n++] = v;
}

static int rpc_block(const char *fn, zd_value_t *args, int n, samples_t *s)
{
    for (int i = 0; i < n; i++) {
        zd_value_t *r;
        double t0 = now_us();
        if (zd_rpc_sync(1, fn, args, -1, &r) < 0) {
            fprintf(stderr, "bench_rpc: %s\n", zd_error_last());
            return -1;
        }
        if (s)
            sample(s, now_us() - t0);
        zd_value_unref(r);
    }
    return 0;
}

static void raw_block(void *req, int n, samples_t *s)
{
    char b = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        zmq_send(req, &b, 1, 0);
        zmq_recv(req, &b, 1, 0);
        if (s)
            sample(s, now_us() - t0);
    }
}

static void no_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

/*  GB/s of one message of `size` bytes one way (plus a one-byte answer). */
static double raw_bw(void *req, void *big, size_t size)
{
    char b;
    zmq_msg_t m;
    zmq_msg_init_data(&m, big, size, no_free, NULL);
    double t0 = now_us();
    zmq_msg_send(&m, req, 0);
    zmq_recv(req, &b, 1, 0);
    return size / ((now_us() - t0) * 1e3);
}

static double rpc_bw(zd_value_t *args, size_t size)
{
    zd_value_t *r;
    double t0 = now_us();
    if (zd_rpc_sync(1, "sink", args, -1, &r) < 0)
        return 0;
    double dt = now_us() - t0;
    zd_value_unref(r);
    return size / (dt * 1e3);
}

/*  GB/s of total calls of size bytes each, window of them in flight
    (zd_rpc_async): the round trip overlaps the next calls' copies. */
static double rpc_bw_window(zd_value_t *args, size_t size, int window, int total)
{
    zd_future_t *ring[16] = {0};
    bool ok = window <= 16;
    double t0 = now_us();
    for (int i = 0; ok && i < total + window; i++) {
        zd_future_t **slot = &ring[i % window];
        if (*slot) {
            ok = zd_future_wait(*slot, ZD_TIMEOUT_NONE) == 0 && zd_future_value(*slot) != NULL;
            zd_future_unref(*slot);
            *slot = NULL;
        }
        if (i < total)
            *slot = zd_rpc_async(1, "sink", args, -1);
    }
    double dt = now_us() - t0;
    return ok ? (double)size * total / (dt * 1e3) : 0;
}

static zd_value_t *tensor_args(size_t bytes)
{
    int64_t n = (int64_t)bytes / 4;
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, &n, 1);
    /* Written, so that its pages are its own: untouched zeroed memory reads
       from the kernel's one zero page and copies faster than any tensor. */
    memset(zd_tensor_raw(t), 0x5a, bytes);
    zd_value_t *args = ZD_ARGS(t);
    zd_tensor_unref(t);
    return args;
}

static double calls_per_second(int window, int total)
{
    zd_future_t **ring = calloc((size_t)window, sizeof *ring);
    double t0 = now_us();
    for (int i = 0; i < total; i++) {
        zd_future_t **slot = &ring[i % window];
        if (*slot) {
            zd_future_wait(*slot, ZD_TIMEOUT_NONE);
            zd_future_unref(*slot);
        }
        *slot = zd_rpc_async(1, "echo", NULL, -1);
    }
    for (int i = 0; i < window; i++)
        if (ring[i]) {
            zd_future_wait(ring[i], ZD_TIMEOUT_NONE);
            zd_future_unref(ring[i]);
        }
    double dt = now_us() - t0;
    free(ring);
    return total / (dt / 1e6);
}

/*  GB/s of one single-threaded memcpy of size bytes between two buffers
    already written (warm, as the RPC figures' buffers are): what one copy
    of a tensor costs on this machine, for the figures beside it. */
static double memcpy_bw(char *dst, const char *src, size_t size)
{
    double t0 = now_us();
    memcpy(dst, src, size);
    double dt = now_us() - t0;
    /* Keep the copy: the compiler may not drop it. */
    __asm__ volatile("" : : "r"(dst) : "memory");
    return size / (dt * 1e3);
}

static bool bw_only; /* --bw */
static int bw_reps;  /* --bw-reps */

/*  The CURVE world: the plain round trip and 64 MiB one way, as above. */
static void client_curve(int iters, figures_t *fs)
{
    rpc_block("echo", NULL, iters / 10, NULL);
    samples_t plain = {0};
    for (int b = 0; b < 20 && !bw_only; b++)
        if (rpc_block("echo", NULL, iters / 20, &plain) < 0)
            break;
    if (plain.n)
        add(fs, "rpc_rtt_curve_us_p50", quantile(plain.t, plain.n, 0.5), "us");
    free(plain.t);
    size_t size = (size_t)64 << 20;
    zd_value_t *args = tensor_args(size);
    double best = 0;
    int reps = bw_reps ? bw_reps : 6;
    for (int i = -1; i < reps; i++) {
        double g = rpc_bw(args, size);
        if (i >= 0 && g > best)
            best = g;
    }
    zd_value_unref(args);
    add(fs, "rpc_bw_64MiB_curve_GBps", best, "GB/s");
}

static void client(int iters, bool raw, const char *raw_ep, figures_t *fs)
{
    void *ctx = NULL, *req = NULL;
    if (raw) {
        ctx = zmq_ctx_new();
        req = zmq_socket(ctx, ZMQ_REQ);
        zmq_connect(req, raw_ep);
        raw_block(req, 100, NULL);
    }
    float ten[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    zd_tensor_t *t = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){1, 10}, 2, ten);
    zd_value_t *targs = ZD_ARGS(t);
    zd_tensor_unref(t);
    /* Warm up, then blocks taking turns so that every kind of call sees the
       same machine (this VM's neighbours come and go). */
    rpc_block("echo", NULL, iters / 10, NULL);
    rpc_block("echo_pool", NULL, iters / 10, NULL);
    samples_t plain = {0}, tensor = {0}, pool = {0}, zraw = {0}, rth = {0};
    const int blocks = bw_only ? 0 : 20;
    for (int b = 0; b < blocks; b++) {
        int n = iters / blocks;
        if (rpc_block("echo", NULL, n, &plain) < 0 || rpc_block("echo", targs, n, &tensor) < 0 ||
            rpc_block("echo_pool", NULL, n, &pool) < 0)
            break;
        if (raw)
            raw_block(req, n, &zraw);
        for (int i = 0; i < n / 2; i++) {
            zd_value_t *v;
            double t0 = now_us();
            zd_rref_t *r = zd_rpc_remote(1, "small", NULL, -1);
            if (!r || zd_rref_to_here(r, -1, &v) < 0) {
                fprintf(stderr, "bench_rpc: %s\n", zd_error_last());
                break;
            }
            sample(&rth, now_us() - t0);
            zd_value_unref(v);
            zd_rref_unref(r);
        }
    }
    zd_value_unref(targs);
    if (plain.n) {
        add(fs, "rpc_rtt_us_p50", quantile(plain.t, plain.n, 0.5), "us");
        add(fs, "rpc_rtt_us_p99", quantile(plain.t, plain.n, 0.99), "us");
    }
    if (tensor.n) {
        add(fs, "rpc_rtt_tensor_us_p50", quantile(tensor.t, tensor.n, 0.5), "us");
        add(fs, "rpc_rtt_tensor_us_p99", quantile(tensor.t, tensor.n, 0.99), "us");
    }
    if (pool.n)
        add(fs, "rpc_rtt_pool_us_p50", quantile(pool.t, pool.n, 0.5), "us");
    if (rth.n)
        add(fs, "remote_to_here_us_p50", quantile(rth.t, rth.n, 0.5), "us");
    if (zraw.n) {
        add(fs, "zmq_rtt_us_p50", quantile(zraw.t, zraw.n, 0.5), "us");
        add(fs, "zmq_rtt_us_p99", quantile(zraw.t, zraw.n, 0.99), "us");
    }
    zd_rref_drain(-1);
    /* Throughput: best of a few, taking turns with raw libzmq at 64 MiB. */
    static const size_t mib[] = {1, 16, 64};
    static const char *names[] = {"rpc_bw_1MiB_GBps", "rpc_bw_16MiB_GBps", "rpc_bw_64MiB_GBps"};
    static const char *copy_names[] = {"memcpy_1MiB_GBps", "memcpy_16MiB_GBps",
                                       "memcpy_64MiB_GBps"};
    void *big = raw ? calloc(1, (size_t)64 << 20) : NULL;
    double zbest = 0, copy_best[3] = {0};
    char *copy_src = malloc((size_t)64 << 20), *copy_dst = malloc((size_t)64 << 20);
    if (copy_src && copy_dst) {
        memset(copy_src, 0x5a, (size_t)64 << 20);
        memset(copy_dst, 0xa5, (size_t)64 << 20);
    }
    for (int k = 0; k < 3; k++) {
        size_t size = mib[k] << 20;
        zd_value_t *args = tensor_args(size);
        double best = 0;
        int reps = bw_reps ? bw_reps : k == 0 ? 20 : k == 1 ? 8 : 6;
        for (int i = -1; i < reps; i++) {
            double g = rpc_bw(args, size);
            if (i >= 0 && g > best)
                best = g;
            /* memcpy takes turns with the calls: both see the same machine. */
            g = copy_src && copy_dst ? memcpy_bw(copy_dst, copy_src, size) : 0;
            if (i >= 0 && g > copy_best[k])
                copy_best[k] = g;
            if (k == 2 && raw) {
                g = raw_bw(req, big, size);
                if (i >= 0 && g > zbest)
                    zbest = g;
            }
        }
        zd_value_unref(args);
        add(fs, names[k], best, "GB/s");
    }
    if (raw)
        add(fs, "zmq_bw_64MiB_GBps", zbest, "GB/s");
    /* 1 MiB with 4 calls in flight: what a stream of such tensors gets. */
    zd_value_t *args1 = tensor_args((size_t)1 << 20);
    double wbest = 0;
    for (int i = -1; i < (bw_reps ? bw_reps : 5); i++) {
        double g = rpc_bw_window(args1, (size_t)1 << 20, 4, 50);
        if (i >= 0 && g > wbest)
            wbest = g;
    }
    zd_value_unref(args1);
    add(fs, "rpc_bw_1MiB_window4_GBps", wbest, "GB/s");
    for (int k = 0; k < 3; k++)
        if (copy_best[k] > 0)
            add(fs, copy_names[k], copy_best[k], "GB/s");
    free(copy_src);
    free(copy_dst);
    free(big);
    if (!bw_only)
        add(fs, "rpc_calls_per_s_64_inflight", calls_per_second(64, 20 * iters), "1/s");
    free(plain.t);
    free(tensor.t);
    free(pool.t);
    free(zraw.t);
    free(rth.t);
    if (raw) {
        char b;
        zmq_send(req, "q", 1, 0);
        zmq_recv(req, &b, 1, 0);
        zmq_close(req);
        zmq_ctx_term(ctx);
    }
}

static int run(int iters, bool raw, figures_t *fs)
{
    int port = world_free_port();
    char raw_ep[64];
    snprintf(raw_ep, sizeof raw_ep, "tcp://127.0.0.1:%d", world_free_port());
    int fd[2];
    if (port < 0 || pipe(fd) < 0)
        return -1;
    fflush(stdout);
    pid_t server = fork();
    if (server == 0) {
        close(fd[0]);
        pthread_t t;
        bool with_raw = raw && !g_key_file;
        if (with_raw)
            pthread_create(&t, NULL, raw_server, raw_ep);
        int rc = setup(1, port) == 0 && zd_rpc_shutdown(true, 0) == 0 ? 0 : 1;
        if (with_raw)
            pthread_join(t, NULL);
        _exit(rc);
    }
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        figures_t mine = {0};
        if (setup(0, port) == 0) {
            if (g_key_file)
                client_curve(iters, &mine);
            else
                client(iters, raw, raw_ep, &mine);
            zd_rpc_shutdown(true, 0);
        }
        if (write(fd[1], &mine, sizeof mine) != (ssize_t)sizeof mine)
            _exit(1);
        _exit(0);
    }
    close(fd[1]);
    figures_t got = {0};
    ssize_t n = read(fd[0], &got, sizeof got);
    close(fd[0]);
    waitpid(pid, NULL, 0);
    waitpid(server, NULL, 0);
    if (n != (ssize_t)sizeof got || got.n == 0)
        return -1;
    *fs = got;
    return 0;
}

/*  The same two processes in a world with a fresh key (a 0700 folder of
    its own, removed after); its figures are added to fs. */
static int curve_run(int iters, figures_t *fs)
{
    char dir[] = "/tmp/bench-rpc-key-XXXXXX", path[64];
    if (!mkdtemp(dir))
        return -1;
    snprintf(path, sizeof path, "%s/world.key", dir);
    figures_t got = {0};
    int rc = zd__security_keygen(path, false);
    if (rc == 0) {
        /* Tensors between two processes of one host take shared memory,
           which CURVE does not touch: the figure is for the encrypted
           ZeroMQ path that joins hosts. */
        const char *shm = getenv("ZDIST_SHM");
        char *saved = shm ? strdup(shm) : NULL;
        setenv("ZDIST_SHM", "0", 1);
        g_key_file = path;
        rc = run(iters, false, &got);
        g_key_file = NULL;
        if (saved)
            setenv("ZDIST_SHM", saved, 1);
        else
            unsetenv("ZDIST_SHM");
        free(saved);
    }
    unlink(path);
    rmdir(dir);
    for (int i = 0; rc == 0 && i < got.n && fs->n < MAX_FIGURES; i++)
        fs->f[fs->n++] = got.f[i];
    return rc;
}

int main(int argc, char **argv)
{
    bool raw = false, csv = false, curve = true;
    int iters = 4000;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--raw") == 0)
            raw = true;
        else if (strcmp(argv[i], "--csv") == 0)
            csv = true;
        else if (strcmp(argv[i], "--bw") == 0)
            bw_only = true;
        else if (strcmp(argv[i], "--no-curve") == 0)
            curve = false;
        else if (strcmp(argv[i], "--bw-reps") == 0 && i + 1 < argc)
            bw_reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            iters = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--raw] [--csv] [--iters N] [--bw] [--bw-reps N] "
                    "[--no-curve]\n",
                    argv[0]);
            return 2;
        }
    }
    if (iters < 100)
        iters = 100;
    figures_t fs = {0};
    if (run(iters, raw, &fs) < 0) {
        fprintf(stderr, "bench_rpc: the run failed\n");
        return 1;
    }
    if (curve && curve_run(iters, &fs) < 0) {
        fprintf(stderr, "bench_rpc: the CURVE run failed\n");
        return 1;
    }
    for (int i = 0; i < fs.n; i++) {
        if (csv)
            printf("%s,%.3f,%s\n", fs.f[i].name, fs.f[i].value, fs.f[i].unit);
        else
            printf("%-32s %12.2f %s\n", fs.f[i].name, fs.f[i].value, fs.f[i].unit);
    }
    return 0;
}
