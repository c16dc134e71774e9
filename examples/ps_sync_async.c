/* SPDX-License-Identifier: MIT */
/*  ps_sync_async: synchronous and asynchronous parameter-server training,
    Ray's parameter-server example on zdist.

        tools/launch --nproc=4 -- ps_sync_async --mode=sync --num_workers=2
        tools/launch --nproc=5 -- ps_sync_async --mode=async --num_workers=2 --num_servers=2

    Rank 0 is the driver, ranks 1..S the parameter servers (shards of the
    parameter-server layer, <zdist/ps.h>), the next num_workers ranks the
    data workers. Each rank runs this same program; the driver creates
    the workers' actors, trains through the servers as their trainer
    (ps_core.h), and prints the test accuracy every 10 iterations, and a
    progress line every --progress_s seconds (progress.h). */
#include <stdio.h>
#include <string.h>

#include <zdist/error.h>
#include "examples/flags.h"
#include "examples/ps_core.h"
#include <zdist/nn.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    /* Line by line even into a pipe (the launcher labels lines as they come). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *prog = "ps_sync_async", *mode = "sync";
    ps_options_t o = ps_options_default();
    o.progress_s = 5;
    flags_world_t w = flags_world_default();
    int64_t workers = o.num_workers, servers = o.num_servers, init_timeout_s = 0;
    const flag_t flags[] = {
        {"mode", FLAG_STRING, &mode, "sync or async"},
        {"num_workers", FLAG_INT, &workers, "data workers (one process each)"},
        {"num_servers", FLAG_INT, &servers, "parameter servers sharing the weights"},
        {"iterations", FLAG_INT, &o.iterations,
         "sync: rounds over all workers; async: iterations x num_workers updates"},
        {"lr", FLAG_DOUBLE, &o.lr, "SGD learning rate of the servers"},
        {"batch_size", FLAG_INT, &o.batch_size, "samples per gradient"},
        {"data_dir", FLAG_STRING, &o.data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"seed", FLAG_INT, &o.seed, "initial weights and the workers' data orders"},
        {"model", FLAG_STRING, &o.model, "convnet or net"},
        {"eval_interval", FLAG_INT, &o.eval_interval, "test accuracy every N iterations"},
        {"progress_s", FLAG_DOUBLE, &o.progress_s,
         "the driver prints a progress line (iteration, samples/s, time left) every N "
         "seconds (0: none)"},
        {"test_size", FLAG_INT, &o.test_size, "evaluate on the first N test images (0: all)"},
        {"train_size", FLAG_INT, &o.train_size, "train on the first N images (0: all)"},
        {"max_staleness", FLAG_INT, &o.max_staleness,
         "async: a worker runs at most K updates ahead of the slowest (0: no bound)"},
        {"straggler_ms", FLAG_INT, &o.straggler_ms,
         "worker 0 takes this many ms longer per gradient (to see a straggler)"},
        {"init_timeout_s", FLAG_INT, &init_timeout_s,
         "give up when the world has not gathered after this long (0: the RPC default)"},
        FLAGS_WORLD(w),
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "Synchronous or asynchronous parameter-server training.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (strcmp(mode, "sync") != 0 && strcmp(mode, "async") != 0) {
        fprintf(stderr, "%s: --mode must be sync or async, got \"%s\"\n", prog, mode);
        return 2;
    }
    o.async = strcmp(mode, "async") == 0;
    o.num_workers = workers > PS_MAX_WORKERS || workers < 0 ? -1 : (int)workers;
    o.num_servers = servers > PS_MAX_SERVERS || servers < 0 ? -1 : (int)servers;
    if (flags_world_resolve(&w, 1 + servers + workers, prog) < 0)
        return 2;
    if (!(o.progress_s >= 0)) {
        fprintf(stderr, "%s: --progress_s must be >= 0\n", prog);
        return 2;
    }
    if (ps_options_check(&o, (int)w.world_size) < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        return 2;
    }

    char name[32];
    snprintf(name, sizeof name,
             w.rank == 0             ? "driver"
                 : w.rank <= servers ? "ps%lld"
                                     : "worker%lld",
             (long long)(w.rank - 1 - (w.rank <= servers ? 0 : servers)));
    zd_ps_server_t *server = NULL;
    if (ps_register() < 0 || ps_server_new(&o, (int)w.rank, &server) < 0) {
        fprintf(stderr, "%s: %s: %s\n", prog, name, zd_error_last());
        return 1;
    }
    if (flags_world_init(&w, name, init_timeout_s > 0 ? init_timeout_s * 1000 : -1, prog) < 0) {
        zd_ps_server_free(server);
        return 1;
    }
    int rc = 0;
    if (w.rank == 0 && ps_run_driver(&o, NULL) < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        rc = 1;
    }
    /* The servers and workers serve the driver's calls until everyone is here. */
    if (zd_rpc_shutdown(true, 0) < 0) {
        fprintf(stderr, "%s: %s: shutdown: %s\n", prog, name, zd_error_last());
        rc = 1;
    }
    zd_ps_server_free(server);
    return rc;
}
