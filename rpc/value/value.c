/* SPDX-License-Identifier: MIT */
/*  value.c: the tagged values an RPC carries. */
#include <zdist/value.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/value/args.h"
#include "rpc/value/codec.h"

struct zd_value {
    atomic_int refcount;
    zd_value_kind_t kind;
    union {
        int64_t i;
        double f;
        struct {
            char *data; /* strings keep a terminating NUL past len */
            size_t len;
        } s;
        zd_tensor_t *t;
        zd_rref_t *r;
        struct {
            zd_value_t **items;
            size_t len, cap;
        } list;
        struct {
            void *ptr;
            void (*free_fn)(void *ptr);
            const char *type;
        } obj;
    } u;
};

/*  Atomic so that an agent starting while other threads build values is not a
    data race; the hooks never change while RRefs are alive. */
static _Atomic(rpc_rref_hook_fn *) rref_ref_hook;
static _Atomic(rpc_rref_hook_fn *) rref_unref_hook;

void zd__value_set_rref_hooks(rpc_rref_hook_fn *ref, rpc_rref_hook_fn *unref)
{
    atomic_store(&rref_ref_hook, ref);
    atomic_store(&rref_unref_hook, unref);
}

static void rref_unref(zd_rref_t *r)
{
    rpc_rref_hook_fn *fn = atomic_load(&rref_unref_hook);
    if (fn && r)
        fn(r);
}

/*  Values alive in this process (tests count them back after a failure). */
static atomic_int_fast64_t live_values;

int64_t zd__value_live_count(void)
{
    return atomic_load_explicit(&live_values, memory_order_relaxed);
}

static zd_value_t *value_new(zd_value_kind_t kind)
{
    zd_value_t *v = calloc(1, sizeof *v);
    if (!v) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "rpc value: out of memory");
        return NULL;
    }
    atomic_fetch_add_explicit(&live_values, 1, memory_order_relaxed);
    atomic_init(&v->refcount, 1);
    v->kind = kind;
    return v;
}

zd_value_t *zd_value_none(void)
{
    return value_new(ZD_VALUE_NONE);
}

zd_value_t *zd_value_int(int64_t i)
{
    zd_value_t *v = value_new(ZD_VALUE_INT);
    if (v)
        v->u.i = i;
    return v;
}

zd_value_t *zd_value_float(double f)
{
    zd_value_t *v = value_new(ZD_VALUE_FLOAT);
    if (v)
        v->u.f = f;
    return v;
}

static zd_value_t *value_blob(zd_value_kind_t kind, const void *data, size_t len)
{
    if (len == SIZE_MAX) {
        zd_error_set("rpc value: %s too long", zd_value_kind_name(kind));
        return NULL;
    }
    zd_value_t *v = value_new(kind);
    if (!v)
        return NULL;
    v->u.s.data = malloc(len + 1);
    if (!v->u.s.data) {
        zd_value_unref(v);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "rpc value: out of memory for a %zu-byte %s", len,
                          zd_value_kind_name(kind));
        return NULL;
    }
    if (len)
        memcpy(v->u.s.data, data, len);
    v->u.s.data[len] = '\0';
    v->u.s.len = len;
    return v;
}

zd_value_t *zd_value_string(const char *s)
{
    if (!s) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_string: NULL string");
        return NULL;
    }
    return value_blob(ZD_VALUE_STRING, s, strlen(s));
}

zd_value_t *zd__value_string_len(const char *s, size_t len)
{
    if (!s && len) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_string: NULL string of %zu bytes", len);
        return NULL;
    }
    if (len && memchr(s, 0, len)) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_string: NUL byte inside a string");
        return NULL;
    }
    return value_blob(ZD_VALUE_STRING, s, len);
}

zd_value_t *zd_value_bytes(const void *data, size_t len)
{
    if (!data && len) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_bytes: NULL data for %zu bytes", len);
        return NULL;
    }
    return value_blob(ZD_VALUE_BYTES, data, len);
}

zd_value_t *zd_value_tensor(zd_tensor_t *t)
{
    if (!t) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_tensor: NULL tensor");
        return NULL;
    }
    zd_value_t *v = value_new(ZD_VALUE_TENSOR);
    if (v)
        v->u.t = zd_tensor_ref(t);
    return v;
}

zd_value_t *zd__value_rref_adopt(zd_rref_t *r)
{
    if (!r) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_rref: NULL RRef");
        return NULL;
    }
    zd_value_t *v = value_new(ZD_VALUE_RREF);
    if (!v) {
        rref_unref(r);
        return NULL;
    }
    v->u.r = r;
    return v;
}

zd_value_t *zd_value_rref(zd_rref_t *r)
{
    if (!r) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_rref: NULL RRef");
        return NULL;
    }
    rpc_rref_hook_fn *fn = atomic_load(&rref_ref_hook);
    if (fn)
        fn(r);
    return zd__value_rref_adopt(r);
}

zd_value_t *zd_value_object(void *ptr, void (*free_fn)(void *ptr), const char *type)
{
    if (!ptr || !type) {
        if (ptr && free_fn)
            free_fn(ptr);
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_value_object: NULL %s", ptr ? "type" : "object");
        return NULL;
    }
    zd_value_t *v = value_new(ZD_VALUE_OBJECT);
    if (!v) {
        if (free_fn)
            free_fn(ptr);
        return NULL;
    }
    v->u.obj.ptr = ptr;
    v->u.obj.free_fn = free_fn;
    v->u.obj.type = type;
    return v;
}

zd_value_t *zd_value_list(size_t capacity)
{
    zd_value_t *v = value_new(ZD_VALUE_LIST);
    if (!v)
        return NULL;
    if (capacity > SIZE_MAX / sizeof(zd_value_t *))
        capacity = 0; /* absurd hint: grow on demand instead */
    if (capacity) {
        v->u.list.items = malloc(capacity * sizeof(zd_value_t *));
        if (!v->u.list.items) {
            zd_value_unref(v);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "rpc value: out of memory for a list of %zu",
                              capacity);
            return NULL;
        }
        v->u.list.cap = capacity;
    }
    return v;
}

int zd_list_append(zd_value_t *list, zd_value_t *item)
{
    if (!item) {
        /* Typically a failed constructor: keep its error text. */
        return zd_error_wrap("zd_list_append: NULL item");
    }
    if (!list || list->kind != ZD_VALUE_LIST) {
        zd_value_unref(item);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_list_append: expected list, got %s",
                                 list ? zd_value_kind_name(list->kind) : "NULL");
    }
    if (item == list) {
        zd_value_unref(item);
        return zd_error_set("zd_list_append: a list cannot contain itself");
    }
    if (list->u.list.len == list->u.list.cap) {
        size_t cap = list->u.list.cap ? list->u.list.cap * 2 : 4;
        zd_value_t **items = NULL;
        if (cap <= SIZE_MAX / sizeof *items)
            items = realloc(list->u.list.items, cap * sizeof *items);
        if (!items) {
            zd_value_unref(item);
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_list_append: out of memory");
        }
        list->u.list.items = items;
        list->u.list.cap = cap;
    }
    list->u.list.items[list->u.list.len++] = item;
    return 0;
}

static zd_value_t *args_item(char c, va_list *ap)
{
    switch (c) {
    case 'i':
        return zd_value_int(va_arg(*ap, int64_t));
    case 'f':
        return zd_value_float(va_arg(*ap, double));
    case 's':
        return zd_value_string(va_arg(*ap, const char *));
    case 't':
        return zd_value_tensor(va_arg(*ap, zd_tensor_t *));
    case 'r':
        return zd_value_rref(va_arg(*ap, zd_rref_t *));
    case 'n':
        return zd_value_none();
    case 'b': {
        const void *data = va_arg(*ap, const void *);
        return zd_value_bytes(data, va_arg(*ap, size_t));
    }
    case 'v': {
        /* NULL: most likely a constructor that failed, whose reason is kept
           (as ZD_ARGS does). */
        zd_value_t *v = va_arg(*ap, zd_value_t *);
        if (!v)
            zd_error_wrap("NULL value");
        return v;
    }
    }
    return NULL;
}

/*  Consumes one argument without building anything, so that an earlier error
    text survives; only 'v' values need releasing. */
static void args_skip(char c, va_list *ap)
{
    switch (c) {
    case 'i':
        (void)va_arg(*ap, int64_t);
        break;
    case 'f':
        (void)va_arg(*ap, double);
        break;
    case 's':
        (void)va_arg(*ap, const char *);
        break;
    case 't':
        (void)va_arg(*ap, zd_tensor_t *);
        break;
    case 'r':
        (void)va_arg(*ap, zd_rref_t *);
        break;
    case 'b':
        (void)va_arg(*ap, const void *);
        (void)va_arg(*ap, size_t);
        break;
    case 'v':
        zd_value_unref(va_arg(*ap, zd_value_t *));
        break;
    }
}

zd_value_t *zd__rpc_args(const char *spec, ...)
{
    if (!spec) {
        zd_error_set("zd__rpc_args: NULL spec");
        return NULL;
    }
    /* Check the spec first: with an unknown letter the types of the varargs
       are unknown, so nothing can be consumed safely. */
    size_t n = strlen(spec);
    for (size_t i = 0; i < n; i++)
        if (!strchr("ifstrnbv", spec[i])) {
            zd_error_set("zd__rpc_args: unknown letter '%c' in spec \"%s\"", spec[i], spec);
            return NULL;
        }
    zd_value_t *list = zd_value_list(n);
    va_list ap;
    va_start(ap, spec);
    /* After a failure keep walking so that every 'v' value is released. */
    int failed = list ? -1 : 0;
    for (size_t i = 0; i < n; i++) {
        if (failed >= 0) {
            args_skip(spec[i], &ap);
            continue;
        }
        zd_value_t *item = args_item(spec[i], &ap);
        if (!item) {
            zd_error_wrap("zd__rpc_args: argument %zu ('%c')", i, spec[i]);
            failed = (int)i;
            continue;
        }
        list->u.list.items[list->u.list.len++] = item; /* capacity n: no growth */
    }
    va_end(ap);
    if (failed >= 0) {
        zd_value_unref(list);
        return NULL;
    }
    return list;
}

zd_value_t *zd_value_ref(zd_value_t *v)
{
    if (v)
        atomic_fetch_add_explicit(&v->refcount, 1, memory_order_relaxed);
    return v;
}

void zd_value_unref(zd_value_t *v)
{
    if (!v || atomic_fetch_sub_explicit(&v->refcount, 1, memory_order_acq_rel) != 1)
        return;
    switch (v->kind) {
    case ZD_VALUE_STRING:
    case ZD_VALUE_BYTES:
        free(v->u.s.data);
        break;
    case ZD_VALUE_TENSOR:
        zd_tensor_unref(v->u.t);
        break;
    case ZD_VALUE_RREF:
        rref_unref(v->u.r);
        break;
    case ZD_VALUE_LIST:
        for (size_t i = 0; i < v->u.list.len; i++)
            zd_value_unref(v->u.list.items[i]);
        free(v->u.list.items);
        break;
    case ZD_VALUE_OBJECT:
        if (v->u.obj.free_fn)
            v->u.obj.free_fn(v->u.obj.ptr);
        break;
    default:
        break;
    }
    atomic_fetch_sub_explicit(&live_values, 1, memory_order_relaxed);
    free(v);
}

zd_value_kind_t zd_value_kind(const zd_value_t *v)
{
    return v ? v->kind : ZD_VALUE_NONE;
}

const char *zd_value_kind_name(zd_value_kind_t kind)
{
    switch (kind) {
    case ZD_VALUE_NONE:
        return "none";
    case ZD_VALUE_INT:
        return "int";
    case ZD_VALUE_FLOAT:
        return "float";
    case ZD_VALUE_STRING:
        return "string";
    case ZD_VALUE_BYTES:
        return "bytes";
    case ZD_VALUE_TENSOR:
        return "tensor";
    case ZD_VALUE_RREF:
        return "rref";
    case ZD_VALUE_LIST:
        return "list";
    case ZD_VALUE_OBJECT:
        return "object";
    }
    return "?";
}

static int expect(const zd_value_t *v, zd_value_kind_t kind)
{
    if (!v)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected %s, got NULL",
                                 zd_value_kind_name(kind));
    if (v->kind != kind)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected %s, got %s", zd_value_kind_name(kind),
                                 zd_value_kind_name(v->kind));
    return 0;
}

int zd_value_get_int(const zd_value_t *v, int64_t *out)
{
    if (expect(v, ZD_VALUE_INT) < 0)
        return -1;
    *out = v->u.i;
    return 0;
}

int zd_value_get_float(const zd_value_t *v, double *out)
{
    if (v && v->kind == ZD_VALUE_INT) {
        *out = (double)v->u.i;
        return 0;
    }
    if (expect(v, ZD_VALUE_FLOAT) < 0)
        return -1;
    *out = v->u.f;
    return 0;
}

int zd_value_get_string(const zd_value_t *v, const char **out)
{
    if (expect(v, ZD_VALUE_STRING) < 0)
        return -1;
    *out = v->u.s.data;
    return 0;
}

int zd_value_get_bytes(const zd_value_t *v, const void **data, size_t *len)
{
    if (expect(v, ZD_VALUE_BYTES) < 0)
        return -1;
    *data = v->u.s.data;
    *len = v->u.s.len;
    return 0;
}

int zd_value_get_tensor(const zd_value_t *v, zd_tensor_t **out)
{
    if (expect(v, ZD_VALUE_TENSOR) < 0)
        return -1;
    *out = v->u.t;
    return 0;
}

int zd_value_get_rref(const zd_value_t *v, zd_rref_t **out)
{
    if (expect(v, ZD_VALUE_RREF) < 0)
        return -1;
    *out = v->u.r;
    return 0;
}

int zd_value_get_object(const zd_value_t *v, const char *type, void **out)
{
    if (!v || v->kind != ZD_VALUE_OBJECT)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected %s%s object, got %s",
                                 type ? "a " : "an", type ? type : "",
                                 v ? zd_value_kind_name(v->kind) : "NULL");
    if (type && strcmp(type, v->u.obj.type) != 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected a %s object; this object is a %s", type,
                                 v->u.obj.type);
    *out = v->u.obj.ptr;
    return 0;
}

const char *zd_value_object_type(const zd_value_t *v)
{
    return v && v->kind == ZD_VALUE_OBJECT ? v->u.obj.type : NULL;
}

size_t zd_list_len(const zd_value_t *v)
{
    return v && v->kind == ZD_VALUE_LIST ? v->u.list.len : 0;
}

zd_value_t *zd_list_get(const zd_value_t *v, size_t i)
{
    if (v && v->kind == ZD_VALUE_LIST && i < v->u.list.len)
        return v->u.list.items[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "zd_list_get: no item %zu (%s)", i,
                      v && v->kind == ZD_VALUE_LIST ? "past the end" : "not a list");
    return NULL;
}

static const zd_value_t *arg(const zd_value_t *args, size_t i)
{
    if (!args || args->kind != ZD_VALUE_LIST) {
        zd_error_set("arguments: expected list, got %s",
                     args ? zd_value_kind_name(args->kind) : "NULL");
        return NULL;
    }
    if (i >= args->u.list.len) {
        zd_error_set("argument %zu missing (%zu given)", i, args->u.list.len);
        return NULL;
    }
    return args->u.list.items[i];
}

/*  Typed argument access: the accessor's error gets the argument's index. */
#define ARG_ACCESS(get, ...)                                                                       \
    do {                                                                                           \
        const zd_value_t *a = arg(args, i);                                                        \
        if (!a)                                                                                    \
            return -1;                                                                             \
        if (get(a, __VA_ARGS__) < 0)                                                               \
            return zd_error_wrap("argument %zu", i);                                               \
        return 0;                                                                                  \
    } while (0)

int zd_rpc_arg_int(const zd_value_t *args, size_t i, int64_t *out)
{
    ARG_ACCESS(zd_value_get_int, out);
}

int zd_rpc_arg_float(const zd_value_t *args, size_t i, double *out)
{
    ARG_ACCESS(zd_value_get_float, out);
}

int zd_rpc_arg_string(const zd_value_t *args, size_t i, const char **out)
{
    ARG_ACCESS(zd_value_get_string, out);
}

int zd_rpc_arg_tensor(const zd_value_t *args, size_t i, zd_tensor_t **out)
{
    ARG_ACCESS(zd_value_get_tensor, out);
}

int zd_rpc_arg_rref(const zd_value_t *args, size_t i, zd_rref_t **out)
{
    ARG_ACCESS(zd_value_get_rref, out);
}

int zd_rpc_arg_bytes(const zd_value_t *args, size_t i, const void **data, size_t *len)
{
    ARG_ACCESS(zd_value_get_bytes, data, len);
}

int zd_rpc_arg_object(const zd_value_t *args, size_t i, const char *type, void **out)
{
    ARG_ACCESS(zd_value_get_object, type, out);
}
