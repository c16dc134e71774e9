/* SPDX-License-Identifier: MIT */
/*  rref.h: remote references inside the agent (private to rpc/).

    Protocol (PyTorch's rref.md). One OwnerRRef (an owner
    entry holding the value) on the owner; any number of UserRRefs
    elsewhere, each a distinct fork with a world-unique fork id. The owner
    keeps the set of forks it knows, each with the rank holding it; it
    frees the value when that set is empty and no local handle holds it.
    Guarantees:
      G1  the owner hears of every user's deletion: the last unref of a user
          handle sends RREF_USER_DELETE, retried until acknowledged;
      G2  a parent is not deleted before the owner has confirmed its child:
          forking an RRef into a message keeps a reference to the parent in
          pending_children until the child sends RREF_CHILD_ACCEPT, which it
          does only after the owner acknowledged its RREF_FORK_REQUEST; a
          user handle keeps itself alive (pending_users) until confirmed.
    The owner forking its own RRef registers the fork at once (no message).
    Control messages are idempotent, so retrying them is safe.

    Ids. RRef ids and fork ids are creator rank << 48 | 48 bits that are a
    secret permutation of a counter (zd__rref_new_id): unique for the life
    of the agent, never 0, and not guessable from the ids a peer has seen.
    An RRef's id is what lets a member name it at all; only the processes
    it was sent to (and the owner's log) learn it.

    Who may become a holder (issue 24 point 5). A fork is bound to the
    parent that made it, the rank in its id's top bits. The owner accepts
    an RREF_FORK_REQUEST for fork f of RRef x from rank s only when
      - f is already recorded as s's (a retry: acknowledged again), or
      - f's creator c is not the owner (the owner's own forks are
        registered when it sends them, never requested) and c holds a
        fork of x recorded here (through its REMOTE, an accepted fork
        request of its own, or the owner sending it x).
    A request whose creator holds nothing yet waits (fork_wait_t): the
    parent may be a creator whose REMOTE is still on its way, or a user
    whose own fork request is (a chain of forks made before the owner
    confirmed any). It is accepted, and answered, as soon as c becomes a
    holder, which may accept requests waiting for s in turn; it is refused
    (answered with an error, logged naming s) when it has waited as long as
    a placeholder would, when c is lost, or at once when f is another
    rank's (control_refused) or the owner's. A fetch from s while its
    request waits waits for the outcome. So a member can become a holder
    only of an RRef whose id it knows, and only in the name of a rank that
    holds it; a member never sent the RRef does not know its id.

    Wire form of an RRef inside a value (RPC_RREF_WIRE_SIZE = 40 bytes,
    little-endian): rref_id u64, fork_id u64, owner u16, parent u16, then
    20 zero bytes. parent is the sender; fork_id was made by the sender. */
#ifndef ZDIST_RPC_RREF_H
#define ZDIST_RPC_RREF_H

#include "rpc/agent/agent.h"

struct zd_rref {
    atomic_int refs;
    unsigned gen; /* the agent generation it belongs to */
    uint64_t rref_id;
    uint64_t fork_id; /* users: this handle's fork; owners: 0 */
    int owner;
    bool is_owner;
    unsigned owner_losses; /* users: the owner's losses (net.h) when it was made */
    atomic_bool confirmed; /* the owner knows of this fork */
    atomic_bool deleted;   /* the delete was sent (users) */
    zd_future_t *value;    /* owners: completes with the value */
    char *error;           /* users: creation failed (under the ctx lock) */
    struct ctrl *del;      /* users: the RREF_USER_DELETE of the last release,
                                   made with the handle: releasing needs no memory */
};

/*  Records forks made while encoding one message, so that a message that is
    never sent can take them back. */
typedef struct {
    agent_t *a;
    struct txn_item *items;
    int n, cap;
} rref_txn_t;

void zd__rref_txn_init(rref_txn_t *t, agent_t *a);
/*  A codec that encodes RRefs through t (and decodes as a->rref_codec). */
rpc_rref_codec_t zd__rref_txn_codec(rref_txn_t *t);
void zd__rref_txn_commit(rref_txn_t *t);
void zd__rref_txn_rollback(rref_txn_t *t);

/*  Decoding RRefs from rank src: the codec callback installed as
    a->rref_codec (arg = the agent). */
int zd__rref_decode(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src, zd_rref_t **out);

/*  zd__value_set_rref_hooks callbacks. */
void zd__rref_value_ref_hook(zd_rref_t *r);
void zd__rref_value_unref_hook(zd_rref_t *r);

/*  Owner side of REMOTE: registers the caller's fork (fork_id 0: created by
    this process for itself) on entry rref_id, accepts (and answers) the
    fork requests that waited for the caller to become a holder, and
    returns the entry's value future (a new reference) to be completed with
    the result, or NULL when the id is bad (error set). */
zd_future_t *zd__rref_owner_remote(agent_t *a, uint64_t rref_id, uint64_t fork_id, int src);

/*  Whether rref_id, which has no entry here, was made by this rank (an
    id this process made has its entry from the moment it exists, so one
    unknown was freed, or made by an earlier process of this rank, which
    was restarted): then no value will ever come for it, and the error is
    set saying so, rather than a placeholder waiting out the caller's
    timeout. */
bool zd__rref_never_here(agent_t *a, uint64_t rref_id);

/*  Whether r's owner was declared lost since this user handle was made:
    what it owned for this process was released then (and went with the
    process, if it was restarted since), so a call through r would wait
    for a value that will never come. A handle made while the owner was
    lost (of its new process, forwarded before this process saw it back)
    is not refused. Sets the error (ZD_ERR_PEER, naming api) when so. */
bool zd__rref_owner_lost_since(agent_t *a, const zd_rref_t *r, const char *api);

/*  Owner side of RREF_FETCH / deref-first: the value future of rref_id (a
    new reference), creating a placeholder that expires after timeout_ms
    when the REMOTE creating it has not arrived; NULL on a bad id. */
zd_future_t *zd__rref_owner_value(agent_t *a, uint64_t rref_id, int64_t timeout_ms);
/*  zd__rref_owner_value for a RREF_FETCH from rank src: refused (NULL,
    error set) when the RRef exists here and src holds no fork of it, but
    while a fork request of src waits for its parent, a future of the
    value if the request is accepted, of the refusal if not; a placeholder
    it makes counts as src's (zd__rref_placeholder_admit). */
zd_future_t *zd__rref_owner_value_for(agent_t *a, uint64_t rref_id, int64_t timeout_ms, int src);

/*  A user handle for a REMOTE about to be sent to owner (pending until
    zd__rref_user_created), or the owner handle when owner is this process. */
zd_rref_t *zd__rref_new_for_remote(agent_t *a, int owner);

/*  The REMOTE's answer arrived (error NULL) or the call failed. */
void zd__rref_user_created(agent_t *a, zd_rref_t *r, const char *error);

/*  Outstanding RRef work of this process: control messages in flight,
    pending users, pending children. */
int64_t zd__rref_outstanding(agent_t *a);

/*  Copies a user's creation error ("" when none) into buf. */
void zd__rref_user_error(agent_t *a, zd_rref_t *r, char *buf, size_t size);

/*  Number of owner entries (values held for RRefs). */
int64_t zd__rref_owner_count(agent_t *a);

/*  A new owner entry holding value and its local handle (zd_rref_new). */
zd_rref_t *zd__rref_new_local(agent_t *a, zd_value_t *value);

/*  ---- internals shared by rref.c and rref_fork.c ---- */

#define OWNER_BUCKETS 1024
#define CHILD_BUCKETS 256

typedef enum {
    OWNER_PLACEHOLDER,     /* seen in a fetch/fork before its REMOTE: expires */
    OWNER_AWAITING_REMOTE, /* this process's own remote() to itself, in flight */
    OWNER_CREATED,
} owner_state_t;

typedef struct owner {
    uint64_t rref_id;
    owner_state_t state;
    zd_future_t *value;
    uint64_t *forks;
    int *holders; /* per fork: the rank holding it */
    int n_forks, cap_forks;
    zd_rref_t *handle; /* the local handle while referenced (weak) */
    int64_t expire_ns; /* placeholders */
    struct owner *next;
    /* Placeholders only: who asked for it (counted per peer, -1: none),
       and their own list, which the expiry scans instead of every owner. */
    int ph_src;
    struct owner *ph_next, *ph_prev;
} owner_t;

typedef struct child {
    uint64_t fork_id;
    int holder;        /* the rank it was sent to */
    zd_rref_t *parent; /* a reference, dropped on RREF_CHILD_ACCEPT */
    struct child *next;
} child_t;

/*  A fork request whose parent holds no fork yet (see the top). */
typedef struct fork_wait {
    uint64_t rref_id, fork_id;
    int src;         /* the child, which asked */
    int parent;      /* the fork's creator, which must become a holder */
    uint64_t req_id; /* the request answered: the latest attempt */
    uint8_t route[RPC_WIRE_SYNC_ID_LEN];
    size_t route_len;
    int64_t since_ns, expire_ns;
    zd_future_t *settled; /* fetches from src while it waits: the value,
                                   or the refusal (NULL until one comes) */
    bool refused;         /* (when answered) refused, with why */
    bool silent;          /* refused without an answer (nobody to read it) */
    char why[256];
    zd_future_t *value; /* (when accepted with settled) the entry's value */
    struct fork_wait *next;
} fork_wait_t;

struct rref_ctx {
    pthread_mutex_t lock;
    bool closing;
    uint64_t id_key[2]; /* zd__rref_new_id's secret */
    atomic_uint_fast64_t id_next;
    owner_t *owners[OWNER_BUCKETS];
    int64_t n_owners, n_placeholders;
    owner_t *placeholders; /* the list of OWNER_PLACEHOLDER entries */
    int64_t ph_due_ns;     /* no placeholder expires before this */
    int64_t ph_scan_ns;    /* when the expiry last scanned them */
    int *ph_by_peer;       /* placeholders per rank that asked (world) */
    int ph_world;
    child_t *children[CHILD_BUCKETS];
    int64_t n_children, n_pending_users, n_ctrl;
    fork_wait_t *waits; /* fork requests waiting for their parent */
    int64_t n_waits, waits_due_ns, waits_scan_ns;
    int *waits_by_peer; /* per rank that asked (world) */
    int waits_world;
    int64_t n_waited; /* fork requests that ever waited (for tests) */
};

typedef struct ctrl ctrl_t;
typedef void(ctrl_done_fn)(agent_t *a, ctrl_t *c, bool ok);

struct ctrl {
    agent_t *a;
    int dst;
    uint8_t type;
    uint64_t rref_id, fork_id;
    int attempts;
    int failures;     /* attempts that failed other than by timing out */
    int64_t first_ns; /* when the first attempt left */
    ctrl_done_fn *done;
    zd_rref_t *r; /* for done */
    int parent;   /* for done */
};

/*  Ids: creator rank << 48 | 48 bits never 0 (see the top). */
int zd__rref_creator(uint64_t id);
bool zd__rref_id_ok(agent_t *a, uint64_t id);
/*  A new RRef or fork id made by this process. */
uint64_t zd__rref_new_id(agent_t *a);

zd_rref_t *zd__rref_handle_new(agent_t *a, uint64_t rref_id, uint64_t fork_id, int owner);
void zd__rref_handle_free(zd_rref_t *r);

/*  Owner entries; all under x->lock. zd__rref_owner_maybe_unlink returns the
    entry when nothing holds it any more, to zd__rref_owner_free after unlocking
    (its value may hold RRefs, whose release takes the lock). */
owner_t *zd__rref_owner_find(rref_ctx_t *x, uint64_t id);
owner_t *zd__rref_owner_create(rref_ctx_t *x, uint64_t id, owner_state_t state);
int zd__rref_owner_add_fork(owner_t *e, uint64_t fork_id, int holder);
/*  The rank holding fork_id of e, or -1 when e has no such fork. */
int zd__rref_owner_fork_holder(const owner_t *e, uint64_t fork_id);
void zd__rref_owner_del_fork(owner_t *e, uint64_t fork_id);
owner_t *zd__rref_owner_maybe_unlink(rref_ctx_t *x, owner_t *e);
void zd__rref_owner_free(owner_t *e);
/*  The entry's local handle with one more reference (made if needed). */
zd_rref_t *zd__rref_owner_handle(agent_t *a, owner_t *e);

/*  Placeholders, which a peer makes with a fetch, a fork request or an RRef
    inside a message before the REMOTE creating it arrived (docs/rpc.md,
    "Limits"): at most RREF_MAX_PLACEHOLDERS in all and
    RREF_MAX_PLACEHOLDERS_PEER asked for by one rank, each given up after
    the smaller of the asker's timeout and the local default, never more
    than RREF_PLACEHOLDER_MAX_MS. */
#define RREF_MAX_PLACEHOLDERS      16384
#define RREF_MAX_PLACEHOLDERS_PEER 1024
#define RREF_PLACEHOLDER_MAX_MS    ((int64_t)600000)
/*  Fork requests waiting for their parent (fork_wait_t): at most this many
    in all and asked by one rank; each waits as long as a placeholder. */
#define RREF_MAX_FORK_WAITS      16384
#define RREF_MAX_FORK_WAITS_PEER 1024
/*  Whether rank src (or -1: this process) may make one more placeholder;
    -1 with the error set (naming the rank) when not. Under x->lock. */
int zd__rref_placeholder_admit(agent_t *a, rref_ctx_t *x, int src);
/*  Arms the new placeholder e for src: its expiry, counted for src.
    Under x->lock. */
void zd__rref_placeholder_arm(agent_t *a, rref_ctx_t *x, owner_t *e, int src, int64_t timeout_ms);
/*  After creating an entry (lock released): frees it when its value comes
    and nothing else holds it. */
void zd__rref_watch_value(agent_t *a, zd_future_t *value, uint64_t rref_id);

/*  Sends a control message, retried until acknowledged; done (may be NULL)
    runs once with the outcome. */
void zd__rref_ctrl_start(agent_t *a, int dst, uint8_t type, uint64_t rref_id, uint64_t fork_id,
                         ctrl_done_fn *done, zd_rref_t *r, int parent);
/*  The same in c, allocated beforehand (taken over). */
void zd__rref_ctrl_run(agent_t *a, ctrl_t *c, int dst, uint8_t type, uint64_t rref_id,
                       uint64_t fork_id, ctrl_done_fn *done, zd_rref_t *r, int parent);
/*  Under x->lock: removes pending child fork_id, returning its parent's
    reference (or NULL). */
zd_rref_t *zd__rref_child_take(rref_ctx_t *x, uint64_t fork_id);

#endif
