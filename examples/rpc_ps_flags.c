/* SPDX-License-Identifier: MIT */
/*  rpc_ps_flags.c: rpc_ps's flags: their defaults (the tutorial's), the
    table that parses them and prints --help, what their types leave to
    check, and what follows from them (the worker's name, its compute
    threads, how long the others wait for a lost rank 0), and joining. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/zdist.h>

#include "examples/flags.h"
#include "examples/ps_stages.h"
#include "examples/rpc_ps.h"

#define TEXT_(x) #x
#define TEXT(x)  TEXT_(x) /* a macro's value as a string */

/*  What the flags' types leave: ranges and flags that go together. 0, or
    -1 with the message printed. */
static int check_options(const rpc_ps_options_t *o)
{
    int64_t trainers = o->world.world_size - o->num_servers;
    const char *bad = o->num_gpus != 0 ? "--num_gpus: this build is CPU-only; use --num_gpus=0"
        : trainers < 1 ? "--world_size and --num_servers leave no trainer (need world_size > "
                         "num_servers >= 1)"
        : o->num_servers > PS_STAGES_MAX ? "--num_servers: at most " TEXT(PS_STAGES_MAX) " shards"
        : o->max_batch_size < 0 || (o->max_batch_size > 0 && o->max_batch_size < RPC_PS_EVAL_BATCH)
        ? "--max_batch_size: 0 (the default) or at least " TEXT(
              RPC_PS_EVAL_BATCH) " (the evaluation's "
                                 "batches)"
        : o->max_inflight < -1 || o->max_inflight > 1000000
        ? "--max_inflight: -1 (no limit), 0 (2 per core) or a number of batches"
        : o->resume && !o->checkpoint
        ? "--resume needs --checkpoint=PREFIX (the files to resume from)"
        : o->progress_s < 0          ? "--progress_s must be >= 0"
        : o->server_wait_s > 86400   ? "--server_wait_s: at most 86400"
        : o->min_trainers > trainers ? "--min_trainers: at most the trainers"
        : o->lr <= 0                 ? "--lr must be > 0"
        : (o->save_model && !o->save_model[0]) || (o->init_from && !o->init_from[0])
        ? "--save_model and --init_from take a file name"
        : NULL;
    if (bad) {
        fprintf(stderr, "rpc_ps: %s\n", bad);
        return -1;
    }
    /* Refused now rather than after the training: a file rank 0 cannot
       write, one a server cannot read. */
    if (o->save_model && o->world.rank == 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o->save_model);
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[slash == dir ? 1 : 0] = 0;
        if (access(slash ? dir : ".", W_OK) < 0) {
            fprintf(stderr, "rpc_ps: --save_model=%s: cannot write in %s (%s)\n", o->save_model,
                    slash ? dir : ".", strerror(errno));
            return -1;
        }
    }
    if (o->init_from && o->world.rank < o->num_servers && access(o->init_from, R_OK) < 0) {
        fprintf(stderr, "rpc_ps: --init_from=%s: %s\n", o->init_from, strerror(errno));
        return -1;
    }
    char path[2048];
    if (o->data_dir && o->world.rank >= o->num_servers &&
        zd_dataset_find_file(o->data_dir, ZD_DATASET_TRAIN, "images", path, sizeof path) < 0) {
        fprintf(stderr, "rpc_ps: %s\n", zd_error_last());
        return -1;
    }
    return 0;
}

int rpc_ps_options_parse(int argc, char **argv, rpc_ps_options_t *o)
{
    *o = (rpc_ps_options_t){.world = flags_world_default(),
                            .num_servers = 1,
                            .batch_size = 32,
                            .epochs = 1,
                            .seed = 1,
                            .log_interval = 0,
                            .check_interval = 5,
                            .lr = 0.03,
                            .progress_s = 5,
                            .init_timeout_s = 60,
                            .checkpoint_every = 100,
                            .min_trainers = 1,
                            .server_wait_s = 120};
    const flag_t flags[] = {
        FLAGS_WORLD(o->world),
        {"num_gpus", FLAG_INT, &o->num_gpus, "must be 0: this build is CPU-only"},
        {"num_servers", FLAG_COUNT, &o->num_servers, "parameter-server shards"},
        {"data_dir", FLAG_STRING, &o->data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"batch_size", FLAG_COUNT, &o->batch_size, "samples per batch"},
        {"lr", FLAG_DOUBLE, &o->lr, "SGD learning rate"},
        {"epochs", FLAG_COUNT, &o->epochs, "passes over the training set"},
        {"max_batches", FLAG_INDEX, &o->max_batches, "stop each trainer after N batches (0: none)"},
        {"seed", FLAG_INT, &o->seed, "seed of the weights, shuffling and dropout"},
        {"log_interval", FLAG_INDEX, &o->log_interval,
         "print the tutorial's loss line every N batches of an epoch (0: none; the tutorial "
         "has 5)"},
        {"progress_s", FLAG_DOUBLE, &o->progress_s,
         "print a progress line (batch, samples/s, mean loss, time left) every N seconds "
         "(0: none)"},
        {"checkpoint", FLAG_STRING, &o->checkpoint,
         "servers save their parameters to PREFIX.shardK every --checkpoint_every batches of a "
         "trainer"},
        {"checkpoint_every", FLAG_COUNT, &o->checkpoint_every, "batches between checkpoints"},
        {"resume", FLAG_BOOL, &o->resume,
         "start from the --checkpoint files: weights, and each trainer's position (a server "
         "shard restarted with it into the running world serves from its checkpoint)"},
        {"server_wait_s", FLAG_COUNT, &o->server_wait_s,
         "with --checkpoint, a trainer whose server shard was lost waits this long for it to "
         "come back (restarted with --resume), then goes on from its last checkpoint"},
        {"save_model", FLAG_STRING, &o->save_model,
         "at the end rank 0 writes the trained Net, gathered from every server shard, to this "
         "safetensors file under PyTorch's state_dict() names (metadata: step, test_accuracy)"},
        {"init_from", FLAG_STRING, &o->init_from,
         "the servers start from the Net in this safetensors file (PyTorch's state_dict() "
         "names, e.g. saved by PyTorch or by --save_model) instead of the seed's weights"},
        {"curves", FLAG_STRING, &o->curves,
         "each trainer writes its loss, throughput and accuracy curves to PREFIX.rankN.csv "
         "(as they come) and .png (at each evaluation)"},
        {"eval_every", FLAG_INDEX, &o->eval_every,
         "each trainer evaluates the weights every N of its batches (0: only at the end)"},
        {"eval_samples", FLAG_INDEX, &o->eval_samples, "test images to evaluate (0: all)"},
        {"check_interval", FLAG_INDEX, &o->check_interval,
         "fetch the server's gradients to check them every N batches (0: never)"},
        {"no_dropout", FLAG_BOOL, &o->no_dropout, "train with dropout off"},
        {"min_trainers", FLAG_INDEX, &o->min_trainers,
         "the server exits with an error when fewer trainers finished their batches (a lost "
         "trainer does not stop the others)"},
        {"max_staleness", FLAG_INDEX, &o->max_staleness,
         "a trainer more than N batches ahead of the slowest trainer still training waits "
         "for it (0: no bound)"},
        {"init_timeout_s", FLAG_INT, &o->init_timeout_s,
         "give up when the world has not gathered after this long"},
        {"max_batch_size", FLAG_INT, &o->max_batch_size,
         "servers refuse a larger batch (0: 4 x --batch_size, at least 1024)"},
        {"max_inflight", FLAG_INT, &o->max_inflight,
         "a server holds the batches of at most N trainers between their forward and the end "
         "of their backward; the others wait their turn (0: 2 per core, -1: no limit)"},
        {"threads", FLAG_INT, &o->threads,
         "compute threads of this process (0: 1 for trainers and for servers of several "
         "trainers, which run their passes side by side; else every core)"},
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "The parameter-server tutorial: rank 0 serves, the others train.");
    if (pr != 0)
        return pr > 0 ? 1 : 2;
    /* 4: one server and three trainers, the tutorial's world. */
    if (flags_world_resolve(&o->world, 4, "rpc_ps") < 0 || check_options(o) < 0)
        return 2;
    bool server = o->world.rank < o->num_servers;
    if (server && o->world.rank == 0)
        snprintf(o->name, sizeof o->name, "parameter_server");
    else if (server)
        snprintf(o->name, sizeof o->name, "parameter_server_%lld", (long long)o->world.rank);
    else
        snprintf(o->name, sizeof o->name, "trainer_%lld", (long long)o->world.rank);
    /* Trainers only compute losses; a server with several trainers runs
       their passes at once, one thread each, which beats splitting every
       pass over all cores while the passes wait for each other. */
    if (o->threads == 0 && (!server || o->world.world_size - o->num_servers >= 2))
        o->threads = 1;
    if (o->threads > 0 && zd_nn_set_num_threads((int)o->threads) < 0) {
        fprintf(stderr, "rpc_ps: --threads: %s\n", zd_error_last());
        return 2;
    }
    /* With checkpoints a lost rank 0 may come back: the others keep
       registering with the rendezvous address while trainers wait for it
       (set for every rank: rank 0 hands it to its members). */
    char wait_s[32];
    snprintf(wait_s, sizeof wait_s, "%lld", (long long)o->server_wait_s);
    if (o->checkpoint && !getenv("ZDIST_MASTER_WAIT_S"))
        setenv("ZDIST_MASTER_WAIT_S", wait_s, 1);
    return 0;
}

int rpc_ps_join(const rpc_ps_options_t *o)
{
    printf("%s: joining a world of %lld at %s:%lld\n", o->name, (long long)o->world.world_size,
           o->world.master_addr ? o->world.master_addr : "*", (long long)o->world.master_port);
    return flags_world_init(&o->world, o->name, o->init_timeout_s * 1000, "rpc_ps");
}
