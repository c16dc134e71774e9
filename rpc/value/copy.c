/* SPDX-License-Identifier: MIT */
/*  copy.c: large copies shared with a helper thread (see copy.h). */
#include "rpc/value/copy.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

typedef struct {
    char *dst;
    const char *src;
    size_t n;
    atomic_size_t next; /* the first byte no thread has taken yet */
} job_t;

/*  The lock guards every field below; the chunks are copied outside it. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER; /* to the helper */
static pthread_cond_t left = PTHREAD_COND_INITIALIZER; /* to the caller */
static pthread_t helper;
static bool allowed, running, stopping;
static bool busy;     /* a caller has the helper */
static job_t *posted; /* offered, not yet taken */
static bool working;  /* the helper is taking chunks of the caller's job */
static atomic_long helped;

static void take_chunks(job_t *j, bool by_helper)
{
    for (;;) {
        size_t at = atomic_fetch_add_explicit(&j->next, RPC_COPY_CHUNK, memory_order_relaxed);
        if (at >= j->n)
            return;
        size_t len = j->n - at < RPC_COPY_CHUNK ? j->n - at : RPC_COPY_CHUNK;
        memcpy(j->dst + at, j->src + at, len);
        if (by_helper)
            atomic_fetch_add_explicit(&helped, 1, memory_order_relaxed);
    }
}

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!posted && !stopping)
            pthread_cond_wait(&wake, &lock);
        if (stopping)
            break;
        job_t *j = posted;
        posted = NULL;
        working = true;
        pthread_mutex_unlock(&lock);
        take_chunks(j, true);
        pthread_mutex_lock(&lock);
        working = false;
        pthread_cond_signal(&left);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

/*  A child has the parent's memory but not its threads. */
static void before_fork(void)
{
    pthread_mutex_lock(&lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

static void after_fork_child(void)
{
    /* The thread that forked holds the lock here (before_fork): it
       unlocks it, rather than making it again, so that ThreadSanitizer
       does not take it for still held. */
    pthread_mutex_unlock(&lock);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&left, NULL);
    allowed = running = stopping = busy = working = false;
    posted = NULL;
}

static void register_fork(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/*  Before the lock is first taken: a fork while another thread holds it
    would leave the child a lock nobody can release. */
static void ensure_fork_handlers(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_fork);
}

/*  Under the lock. The helper takes no signal meant for the application. */
static bool start_helper(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    running = pthread_create(&helper, NULL, helper_main, NULL) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return running;
}

void zd__rpc_copy(void *dst, const void *src, size_t n)
{
    if (n < RPC_COPY_SHARED_MIN) {
        memcpy(dst, src, n);
        return;
    }
    job_t j = {.dst = dst, .src = src, .n = n};
    atomic_init(&j.next, 0);
    ensure_fork_handlers();
    pthread_mutex_lock(&lock);
    bool shared = allowed && !busy && (running || start_helper());
    if (shared) {
        busy = true;
        posted = &j;
        pthread_cond_signal(&wake);
    }
    pthread_mutex_unlock(&lock);
    take_chunks(&j, false);
    if (!shared)
        return;
    /* Every chunk is taken: the helper, if it took the job, is in its last. */
    pthread_mutex_lock(&lock);
    if (posted == &j)
        posted = NULL;
    while (working)
        pthread_cond_wait(&left, &lock);
    busy = false;
    pthread_mutex_unlock(&lock);
}

void zd__rpc_copy_enable(bool on)
{
    ensure_fork_handlers();
    pthread_mutex_lock(&lock);
    allowed = on;
    bool join = !on && running;
    if (join) {
        stopping = true;
        pthread_cond_signal(&wake);
    }
    pthread_mutex_unlock(&lock);
    if (!join)
        return;
    pthread_join(helper, NULL);
    pthread_mutex_lock(&lock);
    running = stopping = false;
    pthread_mutex_unlock(&lock);
}

long zd__rpc_copy_helped(void)
{
    return atomic_load(&helped);
}
