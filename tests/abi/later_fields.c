/* SPDX-License-Identifier: MIT */
/*  A program built against the 1.0 headers, run on a library built as a
    later 1.x might be: every struct that carries its size has fields
    appended there (tests/abi/later_headers.cmake). The option structs
    this program fills are read no further than their size, so the later
    fields keep the library's defaults and the options set here take
    effect; the out-structs the library fills are written no further than
    the size passed, so the bytes after them stay as they were. A world of
    one process on a port of its own: a call to itself, a backward pass,
    metrics and counters, limits, an optimizer's config, an op's table, the
    launch environment, a parameter server's options, shutdown. Exits 0 when all of it holds,
    1 naming what did not. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zdist/zdist.h>

#define CANARY 0xA5

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "later_fields: " __VA_ARGS__);                                         \
            fprintf(stderr, " (%s)\n", zd_error_last());                                           \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/*  Whether the n bytes at p are all CANARY. */
static int intact(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != CANARY)
            return 0;
    return 1;
}

static zd_value_t *add_one(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t v;
    if (ZD_UNPACK(args, &v) < 0)
        return NULL;
    return zd_value_int(v + 1);
}

/*  A port on 127.0.0.1 that no other test takes: bound (SO_REUSEADDR, not
    listening) until this process exits; ZeroMQ's listener, which sets
    SO_REUSEADDR too, can still bind it. -1 on failure. */
static int reserve_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0)
        return -1;
    return ntohs(a.sin_port);
}

int main(void)
{
    int port = reserve_port();
    if (port < 0) {
        perror("later_fields: reserving a port");
        return 1;
    }
    zd_rpc_options_t opts = zd_rpc_options_default();
    opts.master_addr = "127.0.0.1";
    opts.master_port = port;
    opts.rpc_timeout_ms = 7000;
    opts.num_worker_threads = 2;
    opts.init_timeout_ms = 20000;
    /* a parameter server of one shard, here, with 1.0 options: no push
       may be a version behind (the default takes any) */
    zd_named_tensors_t *served = zd_named_tensors_new();
    zd_tensor_t *sw = zd_tensor_zeros1(2);
    zd_ps_options_t po = zd_ps_options_default();
    po.max_staleness = 0;
    zd_optim_config_t psgd = zd_optim_sgd_defaults(0.5);
    zd_ps_server_t *srv = NULL;
    CHECK(served && sw && zd_named_tensors_add(served, "w", sw) == 0 &&
              (srv = zd_ps_server_new(served, 0, 1, &psgd, &po)),
          "zd_ps_server_new");
    zd_named_tensors_free(served);
    zd_tensor_unref(sw);
    /* distributed autograd sets its hooks (a sized struct) before RPC runs */
    CHECK(zd_dist_autograd_init() == 0, "zd_dist_autograd_init");
    if (zd_rpc_init("solo", 0, 1, &opts) < 0) {
        fprintf(stderr, "later_fields: zd_rpc_init: %s\n", zd_error_last());
        return 1;
    }
    CHECK(zd_rpc_get_timeout() == 7000, "rpc_timeout_ms not taken: %lld",
          (long long)zd_rpc_get_timeout());

    zd_rpc_function_t f = zd_rpc_function_default();
    f.fn = add_one;
    CHECK(zd_rpc_register_function("add_one", &f) == 0, "zd_rpc_register_function");
    zd_value_t *r = NULL;
    int64_t v = 0;
    CHECK(zd_rpc_sync_take(0, "add_one", ZD_ARGS(41), ZD_TIMEOUT_DEFAULT, &r) == 0 &&
              zd_value_get_int(r, &v) == 0 && v == 42,
          "a call to itself: %lld", (long long)v);
    zd_value_unref(r);

    struct {
        zd_rpc_metrics_t m;
        unsigned char after[64];
    } metrics;
    memset(&metrics, CANARY, sizeof metrics);
    CHECK(zd_rpc_metrics_get(-1, &metrics.m, sizeof metrics.m) == 0, "zd_rpc_metrics_get");
    CHECK(intact(metrics.after, sizeof metrics.after), "metrics written past the 1.0 struct");
    /* (calls_served counts once the answer is out, which may be after
       the caller has it) */
    CHECK(metrics.m.calls_sent == 1, "metrics: %lld calls sent, not 1",
          (long long)metrics.m.calls_sent);

    zd_dist_autograd_limits_t limits = zd_dist_autograd_limits_default();
    CHECK(zd_dist_autograd_set_limits(&limits) == 0, "zd_dist_autograd_set_limits");
    struct {
        zd_dist_autograd_stats_t s;
        unsigned char after[64];
    } stats;
    memset(&stats, CANARY, sizeof stats);
    CHECK(zd_dist_autograd_stats(&stats.s, sizeof stats.s) == 0, "zd_dist_autograd_stats");
    CHECK(intact(stats.after, sizeof stats.after), "stats written past the 1.0 struct");

    /* y = sum(x * x) at x = (1, 2, 3): x.grad = 2x, with the 1.0 options */
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, (int64_t[]){3}, 1, (float[]){1, 2, 3});
    zd_tensor_t *sq = NULL, *y = NULL;
    CHECK(x && zd_tensor_set_requires_grad(x, true) == 0 && zd_tensor_mul(x, x, &sq) == 0 &&
              zd_tensor_sum(sq, &y) == 0,
          "forward");
    zd_autograd_options_t ao = zd_autograd_options_default();
    zd_autograd_root_t root = {.tensor = y};
    CHECK(y && zd_autograd_run(&root, 1, &ao) == 0, "zd_autograd_run");
    zd_tensor_t *g = x ? zd_tensor_grad(x) : NULL;
    CHECK(g && zd_tensor_data(g)[0] == 2 && zd_tensor_data(g)[2] == 6, "x.grad is not 2x");
    zd_tensor_unref(g);
    zd_tensor_unref(y);
    zd_tensor_unref(sq);
    zd_tensor_unref(x);

    /* an optimizer from a 1.0 config, its config read back no further than
       the 1.0 struct; an op table of the 1.0 header; the launch environment */
    zd_tensor_t *p = zd_tensor_zeros1(2);
    zd_optim_config_t oc = zd_optim_sgd_defaults(0.5);
    zd_optim_t *opt =
        p && zd_tensor_set_requires_grad(p, true) == 0 ? zd_optim_new(&oc, &p, 1) : NULL;
    CHECK(opt, "zd_optim_new");
    struct {
        zd_optim_config_t c;
        unsigned char after[64];
    } back;
    memset(&back, CANARY, sizeof back);
    CHECK(opt && zd_optim_config(opt, &back.c, sizeof back.c) == 0 && back.c.lr == 0.5 &&
              back.c.size == sizeof back.c,
          "zd_optim_config");
    CHECK(intact(back.after, sizeof back.after), "optim config written past the 1.0 struct");
    memset(&back, CANARY, sizeof back);
    CHECK(zd_optim_config_parse("adam lr=0.25", &back.c, sizeof back.c) == 0 && back.c.lr == 0.25 &&
              zd_optim_config_check(&back.c) == 0,
          "zd_optim_config_parse");
    CHECK(intact(back.after, sizeof back.after), "parsed config written past the 1.0 struct");
    zd_optim_free(opt);
    static const zd_autograd_node_ops_t ops = ZD_AUTOGRAD_NODE_OPS("LaterBackward", NULL, NULL);
    zd_autograd_node_t *node = NULL;
    CHECK(zd_autograd_node_new(&ops, &p, 1, 1, &node) == 0 && node, "zd_autograd_node_new");
    zd_autograd_node_unref(node);
    zd_tensor_unref(p);
    struct {
        zd_rpc_env_t e;
        unsigned char after[64];
    } env;
    memset(&env, CANARY, sizeof env);
    CHECK(zd_rpc_env_resolve(0, 1, "127.0.0.1", port, &env.e, sizeof env.e) == 0 &&
              env.e.rank == 0 && env.e.master_port == port,
          "zd_rpc_env_resolve");
    CHECK(intact(env.after, sizeof env.after), "env written past the 1.0 struct");

    /* the trainer: a push on what it pulled is taken; the next one, now a
       version behind, is stale under the 1.0 options' max_staleness 0 */
    zd_tensor_t *rw = zd_tensor_zeros1(2), *rs = NULL;
    zd_named_tensors_t *replica = zd_named_tensors_new();
    zd_ps_client_t *cl = NULL;
    int shard_rank = 0;
    CHECK(rw && replica && zd_tensor_set_requires_grad(rw, true) == 0 &&
              zd_named_tensors_add(replica, "w", rw) == 0 &&
              (cl = zd_ps_client_new(replica, &shard_rank, 1, &po)) &&
              zd_tensor_sum(rw, &rs) == 0 && zd_autograd_backward(rs, NULL, false) == 0,
          "a parameter server's trainer");
    CHECK(cl && zd_ps_client_pull(cl, ZD_TIMEOUT_DEFAULT) == 0 &&
              zd_ps_client_push(cl, ZD_TIMEOUT_DEFAULT) == 0,
          "a push on the parameters pulled");
    CHECK(cl && zd_ps_client_push(cl, ZD_TIMEOUT_DEFAULT) == -1 && zd_error_code() == ZD_ERR_STALE,
          "a push a version behind was not refused as stale");
    CHECK(srv && zd_ps_server_version(srv) == 1, "the shard took %lld steps, not 1",
          srv ? (long long)zd_ps_server_version(srv) : -1LL);
    zd_ps_client_free(cl);
    zd_named_tensors_free(replica);
    zd_tensor_unref(rs);
    zd_tensor_unref(rw);

    CHECK(zd_rpc_shutdown(true, 20000) == 0, "zd_rpc_shutdown");
    zd_ps_server_free(srv);
    if (failures)
        return 1;
    printf("later_fields: a 1.0 program on a library with later fields: every check held\n");
    return 0;
}
