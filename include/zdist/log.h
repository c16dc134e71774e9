/* SPDX-License-Identifier: MIT */
/*  log.h: the library's log lines, their level and where they go.

    The library logs what it cannot report through a return value: a peer
    sending malformed messages, an answer that could not be sent, RRef values
    still referenced at shutdown, and a few lifecycle events. By default the
    lines go to stderr, one per event:

        2026-11-25T15:40:01.123Z WARN  zdist [worker1/1] rpc: dropped a ...

    (UTC time with milliseconds, the level, the worker's name and rank while
    RPC is running, the text). The level is read once from the environment
    variable ZDIST_LOG_LEVEL (error, warn, info or debug, in any case; warn
    when unset) unless zd_log_set_level was called first. Lines other than
    errors are rate limited (ZD_LOG_BUDGET a second, for the whole process,
    and ZD_LOG_BUDGET_KIND of any one kind of line) so that a peer sending
    garbage can neither flood the output nor hide one kind of line behind
    a flood of another; errors always pass. Every function here is thread-safe. */
#ifndef ZDIST_LOG_H
#define ZDIST_LOG_H

#include <zdist/export.h>

ZD_BEGIN_DECLS

/*  How important a line is; a level lets through itself and those above. */
typedef enum {
    ZD_LOG_ERROR, /* something failed and nobody else will report it */
    ZD_LOG_WARN,  /* something went wrong and was dealt with (the default level) */
    ZD_LOG_INFO,  /* lifecycle: RPC joined a world, shut down */
    ZD_LOG_DEBUG, /* details for whoever is chasing a problem */
} zd_log_level_t;

/*  At most this many lines below ZD_LOG_ERROR are written (or given to the
    sink) each second; the others are counted and reported in one line. */
#define ZD_LOG_BUDGET 20

/*  Of those, at most this many of one kind (one call site's line, whatever
    its values) each second: a flood of one kind leaves half the budget to
    the others, and the ranks of a node lost at once are still named. */
#define ZD_LOG_BUDGET_KIND 10

/*  Where lines go instead of stderr: level, who ("worker1/1" while RPC is
    running, else "") and the text without timestamp or level, all borrowed
    for the call. Called from any of the library's threads (the I/O thread,
    handler threads, the caller's), one call at a time, under the log's lock:
    it must not call back into zdist, whose functions may log. */
typedef void(zd_log_sink_fn)(zd_log_level_t level, const char *who, const char *line, void *arg);

/*  Sets the level: lines less important than level are dropped. Overrides
    ZDIST_LOG_LEVEL. A level out of range is clamped. Never fails. */
ZD_API void zd_log_set_level(zd_log_level_t level);

/*  The current level (ZDIST_LOG_LEVEL's, read on the first call, if
    zd_log_set_level was not called). Never fails. */
ZD_API zd_log_level_t zd_log_get_level(void);

/*  Sends the lines to fn(level, who, line, arg) instead of stderr; NULL
    restores stderr. arg stays the caller's; once this returns the previous
    sink is no longer running nor called. Never fails. */
ZD_API void zd_log_set_sink(zd_log_sink_fn *fn, void *arg);

/*  Whether a line of this level would be written now (before the rate
    limit): lets a caller skip building an expensive message. */
ZD_API int zd_log_enabled(zd_log_level_t level);

ZD_END_DECLS

#endif
