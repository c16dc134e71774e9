/* SPDX-License-Identifier: MIT */
/*  codec.h: values on the wire. Private to the rpc module.

    A value travels as one metadata blob plus one frame per tensor, so tensor
    data is never copied into a buffer: the sender hands tensor memory to the
    transport, the receiver wraps the received frames into tensors.

    Metadata format (every integer little-endian):

        meta    := version node             version = RPC_CODEC_VERSION (1 byte)
        node    := kind:u8 body             kind = zd_value_kind_t (0..7)
        NONE    := (nothing)
        INT     := zigzag varint
        FLOAT   := 8 bytes, IEEE binary64 bit pattern
        STRING  := len:varint bytes         no NUL byte inside
        BYTES   := len:varint bytes
        TENSOR  := dtype:u8 flags:u8 ndim:u8 dim:varint * ndim
                   (the data is the next tensor frame, in order of appearance)
        RREF    := RPC_RREF_WIRE_SIZE bytes, written/read by rpc_rref_codec_t
        LIST    := count:varint node * count

    ZD_VALUE_OBJECT (8) has no wire form: a local object cannot leave its
    process, so encoding a value that holds one fails (naming its type and
    suggesting an RRef), and a decoder meeting tag 8 rejects it as unknown.
    The format is the same as before objects existed.

    varint = unsigned LEB128, at most 10 bytes, shortest form only. Tensor
    flags: bit 0 = requires_grad (float32 only); other bits must be 0. dtype
    is zd_tensor_dtype_t. Dimensions are checked exactly as zd_tensor_new checks
    them. Lists nest at most RPC_CODEC_MAX_DEPTH deep (a list inside the top
    list is depth 2). The encoding of a value is unique: decode then encode
    gives back the same bytes, which the fuzzer checks.

    Reference counting of RRefs inside values goes through hooks, so that
    value.c does not depend on the agent: the agent installs them at init. */
#ifndef ZDIST_RPC_CODEC_H
#define ZDIST_RPC_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/value.h>

#define RPC_CODEC_VERSION 1

/*  RRef reference counting used by zd_value_rref() and by freeing an RRef
    value. Implemented by the agent (rpc/agent/rref.c), which installs them with
    zd__value_set_rref_hooks() when it starts; until then both are no-ops.
    Either may be NULL (no-op). */
typedef void(rpc_rref_hook_fn)(zd_rref_t *r);
void zd__value_set_rref_hooks(rpc_rref_hook_fn *ref, rpc_rref_hook_fn *unref);

/*  An RRef value that takes over the caller's reference to r (instead of
    taking a new one). On failure (NULL) that reference is dropped through
    the unref hook. */
zd_value_t *zd__value_rref_adopt(zd_rref_t *r);

/*  A string of len bytes that need not be NUL-terminated (and must not
    contain NUL). New reference, or NULL. */
zd_value_t *zd__value_string_len(const char *s, size_t len);

/*  Values alive in this process. */
int64_t zd__value_live_count(void);

/*  A value serialised for the wire: one metadata blob (the value tree with
    tensors replaced by descriptors) plus the tensors, in order, to be sent
    as separate frames without copying: frame i is zd_tensor_raw(tensors[i]),
    zd_tensor_nbytes(tensors[i]) bytes. A sender hands each frame to ZeroMQ with
    zmq_msg_init_data and a free function that drops a zd_tensor_ref taken for
    it, since the transport may still read the memory after send returns
    (like PyTorch, the caller must not modify a tensor it has just sent).
    The receiver decodes with requires_grad set on float tensors that had it
    on the sender (flag bit 0); attaching autograd recv functions is the
    distributed autograd layer's business. */
typedef struct {
    uint8_t *meta; /* owned (free()) */
    size_t meta_len;
    zd_tensor_t **tensors; /* owned array of references (n_tensors) */
    int n_tensors;
} rpc_encoded_t;

/*  Fixed-size wire form of an RRef, filled/interpreted by the agent. */
#define RPC_RREF_WIRE_SIZE 40
typedef struct {
    /* Fill 40 bytes describing r for sending to peer `dst_rank`; may register
       a pending fork. Returns 0 or -1 (error set). */
    int (*encode)(void *arg, zd_rref_t *r, int dst_rank, uint8_t out[RPC_RREF_WIRE_SIZE]);
    /* Build an RRef (new reference in *out) from 40 received bytes sent by
       rank src_rank. Returns 0 or -1 (error set). */
    int (*decode)(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src_rank, zd_rref_t **out);
    void *arg;
} rpc_rref_codec_t;

/*  One received frame handed to the decoder, which takes ownership: it either
    wraps the memory into a tensor (zero copy, release called when the tensor
    dies) or calls release itself (on error, or when it had to copy because the
    data was misaligned). With release NULL the memory is only borrowed for the
    duration of the call, so the decoder copies it. Empty frames are never
    wrapped (the tensor gets its own storage). */
typedef struct {
    void *data;
    size_t size;
    zd_tensor_release_fn *release; /* may be NULL: memory not owned */
    void *release_arg;
    /* data is memory a peer can still write (a shared segment): the tensor
       made of it gets a copy, taken before anything looks at the bytes. */
    bool peer_writable;
} rpc_frame_t;

#define RPC_CODEC_MAX_DEPTH   32 /* list nesting */
#define RPC_CODEC_MAX_TENSORS 4096
/*  Values travel in the metadata, tensors in frames of their own: 16 MiB of
    metadata is millions of numbers or strings. It bounds the header frame,
    one term of the largest frame a socket accepts (net.h RPC_MAX_FRAME),
    and what a peer makes the decoder build (about 4 objects per 64 bytes). */
#define RPC_CODEC_MAX_META (16u << 20)

/*  Serialise v. rrefs may be NULL when v holds no RRef (else error). dst_rank is
    passed to rrefs->encode. Returns 0 or -1; on failure *out is left empty.
    Fails on a value holding a local object (ZD_VALUE_OBJECT) anywhere. */
int zd__value_encode(const zd_value_t *v, const rpc_rref_codec_t *rrefs, int dst_rank,
                     rpc_encoded_t *out);

/*  Frees what e owns and leaves it empty; NULL-safe, may be called twice. */
void zd__rpc_encoded_clear(rpc_encoded_t *e);

/*  Rebuild a value from meta and exactly n_frames tensor frames (consumed in all
    cases). Validates everything before touching memory: truncated meta, unknown
    kind tags, absurd lengths, nesting deeper than RPC_CODEC_MAX_DEPTH, tensor dtype
    unknown, ndim > ZD_TENSOR_MAX_DIMS, negative/overflowing dims, frame size !=
    numel*elemsize, frame count != descriptors, trailing bytes. Returns 0 and *out,
    or -1 with a clear error ("codec: tensor 2 declares 40 bytes but its frame has 36"). */
int zd__value_decode(const void *meta, size_t meta_len, rpc_frame_t *frames, int n_frames,
                     const rpc_rref_codec_t *rrefs, int src_rank, zd_value_t **out);

#endif
