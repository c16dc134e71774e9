#include <zdist/error.h>

#include <stdio.h>
#include <string.h>

#define ERROR_MAX 1024

static _Thread_local char last_error[ERROR_MAX];

int zd_error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
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
    if (n >= 0 && (size_t)n < sizeof last_error && prev[0])
        snprintf(last_error + n, sizeof last_error - (size_t)n, ": %s", prev);
    return -1;
}

const char *zd_error_last(void)
{
    return last_error;
}

void zd_error_clear(void)
{
    last_error[0] = '\0';
}
