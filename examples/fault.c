/* SPDX-License-Identifier: MIT */
/*  fault.c: ZDIST_FAULT, the tests' fault-injection hook (fault.h). */
#include "examples/fault.h"

#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static long seen; /* times the named phase was reached */

void fault_point(int rank, const char *phase)
{
    const char *spec = getenv("ZDIST_FAULT");
    if (!spec || !*spec)
        return;
    /* A process launch restarted (tools/launch --max_restarts) got the same
       environment: the fault was its first life's, once. */
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
