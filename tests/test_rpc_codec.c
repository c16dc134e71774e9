/* SPDX-License-Identifier: MIT */
/*  The value codec: round trips of every kind, zero copy, and malformed
    input fed straight to the decoder (truncations, byte flips, wrong frames,
    absurd lengths, depth bombs): always rejected or decoded, never a crash
    or a leak, every frame released exactly once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/value/codec.h"
#include <zdist/value.h>
#include "rpc/value/args.h"

/*  ---- a fake RRef world: RRefs are table entries, the wire form is the
    entry's index and the destination rank ---- */

#define N_RREFS 4

typedef struct {
    atomic_int refs;
} fake_rref_t;

static fake_rref_t rrefs[N_RREFS];
static int last_dst_rank, last_src_rank;

static void fake_ref(zd_rref_t *r)
{
    atomic_fetch_add(&((fake_rref_t *)r)->refs, 1);
}
static void fake_unref(zd_rref_t *r)
{
    atomic_fetch_sub(&((fake_rref_t *)r)->refs, 1);
}

static int fake_encode(void *arg, zd_rref_t *r, int dst_rank, uint8_t out[RPC_RREF_WIRE_SIZE])
{
    (void)arg;
    last_dst_rank = dst_rank;
    ptrdiff_t i = (fake_rref_t *)r - rrefs;
    if (i < 0 || i >= N_RREFS)
        return zd_error_set("fake: not an RRef of this test");
    memset(out, 0xA0, RPC_RREF_WIRE_SIZE);
    out[0] = (uint8_t)i;
    return 0;
}

static int fake_decode(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src_rank,
                       zd_rref_t **out)
{
    (void)arg;
    last_src_rank = src_rank;
    for (int k = 1; k < RPC_RREF_WIRE_SIZE; k++)
        if (in[k] != 0xA0)
            return zd_error_set("fake: bad RRef byte %d", k);
    if (in[0] >= N_RREFS)
        return zd_error_set("fake: unknown RRef %u", in[0]);
    fake_ref((zd_rref_t *)&rrefs[in[0]]);
    *out = (zd_rref_t *)&rrefs[in[0]];
    return 0;
}

static const rpc_rref_codec_t fake_codec = {fake_encode, fake_decode, NULL};

static zd_rref_t *rref(int i)
{
    return (zd_rref_t *)&rrefs[i];
}

static int rrefs_balanced(void)
{
    for (int i = 0; i < N_RREFS; i++)
        if (atomic_load(&rrefs[i].refs) != 1)
            return 0;
    return 1;
}

static int rref_refs_sum(void)
{
    int n = 0;
    for (int i = 0; i < N_RREFS; i++)
        n += atomic_load(&rrefs[i].refs);
    return n;
}

static int setup(void **state)
{
    (void)state;
    zd__value_set_rref_hooks(fake_ref, fake_unref);
    for (int i = 0; i < N_RREFS; i++)
        atomic_init(&rrefs[i].refs, 1);
    return 0;
}

/*  ---- received frames: heap copies whose release is counted ---- */

#define MAX_FRAMES 64

typedef struct {
    void *base;
    int released;
} slot_t;

typedef struct {
    rpc_frame_t frames[MAX_FRAMES];
    slot_t slots[MAX_FRAMES];
    int n;
} frameset_t;

static void slot_release(void *data, void *arg)
{
    (void)data;
    slot_t *s = arg;
    s->released++;
    free(s->base);
}

static void frames_add(frameset_t *fs, const void *data, size_t size, size_t misalign)
{
    assert_true(fs->n < MAX_FRAMES);
    int i = fs->n++;
    fs->slots[i].base = malloc(size + misalign + 1); /* malloc: 16-byte aligned */
    assert_non_null(fs->slots[i].base);
    fs->slots[i].released = 0;
    fs->frames[i] = (rpc_frame_t){.data = (char *)fs->slots[i].base + misalign,
                                  .size = size,
                                  .release = slot_release,
                                  .release_arg = &fs->slots[i]};
    if (size)
        memcpy(fs->frames[i].data, data, size);
}

static void frames_from(frameset_t *fs, const rpc_encoded_t *e, size_t misalign)
{
    fs->n = 0;
    for (int i = 0; i < e->n_tensors; i++)
        frames_add(fs, zd_tensor_raw(e->tensors[i]), zd_tensor_nbytes(e->tensors[i]), misalign);
}

static void assert_all_released_once(const frameset_t *fs)
{
    for (int i = 0; i < fs->n; i++)
        assert_int_equal(fs->slots[i].released, 1);
}

/*  encode -> frames -> decode; returns the decoded value (caller unrefs) */
static zd_value_t *round_trip(const zd_value_t *v, frameset_t *fs, size_t misalign)
{
    rpc_encoded_t e;
    assert_int_equal(zd__value_encode(v, &fake_codec, 3, &e), 0);
    frames_from(fs, &e, misalign);
    zd_value_t *out = NULL;
    if (zd__value_decode(e.meta, e.meta_len, fs->frames, fs->n, &fake_codec, 5, &out) < 0)
        fail_msg("decode failed: %s", zd_error_last());
    char a[512], b[512];
    if (!zd_value_equal(v, out))
        fail_msg("round trip changed %s into %s", zd_value_format(v, a, sizeof a),
                 zd_value_format(out, b, sizeof b));
    /* re-encoding gives the same bytes: the encoding is unique */
    rpc_encoded_t e2;
    assert_int_equal(zd__value_encode(out, &fake_codec, 3, &e2), 0);
    assert_int_equal(e2.meta_len, e.meta_len);
    assert_memory_equal(e2.meta, e.meta, e.meta_len);
    zd__rpc_encoded_clear(&e2);
    zd__rpc_encoded_clear(&e);
    zd__rpc_encoded_clear(&e); /* idempotent */
    return out;
}

static void check_round_trip(zd_value_t *v)
{
    int64_t before = zd_tensor_live_count();
    frameset_t fs;
    zd_value_t *out = round_trip(v, &fs, 0);
    zd_value_unref(out);
    assert_all_released_once(&fs);
    assert_int_equal(zd_tensor_live_count(), before);
    zd_value_unref(v);
}

/*  ---- round trips ---- */

static void test_scalars_round_trip(void **state)
{
    (void)state;
    check_round_trip(zd_value_none());
    int64_t ints[] = {0, 1, -1, 63, -64, 64, 300, INT64_MAX, INT64_MIN, INT64_MIN + 1};
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
        check_round_trip(zd_value_int(ints[i]));
    double floats[] = {0.0, -0.0, 1.5, -1e300, INFINITY, -INFINITY, NAN, 5e-324};
    for (size_t i = 0; i < sizeof floats / sizeof *floats; i++)
        check_round_trip(zd_value_float(floats[i]));
    check_round_trip(zd_value_string(""));
    check_round_trip(zd_value_string("fc1.weight \xc3\xa9\xe2\x82\xac"));
    check_round_trip(zd_value_bytes(NULL, 0));
    check_round_trip(zd_value_bytes("\0\1\2\0\xff", 5));
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    check_round_trip(zd_value_string(big));
}

static void test_meta_layout_is_pinned(void **state)
{
    (void)state;
    /* version 1, list of 3: int 1 (zigzag 2), none, string "ab" */
    zd_value_t *v = zd__rpc_args("ins", (int64_t)1, "ab");
    rpc_encoded_t e;
    assert_int_equal(zd__value_encode(v, NULL, 0, &e), 0);
    const uint8_t want[] = {1, 7, 3, 1, 2, 0, 3, 2, 'a', 'b'};
    assert_int_equal(e.meta_len, sizeof want);
    assert_memory_equal(e.meta, want, sizeof want);
    assert_int_equal(e.n_tensors, 0);
    zd__rpc_encoded_clear(&e);
    zd_value_unref(v);

    /* tensor descriptor: dtype, flags, ndim, varint dims; -300 -> zigzag 599 */
    int64_t shape[2] = {2, 200};
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, 2);
    zd_tensor_set_requires_grad(t, true);
    v = zd__rpc_args("ti", t, (int64_t)-300);
    assert_int_equal(zd__value_encode(v, NULL, 0, &e), 0);
    const uint8_t want2[] = {1, 7, 2, 5, 1, 1, 2, 2, 0xC8, 0x01, 1, 0xD7, 0x04};
    assert_int_equal(e.meta_len, sizeof want2);
    assert_memory_equal(e.meta, want2, sizeof want2);
    assert_int_equal(e.n_tensors, 1);
    assert_ptr_equal(e.tensors[0], t); /* a reference, not a copy */
    zd__rpc_encoded_clear(&e);
    zd_value_unref(v);
    zd_tensor_unref(t);
}

static void test_tensors_round_trip(void **state)
{
    (void)state;
    int64_t s23[2] = {2, 3}, s05[2] = {0, 5}, s4[1] = {4}, s111[3] = {1, 1, 1};
    float f[6] = {1, -2, 3.5f, NAN, -0.0f, 1e-30f};
    int64_t i64[4] = {INT64_MIN, -1, 0, INT64_MAX};
    uint8_t u8[4] = {0, 1, 128, 255};
    float scalar = 7;
    zd_tensor_t *ts[] = {
        zd_tensor_from_data(ZD_FLOAT32, s23, 2, f),
        zd_tensor_new(ZD_FLOAT32, s05, 2),                 /* empty */
        zd_tensor_from_data(ZD_FLOAT32, NULL, 0, &scalar), /* 0-dim */
        zd_tensor_from_data(ZD_INT64, s4, 1, i64),
        zd_tensor_from_data(ZD_UINT8, s4, 1, u8),
        zd_tensor_from_data(ZD_UINT8, s111, 3, u8),
        zd_tensor_new(ZD_INT64, (int64_t[]){0}, 1),
    };
    int n = (int)(sizeof ts / sizeof *ts);
    for (int i = 0; i < n; i++) {
        assert_non_null(ts[i]);
        check_round_trip(zd_value_tensor(ts[i]));
    }
    /* requires_grad travels with float tensors */
    assert_int_equal(zd_tensor_set_requires_grad(ts[0], true), 0);
    zd_value_t *v = zd_value_tensor(ts[0]);
    frameset_t fs;
    zd_value_t *out = round_trip(v, &fs, 0);
    zd_tensor_t *got;
    assert_int_equal(zd_value_get_tensor(out, &got), 0);
    assert_true(zd_tensor_requires_grad(got));
    zd_value_unref(out);
    zd_value_unref(v);
    assert_all_released_once(&fs);
    for (int i = 0; i < n; i++)
        zd_tensor_unref(ts[i]);
}

static void test_lists_and_rrefs_round_trip(void **state)
{
    (void)state;
    zd_tensor_t *t = zd_tensor_zeros2(3, 4);
    zd_tensor_data(t)[5] = 2;
    zd_value_t *v = zd__rpc_args("vrtvv", zd__rpc_args(""), rref(1), t,
                                 zd__rpc_args("rvs", rref(2), zd__rpc_args("tt", t, t), "x"),
                                 zd__rpc_args("fnb", 0.5, "zz", (size_t)2));
    assert_non_null(v);
    frameset_t fs;
    zd_value_t *out = round_trip(v, &fs, 0);
    assert_int_equal(fs.n, 3);
    assert_int_equal(last_dst_rank, 3);
    assert_int_equal(last_src_rank, 5);
    zd_rref_t *r;
    assert_int_equal(zd_value_get_rref(zd_list_get(out, 1), &r), 0);
    assert_ptr_equal(r, rref(1));
    assert_int_equal(atomic_load(&rrefs[1].refs), 3); /* ours, v's, out's */
    zd_value_unref(out);
    zd_value_unref(v);
    zd_tensor_unref(t);
    assert_all_released_once(&fs);
    assert_true(rrefs_balanced());

    /* 32 nested lists pass, 33 do not */
    zd_value_t *deep = zd_value_int(1);
    for (int d = 0; d < RPC_CODEC_MAX_DEPTH; d++)
        deep = zd__rpc_args("v", deep);
    check_round_trip(zd_value_ref(deep));
    deep = zd__rpc_args("v", deep);
    rpc_encoded_t e;
    assert_int_equal(zd__value_encode(deep, NULL, 0, &e), -1);
    assert_string_equal(zd_error_last(), "codec: lists nested more than 32 deep");
    assert_null(e.meta);
    assert_int_equal(e.n_tensors, 0);
    zd_value_unref(deep);
}

static void test_encode_errors_leave_nothing(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *t = zd_tensor_zeros1(2);
    zd_value_t *v = zd__rpc_args("tr", t, rref(0));
    rpc_encoded_t e;
    assert_int_equal(zd__value_encode(v, NULL, 0, &e), -1);
    assert_string_equal(zd_error_last(), "codec: value holds an RRef but no RRef codec was given");
    assert_null(e.meta);
    assert_null(e.tensors);
    zd_value_unref(v);

    fake_rref_t stranger = {1};
    v = zd__rpc_args("tr", t, (zd_rref_t *)&stranger);
    assert_int_equal(zd__value_encode(v, &fake_codec, 0, &e), -1);
    assert_string_equal(zd_error_last(), "codec: RRef: fake: not an RRef of this test");
    zd_value_unref(v);

    v = zd_value_list(RPC_CODEC_MAX_TENSORS + 1);
    for (int i = 0; i <= RPC_CODEC_MAX_TENSORS; i++)
        assert_int_equal(zd_list_append(v, zd_value_tensor(t)), 0);
    assert_int_equal(zd__value_encode(v, NULL, 0, &e), -1);
    assert_string_equal(zd_error_last(), "codec: value holds more than 4096 tensors");
    zd_value_unref(v);
    assert_int_equal(zd__value_encode(NULL, NULL, 0, &e), -1);
    zd_tensor_unref(t);
    assert_int_equal(zd_tensor_live_count(), before);
    assert_true(rrefs_balanced());
}

/*  A local object never goes on the wire, alone or deep in a list, and a
    refused encoding frees nothing but what it made. */
static int n_objects_freed;

static void object_free(void *p)
{
    (void)p;
    n_objects_freed++;
}

static void test_objects_are_never_encoded(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    int thing;
    n_objects_freed = 0;
    zd_value_t *obj = zd_value_object(&thing, object_free, "ParameterServer");
    rpc_encoded_t e;
    assert_int_equal(zd__value_encode(obj, NULL, 0, &e), -1);
    assert_string_equal(zd_error_last(),
                        "codec: a local object (ParameterServer) cannot be sent "
                        "to another process; send an RRef to it instead");
    assert_null(e.meta);
    zd_tensor_t *t = zd_tensor_zeros1(4);
    zd_value_t *v = zd__rpc_args("trv", t, rref(1), zd__rpc_args("iv", (int64_t)2, obj));
    assert_int_equal(zd__value_encode(v, &fake_codec, 0, &e), -1);
    assert_non_null(strstr(zd_error_last(), "a local object (ParameterServer)"));
    assert_null(e.meta);
    assert_null(e.tensors);
    assert_int_equal(n_objects_freed, 0);
    zd_value_unref(v);
    assert_int_equal(n_objects_freed, 1);
    zd_tensor_unref(t);
    assert_int_equal(zd_tensor_live_count(), before);
    assert_true(rrefs_balanced());
}

/*  ---- zero copy ---- */

static void test_aligned_frames_are_wrapped_not_copied(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *a = zd_tensor_zeros2(16, 16);
    zd_tensor_t *b = zd_tensor_new(ZD_INT64, (int64_t[]){3}, 1);
    zd_tensor_data(a)[17] = 4;
    zd_tensor_data_i64(b)[2] = -9;
    zd_value_t *v = zd__rpc_args("tt", a, b);
    frameset_t fs;
    zd_value_t *out = round_trip(v, &fs, 0);
    zd_tensor_t *ga, *gb;
    assert_int_equal(zd_rpc_arg_tensor(out, 0, &ga), 0);
    assert_int_equal(zd_rpc_arg_tensor(out, 1, &gb), 0);
    assert_ptr_equal(zd_tensor_raw(ga), fs.frames[0].data);
    assert_ptr_equal(zd_tensor_raw(gb), fs.frames[1].data);
    /* the frames live exactly as long as the tensors wrapping them */
    assert_int_equal(fs.slots[0].released, 0);
    zd_tensor_t *keep = zd_tensor_ref(ga);
    zd_value_unref(out);
    assert_int_equal(fs.slots[0].released, 0);
    assert_int_equal(fs.slots[1].released, 1);
    assert_float_equal(zd_tensor_data(keep)[17], 4, 0);
    zd_tensor_unref(keep);
    assert_all_released_once(&fs);
    zd_value_unref(v);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    assert_int_equal(zd_tensor_live_count(), before);
}

static void test_misaligned_and_borrowed_frames_are_copied(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    zd_tensor_t *a = zd_tensor_zeros1(5);
    zd_tensor_data(a)[3] = 1.25f;
    zd_tensor_t *b = zd_tensor_new(ZD_UINT8, (int64_t[]){3}, 1);
    zd_value_t *v = zd__rpc_args("tt", a, b);
    frameset_t fs;
    zd_value_t *out = round_trip(v, &fs, 1); /* odd addresses */
    zd_tensor_t *ga, *gb;
    assert_int_equal(zd_rpc_arg_tensor(out, 0, &ga), 0);
    assert_int_equal(zd_rpc_arg_tensor(out, 1, &gb), 0);
    assert_ptr_not_equal(zd_tensor_raw(ga), fs.frames[0].data);
    assert_int_equal((uintptr_t)zd_tensor_raw(ga) % 4, 0);
    assert_int_equal(fs.slots[0].released, 1);              /* copied, so released at once */
    assert_ptr_equal(zd_tensor_raw(gb), fs.frames[1].data); /* bytes are never misaligned */
    assert_int_equal(fs.slots[1].released, 0);
    zd_value_unref(out);
    assert_all_released_once(&fs);

    /* release == NULL: the memory is only lent for the call */
    rpc_encoded_t e;
    assert_int_equal(zd__value_encode(v, NULL, 0, &e), 0);
    rpc_frame_t lent[2];
    for (int i = 0; i < 2; i++)
        lent[i] = (rpc_frame_t){.data = zd_tensor_raw(e.tensors[i]),
                                .size = zd_tensor_nbytes(e.tensors[i])};
    assert_int_equal(zd__value_decode(e.meta, e.meta_len, lent, 2, NULL, 0, &out), 0);
    assert_int_equal(zd_rpc_arg_tensor(out, 0, &ga), 0);
    assert_ptr_not_equal(zd_tensor_raw(ga), zd_tensor_raw(a));
    assert_true(zd_value_equal(out, v));
    zd_value_unref(out);
    zd__rpc_encoded_clear(&e);
    zd_value_unref(v);
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    assert_int_equal(zd_tensor_live_count(), before);
}

/*  ---- malformed input ---- */

/*  Decodes meta against frames copied from `model` (or none), expecting
    failure; checks every frame was released once and nothing leaked. */
static void expect_reject(const uint8_t *meta, size_t len, const frameset_t *model, int n_frames,
                          const char *error_part)
{
    int64_t before = zd_tensor_live_count();
    int refs_before = rref_refs_sum();
    frameset_t fs = {.n = 0};
    for (int i = 0; i < n_frames; i++) {
        const rpc_frame_t *m = i < model->n ? &model->frames[i] : &model->frames[0];
        frames_add(&fs, m->data, m->size, 0);
    }
    zd_value_t *out = (zd_value_t *)&fs; /* must be reset to NULL */
    int rc = zd__value_decode(meta, len, fs.frames, fs.n, &fake_codec, 0, &out);
    if (rc != -1)
        fail_msg("accepted a bad blob of %zu bytes (expected \"%s\")", len, error_part);
    assert_null(out);
    if (error_part && !strstr(zd_error_last(), error_part))
        fail_msg("error \"%s\" does not mention \"%s\"", zd_error_last(), error_part);
    assert_all_released_once(&fs);
    assert_int_equal(zd_tensor_live_count(), before);
    assert_int_equal(rref_refs_sum(), refs_before);
}

/*  A valid value with every kind in it, encoded; frames in `model`. */
static zd_value_t *sample(rpc_encoded_t *e, frameset_t *model)
{
    int64_t shape[3] = {2, 1, 3};
    zd_tensor_t *a = zd_tensor_new(ZD_FLOAT32, shape, 3);
    zd_tensor_t *b = zd_tensor_new(ZD_INT64, (int64_t[]){2}, 1);
    zd_tensor_t *c = zd_tensor_new(ZD_UINT8, NULL, 0);
    zd_tensor_set_requires_grad(a, true);
    zd_value_t *v =
        zd__rpc_args("ntvfsbrv", a, zd__rpc_args("tn", b), -2.5, "name", "\0\1", (size_t)2, rref(3),
                     zd__rpc_args("ivt", (int64_t)-77, zd__rpc_args(""), c));
    zd_tensor_unref(a);
    zd_tensor_unref(b);
    zd_tensor_unref(c);
    assert_int_equal(zd__value_encode(v, &fake_codec, 1, e), 0);
    frames_from(model, e, 0);
    return v;
}

static void free_model(frameset_t *model)
{
    for (int i = 0; i < model->n; i++)
        free(model->slots[i].base);
}

static void test_every_truncation_is_rejected(void **state)
{
    (void)state;
    rpc_encoded_t e;
    frameset_t model;
    zd_value_t *v = sample(&e, &model);
    assert_int_equal(model.n, 3);
    for (size_t len = 0; len < e.meta_len; len++)
        expect_reject(e.meta, len, &model, model.n, len ? "codec: " : "empty meta");
    /* and the untruncated blob is fine */
    frameset_t fs = {.n = 0};
    for (int i = 0; i < model.n; i++)
        frames_add(&fs, model.frames[i].data, model.frames[i].size, 0);
    zd_value_t *out;
    assert_int_equal(zd__value_decode(e.meta, e.meta_len, fs.frames, fs.n, &fake_codec, 0, &out),
                     0);
    assert_true(zd_value_equal(v, out));
    zd_value_unref(out);
    assert_all_released_once(&fs);
    free_model(&model);
    zd__rpc_encoded_clear(&e);
    zd_value_unref(v);
    assert_true(rrefs_balanced());
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void test_random_byte_flips(void **state)
{
    (void)state;
    int64_t before = zd_tensor_live_count();
    rpc_encoded_t e;
    frameset_t model;
    zd_value_t *v = sample(&e, &model);
    uint8_t *buf = malloc(e.meta_len);
    int accepted = 0, rejected = 0;
    for (int iter = 0; iter < 50000; iter++) {
        memcpy(buf, e.meta, e.meta_len);
        int flips = 1 + (int)(next_rand() % 3);
        for (int k = 0; k < flips; k++) {
            size_t at = next_rand() % e.meta_len;
            buf[at] = next_rand() % 4 ? (uint8_t)(buf[at] ^ (1u << (next_rand() % 8)))
                                      : (uint8_t)next_rand();
        }
        frameset_t fs = {.n = 0};
        for (int i = 0; i < model.n; i++)
            frames_add(&fs, model.frames[i].data, model.frames[i].size, 0);
        zd_value_t *out = NULL;
        if (zd__value_decode(buf, e.meta_len, fs.frames, fs.n, &fake_codec, 0, &out) == 0) {
            accepted++;
            /* whatever decodes re-encodes to the very same bytes */
            rpc_encoded_t e2;
            assert_int_equal(zd__value_encode(out, &fake_codec, 0, &e2), 0);
            assert_int_equal(e2.meta_len, e.meta_len);
            assert_memory_equal(e2.meta, buf, e.meta_len);
            zd__rpc_encoded_clear(&e2);
            zd_value_unref(out);
        } else {
            rejected++;
            assert_null(out);
            assert_non_null(strstr(zd_error_last(), "codec: "));
        }
        assert_all_released_once(&fs);
    }
    /* both outcomes happen (e.g. flipped float bits decode fine) */
    assert_true(accepted > 100);
    assert_true(rejected > 100);
    free(buf);
    free_model(&model);
    zd__rpc_encoded_clear(&e);
    zd_value_unref(v);
    assert_int_equal(zd_tensor_live_count(), before);
    assert_true(rrefs_balanced());
}

static void test_wrong_frames(void **state)
{
    (void)state;
    rpc_encoded_t e;
    frameset_t model;
    zd_value_t *v = sample(&e, &model);
    expect_reject(e.meta, e.meta_len, &model, 2, "meta describes 3 tensors but 2 frames");
    expect_reject(e.meta, e.meta_len, &model, 4, "meta describes 3 tensors but 4 frames");
    expect_reject(e.meta, e.meta_len, &model, 0, "meta describes 3 tensors but 0 frames");

    /* tensor 1 (2 int64 = 16 bytes) gets a frame one byte short */
    frameset_t short_model = model;
    short_model.frames[1].size = 15;
    expect_reject(e.meta, e.meta_len, &short_model, 3,
                  "codec: tensor 1 declares 16 bytes but its frame has 15");
    frameset_t swapped = model;
    swapped.frames[0] = model.frames[2];
    swapped.frames[2] = model.frames[0];
    expect_reject(e.meta, e.meta_len, &swapped, 3, "tensor 0 declares 24 bytes");

    frameset_t fs = {.n = 0};
    for (int i = 0; i < 3; i++)
        frames_add(&fs, model.frames[i].data, model.frames[i].size, 0);
    fs.frames[1].data = NULL; /* its slot still frees the memory */
    zd_value_t *out;
    assert_int_equal(zd__value_decode(e.meta, e.meta_len, fs.frames, 3, &fake_codec, 0, &out), -1);
    assert_string_equal(zd_error_last(), "codec: frame 1 of 16 bytes has no data");
    assert_all_released_once(&fs);

    /* too many frames for any value: rejected before looking at meta */
    static rpc_frame_t frames[RPC_CODEC_MAX_TENSORS + 1];
    static int released[RPC_CODEC_MAX_TENSORS + 1];
    for (int i = 0; i <= RPC_CODEC_MAX_TENSORS; i++)
        frames[i] = (rpc_frame_t){.data = released};
    assert_int_equal(
        zd__value_decode(e.meta, e.meta_len, frames, RPC_CODEC_MAX_TENSORS + 1, NULL, 0, &out), -1);
    assert_string_equal(zd_error_last(), "codec: 4097 frames (at most 4096 tensors)");
    assert_int_equal(zd__value_decode(e.meta, e.meta_len, NULL, 2, NULL, 0, &out), -1);
    assert_int_equal(zd__value_decode(e.meta, e.meta_len, frames, -1, NULL, 0, &out), -1);

    free_model(&model);
    zd__rpc_encoded_clear(&e);
    zd_value_unref(v);
}

static void test_absurd_headers(void **state)
{
    (void)state;
    frameset_t none = {.n = 0};
    frameset_t one = {.n = 0};
    frames_add(&one, "abcdefgh", 8, 0);

    struct {
        const char *why;
        uint8_t meta[48];
        size_t len;
        int frames;
    } cases[] = {
        {"meta version 2, expected 1", {2, 0}, 2, 0},
        {"unknown kind tag 8 at byte 1", {1, 8}, 2, 0}, /* ZD_VALUE_OBJECT: no wire form */
        {"unknown kind tag 255", {1, 255}, 2, 0},
        {"1 trailing bytes", {1, 0, 0}, 3, 0},
        {"truncated meta: float", {1, 2, 0, 0, 0, 0, 0, 0, 0}, 9, 0},
        {"truncated meta: int", {1, 1, 0x80}, 3, 0},
        {"not in shortest form", {1, 1, 0x80, 0x00}, 4, 0},
        {"overflows 64 bits",
         {1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
         12,
         0},
        {"overflows 64 bits",
         {1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
         13,
         0},
        /* string length 2^62 in a 12-byte blob */
        {"string length at byte 2 declares 4611686018427387904 but only 0 bytes remain",
         {1, 3, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40},
         11,
         0},
        {"bytes length at byte 2 declares 5", {1, 4, 5, 'a', 'b'}, 5, 0},
        {"list length at byte 2 declares 1000000", {1, 7, 0xC0, 0x84, 0x3D, 0}, 6, 0},
        {"contains a NUL byte", {1, 3, 3, 'a', 0, 'b'}, 6, 0},
        {"unknown dtype 0", {1, 5, 0, 0, 0}, 5, 0},
        {"unknown dtype 4", {1, 5, 4, 0, 0}, 5, 0},
        {"unknown flags 0x02", {1, 5, 1, 2, 0}, 5, 0},
        {"only float32 tensors require grad", {1, 5, 2, 1, 0}, 5, 1},
        {"9 dimensions (at most 8)", {1, 5, 1, 0, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 14, 1},
        {"dimension 0 is negative",
         {1, 5, 1, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
         15,
         1},
        /* 2^40 x 2^40: the element count overflows */
        {"shape too large",
         {1, 5, 1, 0, 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20},
         17,
         1},
        /* (2^62, 0) is refused like zd_tensor_new refuses it, although empty */
        {"shape too large",
         {1, 5, 3, 0, 2, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40, 0},
         15,
         0},
        {"tensor 0 declares 4 bytes but its frame has 8", {1, 5, 1, 0, 1, 1}, 6, 1},
        {"meta describes 1 tensors but 0 frames arrived", {1, 5, 1, 0, 1, 2}, 6, 0},
        {"RRef at byte 2 needs 40 bytes, 2 remain", {1, 6, 0, 0xA0}, 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        expect_reject(cases[i].meta, cases[i].len, cases[i].frames ? &one : &none, cases[i].frames,
                      cases[i].why);
    free_model(&one);
}

static void test_rref_failure_after_tensors_releases_everything(void **state)
{
    (void)state;
    /* [tensor f32 (2), rref 0 (valid), rref 7 (refused)]: the tensor is
       wrapped and the first RRef taken before the second one fails. */
    uint8_t meta[128];
    size_t n = 0;
    const uint8_t head[] = {1, 7, 3, 5, 1, 0, 1, 2};
    memcpy(meta, head, sizeof head);
    n = sizeof head;
    for (int k = 0; k < 2; k++) {
        meta[n++] = 6;
        memset(meta + n, 0xA0, RPC_RREF_WIRE_SIZE);
        meta[n] = k ? 7 : 0;
        n += RPC_RREF_WIRE_SIZE;
    }
    frameset_t model = {.n = 0};
    float data[2] = {1, 2};
    frames_add(&model, data, sizeof data, 0);
    expect_reject(meta, n, &model, 1, "fake: unknown RRef 7");
    meta[sizeof head + 1 + RPC_RREF_WIRE_SIZE + 1] = 1; /* make the second one valid */
    frameset_t fs = {.n = 0};
    frames_add(&fs, data, sizeof data, 0);
    zd_value_t *out;
    assert_int_equal(zd__value_decode(meta, n, fs.frames, 1, &fake_codec, 0, &out), 0);
    assert_int_equal(atomic_load(&rrefs[0].refs), 2);
    assert_int_equal(atomic_load(&rrefs[1].refs), 2);
    zd_value_unref(out);
    assert_all_released_once(&fs);
    /* RRefs without an RRef codec are refused before anything is built */
    frameset_t fs2 = {.n = 0};
    frames_add(&fs2, data, sizeof data, 0);
    assert_int_equal(zd__value_decode(meta, n, fs2.frames, 1, NULL, 0, &out), -1);
    assert_string_equal(zd_error_last(), "codec: RRef at byte 8 but no RRef codec was given");
    assert_all_released_once(&fs2);
    free_model(&model);
}

static void test_depth_and_size_bombs(void **state)
{
    (void)state;
    /* a million nested one-item lists: refused at depth 33, no recursion */
    size_t len = 1 + 2 * 1000000 + 1;
    uint8_t *bomb = malloc(len);
    bomb[0] = 1;
    for (size_t i = 0; i < 1000000; i++) {
        bomb[1 + 2 * i] = 7;
        bomb[2 + 2 * i] = 1;
    }
    bomb[len - 1] = 0;
    frameset_t none = {.n = 0};
    expect_reject(bomb, len, &none, 0, "lists nested more than 32 deep at byte 65");

    /* exactly 32 levels are fine */
    size_t ok_len = 1 + 2 * 32 + 1;
    bomb[ok_len - 1] = 0;
    zd_value_t *out;
    assert_int_equal(zd__value_decode(bomb, ok_len, NULL, 0, NULL, 0, &out), 0);
    zd_value_unref(out);

    /* a list declaring 2^60 items, then many nones: rejected by length */
    bomb[1] = 7;
    const uint8_t huge[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10};
    memcpy(bomb + 2, huge, sizeof huge);
    memset(bomb + 2 + sizeof huge, 0, 1000);
    expect_reject(bomb, 2 + sizeof huge + 1000, &none, 0, "list length at byte 2 declares");

    /* more parts than any sane value: 2^22 + 1 nones in one list */
    size_t n_nodes = (1u << 22) + 1;
    uint8_t *many = calloc(1 + 1 + 4 + n_nodes, 1);
    const uint8_t list_head[] = {1, 7, 0x81, 0x80, 0x80, 0x02}; /* varint 2^22 + 1 */
    memcpy(many, list_head, sizeof list_head);
    expect_reject(many, sizeof list_head + n_nodes, &none, 0, "codec: more than 4194304 values");

    /* 4097 tensor descriptors (uint8 scalars) */
    const uint8_t tlist[] = {1, 7, 0x81, 0x20}; /* varint 4097 */
    memcpy(many, tlist, sizeof tlist);
    for (size_t i = 0; i < 4097; i++)
        memcpy(many + sizeof tlist + 4 * i, (uint8_t[]){5, 3, 0, 0}, 4);
    expect_reject(many, sizeof tlist + 4 * 4097, &none, 0, "codec: more than 4096 tensors");
    free(many);

    /* a meta longer than the limit is refused without being read */
    assert_int_equal(zd__value_decode(bomb, (size_t)RPC_CODEC_MAX_META + 1, NULL, 0, NULL, 0, &out),
                     -1);
    assert_string_equal(zd_error_last(), "codec: meta of 16777217 bytes (at most 16777216)");
    assert_int_equal(zd__value_decode(NULL, 0, NULL, 0, NULL, 0, &out), -1);
    assert_string_equal(zd_error_last(), "codec: empty meta");
    free(bomb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scalars_round_trip),
        cmocka_unit_test(test_meta_layout_is_pinned),
        cmocka_unit_test(test_tensors_round_trip),
        cmocka_unit_test(test_lists_and_rrefs_round_trip),
        cmocka_unit_test(test_encode_errors_leave_nothing),
        cmocka_unit_test(test_objects_are_never_encoded),
        cmocka_unit_test(test_aligned_frames_are_wrapped_not_copied),
        cmocka_unit_test(test_misaligned_and_borrowed_frames_are_copied),
        cmocka_unit_test(test_every_truncation_is_rejected),
        cmocka_unit_test(test_random_byte_flips),
        cmocka_unit_test(test_wrong_frames),
        cmocka_unit_test(test_absurd_headers),
        cmocka_unit_test(test_rref_failure_after_tensors_releases_everything),
        cmocka_unit_test(test_depth_and_size_bombs),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
