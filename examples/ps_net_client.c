/* SPDX-License-Identifier: MIT */
/*  ps_net_client.c: a trainer's end of the Net's parameter server
    (ps_net_client.h). */
#include "examples/ps_net_client.h"
#include "examples/fault.h"
#include "examples/train_common.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/ps.h>

/*  The most parameter RRefs a trainer takes from the server: with S shards
    there are 2 S + 6 of them (ps_net.h), so S stays well below. */
#define MAX_PARAM_RREFS 64

/*  Times each rank rejoined the world (zd_rpc_register_peer_joined): a
    trainer whose server shard came back before it noticed the loss sees
    the count change. */
static atomic_int rank_joins[PS_NET_MAX_SERVERS];

struct ps_net_client {
    ps_net_client_config_t cfg;
    zd_rref_t *ps;
    zd_value_t *param_list;
    zd_dist_optim_t *opt;
    int joins[PS_NET_MAX_SERVERS]; /* the shards' join counts at attach */
};

static void peer_joined(void *arg, int rank, const char *name)
{
    (void)arg, (void)name;
    if (rank >= 0 && rank < PS_NET_MAX_SERVERS)
        atomic_fetch_add(&rank_joins[rank], 1);
}

int ps_net_client_hooks(void)
{
    return zd_rpc_register_peer_joined(peer_joined, NULL);
}

ps_net_client_t *ps_net_client_new(const ps_net_client_config_t *cfg)
{
    if (cfg->num_servers < 1 || cfg->num_servers > PS_NET_MAX_SERVERS) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "%d server shards: 1 to %d", cfg->num_servers,
                          PS_NET_MAX_SERVERS);
        return NULL;
    }
    ps_net_client_t *c = calloc(1, sizeof *c);
    if (!c) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    return c;
}

static void detach(ps_net_client_t *c)
{
    zd_dist_optim_free(c->opt);
    zd_value_unref(c->param_list);
    zd_rref_unref(c->ps);
    c->opt = NULL;
    c->param_list = NULL;
    c->ps = NULL;
}

static int call_none(zd_rref_t *ps, const char *method, zd_value_t *args)
{
    zd_value_t *r = NULL;
    int rc = zd_rref_rpc_sync_take(ps, method, args, ZD_TIMEOUT_DEFAULT, &r);
    zd_value_unref(r);
    return rc;
}

int ps_net_client_attach(ps_net_client_t *c)
{
    detach(c);
    for (int i = 0; i < PS_NET_MAX_SERVERS; i++)
        c->joins[i] = atomic_load(&rank_joins[i]);
    zd_rref_list_t *params = NULL;
    if (!(c->ps = zd_rpc_remote(0, "get_parameter_server", NULL, ZD_TIMEOUT_DEFAULT)) ||
        zd_rref_rpc_sync(c->ps, "ps_get_param_rrefs", NULL, ZD_TIMEOUT_DEFAULT, &c->param_list) < 0)
        goto fail;
    int n = (int)zd_list_len(c->param_list);
    if (n > MAX_PARAM_RREFS) {
        zd_error_set("the server offers %d parameter RRefs; a trainer takes at most %d", n,
                     MAX_PARAM_RREFS);
        goto fail;
    }
    if (!(params = zd_rref_list_new()))
        goto fail;
    for (int i = 0; i < n; i++) {
        zd_rref_t *r;
        if (zd_rpc_arg_rref(c->param_list, (size_t)i, &r) < 0 || zd_rref_list_append(params, r) < 0)
            goto fail;
    }
    zd_optim_config_t cfg = zd_optim_sgd_defaults(c->cfg.lr);
    if (!(c->opt = zd_dist_optim_new(&cfg, params)) ||
        zd_ps_trainer_started(0, ZD_TIMEOUT_DEFAULT) < 0)
        goto fail;
    zd_rref_list_free(params);
    return 0;
fail:
    zd_rref_list_free(params);
    detach(c);
    return -1;
}

zd_rref_t *ps_net_client_server(const ps_net_client_t *c)
{
    return c->ps;
}

int ps_net_client_forward(ps_net_client_t *c, zd_tensor_t *x, bool training, zd_tensor_t **out)
{
    *out = NULL;
    if (training)
        fault_point(zd_rpc_rank(), "forward"); /* tests only (fault.h) */
    zd_value_t *r;
    if (zd_rref_rpc_sync_take(c->ps, "ps_forward", ZD_ARGS(x, training), ZD_TIMEOUT_DEFAULT, &r) <
        0)
        return -1;
    zd_tensor_t *t;
    int rc = zd_value_get_tensor(r, &t);
    if (rc == 0)
        *out = zd_tensor_ref(t);
    zd_value_unref(r);
    return rc;
}

int ps_net_client_backward(ps_net_client_t *c, int64_t context_id, zd_tensor_t *loss)
{
    (void)c;
    return zd_dist_autograd_backward(context_id, &loss, 1, false);
}

int ps_net_client_step(ps_net_client_t *c, int64_t context_id)
{
    return zd_dist_optim_step(c->opt, context_id);
}

int ps_net_client_resume_point(ps_net_client_t *c, int64_t *start)
{
    zd_value_t *r = NULL, *a = ZD_ARGS(c->cfg.trainer);
    int64_t at = -1;
    int rc = a ? zd_rref_rpc_sync(c->ps, "ps_resume_point", a, ZD_TIMEOUT_DEFAULT, &r) : -1;
    if (rc == 0)
        rc = zd_value_get_int(r, &at);
    zd_value_unref(a);
    zd_value_unref(r);
    if (rc == 0 && (at < 0 || at > c->cfg.positions))
        rc = zd_error_set("checkpoint %s: trainer %d had done %lld batches, outside 0 to %lld "
                          "(%lld epoch(s))",
                          c->cfg.checkpoint, c->cfg.trainer, (long long)at,
                          (long long)c->cfg.positions, (long long)c->cfg.epochs);
    if (rc == 0)
        *start = at;
    return rc;
}

/*  The shard that was lost, or came back since attach; -1 when none did
    within 5 s: RPC declares a peer lost about 1 s after its connection
    dropped. */
static int shard_gone(const ps_net_client_t *c)
{
    for (double until = train_now() + 5;;) {
        for (int s = 0; s < c->cfg.num_servers; s++)
            if (zd_rpc_peer_is_lost(s) || atomic_load(&rank_joins[s]) != c->joins[s])
                return s;
        if (train_now() >= until)
            return -1;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
}

int ps_net_client_recover(ps_net_client_t *c, int64_t done, int64_t *start)
{
    if (!c->cfg.checkpoint)
        return -1;
    char why[512];
    snprintf(why, sizeof why, "%s", zd_error_last());
    int shard = shard_gone(c);
    if (shard < 0)
        return zd_error_set("%s", why);
    int rank = zd_rpc_rank();
    int64_t wait_s = c->cfg.server_wait_s;
    double t0 = train_now();
    printf("Rank %d: server shard %d lost at batch %lld (%s); waiting up to %lld s "
           "(--server_wait_s) for it to come back\n",
           rank, shard, (long long)done, why, (long long)wait_s);
    fflush(stdout);
    /* What the old process owned is gone: let go of it while it is lost,
       and of the releases of contexts it held (they fail: it is gone), so
       that their failures do not stop the batches that follow. */
    detach(c);
    if (zd_dist_autograd_wait_releases(1000) < 0)
        printf("Rank %d: contexts of the lost server's process not released: %s\n", rank,
               zd_error_last());
    for (int s = 0; s < c->cfg.num_servers; s++) {
        int64_t left = (int64_t)((t0 + (double)wait_s - train_now()) * 1000);
        if (zd_rpc_wait_peer(s, left > 0 ? left : 1) < 0)
            return zd_error_set("server shard %d (rank %d) lost (%s) and not back within "
                                "--server_wait_s=%lld s: %s",
                                s, s, why, (long long)wait_s, zd_error_last());
    }
    /* Just back, a shard may not take calls from everyone yet (its new
       connections are being made): try again until the wait is up. */
    while (ps_net_client_attach(c) < 0 || ps_net_client_resume_point(c, start) < 0) {
        detach(c);
        if (train_now() - t0 > (double)wait_s)
            return zd_error_wrap("server shard %d came back, but", shard);
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    printf("Rank %d: the servers are back after %.2f s; going on from batch %lld (the last "
           "checkpoint; %lld batch(es) of this trainer to take again)\n",
           rank, train_now() - t0, (long long)*start, (long long)(done - *start));
    fflush(stdout);
    return 1;
}

/*  The registry's calls go to rank 0, not through the server's RRef: a
    shard 0 started again since attach would take them as if nothing had
    happened, and the batches since its checkpoint would be lost. 0, or
    -1 (ZD_ERR_PEER) for recovery to take over. */
static int shard0_same(const ps_net_client_t *c)
{
    /* (lost and not back: the call fails by itself, naming the peer) */
    if (atomic_load(&rank_joins[0]) != c->joins[0])
        return zd_error_set_code(ZD_ERR_PEER,
                                 "server shard 0 (rank 0) was lost and started "
                                 "again since this trainer attached");
    return 0;
}

int ps_net_client_staleness_gate(ps_net_client_t *c, int64_t done, int64_t k)
{
    if (shard0_same(c) < 0)
        return -1;
    int rc = zd_ps_trainer_gate(0, done, k, ZD_TIMEOUT_DEFAULT, NULL);
    if (rc < 0 && zd_error_code() == ZD_ERR_TIMEOUT) {
        fprintf(stderr,
                "rpc_ps trainer %d: waited the RPC timeout for the slowest trainer "
                "(--max_staleness=%lld); going on\n",
                zd_rpc_rank(), (long long)k);
        return 0;
    }
    return rc;
}

int ps_net_client_checkpoint(ps_net_client_t *c, int64_t done)
{
    fault_point(zd_rpc_rank(), "checkpoint"); /* tests only (fault.h) */
    return call_none(c->ps, "ps_checkpoint", ZD_ARGS(c->cfg.trainer, done));
}

int ps_net_client_finished(ps_net_client_t *c)
{
    return shard0_same(c) < 0 ? -1 : zd_ps_trainer_finished(0, ZD_TIMEOUT_DEFAULT);
}

int ps_net_client_shared_accuracy(ps_net_client_t *c, int64_t samples, double *acc)
{
    if (shard0_same(c) < 0)
        return -1;
    zd_value_t *a = zd_value_int(samples), *r = NULL;
    int rc = a ? zd_ps_trainer_wait_all(0, a, ZD_TIMEOUT_DEFAULT, &r) : -1;
    if (rc == 0)
        rc = zd_value_get_float(r, acc);
    zd_value_unref(a);
    zd_value_unref(r);
    return rc;
}

/*  The servers stop waiting for a trainer that said its run failed (with
    --checkpoint rank 0 waits for every trainer before its shutdown), name
    it with its error, and the world ends once the others are done,
    instead of waiting for a trainer that will never finish. A plain
    function of rank 0: the trainer may have failed before it had an RRef. */
void ps_net_client_report_failure(ps_net_client_t *c, int64_t done)
{
    (void)c;
    char why[1024];
    snprintf(why, sizeof why, "%s", zd_error_last());
    if (zd_rpc_peer_is_lost(0))
        return;
    if (zd_ps_trainer_failed(0, done, why, ZD_TIMEOUT_DEFAULT) < 0)
        fprintf(stderr, "rpc_ps trainer %d: could not tell the server that this run failed: %s\n",
                zd_rpc_rank(), zd_error_last());
    zd_error_set("%s", why);
}

void ps_net_client_free(ps_net_client_t *c)
{
    if (!c)
        return;
    detach(c);
    free(c);
}
