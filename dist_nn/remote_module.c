/* SPDX-License-Identifier: MIT */
/*  remote_module.c: RemoteModule. The owner keeps the module in
    an object value behind an RRef; forward and remote_parameters are
    internal functions called through that RRef, so the module's tensors
    travel (and are recorded by distributed autograd) as any RPC's. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/dist_autograd.h>
#include <zdist/dist_nn.h>
#include <zdist/error.h>

#define OBJECT_TYPE "RemoteModule"
#define FN_NEW      "__remote_module_new"
#define FN_TYPE     "__remote_module_type"
#define FN_FORWARD  "__remote_module_forward"
#define FN_PARAMS   "__remote_module_params"

struct zd_remote_module {
    zd_rref_t *rref;
    char type[64];
};

/*  ---- the registry of module types (this process) ---- */

typedef struct {
    char *name;
    zd_dist_nn_module_ctor_fn *ctor;
    void *arg;
} module_type_t;

static pthread_mutex_t types_lock = PTHREAD_MUTEX_INITIALIZER;
static module_type_t *types;
static int n_types, cap_types;

int zd_dist_nn_register_module(const char *type_name, zd_dist_nn_module_ctor_fn *ctor, void *arg)
{
    if (!type_name || !type_name[0] || strlen(type_name) >= sizeof((zd_remote_module_t *)0)->type ||
        !ctor)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_dist_nn_register_module: %s",
                                 ctor ? "bad type name (1 to 63 bytes)" : "NULL constructor");
    int rc = 0;
    pthread_mutex_lock(&types_lock);
    int i = 0;
    while (i < n_types && strcmp(types[i].name, type_name) != 0)
        i++;
    if (i == n_types) {
        char *name = strdup(type_name);
        if (name && n_types == cap_types) {
            int cap = cap_types ? 2 * cap_types : 8;
            module_type_t *t = realloc(types, (size_t)cap * sizeof *t);
            if (t) {
                types = t;
                cap_types = cap;
            } else {
                free(name);
                name = NULL;
            }
        }
        if (name)
            types[n_types++].name = name;
        else
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_dist_nn_register_module: out of memory");
    }
    if (rc == 0) {
        types[i].ctor = ctor;
        types[i].arg = arg;
    }
    pthread_mutex_unlock(&types_lock);
    return rc;
}

static int lookup(const char *type_name, module_type_t *out)
{
    pthread_mutex_lock(&types_lock);
    int found = -1;
    char known[256] = "";
    for (int i = 0; i < n_types; i++) {
        if (strcmp(types[i].name, type_name) == 0) {
            *out = types[i];
            found = 0;
        }
        size_t len = strlen(known);
        snprintf(known + len, sizeof known - len, "%s%s", len ? ", " : "", types[i].name);
    }
    pthread_mutex_unlock(&types_lock);
    if (found < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "unknown module type \"%s\" on \"%s\" "
                                 "(registered: %s)",
                                 type_name, zd_rpc_name(),
                                 known[0] ? known : "none; call zd_dist_nn_register_module");
    return 0;
}

/*  ---- the owner's side ---- */

static void module_free(void *p)
{
    zd_nn_module_free(p);
}

int zd_remote_module_local(zd_value_t *object, zd_nn_module_t **module)
{
    void *p;
    if (zd_value_get_object(object, OBJECT_TYPE, &p) < 0)
        return -1;
    *module = p;
    return 0;
}

/*  [type_name, args] -> the module, in an object value (kept by the RRef). */
static zd_value_t *fn_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *type_name;
    zd_value_t *ctor_args;
    module_type_t t = {0};
    if (ZD_UNPACK(args, &type_name, &ctor_args) < 0 || lookup(type_name, &t) < 0)
        return NULL;
    zd_nn_module_t *m = t.ctor(ctor_args, t.arg);
    if (!m)
        return zd_error_wrap("%s constructor", type_name), NULL;
    return zd_value_object(m, module_free, OBJECT_TYPE);
}

static zd_value_t *fn_type(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_nn_module_t *m;
    if (zd_remote_module_local(zd_list_get(args, 0), &m) < 0)
        return NULL;
    return zd_value_string(zd_nn_module_type(m));
}

/*  A forward gives a handful of outputs (the LSTM three): a bound on what
    a peer may ask for, so that it cannot make this process allocate. */
#define MAX_OUTPUTS 1024

typedef struct {
    zd_nn_module_t *m;
    zd_tensor_t **in, **out;
    int n_in, n_out;
} forward_job_t;

static int run_forward(void *arg)
{
    forward_job_t *j = arg;
    return zd_nn_module_forward(j->m, j->in, j->n_in, j->out, j->n_out);
}

/*  [module, n_out, tensors...] -> forward's tensor (n_out 1), or a list of
    its first n_out tensors. The forward runs inside the backward guard:
    another trainer's DistributedOptimizer step on this process waits for
    it, so it never reads a weight half written (zd_dist_optim_init
    installs the guard). */
static zd_value_t *fn_forward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_nn_module_t *m;
    int64_t n_out;
    if (zd_remote_module_local(zd_list_get(args, 0), &m) < 0 || zd_rpc_arg_int(args, 1, &n_out) < 0)
        return NULL;
    if (n_out < 1 || n_out > MAX_OUTPUTS)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "forward: %lld outputs asked for (1 to %d)",
                                 (long long)n_out, MAX_OUTPUTS),
               NULL;
    size_t n = zd_list_len(args) - 2;
    zd_tensor_t **in = calloc(n ? n : 1, sizeof *in);
    zd_tensor_t **out = calloc((size_t)n_out, sizeof *out);
    if (!in || !out) {
        free(in);
        free(out);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "forward: out of memory"), NULL;
    }
    zd_value_t *result = NULL;
    size_t i = 0;
    while (i < n && zd_rpc_arg_tensor(args, i + 2, &in[i]) == 0)
        i++;
    forward_job_t job = {m, in, out, (int)n, (int)n_out};
    if (i == n && zd_dist_autograd_run_guarded(run_forward, &job) == 0) {
        if (n_out == 1) {
            result = zd_value_tensor(out[0]);
        } else {
            result = zd_value_list((size_t)n_out);
            for (int64_t k = 0; result && k < n_out; k++)
                if (zd_list_append(result, zd_value_tensor(out[k])) < 0) {
                    zd_value_unref(result);
                    result = NULL;
                }
        }
        for (int64_t k = 0; k < n_out; k++)
            zd_tensor_unref(out[k]);
    }
    free(out);
    free(in);
    return result;
}

/*  [module] -> [RRef(param) for each parameter], owned here. */
static zd_value_t *fn_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_nn_module_t *m;
    zd_rref_list_t *rrefs;
    if (zd_remote_module_local(zd_list_get(args, 0), &m) < 0 ||
        !(rrefs = zd_dist_nn_parameter_rrefs(m)))
        return NULL;
    int n = zd_rref_list_len(rrefs);
    zd_value_t *list = zd_value_list((size_t)n);
    for (int i = 0; list && i < n; i++)
        if (zd_list_append(list, zd_value_rref(zd_rref_list_get(rrefs, i))) < 0) {
            zd_value_unref(list);
            list = NULL;
        }
    zd_rref_list_free(rrefs);
    return list;
}

int zd_dist_nn_init(void)
{
    static atomic_bool done;
    if (atomic_load(&done))
        return 0;
    if (zd_rpc_register(FN_NEW, fn_new, NULL) < 0 || zd_rpc_register(FN_TYPE, fn_type, NULL) < 0 ||
        zd_rpc_register(FN_FORWARD, fn_forward, NULL) < 0 ||
        zd_rpc_register(FN_PARAMS, fn_params, NULL) < 0)
        return -1;
    atomic_store(&done, true);
    return 0;
}

/*  ---- the creator's side ---- */

zd_remote_module_t *zd_remote_module_new(int to, const char *type_name, zd_value_t *args)
{
    zd_remote_module_t *rm = NULL;
    if (!type_name) {
        zd_value_unref(args);
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_remote_module_new: NULL type name");
        return NULL;
    }
    if (!args)
        args = zd_value_list(0);
    zd_rref_t *r =
        args ? zd_rpc_remote_take(to, FN_NEW, ZD_ARGS(type_name, args), ZD_TIMEOUT_DEFAULT) : NULL;
    zd_value_t *type = NULL;
    /* The creation is asynchronous: asking the module's type waits for it
       and brings back the constructor's error. */
    if (r && zd_rref_rpc_sync(r, FN_TYPE, NULL, ZD_TIMEOUT_DEFAULT, &type) == 0 &&
        (rm = calloc(1, sizeof *rm))) {
        const char *s = "?";
        zd_value_get_string(type, &s);
        snprintf(rm->type, sizeof rm->type, "%s", s);
        rm->rref = r;
        r = NULL;
    } else if (r && !rm && type) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_remote_module_new: out of memory");
    }
    zd_value_unref(type);
    if (!rm && strstr(zd_error_last(), "unknown function \"__remote_module_")) {
        /* Its functions are missing there: say what installs them, with
           the code and words of a missing zd_dist_optim_init(). */
        char text[768];
        zd_rpc_worker_info_t info;
        snprintf(text, sizeof text, "%s", zd_error_last());
        zd_error_set_code(ZD_ERR_NOT_INITIALIZED,
                          "%s (zd_dist_nn_init() was not called on "
                          "\"%s\" before zd_rpc_init())",
                          text, zd_rpc_get_worker_info_by_rank(to, &info) == 0 ? info.name : "?");
    }
    if (!rm)
        zd_error_wrap("RemoteModule %s on worker %d", type_name, to);
    zd_rref_unref(r);
    return rm;
}

static zd_value_t *forward_args(zd_remote_module_t *rm, zd_tensor_t *const *in, int n_in, int n_out)
{
    if (!rm || n_in < 0 || (n_in > 0 && !in) || n_out < 1 || n_out > MAX_OUTPUTS) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "RemoteModule forward: %s",
                          !rm                                    ? "NULL module"
                              : n_out < 1 || n_out > MAX_OUTPUTS ? "bad n_out"
                                                                 : "bad inputs");
        return NULL;
    }
    zd_value_t *args = zd_value_list((size_t)n_in + 1);
    if (args && zd_list_append(args, zd_value_int(n_out)) < 0) {
        zd_value_unref(args);
        args = NULL;
    }
    for (int i = 0; args && i < n_in; i++)
        if (zd_list_append(args, zd_value_tensor(in[i])) < 0) {
            zd_value_unref(args);
            args = NULL;
        }
    return args;
}

/*  The n_out tensors of a forward's result (a tensor for one, a list for
    more) into out, each a new reference; -1 when it is not that. */
static int forward_result(const zd_value_t *r, zd_tensor_t **out, int n_out)
{
    zd_tensor_t *t;
    if (n_out == 1) {
        if (zd_value_get_tensor(r, &t) < 0)
            return -1;
        out[0] = zd_tensor_ref(t);
        return 0;
    }
    if (zd_list_len(r) != (size_t)n_out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "forward gave %zu outputs, asked for %d",
                                 zd_list_len(r), n_out);
    for (int i = 0; i < n_out; i++) {
        if (zd_rpc_arg_tensor(r, (size_t)i, &t) < 0) {
            for (int j = 0; j < i; j++)
                zd_tensor_unref_p(&out[j]);
            return -1;
        }
        out[i] = zd_tensor_ref(t);
    }
    return 0;
}

int zd_remote_module_forward(zd_remote_module_t *rm, zd_tensor_t *const *in, int n_in,
                             zd_tensor_t **out, int n_out)
{
    for (int i = 0; out && i < n_out; i++)
        out[i] = NULL;
    if (!out)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "RemoteModule forward: NULL out");
    zd_value_t *args = forward_args(rm, in, n_in, n_out), *r = NULL;
    if (!args)
        return -1;
    int rc = zd_rref_rpc_sync_take(rm->rref, FN_FORWARD, args, ZD_TIMEOUT_DEFAULT, &r);
    if (rc == 0)
        rc = forward_result(r, out, n_out);
    zd_value_unref(r);
    return rc < 0 ? zd_error_wrap("RemoteModule %s forward", rm->type) : 0;
}

zd_future_t *zd_remote_module_forward_async(zd_remote_module_t *rm, zd_tensor_t *const *in,
                                            int n_in, int n_out)
{
    zd_value_t *args = forward_args(rm, in, n_in, n_out);
    return args ? zd_rref_rpc_async_take(rm->rref, FN_FORWARD, args, ZD_TIMEOUT_DEFAULT) : NULL;
}

zd_rref_list_t *zd_remote_module_remote_parameters(zd_remote_module_t *rm)
{
    if (!rm) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "remote_parameters: NULL module");
        return NULL;
    }
    zd_value_t *list;
    if (zd_rref_rpc_sync(rm->rref, FN_PARAMS, NULL, ZD_TIMEOUT_DEFAULT, &list) < 0) {
        zd_error_wrap("RemoteModule %s remote_parameters", rm->type);
        return NULL;
    }
    zd_rref_list_t *out = zd_rref_list_new();
    size_t count = zd_list_len(list);
    for (size_t i = 0; out && i < count; i++) {
        zd_rref_t *r;
        if (zd_rpc_arg_rref(list, i, &r) < 0 || zd_rref_list_append(out, r) < 0) {
            zd_error_wrap("RemoteModule %s remote_parameters", rm->type);
            zd_rref_list_free(out);
            out = NULL;
        }
    }
    zd_value_unref(list);
    return out;
}

zd_rref_t *zd_remote_module_rref(const zd_remote_module_t *rm)
{
    return rm ? rm->rref : NULL;
}
int zd_remote_module_owner(const zd_remote_module_t *rm)
{
    return rm ? zd_rref_owner(rm->rref) : -1;
}

void zd_remote_module_free(zd_remote_module_t *rm)
{
    if (!rm)
        return;
    zd_rref_unref(rm->rref);
    free(rm);
}
