/* SPDX-License-Identifier: MIT */
/*  Distributed autograd against a hostile peer (issue 11 points 3-4; the
    audit's finding 2 and experiments E2, E8, E13).

    A parameter-server-like world of three processes: rank 0 serves
    "ps_fwd"(x) = log_softmax(x @ W) with its parameter W, rank 1 trains
    against it with distributed autograd and checks every gradient against
    the same computation done locally, and rank 2 is a bystander whose rank
    the intruder claims: a raw socket in the trainer's process that speaks
    the wire protocol to the server as rank 2. Between and inside the
    trainer's steps it sends a gradient of the wrong shape (E2: one float
    for a 32x10 log_softmax output, which read 1,280 bytes out of a 4-byte
    buffer before), one of the wrong dtype, a Lamport number near 2^64, a
    release and a flush of the trainer's live context, and a flood of new
    contexts. Each must be refused with an error, the server must log a
    line naming rank 2, the trainer's gradients must stay exact, the
    server's memory bounded, and the flooded contexts expire. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include <zdist/autograd.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>
#include <zdist/model.h>
#include <zdist/ps.h>
#include "examples/ps_stages.h"
#include "tests/support/intruder.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define B        32
#define K        8
#define C        10
#define PER_PEER 32 /* the server's cap on contexts one peer makes */
#define FLOOD    400
#define IDLE_MS  3000

static float w_at(int i, int j)
{
    return 0.1f * sinf((float)(i * C + j));
}
static float x_at(int step, int i, int j)
{
    return 0.05f * cosf((float)(step * 7 + i * K + j));
}
static float m_at(int i, int j)
{
    return (float)((i + j) % 3) - 1.0f;
}

static zd_tensor_t *make(int rows, int cols, float (*f)(int, int))
{
    int64_t shape[2] = {rows, cols};
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, 2);
    float *d = t ? zd_tensor_data(t) : NULL;
    for (int i = 0; d && i < rows; i++)
        for (int j = 0; j < cols; j++)
            d[i * cols + j] = f(i, j);
    return t;
}

static zd_tensor_t *make_x(int step)
{
    int64_t shape[2] = {B, K};
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, 2);
    float *d = t ? zd_tensor_data(t) : NULL;
    for (int i = 0; d && i < B; i++)
        for (int j = 0; j < K; j++)
            d[i * K + j] = x_at(step, i, j);
    return t;
}

/*  log_softmax(x @ w): the server's forward, and the trainer's reference. */
static zd_tensor_t *forward(zd_tensor_t *x, zd_tensor_t *w)
{
    zd_tensor_t *h = NULL, *y = NULL;
    if (zd_tensor_matmul(x, w, &h) == 0)
        zd_nn_log_softmax(h, 1, &y);
    zd_tensor_unref(h);
    return y;
}

/*  ---- the server (rank 0) ---- */

static zd_tensor_t *server_w;
static pthread_mutex_t done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cond = PTHREAD_COND_INITIALIZER;
static bool trainer_done;

static zd_value_t *fn_fwd(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x;
    if (zd_rpc_arg_tensor(args, 0, &x) < 0)
        return NULL;
    zd_tensor_t *y = forward(x, server_w);
    zd_value_t *v = y ? zd_value_tensor(y) : NULL;
    zd_tensor_unref(y);
    return v;
}

static zd_value_t *fn_ping(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(1);
}

static zd_value_t *fn_done(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&done_lock);
    trainer_done = true;
    pthread_cond_broadcast(&done_cond);
    pthread_mutex_unlock(&done_lock);
    return zd_value_none();
}

/*  The server's log lines, kept for the checks. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[64 * 1024];
static size_t log_len;

static void log_sink(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level, (void)who, (void)arg;
    pthread_mutex_lock(&log_lock);
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s\n", line);
    if (n > 0 && log_len + (size_t)n < sizeof log_text)
        log_len += (size_t)n;
    pthread_mutex_unlock(&log_lock);
}

/*  Whether a captured line contains both a and b. */
static bool logged(const char *a, const char *b)
{
    bool found = false;
    pthread_mutex_lock(&log_lock);
    for (const char *p = log_text; p && *p && !found;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        found = strstr(line, a) && strstr(line, b);
        p = end ? end + 1 : NULL;
    }
    pthread_mutex_unlock(&log_lock);
    return found;
}

static int check_logged(const world_t *w, const char *a, const char *b)
{
    if (logged(a, b))
        return 0;
    pthread_mutex_lock(&log_lock);
    world_fail(w, "no log line with \"%s\" and \"%s\"; the server logged:\n%s", a, b, log_text);
    pthread_mutex_unlock(&log_lock);
    return -1;
}

static int server(const world_t *w)
{
    int64_t held0 = world_held_bytes();
    int64_t deadline = world_now_ms() + 90000;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 90;
    pthread_mutex_lock(&done_lock);
    while (!trainer_done && pthread_cond_timedwait(&done_cond, &done_lock, &until) == 0)
        ;
    bool done = trainer_done;
    pthread_mutex_unlock(&done_lock);
    WCHECK(done);
    /* The flooded contexts expire once idle (the trainer's were released):
       the count is looked at, with a deadline, until they are gone. */
    while (zd_dist_autograd_num_contexts() > 0 && world_now_ms() < deadline) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    WCHECK(zd_dist_autograd_num_contexts() == 0);
    int64_t grown = world_held_bytes() - held0;
    fprintf(stderr, "rank 0: the server grew by %lld KiB under attack\n", (long long)(grown >> 10));
    if (grown > 64 << 20)
        return world_fail(w, "the server grew by %lld MiB under attack", (long long)(grown >> 20));
    WCHECK(zd_autograd_seq_current() < (UINT64_C(1) << 34));
    WCHECK(check_logged(w, "gradient 0 from peer \"worker2\" (rank 2)", "[1]") == 0);
    WCHECK(check_logged(w, "gradient 0 from peer \"worker2\" (rank 2)", "uint8") == 0);
    WCHECK(check_logged(w, "sequence number 18446744073709551615", "(rank 2)") == 0);
    WCHECK(check_logged(w, "a release for context", "(rank 2), which took no part") == 0);
    WCHECK(check_logged(w, "a flush for context", "(rank 2), which took no part") == 0);
    WCHECK(check_logged(w, "refused a new context", "(rank 2): it already has 32") == 0);
    WCHECK(check_logged(w, "made by peer \"worker2\" (rank 2) unused for", "released") == 0);
    zd_log_set_sink(NULL, NULL);
    return 0;
}

/*  ---- the intruder (in the trainer's process, claiming rank 2) ---- */

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/*  The request metadata of distributed autograd (dist_record.c). */
static void dist_extra(uint8_t out[26], int64_t ctx, uint64_t msg, uint64_t seq)
{
    out[0] = 'D';
    out[1] = 1;
    put_u64(out + 2, (uint64_t)ctx);
    put_u64(out + 10, msg);
    put_u64(out + 18, seq);
}

/*  Waits for the answer to request id; 1 with its type, text and (for a
    reply) the message id of the server's send function from its hook
    bytes. 0 when none came. */
static int raw_reply(intruder_t *in, uint64_t id, int *type, char *text, size_t size,
                     uint64_t *msg_id)
{
    int64_t deadline = world_now_ms() + 10000;
    while (world_now_ms() < deadline) {
        zmq_pollitem_t it = {in->sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        zmq_msg_t head;
        zmq_msg_init(&head);
        if (zmq_msg_recv(&head, in->sock, 0) < 0) {
            zmq_msg_close(&head);
            return 0;
        }
        for (bool more = zmq_msg_more(&head); more;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            zmq_msg_recv(&m, in->sock, 0);
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        rpc_wire_header_t h;
        bool mine =
            zd__rpc_wire_parse(zmq_msg_data(&head), zmq_msg_size(&head), &h) == 0 && h.id == id;
        if (mine) {
            *type = h.type;
            snprintf(text, size, "%.*s", h.type == RPC_MSG_ERROR ? (int)h.meta_len : 0,
                     (const char *)h.meta);
            *msg_id = 0;
            for (int i = 0; h.extra_len == 18 && i < 8; i++)
                *msg_id |= (uint64_t)h.extra[2 + i] << (8 * i);
        }
        zmq_msg_close(&head);
        if (mine)
            return 1;
    }
    return 0;
}

/*  Calls fn on the server as rank 2 and expects an ERROR containing why. */
static int expect_refused(intruder_t *in, const char *fn, zd_value_t *args, const void *extra,
                          const char *why)
{
    uint64_t id = intruder_call(in, 0, fn, args, extra, extra ? 26 : 0), msg;
    zd_value_unref(args);
    int type;
    char text[512];
    if (!id || !raw_reply(in, id, &type, text, sizeof text, &msg)) {
        fprintf(stderr, "%s: no answer (expected an error with \"%s\")\n", fn, why);
        return -1;
    }
    if (type != RPC_MSG_ERROR || !strstr(text, why)) {
        fprintf(stderr, "%s: answer %d \"%s\", expected an error with \"%s\"\n", fn, type, text,
                why);
        return -1;
    }
    return 0;
}

/*  E2: the intruder's own forward under its own context, then gradients
    of a wrong shape and a wrong dtype for the server's reply. */
static int attack_gradients(intruder_t *in)
{
    int64_t ctx = (int64_t)(UINT64_C(2) << 48 | 1001);
    uint8_t extra[26];
    dist_extra(extra, ctx, 0, 1);
    zd_tensor_t *x = make_x(0);
    zd_value_t *args = zd__rpc_args("t", x);
    zd_tensor_unref(x);
    uint64_t id = intruder_call(in, 0, "ps_fwd", args, extra, sizeof extra), msg = 0;
    zd_value_unref(args);
    int type;
    char text[512];
    if (!id || !raw_reply(in, id, &type, text, sizeof text, &msg) || type != RPC_MSG_REPLY ||
        !msg) {
        fprintf(stderr, "the intruder's forward failed (%s)\n", text);
        return -1;
    }
    int64_t pass = (int64_t)(UINT64_C(2) << 48 | 5);
    int64_t one = 1, shape[2] = {B, C};
    zd_tensor_t *tiny = zd_tensor_new(ZD_FLOAT32, &one, 1);
    zd_tensor_t *bytes = zd_tensor_new(ZD_UINT8, shape, 2);
    int rc = expect_refused(in, "__dist_backward",
                            zd__rpc_args("iiiit", ctx, (int64_t)msg, pass, (int64_t)0, tiny), NULL,
                            "from peer \"worker2\" (rank 2)");
    if (rc == 0)
        rc = expect_refused(in, "__dist_backward",
                            zd__rpc_args("iiiit", ctx, (int64_t)msg, pass, (int64_t)0, bytes), NULL,
                            "is uint8 [32,10]");
    zd_tensor_unref(tiny);
    zd_tensor_unref(bytes);
    /* Its own context it may release (it made it). */
    intruder_answer_t a;
    zd_value_t *rel = zd__rpc_args("i", ctx);
    if (rc == 0 &&
        (intruder_call_wait(in, 0, "__dist_release", rel, 10000, &a) != 1 ||
         a.type != RPC_MSG_REPLY)) {
        fprintf(stderr, "the intruder could not release its own context: %s\n", a.text);
        rc = -1;
    }
    intruder_answer_clear(&a);
    zd_value_unref(rel);
    return rc;
}

/*  E8 (Lamport): a sequence number near 2^64 would wrap the server's clock. */
static int attack_lamport(intruder_t *in)
{
    uint8_t extra[26];
    dist_extra(extra, (int64_t)(UINT64_C(2) << 48 | 1002), 0, UINT64_MAX);
    return expect_refused(in, "ps_ping", zd__rpc_args("i", (int64_t)0), extra,
                          "implausible sequence number");
}

/*  E13: new contexts without end. The first PER_PEER are made (the bytes
    of an empty context), every other is refused; contexts in another
    rank's name or of no world member are refused too. */
static int attack_flood(intruder_t *in)
{
    int refused = 0, made = 0;
    uint64_t first = 0;
    for (int k = 0; k < FLOOD; k++) {
        uint8_t extra[26];
        dist_extra(extra, (int64_t)(UINT64_C(2) << 48 | (uint64_t)(5000 + k)), 0, 1);
        zd_value_t *args = zd__rpc_args("i", (int64_t)k);
        uint64_t id = intruder_call(in, 0, "ps_ping", args, extra, sizeof extra);
        zd_value_unref(args);
        if (!first)
            first = id;
    }
    /* The answers come in any order (the server's pool runs the calls). */
    (void)first;
    for (int k = 0; k < FLOOD; k++) {
        intruder_answer_t a;
        if (!intruder_answer(in, 10000, &a))
            break;
        if (a.type == RPC_MSG_REPLY)
            made++;
        else if (strstr(a.text, "refused a new context"))
            refused++;
        intruder_answer_clear(&a);
    }
    if (made != PER_PEER || refused != FLOOD - PER_PEER) {
        fprintf(stderr, "flood: %d contexts made, %d refused (expected %d and %d)\n", made, refused,
                PER_PEER, FLOOD - PER_PEER);
        return -1;
    }
    uint8_t extra[26];
    dist_extra(extra, (int64_t)(UINT64_C(9) << 48 | 1), 0, 1);
    return expect_refused(in, "ps_ping", zd__rpc_args("i", (int64_t)0), extra,
                          "not made by a member of this world");
}

/*  ---- the trainer (rank 1) ---- */

/*  One training step under a new context; between forward and backward
    the intruder (when given) tries to release and flush that context.
    The gradient of x must equal the one computed locally. */
static int step(int s, intruder_t *in)
{
    zd_tensor_t *x = make_x(s), *xl = make_x(s), *w = make(K, C, w_at), *m = make(B, C, m_at);
    zd_tensor_set_requires_grad(x, true);
    zd_tensor_set_requires_grad(xl, true);
    zd_tensor_t *y = NULL, *ym = NULL, *loss = NULL, *g = NULL;
    zd_value_t *res = NULL;
    int rc = -1;
    int64_t ctx;
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        goto out;
    zd_value_t *args = zd__rpc_args("t", x);
    int frc = zd_rpc_sync(0, "ps_fwd", args, ZD_TIMEOUT_DEFAULT, &res);
    zd_value_unref(args);
    if (frc < 0 || zd_value_get_tensor(res, &y) < 0)
        goto end;
    zd_tensor_ref(y);
    if (in &&
        (expect_refused(in, "__dist_release", zd__rpc_args("i", ctx), NULL,
                        "which took no part in it") < 0 ||
         expect_refused(in, "__dist_flush", zd__rpc_args("ii", ctx, (int64_t)1), NULL,
                        "which took no part in it") < 0))
        goto end;
    if (zd_tensor_mul(y, m, &ym) < 0 || zd_tensor_sum(ym, &loss) < 0 ||
        zd_dist_autograd_backward(ctx, &loss, 1, false) < 0 ||
        zd_dist_autograd_get_gradient(ctx, x, &g) < 0 || !g)
        goto end;
    /* The same step locally. */
    zd_tensor_t *yl = forward(xl, w), *yml = NULL, *lossl = NULL;
    int lrc = yl && zd_tensor_mul(yl, m, &yml) == 0 && zd_tensor_sum(yml, &lossl) == 0 &&
            zd_autograd_backward(lossl, NULL, false) == 0
        ? 0
        : -1;
    zd_tensor_t *gl = lrc == 0 ? zd_tensor_grad(xl) : NULL;
    rc = gl && zd_tensor_numel(gl) == zd_tensor_numel(g) ? 0 : -1;
    for (int64_t i = 0; rc == 0 && i < zd_tensor_numel(g); i++) {
        float a = ((float *)zd_tensor_data(g))[i], b = ((float *)zd_tensor_data(gl))[i];
        if (fabsf(a - b) > 1e-5f * (1.0f + fabsf(b))) {
            fprintf(stderr, "step %d: gradient %lld is %g, locally %g\n", s, (long long)i, a, b);
            rc = -1;
        }
    }
    zd_tensor_unref(gl);
    zd_tensor_unref(yl);
    zd_tensor_unref(yml);
    zd_tensor_unref(lossl);
end:
    if (zd_dist_autograd_context_end(ctx, ZD_TIMEOUT_DEFAULT) < 0)
        rc = -1;
out:
    if (rc < 0)
        fprintf(stderr, "step %d failed: %s\n", s, zd_error_last());
    zd_value_unref(res);
    zd_tensor_unref(x);
    zd_tensor_unref(xl);
    zd_tensor_unref(w);
    zd_tensor_unref(m);
    zd_tensor_unref(y);
    zd_tensor_unref(ym);
    zd_tensor_unref(loss);
    zd_tensor_unref(g);
    return rc;
}

static int trainer(const world_t *w)
{
    zd_rpc_worker_info_t info;
    WCHECK(zd_rpc_get_worker_info_by_rank(0, &info) == 0);
    intruder_t in;
    WCHECK(intruder_open_as(&in, info.endpoint, 2, 65534) == 0);
    int s = 0, rc = 0;
    for (; rc == 0 && s < 3; s++)
        rc = step(s, NULL);
    if (rc == 0)
        rc = attack_gradients(&in);
    for (int i = 0; rc == 0 && i < 2; i++)
        rc = step(s++, NULL);
    if (rc == 0)
        rc = attack_lamport(&in);
    for (int i = 0; rc == 0 && i < 3; i++)
        rc = step(s++, &in);
    if (rc == 0)
        rc = attack_flood(&in);
    for (int i = 0; rc == 0 && i < 3; i++)
        rc = step(s++, NULL);
    intruder_close(&in);
    WCHECK(rc == 0);
    zd_value_t *res = NULL;
    WCHECK(zd_rpc_sync(0, "ps_done", NULL, ZD_TIMEOUT_DEFAULT, &res) == 0);
    zd_value_unref(res);
    (void)w;
    return 0;
}

static int setup(const world_t *w)
{
    if (w->rank == 0) {
        server_w = make(K, C, w_at);
        zd_tensor_set_requires_grad(server_w, true);
        zd_dist_autograd_limits_t l = zd_dist_autograd_limits_default();
        l.max_contexts = 64;
        l.max_contexts_per_peer = PER_PEER;
        l.idle_timeout_ms = IDLE_MS;
        if (zd_dist_autograd_set_limits(&l) < 0)
            return -1;
        zd_log_set_sink(log_sink, NULL);
    }
    if (zd_rpc_register("ps_fwd", fn_fwd, NULL) < 0 ||
        zd_rpc_register("ps_ping", fn_ping, NULL) < 0 ||
        zd_rpc_register("ps_done", fn_done, NULL) < 0)
        return -1;
    return 0;
}

static int run(const world_t *w)
{
    int rc = w->rank == 0 ? server(w) : w->rank == 1 ? trainer(w) : 0;
    zd_tensor_unref(server_w);
    server_w = NULL;
    return rc;
}

static void test_hostile_peer_against_distributed_autograd(void **state)
{
    (void)state;
    world_options_t o = {
        .world_size = 3, .setup = setup, .fn = run, .timeout_s = 180, .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- rpc_ps's parameter server against a hostile trainer ----

    Rank 0 serves rpc_ps's stage of the Net (examples/ps_stages.h) on the
    layer's remote model, with checkpoints and a batch limit of 64; rank
    1, trainer 0, steps and checkpoints its position; rank 2, trainer 1,
    sends oversized and malformed batches, asks for the stage's
    parameters (rank 0's alone to ask), and steps with a nan gradient. A
    trainer's position is kept under the rank of its calls (the RPC layer
    names the caller): there is no argument for trainer 1 to name trainer
    0's, and each trainer's position is checked to be its own. */

#define PS_MAX_BATCH 64

static char ps_prefix[256];
static pthread_mutex_t ps_done_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ps_done_cond = PTHREAD_COND_INITIALIZER;
static int ps_done;
static zd_nn_module_t *ps_stage;     /* rank 0 */
static zd_ps_model_server_t *ps_srv; /* rank 0 */
static zd_ps_model_t *ps_model;      /* ranks 1 and 2 */
static float ps_before;              /* rank 0: a parameter's value before any step */

static zd_value_t *fn_ps_done(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    pthread_mutex_lock(&ps_done_lock);
    ps_done++;
    pthread_cond_broadcast(&ps_done_cond);
    pthread_mutex_unlock(&ps_done_lock);
    return zd_value_none();
}

/*  The stage's first parameter's first value, as rank 0 serves it. */
static float ps_first_value(void)
{
    zd_named_tensors_t *nt = zd_ps_model_server_params(ps_srv);
    float v = nt ? zd_tensor_data(zd_named_tensors_tensor(nt, 0))[0] : NAN;
    zd_named_tensors_free(nt);
    return v;
}

static int ps_setup(const world_t *w)
{
    zd_optim_config_t sgd = zd_optim_sgd_defaults(0.1);
    if (w->rank != 0)
        return (ps_model = zd_ps_model_new(NULL, 1, &sgd, NULL)) ? 0 : -1;
    zd_nn_module_t *net = zd_nn_net_new(1);
    ps_stage = net ? ps_stage_new(net, 0, 1, PS_MAX_BATCH, 1, false) : NULL;
    zd_nn_module_free(net);
    zd_ps_options_t po = zd_ps_options_default();
    po.max_input_numel = ps_stage_max_input(0, PS_MAX_BATCH);
    po.checkpoint_path = ps_prefix;
    ps_srv = ps_stage ? zd_ps_model_server_new(ps_stage, 0, 1, &po) : NULL;
    int rc = ps_srv && ps_stages_register(ps_srv, ps_stage) == 0 ? 0 : -1;
    if (rc == 0)
        ps_before = ps_first_value();
    if (rc == 0)
        rc = zd_rpc_register("t_done", fn_ps_done, NULL);
    zd_log_set_sink(log_sink, NULL);
    return rc;
}

/*  An MNIST-shaped batch of n images of c channels, every pixel v. */
static zd_tensor_t *images(int64_t n, int64_t c, float v)
{
    int64_t shape[4] = {n, c, 28, 28};
    zd_tensor_t *x = zd_tensor_new(ZD_FLOAT32, shape, 4);
    if (x)
        zd_tensor_fill_(x, v);
    return x;
}

/*  A forward of x through the served stage; 0 when it failed with an
    error containing why. */
static int ps_forward_refused(zd_tensor_t *x, const char *why)
{
    zd_tensor_t *out = NULL;
    int rc = zd_ps_model_forward(ps_model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT);
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    if (rc == 0 || !strstr(zd_error_last(), why)) {
        fprintf(stderr, "forward: %s, expected an error with \"%s\"\n",
                rc == 0 ? "succeeded" : zd_error_last(), why);
        return -1;
    }
    return 0;
}

/*  One step of the Net on batch x under a new context, its loss scaled
    by scale: 0, -1 (the step refused, the error set), or -2 (failed
    before the step). */
static int ps_step(zd_tensor_t *x, float scale)
{
    zd_tensor_t *out = NULL, *mean = NULL, *loss = NULL;
    int rc = -1, step_rc = -1;
    ZD_DIST_AUTOGRAD_CONTEXT(ctx)
    {
        if (zd_ps_model_forward(ps_model, &x, 1, &out, 1, ZD_TIMEOUT_DEFAULT) == 0 &&
            zd_tensor_mean(out, &mean) == 0 && zd_tensor_scale(mean, scale, &loss) == 0 &&
            zd_ps_model_backward(ps_model, ctx, loss) == 0)
            rc = 0;
        if (rc == 0)
            step_rc = zd_ps_model_step(ps_model, ctx);
    }
    zd_tensor_unref(out);
    zd_tensor_unref(mean);
    zd_tensor_unref(loss);
    return rc < 0 ? -2 : step_rc;
}

/*  A checkpoint of this trainer's position, asked again when the other
    trainer's took a newer generation meanwhile (ZD_ERR_STALE). */
static int ps_checkpoint(int64_t position)
{
    int rc = -1;
    for (int tries = 0; rc < 0 && tries < 5; tries++)
        if ((rc = zd_ps_model_checkpoint(ps_model, position, ZD_TIMEOUT_DEFAULT)) < 0 &&
            zd_error_code() != ZD_ERR_STALE)
            break;
    return rc;
}

static int ps_server(const world_t *w)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 120;
    pthread_mutex_lock(&ps_done_lock);
    while (ps_done < 2 && pthread_cond_timedwait(&ps_done_cond, &ps_done_lock, &until) == 0)
        ;
    int done = ps_done;
    pthread_mutex_unlock(&ps_done_lock);
    WCHECK(done == 2);
    WCHECK(check_logged(w, "step refused, nothing applied", "worker \"worker2\" (rank 2)") == 0);
    float after = ps_first_value();
    WCHECK(isfinite(after) && after != ps_before); /* trainer 0's step, nothing of the nan one */
    zd_log_set_sink(NULL, NULL);
    return 0;
}

static int ps_trainer0(const world_t *w)
{
    (void)w;
    int64_t at = -1;
    zd_tensor_t *x = images(8, 1, 0.5f);
    WCHECK(ps_step(x, 1) == 0);
    WTRY(ps_checkpoint(7));
    WTRY(zd_ps_model_resume_position(ps_model, ZD_TIMEOUT_DEFAULT, &at));
    WCHECK(at == 7);
    WTRY(zd_rpc_sync(0, "t_done", NULL, ZD_TIMEOUT_DEFAULT, NULL));
    zd_tensor_unref(x);
    zd_ps_model_free(ps_model);
    return 0;
}

static int ps_trainer1(const world_t *w)
{
    /* Batches the server does not take: too many images, or of three
       channels (no more elements than the limit lets in). */
    WTRY(ps_forward_refused(images(PS_MAX_BATCH + 1, 1, 0.5f), "max_input_numel"));
    WTRY(ps_forward_refused(images(4, 3, 0.5f), "must be float32 (N, 1, 28, 28)"));
    /* The stage's parameters are rank 0's to read. */
    zd_value_t *r = NULL;
    WCHECK(zd_rpc_sync(0, "rpc_ps_params", NULL, ZD_TIMEOUT_DEFAULT, &r) < 0);
    WCHECK(strstr(zd_error_last(), "for rank 0 only, not \"worker2\" (rank 2)") != NULL);
    /* A nan batch is refused at the forward; a nan loss makes gradients
       that are not finite, and the step is refused. */
    WTRY(ps_forward_refused(images(4, 1, NAN), "is nan, not finite"));
    zd_tensor_t *x = images(4, 1, 0.5f);
    int rc = ps_step(x, NAN);
    zd_tensor_unref(x);
    if (rc != -1 || !strstr(zd_error_last(), "the step was refused and nothing applied"))
        return world_fail(w, "a nan step: rc %d, \"%s\"", rc, zd_error_last());
    /* Its position is its own (trainer 0's stays 7): a step, and a
       checkpoint at 3. */
    x = images(4, 1, 0.5f);
    rc = ps_step(x, 1);
    zd_tensor_unref(x);
    WCHECK(rc == 0);
    WTRY(ps_checkpoint(3));
    int64_t at = -2;
    WTRY(zd_ps_model_resume_position(ps_model, ZD_TIMEOUT_DEFAULT, &at));
    WCHECK(at == 3);
    WTRY(zd_rpc_sync(0, "t_done", NULL, ZD_TIMEOUT_DEFAULT, NULL));
    zd_ps_model_free(ps_model);
    return 0;
}

static int ps_run(const world_t *w)
{
    return w->rank == 0 ? ps_server(w) : w->rank == 1 ? ps_trainer0(w) : ps_trainer1(w);
}

static int ps_teardown(const world_t *w)
{
    (void)w;
    zd_ps_model_server_free(ps_srv);
    zd_nn_module_free(ps_stage);
    return 0;
}

static void test_hostile_trainer_against_the_parameter_server(void **state)
{
    (void)state;
    snprintf(ps_prefix, sizeof ps_prefix, "/tmp/zd_hostile_ps_%d/ck", (int)getpid());
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/zd_hostile_ps_%d", (int)getpid());
    assert_int_equal(mkdir(dir, 0700), 0);
    world_options_t o = {.world_size = 3,
                         .setup = ps_setup,
                         .fn = ps_run,
                         .teardown = ps_teardown,
                         .timeout_s = 180,
                         .dist_autograd = true};
    int rc = world_run(&o);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(rc, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostile_peer_against_distributed_autograd),
        cmocka_unit_test(test_hostile_trainer_against_the_parameter_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
