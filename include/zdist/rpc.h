/* SPDX-License-Identifier: MIT */
/*  rpc.h: the RPC agent: named workers calling each other's registered
    functions over ZeroMQ, with futures and remote references,
    in the image of torch.distributed.rpc.

    A world is world_size processes with ranks 0..world_size-1 and unique
    names. Each process registers the functions it serves by name
    (zd_rpc_register), then calls zd_rpc_init; rank 0 hosts the rendezvous at
    master_addr:master_port. After init any process may call any other:

        zd_value_t *r;
        if (zd_rpc_sync_take(zd_rpc_worker("ps"), "add", ZD_ARGS(2, 3),
                             ZD_TIMEOUT_DEFAULT, &r) == 0) {
            ...use r...
            zd_value_unref(r);
        }

    served on "ps" by a handler it registered before zd_rpc_init:

        static zd_value_t *add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
        {
            int64_t a, b;   // errors go back to the caller
            return ZD_UNPACK(args, &a, &b) < 0 ? NULL : zd_value_int(a + b);
        }
        zd_rpc_register("add", add, NULL);

    Values (<zdist/value.h>) carry none, ints, floats, strings, bytes,
    tensors (sent and received without copies), RRefs and lists. Arguments
    are one list value: ZD_ARGS(...) builds it from C values, checked by
    the compiler, and ZD_UNPACK(args, &a, &b) takes it apart in a handler.
    The calls below borrow it (the caller still unrefs it); their _take
    variants take it over, so that ZD_ARGS(...) can be written inline.

    Threads. A thread calling zd_rpc_sync sends on a socket of its own and
    reads the answer itself: no hand-off between threads on that path. One
    I/O thread per process receives everything else: requests, answers to
    zd_rpc_async / remote calls (so zd_future_then callbacks of those run on
    it and must not block), RRef messages; it also runs ZD_RPC_FN_INLINE
    handlers. Other handlers run on a pool of num_worker_threads threads.
    Any thread may call any function here. When a pool thread blocks in
    zd_rpc_sync / zd_rref_to_here / zd_future_wait*, the pool starts another thread,
    so nested calls (a handler calling other processes, which call back,
    ...) never deadlock; async handlers (returning a future) do not even
    hold a thread while they wait.

    Timeouts (ms), as everywhere (error.h): ZD_TIMEOUT_DEFAULT (< 0) is the
    function's default, ZD_TIMEOUT_NONE (0) no limit, as in PyTorch. Calls,
    RRef fetches and method calls default to zd_rpc_get_timeout()
    (zd_rpc_options_t.rpc_timeout_ms); zd_rpc_shutdown and the waits on
    futures default to no limit.

    Errors name the peer and the function:
        zd_rpc_sync to "worker1" (rank 1) calling "divide": remote error: ...
    and the process keeps serving. Everything returns 0 / a pointer on
    success and -1 / NULL on failure, with zd_error_last() (<zdist/error.h>)
    saying why and zd_error_code() what kind of failure it was:
    ZD_ERR_TIMEOUT, ZD_ERR_PEER (unreachable or lost), ZD_ERR_REMOTE (the
    handler failed), ZD_ERR_NO_FUNCTION, ZD_ERR_ARGUMENT (bad rank, unknown
    worker name, ...), ZD_ERR_NOT_INITIALIZED (RPC not running, or a peer
    missing a module's init), ZD_ERR_SHUTDOWN, ZD_ERR_NO_MEMORY.

    Design notes, wire format and protocol details: the user's guide,
    "RPC" (rpc.md). */
#ifndef ZDIST_RPC_H
#define ZDIST_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/future.h>
#include <zdist/value.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_RPC_MAX_NAME     127 /* worker names: 1..127 bytes, printable, no spaces */
#define ZD_RPC_MAX_FUNCTION 255 /* function names: 1..255 bytes, printable, no spaces */
#define ZD_RPC_MAX_ENDPOINT 127

/*  ---- init and shutdown ---- */

/*  Durations follow error.h's rule, as function arguments do:
    ZD_TIMEOUT_DEFAULT (< 0) is the default in parentheses, ZD_TIMEOUT_NONE
    (0) no limit, a positive value that many ms (busy_poll_us: us, and 0 =
    never poll). Start from zd_rpc_options_default(), then set fields: it
    sets size, and the library reads only the fields within size. */
typedef struct {
    size_t size;             /* sizeof(zd_rpc_options_t), set by
                                   zd_rpc_options_default() */
    int64_t rpc_timeout_ms;  /* default call timeout (60000); change it
                                   later with zd_rpc_set_timeout */
    int num_worker_threads;  /* pool threads running handlers (16) */
    int64_t init_timeout_ms; /* rendezvous limit (300000) */
    const char *master_addr; /* rendezvous host; NULL: the environment's
                                   (zd_rpc_env_resolve); rank 0 with none at
                                   all listens on every interface */
    int master_port;         /* rendezvous port; 0: the environment's */
    const char *listen_addr; /* IP (v4 or v6) this process binds and advertises;
                                   NULL: $ZDIST_LISTEN_ADDR, else the address that
                                   routes to master_addr (127.0.0.1 when the master
                                   is on this machine; rank 0: those that route to
                                   the workers that registered) */
    int64_t busy_poll_us;    /* a thread waiting for a message polls this long
                                   before it sleeps, in us; 0: never
                                   ($ZDIST_BUSY_POLL_US, else 100, or 0 when
                                   the host has fewer cores than processes
                                   of the world) */
    const char *key_file;    /* the world key (zdist-keygen): every connection is
                                   then authenticated and encrypted (CURVE); NULL:
                                   $ZDIST_KEY_FILE, else ~/.config/zdist/world.key
                                   if it exists, else none (loopback worlds only) */
    bool insecure;           /* run without a key even off loopback (also
                                   ZDIST_INSECURE=1): no authentication, no
                                   encryption (false) */
    int64_t heartbeat_ms;    /* a peer whose connection carries nothing (not even
                                   heartbeats) this long is lost, like a dead one;
                                   ZD_TIMEOUT_NONE: never for silence alone
                                   ($ZDIST_HEARTBEAT_S seconds, else 30000; at
                                   most a day: more is refused) */
    int64_t master_wait_ms;  /* when rank 0 is lost, keep registering with
                                   master_addr:master_port this long, so that a
                                   restarted rank 0 gets the running world back;
                                   ZD_TIMEOUT_NONE: as long as it takes
                                   ($ZDIST_MASTER_WAIT_S seconds, else not at all;
                                   at most 7 days: more is refused) */
} zd_rpc_options_t;

/*  The defaults (PyTorch's, above), with size set: every duration
    ZD_TIMEOUT_DEFAULT, 16 threads, nothing else given. Inline, so that
    size is the one this program was compiled with. Returns the struct. */
static inline zd_rpc_options_t zd_rpc_options_default(void)
{
    zd_rpc_options_t o;
    memset(&o, 0, sizeof o);
    o.size = sizeof o;
    o.rpc_timeout_ms = ZD_TIMEOUT_DEFAULT;
    o.num_worker_threads = 16;
    o.init_timeout_ms = ZD_TIMEOUT_DEFAULT;
    o.busy_poll_us = ZD_TIMEOUT_DEFAULT;
    o.heartbeat_ms = ZD_TIMEOUT_DEFAULT;
    o.master_wait_ms = ZD_TIMEOUT_DEFAULT;
    return o;
}

/*  ---- where a process learns its place: launchers' environments ---- */

/*  A process's rank, world size and rendezvous, as explicit arguments and
    the environment that its launcher set give them (the user's guide,
    launch.md, has the table): an argument beats every variable; RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT (and ZDIST_MASTER_PORT) beat the launchers'
    own; among launchers the innermost wins: torchrun
    (TORCHELASTIC_RUN_ID; rank 0 then binds MASTER_PORT+1, since torchrun's
    agent holds MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*), PMIx
    (PMIX_RANK), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the
    first host of SLURM_STEP_NODELIST, port 10000 + SLURM_JOB_ID % 20000).
    Each *_from names where its value came from: a variable (or
    "NAME/NAME" when two made it), "the arguments", or NULL when nothing
    gave it; all are static strings. An out-struct, as zd_rpc_metrics_t:
    the caller passes its size, since the library fills it whole and reads none of it. */
typedef struct {
    int rank;              /* -1: nothing gave it */
    int world_size;        /* 0: nothing gave it */
    int local_rank;        /* rank among this host's processes; -1: unknown */
    int local_world_size;  /* processes on this host; 0: unknown */
    char master_addr[256]; /* rank 0's host; "": nothing gave it */
    int master_port;       /* the rendezvous port; 0: nothing gave it */
    const char *launcher;  /* "torchrun", "openmpi", "pmix", "slurm", "env" or NULL */
    const char *rank_from, *world_size_from, *local_rank_from, *local_world_size_from,
        *master_addr_from, *master_port_from;
    char summary[512]; /* one line: "rank 2 of 4 from SLURM_PROCID, ..." */
} zd_rpc_env_t;

/*  Fills env from the arguments (rank < 0, world_size <= 0, master_addr
    NULL or "", master_port 0: not given) and the environment, reading only
    the variables it uses. What nothing gives stays unset (see the fields),
    for the caller's defaults or errors. 0, or -1 (ZD_ERR_ARGUMENT) naming
    the variable: a malformed number or host list, a rank outside the world,
    PMIX_RANK without a world size, Open MPI across hosts without
    MASTER_ADDR; a NULL env or a size below the 1.0 struct's. env is a
    struct of size bytes (sizeof *env), written no further than size, and
    left alone on -1: zd_rpc_env_resolve(-1, 0, NULL, 0, &env, sizeof env). */
ZD_API int zd_rpc_env_resolve(int rank, int world_size, const char *master_addr, int master_port,
                              zd_rpc_env_t *env, size_t size);

/*  Joins the world. rank < 0, world_size <= 0 and the options' unset
    master address and port come from the launcher's environment
    (zd_rpc_env_resolve; the result is logged once at info level), a NULL
    name becomes "worker<rank>"; opts (borrowed) may be NULL: the
    defaults. Rank 0 hosts the rendezvous: every process binds its own
    endpoint and registers; when all world_size have registered each gets
    the table of names, ranks and endpoints, connects to every peer (in a
    world of more than $ZDIST_RPC_EAGER_MAX processes, 16: to rank 0 only,
    and to the others on first use), and returns.
    Register functions before calling this: a peer may call them as soon as
    its own init returns. Fails (every process involved, within
    init_timeout_ms) on a duplicate rank or name, a rank outside the world,
    world sizes that differ, a peer that cannot be reached (named, with its
    address), or a master that never answers; the process whose
    registration conflicts fails at once; at once with ZD_ERR_ARGUMENT on
    a bad option, or opts whose size no zd_rpc_options_default() set.
    Returns 0, or -1. */
ZD_API int zd_rpc_init(const char *name, int rank, int world_size, const zd_rpc_options_t *opts);

/*  Leaves the world. Graceful: waits until every worker has called
    zd_rpc_shutdown, then until no call or RRef message is outstanding
    anywhere, then closes. Not graceful: fails every pending call at once and
    closes. Handlers still running are waited for. timeout_ms bounds the
    graceful part (default: no limit, like PyTorch's rpc.shutdown()); when a
    peer has died, it closes anyway after the timeout and returns -1 naming
    the peer.
    Afterwards every call fails with "RPC is not running"; zd_rpc_init may be
    called again. */
ZD_API int zd_rpc_shutdown(bool graceful, int64_t timeout_ms);

/*  True between a successful zd_rpc_init and zd_rpc_shutdown. */
ZD_API bool zd_rpc_is_running(void);

/*  The default timeout of calls, RRef fetches and distributed-autograd
    operations, in ms (0: none): the running agent's, which starts as
    zd_rpc_options_t.rpc_timeout_ms; when RPC is not running, the
    options' default (60000). Never fails. */
ZD_API int64_t zd_rpc_get_timeout(void);

/*  Changes that default for the calls started from now on (PyTorch's
    rpc._set_rpc_timeout): ZD_TIMEOUT_DEFAULT puts back 60000, 0 is no
    limit. 0, or -1 (ZD_ERR_NOT_INITIALIZED) when RPC is not running. */
ZD_API int zd_rpc_set_timeout(int64_t timeout_ms);

/*  ---- worker info ---- */

typedef struct {
    char name[ZD_RPC_MAX_NAME + 1];
    int rank;
    char endpoint[ZD_RPC_MAX_ENDPOINT + 1]; /* "tcp://127.0.0.1:41873" */
} zd_rpc_worker_info_t;

/*  Info of the worker called name (NULL: this process). 0, or -1. */
ZD_API int zd_rpc_get_worker_info(const char *name, zd_rpc_worker_info_t *out);
ZD_API int zd_rpc_get_worker_info_by_rank(int rank, zd_rpc_worker_info_t *out);

/*  All workers, by rank: fills out[0..min(world, max)-1] and returns the
    world size, or -1 when not running. */
ZD_API int zd_rpc_get_worker_infos(zd_rpc_worker_info_t *out, int max);

/*  The rank of the worker called name, or -1 (with an error) when unknown:
    zd_rpc_sync(zd_rpc_worker("ps"), ...) reads like PyTorch's rpc_sync("ps", ...),
    and a call given that -1 says which name was unknown. */
ZD_API int zd_rpc_worker(const char *name);

/*  This process's rank, the world size (-1 when not running), and this
    process's name ("" when not running; borrowed: valid until the next
    zd_rpc_init or zd_rpc_shutdown). */
ZD_API int zd_rpc_rank(void);
ZD_API int zd_rpc_world_size(void);
ZD_API const char *zd_rpc_name(void);

/*  ---- serving functions ---- */

/*  What a handler knows about the call it serves. Opaque; valid until the
    handler returns (for async handlers: until their future completes). */
typedef struct zd_rpc_call zd_rpc_call_t;

/*  The caller's rank and name, and the function called; the strings are
    borrowed: valid while call is. */
ZD_API int zd_rpc_call_caller_rank(const zd_rpc_call_t *call);
ZD_API const char *zd_rpc_call_caller_name(const zd_rpc_call_t *call);
ZD_API const char *zd_rpc_call_function(const zd_rpc_call_t *call);

/*  A synchronous handler: returns the result (a new reference, which the
    agent drops after sending it), or NULL with zd_error_set() to answer with
    an error. args is the argument list, borrowed. */
typedef zd_value_t *(zd_rpc_handler_fn)(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  An asynchronous handler (PyTorch's @rpc.functions.async_execution):
    returns a future (a new reference) that completes later, for instance
    from the callback of a nested zd_rpc_async; the reply is sent when it
    completes, and no thread is held meanwhile. NULL + zd_error_set() answers
    with an error at once. */
typedef zd_future_t *(zd_rpc_async_handler_fn)(zd_rpc_call_t *call, zd_value_t *args, void *arg);

/*  Run the handler on the I/O thread instead of the pool: saves a thread
    hand-off (waking a pool thread) per call, for handlers that return
    quickly and never block (no zd_rpc_sync, no locks held long). */
#define ZD_RPC_FN_INLINE 0x1u

typedef struct {
    size_t size;           /* set by zd_rpc_function_default() */
    zd_rpc_handler_fn *fn; /* exactly one of fn and async_fn */
    zd_rpc_async_handler_fn *async_fn;
    void *arg;      /* passed to the handler */
    unsigned flags; /* ZD_RPC_FN_* */
} zd_rpc_function_t;

/*  An empty zd_rpc_function_t with size set (inline: this program's
    size); set fn or async_fn, arg and flags. Returns the struct. */
static inline zd_rpc_function_t zd_rpc_function_default(void)
{
    zd_rpc_function_t f;
    memset(&f, 0, sizeof f);
    f.size = sizeof f;
    return f;
}

/*  Registers (or replaces) the function called name in this process (f is
    copied). Names starting with "__" are reserved for modules built on
    the agent (distributed autograd). 0, or -1 (ZD_ERR_ARGUMENT: a bad
    name, not exactly one of fn and async_fn, f's size not set by
    zd_rpc_function_default(); ZD_ERR_NO_MEMORY). */
ZD_API int zd_rpc_register_function(const char *name, const zd_rpc_function_t *f);

/*  Shorthands: a pool handler, an async handler, an inline handler.
    0, or -1 as zd_rpc_register_function. */
ZD_API int zd_rpc_register(const char *name, zd_rpc_handler_fn *fn, void *arg);
ZD_API int zd_rpc_register_async(const char *name, zd_rpc_async_handler_fn *fn, void *arg);
ZD_API int zd_rpc_register_inline(const char *name, zd_rpc_handler_fn *fn, void *arg);

/*  Forgets name. 0, or -1 (ZD_ERR_ARGUMENT) if it was not registered. */
ZD_API int zd_rpc_unregister(const char *name);

/*  ---- calling ---- */

/*  Calls fn on worker `to` with args (borrowed; NULL = no arguments) and
    waits, up to timeout_ms (default: zd_rpc_get_timeout()). Returns 0 and
    *result (a new reference), or -1 with an error that names the peer and
    fn: remote failure (with the remote text), unknown function, timeout,
    unreachable peer. Not allowed on the I/O thread (in a future callback
    or an inline handler): use zd_rpc_async there. */
ZD_API int zd_rpc_sync(int to, const char *fn, zd_value_t *args, int64_t timeout_ms,
                       zd_value_t **result);

/*  Like zd_rpc_sync without waiting: returns a future (a new reference) that
    completes with the result or the error; NULL only when the call could
    not be made at all (not running, bad rank). */
ZD_API zd_future_t *zd_rpc_async(int to, const char *fn, zd_value_t *args, int64_t timeout_ms);

/*  ---- calling with arguments taken over ----

    The calls above (and the RRef method calls below), taking over the
    caller's reference to args, which they release in every case, success
    or failure: zd_rpc_sync_take(to, "f", ZD_ARGS(x, 2), ...) leaks nothing.
    args NULL (a ZD_ARGS that failed) fails the call with that error,
    prefixed with the call; pass ZD_ARGS() for no arguments. Results as for
    the borrowing calls. */

/*  zd_rpc_sync, taking over args (released in every case); *result: a new reference.
    0, or -1 as zd_rpc_sync. */
ZD_API int zd_rpc_sync_take(int to, const char *fn, zd_value_t *args, int64_t timeout_ms,
                            zd_value_t **result);
/*  zd_rpc_async, taking over args (released in every case): a new reference, or NULL
    as zd_rpc_async. */
ZD_API zd_future_t *zd_rpc_async_take(int to, const char *fn, zd_value_t *args, int64_t timeout_ms);
/*  zd_rpc_remote, taking over args (released in every case): a new reference, or NULL
    as zd_rpc_remote. */
ZD_API zd_rref_t *zd_rpc_remote_take(int to, const char *fn, zd_value_t *args, int64_t timeout_ms);
/*  zd_rref_rpc_sync, taking over args (released in every case); *result: a new reference.
    0, or -1 as zd_rref_rpc_sync. */
ZD_API int zd_rref_rpc_sync_take(zd_rref_t *r, const char *method, zd_value_t *args,
                                 int64_t timeout_ms, zd_value_t **result);
/*  zd_rref_rpc_async, taking over args (released in every case): a new reference, or
    NULL as zd_rref_rpc_async. */
ZD_API zd_future_t *zd_rref_rpc_async_take(zd_rref_t *r, const char *method, zd_value_t *args,
                                           int64_t timeout_ms);
/*  zd_rref_remote, taking over args (released in every case): a new reference, or NULL
    as zd_rref_remote. */
ZD_API zd_rref_t *zd_rref_remote_take(zd_rref_t *r, const char *method, zd_value_t *args,
                                      int64_t timeout_ms);

/*  ---- remote references ---- */

/*  zd_rref_t (declared in <zdist/value.h>) is a handle: a user's fork of the
    reference, or the owner's local handle. Handles are reference counted
    and may be shared between threads. */

/*  Runs fn(args) on worker `to`, keeping the result there, and returns an
    RRef to it at once (a new reference; release with zd_rref_unref). The
    owner creates the value asynchronously; errors of fn (or a creation
    timeout) come back from to_here. args' tensors must not be modified
    until zd_rref_confirmed_by_owner(). NULL only when the call could not
    be made at all. */
ZD_API zd_rref_t *zd_rpc_remote(int to, const char *fn, zd_value_t *args, int64_t timeout_ms);

/*  An RRef owned by this process holding value (reference taken):
    PyTorch's RRef(value), for handing out local objects: a new reference,
    or NULL when not running or out of memory. */
ZD_API zd_rref_t *zd_rref_new(zd_value_t *value);

/*  A copy of the RRef's value fetched from its owner (the value itself,
    shared, on the owner), waiting up to timeout_ms (default:
    zd_rpc_get_timeout()): 0 and *value (new reference), or -1 (creation
    failed, timeout, owner unreachable). */
ZD_API int zd_rref_to_here(zd_rref_t *r, int64_t timeout_ms, zd_value_t **value);

/*  The value, on the owner only (waits for its creation up to
    zd_rpc_get_timeout(); zd_rref_to_here takes a timeout of its own). 0 and
    *value (new reference), or -1 (not the owner, failed, ZD_ERR_TIMEOUT). */
ZD_API int zd_rref_local_value(zd_rref_t *r, zd_value_t **value);

/*  The owner's rank and name ("" when unknown; borrowed: the calling
    thread's buffer, valid until its next call), and whether this is it. */
ZD_API int zd_rref_owner(const zd_rref_t *r);
ZD_API const char *zd_rref_owner_name(const zd_rref_t *r);
ZD_API bool zd_rref_is_owner(const zd_rref_t *r);

/*  True once the owner knows of this reference (always on the owner). */
ZD_API bool zd_rref_confirmed_by_owner(const zd_rref_t *r);

/*  Calls the registered function `method` at the RRef's owner with the
    RRef's value as first argument followed by args (PyTorch's
    rref.rpc_sync().method(*args)): synchronously, asynchronously, or
    keeping the result at the owner. Same results as zd_rpc_sync / zd_rpc_async /
    zd_rpc_remote: new references, and -1 or NULL on failure as theirs. */
ZD_API int zd_rref_rpc_sync(zd_rref_t *r, const char *method, zd_value_t *args, int64_t timeout_ms,
                            zd_value_t **result);
ZD_API zd_future_t *zd_rref_rpc_async(zd_rref_t *r, const char *method, zd_value_t *args,
                                      int64_t timeout_ms);
ZD_API zd_rref_t *zd_rref_remote(zd_rref_t *r, const char *method, zd_value_t *args,
                                 int64_t timeout_ms);

/*  Reference counting of RRef handles. The last zd_rref_unref of a user's
    handle tells the owner (after the owner has confirmed it); the owner
    frees the value when no user anywhere and no local handle holds it.
    Values holding an RRef hold a reference too. zd_rref_ref returns r (the
    new reference). Both NULL-safe. */
ZD_API zd_rref_t *zd_rref_ref(zd_rref_t *r);
ZD_API void zd_rref_unref(zd_rref_t *r);

/*  ---- lists of RRefs ----

    PyTorch's list of RRefs, as DistributedOptimizer takes them: gather the
    parameters of several modules, local or remote, into one,

        zd_rref_list_t *params = zd_rref_list_new();
        zd_rref_list_t *enc = zd_remote_module_remote_parameters(encoder);
        zd_rref_list_t *dec = zd_dist_nn_parameter_rrefs(decoder);
        if (!params || !enc || !dec || zd_rref_list_extend(params, enc) < 0 ||
            zd_rref_list_extend(params, dec) < 0)
            ...error...
        zd_rref_list_free(enc);
        zd_rref_list_free(dec);

    An RRef to a value already listed (the same owner and RRef id: the
    same handle, or another fork of it) is listed once, where it was first
    seen, as PyTorch's parameters() lists a tied weight once. RRefs made
    apart to one tensor (two RemoteModules sharing a weight) have two ids:
    tie weights inside one module, whose parameter RRefs list it once. */
typedef struct zd_rref_list zd_rref_list_t;

/*  A new, empty list: a new object (zd_rref_list_free), or NULL when out
    of memory. */
ZD_API zd_rref_list_t *zd_rref_list_new(void);

/*  Frees the list and drops its references to the RRefs. NULL-safe. */
ZD_API void zd_rref_list_free(zd_rref_list_t *l);

/*  Appends r, taking a reference of its own (r stays the caller's); an RRef
    to a value already in the list is skipped. 0 (appended or skipped), or
    -1 (ZD_ERR_ARGUMENT: NULL l or r; ZD_ERR_NO_MEMORY). */
ZD_API int zd_rref_list_append(zd_rref_list_t *l, zd_rref_t *r);

/*  Appends every RRef of other in order, as zd_rref_list_append does (so
    values already listed are skipped): PyTorch's
    params.extend(m.remote_parameters()). other is borrowed. 0, or -1 (l
    may then hold part of other). */
ZD_API int zd_rref_list_extend(zd_rref_list_t *l, const zd_rref_list_t *other);

/*  How many RRefs (0 for NULL). */
ZD_API int zd_rref_list_len(const zd_rref_list_t *l);

/*  RRef i: borrowed, valid while the list lives (zd_rref_ref to keep it
    longer); NULL when i is out of range. */
ZD_API zd_rref_t *zd_rref_list_get(const zd_rref_list_t *l, int i);

/*  Waits until this process has no RRef message in flight: every deletion
    and fork notification it sent was acknowledged and every RRef it
    forked was confirmed, up to timeout_ms (default: no limit, as each of
    those messages has its own timeout). 0, or -1 on timeout. */
ZD_API int zd_rref_drain(int64_t timeout_ms);

/*  Number of values this process holds as an owner (live OwnerRRefs). */
ZD_API int64_t zd_rpc_debug_owner_rrefs(void);

/*  Owned values that were still referenced (by a user somewhere, or by a
    local handle) when the last zd_rpc_shutdown closed the agent: 0 when every
    RRef was released in time. */
ZD_API int64_t zd_rpc_debug_owner_rrefs_leaked(void);

/*  ---- hooks for modules built on the agent (distributed autograd) ----

    One set of hooks per process, installed before zd_rpc_init. Extra bytes
    travel in the header frame next to the value. For every request (CALL,
    REMOTE, RREF_FETCH) and its reply:

      caller: on_send_request (calling thread) ... on_recv_reply (the thread
              that receives the answer: the I/O thread, or zd_rpc_sync's own)
      callee: on_recv_request (thread running the handler, before it),
              on_handler_return (same thread, right after the handler),
              on_send_reply (thread completing the reply)

    on_recv_reply is called exactly once for every on_send_request that
    returned 0, with result NULL when the call failed, so it can release
    its state. on_send_reply is called exactly once for every
    on_recv_request that returned 0 (result NULL for an error reply).
    Any hook may be NULL. A hook returning -1 (zd_error_set) fails the call.
    A process without hooks (or without on_recv_request) answers a request
    that carries extra bytes with an error (ZD_ERR_NOT_INITIALIZED) rather
    than ignore them. */

typedef enum {
    ZD_RPC_KIND_CALL = 0,   /* zd_rpc_sync / zd_rpc_async */
    ZD_RPC_KIND_REMOTE = 1, /* zd_rpc_remote: the reply carries none */
    ZD_RPC_KIND_FETCH = 2,  /* to_here: the request carries none */
} zd_rpc_call_kind_t;

typedef struct {
    int peer;             /* the other side's rank */
    const char *function; /* "__to_here" for fetches */
    zd_rpc_call_kind_t kind;
    uint64_t request_id;
} zd_rpc_hook_msg_t;

typedef struct {
    void *data; /* malloc'ed; the agent frees it */
    size_t len;
} zd_rpc_bytes_t;

/*  One named counter of zd_rpc_get_debug_info. */
typedef struct {
    char name[48];
    int64_t value;
} zd_rpc_debug_item_t;

typedef struct {
    size_t size; /* set by zd_rpc_hooks_default() */
    /* May replace *args (unref the old value, store a new reference), set
       *extra and a per-call *state handed back to on_recv_reply. */
    int (*on_send_request)(void *arg, const zd_rpc_hook_msg_t *m, zd_value_t **args,
                           zd_rpc_bytes_t *extra, void **state);
    /* May replace *args (NULL for a fetch); may keep state with
       zd_rpc_call_set_hook_state. */
    int (*on_recv_request)(void *arg, zd_rpc_call_t *call, const void *extra, size_t len,
                           zd_value_t **args);
    void (*on_handler_return)(void *arg, zd_rpc_call_t *call);
    /* May replace *result (NULL for an error reply) and set *extra. */
    int (*on_send_reply)(void *arg, zd_rpc_call_t *call, zd_value_t **result,
                         zd_rpc_bytes_t *extra);
    /* May replace *result (NULL when the call failed). */
    int (*on_recv_reply)(void *arg, const zd_rpc_hook_msg_t *m, void *state, const void *extra,
                         size_t len, zd_value_t **result);
    void *arg;
    /* The module's counters for zd_rpc_get_debug_info: fills up to max items
       and returns how many it has. Any thread; must not block. */
    int (*debug_info)(void *arg, zd_rpc_debug_item_t *items, int max);
    /* For the error of a call whose peer has no hooks installed (code
       ZD_ERR_NOT_INITIALIZED): the module's name ("distributed-autograd")
       and the call that installs its hooks ("zd_dist_autograd_init()").
       May be NULL. */
    const char *module;
    const char *init_call;
    /* A peer was declared lost (pool thread, once per peer): release what
       the module keeps for it. May be NULL. */
    void (*on_peer_lost)(void *arg, int peer);
} zd_rpc_hooks_t;

/*  Empty hooks with size set (inline: this program's size); set the
    hooks you need. Returns the struct. A static initialiser sets
    .size = sizeof(zd_rpc_hooks_t) itself. */
static inline zd_rpc_hooks_t zd_rpc_hooks_default(void)
{
    zd_rpc_hooks_t h;
    memset(&h, 0, sizeof h);
    h.size = sizeof h;
    return h;
}

/*  Installs hooks (copied; NULL removes them). Only while not running.
    0, or -1 (ZD_ERR_ARGUMENT: RPC is running, or a size that no
    zd_rpc_hooks_default() set). */
ZD_API int zd_rpc_set_hooks(const zd_rpc_hooks_t *hooks);

/*  Per-call state of the callee-side hooks (borrowed: the hooks own it), and
    the kind of call. */
ZD_API void zd_rpc_call_set_hook_state(zd_rpc_call_t *call, void *state);
ZD_API void *zd_rpc_call_hook_state(const zd_rpc_call_t *call);
ZD_API zd_rpc_call_kind_t zd_rpc_call_kind(const zd_rpc_call_t *call);

/*  ---- lost peers ---- */

/*  Called once for each peer declared lost (its process gone: about 1 s after
    its connection dropped; frozen: after heartbeat_ms without a sign of life),
    on an RPC pool thread, before the owner releases what the peer held. */
typedef void(zd_rpc_peer_lost_fn)(void *arg, int peer, const char *name);

/*  Adds fn(arg) to the callbacks run when a peer is lost (at most 8, kept for
    the life of the process; the same pair twice is one). 0, or -1. */
ZD_API int zd_rpc_register_peer_lost(zd_rpc_peer_lost_fn *fn, void *arg);

/*  True when the running agent has declared rank lost (false when not
    running or the rank is alive). Calls to a lost peer fail at once
    (ZD_ERR_PEER, "peer \"NAME\" (rank N) lost 3.1 s ago"). */
ZD_API bool zd_rpc_peer_is_lost(int rank);

/*  ---- peers that come back ---- */

/*  A process restarted with the rank and name of a lost peer joins the
    running world (zd_rpc_init registers with rank 0, which tells the
    others); a restarted rank 0 gets the world back from the members that
    waited for it (master_wait_ms). What the old process owned (its RRefs,
    objects, autograd contexts) is gone: the application makes them anew. */

/*  Called once each time a lost peer has rejoined, on an RPC pool thread,
    after calls to it work again. */
typedef void(zd_rpc_peer_joined_fn)(void *arg, int peer, const char *name);

/*  Adds fn(arg) to the callbacks run when a lost peer rejoins (at most 8, kept
    for the life of the process; the same pair twice is one). 0, or -1. */
ZD_API int zd_rpc_register_peer_joined(zd_rpc_peer_joined_fn *fn, void *arg);

/*  Times rank rejoined since this process joined the world, counted
    before calls to the new process work (before the peer_joined
    callbacks): note it, compare it later, and a peer replaced meanwhile
    is told apart from one that stayed. 0 or more, or -1 (not running, a
    rank outside the world). */
ZD_API int zd_rpc_peer_joins(int rank);

/*  Waits until rank is a live member (not lost: a lost one has rejoined): 0, or
    -1 with ZD_ERR_TIMEOUT after timeout_ms (ZD_TIMEOUT_DEFAULT and
    ZD_TIMEOUT_NONE: no limit), ZD_ERR_NOT_INITIALIZED. */
ZD_API int zd_rpc_wait_peer(int rank, int64_t timeout_ms);

/*  True in a process whose zd_rpc_init joined a world that was already
    running (it was restarted), false when it formed the world or not running. */
ZD_API bool zd_rpc_rejoined(void);

/*  ---- metrics ---- */

typedef struct {
    int64_t calls_sent;   /* CALL, REMOTE and FETCH requests to the peer */
    int64_t calls_served; /* requests from the peer answered */
    int64_t errors;       /* calls to the peer that failed */
    int64_t bytes_sent;   /* all frames, both directions of traffic */
    int64_t bytes_received;
    int64_t in_flight;      /* calls to the peer awaiting their reply */
    int64_t serving;        /* calls from the peer being run here */
    double latency_mean_us; /* round trip of calls to the peer */
    double latency_p50_us;  /* percentiles: within ~2% (log histogram) */
    double latency_p99_us;
} zd_rpc_metrics_t;

/*  Counters for one peer (peer < 0: all peers together) into *out, a
    struct of size bytes (sizeof *out), written no further than size:
    zd_rpc_metrics_get(peer, &m, sizeof m). 0, or -1 (RPC not running, a
    bad peer, a size below the 1.0 struct's; out is then left alone). */
ZD_API int zd_rpc_metrics_get(int peer, zd_rpc_metrics_t *out, size_t size);

/*  One line per peer, human readable, then the debug counters. */
ZD_API void zd_rpc_metrics_print(FILE *f);

/*  This process's counters, like PyTorch's rpc._get_debug_info(): the
    agent's (num_pending_requests, num_serving, thread_pool_size: the
    configured size, num_pool_threads: alive now, num_idle_threads,
    num_owner_rrefs, num_pending_streams), then those of
    the module whose hooks are installed (distributed autograd:
    num_autograd_contexts, num_current_backward_passes, ...). Fills up to
    max items and returns how many there are (more than max: the rest was
    left out), or -1 when RPC is not running. */
ZD_API int zd_rpc_get_debug_info(zd_rpc_debug_item_t *items, int max);

/*  The value of the counter called name in zd_rpc_get_debug_info: 0, or -1
    when RPC is not running, no counter has that name or an argument is
    NULL. */
ZD_API int zd_rpc_get_debug_value(const char *name, int64_t *value);

ZD_END_DECLS

#endif
