/* SPDX-License-Identifier: MIT */
/*  agent.c: the running agent (who may use it, and when shutdown may free
    it), zd_rpc_init / zd_rpc_shutdown, the hooks, ids and the default
    timeout. Options: world/options.c; worker info: world/worker_info.c;
    busy polling: poll.c. Log lines: zd__log (core/log.c). */
#include "rpc/agent/agent.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/fault_point.h"
#include "core/sized.h"
#include "rpc/net/address.h"
#include "rpc/world/membership.h"
#include "rpc/value/future_hook.h"
#include "rpc/agent/rref.h"
#include "rpc/net/security.h"

/*  The running agent. Users are counted outside the agent so that a thread
    can announce itself before it even reads the pointer. */
static _Atomic(agent_t *) g_agent;
static atomic_int g_users;
static atomic_uint g_gen;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;

agent_t *zd__agent_acquire(void)
{
    atomic_fetch_add(&g_users, 1);
    agent_t *a = atomic_load(&g_agent);
    if (a && !atomic_load(&a->net.closing))
        return a;
    atomic_fetch_sub(&g_users, 1);
    zd_error_set_code(ZD_ERR_NOT_INITIALIZED, ZD__RPC_NOT_RUNNING);
    return NULL;
}

agent_t *zd__agent_try_acquire(void)
{
    atomic_fetch_add(&g_users, 1);
    agent_t *a = atomic_load(&g_agent);
    if (a && !atomic_load(&a->net.closing))
        return a;
    atomic_fetch_sub(&g_users, 1);
    return NULL;
}

agent_t *zd__agent_acquire_gen(unsigned gen)
{
    atomic_fetch_add(&g_users, 1);
    agent_t *a = atomic_load(&g_agent);
    if (a && a->net.gen == gen)
        return a;
    atomic_fetch_sub(&g_users, 1);
    return NULL;
}

void zd__agent_release(agent_t *a)
{
    if (a)
        atomic_fetch_sub(&g_users, 1);
}

uint64_t zd__agent_new_id(agent_t *a)
{
    return zd__net_new_id(&a->net);
}

int64_t zd__agent_timeout(agent_t *a, int64_t timeout_ms)
{
    return timeout_ms < 0 ? a->timeout_ms : timeout_ms;
}

/*  ---- hooks ---- */

static zd_rpc_hooks_t g_hooks;
static bool g_has_hooks;

int zd_rpc_set_hooks(const zd_rpc_hooks_t *hooks)
{
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load(&g_agent)) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_rpc_set_hooks: only while RPC is not running");
    }
    zd_rpc_hooks_t h = zd_rpc_hooks_default();
    if (hooks &&
        zd__sized_read(&h, sizeof h, hooks, ZD__SIZE_THROUGH(zd_rpc_hooks_t, on_peer_lost),
                       "zd_rpc_hooks_t", "zd_rpc_hooks_default()") < 0) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_wrap("zd_rpc_set_hooks");
    }
    g_has_hooks = hooks != NULL;
    g_hooks = h;
    pthread_mutex_unlock(&g_init_lock);
    return 0;
}

/*  ---- the way up from the sockets (net.h's zd__net_up_t) ---- */

/*  What the I/O thread received that is not the net's own. */
static void up_dispatch(void *arg, inmsg_t *m)
{
    agent_t *a = arg;
    switch (m->h.type) {
    case RPC_MSG_REPLY:
    case RPC_MSG_ERROR:
        zd__call_handle_answer(a, &m->h, m->frames, m->n);
        break;
    case RPC_MSG_CALL:
    case RPC_MSG_REMOTE:
    case RPC_MSG_RREF_FETCH:
        zd__serve_request(a, m);
        break;
    default:
        zd__inmsg_release_frames(m);
        zd__rref_handle_control(a, m);
        break;
    }
}

static void up_fail_answer(void *arg, uint64_t id, int src, const char *text, zd_error_code_t code)
{
    zd__call_fail_answer(arg, id, src, text, code);
}

static void up_fail_peer(void *arg, int peer, const char *text, zd_error_code_t code)
{
    zd__call_fail_peer(arg, peer, text, code);
}

static void up_peer_lost(void *arg, int rank, int64_t since_ns)
{
    agent_t *a = arg;
    zd__peer_declare_lost(&a->net, &a->lost_up, rank, since_ns); /* world/peer_lost.c */
}

static int64_t up_expire(void *arg, int64_t now_ns)
{
    return zd__call_expire(arg, now_ns);
}

static int64_t up_tick(void *arg, int64_t now_ns)
{
    int64_t due = zd__rref_tick(arg, now_ns);
    int64_t t = zd__shutdown_tick(arg, now_ns);
    return t < due ? t : due;
}

/*  ---- the way up from a lost peer (world/peer_lost.h's zd__peer_lost_up_t) ---- */

static void lost_fail(void *arg, int rank, const char *text)
{
    agent_t *a = arg;
    atomic_fetch_add(&a->n_lost, 1);
    zd__call_fail_peer(a, rank, text, ZD_ERR_PEER);
    zd__membership_peer_lost(a->mb, rank);
}

static int lost_submit(void *arg, void (*fn)(void *), void (*drop)(void *), void *job)
{
    return zd__pool_submit(((agent_t *)arg)->pool, fn, drop, job);
}

static void lost_release(void *arg, int rank, const char *text, int *cancelled, int64_t *forks,
                         int64_t *freed)
{
    agent_t *a = arg;
    *cancelled = zd__serve_cancel_peer(a, rank, text);
    *forks = zd__rref_release_holder(a, rank, freed);
    if (a->has_hooks && a->hooks.on_peer_lost)
        a->hooks.on_peer_lost(a->hooks.arg, rank);
}

/*  ---- the way up from membership (world/membership.h's zd__membership_up_t)
    and the rendezvous (world/rendezvous_run.h's zd__rendezvous_up_t) ---- */

static void mb_count_lost(void *arg, int delta)
{
    atomic_fetch_add(&((agent_t *)arg)->n_lost, delta);
}

static void mb_back_in_rounds(void *arg, int rank)
{
    agent_t *a = arg;
    pthread_mutex_lock(&a->barrier_lock);
    if (a->barrier_last)
        a->barrier_last[rank] = -1;
    pthread_mutex_unlock(&a->barrier_lock);
}

static bool mb_ending(void *arg)
{
    return atomic_load(&((agent_t *)arg)->ending);
}

static zd_future_t *mb_call(void *arg, int to, const char *fn, const char *api, zd_value_t *args,
                            int64_t timeout_ms)
{
    call_req_t req = {.type = RPC_MSG_CALL,
                      .fn = fn,
                      .api = api,
                      .args = args,
                      .timeout_ms = timeout_ms,
                      .hooked = false};
    return zd__call_start(arg, to, &req);
}

static void rdv_mark_lost(void *arg, int rank)
{
    zd__membership_mark_lost(((agent_t *)arg)->mb, rank);
}

static void rdv_keep_desk(void *arg, void *sock, char bound[][ZD_RPC_MAX_ENDPOINT + 1],
                          char bound_ip[][ZD_ADDR_MAX], int n_bound)
{
    zd__membership_keep_desk(((agent_t *)arg)->mb, sock, bound, bound_ip, n_bound);
}

/*  ---- lifecycle ---- */

static void agent_free(agent_t *a)
{
    if (!a)
        return;
    zd__membership_free(a->mb);
    a->mb = NULL;
    a->net.up = (zd__net_up_t){0}; /* no thread is left to use it */
    if (a->net.peers) {
        for (int i = 0; i < a->net.world; i++) {
            pthread_mutex_destroy(&a->net.peers[i].lock);
            zd__metrics_destroy(&a->net.peers[i].m);
        }
        free(a->net.peers);
    }
    free(a->buckets);
    free(a->barrier_last);
    pthread_mutex_destroy(&a->pending_lock);
    pthread_mutex_destroy(&a->barrier_lock);
    pthread_mutex_destroy(&a->net.router_lock);
    pthread_mutex_destroy(&a->net.sync_lock);
    free(a);
}

static agent_t *agent_new(const init_params_t *p)
{
    agent_t *a = calloc(1, sizeof *a);
    if (!a) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rpc_init: out of memory");
        return NULL;
    }
    snprintf(a->name, sizeof a->name, "%s", p->name);
    a->net.name = a->name;
    a->net.up = (zd__net_up_t){.arg = a,
                               .dispatch = up_dispatch,
                               .fail_answer = up_fail_answer,
                               .fail_peer = up_fail_peer,
                               .peer_lost = up_peer_lost,
                               .expire = up_expire,
                               .tick = up_tick};
    a->lost_up = (zd__peer_lost_up_t){
        .arg = a, .lost = lost_fail, .submit = lost_submit, .release = lost_release};
    a->net.rank = p->rank;
    a->net.world = p->world;
    a->timeout_ms = p->o.rpc_timeout_ms;
    a->n_threads = p->o.num_worker_threads;
    a->net.busy_poll_ns = p->o.busy_poll_us * ZD__NS_PER_US;
    a->net.heartbeat_ms = p->o.heartbeat_ms;
    a->net.gen = atomic_fetch_add(&g_gen, 1) + 1;
    a->net.wake_fd = -1;
    atomic_init(&a->net.next_id, 1);
    pthread_mutex_init(&a->pending_lock, NULL);
    pthread_mutex_init(&a->barrier_lock, NULL);
    pthread_mutex_init(&a->net.router_lock, NULL);
    pthread_mutex_init(&a->net.sync_lock, NULL);
    atomic_init(&a->net.next_slot, 1);
    a->n_buckets = 1024;
    a->buckets = calloc(a->n_buckets, sizeof *a->buckets);
    a->net.peers = calloc((size_t)a->net.world, sizeof *a->net.peers);
    if (!a->buckets || !a->net.peers) {
        free(a->buckets);
        free(a->net.peers);
        a->buckets = NULL;
        a->net.peers = NULL;
        agent_free(a);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rpc_init: out of memory");
        return NULL;
    }
    for (int i = 0; i < a->net.world; i++) {
        a->net.peers[i].rank = i;
        pthread_mutex_init(&a->net.peers[i].lock, NULL);
        zd__metrics_init(&a->net.peers[i].m);
    }
    snprintf(a->net.peers[a->net.rank].name, sizeof a->net.peers[a->net.rank].name, "%s", a->name);
    return a;
}

/*  Stops everything the agent started, in an order where nothing can touch
    what is already gone: no new users, no incoming messages, no pending
    call left waiting, no pool thread, then the sockets. */
/*  Every wait of the teardown is bounded by this; what is still held then
    is logged, and left to the process rather than freed under its users. */
#define TEARDOWN_WAIT_MS 30000

/*  Waits for the threads inside the agent to leave: true, or false (logged,
    naming what may hold them) after TEARDOWN_WAIT_MS. */
static bool wait_users(agent_t *a, const char *stage)
{
    int64_t until = zd__deadline_after(zd__net_now_ns(), TEARDOWN_WAIT_MS);
    while (atomic_load(&g_users) > 0) {
        if (zd__net_now_ns() >= until) {
            zd__log(ZD_LOG_ERROR,
                    "rpc: shutdown (%s): %d thread(s) still inside an RPC call after "
                    "%d s (%lld call(s) pending, %lld being served): going on without them",
                    stage, atomic_load(&g_users), (int)(TEARDOWN_WAIT_MS / ZD__MS_PER_S),
                    (long long)a->n_pending, (long long)atomic_load(&a->serving));
            return false;
        }
        struct timespec ts = {0, 100 * ZD__NS_PER_US};
        nanosleep(&ts, NULL);
    }
    return true;
}

/*  Busy polling lends a core to a waiting thread. With more processes of
    the world on this host than it has cores, every poller takes a core
    that another process needs: a world of 65 processes on 2 cores took
    longer to gather with it. So it is off then, unless it was asked for
    (the option or $ZDIST_BUSY_POLL_US). The peers' endpoints, known after
    the rendezvous, tell which of them run on this host. */
static void busy_poll_fit(agent_t *a, bool by_default)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (!by_default || a->net.busy_poll_ns == 0 || cores < 1 || a->net.world <= cores)
        return;
    char ip[ZD_ADDR_MAX];
    const char *last = NULL; /* ranks come in runs on one host: one look a run */
    bool last_local = false;
    int here = 0, port;
    for (int i = 0; i < a->net.world; i++) {
        const char *ep = a->net.peers[i].endpoint;
        if (i == a->net.rank) {
            here++;
            continue;
        }
        if (!last || !zd__addr_same_host(ep, last)) {
            if (zd__addr_parse_endpoint(ep, ip, sizeof ip, &port) < 0)
                continue;
            last = ep;
            last_local = zd__addr_is_local(ip);
        }
        here += last_local;
    }
    if (here > cores) {
        a->net.busy_poll_ns = 0;
        zd__log(ZD_LOG_DEBUG,
                "rpc: no busy polling: %d processes of the world on this host's "
                "%ld cores",
                here, cores);
    }
}

static void agent_teardown(agent_t *a, bool graceful)
{
    zd__metrics_out_close(a);
    atomic_store(&a->net.closing, true);
    /* Threads waiting in zd_rpc_sync on their own sockets hold the agent: the
       failure of their calls is what releases them. */
    zd__call_fail_peer(a, -1, "RPC shut down", ZD_ERR_SHUTDOWN);
    zd__membership_stop(a->mb); /* before the I/O thread stops: a renewal waits for it */
    wait_users(a, "callers");
    bool io_stopped = zd__transport_stop_io(&a->net, TEARDOWN_WAIT_MS) == 0;
    zd__call_fail_peer(a, -1, "RPC shut down", ZD_ERR_SHUTDOWN);
    bool pool_stopped = !a->pool || zd__pool_destroy(a->pool, TEARDOWN_WAIT_MS) == 0;
    a->pool = NULL;
    zd__call_fail_peer(a, -1, "RPC shut down", ZD_ERR_SHUTDOWN);
    zd__shutdown_abort_barrier(a);
    /* Answers still on their way (they may be sent while closing) finish
       before the sockets go. */
    atomic_store(&g_agent, NULL);
    if (!wait_users(a, "answers") || !io_stopped || !pool_stopped) {
        zd__log(ZD_LOG_ERROR,
                "rpc: shutdown: the agent's sockets and memory stay with the "
                "process: %s still use them",
                !io_stopped         ? "the I/O thread"
                    : !pool_stopped ? "handler threads"
                                    : "threads");
        return;
    }
    zd__rref_ctx_free(a);
    zd__direct_close_all(&a->net);
    zd__transport_close(&a->net, graceful);
    agent_free(a);
}

/*  direct.c's way from an exiting thread to the running agent's sockets,
    and worker_info.c's to its peers' table. */
static zd__net_t *net_acquire(void)
{
    agent_t *a = zd__agent_try_acquire();
    return a ? &a->net : NULL;
}

static void net_release(zd__net_t *n)
{
    zd__agent_release(n ? (agent_t *)((char *)n - offsetof(agent_t, net)) : NULL);
}

/*  A process of a world holds a descriptor per connection, per shared
    segment being opened, per data file; the common soft limit of 1024 is
    one a stranger holding connections to an open port can use up, while
    the hard limit (usually far higher) is the machine's real budget. */
static void raise_fd_limit(void)
{
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
        rlim_t was = r.rlim_cur;
        r.rlim_cur = r.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &r) == 0)
            zd__log(ZD_LOG_DEBUG, "rpc: open files limit raised from %llu to %llu",
                    (unsigned long long)was, (unsigned long long)r.rlim_max);
    }
}

int zd_rpc_init(const char *name, int rank, int world_size, const zd_rpc_options_t *opts)
{
    init_params_t p;
    if (zd__agent_init_params(name, rank, world_size, opts, &p) < 0)
        return -1;
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load(&g_agent)) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_set_code(
            ZD_ERR_ARGUMENT, "zd_rpc_init: RPC is already running (call zd_rpc_shutdown first)");
    }
    zd__fault_reload();
    zd__fault_point(p.rank, "rendezvous"); /* tests only (core/fault_point.h) */
    int64_t deadline = zd__deadline_after(zd__net_now_ns(), p.o.init_timeout_ms);
    raise_fd_limit();
    /* Rank 0 without a listen address binds after the rendezvous, on the
       addresses that route to the workers that registered. */
    char ip[64] = "";
    if (p.listen[0])
        snprintf(ip, sizeof ip, "%s", p.listen);
    else if (p.rank != 0 && zd__agent_listen_ip(p.master, ip, sizeof ip) < 0)
        goto fail;
    agent_t *a = agent_new(&p);
    if (!a)
        goto fail;
    a->hooks = g_hooks;
    a->has_hooks = g_has_hooks;
    char who[ZD_RPC_MAX_NAME + 16];
    snprintf(who, sizeof who, "%s/%d", a->name, a->net.rank);
    zd__log_set_who(who);
    zd__direct_hooks(net_acquire, net_release);
    zd__world_info_hooks(net_acquire, net_release);
    zd__membership_up_t mb_up = {.arg = a,
                                 .count_lost = mb_count_lost,
                                 .back_in_rounds = mb_back_in_rounds,
                                 .ending = mb_ending,
                                 .submit = lost_submit,
                                 .call = mb_call,
                                 .block_begin = zd__pool_block_begin,
                                 .block_end = zd__pool_block_end};
    zd__rendezvous_up_t rdv_up = {.arg = a, .mark_lost = rdv_mark_lost, .keep_desk = rdv_keep_desk};
    if (zd__security_new(&a->net, &p.o, p.master, ip[0] ? ip : NULL) < 0 ||
        zd__transport_bind(&a->net, ip[0] ? ip : NULL) < 0 || zd__rref_ctx_new(a) < 0 ||
        zd__serve_register_internal() < 0 || !(a->pool = zd__pool_new(a->n_threads)) ||
        zd__metrics_out_open(a) < 0 ||
        !(a->mb = zd__membership_new(&a->net, &mb_up, &a->lost_up, p.o.master_wait_ms, p.master,
                                     p.port)) ||
        zd__rendezvous_run(&a->net, p.master, p.port, p.o.init_timeout_ms, &rdv_up) < 0) {
        zd_error_wrap("zd_rpc_init of \"%s\" (rank %d)", a->name, a->net.rank);
        agent_teardown(a, false);
        zd__log_set_who(NULL);
        goto fail;
    }
    zd__value_set_rref_hooks(zd__rref_value_ref_hook, zd__rref_value_unref_hook);
    zd__future_set_wait_hooks(&zd__call_wait_hooks);
    /* Published before the I/O thread starts: peers that finished their
       init may call us already, and handlers may call out. */
    atomic_store(&g_agent, a);
    zd__world_publish_identity(&a->net);
    busy_poll_fit(a, p.busy_poll_default);
    zd__poll_set_busy_ns(a->net.busy_poll_ns);
    /* The init barrier: when zd_rpc_init returns, every peer is connected to
       every other (in a large world: to rank 0, and to the others on first
       use, transport.c) and may be called. A process that joins a running world
       has no barrier to meet: the others passed it long ago. */
    int64_t sum;
    bool joined = zd__transport_connect(&a->net, deadline) == 0 &&
        (a->net.rejoined || zd__barrier_all(-1, 0, deadline, "zd_rpc_init", &sum) == 0);
    atomic_store(&a->net.joined, joined); /* from now on a peer down is lost (io.c) */
    if (!joined || zd__membership_start(a->mb) < 0) {
        zd_error_wrap("zd_rpc_init of \"%s\" (rank %d)", a->name, a->net.rank);
        zd__world_publish_identity(NULL);
        zd__poll_set_busy_ns(0);
        agent_teardown(a, false);
        zd__log_set_who(NULL);
        goto fail;
    }
    zd__metrics_out_start(a);
    zd__log(ZD_LOG_INFO, "rpc: joined the world of %d as rank %d at %s", a->net.world, a->net.rank,
            a->net.peers[a->net.rank].endpoint);
    pthread_mutex_unlock(&g_init_lock);
    return 0;
fail: /* unlocks g_init_lock */
    pthread_mutex_unlock(&g_init_lock);
    return -1;
}

int zd_rpc_shutdown(bool graceful, int64_t timeout_ms)
{
    if (zd__net_thread_role() != ROLE_USER)
        return zd_error_set_code(
            ZD_ERR_ARGUMENT,
            "zd_rpc_shutdown: called on an RPC thread (in a handler or a future "
            "callback), which shutdown has to stop: call it from another thread");
    pthread_mutex_lock(&g_init_lock);
    agent_t *a = atomic_load(&g_agent);
    if (!a || atomic_load(&a->net.closing)) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_set_code(ZD_ERR_NOT_INITIALIZED, "zd_rpc_shutdown: RPC is not running");
    }
    zd__fault_point(a->net.rank, "shutdown"); /* tests only (core/fault_point.h) */
    zd__log(ZD_LOG_INFO, "rpc: shutting down (%s)", graceful ? "graceful" : "not graceful");
    int rc = graceful ? zd__shutdown_graceful(a, timeout_ms) : 0;
    char saved[1024] = "";
    zd_error_code_t code = zd_error_code();
    if (rc < 0)
        snprintf(saved, sizeof saved, "%s", zd_error_last());
    zd__metrics_out_close(a); /* the last line: after the final barrier, while the agent runs */
    zd__world_publish_identity(NULL);
    zd__poll_set_busy_ns(0);
    agent_teardown(a, graceful);
    zd__log(ZD_LOG_INFO, "rpc: shutdown complete");
    zd__log_set_who(NULL);
    pthread_mutex_unlock(&g_init_lock);
    if (rc < 0)
        return zd_error_set_code(code, "%s", saved);
    return 0;
}

bool zd_rpc_is_running(void)
{
    agent_t *a = atomic_load(&g_agent);
    return a && !atomic_load(&a->net.closing);
}

int64_t zd_rpc_get_timeout(void)
{
    agent_t *a = zd__agent_try_acquire();
    int64_t t = a ? atomic_load(&a->timeout_ms) : RPC_TIMEOUT_DEFAULT_MS;
    zd__agent_release(a);
    return t;
}

int zd_rpc_set_timeout(int64_t timeout_ms)
{
    if (timeout_ms < 0)
        timeout_ms = RPC_TIMEOUT_DEFAULT_MS;
    agent_t *a = zd__agent_acquire();
    if (!a)
        return zd_error_wrap("zd_rpc_set_timeout");
    atomic_store(&a->timeout_ms, timeout_ms);
    zd__agent_release(a);
    return 0;
}
