/*  wire.h: the header frame of every agent message (private to rpc/).

    A message is one ZeroMQ multipart message:

        [routing id]  added by the receiving ROUTER: 3 bytes 'r', rank hi, lo
                      from a process's shared socket, or 5 bytes 's', rank hi,
                      lo, slot hi, lo from one thread's rpc_sync socket, which
                      gets its answer back on the same connection
        [header]      the frame described here
        [tensor 0] ... [tensor n-1]   raw tensor data, one frame each

    Header frame, version 1, every integer little-endian:

        offset size field
        0      2    magic       0x5A 0x44 ("ZD")
        2      1    version     RPC_WIRE_VERSION; any other value is refused
        3      1    type        rpc_msg_type_t
        4      2    flags       RPC_WIRE_F_*; unknown bits are refused
        6      2    src         sender's rank (must match the routing id)
        8      2    dst         receiver's rank (must be the receiver)
        10     2    fn_len      function name length, 0..RPC_WIRE_MAX_FN
        12     4    extra_len   hook metadata length, 0..RPC_WIRE_MAX_EXTRA
        16     8    id          request id (rank << 48 | counter), never 0
        24     8    a           type-specific: RRef id
        32     8    b           type-specific: fork id
        40     4    meta_len    encoded value length (codec.h), or error text
        44     4    n_tensors   number of tensor frames that follow
        48     4    timeout_ms  caller's timeout (0 = none), for the owner's waits
        52     4    reserved    must be 0
        56     fn_len     function name, printable ASCII
        ...    extra_len  opaque hook metadata (rpc_hooks_t)
        ...    meta_len   value metadata (rpc_value_encode) or UTF-8 error text

    The frame size must equal 56 + fn_len + extra_len + meta_len exactly, and
    n_tensors must equal the number of frames after the header.

    Requests (CALL, REMOTE, RREF_FETCH, the RRef control messages, BARRIER)
    are answered by exactly one REPLY (a value; for control messages an
    empty acknowledgement: PyTorch's RREF_ACK / REMOTE_RET) or one ERROR
    (meta = error text) carrying the request's id. HELLO needs no answer.
    Types 64..127 are reserved for modules built on the agent. */
#ifndef ZDIST_RPC_WIRE_H
#define ZDIST_RPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define RPC_WIRE_VERSION 1
#define RPC_WIRE_FIXED 56
#define RPC_WIRE_MAX_FN 255
#define RPC_WIRE_MAX_EXTRA (1u << 20)
#define RPC_WIRE_MAX_RANK 65535
#define RPC_WIRE_ID_LEN 3
#define RPC_WIRE_SYNC_ID_LEN 5

typedef enum {
    RPC_MSG_HELLO = 1,              /* connection check at init */
    RPC_MSG_CALL = 2,               /* run function fn on args */
    RPC_MSG_REPLY = 3,              /* answer: a value */
    RPC_MSG_ERROR = 4,              /* answer: an error text */
    RPC_MSG_REMOTE = 5,             /* create OwnerRRef a (caller's fork b) from fn(args) */
    RPC_MSG_RREF_FETCH = 6,         /* to_here of RRef a */
    RPC_MSG_RREF_USER_DELETE = 7,   /* fork b of RRef a is gone */
    RPC_MSG_RREF_FORK_REQUEST = 8,  /* child -> owner: register fork b of RRef a */
    RPC_MSG_RREF_CHILD_ACCEPT = 9,  /* child -> parent: fork b confirmed by the owner */
    RPC_MSG_EXT_FIRST = 64,
    RPC_MSG_EXT_LAST = 127,
} rpc_msg_type_t;

/*  CALL/REMOTE: args[0] is an RRef owned by the receiver; the handler gets its
    value instead (the methods of rpc_rref_rpc_sync and friends). */
#define RPC_WIRE_F_DEREF_FIRST 0x0001u
/*  The request is internal (barrier, RRef control): not counted as a user
    call in metrics or in the shutdown drain. */
#define RPC_WIRE_F_INTERNAL 0x0002u
#define RPC_WIRE_F_KNOWN (RPC_WIRE_F_DEREF_FIRST | RPC_WIRE_F_INTERNAL)

/*  A parsed header; the pointers point into the frame it was parsed from. */
typedef struct {
    uint8_t type;
    uint16_t flags;
    int src, dst;
    uint64_t id;
    uint64_t a, b;
    uint32_t n_tensors;
    uint32_t timeout_ms;
    const char *fn;
    size_t fn_len;
    const uint8_t *extra;
    size_t extra_len;
    const uint8_t *meta;
    size_t meta_len;
} rpc_wire_header_t;

/*  Bytes needed for h's frame. */
size_t rpc_wire_size(const rpc_wire_header_t *h);

/*  Writes h (fixed part, fn, extra, meta) into out, which holds
    rpc_wire_size(h) bytes. */
void rpc_wire_write(const rpc_wire_header_t *h, uint8_t *out);

/*  Parses and validates a received header frame of len bytes. Returns 0 and
    fills *h (pointing into buf), or -1 with a clear error naming the bad
    field. Does not check ranks against the world (the caller knows it). */
int rpc_wire_parse(const void *buf, size_t len, rpc_wire_header_t *h);

/*  Name of a message type ("CALL"), "?" when unknown. */
const char *rpc_wire_type_name(int type);

/*  The routing id of rank's shared sending socket, of one of its threads'
    rpc_sync sockets, and back: returns the rank, or -1 when id is not a
    routing id of ours. */
void rpc_wire_identity(int rank, uint8_t out[RPC_WIRE_ID_LEN]);
void rpc_wire_sync_identity(int rank, int slot, uint8_t out[RPC_WIRE_SYNC_ID_LEN]);
int rpc_wire_identity_rank(const void *id, size_t len);

#endif
