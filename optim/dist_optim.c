/*  dist_optim.c: the DistributedOptimizer. Owners keep their local
    optimizers in a table under 64-bit handles; clients hold (owner, handle)
    pairs and reach them with "__dist_optim_*" calls (or directly, for the
    process's own parameters). */
#include "optim/dist_optim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/dist_autograd.h"
#include "autograd/error.h"

/*  ---- owner side ---- */

typedef struct local {
    int64_t handle;
    optim_t *opt;
    struct local *next;
} local_t;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static local_t *table;
static int64_t next_handle = 1;
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

/*  Creates a local optimizer over the values of rrefs (owned here). */
static int local_new(const char *cfg_text, rpc_rref_t *const *rrefs, int n, int64_t *handle)
{
    optim_config_t cfg;
    if (optim_config_parse(cfg_text, &cfg) < 0)
        return -1;
    tensor_t **params = calloc((size_t)(n > 0 ? n : 1), sizeof *params);
    rpc_value_t **values = calloc((size_t)(n > 0 ? n : 1), sizeof *values);
    local_t *l = calloc(1, sizeof *l);
    int rc = params && values && l ? 0 : error_set("out of memory");
    for (int i = 0; rc == 0 && i < n; i++) {
        if (!rpc_rref_is_owner(rrefs[i]))
            rc = error_set("parameter %d is owned by rank %d, not here", i,
                           rpc_rref_owner(rrefs[i]));
        else if (rpc_rref_local_value(rrefs[i], &values[i]) < 0)
            rc = error_wrap("parameter %d", i);
        else if (rpc_value_get_tensor(values[i], &params[i]) < 0)
            rc = error_wrap("parameter %d", i);
    }
    if (rc == 0 && !(l->opt = optim_new(&cfg, n, params)))
        rc = -1;
    if (rc == 0) {
        pthread_mutex_lock(&table_lock);
        l->handle = next_handle++;
        l->next = table;
        table = l;
        *handle = l->handle;
        pthread_mutex_unlock(&table_lock);
        l = NULL;
    }
    for (int i = 0; values && i < n; i++)
        rpc_value_unref(values[i]);
    free(values);
    free(params);
    free(l);
    return rc;
}

static optim_t *local_find(int64_t handle)
{
    pthread_mutex_lock(&table_lock);
    local_t *l = table;
    while (l && l->handle != handle)
        l = l->next;
    pthread_mutex_unlock(&table_lock);
    return l ? l->opt : NULL;
}

static int local_step(int64_t handle, int64_t ctx)
{
    optim_t *opt = local_find(handle);
    if (!opt)
        return error_set("no distributed optimizer %lld here", (long long)handle);
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

static void local_free(int64_t handle)
{
    pthread_mutex_lock(&table_lock);
    local_t **p = &table, *found = NULL;
    while (*p && (*p)->handle != handle)
        p = &(*p)->next;
    if (*p) {
        found = *p;
        *p = found->next;
    }
    pthread_mutex_unlock(&table_lock);
    if (found) {
        optim_free(found->opt);
        free(found);
    }
}

static rpc_value_t *handle_new(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *cfg;
    int n = (int)rpc_list_len(args) - 1;
    rpc_rref_t **rrefs = calloc((size_t)(n > 0 ? n : 1), sizeof *rrefs);
    int64_t handle = 0;
    int rc = rrefs && rpc_arg_string(args, 0, &cfg) == 0 ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = rpc_arg_rref(args, (size_t)(1 + i), &rrefs[i]);
    if (rc == 0)
        rc = local_new(cfg, rrefs, n, &handle);
    free(rrefs);
    return rc == 0 ? rpc_value_int(handle) : NULL;
}

static rpc_value_t *handle_step(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t handle, ctx;
    if (rpc_arg_int(args, 0, &handle) < 0 || rpc_arg_int(args, 1, &ctx) < 0 ||
        local_step(handle, ctx) < 0)
        return NULL;
    return rpc_value_none();
}

static rpc_value_t *handle_free(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t handle;
    if (rpc_arg_int(args, 0, &handle) < 0)
        return NULL;
    local_free(handle);
    return rpc_value_none();
}

int dist_optim_init(void)
{
    pthread_once(&params_lock_once, params_lock_init);
    if (rpc_register("__dist_optim_new", handle_new, NULL) < 0 ||
        rpc_register("__dist_optim_step", handle_step, NULL) < 0 ||
        rpc_register("__dist_optim_free", handle_free, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- client side ---- */

typedef struct {
    int owner;
    int64_t handle;
} remote_optim_t;

struct dist_optim {
    int n;
    remote_optim_t *owners;
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
            int64_t handle;
            size_t len = rpc_list_len(args);
            rpc_rref_t **mine = calloc(len, sizeof *mine);
            for (size_t i = 1; mine && i < len; i++)
                rpc_arg_rref(args, i, &mine[i - 1]);
            rc = mine ? local_new(text, mine, count, &handle) : error_set("out of memory");
            free(mine);
            if (rc == 0)
                o->owners[o->n++] = (remote_optim_t){owner, handle};
            else
                error_wrap("creating the optimizer on %s", self_desc(me, sizeof me));
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
        int64_t handle;
        if (rc == 0) {
            if (rpc_wait(fs[owner], -1) < 0 ||
                rpc_value_get_int(rpc_future_value(fs[owner]), &handle) < 0)
                rc = owner_error(owner, "creating the optimizer");
            else
                o->owners[o->n++] = (remote_optim_t){owner, handle};
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

int dist_optim_step(dist_optim_t *o, int64_t context_id)
{
    rpc_future_t **fs = calloc((size_t)(o->n ? o->n : 1), sizeof *fs);
    rpc_value_t *args = NULL;
    int rc = fs ? 0 : error_set("out of memory"), local = -1;
    char me[200];
    for (int i = 0; rc == 0 && i < o->n; i++) {
        if (o->owners[i].owner == rpc_rank()) {
            local = i;   /* stepped below, while the others run */
            continue;
        }
        args = rpc_args("ii", o->owners[i].handle, context_id);
        fs[i] = args ? rpc_async(o->owners[i].owner, "__dist_optim_step", args, RPC_TIMEOUT_DEFAULT)
                     : NULL;
        rpc_value_unref(args);
        if (!fs[i])
            rc = owner_error(o->owners[i].owner, "step");
    }
    char first[1024] = "";   /* the first failure is the one reported */
    if (rc < 0)
        snprintf(first, sizeof first, "%s", error_last());
    if (rc == 0 && local >= 0 && local_step(o->owners[local].handle, context_id) < 0) {
        rc = error_wrap("step on %s", self_desc(me, sizeof me));
        snprintf(first, sizeof first, "%s", error_last());
    }
    for (int i = 0; fs && i < o->n; i++) {
        if (!fs[i])
            continue;
        if (rpc_wait(fs[i], -1) < 0 && rc == 0) {
            rc = owner_error(o->owners[i].owner, "step");
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
    for (int i = 0; i < o->n; i++) {
        if (o->owners[i].owner == rpc_rank()) {
            local_free(o->owners[i].handle);
            continue;
        }
        rpc_value_t *args = rpc_args("i", o->owners[i].handle), *r = NULL;
        /* Best effort: an owner that is gone has freed everything anyway. */
        if (args && rpc_sync(o->owners[i].owner, "__dist_optim_free", args, RPC_TIMEOUT_DEFAULT,
                             &r) == 0)
            rpc_value_unref(r);
        rpc_value_unref(args);
    }
    free(o->owners);
    free(o);
}
