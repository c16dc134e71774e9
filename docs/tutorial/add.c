/*  add: rank 0 calls "add" on worker1 and prints the sum.
    Run as a world of two processes, e.g.
        launch --nproc=2 --no_rank_flags -- ./add
    or by hand with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set. */
#include <stdio.h>
#include <zdist/error.h>
#include <zdist/rpc.h>

/*  The handler: args is the argument list (borrowed); the result is a new
    value, or NULL with zd_error_set() to answer with an error. */
static zd_value_t *add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t a, b;
    if (zd_rpc_arg_int(args, 0, &a) < 0 || zd_rpc_arg_int(args, 1, &b) < 0)
        return NULL;   /* the caller gets "argument 1: expected int, got ..." */
    return zd_value_int(a + b);
}

int main(void)
{
    /* Register before zd_rpc_init: a peer may call as soon as its init returns.
       NULL name: "worker<rank>"; rank -1 and world size 0: $RANK and
       $WORLD_SIZE; NULL options: the defaults, $MASTER_ADDR, $MASTER_PORT. */
    if (zd_rpc_register("add", add, NULL) < 0 || zd_rpc_init(NULL, -1, 0, NULL) < 0)
        goto fail;
    if (zd_rpc_rank() == 0) {
        /* 'i' reads an int64_t: cast the literals. */
        zd_value_t *args = zd_rpc_args("ii", (int64_t)2, (int64_t)3), *result;
        if (!args)
            goto fail;
        int rc = zd_rpc_sync(zd_rpc_worker("worker1"), "add", args, ZD_TIMEOUT_DEFAULT,
                             &result);
        zd_value_unref(args);   /* calls borrow their arguments */
        if (rc < 0)
            goto fail;
        int64_t sum;
        rc = zd_value_get_int(result, &sum);
        zd_value_unref(result);
        if (rc < 0)
            goto fail;
        printf("add(2, 3) on worker1 = %lld\n", (long long)sum);
    }
    /* Waits for every worker to get here, then closes; 0: no time limit. */
    if (zd_rpc_shutdown(true, 0) < 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "add: %s\n", zd_error_last());
    return 1;
}
