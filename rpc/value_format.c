/*  value_format.c: deep equality and one-line descriptions of values, for
    tests, logs and error messages. Built on the public accessors only. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rpc/codec.h"
#include "rpc/value.h"

static bool tensor_equal(const tensor_t *a, const tensor_t *b)
{
    if (a == b)
        return true;
    return tensor_dtype(a) == tensor_dtype(b) && tensor_same_shape(a, b) &&
           memcmp(tensor_raw(a), tensor_raw(b), tensor_nbytes(a)) == 0;
}

/* Strings and bytes alike: (data, len). */
static void blob(const rpc_value_t *v, const void **data, size_t *len)
{
    if (rpc_value_kind(v) == RPC_STRING) {
        const char *s;
        rpc_value_get_string(v, &s);
        *data = s;
        *len = strlen(s);
    } else {
        rpc_value_get_bytes(v, data, len);
    }
}

bool rpc_value_equal(const rpc_value_t *a, const rpc_value_t *b)
{
    if (a == b)
        return true;
    if (!a || !b || rpc_value_kind(a) != rpc_value_kind(b))
        return false;
    switch (rpc_value_kind(a)) {
    case RPC_NONE:
        return true;
    case RPC_INT: {
        int64_t x, y;
        rpc_value_get_int(a, &x);
        rpc_value_get_int(b, &y);
        return x == y;
    }
    case RPC_FLOAT: {
        double x, y;
        rpc_value_get_float(a, &x);
        rpc_value_get_float(b, &y);
        return memcmp(&x, &y, sizeof x) == 0;
    }
    case RPC_STRING:
    case RPC_BYTES: {
        const void *x, *y;
        size_t nx, ny;
        blob(a, &x, &nx);
        blob(b, &y, &ny);
        return nx == ny && (nx == 0 || memcmp(x, y, nx) == 0);
    }
    case RPC_TENSOR: {
        tensor_t *x, *y;
        rpc_value_get_tensor(a, &x);
        rpc_value_get_tensor(b, &y);
        return tensor_equal(x, y);
    }
    case RPC_RREF: {
        rpc_rref_t *x, *y;
        rpc_value_get_rref(a, &x);
        rpc_value_get_rref(b, &y);
        return x == y;
    }
    case RPC_OBJECT: {
        void *x, *y;
        rpc_value_get_object(a, NULL, &x);
        rpc_value_get_object(b, NULL, &y);
        return x == y;
    }
    case RPC_LIST: {
        size_t n = rpc_list_len(a);
        if (n != rpc_list_len(b))
            return false;
        for (size_t i = 0; i < n; i++)
            if (!rpc_value_equal(rpc_list_get(a, i), rpc_list_get(b, i)))
                return false;
        return true;
    }
    }
    return false;
}

/* A bounded appender: writes what fits, remembers whether anything did not. */
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

static void fmt_value(fmt_t *f, const rpc_value_t *v, int depth)
{
    if (!v) {
        fmt_add(f, "NULL");
        return;
    }
    switch (rpc_value_kind(v)) {
    case RPC_NONE:
        fmt_add(f, "none");
        break;
    case RPC_INT: {
        int64_t i;
        rpc_value_get_int(v, &i);
        fmt_add(f, "%" PRId64, i);
        break;
    }
    case RPC_FLOAT: {
        double x;
        rpc_value_get_float(v, &x);
        fmt_add(f, "%.17g", x);
        break;
    }
    case RPC_STRING: {
        const char *s;
        rpc_value_get_string(v, &s);
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
    case RPC_BYTES: {
        const void *data;
        size_t n;
        rpc_value_get_bytes(v, &data, &n);
        fmt_add(f, "bytes(%zu)", n);
        break;
    }
    case RPC_TENSOR: {
        tensor_t *t;
        char shape[128];
        rpc_value_get_tensor(v, &t);
        fmt_add(f, "tensor %s %s", tensor_dtype_name(tensor_dtype(t)),
                tensor_shape_str(t, shape, sizeof shape));
        break;
    }
    case RPC_RREF: {
        rpc_rref_t *r;
        rpc_value_get_rref(v, &r);
        fmt_add(f, "rref@%p", (void *)r);
        break;
    }
    case RPC_OBJECT: {
        void *p;
        rpc_value_get_object(v, NULL, &p);
        fmt_add(f, "%s@%p", rpc_value_object_type(v), p);
        break;
    }
    case RPC_LIST:
        if (depth >= RPC_CODEC_MAX_DEPTH) {
            fmt_add(f, "[...]");
            break;
        }
        fmt_add(f, "[");
        for (size_t i = 0; i < rpc_list_len(v) && !f->full; i++) {
            if (i)
                fmt_add(f, ", ");
            fmt_value(f, rpc_list_get(v, i), depth + 1);
        }
        fmt_add(f, "]");
        break;
    }
}

char *rpc_value_format(const rpc_value_t *v, char *buf, size_t size)
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
