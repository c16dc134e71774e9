/*  value.h: the values an RPC carries (SPEC R10).

    An zd_value_t is a small tagged union: none, int64, double, string,
    bytes, tensor, RRef, a list of values, or a local C object. Values own
    what they hold: strings and bytes are copied in, tensors and RRefs hold
    one reference, an object is freed with the value. A list owns its items.
    Values are immutable once built and may be shared between threads by
    reference counting (zd_value_ref/unref).

    Arguments of a call are one list value; a result is any value.

    Objects. A value may hold a C object of this process (a parameter
    server, an optimizer), as a PyTorch RRef may point to any Python
    object. Such a value never leaves its process: sending it fails
    ("codec: a local object (ParameterServer) cannot be sent to another
    process; send an RRef to it instead"). Others use it through an RRef:
    a function called with zd_rpc_remote() returns the object value (or a
    function makes one with zd_rref_new() and returns the RRef), and
    methods called through the RRef (zd_rref_rpc_sync and the like) get
    the object as their first argument, on the owner. The object is freed
    when the value's last reference goes: for an RRef's value, when the
    last user anywhere has released the RRef. */
#ifndef ZDIST_RPC_VALUE_H
#define ZDIST_RPC_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <zdist/tensor.h>
#include <zdist/export.h>

ZD_BEGIN_DECLS

typedef enum {
    ZD_VALUE_NONE = 0,
    ZD_VALUE_INT = 1,
    ZD_VALUE_FLOAT = 2,
    ZD_VALUE_STRING = 3,
    ZD_VALUE_BYTES = 4,
    ZD_VALUE_TENSOR = 5,
    ZD_VALUE_RREF = 6,
    ZD_VALUE_LIST = 7,
    ZD_VALUE_OBJECT = 8,     /* local only: never on the wire */
} zd_value_kind_t;

typedef struct zd_value zd_value_t;
typedef struct zd_rref zd_rref_t;   /* defined by the RPC agent (rpc/rref.h) */

/*  Constructors: each returns a new value with one reference (caller
    unrefs), or NULL when out of memory (zd_error_last() says so).
    zd_value_tensor / zd_value_rref take their own reference to t / r. */
ZD_API zd_value_t *zd_value_none(void);
ZD_API zd_value_t *zd_value_int(int64_t v);
ZD_API zd_value_t *zd_value_float(double v);
ZD_API zd_value_t *zd_value_string(const char *s);
ZD_API zd_value_t *zd_value_bytes(const void *data, size_t len);
ZD_API zd_value_t *zd_value_tensor(zd_tensor_t *t);
ZD_API zd_value_t *zd_value_rref(zd_rref_t *r);

/*  A value holding ptr, a C object of the type named by `type` (a string
    that outlives the value, normally a literal: "ParameterServer"). When
    the value's last reference goes, free_fn(ptr) runs (free_fn NULL: the
    value does not own ptr); it may run on the RPC I/O thread (the release
    of an RRef's last user is handled there), so it must not block. On
    failure (NULL ptr or type, out of memory) returns NULL having called
    free_fn(ptr) already, so the caller never cleans up twice. */
ZD_API zd_value_t *zd_value_object(void *ptr, void (*free_fn)(void *ptr), const char *type);

/*  An empty list with room for `capacity` items (it grows as needed). */
ZD_API zd_value_t *zd_value_list(size_t capacity);

/*  Appends item to list, taking over the caller's reference to item (so
    `zd_list_append(l, zd_value_int(3))` leaks nothing). Returns 0, or -1
    (item is then released) when out of memory or l is not a list. */
ZD_API int zd_list_append(zd_value_t *list, zd_value_t *item);

/*  A list built from a printf-like spec, for short calls:
      'i' int64_t, 'f' double, 's' const char *, 't' zd_tensor_t *,
      'r' zd_rref_t *, 'n' none, 'v' zd_value_t * (reference taken over),
      'b' const void *, size_t (bytes).
    zd_rpc_args("ti", x, (int64_t)3). Returns NULL on error; the 'v' values are
    released then too (unless the spec itself holds an unknown letter). */
ZD_API zd_value_t *zd_rpc_args(const char *spec, ...);

ZD_API zd_value_t *zd_value_ref(zd_value_t *v);
ZD_API void zd_value_unref(zd_value_t *v);

ZD_API zd_value_kind_t zd_value_kind(const zd_value_t *v);
ZD_API const char *zd_value_kind_name(zd_value_kind_t kind);

/*  Accessors; each returns 0 and fills *out, or -1 with a clear error when
    v is of another kind ("expected tensor, got string"). Borrowed results:
    valid while v is alive. */
ZD_API int zd_value_get_int(const zd_value_t *v, int64_t *out);
ZD_API int zd_value_get_float(const zd_value_t *v, double *out);   /* ints convert */
ZD_API int zd_value_get_string(const zd_value_t *v, const char **out);
ZD_API int zd_value_get_bytes(const zd_value_t *v, const void **data, size_t *len);
ZD_API int zd_value_get_tensor(const zd_value_t *v, zd_tensor_t **out);
ZD_API int zd_value_get_rref(const zd_value_t *v, zd_rref_t **out);

/*  The object, checked to be of `type` (compared as strings; NULL accepts
    any type): "expected a DataWorker object, got int", "expected a
    DataWorker object; this object is a ParameterServer". */
ZD_API int zd_value_get_object(const zd_value_t *v, const char *type, void **out);

/*  The type name of an object value; NULL for other kinds. */
ZD_API const char *zd_value_object_type(const zd_value_t *v);

/*  List access: length (0 for a non-list) and item i (borrowed, NULL when out
    of range). */
ZD_API size_t zd_list_len(const zd_value_t *v);
ZD_API zd_value_t *zd_list_get(const zd_value_t *v, size_t i);

/*  Typed access to list item i, for handlers unpacking their arguments:
    fails with "argument i: expected tensor, got int" style errors. */
ZD_API int zd_rpc_arg_int(const zd_value_t *args, size_t i, int64_t *out);
ZD_API int zd_rpc_arg_float(const zd_value_t *args, size_t i, double *out);
ZD_API int zd_rpc_arg_string(const zd_value_t *args, size_t i, const char **out);
ZD_API int zd_rpc_arg_tensor(const zd_value_t *args, size_t i, zd_tensor_t **out);
ZD_API int zd_rpc_arg_rref(const zd_value_t *args, size_t i, zd_rref_t **out);
ZD_API int zd_rpc_arg_bytes(const zd_value_t *args, size_t i, const void **data, size_t *len);
ZD_API int zd_rpc_arg_object(const zd_value_t *args, size_t i, const char *type, void **out);

/*  Deep comparison: same kinds, same contents. Tensors compare by dtype,
    shape and bytes; floats bit for bit (NaN equals itself, -0.0 differs from
    0.0); RRefs and objects by identity (the same pointer). NULL equals
    only NULL. */
ZD_API bool zd_value_equal(const zd_value_t *a, const zd_value_t *b);

/*  A one-line description for logs and test failures, truncated with "..."
    to fit: [1, 2.5, "hi", bytes(3), tensor float32 (2, 3), rref@0x.., none,
    ParameterServer@0x..].
    Returns buf. */
ZD_API char *zd_value_format(const zd_value_t *v, char *buf, size_t size);

ZD_END_DECLS

#endif
