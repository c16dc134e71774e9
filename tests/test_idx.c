/* SPDX-License-Identifier: MIT */
/*  IDX files: the real Fashion-MNIST files (gzip and plain), round trips,
    and every kind of broken file refused with a clear reason. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <zdist/error.h>
#include <zdist/dataset.h>
#include <zdist/idx.h>
#include "tests/support/fixtures.h"

#define FMNIST ZD_DATASET_SYSTEM_DIR

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

static void write_gz(const char *path, const void *data, size_t n)
{
    gzFile gz = gzopen(path, "wb");
    assert_non_null(gz);
    assert_int_equal(gzwrite(gz, data, (unsigned)n), (int)n);
    assert_int_equal(gzclose(gz), Z_OK);
}

static unsigned char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc(*n ? *n : 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, *n, f), *n);
    fclose(f);
    return buf;
}

/*  Decompresses src (.gz) into dst with zlib, as a user would with gunzip. */
static void gunzip_to(const char *src, const char *dst)
{
    gzFile in = gzopen(src, "rb");
    assert_non_null(in);
    FILE *out = fopen(dst, "wb");
    assert_non_null(out);
    static char buf[1 << 16];
    int n;
    while ((n = gzread(in, buf, sizeof buf)) > 0)
        assert_int_equal(fwrite(buf, 1, (size_t)n, out), (size_t)n);
    assert_int_equal(n, 0);
    gzclose(in);
    assert_int_equal(fclose(out), 0);
}

/*  An IDX header for type and dims, followed by `extra` bytes of data. */
static size_t make_idx(unsigned char *buf, int type, int ndim, const uint32_t *dims, size_t data)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = (unsigned char)type;
    buf[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++) {
        buf[4 + 4 * i] = (unsigned char)(dims[i] >> 24);
        buf[5 + 4 * i] = (unsigned char)(dims[i] >> 16);
        buf[6 + 4 * i] = (unsigned char)(dims[i] >> 8);
        buf[7 + 4 * i] = (unsigned char)dims[i];
    }
    size_t off = 4 + 4 * (size_t)ndim;
    for (size_t i = 0; i < data; i++)
        buf[off + i] = (unsigned char)(i * 7 + 3);
    return off + data;
}

/*  zd_idx_read must fail with a message containing `expect` and the path. */
static void expect_refused(const char *path, const char *expect)
{
    int64_t live = zd_tensor_live_count();
    zd_error_clear();
    assert_null(zd_idx_read(path));
    if (!strstr(zd_error_last(), expect) || !strstr(zd_error_last(), path))
        fail_msg("loading %s: error '%s' lacks '%s' or the path", path, zd_error_last(), expect);
    assert_int_equal(zd_tensor_live_count(), live);
}

static int setup(void **state)
{
    (void)state;
    return tmpdir_setup("test_idx");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

static bool have_fmnist(void)
{
    struct stat st;
    return stat(FMNIST "/t10k-labels-idx1-ubyte.gz", &st) == 0;
}

static void test_fashion_mnist_gz(void **state)
{
    (void)state;
    if (!have_fmnist())
        skip();
    static const struct {
        const char *file;
        int ndim;
        int64_t n;
        uint64_t sum;     /* of all bytes, computed with Python's gzip module */
        uint8_t first[4]; /* first labels */
    } files[] = {
        {"train-images-idx3-ubyte.gz", 3, 60000, 3431114169u, {0}},
        {"train-labels-idx1-ubyte.gz", 1, 60000, 270000, {9, 0, 0, 3}},
        {"t10k-images-idx3-ubyte.gz", 3, 10000, 573469082u, {0}},
        {"t10k-labels-idx1-ubyte.gz", 1, 10000, 45000, {9, 2, 1, 1}},
    };
    int64_t live = zd_tensor_live_count();
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", FMNIST, files[k].file);
        zd_tensor_t *t = zd_idx_read(path);
        if (!t)
            fail_msg("%s", zd_error_last());
        assert_int_equal(zd_tensor_dtype(t), ZD_UINT8);
        assert_int_equal(zd_tensor_ndim(t), files[k].ndim);
        assert_int_equal(zd_tensor_size(t, 0), files[k].n);
        if (files[k].ndim == 3) {
            assert_int_equal(zd_tensor_size(t, 1), 28);
            assert_int_equal(zd_tensor_size(t, 2), 28);
        }
        const uint8_t *d = zd_tensor_raw(t);
        uint64_t sum = 0;
        for (int64_t i = 0; i < zd_tensor_numel(t); i++)
            sum += d[i];
        assert_int_equal(sum, files[k].sum);
        if (files[k].ndim == 1)
            assert_memory_equal(d, files[k].first, 4);
        zd_tensor_unref(t);
    }
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_plain_copy_equals_gz(void **state)
{
    (void)state;
    if (!have_fmnist())
        skip();
    const char *names[] = {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
    for (int k = 0; k < 2; k++) {
        char gz[512], plain[512];
        snprintf(gz, sizeof gz, "%s/%s.gz", FMNIST, names[k]);
        snprintf(plain, sizeof plain, "%s", tmp_path(names[k]));
        gunzip_to(gz, plain);
        zd_tensor_t *a, *b;
        assert_non_null(a = zd_idx_read(gz));
        assert_non_null(b = zd_idx_read(plain));
        assert_true(zd_tensor_same_shape(a, b));
        assert_memory_equal(zd_tensor_raw(a), zd_tensor_raw(b), zd_tensor_nbytes(a));
        zd_tensor_unref(a);
        zd_tensor_unref(b);
        /* Detection is by content, not by name: plain data named .gz, gzip
           data named without .gz. */
        char renamed[600];
        snprintf(renamed, sizeof renamed, "%s.plain.gz", plain);
        assert_int_equal(rename(plain, renamed), 0);
        assert_non_null(a = zd_idx_read(renamed));
        zd_tensor_unref(a);
        unlink(renamed);
    }
    char gz_no_ext[512];
    snprintf(gz_no_ext, sizeof gz_no_ext, "%s", tmp_path("labels-compressed"));
    size_t n;
    unsigned char *raw = read_file(FMNIST "/t10k-labels-idx1-ubyte.gz", &n);
    write_file(gz_no_ext, raw, n);
    free(raw);
    zd_tensor_t *t;
    assert_non_null(t = zd_idx_read(gz_no_ext));
    assert_int_equal(zd_tensor_size(t, 0), 10000);
    zd_tensor_unref(t);
}

static void test_round_trip_f32_and_u8(void **state)
{
    (void)state;
    int64_t shape[3] = {2, 3, 5};
    zd_tensor_t *f = zd_tensor_new(ZD_FLOAT32, shape, 3), *u = zd_tensor_new(ZD_UINT8, shape, 3);
    for (int i = 0; i < 30; i++) {
        zd_tensor_data(f)[i] = (float)i * -0.37f + 1e-20f * (float)i;
        ((uint8_t *)zd_tensor_raw(u))[i] = (uint8_t)(i * 9);
    }
    const char *files[] = {"f.idx", "f.idx.gz", "u.idx", "u.idx.gz"};
    for (int k = 0; k < 4; k++) {
        zd_tensor_t *src = k < 2 ? f : u, *back;
        const char *p = tmp_path(files[k]);
        assert_int_equal(zd_idx_save(src, p), 0);
        assert_non_null(back = zd_idx_read(p));
        assert_int_equal(zd_tensor_dtype(back), zd_tensor_dtype(src));
        assert_true(zd_tensor_same_shape(back, src));
        assert_memory_equal(zd_tensor_raw(back), zd_tensor_raw(src), zd_tensor_nbytes(src));
        zd_tensor_unref(back);
    }
    size_t n;
    unsigned char *raw = read_file(tmp_path("f.idx"), &n);
    assert_int_equal(n, 4 + 12 + 30 * 4);
    static const unsigned char head[] = {0, 0, 0x0D, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 5};
    assert_memory_equal(raw, head, sizeof head);
    free(raw);
    raw = read_file(tmp_path("f.idx.gz"), &n);
    assert_int_equal(raw[0], 0x1f);
    assert_int_equal(raw[1], 0x8b);
    free(raw);
    assert_int_equal(zd_idx_save_f32(u, tmp_path("x.idx")), -1);
    assert_non_null(strstr(zd_error_last(), "uint8"));
    zd_tensor_unref(f);
    zd_tensor_unref(u);
}

static void test_golden_file_bytes(void **state)
{
    (void)state;
    const char *dir = getenv("ZDIST_GOLDEN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/relu/input.x.idx", dir ? dir : ZD_TEST_GOLDEN_DEFAULT);
    struct stat st;
    if (stat(path, &st) < 0)
        skip();
    zd_tensor_t *t;
    assert_non_null(t = zd_idx_read(path));
    assert_int_equal(zd_tensor_dtype(t), ZD_FLOAT32);
    /* Writing it back gives the same bytes: byte order and header agree. */
    assert_int_equal(zd_idx_save_f32(t, tmp_path("again.idx")), 0);
    size_t a, b;
    unsigned char *orig = read_file(path, &a), *again = read_file(tmp_path("again.idx"), &b);
    assert_int_equal(a, b);
    assert_memory_equal(orig, again, a);
    free(orig);
    free(again);
    zd_tensor_unref(t);
}

static void test_broken_files(void **state)
{
    (void)state;
    unsigned char buf[4096];
    uint32_t dims[3] = {4, 8, 8};
    size_t n;

    expect_refused(tmp_path("does-not-exist"), "No such file");
    expect_refused(tmpdir(), "is a directory");

    n = make_idx(buf, 0x08, 3, dims, 256);
    buf[0] = 0x12;
    write_file(tmp_path("magic"), buf, n);
    expect_refused(tmp_path("magic"), "bad magic");

    n = make_idx(buf, 0x08, 3, dims, 256);
    write_file(tmp_path("short-data"), buf, n - 100);
    expect_refused(tmp_path("short-data"), "truncated data");

    write_file(tmp_path("short-header"), buf, 9);
    expect_refused(tmp_path("short-header"), "truncated header");
    write_file(tmp_path("tiny"), buf, 2);
    expect_refused(tmp_path("tiny"), "truncated header");
    write_file(tmp_path("empty"), buf, 0);
    expect_refused(tmp_path("empty"), "truncated header");

    n = make_idx(buf, 0x08, 3, dims, 256 + 5);
    write_file(tmp_path("trailing"), buf, n);
    expect_refused(tmp_path("trailing"), "5 trailing bytes");

    /* Dimensions that disagree with the length: 4x8x9 announced, 4x8x8 there. */
    uint32_t wrong[3] = {4, 8, 9};
    n = make_idx(buf, 0x08, 3, wrong, 256);
    write_file(tmp_path("dims"), buf, n);
    expect_refused(tmp_path("dims"), "4x8x9 uint8 = 288 data bytes, only 256");

    n = make_idx(buf, 0x08, 0, dims, 4);
    write_file(tmp_path("ndim0"), buf, n);
    expect_refused(tmp_path("ndim0"), "0 dimensions");
    uint32_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    n = make_idx(buf, 0x08, 9, nine, 1);
    write_file(tmp_path("ndim9"), buf, n);
    expect_refused(tmp_path("ndim9"), "9 dimensions");

    n = make_idx(buf, 0x0E, 1, dims, 32);
    write_file(tmp_path("f64"), buf, n);
    expect_refused(tmp_path("f64"), "0x0E (float64) not supported");

    uint32_t huge[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    n = make_idx(buf, 0x0D, 4, huge, 16);
    write_file(tmp_path("overflow"), buf, n);
    expect_refused(tmp_path("overflow"), "overflow");

    /* A header announcing 4 GB over a few bytes costs no 4 GB allocation. */
    uint32_t big[1] = {0xfffffff0u};
    n = make_idx(buf, 0x08, 1, big, 16);
    write_gz(tmp_path("big.gz"), buf, n);
    expect_refused(tmp_path("big.gz"), "truncated data");

    /* The same problems inside gzip data. */
    n = make_idx(buf, 0x08, 3, dims, 256);
    write_gz(tmp_path("short-data.gz"), buf, n - 10);
    expect_refused(tmp_path("short-data.gz"), "truncated data");
    n = make_idx(buf, 0x08, 3, dims, 256 + 1);
    write_gz(tmp_path("trailing.gz"), buf, n);
    expect_refused(tmp_path("trailing.gz"), "trailing bytes");
    buf[2] = 0x0B;
    write_gz(tmp_path("int16.gz"), buf, n);
    expect_refused(tmp_path("int16.gz"), "int16");
}

static void test_broken_gzip(void **state)
{
    (void)state;
    unsigned char buf[4096], z[8192];
    uint32_t dims[3] = {4, 8, 8};
    size_t n = make_idx(buf, 0x08, 3, dims, 256);
    write_gz(tmp_path("ok.gz"), buf, n);
    size_t zn;
    unsigned char *gz = read_file(tmp_path("ok.gz"), &zn);
    assert_true(zn < sizeof z);

    /* Cut in the middle of the compressed stream. */
    write_file(tmp_path("cut.gz"), gz, zn / 2);
    expect_refused(tmp_path("cut.gz"), "truncated");
    /* The gzip magic followed by garbage. */
    memcpy(z, gz, 2);
    for (size_t i = 2; i < 200; i++)
        z[i] = (unsigned char)(i * 31 + 7);
    write_file(tmp_path("garbage.gz"), z, 200);
    expect_refused(tmp_path("garbage.gz"), "corrupt gzip data");
    /* A corrupted byte inside the deflate data (caught by zlib or the CRC). */
    memcpy(z, gz, zn);
    z[zn / 2] ^= 0x55;
    write_file(tmp_path("flipped.gz"), z, zn);
    assert_null(zd_idx_read(tmp_path("flipped.gz")));
    assert_non_null(strstr(zd_error_last(), "flipped.gz: corrupt gzip data"));
    free(gz);
}

static void test_dataset_level_checks(void **state)
{
    (void)state;
    unsigned char buf[4096];
    uint32_t idims[3] = {5, 4, 4}, ldims[1] = {4};
    size_t n = make_idx(buf, 0x08, 3, idims, 80);
    write_file(tmp_path("images5"), buf, n);
    n = make_idx(buf, 0x08, 1, ldims, 0);
    memcpy(buf + n, "\x01\x02\x03\x04", 4);
    write_file(tmp_path("labels4"), buf, n + 4);
    int64_t live = zd_tensor_live_count();
    assert_null(zd_dataset_load_files(tmp_path("images5"), tmp_path("labels4")));
    assert_non_null(strstr(zd_error_last(), "counts differ"));
    assert_non_null(strstr(zd_error_last(), "images5 holds 5 images"));
    assert_non_null(strstr(zd_error_last(), "labels4 holds 4 labels"));

    uint32_t five[1] = {5};
    n = make_idx(buf, 0x08, 1, five, 0);
    memcpy(buf + n, "\x01\x02\x0c\x04\x05", 5);
    write_file(tmp_path("labels-bad"), buf, n + 5);
    assert_null(zd_dataset_load_files(tmp_path("images5"), tmp_path("labels-bad")));
    assert_non_null(strstr(zd_error_last(), "label 12 at index 2"));

    /* Images given where labels belong, and a broken labels file. */
    assert_null(zd_dataset_load_files(tmp_path("images5"), tmp_path("images5")));
    assert_non_null(strstr(zd_error_last(), "expected uint8 labels"));
    buf[0] = 0x12;
    write_file(tmp_path("labels-magic"), buf, n + 5);
    assert_null(zd_dataset_load_files(tmp_path("images5"), tmp_path("labels-magic")));
    assert_non_null(strstr(zd_error_last(), "bad magic"));
    assert_null(zd_dataset_load(tmpdir(), ZD_DATASET_TEST));
    assert_non_null(strstr(zd_error_last(), "no t10k images"));
    assert_int_equal(zd_tensor_live_count(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fashion_mnist_gz),      cmocka_unit_test(test_plain_copy_equals_gz),
        cmocka_unit_test(test_round_trip_f32_and_u8), cmocka_unit_test(test_golden_file_bytes),
        cmocka_unit_test(test_broken_files),          cmocka_unit_test(test_broken_gzip),
        cmocka_unit_test(test_dataset_level_checks),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
