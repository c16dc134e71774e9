/* SPDX-License-Identifier: MIT */
/*  files.c: see files.h. */
#include "data/files.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>

void zd__shape_str(const int64_t *shape, int ndim, char *buf, size_t size)
{
    size_t off = (size_t)snprintf(buf, size, "(");
    for (int i = 0; i < ndim && off < size; i++)
        off +=
            (size_t)snprintf(buf + off, size - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < size)
        snprintf(buf + off, size - off, ")");
}

/*  Makes the rename itself durable; best effort (some file systems refuse
    fsync on directories). */
static void sync_parent(const char *path)
{
    char copy[4096]; /* path fit in the temporary file's name */
    if ((size_t)snprintf(copy, sizeof copy, "%s", path) >= sizeof copy)
        return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

int zd__file_replace(const char *format, const char *path, zd__file_write_fn *write, void *arg)
{
    /* The process id and a counter keep two writers of one path (threads
       or processes) off each other's temporary. */
    static atomic_uint counter;
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
                         atomic_fetch_add(&counter, 1)) >= sizeof tmp)
        return zd_error_set("%s: %s: path too long", format, path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return zd_error_set("%s: %s: cannot create %s: %s", format, path, tmp, strerror(errno));
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return zd_error_set("%s: %s: %s", format, path, strerror(e));
    }
    int rc = write(f, arg);
    int e = 0;
    if (rc == 0 && fflush(f) != 0)
        e = errno;
    if (rc == 0 && !e && fsync(fileno(f)) != 0)
        e = errno;
    if (fclose(f) != 0 && rc == 0 && !e)
        e = errno;
    if (rc == 0 && !e && rename(tmp, path) != 0)
        e = errno;
    if (rc < 0 || e) {
        unlink(tmp);
        return rc < 0 ? -1 : zd_error_set("%s: %s: cannot write: %s", format, path, strerror(e));
    }
    sync_parent(path);
    return 0;
}
