/* SPDX-License-Identifier: MIT */
/*  codec.c: values to metadata + tensor frames and back (format in codec.h).

    Decoding runs the same parser twice: a first pass only validates the
    whole blob and the frame sizes, without allocating anything, so that
    hostile input is rejected before any memory is touched; the second pass
    builds the value and can only fail on out-of-memory or an RRef the agent
    refuses. */
#include "rpc/value/codec.h"
#include "rpc/value/copy.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>

#define TENSOR_FLAG_REQUIRES_GRAD 0x01u

/*  Bounds the memory a blob can make us allocate: every node costs a value
    header (tens of bytes) while it may take a single byte on the wire. */
#define RPC_CODEC_MAX_NODES (1u << 22)

/*  ---- encoding ---- */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    zd_tensor_t **tensors;
    int n_tensors, cap_tensors;
    size_t n_nodes;
    const rpc_rref_codec_t *rrefs;
    int dst_rank;
} encoder_t;

static int put(encoder_t *e, const void *data, size_t n)
{
    if (n > RPC_CODEC_MAX_META - e->len)
        return zd_error_set("codec: value needs more than %u bytes of metadata",
                            RPC_CODEC_MAX_META);
    if (e->len + n > e->cap) {
        size_t cap = e->cap ? e->cap : 64;
        while (cap < e->len + n)
            cap *= 2;
        uint8_t *buf = realloc(e->buf, cap);
        if (!buf)
            return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                     "codec: out of memory for %zu bytes of metadata", cap);
        e->buf = buf;
        e->cap = cap;
    }
    if (n)
        memcpy(e->buf + e->len, data, n);
    e->len += n;
    return 0;
}

static int put_u8(encoder_t *e, unsigned v)
{
    uint8_t b = (uint8_t)v;
    return put(e, &b, 1);
}

static int put_varint(encoder_t *e, uint64_t v)
{
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v)
            b[n] |= 0x80;
        n++;
    } while (v);
    return put(e, b, n);
}

static int put_tensor(encoder_t *e, zd_tensor_t *t)
{
    if (e->n_tensors >= RPC_CODEC_MAX_TENSORS)
        return zd_error_set("codec: value holds more than %d tensors", RPC_CODEC_MAX_TENSORS);
    if (e->n_tensors == e->cap_tensors) {
        int cap = e->cap_tensors ? e->cap_tensors * 2 : 4;
        zd_tensor_t **ts = realloc(e->tensors, (size_t)cap * sizeof *ts);
        if (!ts)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "codec: out of memory");
        e->tensors = ts;
        e->cap_tensors = cap;
    }
    unsigned flags = zd_tensor_requires_grad(t) ? TENSOR_FLAG_REQUIRES_GRAD : 0;
    if (put_u8(e, (unsigned)zd_tensor_dtype(t)) < 0 || put_u8(e, flags) < 0 ||
        put_u8(e, (unsigned)zd_tensor_ndim(t)) < 0)
        return -1;
    for (int d = 0; d < zd_tensor_ndim(t); d++)
        if (put_varint(e, (uint64_t)zd_tensor_size(t, d)) < 0)
            return -1;
    e->tensors[e->n_tensors++] = zd_tensor_ref(t);
    return 0;
}

static int encode_node(encoder_t *e, const zd_value_t *v, int depth)
{
    if (!v)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "codec: NULL value");
    if (++e->n_nodes > RPC_CODEC_MAX_NODES)
        return zd_error_set("codec: value has more than %u parts", RPC_CODEC_MAX_NODES);
    zd_value_kind_t kind = zd_value_kind(v);
    if (put_u8(e, (unsigned)kind) < 0)
        return -1;
    switch (kind) {
    case ZD_VALUE_NONE:
        return 0;
    case ZD_VALUE_INT: {
        int64_t i;
        zd_value_get_int(v, &i);
        /* zigzag: small magnitudes of either sign take few bytes */
        uint64_t u = (uint64_t)i;
        return put_varint(e, (u << 1) ^ (0 - (u >> 63)));
    }
    case ZD_VALUE_FLOAT: {
        double f;
        zd_value_get_float(v, &f);
        uint64_t bits;
        memcpy(&bits, &f, sizeof bits);
        uint8_t b[8];
        for (int k = 0; k < 8; k++)
            b[k] = (uint8_t)(bits >> (8 * k));
        return put(e, b, 8);
    }
    case ZD_VALUE_STRING: {
        const char *s;
        zd_value_get_string(v, &s);
        size_t n = strlen(s);
        return put_varint(e, n) < 0 ? -1 : put(e, s, n);
    }
    case ZD_VALUE_BYTES: {
        const void *data;
        size_t n;
        zd_value_get_bytes(v, &data, &n);
        return put_varint(e, n) < 0 ? -1 : put(e, data, n);
    }
    case ZD_VALUE_TENSOR: {
        zd_tensor_t *t;
        zd_value_get_tensor(v, &t);
        return put_tensor(e, t);
    }
    case ZD_VALUE_RREF: {
        zd_rref_t *r;
        zd_value_get_rref(v, &r);
        if (!e->rrefs || !e->rrefs->encode)
            return zd_error_set("codec: value holds an RRef but no RRef codec was given");
        uint8_t wire[RPC_RREF_WIRE_SIZE];
        memset(wire, 0, sizeof wire);
        if (e->rrefs->encode(e->rrefs->arg, r, e->dst_rank, wire) < 0)
            return zd_error_wrap("codec: RRef");
        return put(e, wire, sizeof wire);
    }
    case ZD_VALUE_OBJECT:
        return zd_error_set("codec: a local object (%s) cannot be sent to another process; "
                            "send an RRef to it instead",
                            zd_value_object_type(v));
    case ZD_VALUE_LIST: {
        if (depth + 1 > RPC_CODEC_MAX_DEPTH)
            return zd_error_set("codec: lists nested more than %d deep", RPC_CODEC_MAX_DEPTH);
        size_t n = zd_list_len(v);
        if (put_varint(e, n) < 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (encode_node(e, zd_list_get(v, i), depth + 1) < 0)
                return -1;
        return 0;
    }
    }
    return zd_error_set("codec: cannot encode a value of kind %d", (int)kind);
}

int zd__value_encode(const zd_value_t *v, const rpc_rref_codec_t *rrefs, int dst_rank,
                     rpc_encoded_t *out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd__value_encode: NULL output");
    memset(out, 0, sizeof *out);
    encoder_t e = {0};
    e.rrefs = rrefs;
    e.dst_rank = dst_rank;
    if (put_u8(&e, RPC_CODEC_VERSION) < 0 || encode_node(&e, v, 0) < 0) {
        for (int i = 0; i < e.n_tensors; i++)
            zd_tensor_unref(e.tensors[i]);
        free(e.tensors);
        free(e.buf);
        return -1;
    }
    out->meta = e.buf;
    out->meta_len = e.len;
    out->tensors = e.tensors;
    out->n_tensors = e.n_tensors;
    return 0;
}

void zd__rpc_encoded_clear(rpc_encoded_t *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_tensors; i++)
        zd_tensor_unref(e->tensors[i]);
    free(e->tensors);
    free(e->meta);
    memset(e, 0, sizeof *e);
}

/*  ---- decoding ---- */

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    bool build; /* second pass: create values */
    size_t n_nodes;
    int n_tensors; /* descriptors seen so far */
    rpc_frame_t *frames;
    int n_frames;
    int next_frame; /* second pass: frames [0, next_frame) consumed */
    const rpc_rref_codec_t *rrefs;
    int src_rank;
} reader_t;

static int need(reader_t *r, size_t n, const char *what)
{
    if (n > r->len - r->pos)
        return zd_error_set("codec: truncated meta: %s at byte %zu needs %zu bytes, %zu remain",
                            what, r->pos, n, r->len - r->pos);
    return 0;
}

static int get_u8(reader_t *r, const char *what, unsigned *out)
{
    if (need(r, 1, what) < 0)
        return -1;
    *out = r->p[r->pos++];
    return 0;
}

/*  Shortest-form LEB128 only, so that every value has exactly one encoding. */
static int get_varint(reader_t *r, const char *what, uint64_t *out)
{
    size_t start = r->pos;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (r->pos >= r->len)
            return zd_error_set("codec: truncated meta: %s at byte %zu", what, start);
        unsigned b = r->p[r->pos++];
        if (i == 9 && b > 1)
            return zd_error_set("codec: %s at byte %zu overflows 64 bits", what, start);
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (b == 0 && i > 0)
                return zd_error_set("codec: %s at byte %zu is not in shortest form", what, start);
            *out = v;
            return 0;
        }
    }
    return zd_error_set("codec: %s at byte %zu overflows 64 bits", what, start);
}

/*  A length that must fit in what is left of the blob, each unit taking at
    least one byte: checked before anything is allocated for it. */
static int get_length(reader_t *r, const char *what, size_t *out)
{
    size_t at = r->pos;
    uint64_t n;
    if (get_varint(r, what, &n) < 0)
        return -1;
    if (n > r->len - r->pos)
        return zd_error_set("codec: %s at byte %zu declares %llu but only %zu bytes remain", what,
                            at, (unsigned long long)n, r->len - r->pos);
    *out = (size_t)n;
    return 0;
}

/*  Takes ownership of the frame: wraps it, or copies and releases it. */
static zd_tensor_t *frame_tensor(rpc_frame_t *fr, zd_tensor_dtype_t dtype, int ndim,
                                 const int64_t *shape)
{
    size_t es = zd_tensor_dtype_size(dtype);
    if (fr->peer_writable) {
        /* A check on the tensor must see the bytes it will use: a wrap
           would let the peer change them after the check (time of check,
           time of use). */
        zd_tensor_t *t = zd_tensor_new(dtype, shape, ndim);
        if (t)
            zd__rpc_copy(zd_tensor_raw(t), fr->data, fr->size);
        if (fr->release)
            fr->release(fr->data, fr->release_arg);
        return t;
    }
    if (fr->size && fr->release && (uintptr_t)fr->data % es == 0)
        return zd_tensor_wrap(dtype, shape, ndim, fr->data, fr->size, fr->release, fr->release_arg);
    /* Empty, misaligned or borrowed: the tensor gets its own storage. */
    zd_tensor_t *t = fr->size ? zd_tensor_from_data(dtype, shape, ndim, fr->data)
                              : zd_tensor_new(dtype, shape, ndim);
    if (fr->release)
        fr->release(fr->data, fr->release_arg);
    return t;
}

static int decode_tensor(reader_t *r, zd_value_t **out)
{
    size_t at = r->pos;
    int index = r->n_tensors;
    unsigned dtype, flags, ndim;
    if (get_u8(r, "tensor dtype", &dtype) < 0 || get_u8(r, "tensor flags", &flags) < 0 ||
        get_u8(r, "tensor ndim", &ndim) < 0)
        return -1;
    size_t es = zd_tensor_dtype_size((zd_tensor_dtype_t)dtype);
    if (es == 0)
        return zd_error_set("codec: tensor %d at byte %zu has unknown dtype %u", index, at, dtype);
    if (flags & ~TENSOR_FLAG_REQUIRES_GRAD)
        return zd_error_set("codec: tensor %d at byte %zu has unknown flags 0x%02x", index, at,
                            flags);
    if ((flags & TENSOR_FLAG_REQUIRES_GRAD) && dtype != ZD_FLOAT32)
        return zd_error_set("codec: tensor %d at byte %zu: only float32 tensors require grad",
                            index, at);
    if (ndim > ZD_TENSOR_MAX_DIMS)
        return zd_error_set("codec: tensor %d at byte %zu has %u dimensions (at most %d)", index,
                            at, ndim, ZD_TENSOR_MAX_DIMS);
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    int64_t numel = 1;
    for (unsigned d = 0; d < ndim; d++) {
        uint64_t dim;
        if (get_varint(r, "tensor dimension", &dim) < 0)
            return -1;
        if (dim > (uint64_t)INT64_MAX)
            return zd_error_set("codec: tensor %d dimension %u is negative", index, d);
        shape[d] = (int64_t)dim;
        /* the same bound as zd_tensor_new, so creating the tensor cannot fail */
        if (shape[d] > 0 && numel > INT64_MAX / 16 / shape[d])
            return zd_error_set("codec: tensor %d at byte %zu: shape too large", index, at);
        numel *= shape[d];
    }
    if (++r->n_tensors > RPC_CODEC_MAX_TENSORS)
        return zd_error_set("codec: more than %d tensors", RPC_CODEC_MAX_TENSORS);
    if (index >= r->n_frames)
        return 0; /* counted; the frame count check reports it */
    rpc_frame_t *fr = &r->frames[index];
    if ((uint64_t)numel > SIZE_MAX / es || (size_t)numel * es != fr->size)
        return zd_error_set("codec: tensor %d declares %lld bytes but its frame has %zu", index,
                            (long long)numel * (long long)es, fr->size);
    if (fr->size && !fr->data)
        return zd_error_set("codec: frame %d of %zu bytes has no data", index, fr->size);
    if (!r->build)
        return 0;
    r->next_frame = index + 1;
    zd_tensor_t *t = frame_tensor(fr, (zd_tensor_dtype_t)dtype, (int)ndim, shape);
    if (!t)
        return zd_error_wrap("codec: tensor %d", index);
    if ((flags & TENSOR_FLAG_REQUIRES_GRAD) && zd_tensor_set_requires_grad(t, true) < 0) {
        zd_tensor_unref(t);
        return zd_error_wrap("codec: tensor %d", index);
    }
    *out = zd_value_tensor(t);
    zd_tensor_unref(t);
    return *out ? 0 : -1;
}

static int decode_node(reader_t *r, int depth, zd_value_t **out)
{
    size_t at = r->pos;
    unsigned kind;
    if (get_u8(r, "kind", &kind) < 0)
        return -1;
    if (++r->n_nodes > RPC_CODEC_MAX_NODES)
        return zd_error_set("codec: more than %u values", RPC_CODEC_MAX_NODES);
    switch (kind) {
    case ZD_VALUE_NONE:
        if (r->build && !(*out = zd_value_none()))
            return -1;
        return 0;
    case ZD_VALUE_INT: {
        uint64_t u;
        if (get_varint(r, "int", &u) < 0)
            return -1;
        uint64_t z = (u >> 1) ^ (0 - (u & 1));
        int64_t i;
        memcpy(&i, &z, sizeof i);
        if (r->build && !(*out = zd_value_int(i)))
            return -1;
        return 0;
    }
    case ZD_VALUE_FLOAT: {
        if (need(r, 8, "float") < 0)
            return -1;
        uint64_t bits = 0;
        for (int k = 0; k < 8; k++)
            bits |= (uint64_t)r->p[r->pos + (size_t)k] << (8 * k);
        r->pos += 8;
        double f;
        memcpy(&f, &bits, sizeof f);
        if (r->build && !(*out = zd_value_float(f)))
            return -1;
        return 0;
    }
    case ZD_VALUE_STRING:
    case ZD_VALUE_BYTES: {
        const char *what = kind == ZD_VALUE_STRING ? "string length" : "bytes length";
        size_t n;
        if (get_length(r, what, &n) < 0)
            return -1;
        const uint8_t *data = r->p + r->pos;
        r->pos += n;
        if (kind == ZD_VALUE_STRING && memchr(data, 0, n))
            return zd_error_set("codec: string at byte %zu contains a NUL byte", at);
        if (!r->build)
            return 0;
        *out = kind == ZD_VALUE_STRING ? zd__value_string_len((const char *)data, n)
                                       : zd_value_bytes(data, n);
        return *out ? 0 : -1;
    }
    case ZD_VALUE_TENSOR:
        return decode_tensor(r, out);
    case ZD_VALUE_RREF: {
        if (!r->rrefs || !r->rrefs->decode)
            return zd_error_set("codec: RRef at byte %zu but no RRef codec was given", at);
        if (need(r, RPC_RREF_WIRE_SIZE, "RRef") < 0)
            return -1;
        const uint8_t *wire = r->p + r->pos;
        r->pos += RPC_RREF_WIRE_SIZE;
        if (!r->build)
            return 0;
        zd_rref_t *rref = NULL;
        if (r->rrefs->decode(r->rrefs->arg, wire, r->src_rank, &rref) < 0)
            return zd_error_wrap("codec: RRef at byte %zu", at);
        *out = zd__value_rref_adopt(rref);
        return *out ? 0 : -1;
    }
    case ZD_VALUE_LIST: {
        if (depth + 1 > RPC_CODEC_MAX_DEPTH)
            return zd_error_set("codec: lists nested more than %d deep at byte %zu",
                                RPC_CODEC_MAX_DEPTH, at);
        size_t n;
        if (get_length(r, "list length", &n) < 0)
            return -1;
        zd_value_t *list = NULL;
        if (r->build && !(list = zd_value_list(n)))
            return -1;
        for (size_t i = 0; i < n; i++) {
            zd_value_t *item = NULL;
            if (decode_node(r, depth + 1, r->build ? &item : NULL) < 0 ||
                (r->build && zd_list_append(list, item) < 0)) {
                zd_value_unref(list);
                return -1;
            }
        }
        if (r->build)
            *out = list;
        return 0;
    }
    }
    return zd_error_set("codec: unknown kind tag %u at byte %zu", kind, at);
}

static void release_frames(rpc_frame_t *frames, int from, int n)
{
    for (int i = from; i < n; i++)
        if (frames[i].release)
            frames[i].release(frames[i].data, frames[i].release_arg);
}

/*  One pass over the whole blob: the value, the frame count, no trailing bytes. */
static int decode_pass(reader_t *r, zd_value_t **out)
{
    unsigned version;
    if (get_u8(r, "version", &version) < 0)
        return -1;
    if (version != RPC_CODEC_VERSION)
        return zd_error_set("codec: meta version %u, expected %d", version, RPC_CODEC_VERSION);
    if (decode_node(r, 0, out) < 0)
        return -1;
    if (r->pos != r->len)
        return zd_error_set("codec: %zu trailing bytes after the value", r->len - r->pos);
    if (r->n_tensors != r->n_frames)
        return zd_error_set("codec: meta describes %d tensors but %d frames arrived", r->n_tensors,
                            r->n_frames);
    return 0;
}

int zd__value_decode(const void *meta, size_t meta_len, rpc_frame_t *frames, int n_frames,
                     const rpc_rref_codec_t *rrefs, int src_rank, zd_value_t **out)
{
    if (!out) {
        if (frames && n_frames > 0)
            release_frames(frames, 0, n_frames);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd__value_decode: NULL output");
    }
    *out = NULL;
    if (n_frames < 0 || (n_frames > 0 && !frames))
        return zd_error_set("codec: bad frame array (%d frames)", n_frames);
    if (n_frames > RPC_CODEC_MAX_TENSORS) {
        release_frames(frames, 0, n_frames);
        return zd_error_set("codec: %d frames (at most %d tensors)", n_frames,
                            RPC_CODEC_MAX_TENSORS);
    }
    if (!meta || meta_len == 0 || meta_len > RPC_CODEC_MAX_META) {
        release_frames(frames, 0, n_frames);
        if (meta_len > RPC_CODEC_MAX_META)
            return zd_error_set("codec: meta of %zu bytes (at most %u)", meta_len,
                                RPC_CODEC_MAX_META);
        return zd_error_set("codec: empty meta");
    }
    reader_t r = {0};
    r.p = meta;
    r.len = meta_len;
    r.frames = frames;
    r.n_frames = n_frames;
    r.rrefs = rrefs;
    r.src_rank = src_rank;
    if (decode_pass(&r, NULL) < 0) {
        release_frames(frames, 0, n_frames);
        return -1;
    }
    r.pos = 0;
    r.n_nodes = 0;
    r.n_tensors = 0;
    r.build = true;
    zd_value_t *v = NULL;
    if (decode_pass(&r, &v) < 0) {
        release_frames(frames, r.next_frame, n_frames);
        zd_value_unref(v);
        return -1;
    }
    *out = v;
    return 0;
}
