/* SPDX-License-Identifier: MIT */
/*  membership.c: a process restarted under the rank and name of a lost
    peer joins the running world (dynamic membership).

    Rank 0 keeps its rendezvous socket for the life of the world, and a
    thread answers it: a restarted process registers there as at the
    start. Rank 0 makes its own sockets to it anew, has every other live
    member do the same ("__zd_member"), and only then answers with the
    table, marked as a running world's: the new process skips the init
    barrier, and its first messages find every member ready for its new
    endpoint and key. While the old process's connection is still up at
    rank 0 (it may be frozen rather than dead), the answer is "not yet",
    and the new process asks again until its init timeout.

    Rank 0 itself has nobody to tell: when it is lost, the members that
    were given master_wait_ms register with master_addr:master_port again,
    marked as running members, until a restarted rank 0 answers (the
    client of init's rendezvous, register.c). A rank 0
    that gets such registrations knows it restarted: it forms the world
    from those that come (the ranks every member lost are left out), and
    the members point their sockets at it.

    A process joining the running world needs rank 0 to answer, not every
    member: one that does not answer in time (down, or restarting itself
    and not told of the newcomer yet) is lost to the newcomer until the
    connection to it comes up or rank 0 announces it again. A member that
    did not acknowledge an announcement is told again, every RETELL_MS,
    until it does, or either of the two is lost: the newcomer reaches it
    only once it has taken the newcomer's key.

    What the old process held was released when it was declared lost
    (peer_lost.c): a renewal waits for that release to finish, so that
    nothing of the new process is taken for the old one's. Sockets belong
    to the I/O thread, which makes them anew (io_renew, its n->io_renew);
    zd_rpc_sync's per-thread sockets notice the new incarnation when next
    used (direct.c).

    It takes the net and a membership_t of its own, not the agent: what it
    changes or uses there (the count of lost peers, rank 0's shutdown
    rounds, the pool, the calls it makes) it reaches through the hooks the
    agent passes in (zd__membership_up_t). The handlers and the public
    functions reach the running agent's net through worker_info.c's hooks,
    and the membership from there: it is the arg of its own hooks on the
    net (mb_of). */
#define _GNU_SOURCE /* pthread_timedjoin_np: a bounded join at shutdown */
#include "rpc/world/membership.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/value/args.h"
#include "rpc/world/rendezvous.h"
#include "rpc/world/worker_info.h"
#include "rpc/net/security.h"
#include "rpc/net/shm.h"

#define RENEW_WAIT_MS  10000 /* a renewal: the release before, the I/O thread */
#define NOTIFY_WAIT_MS 5000  /* rank 0: the members' acknowledgements */
#define DESK_POLL_MS   200   /* how often the thread looks at its stop flag */
#define RETELL_MS      1000  /* rank 0: an announcement a member did not take */

struct membership {
    zd__net_t *n;
    zd__membership_up_t up;            /* the way up into the agent */
    const zd__peer_lost_up_t *lost_up; /* the agent's, for zd__peer_declare_lost */
    int64_t master_wait_ms; /* see init_params_t: 0 = do not wait, INT64_MAX = no limit */
    char master[256];
    int port;
    void *desk; /* rank 0: the rendezvous ROUTER */
    char bound[RDV_MAX_BINDS][ZD_RPC_MAX_ENDPOINT + 1];
    char bound_ip[RDV_MAX_BINDS][ZD_ADDR_MAX];
    int n_bound;

    pthread_t thread;
    bool started;
    bool abandoned; /* its thread did not stop: nothing is freed */
    atomic_bool stop;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* master lost, a renewal done, stop */
    bool master_lost;

    /* Rank 0's desk thread: owed[i * world + r], member i has not taken
       rank r's return yet; retell[] the announcements being made again;
       told[r], how many returns of rank r it announced. */
    bool *owed;
    zd_future_t **retell;
    int64_t retell_at;
    int64_t *told;
    /* The others: seen[r], the last of rank r's returns taken (under
       serial), so that an announcement made again, or late, changes
       nothing. */
    int64_t *seen;

    pthread_mutex_t serial; /* one renewal at a time */
    int renew_rank;
    char renew_ep[ZD_RPC_MAX_ENDPOINT + 1];
    char renew_key[SECURITY_KEY_TXT];
    bool renew_done;
    int renew_rc;
    char renew_error[256];
};

static bool io_renew(void *arg);
static void io_reached(void *arg, int rank);
static void join_unreached(void *arg, int rank);

/*  The membership of the running agent's net: the arg of its own hooks
    there (zd__membership_new), NULL before it is made or once freed. */
static membership_t *mb_of(const zd__net_t *n)
{
    return n->io_renew_arg;
}

membership_t *zd__membership_new(zd__net_t *n, const zd__membership_up_t *up,
                                 const zd__peer_lost_up_t *lost_up, int64_t master_wait_ms,
                                 const char *master, int port)
{
    membership_t *mb = calloc(1, sizeof *mb);
    if (!mb) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    mb->told = calloc((size_t)n->world, sizeof *mb->told);
    mb->seen = calloc((size_t)n->world, sizeof *mb->seen);
    if (!mb->told || !mb->seen) {
        free(mb->told);
        free(mb->seen);
        free(mb);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    mb->n = n;
    mb->up = *up;
    mb->lost_up = lost_up;
    mb->master_wait_ms = master_wait_ms;
    snprintf(mb->master, sizeof mb->master, "%s", master ? master : "");
    mb->port = port;
    pthread_mutex_init(&mb->lock, NULL);
    pthread_cond_init(&mb->cond, NULL);
    pthread_mutex_init(&mb->serial, NULL);
    n->io_renew_arg = mb;
    n->io_renew = io_renew;
    n->io_reached_arg = mb;
    n->io_reached = io_reached;
    n->join_unreached = join_unreached;
    return mb;
}

void zd__membership_keep_desk(membership_t *mb, void *sock, char bound[][ZD_RPC_MAX_ENDPOINT + 1],
                              char bound_ip[][ZD_ADDR_MAX], int n_bound)
{
    mb->desk = sock;
    mb->n_bound = n_bound < RDV_MAX_BINDS ? n_bound : RDV_MAX_BINDS;
    for (int k = 0; k < mb->n_bound; k++) {
        snprintf(mb->bound[k], sizeof mb->bound[k], "%s", bound[k]);
        snprintf(mb->bound_ip[k], sizeof mb->bound_ip[k], "%s", bound_ip[k]);
    }
}

void zd__membership_mark_lost(membership_t *mb, int rank)
{
    peer_t *p = &mb->n->peers[rank];
    int64_t expected = 0;
    if (atomic_load(&p->lost_at_ns))
        return;
    atomic_fetch_add(&p->losses, 1);
    if (atomic_compare_exchange_strong(&p->lost_at_ns, &expected, zd__net_now_ns())) {
        atomic_store(&p->lost, true);
        mb->up.count_lost(mb->up.arg, 1);
    }
}

void zd__membership_mark_unreached(membership_t *mb, int rank)
{
    peer_t *p = &mb->n->peers[rank];
    atomic_store(&p->unreached, true);
    zd__membership_mark_lost(mb, rank);
    zd__log(ZD_LOG_WARN,
            "rpc: \"%s\" (rank %d) at %s did not answer within %d ms of this "
            "process joining the running world: lost until its connection comes up or it "
            "rejoins",
            p->name, rank, p->endpoint, JOIN_PEER_WAIT_MS);
}

/*  zd__transport_connect's hook (n->join_unreached). */
static void join_unreached(void *arg, int rank)
{
    zd__membership_mark_unreached(arg, rank);
}

/*  Rank counts again: alive, and (on rank 0) in the shutdown rounds after
    its (skipped) init round. */
static void count_again(membership_t *mb, int rank)
{
    peer_t *p = &mb->n->peers[rank];
    /* lost_at_ns before unreached: in between, zd__peer_gone() must not see a
       peer lost for good. */
    atomic_store(&p->lost, false);
    if (atomic_exchange(&p->lost_at_ns, 0))
        mb->up.count_lost(mb->up.arg, -1);
    atomic_store(&p->unreached, false);
    if (mb->n->rank == 0)
        mb->up.back_in_rounds(mb->up.arg, rank);
}

/*  The I/O thread's hook (n->io_reached): the connection to rank came up;
    a rank unreached when this process joined the running world is alive. */
static void io_reached(void *arg, int rank)
{
    membership_t *mb = arg;
    zd__net_t *n = mb->n;
    peer_t *p = &n->peers[rank];
    if (!atomic_load(&p->unreached))
        return;
    /* It held nothing here: what it sent while unreached was refused. */
    count_again(mb, rank);
    zd__log(ZD_LOG_WARN, "rpc: \"%s\" (rank %d) answers at %s: no longer lost", p->name, rank,
            p->endpoint);
    zd__shm_offer(n, rank);
}

/*  Rank 0 of a lazily connected world: a loss to tell the members. */
typedef struct {
    membership_t *mb;
    int rank;
    int64_t turn;
} lost_news_t;

/*  On a pool thread (calls are not made from the I/O thread): one message
    to each live member, not waited for. One that does not get it learns of
    the loss when it next calls the lost rank, as before. */
static void tell_lost(void *arg)
{
    lost_news_t *news = arg;
    membership_t *mb = news->mb;
    zd__net_t *n = mb->n;
    for (int i = 1; i < n->world && !atomic_load(&n->closing); i++) {
        if (i == news->rank || atomic_load(&n->peers[i].lost_at_ns))
            continue;
        zd_value_t *args = zd__rpc_args("ii", (int64_t)news->rank, news->turn);
        if (!args)
            break;
        zd_future_unref(mb->up.call(mb->up.arg, i, "__zd_lost", "peer lost", args, NOTIFY_WAIT_MS));
        zd_value_unref(args);
    }
    free(news);
}

void zd__membership_peer_lost(membership_t *mb, int rank)
{
    if (mb && mb->n->rank == 0 && mb->n->lazy) {
        /* The members reach only the peers they called: rank 0, which
           reaches them all, tells them. The number of the lost process's
           return lets a member that took a newer one ignore a late word. */
        lost_news_t *news = malloc(sizeof *news);
        if (news) {
            news->mb = mb;
            news->rank = rank;
            pthread_mutex_lock(&mb->lock);
            news->turn = mb->told[rank];
            pthread_mutex_unlock(&mb->lock);
        }
        if (!news || mb->up.submit(mb->up.arg, tell_lost, free, news) < 0)
            zd__log(ZD_LOG_WARN, "rpc: the members are not told that rank %d was lost", rank);
        return;
    }
    if (!mb || rank != 0)
        return;
    pthread_mutex_lock(&mb->lock);
    mb->master_lost = true;
    pthread_cond_broadcast(&mb->cond);
    pthread_mutex_unlock(&mb->lock);
}

/*  ---- renewing a peer ---- */

/*  Waits (bounded) until what the old process held has been released. */
static bool release_over(const zd__net_t *n, int rank, int64_t deadline)
{
    while (atomic_load(&n->peers[rank].releasing)) {
        if (zd__net_now_ns() >= deadline)
            return false;
        struct timespec ts = {0, ZD__NS_PER_MS};
        nanosleep(&ts, NULL);
    }
    return true;
}

int zd__membership_renew(membership_t *mb, int rank, const char *name, const char *endpoint,
                         const char *key, int64_t turn)
{
    zd__net_t *n = mb->n;
    if (rank < 0 || rank >= n->world || rank == n->rank)
        return zd_error_set("rejoin: rank %d is not a peer", rank);
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), RENEW_WAIT_MS);
    peer_t *p = &n->peers[rank];
    pthread_mutex_lock(&mb->serial);
    if (turn > 0 && turn <= mb->seen[rank]) {
        /* Taken before: rank 0 did not hear it acknowledged (or this is an
           older word, late). */
        pthread_mutex_unlock(&mb->serial);
        return 0;
    }
    /* The old process is gone even if its connection here has not said so
       yet: what it held goes first. */
    if (!atomic_load(&p->lost_at_ns))
        zd__peer_declare_lost(n, mb->lost_up, rank, zd__net_now_ns());
    if (!release_over(n, rank, deadline)) {
        pthread_mutex_unlock(&mb->serial);
        return zd_error_set_code(ZD_ERR_TIMEOUT,
                                 "rejoin of rank %d: what its old process held "
                                 "is still being released after %d s",
                                 rank, (int)(RENEW_WAIT_MS / ZD__MS_PER_S));
    }
    if (name)
        snprintf(n->peers[rank].name, sizeof n->peers[rank].name, "%s", name);
    pthread_mutex_lock(&mb->lock);
    mb->renew_rank = rank;
    snprintf(mb->renew_ep, sizeof mb->renew_ep, "%s", endpoint);
    snprintf(mb->renew_key, sizeof mb->renew_key, "%s", key);
    mb->renew_done = false;
    pthread_mutex_unlock(&mb->lock);
    atomic_store(&n->renew_pending, true);
    uint64_t one = 1;
    if (write(n->wake_fd, &one, sizeof one) < 0) {
        /* the I/O thread's tick finds the flag anyway */
    }
    pthread_mutex_lock(&mb->lock);
    struct timespec until = zd__realtime_in(RENEW_WAIT_MS);
    while (!mb->renew_done && !atomic_load(&mb->stop))
        if (pthread_cond_timedwait(&mb->cond, &mb->lock, &until) == ETIMEDOUT)
            break;
    bool done = mb->renew_done;
    int rc = mb->renew_rc;
    char error[256];
    snprintf(error, sizeof error, "%s", mb->renew_error);
    pthread_mutex_unlock(&mb->lock);
    if (done && rc == 0 && turn > 0)
        mb->seen[rank] = turn;
    pthread_mutex_unlock(&mb->serial);
    if (!done)
        return zd_error_set_code(ZD_ERR_TIMEOUT,
                                 "rejoin of rank %d: the I/O thread did not "
                                 "renew its sockets in time",
                                 rank);
    if (rc < 0)
        return zd_error_set("rejoin of rank %d: %s", rank, error);
    return 0;
}

static void run_joined(void *arg)
{
    int *job = arg;
    zd__net_t *n = zd__world_try_acquire();
    if (n)
        zd__peer_run_joined(n, *job);
    zd__world_release(n);
    free(job);
}

/*  The I/O thread's hook (n->io_renew): carries out a pending renewal; true
    when a peer's sockets changed (the thread polls other sockets now). */
static bool io_renew(void *arg)
{
    membership_t *mb = arg;
    if (!mb)
        return false;
    zd__net_t *n = mb->n;
    if (!atomic_exchange(&n->renew_pending, false))
        return false;
    pthread_mutex_lock(&mb->lock);
    int rank = mb->renew_rank;
    peer_t *p = &n->peers[rank];
    char old_key[SECURITY_KEY_TXT];
    snprintf(old_key, sizeof old_key, "%s", p->key);
    snprintf(p->key, sizeof p->key, "%s", mb->renew_key);
    int rc = zd__security_renew_key(n, rank);
    if (rc == 0) {
        snprintf(p->endpoint, sizeof p->endpoint, "%s", mb->renew_ep);
        zd__shm_peer_reset(rank);
        atomic_fetch_add(&p->incarnation, 1);
        rc = zd__transport_renew_peer(n, p);
    } else {
        snprintf(p->key, sizeof p->key, "%s", old_key);
    }
    if (rc == 0) {
        p->fail_at_ns = 0;
        p->down_since_ns = 0;
        p->remake_at_ns = 0;
        p->reoffer = true;
        /* before calls to it work again: whoever sees it alive sees the
           count that tells it apart from the process that was lost */
        atomic_fetch_add(&p->joins, 1);
        count_again(mb, rank);
    }
    mb->renew_rc = rc;
    snprintf(mb->renew_error, sizeof mb->renew_error, "%s", rc < 0 ? zd_error_last() : "");
    mb->renew_done = true;
    pthread_cond_broadcast(&mb->cond);
    pthread_mutex_unlock(&mb->lock);
    if (rc == 0) {
        zd__log(ZD_LOG_WARN, "rpc: \"%s\" (rank %d) is back, at %s", p->name, rank, p->endpoint);
        int *job = malloc(sizeof *job);
        if (job) {
            *job = rank;
            if (mb->up.submit(mb->up.arg, run_joined, free, job) < 0)
                zd__log(ZD_LOG_WARN, "rpc: the callbacks for rank %d's return did not run", rank);
        }
    }
    return true;
}

/*  ---- rank 0: the desk ---- */

static void reply(void *sock, zframe_t *id, zmsg_t *body)
{
    zframe_t *route = zframe_dup(id);
    zmsg_prepend(body, &route);
    zmsg_send(&body, sock);
    zmsg_destroy(&body);
}

static void reply_text(void *sock, zframe_t *id, const char *tag, const char *text)
{
    zmsg_t *m = zmsg_new();
    zmsg_addstr(m, tag);
    zmsg_addstr(m, text);
    reply(sock, id, m);
}

/*  Rank 0's endpoint for a process at peer (an address): the one it bound
    on the interface that routes there. */
static const char *endpoint_for(membership_t *mb, const char *peer)
{
    char from[ZD_ADDR_MAX];
    if (zd__addr_family(peer) && zd__addr_route_from(peer, from, sizeof from) == 0)
        for (int k = 0; k < mb->n_bound; k++)
            if (!strcmp(mb->bound_ip[k], from))
                return mb->bound[k];
    return mb->bound[0];
}

/*  Announces to member `to` that rank lives at its endpoint, with its key,
    as its return number told[rank]; the call's future, or NULL. */
static zd_future_t *announce(membership_t *mb, int to, int rank)
{
    /* The I/O thread rewrites them under mb->lock (a renewal). */
    pthread_mutex_lock(&mb->lock);
    zd_value_t *args = zd__rpc_args("issi", (int64_t)rank, mb->n->peers[rank].endpoint,
                                    mb->n->peers[rank].key, mb->told[rank]);
    pthread_mutex_unlock(&mb->lock);
    if (!args)
        return NULL;
    zd_future_t *f = mb->up.call(mb->up.arg, to, "__zd_member", "rejoin", args, NOTIFY_WAIT_MS);
    zd_value_unref(args);
    return f;
}

static bool owed_alloc(membership_t *mb)
{
    size_t n = (size_t)mb->n->world * (size_t)mb->n->world;
    if (!mb->owed)
        mb->owed = calloc(n, sizeof *mb->owed);
    if (!mb->retell)
        mb->retell = calloc(n, sizeof *mb->retell);
    return mb->owed && mb->retell;
}

/*  Tells every other live member that rank (its entry in n->peers) came
    back (bounded); those that do not take it are told again later
    (retell). */
static void notify_members(membership_t *mb, int rank)
{
    zd__net_t *n = mb->n;
    int w = n->world;
    zd_future_t **fs = calloc((size_t)w, sizeof *fs);
    if (!fs || !owed_alloc(mb)) {
        free(fs);
        zd__log(ZD_LOG_ERROR, "rpc: rejoin of rank %d: out of memory", rank);
        return;
    }
    /* Its table is the world as it is now: nothing is owed to it. What is
       being told again of its old process no longer counts either. */
    for (int i = 0; i < w; i++) {
        size_t to_it = (size_t)rank * (size_t)w + (size_t)i;
        size_t of_it = (size_t)i * (size_t)w + (size_t)rank;
        mb->owed[to_it] = mb->owed[of_it] = false;
        zd_future_unref(mb->retell[to_it]);
        zd_future_unref(mb->retell[of_it]);
        mb->retell[to_it] = mb->retell[of_it] = NULL;
    }
    for (int i = 1; i < w; i++) {
        if (i != rank && !zd__peer_gone(&n->peers[i]))
            fs[i] = announce(mb, i, rank);
        if (!fs[i] && i != rank && !zd__peer_gone(&n->peers[i]))
            mb->owed[(size_t)i * (size_t)w + (size_t)rank] = true;
    }
    for (int i = 1; i < w; i++) {
        if (!fs[i])
            continue;
        if (zd_future_wait(fs[i], NOTIFY_WAIT_MS) < 0) {
            zd__log(ZD_LOG_WARN,
                    "rpc: rejoin of rank %d: \"%s\" (rank %d) did not take it: %s "
                    "(told again until it does)",
                    rank, n->peers[i].name, i, zd_error_last());
            mb->owed[(size_t)i * (size_t)w + (size_t)rank] = true;
        }
        zd_future_unref(fs[i]);
    }
    free(fs);
}

/*  Rank 0's desk thread, each pass: tells again the members that did not
    take an announcement (every RETELL_MS), and takes the answers of those
    told again. An announcement is owed while both ranks are alive; one
    lost for good gets it all afresh when it rejoins. */
static void retell(membership_t *mb)
{
    if (!mb->owed)
        return;
    zd__net_t *n = mb->n;
    size_t w = (size_t)n->world;
    bool due = zd__net_now_ns() >= mb->retell_at;
    if (due)
        mb->retell_at = zd__deadline_after(zd__net_now_ns(), RETELL_MS);
    for (size_t k = 0; k < w * w; k++) {
        zd_future_t *f = mb->retell[k];
        if (f && zd_future_done(f)) {
            if (zd_future_error_code(f) == ZD_OK)
                mb->owed[k] = false;
            zd_future_unref(f);
            mb->retell[k] = f = NULL;
        }
        if (!mb->owed[k] || f || !due)
            continue;
        peer_t *to = &n->peers[k / w], *about = &n->peers[k % w];
        if (zd__peer_gone(to) || zd__peer_gone(about)) {
            mb->owed[k] = false;
            continue;
        }
        if (atomic_load(&to->lost_at_ns) || atomic_load(&about->lost_at_ns))
            continue; /* not reached yet */
        mb->retell[k] = announce(mb, (int)(k / w), (int)(k % w));
    }
}

/*  The table for a process that restarted: the world as it is, with the
    ranks gone from it. */
static zmsg_t *running_table(zd__net_t *n, const char *ep0, int joiner)
{
    bool *lost = calloc((size_t)n->world, sizeof *lost);
    if (!lost)
        return NULL;
    for (int i = 0; i < n->world; i++)
        lost[i] = i != joiner && zd__peer_gone(&n->peers[i]);
    char status[RDV_MAX_TEXT];
    zd__rdv_status(lost, n->world, status);
    free(lost);
    /* Ranks whose name this rank 0 never learnt go as empty entries. */
    zmsg_t *t = zd__rendezvous_table(n, ep0, status);
    return t;
}

static void desk_serve(membership_t *mb)
{
    zd__net_t *n = mb->n;
    zmsg_t *m = zmsg_recv(mb->desk);
    if (!m)
        return;
    zframe_t *id = zmsg_pop(m);
    char peer[ZD_ADDR_MAX] = "", why[400], text[700];
    zframe_t *first = zmsg_first(m);
    const char *pa = first ? zframe_meta(first, "Peer-Address") : NULL;
    if (!pa || zd__addr_normalize(pa, peer, sizeof peer) < 0)
        snprintf(peer, sizeof peer, "an unknown address");
    rdv_entry_t r;
    char lost_list[RDV_MAX_TEXT];
    int rc = zd__rdv_parse_registration(m, &r, lost_list, why, sizeof why);
    zmsg_destroy(&m);
    if (!id)
        return;
    if (rc == 0 && !zd__security_key_ok(n, r.key))
        rc = -1, snprintf(why, sizeof why, "a key that does not fit this world");
    else if (rc == 0 && zd__security_registration_refused(n, peer, r.endpoint))
        rc = -1,
        snprintf(why, sizeof why, "\"%s\" (rank %d): %s", r.name, r.rank,
                 zd__security_registration_refused(n, peer, r.endpoint));
    else if (rc == 0 && r.world != n->world)
        rc = -1, snprintf(why, sizeof why, "world size %d, this world's is %d", r.world, n->world);
    else if (rc == 0 && (r.rank == 0 || r.rank >= n->world))
        rc = -1,
        snprintf(why, sizeof why, "rank %d, which is %s", r.rank,
                 r.rank ? "outside the world" : "rank 0's own");
    else if (rc == 0 && n->peers[r.rank].name[0] && strcmp(n->peers[r.rank].name, r.name) != 0)
        rc = -1,
        snprintf(why, sizeof why, "\"%s\" for rank %d, which is \"%s\" in this world", r.name,
                 r.rank, n->peers[r.rank].name);
    for (int i = 0; rc == 0 && i < n->world; i++)
        if (i != r.rank && !strcmp(n->peers[i].name, r.name))
            rc = -1,
            snprintf(why, sizeof why, "\"%s\" for rank %d, the name of rank %d", r.name, r.rank, i);
    if (mb->up.ending(mb->up.arg)) {
        /* The world is leaving: no answer, so that a process of the next
           world on this port (one that init again) says it again there. */
        zframe_destroy(&id);
        return;
    }
    if (rc == 0 && atomic_load(&n->closing))
        rc = -1, snprintf(why, sizeof why, "rank 0 is shutting down");
    if (rc < 0) {
        snprintf(text, sizeof text,
                 "rendezvous: rank 0 (\"%s\") of a running world turned away "
                 "a registration from %s: %s",
                 n->name, peer, why);
        zd__log(ZD_LOG_WARN, "rpc: %s", text);
        reply_text(mb->desk, id, RDV_ERR_TAG, text);
        zframe_destroy(&id);
        return;
    }
    peer_t *p = &n->peers[r.rank];
    const char *ep0 = endpoint_for(mb, peer);
    bool alive = !atomic_load(&p->lost_at_ns);
    if (r.running && n->rejoined && alive && !strcmp(p->endpoint, r.endpoint) &&
        !strcmp(p->key, r.key)) {
        /* A restarted rank 0 formed the world from one registration of
           each member, but a member waiting for it sends one every
           REG_RESEND_MS (register.h), and ZeroMQ delivers those queued
           before this process listened: they come here, already
           answered. */
        zframe_destroy(&id);
        return;
    }
    if (r.running) {
        /* A member that declared this very process lost (it was frozen, or
           cut off): it has released what this process held, and this
           process may release what it holds. That is not a restart, and
           nothing safe can go on from it. */
        snprintf(text, sizeof text,
                 "rendezvous: rank 0 (\"%s\") was not restarted: it is the "
                 "process \"%s\" (rank %d) declared lost (frozen or cut off), which cannot take "
                 "it back",
                 n->name, r.name, r.rank);
        zd__log(ZD_LOG_WARN, "rpc: %s", text);
        reply_text(mb->desk, id, RDV_ERR_TAG, text);
        zframe_destroy(&id);
        return;
    }
    if (alive && !atomic_load(&p->lost)) {
        snprintf(text, sizeof text,
                 "rank %d (\"%s\") is still connected to rank 0: its old "
                 "process may be alive (frozen?) or not noticed gone yet",
                 r.rank, r.name);
        reply_text(mb->desk, id, RDV_BUSY_TAG, text);
        zframe_destroy(&id);
        return;
    }
    /* Counted once the old process is declared lost (by the renewal, if
       not before): the members are told of that loss under its own number. */
    if (zd__membership_renew(mb, r.rank, r.name, r.endpoint, r.key, 0) < 0) {
        snprintf(text, sizeof text,
                 "rendezvous: rank 0 (\"%s\") could not take back \"%s\" "
                 "(rank %d): %s",
                 n->name, r.name, r.rank, zd_error_last());
        zd__log(ZD_LOG_WARN, "rpc: %s", text);
        reply_text(mb->desk, id, RDV_ERR_TAG, text);
        zframe_destroy(&id);
        return;
    }
    pthread_mutex_lock(&mb->lock);
    mb->told[r.rank]++;
    pthread_mutex_unlock(&mb->lock);
    notify_members(mb, r.rank);
    zmsg_t *t = running_table(n, ep0, r.rank);
    if (t)
        reply(mb->desk, id, t);
    zd__log(ZD_LOG_WARN, "rpc: \"%s\" (rank %d) rejoined from %s", r.name, r.rank, peer);
    zframe_destroy(&id);
}

zd_value_t *zd__membership_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    zd__net_t *n = zd__world_acquire();
    if (!n)
        return NULL;
    membership_t *mb = mb_of(n);
    zd_value_t *result = NULL;
    int64_t rank, turn = 0;
    const char *endpoint, *key;
    char ip[ZD_ADDR_MAX];
    int port;
    if (zd_rpc_call_caller_rank(call) != 0) {
        zd_error_set("rejoin: only rank 0 announces restarted processes");
    } else if (zd_rpc_arg_int(args, 0, &rank) < 0 || zd_rpc_arg_string(args, 1, &endpoint) < 0 ||
               zd_rpc_arg_string(args, 2, &key) < 0) {
        zd_error_wrap("rejoin");
    } else if (rank < 1 || rank >= n->world || rank == n->rank) {
        zd_error_set("rejoin: rank %lld is not another member", (long long)rank);
    } else if (zd__addr_parse_endpoint(endpoint, ip, sizeof ip, &port) < 0 ||
               !zd__security_key_ok(n, key)) {
        zd_error_set("rejoin: a bad endpoint or key for rank %lld", (long long)rank);
    } else if (!mb) {
        zd_error_set("rejoin: this process keeps no membership yet");
    } else {
        /* The return's number (retell), which older ranks 0 leave out. */
        if (zd_list_len(args) > 3 && zd_rpc_arg_int(args, 3, &turn) < 0)
            turn = 0;
        mb->up.block_begin();
        int rc = zd__membership_renew(mb, (int)rank, NULL, endpoint, key, turn);
        mb->up.block_end();
        if (rc == 0)
            result = zd_value_none();
    }
    zd__world_release(n);
    return result;
}

zd_value_t *zd__membership_lost_handler(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    zd__net_t *n = zd__world_acquire();
    if (!n)
        return NULL;
    membership_t *mb = mb_of(n);
    zd_value_t *result = NULL;
    int64_t rank, turn;
    if (zd_rpc_call_caller_rank(call) != 0) {
        zd_error_set("peer lost: only rank 0 tells of lost peers");
    } else if (zd_rpc_arg_int(args, 0, &rank) < 0 || zd_rpc_arg_int(args, 1, &turn) < 0) {
        zd_error_wrap("peer lost");
    } else if (rank < 1 || rank >= n->world || rank == n->rank) {
        zd_error_set("peer lost: rank %lld is not another member", (long long)rank);
    } else if (!mb) {
        zd_error_set("peer lost: this process keeps no membership yet");
    } else {
        /* Under serial, against a renewal: a rank whose newer return was
           taken here is not the process rank 0 lost. */
        pthread_mutex_lock(&mb->serial);
        if (turn >= mb->seen[rank] && !atomic_load(&n->peers[rank].lost_at_ns)) {
            zd__log(ZD_LOG_WARN, "rpc: rank 0 reports \"%s\" (rank %d) lost", n->peers[rank].name,
                    (int)rank);
            zd__peer_declare_lost(n, mb->lost_up, (int)rank, zd__net_now_ns());
        }
        pthread_mutex_unlock(&mb->serial);
        result = zd_value_none();
    }
    zd__world_release(n);
    return result;
}

/*  ---- the others: waiting for a restarted rank 0 ---- */

/*  Points the peers whose entries changed at the processes now there. */
static void take_table(membership_t *mb, const rdv_entry_t *t)
{
    zd__net_t *n = mb->n;
    /* Another rank 0 counts the returns from 1 again. */
    pthread_mutex_lock(&mb->serial);
    memset(mb->seen, 0, (size_t)n->world * sizeof *mb->seen);
    pthread_mutex_unlock(&mb->serial);
    for (int i = 0; i < n->world; i++) {
        peer_t *p = &n->peers[i];
        if (i == n->rank || t[i].lost || !t[i].endpoint[0])
            continue;
        bool moved = i == 0 || atomic_load(&p->lost_at_ns) || strcmp(p->endpoint, t[i].endpoint) ||
            strcmp(p->key, t[i].key);
        if (moved && zd__membership_renew(mb, i, NULL, t[i].endpoint, t[i].key, 0) < 0)
            zd__log(ZD_LOG_WARN, "rpc: %s", zd_error_last());
    }
}

/*  A member's registration with a restarted rank 0: marked as running, with
    the ranks this process lost (made anew for each send). */
static zmsg_t *running_registration(void *arg)
{
    zd__net_t *n = arg; /* zd__rendezvous_client's arg */
    bool *lost = calloc((size_t)n->world, sizeof *lost);
    if (!lost)
        return NULL;
    for (int i = 0; i < n->world; i++)
        lost[i] = i != 0 && i != n->rank && atomic_load(&n->peers[i].lost_at_ns);
    char status[RDV_MAX_TEXT];
    zd__rdv_status(lost, n->world, status);
    free(lost);
    return zd__rendezvous_registration(n, status);
}

static void await_master(membership_t *mb)
{
    zd__net_t *n = mb->n;
    bool forever = mb->master_wait_ms == INT64_MAX;
    int64_t deadline =
        forever ? ZD__NEVER : zd__deadline_after(zd__net_now_ns(), mb->master_wait_ms);
    char ep[ZD_RPC_MAX_ENDPOINT + 1];
    if (zd__reg_master_endpoint(mb->master, mb->port, ep, sizeof ep) < 0) {
        zd__log(ZD_LOG_WARN, "rpc: rank 0 is lost and cannot be waited for: %s", zd_error_last());
        return;
    }
    char limit[48] = "without limit";
    if (!forever)
        snprintf(limit, sizeof limit, "up to %lld s",
                 (long long)(mb->master_wait_ms / ZD__MS_PER_S));
    zd__log(ZD_LOG_WARN, "rpc: rank 0 (\"%s\") is lost: waiting %s for it to restart at %s",
            n->peers[0].name, limit, ep);
    rdv_entry_t *table = calloc((size_t)n->world, sizeof *table);
    if (!table) {
        zd__log(ZD_LOG_ERROR, "rpc: rank 0 is lost and cannot be waited for: out of memory");
        return;
    }
    /* Until it answers with a table: an error answer comes from a rank 0
       that is not the new one (the process this one declared lost). */
    reg_client_t c;
    zd__rendezvous_client(n, ep, &c);
    c.registration = running_registration;
    c.deadline = deadline;
    c.stop = &mb->stop;
    c.patient = true;
    bool running;
    if (zd__reg_run(&c, table, &running) == 0) {
        take_table(mb, table);
    } else if (!atomic_load(&mb->stop)) { /* a stop is the shutdown's */
        if (zd__net_now_ns() >= deadline)
            zd__log(ZD_LOG_ERROR, "rpc: rank 0 (\"%s\") did not come back within %lld s",
                    n->peers[0].name, (long long)(mb->master_wait_ms / ZD__MS_PER_S));
        else
            zd__log(ZD_LOG_ERROR, "rpc: rank 0 (\"%s\") cannot be waited for: %s", n->peers[0].name,
                    zd_error_last());
    }
    free(table);
}

/*  ---- the thread ---- */

static void *membership_main(void *arg)
{
    membership_t *mb = arg;
    while (!atomic_load(&mb->stop)) {
        if (mb->desk) {
            zmq_pollitem_t item = {mb->desk, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&item, 1, DESK_POLL_MS) > 0)
                desk_serve(mb);
            retell(mb);
            continue;
        }
        pthread_mutex_lock(&mb->lock);
        while (!mb->master_lost && !atomic_load(&mb->stop)) {
            struct timespec until = zd__realtime_in(DESK_POLL_MS);
            pthread_cond_timedwait(&mb->cond, &mb->lock, &until);
        }
        bool lost = mb->master_lost;
        mb->master_lost = false;
        pthread_mutex_unlock(&mb->lock);
        if (lost && mb->master_wait_ms > 0 && !atomic_load(&mb->stop))
            await_master(mb);
    }
    return NULL;
}

int zd__membership_start(membership_t *mb)
{
    if (pthread_create(&mb->thread, NULL, membership_main, mb) != 0)
        return zd_error_set("cannot start the membership thread");
    mb->started = true;
    return 0;
}

void zd__membership_stop(membership_t *mb)
{
    if (!mb)
        return;
    atomic_store(&mb->stop, true);
    pthread_mutex_lock(&mb->lock);
    pthread_cond_broadcast(&mb->cond);
    pthread_mutex_unlock(&mb->lock);
    if (mb->started) {
        /* Its waits are bounded: a poll, a renewal, the members' answers. */
        struct timespec until = zd__realtime_in(RENEW_WAIT_MS + NOTIFY_WAIT_MS + ZD__MS_PER_S);
        mb->started = false;
        if (pthread_timedjoin_np(mb->thread, NULL, &until) != 0) {
            zd__log(ZD_LOG_ERROR, "rpc: shutdown: the membership thread did not stop");
            pthread_detach(mb->thread);
            mb->abandoned = true; /* left to the process: the thread may still use it */
            return;
        }
    }
    if (mb->desk && !mb->abandoned) {
        zmq_close(mb->desk);
        mb->desk = NULL;
    }
    for (size_t k = 0;
         mb->retell && !mb->abandoned && k < (size_t)mb->n->world * (size_t)mb->n->world; k++) {
        zd_future_unref(mb->retell[k]);
        mb->retell[k] = NULL;
    }
}

void zd__membership_free(membership_t *mb)
{
    if (!mb)
        return;
    zd__membership_stop(mb);
    zd__net_t *n = mb->n;
    n->io_renew = NULL;
    n->io_renew_arg = NULL;
    n->io_reached = NULL;
    n->join_unreached = NULL;
    n->io_reached_arg = NULL;
    if (mb->abandoned)
        return;
    pthread_cond_destroy(&mb->cond);
    pthread_mutex_destroy(&mb->lock);
    pthread_mutex_destroy(&mb->serial);
    free(mb->owed);
    free(mb->retell);
    free(mb->told);
    free(mb->seen);
    free(mb);
}

/*  ---- public ---- */

bool zd_rpc_rejoined(void)
{
    zd__net_t *n = zd__world_try_acquire();
    bool r = n && n->rejoined;
    zd__world_release(n);
    return r;
}

int zd_rpc_peer_joins(int rank)
{
    zd__net_t *n = zd__world_try_acquire();
    int joins = n && rank >= 0 && rank < n->world ? atomic_load(&n->peers[rank].joins) : -1;
    zd__world_release(n);
    return joins;
}

int zd_rpc_wait_peer(int rank, int64_t timeout_ms)
{
    zd__net_t *n = zd__world_acquire();
    if (!n)
        return zd_error_wrap("zd_rpc_wait_peer");
    int rc = 0;
    if (rank < 0 || rank >= n->world) {
        rc = zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_wait_peer: no rank %d in a world of %d",
                               rank, n->world);
        goto out;
    }
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), timeout_ms);
    peer_t *p = &n->peers[rank];
    while (atomic_load(&p->lost_at_ns) || (rank != n->rank && atomic_load(&p->lost))) {
        if (atomic_load(&n->closing)) {
            rc = zd_error_set_code(ZD_ERR_SHUTDOWN, "zd_rpc_wait_peer: RPC shut down");
            goto out;
        }
        if (zd__net_now_ns() >= deadline) {
            char text[256] = "";
            zd__peer_lost(n, rank, text, sizeof text);
            rc = zd_error_set_code(ZD_ERR_TIMEOUT,
                                   "zd_rpc_wait_peer: %s did not come back "
                                   "within %lld ms",
                                   text[0] ? text : "the peer", (long long)timeout_ms);
            goto out;
        }
        /* The state changes on the I/O thread: a short look each time. */
        struct timespec ts = {0, 5 * ZD__NS_PER_MS};
        nanosleep(&ts, NULL);
    }
out:
    zd__world_release(n);
    return rc;
}
