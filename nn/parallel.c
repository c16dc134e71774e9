/* SPDX-License-Identifier: MIT */
/*  parallel.c: a small pool of threads for the layers' heavy loops.

    Layers split their work into chunks (a convolution: samples, or runs of
    samples; a linear layer: blocks of output features) that the threads
    take as they come; each chunk calls single-threaded GEMMs. On two cores this beat letting
    OpenBLAS split every per-sample GEMM between its own threads, spreads the
    non-GEMM work too, and keeps OpenBLAS's idle threads (which poll with
    sched_yield for a while after each threaded call) off the CPUs. While a
    job runs, OpenBLAS is switched to one thread (openblas_set_num_threads,
    a plain counter in its pthread build) and switched back after.

    One caller at a time owns the pool. A concurrent caller (two RPC
    handlers running forwards, say) runs its chunks itself, one after the
    other, with the same partition (and OpenBLAS's own threading), so
    results never depend on who got the pool. */
#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include <zdist/error.h>
#include "core/blocks.h"
#include "core/clock.h"
#include <zdist/nn.h>
#include "nn/nn_private.h"

/*  How long an idle helper polls for the next job before sleeping: jobs of
    one training step follow each other within microseconds. */
#define SPIN_NS 200000

/*  Waiting threads poll with pause alone for this long, then yield the CPU
    between polls: on a machine with more runnable threads than cores, the
    thread being waited for may need the very core the waiter spins on. */
#define PAUSE_NS 20000

static struct {
    atomic_int ready; /* the threads below exist */
    int n;            /* threads, the caller included */
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_uint_fast64_t generation; /* bumped for each job */
    atomic_int running;              /* helpers still working on the job */
    int sleepers;                    /* helpers waiting on `wake` */
    nn_chunk_fn *fn;
    void *arg;
    int n_chunks;
    atomic_int next;  /* next chunk to take */
    atomic_flag busy; /* set while a caller owns the pool */
    float *scratch[NN_MAX_THREADS];
    size_t scratch_cap[NN_MAX_THREADS];
    size_t scratch_floats; /* of the current job */
} pool = {.busy = ATOMIC_FLAG_INIT};

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void)
{
    return (uint64_t)zd__now_ns();
}

/*  Takes chunks until none is left; `slot` picks the scratch buffer. */
static void run_chunks(int slot)
{
    int c;
    float *scratch = pool.scratch_floats ? pool.scratch[slot] : NULL;
    while ((c = atomic_fetch_add(&pool.next, 1)) < pool.n_chunks)
        pool.fn(pool.arg, c, scratch);
}

/*  One poll of a wait that started at t0 (now_ns): pause, or yield once
    the wait has lasted PAUSE_NS. */
static inline void wait_a_little(uint64_t t0, int *spins)
{
    if (++*spins < 64 || now_ns() - t0 < PAUSE_NS)
        _mm_pause();
    else
        sched_yield();
}

static void *helper(void *p)
{
    int slot = (int)(intptr_t)p;
    uint64_t seen = 0;
    for (;;) {
        uint64_t t0 = now_ns();
        int spins = 0;
        while (atomic_load(&pool.generation) == seen) {
            wait_a_little(t0, &spins);
            if (spins % 256 == 0 && now_ns() - t0 > SPIN_NS) {
                pthread_mutex_lock(&pool.lock);
                pool.sleepers++;
                while (atomic_load(&pool.generation) == seen)
                    pthread_cond_wait(&pool.wake, &pool.lock);
                pool.sleepers--;
                pthread_mutex_unlock(&pool.lock);
            }
        }
        seen = atomic_load(&pool.generation);
        run_chunks(slot);
        atomic_fetch_sub(&pool.running, 1);
    }
    return NULL;
}

/*  A forked child has none of the helpers: start over, lazily. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&init_lock, NULL);
    atomic_store(&pool.ready, 0);
    atomic_store(&pool.generation, 0); /* new helpers start from 0 */
    atomic_flag_clear(&pool.busy);
    atomic_store(&pool.running, 0);
    pool.sleepers = 0;
}

static void pool_init(void)
{
    static bool atfork_done;
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, after_fork_in_child);
        atfork_done = true;
    }
    int n = openblas_get_num_threads();
    pool.n = n < 1 ? 1 : n > NN_MAX_THREADS ? NN_MAX_THREADS : n;
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    for (int i = 1; i < pool.n; i++) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&t, &attr, helper, (void *)(intptr_t)i);
        pthread_attr_destroy(&attr);
        if (rc != 0) {
            pool.n = i; /* run with the threads we got */
            break;
        }
    }
}

static void ensure_pool(void)
{
    if (atomic_load(&pool.ready))
        return;
    pthread_mutex_lock(&init_lock);
    if (!atomic_load(&pool.ready)) {
        pool_init();
        atomic_store(&pool.ready, 1);
    }
    pthread_mutex_unlock(&init_lock);
}

int zd_nn_set_num_threads(int n)
{
    if (n < 1 || n > NN_MAX_THREADS)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_set_num_threads: %d threads (1 to %d)", n,
                                 NN_MAX_THREADS);
    pthread_mutex_lock(&init_lock);
    int rc = 0;
    if (atomic_load(&pool.ready) && pool.n != n)
        rc = zd_error_set("zd_nn_set_num_threads: the layers already run on %d threads; set the "
                          "number before the first layer runs",
                          pool.n);
    else
        openblas_set_num_threads(n); /* pool_init sizes the pool from it */
    pthread_mutex_unlock(&init_lock);
    return rc;
}

int zd_nn_get_num_threads(void)
{
    return atomic_load(&pool.ready) ? pool.n : openblas_get_num_threads();
}

int zd__nn_parallel_chunks(void)
{
    ensure_pool();
    return pool.n;
}

float *zd__nn_alloc_floats(size_t n)
{
    if (n > SIZE_MAX / sizeof(float))
        return NULL;
    return zd__mem_alloc(sizeof(float) * (n ? n : 1));
}

void zd__nn_free_floats(float *p)
{
    zd__mem_free(p);
}

/*  Serial fallback: one scratch buffer, reused by every chunk. */
static int run_serial(int n_chunks, size_t scratch_floats, nn_chunk_fn *fn, void *arg)
{
    float *scratch = NULL;
    if (scratch_floats && !(scratch = zd__nn_alloc_floats(scratch_floats)))
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for %zu floats of scratch",
                                 scratch_floats);
    for (int c = 0; c < n_chunks; c++)
        fn(arg, c, scratch);
    zd__nn_free_floats(scratch);
    return 0;
}

static int grow_scratch(int slots, size_t floats)
{
    for (int i = 0; i < slots; i++) {
        if (pool.scratch_cap[i] >= floats)
            continue;
        float *p = zd__nn_alloc_floats(floats); /* contents need not survive */
        if (!p)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for %zu floats of scratch",
                                     floats);
        zd__nn_free_floats(pool.scratch[i]);
        pool.scratch[i] = p;
        pool.scratch_cap[i] = floats;
    }
    return 0;
}

int zd__nn_parallel_run(int n_chunks, size_t scratch_floats, nn_chunk_fn *fn, void *arg)
{
    ensure_pool();
    if (n_chunks <= 1 || pool.n == 1 || atomic_flag_test_and_set(&pool.busy))
        return run_serial(n_chunks, scratch_floats, fn, arg);
    if (grow_scratch(pool.n, scratch_floats) < 0) {
        atomic_flag_clear(&pool.busy);
        return -1;
    }
    int blas_threads = openblas_get_num_threads();
    if (blas_threads > 1)
        openblas_set_num_threads(1);
    pool.fn = fn;
    pool.arg = arg;
    pool.n_chunks = n_chunks;
    pool.scratch_floats = scratch_floats;
    atomic_store(&pool.next, 0);
    atomic_store(&pool.running, pool.n - 1);
    pthread_mutex_lock(&pool.lock);
    atomic_fetch_add(&pool.generation, 1);
    if (pool.sleepers)
        pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    run_chunks(0);
    uint64_t t0 = now_ns();
    int spins = 0;
    while (atomic_load(&pool.running) > 0)
        wait_a_little(t0, &spins);
    if (blas_threads > 1)
        openblas_set_num_threads(blas_threads);
    atomic_flag_clear(&pool.busy);
    return 0;
}
