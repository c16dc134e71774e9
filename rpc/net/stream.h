/* SPDX-License-Identifier: MIT */
/*  stream.h: large tensors streamed in pieces (private to rpc/).

    The format is in wire.h ("Streamed tensors"). The sender (transport.c)
    streams every tensor of more than RPC_STREAM_OVER bytes in pieces of
    RPC_STREAM_CHUNK bytes; smaller tensors keep their single zero-copy
    frame. The receiver's read loop passes every message it read through
    zd__transport_stream_filter, which puts the pieces together.

    Why pieces, and these sizes (bench_rpc, 2-core VM; docs/rpc.md): libzmq
    receives each frame into a buffer it mallocs in its I/O thread. glibc
    keeps a freed buffer for reuse only when it is small next to what the
    process freed before (its dynamic trim threshold); a 64 MiB message, or
    64 MiB in many frames of one multipart message (all held until the last
    one arrives), comes back as fresh pages each time. Pieces sent as
    messages of their own are each copied out and freed as soon as they
    arrive, so libzmq holds a piece or two and reuses their memory, and the
    copy overlaps the transfer. 64 MiB: 1.1-1.6 GB/s in one frame, 2.5-3.0
    in 1 MiB pieces; side by side, median 2.1-2.6 for 1 MiB pieces against
    1.7-1.8 for 0.5, 2 or 4 MiB. 16 MiB tensors are as fast in one frame
    (glibc reuses a buffer that size once one was freed), so they stay
    zero-copy. */
#ifndef ZDIST_RPC_STREAM_H
#define ZDIST_RPC_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/clock.h"
#include "rpc/net/net.h"

#define RPC_STREAM_OVER  ((size_t)16 << 20)
#define RPC_STREAM_CHUNK ((size_t)1 << 20)
/*  A message streams at most this many pieces per tensor: a larger tensor
    takes larger pieces (multiples of RPC_STREAM_CHUNK). */
#define RPC_STREAM_MAX_PIECES 1024
/*  Streamed messages being received at once. A connection has at most one
    (its sender queues a message and all its pieces at once); this only
    bounds what a flood of connections can make us hold. */
#define RPC_STREAM_MAX_PENDING 1024

_Static_assert(RPC_STREAM_OVER <= RPC_MAX_FRAME && RPC_WIRE_MAX_CHUNK <= RPC_MAX_FRAME,
               "every legitimate frame must pass ZMQ_MAXMSGSIZE (RPC_MAX_FRAME, net.h)");
/*  Pending streamed messages from one rank (all its connections). */
#define RPC_STREAM_MAX_PENDING_PEER 64
/*  The memory all pending streamed messages may reserve together (their
    declared sizes), by default: ZDIST_STREAM_BUDGET_MB overrides it. One
    rank may reserve at most half of it (ZDIST_STREAM_PEER_MB overrides),
    so that one peer cannot starve the others' streams. A buffer is mapped
    when its stream is announced but its pages are touched only as the
    pieces arrive, so resident memory follows what really came. */
#define RPC_STREAM_BUDGET_DEFAULT ((uint64_t)2 << 30)

/*  A streamed message that got no piece for this long is dropped
    (zd__transport_stream_expire): its sender died or froze in the middle of
    it. A live sender queues all the pieces right behind the message, so
    its pieces never pause that long. */
#define RPC_STREAM_STALL_NS (60 * ZD__NS_PER_S)
/*  ... and stayed so for this long after an expiry pass first found it
    stalled: a receiver that was itself paused (a debugger, SIGSTOP) gets
    the time to read the pieces that waited in its sockets meanwhile. */
#define RPC_STREAM_GRACE_NS ZD__NS_PER_S

/*  For the receive loop, on every valid message it read from sock (m as
    zd__transport_recv fills it). Returns 1 when m is a message to dispatch
    (unchanged when it was not streamed, or a streamed message whose last
    piece just arrived, now with its tensors in their frames and without
    the stream table), 0 when it took m (a streamed message waiting for
    its pieces, or a piece: read on), or -1 when it dropped m (logged; when
    m->reject_id is set, answer that request with m->reject). After 0 or -1,
    m holds nothing. Called by one thread at a time per socket. */
int zd__transport_stream_filter(zd__net_t *n, void *sock, inmsg_t *m);

/*  Drops every streamed message still waiting for pieces (at shutdown,
    before the sockets close). */
void zd__transport_stream_clear(void);

/*  Drops the streamed messages whose last piece (or the message itself)
    came more than RPC_STREAM_STALL_NS before now, once an earlier pass at
    least RPC_STREAM_GRACE_NS ago already found them so (logged). A request
    on the ROUTER is answered with an ERROR, so that a sender that was only
    frozen learns of it; an answer fails the call that waits for it. The
    I/O thread calls it about once a second. Returns how many it dropped. */
int zd__transport_stream_expire(zd__net_t *n, int64_t now);

/*  Streamed messages waiting for pieces now (tests). */
int zd__transport_stream_pending(void);

#endif
