/* SPDX-License-Identifier: MIT */
/*  What every public header shares: ZD_API marks the functions the library
    exports (everything else is hidden: the library is built with
    -fvisibility=hidden), and ZD_BEGIN_DECLS / ZD_END_DECLS give the
    declarations C linkage when a C++ program includes them. */
#ifndef ZDIST_EXPORT_H
#define ZDIST_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define ZD_API __attribute__((visibility("default")))
#else
#define ZD_API
#endif

#ifdef __cplusplus
#define ZD_BEGIN_DECLS extern "C" {
#define ZD_END_DECLS   }
#else
#define ZD_BEGIN_DECLS
#define ZD_END_DECLS
#endif

#endif
