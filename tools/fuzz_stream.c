/* SPDX-License-Identifier: MIT */
/*  fuzz_stream.c: libFuzzer target for the wire header parser and the
    reassembly of streamed messages (rpc/net/wire.h, rpc/net/stream.h).

    The input is a sequence of messages, each read as a receive loop would
    have read it from one of four connections, then passed through
    zd__transport_stream_filter like io.c does:

        byte 0      bits 0-1: connection (0: ROUTER, rank 0; 1: ROUTER,
                    rank 1 through a zd_rpc_sync routing id; 2: ROUTER, rank
                    1 through its shared socket; 3: a zd_rpc_sync DEALER
                    connected to rank 1, where only answers may come)
                    bit 2: raw header (else built from the fields below)
                    bit 3: afterwards, expire the streams as if
                    RPC_STREAM_STALL_NS had passed
                    bits 4-6: number of tensor frames (0-7)
        header      raw: u16 length, then that many bytes for
                    zd__rpc_wire_parse. Built: type, flags (bit 0 streamed,
                    bit 1 piece, bit 2 deref-first, bits 3-7 fork id),
                    id, piece number (or RRef id): one byte each (ids
                    modulo 8, so that pieces meet their messages)
        frames      per frame: u16 length, then the bytes (fewer when the
                    input runs out)

    The agent around the filter is a stand-in: no sockets, a clock that
    only moves when bit 3 asks, and error answers and failed calls checked
    instead of sent.

    Checks, beyond "no crash, no sanitizer report": every frame is
    released exactly once; a message the filter hands over is complete (as
    many frames as its header announces) and no longer marked streamed; an
    expiry drops every stalled stream, but only after its grace; error
    answers and failed calls carry a text; after the last message and a
    shutdown's clear, nothing is pending and every frame and receive
    buffer is back (LeakSanitizer sees a lost buffer).

    Build and run with tools/fuzz.sh 60 fuzz_stream. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include "rpc/net/bufcache.h"
#include "rpc/net/stream.h"
#include "rpc/net/wire.h"

#define MAX_FRAMES 7

#define FUZZ_NAME "fuzz_stream"
#include "tools/fuzz_check.h"

/*  ---- the stand-in agent ---- */

static int64_t clock_ns = 1000000000;

int64_t zd__net_now_ns(void)
{
    return clock_ns;
}

void zd__transport_answer_error(zd__net_t *n, const inmsg_t *m, uint64_t id, const char *text)
{
    (void)n, (void)id;
    CHECK(text && text[0], "an error answer without text");
    CHECK(m->route_len == 0 || m->route_len == RPC_WIRE_SYNC_ID_LEN, "a route of %zu bytes",
          m->route_len);
}

/*  The agent's part (net.h's zd__net_up_t), installed on the stand-in. */
static void fail_answer(void *arg, uint64_t id, int src, const char *text, zd_error_code_t code)
{
    (void)arg, (void)id, (void)src, (void)code;
    CHECK(text && text[0], "a call failed without text");
}

/*  ---- frames that count their releases ---- */

/*  A frame's memory stays until the input is done, so that a second
    release is caught by the check rather than as a use after free. */
typedef struct fuzz_frame {
    int released;
    struct fuzz_frame *next;
    uint8_t bytes[];
} fuzz_frame_t;

static fuzz_frame_t *all_frames;
static int live_frames;

static void frame_release(void *data, void *arg)
{
    (void)data;
    fuzz_frame_t *f = arg;
    CHECK(f->released == 0, "a frame released twice");
    f->released = 1;
    live_frames--;
}

static rpc_frame_t frame_new(const uint8_t *data, size_t size)
{
    fuzz_frame_t *f = malloc(sizeof *f + (size ? size : 1));
    CHECK(f, "out of memory");
    f->released = 0;
    f->next = all_frames;
    all_frames = f;
    if (size)
        memcpy(f->bytes, data, size);
    live_frames++;
    return (rpc_frame_t){
        .data = f->bytes, .size = size, .release = frame_release, .release_arg = f};
}

static void frames_free(void)
{
    while (all_frames) {
        fuzz_frame_t *next = all_frames->next;
        free(all_frames);
        all_frames = next;
    }
}

/*  ---- reading the input ---- */

typedef struct {
    const uint8_t *p;
    size_t left;
} input_t;

static int take_u8(input_t *in)
{
    if (!in->left)
        return -1;
    in->left--;
    return *in->p++;
}

static size_t take_u16(input_t *in)
{
    int lo = take_u8(in), hi = take_u8(in);
    return lo < 0 ? 0 : (size_t)lo | (size_t)(hi < 0 ? 0 : hi) << 8;
}

static const uint8_t *take_bytes(input_t *in, size_t *n)
{
    if (*n > in->left)
        *n = in->left;
    const uint8_t *p = in->p;
    in->p += *n;
    in->left -= *n;
    return p;
}

/*  The header frame of the next message (of n_frames tensor frames, unless
    raw), in hm; false when the input ran out before it. */
static bool next_header(input_t *in, bool raw, int n_frames, zmq_msg_t *hm)
{
    if (raw) {
        size_t n = take_u16(in);
        const uint8_t *p = take_bytes(in, &n);
        zmq_msg_init_size(hm, n);
        if (n)
            memcpy(zmq_msg_data(hm), p, n);
        return true;
    }
    int type = take_u8(in), flags = take_u8(in), id = take_u8(in), seq = take_u8(in);
    if (seq < 0)
        return false;
    /* Headers the parser accepts, mostly: pieces as senders make them, the
       rest with a function name and a value where their type has one. */
    rpc_wire_header_t h = {.type = (uint8_t)(1 + type % 9),
                           .id = (uint64_t)id % 8,
                           .a = (uint64_t)seq,
                           .n_tensors = (uint32_t)n_frames};
    if (flags & 2) {
        h.type = RPC_MSG_REPLY;
        h.flags = RPC_WIRE_F_CHUNK;
    } else {
        bool has_fn = h.type == RPC_MSG_CALL || h.type == RPC_MSG_REMOTE;
        if (has_fn)
            h.fn = "f", h.fn_len = 1;
        if (has_fn || h.type == RPC_MSG_REPLY || h.type == RPC_MSG_ERROR)
            h.meta = (const uint8_t *)"x", h.meta_len = 1;
        if (flags & 1)
            h.flags |= RPC_WIRE_F_STREAMED;
        if (flags & 4)
            h.flags |= RPC_WIRE_F_DEREF_FIRST;
        h.b = (uint64_t)(flags >> 3);
    }
    zmq_msg_init_size(hm, zd__rpc_wire_size(&h));
    zd__rpc_wire_write(&h, zmq_msg_data(hm));
    return true;
}

static void release_all(inmsg_t *m)
{
    for (int i = 0; i < m->n; i++)
        m->frames[i].release(m->frames[i].data, m->frames[i].release_arg);
    m->n = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int router_tag, dealer_tag;
    static zd__net_t fake;
    memset(&fake, 0, sizeof fake);
    fake.router = &router_tag;
    fake.rank = 1;
    fake.up.fail_answer = fail_answer;
    zd__rpc_bufcache_enable(true);
    input_t in = {data, size};
    inmsg_t m = {0};
    m.frames = malloc(MAX_FRAMES * sizeof *m.frames);
    m.cap = MAX_FRAMES;
    CHECK(m.frames, "out of memory");
    while (in.left) {
        int c = take_u8(&in);
        int conn = c & 3, n = (c >> 4) & 7;
        zmq_msg_init(&m.hm);
        if (!next_header(&in, c & 4, n, &m.hm)) {
            zmq_msg_close(&m.hm);
            break;
        }
        m.n = 0;
        for (int i = 0; i < n; i++) {
            size_t len = take_u16(&in);
            const uint8_t *p = take_bytes(&in, &len);
            m.frames[m.n++] = frame_new(p, len);
        }
        /* What recv_message checks before the filter. */
        void *sock = conn == 3 ? (void *)&dealer_tag : (void *)&router_tag;
        m.src = conn == 0 ? 0 : 1;
        m.route_len = 0;
        if (conn == 1) {
            zd__rpc_wire_sync_identity(1, 7, m.route);
            m.route_len = RPC_WIRE_SYNC_ID_LEN;
        }
        m.reject_id = 0;
        rpc_wire_header_t *h = &m.h;
        bool valid = zd__rpc_wire_parse(zmq_msg_data(&m.hm), zmq_msg_size(&m.hm), h) == 0 &&
            h->n_tensors == (uint32_t)m.n &&
            (conn != 3 || h->type == RPC_MSG_REPLY || h->type == RPC_MSG_ERROR);
        bool verbose = getenv("FUZZ_STREAM_VERBOSE");
        /* The stream layer logs what it drops: only wanted when verbose. */
        zd_log_set_level(verbose ? ZD_LOG_DEBUG : ZD_LOG_ERROR);
        if (verbose)
            fprintf(stderr, "connection %d, %d frames: %s\n", conn, m.n,
                    valid ? zd__rpc_wire_type_name(h->type) : zd_error_last());
        if (!valid) {
            release_all(&m);
            zmq_msg_close(&m.hm);
            continue;
        }
        int rc = zd__transport_stream_filter(&fake, sock, &m);
        if (verbose)
            fprintf(stderr, "  filter: %d\n", rc);
        if (rc == 1) {
            CHECK(!(m.h.flags & (RPC_WIRE_F_STREAMED | RPC_WIRE_F_CHUNK)),
                  "a message handed over still marked streamed");
            CHECK(m.h.n_tensors == (uint32_t)m.n, "%u frames announced, %d handed over",
                  m.h.n_tensors, m.n);
            release_all(&m);
            zmq_msg_close(&m.hm);
        } else {
            CHECK(m.n == 0, "the filter kept or dropped a message but left %d frames in it", m.n);
            CHECK(rc == 0 || rc == -1, "filter returned %d", rc);
            CHECK(rc == -1 || !m.reject_id, "a message taken in, yet to be answered");
        }
        if (c & 8) {
            /* Found stalled, then dropped once the grace is over. */
            int before = zd__transport_stream_pending();
            clock_ns += RPC_STREAM_STALL_NS + 1;
            CHECK(zd__transport_stream_expire(&fake, clock_ns) == 0, "expired without grace");
            clock_ns += RPC_STREAM_GRACE_NS;
            CHECK(zd__transport_stream_expire(&fake, clock_ns) == before, "%d of %d expired",
                  before - zd__transport_stream_pending(), before);
            CHECK(zd__transport_stream_pending() == 0, "%d streams left after expiry",
                  zd__transport_stream_pending());
        }
    }
    zd__transport_stream_clear();
    CHECK(zd__transport_stream_pending() == 0, "streams left after clear");
    CHECK(live_frames == 0, "%d frames never released", live_frames);
    frames_free();
    zd__rpc_bufcache_enable(false);
    free(m.frames);
    zd_error_clear();
    return 0;
}
