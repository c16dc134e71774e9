/* SPDX-License-Identifier: MIT */
/*  ps_net_checkpoint.c: checkpoints and resume of the parameter server
    (SPEC B2: a run stopped and resumed takes the steps of one that never
    stopped); see ps_net_checkpoint_enable in ps_net.h. */
#include "examples/fault.h"
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"

#include <pthread.h>
#include <string.h>

#include <zdist/checkpoint.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/rpc.h>

static struct {
    char prefix[1024];          /* "": off */
    int64_t config[3];          /* batch_size, seed, trainers */
    pthread_mutex_t lock;
    int64_t progress[PS_NET_MAX_TRAINERS];   /* shard 0: batches each trainer reported */
} ck = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define PROGRESS_NAME "trainer_progress"
#define CONFIG_NAME "run_config"    /* batch_size, seed, trainers: must match on resume */

static void shard_path(char *buf, size_t size, int shard)
{
    snprintf(buf, size, "%s.shard%d", ck.prefix, shard);
}

/*  What a shard's file holds: its parameters, and on shard 0 also the
    trainers' progress and the run's configuration (tensors of its own). */
typedef struct {
    const char *names[PS_NET_MAX_PARAMS + 2];
    zd_tensor_t *tensors[PS_NET_MAX_PARAMS + 2];
    int n;
    zd_tensor_t *progress, *config;
} shard_file_t;

static void shard_file_clear(shard_file_t *f)
{
    zd_tensor_unref_p(&f->progress);
    zd_tensor_unref_p(&f->config);
}

static int shard_file_init(shard_file_t *f)
{
    memset(f, 0, sizeof *f);
    for (int i = 0; i < ps_shard.n; i++, f->n++)
        f->names[f->n] = ps_shard.names[i], f->tensors[f->n] = ps_shard.params[i];
    if (ps_shard.shard != 0)
        return 0;
    f->progress = zd_tensor_new(ZD_INT64, 1, (int64_t[]){PS_NET_MAX_TRAINERS});
    f->config = zd_tensor_new(ZD_INT64, 1, (int64_t[]){3});
    if (!f->progress || !f->config) {
        shard_file_clear(f);
        return -1;
    }
    f->names[f->n] = PROGRESS_NAME, f->tensors[f->n++] = f->progress;
    f->names[f->n] = CONFIG_NAME, f->tensors[f->n++] = f->config;
    return 0;
}

/*  Writes this shard's parameters (shard 0: with the trainers' progress)
    under the parameters' read lock, so that no step is half applied. */
static int save_shard(void)
{
    char path[1100];
    shard_file_t f;
    if (shard_file_init(&f) < 0)
        return -1;
    if (f.progress) {
        pthread_mutex_lock(&ck.lock);
        memcpy(zd_tensor_data_i64(f.progress), ck.progress, sizeof ck.progress);
        pthread_mutex_unlock(&ck.lock);
        memcpy(zd_tensor_data_i64(f.config), ck.config, sizeof ck.config);
    }
    shard_path(path, sizeof path, ps_shard.shard);
    fault_point(zd_rpc_rank(), "checkpoint");   /* tests only (fault.h) */
    /* Under the read lock to the rename: no step half applied, and an older
       save cannot replace a newer one. */
    zd_dist_optim_read_lock();
    int rc = zd_checkpoint_save(path, f.n, f.names, f.tensors);
    zd_dist_optim_read_unlock();
    shard_file_clear(&f);
    return rc;
}

/*  ps_checkpoint(server, trainer, batches): shard 0 notes the trainer's
    progress, has the other shards save theirs, then saves its own (last,
    so that the progress it records is never ahead of any shard's
    weights). */
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
    /* The other shards first, all at once: once they hold this trainer's
       steps, its position may be recorded (and saved with shard 0). */
    zd_future_t *fs[64];
    int n = 0, rc = 0;
    for (int s = 1; s < ps_shard.num_shards; s++)
        if ((fs[n] = zd_rpc_async(s, "ps_save_shard", NULL, ZD_TIMEOUT_DEFAULT)))
            n++;
        else
            rc = -1;
    if (n && zd_future_wait_all(fs, n, -1) < 0)
        rc = -1;
    for (int i = 0; i < n; i++)
        zd_future_unref(fs[i]);
    if (rc < 0)
        return NULL;
    pthread_mutex_lock(&ck.lock);
    ck.progress[trainer] = batches;
    pthread_mutex_unlock(&ck.lock);
    return save_shard() == 0 ? zd_value_none() : NULL;
}

static zd_value_t *fn_save_shard(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    if (!ck.prefix[0]) {
        zd_error_set("ps_save_shard: shard %d runs without --checkpoint", ps_shard.shard);
        return NULL;
    }
    return save_shard() == 0 ? zd_value_none() : NULL;
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
    if (ps_net_guard_trainer(call, trainer) < 0)
        return NULL;
    pthread_mutex_lock(&ck.lock);
    int64_t batches = ck.progress[trainer];
    pthread_mutex_unlock(&ck.lock);
    return zd_value_int(batches);
}

int ps_net_checkpoint_enable(const char *prefix, bool resume, int64_t batch_size,
                             int num_trainers)
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
    if (!resume)
        return 0;
    char path[1100];
    shard_path(path, sizeof path, ps_shard.shard);
    shard_file_t f;
    int rc = shard_file_init(&f) < 0 ? -1 : zd_checkpoint_load(path, f.n, f.names, f.tensors);
    const int64_t *got = f.config && rc == 0 ? zd_tensor_data_i64(f.config) : NULL;
    if (got && memcmp(got, ck.config, sizeof ck.config) != 0)
        rc = zd_error_set("%s was written by a run with --batch_size=%lld --seed=%lld and %lld "
                       "trainer(s); this one has %lld, %lld and %lld", path, (long long)got[0],
                       (long long)got[1], (long long)got[2], (long long)ck.config[0],
                       (long long)ck.config[1], (long long)ck.config[2]);
    for (int t = 0; rc == 0 && f.progress && t < PS_NET_MAX_TRAINERS; t++)
        if ((ck.progress[t] = zd_tensor_data_i64(f.progress)[t]) < 0)
            rc = zd_error_set("%s: trainer %d at batch %lld", path, t,
                           (long long)ck.progress[t]);
    shard_file_clear(&f);
    return rc < 0 ? zd_error_wrap("resuming shard %d", ps_shard.shard) : 0;
}

int ps_net_checkpoint_register(void)
{
    if (zd_rpc_register("ps_checkpoint", fn_checkpoint, NULL) < 0 ||
        zd_rpc_register("ps_save_shard", fn_save_shard, NULL) < 0)
        return -1;
    return zd_rpc_register("ps_resume_point", fn_resume_point, NULL);
}
