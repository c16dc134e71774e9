/* SPDX-License-Identifier: MIT */
#include <zdist/error.h>

#include <stdio.h>
#include <string.h>

#define ERROR_MAX 1024

static _Thread_local char last_error[ERROR_MAX];
static _Thread_local zd_error_code_t last_code;

/*  Formats into a copy first: callers pass zd_error_last() among the
    arguments ("...: %s", zd_error_last()), and vsnprintf must not read
    the buffer it writes. */
static void set_text(const char *fmt, va_list ap)
{
    char text[ERROR_MAX] = "";
    vsnprintf(text, sizeof text, fmt, ap);
    memcpy(last_error, text, strlen(text) + 1);
}

int zd_error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_text(fmt, ap);
    va_end(ap);
    last_code = ZD_ERR_OTHER;
    return -1;
}

int zd_error_set_code(zd_error_code_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_text(fmt, ap);
    va_end(ap);
    last_code = code == ZD_OK ? ZD_ERR_OTHER : code;
    return -1;
}

int zd_error_wrap(const char *fmt, ...)
{
    char prev[ERROR_MAX];
    memcpy(prev, last_error, sizeof prev);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    /* ": " and the previous text, cut to what is left (snprintf would do
       it too, but gcc warns of the truncation that is meant here). */
    if (n >= 0 && (size_t)n + 3 <= sizeof last_error && prev[0]) {
        char *p = last_error + n;
        size_t k = strnlen(prev, sizeof last_error - (size_t)n - 3);
        p[0] = ':';
        p[1] = ' ';
        memcpy(p + 2, prev, k);
        p[2 + k] = '\0';
    }
    if (last_code == ZD_OK)
        last_code = ZD_ERR_OTHER;
    return -1;
}

const char *zd_error_last(void)
{
    return last_error;
}

zd_error_code_t zd_error_code(void)
{
    return last_code;
}

const char *zd_error_code_name(zd_error_code_t code)
{
    switch (code) {
    case ZD_OK:
        return "ok";
    case ZD_ERR_OTHER:
        return "other";
    case ZD_ERR_TIMEOUT:
        return "timeout";
    case ZD_ERR_PEER:
        return "peer";
    case ZD_ERR_REMOTE:
        return "remote";
    case ZD_ERR_NO_FUNCTION:
        return "no function";
    case ZD_ERR_ARGUMENT:
        return "argument";
    case ZD_ERR_NOT_INITIALIZED:
        return "not initialized";
    case ZD_ERR_NO_MEMORY:
        return "no memory";
    case ZD_ERR_SHUTDOWN:
        return "shutdown";
    case ZD_ERR_STALE:
        return "stale";
    case ZD_ERR_STOPPED:
        return "stopped";
    }
    return "unknown";
}

void zd_error_clear(void)
{
    last_error[0] = '\0';
    last_code = ZD_OK;
}
