/*  Distributed autograd across real processes over loopback (SPEC A2-A6).

    Every process holds a parameter w (4 elements, w[i] = rank + 1 + i/10)
    and serves "mul_w"(x) = x * w; chains, fan-out, repeated tensors and
    RRefs are built from it, and every gradient is checked against the
    closed form. The tutorial Net split over three processes is checked
    against PyTorch's gradients in ../shared/golden/net. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/autograd.h"
#include "autograd/dist_autograd.h"
#include "autograd/error.h"
#include "nn/model.h"
#include "nn/nn.h"
#include "rpc/rpc.h"
#include "tests/support/dist_fixtures.h"
#include "tests/support/world.h"
#include "tools/golden_manifest.h"

#define N 4

static tensor_t *w_param;   /* this process's parameter */

static float w_value(int rank, int i) { return (float)rank + 1.0f + 0.1f * (float)i; }

static tensor_t *vec(const float *v)
{
    int64_t n = N;
    return tensor_from_data(TENSOR_F32, 1, &n, v);
}

static tensor_t *x_leaf(float base)
{
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = base + (float)i;
    tensor_t *x = vec(v);
    tensor_set_requires_grad(x, true);
    return x;
}

static int close_to(const float *a, const float *b, int n, float tol)
{
    for (int i = 0; i < n; i++)
        if (fabsf(a[i] - b[i]) > tol * (1.0f + fabsf(b[i])))
            return 0;
    return 1;
}

/*  ---- functions every process serves ---- */

static rpc_value_t *fn_mul_w(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return dist_mul_by(args, w_param);
}

/*  pair(a, b) = a * w + b * w */
static rpc_value_t *fn_pair(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    tensor_t *a, *b, *aw = NULL, *bw = NULL, *y = NULL;
    if (rpc_arg_tensor(args, 0, &a) < 0 || rpc_arg_tensor(args, 1, &b) < 0)
        return NULL;
    rpc_value_t *v = NULL;
    if (tensor_mul(a, w_param, &aw) == 0 && tensor_mul(b, w_param, &bw) == 0 &&
        tensor_add(aw, bw, &y) == 0)
        v = rpc_value_tensor(y);
    tensor_unref(aw);
    tensor_unref(bw);
    tensor_unref(y);
    return v;
}

/*  chain(x, hops): y = x * w, passed on to the next rank (1..world-1,
    wrapping) while hops remain. */
static rpc_value_t *fn_chain(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    tensor_t *x, *y;
    int64_t hops;
    if (rpc_arg_tensor(args, 0, &x) < 0 || rpc_arg_int(args, 1, &hops) < 0 ||
        tensor_mul(x, w_param, &y) < 0)
        return NULL;
    if (hops == 0) {
        rpc_value_t *v = rpc_value_tensor(y);
        tensor_unref(y);
        return v;
    }
    int next = rpc_rank() % (rpc_world_size() - 1) + 1;
    rpc_value_t *a = rpc_args("ti", y, hops - 1), *r = NULL;
    tensor_unref(y);
    if (rpc_sync(next, "chain", a, -1, &r) < 0)
        r = NULL;
    rpc_value_unref(a);
    return r;
}

/*  The gradient of w in a context, or none. */
static rpc_value_t *fn_get_grad(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t ctx;
    tensor_t *g;
    if (rpc_arg_int(args, 0, &ctx) < 0 || dist_autograd_get_gradient(ctx, w_param, &g) < 0)
        return NULL;
    rpc_value_t *v = g ? rpc_value_tensor(g) : rpc_value_none();
    tensor_unref(g);
    return v;
}

/*  Live contexts as the RPC debug counters show them (A6). */
static rpc_value_t *fn_num_contexts(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    int64_t n;
    if (rpc_get_debug_value("num_autograd_contexts", &n) < 0)
        return NULL;
    if (n != dist_autograd_num_contexts())
        return rpc_value_int(-1000 - n);
    return rpc_value_int(n);
}

static rpc_value_t *fn_flushed(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    dist_autograd_stats_t st;
    dist_autograd_stats(&st);
    return rpc_value_int(st.flushed_nodes);
}

static rpc_value_t *fn_rss(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return rpc_value_int(world_rss_bytes());
}

/*  split(x) returns y = x * w and keeps y for use_h, which returns 2y: two
    send functions over one graph. */
static tensor_t *kept;

static rpc_value_t *fn_split(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    rpc_value_t *v = fn_mul_w(call, args, arg);
    tensor_t *y;
    if (v && rpc_value_get_tensor(v, &y) == 0) {
        tensor_unref(kept);
        kept = tensor_ref(y);
    }
    return v;
}

static rpc_value_t *fn_use_h(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    tensor_t *y;
    if (!kept || tensor_scale(kept, 2.0f, &y) < 0)
        return NULL;
    tensor_unref_p(&kept);
    rpc_value_t *v = rpc_value_tensor(y);
    tensor_unref(y);
    return v;
}

/*  Ops whose backward fails, or kills the process. */
static int failing_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    (void)n, (void)gout, (void)gin;
    return error_set("deliberate failure in backward");
}

static int dying_backward(autograd_node_t *n, tensor_t *const *gout, tensor_t **gin)
{
    (void)n, (void)gout, (void)gin;
    fflush(NULL);
    _exit(7);
}

static const autograd_node_ops_t failing_ops = {"FailingBackward", failing_backward, NULL};
static const autograd_node_ops_t dying_ops = {"DyingBackward", dying_backward, NULL};

static rpc_value_t *bad_op(rpc_value_t *args, const autograd_node_ops_t *ops)
{
    tensor_t *x, *y;
    autograd_node_t *node;
    if (rpc_arg_tensor(args, 0, &x) < 0 || tensor_mul(x, w_param, &y) < 0)
        return NULL;
    tensor_t *out = tensor_clone(y);
    tensor_unref(y);
    if (autograd_node_new(ops, 1, &x, 1, &node) < 0 || !node) {
        tensor_unref(out);
        return NULL;
    }
    autograd_node_set_output(node, out);
    autograd_node_unref(node);
    rpc_value_t *v = rpc_value_tensor(out);
    tensor_unref(out);
    return v;
}

static rpc_value_t *fn_fail_bw(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return bad_op(args, &failing_ops);
}

static rpc_value_t *fn_die_bw(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return bad_op(args, &dying_ops);
}

static int setup(const world_t *w)
{
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = w_value(w->rank, i);
    w_param = vec(v);
    tensor_set_requires_grad(w_param, true);
    tensor_set_name(w_param, "w");
    struct {
        const char *name;
        rpc_handler_fn *fn;
    } fns[] = {{"mul_w", fn_mul_w},     {"pair", fn_pair},
               {"chain", fn_chain},     {"get_grad", fn_get_grad},
               {"num_contexts", fn_num_contexts}, {"rss", fn_rss},
               {"flushed", fn_flushed},
               {"split", fn_split},     {"use_h", fn_use_h},
               {"fail_bw", fn_fail_bw}, {"die_bw", fn_die_bw}};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (rpc_register(fns[i].name, fns[i].fn, NULL) < 0)
            return -1;
    return 0;
}

/*  ---- helpers for the driver (rank 0) ---- */

static tensor_t *call_tensor(int to, const char *fn, rpc_value_t *args)
{
    rpc_value_t *r;
    tensor_t *t = NULL;
    if (rpc_sync(to, fn, args, -1, &r) == 0) {
        if (rpc_value_get_tensor(r, &t) == 0)
            tensor_ref(t);
        rpc_value_unref(r);
    }
    rpc_value_unref(args);
    return t;
}

/*  Compares rank's gradient of w in ctx with expect (NULL: none expected). */
static int check_remote_grad(const world_t *w, int rank, int64_t ctx, const float *expect)
{
    rpc_value_t *r, *a = rpc_args("i", ctx);
    int src = rpc_sync(rank, "get_grad", a, -1, &r);
    rpc_value_unref(a);
    if (src < 0)
        return world_fail(w, "get_grad on %d: %s", rank, error_last());
    tensor_t *g = NULL;
    int ok = expect ? rpc_value_get_tensor(r, &g) == 0 && close_to(tensor_data(g), expect, N, 1e-5f)
                    : rpc_value_kind(r) == RPC_NONE;
    if (!ok && g)
        world_fail(w, "rank %d grad of w: %g %g %g %g, expected %g %g %g %g", rank,
                   tensor_data(g)[0], tensor_data(g)[1], tensor_data(g)[2], tensor_data(g)[3],
                   expect[0], expect[1], expect[2], expect[3]);
    rpc_value_unref(r);
    return ok ? 0 : world_fail(w, "rank %d: wrong gradient of w", rank);
}

static int check_local_grad(const world_t *w, int64_t ctx, tensor_t *t, const float *expect)
{
    tensor_t *g;
    if (dist_autograd_get_gradient(ctx, t, &g) < 0 || !g)
        return world_fail(w, "no local gradient: %s", error_last());
    int ok = close_to(tensor_data(g), expect, N, 1e-5f);
    if (!ok)
        world_fail(w, "local grad %g %g %g %g, expected %g %g %g %g", tensor_data(g)[0],
                   tensor_data(g)[1], tensor_data(g)[2], tensor_data(g)[3], expect[0], expect[1],
                   expect[2], expect[3]);
    tensor_unref(g);
    /* Gradients never land in .grad under distributed autograd. */
    tensor_t *local = tensor_grad(t);
    tensor_unref(local);
    return ok && !local ? 0 : world_fail(w, "wrong local gradient");
}

static int backward_sum(int64_t ctx, tensor_t *y)
{
    tensor_t *loss;
    if (tensor_sum(y, &loss) < 0)
        return -1;
    int rc = dist_autograd_backward(ctx, &loss, 1, false);
    tensor_unref(loss);
    return rc;
}

static int64_t remote_int(int rank, const char *fn)
{
    rpc_value_t *r;
    int64_t v = -1;
    if (rpc_sync(rank, fn, NULL, -1, &r) == 0) {
        rpc_value_get_int(r, &v);
        rpc_value_unref(r);
    }
    return v;
}

/*  ---- scenarios (rank 0 drives, the others serve) ---- */

/*  x -> 1 -> 2 -> 3 -> 1 -> 2: five hops, ranks visited twice. */
static int chain_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    int64_t ctx;
    tensor_t *x = x_leaf(1.0f);
    if (dist_autograd_context_begin(&ctx) < 0)
        return world_fail(w, "begin: %s", error_last());
    int hops = 5, visits[N] = {0};
    tensor_t *y = call_tensor(1, "chain", rpc_args("ti", x, (int64_t)(hops - 1)));
    if (!y || backward_sum(ctx, y) < 0)
        return world_fail(w, "chain: %s", error_last());
    int r = 1;
    for (int h = 0; h < hops; h++, r = r % (w->world_size - 1) + 1)
        visits[r]++;
    float expect_x[N], expect_w[4][N];
    for (int i = 0; i < N; i++) {
        double prod = 1;
        for (int k = 1; k < w->world_size; k++)
            prod *= pow(w_value(k, i), visits[k]);
        expect_x[i] = (float)prod;
        for (int k = 1; k < w->world_size; k++)
            expect_w[k][i] = (float)((1.0f + (float)i) * prod * visits[k] / w_value(k, i));
    }
    int rc = check_local_grad(w, ctx, x, expect_x);
    for (int k = 1; k < w->world_size && rc == 0; k++)
        rc = check_remote_grad(w, k, ctx, expect_w[k]);
    if (rc == 0 && dist_autograd_context_end(ctx, -1) < 0)
        rc = world_fail(w, "end: %s", error_last());
    tensor_unref(y);
    tensor_unref(x);
    return rc;
}

static void test_chain_of_five_hops_through_four_processes(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 4, .setup = setup, .fn = chain_body,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  Fan-out to 1 and 2, x sent twice to 1 in one call, and an RRef. */
static int fanout_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    int64_t ctx;
    tensor_t *x = x_leaf(2.0f);
    if (dist_autograd_context_begin(&ctx) < 0)
        return -1;
    rpc_value_t *ax = rpc_args("t", x);
    rpc_future_t *f1 = rpc_async(1, "mul_w", ax, -1);
    rpc_future_t *f2 = rpc_async(2, "mul_w", ax, -1);
    rpc_value_unref(ax);
    tensor_t *y1, *y2, *s = NULL, *p, *s2 = NULL;
    if (rpc_wait(f1, -1) < 0 || rpc_wait(f2, -1) < 0)
        return world_fail(w, "fan-out: %s", error_last());
    rpc_value_get_tensor(rpc_future_value(f1), &y1);
    rpc_value_get_tensor(rpc_future_value(f2), &y2);
    p = call_tensor(1, "pair", rpc_args("tt", x, x));   /* same tensor twice */
    if (!p || tensor_add(y1, y2, &s) < 0 || tensor_add(s, p, &s2) < 0 ||
        backward_sum(ctx, s2) < 0)
        return world_fail(w, "fan-out backward: %s", error_last());
    /* loss = sum(x w1 + x w2 + 2 x w1) */
    float ex[N], ew1[N], ew2[N];
    for (int i = 0; i < N; i++) {
        ex[i] = 3 * w_value(1, i) + w_value(2, i);
        ew1[i] = 3 * (2.0f + (float)i);
        ew2[i] = 2.0f + (float)i;
    }
    int rc = check_local_grad(w, ctx, x, ex);
    if (rc == 0)
        rc = check_remote_grad(w, 1, ctx, ew1);
    if (rc == 0)
        rc = check_remote_grad(w, 2, ctx, ew2);
    dist_autograd_context_end(ctx, -1);
    rpc_future_unref(f1);
    rpc_future_unref(f2);
    tensor_unref(s);
    tensor_unref(s2);
    tensor_unref(p);

    /* An RRef created and fetched under a context. */
    tensor_t *xr = x_leaf(-1.0f);
    if (rc == 0 && dist_autograd_context_begin(&ctx) == 0) {
        rpc_value_t *axr = rpc_args("t", xr);
        rpc_rref_t *ref = rpc_remote(2, "mul_w", axr, -1);
        rpc_value_unref(axr);
        rpc_value_t *v = NULL;
        tensor_t *y;
        if (!ref || rpc_rref_to_here(ref, -1, &v) < 0 || rpc_value_get_tensor(v, &y) < 0 ||
            backward_sum(ctx, y) < 0) {
            rc = world_fail(w, "rref: %s", error_last());
        } else {
            float exr[N], ew[N];
            for (int i = 0; i < N; i++) {
                exr[i] = w_value(2, i);
                ew[i] = -1.0f + (float)i;
            }
            rc = check_local_grad(w, ctx, xr, exr);
            if (rc == 0)
                rc = check_remote_grad(w, 2, ctx, ew);
        }
        rpc_value_unref(v);
        rpc_rref_unref(ref);
        dist_autograd_context_end(ctx, -1);
    }
    tensor_unref(xr);
    tensor_unref(x);
    return rc;
}

static void test_fan_out_repeated_tensor_and_rref(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = setup, .fn = fanout_body,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  An RPC output that the loss never uses leaves nodes waiting on rank 1:
    the pass must neither hang nor lose the used part. */
static int unused_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    int64_t ctx;
    tensor_t *x = x_leaf(1.0f);
    dist_autograd_context_begin(&ctx);
    tensor_t *a = call_tensor(1, "split", rpc_args("t", x));
    tensor_t *b = call_tensor(1, "use_h", rpc_args(""));   /* never used */
    if (!a || !b || backward_sum(ctx, a) < 0)
        return world_fail(w, "unused output: %s", error_last());
    float ex[N], ew[N];
    for (int i = 0; i < N; i++) {
        ex[i] = w_value(1, i);
        ew[i] = 1.0f + (float)i;
    }
    int rc = check_local_grad(w, ctx, x, ex);
    if (rc == 0)
        rc = check_remote_grad(w, 1, ctx, ew);
    /* The multiply node on rank 1 waited for use_h's send function: it ran
       in the flush, with that missing gradient as zeros. */
    if (rc == 0 && remote_int(1, "flushed") != 1)
        rc = world_fail(w, "rank 1 flushed %lld nodes, expected 1",
                        (long long)remote_int(1, "flushed"));
    dist_autograd_context_end(ctx, -1);
    tensor_unref(a);
    tensor_unref(b);
    tensor_unref(x);
    return rc;
}

static void test_unused_output_is_flushed_not_hung(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2, .setup = setup, .fn = unused_body,
                         .dist_autograd = true, .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

/*  Three trainers, 200 contexts each, one server, same parameter. */
#define CONTEXTS 200

static int trainers_body(const world_t *w)
{
    if (w->rank == 0)
        return 0;
    for (int it = 0; it < CONTEXTS; it++) {
        int64_t ctx;
        float xv[N];
        for (int i = 0; i < N; i++)
            xv[i] = (float)(w->rank * 1000 + it) + 0.25f * (float)i;
        tensor_t *x = vec(xv);
        if (dist_autograd_context_begin(&ctx) < 0)
            return world_fail(w, "begin: %s", error_last());
        tensor_t *y = call_tensor(0, "mul_w", rpc_args("t", x));
        int rc = y ? backward_sum(ctx, y) : -1;
        if (rc < 0)
            return world_fail(w, "iteration %d: %s", it, error_last());
        rc = check_remote_grad(w, 0, ctx, xv);   /* d sum(x w) / dw = x */
        /* Half the contexts end without waiting for the server's confirmation. */
        int erc = it % 2 ? dist_autograd_context_release(ctx) : dist_autograd_context_end(ctx, -1);
        if (erc < 0 || rc < 0)
            return world_fail(w, "iteration %d: %s", it, error_last());
        if (dist_autograd_context_exists(ctx))
            return world_fail(w, "context %lld still here after its end", (long long)ctx);
        tensor_unref(y);
        tensor_unref(x);
    }
    if (dist_autograd_wait_releases(-1) < 0)
        return world_fail(w, "releases: %s", error_last());
    return 0;
}

static void test_three_trainers_keep_gradients_apart(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 4, .setup = setup, .fn = trainers_body,
                         .dist_autograd = true, .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

/*  10,000 iterations: no context left anywhere, flat server memory. */
#define ITERATIONS 10000

static int memory_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    int64_t rss_early = 0, here;
    for (int it = 0; it < ITERATIONS; it++) {
        int64_t ctx;
        tensor_t *x = x_leaf((float)it);
        if (dist_autograd_context_begin(&ctx) < 0)
            return world_fail(w, "begin: %s", error_last());
        if (it == 0 && (rpc_get_debug_value("num_autograd_contexts", &here) < 0 || here != 1))
            return world_fail(w, "one live context, debug info says %lld", (long long)here);
        tensor_t *y = call_tensor(1, "mul_w", rpc_args("t", x));
        if (!y || backward_sum(ctx, y) < 0 || dist_autograd_context_end(ctx, -1) < 0)
            return world_fail(w, "iteration %d: %s", it, error_last());
        tensor_unref(y);
        tensor_unref(x);
        if (it == ITERATIONS / 5)
            rss_early = remote_int(1, "rss");
    }
    int64_t rss_late = remote_int(1, "rss"), live = remote_int(1, "num_contexts");
    printf("after %d iterations: contexts here %lld, on the server %lld; server RSS %.1f MB "
           "at %d iterations, %.1f MB at %d\n", ITERATIONS,
           (long long)dist_autograd_num_contexts(), (long long)live, rss_early / 1e6,
           ITERATIONS / 5, rss_late / 1e6, ITERATIONS);
    if (live != 0 || dist_autograd_num_contexts() != 0 ||
        rpc_get_debug_value("num_autograd_contexts", &here) < 0 || here != 0)
        return world_fail(w, "contexts left behind");
#if !defined(__SANITIZE_ADDRESS__)
    /* ASan's quarantine holds freed memory back, so only judge plain builds. */
    if (rss_late - rss_early > 4 * 1000 * 1000)
        return world_fail(w, "server memory grew by %lld bytes", (long long)(rss_late - rss_early));
#endif
    return 0;
}

static void test_ten_thousand_contexts_leave_nothing(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2, .setup = setup, .fn = memory_body,
                         .dist_autograd = true, .timeout_s = 300};
    assert_int_equal(world_run(&o), 0);
}

/*  A failing backward on rank 1; then rank 2 dies in the middle of one. */
static int errors_body(const world_t *w)
{
    if (w->rank != 0)
        return 0;
    int64_t ctx;
    tensor_t *x = x_leaf(1.0f);
    dist_autograd_context_begin(&ctx);
    tensor_t *y = call_tensor(1, "fail_bw", rpc_args("t", x));
    if (!y)
        return world_fail(w, "fail_bw: %s", error_last());
    if (backward_sum(ctx, y) == 0)
        return world_fail(w, "a failing backward succeeded");
    if (!strstr(error_last(), "worker1") || !strstr(error_last(), "deliberate failure"))
        return world_fail(w, "unclear error: %s", error_last());
    printf("failing backward reported: %s\n", error_last());
    dist_autograd_context_end(ctx, -1);
    tensor_unref(y);

    dist_autograd_context_begin(&ctx);
    y = call_tensor(2, "die_bw", rpc_args("t", x));
    if (!y)
        return world_fail(w, "die_bw: %s", error_last());
    if (backward_sum(ctx, y) == 0)
        return world_fail(w, "a backward through a dead peer succeeded");
    if (!strstr(error_last(), "worker2"))
        return world_fail(w, "unclear error: %s", error_last());
    printf("dead peer reported: %s\n", error_last());
    dist_autograd_context_end(ctx, 2000);
    tensor_unref(y);
    tensor_unref(x);
    /* rank 2 is gone: leave without the graceful barrier. */
    rpc_shutdown(false, 0);
    return 0;
}

static int errors_body_others(const world_t *w)
{
    if (w->rank == 0)
        return errors_body(w);
    if (w->rank == 1) {
        /* Wait for rank 0 to finish, then leave without waiting for rank 2. */
        rpc_shutdown(true, 20000);
        return 0;
    }
    return 0;   /* rank 2 dies inside its backward */
}

static void test_errors_in_backward_reach_the_caller(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = setup, .fn = errors_body_others,
                         .dist_autograd = true, .rpc_timeout_ms = 5000, .timeout_s = 90,
                         .expect_exit = {0, 0, 7}};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- the tutorial Net split over three processes ---- */

static nn_model_t *net;
static golden_case_t *golden;

static int net_setup(const world_t *w)
{
    const char *dir = getenv("ZDIST_GOLDEN_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/net", dir && *dir ? dir : "../shared/golden");
    if (!(golden = golden_case_load(path)) || !(net = nn_net_new(1)))
        return -1;
    nn_model_train(net, false);
    for (int i = 0; i < nn_model_n_params(net); i++) {
        tensor_t *src = golden_tensor(golden, "param", nn_model_param_name(net, i));
        if (!src || tensor_copy_(nn_model_param(net, i), src) < 0)
            return -1;
    }
    return setup(w);
}

static rpc_value_t *fn_net_conv(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    tensor_t *x, *flat;
    if (rpc_arg_tensor(args, 0, &x) < 0 || nn_net_forward_conv(net, x, &flat) < 0)
        return NULL;
    rpc_value_t *v = rpc_value_tensor(flat);
    tensor_unref(flat);
    return v;
}

static rpc_value_t *fn_net_fc(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    tensor_t *flat, *out;
    if (rpc_arg_tensor(args, 0, &flat) < 0 || nn_net_forward_fc(net, flat, &out) < 0)
        return NULL;
    rpc_value_t *v = rpc_value_tensor(out);
    tensor_unref(out);
    return v;
}

/*  Compares this process's context gradients of the given parameters with
    the golden ones; returns the number that matched, as an int value. */
static rpc_value_t *fn_net_check(rpc_call_t *call, rpc_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t ctx, first, count, matched = 0;
    if (rpc_arg_int(args, 0, &ctx) < 0 || rpc_arg_int(args, 1, &first) < 0 ||
        rpc_arg_int(args, 2, &count) < 0)
        return NULL;
    for (int i = (int)first; i < first + count; i++) {
        const char *name = nn_model_param_name(net, i);
        golden_entry_t *e = golden_find(golden, "grad", name);
        tensor_t *g;
        if (!e || dist_autograd_get_gradient(ctx, nn_model_param(net, i), &g) < 0 || !g)
            continue;
        int64_t row = tensor_numel(g) / tensor_size(g, 0), bad = 0;
        int64_t n = tensor_numel(e->value);
        for (int64_t k = 0; k < n; k++) {
            int64_t src = e->n_rows ? e->rows[k / row] * row + k % row : k;
            float a = tensor_data(g)[src], x = tensor_data(e->value)[k];
            if (fabsf(a - x) > 1e-5f + 1e-4f * fabsf(x))
                bad++;
        }
        if (bad == 0)
            matched++;
        else
            fprintf(stderr, "%s: %lld elements off\n", name, (long long)bad);
        tensor_unref(g);
    }
    return rpc_value_int(matched);
}

static int net_register(const world_t *w)
{
    if (net_setup(w) < 0)
        return -1;
    return rpc_register("net_conv", fn_net_conv, NULL) | rpc_register("net_fc", fn_net_fc, NULL) |
           rpc_register("net_check", fn_net_check, NULL);
}

static int net_body(const world_t *w)
{
    int rc = 0;
    if (w->rank == 0) {
        int64_t ctx;
        tensor_t *x = golden_tensor(golden, "input", "x");
        tensor_t *target = golden_tensor(golden, "input", "target");
        tensor_t *flat = NULL, *logprobs = NULL, *loss = NULL;
        dist_autograd_context_begin(&ctx);
        flat = call_tensor(1, "net_conv", rpc_args("t", x));
        logprobs = flat ? call_tensor(2, "net_fc", rpc_args("t", flat)) : NULL;
        if (!logprobs || nn_nll_loss(logprobs, target, &loss) < 0 ||
            dist_autograd_backward(ctx, &loss, 1, false) < 0)
            rc = world_fail(w, "net: %s", error_last());
        float expect = tensor_data(golden_tensor(golden, "output", "loss"))[0];
        if (rc == 0 && fabsf(tensor_data(loss)[0] - expect) > 1e-4f)
            rc = world_fail(w, "loss %g, golden %g", tensor_data(loss)[0], expect);
        /* conv1.*, conv2.* live on rank 1; fc1.*, fc2.* on rank 2 */
        int64_t m1 = 0, m2 = 0;
        for (int k = 1; rc == 0 && k <= 2; k++) {
            rpc_value_t *r, *a = rpc_args("iii", ctx, (int64_t)(k == 1 ? 0 : 4), (int64_t)4);
            if (rpc_sync(k, "net_check", a, -1, &r) == 0) {
                rpc_value_get_int(r, k == 1 ? &m1 : &m2);
                rpc_value_unref(r);
            }
            rpc_value_unref(a);
        }
        if (rc == 0 && (m1 != 4 || m2 != 4))
            rc = world_fail(w, "gradients matching golden: %lld of 4 on rank 1, %lld of 4 on "
                            "rank 2", (long long)m1, (long long)m2);
        dist_autograd_context_end(ctx, -1);
        tensor_unref(loss);
        tensor_unref(logprobs);
        tensor_unref(flat);
    }
    return rc;
}

static void test_net_split_over_three_processes_matches_golden(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = net_register, .fn = net_body,
                         .dist_autograd = true, .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_of_five_hops_through_four_processes),
        cmocka_unit_test(test_fan_out_repeated_tensor_and_rref),
        cmocka_unit_test(test_unused_output_is_flushed_not_hung),
        cmocka_unit_test(test_net_split_over_three_processes_matches_golden),
        cmocka_unit_test(test_three_trainers_keep_gradients_apart),
        cmocka_unit_test(test_errors_in_backward_reach_the_caller),
        cmocka_unit_test(test_ten_thousand_contexts_leave_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
