/* SPDX-License-Identifier: MIT */
/*  intruder.c: see intruder.h. */
#include "tests/support/intruder.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <zdist/error.h>
#include <zdist/tensor.h>
#include "rpc/value/codec.h"

int intruder_open(intruder_t *in, const char *endpoint, int rank, const void *id, size_t id_len)
{
    memset(in, 0, sizeof *in);
    in->rank = rank;
    in->next_id = ((uint64_t)rank << 48) | 0x7700000000ull;
    in->ctx = zmq_ctx_new();
    in->sock = in->ctx ? zmq_socket(in->ctx, ZMQ_DEALER) : NULL;
    if (!in->sock) {
        fprintf(stderr, "intruder: cannot create a socket: %s\n", zmq_strerror(errno));
        intruder_close(in);
        return -1;
    }
    int zero = 0;
    zmq_setsockopt(in->sock, ZMQ_LINGER, &zero, sizeof zero);
    if (id)
        zmq_setsockopt(in->sock, ZMQ_ROUTING_ID, id, id_len);
    if (zmq_connect(in->sock, endpoint) < 0) {
        fprintf(stderr, "intruder: cannot connect to %s: %s\n", endpoint, zmq_strerror(errno));
        intruder_close(in);
        return -1;
    }
    return 0;
}

int intruder_open_as(intruder_t *in, const char *endpoint, int rank, int slot)
{
    uint8_t id[RPC_WIRE_SYNC_ID_LEN];
    zd__rpc_wire_sync_identity(rank, slot, id);
    return intruder_open(in, endpoint, rank, id, sizeof id);
}

void intruder_close(intruder_t *in)
{
    if (in->sock)
        zmq_close(in->sock);
    if (in->ctx)
        zmq_ctx_term(in->ctx);
    in->sock = in->ctx = NULL;
}

static int send_zeros(void *sock, size_t size, int flags)
{
    /* One message of `size` zero bytes: built in place so that frames of
       any size cost one allocation, not a stack buffer. */
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, size) < 0)
        return -1;
    memset(zmq_msg_data(&m), 0, size);
    if (zmq_msg_send(&m, sock, flags) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    return 0;
}

int intruder_send(intruder_t *in, const rpc_wire_header_t *h, int n, const void *const *data,
                  const size_t *sizes)
{
    size_t len = zd__rpc_wire_size(h);
    uint8_t *buf = malloc(len);
    if (!buf)
        return -1;
    zd__rpc_wire_write(h, buf);
    int rc = zmq_send(in->sock, buf, len, n ? ZMQ_SNDMORE : 0);
    free(buf);
    if (rc < 0)
        return -1;
    for (int i = 0; i < n; i++) {
        int more = i + 1 < n ? ZMQ_SNDMORE : 0;
        rc = data && data[i] ? zmq_send(in->sock, data[i], sizes[i], more)
                             : send_zeros(in->sock, sizes[i], more);
        if (rc < 0)
            return -1;
    }
    return 0;
}

uint64_t intruder_call(intruder_t *in, int dst, const char *fn, const zd_value_t *args,
                       const void *extra, size_t extra_len)
{
    rpc_encoded_t e = {0};
    if (zd__value_encode(args, NULL, dst, &e) < 0) {
        fprintf(stderr, "intruder: cannot encode the arguments: %s\n", zd_error_last());
        return 0;
    }
    rpc_wire_header_t h = {.type = RPC_MSG_CALL,
                           .src = in->rank,
                           .dst = dst,
                           .id = ++in->next_id,
                           .fn = fn,
                           .fn_len = strlen(fn),
                           .extra = extra,
                           .extra_len = extra ? extra_len : 0,
                           .meta = e.meta,
                           .meta_len = e.meta_len,
                           .n_tensors = (uint32_t)e.n_tensors};
    const void **data = calloc((size_t)e.n_tensors + 1, sizeof *data);
    size_t *sizes = calloc((size_t)e.n_tensors + 1, sizeof *sizes);
    int rc = data && sizes ? 0 : -1;
    for (int i = 0; rc == 0 && i < e.n_tensors; i++) {
        data[i] = zd_tensor_raw(e.tensors[i]);
        sizes[i] = zd_tensor_nbytes(e.tensors[i]);
    }
    if (rc == 0)
        rc = intruder_send(in, &h, e.n_tensors, data, sizes);
    free(data);
    free(sizes);
    zd__rpc_encoded_clear(&e);
    return rc == 0 ? h.id : 0;
}

int intruder_answer(intruder_t *in, int timeout_ms, intruder_answer_t *out)
{
    memset(out, 0, sizeof *out);
    out->type = -1;
    zmq_pollitem_t it = {in->sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, timeout_ms) <= 0)
        return 0;
    zmq_msg_t head;
    zmq_msg_init(&head);
    if (zmq_msg_recv(&head, in->sock, 0) < 0) {
        zmq_msg_close(&head);
        return 0;
    }
    enum { MAX_FRAMES = RPC_CODEC_MAX_TENSORS };
    rpc_frame_t *frames = calloc(MAX_FRAMES, sizeof *frames);
    zmq_msg_t *msgs = calloc(MAX_FRAMES, sizeof *msgs);
    int n = 0;
    bool more = zmq_msg_more(&head);
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        zmq_msg_recv(&m, in->sock, 0);
        more = zmq_msg_more(&m);
        if (frames && msgs && n < MAX_FRAMES) {
            msgs[n] = m;
            n++;
        } else {
            zmq_msg_close(&m);
        }
    }
    out->n_frames = n;
    rpc_wire_header_t h;
    if (zd__rpc_wire_parse(zmq_msg_data(&head), zmq_msg_size(&head), &h) == 0) {
        out->type = h.type;
        out->id = h.id;
        if (h.type == RPC_MSG_ERROR)
            snprintf(out->text, sizeof out->text, "%.*s", (int)h.meta_len, (const char *)h.meta);
        if (h.type == RPC_MSG_REPLY && frames && msgs) {
            /* Borrowed frames (release NULL): the decoder copies them. */
            for (int i = 0; i < n; i++)
                frames[i] =
                    (rpc_frame_t){.data = zmq_msg_data(&msgs[i]), .size = zmq_msg_size(&msgs[i])};
            if (zd__value_decode(h.meta, h.meta_len, frames, n, NULL, h.src, &out->value) < 0)
                snprintf(out->text, sizeof out->text, "undecodable reply: %s", zd_error_last());
        }
    }
    for (int i = 0; msgs && i < n; i++)
        zmq_msg_close(&msgs[i]);
    free(frames);
    free(msgs);
    zmq_msg_close(&head);
    return 1;
}

void intruder_answer_clear(intruder_answer_t *a)
{
    zd_value_unref(a->value);
    a->value = NULL;
}

int intruder_call_wait(intruder_t *in, int dst, const char *fn, const zd_value_t *args,
                       int timeout_ms, intruder_answer_t *out)
{
    uint64_t id = intruder_call(in, dst, fn, args, NULL, 0);
    if (!id)
        return -1;
    for (;;) {
        /* Answers to earlier ids (a test's stray calls) are skipped; the
           deadline is per message, which bounds the total by the number of
           strays the test itself caused. */
        if (!intruder_answer(in, timeout_ms, out))
            return 0;
        if (out->id == id)
            return 1;
        intruder_answer_clear(out);
    }
}
