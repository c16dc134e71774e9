/* SPDX-License-Identifier: MIT */
/*  MNIST-format data sets: normalisation against PyTorch's numbers, file
    discovery, seeded shuffling, batching, subsets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/dataset.h>
#include <zdist/idx.h>
#include "tests/support/fixtures.h"

static const char *golden_dir(void)
{
    const char *d = getenv("ZDIST_GOLDEN_DIR");
    return d && *d ? d : ZD_TEST_GOLDEN_DEFAULT;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/*  "kind" from the first line of a golden case's manifest, or "". */
static void case_kind(const char *dir, char *kind, size_t size)
{
    kind[0] = '\0';
    FILE *f = fopen(path_in(dir, "manifest.txt"), "r");
    char line[256];
    if (f && fgets(line, sizeof line, f) && strncmp(line, "# kind: ", 8) == 0) {
        line[strcspn(line, "\r\n")] = '\0';
        if (strlen(line + 8) < size)
            strcpy(kind, line + 8);
    }
    if (f)
        fclose(f);
}

/*  Writes a small data set of n images (h x w) whose pixels encode the
    sample index (pixel p of sample i = (i * 16 + p) % 256) and labels i % 10,
    under the given file names. */
static void write_set(const char *dir, const char *images, const char *labels, int64_t n, int64_t h,
                      int64_t w)
{
    int64_t shape[3] = {n, h, w};
    zd_tensor_t *img = zd_tensor_new(ZD_UINT8, shape, 3), *lab = zd_tensor_new(ZD_UINT8, &n, 1);
    uint8_t *d = zd_tensor_raw(img), *l = zd_tensor_raw(lab);
    for (int64_t i = 0; i < n; i++) {
        for (int64_t p = 0; p < h * w; p++)
            d[i * h * w + p] = (uint8_t)((i * 16 + p) % 256);
        l[i] = (uint8_t)(i % 10);
    }
    assert_int_equal(zd_idx_save(img, path_in(dir, images)), 0);
    assert_int_equal(zd_idx_save(lab, path_in(dir, labels)), 0);
    zd_tensor_unref(img);
    zd_tensor_unref(lab);
}

static float norm(int v)
{
    return ((float)v / 255.0f - 0.1307f) / 0.3081f;
}

static int setup(void **state)
{
    (void)state;
    if (tmpdir_setup("test_dataset") < 0)
        return -1;
    /* Train split under the classic names, test split gzip-compressed
       under the '.'-before-idx names some downloads use. */
    write_set(tmpdir(), "train-images-idx3-ubyte", "train-labels-idx1-ubyte", 10, 3, 5);
    write_set(tmpdir(), "t10k-images.idx3-ubyte.gz", "t10k-labels.idx1-ubyte.gz", 7, 3, 5);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

/*  The normalised golden images equal PyTorch's input x; and where the
    golden images come from the Fashion-MNIST training set on this machine,
    the data set's batches of those samples equal x and target too. */
static void test_normalisation_matches_golden(void **state)
{
    (void)state;
    const char *gdir = golden_dir();
    DIR *d = opendir(gdir);
    if (!d)
        skip();
    zd_dataset_t *train = NULL;
    if (exists(ZD_DATASET_SYSTEM_DIR "/train-images-idx3-ubyte.gz"))
        assert_non_null(train = zd_dataset_load(ZD_DATASET_SYSTEM_DIR, ZD_DATASET_TRAIN));
    int cases = 0, found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char dir[600], kind[64];
        snprintf(dir, sizeof dir, "%s/%s", gdir, e->d_name);
        case_kind(dir, kind, sizeof kind);
        if (strcmp(kind, "net") != 0 && strcmp(kind, "convnet") != 0)
            continue;
        zd_tensor_t *images, *x, *target, *mine;
        assert_non_null(images = zd_idx_read(path_in(dir, "input.images.idx")));
        assert_non_null(x = zd_idx_read(path_in(dir, "input.x.idx")));
        assert_non_null(target = zd_idx_read(path_in(dir, "input.target.idx")));
        assert_int_equal(zd_dataset_normalise(images, &mine), 0);
        assert_true(zd_tensor_same_shape(mine, x));
        for (int64_t i = 0; i < zd_tensor_numel(x); i++)
            if (fabsf(zd_tensor_data(mine)[i] - zd_tensor_data(x)[i]) > 1e-6f)
                fail_msg("%s: x[%lld] = %.9g, golden %.9g", dir, (long long)i,
                         zd_tensor_data(mine)[i], zd_tensor_data(x)[i]);
        cases++;
        int64_t n = zd_tensor_size(images, 0),
                pix = zd_tensor_size(images, 1) * zd_tensor_size(images, 2);
        for (int64_t k = 0; train && k < n; k++) {
            const uint8_t *want = (const uint8_t *)zd_tensor_raw(images) + k * pix;
            const uint8_t *all = zd_tensor_raw(zd_dataset_images_u8(train));
            int64_t at = -1;
            for (int64_t s = 0; s < zd_dataset_len(train) && at < 0; s++)
                if (memcmp(all + s * pix, want, (size_t)pix) == 0)
                    at = s;
            if (at < 0)
                continue;
            zd_tensor_t *bx, *by;
            assert_int_equal(zd_dataset_batch(train, &at, 0, 1, &bx, &by), 0);
            for (int64_t p = 0; p < pix; p++)
                assert_true(fabsf(zd_tensor_data(bx)[p] - zd_tensor_data(x)[k * pix + p]) <= 1e-6f);
            assert_int_equal(zd_tensor_data_i64(by)[0], ((uint8_t *)zd_tensor_raw(target))[k]);
            found++;
            zd_tensor_unref(bx);
            zd_tensor_unref(by);
        }
        zd_tensor_unref(images);
        zd_tensor_unref(x);
        zd_tensor_unref(target);
        zd_tensor_unref(mine);
    }
    closedir(d);
    zd_dataset_free(train);
    assert_true(cases > 0);
    if (train && found == 0)
        print_message("note: the golden images are not Fashion-MNIST training images\n");
    /* The formula itself, at both ends of the range. */
    int64_t two = 2;
    zd_tensor_t *px = zd_tensor_new(ZD_UINT8, (int64_t[]){two, 1, 1}, 3), *out;
    ((uint8_t *)zd_tensor_raw(px))[1] = 255;
    assert_int_equal(zd_dataset_normalise(px, &out), 0);
    assert_int_equal(zd_tensor_ndim(out), 4);
    assert_float_equal(zd_tensor_data(out)[0], -0.4242129623889923, 1e-7);
    assert_float_equal(zd_tensor_data(out)[1], 2.821486711502075, 1e-6);
    zd_tensor_unref(out);
    zd_tensor_unref(px);
}

static void test_find_files_and_load(void **state)
{
    (void)state;
    char path[600];
    assert_int_equal(zd_dataset_find_file(tmpdir(), ZD_DATASET_TRAIN, "images", path, sizeof path),
                     0);
    assert_string_equal(path, path_in(tmpdir(), "train-images-idx3-ubyte"));
    assert_int_equal(zd_dataset_find_file(tmpdir(), ZD_DATASET_TEST, "labels", path, sizeof path),
                     0);
    assert_string_equal(path, path_in(tmpdir(), "t10k-labels.idx1-ubyte.gz"));

    zd_dataset_t *train, *test;
    assert_non_null(train = zd_dataset_load(tmpdir(), ZD_DATASET_TRAIN));
    assert_non_null(test = zd_dataset_load(tmpdir(), ZD_DATASET_TEST));
    assert_int_equal(zd_dataset_len(train), 10);
    assert_int_equal(zd_dataset_len(test), 7);
    assert_int_equal(zd_dataset_rows(train), 3);
    assert_int_equal(zd_dataset_cols(train), 5);
    assert_string_equal(zd_dataset_labels_path(test),
                        path_in(tmpdir(), "t10k-labels.idx1-ubyte.gz"));
    assert_int_equal(zd_tensor_dtype(zd_dataset_labels(train)), ZD_INT64);
    assert_int_equal(zd_tensor_data_i64(zd_dataset_labels(test))[6], 6);
    zd_dataset_free(train);
    zd_dataset_free(test);

    /* Labels missing: the error names the directory and the names tried. */
    char empty[600];
    snprintf(empty, sizeof empty, "%s/empty", tmpdir());
    assert_int_equal(mkdir(empty, 0700), 0);
    write_set(empty, "train-images-idx3-ubyte.gz", "other-name", 2, 2, 2);
    assert_null(zd_dataset_load(empty, ZD_DATASET_TRAIN));
    assert_non_null(strstr(zd_error_last(), "no train labels in"));
    assert_non_null(strstr(zd_error_last(), "train-labels-idx1-ubyte[.gz]"));
    assert_non_null(strstr(zd_error_last(), "train-labels.idx1-ubyte[.gz]"));
}

static void test_default_dir(void **state)
{
    (void)state;
    char dir[600], cwd[1024];
    assert_non_null(getcwd(cwd, sizeof cwd));
    /* $ZDIST_DATA_DIR wins, and must hold the files. */
    setenv("ZDIST_DATA_DIR", tmpdir(), 1);
    assert_int_equal(zd_dataset_find_dir(dir, sizeof dir), 0);
    assert_string_equal(dir, tmpdir());
    setenv("ZDIST_DATA_DIR", "/nonexistent-zd-dir", 1);
    assert_int_equal(zd_dataset_find_dir(dir, sizeof dir), -1);
    assert_non_null(strstr(zd_error_last(), "ZDIST_DATA_DIR=/nonexistent-zd-dir"));
    unsetenv("ZDIST_DATA_DIR");

    /* ./data with MNIST-format files is preferred. */
    char work[600], data[700];
    snprintf(work, sizeof work, "%s/cwd", tmpdir());
    snprintf(data, sizeof data, "%s/data", work);
    assert_int_equal(mkdir(work, 0700), 0);
    assert_int_equal(chdir(work), 0);
    int rc = zd_dataset_find_dir(dir, sizeof dir);
    if (exists(ZD_DATASET_SYSTEM_DIR "/train-images-idx3-ubyte.gz")) {
        assert_int_equal(rc, 0);
        assert_string_equal(dir, ZD_DATASET_SYSTEM_DIR);
    } else {
        assert_int_equal(rc, -1);
        assert_non_null(strstr(zd_error_last(), "neither ./data nor " ZD_DATASET_SYSTEM_DIR));
    }
    assert_int_equal(mkdir(data, 0700), 0);
    write_set(data, "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 3, 28, 28);
    assert_int_equal(zd_dataset_find_dir(dir, sizeof dir), 0);
    assert_string_equal(dir, "./data");
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(NULL, ZD_DATASET_TRAIN));
    assert_int_equal(zd_dataset_len(ds), 3);
    zd_dataset_free(ds);
    assert_int_equal(chdir(cwd), 0);
}

static void test_shuffle_is_seeded_permutation(void **state)
{
    (void)state;
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(tmpdir(), ZD_DATASET_TRAIN));
    int64_t *a = zd_dataset_order(ds, 42), *b = zd_dataset_order(ds, 42),
            *c = zd_dataset_order(ds, 43);
    assert_non_null(a);
    assert_memory_equal(a, b, 10 * sizeof *a);
    assert_memory_not_equal(a, c, 10 * sizeof *a);
    int seen[10] = {0};
    bool moved = false;
    for (int i = 0; i < 10; i++) {
        assert_true(a[i] >= 0 && a[i] < 10);
        seen[a[i]]++;
        moved |= a[i] != i;
    }
    for (int i = 0; i < 10; i++)
        assert_int_equal(seen[i], 1);
    assert_true(moved);
    free(a);
    free(b);
    free(c);

    /* Larger: every seed gives a permutation; positions are spread out. */
    enum { N = 1000 };
    int64_t *idx = malloc(N * sizeof *idx), *again = malloc(N * sizeof *again);
    for (int i = 0; i < N; i++)
        idx[i] = again[i] = i;
    zd_dataset_shuffle(idx, N, 7);
    zd_dataset_shuffle(again, N, 7);
    assert_memory_equal(idx, again, N * sizeof *idx);
    int fixed = 0;
    int64_t sum = 0;
    for (int i = 0; i < N; i++) {
        fixed += idx[i] == i;
        sum += idx[i];
    }
    assert_int_equal(sum, (int64_t)N * (N - 1) / 2);
    assert_true(fixed < 10);
    free(idx);
    free(again);
    zd_dataset_free(ds);
}

static void check_batch(const zd_dataset_t *ds, const int64_t *order, int64_t start, int64_t bs,
                        int64_t expect_b)
{
    zd_tensor_t *x, *y;
    assert_int_equal(zd_dataset_batch(ds, order, start, bs, &x, &y), 0);
    int64_t h = zd_dataset_rows(ds), w = zd_dataset_cols(ds);
    assert_int_equal(zd_tensor_ndim(x), 4);
    assert_int_equal(zd_tensor_size(x, 0), expect_b);
    assert_int_equal(zd_tensor_size(x, 1), 1);
    assert_int_equal(zd_tensor_size(x, 2), h);
    assert_int_equal(zd_tensor_size(x, 3), w);
    assert_int_equal(zd_tensor_dtype(y), ZD_INT64);
    assert_int_equal(zd_tensor_size(y, 0), expect_b);
    for (int64_t i = 0; i < expect_b; i++) {
        int64_t k = order ? order[start + i] : start + i;
        assert_int_equal(zd_tensor_data_i64(y)[i], k % 10);
        for (int64_t p = 0; p < h * w; p++)
            assert_float_equal(zd_tensor_data(x)[i * h * w + p], norm((int)((k * 16 + p) % 256)),
                               0);
    }
    zd_tensor_unref(x);
    zd_tensor_unref(y);
}

static void test_batches_and_subset(void **state)
{
    (void)state;
    int64_t live = zd_tensor_live_count();
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(tmpdir(), ZD_DATASET_TRAIN));
    assert_int_equal(zd_dataset_num_batches(ds, 4), 3);
    assert_int_equal(zd_dataset_num_batches(ds, 10), 1);
    assert_int_equal(zd_dataset_num_batches(ds, 11), 1);
    check_batch(ds, NULL, 0, 4, 4);
    check_batch(ds, NULL, 4, 4, 4);
    check_batch(ds, NULL, 8, 4, 2); /* the last, partial batch */
    int64_t *order = zd_dataset_order(ds, 5);
    for (int64_t s = 0; s < 10; s += 3)
        check_batch(ds, order, s, 3, s + 3 <= 10 ? 3 : 10 - s);

    zd_tensor_t *x = (zd_tensor_t *)0x1, *y = (zd_tensor_t *)0x1;
    assert_int_equal(zd_dataset_batch(ds, NULL, 10, 4, &x, &y), -1);
    assert_null(x);
    assert_null(y);
    assert_non_null(strstr(zd_error_last(), "start 10 outside the 10 samples"));
    assert_int_equal(zd_dataset_batch(ds, NULL, 0, 0, &x, &y), -1);
    assert_non_null(strstr(zd_error_last(), "batch size 0"));
    order[1] = 99;
    assert_int_equal(zd_dataset_batch(ds, order, 0, 4, &x, &y), -1);
    assert_non_null(strstr(zd_error_last(), "order[1] = 99"));
    free(order);

    /* Subset: the first 6 samples only. */
    assert_int_equal(zd_dataset_limit(ds, 0), -1);
    assert_int_equal(zd_dataset_limit(ds, 100), 0);
    assert_int_equal(zd_dataset_len(ds), 10);
    assert_int_equal(zd_dataset_limit(ds, 6), 0);
    assert_int_equal(zd_dataset_len(ds), 6);
    assert_int_equal(zd_tensor_size(zd_dataset_images_u8(ds), 0), 6);
    assert_int_equal(zd_dataset_num_batches(ds, 4), 2);
    check_batch(ds, NULL, 4, 4, 2);
    order = zd_dataset_order(ds, 1);
    for (int i = 0; i < 6; i++)
        assert_true(order[i] < 6);
    check_batch(ds, order, 0, 6, 6);
    free(order);
    assert_int_equal(zd_dataset_batch(ds, NULL, 6, 1, &x, &y), -1);
    zd_dataset_free(ds);
    assert_int_equal(zd_tensor_live_count(), live);
}

static void test_real_test_split(void **state)
{
    (void)state;
    if (!exists(ZD_DATASET_SYSTEM_DIR "/t10k-images-idx3-ubyte.gz"))
        skip();
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(ZD_DATASET_SYSTEM_DIR, ZD_DATASET_TEST));
    assert_int_equal(zd_dataset_len(ds), 10000);
    assert_int_equal(zd_dataset_rows(ds), 28);
    assert_int_equal(zd_dataset_cols(ds), 28);
    assert_int_equal(zd_dataset_num_batches(ds, 32), 313);
    zd_tensor_t *x, *y;
    assert_int_equal(zd_dataset_batch(ds, NULL, 9984, 32, &x, &y), 0);
    assert_int_equal(zd_tensor_size(x, 0), 16);
    float lo = 1e9f, hi = -1e9f;
    for (int64_t i = 0; i < zd_tensor_numel(x); i++) {
        lo = fminf(lo, zd_tensor_data(x)[i]);
        hi = fmaxf(hi, zd_tensor_data(x)[i]);
    }
    assert_float_equal(lo, norm(0), 0);
    assert_true(hi <= norm(255) && hi > 2.0f);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    zd_dataset_free(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_normalisation_matches_golden),
        cmocka_unit_test(test_find_files_and_load),
        cmocka_unit_test(test_default_dir),
        cmocka_unit_test(test_shuffle_is_seeded_permutation),
        cmocka_unit_test(test_batches_and_subset),
        cmocka_unit_test(test_real_test_split),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
