/* SPDX-License-Identifier: MIT */
/*  poll.c: the busy-poll policy of the agent's waiting threads.

    Waking a sleeping thread costs tens of microseconds on a VM whose CPU
    has gone idle, more than most answers take to arrive; a waiter that
    polls keeps its CPU awake, and yielding lets the threads that carry the
    answer (ZeroMQ's I/O threads) run on it at once. Measured: round trip
    150 -> 85 us, and spinning without yielding made it worse than sleeping
    (2 cores). So a thread that waits for a message polls first, for
    zd_rpc_options_t.busy_poll_us, yielding between looks, then sleeps.

    At most one thread of the process polls at a time (zd__poll_begin):
    with more, on two cores, the pollers crowd out the threads that bring
    their answers (64 pipelined calls ran at half speed). Future waiters are
    the exception (zd__poll_future): while calls of this process are
    in flight, the future is most likely completed by one of their answers
    (directly, or through a callback, as zd_dist_autograd_backward's joined
    futures are), which come in through the I/O thread: that thread polls
    too meanwhile (io_poll_waiters); were it asleep, waking it would cost
    what the waiter saves. Such a waiter does not wait for its turn: the
    thread it depends on polls for it anyway. Of several threads waiting
    for futures, one polls; the others sleep at once, as a crowd of pollers
    would take the CPUs from the threads that bring the answers.
    Figures: docs/rpc.md, "Busy polling". */
#include "rpc/net/net.h"

#include "core/clock.h"

#include <sched.h>
#include <unistd.h>

int64_t zd__net_now_ns(void)
{
    return zd__now_ns();
}

static __thread thread_role_t tls_role;

thread_role_t zd__net_thread_role(void)
{
    return tls_role;
}

void zd__net_set_thread_role(thread_role_t role)
{
    tls_role = role;
}

static _Atomic int64_t g_busy_poll_ns;

void zd__poll_set_busy_ns(int64_t ns)
{
    atomic_store(&g_busy_poll_ns, ns);
}

int64_t zd__poll_busy_ns(void)
{
    return atomic_load_explicit(&g_busy_poll_ns, memory_order_relaxed);
}

static atomic_int g_pollers;

int64_t zd__poll_begin(void)
{
    int64_t ns = zd__poll_busy_ns();
    int none = 0;
    if (ns <= 0 || !atomic_compare_exchange_strong(&g_pollers, &none, 1))
        return 0;
    return ns;
}

void zd__poll_end(void)
{
    atomic_store(&g_pollers, 0);
}

static atomic_int g_future_pollers;

bool zd__poll_future(zd__net_t *n, zd_future_t *f, int64_t max_ns, bool calls_in_flight)
{
    int64_t ns = zd__poll_busy_ns();
    if (max_ns < ns)
        ns = max_ns;
    int none = 0;
    if (ns <= 0 || zd_future_done(f) || zd__net_thread_role() == ROLE_IO ||
        !atomic_compare_exchange_strong(&g_future_pollers, &none, 1))
        return zd_future_done(f);
    /* With no call of ours in flight, no answer can come to wake it for.
       Sequentially consistent, against the I/O thread's store to io_asleep
       and load of io_poll_waiters: one of the two sees the other, so it
       either polls already or gets woken. */
    if (calls_in_flight)
        atomic_fetch_add(&n->io_poll_waiters, 1);
    if (calls_in_flight && atomic_load(&n->io_asleep)) {
        uint64_t one = 1;
        if (write(n->wake_fd, &one, sizeof one) < 0) {
            /* cannot be full; at worst the I/O thread polls a tick later */
        }
    }
    int64_t end = zd__net_now_ns() + ns;
    bool ok;
    while (!(ok = zd_future_done(f)) && zd__net_now_ns() < end)
        sched_yield();
    if (calls_in_flight)
        atomic_fetch_sub(&n->io_poll_waiters, 1);
    atomic_store(&g_future_pollers, 0);
    return ok;
}

bool zd__poll_io_wanted(zd__net_t *n)
{
    return atomic_load(&n->io_poll_waiters) > 0;
}
