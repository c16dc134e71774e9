/* SPDX-License-Identifier: MIT */
/*  wire.c: writing and validating header frames (format in wire.h). */
#include "rpc/net/wire.h"

#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/value/codec.h"

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

size_t zd__rpc_wire_size(const rpc_wire_header_t *h)
{
    return RPC_WIRE_FIXED + h->fn_len + h->extra_len + h->meta_len;
}

void zd__rpc_wire_write(const rpc_wire_header_t *h, uint8_t *out)
{
    out[0] = 'Z';
    out[1] = 'D';
    out[2] = RPC_WIRE_VERSION;
    out[3] = h->type;
    put16(out + 4, h->flags);
    put16(out + 6, (uint16_t)h->src);
    put16(out + 8, (uint16_t)h->dst);
    put16(out + 10, (uint16_t)h->fn_len);
    put32(out + 12, (uint32_t)h->extra_len);
    put64(out + 16, h->id);
    put64(out + 24, h->a);
    put64(out + 32, h->b);
    put32(out + 40, (uint32_t)h->meta_len);
    put32(out + 44, h->n_tensors);
    put32(out + 48, h->timeout_ms);
    put32(out + 52, 0);
    uint8_t *p = out + RPC_WIRE_FIXED;
    if (h->fn_len)
        memcpy(p, h->fn, h->fn_len);
    p += h->fn_len;
    if (h->extra_len)
        memcpy(p, h->extra, h->extra_len);
    p += h->extra_len;
    if (h->meta_len)
        memcpy(p, h->meta, h->meta_len);
}

size_t zd__rpc_wire_stream_table_size(uint32_t count)
{
    return 8 + (size_t)count * RPC_WIRE_STREAM_ENTRY;
}

void zd__rpc_wire_stream_table_write(const rpc_wire_stream_t *entries, uint32_t count,
                                     uint32_t chunk, uint8_t *out)
{
    put32(out, count);
    put32(out + 4, chunk);
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *e = out + 8 + (size_t)i * RPC_WIRE_STREAM_ENTRY;
        put32(e, entries[i].frame);
        put32(e + 4, 0);
        put64(e + 8, entries[i].bytes);
    }
}

int zd__rpc_wire_stream_table_parse(const void *buf, size_t len, uint32_t n_frames, uint32_t *count,
                                    uint32_t *chunk, rpc_wire_stream_t **entries)
{
    const uint8_t *p = buf;
    *entries = NULL;
    if (!buf || len < 8)
        return zd_error_set("wire: stream table of %zu bytes (at least 8)", len);
    uint32_t n = get32(p);
    uint32_t c = get32(p + 4);
    if (n == 0 || n_frames < 2 || n > n_frames - 1)
        return zd_error_set("wire: stream table of %u tensors for %u tensor frames", n,
                            n_frames ? n_frames - 1 : 0);
    if (len != zd__rpc_wire_stream_table_size(n))
        return zd_error_set("wire: stream table of %u tensors in %zu bytes (%zu expected)", n, len,
                            zd__rpc_wire_stream_table_size(n));
    if (c < RPC_WIRE_MIN_CHUNK || c > RPC_WIRE_MAX_CHUNK)
        return zd_error_set("wire: stream chunks of %u bytes (%zu to %zu)", c, RPC_WIRE_MIN_CHUNK,
                            RPC_WIRE_MAX_CHUNK);
    rpc_wire_stream_t *e = malloc(n * sizeof *e);
    if (!e)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "wire: out of memory for a stream table of %u tensors", n);
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *q = p + 8 + (size_t)i * RPC_WIRE_STREAM_ENTRY;
        e[i].frame = get32(q);
        e[i].bytes = get64(q + 8);
        const char *bad = NULL;
        if (e[i].frame >= n_frames - 1 || (i > 0 && e[i].frame <= e[i - 1].frame))
            bad = "frame index out of order or range";
        else if (get32(q + 4) != 0)
            bad = "reserved field is not 0";
        else if (e[i].bytes == 0 || e[i].bytes > RPC_WIRE_MAX_STREAM)
            bad = "size out of range";
        if (bad) {
            zd_error_set("wire: stream table entry %u (frame %u, %llu bytes): %s", i, e[i].frame,
                         (unsigned long long)e[i].bytes, bad);
            free(e);
            return -1;
        }
    }
    *count = n;
    *chunk = c;
    *entries = e;
    return 0;
}

const char *zd__rpc_wire_type_name(int type)
{
    switch (type) {
    case RPC_MSG_HELLO:
        return "HELLO";
    case RPC_MSG_CALL:
        return "CALL";
    case RPC_MSG_REPLY:
        return "REPLY";
    case RPC_MSG_ERROR:
        return "ERROR";
    case RPC_MSG_REMOTE:
        return "REMOTE";
    case RPC_MSG_RREF_FETCH:
        return "RREF_FETCH";
    case RPC_MSG_RREF_USER_DELETE:
        return "RREF_USER_DELETE";
    case RPC_MSG_RREF_FORK_REQUEST:
        return "RREF_FORK_REQUEST";
    case RPC_MSG_RREF_CHILD_ACCEPT:
        return "RREF_CHILD_ACCEPT";
    case RPC_MSG_SHM_OFFER:
        return "SHM_OFFER";
    case RPC_MSG_SHM_ACCEPT:
        return "SHM_ACCEPT";
    case RPC_MSG_SHM_SEGMENT:
        return "SHM_SEGMENT";
    case RPC_MSG_SHM_MAPPED:
        return "SHM_MAPPED";
    }
    if (type >= RPC_MSG_EXT_FIRST && type <= RPC_MSG_EXT_LAST)
        return "EXTENSION";
    return "?";
}

static bool type_known(int type)
{
    return type >= RPC_MSG_HELLO && type <= RPC_MSG_SHM_MAPPED;
}

/*  A piece of a streamed message carries nothing but its number and data. */
static int check_chunk_fields(const rpc_wire_header_t *h)
{
    if (h->type != RPC_MSG_REPLY)
        return zd_error_set("wire: a stream piece of type %s (REPLY expected)",
                            zd__rpc_wire_type_name(h->type));
    if (h->flags != RPC_WIRE_F_CHUNK)
        return zd_error_set("wire: a stream piece with flags 0x%04x", h->flags);
    if (h->fn_len || h->extra_len || h->meta_len)
        return zd_error_set("wire: a stream piece with a function name, hook or value bytes");
    if (h->n_tensors != 1)
        return zd_error_set("wire: a stream piece with %u frames (1 expected)", h->n_tensors);
    if (h->b || h->timeout_ms)
        return zd_error_set("wire: a stream piece with fork id or timeout set");
    return 0;
}

/*  Which optional parts each type may carry. */
static int check_type_fields(const rpc_wire_header_t *h)
{
    const char *name = zd__rpc_wire_type_name(h->type);
    if (h->flags & RPC_WIRE_F_CHUNK)
        return check_chunk_fields(h);
    bool has_fn = h->type == RPC_MSG_CALL || h->type == RPC_MSG_REMOTE;
    if (has_fn && h->fn_len == 0)
        return zd_error_set("wire: %s without a function name", name);
    if (!has_fn && h->fn_len != 0)
        return zd_error_set("wire: %s with a function name", name);
    bool has_value = has_fn || h->type == RPC_MSG_REPLY;
    if (!has_value && h->n_tensors != 0)
        return zd_error_set("wire: %s with %u tensor frames", name, h->n_tensors);
    if (has_value && h->meta_len == 0)
        return zd_error_set("wire: %s without a value", name);
    if (h->type == RPC_MSG_ERROR) {
        if (h->meta_len == 0)
            return zd_error_set("wire: ERROR without a text");
        if (memchr(h->meta, 0, h->meta_len))
            return zd_error_set("wire: ERROR text with a NUL byte");
    } else if (!has_value && h->meta_len != 0) {
        return zd_error_set("wire: %s with %zu bytes of value", name, h->meta_len);
    }
    if ((h->flags & RPC_WIRE_F_DEREF_FIRST) && !has_fn)
        return zd_error_set("wire: %s with the deref-first flag", name);
    if ((h->flags & RPC_WIRE_F_STREAMED) && (!has_value || h->n_tensors < 2))
        return zd_error_set("wire: %s with the streamed flag and %u frames", name, h->n_tensors);
    if ((h->flags & RPC_WIRE_F_SHM) &&
        (!has_value || h->n_tensors < 2 || (h->flags & RPC_WIRE_F_STREAMED)))
        return zd_error_set("wire: %s with the shared-memory flag, flags 0x%04x and %u frames",
                            name, h->flags, h->n_tensors);
    bool rref_msg = h->type == RPC_MSG_REMOTE || h->type == RPC_MSG_RREF_FETCH ||
        h->type == RPC_MSG_RREF_USER_DELETE || h->type == RPC_MSG_RREF_FORK_REQUEST;
    if (rref_msg && h->a == 0)
        return zd_error_set("wire: %s without an RRef id", name);
    bool fork_msg = h->type == RPC_MSG_RREF_USER_DELETE || h->type == RPC_MSG_RREF_FORK_REQUEST ||
        h->type == RPC_MSG_RREF_CHILD_ACCEPT;
    if (fork_msg && h->b == 0)
        return zd_error_set("wire: %s without a fork id", name);
    return 0;
}

int zd__rpc_wire_parse(const void *buf, size_t len, rpc_wire_header_t *h)
{
    const uint8_t *p = buf;
    memset(h, 0, sizeof *h);
    if (!buf || len < RPC_WIRE_FIXED)
        return zd_error_set("wire: header of %zu bytes (at least %d expected)", len,
                            RPC_WIRE_FIXED);
    if (p[0] != 'Z' || p[1] != 'D')
        return zd_error_set("wire: bad magic 0x%02x%02x", p[0], p[1]);
    if (p[2] != RPC_WIRE_VERSION)
        return zd_error_set("wire: version %u not supported (this build speaks %d)", p[2],
                            RPC_WIRE_VERSION);
    h->type = p[3];
    h->flags = get16(p + 4);
    h->src = get16(p + 6);
    h->dst = get16(p + 8);
    h->fn_len = get16(p + 10);
    h->extra_len = get32(p + 12);
    h->id = get64(p + 16);
    h->a = get64(p + 24);
    h->b = get64(p + 32);
    h->meta_len = get32(p + 40);
    h->n_tensors = get32(p + 44);
    h->timeout_ms = get32(p + 48);
    if (!type_known(h->type))
        return zd_error_set("wire: unknown message type %u", h->type);
    if (h->flags & ~RPC_WIRE_F_KNOWN)
        return zd_error_set("wire: unknown flags 0x%04x", h->flags);
    if (get32(p + 52) != 0)
        return zd_error_set("wire: reserved field is not 0");
    if (h->id == 0 && h->type != RPC_MSG_HELLO)
        return zd_error_set("wire: %s with request id 0", zd__rpc_wire_type_name(h->type));
    if (h->fn_len > RPC_WIRE_MAX_FN)
        return zd_error_set("wire: function name of %zu bytes (at most %d)", h->fn_len,
                            RPC_WIRE_MAX_FN);
    if (h->extra_len > RPC_WIRE_MAX_EXTRA)
        return zd_error_set("wire: %zu bytes of hook metadata (at most %u)", h->extra_len,
                            RPC_WIRE_MAX_EXTRA);
    if (h->meta_len > RPC_CODEC_MAX_META)
        return zd_error_set("wire: value metadata of %zu bytes (at most %u)", h->meta_len,
                            RPC_CODEC_MAX_META);
    if (h->n_tensors > RPC_CODEC_MAX_TENSORS)
        return zd_error_set("wire: %u tensor frames (at most %d)", h->n_tensors,
                            RPC_CODEC_MAX_TENSORS);
    /* Each part is bounded above, so the sum cannot overflow. */
    size_t want = RPC_WIRE_FIXED + h->fn_len + h->extra_len + h->meta_len;
    if (want != len)
        return zd_error_set("wire: header declares %zu bytes but the frame has %zu", want, len);
    h->fn = (const char *)p + RPC_WIRE_FIXED;
    h->extra = p + RPC_WIRE_FIXED + h->fn_len;
    h->meta = h->extra + h->extra_len;
    for (size_t i = 0; i < h->fn_len; i++)
        if (h->fn[i] < 0x21 || h->fn[i] > 0x7e)
            return zd_error_set("wire: function name with byte 0x%02x at %zu",
                                (unsigned char)h->fn[i], i);
    if (h->fn_len == 0)
        h->fn = NULL;
    if (h->extra_len == 0)
        h->extra = NULL;
    if (h->meta_len == 0)
        h->meta = NULL;
    return check_type_fields(h);
}

void zd__rpc_wire_identity(int rank, uint8_t out[RPC_WIRE_ID_LEN])
{
    out[0] = 'r';
    out[1] = (uint8_t)(rank >> 8);
    out[2] = (uint8_t)rank;
}

void zd__rpc_wire_sync_identity(int rank, int slot, uint8_t out[RPC_WIRE_SYNC_ID_LEN])
{
    out[0] = 's';
    out[1] = (uint8_t)(rank >> 8);
    out[2] = (uint8_t)rank;
    out[3] = (uint8_t)(slot >> 8);
    out[4] = (uint8_t)slot;
}

int zd__rpc_wire_identity_rank(const void *id, size_t len)
{
    const uint8_t *p = id;
    if (len == RPC_WIRE_ID_LEN && p[0] == 'r')
        return p[1] << 8 | p[2];
    if (len == RPC_WIRE_SYNC_ID_LEN && p[0] == 's')
        return p[1] << 8 | p[2];
    return -1;
}

bool zd__rpc_wire_name_ok(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e)
            return false;
    return true;
}
