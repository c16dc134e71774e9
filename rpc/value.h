/*  value.h: the values an RPC carries (SPEC R10).

    An rpc_value_t is a small tagged union: none, int64, double, string,
    bytes, tensor, RRef, a list of values, or a local C object. Values own
    what they hold: strings and bytes are copied in, tensors and RRefs hold
    one reference, an object is freed with the value. A list owns its items.
    Values are immutable once built and may be shared between threads by
    reference counting (rpc_value_ref/unref).

    Arguments of a call are one list value; a result is any value.

    Objects. A value may hold a C object of this process (a parameter
    server, an optimizer), as a PyTorch RRef may point to any Python
    object. Such a value never leaves its process: sending it fails
    ("codec: a local object (ParameterServer) cannot be sent to another
    process; send an RRef to it instead"). Others use it through an RRef:
    a function called with rpc_remote() returns the object value (or a
    function makes one with rpc_rref_new() and returns the RRef), and
    methods called through the RRef (rpc_rref_rpc_sync and the like) get
    the object as their first argument, on the owner. The object is freed
    when the value's last reference goes: for an RRef's value, when the
    last user anywhere has released the RRef. */
#ifndef ZDIST_RPC_VALUE_H
#define ZDIST_RPC_VALUE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "autograd/tensor.h"

typedef enum {
    RPC_NONE = 0,
    RPC_INT = 1,
    RPC_FLOAT = 2,
    RPC_STRING = 3,
    RPC_BYTES = 4,
    RPC_TENSOR = 5,
    RPC_RREF = 6,
    RPC_LIST = 7,
    RPC_OBJECT = 8,     /* local only: never on the wire */
} rpc_value_kind_t;

typedef struct rpc_value rpc_value_t;
typedef struct rpc_rref rpc_rref_t;   /* defined by the RPC agent (rpc/rref.h) */

/*  Constructors: each returns a new value with one reference (caller
    unrefs), or NULL when out of memory (error_last() says so).
    rpc_value_tensor / rpc_value_rref take their own reference to t / r. */
rpc_value_t *rpc_value_none(void);
rpc_value_t *rpc_value_int(int64_t v);
rpc_value_t *rpc_value_float(double v);
rpc_value_t *rpc_value_string(const char *s);
rpc_value_t *rpc_value_bytes(const void *data, size_t len);
rpc_value_t *rpc_value_tensor(tensor_t *t);
rpc_value_t *rpc_value_rref(rpc_rref_t *r);

/*  A value holding ptr, a C object of the type named by `type` (a string
    that outlives the value, normally a literal: "ParameterServer"). When
    the value's last reference goes, free_fn(ptr) runs (free_fn NULL: the
    value does not own ptr); it may run on the RPC I/O thread (the release
    of an RRef's last user is handled there), so it must not block. On
    failure (NULL ptr or type, out of memory) returns NULL having called
    free_fn(ptr) already, so the caller never cleans up twice. */
rpc_value_t *rpc_value_object(void *ptr, void (*free_fn)(void *ptr), const char *type);

/*  An empty list with room for `capacity` items (it grows as needed). */
rpc_value_t *rpc_value_list(size_t capacity);

/*  Appends item to list, taking over the caller's reference to item (so
    `rpc_list_append(l, rpc_value_int(3))` leaks nothing). Returns 0, or -1
    (item is then released) when out of memory or l is not a list. */
int rpc_list_append(rpc_value_t *list, rpc_value_t *item);

/*  A list built from a printf-like spec, for short calls:
      'i' int64_t, 'f' double, 's' const char *, 't' tensor_t *,
      'r' rpc_rref_t *, 'n' none, 'v' rpc_value_t * (reference taken over),
      'b' const void *, size_t (bytes).
    rpc_args("ti", x, (int64_t)3). Returns NULL on error; the 'v' values are
    released then too (unless the spec itself holds an unknown letter). */
rpc_value_t *rpc_args(const char *spec, ...);

rpc_value_t *rpc_value_ref(rpc_value_t *v);
void rpc_value_unref(rpc_value_t *v);

rpc_value_kind_t rpc_value_kind(const rpc_value_t *v);
const char *rpc_value_kind_name(rpc_value_kind_t kind);

/*  Accessors; each returns 0 and fills *out, or -1 with a clear error when
    v is of another kind ("expected tensor, got string"). Borrowed results:
    valid while v is alive. */
int rpc_value_get_int(const rpc_value_t *v, int64_t *out);
int rpc_value_get_float(const rpc_value_t *v, double *out);   /* ints convert */
int rpc_value_get_string(const rpc_value_t *v, const char **out);
int rpc_value_get_bytes(const rpc_value_t *v, const void **data, size_t *len);
int rpc_value_get_tensor(const rpc_value_t *v, tensor_t **out);
int rpc_value_get_rref(const rpc_value_t *v, rpc_rref_t **out);

/*  The object, checked to be of `type` (compared as strings; NULL accepts
    any type): "expected a DataWorker object, got int", "expected a
    DataWorker object; this object is a ParameterServer". */
int rpc_value_get_object(const rpc_value_t *v, const char *type, void **out);

/*  The type name of an object value; NULL for other kinds. */
const char *rpc_value_object_type(const rpc_value_t *v);

/*  List access: length (0 for a non-list) and item i (borrowed, NULL when out
    of range). */
size_t rpc_list_len(const rpc_value_t *v);
rpc_value_t *rpc_list_get(const rpc_value_t *v, size_t i);

/*  Typed access to list item i, for handlers unpacking their arguments:
    fails with "argument i: expected tensor, got int" style errors. */
int rpc_arg_int(const rpc_value_t *args, size_t i, int64_t *out);
int rpc_arg_float(const rpc_value_t *args, size_t i, double *out);
int rpc_arg_string(const rpc_value_t *args, size_t i, const char **out);
int rpc_arg_tensor(const rpc_value_t *args, size_t i, tensor_t **out);
int rpc_arg_rref(const rpc_value_t *args, size_t i, rpc_rref_t **out);
int rpc_arg_bytes(const rpc_value_t *args, size_t i, const void **data, size_t *len);
int rpc_arg_object(const rpc_value_t *args, size_t i, const char *type, void **out);

/*  Deep comparison: same kinds, same contents. Tensors compare by dtype,
    shape and bytes; floats bit for bit (NaN equals itself, -0.0 differs from
    0.0); RRefs and objects by identity (the same pointer). NULL equals
    only NULL. */
bool rpc_value_equal(const rpc_value_t *a, const rpc_value_t *b);

/*  A one-line description for logs and test failures, truncated with "..."
    to fit: [1, 2.5, "hi", bytes(3), tensor float32 (2, 3), rref@0x.., none,
    ParameterServer@0x..].
    Returns buf. */
char *rpc_value_format(const rpc_value_t *v, char *buf, size_t size);

#endif
