/* SPDX-License-Identifier: MIT */
/*  dist_optim.c: the DistributedOptimizer. As PyTorch's holds RRefs to
    _LocalOptimizer objects, each owner's local optimizer is a local object
    value behind an RRef that the owner makes (zd_rref_new) and hands to
    the client; steps are methods called through those RRefs (or directly,
    for the process's own parameters), and releasing them frees the
    optimizers on their owners. */
#include <zdist/dist_optim.h>

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/dist_autograd.h>
#include <zdist/error.h>
#include "core/finite.h"
#include "core/fault_point.h"
#include "core/log_private.h"
#include "core/sized.h"

/*  ---- owner side ---- */

/*  The type of the local optimizer objects: a zd_optim_t. */
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

/*  The read holds of this thread. A forward that takes the read lock while
    a guarded run already holds it for the thread (a RemoteModule's
    forward, a backward function: zd_dist_autograd_run_guarded) would
    otherwise wait behind a waiting step, which waits for the first hold:
    only the outermost hold takes the lock. */
static _Thread_local int read_depth;

void zd_dist_optim_read_lock(void)
{
    if (read_depth++ > 0)
        return;
    pthread_once(&params_lock_once, params_lock_init);
    pthread_rwlock_rdlock(&params_lock);
}

void zd_dist_optim_read_unlock(void)
{
    if (read_depth < 1) /* not held here: unlocking another thread's hold would corrupt it */
        return;
    if (--read_depth == 0)
        pthread_rwlock_unlock(&params_lock);
}

/*  Steps applied here: changed only under the write lock. */
static _Atomic uint64_t params_version;

/*  How often an owner changed its parameters outside a step
    (zd_dist_optim_update_params): a local optimizer of an older epoch
    refuses to step, its caller's gradients being of parameters no
    longer there. Changed only under the write lock. */
static _Atomic uint64_t params_epoch;

uint64_t zd_dist_optim_version(void)
{
    return atomic_load(&params_version);
}

int zd_dist_optim_update_params(int (*update)(void *arg), void *arg)
{
    if (!update)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dist_optim_update_params: NULL");
    if (read_depth > 0) /* the write lock would wait for this thread's own hold */
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_dist_optim_update_params: called while "
                                 "this thread holds zd_dist_optim_read_lock()");
    pthread_once(&params_lock_once, params_lock_init);
    pthread_rwlock_wrlock(&params_lock);
    int rc = update(arg);
    if (rc > 0) {
        atomic_fetch_add(&params_version, 1);
        atomic_fetch_add(&params_epoch, 1);
    }
    pthread_rwlock_unlock(&params_lock);
    return rc;
}

static const char *self_desc(char *buf, size_t size)
{
    snprintf(buf, size, "\"%s\" (rank %d)", zd_rpc_name(), zd_rpc_rank());
    return buf;
}

/*  Who asked: 'worker "trainer_1" (rank 2)', or "this process" (from -1). */
static const char *caller_desc(int from, char *buf, size_t size)
{
    zd_rpc_worker_info_t info;
    snprintf(buf, size, "this process");
    if (from >= 0 && zd_rpc_get_worker_info_by_rank(from, &info) == 0)
        snprintf(buf, size, "worker \"%s\" (rank %d)", info.name, from);
    return buf;
}

/*  "parameter 3 ('fc1.weight')" or "parameter 3". */
static const char *param_desc(zd_tensor_t *p, int i, char *buf, size_t size)
{
    const char *name = zd_tensor_name(p);
    if (*name)
        snprintf(buf, size, "parameter %d ('%s')", i, name);
    else
        snprintf(buf, size, "parameter %d", i);
    return buf;
}

/*  ---- what this owner accepts (zd_dist_optim_set_owner_limits) ---- */

static pthread_mutex_t limits_lock = PTHREAD_MUTEX_INITIALIZER;
static bool owner_has_config;
static zd_optim_config_t owner_config;
static double owner_max_change;

int zd_dist_optim_set_owner_limits(const zd_dist_optim_owner_limits_t *in)
{
    zd_dist_optim_owner_limits_t l = zd_dist_optim_owner_limits_default(), *limits = NULL;
    if (in &&
        zd__sized_read(&l, sizeof l, in, ZD__SIZE_THROUGH(zd_dist_optim_owner_limits_t, max_change),
                       "zd_dist_optim_owner_limits_t", "zd_dist_optim_owner_limits_default()") < 0)
        return zd_error_wrap("zd_dist_optim_set_owner_limits");
    if (in)
        limits = &l;
    /* copied through its text form, which reads the caller's struct no
       further than its size */
    zd_optim_config_t copy;
    char text[512];
    if (limits && limits->config &&
        (zd_optim_config_check(limits->config) < 0 ||
         zd_optim_config_format(limits->config, text, sizeof text) < 0 ||
         zd_optim_config_parse(text, &copy, sizeof copy) < 0))
        return zd_error_wrap("zd_dist_optim_set_owner_limits");
    if (limits && !(limits->max_change >= 0 && limits->max_change <= DBL_MAX))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_dist_optim_set_owner_limits: max_change "
                                 "is %g; it must be a finite number >= 0 (0: no bound)",
                                 limits->max_change);
    pthread_mutex_lock(&limits_lock);
    owner_has_config = limits && limits->config;
    if (owner_has_config)
        owner_config = copy;
    owner_max_change = limits ? limits->max_change : 0;
    pthread_mutex_unlock(&limits_lock);
    return 0;
}

static double max_change_now(void)
{
    pthread_mutex_lock(&limits_lock);
    double m = owner_max_change;
    pthread_mutex_unlock(&limits_lock);
    return m;
}

/*  0 when this owner takes config cfg from `from`; -1 naming the first
    field that differs from the one it takes. */
static int config_admitted(const zd_optim_config_t *cfg, int from)
{
    pthread_mutex_lock(&limits_lock);
    bool has = owner_has_config;
    zd_optim_config_t want = owner_config;
    pthread_mutex_unlock(&limits_lock);
    char mine[512], theirs[512], who[160], me[200];
    if (!has)
        return 0;
    if (zd_optim_config_format(&want, mine, sizeof mine) < 0 ||
        zd_optim_config_format(cfg, theirs, sizeof theirs) < 0)
        return -1;
    if (!strcmp(mine, theirs))
        return 0;
    /* Both texts list the same keys in the same order when the kind is
       the same: the first token that differs names the field. */
    const char *p = mine, *q = theirs;
    size_t lp = strcspn(p, " "), lq = strcspn(q, " ");
    while (lp == lq && !strncmp(p, q, lp) && p[lp] && q[lq]) {
        p += lp + 1, q += lq + 1;
        lp = strcspn(p, " "), lq = strcspn(q, " ");
    }
    caller_desc(from, who, sizeof who);
    zd__log(ZD_LOG_WARN,
            "dist_optim: refused the optimizer of %s: its %.*s, where this process "
            "takes %.*s",
            who, (int)lq, q, (int)lp, p);
    /* Another kind: its whole config, the fields are not the same. */
    char whole[540] = "";
    if (p == mine)
        snprintf(whole, sizeof whole, " (\"%s\")", mine);
    return zd_error_set("dist_optim: %s refuses the optimizer of %s: its %.*s, where this owner "
                        "takes %.*s%s only (zd_dist_optim_set_owner_limits)",
                        self_desc(me, sizeof me), who, (int)lq, q, (int)lp, p, whole);
}

/*  One copy of the parameters a step changes, taken before the step and
    put back when it is refused: under the write lock, grown to the
    largest step, never allocated per step. It goes with the last local
    optimizer, unless the lock is busy then: the release may run on the
    RPC I/O thread, which must not wait (the next release or step sees
    to it). */
static float *scratch;
static size_t scratch_cap;
static atomic_int n_local;

/*  A local optimizer, and the parameters' epoch it was made in. */
typedef struct {
    zd_optim_t *opt;
    uint64_t epoch;
} local_t;

static void local_free(void *p)
{
    local_t *l = p;
    zd_optim_free(l->opt);
    free(l);
    if (atomic_fetch_sub(&n_local, 1) == 1 && pthread_rwlock_trywrlock(&params_lock) == 0) {
        if (atomic_load(&n_local) == 0) {
            free(scratch);
            scratch = NULL;
            scratch_cap = 0;
        }
        pthread_rwlock_unlock(&params_lock);
    }
}

/*  A new RRef owned here to a local optimizer over the values of rrefs
    (owned here too) for `from` (-1: this process), or NULL. */
static zd_rref_t *local_new(const char *cfg_text, zd_rref_t *const *rrefs, int n, int from)
{
    zd_optim_config_t cfg;
    if (zd_optim_config_parse(cfg_text, &cfg, sizeof cfg) < 0 || config_admitted(&cfg, from) < 0)
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
    local_t *l = rc == 0 ? malloc(sizeof *l) : NULL;
    if (rc == 0 && !l)
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    if (l && !(l->opt = zd_optim_new(&cfg, params, n))) {
        free(l);
        l = NULL;
    }
    if (l) {
        l->epoch = atomic_load(&params_epoch);
        atomic_fetch_add(&n_local, 1); /* local_free counts it out */
    }
    zd_value_t *v = l ? zd_value_object(l, local_free, LOCAL_OPTIMIZER) : NULL;
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
static int local_step_from(local_t *l, int64_t ctx, int from);

static int check_finite(zd_tensor_t *const *grads, int n, int64_t ctx, int from)
{
    for (int i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        const float *d = zd_tensor_data(grads[i]);
        int64_t bad = zd__first_not_finite(d, zd_tensor_numel(grads[i]));
        if (bad < 0)
            continue;
        char who[160];
        caller_desc(from, who, sizeof who);
        zd__log(ZD_LOG_WARN,
                "dist_optim: the gradient of parameter %d in context %lld of %s "
                "holds %g at element %lld: step refused, nothing applied",
                i, (long long)ctx, who, (double)d[bad], (long long)bad);
        return zd_error_set("dist_optim: the gradient of parameter %d holds %g (element %lld) "
                            "in context %lld of %s: the step was refused and nothing applied",
                            i, (double)d[bad], (long long)bad, (long long)ctx, who);
    }
    return 0;
}

/*  Finite gradients still make a step that ruins the shared parameters
    when the caller's learning rate is absurd (issue 24 point 6: --lr=1e30
    from one trainer made them inf for every trainer). So a stepped
    parameter is published only if every element is finite and, when the
    owner set max_change, its change is bounded: RMS(new - old) at most
    max_change x max(RMS(old), 1). Otherwise -1 naming the caller, the
    parameter and the element. old holds the values before the step. */
static int check_stepped(zd_optim_t *opt, int i, const float *old, int64_t ctx, int from,
                         double max_change)
{
    zd_tensor_t *p = zd_optim_param(opt, i);
    const float *d = zd_tensor_data(p);
    int64_t n = zd_tensor_numel(p), bad = -1;
    char who[160], what[200], text[512];
    if ((bad = zd__first_not_finite(d, n)) >= 0) {
        snprintf(text, sizeof text, "made %s %g at element %lld (it was %g)",
                 param_desc(p, i, what, sizeof what), (double)d[bad], (long long)bad,
                 (double)old[bad]);
    } else if (max_change > 0 && n > 0) {
        double dd4[4] = {0}, pp4[4] = {0}, dd = 0, pp = 0; /* side by side (core/finite.h) */
        int64_t k = 0;
        for (; k + 4 <= n; k += 4)
            for (int j = 0; j < 4; j++) {
                double o = old[k + j], diff = (double)d[k + j] - o;
                dd4[j] += diff * diff;
                pp4[j] += o * o;
            }
        for (; k < n; k++) {
            double o = old[k], diff = (double)d[k] - o;
            dd += diff * diff;
            pp += o * o;
        }
        for (int j = 0; j < 4; j++)
            dd += dd4[j], pp += pp4[j];
        double rms_d = sqrt(dd / (double)n), rms_p = sqrt(pp / (double)n);
        if (!(rms_d <= max_change * fmax(rms_p, 1.0))) {
            bad = 0;
            for (k = 1; k < n; k++)
                if (fabsf(d[k] - old[k]) > fabsf(d[bad] - old[bad]))
                    bad = k;
            snprintf(text, sizeof text,
                     "moved %s by %g (RMS), more than max_change %g times "
                     "max(its RMS %g, 1); most at element %lld, from %g to %g",
                     param_desc(p, i, what, sizeof what), rms_d, max_change, rms_p, (long long)bad,
                     (double)old[bad], (double)d[bad]);
        }
    }
    if (bad < 0)
        return 0;
    caller_desc(from, who, sizeof who);
    zd__log(ZD_LOG_WARN, "dist_optim: the step of %s in context %lld %s: step refused and undone",
            who, (long long)ctx, text);
    return zd_error_set("dist_optim: the step of %s in context %lld %s: the step was refused and "
                        "undone, the parameters are as they were",
                        who, (long long)ctx, text);
}

/*  Under the write lock: steps opt with grads, and publishes the result
    only if check_stepped passes for every parameter stepped; else puts
    back the values of before the step. */
static int step_checked(zd_optim_t *opt, zd_tensor_t *const *grads, int64_t ctx, int from)
{
    int n = zd_optim_n_params(opt);
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (grads[i])
            total += (size_t)zd_tensor_numel(zd_optim_param(opt, i));
    if (total > scratch_cap) {
        float *s = realloc(scratch, total * sizeof *s);
        if (!s)
            return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                     "dist_optim: out of memory for a copy of "
                                     "%zu parameter values",
                                     total);
        scratch = s;
        scratch_cap = total;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        zd_tensor_t *p = zd_optim_param(opt, i);
        memcpy(scratch + off, zd_tensor_data(p), zd_tensor_nbytes(p));
        off += (size_t)zd_tensor_numel(p);
    }
    if (zd_optim_step(opt, grads) < 0)
        return -1; /* it checks everything first: nothing moved */
    double max_change = max_change_now();
    int rc = 0;
    off = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        if (!grads[i])
            continue;
        rc = check_stepped(opt, i, scratch + off, ctx, from, max_change);
        off += (size_t)zd_tensor_numel(zd_optim_param(opt, i));
    }
    if (rc == 0) {
        atomic_fetch_add(&params_version, 1);
        return 0;
    }
    off = 0;
    for (int i = 0; i < n; i++) {
        if (!grads[i])
            continue;
        zd_tensor_t *p = zd_optim_param(opt, i);
        memcpy(zd_tensor_data(p), scratch + off, zd_tensor_nbytes(p));
        off += (size_t)zd_tensor_numel(p);
    }
    return -1;
}

static int local_step(local_t *l, int64_t ctx)
{
    return local_step_from(l, ctx, -1);
}

static int local_step_from(local_t *l, int64_t ctx, int from)
{
    zd_optim_t *opt = l->opt;
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
        if (l->epoch != atomic_load(&params_epoch))
            rc = zd_error_set_code(ZD_ERR_STALE,
                                   "the parameters were taken back (a checkpoint) after this "
                                   "optimizer was made: its gradients are of parameters no "
                                   "longer there");
        else
            rc = step_checked(opt, grads, ctx, from);
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
    (void)arg;
    const char *cfg;
    int n = (int)zd_list_len(args) - 1;
    zd_rref_t **rrefs = calloc((size_t)(n > 0 ? n : 1), sizeof *rrefs), *r = NULL;
    int rc = rrefs && zd_rpc_arg_string(args, 0, &cfg) == 0 ? 0 : -1;
    for (int i = 0; rc == 0 && i < n; i++)
        rc = zd_rpc_arg_rref(args, (size_t)(1 + i), &rrefs[i]);
    if (rc == 0)
        r = local_new(cfg, rrefs, n, call ? zd_rpc_call_caller_rank(call) : -1);
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
    if (zd_rpc_arg_object(args, 0, LOCAL_OPTIMIZER, &opt) < 0 ||
        zd_rpc_arg_int(args, 1, &ctx) < 0 ||
        local_step_from(opt, ctx, call ? zd_rpc_call_caller_rank(call) : -1) < 0)
        return NULL;
    return zd_value_none();
}

int zd_dist_optim_init(void)
{
    pthread_once(&params_lock_once, params_lock_init);
    /* Backward functions read what steps write (a weight for its input's
       gradient): another trainer's backward here waits for a step, and a
       step for the backwards running here. */
    zd_dist_autograd_set_backward_guard(zd_dist_optim_read_lock, zd_dist_optim_read_unlock);
    if (zd_rpc_register("__dist_optim_new", handle_new, NULL) < 0 ||
        zd_rpc_register("__dist_optim_step", handle_step, NULL) < 0)
        return -1;
    return 0;
}

/*  ---- client side ---- */

struct zd_dist_optim {
    int n;
    zd_rref_t **owners; /* per owner, an RRef to its local optimizer */
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
    if (no_init) { /* its functions are missing there: say what installs them */
        char text[1024];
        snprintf(text, sizeof text, "%s", zd_error_last());
        zd_error_set_code(ZD_ERR_NOT_INITIALIZED,
                          "%s (zd_dist_optim_init() was not called on "
                          "\"%s\" before zd_rpc_init())",
                          text, name);
    }
    return -1;
}

zd_dist_optim_t *zd_dist_optim_new(const zd_optim_config_t *cfg, const zd_rref_list_t *list)
{
    char text[512], me[200];
    if (zd_optim_config_check(cfg) < 0)
        return NULL;
    int n = zd_rref_list_len(list);
    if (n < 1) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "dist_optim: no parameters given");
        return NULL;
    }
    if (zd_optim_config_format(cfg, text, sizeof text) < 0)
        return NULL;
    zd_dist_optim_t *o = calloc(1, sizeof *o);
    int world = zd_rpc_world_size();
    if (!o || world < 1) {
        free(o);
        if (world < 1)
            zd_error_set_code(ZD_ERR_NOT_INITIALIZED, "dist_optim: RPC is not running");
        else
            zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_optim: out of memory");
        return NULL;
    }
    o->owners = calloc((size_t)world, sizeof *o->owners);
    zd_future_t **fs = calloc((size_t)world, sizeof *fs);
    int rc = o->owners && fs ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
    /* One call per owner, all in flight at once. */
    for (int owner = 0; rc == 0 && owner < world; owner++) {
        zd_value_t *args = ZD_ARGS(text);
        int count = 0;
        for (int i = 0; args && i < n; i++)
            if (zd_rref_owner(zd_rref_list_get(list, i)) == owner) {
                count++;
                if (zd_list_append(args, zd_value_rref(zd_rref_list_get(list, i))) < 0)
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
            else if (!(r = local_new(text, mine, count, -1)))
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
        return NULL;
    }
    return o;
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
    zd__fault_point(zd_rpc_rank(), "step"); /* tests only (core/fault_point.h) */
    zd_future_t **fs = calloc((size_t)(o->n ? o->n : 1), sizeof *fs);
    zd_value_t *args = ZD_ARGS(context_id);
    int rc = fs && args ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "dist_optim: out of memory"),
        local = -1;
    char me[200];
    for (int i = 0; rc == 0 && i < o->n; i++)
        if (zd_rref_is_owner(o->owners[i]))
            local = i; /* stepped below, while the others run */
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
    char first[1024] = ""; /* the first failure is the one reported */
    zd_error_code_t first_code = ZD_OK;
    if (rc == 0 && last_sync >= 0) {
        zd_value_t *r = NULL;
        if (zd_rref_rpc_sync(o->owners[last_sync], "__dist_optim_step", args, ZD_TIMEOUT_DEFAULT,
                             &r) < 0)
            rc = owner_error(zd_rref_owner(o->owners[last_sync]), "step");
        zd_value_unref(r);
    }
    zd_value_unref(args);
    if (rc < 0) {
        snprintf(first, sizeof first, "%s", zd_error_last());
        first_code = zd_error_code();
    }
    if (rc == 0 && local >= 0 && step_here(o->owners[local], context_id) < 0) {
        rc = zd_error_wrap("step on %s", self_desc(me, sizeof me));
        snprintf(first, sizeof first, "%s", zd_error_last());
        first_code = zd_error_code();
    }
    for (int i = 0; fs && i < o->n; i++) {
        if (!fs[i])
            continue;
        if (zd_future_wait(fs[i], ZD_TIMEOUT_NONE) < 0 && rc == 0) {
            rc = owner_error(zd_rref_owner(o->owners[i]), "step");
            snprintf(first, sizeof first, "%s", zd_error_last());
            first_code = zd_error_code();
        }
        zd_future_unref(fs[i]);
    }
    free(fs);
    if (rc < 0)
        zd_error_set_code(first_code, "%s", first);
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
