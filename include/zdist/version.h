/* SPDX-License-Identifier: MIT */
/*  zdist's version. The numbers change with the release (CMake reads them
    from this file); zd_version() tells which library a program actually
    loaded, which may be newer than the headers it was compiled with. */
#ifndef ZDIST_VERSION_H
#define ZDIST_VERSION_H

#include <zdist/export.h>

#define ZD_VERSION_MAJOR                     1
#define ZD_VERSION_MINOR                     0
#define ZD_VERSION_PATCH                     0
#define ZD_MAKE_VERSION(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))
#define ZD_VERSION                           ZD_MAKE_VERSION(ZD_VERSION_MAJOR, ZD_VERSION_MINOR, ZD_VERSION_PATCH)

ZD_BEGIN_DECLS

/*  The loaded library's version as "MAJOR.MINOR.PATCH" (static storage). */
ZD_API const char *zd_version(void);

ZD_END_DECLS

#endif
