/* SPDX-License-Identifier: MIT */
/*  pool.c: the worker threads that run handlers.

    A fixed pool deadlocks on nested calls once every thread waits for an
    answer that needs a thread (pytorch/pytorch#26362). Here a pool thread
    that blocks in an RPC wait tells the pool (zd__pool_block_begin), and the
    pool starts another thread when work is queued and fewer than `core`
    threads are runnable. Threads above `core` leave after a few idle
    seconds. The hard limit only guards against runaway recursion. */
#define _GNU_SOURCE /* pthread_timedjoin_np: bounded joins at shutdown */
#include "rpc/agent/agent.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#define POOL_MAX_THREADS 4096
#define POOL_IDLE_EXIT_S 5

typedef struct task {
    pool_fn *fn, *drop;
    void *arg;
    struct task *next;
} task_t;

typedef struct worker {
    pthread_t thread;
    struct worker *next;
} worker_t;

struct pool {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* work queued, or stop */
    pthread_cond_t gone; /* a thread exited */
    task_t *head, *tail;
    int core;
    int total;   /* live threads */
    int idle;    /* waiting for work */
    int blocked; /* inside zd__pool_block_begin/end */
    bool stop;
    worker_t *live;   /* every thread started, for joining */
    worker_t *exited; /* threads that left early: joined lazily */
};

static __thread pool_t *tls_pool;
static __thread int tls_blocked; /* nesting depth of block_begin on this thread */

static void *worker_main(void *arg);

/*  Under the lock. Starting a thread can fail (resources): the work then
    waits for a running thread, which is never worse than a fixed pool. */
static void spawn(pool_t *p)
{
    if (p->total >= POOL_MAX_THREADS)
        return;
    worker_t *w = malloc(sizeof *w);
    if (!w)
        return;
    if (pthread_create(&w->thread, NULL, worker_main, p) != 0) {
        free(w);
        return;
    }
    w->next = p->live;
    p->live = w;
    p->total++;
}

/*  Under the lock: joins threads that already left (they hold no lock). */
static void reap(pool_t *p)
{
    while (p->exited) {
        worker_t *w = p->exited;
        p->exited = w->next;
        pthread_join(w->thread, NULL);
        free(w);
    }
}

/*  Under the lock: moves the calling thread's record to the exited list. */
static void leave(pool_t *p)
{
    pthread_t me = pthread_self();
    for (worker_t **pp = &p->live; *pp; pp = &(*pp)->next)
        if (pthread_equal((*pp)->thread, me)) {
            worker_t *w = *pp;
            *pp = w->next;
            w->next = p->exited;
            p->exited = w;
            break;
        }
    p->total--;
    pthread_cond_broadcast(&p->gone);
}

static void *worker_main(void *arg)
{
    pool_t *p = arg;
    tls_pool = p;
    zd__net_set_thread_role(ROLE_POOL);
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop) {
            p->idle++;
            int rc = 0;
            if (p->total > p->core) {
                struct timespec ts = zd__realtime_in(POOL_IDLE_EXIT_S * ZD__MS_PER_S);
                rc = pthread_cond_timedwait(&p->cond, &p->lock, &ts);
            } else {
                pthread_cond_wait(&p->cond, &p->lock);
            }
            p->idle--;
            if (rc == ETIMEDOUT && !p->head && p->total > p->core && !p->stop) {
                leave(p);
                pthread_mutex_unlock(&p->lock);
                return NULL;
            }
        }
        if (p->stop)
            break;
        task_t *t = p->head;
        p->head = t->next;
        if (!p->head)
            p->tail = NULL;
        reap(p);
        pthread_mutex_unlock(&p->lock);
        t->fn(t->arg);
        free(t);
        pthread_mutex_lock(&p->lock);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

pool_t *zd__pool_new(int n_threads)
{
    pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    pthread_cond_init(&p->gone, NULL);
    p->core = n_threads;
    /* Threads start on demand: an idle world of many processes costs
       nothing, and the first calls start them. */
    return p;
}

int zd__pool_submit(pool_t *p, pool_fn *fn, pool_fn *drop, void *arg)
{
    task_t *t = malloc(sizeof *t);
    if (!t) {
        drop(arg);
        return -1;
    }
    t->fn = fn;
    t->drop = drop;
    t->arg = arg;
    t->next = NULL;
    pthread_mutex_lock(&p->lock);
    if (p->stop) {
        pthread_mutex_unlock(&p->lock);
        free(t);
        drop(arg);
        return -1;
    }
    if (p->tail)
        p->tail->next = t;
    else
        p->head = t;
    p->tail = t;
    if (p->idle > 0)
        pthread_cond_signal(&p->cond);
    else if (p->total - p->blocked < p->core)
        spawn(p);
    pthread_mutex_unlock(&p->lock);
    return 0;
}

void zd__pool_stats(pool_t *p, int *threads, int *idle)
{
    pthread_mutex_lock(&p->lock);
    *threads = p->total;
    *idle = p->idle;
    pthread_mutex_unlock(&p->lock);
}

void zd__pool_block_begin(void)
{
    pool_t *p = tls_pool;
    if (!p || tls_blocked++ > 0)
        return;
    pthread_mutex_lock(&p->lock);
    p->blocked++;
    if (p->head && p->idle == 0 && p->total - p->blocked < p->core)
        spawn(p);
    pthread_mutex_unlock(&p->lock);
}

void zd__pool_block_end(void)
{
    pool_t *p = tls_pool;
    if (!p || --tls_blocked > 0)
        return;
    pthread_mutex_lock(&p->lock);
    p->blocked--;
    pthread_mutex_unlock(&p->lock);
}

int zd__pool_destroy(pool_t *p, int64_t wait_ms)
{
    if (!p)
        return 0;
    struct timespec until = zd__realtime_in(wait_ms);
    int stuck = 0;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->cond);
    task_t *t = p->head;
    p->head = p->tail = NULL;
    pthread_mutex_unlock(&p->lock);
    /* Dropped outside the lock: drop functions answer their callers. */
    while (t) {
        task_t *next = t->next;
        t->drop(t->arg);
        free(t);
        t = next;
    }
    pthread_mutex_lock(&p->lock);
    reap(p);
    worker_t *live = p->live;
    p->live = NULL;
    pthread_mutex_unlock(&p->lock);
    while (live) {
        worker_t *next = live->next;
        if (pthread_timedjoin_np(live->thread, NULL, &until) != 0) {
            pthread_detach(live->thread); /* a handler stuck in user code */
            stuck++;
        }
        free(live);
        live = next;
    }
    if (stuck) {
        zd__log(ZD_LOG_ERROR,
                "rpc: shutdown: %d handler thread(s) still running after %lld ms "
                "(stuck in a handler?): left running, with the pool",
                stuck, (long long)wait_ms);
        return -1;
    }
    pthread_mutex_lock(&p->lock);
    reap(p);
    pthread_mutex_unlock(&p->lock);
    pthread_cond_destroy(&p->cond);
    pthread_cond_destroy(&p->gone);
    pthread_mutex_destroy(&p->lock);
    free(p);
    return 0;
}
