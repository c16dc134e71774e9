/* SPDX-License-Identifier: MIT */
/*  dist_optim.c: the DistributedOptimizer. As PyTorch's holds RRefs to
    _LocalOptimizer objects, each owner's local optimizer is a local object
    value behind an RRef that the owner makes (zd_rref_new) and hands to
    the client; steps are methods called through those RRefs (or directly,
    for the process's own parameters), and releasing them frees the
    optimizers on their owners. */
#include <zdist/dist_optim.h>

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include <zdist/log.h>

/*  ---- owner side ---- */

/*  The type of the local optimizer objects: an zd_optim_t. */
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

void zd_dist_optim_read_lock(void)
{
    pthread_once(&params_lock_once, params_lock_init);
    pthread_rwlock_rdlock(&params_lock);
}

void zd_dist_optim_read_unlock(void)
{
    pthread_rwlock_unlock(&params_lock);
}

/*  Steps applied here: changed only under the write lock. */
static _Atomic uint64_t params_version;

uint64_t zd_dist_optim_version(void)
{
    return atomic_load(&params_version);
}

static const char *self_desc(char *buf, size_t size)
{
    snprintf(buf, size, "\"%s\" (rank %d)", zd_rpc_name(), zd_rpc_rank());
    return buf;
}

static void local_free(void *opt)
{
    zd_optim_free(opt);
}

/*  A new RRef owned here to a local optimizer over the values of rrefs
    (owned here too), or NULL. */
static zd_rref_t *local_new(const char *cfg_text, zd_rref_t *const *rrefs, int n)
{
    zd_optim_config_t cfg;
    if (zd_optim_config_parse(cfg_text, &cfg) < 0)
        return NULL;
    zd_tensor_t **params = calloc((size_t)(n > 0 ? n : 1), sizeof *params);
    zd_value_t **values = calloc((size_t)(n > 0 ? n : 1), sizeof *values);
    int rc = params && values ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!zd_rref_is_owner(rrefs[i]))
            rc = zd_error_set("parameter %d is owned by rank %d, not here", i,
                           zd_rref_owner(rrefs[i]));
        else if (zd_rref_local_value(rrefs[i], &values[i]) < 0)
            rc = zd_error_wrap("parameter %d", i);
        else if (zd_value_get_tensor(values[i], &params[i]) < 0)
            rc = zd_error_wrap("parameter %d", i);
    }
    zd_optim_t *opt = rc == 0 ? zd_optim_new(&cfg, n, params) : NULL;
    zd_value_t *v = opt ? zd_value_object(opt, local_free, LOCAL_OPTIMIZER) : NULL;
    zd_rref_t *r = v ? zd_rref_new(v) : NULL;
    zd_value_unref(v);
    for (int i = 0; values && i < n; i++)
        zd_value_unref(values[i]);
    free(values);
    free(params);
    return r;
}

/*  A step never applies a gradient that is not finite: one nan would
    spread to every user of the parameters (issue 12 point 5). from is the
    rank that asked for the step (-1: this process). */
static int local_step_from(zd_optim_t *opt, int64_t ctx, int from);

static int check_finite(zd_tensor_t *const *grads, int n, int64_t ctx, int from)
{
    for (int i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        const float *d = zd_tensor_data(grads[i]);
        int64_t bad = -1;
        for (int64_t k = 0; k < zd_tensor_numel(grads[i]) && bad < 0; k++)
            if (!isfinite(d[k]))
                bad = k;
        if (bad < 0)
            continue;
        char who[160] = "this process";
        zd_rpc_worker_info_t info;
        if (from >= 0 && zd_rpc_get_worker_info_by_rank(from, &info) == 0)
            snprintf(who, sizeof who, "worker \"%s\" (rank %d)", info.name, from);
        zd__log(ZD_LOG_WARN, "dist_optim: the gradient of parameter %d in context %lld of %s "
                "holds %g at element %lld: step refused, nothing applied", i, (long long)ctx, who,
                (double)d[bad], (long long)bad);
        return zd_error_set("dist_optim: the gradient of parameter %d holds %g (element %lld) "
                            "in context %lld of %s: the step was refused and nothing applied",
                            i, (double)d[bad], (long long)bad, (long long)ctx, who);
    }
    return 0;
}

static int local_step(zd_optim_t *opt, int64_t ctx)
{
    return local_step_from(opt, ctx, -1);
}

static int local_step_from(zd_optim_t *opt, int64_t ctx, int from)
{
    int n = zd_optim_n_params(opt), rc = 0;
    zd_tensor_t **grads = calloc((size_t)(n > 0 ? n : 1), sizeof *grads);
    if (!grads)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    for (int i = 0; rc == 0 && i < n; i++)
        rc = zd_dist_autograd_get_gradient(ctx, zd_optim_param(opt, i), &grads[i]);
    if (rc == 0)
        rc = check_finite(grads, n, ctx, from);
    if (rc == 0) {
        pthread_once(&params_lock_once, params_lock_init);
        pthread_rwlock_wrlock(&params_lock);
        rc = zd_optim_step(opt, grads);
        /* even a failed step may have changed some parameters */
        atomic_fetch_add(&params_version, 1);
        pthread_rwlock_unlock(&params_lock);
    }
    for (int i = 0; i < n; i++)
        zd_tensor_unref(grads[i]);
    free(grads);
    return rc;
}

/*  "__dist_optim_new"(config, param RRef...) -> RRef to the local optimizer */
static zd_value_t *handle_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *cfg;
    int n = (int)zd_list_len(args) - 1;
    zd_rref_t **rrefs = calloc((size_t)(n > 0 ? n : 1), sizeof *rrefs), *r = NULL;
    int rc = rrefs && zd_rpc_arg_string(args, 0, &cfg) == 0 ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = zd_rpc_arg_rref(args, (size_t)(1 + i), &rrefs[i]);
    if (rc == 0)
        r = local_new(cfg, rrefs, n);
    free(rrefs);
    zd_value_t *v = r ? zd_value_rref(r) : NULL;
    zd_rref_unref(r);
    return v;
}

/*  "__dist_optim_step"(local optimizer, context id), called through its RRef */
static zd_value_t *handle_step(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    void *opt;
    int64_t ctx;
    if (zd_rpc_arg_object(args, 0, LOCAL_OPTIMIZER, &opt) < 0 || zd_rpc_arg_int(args, 1, &ctx) < 0 ||
        local_step_from(opt, ctx, call ? zd_rpc_call_caller_rank(call) : -1) < 0)
        return NULL;
    return zd_value_none();
}

int zd_dist_optim_init(void)
{
    pthread_once(&params_lock_once, params_lock_init);
    if (zd_rpc_register("__dist_optim_new", handle_new, NULL) < 0 ||
        zd_rpc_register("__dist_optim_step", handle_step, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- client side ---- */

struct zd_dist_optim {
    int n;
    zd_rref_t **owners;    /* per owner, an RRef to its local optimizer */
};

int zd_dist_optim_num_owners(const zd_dist_optim_t *opt)
{
    return opt->n;
}

static int owner_error(int owner, const char *what)
{
    zd_rpc_worker_info_t info;
    bool no_init = zd_error_code() == ZD_ERR_NO_FUNCTION;
    const char *name = zd_rpc_get_worker_info_by_rank(owner, &info) == 0 ? info.name : "?";
    zd_error_wrap("%s on \"%s\" (rank %d)", what, name, owner);
    if (no_init) {   /* its functions are missing there: say what installs them */
        char text[1024];
        snprintf(text, sizeof text, "%s", zd_error_last());
        zd_error_set_code(ZD_ERR_NOT_INITIALIZED, "%s (zd_dist_optim_init() was not called on "
                          "\"%s\" before zd_rpc_init())", text, name);
    }
    return -1;
}

int zd_dist_optim_new(const zd_optim_config_t *cfg, zd_rref_t *const *params, int n,
                   zd_dist_optim_t **out)
{
    char text[512], me[200];
    *out = NULL;
    if (zd_optim_config_check(cfg) < 0)
        return -1;
    if (n < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "dist_optim: no parameters given");
    if (zd_optim_config_format(cfg, text, sizeof text) < 0)
        return -1;
    zd_dist_optim_t *o = calloc(1, sizeof *o);
    int world = zd_rpc_world_size();
    if (!o || world < 1) {
        free(o);
        return zd_error_set(world < 1 ? "dist_optim: RPC is not running" : "out of memory");
    }
    o->owners = calloc((size_t)world, sizeof *o->owners);
    zd_future_t **fs = calloc((size_t)world, sizeof *fs);
    int rc = o->owners && fs ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    /* One call per owner, all in flight at once. */
    for (int owner = 0; rc == 0 && owner < world; owner++) {
        zd_value_t *args = zd_rpc_args("s", text);
        int count = 0;
        for (int i = 0; args && i < n; i++)
            if (zd_rref_owner(params[i]) == owner) {
                count++;
                if (zd_list_append(args, zd_value_rref(params[i])) < 0)
                    zd_value_unref(args), args = NULL;
            }
        if (!args) {
            rc = -1;
        } else if (count > 0 && owner == zd_rpc_rank()) {
            /* Our own parameters: no message. */
            size_t len = zd_list_len(args);
            zd_rref_t **mine = calloc(len, sizeof *mine), *r = NULL;
            for (size_t i = 1; mine && i < len; i++)
                zd_rpc_arg_rref(args, i, &mine[i - 1]);
            if (!mine)
                rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
            else if (!(r = local_new(text, mine, count)))
                rc = zd_error_wrap("creating the optimizer on %s", self_desc(me, sizeof me));
            else
                o->owners[o->n++] = r;
            free(mine);
        } else if (count > 0) {
            fs[owner] = zd_rpc_async(owner, "__dist_optim_new", args, ZD_TIMEOUT_DEFAULT);
            if (!fs[owner])
                rc = owner_error(owner, "creating the optimizer");
        }
        zd_value_unref(args);
    }
    for (int owner = 0; owner < world; owner++) {
        if (!fs || !fs[owner])
            continue;
        zd_rref_t *r;
        if (rc == 0) {
            if (zd_future_wait(fs[owner], ZD_TIMEOUT_NONE) < 0 ||
                zd_value_get_rref(zd_future_value(fs[owner]), &r) < 0)
                rc = owner_error(owner, "creating the optimizer");
            else
                o->owners[o->n++] = zd_rref_ref(r);
        }
        zd_future_unref(fs[owner]);
    }
    free(fs);
    if (rc < 0) {
        zd_dist_optim_free(o);
        return -1;
    }
    *out = o;
    return 0;
}

/*  Steps our own local optimizer, without a message. */
static int step_here(zd_rref_t *r, int64_t context_id)
{
    zd_value_t *v;
    void *opt;
    if (zd_rref_local_value(r, &v) < 0)
        return -1;
    int rc = zd_value_get_object(v, LOCAL_OPTIMIZER, &opt) < 0 ? -1 : local_step(opt, context_id);
    zd_value_unref(v);
    return rc;
}

int zd_dist_optim_step(zd_dist_optim_t *o, int64_t context_id)
{
    zd_future_t **fs = calloc((size_t)(o->n ? o->n : 1), sizeof *fs);
    zd_value_t *args = zd_rpc_args("i", context_id);
    int rc = fs && args ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory"), local = -1;
    char me[200];
    for (int i = 0; rc == 0 && i < o->n; i++)
        if (zd_rref_is_owner(o->owners[i]))
            local = i;   /* stepped below, while the others run */
    /* Without a local owner, the last owner is called with zd_rpc_sync while the
       others run: its answer comes straight to this thread, one hand-off
       fewer than a future's (most worlds have one owner). */
    int last_sync = local < 0 ? o->n - 1 : -1;
    for (int i = 0; rc == 0 && i < o->n; i++) {
        if (i == local || i == last_sync)
            continue;
        fs[i] = zd_rref_rpc_async(o->owners[i], "__dist_optim_step", args, ZD_TIMEOUT_DEFAULT);
        if (!fs[i])
            rc = owner_error(zd_rref_owner(o->owners[i]), "step");
    }
    char first[1024] = "";   /* the first failure is the one reported */
    if (rc == 0 && last_sync >= 0) {
        zd_value_t *r = NULL;
        if (zd_rref_rpc_sync(o->owners[last_sync], "__dist_optim_step", args,
                              ZD_TIMEOUT_DEFAULT, &r) < 0)
            rc = owner_error(zd_rref_owner(o->owners[last_sync]), "step");
        zd_value_unref(r);
    }
    zd_value_unref(args);
    if (rc < 0)
        snprintf(first, sizeof first, "%s", zd_error_last());
    if (rc == 0 && local >= 0 && step_here(o->owners[local], context_id) < 0) {
        rc = zd_error_wrap("step on %s", self_desc(me, sizeof me));
        snprintf(first, sizeof first, "%s", zd_error_last());
    }
    for (int i = 0; fs && i < o->n; i++) {
        if (!fs[i])
            continue;
        if (zd_future_wait(fs[i], ZD_TIMEOUT_NONE) < 0 && rc == 0) {
            rc = owner_error(zd_rref_owner(o->owners[i]), "step");
            snprintf(first, sizeof first, "%s", zd_error_last());
        }
        zd_future_unref(fs[i]);
    }
    free(fs);
    if (rc < 0)
        zd_error_set("%s", first);
    return rc;
}

void zd_dist_optim_free(zd_dist_optim_t *o)
{
    if (!o)
        return;
    /* The owners free the local optimizers when these RRefs are released. */
    for (int i = 0; i < o->n; i++)
        zd_rref_unref(o->owners[i]);
    free(o->owners);
    free(o);
}
