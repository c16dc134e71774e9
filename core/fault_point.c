/* SPDX-License-Identifier: MIT */
/*  fault_point.c: ZDIST_FAULT, the tests' fault points (fault_point.h). */
#include "core/fault_point.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long seen; /* times the named phase was reached */

void zd__fault_point(int rank, const char *phase)
{
    /* read at each point, not once: a test's forked child sets it */
    const char *spec = getenv("ZDIST_FAULT");
    if (!spec || !*spec)
        return;
    const char *restarts = getenv("ZDIST_RESTART_COUNT");
    if (restarts && atoi(restarts) > 0)
        return;
    int r = -1;
    char ph[32] = "", action[16] = "";
    long nth = 1;
    if (sscanf(spec, "%d:%31[a-z]:%15[a-z]:%ld", &r, ph, action, &nth) < 3 || r != rank ||
        strcmp(ph, phase) != 0)
        return;
    pthread_mutex_lock(&lock);
    bool now = ++seen == nth;
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
