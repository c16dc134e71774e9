/* SPDX-License-Identifier: MIT */
/*  rendezvous.h: the rendezvous messages (private to rpc/), read by pure
    functions so that tools/fuzz_rendezvous.c can drive them without
    sockets. The exchange itself is rendezvous.c; the format:

        registration (joiner -> rank 0):  "ZDREG1" rank world_size name endpoint key
        table (rank 0 -> joiner):         "ZDTAB1" world_size (name endpoint key) * world_size
        error (rank 0 -> joiner):         "ZDERR1" text

    every field one frame of text (no terminating NUL on the wire). key is
    the process's CURVE public key in Z85 (RDV_KEY_LEN characters), or empty
    in a world without a key; whether it fits the world is rendezvous.c's
    business (security.h). */
#ifndef ZDIST_RPC_RENDEZVOUS_H
#define ZDIST_RPC_RENDEZVOUS_H

#include <czmq.h>

#include <zdist/rpc.h>

#define RDV_REG_TAG "ZDREG1"
#define RDV_TAB_TAG "ZDTAB1"
#define RDV_ERR_TAG "ZDERR1"

/* Longest frame either side accepts (ZMQ_MAXMSGSIZE on both sockets): a
   registration's frames are a name and an endpoint of at most 127 bytes,
   an error text at most RDV_MAX_TEXT. */
#define RDV_MAX_FRAME 4096
#define RDV_MAX_TEXT 1024
#define RDV_KEY_LEN 40          /* a Z85 CURVE public key */

typedef struct {
    int rank, world;
    char name[ZD_RPC_MAX_NAME + 1];
    char endpoint[ZD_RPC_MAX_ENDPOINT + 1];
    char key[RDV_KEY_LEN + 1];  /* "" in a world without a key */
} rdv_entry_t;

/*  Reads a registration: the frames after the sender's routing id (m is
    left as it was). The endpoint must be tcp:// with a numeric address and
    a port (address.h); rank and world are checked against nothing but the
    wire's bounds. 0, or -1 with the reason in why (a malformed message). */
int zd__rdv_parse_registration(zmsg_t *m, rdv_entry_t *out, char *why, size_t size);

/*  Reads rank 0's answer to a joiner of rank `rank` named `name` in a
    world of `world`: a table fills out[0..world-1] and returns 0; an error
    answer returns -1 with rank 0's text (made printable, at most
    RDV_MAX_TEXT bytes) in why; anything malformed returns -1 saying so. */
int zd__rdv_parse_answer(zmsg_t *m, int world, int rank, const char *name, rdv_entry_t *out,
                         char *why, size_t size);

#endif
