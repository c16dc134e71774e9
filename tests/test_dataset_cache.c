/* SPDX-License-Identifier: MIT */
/*  The per-host cache of decompressed data sets (data/dataset_cache.c): the
    batches read in place equal the in-memory ones bit for bit; processes
    starting together decompress once; a corrupt, truncated or stale cache
    file is rebuilt; its CRC is checked once per boot; a cache directory
    that cannot be written falls back to memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/idx.h>
#include <zdist/log.h>
#include "core/log_private.h"
#include "tests/support/fixtures.h"
#include "tests/support/world.h"

#define N    60
#define SIDE 28

static char src[512], cache[512];

/*  A gzip data set whose pixels take every value 0..255, in src. */
static void write_source(unsigned salt)
{
    int64_t shape[3] = {N, SIDE, SIDE}, n = N;
    zd_tensor_t *img = zd_tensor_new(ZD_UINT8, shape, 3), *lab = zd_tensor_new(ZD_UINT8, &n, 1);
    uint8_t *d = zd_tensor_raw(img), *l = zd_tensor_raw(lab);
    for (int64_t i = 0; i < N * SIDE * SIDE; i++)
        d[i] = (uint8_t)((i * 131 + salt) % 256);
    for (int64_t i = 0; i < N; i++)
        l[i] = (uint8_t)((i + salt) % 10);
    assert_int_equal(zd_idx_save(img, path_in(src, "train-images-idx3-ubyte.gz")), 0);
    assert_int_equal(zd_idx_save(lab, path_in(src, "train-labels-idx1-ubyte.gz")), 0);
    zd_tensor_unref(img);
    zd_tensor_unref(lab);
}

static int setup(void **state)
{
    (void)state;
    if (tmpdir_setup("test_dataset_cache") < 0)
        return -1;
    snprintf(src, sizeof src, "%s/src", tmpdir());
    snprintf(cache, sizeof cache, "%s/cache", tmpdir());
    if (mkdir(src, 0700) < 0)
        return -1;
    write_source(0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    chmod(cache, 0700);
    return tmpdir_teardown();
}

/*  Lines of the log, for the tests to count builds. */
static atomic_int builds, fallbacks;

static void sink(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level;
    (void)who;
    (void)arg;
    if (strstr(line, "into the cache"))
        atomic_fetch_add(&builds, 1);
    if (strstr(line, "cannot be used"))
        atomic_fetch_add(&fallbacks, 1);
}

static void listen_log(void)
{
    atomic_store(&builds, 0);
    /* a fresh rate limit: the subtests build more than a second's
       ZD_LOG_BUDGET_KIND lines of a kind, and the count must see each */
    zd__log_reset();
    zd_log_set_level(ZD_LOG_INFO);
    zd_log_set_sink(sink, NULL);
}

static void stop_log(void)
{
    zd_log_set_sink(NULL, NULL);
    zd_log_set_level(ZD_LOG_WARN);
}

/*  Files in dir whose name ends with suffix (or starts with it, when
    prefix): how many. */
static int count_files(const char *dir, const char *part, bool prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t len = strlen(e->d_name), plen = strlen(part);
        if (prefix ? strncmp(e->d_name, part, plen) == 0
                   : len >= plen && strcmp(e->d_name + len - plen, part) == 0)
            n++;
    }
    if (d)
        closedir(d);
    return n;
}

/*  The path of the images' cache file (the larger of the two). */
static void images_cache_file(char *buf, size_t size)
{
    DIR *d = opendir(cache);
    assert_non_null(d);
    struct dirent *e;
    off_t best = -1;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        struct stat st;
        const char *p = path_in(cache, e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".idx") == 0 && stat(p, &st) == 0 &&
            st.st_size > best) {
            best = st.st_size;
            snprintf(buf, size, "%s", p);
        }
    }
    closedir(d);
    assert_true(best > 0);
}

/*  Every batch of a shuffled epoch (and the sequential ones evaluation
    takes), concatenated: x as float32 bytes, then y. */
static void batches(const zd_dataset_t *ds, float *x, int64_t *y)
{
    int64_t *order = zd_dataset_order(ds, 7);
    assert_non_null(order);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t s = 0; s < N; s += 16) {
            zd_tensor_t *bx, *by;
            assert_int_equal(zd_dataset_batch(ds, pass ? NULL : order, s, 16, &bx, &by), 0);
            int64_t b = zd_tensor_size(bx, 0);
            memcpy(x + (pass * N + s) * SIDE * SIDE, zd_tensor_data(bx),
                   (size_t)(b * SIDE * SIDE) * sizeof(float));
            memcpy(y + pass * N + s, zd_tensor_data_i64(by), (size_t)b * sizeof(int64_t));
            zd_tensor_unref(bx);
            zd_tensor_unref(by);
        }
    }
    free(order);
}

/*  The batches as the in-memory path gives them (cache off), and as the
    old float path computes them: zd_dataset_normalise of the whole file. */
static float ref_x[2 * N * SIDE * SIDE];
static int64_t ref_y[2 * N];

static void reference(void)
{
    setenv("ZDIST_CACHE_DIR", "off", 1);
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(src, ZD_DATASET_TRAIN));
    batches(ds, ref_x, ref_y);
    zd_dataset_free(ds);
    setenv("ZDIST_CACHE_DIR", cache, 1);
}

static void assert_same_batches(void)
{
    static float x[2 * N * SIDE * SIDE];
    static int64_t y[2 * N];
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(src, ZD_DATASET_TRAIN));
    batches(ds, x, y);
    zd_dataset_free(ds);
    assert_memory_equal(x, ref_x, sizeof x);
    assert_memory_equal(y, ref_y, sizeof y);
}

static void test_in_place_equals_float_path(void **state)
{
    (void)state;
    reference();
    /* the old float path: the whole file normalised, then indexed */
    zd_tensor_t *img, *all;
    assert_non_null(img = zd_idx_read(path_in(src, "train-images-idx3-ubyte.gz")));
    assert_int_equal(zd_dataset_normalise(img, &all), 0);
    int64_t order[N];
    for (int64_t i = 0; i < N; i++)
        order[i] = i;
    zd_dataset_shuffle(order, N, 7);
    for (int64_t i = 0; i < N; i++)
        assert_memory_equal(ref_x + i * SIDE * SIDE, zd_tensor_data(all) + order[i] * SIDE * SIDE,
                            SIDE * SIDE * sizeof(float));
    zd_tensor_unref(img);
    zd_tensor_unref(all);

    listen_log();
    assert_same_batches(); /* builds the cache */
    assert_int_equal(atomic_load(&builds), 2);
    assert_same_batches(); /* reads it */
    assert_int_equal(atomic_load(&builds), 2);
    stop_log();
    assert_int_equal(count_files(cache, ".idx", false), 2);
    assert_int_equal(count_files(cache, ".build", true), 0);

    /* the whole images tensor, over the mapping */
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(src, ZD_DATASET_TRAIN));
    assert_int_equal(zd_tensor_size(zd_dataset_images_u8(ds), 0), N);
    assert_int_equal(((uint8_t *)zd_tensor_raw(zd_dataset_images_u8(ds)))[N * SIDE * SIDE - 1],
                     (uint8_t)(((N * SIDE * SIDE - 1) * 131) % 256));
    assert_int_equal(zd_dataset_limit(ds, 5), 0);
    zd_tensor_t *bx, *by;
    assert_int_equal(zd_dataset_batch(ds, NULL, 0, 8, &bx, &by), 0);
    assert_int_equal(zd_tensor_size(bx, 0), 5);
    assert_memory_equal(zd_tensor_data(bx), ref_x + N * SIDE * SIDE,
                        5 * SIDE * SIDE * sizeof(float));
    zd_tensor_unref(bx);
    zd_tensor_unref(by);
    zd_dataset_free(ds);
}

typedef struct {
    atomic_int arrived;
    atomic_int built;
    atomic_int mismatches;
} shared_t;

static int concurrent_child(const world_t *w)
{
    shared_t *sh = w->arg;
    listen_log(); /* the parent's count and budget came along with the fork */
    /* all start together: wait (with a deadline) until every one is here */
    atomic_fetch_add(&sh->arrived, 1);
    int64_t deadline = world_now_ms() + 20000;
    while (atomic_load(&sh->arrived) < w->world_size && world_now_ms() < deadline)
        sched_yield();
    static float x[2 * N * SIDE * SIDE];
    static int64_t y[2 * N];
    zd_dataset_t *ds;
    WTRY((ds = zd_dataset_load(src, ZD_DATASET_TRAIN)) ? 0 : -1);
    batches(ds, x, y);
    zd_dataset_free(ds);
    if (memcmp(x, ref_x, sizeof x) != 0 || memcmp(y, ref_y, sizeof y) != 0)
        atomic_fetch_add(&sh->mismatches, 1);
    atomic_fetch_add(&sh->built, atomic_load(&builds));
    zd_log_set_sink(NULL, NULL);
    return 0;
}

static void test_concurrent_first_use(void **state)
{
    (void)state;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/fresh", cache);
    reference();
    setenv("ZDIST_CACHE_DIR", dir, 1);
    shared_t *sh =
        mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof *sh);
    assert_int_equal(world_run_simple(6, 60, concurrent_child, sh), 0);
    /* one decompression per file, whoever did it; everyone read it */
    assert_int_equal(atomic_load(&sh->built), 2);
    assert_int_equal(atomic_load(&sh->mismatches), 0);
    assert_int_equal(count_files(dir, ".idx", false), 2);
    assert_int_equal(count_files(dir, ".build", true), 0);
    munmap(sh, sizeof *sh);
    setenv("ZDIST_CACHE_DIR", cache, 1);
}

/*  Spoils the images' cache file with how, then checks that a load
    rebuilds it and reads the right data. */
static void spoil_and_rebuild(const char *what, void (*how)(const char *path, off_t size))
{
    char path[600];
    struct stat before, after;
    images_cache_file(path, sizeof path);
    assert_int_equal(stat(path, &before), 0);
    how(path, before.st_size);
    listen_log();
    assert_same_batches();
    stop_log();
    if (atomic_load(&builds) != 1)
        fail_msg("%s: %d rebuilds, expected 1", what, atomic_load(&builds));
    assert_int_equal(stat(path, &after), 0);
    assert_int_equal(after.st_size, before.st_size);
    assert_int_equal(count_files(cache, ".idx", false), 2);
}

static void flip_payload_byte(const char *path, off_t size)
{
    int fd = open(path, O_RDWR);
    unsigned char b;
    off_t at = size - 100; /* pixels of the last image */
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static void truncate_payload(const char *path, off_t size)
{
    assert_int_equal(truncate(path, size / 2), 0);
}

static void overwrite_header(const char *path, off_t size)
{
    (void)size;
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "garbage!", 8, 0), 8);
    close(fd);
}

static void test_corrupt_cache_rebuilt(void **state)
{
    (void)state;
    reference();
    assert_same_batches(); /* the cache is there */
    spoil_and_rebuild("a flipped payload byte", flip_payload_byte);
    spoil_and_rebuild("a truncated file", truncate_payload);
    spoil_and_rebuild("a bad header", overwrite_header);
}

#define MARK "user.zdist.verified"

/*  Sets path's modification time secs before now, as if written then. */
static void age(const char *path, int secs)
{
    struct timespec t[2];
    clock_gettime(CLOCK_REALTIME, &t[1]);
    t[1].tv_sec -= secs;
    t[0] = t[1];
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

/*  The mark on path ("" when there is none). */
static void mark_of(const char *path, char *buf, size_t size)
{
    ssize_t n = getxattr(path, MARK, buf, size - 1);
    buf[n < 0 ? 0 : n] = '\0';
}

/*  A restore of the modification time after a write. */
static struct timespec kept_mtime;

static void flip_behind_kept_mtime(const char *path, off_t size)
{
    flip_payload_byte(path, size);
    struct timespec t[2] = {kept_mtime, kept_mtime};
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static void test_crc_checked_once_per_boot(void **state)
{
    (void)state;
    char path[600], mark[256], boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    assert_non_null(f);
    assert_non_null(fgets(boot, sizeof boot, f));
    fclose(f);
    boot[strcspn(boot, "\n")] = '\0';
    reference();
    assert_same_batches();
    images_cache_file(path, sizeof path);
    if (setxattr(path, "user.zdist.probe", "1", 1, 0) < 0)
        skip(); /* a file system without user extended attributes: checked every time */
    removexattr(path, "user.zdist.probe");
    /* just written: not marked, since a write in the same tick of the
       clock would not change the modification time */
    assert_same_batches();
    mark_of(path, mark, sizeof mark);
    assert_string_equal(mark, "");
    /* written long enough ago: the first check marks it for this boot */
    age(path, 10);
    assert_same_batches();
    mark_of(path, mark, sizeof mark);
    assert_true(strncmp(mark, boot, strlen(boot)) == 0);
    /* a marked file is not read through again (the point: 65 processes
       starting together check it once), even when its bytes changed behind
       a modification time put back as it was */
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    kept_mtime = st.st_mtim;
    flip_behind_kept_mtime(path, st.st_size);
    listen_log();
    zd_dataset_t *ds;
    assert_non_null(ds = zd_dataset_load(src, ZD_DATASET_TRAIN));
    zd_dataset_free(ds);
    stop_log();
    assert_int_equal(atomic_load(&builds), 0);
    flip_behind_kept_mtime(path, st.st_size); /* the byte back */
    assert_same_batches();
    assert_int_equal(atomic_load(&builds), 0);
    /* a write changes the modification time: checked again, rebuilt */
    spoil_and_rebuild("a byte flipped after the mark", flip_payload_byte);
    /* another boot's mark is no mark: checked again, rebuilt */
    images_cache_file(path, sizeof path);
    age(path, 10);
    assert_same_batches();
    assert_int_equal(stat(path, &st), 0);
    snprintf(mark, sizeof mark, "00000000-0000-0000-0000-000000000000 %lld %lld.%09ld",
             (long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    assert_int_equal(setxattr(path, MARK, mark, strlen(mark), 0), 0);
    kept_mtime = st.st_mtim;
    spoil_and_rebuild("a byte flipped under another boot's mark", flip_behind_kept_mtime);
}

static void test_changed_source_replaces_entry(void **state)
{
    (void)state;
    reference();
    assert_same_batches();
    /* a new version of the source: its own entry, the old one removed */
    write_source(3);
    reference();
    listen_log();
    assert_same_batches();
    stop_log();
    assert_int_equal(atomic_load(&builds), 2);
    assert_int_equal(count_files(cache, ".idx", false), 2);
    write_source(0);
    reference();
}

static void test_unwritable_cache_falls_back(void **state)
{
    (void)state;
    reference();
    /* a directory that cannot be made (its parent is a file): even root
       cannot write there */
    char blocker[600], dir[700];
    snprintf(blocker, sizeof blocker, "%s/a-file", tmpdir());
    FILE *f = fopen(blocker, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/cache", blocker);
    setenv("ZDIST_CACHE_DIR", dir, 1);
    listen_log();
    assert_same_batches();
    stop_log();
    assert_int_equal(atomic_load(&builds), 0);
    /* a read-only directory (for a user the permissions bind) */
    if (geteuid() != 0) {
        char ro[600];
        snprintf(ro, sizeof ro, "%s/ro", tmpdir());
        assert_int_equal(mkdir(ro, 0500), 0);
        setenv("ZDIST_CACHE_DIR", ro, 1);
        assert_same_batches();
        assert_int_equal(count_files(ro, ".idx", false), 0);
        chmod(ro, 0700);
    }
    /* the cache turned off: nothing built (not even in a directory "off") */
    setenv("ZDIST_CACHE_DIR", "off", 1);
    listen_log();
    assert_same_batches();
    stop_log();
    assert_int_equal(atomic_load(&builds), 0);
    struct stat st;
    assert_int_equal(stat("off", &st), -1);
    setenv("ZDIST_CACHE_DIR", cache, 1);
}

/*  On the real data where there is some: the test split's every batch read
    in place equals the in-memory one. */
static void test_fashion_mnist_in_place(void **state)
{
    (void)state;
    char dir[1024];
    if (zd_dataset_find_dir(dir, sizeof dir) < 0)
        skip();
    zd_dataset_t *mem, *cached;
    setenv("ZDIST_CACHE_DIR", "off", 1);
    assert_non_null(mem = zd_dataset_load(dir, ZD_DATASET_TEST));
    setenv("ZDIST_CACHE_DIR", cache, 1);
    assert_non_null(cached = zd_dataset_load(dir, ZD_DATASET_TEST));
    int64_t n = zd_dataset_len(mem);
    assert_int_equal(zd_dataset_len(cached), n);
    int64_t *order = zd_dataset_order(mem, 11);
    for (int pass = 0; pass < 2; pass++) {
        for (int64_t s = 0; s < n; s += 1000) {
            zd_tensor_t *ax, *ay, *bx, *by;
            assert_int_equal(zd_dataset_batch(mem, pass ? order : NULL, s, 1000, &ax, &ay), 0);
            assert_int_equal(zd_dataset_batch(cached, pass ? order : NULL, s, 1000, &bx, &by), 0);
            assert_memory_equal(zd_tensor_data(ax), zd_tensor_data(bx), zd_tensor_nbytes(ax));
            assert_memory_equal(zd_tensor_data_i64(ay), zd_tensor_data_i64(by),
                                zd_tensor_nbytes(ay));
            zd_tensor_unref(ax);
            zd_tensor_unref(ay);
            zd_tensor_unref(bx);
            zd_tensor_unref(by);
        }
    }
    free(order);
    zd_dataset_free(mem);
    zd_dataset_free(cached);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_in_place_equals_float_path),
        cmocka_unit_test(test_concurrent_first_use),
        cmocka_unit_test(test_corrupt_cache_rebuilt),
        cmocka_unit_test(test_crc_checked_once_per_boot),
        cmocka_unit_test(test_changed_source_replaces_entry),
        cmocka_unit_test(test_unwritable_cache_falls_back),
        cmocka_unit_test(test_fashion_mnist_in_place),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
