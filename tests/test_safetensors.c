/* SPDX-License-Identifier: MIT */
/*  safetensors files: round trips of every dtype, the bytes safetensors'
    own writer makes, tensors borrowing the mapping or copying it, metadata,
    every kind of bad file refused with the file and the problem named, and
    files moving both ways between zdist and PyTorch (tools/safetensors/
    st.py run by /usr/bin/python3; skipped when it cannot import torch). */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/safetensors.h>
#include "tests/support/fixtures.h"

/*  ---- files ---- */

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*n ? *n : 1);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

/*  Writes tmp_path(name): the 8-byte length len, hlen bytes of header,
    then n bytes of data. Returns the path (one of tmp_path's buffers). */
static const char *raw_file(const char *name, uint64_t len, const void *header, size_t hlen,
                            const void *data, size_t n)
{
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(len >> (8 * i));
    assert_int_equal(fwrite(b, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, hlen, f), hlen);
    if (n)
        assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    return path;
}

/*  A file whose header is json, its length its own. */
static const char *st_file(const char *name, const char *json, const void *data, size_t n)
{
    return raw_file(name, strlen(json), json, strlen(json), data, n);
}

/*  Whether /proc/self/maps has a mapping of path; with p, one holding p. */
static bool mapped(const char *path, const void *p)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1200];
    bool found = false;
    size_t len = strlen(path);
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        size_t n = strlen(line);
        unsigned long lo, hi;
        if (n < len || strcmp(line + n - len, path) != 0 || sscanf(line, "%lx-%lx", &lo, &hi) != 2)
            continue;
        found = !p || ((uintptr_t)p >= lo && (uintptr_t)p < hi);
    }
    fclose(f);
    return found;
}

/*  ---- tensors ---- */

static zd_tensor_t *f32_tensor(int ndim, const int64_t *shape, float first, float step)
{
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, shape, ndim);
    assert_non_null(t);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        zd_tensor_data(t)[i] = first + step * (float)i;
    return t;
}

static void add(zd_named_tensors_t *nt, const char *name, zd_tensor_t *t)
{
    assert_int_equal(zd_named_tensors_add(nt, name, t), 0);
    zd_tensor_unref(t);
}

/*  Writes nt with n metadata strings (key, value, ...): what the write
    returns. */
static int write_kv(const char *path, const zd_named_tensors_t *nt, const char *const *kv, int n)
{
    zd_strings_t *meta = zd_strings_from(kv, n);
    assert_non_null(meta);
    int rc = zd_safetensors_write(nt, path, meta);
    zd_strings_free(meta);
    return rc;
}

static void assert_same(const zd_tensor_t *a, const zd_tensor_t *b, const char *name)
{
    if (zd_tensor_dtype(a) != zd_tensor_dtype(b) || !zd_tensor_same_shape(a, b) ||
        memcmp(zd_tensor_raw(a), zd_tensor_raw(b), zd_tensor_nbytes(a)) != 0) {
        char sa[128], sb[128];
        fail_msg("%s: %s %s read back as %s %s, or its bytes differ", name,
                 zd_tensor_dtype_name(zd_tensor_dtype(a)), zd_tensor_shape_str(a, sa, sizeof sa),
                 zd_tensor_dtype_name(zd_tensor_dtype(b)), zd_tensor_shape_str(b, sb, sizeof sb));
    }
}

static void assert_names(const zd_named_tensors_t *nt, const char *const *names, int n)
{
    assert_int_equal(zd_named_tensors_len(nt), n);
    for (int i = 0; i < n; i++)
        if (strcmp(zd_named_tensors_name(nt, i), names[i]) != 0)
            fail_msg("tensor %d is '%s', expected '%s'", i, zd_named_tensors_name(nt, i), names[i]);
}

/*  ---- round trips ---- */

static void test_round_trip(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_named_tensors_t *nt = zd_named_tensors_new();
    add(nt, "fc.weight", f32_tensor(2, (int64_t[]){3, 4}, -1.5f, 0.125f));
    add(nt, "fc.bias", f32_tensor(1, (int64_t[]){3}, 2, -0.5f));
    add(nt, "scale", f32_tensor(0, NULL, 7.25f, 0));
    add(nt, "none", zd_tensor_new(ZD_FLOAT32, (int64_t[]){0}, 1));
    add(nt, "none_2d", zd_tensor_new(ZD_FLOAT32, (int64_t[]){2, 0, 3}, 3));
    add(nt, "eight_dims", f32_tensor(8, (int64_t[]){1, 2, 1, 2, 1, 2, 1, 2}, 0, 1));
    zd_tensor_t *i64 = zd_tensor_empty(ZD_INT64, (int64_t[]){2, 3}, 2);
    int64_t iv[6] = {INT64_MIN, -1, 0, 1, 1LL << 40, INT64_MAX};
    memcpy(zd_tensor_data_i64(i64), iv, sizeof iv);
    add(nt, "counts", i64);
    zd_tensor_t *u8 = zd_tensor_empty(ZD_UINT8, (int64_t[]){2, 3, 5}, 3);
    for (int i = 0; i < 30; i++)
        ((uint8_t *)zd_tensor_raw(u8))[i] = (uint8_t)(i * 37);
    add(nt, "pixels", u8);
    add(nt, "step", zd_tensor_new(ZD_INT64, NULL, 0));

    const char *path = tmp_path("round.safetensors");
    const char *meta[] = {"step", "200", "accuracy", "0.8541"};
    assert_int_equal(write_kv(path, nt, meta, 4), 0);
    zd_strings_t *kv;
    zd_named_tensors_t *back = zd_safetensors_read(path, &kv);
    if (!back)
        fail_msg("%s", zd_error_last());
    /* the file's order: I64, F32, U8, by name within each */
    const char *order[] = {"counts", "step",    "eight_dims", "fc.bias", "fc.weight",
                           "none",   "none_2d", "scale",      "pixels"};
    assert_names(back, order, 9);
    for (int i = 0; i < 9; i++) {
        const char *name = zd_named_tensors_name(back, i);
        assert_same(zd_named_tensors_find(nt, name), zd_named_tensors_tensor(back, i), name);
    }
    assert_int_equal(zd_strings_len(kv), 4);
    for (int i = 0; i < 4; i++)
        assert_string_equal(zd_strings_get(kv, i), meta[i]);
    assert_string_equal(zd_strings_value(kv, "accuracy"), "0.8541");
    assert_null(zd_strings_value(kv, "200")); /* a value is not a key */
    zd_strings_free(kv);

    /* without asking for the metadata; and what it reads writes the same bytes */
    zd_named_tensors_t *again = zd_safetensors_read(path, NULL);
    assert_non_null(again);
    const char *path2 = tmp_path("round2.safetensors");
    assert_int_equal(write_kv(path2, again, meta, 4), 0);
    size_t n1, n2;
    unsigned char *b1 = read_file(tmp_path("round.safetensors"), &n1);
    unsigned char *b2 = read_file(path2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    zd_named_tensors_free(again);
    zd_named_tensors_free(back);
    zd_named_tensors_free(nt);
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  The bytes safetensors' own writer gives for the same tensors: the
    expected files of its tests (test_serialization, test_empty,
    test_serialization_forced_alignement in safetensors/src/tensor.rs). */
static void expect_file(const char *path, const char *header, const void *data, size_t n)
{
    size_t got_n, hlen = strlen(header);
    unsigned char *got = read_file(path, &got_n);
    assert_int_equal(got_n, 8 + hlen + n);
    for (int i = 0; i < 8; i++)
        assert_int_equal(got[i], (unsigned char)((uint64_t)hlen >> (8 * i)));
    if (memcmp(got + 8, header, hlen) != 0)
        fail_msg("%s: header\n%.*s\nexpected\n%s", path, (int)hlen, (const char *)got + 8, header);
    assert_memory_equal(got + 8 + hlen, data, n);
    free(got);
}

static void test_upstream_bytes(void **state)
{
    (void)state;
    float v[6] = {0, 1, 2, 3, 4, 5};
    zd_named_tensors_t *nt = zd_named_tensors_new();
    add(nt, "attn.0", zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){1, 2, 3}, 3, v));
    assert_int_equal(zd_safetensors_write(nt, tmp_path("attn.0"), NULL), 0);
    expect_file(tmp_path("attn.0"),
                "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}", v,
                24);
    zd_named_tensors_free(nt);

    nt = zd_named_tensors_new();
    add(nt, "attn0", zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){1, 1, 2, 3}, 4, v));
    assert_int_equal(zd_safetensors_write(nt, tmp_path("attn0"), NULL), 0);
    expect_file(tmp_path("attn0"),
                "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],"
                "\"data_offsets\":[0,24]}}       ",
                v, 24);
    zd_named_tensors_free(nt);

    nt = zd_named_tensors_new();
    assert_int_equal(zd_safetensors_write(nt, tmp_path("empty"), NULL), 0);
    expect_file(tmp_path("empty"), "{}      ", NULL, 0);
    const char *fw[] = {"framework", "pt"};
    assert_int_equal(write_kv(tmp_path("empty_meta"), nt, fw, 2), 0);
    expect_file(tmp_path("empty_meta"), "{\"__metadata__\":{\"framework\":\"pt\"}}     ", NULL, 0);
    zd_named_tensors_t *back = zd_safetensors_read(tmp_path("empty"), NULL);
    assert_non_null(back);
    assert_int_equal(zd_named_tensors_len(back), 0);
    zd_named_tensors_free(back);
    zd_named_tensors_free(nt);
}

/*  Names and metadata that need escaping, and non-ASCII ones, travel. */
static void test_metadata(void **state)
{
    (void)state;
    zd_named_tensors_t *nt = zd_named_tensors_new();
    const char *odd = "q\"uote\\back\nline\ttab\x01\x1f\xc3\xa9\xe6\x97\xa5/";
    add(nt, odd, f32_tensor(1, (int64_t[]){2}, 1, 1));
    const char *meta[] = {"format", "pt", odd, odd, "empty", ""};
    const char *path = tmp_path("meta.safetensors");
    assert_int_equal(write_kv(path, nt, meta, 6), 0);
    size_t n;
    unsigned char *bytes = read_file(path, &n);
    /* escaped as serde_json and Python's json escape them */
    const char *esc = "\"q\\\"uote\\\\back\\nline\\ttab\\u0001\\u001f\xc3\xa9\xe6\x97\xa5/\"";
    assert_non_null(memmem(bytes, n, esc, strlen(esc)));
    assert_non_null(memmem(bytes, n, "{\"__metadata__\":{\"format\":\"pt\",", 31));
    free(bytes);
    zd_strings_t *kv;
    zd_named_tensors_t *back = zd_safetensors_read(path, &kv);
    assert_non_null(back);
    assert_string_equal(zd_named_tensors_name(back, 0), odd);
    assert_int_equal(zd_strings_len(kv), 6);
    for (int i = 0; i < 6; i++)
        assert_string_equal(zd_strings_get(kv, i), meta[i]);
    zd_strings_free(kv);
    zd_named_tensors_free(back);

    /* no metadata: no "__metadata__", and none read */
    assert_int_equal(zd_safetensors_write(nt, path, NULL), 0);
    back = zd_safetensors_read(path, &kv);
    assert_non_null(back);
    assert_non_null(kv);
    assert_int_equal(zd_strings_len(kv), 0);
    zd_strings_free(kv);
    zd_named_tensors_free(back);
    zd_named_tensors_free(nt);
}

/*  The values of the F64, F16 and BF16 tensors both sides write, as
    float32: 1/3, -2.5, 1e300 (past float's range), 5e-324 (below it);
    0, -0, 1, -2.5, 65504, 2^-24 (the least subnormal half), inf, NaN;
    1, -3.140625, 2^100, -2^-100. */
static const float want_f64[4] = {(float)(1.0 / 3), -2.5f, INFINITY, 0.0f};
static const float want_f16[8] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 0x1p-24f, INFINITY, NAN};
static const float want_bf16[4] = {1.0f, -3.140625f, 0x1p100f, -0x1p-100f};

/*  t is float32 and holds want bit for bit (any NaN for a NaN). */
static void assert_floats(const zd_tensor_t *t, const float *want, int64_t n, const char *name)
{
    assert_int_equal(zd_tensor_dtype(t), ZD_FLOAT32);
    assert_int_equal(zd_tensor_numel(t), n);
    for (int64_t i = 0; i < n; i++) {
        float got = zd_tensor_data(t)[i], w = want[i];
        if (isnan(w) ? !isnan(got) : memcmp(&got, &w, 4) != 0)
            fail_msg("%s[%lld] = %a, expected %a", name, (long long)i, got, w);
    }
}

/*  F16, BF16 and F64, which zdist reads as float32. */
static void test_converted_dtypes(void **state)
{
    (void)state;
    unsigned char data[64 + 16 + 8];
    double d[4] = {1.0 / 3, -2.5, 1e300, 5e-324};
    memcpy(data, d, 32);
    /* 0, -0, 1, -2.5, 65504, 2^-24 (the least subnormal), inf, NaN */
    uint16_t h[8] = {0x0000, 0x8000, 0x3c00, 0xc100, 0x7bff, 0x0001, 0x7c00, 0x7e00};
    memcpy(data + 32, h, 16);
    /* 1, -3.140625, 2^100, -2^-100 */
    uint16_t bf[4] = {0x3f80, 0xc049, 0x7180, 0x8d80};
    memcpy(data + 48, bf, 8);
    const char *json = "{\"d\":{\"dtype\":\"F64\",\"shape\":[4],\"data_offsets\":[0,32]},"
                       "\"h\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[32,48]},"
                       "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[48,56]}}";
    const char *path = st_file("converted.safetensors", json, data, 56);
    zd_named_tensors_t *nt = zd_safetensors_read(path, NULL);
    if (!nt)
        fail_msg("%s", zd_error_last());
    const char *order[] = {"d", "h", "b"};
    assert_names(nt, order, 3);
    assert_floats(zd_named_tensors_tensor(nt, 0), want_f64, 4, "d");
    assert_floats(zd_named_tensors_tensor(nt, 1), want_f16, 8, "h");
    assert_floats(zd_named_tensors_tensor(nt, 2), want_bf16, 4, "b");
    assert_int_equal(zd_tensor_ndim(zd_named_tensors_tensor(nt, 1)), 2);
    /* converted: copies, never the mapping */
    for (int k = 0; k < 3; k++)
        assert_false(mapped(path, zd_tensor_raw(zd_named_tensors_tensor(nt, k))));
    zd_named_tensors_free(nt);
    assert_false(mapped(path, NULL));
}

/*  Aligned tensors borrow the mapping, which lives as long as the last of
    them; misaligned ones are copies; writing into a borrowed tensor leaves
    the file as it was. */
static void test_borrowed_and_copied(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_named_tensors_t *nt = zd_named_tensors_new();
    add(nt, "w", f32_tensor(2, (int64_t[]){64, 64}, 0, 1));
    zd_tensor_t *i64 = zd_tensor_empty(ZD_INT64, (int64_t[]){5}, 1);
    for (int i = 0; i < 5; i++)
        zd_tensor_data_i64(i64)[i] = 1000 + i;
    add(nt, "n", i64);
    add(nt, "u", zd_tensor_new(ZD_UINT8, (int64_t[]){3}, 1));
    char path[600];
    snprintf(path, sizeof path, "%s", tmp_path("aligned.safetensors"));
    assert_int_equal(zd_safetensors_write(nt, path, NULL), 0);
    zd_named_tensors_free(nt);
    size_t size;
    unsigned char *before = read_file(path, &size);

    nt = zd_safetensors_read(path, NULL);
    assert_non_null(nt);
    for (int i = 0; i < 3; i++)
        if (!mapped(path, zd_tensor_raw(zd_named_tensors_tensor(nt, i))))
            fail_msg("'%s' does not borrow the mapping of %s", zd_named_tensors_name(nt, i), path);
    zd_tensor_t *w = zd_tensor_ref(zd_named_tensors_find(nt, "w"));
    zd_named_tensors_free(nt);
    assert_true(mapped(path, zd_tensor_raw(w))); /* w still holds it */
    assert_true(zd_tensor_data(w)[4095] == 4095.0f);
    zd_tensor_fill_(w, -1); /* trained in place */
    zd_tensor_unref(w);
    assert_false(mapped(path, NULL)); /* the last one gone: unmapped */
    size_t size2;
    unsigned char *after = read_file(path, &size2);
    assert_int_equal(size, size2);
    assert_memory_equal(before, after, size);
    free(before);
    free(after);

    /* A header of 8k+2 bytes: the data starts 2 bytes off alignment. The
       I64 and F32 tensors are copied, the U8 one borrowed. */
    const char *json = "{\"n\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                       "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                       "\"u\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[16,19]}}";
    char header[256];
    size_t hlen = strlen(json);
    memcpy(header, json, hlen);
    while (hlen % 8 != 2)
        header[hlen++] = ' ';
    unsigned char data[19];
    int64_t nv = -77;
    float fv[2] = {1.5f, -2.25f};
    memcpy(data, &nv, 8);
    memcpy(data + 8, fv, 8);
    memcpy(data + 16, "abc", 3);
    snprintf(path, sizeof path, "%s",
             raw_file("misaligned.safetensors", hlen, header, hlen, data, 19));
    nt = zd_safetensors_read(path, NULL);
    if (!nt)
        fail_msg("%s", zd_error_last());
    assert_int_equal(zd_tensor_data_i64(zd_named_tensors_find(nt, "n"))[0], -77);
    assert_memory_equal(zd_tensor_data(zd_named_tensors_find(nt, "f")), fv, 8);
    assert_memory_equal(zd_tensor_raw(zd_named_tensors_find(nt, "u")), "abc", 3);
    assert_false(mapped(path, zd_tensor_raw(zd_named_tensors_find(nt, "n"))));
    assert_false(mapped(path, zd_tensor_raw(zd_named_tensors_find(nt, "f"))));
    assert_true(mapped(path, zd_tensor_raw(zd_named_tensors_find(nt, "u"))));
    zd_named_tensors_free(nt);
    assert_false(mapped(path, NULL));
    assert_int_equal(zd_tensor_live_count(), live);
}

/*  ---- bad files ---- */

static void expect_refused(const char *path, const char *phrase)
{
    int64_t live = zd_tensor_live_count();
    zd_strings_t *kv = (zd_strings_t *)&kv;
    zd_named_tensors_t *nt = zd_safetensors_read(path, &kv);
    if (nt)
        fail_msg("%s was read, though %s", path, phrase);
    assert_null(kv);
    const char *e = zd_error_last();
    if (!strstr(e, path) || !strstr(e, phrase))
        fail_msg("%s: the error \"%s\" should name the file and say \"%s\"", path, e, phrase);
    printf("  %s\n", strstr(e, path) + strlen(path) + 2);
    assert_int_equal(zd_tensor_live_count(), live);
    assert_false(mapped(path, NULL));
}

/*  The file of one entry {"a": entry} with n bytes of data. */
static const char *one(const char *name, const char *entry, size_t n)
{
    static unsigned char zeros[64];
    char json[512];
    snprintf(json, sizeof json, "{\"a\":%s}", entry);
    return st_file(name, json, zeros, n);
}

static const char *F32_2 = "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";

static void test_bad_files(void **state)
{
    (void)state;
    unsigned char zeros[64] = {0};
    char json[512];
    const char *path = tmp_path("short");
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite("\x10\0\0\0\0", 1, 5, f);
    fclose(f);
    expect_refused(path, "5 bytes, too short");
    path = tmp_path("empty");
    f = fopen(path, "wb");
    assert_non_null(f);
    fclose(f);
    expect_refused(path, "0 bytes, too short");
    expect_refused(tmpdir(), "not a regular file");
    expect_refused(tmp_path("missing"), "cannot open");

    /* the header's length */
    expect_refused(raw_file("beyond", 1000, "{}", 2, NULL, 0), "longer than the 2 bytes");
    expect_refused(raw_file("huge_len", UINT64_MAX, "{}", 2, NULL, 0), "over the format's limit");
    expect_refused(raw_file("len_100mb", 100000001, "{}", 2, NULL, 0),
                   "a header of 100000001 bytes: over the format's limit");
    expect_refused(raw_file("len_zero", 0, "{}", 2, NULL, 0), "does not start with '{'");

    /* the data against the offsets */
    expect_refused(
        one("truncated", "{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}", 10),
        "go past the 10 bytes of data after the header (a truncated file?)");
    snprintf(json, sizeof json,
             "{\"a\":%s,\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
             "\"data_offsets\":[4,12]}}",
             F32_2);
    expect_refused(st_file("overlap", json, zeros, 12), "overlaps 'a', which ends at 8");
    snprintf(json, sizeof json,
             "{\"a\":%s,\"b\":{\"dtype\":\"U8\",\"shape\":[8],"
             "\"data_offsets\":[8,16]}}",
             F32_2);
    expect_refused(st_file("leaves", json, zeros, 12), "'b': data_offsets [8, 16] go past");
    snprintf(json, sizeof json,
             "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
             "\"data_offsets\":[12,20]},\"a\":%s}",
             F32_2);
    expect_refused(st_file("gap", json, zeros, 20),
                   "bytes 8 to 12 of the data belong to no "
                   "tensor (a gap before 'b')");
    expect_refused(one("trailing", F32_2, 12), "4 bytes after the last tensor's data");
    expect_refused(one("backwards", "{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[8,4]}", 8),
                   "ends before it begins");
    expect_refused(one("mismatch", "{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}", 8),
                   "shape (3) of F32 is 12 bytes, but data_offsets [0, 8] hold 8");
    expect_refused(
        one("empty_mismatch", "{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,4]}", 4),
        "shape (0) of F32 is 0 bytes");

    /* dtypes and shapes */
    expect_refused(
        one("dtype_unknown", "{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}", 8),
        "unknown dtype \"F33\"");
    expect_refused(one("dtype_i32", "{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8),
                   "dtype I32, which zdist does not read");
    expect_refused(
        one("dim_negative", "{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}", 0),
        "dimension 0 is negative");
    expect_refused(one("dims_huge",
                       "{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
                       "\"data_offsets\":[0,0]}",
                       0),
                   "multiply past 2^59");
    expect_refused(one("dim_too_big",
                       "{\"dtype\":\"U8\",\"shape\":[99999999999999999999],"
                       "\"data_offsets\":[0,0]}",
                       0),
                   "not valid JSON");
    expect_refused(one("dims_nine",
                       "{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                       "\"data_offsets\":[0,1]}",
                       1),
                   "9 dimensions");

    /* UTF-8 and JSON */
    expect_refused(st_file("utf8_bad", "{\"a\xff\":{}}", NULL, 0), "not valid UTF-8 (byte 3");
    expect_refused(st_file("utf8_overlong", "{\"a\xc0\xaf\":{}}", NULL, 0), "not valid UTF-8");
    expect_refused(st_file("utf8_surrogate", "{\"a\xed\xa0\x80\":{}}", NULL, 0), "not valid UTF-8");
    expect_refused(st_file("utf8_cut", "{\"a\":{}}\xe6\x97", NULL, 0), "not valid UTF-8");
    expect_refused(st_file("json_cut", "{\"a\":", NULL, 0), "not valid JSON");
    expect_refused(st_file("json_trailing", "{} x", NULL, 0), "not valid JSON");
    expect_refused(st_file("not_object", "[]", NULL, 0), "does not start with '{'");
    expect_refused(st_file("nul", "{\"a\\u0000b\":{}}", NULL, 0), "not valid JSON");
    snprintf(json, sizeof json, "{\"a\":%s,\"a\":%s}", F32_2, F32_2);
    expect_refused(st_file("duplicate", json, zeros, 8), "names a tensor or key twice");

    /* values of the wrong type */
    expect_refused(one("entry_number", "5", 0), "its entry is an integer, not an object");
    expect_refused(one("dtype_number", "{\"dtype\":5,\"shape\":[2],\"data_offsets\":[0,8]}", 8),
                   "dtype is an integer, not a string");
    expect_refused(
        one("shape_string", "{\"dtype\":\"U8\",\"shape\":\"2\",\"data_offsets\":[0,2]}", 2),
        "shape is a string, not an array");
    expect_refused(one("dim_real", "{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}", 2),
                   "dimension 0 is a real number, not an integer");
    expect_refused(one("offsets_three",
                       "{\"dtype\":\"U8\",\"shape\":[2],"
                       "\"data_offsets\":[0,1,2]}",
                       2),
                   "not an array of two integers");
    expect_refused(one("offsets_negative",
                       "{\"dtype\":\"U8\",\"shape\":[2],"
                       "\"data_offsets\":[-2,0]}",
                       2),
                   "two non-negative integers");
    expect_refused(one("no_offsets", "{\"dtype\":\"U8\",\"shape\":[2]}", 2),
                   "has no \"data_offsets\"");
    expect_refused(one("nested", "{\"dtype\":\"U8\",\"shape\":[[2]],\"data_offsets\":[0,2]}", 2),
                   "nests deeper than a safetensors header");
    snprintf(json, sizeof json, "{\"__metadata__\":[],\"a\":%s}", F32_2);
    expect_refused(st_file("meta_array", json, zeros, 8), "__metadata__ is an array");
    snprintf(json, sizeof json, "{\"__metadata__\":{\"k\":\"v\",\"step\":200},\"a\":%s}", F32_2);
    expect_refused(st_file("meta_number", json, zeros, 8),
                   "__metadata__ entry \"step\" is an integer, not a string");
    snprintf(json, sizeof json, "{\"\":%s}", F32_2);
    expect_refused(st_file("empty_name", json, zeros, 8), "empty name");

    /* sizes a file may ask for */
    size_t cap = 80 * (ZD_SAFETENSORS_MAX_TENSORS + 2) + 2 * 600000 + 4096;
    char *big = malloc(cap);
    assert_non_null(big);
    size_t len = (size_t)sprintf(big, "{\"");
    memset(big + len, 'x', ZD_SAFETENSORS_MAX_NAME + 1);
    len += ZD_SAFETENSORS_MAX_NAME + 1;
    len += (size_t)sprintf(big + len, "\":%s}", F32_2);
    expect_refused(st_file("long_name", big, zeros, 8), "a name of 1025 bytes (at most 1024)");
    /* one tensor too many: empty entries (the first pass counts them),
       then well-formed ones of no bytes (the entries are) */
    len = (size_t)sprintf(big, "{");
    for (int i = 0; i <= ZD_SAFETENSORS_MAX_TENSORS + 1; i++)
        len += (size_t)sprintf(big + len, "%s\"t%d\":{}", i ? "," : "", i);
    sprintf(big + len, "}");
    expect_refused(st_file("many_entries", big, NULL, 0), "more than 20000 tensors");
    len = (size_t)sprintf(big, "{");
    for (int i = 0; i <= ZD_SAFETENSORS_MAX_TENSORS; i++)
        len += (size_t)sprintf(big + len,
                               "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],"
                               "\"data_offsets\":[0,0]}",
                               i ? "," : "", i);
    sprintf(big + len, "}");
    expect_refused(st_file("many_tensors", big, NULL, 0), "more than 20000 tensors");
    /* one entry with an array of 600,000 numbers: what jansson would
       build for it is refused before it builds it */
    len = (size_t)sprintf(big,
                          "{\"a\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1],"
                          "\"x\":[0");
    for (int i = 0; i < 600000; i++) {
        big[len++] = ',';
        big[len++] = '0';
    }
    strcpy(big + len, "]}}");
    expect_refused(st_file("many_values", big, zeros, 1), "more JSON values than");
    free(big);

    /* what safetensors allows, zdist too: fields it does not know, and
       tensors listed out of their data's order */
    snprintf(json, sizeof json,
             "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10],"
             "\"extra\":[1]},\"a\":%s}",
             F32_2);
    zd_named_tensors_t *nt = zd_safetensors_read(st_file("lenient", json, zeros, 10), NULL);
    if (!nt)
        fail_msg("%s", zd_error_last());
    const char *order[] = {"a", "b"};
    assert_names(nt, order, 2);
    zd_named_tensors_free(nt);
}

/*  What zd_safetensors_write refuses, leaving the file as it was. */
static void test_write_refused(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s", tmp_path("kept.safetensors"));
    zd_named_tensors_t *nt = zd_named_tensors_new();
    add(nt, "a", f32_tensor(1, (int64_t[]){2}, 1, 1));
    assert_int_equal(zd_safetensors_write(nt, path, NULL), 0);
    size_t n;
    unsigned char *before = read_file(path, &n);

    const char *dup[] = {"k", "1", "k", "2"};
    assert_int_equal(write_kv(path, nt, dup, 4), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "metadata key \"k\" given twice"));
    const char *bad_utf8[] = {"k", "\xff"};
    assert_int_equal(write_kv(path, nt, bad_utf8, 2), -1);
    assert_non_null(strstr(zd_error_last(), "metadata value 0 is not UTF-8"));
    /* a NULL never gets into a list; an odd count is not key, value pairs */
    const char *null_value[] = {"k", NULL};
    assert_null(zd_strings_from(null_value, 2));
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(write_kv(path, nt, null_value, 1), -1);
    assert_non_null(strstr(zd_error_last(), "metadata of 1 strings"));
    add(nt, "__metadata__", f32_tensor(1, (int64_t[]){1}, 0, 0));
    assert_int_equal(zd_safetensors_write(nt, path, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "'__metadata__' is not one a file may hold"));
    zd_named_tensors_free(nt);
    nt = zd_named_tensors_new();
    add(nt, "\xc3", f32_tensor(1, (int64_t[]){1}, 0, 0));
    assert_int_equal(zd_safetensors_write(nt, path, NULL), -1);
    assert_int_equal(zd_safetensors_write(NULL, path, NULL), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    zd_named_tensors_free(nt);

    size_t n2;
    unsigned char *after = read_file(path, &n2);
    assert_int_equal(n, n2);
    assert_memory_equal(before, after, n);
    free(before);
    free(after);
    /* no temporary file left beside it */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", tmpdir());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int count = -1;
    assert_int_equal(fscanf(p, "%d", &count), 1);
    pclose(p);
    assert_int_equal(count, 0);

    /* a directory that is not there: named */
    nt = zd_named_tensors_new();
    assert_int_equal(zd_safetensors_write(nt, tmp_path("no/such/dir.safetensors"), NULL), -1);
    assert_non_null(strstr(zd_error_last(), "no/such/dir.safetensors: cannot create"));
    zd_named_tensors_free(nt);
}

/*  ---- PyTorch ---- */

/*  Runs tests/safetensors_torch.py FROM_ZDIST TO_ZDIST (see torch_script). */
static void torch_run(const char *from_zdist, const char *to_zdist)
{
    char args[1300], out[4096];
    snprintf(args, sizeof args, "%s %s", from_zdist, to_zdist);
    torch_script("safetensors_torch.py", args, out, sizeof out);
    assert_non_null(strstr(out, "identical to PyTorch's"));
}

static const char NOTE[] = "\xc3\xa9 \"q\" \\ \n\t\xe6\x97\xa5\xe6\x9c\xac";

/*  The tensors of safetensors_torch.py's reference(False). */
static zd_named_tensors_t *reference(void)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    add(nt, "layer.weight", f32_tensor(3, (int64_t[]){2, 3, 4}, -3, 0.25f));
    zd_tensor_t *steps = zd_tensor_empty(ZD_INT64, (int64_t[]){4}, 1);
    int64_t sv[4] = {INT64_MIN, -1, 0, INT64_MAX};
    memcpy(zd_tensor_data_i64(steps), sv, sizeof sv);
    add(nt, "steps", steps);
    zd_tensor_t *pixels = zd_tensor_empty(ZD_UINT8, (int64_t[]){16, 16}, 2);
    for (int i = 0; i < 256; i++)
        ((uint8_t *)zd_tensor_raw(pixels))[i] = (uint8_t)i;
    add(nt, "pixels", pixels);
    add(nt, "scale", f32_tensor(0, NULL, 7.5f, 0));
    add(nt, "empty", zd_tensor_new(ZD_FLOAT32, (int64_t[]){0, 5}, 2));
    return nt;
}

/*  zdist writes the reference tensors, PyTorch checks them (and that the
    file is the one it writes), then writes those of every dtype zdist
    reads, and zdist checks them. */
static void test_pytorch_both_ways(void **state)
{
    (void)state;
    char to_torch[600], path[600];
    snprintf(to_torch, sizeof to_torch, "%s", tmp_path("to_torch.safetensors"));
    snprintf(path, sizeof path, "%s", tmp_path("from_torch.safetensors"));
    zd_named_tensors_t *nt = reference();
    const char *meta[] = {"format", "pt", "note", NOTE};
    assert_int_equal(write_kv(to_torch, nt, meta, 4), 0);
    zd_named_tensors_free(nt);
    torch_run(to_torch, path);

    zd_strings_t *kv;
    nt = zd_safetensors_read(path, &kv);
    if (!nt)
        fail_msg("%s", zd_error_last());
    const char *order[] = {"steps", "f64",  "empty", "layer.weight",
                           "scale", "bf16", "f16",   "pixels"};
    assert_names(nt, order, 8);
    zd_named_tensors_t *ref = reference();
    for (int i = 0; i < zd_named_tensors_len(ref); i++) {
        const char *name = zd_named_tensors_name(ref, i);
        zd_tensor_t *t = zd_named_tensors_find(nt, name);
        assert_same(zd_named_tensors_tensor(ref, i), t, name);
        if (zd_tensor_numel(t) > 0 && !mapped(path, zd_tensor_raw(t)))
            fail_msg("'%s' was copied: PyTorch's file is aligned", name);
    }
    zd_named_tensors_free(ref);
    assert_floats(zd_named_tensors_find(nt, "f64"), want_f64, 4, "f64");
    assert_floats(zd_named_tensors_find(nt, "f16"), want_f16, 8, "f16");
    assert_floats(zd_named_tensors_find(nt, "bf16"), want_bf16, 4, "bf16");
    assert_int_equal(zd_strings_len(kv), 4);
    assert_string_equal(zd_strings_get(kv, 0), "format");
    assert_string_equal(zd_strings_get(kv, 1), "pt");
    assert_string_equal(zd_strings_get(kv, 2), "note");
    assert_string_equal(zd_strings_get(kv, 3), NOTE);
    zd_strings_free(kv);
    zd_named_tensors_free(nt);
}

static int setup(void **state)
{
    (void)state;
    return tmpdir_setup("safetensors");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_upstream_bytes),
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_converted_dtypes),
        cmocka_unit_test(test_borrowed_and_copied),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_write_refused),
        cmocka_unit_test(test_pytorch_both_ways),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
