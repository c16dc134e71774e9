/* SPDX-License-Identifier: MIT */
/*  dataset_cache.c: the per-host cache of decompressed data sets.

    Every process of a world used to gunzip Fashion-MNIST itself (half a
    second of CPU each, and 47 MB of private memory). Instead the first
    process on a host decompresses a gzip IDX file once into the cache
    directory, and every process reads that file in place: mapped read-only
    (shared pages) and read with pread, so the data set lives once in the
    page cache instead of once per process.

    A cache file is named after the source path and its identity (device,
    inode, size, modification time), so a changed source gets a new file
    and the old one is removed. It holds a 4096-byte header (magic, that
    identity, the payload's length and CRC-32) followed by the decompressed
    IDX bytes. A file that does not match its source, is short, or fails
    its CRC is rebuilt. Builders hold an flock on a lock file beside it, so
    that processes starting together wait for one decompression instead of
    each doing it; the file appears by rename, whole, so a reader never
    sees a partial one. Only files owned by this user are trusted.

    The CRC is checked once per boot, not by every process: 65 processes
    starting together each spent 0.1-0.15 s of CPU on the same 55 MB in the
    page cache, seconds of a 2-core host. The first opener since boot checks
    it, under the lock, and marks the file with an extended attribute (the
    boot id, and the file's size and modification time, which a later write
    changes); a later opener that finds its boot's mark skips the check. A
    file system without user extended attributes gets the check every time,
    as does a file written in the last 2 s.

    When the directory cannot be used (not writable, no home), the caller
    decompresses in memory as before: the cache makes loading cheaper, never
    impossible. */
#include "data/dataset_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <zdist/error.h>
#include <zdist/idx.h>
#include "core/clock.h"
#include "core/log_private.h"

#define HEADER_BYTES 4096
#define CHUNK        (1u << 20)
#define IDX_MAX_DIMS 8
static const char magic[8] = {'Z', 'D', 'C', 'A', 'C', 'H', 'E', '1'};

typedef struct {
    char magic[8];
    uint64_t dev, ino, size, mtime_s, mtime_ns;
    uint64_t payload_bytes;
    uint32_t payload_crc;
    uint32_t path_len;
    char path[HEADER_BYTES - 8 - 8 * 6 - 8];
} header_t;

_Static_assert(sizeof(header_t) == HEADER_BYTES, "the cache header is one page");

void zd__dataset_cache_dir(char *buf, size_t size)
{
    const char *env = getenv("ZDIST_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n = -1;
    if (env && *env)
        n = strcmp(env, "off") == 0 ? snprintf(buf, size, "%s", "")
                                    : snprintf(buf, size, "%s", env);
    else if (xdg && *xdg == '/')
        n = snprintf(buf, size, "%s/zdist", xdg);
    else if (home && *home == '/')
        n = snprintf(buf, size, "%s/.cache/zdist", home);
    if (n < 0 || (size_t)n >= size)
        buf[0] = '\0';
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

bool zd__pread_full(int fd, void *buf, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static bool write_full(int fd, const void *buf, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = write(fd, (const char *)buf + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        done += (size_t)r;
    }
    return true;
}

/*  Parses the IDX header at off in fd, whose length is total: a uint8 file
    whose dimensions account for every byte. */
static bool parse_idx(int fd, off_t off, uint64_t total, zd__idx_view_t *v)
{
    unsigned char head[4 + 4 * IDX_MAX_DIMS];
    if (total < 4 || !zd__pread_full(fd, head, 4, off))
        return false;
    if (head[0] != 0 || head[1] != 0 || head[2] != ZD_IDX_TYPE_U8 || head[3] < 1 ||
        head[3] > IDX_MAX_DIMS)
        return false;
    int ndim = head[3];
    uint64_t hbytes = 4 + 4 * (uint64_t)ndim;
    if (total < hbytes || !zd__pread_full(fd, head + 4, 4 * (size_t)ndim, off + 4))
        return false;
    uint64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        const unsigned char *p = head + 4 + 4 * i;
        uint64_t d = (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 | p[3];
        if (d != 0 && count > (uint64_t)INT64_MAX / 16 / d)
            return false;
        count *= d;
        v->dims[i] = (int64_t)d;
    }
    if (count != total - hbytes)
        return false;
    v->ndim = ndim;
    v->data_off = (int64_t)off + (int64_t)hbytes;
    v->data_bytes = (size_t)count;
    return true;
}

static bool map_view(int fd, uint64_t len, zd__idx_view_t *v)
{
    void *m = mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return false;
    v->fd = fd;
    v->map = m;
    v->map_len = (size_t)len;
    return true;
}

void zd__idx_view_close(zd__idx_view_t *v)
{
    if (v->map)
        munmap(v->map, v->map_len);
    if (v->fd >= 0)
        close(v->fd);
    v->map = NULL;
    v->fd = -1;
}

/*  What a cache file must say about its source. */
static void identity(const struct stat *st, const char *path, header_t *h)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, magic, sizeof magic);
    h->dev = (uint64_t)st->st_dev;
    h->ino = (uint64_t)st->st_ino;
    h->size = (uint64_t)st->st_size;
    h->mtime_s = (uint64_t)st->st_mtim.tv_sec;
    h->mtime_ns = (uint64_t)st->st_mtim.tv_nsec;
    h->path_len = (uint32_t)strlen(path);
    memcpy(h->path, path, h->path_len);
}

/*  The CRC-32 of fd's bytes from off to its end (len bytes), read through
    a small buffer: a check that maps nothing keeps this process's
    resident memory small. */
static bool crc_of(int fd, off_t off, uint64_t len, uint32_t *crc)
{
    unsigned char *buf = malloc(CHUNK);
    uLong c = crc32(0, NULL, 0);
    bool ok = buf != NULL;
    for (uint64_t at = 0; ok && at < len;) {
        size_t n = len - at < CHUNK ? (size_t)(len - at) : CHUNK;
        ok = zd__pread_full(fd, buf, n, off + (off_t)at);
        if (ok)
            c = crc32(c, buf, (uInt)n);
        at += n;
    }
    free(buf);
    *crc = (uint32_t)c;
    return ok;
}

#define MARK_XATTR "user.zdist.verified"

/*  The mark of a file whose CRC was checked since this boot: the boot id
    (36 characters, with Linux's newline) and st's size and modification
    time. false when the boot id cannot be read (then nothing is marked). */
static bool verified_mark(const struct stat *st, char *mark, size_t size)
{
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    bool ok = f && fgets(boot, sizeof boot, f) && strlen(boot) >= 32;
    if (f)
        fclose(f);
    if (!ok)
        return false;
    boot[strcspn(boot, "\n")] = '\0';
    int n = snprintf(mark, size, "%s %lld %lld.%09ld", boot, (long long)st->st_size,
                     (long long)st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
    return n > 0 && (size_t)n < size;
}

/*  Whether fd carries this boot's mark for its present size and time. */
static bool verified_this_boot(int fd, const struct stat *st)
{
    char want[128], have[128];
    if (!verified_mark(st, want, sizeof want))
        return false;
    ssize_t n = fgetxattr(fd, MARK_XATTR, have, sizeof have - 1);
    if (n < 0)
        return false;
    have[n] = '\0';
    return strcmp(have, want) == 0;
}

/*  Opens the cache file at cpath when it is a good copy of the source
    (identity `want`): 0 with *v open, 1 otherwise (why, in *why). Unless
    check_crc, a file not yet marked verified this boot is not good either
    (the caller takes the lock and asks again with check_crc). */
static int open_cached(const char *cpath, const header_t *want, bool check_crc, zd__idx_view_t *v,
                       const char **why)
{
    int fd = open(cpath, O_RDONLY | O_CLOEXEC);
    struct stat st;
    header_t *h = NULL;
    *why = "absent";
    if (fd < 0)
        return 1;
    *why = "not a regular file of this user, or shorter than its header";
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (uint64_t)st.st_size < HEADER_BYTES)
        goto bad;
    h = malloc(sizeof *h);
    *why = "unreadable header";
    if (!h || !zd__pread_full(fd, h, sizeof *h, 0))
        goto bad;
    *why = "made from another version of the source";
    if (memcmp(h->magic, want->magic, sizeof magic) != 0 || h->dev != want->dev ||
        h->ino != want->ino || h->size != want->size || h->mtime_s != want->mtime_s ||
        h->mtime_ns != want->mtime_ns || h->path_len != want->path_len ||
        memcmp(h->path, want->path, want->path_len) != 0)
        goto bad;
    *why = "truncated or overlong";
    if (h->payload_bytes != (uint64_t)st.st_size - HEADER_BYTES)
        goto bad;
    if (!verified_this_boot(fd, &st)) {
        uint32_t crc;
        *why = "not yet checked since boot";
        if (!check_crc)
            goto bad;
        *why = "corrupt (CRC-32 mismatch)";
        if (!crc_of(fd, HEADER_BYTES, h->payload_bytes, &crc) || crc != h->payload_crc)
            goto bad;
        /* Only a file last written 2 s ago or more: a write within the
           same tick of the file system's coarse clock would leave the
           modification time, and so the mark, as they were. A refusal
           (no user xattrs) costs a check at the next open. */
        char mark[128];
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if (now.tv_sec - st.st_mtim.tv_sec >= 2 && verified_mark(&st, mark, sizeof mark))
            (void)fsetxattr(fd, MARK_XATTR, mark, strlen(mark), 0);
    }
    *why = "not a uint8 IDX file";
    if (!parse_idx(fd, HEADER_BYTES, h->payload_bytes, v))
        goto bad;
    *why = "cannot be mapped";
    if (!map_view(fd, (uint64_t)st.st_size, v))
        goto bad;
    free(h);
    return 0;
bad:
    free(h);
    close(fd);
    return 1;
}

static int mkdir_p(const char *dir)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return -1;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0700) < 0 && errno != EEXIST)
            return -1;
        *s = '/';
    }
    if (mkdir(p, 0700) < 0 && errno != EEXIST)
        return -1;
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

/*  Decompresses the source (open at src) into a temporary file of dir and
    renames it to cpath. false when the source is not good gzip data or
    the directory refuses the file (why says which). */
static bool build(int src, const char *dir, const char *cpath, header_t *h, const char **why)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/.build.XXXXXX", dir);
    int out = mkstemp(tmp);
    *why = "cannot create a file there";
    if (out < 0)
        return false;
    int in = dup(src);
    gzFile gz = in >= 0 ? gzdopen(in, "rb") : NULL;
    unsigned char *buf = malloc(CHUNK);
    bool ok = gz && buf && lseek(in, 0, SEEK_SET) == 0;
    if (!gz && in >= 0)
        close(in);
    if (ok)
        gzbuffer(gz, 1 << 17);
    /* the header last, once the payload's length and CRC are known */
    static const unsigned char zeros[HEADER_BYTES];
    *why = gz && buf ? "cannot write there" : "out of memory";
    ok = ok && write_full(out, zeros, sizeof zeros);
    uLong crc = crc32(0, NULL, 0);
    uint64_t total = 0;
    while (ok) {
        int r = gzread(gz, buf, CHUNK);
        if (r < 0) {
            *why = "the source is not good gzip data";
            ok = false;
            break;
        }
        if (r == 0)
            break;
        crc = crc32(crc, buf, (uInt)r);
        total += (uint64_t)r;
        ok = write_full(out, buf, (size_t)r);
    }
    if (ok) {
        int err = Z_OK;
        gzerror(gz, &err);
        if (err != Z_OK && err != Z_STREAM_END) {
            *why = "the source is not good gzip data";
            ok = false;
        }
    }
    if (gz)
        gzclose(gz);
    free(buf);
    h->payload_bytes = total;
    h->payload_crc = (uint32_t)crc;
    zd__idx_view_t probe = {.fd = -1};
    if (ok && !parse_idx(out, HEADER_BYTES, total, &probe)) {
        *why = "the source is not a uint8 IDX file";
        ok = false;
    }
    if (ok && (pwrite(out, h, sizeof *h, 0) != (ssize_t)sizeof *h || fchmod(out, 0644) < 0)) {
        *why = "cannot write there";
        ok = false;
    }
    if (close(out) < 0)
        ok = false;
    if (ok && rename(tmp, cpath) < 0) {
        *why = "cannot rename into place there";
        ok = false;
    }
    if (!ok)
        unlink(tmp);
    return ok;
}

/*  Whether the cache file at p was made from a source that is gone. */
static bool orphan(const char *p)
{
    header_t *h = malloc(sizeof *h);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    bool gone = false;
    if (h && fd >= 0 && zd__pread_full(fd, h, sizeof *h, 0) &&
        memcmp(h->magic, magic, sizeof magic) == 0 && h->path_len < sizeof h->path) {
        h->path[h->path_len] = '\0';
        struct stat st;
        gone = stat(h->path, &st) < 0 && errno == ENOENT;
    }
    if (fd >= 0)
        close(fd);
    free(h);
    return gone;
}

/*  Removes the cache files of older versions of the same source (same
    path hash, the name's first half; another identity) and those whose
    source is gone, so that the cache holds no more than the sources do. */
static void prune(const char *dir, const char *prefix, const char *keep)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    size_t plen = strlen(prefix), len;
    while ((e = readdir(d))) {
        char p[4400];
        if (strcmp(e->d_name, keep) == 0 || (len = strlen(e->d_name)) < 5 ||
            strcmp(e->d_name + len - 4, ".idx") != 0 ||
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p)
            continue;
        if (strncmp(e->d_name, prefix, plen) == 0 || orphan(p))
            unlink(p);
    }
    closedir(d);
}

static void say_unused(const char *dir, const char *why)
{
    static _Atomic bool said;
    if (!said) {
        said = true;
        zd__log(ZD_LOG_WARN,
                "dataset: the cache directory %s cannot be used (%s): "
                "decompressing in this process's memory (set ZDIST_CACHE_DIR to a "
                "writable directory)",
                dir, why);
    }
}

static int open_gzip(int src, const struct stat *st, const char *path, zd__idx_view_t *v)
{
    char dir[4096], abs[4096];
    zd__dataset_cache_dir(dir, sizeof dir);
    if (!dir[0] || !realpath(path, abs) || strlen(abs) >= sizeof((header_t *)0)->path)
        return 1;
    header_t *h = malloc(sizeof *h);
    if (!h)
        return 1;
    identity(st, abs, h);
    uint64_t ph = fnv1a(0xcbf29ce484222325ull, abs, strlen(abs));
    uint64_t kh = fnv1a(ph, &h->dev, 5 * sizeof h->dev);
    char name[64], prefix[32], cpath[4400], lpath[4400];
    snprintf(prefix, sizeof prefix, "%016llx-", (unsigned long long)ph);
    snprintf(name, sizeof name, "%s%016llx.idx", prefix, (unsigned long long)kh);
    snprintf(cpath, sizeof cpath, "%s/%s", dir, name);
    snprintf(lpath, sizeof lpath, "%s/.%016llx.lock", dir, (unsigned long long)ph);
    const char *why;
    int rc = open_cached(cpath, h, false, v, &why);
    if (rc == 0) {
        free(h);
        return 0;
    }
    if (mkdir_p(dir) < 0) {
        say_unused(dir, strerror(errno));
        free(h);
        return 1;
    }
    /* One builder at a time; the others wait, then find its file. Without
       the lock (say, a file system that refuses flock) each builds its own
       copy, and the renames still leave one whole file. */
    int lock = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock >= 0) {
        while (flock(lock, LOCK_EX) < 0 && errno == EINTR)
            ;
    }
    rc = open_cached(cpath, h, true, v, &why);
    if (rc != 0) {
        const char *was = why;
        int64_t t0 = zd__now_ns();
        if (build(src, dir, cpath, h, &why)) {
            double took_s = (double)(zd__now_ns() - t0) / (double)ZD__NS_PER_S;
            zd__log(ZD_LOG_INFO,
                    "dataset: decompressed %s into the cache %s (%.2f s; the "
                    "cached copy was %s)",
                    abs, cpath, took_s, was);
            prune(dir, prefix, name);
            rc = open_cached(cpath, h, true, v, &why);
        } else if (strstr(why, "source") == NULL) {
            say_unused(dir, why);
        }
    }
    if (lock >= 0)
        close(lock); /* releases the flock */
    free(h);
    return rc;
}

int zd__idx_view_open(const char *path, zd__idx_view_t *v)
{
    memset(v, 0, sizeof *v);
    v->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    unsigned char head[2];
    if (fd < 0)
        return 1;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || !zd__pread_full(fd, head, 2, 0)) {
        close(fd);
        return 1;
    }
    int rc = 1;
    if (head[0] == 0x1f && head[1] == 0x8b) {
        rc = open_gzip(fd, &st, path, v);
        close(fd);
    } else if (parse_idx(fd, 0, (uint64_t)st.st_size, v) && map_view(fd, (uint64_t)st.st_size, v)) {
        rc = 0; /* a plain file is read in place: it is its own cache */
    } else {
        close(fd);
    }
    if (rc != 0) {
        memset(v, 0, sizeof *v);
        v->fd = -1;
    }
    return rc;
}
