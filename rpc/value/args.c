/* SPDX-License-Identifier: MIT */
/*  args.c: typed argument lists (ZD_ARGS, ZD_UNPACK) and the calls that
    take their argument list over (the _take variants of rpc.h), so that a
    list can be built inline in the call without leaking. */
#include <zdist/error.h>
#include <zdist/rpc.h>
#include <zdist/value.h>
#include "rpc/value/args.h"

#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

/*  ---- building ---- */

static zd_value_t *arg_value(const zd_rpc_arg_t *a)
{
    switch (a->kind) {
    case 'i':
        return zd_value_int(a->u.i);
    case 'u':
        if (a->u.u > (uint64_t)INT64_MAX) {
            zd_error_set("%llu does not fit an int value (int64)", (unsigned long long)a->u.u);
            return NULL;
        }
        return zd_value_int((int64_t)a->u.u);
    case 'f':
        return zd_value_float(a->u.f);
    case 's':
        return zd_value_string(a->u.s);
    case 't':
        return zd_value_tensor(a->u.t);
    case 'r':
        return zd_value_rref(a->u.r);
    case 'v':
        /* NULL: most likely a constructor or a nested ZD_ARGS that failed,
           whose reason is kept. */
        if (!a->u.v)
            zd_error_wrap("NULL value");
        return a->u.v;
    }
    zd_error_set("unknown item kind '%c'", a->kind);
    return NULL;
}

zd_value_t *zd_rpc_args_array(const zd_rpc_arg_t *items, size_t n)
{
    if (n && !items) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "ZD_ARGS: NULL items");
        return NULL;
    }
    zd_value_t *list = zd_value_list(n);
    size_t i = 0;
    if (!list)
        zd_error_wrap("ZD_ARGS");
    for (; list && i < n; i++) {
        zd_value_t *v = arg_value(&items[i]);
        if (!v || zd_list_append(list, v) < 0) { /* append released v */
            zd_error_wrap("ZD_ARGS: argument %zu", i);
            zd_value_unref(list);
            list = NULL;
        }
    }
    /* The taken-over values not reached are released all the same, so that
       the caller never has to know how far it went. */
    for (; i < n; i++)
        if (items[i].kind == 'v')
            zd_value_unref(items[i].u.v);
    return list;
}

/*  ---- unpacking ---- */

static int out_fill(const zd_value_t *args, size_t i, const zd_rpc_out_t *o)
{
    if (!o->out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "argument %zu: NULL output pointer", i);
    switch (o->kind) {
    case 'i':
        return zd_rpc_arg_int(args, i, o->out);
    case 'f':
        return zd_rpc_arg_float(args, i, o->out);
    case 's':
        return zd_rpc_arg_string(args, i, o->out);
    case 't':
        return zd_rpc_arg_tensor(args, i, o->out);
    case 'r':
        return zd_rpc_arg_rref(args, i, o->out);
    case 'v':
        *(zd_value_t **)o->out = zd_list_get(args, i);
        return 0;
    }
    return zd_error_set("argument %zu: unknown output kind '%c'", i, o->kind);
}

static int arity(const zd_value_t *args, size_t n)
{
    if (!args || zd_value_kind(args) != ZD_VALUE_LIST)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "arguments: expected list, got %s",
                                 args ? zd_value_kind_name(zd_value_kind(args)) : "NULL");
    size_t got = zd_list_len(args);
    if (got != n)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected %zu argument%s, got %zu", n,
                                 n == 1 ? "" : "s", got);
    return 0;
}

int zd_rpc_unpack_array(const zd_value_t *args, const zd_rpc_out_t *outs, size_t n)
{
    if (arity(args, n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (out_fill(args, i, &outs[i]) < 0)
            return -1;
    return 0;
}

int zd__rpc_unpack(const zd_value_t *args, const char *spec, ...)
{
    if (!spec)
        return zd_error_set("zd__rpc_unpack: NULL spec");
    size_t n = strlen(spec);
    for (size_t i = 0; i < n; i++)
        if (!strchr("ifstrv", spec[i]))
            return zd_error_set("zd__rpc_unpack: unknown letter '%c' in spec \"%s\"", spec[i],
                                spec);
    if (arity(args, n) < 0)
        return -1;
    va_list ap;
    va_start(ap, spec);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        zd_rpc_out_t o = {spec[i], va_arg(ap, void *)};
        rc = out_fill(args, i, &o);
    }
    va_end(ap);
    return rc;
}

/*  ---- calls taking their arguments over ---- */

/*  args NULL: the ZD_ARGS (or zd__rpc_args) that made it failed and said
    why; say which call it was for. */
static int no_args(const char *api, const char *fn)
{
    if (!zd_error_last()[0])
        zd_error_set_code(ZD_ERR_ARGUMENT, "NULL argument list (ZD_ARGS() is the empty one)");
    return zd_error_wrap("%s calling \"%s\"", api, fn ? fn : "(null)");
}

int zd_rpc_sync_take(int to, const char *fn, zd_value_t *args, int64_t timeout_ms,
                     zd_value_t **result)
{
    if (!args) {
        if (result)
            *result = NULL;
        return no_args("zd_rpc_sync", fn);
    }
    int rc = zd_rpc_sync(to, fn, args, timeout_ms, result);
    zd_value_unref(args);
    return rc;
}

zd_future_t *zd_rpc_async_take(int to, const char *fn, zd_value_t *args, int64_t timeout_ms)
{
    if (!args) {
        no_args("zd_rpc_async", fn);
        return NULL;
    }
    zd_future_t *f = zd_rpc_async(to, fn, args, timeout_ms);
    zd_value_unref(args);
    return f;
}

zd_rref_t *zd_rpc_remote_take(int to, const char *fn, zd_value_t *args, int64_t timeout_ms)
{
    if (!args) {
        no_args("zd_rpc_remote", fn);
        return NULL;
    }
    zd_rref_t *r = zd_rpc_remote(to, fn, args, timeout_ms);
    zd_value_unref(args);
    return r;
}

int zd_rref_rpc_sync_take(zd_rref_t *r, const char *method, zd_value_t *args, int64_t timeout_ms,
                          zd_value_t **result)
{
    if (!args) {
        if (result)
            *result = NULL;
        return no_args("rref.rpc_sync", method);
    }
    int rc = zd_rref_rpc_sync(r, method, args, timeout_ms, result);
    zd_value_unref(args);
    return rc;
}

zd_future_t *zd_rref_rpc_async_take(zd_rref_t *r, const char *method, zd_value_t *args,
                                    int64_t timeout_ms)
{
    if (!args) {
        no_args("rref.rpc_async", method);
        return NULL;
    }
    zd_future_t *f = zd_rref_rpc_async(r, method, args, timeout_ms);
    zd_value_unref(args);
    return f;
}

zd_rref_t *zd_rref_remote_take(zd_rref_t *r, const char *method, zd_value_t *args,
                               int64_t timeout_ms)
{
    if (!args) {
        no_args("rref.remote", method);
        return NULL;
    }
    zd_rref_t *out = zd_rref_remote(r, method, args, timeout_ms);
    zd_value_unref(args);
    return out;
}
