/* SPDX-License-Identifier: MIT */
/*  checkpoint.c: a shard's checkpoints, in generations (ps.h).

    A shard's checkpoint is one checkpoint.h file of named tensors:
    "ps.meta" (int64: format, shard, shards, version, and in format 2 the
    generation a remote model's stage numbered it), "param.<name>" for
    each tensor it serves, "optim.<entry>" for its optimizer's state and,
    for a shard that has them, "ps.positions" (int64, by rank: where each
    trainer was in its data at its last push taken, or training forward
    served, -1: none) and, for a synchronous one, "ps.trainers" (int64:
    the ranks it knew as trainers, live or lost).
    A generation is written whole to "<path>.new" (checkpoint.h writes a
    temporary file and renames it), then the current file becomes
    "<path>.prev" and the new one "<path>": a crash at any point leaves
    at least one whole generation among the three names. A resume reads
    every one of them there is and takes the newest generation it can read,
    naming the files it could not. */
#include "ps/ps_private.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/checkpoint.h>
#include <zdist/error.h>
#include <zdist/optim.h>
#include "core/log_private.h"

#define FORMAT     1 /* push/pull: the version is the generation's key */
#define FORMAT_GEN 2 /* a remote model's stage: the generation it was given */
#define META       "ps.meta"
#define POSITIONS  "ps.positions"
#define TRAINERS   "ps.trainers"
#define TAG        "ps.tag" /* uint8: the run's tag (zd_ps_options_t.run_tag) */
/*  No world has more ranks (rpc.h): a longer positions tensor is refused. */
#define MAX_POSITIONS 65536
#define PARAM         "param."
#define OPTIM         "optim."
#define N_SUFFIXES    3

/*  The names a generation may have, newest first when all are whole. */
static const char *const suffixes[N_SUFFIXES] = {"", ".new", ".prev"};

static int64_t *meta_of(zd_named_tensors_t *nt)
{
    zd_tensor_t *t = zd_named_tensors_find(nt, META);
    if (!t || zd_tensor_dtype(t) != ZD_INT64 || zd_tensor_ndim(t) != 1)
        return NULL;
    int64_t *m = zd_tensor_data_i64(t), n = zd_tensor_numel(t);
    /* (a generation far from INT64_MAX: the next one is one more) */
    return (n == 4 && m[0] == FORMAT) ||
            (n == 5 && m[0] == FORMAT_GEN && m[4] >= 0 && m[4] < INT64_MAX / 2)
        ? m
        : NULL;
}

/*  The key of a file of version v whose meta is m, as s counts them. */
static int64_t key_of(const zd__ps_ckpt_t *s, const int64_t *m, int64_t v)
{
    if (!s->by_gen)
        return v;
    /* a stage's own checkpoints are its intervals' whoever numbered the
       file (a run of checkpoint_every 0 before this one, or a build
       before generations were numbered) */
    if (s->every > 0)
        return v / s->every;
    return m[0] == FORMAT_GEN ? m[4] : v;
}

/*  Adds t under prefix + name. 0, or -1. */
static int add_prefixed(zd_named_tensors_t *nt, const char *prefix, const char *name,
                        zd_tensor_t *t)
{
    char full[ZD_CHECKPOINT_MAX_NAME + 1];
    if (snprintf(full, sizeof full, "%s%s", prefix, name) >= (int)sizeof full)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: the name \"%s\" is too long", name);
    return zd_named_tensors_add(nt, full, t);
}

static zd_named_tensors_t *snapshot(const zd__ps_ckpt_t *s, int64_t version)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    zd_named_tensors_t *state = s->opt ? zd_optim_state_export(s->opt) : zd_named_tensors_new();
    zd_tensor_t *meta = zd_tensor_empty(ZD_INT64, (int64_t[]){s->by_gen ? 5 : 4}, 1);
    int rc = nt && state && meta ? 0 : -1;
    if (rc == 0) {
        int64_t *m = zd_tensor_data_i64(meta);
        m[0] = s->by_gen ? FORMAT_GEN : FORMAT;
        m[1] = s->shard;
        m[2] = s->n_shards;
        m[3] = version;
        if (s->by_gen)
            m[4] = s->gen;
        rc = zd_named_tensors_add(nt, META, meta);
    }
    if (rc == 0 && s->tag && *s->tag) {
        zd_tensor_t *tag =
            zd_tensor_from_data(ZD_UINT8, (int64_t[]){(int64_t)strlen(s->tag)}, 1, s->tag);
        rc = tag ? zd_named_tensors_add(nt, TAG, tag) : -1;
        zd_tensor_unref(tag);
    }
    if (rc == 0 && s->positions && *s->positions && *s->n_positions > 0) {
        zd_tensor_t *pos =
            zd_tensor_from_data(ZD_INT64, (int64_t[]){*s->n_positions}, 1, *s->positions);
        rc = pos ? zd_named_tensors_add(nt, POSITIONS, pos) : -1;
        zd_tensor_unref(pos);
    }
    int64_t n_trainers = 0;
    for (int r = 0; s->trainer && r < s->n_ranks; r++)
        n_trainers += s->trainer[r] != TRAINER_UNKNOWN;
    if (rc == 0 && n_trainers > 0) {
        zd_tensor_t *tr = zd_tensor_empty(ZD_INT64, (int64_t[]){n_trainers}, 1);
        int64_t k = 0;
        for (int r = 0; tr && r < s->n_ranks; r++)
            if (s->trainer[r] != TRAINER_UNKNOWN)
                zd_tensor_data_i64(tr)[k++] = r;
        rc = tr ? zd_named_tensors_add(nt, TRAINERS, tr) : -1;
        zd_tensor_unref(tr);
    }
    for (int i = 0; rc == 0 && i < s->n; i++)
        rc = add_prefixed(nt, PARAM, s->names[i], s->params[i]);
    for (int i = 0; rc == 0 && i < zd_named_tensors_len(state); i++)
        rc = add_prefixed(nt, OPTIM, zd_named_tensors_name(state, i),
                          zd_named_tensors_tensor(state, i));
    zd_tensor_unref(meta);
    zd_named_tensors_free(state);
    if (rc < 0) {
        zd_named_tensors_free(nt);
        return NULL;
    }
    return nt;
}

static void name_of(const zd__ps_ckpt_t *s, int which, char *buf, size_t size)
{
    snprintf(buf, size, "%s%s", s->path, suffixes[which]);
}

void zd__ps_positions_record(int64_t **positions, int *n, int rank, int64_t position)
{
    if (position < 0 || rank < 0)
        return;
    if (rank >= *n) {
        int world = zd_rpc_world_size();
        int grown = world > rank ? world : rank + 1;
        int64_t *p = realloc(*positions, (size_t)grown * sizeof *p);
        if (!p)
            return;
        for (int i = *n; i < grown; i++)
            p[i] = -1;
        *positions = p;
        *n = grown;
    }
    (*positions)[rank] = position;
}

char *zd__ps_checkpoint_path(const char *prefix, int shard)
{
    size_t len = strlen(prefix) + 32;
    char *path = malloc(len);
    if (path)
        snprintf(path, len, "%s.shard%d", prefix, shard);
    else
        zd_error_set_code(ZD_ERR_NO_MEMORY, "ps: out of memory");
    return path;
}

int zd__ps_checkpoint_write(const zd__ps_ckpt_t *s, int64_t version, bool replace)
{
    if (!s->path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: shard %d has no checkpoint_path", s->shard);
    char cur[4200], next[4200], prev[4200];
    name_of(s, 0, cur, sizeof cur);
    name_of(s, 1, next, sizeof next);
    name_of(s, 2, prev, sizeof prev);
    zd_named_tensors_t *nt = snapshot(s, version);
    if (!nt)
        return zd_error_wrap("ps: shard %d: checkpoint of version %" PRId64, s->shard, version);
    int rc = zd_checkpoint_save(nt, next);
    zd_named_tensors_free(nt);
    if (rc < 0)
        return zd_error_wrap("ps: shard %d: checkpoint of version %" PRId64, s->shard, version);
    if ((!replace && rename(cur, prev) < 0 && errno != ENOENT) || rename(next, cur) < 0)
        return zd_error_set("ps: shard %d: cannot move the checkpoint of version %" PRId64
                            " into %s: %s",
                            s->shard, version, cur, strerror(errno));
    return 0;
}

/*  The file's version when it is a whole checkpoint of this shard, whose
    parameters have the served names, dtypes and shapes, with its key in
    *key; else -1 with the error set. */
static int64_t check_file(const zd__ps_ckpt_t *s, zd_named_tensors_t *nt, int64_t *key)
{
    const int64_t *m = meta_of(nt);
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "not a parameter server checkpoint (no %s of a format this "
                                 "build reads)",
                                 META);
    if (m[1] != s->shard || m[2] != s->n_shards || m[3] < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "a checkpoint of shard %" PRId64 " of %" PRId64
                                 ", not of shard %d of %d",
                                 m[1], m[2], s->shard, s->n_shards);
    int params = 0;
    for (int i = 0; i < zd_named_tensors_len(nt); i++)
        params += strncmp(zd_named_tensors_name(nt, i), PARAM, strlen(PARAM)) == 0;
    if (params != s->n)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%d parameters, the shard serves %d", params,
                                 s->n);
    char full[ZD_CHECKPOINT_MAX_NAME + 1];
    for (int i = 0; i < s->n; i++) {
        snprintf(full, sizeof full, PARAM "%s", s->names[i]);
        zd_tensor_t *t = zd_named_tensors_find(nt, full), *want = s->params[i];
        if (!t)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "no \"%s\"", s->names[i]);
        if (zd_tensor_dtype(t) != ZD_FLOAT32 || zd_tensor_ndim(t) != zd_tensor_ndim(want) ||
            memcmp(zd_tensor_shape(t), zd_tensor_shape(want),
                   (size_t)zd_tensor_ndim(t) * sizeof(int64_t)) != 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" is not float32 of the served shape",
                                     s->names[i]);
    }
    *key = key_of(s, m, m[3]);
    return m[3];
}

/*  What take checks of nt beyond check_file, before it changes
    anything: the positions' form, and no optimizer state for a shard
    without an optimizer (a shard with one checks the state as it takes
    it). 0, or -1. */
static int check_extras(const zd__ps_ckpt_t *s, zd_named_tensors_t *nt)
{
    zd_tensor_t *pos = zd_named_tensors_find(nt, POSITIONS);
    if (pos && s->positions &&
        (zd_tensor_dtype(pos) != ZD_INT64 || zd_tensor_ndim(pos) != 1 ||
         zd_tensor_numel(pos) > MAX_POSITIONS))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" is not int64, one a rank", POSITIONS);
    for (int i = 0; !s->opt && i < zd_named_tensors_len(nt); i++)
        if (strncmp(zd_named_tensors_name(nt, i), OPTIM, strlen(OPTIM)) == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "an optimizer's state, for a shard without one");
    return 0;
}

/*  Whether the run's tag (s->tag, NULL: none) is the one file (nt)
    was written with: 0, or -1 naming both. */
static int check_tag(const zd__ps_ckpt_t *s, zd_named_tensors_t *nt, const char *file)
{
    if (!s->tag || !*s->tag)
        return 0;
    zd_tensor_t *t = zd_named_tensors_find(nt, TAG);
    char got[ZD__PS_MAX_TAG + 1] = "";
    bool ok = t && zd_tensor_dtype(t) == ZD_UINT8 && zd_tensor_ndim(t) == 1 &&
        zd_tensor_numel(t) <= ZD__PS_MAX_TAG;
    if (ok) {
        memcpy(got, zd_tensor_raw(t), (size_t)zd_tensor_numel(t));
        got[zd_tensor_numel(t)] = 0;
        ok = memchr(got, 0, (size_t)zd_tensor_numel(t)) == NULL; /* (no NUL inside) */
    }
    if (ok && strcmp(got, s->tag) == 0)
        return 0;
    /* shown from a little before where they part (long tags), the
       file's bytes that are not printable as '?' */
    size_t at = 0;
    while (ok && got[at] && got[at] == s->tag[at])
        at++;
    at = at > 40 ? at - 40 : 0;
    for (char *c = got; *c; c++)
        *c = *c < 0x20 || *c > 0x7e ? '?' : *c;
    return zd_error_set_code(ZD_ERR_ARGUMENT,
                             "%s was written by a run with %s%s%.160s%s; this one has "
                             "\"%s%.160s\": resume with that configuration, or start anew",
                             file, ok ? "\"" : "", ok && at ? "..." : "",
                             ok      ? got + at
                                 : t ? "a damaged tag"
                                     : "no tag",
                             ok ? "\"" : "", ok && at ? "..." : "", ok ? s->tag + at : s->tag);
}

/*  Takes nt into the shard: the positions are checked and the
    optimizer's state taken first (each refused whole when it does not
    fit), then the parameters. 0, or -1. */
static int take(const zd__ps_ckpt_t *s, zd_named_tensors_t *nt)
{
    if (check_extras(s, nt) < 0)
        return -1;
    /* The positions: a file of a run that set none has none, and every
       trainer starts from its beginning. */
    zd_tensor_t *pos = zd_named_tensors_find(nt, POSITIONS);
    int64_t *copy = NULL;
    int n_pos = 0;
    if (pos && s->positions) {
        n_pos = (int)zd_tensor_numel(pos);
        if (n_pos > 0 && !(copy = malloc((size_t)n_pos * sizeof *copy)))
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
        for (int i = 0; i < n_pos; i++)
            copy[i] = zd_tensor_data_i64(pos)[i] < -1 ? -1 : zd_tensor_data_i64(pos)[i];
    }
    zd_named_tensors_t *state = zd_named_tensors_new();
    int rc = state ? 0 : -1;
    for (int i = 0; rc == 0 && i < zd_named_tensors_len(nt); i++) {
        const char *name = zd_named_tensors_name(nt, i);
        if (strncmp(name, OPTIM, strlen(OPTIM)) == 0)
            rc = zd_named_tensors_add(state, name + strlen(OPTIM), zd_named_tensors_tensor(nt, i));
    }
    if (rc == 0 && s->opt)
        rc = zd_optim_state_import(s->opt, state);
    zd_named_tensors_free(state);
    if (rc < 0) {
        free(copy);
        return -1;
    }
    char full[ZD_CHECKPOINT_MAX_NAME + 1];
    for (int i = 0; i < s->n; i++) {
        snprintf(full, sizeof full, PARAM "%s", s->names[i]);
        zd_tensor_t *t = zd_named_tensors_find(nt, full);
        memcpy(zd_tensor_data(s->params[i]), zd_tensor_data(t), zd_tensor_nbytes(t));
    }
    if (s->positions) {
        free(*s->positions);
        *s->positions = copy;
        *s->n_positions = n_pos;
    }
    return 0;
}

/*  Whether name (a file in the checkpoint's folder) is what a write of
    this shard left when its process died mid-write: "<file>.tmp.P.N"
    or "<file>.new.tmp.P.N" (zd_checkpoint_save's temporary files) or
    "<file>.probe.P.N" (a probe's), file the checkpoint's base name. */
static bool is_stale_temp(const char *name, const char *file)
{
    size_t n = strlen(file);
    if (strncmp(name, file, n) != 0 || name[n] != '.')
        return false;
    name += n + 1;
    static const char *const kinds[] = {"tmp.", "new.tmp.", "probe."};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t len = strlen(kinds[k]);
        const char *rest = name + len;
        if (strncmp(name, kinds[k], len) == 0 && rest[0] &&
            strspn(rest, "0123456789.") == strlen(rest))
            return true;
    }
    return false;
}

int zd__ps_checkpoint_prepare(const zd__ps_ckpt_t *s)
{
    /* Only shard K writes its files, and this process is shard K now:
       every temporary one there is was left by a process that died. */
    char dir[4200], probe[4240];
    const char *slash = strrchr(s->path, '/'), *file = slash ? slash + 1 : s->path;
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - s->path) + (slash == s->path), s->path);
    else
        snprintf(dir, sizeof dir, ".");
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char stale[4500];
        if (!is_stale_temp(e->d_name, file) ||
            snprintf(stale, sizeof stale, "%s/%s", dir, e->d_name) >= (int)sizeof stale)
            continue;
        if (unlink(stale) == 0)
            zd__log(ZD_LOG_WARN, "ps: shard %d: removed %s, left by a write that did not finish",
                    s->shard, stale);
        else if (errno != ENOENT)
            zd__log(ZD_LOG_WARN, "ps: shard %d: cannot remove %s: %s", s->shard, stale,
                    strerror(errno));
    }
    if (d)
        closedir(d);
    /* A folder that is not there, read-only or full fails now, naming
       the path, rather than at the first checkpoint, deep in a run. */
    static _Atomic unsigned probes;
    snprintf(probe, sizeof probe, "%s.probe.%ld.%u", s->path, (long)getpid(), probes++);
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        errno = 0; /* (a short write sets none) */
        if (write(fd, "", 1) != 1 || fsync(fd) < 0)
            err = errno ? errno : EIO;
        if (close(fd) < 0 && !err)
            err = errno;
        unlink(probe);
    }
    if (err)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: shard %d: cannot write %s: %s (checkpoint_path must name "
                                 "files in a folder this process can write)",
                                 s->shard, probe, strerror(err));
    return 0;
}

void zd__ps_checkpoint_set_aside(const zd__ps_ckpt_t *s)
{
    char name[4200], aside[4220];
    for (int which = 0; which < N_SUFFIXES; which++) {
        name_of(s, which, name, sizeof name);
        if (access(name, F_OK) < 0)
            continue;
        snprintf(aside, sizeof aside, "%s.earlier", name);
        if (rename(name, aside) == 0)
            zd__log(ZD_LOG_WARN, "ps: shard %d: a new run: %s, of an earlier one, is now %s",
                    s->shard, name, aside);
        else
            zd__log(ZD_LOG_WARN, "ps: shard %d: cannot set %s aside: %s", s->shard, name,
                    strerror(errno));
    }
}

int zd__ps_checkpoint_check(const zd__ps_ckpt_t *s, int64_t want)
{
    char name[4200], seen[1024] = "";
    for (int which = 0; which < N_SUFFIXES; which++) {
        name_of(s, which, name, sizeof name);
        if (access(name, F_OK) < 0)
            continue;
        zd_named_tensors_t *nt = zd_checkpoint_read(name);
        int64_t key = -1, v = nt ? check_file(s, nt, &key) : -1;
        if (v >= 0 && check_extras(s, nt) < 0)
            v = -1;
        zd_named_tensors_free(nt);
        if (v >= 0 && key == want)
            return 0;
        size_t at = strlen(seen);
        if (v >= 0)
            snprintf(seen + at, sizeof seen - at, "%s%.200s (%s %" PRId64 ")", at ? "; " : "", name,
                     s->by_gen ? "generation" : "version", key);
        else
            snprintf(seen + at, sizeof seen - at, "%s%.200s (%.100s)", at ? "; " : "", name,
                     zd_error_last());
    }
    return zd_error_set_code(
        ZD_ERR_ARGUMENT, "ps: shard %d: no readable checkpoint of %s %" PRId64 " at %s (there: %s)",
        s->shard, s->by_gen ? "generation" : "version", want, s->path, seen[0] ? seen : "none");
}

int zd__ps_checkpoint_load(const zd__ps_ckpt_t *s, int64_t want, int64_t *version, int64_t *key,
                           int64_t *older)
{
    zd_named_tensors_t *best = NULL;
    /* each file's key (by_gen: its generation; else its version) */
    int64_t best_key = -1, best_version = -1, keys[N_SUFFIXES] = {-1, -1, -1};
    int found = 0, best_which = -1;
    char name[4200], damaged[1024] = "", held[256] = "";
    for (int which = 0; which < N_SUFFIXES; which++) {
        name_of(s, which, name, sizeof name);
        if (access(name, F_OK) < 0)
            continue;
        found++;
        zd_named_tensors_t *nt = zd_checkpoint_read(name);
        int64_t k = -1, v = nt ? check_file(s, nt, &k) : -1;
        if (v < 0) {
            size_t at = strlen(damaged);
            snprintf(damaged + at, sizeof damaged - at, "%s%.200s (%.100s)", at ? "; " : "", name,
                     zd_error_last());
            zd_named_tensors_free(nt);
            continue;
        }
        size_t at = strlen(held);
        snprintf(held + at, sizeof held - at, "%s%" PRId64, at ? ", " : "", k);
        keys[which] = k;
        if (want < 0 ? k > best_key : k == want && !best) {
            zd_named_tensors_free(best);
            best = nt;
            best_key = k;
            best_version = v;
            best_which = which;
        } else {
            zd_named_tensors_free(nt);
        }
    }
    if (!found && want < 0) {
        zd__log(ZD_LOG_INFO, "ps: shard %d: no checkpoint at %s yet: starting anew", s->shard,
                s->path);
        return -1;
    }
    if (!best && want >= 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: shard %d: no checkpoint of %s %" PRId64
                                 " (its readable ones: %s) at %s%s%s",
                                 s->shard, s->by_gen ? "generation" : "version", want,
                                 held[0] ? held : "none", s->path, damaged[0] ? "; damaged: " : "",
                                 damaged),
               -2;
    if (!best)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: shard %d: no checkpoint can be resumed: %s",
                                 s->shard, damaged),
               -2;
    if (damaged[0] && want < 0)
        zd__log(ZD_LOG_WARN, "ps: shard %d: passed over %s", s->shard, damaged);
    name_of(s, best_which, name, sizeof name);
    if (want < 0 && check_tag(s, best, name) < 0) {
        zd_named_tensors_free(best);
        return zd_error_wrap("ps: shard %d", s->shard), -2;
    }
    int rc = take(s, best);
    zd_tensor_t *tr = zd_named_tensors_find(best, TRAINERS);
    if (rc == 0 && want < 0 && s->known && tr && zd_tensor_dtype(tr) == ZD_INT64 &&
        zd_tensor_ndim(tr) == 1 && zd_tensor_numel(tr) <= MAX_POSITIONS) {
        /* (out of memory, or ranks out of range: none known, as before) */
        int n = (int)zd_tensor_numel(tr);
        int64_t *known = n > 0 ? malloc((size_t)n * sizeof *known) : NULL;
        int k = 0;
        for (int i = 0; known && i < n; i++)
            if (zd_tensor_data_i64(tr)[i] >= 0 && zd_tensor_data_i64(tr)[i] < MAX_POSITIONS)
                known[k++] = zd_tensor_data_i64(tr)[i];
        free(*s->known);
        *s->known = known;
        *s->n_known = known ? k : 0;
    }
    zd_named_tensors_free(best);
    if (rc < 0)
        return zd_error_wrap("ps: shard %d: resuming from %s", s->shard, name), -2;
    /* The generation taken becomes the current file, so that the next
       write keeps it as ".prev" and the disk holds what the shard says it
       holds: gone back (want), the newer generations are of a branch
       given up, which a restart must not resume from; resumed from
       ".new" (a write cut short), the rotation is finished; resumed from
       ".prev", the current file was damaged, and is kept aside. */
    char cur[4200], other[4220];
    name_of(s, 0, cur, sizeof cur);
    for (int which = 0; want >= 0 && which < N_SUFFIXES; which++)
        if (keys[which] > want) {
            name_of(s, which, other, sizeof other);
            if (unlink(other) < 0)
                zd__log(ZD_LOG_WARN, "ps: shard %d: cannot remove %s: %s", s->shard, other,
                        strerror(errno));
            keys[which] = -1;
        }
    if (best_which == 1 && keys[0] >= 0) { /* the current one becomes the one before */
        name_of(s, 2, other, sizeof other);
        if (rename(cur, other) == 0)
            keys[2] = keys[0], keys[0] = -1;
    } else if (best_which == 2 && access(cur, F_OK) == 0 && keys[0] < 0) {
        snprintf(other, sizeof other, "%s.damaged", cur);
        if (rename(cur, other) < 0)
            zd__log(ZD_LOG_WARN, "ps: shard %d: cannot move %s aside: %s", s->shard, cur,
                    strerror(errno));
    }
    if (best_which != 0) {
        if (rename(name, cur) == 0) {
            keys[0] = keys[best_which];
            keys[best_which] = -1;
        } else {
            zd__log(ZD_LOG_WARN, "ps: shard %d: cannot make %s the current file: %s", s->shard,
                    name, strerror(errno));
        }
    }
    if (older) {
        *older = -1;
        for (int which = 0; which < N_SUFFIXES; which++)
            if (keys[which] < best_key && keys[which] > *older)
                *older = keys[which];
    }
    *version = best_version;
    if (key)
        *key = best_key;
    zd__log(ZD_LOG_INFO, "ps: shard %d: %s %s at version %" PRId64, s->shard,
            want < 0 ? "resumed from" : "went back to", name, best_version);
    return 0;
}
