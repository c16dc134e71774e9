/* SPDX-License-Identifier: MIT */
/*  shutdown.c: graceful shutdown.

    Rounds of a barrier hosted by rank 0, each carrying every process's
    count of outstanding work (its calls in flight, the calls it is serving,
    its RRef messages in flight): round 0 returns once every worker has
    called zd_rpc_shutdown; the rounds repeat until one sums to zero, so that
    nobody closes while anybody may still send to it (the same loop as
    PyTorch's agent join). Before each later round a process waits for its
    own work to drain. Everything is bounded by the shutdown timeout, and rank 0
    fails a round early, naming the missing workers, when one of them has
    lost its connection or the round's time is up. */
#include "rpc/agent/agent.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include "rpc/value/args.h"
#include "rpc/world/membership.h"
#include "rpc/agent/rref.h"

/*  How often rank 0 looks at the open rounds (for members lost meanwhile). */
#define BARRIER_LOOK_NS (20 * ZD__NS_PER_MS)
/*  The longest timeout a barrier round takes, so that the deadline
    arithmetic cannot overflow: a week. */
#define BARRIER_MAX_TIMEOUT_MS (ZD__WEEK_S * ZD__MS_PER_S)
/*  A round ends at 3/4 of its callers' own timeout, so that they get this
    round's error, which names the missing workers: ns per ms of it. */
#define BARRIER_DEADLINE_NS_PER_MS (ZD__NS_PER_MS * 3 / 4)
/*  How often a drain looks whether the work in flight is done. */
#define DRAIN_LOOK_NS (500 * ZD__NS_PER_US)
/*  The longest a drain without a shutdown timeout waits (drain_deadline). */
#define DRAIN_BOUND_MS (10 * 60 * ZD__MS_PER_S)

typedef struct barrier_round {
    int64_t round;
    int arrived;
    int64_t total;
    zd_future_t **waiting; /* per rank: its answer, once arrived */
    int world;
    int64_t deadline_ns; /* INT64_MAX: none */
    struct barrier_round *next;
} barrier_round_t;

static void round_free(barrier_round_t *r)
{
    for (int i = 0; i < r->world; i++)
        zd_future_unref(r->waiting[i]);
    free(r->waiting);
    free(r);
}

/*  Answers every rank, rank 0 last: rank 0 may close as soon as it has its
    answer, so the others' must be on their way first. */
static void round_answer(barrier_round_t *r, zd_value_t *v, const char *error)
{
    for (int i = r->world - 1; i >= 0; i--) {
        if (!r->waiting[i])
            continue;
        if (v)
            zd_future_set_value(r->waiting[i], v);
        else
            zd_future_set_error(r->waiting[i], "%s", error);
    }
}

/*  Names the workers that have not arrived, for an error text. */
static void missing_text(agent_t *a, const barrier_round_t *r, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < a->net.world && n + 64 < size; i++)
        if (!r->waiting[i])
            n += (size_t)snprintf(buf + n, size - n, "%s\"%s\" (rank %d)%s", n ? ", " : "",
                                  a->net.peers[i].name, i,
                                  atomic_load(&a->net.peers[i].lost) ? " unreachable" : "");
}

/*  Missing workers the round still waits for: from round 0 on, a peer
    declared lost (peer_lost.c) is not waited for (the survivors finish
    without it); init's round -1 waits for everyone. */
static int missing_live(agent_t *a, const barrier_round_t *r)
{
    int n = 0;
    for (int i = 0; i < r->world; i++)
        if (!r->waiting[i] && (r->round < 0 || !atomic_load(&a->net.peers[i].lost_at_ns)))
            n++;
    return n;
}

/*  Under barrier_lock: whether rank src may enter round with count: only
    its own rounds, in order (-1, 0, 1, ...: the one it is in again, or the
    next), with a count that is not negative. The first time a rank is seen
    it must be at init's round -1 or, for a world that started before this
    check was made, any round. */
static bool entry_ok(agent_t *a, int src, int64_t round, int64_t count, int64_t timeout_ms,
                     barrier_round_t *open)
{
    if (count < 0 || round < -1 || timeout_ms < 0)
        return zd_error_set("shutdown barrier: rank %d sent round %" PRId64 ", count %" PRId64
                            ", timeout %" PRId64 " ms",
                            src, round, count, timeout_ms),
               false;
    if (!a->barrier_last) {
        a->barrier_last = malloc((size_t)a->net.world * sizeof *a->barrier_last);
        if (!a->barrier_last)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "shutdown barrier: out of memory"), false;
        /* A restarted rank 0's members passed their init round long ago. */
        for (int i = 0; i < a->net.world; i++)
            a->barrier_last[i] = a->net.rejoined ? -1 : -2;
    }
    int64_t last = a->barrier_last[src];
    if (round == last + 1 || (round == last && open && !open->waiting[src])) {
        a->barrier_last[src] = round;
        return true;
    }
    if (round == last && open)
        return true; /* the same rank again in its open round: the same answer */
    return zd_error_set("shutdown barrier: rank %d asked for round %" PRId64
                        " after round %" PRId64,
                        src, round, last),
           false;
}

/*  Under barrier_lock: whether src asks again for the round completed last,
    which it had entered: a caller whose connection to rank 0 went down and
    came back before the answer reached it (zd__barrier_all asks again). */
static bool repeated(agent_t *a, int src, int64_t round)
{
    return a->barrier_done && round == a->barrier_done_round && a->barrier_last &&
        a->barrier_last[src] == round;
}

/*  Under barrier_lock: remembers the round completed last, for repeated(). */
static void round_done(agent_t *a, const barrier_round_t *r)
{
    a->barrier_done = true;
    a->barrier_done_round = r->round;
    a->barrier_done_total = r->total;
}

/*  Names the lost workers a round went on without, for the log. */
static void log_without(agent_t *a, const barrier_round_t *r)
{
    for (int i = 0; i < r->world; i++)
        if (!r->waiting[i])
            zd__log(ZD_LOG_WARN,
                    "rpc: shutdown barrier round %" PRId64 ": going on without "
                    "\"%s\" (rank %d), lost",
                    r->round, a->net.peers[i].name, i);
}

zd_future_t *zd__shutdown_barrier_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    agent_t *a = zd__agent_acquire();
    if (!a)
        return NULL;
    int64_t round, count;
    int src = zd_rpc_call_caller_rank(call);
    zd_future_t *f = NULL;
    if (a->net.rank != 0) {
        zd_error_set("shutdown barrier: rank %d is not the host", a->net.rank);
        goto out;
    }
    int64_t timeout_ms;
    if (zd_rpc_arg_int(args, 0, &round) < 0 || zd_rpc_arg_int(args, 1, &count) < 0 ||
        zd_rpc_arg_int(args, 2, &timeout_ms) < 0)
        goto out;
    if (timeout_ms > BARRIER_MAX_TIMEOUT_MS)
        timeout_ms = BARRIER_MAX_TIMEOUT_MS;
    pthread_mutex_lock(&a->barrier_lock);
    barrier_round_t *r = a->barrier;
    while (r && r->round != round)
        r = r->next;
    if (!r && repeated(a, src, round)) { /* its answer was lost on the way */
        int64_t total = a->barrier_done_total;
        pthread_mutex_unlock(&a->barrier_lock);
        f = zd_future_new();
        zd_value_t *v = zd_value_int(total);
        if (f && v)
            zd_future_set_value(f, v);
        else if (f) /* never leave the caller a future nobody completes */
            zd_future_set_error_code(f, ZD_ERR_NO_MEMORY, "shutdown barrier: out of memory");
        zd_value_unref(v);
        goto out;
    }
    if (!entry_ok(a, src, round, count, timeout_ms, r)) {
        pthread_mutex_unlock(&a->barrier_lock);
        goto out;
    }
    if (!r) {
        r = calloc(1, sizeof *r);
        if (r)
            r->waiting = calloc((size_t)a->net.world, sizeof *r->waiting);
        if (!r || !r->waiting) {
            free(r);
            pthread_mutex_unlock(&a->barrier_lock);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "shutdown barrier: out of memory");
            goto out;
        }
        r->world = a->net.world;
        r->round = round;
        r->deadline_ns =
            timeout_ms > 0 ? zd__net_now_ns() + timeout_ms * BARRIER_DEADLINE_NS_PER_MS : ZD__NEVER;
        r->next = a->barrier;
        a->barrier = r;
        zd__io_due(&a->net, zd__net_now_ns() + BARRIER_LOOK_NS);
    }
    if (!r->waiting[src]) {
        r->waiting[src] = zd_future_new();
        if (!r->waiting[src]) {
            pthread_mutex_unlock(&a->barrier_lock);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "shutdown barrier: out of memory");
            goto out;
        }
        r->arrived++;
        r->total += count;
    }
    f = zd_future_ref(r->waiting[src]);
    bool complete = missing_live(a, r) == 0;
    int64_t total = r->total;
    if (complete) {
        barrier_round_t **pp = &a->barrier;
        while (*pp != r)
            pp = &(*pp)->next;
        *pp = r->next;
        round_done(a, r);
    }
    pthread_mutex_unlock(&a->barrier_lock);
    if (complete) {
        if (round == 0)
            atomic_store(&a->ending, true); /* before anyone hears it: membership.c */
        if (r->arrived < a->net.world)
            log_without(a, r);
        zd_value_t *v = zd_value_int(total);
        round_answer(r, v, "out of memory");
        zd_value_unref(v);
        round_free(r);
    }
out:
    zd__agent_release(a);
    return f;
}

/*  I/O thread: whether a peer missing from init's round has had its
    connection down for INIT_DOWN_MS: on a host crowded past its cores a
    handshake may time out and the connection come back seconds later. */
#define INIT_DOWN_MS 10000

static bool down_for_good(const peer_t *p, int64_t now_ns)
{
    return atomic_load(&p->lost) && p->down_since_ns &&
        now_ns - p->down_since_ns >= INIT_DOWN_MS * ZD__NS_PER_MS;
}

/*  Rank 0, I/O thread: fails rounds that cannot complete any more. */
int64_t zd__shutdown_tick(agent_t *a, int64_t now_ns)
{
    if (a->net.rank != 0)
        return INT64_MAX;
    barrier_round_t *failed = NULL, *done = NULL;
    pthread_mutex_lock(&a->barrier_lock);
    barrier_round_t **pp = &a->barrier;
    while (*pp) {
        barrier_round_t *r = *pp;
        if (missing_live(a, r) == 0) { /* the rest were lost while it waited */
            round_done(a, r);
            *pp = r->next;
            r->next = done;
            done = r;
            continue;
        }
        /* Early only when everyone still reachable is here: the living
           keep their barrier among themselves until the timeout. From
           round 0 on, a peer whose connection just went down is waited
           for: within the grace of io.c it is declared lost (and the round
           completes without it) or it is back. */
        bool lost = false, waiting_for_living = false;
        for (int i = 0; i < a->net.world; i++)
            if (!r->waiting[i]) {
                if (r->round < 0 && down_for_good(&a->net.peers[i], now_ns))
                    lost = true;
                else
                    waiting_for_living = true;
            }
        if ((lost && !waiting_for_living) || now_ns >= r->deadline_ns) {
            *pp = r->next;
            r->next = failed;
            failed = r;
        } else {
            pp = &r->next;
        }
    }
    int64_t look_at = a->barrier ? now_ns + BARRIER_LOOK_NS : INT64_MAX;
    pthread_mutex_unlock(&a->barrier_lock);
    while (done) {
        barrier_round_t *next = done->next;
        if (done->round == 0)
            atomic_store(&a->ending, true);
        log_without(a, done);
        zd_value_t *v = zd_value_int(done->total);
        round_answer(done, v, "out of memory");
        zd_value_unref(v);
        round_free(done);
        done = next;
    }
    while (failed) {
        barrier_round_t *next = failed->next;
        char missing[1024], text[1200];
        missing_text(a, failed, missing, sizeof missing);
        snprintf(text, sizeof text, "shutdown barrier: %d of %d workers arrived; missing %s",
                 failed->arrived, a->net.world, missing);
        round_answer(failed, NULL, text);
        round_free(failed);
        failed = next;
    }
    return look_at;
}

/*  Teardown: whoever still waits at a barrier gets an error. */
void zd__shutdown_abort_barrier(agent_t *a)
{
    pthread_mutex_lock(&a->barrier_lock);
    barrier_round_t *r = a->barrier;
    a->barrier = NULL;
    pthread_mutex_unlock(&a->barrier_lock);
    while (r) {
        barrier_round_t *next = r->next;
        round_answer(r, NULL, "shutdown barrier: rank 0 shut down");
        round_free(r);
        r = next;
    }
}

/*  Calls being served for a lost peer do not count: nobody waits for
    their answers. */
static int64_t outstanding(agent_t *a)
{
    int64_t n = atomic_load(&a->user_in_flight) + zd__rref_outstanding(a);
    for (int i = 0; i < a->net.world; i++)
        if (!atomic_load(&a->net.peers[i].lost_at_ns))
            n += atomic_load(&a->net.peers[i].m.serving);
    return n;
}

/*  Waits until this process's own work is done, or the deadline. */
static int drain_local(agent_t *a, int64_t deadline_ns)
{
    while (outstanding(a) > 0) {
        if (zd__net_now_ns() >= deadline_ns) {
            return zd_error_set_code(
                ZD_ERR_TIMEOUT,
                "%" PRId64 " calls in flight, %" PRId64 " being served, %" PRId64
                " RRef messages outstanding at the deadline",
                (int64_t)atomic_load(&a->user_in_flight),
                outstanding(a) - atomic_load(&a->user_in_flight) - zd__rref_outstanding(a),
                zd__rref_outstanding(a));
        }
        struct timespec ts = {0, DRAIN_LOOK_NS};
        nanosleep(&ts, NULL);
    }
    return 0;
}

int zd__barrier_all(int64_t round, int64_t count, int64_t deadline_ns, const char *api,
                    int64_t *sum)
{
    /* 0 asks rank 0 to wait without limit */
    int64_t left = deadline_ns == ZD__NEVER ? 0 : zd__ms_left(zd__net_now_ns(), deadline_ns);
    if (deadline_ns != ZD__NEVER && left < 1)
        left = 1;
    zd_value_t *args = zd__rpc_args("iii", round, count, left);
    call_req_t req = {.type = RPC_MSG_CALL,
                      .fn = "__zd_barrier",
                      .api = api,
                      .args = args,
                      .timeout_ms = left,
                      .hooked = false};
    zd_value_t *total = NULL;
    int rc = args ? zd__call_sync(&req, 0, &total) : -1;
    /* A connection to rank 0 that went down and came back took the call
       with it, or refused it while down (io.c): ask again, which rank 0
       answers alike (see join_round), until it is declared lost or the
       deadline passes. */
    while (rc < 0 && args && zd_error_code() == ZD_ERR_PEER && !zd_rpc_peer_is_lost(0) &&
           zd__net_now_ns() < deadline_ns) {
        struct timespec ts = {0, 20 * ZD__NS_PER_MS};
        nanosleep(&ts, NULL);
        rc = zd__call_sync(&req, 0, &total);
    }
    zd_value_unref(args);
    if (rc == 0 && zd_value_get_int(total, sum) < 0)
        rc = -1;
    zd_value_unref(total);
    return rc;
}

/*  The deadline of one drain: the shutdown's, but never unbounded. Without
    a shutdown timeout, work that outlives twice the call timeout (10 min
    when calls have none) is stuck, not slow: a handler waiting for
    something that will never come. */
static int64_t drain_deadline(agent_t *a, int64_t deadline)
{
    int64_t call = atomic_load(&a->timeout_ms);
    int64_t bound_ms = call > 0 && call < DRAIN_BOUND_MS / 2 ? 2 * call : DRAIN_BOUND_MS;
    int64_t bound = zd__deadline_after(zd__net_now_ns(), bound_ms);
    return bound < deadline ? bound : deadline;
}

int zd__shutdown_graceful(agent_t *a, int64_t timeout_ms)
{
    /* Default: no limit, like PyTorch's rpc.shutdown(). */
    int64_t t = timeout_ms > 0 ? timeout_ms : 0;
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), t);
    /* Round 0: everyone has called zd_rpc_shutdown. Then drain and repeat
       until a round finds no work anywhere. */
    for (int64_t round = 0;; round++) {
        int64_t sum = -1;
        if ((round > 0 && drain_local(a, drain_deadline(a, deadline)) < 0) ||
            zd__barrier_all(round, outstanding(a), deadline, "zd_rpc_shutdown", &sum) < 0)
            return zd_error_wrap("zd_rpc_shutdown of \"%s\" (rank %d)", a->name, a->net.rank);
        /* Once every live member is leaving, nobody joins any more: rank
           0's rendezvous port is free again before anyone has left, for a
           next world's (a process may init again). Until then a process
           restarted under a lost rank may still come back (a server waits
           in zd_rpc_shutdown while its trainers train). */
        if (round == 0)
            zd__membership_stop(a->mb);
        if (sum == 0)
            return 0;
    }
}
