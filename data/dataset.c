/* SPDX-License-Identifier: MIT */
/*  dataset.c: MNIST-format data sets. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/dataset.h>
#include <zdist/idx.h>
#include <zdist/rng.h>

#include "core/fault_inject.h"
#include "data/dataset_cache.h"

struct zd_dataset {
    zd_tensor_t *images; /* (N, H, W) uint8 */
    zd_tensor_t *labels; /* (N) int64 */
    int64_t n, rows, cols;
    char *images_path;
    char *labels_path;
    /* The images file read in place (dataset_cache.c): batches are read
       from it with pread, so the pages stay in the page cache, shared by
       every process of the host, and out of this one's resident set.
       -1: the images are in memory only. */
    int fd;
    int64_t data_off;
};

static bool is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int zd_dataset_find_file(const char *dir, zd_dataset_split_t split, const char *kind, char *buf,
                         size_t size)
{
    if (!dir)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_find_file: NULL dir");
    if (!kind)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_find_file: NULL kind");
    if (!buf)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_find_file: NULL buf");
    const char *prefix = split == ZD_DATASET_TEST ? "t10k" : "train";
    if (strcmp(kind, "images") != 0 && strcmp(kind, "labels") != 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "dataset: unknown file kind '%s' (images or labels)", kind);
    const char *idx = strcmp(kind, "labels") == 0 ? "idx1" : "idx3";
    /* Plain before gzip: both hold the same data and plain reads faster. */
    static const char *const patterns[] = {
        "%s/%s-%s-%s-ubyte",
        "%s/%s-%s.%s-ubyte",
        "%s/%s-%s-%s-ubyte.gz",
        "%s/%s-%s.%s-ubyte.gz",
    };
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        int n = snprintf(buf, size, patterns[i], dir, prefix, kind, idx);
        if (n < 0 || (size_t)n >= size)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "dataset: path in %s too long", dir);
        if (is_file(buf))
            return 0;
    }
    return zd_error_set("dataset: no %s %s in %s (looked for %s-%s-%s-ubyte[.gz] and "
                        "%s-%s.%s-ubyte[.gz])",
                        prefix, kind, dir, prefix, kind, idx, prefix, kind, idx);
}

static bool holds_train_files(const char *dir)
{
    char path[4096];
    return zd_dataset_find_file(dir, ZD_DATASET_TRAIN, "images", path, sizeof path) == 0 &&
        zd_dataset_find_file(dir, ZD_DATASET_TRAIN, "labels", path, sizeof path) == 0;
}

/*  The directory found: the places tried before it left their error text,
    which must not outlive a success. */
static int copy_dir(const char *dir, char *buf, size_t size)
{
    if ((size_t)snprintf(buf, size, "%s", dir) >= size)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dataset: directory name %s too long", dir);
    zd_error_clear();
    return 0;
}

int zd_dataset_find_dir(char *buf, size_t size)
{
    if (!buf)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_find_dir: NULL buf");
    const char *env = getenv("ZDIST_DATA_DIR");
    if (env && *env) {
        if (!holds_train_files(env))
            return zd_error_set("dataset: ZDIST_DATA_DIR=%s holds no MNIST-format files "
                                "(train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz])",
                                env);
        return copy_dir(env, buf, size);
    }
    if (holds_train_files(ZD_DATASET_LOCAL_DIR))
        return copy_dir(ZD_DATASET_LOCAL_DIR, buf, size);
    if (holds_train_files(ZD_DATASET_SYSTEM_DIR))
        return copy_dir(ZD_DATASET_SYSTEM_DIR, buf, size);
    return zd_error_set("dataset: no MNIST-format data found: neither %s nor %s holds "
                        "train-images-idx3-ubyte[.gz] and train-labels-idx1-ubyte[.gz] "
                        "(put MNIST or Fashion-MNIST files in %s, or set ZDIST_DATA_DIR)",
                        ZD_DATASET_LOCAL_DIR, ZD_DATASET_SYSTEM_DIR, ZD_DATASET_LOCAL_DIR);
}

zd_dataset_t *zd_dataset_load(const char *dir, zd_dataset_split_t split)
{
    char found[4096], images[4096], labels[4096];
    if (!dir) {
        if (zd_dataset_find_dir(found, sizeof found) < 0)
            return NULL;
        dir = found;
    }
    if (zd_dataset_find_file(dir, split, "images", images, sizeof images) < 0 ||
        zd_dataset_find_file(dir, split, "labels", labels, sizeof labels) < 0)
        return NULL;
    return zd_dataset_load_files(images, labels);
}

/*  Checks the two tensors and turns the labels into int64. */
static int check_and_convert(const char *ipath, zd_tensor_t *img, const char *lpath,
                             zd_tensor_t *lab, zd_tensor_t **labels64)
{
    char s[96];
    if (zd_tensor_dtype(img) != ZD_UINT8 || zd_tensor_ndim(img) != 3)
        return zd_error_set("dataset: %s: expected uint8 images N x H x W, got %s %s", ipath,
                            zd_tensor_dtype_name(zd_tensor_dtype(img)),
                            zd_tensor_shape_str(img, s, sizeof s));
    if (zd_tensor_dtype(lab) != ZD_UINT8 || zd_tensor_ndim(lab) != 1)
        return zd_error_set("dataset: %s: expected uint8 labels of shape (N), got %s %s", lpath,
                            zd_tensor_dtype_name(zd_tensor_dtype(lab)),
                            zd_tensor_shape_str(lab, s, sizeof s));
    int64_t n = zd_tensor_size(img, 0);
    if (n == 0 || zd_tensor_size(img, 1) == 0 || zd_tensor_size(img, 2) == 0)
        return zd_error_set("dataset: %s: no images (shape %s)", ipath,
                            zd_tensor_shape_str(img, s, sizeof s));
    if (zd_tensor_size(lab, 0) != n)
        return zd_error_set("dataset: image and label counts differ: %s holds %lld images, "
                            "%s holds %lld labels",
                            ipath, (long long)n, lpath, (long long)zd_tensor_size(lab, 0));
    const uint8_t *l = zd_tensor_raw(lab);
    for (int64_t i = 0; i < n; i++)
        if (l[i] >= ZD_DATASET_CLASSES)
            return zd_error_set("dataset: %s: label %d at index %lld is not a class "
                                "(0 to %d)",
                                lpath, l[i], (long long)i, ZD_DATASET_CLASSES - 1);
    *labels64 = zd_tensor_empty(ZD_INT64, &n, 1);
    if (!*labels64)
        return -1;
    int64_t *d = zd_tensor_data_i64(*labels64);
    for (int64_t i = 0; i < n; i++)
        d[i] = l[i];
    return 0;
}

typedef struct {
    void *map;
    size_t len;
} mapping_t;

static void unmap(void *data, void *arg)
{
    (void)data;
    mapping_t *m = arg;
    munmap(m->map, m->len);
    free(m);
}

/*  A uint8 IDX file as a tensor over its read-only mapping (the cache's
    copy of a gzip file, or a plain file itself), or, when that cannot be
    had, read into memory (which reports a bad file). With fd_out, the
    file stays open there (-1 for memory) and *off_out says where the
    elements start. */
static int load_in_place(const char *path, zd_tensor_t **t, int *fd_out, int64_t *off_out)
{
    zd__idx_view_t v;
    mapping_t *m = NULL;
    *t = NULL;
    if (fd_out)
        *fd_out = -1;
    /* Failing here, out of memory too, leaves reading the file. */
    ZD_FAULT_BENIGN(true);
    if (zd__idx_view_open(path, &v) == 0 && (m = malloc(sizeof *m))) {
        m->map = v.map;
        m->len = v.map_len;
        v.map = NULL; /* the tensor unmaps it */
        *t = zd_tensor_wrap(ZD_UINT8, v.dims, v.ndim, (char *)m->map + v.data_off, v.data_bytes,
                            unmap, m);
        if (*t && fd_out) {
            *fd_out = v.fd;
            *off_out = v.data_off;
            v.fd = -1;
        }
    }
    zd__idx_view_close(&v);
    ZD_FAULT_BENIGN(false);
    if (!*t)
        *t = zd_idx_read(path);
    return *t ? 0 : -1;
}

static int load_files(const char *images_path, const char *labels_path, zd_dataset_t **out)
{
    zd_tensor_t *img = NULL, *lab = NULL, *lab64 = NULL;
    int fd = -1;
    int64_t data_off = 0;
    *out = NULL;
    if (load_in_place(images_path, &img, &fd, &data_off) < 0)
        return zd_error_wrap("dataset: images");
    if (load_in_place(labels_path, &lab, NULL, NULL) < 0) {
        zd_tensor_unref(img);
        if (fd >= 0)
            close(fd);
        return zd_error_wrap("dataset: labels");
    }
    int rc = check_and_convert(images_path, img, labels_path, lab, &lab64);
    zd_tensor_unref(lab);
    zd_dataset_t *ds = rc == 0 ? calloc(1, sizeof *ds) : NULL;
    if (ds) {
        ds->images_path = strdup(images_path);
        ds->labels_path = strdup(labels_path);
    }
    if (!ds || !ds->images_path || !ds->labels_path) {
        if (rc == 0)
            zd_error_set_code(ZD_ERR_NO_MEMORY, "dataset: out of memory");
        if (ds) {
            free(ds->images_path);
            free(ds->labels_path);
            free(ds);
        }
        zd_tensor_unref(img);
        zd_tensor_unref(lab64);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    ds->fd = fd;
    ds->data_off = data_off;
    ds->images = img;
    ds->labels = lab64;
    ds->n = zd_tensor_size(img, 0);
    ds->rows = zd_tensor_size(img, 1);
    ds->cols = zd_tensor_size(img, 2);
    *out = ds;
    return 0;
}

zd_dataset_t *zd_dataset_load_files(const char *images_path, const char *labels_path)
{
    if (!images_path) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_load_files: NULL images_path");
        return NULL;
    }
    if (!labels_path) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_load_files: NULL labels_path");
        return NULL;
    }
    zd_dataset_t *ds;
    return load_files(images_path, labels_path, &ds) < 0 ? NULL : ds;
}

void zd_dataset_free(zd_dataset_t *ds)
{
    if (!ds)
        return;
    zd_tensor_unref(ds->images);
    zd_tensor_unref(ds->labels);
    if (ds->fd >= 0)
        close(ds->fd);
    free(ds->images_path);
    free(ds->labels_path);
    free(ds);
}

int64_t zd_dataset_len(const zd_dataset_t *ds)
{
    return ds->n;
}
int64_t zd_dataset_rows(const zd_dataset_t *ds)
{
    return ds->rows;
}
int64_t zd_dataset_cols(const zd_dataset_t *ds)
{
    return ds->cols;
}
const char *zd_dataset_images_path(const zd_dataset_t *ds)
{
    return ds->images_path;
}
const char *zd_dataset_labels_path(const zd_dataset_t *ds)
{
    return ds->labels_path;
}
zd_tensor_t *zd_dataset_images_u8(const zd_dataset_t *ds)
{
    return ds->images;
}
zd_tensor_t *zd_dataset_labels(const zd_dataset_t *ds)
{
    return ds->labels;
}

int zd_dataset_limit(zd_dataset_t *ds, int64_t k)
{
    if (!ds)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_limit: NULL data set");
    if (k < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dataset: limit %lld (at least 1 sample)",
                                 (long long)k);
    if (k >= ds->n)
        return 0;
    int64_t shape[3] = {k, ds->rows, ds->cols};
    zd_tensor_t *img = zd_tensor_from_data(ZD_UINT8, shape, 3, zd_tensor_raw(ds->images));
    zd_tensor_t *lab = zd_tensor_from_data(ZD_INT64, &k, 1, zd_tensor_raw(ds->labels));
    if (!img || !lab) {
        zd_tensor_unref(img);
        zd_tensor_unref(lab);
        return -1;
    }
    zd_tensor_unref(ds->images);
    zd_tensor_unref(ds->labels);
    ds->images = img;
    ds->labels = lab;
    ds->n = k;
    return 0;
}

/*  The same arithmetic as ToTensor (v / 255 in float32) followed by
    Normalize (subtract, then divide, by float32 mean and std). */
static void make_table(float table[256])
{
    for (int v = 0; v < 256; v++)
        table[v] = ((float)v / 255.0f - ZD_DATASET_MEAN) / ZD_DATASET_STD;
}

int zd_dataset_normalise(const zd_tensor_t *images, zd_tensor_t **out)
{
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_normalise: NULL out");
    *out = NULL;
    if (!images)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_normalise: NULL images");
    char s[96];
    int nd = zd_tensor_ndim(images);
    *out = NULL;
    if (zd_tensor_dtype(images) != ZD_UINT8 || (nd != 3 && nd != 4) ||
        (nd == 4 && zd_tensor_size(images, 1) != 1))
        return zd_error_set_code(
            ZD_ERR_ARGUMENT,
            "zd_dataset_normalise: expected uint8 (N, H, W) or (N, 1, H, W), got "
            "%s %s",
            zd_tensor_dtype_name(zd_tensor_dtype(images)),
            zd_tensor_shape_str(images, s, sizeof s));
    int64_t shape[4] = {zd_tensor_size(images, 0), 1, zd_tensor_size(images, -2),
                        zd_tensor_size(images, -1)};
    zd_tensor_t *x = zd_tensor_empty(ZD_FLOAT32, shape, 4);
    if (!x)
        return -1;
    float table[256];
    make_table(table);
    const uint8_t *src = zd_tensor_raw(images);
    float *dst = zd_tensor_data(x);
    for (int64_t i = 0, n = zd_tensor_numel(x); i < n; i++)
        dst[i] = table[src[i]];
    *out = x;
    return 0;
}

void zd_dataset_shuffle(int64_t *idx, int64_t n, uint64_t seed)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    zd_rng_shuffle_i64(&rng, idx, n > 0 ? (size_t)n : 0);
}

int64_t *zd_dataset_order(const zd_dataset_t *ds, uint64_t seed)
{
    if (!ds) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_order: NULL data set");
        return NULL;
    }
    int64_t *order = malloc((size_t)ds->n * sizeof *order);
    if (!order) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "dataset: out of memory for an order of %lld samples",
                          (long long)ds->n);
        return NULL;
    }
    for (int64_t i = 0; i < ds->n; i++)
        order[i] = i;
    zd_dataset_shuffle(order, ds->n, seed);
    return order;
}

int64_t zd_dataset_num_batches(const zd_dataset_t *ds, int64_t batch_size)
{
    if (batch_size < 1)
        return 0;
    return (ds->n + batch_size - 1) / batch_size;
}

/*  The batch's images, uint8, from the file (a new array the caller
    frees): one read for consecutive samples, else one per sample. Through
    pread rather than the mapping, so that an epoch leaves no data set
    pages in this process's resident set. */
static int read_rows(const zd_dataset_t *ds, const int64_t *order, int64_t start, int64_t b,
                     uint8_t **rows)
{
    const size_t pix = (size_t)(ds->rows * ds->cols);
    uint8_t *r = malloc((size_t)b * pix);
    errno = 0;
    if (!r)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "zd_dataset_batch: out of memory for %lld images", (long long)b);
    bool ok = true;
    if (!order)
        ok = zd__pread_full(ds->fd, r, (size_t)b * pix,
                            (off_t)(ds->data_off + start * (int64_t)pix));
    for (int64_t i = 0; order && i < b && ok; i++)
        ok = zd__pread_full(ds->fd, r + (size_t)i * pix, pix,
                            (off_t)(ds->data_off + order[start + i] * (int64_t)pix));
    if (!ok) {
        free(r);
        return zd_error_set("zd_dataset_batch: reading %s: %s", ds->images_path,
                            errno ? strerror(errno) : "the file is shorter than it was");
    }
    *rows = r;
    return 0;
}

int zd_dataset_batch(const zd_dataset_t *ds, const int64_t *order, int64_t start,
                     int64_t batch_size, zd_tensor_t **x, zd_tensor_t **y)
{
    if (!x)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_batch: NULL x");
    if (!y)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_batch: NULL y");
    *x = *y = NULL;
    if (!ds)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_batch: NULL data set");
    if (batch_size < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dataset_batch: batch size %lld (at least 1)",
                                 (long long)batch_size);
    if (start < 0 || start >= ds->n)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_dataset_batch: start %lld outside the %lld samples",
                                 (long long)start, (long long)ds->n);
    int64_t b = ds->n - start < batch_size ? ds->n - start : batch_size;
    for (int64_t i = 0; order && i < b; i++)
        if (order[start + i] < 0 || order[start + i] >= ds->n)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "zd_dataset_batch: order[%lld] = %lld is not a sample index "
                                     "(0 to %lld)",
                                     (long long)(start + i), (long long)order[start + i],
                                     (long long)ds->n - 1);
    int64_t xs[4] = {b, 1, ds->rows, ds->cols};
    *x = zd_tensor_empty(ZD_FLOAT32, xs, 4);
    *y = zd_tensor_empty(ZD_INT64, &b, 1);
    if (!*x || !*y) {
        zd_tensor_unref_p(x);
        zd_tensor_unref_p(y);
        return -1;
    }
    float table[256];
    make_table(table);
    const int64_t pix = ds->rows * ds->cols;
    const uint8_t *src = zd_tensor_raw(ds->images);
    const int64_t *lab = zd_tensor_data_i64(ds->labels);
    float *dx = zd_tensor_data(*x);
    int64_t *dy = zd_tensor_data_i64(*y);
    uint8_t *rows = NULL;
    if (ds->fd >= 0 && read_rows(ds, order, start, b, &rows) < 0) {
        zd_tensor_unref_p(x);
        zd_tensor_unref_p(y);
        return -1;
    }
    for (int64_t i = 0; i < b; i++) {
        int64_t k = order ? order[start + i] : start + i;
        const uint8_t *img = rows ? rows + i * pix : src + k * pix;
        for (int64_t p = 0; p < pix; p++)
            dx[i * pix + p] = table[img[p]];
        dy[i] = lab[k];
    }
    free(rows);
    return 0;
}
