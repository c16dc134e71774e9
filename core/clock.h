/* SPDX-License-Identifier: MIT */
/*  clock.h: time units and deadlines, one way for the whole library
    (private; every layer may include it). Durations cross the API in
    milliseconds (error.h: ZD_TIMEOUT_NONE = 0 is no limit); inside, time
    is the monotonic clock in nanoseconds, and a deadline is an instant on
    it, INT64_MAX for none. */
#ifndef ZDIST_CORE_CLOCK_H
#define ZDIST_CORE_CLOCK_H

#include <stdint.h>
#include <time.h>

#define ZD__NS_PER_US INT64_C(1000)
#define ZD__NS_PER_MS INT64_C(1000000)
#define ZD__NS_PER_S  INT64_C(1000000000)
#define ZD__MS_PER_S  INT64_C(1000)
#define ZD__US_PER_S  INT64_C(1000000)

/*  Spans the library bounds durations by, in seconds. */
#define ZD__DAY_S  INT64_C(86400)
#define ZD__WEEK_S (7 * ZD__DAY_S)

/*  No deadline: later than any instant. */
#define ZD__NEVER INT64_MAX

/*  The monotonic clock, in ns. */
static inline int64_t zd__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * ZD__NS_PER_S + ts.tv_nsec;
}

/*  The instant timeout_ms after now_ns; ZD__NEVER for ZD_TIMEOUT_NONE (0)
    or less, and for a timeout too long to count in ns (about 290 years).
    The caller passes its clock's now: rpc/ reads zd__net_now_ns(), which
    the fuzz targets replace. */
static inline int64_t zd__deadline_after(int64_t now_ns, int64_t timeout_ms)
{
    if (timeout_ms <= 0 || timeout_ms > (ZD__NEVER - now_ns) / ZD__NS_PER_MS)
        return ZD__NEVER;
    return now_ns + timeout_ms * ZD__NS_PER_MS;
}

/*  Milliseconds from now_ns until deadline_ns, rounded up (a wait that
    ends then does not wake a little early), 0 once past it; -1 for
    ZD__NEVER (poll's and ZeroMQ's "no limit"). */
static inline int64_t zd__ms_left(int64_t now_ns, int64_t deadline_ns)
{
    if (deadline_ns == ZD__NEVER)
        return -1;
    int64_t left = deadline_ns - now_ns;
    return left <= 0 ? 0 : (left + ZD__NS_PER_MS - 1) / ZD__NS_PER_MS;
}

/*  The instant ms (>= 0) from now on clock, as a timespec, for
    pthread_cond_timedwait on a condition variable that waits on that
    clock (CLOCK_MONOTONIC set with pthread_condattr_setclock, or the
    default CLOCK_REALTIME: zd__realtime_in). */
static inline struct timespec zd__timespec_in(clockid_t clock, int64_t ms)
{
    struct timespec t;
    clock_gettime(clock, &t);
    t.tv_sec += (time_t)(ms / ZD__MS_PER_S);
    t.tv_nsec += (long)((ms % ZD__MS_PER_S) * ZD__NS_PER_MS);
    if (t.tv_nsec >= ZD__NS_PER_S) {
        t.tv_sec++;
        t.tv_nsec -= ZD__NS_PER_S;
    }
    return t;
}

/*  The realtime clock ms from now, for pthread_cond_timedwait on a
    condition variable that keeps the default clock. */
static inline struct timespec zd__realtime_in(int64_t ms)
{
    return zd__timespec_in(CLOCK_REALTIME, ms);
}

#endif
