/* SPDX-License-Identifier: MIT */
/*  checkpoint.c: the checkpoint file format described in checkpoint.h. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include <zdist/error.h>
#include <zdist/checkpoint.h>
#include "data/files.h"

#define HEADER_BYTES 16

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BIG_ENDIAN 1
#else
#define HOST_BIG_ENDIAN 0
#endif

/*  One tensor record of a file held in memory. */
typedef struct {
    const char *name; /* not NUL-terminated */
    uint32_t name_len;
    zd_tensor_dtype_t dtype;
    int ndim;
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    const unsigned char *data;
    size_t bytes;
} record_t;

/*  A parsed file: the bytes and the records pointing into them. */
typedef struct {
    unsigned char *buf;
    size_t size;
    uint32_t count;
    record_t *rec;
} parsed_t;

/*  ---- saving ---- */

typedef struct {
    FILE *f;
    uLong crc;
    bool failed;
} writer_t;

static void emit(writer_t *w, const void *p, size_t n)
{
    if (w->failed || n == 0)
        return;
    if (fwrite(p, 1, n, w->f) != n) {
        w->failed = true;
        return;
    }
    w->crc = crc32_z(w->crc, p, n);
}

static void emit_u32(writer_t *w, uint32_t v)
{
    unsigned char b[4];
    zd__put_le32(b, v);
    emit(w, b, 4);
}

static void emit_data(writer_t *w, const zd_tensor_t *t)
{
    size_t es = zd_tensor_dtype_size(zd_tensor_dtype(t));
    const unsigned char *p = zd_tensor_raw(t);
    size_t bytes = zd_tensor_nbytes(t);
    if (!HOST_BIG_ENDIAN || es == 1) {
        emit(w, p, bytes);
        return;
    }
    unsigned char tmp[4096];
    for (size_t off = 0; off < bytes;) {
        size_t k = 0;
        for (; k + es <= sizeof tmp && off < bytes; k += es, off += es)
            for (size_t b = 0; b < es; b++)
                tmp[k + b] = p[off + es - 1 - b];
        emit(w, tmp, k);
    }
}

/*  The list holds unique, non-empty names and a tensor for each: what is
    left to check is what the file format bounds. */
static int check_inputs(const char *path, const zd_named_tensors_t *nt)
{
    if (!nt)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "checkpoint: %s: no tensors given (NULL)", path);
    int n = zd_named_tensors_len(nt);
    if (n > ZD_CHECKPOINT_MAX_COUNT)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "checkpoint: %s: %d tensors (0 to %d)", path, n,
                                 ZD_CHECKPOINT_MAX_COUNT);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(zd_named_tensors_name(nt, i));
        if (len > ZD_CHECKPOINT_MAX_NAME)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "checkpoint: %s: name of tensor %d is %zu bytes (1 to %d)",
                                     path, i, len, ZD_CHECKPOINT_MAX_NAME);
    }
    return 0;
}

static void write_all(writer_t *w, const zd_named_tensors_t *nt)
{
    int n = zd_named_tensors_len(nt);
    emit(w, ZD_CHECKPOINT_MAGIC, 8);
    emit_u32(w, ZD_CHECKPOINT_VERSION);
    emit_u32(w, (uint32_t)n);
    for (int i = 0; i < n; i++) {
        const char *name = zd_named_tensors_name(nt, i);
        const zd_tensor_t *t = zd_named_tensors_tensor(nt, i);
        uint32_t len = (uint32_t)strlen(name);
        emit_u32(w, len);
        emit(w, name, len);
        emit_u32(w, (uint32_t)zd_tensor_dtype(t));
        emit_u32(w, (uint32_t)zd_tensor_ndim(t));
        for (int d = 0; d < zd_tensor_ndim(t); d++) {
            unsigned char b[8];
            uint64_t v = (uint64_t)zd_tensor_size(t, d);
            zd__put_le32(b, (uint32_t)v);
            zd__put_le32(b + 4, (uint32_t)(v >> 32));
            emit(w, b, 8);
        }
        emit_data(w, t);
    }
    unsigned char b[4];
    zd__put_le32(b, (uint32_t)w->crc);
    if (!w->failed && fwrite(b, 1, 4, w->f) != 4)
        w->failed = true;
}

typedef struct {
    const char *path;
    const zd_named_tensors_t *nt;
} save_t;

static int save_to(FILE *f, void *arg)
{
    save_t *s = arg;
    writer_t w = {f, crc32(0L, Z_NULL, 0), false};
    write_all(&w, s->nt);
    return w.failed ? zd_error_set("checkpoint: %s: cannot write: %s", s->path, strerror(errno))
                    : 0;
}

int zd_checkpoint_save(const zd_named_tensors_t *tensors, const char *path)
{
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_checkpoint_save: NULL path");
    if (check_inputs(path, tensors) < 0)
        return -1;
    return zd__file_replace("checkpoint", path, save_to, &(save_t){path, tensors});
}

/*  ---- loading ---- */

static int read_file(const char *path, parsed_t *p)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return zd_error_set("checkpoint: %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return zd_error_set("checkpoint: %s: not a regular file", path);
    }
    p->size = (size_t)st.st_size;
    p->buf = malloc(p->size ? p->size : 1);
    if (!p->buf) {
        fclose(f);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "checkpoint: %s: out of memory for %zu bytes",
                                 path, p->size);
    }
    size_t got = fread(p->buf, 1, p->size, f);
    fclose(f);
    if (got != p->size)
        return zd_error_set("checkpoint: %s: read error", path);
    return 0;
}

/*  Walks one record at *pos; end is where the CRC starts. */
static int parse_record(const char *path, parsed_t *p, uint32_t k, size_t *pos, size_t end)
{
    record_t *r = &p->rec[k];
    const unsigned char *b = p->buf;
#define NEED(n, what)                                                                              \
    if (end - *pos < (size_t)(n))                                                                  \
    return zd_error_set("checkpoint: %s: truncated: tensor %u of %u needs %zu bytes of %s, "       \
                        "only %zu left",                                                           \
                        path, k + 1, p->count, (size_t)(n), what, end - *pos)
    NEED(4, "name length");
    r->name_len = zd__le32(b + *pos);
    *pos += 4;
    if (r->name_len == 0 || r->name_len > ZD_CHECKPOINT_MAX_NAME)
        return zd_error_set("checkpoint: %s: tensor %u of %u: name length %u out of range "
                            "(corrupt file)",
                            path, k + 1, p->count, r->name_len);
    NEED(r->name_len + 8, "name, dtype and ndim");
    r->name = (const char *)b + *pos;
    if (memchr(r->name, '\0', r->name_len))
        return zd_error_set("checkpoint: %s: tensor %u of %u: a NUL byte in its name (corrupt "
                            "file)",
                            path, k + 1, p->count);
    *pos += r->name_len;
    uint32_t dtype = zd__le32(b + *pos), ndim = zd__le32(b + *pos + 4);
    *pos += 8;
    size_t es = zd_tensor_dtype_size((zd_tensor_dtype_t)dtype);
    if (es == 0 || ndim > ZD_TENSOR_MAX_DIMS)
        return zd_error_set("checkpoint: %s: tensor '%.*s': dtype %u, %u dimensions (corrupt "
                            "file)",
                            path, (int)r->name_len, r->name, dtype, ndim);
    r->dtype = (zd_tensor_dtype_t)dtype;
    r->ndim = (int)ndim;
    NEED(8 * ndim, "dimensions");
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
        uint64_t v = zd__le64(b + *pos + 8 * d);
        if (v > (uint64_t)INT64_MAX || (v && numel > (uint64_t)INT64_MAX / 16 / v))
            return zd_error_set("checkpoint: %s: tensor '%.*s': dimensions too large (corrupt "
                                "file)",
                                path, (int)r->name_len, r->name);
        numel *= v;
        r->shape[d] = (int64_t)v;
    }
    *pos += 8 * ndim;
    if (numel > (end - *pos) / es)
        return zd_error_set("checkpoint: %s: truncated: tensor '%.*s' needs %llu bytes of "
                            "data, only %zu left",
                            path, (int)r->name_len, r->name, (unsigned long long)(numel * es),
                            end - *pos);
    r->data = b + *pos;
    r->bytes = (size_t)numel * es;
    *pos += r->bytes;
    return 0;
#undef NEED
}

static void parsed_free(parsed_t *p)
{
    free(p->buf);
    free(p->rec);
}

/*  Reads and checks the whole file: structure, CRC, unique names. */
static int parse(const char *path, parsed_t *p)
{
    memset(p, 0, sizeof *p);
    if (read_file(path, p) < 0) {
        parsed_free(p);
        return -1;
    }
    int rc = -1;
    if (p->size >= 8 && memcmp(p->buf, ZD_CHECKPOINT_MAGIC, 8) != 0) {
        zd_error_set("checkpoint: %s: not a checkpoint (bad magic)", path);
        goto out;
    }
    if (p->size < HEADER_BYTES + 4) {
        zd_error_set("checkpoint: %s: truncated: %zu bytes, shorter than a header", path, p->size);
        goto out;
    }
    uint32_t version = zd__le32(p->buf + 8);
    if (version != ZD_CHECKPOINT_VERSION) {
        zd_error_set("checkpoint: %s: version %u not supported (this build reads version %d)", path,
                     version, ZD_CHECKPOINT_VERSION);
        goto out;
    }
    p->count = zd__le32(p->buf + 12);
    if (p->count > ZD_CHECKPOINT_MAX_COUNT) {
        zd_error_set("checkpoint: %s: %u tensors (corrupt file)", path, p->count);
        goto out;
    }
    p->rec = calloc(p->count ? p->count : 1, sizeof *p->rec);
    if (!p->rec) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "checkpoint: %s: out of memory", path);
        goto out;
    }
    size_t pos = HEADER_BYTES, end = p->size - 4;
    for (uint32_t k = 0; k < p->count; k++)
        if (parse_record(path, p, k, &pos, end) < 0)
            goto out;
    uint32_t stored = zd__le32(p->buf + end),
             actual = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), p->buf, end);
    if (stored != actual) {
        zd_error_set("checkpoint: %s: CRC mismatch (stored %08x, computed %08x): the file is "
                     "corrupt",
                     path, stored, actual);
        goto out;
    }
    if (pos != end) {
        zd_error_set("checkpoint: %s: %zu unexpected bytes after the last tensor", path, end - pos);
        goto out;
    }
    for (uint32_t k = 0; k < p->count; k++)
        for (uint32_t j = 0; j < k; j++)
            if (p->rec[j].name_len == p->rec[k].name_len &&
                memcmp(p->rec[j].name, p->rec[k].name, p->rec[k].name_len) == 0) {
                zd_error_set("checkpoint: %s: tensor '%.*s' appears twice", path,
                             (int)p->rec[k].name_len, p->rec[k].name);
                goto out;
            }
    rc = 0;
out:
    if (rc < 0)
        parsed_free(p);
    return rc;
}

static bool name_is(const record_t *r, const char *name)
{
    return strlen(name) == r->name_len && memcmp(r->name, name, r->name_len) == 0;
}

static void copy_data(void *dst, const record_t *r)
{
    size_t es = zd_tensor_dtype_size(r->dtype);
    if (!HOST_BIG_ENDIAN || es == 1) {
        memcpy(dst, r->data, r->bytes);
        return;
    }
    unsigned char *d = dst;
    for (size_t off = 0; off < r->bytes; off += es)
        for (size_t b = 0; b < es; b++)
            d[off + b] = r->data[off + es - 1 - b];
}

/*  Finds, for every requested name, its record; checks dtypes and shapes. */
static int match(const char *path, const parsed_t *p, const zd_named_tensors_t *nt,
                 const record_t **which)
{
    int n = zd_named_tensors_len(nt);
    for (int i = 0; i < n; i++) {
        const char *name = zd_named_tensors_name(nt, i);
        which[i] = NULL;
        for (uint32_t k = 0; k < p->count && !which[i]; k++)
            if (name_is(&p->rec[k], name))
                which[i] = &p->rec[k];
        if (!which[i])
            return zd_error_set("checkpoint: %s: no tensor '%s' in the file", path, name);
        const record_t *r = which[i];
        const zd_tensor_t *t = zd_named_tensors_tensor(nt, i);
        if (r->dtype != zd_tensor_dtype(t))
            return zd_error_set("checkpoint: %s: tensor '%s' is %s in the file but %s here", path,
                                name, zd_tensor_dtype_name(r->dtype),
                                zd_tensor_dtype_name(zd_tensor_dtype(t)));
        bool same = r->ndim == zd_tensor_ndim(t);
        for (int d = 0; same && d < r->ndim; d++)
            same = r->shape[d] == zd_tensor_size(t, d);
        if (!same) {
            char a[160], b[160];
            zd__shape_str(r->shape, r->ndim, a, sizeof a);
            zd__shape_str(zd_tensor_shape(t), zd_tensor_ndim(t), b, sizeof b);
            return zd_error_set("checkpoint: %s: tensor '%s' has shape %s in the file but %s "
                                "here",
                                path, name, a, b);
        }
    }
    for (uint32_t k = 0; k < p->count; k++) {
        bool wanted = false;
        for (int i = 0; i < n && !wanted; i++)
            wanted = which[i] == &p->rec[k];
        if (!wanted)
            return zd_error_set("checkpoint: %s: unexpected tensor '%.*s' in the file (not "
                                "among the %d requested)",
                                path, (int)p->rec[k].name_len, p->rec[k].name, n);
    }
    return 0;
}

int zd_checkpoint_load(const zd_named_tensors_t *into, const char *path)
{
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_checkpoint_load: NULL path");
    if (check_inputs(path, into) < 0)
        return -1;
    parsed_t p;
    if (parse(path, &p) < 0)
        return -1;
    int n = zd_named_tensors_len(into);
    const record_t **which = calloc(n ? (size_t)n : 1, sizeof *which);
    if (!which) {
        parsed_free(&p);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "checkpoint: %s: out of memory", path);
    }
    int rc = match(path, &p, into, which);
    for (int i = 0; rc == 0 && i < n; i++)
        copy_data(zd_tensor_raw(zd_named_tensors_tensor(into, i)), which[i]);
    free(which);
    parsed_free(&p);
    return rc;
}

zd_named_tensors_t *zd_checkpoint_read(const char *path)
{
    if (!path) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_checkpoint_read: NULL path");
        return NULL;
    }
    parsed_t p;
    if (parse(path, &p) < 0)
        return NULL;
    zd_named_tensors_t *nt = zd_named_tensors_new();
    int rc = nt ? 0 : -1;
    for (uint32_t k = 0; rc == 0 && k < p.count; k++) {
        const record_t *r = &p.rec[k];
        char name[ZD_CHECKPOINT_MAX_NAME + 1];
        memcpy(name, r->name, r->name_len);
        name[r->name_len] = '\0';
        zd_tensor_t *t = zd_tensor_empty(r->dtype, r->shape, r->ndim);
        if (!t)
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "checkpoint: %s: out of memory", path);
        else
            copy_data(zd_tensor_raw(t), r);
        if (rc == 0 && zd_named_tensors_add(nt, name, t) < 0)
            rc = zd_error_wrap("checkpoint: %s", path);
        zd_tensor_unref(t);
    }
    parsed_free(&p);
    if (rc < 0) {
        zd_named_tensors_free(nt);
        return NULL;
    }
    return nt;
}
