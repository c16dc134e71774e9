/* SPDX-License-Identifier: MIT */
/*  log_private.h: how the library writes its log lines (the public side,
    level and sink, is <zdist/log.h>). Hidden: not exported by libzdist.so. */
#ifndef ZDIST_CORE_LOG_PRIVATE_H
#define ZDIST_CORE_LOG_PRIVATE_H

#include <zdist/log.h>

/*  Logs one line (printf-style) at level, through the level, the rate limit
    and the sink, counted under kind: any address that stays the same for
    lines of one kind (a wrapper, whose one call site logs lines of
    several kinds, passes its caller's format). */
void zd__log_as(zd_log_level_t level, const void *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define ZD__LOG_STR2(x) #x
#define ZD__LOG_STR(x)  ZD__LOG_STR2(x)

/*  zd__log(level, fmt, ...): one line, of the kind of its call site
    (ZD_LOG_BUDGET_KIND a second): its file and line, a text of its own
    however the compiler merges formats or turns a last call into a
    jump. */
#define zd__log(level, ...) zd__log_as((level), __FILE__ ":" ZD__LOG_STR(__LINE__), __VA_ARGS__)

/*  Sets who appears on each line ("worker1/1"); NULL or "" clears it. rpc/
    sets it while its agent runs: the bottom layer never asks rpc/. */
void zd__log_set_who(const char *who);

/*  Tests: forgets the level so that ZDIST_LOG_LEVEL is read again, and
    resets the rate limit. */
void zd__log_reset(void);

#endif
