/* SPDX-License-Identifier: MIT */
/*  ps_two_stages.c: the model of two stages of ps_two_stages.h. */
#include "tests/support/ps_two_stages.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/named_tensors.h>
#include <zdist/nn.h>
#include <zdist/rng.h>
#include <zdist/rpc.h>

/*  ---- the model ---- */

typedef struct {
    zd_tensor_t *w, *b; /* borrowed from the module */
} linear_t;

static int hidden_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                          int n_out)
{
    linear_t *s = zd_nn_module_state(m);
    zd_tensor_t *h = NULL;
    if (n_in != 1 || n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "Hidden: one input, one output");
    int rc = zd_nn_linear(in[0], s->w, s->b, &h);
    if (rc == 0)
        rc = zd_tensor_tanh(h, out);
    zd_tensor_unref(h);
    return rc;
}

/*  The mode as a second output lets a trainer see that evaluation mode
    reached the stage. */
static int head_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                        int n_out)
{
    linear_t *s = zd_nn_module_state(m);
    if (n_in != 1 || n_out < 1 || n_out > 2)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "Head: one input, one or two outputs");
    if (zd_nn_linear(in[0], s->w, s->b, &out[0]) < 0)
        return -1;
    if (n_out == 2) {
        out[1] = zd_tensor_new(ZD_FLOAT32, NULL, 0);
        if (!out[1]) {
            zd_tensor_unref_p(&out[0]);
            return -1;
        }
        zd_tensor_data(out[1])[0] = zd_nn_module_is_training(m) ? 1.0f : 0.0f;
    }
    return 0;
}

zd_nn_module_t *ps2_make_stage(int which)
{
    int64_t in = which == 0 ? PS2_IN : PS2_HIDDEN, out = which == 0 ? PS2_HIDDEN : PS2_OUT;
    linear_t *s = calloc(1, sizeof *s);
    zd_nn_module_t *m = s ? zd_nn_module_new(which == 0 ? "Hidden" : "Head",
                                             which == 0 ? hidden_forward : head_forward, s, free)
                          : NULL;
    if (!m)
        return NULL;
    s->w = zd_nn_module_add_parameter(m, "weight", (int64_t[]){out, in}, 2);
    s->b = zd_nn_module_add_parameter(m, "bias", (int64_t[]){out}, 1);
    if (!s->w || !s->b) {
        zd_nn_module_free(m);
        return NULL;
    }
    /* multiples of 1/64, exact in float: the local copy and the shard's
       start from the same bits */
    zd_rng_t rng;
    zd_rng_seed(&rng, 7 + (uint64_t)which);
    for (int64_t k = 0; k < zd_tensor_numel(s->w); k++)
        zd_tensor_data(s->w)[k] = (float)zd_rng_below(&rng, 64) / 64.0f - 0.5f;
    for (int64_t k = 0; k < zd_tensor_numel(s->b); k++)
        zd_tensor_data(s->b)[k] = (float)zd_rng_below(&rng, 64) / 64.0f - 0.5f;
    return m;
}

void ps2_make_batch(int trainer, int64_t position, zd_tensor_t **x, zd_tensor_t **y)
{
    *x = zd_tensor_new(ZD_FLOAT32, (int64_t[]){PS2_BATCH, PS2_IN}, 2);
    *y = zd_tensor_new(ZD_FLOAT32, (int64_t[]){PS2_BATCH, PS2_OUT}, 2);
    if (!*x || !*y)
        return;
    for (int64_t k = 0; k < PS2_BATCH * PS2_IN; k++)
        zd_tensor_data(*x)[k] = (float)((k * 7 + position * 3 + trainer) % 11) / 11.0f - 0.5f;
    for (int64_t k = 0; k < PS2_BATCH * PS2_OUT; k++)
        zd_tensor_data(*y)[k] = (float)((k * 5 + trainer) % 7) / 7.0f - 0.5f;
}

/*  ---- the shards ---- */

static zd_nn_module_t *g_stage;
static zd_ps_model_server_t *g_server;

/*  "test_stage_params"() -> [weight, bias], the server's copy: what a
    trainer's steps left there, not the module the server started from. */
static zd_value_t *fn_stage_params(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_named_tensors_t *nt = zd_ps_model_server_params(g_server);
    zd_tensor_t *w = nt ? zd_named_tensors_find(nt, "weight") : NULL;
    zd_tensor_t *b = nt ? zd_named_tensors_find(nt, "bias") : NULL;
    zd_value_t *v = w && b && zd_named_tensors_len(nt) == 2 ? ZD_ARGS(w, b) : NULL;
    if (nt && !v)
        zd_error_set("the stage's copy has %d tensors, not weight and bias",
                     zd_named_tensors_len(nt));
    zd_named_tensors_free(nt);
    return v;
}

static zd_value_t *fn_version(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(zd_ps_model_server_version(g_server));
}

/*  Never answered: the caller sees the process lost, as after a crash. */
static zd_value_t *fn_die(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    raise(SIGKILL);
    return NULL;
}

int ps2_run_shard(const world_t *w, const ps2_shard_t *o)
{
    WCHECK(g_stage = ps2_make_stage(w->rank));
    WCHECK(g_server = zd_ps_model_server_new(g_stage, w->rank, 2, &o->options));
    WTRY(zd_rpc_register("test_stage_params", fn_stage_params, NULL));
    WTRY(zd_rpc_register("test_version", fn_version, NULL));
    WTRY(zd_rpc_register("test_die", fn_die, NULL));
    WTRY(world_join(w));
    int rc = o->serving ? o->serving(w) : 0;
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0 && !o->shutdown_may_fail)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    zd_ps_model_server_free(g_server);
    zd_nn_module_free(g_stage);
    g_server = NULL;
    g_stage = NULL;
    return rc;
}

zd_ps_model_server_t *ps2_server(void)
{
    return g_server;
}

/*  The rank's own process never starts RPC, so forking it is safe; a
    child dies with it, since a world that timed out kills only the
    rank's process. */
int ps2_restarted_shard(const world_t *w, int lives, int told_fd,
                        int (*serve)(const world_t *w, bool resume))
{
    for (int life = 0; life < lives; life++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0)
            return world_fail(w, "fork: %s", strerror(errno));
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            exit(serve(w, life > 0) == 0 ? 0 : 1); /* exit, not _exit: LeakSanitizer's check */
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (life == lives - 1)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0
                ? 0
                : world_fail(w, "the last shard %d ended with status %d", w->rank, status);
        if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
            return world_fail(w, "shard %d's life %d ended with status %d, not killed", w->rank,
                              life, status);
        struct pollfd p = {.fd = told_fd, .events = POLLIN};
        char c;
        if (poll(&p, 1, (int)world_scaled_ms(30000)) != 1 || read(told_fd, &c, 1) != 1)
            return world_fail(w, "the trainer did not say when to restart shard %d", w->rank);
    }
    return 0;
}

/*  ---- the trainer's side ---- */

zd_ps_model_t *ps2_trainer_join(const world_t *w)
{
    zd_optim_config_t sgd = zd_optim_sgd_defaults(PS2_LR);
    zd_ps_model_t *model = zd_ps_model_new((const int[]){0, 1}, 2, &sgd, NULL);
    if (model && world_join(w) < 0) {
        zd_ps_model_free(model);
        return NULL;
    }
    return model;
}

void ps2_local_free(ps2_local_t *l)
{
    zd_optim_free(l->opt);
    zd_nn_module_free(l->stage[0]);
    zd_nn_module_free(l->stage[1]);
}

int ps2_local_new(ps2_local_t *l)
{
    zd_optim_config_t sgd = zd_optim_sgd_defaults(PS2_LR);
    *l = (ps2_local_t){.stage = {ps2_make_stage(0), ps2_make_stage(1)}};
    if (l->stage[0] && l->stage[1]) {
        zd_tensor_t *params[4] = {
            zd_nn_module_param(l->stage[0], 0), zd_nn_module_param(l->stage[0], 1),
            zd_nn_module_param(l->stage[1], 0), zd_nn_module_param(l->stage[1], 1)};
        l->opt = zd_optim_new(&sgd, params, 4);
    }
    if (l->opt)
        return 0;
    ps2_local_free(l);
    return -1;
}

int ps2_local_step(ps2_local_t *l, int64_t position, float *loss)
{
    zd_tensor_t *x, *y, *h = NULL, *out = NULL, *lt = NULL;
    ps2_make_batch(0, position, &x, &y);
    zd_optim_zero_grad(l->opt, true);
    int rc = zd_nn_module_forward(l->stage[0], &x, 1, &h, 1) < 0 ||
            zd_nn_module_forward(l->stage[1], &h, 1, &out, 1) < 0 ||
            zd_nn_mse_loss(out, y, &lt) < 0 || zd_autograd_backward(lt, NULL, false) < 0 ||
            zd_optim_step_grad(l->opt) < 0
        ? -1
        : 0;
    if (rc == 0 && loss)
        *loss = zd_tensor_data(lt)[0];
    zd_tensor_unref(lt);
    zd_tensor_unref(out);
    zd_tensor_unref(h);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    return rc;
}

static int same_stage(const world_t *w, int s, zd_nn_module_t *local)
{
    zd_value_t *v = NULL;
    if (zd_rpc_sync(s, "test_stage_params", NULL, ZD_TIMEOUT_DEFAULT, &v) < 0)
        return world_fail(w, "stage %d's parameters: %s", s, zd_error_last());
    int rc = 0;
    for (int i = 0; rc == 0 && i < 2; i++) {
        zd_tensor_t *t, *want = zd_nn_module_param(local, i);
        if (zd_rpc_arg_tensor(v, (size_t)i, &t) < 0)
            rc = world_fail(w, "stage %d: %s", s, zd_error_last());
        for (int64_t k = 0; rc == 0 && k < zd_tensor_numel(want); k++) {
            float a = zd_tensor_data(t)[k], b = zd_tensor_data(want)[k];
            if (fabsf(a - b) > 1e-6f * (1 + fabsf(b)))
                rc = world_fail(w, "stage %d %s[%lld] is %.9g, trained locally %.9g", s,
                                zd_nn_module_param_name(local, i), (long long)k, a, b);
        }
    }
    zd_value_unref(v);
    return rc;
}

int ps2_same_params(const world_t *w, const ps2_local_t *l)
{
    int rc = 0;
    for (int s = 0; rc == 0 && s < 2; s++)
        rc = same_stage(w, s, l->stage[s]);
    return rc;
}

int64_t ps2_shard_version(int s)
{
    zd_value_t *v = NULL;
    int64_t n = -1;
    if (zd_rpc_sync(s, "test_version", NULL, ZD_TIMEOUT_DEFAULT, &v) == 0)
        zd_value_get_int(v, &n);
    zd_value_unref(v);
    return n;
}

int ps2_kill_shard_1(void)
{
    zd_value_t *v = NULL;
    int rc = zd_rpc_sync(1, "test_die", NULL, ZD_TIMEOUT_DEFAULT, &v) == 0 ? -1 : 0;
    zd_value_unref(v);
    return rc;
}

int ps2_leave(const world_t *w, zd_ps_model_t *model, int rc)
{
    zd_ps_model_free(model);
    if (zd_rpc_shutdown(true, world_scaled_ms(30000)) < 0)
        rc = world_fail(w, "shutdown: %s", zd_error_last());
    return rc;
}
