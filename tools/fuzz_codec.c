/* SPDX-License-Identifier: MIT */
/*  fuzz_codec.c: libFuzzer target for the value decoder (rpc/value/codec.h).

    Input layout (everything the network could send us, plus switches):

        byte 0      bits 0-3: number of tensor frames (0..15)
                    bit 4: frames start at an odd address (the copy path)
                    bit 5: frames are lent (release == NULL: the copy path)
        2*n bytes   frame sizes, u16 little-endian
        rest        metadata, then the frames' bytes taken from the end
                    (a frame gets fewer bytes when the input runs out)

    Checks, beyond "no crash, no sanitizer report": every frame is released
    exactly once; no tensor or RRef outlives the value; whatever decodes
    re-encodes to the very same metadata bytes and tensor bytes (the
    encoding is unique). A violated check aborts, which libFuzzer reports.

    Build and run with tools/fuzz.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/value/codec.h"

#define MAX_FRAMES 15

#define FUZZ_NAME "fuzz_codec"
#include "tools/fuzz_check.h"

/*  ---- RRefs: heap objects holding their 40 wire bytes ---- */

typedef struct {
    int refs;
    uint8_t wire[RPC_RREF_WIRE_SIZE];
} fuzz_rref_t;

static int live_rrefs;

static void rref_ref(zd_rref_t *r)
{
    ((fuzz_rref_t *)r)->refs++;
}

static void rref_unref(zd_rref_t *r)
{
    fuzz_rref_t *f = (fuzz_rref_t *)r;
    if (--f->refs == 0) {
        free(f);
        live_rrefs--;
    }
}

static int rref_encode(void *arg, zd_rref_t *r, int dst_rank, uint8_t out[RPC_RREF_WIRE_SIZE])
{
    (void)arg;
    (void)dst_rank;
    memcpy(out, ((fuzz_rref_t *)r)->wire, RPC_RREF_WIRE_SIZE);
    return 0;
}

/*  Refuses some RRefs, as the agent refuses unknown ids. */
static int zd__rref_decode(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src_rank,
                           zd_rref_t **out)
{
    (void)arg;
    (void)src_rank;
    if (in[0] == 0xFF)
        return zd_error_set("fuzz: unknown RRef");
    fuzz_rref_t *f = malloc(sizeof *f);
    if (!f)
        return zd_error_set("fuzz: out of memory");
    f->refs = 1;
    memcpy(f->wire, in, RPC_RREF_WIRE_SIZE);
    live_rrefs++;
    *out = (zd_rref_t *)f;
    return 0;
}

static const rpc_rref_codec_t rrefs = {rref_encode, zd__rref_decode, NULL};

/*  ---- frames: exact-size heap copies, so ASan sees any overread ---- */

typedef struct {
    void *base;
    int released;
} slot_t;

static void slot_release(void *data, void *arg)
{
    (void)data;
    slot_t *s = arg;
    s->released++;
    free(s->base);
    s->base = NULL;
}

static int verbose;

static int fuzz_value_codec(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int n_frames = data[0] & 0x0f;
    size_t misalign = (data[0] >> 4) & 1;
    int lent = (data[0] >> 5) & 1;
    size_t pos = 1;
    if (size < pos + 2 * (size_t)n_frames)
        return 0;
    size_t sizes[MAX_FRAMES], total = 0;
    for (int i = 0; i < n_frames; i++) {
        sizes[i] = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
        pos += 2;
        total += sizes[i];
    }
    const uint8_t *meta = data + pos;
    size_t rest = size - pos;
    size_t meta_len = rest > total ? rest - total : 0;
    size_t at = pos + meta_len;

    rpc_frame_t frames[MAX_FRAMES];
    slot_t slots[MAX_FRAMES];
    const uint8_t *src[MAX_FRAMES];
    for (int i = 0; i < n_frames; i++) {
        size_t n = sizes[i] < size - at ? sizes[i] : size - at;
        src[i] = data + at;
        slots[i].base = malloc(n + misalign > 0 ? n + misalign : 1);
        CHECK(slots[i].base, "out of memory");
        slots[i].released = 0;
        frames[i] = (rpc_frame_t){.data = (uint8_t *)slots[i].base + misalign,
                                  .size = n,
                                  .release = lent ? NULL : slot_release,
                                  .release_arg = &slots[i]};
        if (n)
            memcpy(frames[i].data, src[i], n);
        at += n;
    }

    int64_t tensors_before = zd_tensor_live_count();
    zd_value_t *v = NULL;
    int rc = zd__value_decode(meta, meta_len, frames, n_frames, &rrefs, 1, &v);
    if (verbose) {
        char text[512];
        fprintf(stderr, "fuzz_codec: %zu meta bytes, %d frames: %s\n", meta_len, n_frames,
                rc == 0 ? zd_value_format(v, text, sizeof text) : zd_error_last());
    }
    if (rc == 0) {
        CHECK(v, "decode returned 0 without a value");
        rpc_encoded_t e;
        CHECK(zd__value_encode(v, &rrefs, 1, &e) == 0, "re-encode failed: %s", zd_error_last());
        CHECK(e.meta_len == meta_len && memcmp(e.meta, meta, meta_len) == 0,
              "re-encoded meta differs (%zu bytes, was %zu)", e.meta_len, meta_len);
        CHECK(e.n_tensors == n_frames, "%d tensors for %d frames", e.n_tensors, n_frames);
        for (int i = 0; i < n_frames; i++)
            CHECK(zd_tensor_nbytes(e.tensors[i]) == frames[i].size &&
                      (frames[i].size == 0 ||
                       memcmp(zd_tensor_raw(e.tensors[i]), src[i], frames[i].size) == 0),
                  "tensor %d data differs from its frame", i);
        zd__rpc_encoded_clear(&e);
        zd_value_unref(v);
    } else {
        CHECK(v == NULL, "failed decode left a value");
        CHECK(strncmp(zd_error_last(), "codec: ", 7) == 0, "error without context: %s",
              zd_error_last());
    }
    for (int i = 0; i < n_frames; i++) {
        if (lent) {
            CHECK(slots[i].released == 0, "lent frame %d was released", i);
            free(slots[i].base);
        } else {
            CHECK(slots[i].released == 1, "frame %d released %d times", i, slots[i].released);
        }
    }
    CHECK(zd_tensor_live_count() == tensors_before, "tensors leaked");
    CHECK(live_rrefs == 0, "%d RRefs leaked", live_rrefs);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int ready;
    if (!ready) {
        zd__value_set_rref_hooks(rref_ref, rref_unref);
        verbose = getenv("FUZZ_CODEC_VERBOSE") != NULL;
        ready = 1;
    }
    return fuzz_value_codec(data, size);
}
