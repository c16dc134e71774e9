/* SPDX-License-Identifier: MIT */
/*  value.h: the values an RPC carries.

    A zd_value_t is a small tagged union: none, int64, double, string,
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
    ZD_VALUE_OBJECT = 8, /* local only: never on the wire */
} zd_value_kind_t;

typedef struct zd_value zd_value_t;
typedef struct zd_rref zd_rref_t; /* opaque: see <zdist/rpc.h> */

/*  Constructors: each returns a new value (a new reference), or NULL with
    the error set: ZD_ERR_ARGUMENT for a NULL string, data, tensor or RRef
    (or a string with a NUL byte inside), ZD_ERR_NO_MEMORY out of memory.
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
    free_fn(ptr) already, so the caller never cleans up twice. Otherwise a
    new reference. */
ZD_API zd_value_t *zd_value_object(void *ptr, void (*free_fn)(void *ptr), const char *type);

/*  An empty list with room for `capacity` items (it grows as needed): a new
    reference, or NULL. */
ZD_API zd_value_t *zd_value_list(size_t capacity);

/*  Appends item to list, taking over the caller's reference to item (so
    `zd_list_append(l, zd_value_int(3))` leaks nothing). Returns 0, or -1
    (item is then released) when out of memory or l is not a list. */
ZD_API int zd_list_append(zd_value_t *list, zd_value_t *item);

/*  ---- call arguments: ZD_ARGS and ZD_UNPACK ----

    The one way to build a call's arguments is ZD_ARGS, and the one way to
    read them in a handler is ZD_UNPACK; both are C (C11 _Generic). Their
    function forms, for C++ and for lists built in a loop: zd_value_list +
    zd_list_append to build, zd_list_len + zd_rpc_arg_* to read.

    ZD_ARGS(x, y, ...) builds a new list value (caller unrefs, or hands it
    to a _take call of rpc.h) from C values, each converted by its type,
    which the compiler checks (C11 _Generic):
      any integer type (char, int, long, unsigned ..., int64_t, bool)
                                         -> int (an unsigned value above
                                            INT64_MAX fails)
      float, double, long double         -> float
      char *, const char * (literals)    -> string (copied)
      zd_tensor_t *, zd_rref_t *         -> tensor, RRef (own reference taken)
      zd_value_t *                       -> that value, reference taken over
                                            (a nested ZD_ARGS(...) is a list)
    Any other type (void *, NULL, int *, a struct) does not compile: the
    compiler's error names ZD_ARGS_takes_integers_floats_strings_....
    ZD_ARGS() is the empty list; up to 24 items (more do not compile).
    Each argument is evaluated once. Returns NULL when an item fails (a
    NULL string, tensor or value, out of memory): "ZD_ARGS: argument 1:
    zd_value_string: NULL string" (items count from 0, as in zd_rpc_arg_*);
    what was built and the zd_value_t items are released then too.

        zd_rpc_sync_take(to, "add", ZD_ARGS(2, -3), ZD_TIMEOUT_DEFAULT, &r);

    ZD_UNPACK(args, &a, &b, ...) is the reverse, for handlers: checks that
    args is a list of exactly that many items ("expected 2 arguments, got
    3") and fills each output by its pointer type, with the errors of
    zd_rpc_arg_* ("argument 1: expected tensor, got int"):
      int64_t *  -> int         double *       -> float (ints convert)
      const char ** -> string   zd_tensor_t ** -> tensor
      zd_rref_t ** -> RRef      zd_value_t **  -> the item itself
    Results are borrowed from args. Returns 0, or -1 (outputs before the
    failing one may have been written). Any other pointer type, notably
    int * or long long *, does not compile (the error names
    ZD_UNPACK_takes_int64_t_double_const_char_...): declare int64_t.

        int64_t a, b;
        if (ZD_UNPACK(args, &a, &b) < 0)
            return NULL;

    Bytes and none items go in as values: ZD_ARGS(zd_value_bytes(p, n),
    zd_value_none()), read with zd_rpc_arg_bytes and ZD_UNPACK's
    zd_value_t **. */

/*  One item of ZD_ARGS: kind 'i' int64, 'u' an unsigned integer (checked
    to fit an int64), 'f' double, 's' string, 't' tensor, 'r' RRef, 'v' a
    value (taken over). */
typedef struct {
    char kind;
    union {
        int64_t i;
        uint64_t u;
        double f;
        const char *s;
        zd_tensor_t *t;
        zd_rref_t *r;
        zd_value_t *v;
    } u;
} zd_rpc_arg_t;

/*  One output of ZD_UNPACK: kind 'i' int64_t *, 'f' double *, 's' const
    char **, 't' zd_tensor_t **, 'r' zd_rref_t **, 'v' zd_value_t **; out
    the pointer it fills. */
typedef struct {
    char kind;
    void *out;
} zd_rpc_out_t;

/*  The list of n items (n 0: empty; items may then be NULL): what ZD_ARGS
    calls. A new reference, or NULL (the 'v' items released, as above). */
ZD_API zd_value_t *zd_rpc_args_array(const zd_rpc_arg_t *items, size_t n);

/*  Unpacks args into n outputs: what ZD_UNPACK calls. Results borrowed
    from args. 0, or -1. */
ZD_API int zd_rpc_unpack_array(const zd_value_t *args, const zd_rpc_out_t *outs, size_t n);

#ifndef __cplusplus

#define ZD_ARGS(...)   ZD__CAT(ZD__ARGS_EMPTY, ZD__ISEMPTY(__VA_ARGS__))(__VA_ARGS__)
#define ZD_UNPACK(...) ZD__CAT(ZD__UNPACK_, ZD__HAS_COMMA(__VA_ARGS__))(__VA_ARGS__)

/*  What follows is machinery: no user-serviceable parts. */
#define ZD__ARGS_EMPTY1(...) zd_rpc_args_array(NULL, 0)
#define ZD__ARGS_EMPTY0(...)                                                                       \
    zd_rpc_args_array((const zd_rpc_arg_t[]){ZD__MAP(ZD__ARG, __VA_ARGS__)}, ZD__NARG(__VA_ARGS__))
#define ZD__UNPACK_0(args) zd_rpc_unpack_array((args), NULL, 0)
#define ZD__UNPACK_1(args, ...)                                                                    \
    zd_rpc_unpack_array((args), (const zd_rpc_out_t[]){ZD__MAP(ZD__OUT, __VA_ARGS__)},             \
                        ZD__NARG(__VA_ARGS__))

/*  A type ZD_ARGS or ZD_UNPACK does not take selects one of these objects,
    declared and never defined: calling it fails to compile, and the
    compiler's message names it, and so what the macro takes. */
extern const struct ZD_ARGS_takes_integers_floats_strings_tensors_rrefs_or_values
    ZD_ARGS_takes_integers_floats_strings_tensors_rrefs_or_values;
extern const struct ZD_UNPACK_takes_int64_t_double_const_char_tensor_rref_or_value_pointers
    ZD_UNPACK_takes_int64_t_double_const_char_tensor_rref_or_value_pointers;

#define ZD__ARG(x)                                                                                 \
    _Generic((x),                                                                                  \
        _Bool: zd__arg_int, char: zd__arg_int, signed char: zd__arg_int,                           \
        unsigned char: zd__arg_int, short: zd__arg_int, unsigned short: zd__arg_int,               \
        int: zd__arg_int, unsigned int: zd__arg_int, long: zd__arg_int, long long: zd__arg_int,    \
        unsigned long: zd__arg_uint, unsigned long long: zd__arg_uint,                             \
        float: zd__arg_float, double: zd__arg_float, long double: zd__arg_long_double,             \
        char *: zd__arg_string, const char *: zd__arg_string,                                      \
        zd_tensor_t *: zd__arg_tensor, zd_rref_t *: zd__arg_rref, zd_value_t *: zd__arg_value,     \
        default: ZD_ARGS_takes_integers_floats_strings_tensors_rrefs_or_values)(x)

#define ZD__OUT(p)                                                                                 \
    _Generic((p),                                                                                  \
        int64_t *: zd__out_int, double *: zd__out_float, const char **: zd__out_string,            \
        zd_tensor_t **: zd__out_tensor, zd_rref_t **: zd__out_rref, zd_value_t **: zd__out_value,  \
        default: ZD_UNPACK_takes_int64_t_double_const_char_tensor_rref_or_value_pointers)(p)

#define ZD__ARG_FN(name, type, k, member)                                                          \
    static inline zd_rpc_arg_t name(type v)                                                        \
    {                                                                                              \
        zd_rpc_arg_t a = {k, {.member = v}};                                                       \
        return a;                                                                                  \
    }
#define ZD__OUT_FN(name, type, k)                                                                  \
    static inline zd_rpc_out_t name(type *p)                                                       \
    {                                                                                              \
        zd_rpc_out_t o = {k, p};                                                                   \
        return o;                                                                                  \
    }
ZD__ARG_FN(zd__arg_int, int64_t, 'i', i)
ZD__ARG_FN(zd__arg_uint, uint64_t, 'u', u)
ZD__ARG_FN(zd__arg_float, double, 'f', f)
ZD__ARG_FN(zd__arg_string, const char *, 's', s)
ZD__ARG_FN(zd__arg_tensor, zd_tensor_t *, 't', t)
ZD__ARG_FN(zd__arg_rref, zd_rref_t *, 'r', r)
ZD__ARG_FN(zd__arg_value, zd_value_t *, 'v', v)
static inline zd_rpc_arg_t zd__arg_long_double(long double v)
{
    return zd__arg_float((double)v);
}
ZD__OUT_FN(zd__out_int, int64_t, 'i')
ZD__OUT_FN(zd__out_float, double, 'f')
ZD__OUT_FN(zd__out_string, const char *, 's')
ZD__OUT_FN(zd__out_tensor, zd_tensor_t *, 't')
ZD__OUT_FN(zd__out_rref, zd_rref_t *, 'r')
ZD__OUT_FN(zd__out_value, zd_value_t *, 'v')

/*  Counting and mapping macro arguments (up to 24), and telling an empty
    argument list apart (Jens Gustedt's ISEMPTY, plain C99). */
#define ZD__CAT(a, b)   ZD__CAT_(a, b)
#define ZD__CAT_(a, b)  a##b
#define ZD__MAP(f, ...) ZD__CAT(ZD__MAP, ZD__NARG(__VA_ARGS__))(f, __VA_ARGS__)
#define ZD__NTH(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18,   \
                _19, _20, _21, _22, _23, _24, _25, N, ...)                                         \
    N
#define ZD__NARG(...)                                                                              \
    ZD__NTH(__VA_ARGS__, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7,  \
            6, 5, 4, 3, 2, 1, 0)
#define ZD__HAS_COMMA(...)                                                                         \
    ZD__NTH(__VA_ARGS__, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,   \
            0, 0)
#define ZD__TRIGGER(...) ,
#define ZD__ISEMPTY(...)                                                                           \
    ZD__ISEMPTY_(ZD__HAS_COMMA(__VA_ARGS__), ZD__HAS_COMMA(ZD__TRIGGER __VA_ARGS__),               \
                 ZD__HAS_COMMA(__VA_ARGS__()), ZD__HAS_COMMA(ZD__TRIGGER __VA_ARGS__()))
#define ZD__ISEMPTY_(a, b, c, d) ZD__HAS_COMMA(ZD__CAT5(ZD__EMPTY_CASE_, a, b, c, d))
#define ZD__CAT5(a, b, c, d, e)  a##b##c##d##e
#define ZD__EMPTY_CASE_0001      ,
#define ZD__MAP1(f, x)           f(x)
#define ZD__MAP2(f, x, ...)      f(x), ZD__MAP1(f, __VA_ARGS__)
#define ZD__MAP3(f, x, ...)      f(x), ZD__MAP2(f, __VA_ARGS__)
#define ZD__MAP4(f, x, ...)      f(x), ZD__MAP3(f, __VA_ARGS__)
#define ZD__MAP5(f, x, ...)      f(x), ZD__MAP4(f, __VA_ARGS__)
#define ZD__MAP6(f, x, ...)      f(x), ZD__MAP5(f, __VA_ARGS__)
#define ZD__MAP7(f, x, ...)      f(x), ZD__MAP6(f, __VA_ARGS__)
#define ZD__MAP8(f, x, ...)      f(x), ZD__MAP7(f, __VA_ARGS__)
#define ZD__MAP9(f, x, ...)      f(x), ZD__MAP8(f, __VA_ARGS__)
#define ZD__MAP10(f, x, ...)     f(x), ZD__MAP9(f, __VA_ARGS__)
#define ZD__MAP11(f, x, ...)     f(x), ZD__MAP10(f, __VA_ARGS__)
#define ZD__MAP12(f, x, ...)     f(x), ZD__MAP11(f, __VA_ARGS__)
#define ZD__MAP13(f, x, ...)     f(x), ZD__MAP12(f, __VA_ARGS__)
#define ZD__MAP14(f, x, ...)     f(x), ZD__MAP13(f, __VA_ARGS__)
#define ZD__MAP15(f, x, ...)     f(x), ZD__MAP14(f, __VA_ARGS__)
#define ZD__MAP16(f, x, ...)     f(x), ZD__MAP15(f, __VA_ARGS__)
#define ZD__MAP17(f, x, ...)     f(x), ZD__MAP16(f, __VA_ARGS__)
#define ZD__MAP18(f, x, ...)     f(x), ZD__MAP17(f, __VA_ARGS__)
#define ZD__MAP19(f, x, ...)     f(x), ZD__MAP18(f, __VA_ARGS__)
#define ZD__MAP20(f, x, ...)     f(x), ZD__MAP19(f, __VA_ARGS__)
#define ZD__MAP21(f, x, ...)     f(x), ZD__MAP20(f, __VA_ARGS__)
#define ZD__MAP22(f, x, ...)     f(x), ZD__MAP21(f, __VA_ARGS__)
#define ZD__MAP23(f, x, ...)     f(x), ZD__MAP22(f, __VA_ARGS__)
#define ZD__MAP24(f, x, ...)     f(x), ZD__MAP23(f, __VA_ARGS__)

#endif /* !__cplusplus */

/*  zd_value_ref takes one more reference and returns v (the new reference);
    zd_value_unref drops one. Both NULL-safe. */
ZD_API zd_value_t *zd_value_ref(zd_value_t *v);
ZD_API void zd_value_unref(zd_value_t *v);

/*  v's kind, and a kind's name ("tensor"; static). */
ZD_API zd_value_kind_t zd_value_kind(const zd_value_t *v);
ZD_API const char *zd_value_kind_name(zd_value_kind_t kind);

/*  Accessors; each returns 0 and fills *out, or -1 with a clear error when
    v is of another kind ("expected tensor, got string"). Borrowed results:
    valid while v is alive. */
ZD_API int zd_value_get_int(const zd_value_t *v, int64_t *out);
ZD_API int zd_value_get_float(const zd_value_t *v, double *out); /* ints convert */
ZD_API int zd_value_get_string(const zd_value_t *v, const char **out);
ZD_API int zd_value_get_bytes(const zd_value_t *v, const void **data, size_t *len);
ZD_API int zd_value_get_tensor(const zd_value_t *v, zd_tensor_t **out);
ZD_API int zd_value_get_rref(const zd_value_t *v, zd_rref_t **out);

/*  The object, checked to be of `type` (compared as strings; NULL accepts
    any type): "expected a DataWorker object, got int", "expected a
    DataWorker object; this object is a ParameterServer". *out is
    borrowed: valid while v lives. */
ZD_API int zd_value_get_object(const zd_value_t *v, const char *type, void **out);

/*  The type name of an object value (borrowed: valid while v lives); NULL
    for other kinds. */
ZD_API const char *zd_value_object_type(const zd_value_t *v);

/*  List access: length (0 for a non-list) and item i (borrowed, NULL when out
    of range). */
ZD_API size_t zd_list_len(const zd_value_t *v);
ZD_API zd_value_t *zd_list_get(const zd_value_t *v, size_t i);

/*  Typed access to list item i, for handlers unpacking their arguments
    (ZD_UNPACK's function form): 0 and *out, borrowed from args (valid
    while args lives), or -1 with "argument i: expected tensor, got int"
    style errors. */
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
    ParameterServer@0x..]. Returns buf (borrowed: the caller's own buffer). */
ZD_API char *zd_value_format(const zd_value_t *v, char *buf, size_t size);

ZD_END_DECLS

#endif
