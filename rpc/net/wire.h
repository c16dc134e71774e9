/* SPDX-License-Identifier: MIT */
/*  wire.h: the header frame of every agent message (private to rpc/).

    A message is one ZeroMQ multipart message:

        [routing id]  added by the receiving ROUTER: 3 bytes 'r', rank hi, lo
                      from a process's shared socket, or 5 bytes 's', rank hi,
                      lo, slot hi, lo from one thread's zd_rpc_sync socket, which
                      gets its answer back on the same connection
        [header]      the frame described here
        [tensor 0] ... [tensor n-1]   raw tensor data, one frame each

    Header frame, version 2, every integer little-endian:

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
        24     8    a           type-specific: RRef id; for ERROR the failure's
                                zd_error_code_t (0: read as ZD_ERR_REMOTE)
        32     8    b           type-specific: fork id
        40     4    meta_len    encoded value length (codec.h), or error text
        44     4    n_tensors   number of frames that follow the header
        48     4    timeout_ms  caller's timeout (0 = none), for the owner's waits
        52     4    reserved    must be 0
        56     fn_len     function name, printable ASCII
        ...    extra_len  opaque hook metadata (zd_rpc_hooks_t)
        ...    meta_len   value metadata (zd__value_encode) or UTF-8 error text

    The frame size must equal 56 + fn_len + extra_len + meta_len exactly, and
    n_tensors must equal the number of frames after the header.

    Streamed tensors (new in version 2). libzmq hands a multipart message
    over only once all of it has arrived, each frame in a buffer it mallocs
    in its I/O thread; for tens of MiB, glibc gives that buffer back to the
    kernel when it is freed, so every such message is received into fresh
    pages (a page fault every 4 KiB: that, not the network, capped 64 MiB
    tensors at ~1.3 GB/s). So a sender may stream its large tensors instead:

      - The message (CALL, REMOTE or REPLY) gets flag RPC_WIRE_F_STREAMED.
        Each streamed tensor's frame is empty, and one more frame, the stream
        table, follows the last tensor (n_tensors counts it):

            offset size field
            0      4    count   streamed tensors, 1..(frames before the table)
            4      4    chunk   bytes per chunk, RPC_WIRE_MIN_CHUNK..RPC_WIRE_MAX_CHUNK
            8 + 16*i    entry i:
                   4    frame   index of the tensor's (empty) frame; strictly
                                increasing from entry to entry
                   4    reserved, 0
                   8    bytes   the tensor's size, 1..RPC_WIRE_MAX_STREAM

        The table's size is exactly 8 + 16 * count.
      - Right after it, on the same connection, come the pieces: the data
        of entry 0, then entry 1, ..., cut into `chunk` bytes (a tensor's
        last piece may be shorter). Each piece is a message [header][data]
        whose header has type REPLY, flags RPC_WIRE_F_CHUNK alone, the
        streamed message's id, a = the piece's number counted from 0 over
        the whole message, n_tensors = 1 and nothing else (0). REPLY, so
        that sockets which take only answers (zd_rpc_sync) take them, and so
        that a receiver unable to put them together could only see a bad
        answer.
      - The receiver copies the pieces into one buffer per tensor as they
        arrive (stream.h), so that only a piece or two are ever held by
        libzmq, and hands the message on once the last piece is in, as if
        its tensors had come in their frames. A piece that does not match
        (number, size, id, type, or no streamed message pending on its
        connection) drops the message, logged, with an ERROR answer to a
        request.

    Tensors through shared memory between two processes of one host (the
    flag RPC_WIRE_F_SHM, a segment table as the last frame, and the
    SHM_OFFER / SHM_ACCEPT handshake and the SHM_SEGMENT / SHM_MAPPED
    announcement of each segment, none of which is answered otherwise):
    see shm.h.

    Requests (CALL, REMOTE, RREF_FETCH, the RRef control messages, BARRIER)
    are answered by exactly one REPLY (a value; for control messages an
    empty acknowledgement: PyTorch's RREF_ACK / REMOTE_RET) or one ERROR
    (meta = error text) carrying the request's id. HELLO needs no answer.
    Types 64..127 are reserved for modules built on the agent. */
#ifndef ZDIST_RPC_WIRE_H
#define ZDIST_RPC_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RPC_WIRE_VERSION     2
#define RPC_WIRE_FIXED       56
#define RPC_WIRE_MAX_FN      255
#define RPC_WIRE_MAX_EXTRA   (1u << 20)
#define RPC_WIRE_MAX_RANK    65535
#define RPC_WIRE_ID_LEN      3
#define RPC_WIRE_SYNC_ID_LEN 5

typedef enum {
    RPC_MSG_HELLO = 1,             /* connection check at init */
    RPC_MSG_CALL = 2,              /* run function fn on args */
    RPC_MSG_REPLY = 3,             /* answer: a value */
    RPC_MSG_ERROR = 4,             /* answer: an error text */
    RPC_MSG_REMOTE = 5,            /* create OwnerRRef a (caller's fork b) from fn(args) */
    RPC_MSG_RREF_FETCH = 6,        /* to_here of RRef a */
    RPC_MSG_RREF_USER_DELETE = 7,  /* fork b of RRef a is gone */
    RPC_MSG_RREF_FORK_REQUEST = 8, /* child -> owner: register fork b of RRef a */
    RPC_MSG_RREF_CHILD_ACCEPT = 9, /* child -> parent: fork b confirmed by the owner */
    RPC_MSG_SHM_OFFER = 10,        /* same-host shared memory offered, extra = identity (shm.h) */
    RPC_MSG_SHM_ACCEPT = 11,       /* answer to an offer: a = 1 accepted, 0 refused */
    RPC_MSG_SHM_SEGMENT = 12,      /* a new segment: a = slot, b = token, extra = fd, cap */
    RPC_MSG_SHM_MAPPED = 13,       /* its answer: a = slot, b = token, extra = 1 mapped, or 0
                                       and why not */
    RPC_MSG_EXT_FIRST = 64,
    RPC_MSG_EXT_LAST = 127,
} rpc_msg_type_t;

/*  CALL/REMOTE: args[0] is an RRef owned by the receiver; the handler gets its
    value instead (the methods of zd_rref_rpc_sync and friends). */
#define RPC_WIRE_F_DEREF_FIRST 0x0001u
/*  The sender ran no request hooks for this call (the RPC layer's own
    calls: the shutdown barrier). A hint only, never trusted: whether a call
    is internal (no hooks, not counted as a user call in metrics or in the
    shutdown drain) is what the receiver's own registry says of the function
    (serve.c); a peer cannot make a user function skip its hooks with it. */
#define RPC_WIRE_F_INTERNAL 0x0002u
/*  The message's large tensors are streamed: see above. */
#define RPC_WIRE_F_STREAMED 0x0004u
/*  A piece of a streamed message's tensor data: see above. */
#define RPC_WIRE_F_CHUNK 0x0008u
/*  Some tensors are in shared-memory segments, named by a last frame
    (shm.h); never with RPC_WIRE_F_STREAMED. */
#define RPC_WIRE_F_SHM 0x0010u
#define RPC_WIRE_F_KNOWN                                                                           \
    (RPC_WIRE_F_DEREF_FIRST | RPC_WIRE_F_INTERNAL | RPC_WIRE_F_STREAMED | RPC_WIRE_F_CHUNK |       \
     RPC_WIRE_F_SHM)

/*  Limits of the stream table. A piece is one frame: MAX_CHUNK is one of the
    terms of the largest frame a socket accepts (net.h RPC_MAX_FRAME). The
    sender takes pieces of 1 MiB, larger ones only past 1 GiB per tensor (at
    most RPC_STREAM_MAX_PIECES of them), so 16 MiB pieces carry up to 16 GiB. */
#define RPC_WIRE_MIN_CHUNK    ((size_t)4 << 10)
#define RPC_WIRE_MAX_CHUNK    ((size_t)16 << 20)
#define RPC_WIRE_MAX_STREAM   ((uint64_t)16 << 30)
#define RPC_WIRE_STREAM_ENTRY 16

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

/*  True when s is a worker or function name the protocol allows: 1 to max
    bytes, each printable ASCII without space (names are sent as they are and
    printed in errors). NULL is not. */
bool zd__rpc_wire_name_ok(const char *s, size_t max);

/*  Bytes needed for h's frame. */
size_t zd__rpc_wire_size(const rpc_wire_header_t *h);

/*  Writes h (fixed part, fn, extra, meta) into out, which holds
    zd__rpc_wire_size(h) bytes. */
void zd__rpc_wire_write(const rpc_wire_header_t *h, uint8_t *out);

/*  Parses and validates a received header frame of len bytes. Returns 0 and
    fills *h (pointing into buf), or -1 with a clear error naming the bad
    field. Does not check ranks against the world (the caller knows it). */
int zd__rpc_wire_parse(const void *buf, size_t len, rpc_wire_header_t *h);

/*  One entry of a stream table. */
typedef struct {
    uint32_t frame;
    uint64_t bytes;
} rpc_wire_stream_t;

/*  Bytes of a stream table of count entries. */
size_t zd__rpc_wire_stream_table_size(uint32_t count);

/*  Writes a table of count entries (chunk bytes per piece) into out, which
    holds zd__rpc_wire_stream_table_size(count) bytes. */
void zd__rpc_wire_stream_table_write(const rpc_wire_stream_t *entries, uint32_t count,
                                     uint32_t chunk, uint8_t *out);

/*  Parses and validates a received stream table of len bytes, the last of
    n_frames frames. Returns 0 and fills *count, *chunk and *entries (a new
    array, free() it), or -1 with a clear error naming the bad field. Does
    not look at the tensors' frames (the caller checks they are empty). */
int zd__rpc_wire_stream_table_parse(const void *buf, size_t len, uint32_t n_frames, uint32_t *count,
                                    uint32_t *chunk, rpc_wire_stream_t **entries);

/*  Name of a message type ("CALL"), "?" when unknown. */
const char *zd__rpc_wire_type_name(int type);

/*  The routing id of rank's shared sending socket, of one of its threads'
    zd_rpc_sync sockets, and back: returns the rank, or -1 when id is not a
    routing id of ours. */
void zd__rpc_wire_identity(int rank, uint8_t out[RPC_WIRE_ID_LEN]);
void zd__rpc_wire_sync_identity(int rank, int slot, uint8_t out[RPC_WIRE_SYNC_ID_LEN]);
int zd__rpc_wire_identity_rank(const void *id, size_t len);

#endif
