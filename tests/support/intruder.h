/* SPDX-License-Identifier: MIT */
/*  intruder.h: a raw ZeroMQ socket that speaks the wire protocol, for tests
    that play a hostile or broken peer against a live world.

    The intruder has its own ZeroMQ context and one DEALER, connected to an
    agent's endpoint (zd_rpc_get_worker_info_by_rank gives it) under any
    routing id the test chooses: a real rank's, a sync slot's, or garbage.
    It sends whatever header and frames the test builds, well-formed or not,
    and reads answers with a deadline; nothing in it trusts or checks the
    other side. Works in any process of a world (or outside one). */
#ifndef ZDIST_TESTS_INTRUDER_H
#define ZDIST_TESTS_INTRUDER_H

#include <stddef.h>
#include <stdint.h>

#include <zdist/value.h>
#include "rpc/net/wire.h"

typedef struct {
    void *ctx;        /* the intruder's own ZeroMQ context */
    void *sock;       /* its DEALER */
    int rank;         /* the rank it claims in headers (src) */
    uint64_t next_id; /* request ids it uses, counting up */
} intruder_t;

/*  An answer the intruder received. */
typedef struct {
    int type;          /* RPC_MSG_*, -1 when the header did not parse */
    uint64_t id;       /* the request id it answers */
    char text[512];    /* an ERROR's text ("" otherwise) */
    zd_value_t *value; /* a REPLY's decoded value (NULL otherwise); the
                                     caller unrefs it (intruder_answer_clear) */
    int n_frames;      /* frames after the header */
} intruder_answer_t;

/*  Connects a DEALER to endpoint with routing id id (id_len bytes; NULL:
    ZeroMQ picks one), claiming rank `rank` in the headers it builds.
    0, or -1 with a message on stderr. */
int intruder_open(intruder_t *in, const char *endpoint, int rank, const void *id, size_t id_len);

/*  intruder_open with the routing id of rank's zd_rpc_sync socket of thread
    slot `slot` (65534 is a slot no agent uses), i.e. impersonating rank. */
int intruder_open_as(intruder_t *in, const char *endpoint, int rank, int slot);

/*  Closes the socket and the context (no linger); safe twice. */
void intruder_close(intruder_t *in);

/*  Sends header h followed by n frames: frame i is data[i] (NULL: zeros)
    of sizes[i] bytes. Sizes up to any length (zero frames are built in
    chunks). 0, or -1 when ZeroMQ refused (errno kept). */
int intruder_send(intruder_t *in, const rpc_wire_header_t *h, int n, const void *const *data,
                  const size_t *sizes);

/*  Sends a CALL of function fn with value args (encoded by the library's
    own codec, tensors as frames) to rank dst, extra as the header's hook
    bytes (NULL: none). Returns the request id used, or 0 on failure. */
uint64_t intruder_call(intruder_t *in, int dst, const char *fn, const zd_value_t *args,
                       const void *extra, size_t extra_len);

/*  Waits up to timeout_ms for one message and fills *out (its frames are
    read and, for a REPLY, decoded). 1 when a message came, 0 when none did. */
int intruder_answer(intruder_t *in, int timeout_ms, intruder_answer_t *out);

/*  Drops what an answer owns. */
void intruder_answer_clear(intruder_answer_t *a);

/*  Sends a CALL and waits for its answer (skipping answers to other ids):
    1 with *out filled, 0 when no answer to it came within timeout_ms, -1
    when it could not be sent. */
int intruder_call_wait(intruder_t *in, int dst, const char *fn, const zd_value_t *args,
                       int timeout_ms, intruder_answer_t *out);

#endif
