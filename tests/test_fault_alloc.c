/* SPDX-License-Identifier: MIT */
/*  Allocation failure injection, SQLite's way (issue 25 point 2). Built
    with -DZDIST_FAULT_INJECT=ON only (core/fault_inject.h): each
    scenario runs with the N-th allocation of its thread failing, for
    N = 1, 2, 3, ... until a run makes fewer than N allocations, which must
    then succeed. At every N that failed:
      - the calls returned their failure, with ZD_ERR_NO_MEMORY and a text
        saying "out of memory";
      - nothing crashed (every scenario runs in processes of its own);
      - the tensors, values, owned RRefs and autograd contexts of the
        process, and of its peer in two-process worlds, came back to what
        they were;
      - the world kept working: the next N runs in it.
    LeakSanitizer checks every process at exit (the ASan+UBSan stage of
    tools/test.sh builds with injection). Each scenario prints how many
    allocations it makes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/checkpoint.h>
#include <zdist/dataset.h>
#include <zdist/dist_autograd.h>
#include <zdist/dist_optim.h>
#include <zdist/error.h>
#include <zdist/idx.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include <zdist/optim.h>
#include <zdist/rpc.h>
#include "core/fault_inject.h"
#include "rpc/agent/agent.h"
#include "rpc/value/codec.h"
#include "tests/support/fixtures.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

/*  ---- the driver ---- */

/*  What a process holds: these must come back after every failure. */
typedef struct {
    int64_t v[8];
    int n;
} counts_t;

static const char *count_names[] = {
    "tensors",      "values",      "owned RRefs",      "autograd contexts",
    "peer tensors", "peer values", "peer owned RRefs", "peer autograd contexts"};

/*  The calls under test: 0, or -1 with the error of the call that failed
    (what was made is released before returning either way). */
typedef int(scenario_fn)(void *arg);
/*  Counts once the process (and its peer) are quiet: 0, or -1. */
typedef int(counts_fn)(counts_t *out);

static void local_counts_into(counts_t *c)
{
    c->v[c->n++] = zd_tensor_live_count();
    c->v[c->n++] = zd__value_live_count();
    c->v[c->n++] = zd_rpc_is_running() ? zd_rpc_debug_owner_rrefs() : 0;
    c->v[c->n++] = zd_dist_autograd_num_contexts();
}

static int local_counts(counts_t *c)
{
    c->n = 0;
    local_counts_into(c);
    return 0;
}

static bool counts_equal(const counts_t *a, const counts_t *b)
{
    return a->n == b->n && memcmp(a->v, b->v, sizeof a->v[0] * (size_t)a->n) == 0;
}

/*  Waits (up to 10 s) for the counts to come back to *want: the peer
    releases what a failed call left it asynchronously. */
static int counts_back(counts_fn *counts, const counts_t *want, counts_t *got)
{
    int64_t until = world_now_ms() + world_scaled_ms(10000);
    for (;;) {
        if (counts(got) < 0)
            return -1;
        if (counts_equal(got, want) || world_now_ms() > until)
            return counts_equal(got, want) ? 0 : -1;
        usleep(2000);
    }
}

static void print_counts_diff(const world_t *w, const char *name, long n, const counts_t *want,
                              const counts_t *got)
{
    for (int i = 0; i < want->n && i < got->n; i++)
        if (want->v[i] != got->v[i])
            world_fail(w, "%s, N = %ld: %s %lld, %lld before", name, n, count_names[i],
                       (long long)got->v[i], (long long)want->v[i]);
}

/*  Runs fn with allocation N failing, N = 1, 2, ... (see the top). Every
    problem is printed; 0 when there was none. */
/*  Waits (up to 10 s) until this process serves no more than `calls`
    calls: a call's answer reaches its caller before the server has
    released the call's arguments (zd_rpc_init's barrier among them). */
static int wait_serving(int64_t calls)
{
    int64_t until = world_now_ms() + world_scaled_ms(10000);
    for (;;) {
        agent_t *a = zd__agent_acquire();
        int64_t serving = a ? atomic_load_explicit(&a->serving, memory_order_acquire) : 0;
        if (a)
            zd__agent_release(a);
        if (serving <= calls)
            return 0;
        if (world_now_ms() > until)
            return zd_error_set("still serving %lld calls after 10 s", (long long)serving);
        usleep(2000);
    }
}

static int drive(const world_t *w, const char *name, scenario_fn *fn, void *arg, counts_fn *counts)
{
    counts_t before, after;
    if (wait_serving(0) < 0 || counts(&before) < 0)
        return world_fail(w, "%s: counts: %s", name, zd_error_last());
    int problems = 0, benign_ok = 0;
    /* ZD_FAULT_FROM and ZD_FAULT_TO: only those N (to look at one failure). */
    long from = getenv("ZD_FAULT_FROM") ? atol(getenv("ZD_FAULT_FROM")) : 1;
    long to = getenv("ZD_FAULT_TO") ? atol(getenv("ZD_FAULT_TO")) : 0;
    for (long n = from > 0 ? from : 1; !to || n <= to; n++) {
        zd_error_clear();
        zd__fault_arm(n);
        int rc = fn(arg);
        bool fired = zd__fault_fired(), benign = zd__fault_fired_benign();
        long made = zd__fault_count();
        zd__fault_arm(0);
        char text[1024];
        snprintf(text, sizeof text, "%s", zd_error_last());
        zd_error_code_t code = zd_error_code();
        if (!fired && rc < 0) {
            world_fail(w, "%s: failed with no allocation failing (N = %ld): %s", name, n, text);
            return -1;
        }
        if (fired && rc == 0 && benign) {
            benign_ok++; /* a fallback the code has by design */
        } else if (fired && rc == 0) {
            world_fail(w, "%s: allocation %ld failed, yet every call succeeded", name, n);
            problems++;
        } else if (fired && code != ZD_ERR_NO_MEMORY) {
            world_fail(w, "%s: allocation %ld failed: code \"%s\", not \"no memory\": %s", name, n,
                       zd_error_code_name(code), text);
            problems++;
        } else if (fired && !strstr(text, "out of memory")) {
            world_fail(w, "%s: allocation %ld failed: the text does not say so: %s", name, n, text);
            problems++;
        }
        if (counts_back(counts, &before, &after) < 0) {
            print_counts_diff(w, name, n, &before, &after);
            problems++;
            before = after; /* one leak is reported once */
        }
        if (!fired) {
            printf("%s: %ld allocations; each failed in turn (N = 1 to %ld)%s", name, made, n - 1,
                   problems ? "" : ", every failure reported and undone");
            printf(benign_ok ? " (%d survived by design)\n" : "\n", benign_ok);
            fflush(stdout);
            return problems ? -1 : 0;
        }
    }
    return problems ? -1 : 0;
}

/*  ---- tensor ops, backward and an optimizer step ---- */

typedef struct {
    zd_tensor_t *x, *y, *w1, *b1, *w2, *b2, *a, *b;
} mlp_t;

static zd_tensor_t *filled(int ndim, const int64_t *shape, float scale, bool grad)
{
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, ndim);
    float *d = zd_tensor_data(t);
    for (int64_t i = 0; i < zd_tensor_numel(t); i++)
        d[i] = scale * (float)((i * 7919) % 17 - 8) / 8.0f;
    if (grad)
        zd_tensor_set_requires_grad(t, true);
    return t;
}

/*  x (256, 256) @ w1^T is a 256 KiB activation and w1's gradient another:
    tensors of that size get blocks of their own (core/blocks.c). */
static void mlp_make(mlp_t *m)
{
    m->x = filled(2, (int64_t[]){256, 256}, 1.0f, false);
    m->w1 = filled(2, (int64_t[]){256, 256}, 0.05f, true);
    m->b1 = filled(1, (int64_t[]){256}, 0.1f, true);
    m->w2 = filled(2, (int64_t[]){10, 256}, 0.05f, true);
    m->b2 = filled(1, (int64_t[]){10}, 0.1f, true);
    m->a = filled(2, (int64_t[]){3, 4}, 1.0f, true);
    m->b = filled(2, (int64_t[]){2, 4}, 1.0f, true);
    m->y = zd_tensor_new(ZD_INT64, (int64_t[]){256}, 1);
    for (int i = 0; i < 256; i++)
        zd_tensor_data_i64(m->y)[i] = i % 10;
}

static void mlp_free(mlp_t *m)
{
    zd_tensor_t **all[] = {&m->x, &m->y, &m->w1, &m->b1, &m->w2, &m->b2, &m->a, &m->b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        zd_tensor_unref_p(all[i]);
}

/*  A forward pass of a two-layer MLP, a few other ops, backward through
    both, an SGD step with momentum (its state is made on the first). */
static int mlp_step(void *arg)
{
    mlp_t *m = arg;
    zd_tensor_t *params[] = {m->w1, m->b1, m->w2, m->b2, m->a, m->b};
    zd_tensor_t *h = NULL, *r = NULL, *logits = NULL, *loss = NULL;
    zd_tensor_t *cat = NULL, *perm = NULL, *th = NULL, *nar = NULL, *prod = NULL, *s = NULL;
    zd_tensor_t *total = NULL;
    zd_optim_t *opt = NULL;
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.01);
    cfg.momentum = 0.9;
    int rc = -1;
    if (zd_nn_linear(m->x, m->w1, m->b1, &h) < 0 || zd_nn_relu(h, &r) < 0 ||
        zd_nn_linear(r, m->w2, m->b2, &logits) < 0 || zd_nn_cross_entropy(logits, m->y, &loss) < 0)
        goto done;
    if (zd_tensor_cat((zd_tensor_t *[]){m->a, m->b}, 2, 0, &cat) < 0 ||
        zd_tensor_permute(cat, (int[]){1, 0}, 2, &perm) < 0 || zd_tensor_tanh(perm, &th) < 0 ||
        zd_tensor_narrow(th, 1, 1, 3, &nar) < 0 || zd_tensor_mul(nar, nar, &prod) < 0 ||
        zd_tensor_sum(prod, &s) < 0 || zd_tensor_add(loss, s, &total) < 0)
        goto done;
    if (zd_autograd_backward(total, NULL, false) < 0)
        goto done;
    if (!(opt = zd_optim_new(&cfg, params, 6)) || zd_optim_step_grad(opt) < 0)
        goto done;
    rc = 0;
done:
    zd_optim_free(opt);
    zd_tensor_t *made[] = {h, r, logits, loss, cat, perm, th, nar, prod, s, total};
    for (size_t i = 0; i < sizeof made / sizeof made[0]; i++)
        zd_tensor_unref(made[i]);
    for (int i = 0; i < 6; i++)
        zd_tensor_clear_grad(params[i]);
    return rc;
}

static int tensors_body(const world_t *w)
{
    /* The layers' work on this thread only: its allocations are the ones counted. */
    zd_nn_set_num_threads(1);
    mlp_t m;
    mlp_make(&m);
    int rc = drive(w, "tensor ops, backward and SGD step", mlp_step, &m, local_counts);
    mlp_free(&m);
    return rc;
}

static void test_tensors(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 120, tensors_body, NULL), 0);
}

/*  ---- the codec: a value holding every kind, encoded and decoded ---- */

/*  A stand-in RRef (the codec asks its callbacks; no agent runs here). */
static int fake_rref_refs = 1;
static char fake_rref_obj;
static void fake_ref(zd_rref_t *r)
{
    (void)r, fake_rref_refs++;
}
static void fake_unref(zd_rref_t *r)
{
    (void)r, fake_rref_refs--;
}

static int fake_encode(void *arg, zd_rref_t *r, int dst, uint8_t out[RPC_RREF_WIRE_SIZE])
{
    (void)arg, (void)r, (void)dst;
    memset(out, 0xA5, RPC_RREF_WIRE_SIZE);
    return 0;
}

static int fake_decode(void *arg, const uint8_t in[RPC_RREF_WIRE_SIZE], int src, zd_rref_t **out)
{
    (void)arg, (void)in, (void)src;
    fake_ref((zd_rref_t *)&fake_rref_obj);
    *out = (zd_rref_t *)&fake_rref_obj;
    return 0;
}

static const rpc_rref_codec_t fake_codec = {fake_encode, fake_decode, NULL};

typedef struct {
    zd_value_t *v;
    int frames_made;
    int frames_freed;
} codec_arg_t;

typedef struct {
    codec_arg_t *c;
    void *block;
} frame_slot_t;

static void frame_free(void *data, void *arg)
{
    (void)data;
    frame_slot_t *s = arg;
    s->c->frames_freed++;
    free(s->block);
}

static int codec_round(void *arg)
{
    codec_arg_t *c = arg;
    rpc_encoded_t e;
    if (zd__value_encode(c->v, &fake_codec, 1, &e) < 0)
        return -1;
    /* Frames as received: owned and aligned (wrapped), owned but
       misaligned (copied), borrowed (copied). */
    rpc_frame_t frames[8];
    frame_slot_t slots[8];
    char *borrowed[8] = {0};
    int n = e.n_tensors;
    for (int i = 0; i < n && i < 8; i++) {
        size_t size = zd_tensor_nbytes(e.tensors[i]);
        size_t off = i % 3 == 1 ? 1 : 0;
        char *p = malloc(size + off + 1);
        memcpy(p + off, zd_tensor_raw(e.tensors[i]), size);
        frames[i] = (rpc_frame_t){.data = p + off, .size = size};
        if (i % 3 == 2) {
            borrowed[i] = p;
        } else {
            slots[i] = (frame_slot_t){c, p};
            frames[i].release = frame_free;
            frames[i].release_arg = &slots[i];
            c->frames_made++;
        }
    }
    zd_value_t *out = NULL;
    int rc = zd__value_decode(e.meta, e.meta_len, frames, n, &fake_codec, 1, &out);
    zd__rpc_encoded_clear(&e);
    if (rc == 0 && !zd_value_equal(out, c->v))
        rc = zd_error_set("codec: the value came back changed");
    zd_value_unref(out);
    for (int i = 0; i < n && i < 8; i++)
        free(borrowed[i]);
    return rc;
}

static int codec_counts(counts_t *c)
{
    c->n = 0;
    local_counts_into(c);
    c->v[c->n++] = fake_rref_refs;
    return 0;
}

static int codec_body(const world_t *w)
{
    zd__value_set_rref_hooks(fake_ref, fake_unref);
    zd_tensor_t *f = filled(2, (int64_t[]){3, 5}, 1.0f, true);
    zd_tensor_t *i64 = zd_tensor_new(ZD_INT64, (int64_t[]){4}, 1);
    zd_tensor_t *u8 = zd_tensor_new(ZD_UINT8, (int64_t[]){2, 2, 3}, 3);
    zd_tensor_t *empty = zd_tensor_new(ZD_FLOAT32, (int64_t[]){0}, 1);
    zd_tensor_t *scalar = filled(0, NULL, 2.0f, false);
    zd_value_t *inner = zd_value_list(0);
    zd_list_append(inner, zd_value_string("inner"));
    zd_list_append(inner, zd_value_tensor(u8));
    zd_list_append(inner, zd_value_list(0));
    codec_arg_t c = {.v = zd_value_list(2)};
    zd_list_append(c.v, zd_value_none());
    zd_list_append(c.v, zd_value_int(-123456789012345));
    zd_list_append(c.v, zd_value_float(2.5));
    zd_list_append(c.v, zd_value_string("a string"));
    zd_list_append(c.v, zd_value_bytes("\0\1\2\3", 4));
    zd_list_append(c.v, zd_value_tensor(f));
    zd_list_append(c.v, zd_value_tensor(i64));
    zd_list_append(c.v, zd_value_tensor(empty));
    zd_list_append(c.v, zd_value_tensor(scalar));
    zd_list_append(c.v, zd_value_rref((zd_rref_t *)&fake_rref_obj));
    zd_list_append(c.v, inner);
    zd_tensor_t *ts[] = {f, i64, u8, empty, scalar};
    for (int i = 0; i < 5; i++)
        zd_tensor_unref(ts[i]);
    WCHECK(zd_list_len(c.v) == 11);
    int rc = drive(w, "codec: every value kind", codec_round, &c, codec_counts);
    if (c.frames_freed != c.frames_made)
        rc = world_fail(w, "codec: %d received frames, %d released", c.frames_made, c.frames_freed);
    zd_value_unref(c.v);
    return rc;
}

static void test_codec(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 60, codec_body, NULL), 0);
}

/*  ---- checkpoints, data sets, modules ---- */

/*  Files left in dir whose name starts with prefix (a failed save must
    leave no temporary file behind). */
static int files_like(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

typedef struct {
    const char *dir;
    zd_tensor_t *t[3];
} ckpt_arg_t;

static int ckpt_round(void *arg)
{
    ckpt_arg_t *c = arg;
    const char *names[] = {"weights", "steps", "mask"};
    const char *path = path_in(c->dir, "model.ckpt");
    zd_named_tensors_t *nt = zd_named_tensors_new(), *got = NULL;
    int rc = nt ? 0 : -1;
    for (int i = 0; rc == 0 && i < 3; i++)
        rc = zd_named_tensors_add(nt, names[i], c->t[i]);
    if (rc == 0 &&
        (zd_checkpoint_save(nt, path) < 0 || zd_checkpoint_load(nt, path) < 0 ||
         !(got = zd_checkpoint_read(path))))
        rc = -1;
    int n = zd_named_tensors_len(got);
    zd_named_tensors_free(nt);
    zd_named_tensors_free(got);
    if (rc < 0)
        return -1;
    return n == 3 ? 0 : zd_error_set("checkpoint: read %d tensors, not 3", n);
}

static int ckpt_counts(counts_t *c)
{
    local_counts(c);
    return 0;
}

static int ckpt_body(const world_t *w)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s", (const char *)w->arg);
    ckpt_arg_t c = {.dir = dir};
    c.t[0] = filled(2, (int64_t[]){300, 300}, 1.0f, false); /* a block (blocks.c) */
    c.t[1] = zd_tensor_new(ZD_INT64, (int64_t[]){3}, 1);
    c.t[2] = zd_tensor_new(ZD_UINT8, (int64_t[]){4, 4}, 2);
    int rc = drive(w, "checkpoint write and read", ckpt_round, &c, ckpt_counts);
    if (files_like(c.dir, "model.ckpt.tmp") != 0)
        rc = world_fail(w, "checkpoint: temporary files left in %s", c.dir);
    for (int i = 0; i < 3; i++)
        zd_tensor_unref(c.t[i]);
    return rc;
}

static void test_checkpoint(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 60, ckpt_body, (void *)tmpdir()), 0);
}

typedef struct {
    const char *dir;    /* plain files */
    const char *gz_dir; /* gzip files under the classic names */
    const char *cache;  /* a cache emptied before each run */
} data_arg_t;

static void empty_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            unlink(path_in(dir, e->d_name));
    closedir(d);
}

static int data_use(zd_dataset_t *ds)
{
    zd_tensor_t *x = NULL, *y = NULL, *norm = NULL;
    int64_t *order = zd_dataset_order(ds, 7);
    int rc = order && zd_dataset_batch(ds, order, 0, 5, &x, &y) == 0 &&
            zd_dataset_normalise(zd_dataset_images_u8(ds), &norm) == 0 &&
            zd_dataset_limit(ds, 6) == 0
        ? 0
        : -1;
    free(order);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
    zd_tensor_unref(norm);
    return rc;
}

/*  The plain pair loaded, used and freed; then the gzip pair, which is
    decompressed into the cache (emptied first), and loaded again from it. */
static int data_round(void *arg)
{
    data_arg_t *d = arg;
    empty_dir(d->cache);
    zd_dataset_t *ds =
        zd_dataset_load_files(path_in(d->dir, "images.idx"), path_in(d->dir, "labels.idx"));
    if (!ds)
        return -1;
    int rc = data_use(ds);
    zd_dataset_free(ds);
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
        if (!(ds = zd_dataset_load(d->gz_dir, ZD_DATASET_TRAIN)))
            return -1;
        rc = data_use(ds);
        zd_dataset_free(ds);
    }
    return rc;
}

static int data_body(const world_t *w)
{
    const char *root = w->arg;
    char dir[512], gz[512], cache[512];
    snprintf(dir, sizeof dir, "%s", path_in(root, "plain"));
    snprintf(gz, sizeof gz, "%s", path_in(root, "gz"));
    snprintf(cache, sizeof cache, "%s", path_in(root, "cache"));
    WCHECK(mkdir(dir, 0700) == 0 && mkdir(gz, 0700) == 0 && mkdir(cache, 0700) == 0);
    zd_tensor_t *images = zd_tensor_new(ZD_UINT8, (int64_t[]){12, 6, 5}, 3);
    zd_tensor_t *labels = zd_tensor_new(ZD_UINT8, (int64_t[]){12}, 1);
    for (int64_t i = 0; i < zd_tensor_numel(images); i++)
        ((uint8_t *)zd_tensor_raw(images))[i] = (uint8_t)(i * 37);
    for (int i = 0; i < 12; i++)
        ((uint8_t *)zd_tensor_raw(labels))[i] = (uint8_t)(i % 10);
    WTRY(zd_idx_save(images, path_in(dir, "images.idx")));
    WTRY(zd_idx_save(labels, path_in(dir, "labels.idx")));
    WTRY(zd_idx_save(images, path_in(gz, "train-images-idx3-ubyte.gz")));
    WTRY(zd_idx_save(labels, path_in(gz, "train-labels-idx1-ubyte.gz")));
    zd_tensor_unref(images);
    zd_tensor_unref(labels);
    setenv("ZDIST_CACHE_DIR", cache, 1);
    data_arg_t d = {dir, gz, cache};
    return drive(w, "data set load", data_round, &d, local_counts);
}

static void test_dataset(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 60, data_body, (void *)tmpdir()), 0);
}

/*  A module of two Linear children made, saved, loaded (as a checkpoint
    and as a safetensors file) and run. */
static int module_round(void *arg)
{
    const char *path = arg;
    zd_rng_t rng;
    zd_rng_seed(&rng, 3);
    zd_nn_module_t *m = zd_nn_module_new("Pair", NULL, NULL, NULL);
    if (!m)
        return -1;
    zd_tensor_t *x = NULL, *out = NULL;
    int rc = -1;
    zd_nn_module_t *fc1 = zd_nn_linear_new(4, 3, true, &rng);
    if (!fc1 || zd_nn_module_register_module(m, "fc1", fc1) < 0)
        goto done;
    zd_nn_module_t *fc2 = zd_nn_linear_new(3, 2, false, &rng);
    if (!fc2 || zd_nn_module_register_module(m, "fc2", fc2) < 0 ||
        !zd_nn_module_add_parameter(m, "scale", (int64_t[]){2}, 1))
        goto done;
    if (zd_nn_module_save(m, path) < 0 || zd_nn_module_load(m, path) < 0)
        goto done;
    /* The safetensors reader allocates through jansson too (routed). */
    char st[600];
    snprintf(st, sizeof st, "%s.safetensors", path);
    zd_strings_t *kv = zd_strings_from((const char *const[]){"format", "pt"}, 2);
    bool failed = !kv || zd_nn_module_save_safetensors(m, st, kv) < 0 ||
        zd_nn_module_load_safetensors(m, st, true, NULL) < 0;
    zd_strings_free(kv);
    if (failed)
        goto done;
    if (!(x = zd_tensor_new(ZD_FLOAT32, (int64_t[]){5, 4}, 2)) ||
        zd_nn_module_forward(zd_nn_module_child(m, "fc1"), &x, 1, &out, 1) < 0)
        goto done;
    rc = 0;
done:
    zd_tensor_unref(out);
    zd_tensor_unref(x);
    zd_nn_module_free(m);
    return rc;
}

static int module_body(const world_t *w)
{
    char path[512];
    snprintf(path, sizeof path, "%s", path_in(w->arg, "module.ckpt"));
    return drive(w, "module save and load", module_round, path, local_counts);
}

static void test_module(void **state)
{
    (void)state;
    assert_int_equal(world_run_simple(1, 60, module_body, (void *)tmpdir()), 0);
}

/*  ---- two-process worlds ---- */

/*  The counts of this process and of rank 1, once neither has an RRef
    message or an autograd context release in flight. */
static int world_counts(counts_t *c)
{
    zd_value_t *r = NULL;
    zd_dist_autograd_wait_releases(world_scaled_ms(10000));
    if (zd_rref_drain(world_scaled_ms(10000)) < 0 ||
        zd_rpc_sync_take(1, "counts", ZD_ARGS(), -1, &r) < 0)
        return -1;
    c->n = 0;
    local_counts_into(c);
    for (size_t i = 0; i < 4 && i < zd_list_len(r); i++)
        zd_value_get_int(zd_list_get(r, i), &c->v[c->n++]);
    zd_value_unref(r);
    return 0;
}

static zd_value_t *h_counts(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    if (zd_rref_drain(world_scaled_ms(10000)) < 0)
        return NULL;
    zd_dist_autograd_wait_releases(world_scaled_ms(10000));
    /* The arguments of this call are one value, alive at every count. */
    (void)args;
    if (wait_serving(1) < 0)
        return NULL;
    counts_t c = {0};
    local_counts_into(&c);
    return ZD_ARGS(c.v[0], c.v[1], c.v[2], c.v[3]);
}

static zd_value_t *h_echo(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    return zd_value_ref(args);
}

static zd_value_t *h_make(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg, (void)args;
    zd_tensor_t *t = filled(1, (int64_t[]){6}, 1.0f, false);
    zd_value_t *v = ZD_ARGS(t, "made");
    zd_tensor_unref(t);
    return v;
}

/*  Takes an RRef this process does not own (a fork) and one it owns, and
    fetches the first. */
static zd_value_t *h_use_rrefs(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_rref_t *theirs, *mine;
    zd_value_t *v;
    if (ZD_UNPACK(args, &theirs, &mine) < 0 || zd_rref_to_here(theirs, -1, &v) < 0)
        return NULL;
    zd_value_unref(v);
    return zd_value_int(zd_rref_is_owner(mine));
}

/*  Rank 1 serves until rank 0 says it is done (a scenario outlasts the
    world's shutdown wait). */
static atomic_bool finished;

static zd_value_t *h_finish(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    atomic_store(&finished, true);
    return zd_value_none();
}

static int serve_until_finished(const world_t *w)
{
    int64_t until = world_now_ms() + world_scaled_ms(600000);
    while (!atomic_load(&finished) && world_now_ms() < until)
        usleep(10000);
    return atomic_load(&finished) ? 0 : world_fail(w, "rank 0 never finished");
}

static int finish(int rc)
{
    zd_value_t *r = NULL;
    if (zd_rpc_sync_take(1, "finish", ZD_ARGS(), -1, &r) < 0)
        rc = -1;
    zd_value_unref(r);
    return rc;
}

static int rpc_setup(const world_t *w)
{
    (void)w;
    return zd_rpc_register("counts", h_counts, NULL) | zd_rpc_register("echo", h_echo, NULL) |
        zd_rpc_register("make", h_make, NULL) | zd_rpc_register("use_rrefs", h_use_rrefs, NULL) |
        zd_rpc_register("finish", h_finish, NULL);
}

typedef struct {
    zd_tensor_t *t;
} calls_arg_t;

/*  Arguments built every way, sent with every kind of call, RRefs made
    (remote and local), fetched, forked to the peer and released. */
static int calls_round(void *arg)
{
    calls_arg_t *c = arg;
    zd_value_t *a1 = NULL, *a2 = NULL, *list = NULL, *res = NULL, *got = NULL, *own_v = NULL;
    zd_future_t *f = NULL;
    zd_rref_t *remote = NULL, *own = NULL;
    int rc = -1;
    if (!(a1 = ZD_ARGS(1, 2.5, "text", c->t, ZD_ARGS(3, "x"))) ||
        !(a2 = zd__rpc_args("ifsbtnv", (int64_t)7, 0.5, "s", "\1\2", (size_t)2, c->t,
                            zd_value_list(0))) ||
        !(list = zd_value_list(1)) || zd_list_append(list, zd_value_int(1)) < 0 ||
        zd_list_append(list, zd_value_bytes("abc", 3)) < 0)
        goto done;
    if (zd_rpc_sync(1, "echo", a1, -1, &res) < 0)
        goto done;
    zd_value_unref(res);
    res = NULL;
    if (zd_rpc_sync_take(1, "echo", ZD_ARGS("inline", c->t), -1, &res) < 0)
        goto done;
    if (!(f = zd_rpc_async(1, "echo", a2, -1)) || zd_future_wait(f, -1) < 0)
        goto done;
    if (!(remote = zd_rpc_remote(1, "make", list, -1)) || zd_rref_to_here(remote, -1, &got) < 0)
        goto done;
    if (!(own_v = zd_value_tensor(c->t)) || !(own = zd_rref_new(own_v)))
        goto done;
    zd_value_unref(res);
    res = NULL;
    if (zd_rpc_sync_take(1, "use_rrefs", ZD_ARGS(own, remote), -1, &res) < 0)
        goto done;
    rc = 0;
done:
    zd_rref_unref(own);
    zd_rref_unref(remote);
    zd_future_unref(f);
    zd_value_t *vs[] = {a1, a2, list, res, got, own_v};
    for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++)
        zd_value_unref(vs[i]);
    return rc;
}

static int calls_body(const world_t *w)
{
    if (w->rank != 0)
        return serve_until_finished(w);
    calls_arg_t c = {filled(1, (int64_t[]){8}, 1.0f, false)};
    int rc = drive(w, "calls and RRefs in a two-process world", calls_round, &c, world_counts);
    zd_tensor_unref(c.t);
    return finish(rc);
}

static void test_calls(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2,
                         .setup = rpc_setup,
                         .fn = calls_body,
                         .timeout_s = 600,
                         .rpc_timeout_ms = 10000};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- a distributed backward and optimizer step ---- */

static zd_tensor_t *w_param;

static zd_value_t *h_mul_w(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *x, *y;
    zd_dist_optim_read_lock();
    int rc = zd_rpc_arg_tensor(args, 0, &x) < 0 ? -1 : zd_tensor_mul(x, w_param, &y);
    zd_dist_optim_read_unlock();
    if (rc < 0)
        return NULL;
    zd_value_t *v = zd_value_tensor(y);
    zd_tensor_unref(y);
    return v;
}

static zd_value_t *h_param_rref(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *tv = zd_value_tensor(w_param);
    zd_rref_t *r = zd_rref_new(tv);
    zd_value_unref(tv);
    zd_value_t *v = zd_value_rref(r);
    zd_rref_unref(r);
    return v;
}

static int dist_setup(const world_t *w)
{
    w_param = filled(1, (int64_t[]){4}, 1.0f, true);
    if (zd_dist_optim_init() < 0 || rpc_setup(w) < 0)
        return -1;
    return zd_rpc_register("mul_w", h_mul_w, NULL) |
        zd_rpc_register("param_rref", h_param_rref, NULL);
}

typedef struct {
    zd_dist_optim_t *opt;
    zd_tensor_t *x, *local_w;
} dist_arg_t;

/*  loss = sum(x * w_1) + sum(x * w_0): a forward over RPC, the backward
    across both processes, a step of both owners. */
static int dist_round(void *arg)
{
    dist_arg_t *d = arg;
    int64_t ctx;
    if (zd_dist_autograd_context_begin(&ctx) < 0)
        return -1;
    zd_value_t *r = NULL;
    zd_tensor_t *y, *mine = NULL, *s1 = NULL, *s0 = NULL, *loss = NULL;
    int rc = -1;
    if (zd_rpc_sync_take(1, "mul_w", ZD_ARGS(d->x), -1, &r) < 0 || zd_value_get_tensor(r, &y) < 0 ||
        zd_tensor_sum(y, &s1) < 0 || zd_tensor_mul(d->x, d->local_w, &mine) < 0 ||
        zd_tensor_sum(mine, &s0) < 0 || zd_tensor_add(s0, s1, &loss) < 0)
        goto done;
    if (zd_dist_autograd_backward(ctx, &loss, 1, false) < 0 || zd_dist_optim_step(d->opt, ctx) < 0)
        goto done;
    rc = 0;
done:
    zd_value_unref(r);
    zd_tensor_t *ts[] = {mine, s1, s0, loss};
    for (int i = 0; i < 4; i++)
        zd_tensor_unref(ts[i]);
    /* The context ends in every case (after a failure, keep its error). A
       context_end that failed out of memory left it, to be ended again. */
    char text[1024];
    snprintf(text, sizeof text, "%s", zd_error_last());
    zd_error_code_t code = zd_error_code();
    if (zd_dist_autograd_context_end(ctx, -1) < 0 && rc == 0) {
        snprintf(text, sizeof text, "%s", zd_error_last());
        code = zd_error_code();
        rc = -1;
    }
    if (zd_dist_autograd_context_exists(ctx))
        zd_dist_autograd_context_end(ctx, -1);
    if (rc < 0)
        zd_error_set_code(code, "%s", text);
    return rc;
}

static int dist_body(const world_t *w)
{
    if (w->rank != 0)
        return serve_until_finished(w);
    zd_value_t *r;
    zd_rref_t *refs[2] = {0};
    dist_arg_t d = {.x = filled(1, (int64_t[]){4}, 1.0f, false)};
    d.local_w = zd_tensor_ref(w_param);
    zd_value_t *lv = zd_value_tensor(w_param);
    refs[0] = zd_rref_new(lv);
    zd_value_unref(lv);
    WTRY(zd_rpc_sync_take(1, "param_rref", ZD_ARGS(), -1, &r));
    WTRY(zd_value_get_rref(r, &refs[1]));
    zd_rref_ref(refs[1]);
    zd_value_unref(r);
    zd_optim_config_t cfg = zd_optim_sgd_defaults(0.001);
    zd_rref_list_t *params = zd_rref_list_new();
    WCHECK(params);
    WTRY(zd_rref_list_append(params, refs[0]));
    WTRY(zd_rref_list_append(params, refs[1]));
    d.opt = zd_dist_optim_new(&cfg, params);
    zd_rref_list_free(params);
    WCHECK(d.opt);
    int rc = drive(w, "distributed backward and optimizer step", dist_round, &d, world_counts);
    zd_dist_optim_free(d.opt);
    zd_rref_unref(refs[0]);
    zd_rref_unref(refs[1]);
    zd_tensor_unref(d.x);
    zd_tensor_unref(d.local_w);
    return finish(rc);
}

static void test_dist(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 2,
                         .setup = dist_setup,
                         .fn = dist_body,
                         .timeout_s = 600,
                         .rpc_timeout_ms = 10000,
                         .dist_autograd = true};
    assert_int_equal(world_run(&o), 0);
}

/*  ---- metrics ---- */

static int metrics_round(void *arg)
{
    (void)arg;
    int64_t v;
    char *buf = NULL;
    size_t len = 0;
    if (zd_rpc_get_debug_value("num_pending_requests", &v) < 0 || zd__metrics_out_line() < 0)
        return -1;
    FILE *f = open_memstream(&buf, &len);
    zd_rpc_metrics_print(f);
    fclose(f);
    free(buf);
    return 0;
}

static int metrics_setup(const world_t *w)
{
    setenv("ZDIST_METRICS", w->arg, 1);
    setenv("ZDIST_METRICS_INTERVAL_S", "1000000", 1); /* lines written by the test only */
    return 0;
}

static int metrics_body(const world_t *w)
{
    return drive(w, "metrics output", metrics_round, NULL, local_counts);
}

static void test_metrics(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 1,
                         .setup = metrics_setup,
                         .fn = metrics_body,
                         .arg = (void *)path_in(tmpdir(), "metrics"),
                         .timeout_s = 60};
    assert_int_equal(world_run(&o), 0);
}

static int group_setup(void **state)
{
    (void)state;
    return tmpdir_setup("fault_alloc");
}

static int group_teardown(void **state)
{
    (void)state;
    return tmpdir_teardown();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensors),    cmocka_unit_test(test_codec),
        cmocka_unit_test(test_checkpoint), cmocka_unit_test(test_dataset),
        cmocka_unit_test(test_module),     cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_calls),      cmocka_unit_test(test_dist),
    };
    /* ZD_FAULT_ONLY=test_calls runs one scenario (cmocka's pattern). */
    if (getenv("ZD_FAULT_ONLY"))
        cmocka_set_test_filter(getenv("ZD_FAULT_ONLY"));
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
