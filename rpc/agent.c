/*  agent.c: zd_rpc_init / zd_rpc_shutdown, the running agent, worker info. */
#include "rpc/agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sched.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <zdist/error.h>
#include "rpc/future_hook.h"
#include "rpc/rref.h"

/*  The running agent. Users are counted outside the agent so that a thread
    can announce itself before it even reads the pointer. */
static _Atomic(agent_t *) g_agent;
static atomic_int g_users;
static atomic_uint g_gen;
static _Atomic int64_t g_busy_poll_ns;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;

agent_t *zd__agent_acquire(void)
{
    atomic_fetch_add(&g_users, 1);
    agent_t *a = atomic_load(&g_agent);
    if (a && !atomic_load(&a->closing))
        return a;
    atomic_fetch_sub(&g_users, 1);
    zd_error_set_code(ZD_ERR_NOT_INITIALIZED,
                      "RPC is not running (call zd_rpc_init first, and not after zd_rpc_shutdown)");
    return NULL;
}

agent_t *zd__agent_try_acquire(void)
{
    atomic_fetch_add(&g_users, 1);
    agent_t *a = atomic_load(&g_agent);
    if (a && !atomic_load(&a->closing))
        return a;
    atomic_fetch_sub(&g_users, 1);
    return NULL;
}

agent_t *zd__agent_acquire_gen(unsigned gen)
{
    atomic_fetch_add(&g_users, 1);
    agent_t *a = atomic_load(&g_agent);
    if (a && a->gen == gen)
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
    uint64_t n = atomic_fetch_add(&a->next_id, 1) & ((UINT64_C(1) << 48) - 1);
    return (uint64_t)a->rank << 48 | n;
}

int64_t zd__agent_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t zd__agent_busy_poll_ns(void)
{
    return atomic_load_explicit(&g_busy_poll_ns, memory_order_relaxed);
}

static atomic_int g_pollers;

int64_t zd__agent_poll_begin(void)
{
    int64_t ns = zd__agent_busy_poll_ns();
    int none = 0;
    if (ns <= 0 || !atomic_compare_exchange_strong(&g_pollers, &none, 1))
        return 0;
    return ns;
}

void zd__agent_poll_end(void)
{
    atomic_store(&g_pollers, 0);
}

static atomic_int g_future_pollers;

bool zd__agent_poll_future(agent_t *a, zd_future_t *f, int64_t max_ns)
{
    int64_t ns = zd__agent_busy_poll_ns();
    if (max_ns < ns)
        ns = max_ns;
    int none = 0;
    if (ns <= 0 || zd_future_done(f) || zd__transport_thread_role() == ROLE_IO ||
        !atomic_compare_exchange_strong(&g_future_pollers, &none, 1))
        return zd_future_done(f);
    /* With no call of ours in flight, no answer can come to wake it for.
       Sequentially consistent, against the I/O thread's store to io_asleep
       and load of io_poll_waiters: one of the two sees the other, so it
       either polls already or gets woken. */
    bool want_io = atomic_load(&a->user_in_flight) > 0;
    if (want_io)
        atomic_fetch_add(&a->io_poll_waiters, 1);
    if (want_io && atomic_load(&a->io_asleep)) {
        uint64_t one = 1;
        if (write(a->wake_fd, &one, sizeof one) < 0) {
            /* cannot be full; at worst the I/O thread polls a tick later */
        }
    }
    int64_t end = zd__agent_now_ns() + ns;
    bool ok;
    while (!(ok = zd_future_done(f)) && zd__agent_now_ns() < end)
        sched_yield();
    if (want_io)
        atomic_fetch_sub(&a->io_poll_waiters, 1);
    atomic_store(&g_future_pollers, 0);
    return ok;
}

bool zd__agent_io_poll_wanted(agent_t *a)
{
    return atomic_load(&a->io_poll_waiters) > 0;
}

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

int64_t zd__agent_timeout(agent_t *a, int64_t timeout_ms)
{
    return timeout_ms < 0 ? a->timeout_ms : timeout_ms;
}

/* The name of this thread's last zd_rpc_worker lookup that failed, so that
   zd_rpc_sync(zd_rpc_worker("nope"), ...) can say "nope" rather than -1. */
static _Thread_local char t_unknown_name[ZD_RPC_MAX_NAME + 1];

int zd__agent_check_rank(agent_t *a, int rank, const char *api)
{
    if (rank == -1 && t_unknown_name[0])
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no worker called \"%s\" (zd_rpc_worker "
                                 "returned -1)", api, t_unknown_name);
    if (rank < 0 || rank >= a->world)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no worker with rank %d (world size %d)",
                                 api, rank, a->world);
    return 0;
}

/* ---- hooks ---- */

static zd_rpc_hooks_t g_hooks;
static bool g_has_hooks;

int zd_rpc_set_hooks(const zd_rpc_hooks_t *hooks)
{
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load(&g_agent)) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_set_hooks: only while RPC is not running");
    }
    g_has_hooks = hooks != NULL;
    if (hooks)
        g_hooks = *hooks;
    else
        memset(&g_hooks, 0, sizeof g_hooks);
    pthread_mutex_unlock(&g_init_lock);
    return 0;
}

/* ---- options and the environment ---- */

zd_rpc_options_t zd_rpc_options_default(void)
{
    zd_rpc_options_t o = {
        .rpc_timeout_ms = 60000,
        .num_worker_threads = 16,
        .init_timeout_ms = 300000,
        .master_addr = NULL,
        .master_port = 0,
        .listen_addr = NULL,
        .busy_poll_us = -1,
    };
    return o;
}

/* Reads an integer environment variable: 1 when set and valid, 0 when
   unset, -1 (error set) when set to something else. */
static int env_int(const char *var, long lo, long hi, long *out)
{
    const char *s = getenv(var);
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: %s=\"%s\" is not a number in [%ld, %ld]", var, s, lo, hi);
    *out = v;
    return 1;
}

static bool name_ok(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}

/* The IP this process should bind and advertise: the one the kernel would
   use to reach the master (a UDP "connect" sends nothing). */
static int pick_listen_ip(const char *master, int port, char *ip, size_t size)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res;
    int rc = getaddrinfo(master, NULL, &hints, &res);
    if (rc != 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: cannot resolve master address \"%s\": %s", master,
                         gai_strerror(rc));
    struct sockaddr_in to = *(struct sockaddr_in *)res->ai_addr;
    freeaddrinfo(res);
    to.sin_port = htons((uint16_t)port);
    if ((ntohl(to.sin_addr.s_addr) >> 24) == 127 || to.sin_addr.s_addr == INADDR_ANY) {
        snprintf(ip, size, "127.0.0.1");
        return 0;
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in me;
    socklen_t len = sizeof me;
    if (fd < 0 || connect(fd, (struct sockaddr *)&to, sizeof to) < 0 ||
        getsockname(fd, (struct sockaddr *)&me, &len) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: no route to master %s: %s", master, strerror(e));
    }
    close(fd);
    inet_ntop(AF_INET, &me.sin_addr, ip, (socklen_t)size);
    return 0;
}

typedef struct {
    char name[ZD_RPC_MAX_NAME + 1];
    int rank, world;
    zd_rpc_options_t o;
    char master[256];
    int port;
} init_params_t;

static int init_params(const char *name, int rank, int world, const zd_rpc_options_t *opts,
                       init_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->o = opts ? *opts : zd_rpc_options_default();
    long v;
    int rc;
    if (rank < 0) {
        if ((rc = env_int("RANK", 0, RPC_WIRE_MAX_RANK, &v)) < 0)
            return -1;
        if (rc == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: no rank given and RANK is not set");
        rank = (int)v;
    }
    if (world <= 0) {
        if ((rc = env_int("WORLD_SIZE", 1, RPC_WIRE_MAX_RANK + 1, &v)) < 0)
            return -1;
        if (rc == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: no world size given and WORLD_SIZE is not set");
        world = (int)v;
    }
    if (world > RPC_WIRE_MAX_RANK + 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: world size %d (at most %d)", world, RPC_WIRE_MAX_RANK + 1);
    if (rank >= world)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: rank %d is outside the world of size %d", rank, world);
    p->rank = rank;
    p->world = world;
    if (name)
        snprintf(p->name, sizeof p->name, "%s", name);
    else
        snprintf(p->name, sizeof p->name, "worker%d", rank);
    if (!name_ok(name ? name : p->name, ZD_RPC_MAX_NAME))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: bad worker name \"%s\" (1 to %d printable characters, "
                         "no spaces)", name, ZD_RPC_MAX_NAME);
    const char *addr = p->o.master_addr ? p->o.master_addr : getenv("MASTER_ADDR");
    if (!addr || !*addr)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: no master address: set options.master_addr or "
                         "MASTER_ADDR");
    if (strlen(addr) >= sizeof p->master)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: master address too long");
    snprintf(p->master, sizeof p->master, "%s", addr);
    p->port = p->o.master_port;
    if (p->port == 0) {
        if ((rc = env_int("MASTER_PORT", 1, 65535, &v)) < 0)
            return -1;
        if (rc == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: no master port: set options.master_port or "
                             "MASTER_PORT");
        p->port = (int)v;
    }
    if (p->port < 1 || p->port > 65535)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: master port %d is not in [1, 65535]", p->port);
    if (p->o.num_worker_threads < 1 || p->o.num_worker_threads > 1024)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: %d worker threads (1 to 1024)", p->o.num_worker_threads);
    if (p->o.rpc_timeout_ms < 0 || p->o.init_timeout_ms < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: negative timeout");
    if (p->o.busy_poll_us < 0) {
        p->o.busy_poll_us = 100;
        if ((rc = env_int("ZDIST_BUSY_POLL_US", 0, 1000000, &v)) < 0)
            return -1;
        if (rc == 1)
            p->o.busy_poll_us = v;
    }
    if (p->o.busy_poll_us > 1000000)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: busy_poll_us %lld is over 1000000",
                         (long long)p->o.busy_poll_us);
    return 0;
}

static void publish_identity(agent_t *a);

/* ---- lifecycle ---- */

static void agent_free(agent_t *a)
{
    if (!a)
        return;
    if (a->peers) {
        for (int i = 0; i < a->world; i++) {
            pthread_mutex_destroy(&a->peers[i].lock);
            zd__metrics_destroy(&a->peers[i].m);
        }
        free(a->peers);
    }
    free(a->buckets);
    pthread_mutex_destroy(&a->pending_lock);
    pthread_mutex_destroy(&a->barrier_lock);
    pthread_mutex_destroy(&a->router_lock);
    pthread_mutex_destroy(&a->sync_lock);
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
    a->rank = p->rank;
    a->world = p->world;
    a->timeout_ms = p->o.rpc_timeout_ms;
    a->n_threads = p->o.num_worker_threads;
    a->busy_poll_ns = p->o.busy_poll_us * 1000;
    a->gen = atomic_fetch_add(&g_gen, 1) + 1;
    a->wake_fd = -1;
    atomic_init(&a->next_id, 1);
    atomic_init(&a->log_budget, 20);
    pthread_mutex_init(&a->pending_lock, NULL);
    pthread_mutex_init(&a->barrier_lock, NULL);
    pthread_mutex_init(&a->router_lock, NULL);
    pthread_mutex_init(&a->sync_lock, NULL);
    atomic_init(&a->next_slot, 1);
    a->n_buckets = 1024;
    a->buckets = calloc(a->n_buckets, sizeof *a->buckets);
    a->peers = calloc((size_t)a->world, sizeof *a->peers);
    if (!a->buckets || !a->peers) {
        free(a->buckets);
        free(a->peers);
        a->buckets = NULL;
        a->peers = NULL;
        agent_free(a);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_rpc_init: out of memory");
        return NULL;
    }
    for (int i = 0; i < a->world; i++) {
        a->peers[i].rank = i;
        pthread_mutex_init(&a->peers[i].lock, NULL);
        zd__metrics_init(&a->peers[i].m);
    }
    snprintf(a->peers[a->rank].name, sizeof a->peers[a->rank].name, "%s", a->name);
    return a;
}

/* Stops everything the agent started, in an order where nothing can touch
   what is already gone: no new users, no incoming messages, no pending
   call left waiting, no pool thread, then the sockets. */
static void agent_teardown(agent_t *a, bool graceful)
{
    atomic_store(&a->closing, true);
    /* Threads waiting in zd_rpc_sync on their own sockets hold the agent: the
       failure of their calls is what releases them. */
    zd__call_fail_peer(a, -1, "RPC shut down", ZD_ERR_SHUTDOWN);
    while (atomic_load(&g_users) > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    zd__transport_stop_io(a);
    zd__call_fail_peer(a, -1, "RPC shut down", ZD_ERR_SHUTDOWN);
    if (a->pool)
        zd__pool_destroy(a->pool);
    a->pool = NULL;
    zd__call_fail_peer(a, -1, "RPC shut down", ZD_ERR_SHUTDOWN);
    zd__shutdown_abort_barrier(a);
    /* Answers still on their way (they may be sent while closing) finish
       before the sockets go. */
    atomic_store(&g_agent, NULL);
    while (atomic_load(&g_users) > 0) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    zd__rref_ctx_free(a);
    zd__direct_close_all(a);
    zd__transport_close(a, graceful);
    agent_free(a);
}

int zd_rpc_init(const char *name, int rank, int world_size, const zd_rpc_options_t *opts)
{
    init_params_t p;
    if (init_params(name, rank, world_size, opts, &p) < 0)
        return -1;
    pthread_mutex_lock(&g_init_lock);
    if (atomic_load(&g_agent)) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_init: RPC is already running (call zd_rpc_shutdown first)");
    }
    int64_t deadline = p.o.init_timeout_ms
                           ? zd__agent_now_ns() + p.o.init_timeout_ms * 1000000
                           : INT64_MAX;
    char ip[64];
    if (p.o.listen_addr)
        snprintf(ip, sizeof ip, "%s", p.o.listen_addr);
    else if (pick_listen_ip(p.master, p.port, ip, sizeof ip) < 0)
        goto fail_unlocked;
    agent_t *a = agent_new(&p);
    if (!a)
        goto fail_unlocked;
    a->hooks = g_hooks;
    a->has_hooks = g_has_hooks;
    if (zd__transport_bind(a, ip) < 0 || zd__rref_ctx_new(a) < 0 || zd__serve_register_internal() < 0 ||
        !(a->pool = zd__pool_new(a->n_threads)) ||
        zd__rendezvous_run(a, p.master, p.port, p.o.init_timeout_ms) < 0) {
        zd_error_wrap("zd_rpc_init of \"%s\" (rank %d)", a->name, a->rank);
        agent_teardown(a, false);
        goto fail_unlocked;
    }
    zd__value_set_rref_hooks(zd__rref_value_ref_hook, zd__rref_value_unref_hook);
    zd__future_set_wait_hooks(&zd__call_wait_hooks);
    /* Published before the I/O thread starts: peers that finished their
       init may call us already, and handlers may call out. */
    atomic_store(&g_agent, a);
    publish_identity(a);
    /* The init barrier: when zd_rpc_init returns, every peer is connected to
       every other and may be called. */
    int64_t sum;
    if (zd__transport_connect(a, deadline) < 0 ||
        zd__barrier_all(-1, 0, deadline, "zd_rpc_init", &sum) < 0) {
        zd_error_wrap("zd_rpc_init of \"%s\" (rank %d)", a->name, a->rank);
        publish_identity(NULL);
        agent_teardown(a, false);
        goto fail_unlocked;
    }
    pthread_mutex_unlock(&g_init_lock);
    return 0;
fail_unlocked:
    pthread_mutex_unlock(&g_init_lock);
    return -1;
}

int zd_rpc_shutdown(bool graceful, int64_t timeout_ms)
{
    if (zd__transport_thread_role() != ROLE_USER)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_shutdown: called on an RPC thread (in a handler or a future "
                         "callback), which shutdown has to stop: call it from another thread");
    pthread_mutex_lock(&g_init_lock);
    agent_t *a = atomic_load(&g_agent);
    if (!a || atomic_load(&a->closing)) {
        pthread_mutex_unlock(&g_init_lock);
        return zd_error_set_code(ZD_ERR_NOT_INITIALIZED, "zd_rpc_shutdown: RPC is not running");
    }
    int rc = graceful ? zd__shutdown_graceful(a, timeout_ms) : 0;
    char saved[1024] = "";
    zd_error_code_t code = zd_error_code();
    if (rc < 0)
        snprintf(saved, sizeof saved, "%s", zd_error_last());
    publish_identity(NULL);
    agent_teardown(a, graceful);
    pthread_mutex_unlock(&g_init_lock);
    if (rc < 0)
        return zd_error_set_code(code, "%s", saved);
    return 0;
}

bool zd_rpc_is_running(void)
{
    agent_t *a = atomic_load(&g_agent);
    return a && !atomic_load(&a->closing);
}

int64_t zd_rpc_get_timeout(void)
{
    agent_t *a = zd__agent_try_acquire();
    int64_t t = a ? atomic_load(&a->timeout_ms) : zd_rpc_options_default().rpc_timeout_ms;
    zd__agent_release(a);
    return t;
}

int zd_rpc_set_timeout(int64_t timeout_ms)
{
    if (timeout_ms < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_set_timeout: negative timeout %lld "
                                 "(0 means none)", (long long)timeout_ms);
    agent_t *a = zd__agent_acquire();
    if (!a)
        return zd_error_wrap("zd_rpc_set_timeout");
    atomic_store(&a->timeout_ms, timeout_ms);
    zd__agent_release(a);
    return 0;
}

/* ---- worker info ---- */

static void fill_info(const peer_t *p, zd_rpc_worker_info_t *out)
{
    snprintf(out->name, sizeof out->name, "%s", p->name);
    out->rank = p->rank;
    snprintf(out->endpoint, sizeof out->endpoint, "%s", p->endpoint);
}

int zd_rpc_get_worker_info(const char *name, zd_rpc_worker_info_t *out)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    int rc = -1;
    if (!out) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info: NULL output");
    } else if (!name) {
        fill_info(&a->peers[a->rank], out);
        rc = 0;
    } else {
        for (int i = 0; i < a->world; i++)
            if (strcmp(a->peers[i].name, name) == 0) {
                fill_info(&a->peers[i], out);
                rc = 0;
                break;
            }
        if (rc < 0)
            zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info: no worker called \"%s\"",
                              name);
    }
    zd__agent_release(a);
    return rc;
}

int zd_rpc_get_worker_info_by_rank(int rank, zd_rpc_worker_info_t *out)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    int rc = -1;
    if (!out)
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_rpc_get_worker_info_by_rank: NULL output");
    else if (zd__agent_check_rank(a, rank, "zd_rpc_get_worker_info_by_rank") == 0) {
        fill_info(&a->peers[rank], out);
        rc = 0;
    }
    zd__agent_release(a);
    return rc;
}

int zd_rpc_get_worker_infos(zd_rpc_worker_info_t *out, int max)
{
    agent_t *a = zd__agent_acquire();
    if (!a)
        return -1;
    for (int i = 0; out && i < a->world && i < max; i++)
        fill_info(&a->peers[i], &out[i]);
    int n = a->world;
    zd__agent_release(a);
    return n;
}

int zd_rpc_worker(const char *name)
{
    zd_rpc_worker_info_t info;
    if (zd_rpc_get_worker_info(name, &info) < 0) {
        snprintf(t_unknown_name, sizeof t_unknown_name, "%s", name ? name : "(null)");
        return -1;
    }
    t_unknown_name[0] = 0;
    return info.rank;
}

/* Read without taking the agent: these never fail and never set errors. */
static atomic_int g_rank = -1, g_world = -1;
static char g_name[ZD_RPC_MAX_NAME + 1];

static void publish_identity(agent_t *a)
{
    if (a)
        snprintf(g_name, sizeof g_name, "%s", a->name);
    else
        g_name[0] = 0;
    atomic_store(&g_rank, a ? a->rank : -1);
    atomic_store(&g_world, a ? a->world : -1);
    atomic_store(&g_busy_poll_ns, a ? a->busy_poll_ns : 0);
}

int zd_rpc_rank(void)
{
    return atomic_load(&g_rank);
}

int zd_rpc_world_size(void)
{
    return atomic_load(&g_world);
}

const char *zd_rpc_name(void)
{
    return g_name;
}
