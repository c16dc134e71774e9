/* SPDX-License-Identifier: MIT */
/*  add: rank 0 calls "add" on worker1 and prints the sum.
    Run as a world of two processes:  launch --nproc=2 --no_rank_flags -- ./add
    (or by hand, with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set). */
#include <stdio.h>
#include <zdist/zdist.h>

/*  The handler: args is the argument list (borrowed); the result is a new
    value, or NULL to answer with the last error (here ZD_UNPACK's). */
static zd_value_t *add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t a, b;
    return ZD_UNPACK(args, &a, &b) < 0 ? NULL : zd_value_int(a + b);
}

int main(void)
{
    /* Register before zd_rpc_init: a peer may call as soon as its init returns.
       NULL name: "worker<rank>"; rank -1, world size 0: $RANK, $WORLD_SIZE;
       NULL options: the defaults, with $MASTER_ADDR and $MASTER_PORT. */
    if (zd_rpc_register("add", add, NULL) < 0 || zd_rpc_init(NULL, -1, 0, NULL) < 0)
        goto fail;
    if (zd_rpc_rank() == 0) {
        zd_value_t *result;
        int64_t sum;
        /* _take: the call takes over the list ZD_ARGS built, and frees it. */
        if (zd_rpc_sync_take(zd_rpc_worker("worker1"), "add", ZD_ARGS(2, 3),
                             ZD_TIMEOUT_DEFAULT, &result) < 0)
            goto fail;
        int rc = zd_value_get_int(result, &sum);
        zd_value_unref(result);
        if (rc < 0)
            goto fail;
        printf("add(2, 3) on worker1 = %lld\n", (long long)sum);
    }
    /* Waits for every worker to get here (by default without limit), then closes. */
    if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "add: %s\n", zd_error_last());
    return 1;
}
