/* SPDX-License-Identifier: MIT */
/*  What ZD_ARGS and ZD_UNPACK refuse at compile time: ctest compiles this
    file once per CASE_... (tests/CMakeLists.txt) and expects the compiler
    to reject each case, naming the offending type; CASE_OK, with every
    type right, must compile. Never linked: only -fsyntax-only. */
#include <stdint.h>
#include <zdist/value.h>

int use(zd_value_t *args);

int use(zd_value_t *args)
{
#if defined(CASE_OK)
    int64_t i;
    double d;
    const char *s;
    zd_value_unref(ZD_ARGS(1, 2.0, "s", (unsigned char)3));
    return ZD_UNPACK(args, &i, &d, &s);
#elif defined(CASE_unpack_int)
    int i; /* ZD_UNPACK fills int64_t: an int would be half written */
    return ZD_UNPACK(args, &i);
#elif defined(CASE_unpack_long_long)
    long long i; /* the same size as int64_t, but another type */
    return ZD_UNPACK(args, &i);
#elif defined(CASE_unpack_char_ptr)
    char *s; /* strings are borrowed from args: const char * */
    return ZD_UNPACK(args, &s);
#elif defined(CASE_args_void_ptr)
    void *p = args; /* an untyped pointer: no way to know what it is */
    zd_value_unref(ZD_ARGS(p));
    return 0;
#elif defined(CASE_args_int_ptr)
    int n = 3;
    (void)args;
    zd_value_unref(ZD_ARGS(&n));
    return 0;
#else
#error "no CASE_ defined"
#endif
}
