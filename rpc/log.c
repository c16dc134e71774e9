/* SPDX-License-Identifier: MIT */
/*  log.c: the agent's log lines on stderr, rate limited. */
#include "rpc/agent.h"

#include <stdarg.h>
#include <stdio.h>

void zd__agent_log(agent_t *a, const char *fmt, ...)
{
    /* At most 20 lines a second: a peer sending garbage must not turn into
       a flood of output. */
    int64_t window = zd__agent_now_ns() / 1000000000;
    int64_t seen = atomic_load(&a->log_window);
    if (window != seen && atomic_compare_exchange_strong(&a->log_window, &seen, window))
        atomic_store(&a->log_budget, 20);
    if (atomic_fetch_sub(&a->log_budget, 1) <= 0)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "zdist rpc [%s/%d]: %s\n", a->name, a->rank, line);
}
