/* SPDX-License-Identifier: MIT */
/*  shm.h: large tensors between two processes of one host through shared
    memory (private to rpc/).

    Over loopback TCP a tensor is copied twice (into the kernel and out of
    it) and libzmq receives it into fresh heap pages; through a shared
    segment it is copied by the sender, then out of the segment by the
    receiver (the sender could still write the segment: the receiver's
    tensor must not be it). The control message (header, value, the smaller
    tensors) still travels on ZeroMQ, over the connection the world already
    authenticated.

    Handshake. Once connected (zd__transport_connect), every process sends
    each peer an OFFER (wire.h type RPC_MSG_SHM_OFFER) whose extra bytes are
    its identity: the kernel's boot id, the inodes of its network, mount and
    pid namespaces, its uid and pid, and a probe: a memfd of its own, named
    by descriptor number, holding a random token. The peer accepts (type
    RPC_MSG_SHM_ACCEPT, a = 1) only when the identity is its own but for the
    pid, and it could open the probe through /proc/<pid>/fd/<n> (a
    directory only the same user, or root, can open), found a memfd of its
    own uid there and read the token the offer named; else it refuses
    (a = 0; one INFO line saying why) and the tensors to it keep going over
    ZeroMQ. ZDIST_SHM=0 turns the path off: no offers, every offer refused.

    Segments. Per peer a sender keeps up to RPC_SHM_MAX_SEGS memfds
    ("zdist-shm"), each a page of header (magic, random token, ranks, size,
    a busy flag) and the data, made on demand and kept (warm, pre-faulted)
    until the agent stops. A tensor of more than RPC_SHM_OVER bytes to an
    accepting peer takes a free segment that fits (busy 0 -> 1, one copy,
    shared with a helper thread when large: copy.h);
    the message gets flag RPC_WIRE_F_SHM, the tensor's frame is empty and a
    last frame, the segment table, says where its bytes are:

        offset size field
        0      4    count   tensors in segments, 1..(frames before the table)
        4      4    reserved, 0
        8 + 40*i    entry i:
               4    frame   index of the tensor's (empty) frame, increasing
               4    slot    the sender's segment number, < RPC_SHM_MAX_SEGS
               4    fd      its descriptor number in the sender (as announced)
               4    reserved, 0
               8    token   the segment's token
               8    cap     its data size
               8    bytes   the tensor's size, 1..cap

    Announcement. A sender uses a segment only once the receiver has mapped
    it. A new segment (or one remade larger) is announced with SHM_SEGMENT
    (a = slot, b = token, extra = fd u32, 0 u32, cap u64) and the message
    that needed it goes the ZeroMQ way; the receiver, only for a peer whose
    offer it accepted, opens it as it opened the probe, checks it (its
    header: magic, token, size, ranks; its seals against any change of
    size), maps it, keeps it under (slot, token) in place of what that
    slot held, and answers SHM_MAPPED (a, b as announced, extra = 1, or 0
    and the reason). A segment it could not map (a descriptor it could not
    get, even with the one it keeps in reserve; a segment that is not what
    was announced) costs only the shared memory: the sender sends to it the
    ZeroMQ way from then on. A table may name only a mapped (slot, token);
    decoding the message copies the tensor out and sets busy back to 0.
    When no mapped segment is free and no new one may be made, the message
    goes the ZeroMQ way. A memfd goes away with the last process that maps
    it: nothing is left behind by a crash. */
#ifndef ZDIST_RPC_SHM_H
#define ZDIST_RPC_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc/net/net.h"

/*  Tensors of more bytes go through shared memory. */
#define RPC_SHM_OVER     ((size_t)256 << 10)
#define RPC_SHM_MAX_SEGS 8
/*  Bytes of segments a process makes for one peer, and for all of them. */
#define RPC_SHM_PEER_BYTES ((size_t)512 << 20)
#define RPC_SHM_MAX_BYTES  ((size_t)1 << 30)
#define RPC_SHM_ENTRY      40

/*  A message's tensors placed in segments by zd__shm_send_prepare. */
typedef struct {
    int peer;
    int count;
    int frames[RPC_SHM_MAX_SEGS]; /* which tensors */
    int slots[RPC_SHM_MAX_SEGS];
    uint8_t *table; /* the segment table frame (malloc) */
    size_t table_len;
} rpc_shm_out_t;

/*  At bind: reads ZDIST_SHM and this process's identity. */
void zd__shm_start(zd__net_t *n);

/*  After the connections are up: sends every other peer an OFFER, and the
    answers to offers that came before. */
void zd__shm_offer_all(zd__net_t *n);

/*  Sends peer an OFFER (a restarted process under that rank, once connected). */
void zd__shm_offer(zd__net_t *n, int peer);

/*  Peer's process is gone (it is being replaced by a restarted one): sends
    to it go over ZeroMQ until it accepts a new offer, and the segments made
    for the old one are freed. */
void zd__shm_peer_reset(int peer);

/*  At close (no sends any more): frees the segments and what the receiving
    side holds; tensors still alive keep their mapping until they die. */
void zd__shm_stop(void);

/*  For a message h (h->dst set) about to be sent with these tensors: when
    the peer accepted and every tensor of more than RPC_SHM_OVER bytes got a
    segment, copies them in, fills *out and returns 1; else 0 (send it the
    ZeroMQ way). Fills *out either way, for zd__shm_send_done. Any thread;
    called before the socket's lock is taken, so that the copy does not
    hold up the other users of the socket. */
int zd__shm_send_prepare(const rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors,
                         rpc_shm_out_t *out);

/*  Whether tensor i of a prepared message travels in a segment. */
bool zd__shm_in_segment(const rpc_shm_out_t *out, int i);

/*  Frees out's table; when the message was not sent, frees its segments.
    Nothing to do when prepare returned 0. */
void zd__shm_send_done(rpc_shm_out_t *out, bool sent);

/*  For the receive loop, on every complete message (after the stream
    filter): returns 1 when m is to be dispatched (unchanged, or with its
    segment tensors in their frames and without the table), -1 when it
    dropped m (logged; m->reject_id set for a request to answer). */
int zd__shm_filter(zd__net_t *n, void *sock, inmsg_t *m);

/*  OFFER and ACCEPT messages (I/O thread); m's frames are released. */
void zd__shm_handle(zd__net_t *n, inmsg_t *m);

/*  What peer answered this process's offer (tests): 1 accepted (tensors to
    it go through shared memory), -1 refused, 0 no answer yet or off here. */
int zd__shm_peer_state(int peer);

/*  Counters since the process started (tests, benchmarks): messages sent
    with segments, received with segments, large messages to an accepting
    peer sent the ZeroMQ way for want of a mapped segment, segments made,
    peers' segments this process refused to map. Any pointer may be NULL. */
void zd__shm_stats(long *sent, long *received, long *fallbacks, long *made, long *refused);

#endif
