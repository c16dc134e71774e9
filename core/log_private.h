/* SPDX-License-Identifier: MIT */
/*  log_private.h: how the library writes its log lines (the public side,
    level and sink, is <zdist/log.h>). Hidden: not exported by libzdist.so. */
#ifndef ZDIST_CORE_LOG_PRIVATE_H
#define ZDIST_CORE_LOG_PRIVATE_H

#include <zdist/log.h>

/*  Logs one line (printf-style) at level, through the level, the rate limit
    (ZD_LOG_BUDGET_KIND a second of the lines of this call site) and the
    sink. */
void zd__log(zd_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*  zd__log for a wrapper, whose one call site logs lines of several
    kinds: kind, any address that stays the same for lines of one kind
    (the wrapper's caller's format), is what the rate limit counts the
    line under. */
void zd__log_as(zd_log_level_t level, const void *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*  Sets who appears on each line ("worker1/1"); NULL or "" clears it. rpc/
    sets it while its agent runs: the bottom layer never asks rpc/. */
void zd__log_set_who(const char *who);

/*  Tests: forgets the level so that ZDIST_LOG_LEVEL is read again, and
    resets the rate limit. */
void zd__log_reset(void);

#endif
