/* SPDX-License-Identifier: MIT */
/*  Bad input from the network (SPEC R13): the header frame decoder refuses
    every malformed header with a reason, and a live agent fed malformed
    messages over a raw socket answers or drops them, keeps serving, and
    leaks nothing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/error.h>
#include <zdist/rpc.h>
#include "rpc/value/codec.h"
#include "rpc/net/wire.h"
#include "tests/support/handlers.h"
#include "tests/support/intruder.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

/*  ---- the header decoder ---- */

static size_t build(const rpc_wire_header_t *h, uint8_t *buf)
{
    zd__rpc_wire_write(h, buf);
    return zd__rpc_wire_size(h);
}

static const uint8_t meta_none[] = {RPC_CODEC_VERSION, ZD_VALUE_NONE};

static rpc_wire_header_t good_call(void)
{
    rpc_wire_header_t h = {.type = RPC_MSG_CALL,
                           .src = 1,
                           .dst = 2,
                           .id = 77,
                           .fn = "add",
                           .fn_len = 3,
                           .extra = (const uint8_t *)"xy",
                           .extra_len = 2,
                           .meta = meta_none,
                           .meta_len = sizeof meta_none,
                           .n_tensors = 0,
                           .timeout_ms = 500};
    return h;
}

static void expect_bad(const uint8_t *buf, size_t len, const char *why)
{
    rpc_wire_header_t h;
    assert_int_equal(zd__rpc_wire_parse(buf, len, &h), -1);
    if (!strstr(zd_error_last(), why))
        fail_msg("expected \"%s\" in \"%s\"", why, zd_error_last());
}

static void test_valid_headers_round_trip(void **state)
{
    (void)state;
    uint8_t buf[512];
    rpc_wire_header_t h = good_call(), p;
    size_t len = build(&h, buf);
    assert_int_equal(len, RPC_WIRE_FIXED + 3 + 2 + 2);
    assert_int_equal(zd__rpc_wire_parse(buf, len, &p), 0);
    assert_int_equal(p.type, RPC_MSG_CALL);
    assert_int_equal(p.src, 1);
    assert_int_equal(p.dst, 2);
    assert_true(p.id == 77);
    assert_int_equal(p.timeout_ms, 500);
    assert_int_equal(p.fn_len, 3);
    assert_memory_equal(p.fn, "add", 3);
    assert_int_equal(p.extra_len, 2);
    assert_memory_equal(p.extra, "xy", 2);
    assert_int_equal(p.meta_len, 2);
    /* An answer, an error text, a control message, a hello. */
    rpc_wire_header_t r = {
        .type = RPC_MSG_REPLY, .id = 9, .meta = meta_none, .meta_len = 2, .n_tensors = 3};
    assert_int_equal(zd__rpc_wire_parse(buf, build(&r, buf), &p), 0);
    assert_int_equal(p.n_tensors, 3);
    rpc_wire_header_t e = {
        .type = RPC_MSG_ERROR, .id = 9, .meta = (const uint8_t *)"oops", .meta_len = 4};
    assert_int_equal(zd__rpc_wire_parse(buf, build(&e, buf), &p), 0);
    rpc_wire_header_t d = {.type = RPC_MSG_RREF_USER_DELETE, .id = 9, .a = 5, .b = 6};
    assert_int_equal(zd__rpc_wire_parse(buf, build(&d, buf), &p), 0);
    assert_true(p.a == 5 && p.b == 6);
    rpc_wire_header_t hello = {.type = RPC_MSG_HELLO};
    assert_int_equal(zd__rpc_wire_parse(buf, build(&hello, buf), &p), 0);
}

static void test_malformed_headers_are_refused(void **state)
{
    (void)state;
    uint8_t buf[512], bad[512];
    rpc_wire_header_t h = good_call();
    size_t len = build(&h, buf);

    expect_bad(NULL, 0, "header of 0 bytes");
    expect_bad(buf, RPC_WIRE_FIXED - 1, "at least");
    memcpy(bad, buf, len);
    bad[0] = 'X';
    expect_bad(bad, len, "bad magic");
    memcpy(bad, buf, len);
    bad[2] = 1;
    expect_bad(bad, len, "version 1 not supported");
    memcpy(bad, buf, len);
    bad[2] = 3;
    expect_bad(bad, len, "version 3 not supported");
    memcpy(bad, buf, len);
    bad[3] = 99;
    expect_bad(bad, len, "unknown message type 99");
    memcpy(bad, buf, len);
    bad[3] = RPC_MSG_EXT_FIRST;
    expect_bad(bad, len, "unknown message type");
    memcpy(bad, buf, len);
    bad[5] = 0x80;
    expect_bad(bad, len, "unknown flags");
    memcpy(bad, buf, len);
    bad[53] = 1;
    expect_bad(bad, len, "reserved");
    /* Lengths that do not add up: truncated, trailing bytes, absurd. */
    expect_bad(buf, len - 1, "declares");
    memcpy(bad, buf, len);
    bad[len] = 0;
    expect_bad(bad, len + 1, "declares");
    memcpy(bad, buf, len);
    bad[12] = 0xff, bad[13] = 0xff, bad[14] = 0xff, bad[15] = 0x7f;
    expect_bad(bad, len, "hook metadata");
    memcpy(bad, buf, len);
    bad[40] = 0xff, bad[41] = 0xff, bad[42] = 0xff, bad[43] = 0xff;
    expect_bad(bad, len, "value metadata");
    memcpy(bad, buf, len);
    bad[44] = 0xff, bad[45] = 0xff;
    expect_bad(bad, len, "tensor frames");
    memcpy(bad, buf, len);
    bad[10] = 0, bad[11] = 1; /* fn_len 256 */
    expect_bad(bad, len, "function name of 256 bytes");
    /* Fields each type must or must not have. */
    rpc_wire_header_t x = good_call();
    x.id = 0;
    expect_bad(buf, build(&x, buf), "request id 0");
    x = good_call();
    x.fn = "a b";
    expect_bad(buf, build(&x, buf), "function name with byte 0x20");
    x = good_call();
    x.fn = NULL, x.fn_len = 0;
    expect_bad(buf, build(&x, buf), "CALL without a function name");
    x = good_call();
    x.meta = NULL, x.meta_len = 0;
    expect_bad(buf, build(&x, buf), "CALL without a value");
    rpc_wire_header_t r = {
        .type = RPC_MSG_REPLY, .id = 3, .fn = "f", .fn_len = 1, .meta = meta_none, .meta_len = 2};
    expect_bad(buf, build(&r, buf), "REPLY with a function name");
    rpc_wire_header_t e = {.type = RPC_MSG_ERROR, .id = 3};
    expect_bad(buf, build(&e, buf), "ERROR without a text");
    e.meta = (const uint8_t *)"a\0b", e.meta_len = 3;
    expect_bad(buf, build(&e, buf), "NUL byte");
    e.meta_len = 1, e.n_tensors = 2;
    expect_bad(buf, build(&e, buf), "ERROR with 2 tensor frames");
    rpc_wire_header_t d = {.type = RPC_MSG_RREF_USER_DELETE, .id = 3, .b = 1};
    expect_bad(buf, build(&d, buf), "without an RRef id");
    d.a = 1, d.b = 0;
    expect_bad(buf, build(&d, buf), "without a fork id");
    rpc_wire_header_t f = {
        .type = RPC_MSG_RREF_FETCH, .id = 3, .a = 1, .flags = RPC_WIRE_F_DEREF_FIRST};
    expect_bad(buf, build(&f, buf), "deref-first");
    f.flags = 0, f.meta = meta_none, f.meta_len = 2;
    expect_bad(buf, build(&f, buf), "RREF_FETCH with 2 bytes of value");
}

/*  ---- streamed messages: the flags, the pieces' headers, the table ---- */

static rpc_wire_header_t good_piece(void)
{
    rpc_wire_header_t h = {.type = RPC_MSG_REPLY,
                           .flags = RPC_WIRE_F_CHUNK,
                           .src = 1,
                           .dst = 2,
                           .id = 77,
                           .a = 5,
                           .n_tensors = 1};
    return h;
}

static void test_stream_headers(void **state)
{
    (void)state;
    uint8_t buf[512];
    rpc_wire_header_t p;
    /* A streamed call: its tensor frames and the table. */
    rpc_wire_header_t h = good_call();
    h.flags = RPC_WIRE_F_STREAMED;
    h.n_tensors = 2;
    assert_int_equal(zd__rpc_wire_parse(buf, build(&h, buf), &p), 0);
    assert_int_equal(p.flags, RPC_WIRE_F_STREAMED);
    h.n_tensors = 1;
    expect_bad(buf, build(&h, buf), "CALL with the streamed flag and 1 frames");
    rpc_wire_header_t f = {
        .type = RPC_MSG_RREF_FETCH, .id = 3, .a = 1, .n_tensors = 2, .flags = RPC_WIRE_F_STREAMED};
    expect_bad(buf, build(&f, buf), "RREF_FETCH with 2 tensor frames");
    rpc_wire_header_t e = {.type = RPC_MSG_ERROR,
                           .id = 3,
                           .meta = (const uint8_t *)"x",
                           .meta_len = 1,
                           .flags = RPC_WIRE_F_STREAMED};
    expect_bad(buf, build(&e, buf), "ERROR with the streamed flag");
    /* A piece, and everything a piece must not have. */
    rpc_wire_header_t x = good_piece();
    assert_int_equal(zd__rpc_wire_parse(buf, build(&x, buf), &p), 0);
    assert_true(p.a == 5 && p.id == 77 && p.n_tensors == 1);
    x.type = RPC_MSG_CALL;
    expect_bad(buf, build(&x, buf), "stream piece of type CALL");
    x = good_piece();
    x.flags |= RPC_WIRE_F_STREAMED;
    expect_bad(buf, build(&x, buf), "stream piece with flags 0x000c");
    x = good_piece();
    x.flags |= RPC_WIRE_F_INTERNAL;
    expect_bad(buf, build(&x, buf), "stream piece with flags");
    x = good_piece();
    x.meta = meta_none, x.meta_len = 2;
    expect_bad(buf, build(&x, buf), "value bytes");
    x = good_piece();
    x.fn = "f", x.fn_len = 1;
    expect_bad(buf, build(&x, buf), "function name");
    x = good_piece();
    x.extra = (const uint8_t *)"e", x.extra_len = 1;
    expect_bad(buf, build(&x, buf), "hook");
    x = good_piece();
    x.n_tensors = 2;
    expect_bad(buf, build(&x, buf), "stream piece with 2 frames");
    x.n_tensors = 0;
    expect_bad(buf, build(&x, buf), "stream piece with 0 frames");
    x = good_piece();
    x.b = 1;
    expect_bad(buf, build(&x, buf), "fork id or timeout");
    x = good_piece();
    x.timeout_ms = 10;
    expect_bad(buf, build(&x, buf), "fork id or timeout");
    x = good_piece();
    x.id = 0;
    expect_bad(buf, build(&x, buf), "request id 0");
}

static void expect_bad_table(const uint8_t *buf, size_t len, uint32_t n_frames, const char *why)
{
    uint32_t count = 99, chunk = 99;
    rpc_wire_stream_t *e = (rpc_wire_stream_t *)&count;
    assert_int_equal(zd__rpc_wire_stream_table_parse(buf, len, n_frames, &count, &chunk, &e), -1);
    assert_null(e);
    if (!strstr(zd_error_last(), why))
        fail_msg("expected \"%s\" in \"%s\"", why, zd_error_last());
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void test_stream_tables(void **state)
{
    (void)state;
    const rpc_wire_stream_t in[3] = {{1, 70000}, {2, 1}, {5, (uint64_t)3 << 32}};
    uint8_t buf[128], bad[128];
    size_t len = zd__rpc_wire_stream_table_size(3);
    assert_int_equal(len, 8 + 3 * 16);
    zd__rpc_wire_stream_table_write(in, 3, 1 << 20, buf);
    /* The layout is the one wire.h describes. */
    static const uint8_t head[] = {3, 0, 0, 0, 0,    0,    0x10, 0, 1, 0, 0, 0,
                                   0, 0, 0, 0, 0x70, 0x11, 1,    0, 0, 0, 0, 0};
    assert_memory_equal(buf, head, sizeof head);
    uint32_t count, chunk;
    rpc_wire_stream_t *out;
    assert_int_equal(zd__rpc_wire_stream_table_parse(buf, len, 7, &count, &chunk, &out), 0);
    assert_int_equal(count, 3);
    assert_int_equal(chunk, 1 << 20);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(out[i].frame, in[i].frame);
        assert_true(out[i].bytes == in[i].bytes);
    }
    free(out);

    expect_bad_table(NULL, 0, 7, "stream table of 0 bytes");
    expect_bad_table(buf, 7, 7, "stream table of 7 bytes");
    expect_bad_table(buf, len - 1, 7, "in 55 bytes (56 expected)");
    expect_bad_table(buf, len, 6, "frame index"); /* frame 5 is the table's place */
    expect_bad_table(buf, len, 3, "3 tensors for 2 tensor frames");
    expect_bad_table(buf, len, 1, "for 0 tensor frames");
    memcpy(bad, buf, len);
    put_le(bad, 0, 4);
    expect_bad_table(bad, 8, 7, "stream table of 0 tensors");
    memcpy(bad, buf, len);
    put_le(bad + 4, RPC_WIRE_MIN_CHUNK - 1, 4);
    expect_bad_table(bad, len, 7, "stream chunks of 4095 bytes");
    put_le(bad + 4, RPC_WIRE_MAX_CHUNK + 1, 4);
    expect_bad_table(bad, len, 7, "stream chunks of");
    memcpy(bad, buf, len);
    put_le(bad + 8 + 16, 1, 4); /* entry 1: frame 1 again */
    expect_bad_table(bad, len, 7, "entry 1 (frame 1, 1 bytes): frame index out of order");
    memcpy(bad, buf, len);
    put_le(bad + 8 + 4, 1, 4);
    expect_bad_table(bad, len, 7, "entry 0 (frame 1, 70000 bytes): reserved");
    memcpy(bad, buf, len);
    put_le(bad + 8 + 16 + 8, 0, 8);
    expect_bad_table(bad, len, 7, "entry 1 (frame 2, 0 bytes): size out of range");
    memcpy(bad, buf, len);
    put_le(bad + 8 + 32 + 8, RPC_WIRE_MAX_STREAM + 1, 8);
    expect_bad_table(bad, len, 7, "size out of range");
    memcpy(bad, buf, len);
    put_le(bad, 0xffffffff, 4);
    expect_bad_table(bad, len, 7, "stream table of 4294967295 tensors");
}

static void test_routing_ids(void **state)
{
    (void)state;
    uint8_t id[RPC_WIRE_SYNC_ID_LEN];
    zd__rpc_wire_identity(300, id);
    assert_int_equal(zd__rpc_wire_identity_rank(id, RPC_WIRE_ID_LEN), 300);
    zd__rpc_wire_sync_identity(7, 9, id);
    assert_int_equal(zd__rpc_wire_identity_rank(id, RPC_WIRE_SYNC_ID_LEN), 7);
    assert_int_equal(zd__rpc_wire_identity_rank(id, 4), -1);
    assert_int_equal(zd__rpc_wire_identity_rank("x\0\0", 3), -1);
    assert_int_equal(zd__rpc_wire_identity_rank("", 0), -1);
}

/*  ---- malformed messages to a live agent ---- */

/*  Waits for an answer on the raw socket: 1 with its type and text, 0 when
    none came within timeout_ms. */
static int raw_answer(intruder_t *r, int timeout_ms, int *type, char *text, size_t size)
{
    intruder_answer_t a;
    if (!intruder_answer(r, timeout_ms, &a))
        return 0;
    *type = a.type;
    snprintf(text, size, "%s", a.text);
    intruder_answer_clear(&a);
    return 1;
}

static int raw_send(intruder_t *r, rpc_wire_header_t *h, int n, const size_t *sizes)
{
    return intruder_send(r, h, n, NULL, sizes);
}

static int expect_error(intruder_t *r, rpc_wire_header_t *h, int n, const size_t *sizes,
                        const char *why)
{
    char text[512];
    int type;
    if (raw_send(r, h, n, sizes) < 0 || !raw_answer(r, 5000, &type, text, sizeof text)) {
        fprintf(stderr, "no answer (expected \"%s\")\n", why);
        return -1;
    }
    if (type != RPC_MSG_ERROR || !strstr(text, why)) {
        fprintf(stderr, "answer type %d \"%s\", expected an ERROR with \"%s\"\n", type, text, why);
        return -1;
    }
    return 0;
}

static rpc_wire_header_t call_to_1(intruder_t *r, const char *fn, const uint8_t *meta,
                                   size_t meta_len, uint32_t n_tensors)
{
    rpc_wire_header_t h = {.type = RPC_MSG_CALL,
                           .src = 0,
                           .dst = 1,
                           .id = ++r->next_id,
                           .fn = fn,
                           .fn_len = strlen(fn),
                           .meta = meta,
                           .meta_len = meta_len,
                           .n_tensors = n_tensors};
    return h;
}

static int world_garbage(const world_t *w)
{
    WCHECK(zd_rpc_register("add", world_h_add, NULL) == 0);
    WCHECK(zd_rpc_register_inline("owner_count", world_h_owner_count, NULL) == 0);
    zd_rpc_options_t o = world_rpc_options(w->port);
    WCHECK(zd_rpc_init(NULL, w->rank, w->world_size, &o) == 0);
    if (w->rank == 0) {
        zd_rpc_worker_info_t info;
        WCHECK(zd_rpc_get_worker_info_by_rank(1, &info) == 0);
        intruder_t r;
        /* Rank 0, a slot the agent never uses. */
        WCHECK(intruder_open_as(&r, info.endpoint, 0, 65534) == 0);
        static const uint8_t args_ok[] = {
            RPC_CODEC_VERSION, ZD_VALUE_LIST, 2, ZD_VALUE_INT, 2, ZD_VALUE_INT, 4};
        rpc_wire_header_t h = call_to_1(&r, "add", args_ok, sizeof args_ok, 0);
        h.src = 1;
        WCHECK(expect_error(&r, &h, 0, NULL, "header says rank 1") == 0);
        h = call_to_1(&r, "add", args_ok, sizeof args_ok, 0);
        h.dst = 0;
        WCHECK(expect_error(&r, &h, 0, NULL, "for rank 0 delivered to rank 1") == 0);
        h = call_to_1(&r, "add", args_ok, sizeof args_ok, 1);
        WCHECK(expect_error(&r, &h, 0, NULL, "announces 1 tensor frames but 0") == 0);
        static const uint8_t garbage[] = {RPC_CODEC_VERSION, 99, 1, 2, 3};
        h = call_to_1(&r, "add", garbage, sizeof garbage, 0);
        WCHECK(expect_error(&r, &h, 0, NULL, "bad arguments for \"add\"") == 0);
        /* A float32 tensor of 10 elements whose frame has 7 bytes. */
        static const uint8_t tensor10[] = {
            RPC_CODEC_VERSION, ZD_VALUE_LIST, 1, ZD_VALUE_TENSOR, ZD_FLOAT32, 0, 1, 10};
        h = call_to_1(&r, "add", tensor10, sizeof tensor10, 1);
        WCHECK(expect_error(&r, &h, 1, (size_t[]){7}, "40 bytes but its frame has 7") == 0);
        h = call_to_1(&r, "nosuch", args_ok, sizeof args_ok, 0);
        WCHECK(expect_error(&r, &h, 0, NULL, "unknown function \"nosuch\"") == 0);
        /* An RRef whose fork id claims to come from rank 5 of 2. */
        uint8_t rref_args[4 + RPC_RREF_WIRE_SIZE] = {RPC_CODEC_VERSION, ZD_VALUE_LIST, 1,
                                                     ZD_VALUE_RREF};
        uint8_t *w = rref_args + 4;
        w[0] = 1;            /* rref id: rank 0, counter 1 */
        w[8] = 1, w[14] = 5; /* fork id: rank 5 */
        h = call_to_1(&r, "add", rref_args, sizeof rref_args, 0);
        WCHECK(expect_error(&r, &h, 0, NULL, "RRef: inconsistent ids") == 0);
        /* Too many frames. */
        h = call_to_1(&r, "add", args_ok, sizeof args_ok, 0);
        uint8_t hbuf[256];
        size_t hlen = build(&h, hbuf);
        zmq_send(r.sock, hbuf, hlen, ZMQ_SNDMORE);
        for (int i = 0; i < RPC_CODEC_MAX_TENSORS + 5; i++)
            zmq_send(r.sock, "", 0, i + 1 < RPC_CODEC_MAX_TENSORS + 5 ? ZMQ_SNDMORE : 0);
        char text[512];
        int type;
        WCHECK(raw_answer(&r, 5000, &type, text, sizeof text) == 1);
        WCHECK(type == RPC_MSG_ERROR && strstr(text, "more than 4096 tensor frames"));
        /* A future version is refused, and answered since the id is readable. */
        h = call_to_1(&r, "add", args_ok, sizeof args_ok, 0);
        hlen = build(&h, hbuf);
        hbuf[2] = 9;
        zmq_send(r.sock, hbuf, hlen, 0);
        WCHECK(raw_answer(&r, 5000, &type, text, sizeof text) == 1);
        WCHECK(type == RPC_MSG_ERROR && strstr(text, "version 9 not supported"));
        /* Fetching an RRef nobody created: refused once its wait is over. */
        rpc_wire_header_t f = {.type = RPC_MSG_RREF_FETCH,
                               .src = 0,
                               .dst = 1,
                               .id = ++r.next_id,
                               .a = 12345,
                               .timeout_ms = 200};
        int64_t t0 = world_now_ms();
        WCHECK(expect_error(&r, &f, 0, NULL, "unknown RRef") == 0);
        WCHECK(world_now_ms() - t0 < 3000);
        /* Deleting or accepting unknown forks is harmless: acknowledged. */
        rpc_wire_header_t d = {.type = RPC_MSG_RREF_USER_DELETE,
                               .src = 0,
                               .dst = 1,
                               .id = ++r.next_id,
                               .a = 777,
                               .b = 778};
        WCHECK(raw_send(&r, &d, 0, NULL) == 0);
        WCHECK(raw_answer(&r, 5000, &type, text, sizeof text) == 1 && type == RPC_MSG_REPLY);
        d.type = RPC_MSG_RREF_CHILD_ACCEPT, d.id = ++r.next_id;
        WCHECK(raw_send(&r, &d, 0, NULL) == 0);
        WCHECK(raw_answer(&r, 5000, &type, text, sizeof text) == 1 && type == RPC_MSG_REPLY);
        /* Not ours at all: dropped without an answer. */
        zmq_send(r.sock, "hello?", 6, 0);
        zmq_send(r.sock, "", 0, 0);
        WCHECK(raw_answer(&r, 300, &type, text, sizeof text) == 0);
        /* A stranger's routing id: dropped. */
        intruder_t stranger;
        WCHECK(intruder_open(&stranger, info.endpoint, 0, "zzz", 3) == 0);
        h = call_to_1(&r, "add", args_ok, sizeof args_ok, 0);
        hlen = build(&h, hbuf);
        zmq_send(stranger.sock, hbuf, hlen, 0);
        intruder_close(&stranger);
        /* A well-formed call on the raw socket works, and so does the agent. */
        zd_value_t *two = zd__rpc_args("ii", (int64_t)2, (int64_t)4);
        intruder_answer_t ans;
        int64_t sum = 0;
        WCHECK(intruder_call_wait(&r, 1, "add", two, 5000, &ans) == 1);
        zd_value_unref(two);
        WCHECK(ans.type == RPC_MSG_REPLY && zd_value_get_int(ans.value, &sum) == 0 && sum == 6);
        intruder_answer_clear(&ans);
        intruder_close(&r);
        zd_value_t *res, *args = zd__rpc_args("ii", (int64_t)40, (int64_t)2);
        int64_t v;
        WCHECK(zd_rpc_sync(1, "add", args, -1, &res) == 0);
        WCHECK(zd_value_get_int(res, &v) == 0 && v == 42);
        zd_value_unref(res);
        zd_value_unref(args);
        WCHECK(zd_rpc_sync(1, "owner_count", NULL, -1, &res) == 0);
        WCHECK(zd_value_get_int(res, &v) == 0 && v == 0); /* no placeholder left */
        zd_value_unref(res);
    }
    WCHECK(zd_rpc_shutdown(true, 10000) == 0);
    return 0;
}

static void test_malformed_messages_to_a_live_agent(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(2, 60, world_garbage, NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_headers_round_trip),
        cmocka_unit_test(test_malformed_headers_are_refused),
        cmocka_unit_test(test_stream_headers),
        cmocka_unit_test(test_stream_tables),
        cmocka_unit_test(test_routing_ids),
        cmocka_unit_test(test_malformed_messages_to_a_live_agent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
