/* SPDX-License-Identifier: MIT */
/*  value_format.c: deep equality and one-line descriptions of values, for
    tests, logs and error messages. Built on the public accessors only. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rpc/value/codec.h"
#include <zdist/value.h>

static bool tensor_equal(const zd_tensor_t *a, const zd_tensor_t *b)
{
    if (a == b)
        return true;
    return zd_tensor_dtype(a) == zd_tensor_dtype(b) && zd_tensor_same_shape(a, b) &&
        memcmp(zd_tensor_raw(a), zd_tensor_raw(b), zd_tensor_nbytes(a)) == 0;
}

/*  Strings and bytes alike: (data, len). */
static void blob(const zd_value_t *v, const void **data, size_t *len)
{
    if (zd_value_kind(v) == ZD_VALUE_STRING) {
        const char *s;
        zd_value_get_string(v, &s);
        *data = s;
        *len = strlen(s);
    } else {
        zd_value_get_bytes(v, data, len);
    }
}

bool zd_value_equal(const zd_value_t *a, const zd_value_t *b)
{
    if (a == b)
        return true;
    if (!a || !b || zd_value_kind(a) != zd_value_kind(b))
        return false;
    switch (zd_value_kind(a)) {
    case ZD_VALUE_NONE:
        return true;
    case ZD_VALUE_INT: {
        int64_t x, y;
        zd_value_get_int(a, &x);
        zd_value_get_int(b, &y);
        return x == y;
    }
    case ZD_VALUE_FLOAT: {
        double x, y;
        zd_value_get_float(a, &x);
        zd_value_get_float(b, &y);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    case ZD_VALUE_STRING:
    case ZD_VALUE_BYTES: {
        const void *x, *y;
        size_t nx, ny;
        blob(a, &x, &nx);
        blob(b, &y, &ny);
        return nx == ny && (nx == 0 || memcmp(x, y, nx) == 0);
    }
    case ZD_VALUE_TENSOR: {
        zd_tensor_t *x, *y;
        zd_value_get_tensor(a, &x);
        zd_value_get_tensor(b, &y);
        return tensor_equal(x, y);
    }
    case ZD_VALUE_RREF: {
        zd_rref_t *x, *y;
        zd_value_get_rref(a, &x);
        zd_value_get_rref(b, &y);
        return x == y;
    }
    case ZD_VALUE_OBJECT: {
        void *x, *y;
        zd_value_get_object(a, NULL, &x);
        zd_value_get_object(b, NULL, &y);
        return x == y;
    }
    case ZD_VALUE_LIST: {
        size_t n = zd_list_len(a);
        if (n != zd_list_len(b))
            return false;
        for (size_t i = 0; i < n; i++)
            if (!zd_value_equal(zd_list_get(a, i), zd_list_get(b, i)))
                return false;
        return true;
    }
    }
    return false;
}

/*  A bounded appender: writes what fits, remembers whether anything did not. */
typedef struct {
    char *buf;
    size_t size, len;
    bool full;
} fmt_t;

static void fmt_add(fmt_t *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fmt_add(fmt_t *f, const char *fmt, ...)
{
    if (f->full)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(f->buf + f->len, f->size - f->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= f->size - f->len) {
        f->full = true;
        f->len = f->size - 1;
    } else {
        f->len += (size_t)n;
    }
}

static void fmt_value(fmt_t *f, const zd_value_t *v, int depth)
{
    if (!v) {
        fmt_add(f, "NULL");
        return;
    }
    switch (zd_value_kind(v)) {
    case ZD_VALUE_NONE:
        fmt_add(f, "none");
        break;
    case ZD_VALUE_INT: {
        int64_t i;
        zd_value_get_int(v, &i);
        fmt_add(f, "%" PRId64, i);
        break;
    }
    case ZD_VALUE_FLOAT: {
        double x;
        zd_value_get_float(v, &x);
        fmt_add(f, "%.17g", x);
        break;
    }
    case ZD_VALUE_STRING: {
        const char *s;
        zd_value_get_string(v, &s);
        fmt_add(f, "\"");
        for (const char *p = s; *p && !f->full; p++) {
            unsigned char c = (unsigned char)*p;
            if (c == '"' || c == '\\')
                fmt_add(f, "\\%c", c);
            else if (c < 0x20 || c >= 0x7f)
                fmt_add(f, "\\x%02x", c);
            else
                fmt_add(f, "%c", c);
        }
        fmt_add(f, "\"");
        break;
    }
    case ZD_VALUE_BYTES: {
        const void *data;
        size_t n;
        zd_value_get_bytes(v, &data, &n);
        fmt_add(f, "bytes(%zu)", n);
        break;
    }
    case ZD_VALUE_TENSOR: {
        zd_tensor_t *t;
        char shape[128];
        zd_value_get_tensor(v, &t);
        fmt_add(f, "tensor %s %s", zd_tensor_dtype_name(zd_tensor_dtype(t)),
                zd_tensor_shape_str(t, shape, sizeof shape));
        break;
    }
    case ZD_VALUE_RREF: {
        zd_rref_t *r;
        zd_value_get_rref(v, &r);
        fmt_add(f, "rref@%p", (void *)r);
        break;
    }
    case ZD_VALUE_OBJECT: {
        void *p;
        zd_value_get_object(v, NULL, &p);
        fmt_add(f, "%s@%p", zd_value_object_type(v), p);
        break;
    }
    case ZD_VALUE_LIST:
        if (depth >= RPC_CODEC_MAX_DEPTH) {
            fmt_add(f, "[...]");
            break;
        }
        fmt_add(f, "[");
        for (size_t i = 0; i < zd_list_len(v) && !f->full; i++) {
            if (i)
                fmt_add(f, ", ");
            fmt_value(f, zd_list_get(v, i), depth + 1);
        }
        fmt_add(f, "]");
        break;
    }
}

char *zd_value_format(const zd_value_t *v, char *buf, size_t size)
{
    if (!buf || size == 0)
        return buf;
    fmt_t f = {buf, size, 0, false};
    buf[0] = '\0';
    fmt_value(&f, v, 0);
    if (f.full) {
        size_t dots = size > 4 ? 3 : size - 1;
        memset(buf + size - 1 - dots, '.', dots);
        buf[size - 1] = '\0';
    }
    return buf;
}
