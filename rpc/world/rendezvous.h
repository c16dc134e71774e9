/* SPDX-License-Identifier: MIT */
/*  rendezvous.h: the rendezvous messages (private to rpc/), read by pure
    functions so that tools/fuzz_rendezvous.c can drive them without
    sockets. The exchange itself is rendezvous.c; the format:

        registration (joiner -> rank 0):  "ZDREG1" rank world_size name endpoint key [status]
        table (rank 0 -> joiner):         "ZDTAB2" world_size entries [status]
        error (rank 0 -> joiner):         "ZDERR1" text
        not yet (rank 0 -> joiner):       "ZDBSY1" text

    status, when present, says that the world is already running
    (membership.c): "running", or "running:" and the ranks lost to the
    sender, comma-separated. A registration with it comes from a member
    that lost rank 0 and re-registers with a restarted one; a table with it
    answers a process that restarted, and its list names the ranks that
    are gone. "Not yet" answers a restarted process whose old connection
    is still up at rank 0: it asks again until its timeout.

    every field one frame of text (no terminating NUL on the wire), but
    entries: one frame holding name, endpoint and key of every rank in
    order, each a length byte and that many bytes (a rank gone from a
    running world: three empty fields). One frame, not three per rank: in
    a world of 512 rank 0 built, copied and sent 786,000 frames, which
    took it 4 s of the world's start. key is
    the process's CURVE public key in Z85 (RDV_KEY_LEN characters), or empty
    in a world without a key; whether it fits the world is rendezvous.c's
    business (security.h). */
#ifndef ZDIST_RPC_RENDEZVOUS_H
#define ZDIST_RPC_RENDEZVOUS_H

#include <czmq.h>

#include <zdist/rpc.h>

#define RDV_REG_TAG  "ZDREG1"
#define RDV_TAB_TAG  "ZDTAB2"
#define RDV_ERR_TAG  "ZDERR1"
#define RDV_BUSY_TAG "ZDBSY1"
#define RDV_RUNNING  "running"

/*  Longest frame either side accepts (ZMQ_MAXMSGSIZE on both sockets): a
    registration's frames are a name and an endpoint of at most 127 bytes,
    an error text at most RDV_MAX_TEXT. */
#define RDV_MAX_FRAME 4096
/*  A table's entries frame holds at most this much per rank, which the
    joiner's socket accepts (RDV_MAX_FRAME does not bound that frame). */
#define RDV_ENTRY_MAX (3 + ZD_RPC_MAX_NAME + ZD_RPC_MAX_ENDPOINT + RDV_KEY_LEN)
/*  A connection to the rendezvous that has not finished its ZMTP (and, with
    a key, CURVE) handshake within this is dropped: a legitimate process
    finishes in milliseconds, and each one held open costs rank 0 a
    descriptor. */
#define RDV_HANDSHAKE_MS 3000
#define RDV_MAX_TEXT     1024
#define RDV_KEY_LEN      40 /* a Z85 CURVE public key */

typedef struct {
    int rank, world;
    char name[ZD_RPC_MAX_NAME + 1];
    char endpoint[ZD_RPC_MAX_ENDPOINT + 1];
    char key[RDV_KEY_LEN + 1]; /* "" in a world without a key */
    bool running;              /* registration: the sender is a running member */
    bool lost;                 /* table of a running world: this rank is gone */
} rdv_entry_t;

/*  Reads a registration: the frames after the sender's routing id (m is
    left as it was). The endpoint must be tcp:// with a numeric address and
    a port (address.h); rank and world are checked against nothing but the
    wire's bounds. 0, or -1 with the reason in why (a malformed message). */
int zd__rdv_parse_registration(zmsg_t *m, rdv_entry_t *out, char lost_list[RDV_MAX_TEXT], char *why,
                               size_t size);

/*  Reads rank 0's answer to a joiner of rank `rank` named `name` in a
    world of `world`: a table fills out[0..world-1] and returns 0, with
    *running set when the world was already running (and out[i].lost for
    the ranks gone from it); an error answer returns -1 with rank 0's text
    (made printable, at most RDV_MAX_TEXT bytes) in why, a "not yet" -2;
    anything malformed returns -1 saying so. */
int zd__rdv_parse_answer(zmsg_t *m, int world, int rank, const char *name, rdv_entry_t *out,
                         bool *running, char *why, size_t size);

/*  Marks in lost[0..world-1] the ranks of a status's list ("1,5"): 0, or
    -1 when a rank is out of the world or the list is malformed. */
int zd__rdv_parse_ranks(const char *list, int world, bool *lost);

/*  Writes the status of a running member or world, with the ranks lost[i]
    is set for: "running" or "running:1,5". A list longer than the buffer
    stops at the last rank that fits (a world with that many lost ranks
    only waits longer for the ones left out). */
void zd__rdv_status(const bool *lost, int world, char buf[RDV_MAX_TEXT]);

#endif
