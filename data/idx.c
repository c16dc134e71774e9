/* SPDX-License-Identifier: MIT */
/*  idx.c: IDX files, plain or gzip, through zlib's gz* stream functions
    (which read a file without the gzip magic as it is). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include <zdist/error.h>
#include <zdist/idx.h>

#define IDX_MAX_DIMS 8
#define CHUNK        (1u << 20)

static const char *type_name(int type)
{
    switch (type) {
    case 0x08:
        return "uint8";
    case 0x09:
        return "int8";
    case 0x0B:
        return "int16";
    case 0x0C:
        return "int32";
    case 0x0D:
        return "float32";
    case 0x0E:
        return "float64";
    }
    return "unknown";
}

/*  The reason zlib gives for the stream's state, or NULL when all is well.
    A gzip stream that stops early leaves Z_BUF_ERROR after a short read. */
static const char *gz_problem(gzFile gz, const char *path)
{
    int errnum = Z_OK;
    const char *msg = gzerror(gz, &errnum);
    if (errnum == Z_OK || errnum == Z_STREAM_END)
        return NULL;
    if (errnum == Z_ERRNO)
        return strerror(errno);
    if (errnum == Z_BUF_ERROR)
        return "gzip data ends unexpectedly (truncated .gz file)";
    if (!msg || !*msg)
        return "corrupt gzip data";
    /* zlib's text starts with the path, which our message already has. */
    size_t len = strlen(path);
    if (strncmp(msg, path, len) == 0 && strncmp(msg + len, ": ", 2) == 0)
        msg += len + 2;
    static _Thread_local char text[256];
    snprintf(text, sizeof text, "corrupt gzip data (%s)", msg);
    return text;
}

/*  Reads up to want bytes; *got says how many came. -1 on a read or
    decompression error (reported against path). */
static int read_full(gzFile gz, const char *path, void *buf, size_t want, size_t *got)
{
    *got = 0;
    while (*got < want) {
        size_t n = want - *got;
        if (n > (1u << 30))
            n = 1u << 30;
        int r = gzread(gz, (char *)buf + *got, (unsigned)n);
        if (r < 0) {
            const char *why = gz_problem(gz, path);
            return zd_error_set("idx: %s: %s", path, why ? why : "read error");
        }
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    const char *why = gz_problem(gz, path);
    if (why)
        return zd_error_set("idx: %s: %s", path, why);
    return 0;
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void shape_text(int ndim, const int64_t *dims, char *buf, size_t size)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndim && off < size; i++) {
        int n = snprintf(buf + off, size - off, "%s%lld", i ? "x" : "", (long long)dims[i]);
        if (n < 0)
            break;
        off += (size_t)n;
    }
}

/*  Reads the header: element type, dimensions, and the data size they
    announce. */
static int read_header(gzFile gz, const char *path, int *type, int *ndim, int64_t *dims,
                       size_t *data_bytes)
{
    unsigned char head[4], raw[4 * IDX_MAX_DIMS];
    size_t got;
    if (read_full(gz, path, head, 4, &got) < 0)
        return -1;
    if (got < 4)
        return zd_error_set("idx: %s: truncated header: %zu bytes, an IDX file starts with 4", path,
                            got);
    if (head[0] != 0 || head[1] != 0)
        return zd_error_set("idx: %s: bad magic %02x %02x %02x %02x (an IDX file starts with "
                            "00 00 <type> <ndims>)",
                            path, head[0], head[1], head[2], head[3]);
    *type = head[2];
    if (*type != ZD_IDX_TYPE_U8 && *type != ZD_IDX_TYPE_F32)
        return zd_error_set("idx: %s: element type 0x%02X (%s) not supported (only 0x08 uint8 "
                            "and 0x0D float32)",
                            path, *type, type_name(*type));
    *ndim = head[3];
    if (*ndim < 1 || *ndim > IDX_MAX_DIMS)
        return zd_error_set("idx: %s: %d dimensions (1 to %d allowed)", path, *ndim, IDX_MAX_DIMS);
    size_t want = 4 * (size_t)*ndim;
    if (read_full(gz, path, raw, want, &got) < 0)
        return -1;
    if (got < want)
        return zd_error_set("idx: %s: truncated header: %d dimensions need %zu bytes after "
                            "the magic, %zu present",
                            path, *ndim, want, got);
    size_t esize = *type == ZD_IDX_TYPE_U8 ? 1 : 4;
    /* The product must fit tensors (which stop at INT64_MAX/16 elements)
       and size_t bytes. */
    uint64_t count = 1, limit = (uint64_t)INT64_MAX / 16;
    if (limit > SIZE_MAX / esize)
        limit = SIZE_MAX / esize;
    bool overflow = false;
    for (int i = 0; i < *ndim; i++) {
        dims[i] = be32(raw + 4 * i);
        if (dims[i] != 0 && count > limit / (uint64_t)dims[i])
            overflow = true;
        else
            count *= (uint64_t)dims[i];
    }
    if (overflow) {
        char s[160];
        shape_text(*ndim, dims, s, sizeof s);
        return zd_error_set("idx: %s: dimensions %s overflow (too many elements)", path, s);
    }
    *data_bytes = (size_t)count * esize;
    return 0;
}

/*  Reads exactly `bytes` bytes of data. The buffer grows as data arrives,
    so a header announcing far more than the file holds costs no huge
    allocation. */
static int read_data(gzFile gz, const char *path, size_t bytes, unsigned char **out,
                     const char *what)
{
    size_t cap = bytes < CHUNK ? bytes : CHUNK, have = 0;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "idx: %s: out of memory", path);
    while (have < bytes) {
        if (have == cap) {
            size_t ncap = cap > bytes / 2 ? bytes : cap * 2;
            unsigned char *nb = realloc(buf, ncap);
            if (!nb) {
                free(buf);
                return zd_error_set_code(ZD_ERR_NO_MEMORY, "idx: %s: out of memory for %zu bytes",
                                         path, ncap);
            }
            buf = nb;
            cap = ncap;
        }
        size_t room = cap - have, got;
        if (read_full(gz, path, buf + have, room, &got) < 0) {
            free(buf);
            return -1;
        }
        have += got;
        if (got < room)
            break;
    }
    if (have < bytes) {
        free(buf);
        return zd_error_set("idx: %s: truncated data: the header says %s = %zu data bytes, "
                            "only %zu present",
                            path, what, bytes, have);
    }
    unsigned char extra;
    size_t got;
    if (read_full(gz, path, &extra, 1, &got) < 0) {
        free(buf);
        return -1;
    }
    if (got) {
        free(buf);
        return zd_error_set("idx: %s: trailing bytes after the %zu data bytes the header "
                            "announces (%s): the dimensions disagree with the file length",
                            path, bytes, what);
    }
    *out = buf;
    return 0;
}

static zd_tensor_t *make_tensor(int type, int ndim, const int64_t *dims, const unsigned char *buf)
{
    if (type == ZD_IDX_TYPE_U8)
        return zd_tensor_from_data(ZD_UINT8, dims, ndim, buf);
    zd_tensor_t *t = zd_tensor_empty(ZD_FLOAT32, dims, ndim);
    if (!t)
        return NULL;
    float *d = zd_tensor_data(t);
    int64_t n = zd_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = be32(buf + 4 * i);
        memcpy(&d[i], &u, 4);
    }
    return t;
}

static int load(const char *path, zd_tensor_t **out)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) < 0)
        return zd_error_set("idx: %s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return zd_error_set("idx: %s: is a directory, not an IDX file", path);
    gzFile gz = gzopen(path, "rb");
    if (!gz)
        return zd_error_set("idx: %s: cannot open: %s", path,
                            errno ? strerror(errno) : "out of memory");
    gzbuffer(gz, 1 << 17);

    int type = 0, ndim = 0;
    int64_t dims[IDX_MAX_DIMS];
    size_t bytes = 0;
    unsigned char *buf = NULL;
    if (read_header(gz, path, &type, &ndim, dims, &bytes) < 0) {
        gzclose(gz);
        return -1;
    }
    char what[200];
    shape_text(ndim, dims, what, sizeof what - 16);
    strcat(what, type == ZD_IDX_TYPE_U8 ? " uint8" : " float32");
    /* A plain file's length is known up front: say exactly how it differs. */
    size_t header = 4 + 4 * (size_t)ndim;
    if (S_ISREG(st.st_mode) && gzdirect(gz) && (uint64_t)st.st_size != header + (uint64_t)bytes) {
        gzclose(gz);
        if ((uint64_t)st.st_size < header + (uint64_t)bytes)
            return zd_error_set("idx: %s: truncated data: the header says %s = %zu data bytes, "
                                "only %llu present",
                                path, what, bytes,
                                (unsigned long long)(st.st_size - (off_t)header));
        return zd_error_set("idx: %s: %llu trailing bytes after the %zu data bytes the header "
                            "announces (%s): the dimensions disagree with the file length",
                            path, (unsigned long long)((uint64_t)st.st_size - header - bytes),
                            bytes, what);
    }
    int rc = read_data(gz, path, bytes, &buf, what);
    gzclose(gz);
    if (rc < 0)
        return -1;
    *out = make_tensor(type, ndim, dims, buf);
    free(buf);
    if (!*out)
        return zd_error_wrap("idx: %s", path);
    return 0;
}

zd_tensor_t *zd_idx_read(const char *path)
{
    if (!path) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_idx_read: NULL path");
        return NULL;
    }
    zd_tensor_t *t;
    return load(path, &t) < 0 ? NULL : t;
}

int zd_idx_save(const zd_tensor_t *t, const char *path)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_idx_save: NULL tensor");
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_idx_save: NULL path");
    zd_tensor_dtype_t dt = zd_tensor_dtype(t);
    if (dt != ZD_UINT8 && dt != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "idx: %s: cannot write %s tensors (uint8 and float32 only)", path,
                                 zd_tensor_dtype_name(dt));
    int ndim = zd_tensor_ndim(t);
    if (ndim < 1 || ndim > IDX_MAX_DIMS)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "idx: %s: cannot write a %d-dimensional tensor (1 to %d)", path,
                                 ndim, IDX_MAX_DIMS);
    unsigned char head[4 + 4 * IDX_MAX_DIMS] = {
        0, 0, dt == ZD_UINT8 ? ZD_IDX_TYPE_U8 : ZD_IDX_TYPE_F32, (unsigned char)ndim};
    for (int i = 0; i < ndim; i++) {
        if (zd_tensor_size(t, i) > UINT32_MAX)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "idx: %s: dimension %d is %lld, more than an IDX u32 holds",
                                     path, i, (long long)zd_tensor_size(t, i));
        put_be32(head + 4 + 4 * i, (uint32_t)zd_tensor_size(t, i));
    }
    size_t len = strlen(path);
    bool gzip = len > 3 && strcmp(path + len - 3, ".gz") == 0;
    gzFile gz = gzopen(path, gzip ? "wb6" : "wbT");
    if (!gz)
        return zd_error_set("idx: %s: cannot create: %s", path,
                            errno ? strerror(errno) : "out of memory");
    bool ok = gzwrite(gz, head, 4 + 4 * (unsigned)ndim) == (int)(4 + 4 * ndim);
    if (dt == ZD_UINT8) {
        const unsigned char *p = zd_tensor_raw(t);
        size_t left = zd_tensor_nbytes(t);
        while (ok && left) {
            unsigned n = left > CHUNK ? CHUNK : (unsigned)left;
            ok = gzwrite(gz, p, n) == (int)n;
            p += n;
            left -= n;
        }
    } else {
        unsigned char buf[4096];
        const float *d = zd_tensor_data(t);
        int64_t n = zd_tensor_numel(t);
        for (int64_t i = 0; ok && i < n;) {
            unsigned k = 0;
            for (; k < sizeof buf / 4 && i < n; k++, i++) {
                uint32_t u;
                memcpy(&u, &d[i], 4);
                put_be32(buf + 4 * k, u);
            }
            ok = gzwrite(gz, buf, 4 * k) == (int)(4 * k);
        }
    }
    const char *why = ok ? NULL : gz_problem(gz, path);
    char saved[256];
    snprintf(saved, sizeof saved, "%s", why ? why : "write error");
    if (gzclose(gz) != Z_OK && ok) {
        ok = false;
        snprintf(saved, sizeof saved, "%s", errno ? strerror(errno) : "close failed");
    }
    if (!ok)
        return zd_error_set("idx: %s: cannot write: %s", path, saved);
    return 0;
}

int zd_idx_save_f32(const zd_tensor_t *t, const char *path)
{
    if (!t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_idx_save_f32: NULL tensor");
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_idx_save_f32: NULL path");
    if (zd_tensor_dtype(t) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "idx: %s: zd_idx_save_f32 got a %s tensor", path,
                                 zd_tensor_dtype_name(zd_tensor_dtype(t)));
    return zd_idx_save(t, path);
}
