/* SPDX-License-Identifier: MIT */
/*  dataset.h: MNIST-format data sets (MNIST, Fashion-MNIST): loading,
    normalisation, seeded shuffling and batching.

    A data set is an images IDX file (uint8, N x H x W) and a labels IDX
    file (uint8, N, each < 10), plain or gzip. In a directory they are found
    under the classic names

        train-images-idx3-ubyte   train-labels-idx1-ubyte    (ZD_DATASET_TRAIN)
        t10k-images-idx3-ubyte    t10k-labels-idx1-ubyte     (ZD_DATASET_TEST)

    or the variants with '.' before "idx" (train-images.idx3-ubyte), each
    optionally ending in ".gz" (a plain file is preferred when both exist).

    Images stay uint8 (a quarter of the float size); batches are
    normalised as torchvision's ToTensor + Normalize((0.1307,), (0.3081,))
    do, in float32: x = (v / 255 - 0.1307) / 0.3081.

    Gzip files are decompressed once per host into a cache directory
    ($ZDIST_CACHE_DIR, else ${XDG_CACHE_HOME:-~/.cache}/zdist; "off": none)
    and read in place from there, as plain files are: the images are
    mapped read-only and batches read from the file, so the data sit once
    in the host's page cache rather than in every process. Where the cache
    cannot be used, the files are read into memory (the user's guide,
    "The data set cache").

    A zd_dataset_t is immutable after loading except for zd_dataset_limit(); it
    may be read from several threads at once. */
#ifndef ZDIST_DATASET_H
#define ZDIST_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

#define ZD_DATASET_MEAN    0.1307f
#define ZD_DATASET_STD     0.3081f
#define ZD_DATASET_CLASSES 10

/*  Where zd_dataset_find_dir() looks, in order (after $ZDIST_DATA_DIR). */
#define ZD_DATASET_LOCAL_DIR  "./data"
#define ZD_DATASET_SYSTEM_DIR "/usr/share/datasets/fashion-mnist"

typedef enum {
    ZD_DATASET_TRAIN = 0, /* train-* files */
    ZD_DATASET_TEST = 1,  /* t10k-* files */
} zd_dataset_split_t;

typedef struct zd_dataset zd_dataset_t;

/*  Picks the data directory: $ZDIST_DATA_DIR when set (it must then hold
    the files), else ./data when it holds MNIST-format train images and
    labels, else /usr/share/datasets/fashion-mnist when that does. Copies
    the directory into buf. Returns 0, or -1 with an error naming every
    place it looked. */
ZD_API int zd_dataset_find_dir(char *buf, size_t size);

/*  Finds the images (kind "images") or labels (kind "labels") file of a
    split in dir, under any of the names above; copies its path into buf.
    Returns 0, or -1 with an error naming dir and the names tried. */
ZD_API int zd_dataset_find_file(const char *dir, zd_dataset_split_t split, const char *kind,
                                char *buf, size_t size);

/*  Loads a split from dir (NULL: zd_dataset_find_dir()). Checks that both
    files are uint8 IDX files of N x H x W images and N labels, that the
    counts agree and that every label is < 10. Returns the data set, a new
    object (zd_dataset_free), or NULL with an error naming the file. */
ZD_API zd_dataset_t *zd_dataset_load(const char *dir, zd_dataset_split_t split);

/*  Same (a new object (zd_dataset_free), or NULL with an error naming the
    file), from two explicit files. */
ZD_API zd_dataset_t *zd_dataset_load_files(const char *images_path, const char *labels_path);

/*  Frees a data set (NULL-safe). */
ZD_API void zd_dataset_free(zd_dataset_t *ds);

/*  Number of samples, and the image height (rows) and width (cols). */
ZD_API int64_t zd_dataset_len(const zd_dataset_t *ds);
ZD_API int64_t zd_dataset_rows(const zd_dataset_t *ds);
ZD_API int64_t zd_dataset_cols(const zd_dataset_t *ds);

/*  The files it was loaded from (borrowed: valid while ds lives). */
ZD_API const char *zd_dataset_images_path(const zd_dataset_t *ds);
ZD_API const char *zd_dataset_labels_path(const zd_dataset_t *ds);

/*  The raw images (N, H, W) uint8 and the labels (N) int64. Borrowed:
    valid until zd_dataset_free() or zd_dataset_limit(). The images may be
    a read-only mapping of the file: never write to them. */
ZD_API zd_tensor_t *zd_dataset_images_u8(const zd_dataset_t *ds);
ZD_API zd_tensor_t *zd_dataset_labels(const zd_dataset_t *ds);

/*  Keeps only the first k samples (k >= N keeps everything). Returns 0, or
    -1 (k < 1, or out of memory; the data set is then unchanged). */
ZD_API int zd_dataset_limit(zd_dataset_t *ds, int64_t k);

/*  Normalises uint8 images, (N, H, W) or (N, 1, H, W), into a new float32
    (N, 1, H, W) tensor with the formula above. Returns 0 and sets *out (a
    new reference), or -1. */
ZD_API int zd_dataset_normalise(const zd_tensor_t *images, zd_tensor_t **out);

/*  Puts idx[0..n) in a pseudo-random order (Fisher-Yates driven by
    <zdist/rng.h> seeded with seed): the same seed and n always give the same
    order, on every platform. */
ZD_API void zd_dataset_shuffle(int64_t *idx, int64_t n, uint64_t seed);

/*  An epoch order: a new array of zd_dataset_len() indices, 0..N-1 shuffled
    with zd_dataset_shuffle(seed). Callers wanting a different order per epoch
    pass e.g. seed + epoch. The caller frees it with free(). NULL when out
    of memory. */
ZD_API int64_t *zd_dataset_order(const zd_dataset_t *ds, uint64_t seed);

/*  Number of batches of batch_size in one epoch, the last one partial:
    ceil(N / batch_size). 0 for batch_size < 1. */
ZD_API int64_t zd_dataset_num_batches(const zd_dataset_t *ds, int64_t batch_size);

/*  The batch of samples order[start], ..., order[start + B - 1] with
    B = min(batch_size, N - start) (so the last batch may be partial);
    order NULL means 0, 1, 2, ... Sets *x to a new float32 (B, 1, H, W)
    normalised tensor and *y to a new int64 (B) label tensor (new
    references both). Returns 0, or -1 (start outside [0, N), batch_size < 1, an
    index outside [0, N) in order, out of memory) with *x and *y NULL. */
ZD_API int zd_dataset_batch(const zd_dataset_t *ds, const int64_t *order, int64_t start,
                            int64_t batch_size, zd_tensor_t **x, zd_tensor_t **y);

ZD_END_DECLS

#endif
