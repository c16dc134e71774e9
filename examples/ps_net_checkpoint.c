/* SPDX-License-Identifier: MIT */
/*  ps_net_checkpoint.c: checkpoints and resume of the parameter server
    (a run stopped and resumed takes the steps of one that never
    stopped); see ps_net_checkpoint_enable in ps_net.h.

    Generations. Shard 0 numbers each checkpoint (1, 2, ...) and every
    shard's file records the number of the checkpoint it belongs to. Shard 0
    has the others write generation G first and writes its own last: its
    file is the commit point, and the trainers' positions it holds are
    never ahead of any shard's weights. A shard writes generation G to
    PREFIX.shardK.new, and only then keeps the file it replaces as
    PREFIX.shardK.prev and moves the new one in place (a write that fails
    leaves both older generations as they were), so that when a shard
    dies between the others' writes and shard 0's (the others at G, shard 0
    still at G-1) every shard still has a file of generation G-1. A resume
    takes, on every shard, the file of shard 0's generation (the current
    one, or .prev), and refuses any other mix, naming the files. */
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"
#include "examples/fault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/checkpoint.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/rpc.h>

static struct {
    char prefix[1024]; /* "": off */
    int64_t config[3]; /* batch_size, seed, trainers */
    pthread_mutex_t lock;
    int64_t progress[PS_NET_MAX_TRAINERS]; /* shard 0: batches each trainer reported */
    /* One checkpoint at a time (shard 0: the whole round over the shards;
       the others: a write), so that generations reach the files in order. */
    pthread_mutex_t serial;
    int64_t generation; /* of the file this shard last wrote or loaded (0: none) */
    /* This process loaded its files at start (--resume) and nobody has
       rolled the shards back to one checkpoint since: see rollback(). */
    bool restored;
    /* What this shard loaded came from .prev: its current file is of a
       checkpoint that never reached shard 0, and the next write replaces
       it without keeping it. */
    bool from_prev;
} ck = {.lock = PTHREAD_MUTEX_INITIALIZER, .serial = PTHREAD_MUTEX_INITIALIZER};

#define PROGRESS_NAME   "trainer_progress"
#define CONFIG_NAME     "run_config" /* batch_size, seed, trainers: must match on resume */
#define GENERATION_NAME "generation"

static void shard_path(char *buf, size_t size, int shard, bool prev)
{
    snprintf(buf, size, "%s.shard%d%s", ck.prefix, shard, prev ? ".prev" : "");
}

/*  What a shard's file holds: its parameters and its generation, and on
    shard 0 also the trainers' progress and the run's configuration
    (tensors of their own, borrowed here from the list). */
typedef struct {
    zd_named_tensors_t *tensors;
    zd_tensor_t *progress, *config, *generation;
} shard_file_t;

static void shard_file_clear(shard_file_t *f)
{
    zd_named_tensors_free(f->tensors);
    memset(f, 0, sizeof *f);
}

/*  Adds a new int64 tensor of len elements under name; *t borrows it. */
static int add_own(shard_file_t *f, const char *name, int64_t len, zd_tensor_t **t)
{
    zd_tensor_t *own = zd_tensor_new(ZD_INT64, &len, 1);
    int rc = own ? zd_named_tensors_add(f->tensors, name, own) : -1;
    zd_tensor_unref(own);
    *t = rc == 0 ? own : NULL;
    return rc;
}

static int shard_file_init(shard_file_t *f)
{
    memset(f, 0, sizeof *f);
    if (!(f->tensors = zd_named_tensors_new()))
        return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < ps_shard.n; i++)
        rc = zd_named_tensors_add(f->tensors, ps_shard.names[i], ps_shard.params[i]);
    if (rc == 0)
        rc = add_own(f, GENERATION_NAME, 1, &f->generation);
    if (rc == 0 && ps_shard.shard == 0 &&
        (add_own(f, PROGRESS_NAME, PS_NET_MAX_TRAINERS, &f->progress) < 0 ||
         add_own(f, CONFIG_NAME, 3, &f->config) < 0))
        rc = -1;
    if (rc < 0)
        shard_file_clear(f);
    return rc;
}

/*  The file at path becomes path.prev (a hard link, then a rename: path
    stays in place throughout). Nothing to keep before the first write.
    Called once the new file is written whole (save_shard): a write that
    fails must leave .prev the generation before path's, not a second copy
    of path. */
static int keep_previous(const char *path)
{
    char tmp[1200], prev[1200];
    snprintf(tmp, sizeof tmp, "%s.prev.tmp.%ld", path, (long)getpid());
    snprintf(prev, sizeof prev, "%s.prev", path);
    unlink(tmp);
    if (link(path, tmp) < 0)
        return errno == ENOENT
            ? 0
            : zd_error_set("checkpoint: cannot keep %s as %s: %s", path, prev, strerror(errno));
    if (rename(tmp, prev) < 0) {
        int e = errno;
        unlink(tmp);
        return zd_error_set("checkpoint: cannot keep %s as %s: %s", path, prev, strerror(e));
    }
    return 0;
}

/*  Writes this shard's parameters (shard 0: with the trainers' progress)
    as generation `generation`, under the parameters' read lock, so that
    no step is half applied. Under ck.serial. */
static int save_shard(int64_t generation)
{
    char path[1100];
    shard_file_t f;
    if (shard_file_init(&f) < 0)
        return -1;
    zd_tensor_data_i64(f.generation)[0] = generation;
    if (f.progress) {
        pthread_mutex_lock(&ck.lock);
        memcpy(zd_tensor_data_i64(f.progress), ck.progress, sizeof ck.progress);
        pthread_mutex_unlock(&ck.lock);
        memcpy(zd_tensor_data_i64(f.config), ck.config, sizeof ck.config);
    }
    shard_path(path, sizeof path, ps_shard.shard, false);
    /* Shard 0 reaches its checkpoint phase in fn_checkpoint, between the
       others' saves and its own; the others here. Tests only (fault.h). */
    if (ps_shard.shard != 0)
        fault_point(zd_rpc_rank(), "checkpoint");
    /* The new generation goes to PREFIX.shardK.new first; only once it is
       there whole does the current file become .prev and the new one take
       its place. A write that fails (a full disk, a file system turned
       read-only) then leaves both generations as they were. */
    char next[1200];
    snprintf(next, sizeof next, "%s.new", path);
    zd_dist_optim_read_lock();
    int rc = zd_checkpoint_save(f.tensors, next);
    zd_dist_optim_read_unlock();
    shard_file_clear(&f);
    /* A generation written again (its first round did not reach shard 0)
       keeps the .prev of the one before it. */
    if (rc == 0 && generation != ck.generation && !ck.from_prev)
        rc = keep_previous(path);
    if (rc == 0 && rename(next, path) < 0)
        rc = zd_error_set("checkpoint: cannot rename %s to %s: %s", next, path, strerror(errno));
    if (rc < 0) {
        unlink(next);
        /* The trainer whose checkpoint this was fails with this error; the
           server names it too, where its operator looks. */
        fprintf(stderr, "parameter server %d: checkpoint generation %lld not written: %s\n",
                ps_shard.shard, (long long)generation, zd_error_last());
    }
    if (rc == 0) {
        ck.generation = generation;
        ck.restored = ck.from_prev = false;
    }
    return rc;
}

/*  ps_checkpoint(server, trainer, batches): shard 0 takes the next
    generation, has the other shards save theirs (all at once), records
    the trainer's position and saves its own file last (the commit). */
static zd_value_t *fn_checkpoint(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t trainer, batches;
    if (zd_rpc_arg_int(args, 1, &trainer) < 0 || zd_rpc_arg_int(args, 2, &batches) < 0)
        return NULL;
    if (!ck.prefix[0]) {
        zd_error_set("ps_checkpoint: this server runs without --checkpoint");
        return NULL;
    }
    if (trainer < 0 || trainer >= PS_NET_MAX_TRAINERS || batches < 0) {
        zd_error_set("ps_checkpoint: trainer %lld with %lld batches (trainers 0 to %d)",
                     (long long)trainer, (long long)batches, PS_NET_MAX_TRAINERS - 1);
        return NULL;
    }
    if (ps_net_guard_trainer(call, trainer) < 0)
        return NULL;
    pthread_mutex_lock(&ck.serial);
    int64_t generation = ck.generation + 1;
    zd_value_t *gargs = ZD_ARGS(generation);
    zd_future_t *fs[64];
    int n = 0, rc = gargs ? 0 : -1;
    for (int s = 1; rc == 0 && s < ps_shard.num_shards; s++)
        if ((fs[n] = zd_rpc_async(s, "ps_save_shard", gargs, ZD_TIMEOUT_DEFAULT)))
            n++;
        else
            rc = -1;
    if (n && zd_future_wait_all(fs, n, ZD_TIMEOUT_DEFAULT) < 0)
        rc = -1;
    for (int i = 0; i < n; i++)
        zd_future_unref(fs[i]);
    zd_value_unref(gargs);
    if (rc == 0) {
        /* Tests: a shard 0 that dies here leaves the others one generation
           ahead of it. */
        fault_point(ps_shard.shard, "checkpoint");
        pthread_mutex_lock(&ck.lock);
        ck.progress[trainer] = batches;
        pthread_mutex_unlock(&ck.lock);
        rc = save_shard(generation);
    }
    pthread_mutex_unlock(&ck.serial);
    if (rc < 0)
        zd_error_wrap("checkpoint generation %lld", (long long)generation);
    return rc == 0 ? zd_value_none() : NULL;
}

/*  ps_save_shard(generation): shard 0 has this shard write its part. */
static zd_value_t *fn_save_shard(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t generation;
    if (ZD_UNPACK(args, &generation) < 0)
        return NULL;
    if (!ck.prefix[0]) {
        zd_error_set("ps_save_shard: shard %d runs without --checkpoint", ps_shard.shard);
        return NULL;
    }
    if (zd_rpc_call_caller_rank(call) != 0) {
        zd_error_set("ps_save_shard: only shard 0 numbers checkpoints, not rank %d",
                     zd_rpc_call_caller_rank(call));
        return NULL;
    }
    pthread_mutex_lock(&ck.serial);
    /* An older generation never replaces a newer one. */
    int rc = generation >= ck.generation ? save_shard(generation) : 0;
    pthread_mutex_unlock(&ck.serial);
    return rc == 0 ? zd_value_none() : NULL;
}

static int load_generation(int64_t want);

/*  ps_shard_restored() -> 1 when this shard loaded its files at start and
    was not rolled back or saved since, else 0. */
static zd_value_t *fn_shard_restored(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&ck.serial);
    bool restored = ck.restored;
    pthread_mutex_unlock(&ck.serial);
    return zd_value_int(restored);
}

/*  ps_reload_shard(generation): shard 0 has this shard load its file of
    that generation again (rollback()). */
static zd_value_t *fn_reload_shard(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t generation;
    if (ZD_UNPACK(args, &generation) < 0)
        return NULL;
    if (!ck.prefix[0] || zd_rpc_call_caller_rank(call) != 0) {
        zd_error_set("ps_reload_shard: only shard 0 rolls shards back, with --checkpoint");
        return NULL;
    }
    pthread_mutex_lock(&ck.serial);
    /* Restored from that very generation, it holds it already. */
    int rc = ck.restored && ck.generation == generation ? 0 : load_generation(generation);
    if (rc == 0)
        ck.restored = false;
    pthread_mutex_unlock(&ck.serial);
    return rc == 0 ? zd_value_none() : NULL;
}

/*  Shard 0, when a trainer asks where to resume: a shard that came back
    from its files while the others ran (this one, or another: it says it
    was restored) holds the last checkpoint, the others have gone on
    since. Every shard then loads shard 0's last generation again, and the
    trainers' positions are those of that checkpoint: the world is back at
    one checkpoint, and at most one interval of updates is lost. (When the
    whole world resumed, every shard already holds that generation, and
    loading it again changes nothing.) */
static int rollback(void)
{
    pthread_mutex_lock(&ck.serial);
    bool any = ck.restored, all = ck.restored;
    for (int s = 1; s < ps_shard.num_shards; s++) {
        zd_value_t *r = NULL;
        int64_t restored = 0;
        if (zd_rpc_sync(s, "ps_shard_restored", NULL, ZD_TIMEOUT_DEFAULT, &r) < 0 ||
            zd_value_get_int(r, &restored) < 0) {
            zd_value_unref(r);
            pthread_mutex_unlock(&ck.serial);
            return zd_error_wrap("asking shard %d whether it was restarted", s);
        }
        zd_value_unref(r);
        any = any || restored != 0;
        all = all && restored != 0;
    }
    int rc = 0;
    if (any && ck.generation == 0) {
        rc = zd_error_set("a server shard came back from its checkpoint, and shard 0 has none "
                          "to roll the others back to");
    } else if (any) {
        if (!all)
            printf("shard 0: a server shard came back: every shard goes back to checkpoint "
                   "generation %lld\n",
                   (long long)ck.generation);
        fflush(stdout);
        zd_value_t *gargs = ZD_ARGS(ck.generation);
        for (int s = 1; rc == 0 && s < ps_shard.num_shards; s++) {
            zd_value_t *r = NULL;
            rc = gargs ? zd_rpc_sync(s, "ps_reload_shard", gargs, ZD_TIMEOUT_DEFAULT, &r) : -1;
            zd_value_unref(r);
            if (rc < 0)
                zd_error_wrap("rolling shard %d back to generation %lld", s,
                              (long long)ck.generation);
        }
        zd_value_unref(gargs);
        if (rc == 0 && !ck.restored)
            rc = load_generation(ck.generation);
        if (rc == 0)
            ck.restored = false;
    }
    pthread_mutex_unlock(&ck.serial);
    return rc;
}

/*  ps_resume_point(server, trainer) -> batches the trainer had done. */
static zd_value_t *fn_resume_point(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t trainer;
    if (zd_rpc_arg_int(args, 1, &trainer) < 0)
        return NULL;
    if (!ck.prefix[0]) {
        zd_error_set("ps_resume_point: this server runs without --checkpoint: nothing to resume");
        return NULL;
    }
    if (trainer < 0 || trainer >= PS_NET_MAX_TRAINERS) {
        zd_error_set("ps_resume_point: no trainer %lld (trainers 0 to %d)", (long long)trainer,
                     PS_NET_MAX_TRAINERS - 1);
        return NULL;
    }
    if (ps_net_guard_trainer(call, trainer) < 0 || rollback() < 0)
        return NULL;
    pthread_mutex_lock(&ck.lock);
    int64_t batches = ck.progress[trainer];
    pthread_mutex_unlock(&ck.lock);
    return zd_value_int(batches);
}

/*  ---- resuming ---- */

/*  The generation recorded in the checkpoint file at path: 1 and *gen, 0
    when there is no such file, -1 (error set) when it cannot be read. */
static int file_generation(const char *path, int64_t *gen)
{
    if (access(path, F_OK) < 0 && errno == ENOENT)
        return 0;
    zd_named_tensors_t *nt = zd_checkpoint_read(path);
    if (!nt)
        return -1;
    zd_tensor_t *g = zd_named_tensors_find(nt, GENERATION_NAME);
    int rc = 1;
    if (g && zd_tensor_dtype(g) == ZD_INT64 && zd_tensor_numel(g) == 1)
        *gen = zd_tensor_data_i64(g)[0];
    else
        rc = zd_error_set("%s holds no %s: a checkpoint of an older rpc_ps", path, GENERATION_NAME);
    zd_named_tensors_free(nt);
    return rc;
}

/*  Shard s's files: their generations (-1: no such file). -1 when one
    exists but cannot be read. */
static int shard_generations(int s, int64_t *cur, int64_t *prev)
{
    char path[1100];
    *cur = *prev = -1;
    shard_path(path, sizeof path, s, false);
    if (file_generation(path, cur) < 0)
        return -1;
    shard_path(path, sizeof path, s, true);
    return file_generation(path, prev) < 0 ? -1 : 0;
}

/*  Appends ", PREFIX.shardS generation G (PREFIX.shardS.prev: G')" to msg. */
static void describe_shard(char *msg, size_t size, int s, int64_t cur, int64_t prev)
{
    char path[1100];
    size_t len = strlen(msg);
    shard_path(path, sizeof path, s, false);
    if (cur < 0)
        snprintf(msg + len, size - len, "%s%s missing", len ? ", " : "", path);
    else
        snprintf(msg + len, size - len, "%s%s generation %lld", len ? ", " : "", path,
                 (long long)cur);
    len = strlen(msg);
    if (prev >= 0)
        snprintf(msg + len, size - len, " (%s.prev: %lld)", path, (long long)prev);
}

/*  Shard 0, before it loads: every other shard whose files are here
    (one host, or a shared file system) has one of generation want. */
static int check_other_shards(int64_t want)
{
    char msg[4096] = "";
    bool mixed = false;
    for (int s = 0; s < ps_shard.num_shards; s++) {
        int64_t cur, prev;
        if (shard_generations(s, &cur, &prev) < 0)
            return -1;
        describe_shard(msg, sizeof msg, s, cur, prev);
        if (s > 0 && cur >= 0 && cur != want && prev != want)
            mixed = true;
    }
    if (mixed)
        return zd_error_set("checkpoint generations differ: %s; shard 0's file is the commit "
                            "point (generation %lld) and a shard holds no file of it: these "
                            "files are not of one checkpoint, refusing to resume",
                            msg, (long long)want);
    return 0;
}

typedef struct {
    zd_named_tensors_t *tensors;
    const char *path;
} load_t;

/*  zd_checkpoint_load into the shard's parameters, run as a step
    (zd_dist_optim_update_params): a rollback while other trainers train
    is then never seen half loaded by a step, a forward's copy or an
    evaluation. It answers 0, "unchanged", on purpose: the step count
    then stays, and the trainers' DistributedOptimizers stay good (a
    rollback is the whole world's, each trainer going back to its
    position). The count's one use here, the forwards' shared copies, is
    told instead: they are of the weights before. */
static int load_params(void *arg)
{
    const load_t *l = arg;
    if (zd_checkpoint_load(l->tensors, l->path) < 0)
        return -1;
    ps_net_snapshot_drop();
    return 0;
}

/*  Loads this shard's file of generation want (its current file, or the
    one kept as .prev when a checkpoint did not reach shard 0), or its
    current file when want is -1. Refuses (naming the files) when it has
    no file of that generation, or the file is missing, damaged, of
    another layout, or of a run with another configuration. */
static int load_generation(int64_t want)
{
    int64_t cur, prev;
    char path[1100];
    if (shard_generations(ps_shard.shard, &cur, &prev) < 0)
        return -1;
    bool use_prev = want >= 0 && cur != want && prev == want;
    shard_path(path, sizeof path, ps_shard.shard, use_prev);
    if (want >= 0 && cur >= 0 && cur != want && !use_prev) {
        char msg[2048] = "";
        describe_shard(msg, sizeof msg, ps_shard.shard, cur, prev);
        return zd_error_set("checkpoint generations differ: %s, %s.shard0 (the commit point) "
                            "generation %lld: not one checkpoint, refusing to resume",
                            msg, ck.prefix, (long long)want);
    }
    if (use_prev)
        printf("shard %d: %s.shard%d holds generation %lld, a checkpoint that did not reach "
               "shard 0: resuming from %s (generation %lld)\n",
               ps_shard.shard, ck.prefix, ps_shard.shard, (long long)cur, path, (long long)want);
    shard_file_t f;
    int rc = shard_file_init(&f) < 0
        ? -1
        : zd_dist_optim_update_params(load_params, &(load_t){f.tensors, path});
    const int64_t *got = f.config && rc == 0 ? zd_tensor_data_i64(f.config) : NULL;
    if (got && memcmp(got, ck.config, sizeof ck.config) != 0)
        rc =
            zd_error_set("%s was written by a run with --batch_size=%lld --seed=%lld and %lld "
                         "trainer(s); this one has %lld, %lld and %lld",
                         path, (long long)got[0], (long long)got[1], (long long)got[2],
                         (long long)ck.config[0], (long long)ck.config[1], (long long)ck.config[2]);
    int64_t progress[PS_NET_MAX_TRAINERS];
    for (int t = 0; rc == 0 && f.progress && t < PS_NET_MAX_TRAINERS; t++)
        if ((progress[t] = zd_tensor_data_i64(f.progress)[t]) < 0)
            rc = zd_error_set("%s: trainer %d at batch %lld", path, t, (long long)progress[t]);
    if (rc == 0) {
        ck.generation = zd_tensor_data_i64(f.generation)[0];
        ck.from_prev = use_prev;
        if (f.progress) {
            pthread_mutex_lock(&ck.lock);
            memcpy(ck.progress, progress, sizeof progress);
            pthread_mutex_unlock(&ck.lock);
        }
        printf("shard %d: loaded %s (generation %lld)\n", ps_shard.shard, path,
               (long long)ck.generation);
    }
    shard_file_clear(&f);
    return rc;
}

/*  Removes what writes of this shard's files left behind when their
    process died mid-write: PREFIX.shardK.tmp.PID.N (zd_checkpoint_save),
    PREFIX.shardK.prev.tmp.PID (keep_previous), PREFIX.shardK.new and its
    PREFIX.shardK.new.tmp.PID.N (save_shard), PREFIX.shardK.probe.PID
    (check_prefix). Only shard K writes them, and this process is shard K
    now: any there are stale. */
static int remove_stale_temps(void)
{
    char dir[1100], lead[1100];
    const char *slash = strrchr(ck.prefix, '/');
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - ck.prefix) + (slash == ck.prefix),
                 ck.prefix);
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(lead, sizeof lead, "%s.shard%d.", slash ? slash + 1 : ck.prefix, ps_shard.shard);
    DIR *d = opendir(dir);
    if (!d) /* the first save will say what is wrong with the place */
        return 0;
    size_t n = strlen(lead);
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *rest = e->d_name;
        if (strncmp(rest, lead, n) != 0)
            continue;
        rest += n;
        static const char *const kinds[] = {"tmp.", "prev.tmp.", "new.tmp.", "probe."};
        size_t k = 0, nk = sizeof kinds / sizeof kinds[0];
        while (k < nk && strncmp(rest, kinds[k], strlen(kinds[k])) != 0)
            k++;
        if (strcmp(rest, "new") != 0) {
            if (k == nk)
                continue;
            rest += strlen(kinds[k]);
            if (!rest[0] || strspn(rest, "0123456789.") != strlen(rest))
                continue;
        }
        char path[2400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            printf("shard %d: removed %s, left by a write that did not finish\n", ps_shard.shard,
                   path);
        else if (errno != ENOENT)
            fprintf(stderr, "shard %d: cannot remove %s: %s\n", ps_shard.shard, path,
                    strerror(errno));
    }
    closedir(d);
    return 0;
}

/*  Whether this shard can write its files: creates, writes a byte to and
    removes PREFIX.shardK.probe.PID. A prefix in a folder that is not
    there, under a regular file, read-only or full fails here, at start,
    naming the path, rather than at the first checkpoint, deep in a run. */
static int check_prefix(void)
{
    char path[1200];
    snprintf(path, sizeof path, "%s.shard%d.probe.%ld", ck.prefix, ps_shard.shard, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int e = fd < 0 ? errno : 0;
    if (fd >= 0) {
        if (write(fd, "", 1) != 1 || fsync(fd) < 0)
            e = errno ? errno : EIO;
        if (close(fd) < 0 && !e)
            e = errno;
        unlink(path);
    }
    if (e)
        return zd_error_set("checkpoint: --checkpoint=%s: cannot write %s: %s (the prefix "
                            "must name files in a folder this process can write)",
                            ck.prefix, path, strerror(e));
    return 0;
}

int ps_net_checkpoint_enable(const char *prefix, bool resume, int64_t batch_size, int num_trainers)
{
    if (!prefix || !prefix[0] || strlen(prefix) >= sizeof ck.prefix - 16)
        return zd_error_set("ps_net: checkpoint prefix empty or over %zu bytes",
                            sizeof ck.prefix - 16);
    if (num_trainers < 1 || num_trainers > PS_NET_MAX_TRAINERS)
        return zd_error_set("ps_net: checkpoints handle 1 to %d trainers, not %d",
                            PS_NET_MAX_TRAINERS, num_trainers);
    snprintf(ck.prefix, sizeof ck.prefix, "%s", prefix);
    ck.config[0] = batch_size;
    ck.config[1] = (int64_t)ps_shard.seed;
    ck.config[2] = num_trainers;
    remove_stale_temps();
    if (check_prefix() < 0)
        return -1;
    if (!resume)
        return 0;
    /* Shard 0's generation is the one to resume; another shard reads it
       from shard 0's file when that is here too, else takes its own. */
    char path[1100];
    int64_t want = -1;
    shard_path(path, sizeof path, 0, false);
    int rc = file_generation(path, &want);
    if (rc == 0 && ps_shard.shard == 0)
        rc = zd_error_set("checkpoint: %s: no such file", path);
    if (rc > 0)
        rc = ps_shard.shard == 0 ? check_other_shards(want) : 0;
    if (rc == 0)
        rc = load_generation(want);
    if (rc == 0)
        ck.restored = true;
    return rc < 0 ? zd_error_wrap("resuming shard %d", ps_shard.shard) : 0;
}

int ps_net_checkpoint_register(void)
{
    if (zd_rpc_register("ps_checkpoint", fn_checkpoint, NULL) < 0 ||
        zd_rpc_register("ps_save_shard", fn_save_shard, NULL) < 0 ||
        zd_rpc_register("ps_shard_restored", fn_shard_restored, NULL) < 0 ||
        zd_rpc_register("ps_reload_shard", fn_reload_shard, NULL) < 0)
        return -1;
    return zd_rpc_register("ps_resume_point", fn_resume_point, NULL);
}
