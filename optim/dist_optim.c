/*  dist_optim.c: the DistributedOptimizer. As PyTorch's holds RRefs to
    _LocalOptimizer objects, each owner's local optimizer is a local object
    value behind an RRef that the owner makes (rpc_rref_new) and hands to
    the client; steps are methods called through those RRefs (or directly,
    for the process's own parameters), and releasing them frees the
    optimizers on their owners. */
#include "optim/dist_optim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/dist_autograd.h"
#include "autograd/error.h"

/*  ---- owner side ---- */

/*  The type of the local optimizer objects: an optim_t. */
#define LOCAL_OPTIMIZER "LocalOptimizer"

static pthread_rwlock_t params_lock;
static pthread_once_t params_lock_once = PTHREAD_ONCE_INIT;

static void params_lock_init(void)
{
    /* Writers first: steps must not starve behind a stream of forwards. */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&params_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
}

void dist_optim_read_lock(void)
{
    pthread_once(&params_lock_once, params_lock_init);
    pthread_rwlock_rdlock(&params_lock);
}

void dist_optim_read_unlock(void)
{
    pthread_rwlock_unlock(&params_lock);
}

static const char *self_desc(char *buf, size_t size)
{
    snprintf(buf, size, "\"%s\" (rank %d)", rpc_name(), rpc_rank());
    return buf;
}

static void local_free(void *opt)
{
    optim_free(opt);
}

/*  A new RRef owned here to a local optimizer over the values of rrefs
    (owned here too), or NULL. */
static rpc_rref_t *local_new(const char *cfg_text, rpc_rref_t *const *rrefs, int n)
{
    optim_config_t cfg;
    if (optim_config_parse(cfg_text, &cfg) < 0)
        return NULL;
    tensor_t **params = calloc((size_t)(n > 0 ? n : 1), sizeof *params);
    rpc_value_t **values = calloc((size_t)(n > 0 ? n : 1), sizeof *values);
    int rc = params && values ? 0 : error_set("out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!rpc_rref_is_owner(rrefs[i]))
            rc = error_set("parameter %d is owned by rank %d, not here", i,
                           rpc_rref_owner(rrefs[i]));
        else if (rpc_rref_local_value(rrefs[i], &values[i]) < 0)
            rc = error_wrap("parameter %d", i);
        else if (rpc_value_get_tensor(values[i], &params[i]) < 0)
            rc = error_wrap("parameter %d", i);
    }
    optim_t *opt = rc == 0 ? optim_new(&cfg, n, params) : NULL;
    rpc_value_t *v = opt ? rpc_value_object(opt, local_free, LOCAL_OPTIMIZER) : NULL;
    rpc_rref_t *r = v ? rpc_rref_new(v) : NULL;
    rpc_value_unref(v);
    for (int i = 0; values && i < n; i++)
        rpc_value_unref(values[i]);
    free(values);
    free(params);
    return r;
}

static int local_step(optim_t *opt, int64_t ctx)
{
    int n = optim_n_params(opt), rc = 0;
    tensor_t **grads = calloc((size_t)(n > 0 ? n : 1), sizeof *grads);
    if (!grads)
        return error_set("out of memory");
    for (int i = 0; rc == 0 && i < n; i++)
        rc = dist_autograd_get_gradient(ctx, optim_param(opt, i), &grads[i]);
    if (rc == 0) {
        pthread_once(&params_lock_once, params_lock_init);
        pthread_rwlock_wrlock(&params_lock);
        rc = optim_step(opt, grads);
        pthread_rwlock_unlock(&params_lock);
    }
    for (int i = 0; i < n; i++)
        tensor_unref(grads[i]);
    free(grads);
    return rc;
}

/*  "__dist_optim_new"(config, param RRef...) -> RRef to the local optimizer */
static rpc_value_t *handle_new(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *cfg;
    int n = (int)rpc_list_len(args) - 1;
    rpc_rref_t **rrefs = calloc((size_t)(n > 0 ? n : 1), sizeof *rrefs), *r = NULL;
    int rc = rrefs && rpc_arg_string(args, 0, &cfg) == 0 ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = rpc_arg_rref(args, (size_t)(1 + i), &rrefs[i]);
    if (rc == 0)
        r = local_new(cfg, rrefs, n);
    free(rrefs);
    rpc_value_t *v = r ? rpc_value_rref(r) : NULL;
    rpc_rref_unref(r);
    return v;
}

/*  "__dist_optim_step"(local optimizer, context id), called through its RRef */
static rpc_value_t *handle_step(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    void *opt;
    int64_t ctx;
    if (rpc_arg_object(args, 0, LOCAL_OPTIMIZER, &opt) < 0 || rpc_arg_int(args, 1, &ctx) < 0 ||
        local_step(opt, ctx) < 0)
        return NULL;
    return rpc_value_none();
}

int dist_optim_init(void)
{
    pthread_once(&params_lock_once, params_lock_init);
    if (rpc_register("__dist_optim_new", handle_new, NULL) < 0 ||
        rpc_register("__dist_optim_step", handle_step, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- client side ---- */

struct dist_optim {
    int n;
    rpc_rref_t **owners;    /* per owner, an RRef to its local optimizer */
};

int dist_optim_num_owners(const dist_optim_t *opt)
{
    return opt->n;
}

static int owner_error(int owner, const char *what)
{
    rpc_worker_info_t info;
    const char *name = rpc_get_worker_info_by_rank(owner, &info) == 0 ? info.name : "?";
    return error_wrap("%s on \"%s\" (rank %d)", what, name, owner);
}

int dist_optim_new(const optim_config_t *cfg, rpc_rref_t *const *params, int n,
                   dist_optim_t **out)
{
    char text[512], me[200];
    *out = NULL;
    if (optim_config_check(cfg) < 0)
        return -1;
    if (n < 1)
        return error_set("dist_optim: no parameters given");
    if (optim_config_format(cfg, text, sizeof text) < 0)
        return -1;
    dist_optim_t *o = calloc(1, sizeof *o);
    int world = rpc_world_size();
    if (!o || world < 1) {
        free(o);
        return error_set(world < 1 ? "dist_optim: RPC is not running" : "out of memory");
    }
    o->owners = calloc((size_t)world, sizeof *o->owners);
    rpc_future_t **fs = calloc((size_t)world, sizeof *fs);
    int rc = o->owners && fs ? 0 : error_set("out of memory");
    /* One call per owner, all in flight at once. */
    for (int owner = 0; rc == 0 && owner < world; owner++) {
        rpc_value_t *args = rpc_args("s", text);
        int count = 0;
        for (int i = 0; args && i < n; i++)
            if (rpc_rref_owner(params[i]) == owner) {
                count++;
                if (rpc_list_append(args, rpc_value_rref(params[i])) < 0)
                    rpc_value_unref(args), args = NULL;
            }
        if (!args) {
            rc = -1;
        } else if (count > 0 && owner == rpc_rank()) {
            /* Our own parameters: no message. */
            size_t len = rpc_list_len(args);
            rpc_rref_t **mine = calloc(len, sizeof *mine), *r = NULL;
            for (size_t i = 1; mine && i < len; i++)
                rpc_arg_rref(args, i, &mine[i - 1]);
            if (!mine)
                rc = error_set("out of memory");
            else if (!(r = local_new(text, mine, count)))
                rc = error_wrap("creating the optimizer on %s", self_desc(me, sizeof me));
            else
                o->owners[o->n++] = r;
            free(mine);
        } else if (count > 0) {
            fs[owner] = rpc_async(owner, "__dist_optim_new", args, RPC_TIMEOUT_DEFAULT);
            if (!fs[owner])
                rc = owner_error(owner, "creating the optimizer");
        }
        rpc_value_unref(args);
    }
    for (int owner = 0; owner < world; owner++) {
        if (!fs || !fs[owner])
            continue;
        rpc_rref_t *r;
        if (rc == 0) {
            if (rpc_wait(fs[owner], -1) < 0 ||
                rpc_value_get_rref(rpc_future_value(fs[owner]), &r) < 0)
                rc = owner_error(owner, "creating the optimizer");
            else
                o->owners[o->n++] = rpc_rref_ref(r);
        }
        rpc_future_unref(fs[owner]);
    }
    free(fs);
    if (rc < 0) {
        dist_optim_free(o);
        return -1;
    }
    *out = o;
    return 0;
}

/*  Steps our own local optimizer, without a message. */
static int step_here(rpc_rref_t *r, int64_t context_id)
{
    rpc_value_t *v;
    void *opt;
    if (rpc_rref_local_value(r, &v) < 0)
        return -1;
    int rc = rpc_value_get_object(v, LOCAL_OPTIMIZER, &opt) < 0 ? -1 : local_step(opt, context_id);
    rpc_value_unref(v);
    return rc;
}

int dist_optim_step(dist_optim_t *o, int64_t context_id)
{
    rpc_future_t **fs = calloc((size_t)(o->n ? o->n : 1), sizeof *fs);
    rpc_value_t *args = rpc_args("i", context_id);
    int rc = fs && args ? 0 : error_set("out of memory"), local = -1;
    char me[200];
    for (int i = 0; rc == 0 && i < o->n; i++)
        if (rpc_rref_is_owner(o->owners[i]))
            local = i;   /* stepped below, while the others run */
    /* Without a local owner, the last owner is called with rpc_sync while the
       others run: its answer comes straight to this thread, one hand-off
       fewer than a future's (most worlds have one owner). */
    int last_sync = local < 0 ? o->n - 1 : -1;
    for (int i = 0; rc == 0 && i < o->n; i++) {
        if (i == local || i == last_sync)
            continue;
        fs[i] = rpc_rref_rpc_async(o->owners[i], "__dist_optim_step", args, RPC_TIMEOUT_DEFAULT);
        if (!fs[i])
            rc = owner_error(rpc_rref_owner(o->owners[i]), "step");
    }
    char first[1024] = "";   /* the first failure is the one reported */
    if (rc == 0 && last_sync >= 0) {
        rpc_value_t *r = NULL;
        if (rpc_rref_rpc_sync(o->owners[last_sync], "__dist_optim_step", args,
                              RPC_TIMEOUT_DEFAULT, &r) < 0)
            rc = owner_error(rpc_rref_owner(o->owners[last_sync]), "step");
        rpc_value_unref(r);
    }
    rpc_value_unref(args);
    if (rc < 0)
        snprintf(first, sizeof first, "%s", error_last());
    if (rc == 0 && local >= 0 && step_here(o->owners[local], context_id) < 0) {
        rc = error_wrap("step on %s", self_desc(me, sizeof me));
        snprintf(first, sizeof first, "%s", error_last());
    }
    for (int i = 0; fs && i < o->n; i++) {
        if (!fs[i])
            continue;
        if (rpc_wait(fs[i], -1) < 0 && rc == 0) {
            rc = owner_error(rpc_rref_owner(o->owners[i]), "step");
            snprintf(first, sizeof first, "%s", error_last());
        }
        rpc_future_unref(fs[i]);
    }
    free(fs);
    if (rc < 0)
        error_set("%s", first);
    return rc;
}

void dist_optim_free(dist_optim_t *o)
{
    if (!o)
        return;
    /* The owners free the local optimizers when these RRefs are released. */
    for (int i = 0; i < o->n; i++)
        rpc_rref_unref(o->owners[i]);
    free(o->owners);
    free(o);
}
