/* SPDX-License-Identifier: MIT */
/*  zd_version(): the version this library was built as. */
#include <zdist/version.h>

#define ZD_STR_(x) #x
#define ZD_STR(x)  ZD_STR_(x)

const char *zd_version(void)
{
    return ZD_STR(ZD_VERSION_MAJOR) "." ZD_STR(ZD_VERSION_MINOR) "." ZD_STR(ZD_VERSION_PATCH);
}
