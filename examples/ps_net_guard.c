/* SPDX-License-Identifier: MIT */
/*  ps_net_guard.c: what the parameter server checks of its callers before
    it works for them (issue 11 point 3): a trainer's batch is a batch of
    MNIST images no larger than --max_batch_size, the features of fc1
    come from shard 0 only, and a trainer checkpoints and resumes only its
    own position. A refused call gets an error naming the caller, and the
    server prints a line about it. */
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/rpc.h>

static _Atomic int64_t max_batch = 1024;

void ps_net_set_max_batch(int64_t n)
{
    atomic_store(&max_batch, n > 0 ? n : 1024);
}

/*  Sets the error for the caller and prints it on the server: -1. */
static int refuse(const zd_rpc_call_t *call, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int refuse(const zd_rpc_call_t *call, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    fprintf(stderr, "parameter server %d: refused %s from \"%s\" (rank %d): %s\n", ps_shard.shard,
            zd_rpc_call_function(call), zd_rpc_call_caller_name(call),
            zd_rpc_call_caller_rank(call), why);
    return zd_error_set("%s refused by parameter server %d: %s", zd_rpc_call_function(call),
                        ps_shard.shard, why);
}

int ps_net_guard_batch(const zd_rpc_call_t *call, const zd_tensor_t *x)
{
    const int64_t *s = zd_tensor_shape(x);
    int64_t max = atomic_load(&max_batch);
    if (zd_tensor_dtype(x) != ZD_FLOAT32 || zd_tensor_ndim(x) != 4 || s[1] != 1 || s[2] != 28 ||
        s[3] != 28) {
        char dims[128] = "";
        for (int d = 0; d < zd_tensor_ndim(x); d++)
            snprintf(dims + strlen(dims), sizeof dims - strlen(dims), d ? ",%lld" : "%lld",
                     (long long)s[d]);
        return refuse(call,
                      "a batch must be float32 [N,1,28,28] (MNIST images), this one is "
                      "%s [%s]",
                      zd_tensor_dtype_name(zd_tensor_dtype(x)), dims);
    }
    if (s[0] < 1 || s[0] > max)
        return refuse(call,
                      "a batch of %lld images; this server takes 1 to %lld "
                      "(--max_batch_size)",
                      (long long)s[0], (long long)max);
    return 0;
}

int ps_net_guard_shard0(const zd_rpc_call_t *call, const char *what)
{
    if (zd_rpc_call_caller_rank(call) != 0)
        return refuse(call, "only shard 0 (rank 0) asks for %s", what);
    return 0;
}

int ps_net_guard_features(const zd_rpc_call_t *call, const zd_tensor_t *flat)
{
    if (ps_net_guard_shard0(call, "a part of fc1") < 0)
        return -1;
    int64_t max = atomic_load(&max_batch);
    if (zd_tensor_dtype(flat) != ZD_FLOAT32 || zd_tensor_ndim(flat) != 2 ||
        zd_tensor_shape(flat)[0] < 1 || zd_tensor_shape(flat)[0] > max)
        return refuse(call, "features must be float32 [N, features] with 1 <= N <= %lld",
                      (long long)max);
    return 0;
}

int ps_net_guard_trainer(const zd_rpc_call_t *call, int64_t trainer)
{
    int64_t own = (int64_t)zd_rpc_call_caller_rank(call) - ps_shard.num_shards;
    if (own < 0)
        return refuse(call, "only trainers have a position (rank %d is a server)",
                      zd_rpc_call_caller_rank(call));
    if (trainer != own)
        return refuse(call,
                      "the position of trainer %lld, but the caller is trainer %lld: "
                      "a trainer records and reads only its own",
                      (long long)trainer, (long long)own);
    return 0;
}
