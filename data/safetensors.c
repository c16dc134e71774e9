/* SPDX-License-Identifier: MIT */
/*  safetensors.c: safetensors files (<zdist/safetensors.h>).

    Reading: the file is mapped, a pass of our own over the header
    (header_scan) checks its UTF-8 and bounds its size as a JSON tree, and
    only then does jansson parse it; every tensor's entry is checked, the
    entries are sorted by offset and must cover the data exactly (as
    safetensors' own reader demands), and the tensors borrow the mapping or
    copy from it. Writing follows safetensors' writer (prepare() in its
    safetensors/src/tensor.rs): the same order, the same compact JSON, the
    same padding. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/error.h>
#include <zdist/safetensors.h>
#include "data/files.h"
#include "data/safetensors_private.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BIG_ENDIAN 1
#else
#define HOST_BIG_ENDIAN 0
#endif

/*  How many JSON items (',' ':' '{' '[' outside strings) a header may
    hold: a tensor's entry needs at most 19, a metadata entry 2. This, not
    the 100 MB, bounds the tree jansson builds: a 100 MB header of
    "[0,0,0,..." would take it gigabytes. */
#define MAX_ITEMS (24 * (ZD_SAFETENSORS_MAX_TENSORS + 1) + 4 * ZD_SAFETENSORS_MAX_META)

/*  Errors show at most this much of a name: the problem stays in view. */
#define SHOW 200

typedef enum { CONV_NONE, CONV_F16, CONV_BF16, CONV_F64 } conv_t;

/*  The dtypes safetensors knows, in the order of its Dtype enum: its
    writer lays tensors out by that order, descending (widest first, so
    that every tensor is aligned when the header is a multiple of 8 long).
    `to` is the zdist dtype a tensor of it becomes, 0 when zdist reads none. */
typedef struct {
    const char *name;
    size_t size;
    zd_tensor_dtype_t to;
    conv_t conv;
} st_dtype_t;

static const st_dtype_t dtypes[] = {
    {"BOOL", 1, 0, CONV_NONE},
    {"U8", 1, ZD_UINT8, CONV_NONE},
    {"I8", 1, 0, CONV_NONE},
    {"F8_E5M2", 1, 0, CONV_NONE},
    {"F8_E4M3", 1, 0, CONV_NONE},
    {"I16", 2, 0, CONV_NONE},
    {"U16", 2, 0, CONV_NONE},
    {"F16", 2, ZD_FLOAT32, CONV_F16},
    {"BF16", 2, ZD_FLOAT32, CONV_BF16},
    {"I32", 4, 0, CONV_NONE},
    {"U32", 4, 0, CONV_NONE},
    {"F32", 4, ZD_FLOAT32, CONV_NONE},
    {"F64", 8, ZD_FLOAT32, CONV_F64},
    {"I64", 8, ZD_INT64, CONV_NONE},
    {"U64", 8, 0, CONV_NONE},
};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

static const st_dtype_t *dtype_named(const char *name)
{
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return &dtypes[i];
    return NULL;
}

/*  Where a zdist dtype sits in that order (what the writer sorts by). */
static int dtype_rank(zd_tensor_dtype_t dt)
{
    const char *name = dt == ZD_FLOAT32 ? "F32"
        : dt == ZD_INT64                ? "I64"
        : dt == ZD_UINT8                ? "U8"
                                        : NULL;
    for (int i = 0; name && i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0)
            return i;
    return -1;
}

static uint16_t le16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static float float_of_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/*  IEEE binary16 to binary32: exact (every half is a float). */
static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f)
        return float_of_bits(sign | 0x7f800000u | man << 13); /* inf, NaN */
    if (exp)
        return float_of_bits(sign | (exp + 112) << 23 | man << 13);
    float f = (float)man * 0x1p-24f; /* zero, subnormal */
    return sign ? -f : f;
}

/*  Length of the UTF-8 sequence at s (n bytes left), 0 when it is not one:
    overlong forms, surrogates and code points past U+10FFFF are refused,
    as Rust's from_utf8 (safetensors' check) refuses them. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0)
        len = 2, cp = c & 0x1f, min = 0x80;
    else if ((c & 0xf0) == 0xe0)
        len = 3, cp = c & 0x0f, min = 0x800;
    else if ((c & 0xf8) == 0xf0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/*  Offset of the first byte that is not valid UTF-8, or n. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
    size_t i = 0, k;
    while (i < n && (k = utf8_seq(s + i, n - i)) != 0)
        i += k;
    return i;
}

static bool utf8_ok(const char *s)
{
    size_t n = strlen(s);
    return utf8_check((const unsigned char *)s, n) == n;
}

/*  ---- reading ---- */

/*  The bytes being read, shared by the tensors that borrow them. */
typedef struct {
    atomic_int refs;
    void *data;
    size_t size;
    zd__safetensors_release_fn *release;
} buffer_t;

static void buffer_unref(buffer_t *b)
{
    if (atomic_fetch_sub(&b->refs, 1) == 1) {
        b->release(b->data, b->size);
        free(b);
    }
}

static void tensor_release(void *data, void *arg)
{
    (void)data;
    buffer_unref(arg);
}

/*  One tensor's entry in the header. */
typedef struct {
    const char *name; /* jansson's key: lives as long as the tree */
    const st_dtype_t *dt;
    int ndim;
    int64_t shape[ZD_TENSOR_MAX_DIMS];
    uint64_t numel, begin, end;
    size_t index; /* its place in the header: sorts ties stably */
} record_t;

typedef struct {
    const char *path;
    const unsigned char *bytes; /* the whole file */
    size_t size;
    const unsigned char *data; /* after the header */
    uint64_t header_len, data_size;
    json_t *root;
    json_t *meta; /* "__metadata__", inside root, or NULL */
    record_t *rec;
    size_t n;
} parse_t;

#define FAIL(p, ...) fail((p)->path, __VA_ARGS__)

static int fail(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(const char *path, const char *fmt, ...)
{
    char what[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return zd_error_set("safetensors: %s: %s", path, what);
}

static const char *kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a real number";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    default:
        return "null";
    }
}

/*  Before jansson: valid UTF-8, a '{' first, no deeper than a header nests
    (3: the top object, an entry, its shape), and no more items than
    MAX_ITEMS or top-level members than the tensors allowed. */
static int header_scan(parse_t *p, const unsigned char *h)
{
    size_t n = (size_t)p->header_len, bad = utf8_check(h, n);
    if (bad < n)
        return FAIL(p, "the header is not valid UTF-8 (byte %zu of it)", bad);
    if (n == 0 || h[0] != '{')
        return FAIL(p, "the header does not start with '{'");
    int depth = 0;
    bool in_string = false;
    size_t items = 0, members = 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = h[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
            continue;
        }
        if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            if (++depth > 3)
                return FAIL(p,
                            "the header nests deeper than a safetensors header at byte %zu "
                            "(a value of the wrong type)",
                            i);
            items++;
        } else if (c == '}' || c == ']') {
            depth -= depth > 0;
        } else if (c == ',' || c == ':') {
            items++;
            if (c == ',' && depth == 1 && ++members > ZD_SAFETENSORS_MAX_TENSORS + 1)
                return FAIL(p, "the header holds more than %d tensors", ZD_SAFETENSORS_MAX_TENSORS);
        }
        if (items > MAX_ITEMS)
            return FAIL(p,
                        "the header holds more JSON values than %d tensors and %d metadata "
                        "entries need",
                        ZD_SAFETENSORS_MAX_TENSORS, ZD_SAFETENSORS_MAX_META);
    }
    return 0;
}

static int check_meta(parse_t *p, json_t *m)
{
    const char *key;
    json_t *v;
    if (!json_is_object(m))
        return FAIL(p, "__metadata__ is %s, not an object", kind(m));
    if (json_object_size(m) > ZD_SAFETENSORS_MAX_META)
        return FAIL(p, "__metadata__ has %zu entries (at most %d)", json_object_size(m),
                    ZD_SAFETENSORS_MAX_META);
    json_object_foreach(m, key, v)
    {
        if (!json_is_string(v))
            return FAIL(p, "__metadata__ entry \"%.*s\" is %s, not a string", SHOW, key, kind(v));
    }
    p->meta = m;
    return 0;
}

/*  A non-negative JSON integer, or -1. */
static int64_t natural(const json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) >= 0 ? (int64_t)json_integer_value(v) : -1;
}

static int parse_entry(parse_t *p, const char *name, json_t *v, record_t *r)
{
    size_t len = strlen(name);
    if (len == 0)
        return FAIL(p, "a tensor has an empty name");
    if (len > ZD_SAFETENSORS_MAX_NAME)
        return FAIL(p, "tensor '%.*s...': a name of %zu bytes (at most %d)", SHOW, name, len,
                    ZD_SAFETENSORS_MAX_NAME);
    if (!json_is_object(v))
        return FAIL(p, "tensor '%.*s': its entry is %s, not an object", SHOW, name, kind(v));
    json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape");
    json_t *offsets = json_object_get(v, "data_offsets");
    if (!dtype || !shape || !offsets)
        return FAIL(p, "tensor '%.*s' has no \"%s\"", SHOW, name,
                    !dtype       ? "dtype"
                        : !shape ? "shape"
                                 : "data_offsets");
    if (!json_is_string(dtype))
        return FAIL(p, "tensor '%.*s': dtype is %s, not a string", SHOW, name, kind(dtype));
    r->dt = dtype_named(json_string_value(dtype));
    if (!r->dt)
        return FAIL(p, "tensor '%.*s': unknown dtype \"%.40s\"", SHOW, name,
                    json_string_value(dtype));
    if (!r->dt->to)
        return FAIL(p,
                    "tensor '%.*s': dtype %s, which zdist does not read (F32, F64, F16, BF16, "
                    "I64, U8)",
                    SHOW, name, r->dt->name);
    if (!json_is_array(shape))
        return FAIL(p, "tensor '%.*s': shape is %s, not an array", SHOW, name, kind(shape));
    if (json_array_size(shape) > ZD_TENSOR_MAX_DIMS)
        return FAIL(p, "tensor '%.*s' has %zu dimensions (zdist's tensors have at most %d)", SHOW,
                    name, json_array_size(shape), ZD_TENSOR_MAX_DIMS);
    r->ndim = (int)json_array_size(shape);
    r->numel = 1;
    for (int d = 0; d < r->ndim; d++) {
        json_t *e = json_array_get(shape, (size_t)d);
        int64_t x = natural(e);
        if (x < 0)
            return FAIL(p, "tensor '%.*s': dimension %d is %s%s", SHOW, name, d,
                        json_is_integer(e) ? "negative" : kind(e),
                        json_is_integer(e) ? "" : ", not an integer");
        /* the bound zd_tensor_new sets: numel * 16 fits in int64 */
        if (x > 0 && r->numel > (uint64_t)(INT64_MAX / 16) / (uint64_t)x)
            return FAIL(p, "tensor '%.*s': its dimensions multiply past 2^59 elements", SHOW, name);
        r->shape[d] = x;
        r->numel *= (uint64_t)x;
    }
    if (!json_is_array(offsets) || json_array_size(offsets) != 2)
        return FAIL(p, "tensor '%.*s': data_offsets is %s, not an array of two integers", SHOW,
                    name, json_is_array(offsets) ? "another array" : kind(offsets));
    int64_t b = natural(json_array_get(offsets, 0)), e = natural(json_array_get(offsets, 1));
    if (b < 0 || e < 0)
        return FAIL(p,
                    "tensor '%.*s': data_offsets holds something other than two "
                    "non-negative integers",
                    SHOW, name);
    if (b > e)
        return FAIL(p,
                    "tensor '%.*s': data_offsets [%" PRId64 ", %" PRId64 "] ends before it "
                    "begins",
                    SHOW, name, b, e);
    r->begin = (uint64_t)b;
    r->end = (uint64_t)e;
    uint64_t need = r->numel * r->dt->size;
    if (r->end - r->begin != need) {
        char s[200];
        zd__shape_str(r->shape, r->ndim, s, sizeof s);
        return FAIL(p,
                    "tensor '%.*s': shape %s of %s is %" PRIu64 " bytes, but data_offsets "
                    "[%" PRIu64 ", %" PRIu64 "] hold %" PRIu64,
                    SHOW, name, s, r->dt->name, need, r->begin, r->end, r->end - r->begin);
    }
    if (r->end > p->data_size)
        return FAIL(p,
                    "tensor '%.*s': data_offsets [%" PRIu64 ", %" PRIu64 "] go past the %" PRIu64
                    " bytes of data after the header (a truncated file?)",
                    SHOW, name, r->begin, r->end, p->data_size);
    r->name = name;
    return 0;
}

/*  jansson reports most failed allocations as invalid JSON, and takes its
    allocator process-wide. Ours wraps whichever was there (the program's
    own, if it set one) and marks the thread whose allocation failed, so
    that a header that did not parse for want of memory is reported as
    such. In fault-injection builds it fails when a test says so. */
static _Thread_local bool json_failed_alloc;
static json_malloc_t json_prev_malloc;
static json_free_t json_prev_free;

static void *json_malloc(size_t n)
{
#ifdef ZDIST_FAULT_INJECT
    if (zd__fault_fail()) {
        json_failed_alloc = true;
        return NULL;
    }
#endif
    void *ptr = json_prev_malloc(n);
    if (!ptr)
        json_failed_alloc = true;
    return ptr;
}

static void json_free(void *ptr)
{
    json_prev_free(ptr);
}

static void json_wrap_allocator(void)
{
    json_get_alloc_funcs(&json_prev_malloc, &json_prev_free);
    json_set_alloc_funcs(json_malloc, json_free);
}

static int parse_header(parse_t *p)
{
    static pthread_once_t wrapped = PTHREAD_ONCE_INIT;
    pthread_once(&wrapped, json_wrap_allocator);
    if (p->size < 8)
        return FAIL(p, "%zu bytes, too short for the header's 8-byte length", p->size);
    p->header_len = zd__le64(p->bytes);
    if (p->header_len > ZD_SAFETENSORS_MAX_HEADER)
        return FAIL(p, "a header of %" PRIu64 " bytes: over the format's limit of %d",
                    p->header_len, ZD_SAFETENSORS_MAX_HEADER);
    if (p->header_len > p->size - 8)
        return FAIL(p,
                    "a header of %" PRIu64 " bytes, longer than the %zu bytes after its "
                    "length (a truncated file?)",
                    p->header_len, p->size - 8);
    p->data = p->bytes + 8 + p->header_len;
    p->data_size = p->size - 8 - p->header_len;
    /* Scanned and parsed from one copy: the file under a mapping can be
       rewritten by another process between the two reads. */
    unsigned char *h = malloc(p->header_len ? (size_t)p->header_len : 1);
    if (!h)
        return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                 "safetensors: %s: out of memory for the "
                                 "header",
                                 p->path);
    memcpy(h, p->bytes + 8, (size_t)p->header_len);
    if (header_scan(p, h) < 0) {
        free(h);
        return -1;
    }
    json_error_t je;
    json_failed_alloc = false;
    p->root = json_loadb((const char *)h, (size_t)p->header_len, JSON_REJECT_DUPLICATES, &je);
    free(h);
    if (!p->root) {
        if (json_failed_alloc || json_error_code(&je) == json_error_out_of_memory)
            return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                     "safetensors: %s: out of memory for the "
                                     "header",
                                     p->path);
        if (json_error_code(&je) == json_error_duplicate_key)
            return FAIL(p, "the header names a tensor or key twice (at byte %d of it)",
                        je.position);
        return FAIL(p, "the header is not valid JSON (byte %d of it: %s)", je.position, je.text);
    }
    if (!json_is_object(p->root))
        return FAIL(p, "the header is %s, not an object", kind(p->root));
    p->rec = calloc(json_object_size(p->root) + 1, sizeof *p->rec);
    if (!p->rec)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "safetensors: %s: out of memory", p->path);
    const char *key;
    json_t *v;
    json_object_foreach(p->root, key, v)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (check_meta(p, v) < 0)
                return -1;
            continue;
        }
        if (p->n == ZD_SAFETENSORS_MAX_TENSORS)
            return FAIL(p, "more than %d tensors", ZD_SAFETENSORS_MAX_TENSORS);
        if (parse_entry(p, key, v, &p->rec[p->n]) < 0)
            return -1;
        p->rec[p->n].index = p->n;
        p->n++;
    }
    return 0;
}

static int by_offset(const void *a, const void *b)
{
    const record_t *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/*  The tensors, by offset, must cover the data exactly: no gap, no
    overlap, nothing after the last (safetensors refuses each). */
static int check_layout(parse_t *p)
{
    qsort(p->rec, p->n, sizeof *p->rec, by_offset);
    uint64_t pos = 0;
    for (size_t i = 0; i < p->n; i++) {
        const record_t *r = &p->rec[i];
        if (r->begin > pos)
            return FAIL(p,
                        "bytes %" PRIu64 " to %" PRIu64 " of the data belong to no tensor (a "
                        "gap before '%.*s')",
                        pos, r->begin, SHOW, r->name);
        if (r->begin < pos)
            return FAIL(p,
                        "tensor '%.*s' (data_offsets [%" PRIu64 ", %" PRIu64 "]) overlaps "
                        "'%.*s', which ends at %" PRIu64,
                        SHOW, r->name, r->begin, r->end, SHOW, p->rec[i - 1].name, pos);
        pos = r->end;
    }
    if (pos != p->data_size)
        return FAIL(p, "%" PRIu64 " bytes after the last tensor's data belong to no tensor",
                    p->data_size - pos);
    return 0;
}

/*  Copies (converting) n elements of r's file dtype at src into dst. */
static void convert(const record_t *r, const unsigned char *src, void *dst)
{
    size_t es = r->dt->size;
    float *f = dst;
    unsigned char *d = dst;
    switch (r->dt->conv) {
    case CONV_F16:
        for (uint64_t i = 0; i < r->numel; i++)
            f[i] = half_to_float(le16(src + 2 * i));
        break;
    case CONV_BF16:
        for (uint64_t i = 0; i < r->numel; i++)
            f[i] = float_of_bits((uint32_t)le16(src + 2 * i) << 16);
        break;
    case CONV_F64:
        for (uint64_t i = 0; i < r->numel; i++) {
            uint64_t bits = zd__le64(src + 8 * i);
            double x;
            memcpy(&x, &bits, sizeof x);
            f[i] = (float)x; /* rounds to nearest; inf past FLT_MAX, as PyTorch's .float() */
        }
        break;
    case CONV_NONE:
        if (!HOST_BIG_ENDIAN || es == 1) {
            memcpy(dst, src, (size_t)(r->numel * es));
            break;
        }
        for (uint64_t off = 0; off < r->numel * es; off += es)
            for (size_t b = 0; b < es; b++)
                d[off + b] = src[off + es - 1 - b];
        break;
    }
}

static zd_named_tensors_t *make_tensors(parse_t *p, buffer_t *buf)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    if (!nt) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "safetensors: %s: out of memory", p->path);
        return NULL;
    }
    /* in the order of the data (that of the header too, in the files
       safetensors and zdist write) */
    for (size_t i = 0; i < p->n; i++) {
        const record_t *r = &p->rec[i];
        const unsigned char *src = p->data + r->begin;
        size_t bytes = (size_t)(r->end - r->begin);
        zd_tensor_t *t;
        if (!HOST_BIG_ENDIAN && r->dt->conv == CONV_NONE && bytes > 0 &&
            (uintptr_t)src % r->dt->size == 0) {
            atomic_fetch_add(&buf->refs, 1);
            t = zd_tensor_wrap(r->dt->to, r->shape, r->ndim, (void *)src, bytes, tensor_release,
                               buf);
        } else {
            t = zd_tensor_empty(r->dt->to, r->shape, r->ndim);
            if (t)
                convert(r, src, zd_tensor_raw(t));
        }
        if (!t || zd_named_tensors_add(nt, r->name, t) < 0) {
            zd_tensor_unref(t);
            zd_named_tensors_free(nt);
            zd_error_wrap("safetensors: %s: tensor '%.*s'", p->path, SHOW, r->name);
            return NULL;
        }
        zd_tensor_unref(t);
    }
    return nt;
}

/*  The file's "__metadata__" as key, value pairs in *meta (a new list,
    empty when it has none). */
static int take_meta(parse_t *p, zd_strings_t **meta)
{
    zd_strings_t *kv = zd_strings_new();
    const char *key;
    json_t *v;
    if (kv && p->meta)
        json_object_foreach(p->meta, key, v)
        {
            if (zd_strings_append(kv, key) < 0 || zd_strings_append(kv, json_string_value(v)) < 0) {
                zd_strings_free(kv);
                kv = NULL;
                break;
            }
        }
    if (!kv)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "safetensors: %s: out of memory", p->path);
    *meta = kv;
    return 0;
}

zd_named_tensors_t *zd__safetensors_parse(const char *label, void *data, size_t size,
                                          zd__safetensors_release_fn *release, zd_strings_t **meta)
{
    if (meta)
        *meta = NULL;
    buffer_t *buf = malloc(sizeof *buf);
    if (!buf) {
        release(data, size);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "safetensors: %s: out of memory", label);
        return NULL;
    }
    atomic_init(&buf->refs, 1);
    buf->data = data;
    buf->size = size;
    buf->release = release;
    parse_t p = {.path = label, .bytes = data, .size = size};
    zd_named_tensors_t *nt = NULL;
    if (parse_header(&p) == 0 && check_layout(&p) == 0)
        nt = make_tensors(&p, buf);
    if (nt && meta && take_meta(&p, meta) < 0) {
        zd_named_tensors_free(nt);
        nt = NULL;
    }
    free(p.rec);
    json_decref(p.root);
    buffer_unref(buf);
    return nt;
}

static void unmap(void *data, size_t size)
{
    munmap(data, size);
}

zd_named_tensors_t *zd_safetensors_read(const char *path, zd_strings_t **meta)
{
    if (meta)
        *meta = NULL;
    if (!path) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "safetensors: read needs a path");
        return NULL;
    }
    /* Non-blocking: opening a FIFO would otherwise wait for a writer
       before the check below could refuse it (mmap does not mind). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        fail(path, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        fail(path, "cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        fail(path, "not a regular file");
        return NULL;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        fail(path, "%lld bytes, more than this process can map", (long long)st.st_size);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) { /* mmap refuses 0 bytes: say what parse would */
        close(fd);
        fail(path, "%zu bytes, too short for the header's 8-byte length", size);
        return NULL;
    }
    /* Private and writable: tensors that borrow it may be trained in
       place; the pages they write become this process's own. */
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        fail(path, "cannot map %zu bytes: %s", size, strerror(e));
        return NULL;
    }
    return zd__safetensors_parse(path, map, size, unmap, meta);
}

/*  ---- writing ---- */

/*  A growing string; `failed` once an allocation failed. */
typedef struct {
    char *p;
    size_t len, cap;
    bool failed;
} strbuf_t;

static void put(strbuf_t *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void puts_(strbuf_t *b, const char *s)
{
    put(b, s, strlen(s));
}

/*  s as a JSON string, escaped as serde_json (safetensors' writer) and
    Python's json (ensure_ascii=False) escape: '"', '\\' and control
    characters only, the short forms where there are some. */
static void put_string(strbuf_t *b, const char *s)
{
    put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        switch (*c) {
        case '"':
            puts_(b, "\\\"");
            break;
        case '\\':
            puts_(b, "\\\\");
            break;
        case '\b':
            puts_(b, "\\b");
            break;
        case '\f':
            puts_(b, "\\f");
            break;
        case '\n':
            puts_(b, "\\n");
            break;
        case '\r':
            puts_(b, "\\r");
            break;
        case '\t':
            puts_(b, "\\t");
            break;
        default:
            if (*c < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *c);
                puts_(b, esc);
            } else {
                put(b, (const char *)c, 1);
            }
        }
    }
    put(b, "\"", 1);
}

static void put_u64(strbuf_t *b, uint64_t v)
{
    char s[24];
    snprintf(s, sizeof s, "%" PRIu64, v);
    puts_(b, s);
}

/*  One tensor to write. */
typedef struct {
    const char *name;
    zd_tensor_t *t;
    int rank;
} item_t;

/*  safetensors' order: dtype descending (its enum's order), then name
    (bytes, as strcmp and Rust's String compare). */
static int by_layout(const void *a, const void *b)
{
    const item_t *x = a, *y = b;
    if (x->rank != y->rank)
        return y->rank - x->rank;
    return strcmp(x->name, y->name);
}

static int check_write(const char *path, const zd_named_tensors_t *nt, const zd_strings_t *meta)
{
    if (!nt)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "safetensors: %s: no tensors given (NULL)", path);
    int n = zd_named_tensors_len(nt);
    if (n > ZD_SAFETENSORS_MAX_TENSORS)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "safetensors: %s: %d tensors (at most %d)", path,
                                 n, ZD_SAFETENSORS_MAX_TENSORS);
    for (int i = 0; i < n; i++) {
        const char *name = zd_named_tensors_name(nt, i);
        zd_tensor_t *t = zd_named_tensors_tensor(nt, i);
        if (strlen(name) > ZD_SAFETENSORS_MAX_NAME || !utf8_ok(name) ||
            strcmp(name, "__metadata__") == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "safetensors: %s: tensor name '%.*s' is "
                                     "not one a file may hold (UTF-8, at most %d bytes, not "
                                     "__metadata__)",
                                     path, SHOW, name, ZD_SAFETENSORS_MAX_NAME);
        if (dtype_rank(zd_tensor_dtype(t)) < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "safetensors: %s: tensor '%.*s' is %s", path,
                                     SHOW, name, zd_tensor_dtype_name(zd_tensor_dtype(t)));
    }
    int n_kv = zd_strings_len(meta);
    if (n_kv % 2 || n_kv / 2 > ZD_SAFETENSORS_MAX_META)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "safetensors: %s: metadata of %d strings (key, value pairs: "
                                 "at most %d)",
                                 path, n_kv, ZD_SAFETENSORS_MAX_META);
    for (int i = 0; i < n_kv; i++) {
        const char *si = zd_strings_get(meta, i);
        if (!utf8_ok(si))
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "safetensors: %s: metadata %s %d is not UTF-8", path,
                                     i % 2 ? "value" : "key", i / 2);
        for (int j = 0; i % 2 == 0 && j < i; j += 2)
            if (strcmp(si, zd_strings_get(meta, j)) == 0)
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "safetensors: %s: metadata key "
                                         "\"%.*s\" given twice",
                                         path, SHOW, si);
    }
    return 0;
}

/*  The header, padded, into b; the items in layout order into items. */
static void build_header(strbuf_t *b, item_t *items, int n, const zd_strings_t *meta)
{
    int n_meta = zd_strings_len(meta) / 2;
    put(b, "{", 1);
    if (n_meta > 0) {
        puts_(b, "\"__metadata__\":{");
        for (int i = 0; i < n_meta; i++) {
            if (i)
                put(b, ",", 1);
            put_string(b, zd_strings_get(meta, 2 * i));
            put(b, ":", 1);
            put_string(b, zd_strings_get(meta, 2 * i + 1));
        }
        put(b, "}", 1);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        zd_tensor_t *t = items[i].t;
        if (i || n_meta > 0)
            put(b, ",", 1);
        put_string(b, items[i].name);
        puts_(b, ":{\"dtype\":\"");
        puts_(b, dtypes[items[i].rank].name);
        puts_(b, "\",\"shape\":[");
        for (int d = 0; d < zd_tensor_ndim(t); d++) {
            if (d)
                put(b, ",", 1);
            put_u64(b, (uint64_t)zd_tensor_size(t, d));
        }
        puts_(b, "],\"data_offsets\":[");
        put_u64(b, off);
        put(b, ",", 1);
        off += zd_tensor_nbytes(t);
        put_u64(b, off);
        puts_(b, "]}");
    }
    put(b, "}", 1);
    while (!b->failed && b->len % 8)
        put(b, " ", 1);
}

static bool emit_data(FILE *f, const zd_tensor_t *t)
{
    size_t es = zd_tensor_dtype_size(zd_tensor_dtype(t));
    const unsigned char *p = zd_tensor_raw(t);
    size_t bytes = zd_tensor_nbytes(t);
    if (!HOST_BIG_ENDIAN || es == 1)
        return fwrite(p, 1, bytes, f) == bytes;
    unsigned char tmp[4096];
    for (size_t off = 0; off < bytes;) {
        size_t k = 0;
        for (; k + es <= sizeof tmp && off < bytes; k += es, off += es)
            for (size_t b = 0; b < es; b++)
                tmp[k + b] = p[off + es - 1 - b];
        if (fwrite(tmp, 1, k, f) != k)
            return false;
    }
    return true;
}

int zd__safetensors_write_stream(FILE *f, const char *label, const zd_named_tensors_t *nt,
                                 const zd_strings_t *meta)
{
    if (check_write(label, nt, meta) < 0)
        return -1;
    int n = zd_named_tensors_len(nt);
    item_t *items = calloc((size_t)n + 1, sizeof *items);
    if (!items)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "safetensors: %s: out of memory", label);
    for (int i = 0; i < n; i++) {
        items[i].name = zd_named_tensors_name(nt, i);
        items[i].t = zd_named_tensors_tensor(nt, i);
        items[i].rank = dtype_rank(zd_tensor_dtype(items[i].t));
    }
    qsort(items, (size_t)n, sizeof *items, by_layout);
    strbuf_t b = {0};
    build_header(&b, items, n, meta);
    int rc = 0;
    if (b.failed) {
        rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "safetensors: %s: out of memory", label);
    } else if (b.len > ZD_SAFETENSORS_MAX_HEADER) {
        rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                               "safetensors: %s: a header of %zu bytes (the "
                               "format's limit is %d)",
                               label, b.len, ZD_SAFETENSORS_MAX_HEADER);
    } else {
        unsigned char len[8];
        for (int i = 0; i < 8; i++)
            len[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
        bool ok = fwrite(len, 1, 8, f) == 8 && fwrite(b.p, 1, b.len, f) == b.len;
        for (int i = 0; ok && i < n; i++)
            ok = emit_data(f, items[i].t);
        if (!ok)
            rc = zd_error_set("safetensors: %s: cannot write: %s", label, strerror(errno));
    }
    free(b.p);
    free(items);
    return rc;
}

typedef struct {
    const char *path;
    const zd_named_tensors_t *nt;
    const zd_strings_t *meta;
} write_t;

static int write_to(FILE *f, void *arg)
{
    write_t *w = arg;
    return zd__safetensors_write_stream(f, w->path, w->nt, w->meta);
}

int zd_safetensors_write(const zd_named_tensors_t *nt, const char *path, const zd_strings_t *meta)
{
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "safetensors: write needs a path");
    if (check_write(path, nt, meta) < 0) /* before any file is made */
        return -1;
    return zd__file_replace("safetensors", path, write_to, &(write_t){path, nt, meta});
}
