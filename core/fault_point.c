/* SPDX-License-Identifier: MIT */
/*  fault_point.c: ZDIST_FAULT, the tests' fault points (fault_point.h). */
#include "core/fault_point.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { UNREAD, NONE, ARMED };

/*  The variable as last read, parsed: points run on RPC threads, where a
    getenv could race a program's setenv. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int state = UNREAD;
static struct {
    int rank;
    char phase[32], action[16];
    long nth;
} spec;
static long seen; /* times the named phase was reached */

static void read_env_locked(void)
{
    const char *v = getenv("ZDIST_FAULT");
    /* A process launch restarted (tools/launch --max_restarts) got the
       same environment: the fault was its first life's, once. */
    const char *restarts = getenv("ZDIST_RESTART_COUNT");
    spec.nth = 1;
    bool armed = v && *v && !(restarts && atoi(restarts) > 0) &&
        sscanf(v, "%d:%31[a-z]:%15[a-z]:%ld", &spec.rank, spec.phase, spec.action, &spec.nth) >= 3;
    atomic_store(&state, armed ? ARMED : NONE);
}

void zd__fault_reload(void)
{
    pthread_mutex_lock(&lock);
    read_env_locked();
    pthread_mutex_unlock(&lock);
}

void zd__fault_point(int rank, const char *phase)
{
    if (atomic_load(&state) == NONE)
        return;
    pthread_mutex_lock(&lock);
    if (atomic_load(&state) == UNREAD)
        read_env_locked();
    bool now = atomic_load(&state) == ARMED && rank == spec.rank &&
        strcmp(phase, spec.phase) == 0 && ++seen == spec.nth;
    char action[16];
    long nth = spec.nth;
    memcpy(action, spec.action, sizeof action);
    pthread_mutex_unlock(&lock);
    if (!now)
        return;
    fprintf(stderr, "ZDIST_FAULT: rank %d: %s at %s #%ld\n", rank, action, phase, nth);
    fflush(stdout);
    fflush(stderr);
    if (strcmp(action, "kill") == 0)
        raise(SIGKILL);
    else if (strcmp(action, "stop") == 0)
        raise(SIGSTOP);
}
