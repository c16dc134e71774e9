/* SPDX-License-Identifier: MIT */
/*  Checkpoints: round trips, every kind of damage refused without touching
    the tensors, and no half-written file ever at the checkpoint's path. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <zdist/error.h>
#include <zdist/checkpoint.h>
#include "tests/support/fixtures.h"

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

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/*  Number of entries in the test directory whose name contains `part`. */
static int count_files(const char *part)
{
    DIR *d = opendir(tmpdir());
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)))
        n += e->d_name[0] != '.' && strstr(e->d_name, part) != NULL;
    if (d)
        closedir(d);
    return n;
}

/*  A small "model": named float32 tensors with distinct values. */
#define NT 4
static const char *const names[NT] = {"conv1.weight", "conv1.bias", "fc.weight", "step"};

static void make_model(zd_tensor_t **t, float base)
{
    t[0] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){3, 1, 3, 3}, 4);
    t[1] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){3}, 1);
    t[2] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){10, 7}, 2);
    t[3] = zd_tensor_new(ZD_FLOAT32, NULL, 0);
    for (int k = 0; k < NT; k++)
        for (int64_t i = 0; i < zd_tensor_numel(t[k]); i++)
            zd_tensor_data(t[k])[i] = base + (float)k * 100.0f + (float)i * 0.125f - 3.3f;
}

static void free_model(zd_tensor_t **t)
{
    for (int k = 0; k < NT; k++)
        zd_tensor_unref(t[k]);
}

/*  The pairs (nm[i], t[i]) as a list, the API's container. */
static zd_named_tensors_t *list_of(int n, const char *const *nm, zd_tensor_t *const *t)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    assert_non_null(nt);
    for (int i = 0; i < n; i++)
        assert_int_equal(zd_named_tensors_add(nt, nm[i], t[i]), 0);
    return nt;
}

static int save(const char *path, int n, const char *const *nm, zd_tensor_t *const *t)
{
    zd_named_tensors_t *nt = list_of(n, nm, t);
    int rc = zd_checkpoint_save(nt, path);
    zd_named_tensors_free(nt);
    return rc;
}

static int load(const char *path, int n, const char *const *nm, zd_tensor_t *const *t)
{
    zd_named_tensors_t *nt = list_of(n, nm, t);
    int rc = zd_checkpoint_load(nt, path);
    zd_named_tensors_free(nt);
    return rc;
}

static void assert_model_equal(zd_tensor_t **a, zd_tensor_t **b)
{
    for (int k = 0; k < NT; k++) {
        assert_true(zd_tensor_same_shape(a[k], b[k]));
        assert_memory_equal(zd_tensor_data(a[k]), zd_tensor_data(b[k]), zd_tensor_nbytes(a[k]));
    }
}

/*  Loading `path` into a fresh model fails with `expect` in the message and
    changes nothing. */
static void expect_refused(const char *path, const char *expect)
{
    zd_tensor_t *t[NT], *orig[NT];
    make_model(t, -7.0f);
    make_model(orig, -7.0f);
    assert_int_equal(load(path, NT, names, t), -1);
    if (!strstr(zd_error_last(), expect) || !strstr(zd_error_last(), path))
        fail_msg("loading %s: error '%s' lacks '%s' or the path", path, zd_error_last(), expect);
    assert_model_equal(t, orig);
    free_model(t);
    free_model(orig);
}

static int setup(void **state)
{
    (void)state;
    return tmpdir_setup("test_checkpoint");
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

static void test_round_trip(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *a[NT], *b[NT];
    make_model(a, 1.0f);
    make_model(b, 50.0f);
    const char *p = tmp_path("model.ckpt");
    assert_int_equal(save(p, NT, names, a), 0);
    assert_int_equal(count_files(".tmp."), 0);

    /* Loading matches by name, in any order. */
    const char *rev_names[NT];
    zd_tensor_t *rev[NT];
    for (int k = 0; k < NT; k++) {
        rev_names[k] = names[NT - 1 - k];
        rev[k] = b[NT - 1 - k];
    }
    assert_int_equal(load(p, NT, rev_names, rev), 0);
    assert_model_equal(a, b);

    /* The documented layout: magic, version 1, count, then the first record. */
    size_t n;
    unsigned char *raw = read_file(p, &n);
    assert_memory_equal(raw, "ZDCKPT\r\n\x01\0\0\0\x04\0\0\0\x0c\0\0\0conv1.weight\x01\0\0\0\x04",
                        8 + 4 + 4 + 4 + 12 + 4 + 1);
    size_t data_bytes = (27 + 3 + 70 + 1) * 4, names_bytes = 12 + 10 + 9 + 4;
    assert_int_equal(n, 16 + NT * 12 + names_bytes + 8 * (4 + 1 + 2) + data_bytes + 4);
    free(raw);

    /* zd_checkpoint_read: everything, without knowing it in advance, in
       the file's order. */
    zd_named_tensors_t *rd = zd_checkpoint_read(p);
    assert_non_null(rd);
    assert_int_equal(zd_named_tensors_len(rd), NT);
    for (int k = 0; k < NT; k++) {
        zd_tensor_t *rt = zd_named_tensors_tensor(rd, k);
        assert_string_equal(zd_named_tensors_name(rd, k), names[k]);
        assert_true(zd_tensor_same_shape(rt, a[k]));
        assert_memory_equal(zd_tensor_data(rt), zd_tensor_data(a[k]), zd_tensor_nbytes(a[k]));
    }
    zd_named_tensors_free(rd);

    /* Other dtypes and an empty checkpoint work too. */
    int64_t two = 2;
    zd_tensor_t *i64 = zd_tensor_new(ZD_INT64, &two, 1);
    zd_tensor_data_i64(i64)[1] = -5000000000LL;
    const char *iname = "counter";
    assert_int_equal(save(tmp_path("i64.ckpt"), 1, &iname, &i64), 0);
    zd_tensor_t *i64b = zd_tensor_new(ZD_INT64, &two, 1);
    assert_int_equal(load(tmp_path("i64.ckpt"), 1, &iname, &i64b), 0);
    assert_int_equal(zd_tensor_data_i64(i64b)[1], -5000000000LL);
    zd_tensor_t *f32 = zd_tensor_new(ZD_FLOAT32, &two, 1);
    assert_int_equal(load(tmp_path("i64.ckpt"), 1, &iname, &f32), -1);
    assert_non_null(strstr(zd_error_last(), "'counter' is int64 in the file but float32 here"));
    assert_int_equal(save(tmp_path("empty.ckpt"), 0, NULL, NULL), 0);
    assert_int_equal(load(tmp_path("empty.ckpt"), 0, NULL, NULL), 0);
    rd = zd_checkpoint_read(tmp_path("empty.ckpt"));
    assert_non_null(rd);
    assert_int_equal(zd_named_tensors_len(rd), 0);
    zd_named_tensors_free(rd);
    zd_tensor_unref(i64);
    zd_tensor_unref(i64b);
    zd_tensor_unref(f32);
    free_model(a);
    free_model(b);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_corruption_refused(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_tensor_t *a[NT];
    make_model(a, 2.0f);
    const char *p = tmp_path("good.ckpt");
    assert_int_equal(save(p, NT, names, a), 0);
    size_t n;
    unsigned char *good = read_file(p, &n), *bad = malloc(n);

    /* One flipped bit anywhere in the data: CRC. */
    size_t spots[] = {n - 5, n / 2, 100};
    for (size_t s = 0; s < 3; s++) {
        memcpy(bad, good, n);
        bad[spots[s]] ^= 0x04;
        write_file(tmp_path("flip.ckpt"), bad, n);
        expect_refused(tmp_path("flip.ckpt"), "CRC mismatch");
    }
    /* The CRC itself damaged. */
    memcpy(bad, good, n);
    bad[n - 1] ^= 0xff;
    write_file(tmp_path("crc.ckpt"), bad, n);
    expect_refused(tmp_path("crc.ckpt"), "CRC mismatch");

    /* Truncated: in the data, in a record header, in the file header. */
    size_t cuts[] = {n - 1, n - 4, n - 50, 16 + 4 + 5, 30, 19, 10, 3, 0};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        write_file(tmp_path("cut.ckpt"), good, cuts[c]);
        expect_refused(tmp_path("cut.ckpt"), "truncated");
    }

    /* Bytes appended after the last tensor, with a CRC that covers them. */
    unsigned char *longer = malloc(n + 3);
    memcpy(longer, good, n - 4);
    memcpy(longer + n - 4, "abc", 3);
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), longer, (uInt)(n - 1));
    for (int i = 0; i < 4; i++)
        longer[n - 1 + i] = (unsigned char)(crc >> (8 * i));
    write_file(tmp_path("long.ckpt"), longer, n + 3);
    expect_refused(tmp_path("long.ckpt"), "3 unexpected bytes after the last tensor");
    free(longer);

    memcpy(bad, good, n);
    bad[0] = 'X';
    write_file(tmp_path("magic.ckpt"), bad, n);
    expect_refused(tmp_path("magic.ckpt"), "bad magic");
    memcpy(bad, good, n);
    bad[8] = 2;
    write_file(tmp_path("version.ckpt"), bad, n);
    expect_refused(tmp_path("version.ckpt"), "version 2 not supported");
    memcpy(bad, good, n);
    bad[12] = 0xff;
    bad[13] = 0xff;
    bad[14] = 0xff;
    write_file(tmp_path("count.ckpt"), bad, n);
    expect_refused(tmp_path("count.ckpt"), "corrupt file");
    memcpy(bad, good, n);
    bad[16 + 4 + 5] = '\0'; /* in "conv1.weight" */
    write_file(tmp_path("nul.ckpt"), bad, n);
    expect_refused(tmp_path("nul.ckpt"), "a NUL byte in its name (corrupt file)");
    assert_null(zd_checkpoint_read(tmp_path("nul.ckpt")));
    assert_non_null(strstr(zd_error_last(), "a NUL byte in its name"));
    write_file(tmp_path("nothing.ckpt"), "", 0);
    expect_refused(tmp_path("nothing.ckpt"), "truncated");
    expect_refused(tmp_path("missing.ckpt"), "No such file");
    expect_refused(tmpdir(), "not a regular file");
    /* zd_checkpoint_read refuses what loading refuses. */
    assert_null(zd_checkpoint_read(tmp_path("flip.ckpt")));
    assert_non_null(strstr(zd_error_last(), "CRC mismatch"));
    assert_null(zd_checkpoint_read(tmp_path("missing.ckpt")));
    assert_non_null(strstr(zd_error_last(), "No such file"));
    free(good);
    free(bad);
    free_model(a);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_mismatches_refused(void **state)
{
    (void)state;
    zd_tensor_t *a[NT];
    make_model(a, 3.0f);
    const char *p = tmp_path("m.ckpt");
    assert_int_equal(save(p, NT, names, a), 0);

    /* A model whose fc.weight is (7, 10) instead of (10, 7). */
    zd_tensor_t *b[NT];
    make_model(b, 0.0f);
    zd_tensor_t *orig_fc = b[2];
    b[2] = zd_tensor_new(ZD_FLOAT32, (int64_t[]){7, 10}, 2);
    zd_tensor_t *before = zd_tensor_detach_copy(b[0]);
    assert_int_equal(load(p, NT, names, b), -1);
    assert_non_null(strstr(zd_error_last(),
                           "tensor 'fc.weight' has shape (10, 7) in the file but (7, 10) here"));
    assert_memory_equal(zd_tensor_data(b[0]), zd_tensor_data(before), zd_tensor_nbytes(before));
    zd_tensor_unref(b[2]);
    b[2] = orig_fc;

    /* The model has a tensor the file lacks. */
    const char *more_names[NT + 1] = {names[0], names[1], names[2], names[3], "fc.bias"};
    zd_tensor_t *more[NT + 1] = {b[0], b[1], b[2], b[3], zd_tensor_zeros1(10)};
    assert_int_equal(load(p, NT + 1, more_names, more), -1);
    assert_non_null(strstr(zd_error_last(), "no tensor 'fc.bias' in the file"));
    zd_tensor_unref(more[NT]);

    /* The file has a tensor the model lacks. */
    assert_int_equal(load(p, NT - 1, names, b), -1);
    assert_non_null(strstr(zd_error_last(), "unexpected tensor 'step' in the file"));
    assert_memory_equal(zd_tensor_data(b[0]), zd_tensor_data(before), zd_tensor_nbytes(before));

    /* Bad requests: repeated or empty names never make it into a list;
       no list at all, or a name longer than the format's, is refused. */
    zd_named_tensors_t *bad = list_of(1, names, b);
    assert_int_equal(zd_named_tensors_add(bad, "conv1.weight", b[1]), -1);
    assert_non_null(strstr(zd_error_last(), "is there already"));
    assert_int_equal(zd_named_tensors_add(bad, "", b[1]), -1);
    assert_int_equal(zd_named_tensors_len(bad), 1);
    assert_int_equal(zd_checkpoint_save(NULL, tmp_path("x.ckpt")), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(zd_checkpoint_load(NULL, p), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    char *long_name = malloc(ZD_CHECKPOINT_MAX_NAME + 2);
    memset(long_name, 'w', ZD_CHECKPOINT_MAX_NAME + 1);
    long_name[ZD_CHECKPOINT_MAX_NAME + 1] = '\0';
    assert_int_equal(zd_named_tensors_add(bad, long_name, b[1]), 0);
    assert_int_equal(zd_checkpoint_save(bad, tmp_path("x.ckpt")), -1);
    assert_non_null(strstr(zd_error_last(), "name of tensor 1 is 4097 bytes (1 to 4096)"));
    assert_int_equal(zd_checkpoint_load(bad, p), -1);
    assert_non_null(strstr(zd_error_last(), "name of tensor 1 is 4097 bytes"));
    assert_memory_equal(zd_tensor_data(b[0]), zd_tensor_data(before), zd_tensor_nbytes(before));
    assert_false(access(tmp_path("x.ckpt"), F_OK) == 0);
    free(long_name);
    zd_named_tensors_free(bad);
    zd_tensor_unref(before);
    free_model(a);
    free_model(b);
}

/*  A failing save (disk full, a crash) leaves the previous checkpoint in
    place and no partial file at the path. The child process gets a file
    size limit so that writing the big checkpoint fails half-way. */
static void test_failed_save_keeps_old_file(void **state)
{
    (void)state;
    zd_tensor_t *a[NT];
    make_model(a, 4.0f);
    const char *p = tmp_path("keep.ckpt");
    assert_int_equal(save(p, NT, names, a), 0);
    size_t n_old;
    unsigned char *old = read_file(p, &n_old);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        zd_tensor_t *big = zd_tensor_new(ZD_FLOAT32, (int64_t[]){100000}, 1);
        const char *bn = "big";
        int rc = save(p, 1, &bn, &big);
        int ok = rc == -1 && strstr(zd_error_last(), "cannot write") != NULL;
        zd_tensor_unref(big);
        _exit(ok ? 0 : 1);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    size_t n_now;
    unsigned char *now = read_file(p, &n_now);
    assert_int_equal(n_now, n_old);
    assert_memory_equal(now, old, n_old);
    assert_int_equal(count_files(".tmp."), 0);

    /* Overwriting works, and leaves no temporary file either. */
    zd_tensor_t *b[NT];
    make_model(b, 9.0f);
    assert_int_equal(save(p, NT, names, b), 0);
    assert_int_equal(load(p, NT, names, a), 0);
    assert_model_equal(a, b);
    assert_int_equal(count_files(".tmp."), 0);

    /* A path that cannot be written: a missing directory, a directory. */
    assert_int_equal(save("/nonexistent-zd-dir/x.ckpt", NT, names, a), -1);
    assert_non_null(strstr(zd_error_last(), "cannot create"));
    const char *sub = tmp_path("subdir");
    assert_int_equal(mkdir(sub, 0700), 0);
    assert_int_equal(save(sub, NT, names, a), -1);
    assert_non_null(strstr(zd_error_last(), "cannot write"));
    assert_int_equal(count_files(".tmp."), 0);
    free(old);
    free(now);
    free_model(a);
    free_model(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corruption_refused),
        cmocka_unit_test(test_mismatches_refused),
        cmocka_unit_test(test_failed_save_keeps_old_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
