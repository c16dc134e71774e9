/* SPDX-License-Identifier: MIT */
/*  pipeline: pipeline-parallel training of the tutorial Net over RPC, in
    the style of PyTorch's "Distributed Pipeline Parallelism Using RPC".

        tools/launch --nproc=3 -- pipeline --num_split=4

    Rank 0 drives; ranks 1 and 2 each hold one half of the Net
    (pipeline_core.h). The driver trains with 1 micro-batch per batch and
    then with --num_split, printing the throughput of each, so the overlap
    of the two shards shows. */
#include <stdio.h>

#include <zdist/error.h>
#include "examples/flags.h"
#include "examples/pipeline_core.h"
#include <zdist/nn.h>
#include <zdist/rpc.h>

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    /* Line by line even into a pipe (the launcher labels lines as they come). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *prog = "pipeline";
    pipeline_options_t o = pipeline_options_default();
    flags_world_t w = flags_world_default();
    int64_t split_size = 0, init_timeout_s = 0;
    bool no_dropout = false;
    const flag_t flags[] = {
        {"num_split", FLAG_INT, &o.num_split, "micro-batches per batch"},
        {"split_size", FLAG_INT, &split_size,
         "rows per micro-batch instead of --num_split (0: use --num_split)"},
        {"baseline", FLAG_BOOL, &o.baseline, "first run with 1 micro-batch, for comparison"},
        {"batch_size", FLAG_INT, &o.batch_size, "samples per batch"},
        {"iterations", FLAG_INT, &o.iterations, "batches per run"},
        {"max_batches", FLAG_INT, &o.iterations, "same as --iterations"},
        {"lr", FLAG_DOUBLE, &o.lr, "SGD learning rate (DistributedOptimizer)"},
        {"seed", FLAG_INT, &o.seed, "initial weights, data order, dropout"},
        {"data_dir", FLAG_STRING, &o.data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"no_dropout", FLAG_BOOL, &no_dropout, "train with dropout off"},
        {"test_size", FLAG_INT, &o.test_size, "test images evaluated at the end (0: none)"},
        {"log_interval", FLAG_INT, &o.log_interval, "print the loss every N batches"},
        {"init_timeout_s", FLAG_INT, &init_timeout_s,
         "give up when the world has not gathered after this long (0: the RPC default)"},
        FLAGS_WORLD(w),
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "Pipeline-parallel training of the Net split over two processes.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    o.dropout = !no_dropout;
    if (split_size > 0)
        o.num_split = (o.batch_size + split_size - 1) / split_size;
    if (flags_world_resolve(&w, PIPELINE_WORLD_SIZE, prog) < 0)
        return 2;
    if (pipeline_options_check(&o, (int)w.world_size) < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        return 2;
    }
    const char *names[PIPELINE_WORLD_SIZE] = {"master", "shard1", "shard2"};
    if (pipeline_register() < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        return 1;
    }
    if (flags_world_init(&w, names[w.rank], init_timeout_s > 0 ? init_timeout_s * 1000 : -1, prog) <
        0)
        return 1;
    int rc = 0;
    if (w.rank == 0 && pipeline_run_driver(&o, NULL) < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        rc = 1;
    }
    if (zd_rpc_shutdown(true, 0) < 0) {
        fprintf(stderr, "%s: %s: shutdown: %s\n", prog, names[w.rank], zd_error_last());
        rc = 1;
    }
    return rc;
}
