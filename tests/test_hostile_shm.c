/* SPDX-License-Identifier: MIT */
/*  test_hostile_shm.c: a member on the same host attacks a peer through
    the shared segments its large tensors travel in (rpc/net/shm.h; issue 24,
    findings 1 and 2).

    The attacker is a real member (rank 1, the library's own sender) that
    then reaches into its own segments, as any process can with its memfds:
    - it rewrites a tensor's bytes after the receiver checked them: the
      receiver's tensor must not change (it was copied out of the segment),
      and a loss that checked the targets must not index with new ones;
    - it tries to shrink a segment under the receiver's mapping, which would
      kill the receiver with SIGBUS: the segment's seals refuse it;
    and a segment without those seals is refused by the receiver's filter. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/nn.h>
#include <zdist/rpc.h>
#include "rpc/agent/agent.h"
#include "rpc/net/shm.h"
#include "tests/support/fixtures.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define N_TARGETS 65536 /* int64: 512 KiB, over the shared-memory threshold */
#define CLASSES   10

static zd_tensor_t *held; /* rank 0: the targets it checked */

static bool targets_ok(const zd_tensor_t *t)
{
    const int64_t *d = zd_tensor_data_i64(t);
    for (int64_t i = 0; i < N_TARGETS; i++)
        if (d[i] != i % CLASSES)
            return false;
    return true;
}

/*  "hold"(targets): checks them as a server checks a batch, keeps them. */
static zd_value_t *h_hold(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *t;
    if (zd_rpc_arg_tensor(args, 0, &t) < 0)
        return NULL;
    if (zd_tensor_dtype(t) != ZD_INT64 || zd_tensor_numel(t) != N_TARGETS || !targets_ok(t)) {
        zd_error_set("hold: not the targets sent");
        return NULL;
    }
    zd_tensor_unref(held);
    held = zd_tensor_ref(t); /* t is borrowed from args */
    return zd_value_int(1);
}

/*  "use"(): the held targets are still those checked, and a cross-entropy
    and its backward over them (which index with them) run. */
static zd_value_t *h_use(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    if (!held)
        return NULL;
    zd_tensor_t *logits = zd_tensor_zeros2(N_TARGETS, CLASSES), *loss = NULL;
    bool same = targets_ok(held);
    if (!logits)
        return NULL;
    zd_tensor_set_requires_grad(logits, true);
    int rc = zd_nn_cross_entropy(logits, held, &loss);
    if (rc == 0)
        rc = zd_autograd_backward(loss, NULL, false);
    zd_tensor_unref(loss);
    zd_tensor_unref(logits);
    zd_tensor_unref(held);
    held = NULL;
    return rc == 0 ? zd_value_int(same) : NULL;
}

static char refusal[512]; /* rank 0: the last refusal its log gave */

/*  "refused"(): [segments this process refused to map, the log line of the
    last refusal], once one was (the announcement is handled on the I/O
    thread; bounded wait). */
static zd_value_t *h_refused(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    int64_t end = world_now_ms() + world_scaled_ms(10000);
    long refused = 0;
    while (zd__shm_stats(NULL, NULL, NULL, NULL, &refused), refused == 0 && world_now_ms() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return zd__rpc_args("is", (int64_t)refused, refusal);
}

static void sink(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level, (void)arg;
    fprintf(stderr, "[%s] %s\n", who, line);
    if (strstr(line, "not shared memory: its segment"))
        snprintf(refusal, sizeof refusal, "%s", line);
}

static int setup(const world_t *w)
{
    (void)w;
    zd_log_set_sink(sink, NULL);
    if (zd_rpc_register("hold", h_hold, NULL) < 0 || zd_rpc_register("use", h_use, NULL) < 0 ||
        zd_rpc_register("refused", h_refused, NULL) < 0)
        return -1;
    return 0;
}

/*  The descriptors of this process's segments (not the 4 KiB probe). */
static int own_segments(int *fds, int max)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && n < max) {
        char path[300], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = 0;
        struct stat st;
        int fd = atoi(e->d_name);
        if (strncmp(target, "/memfd:zdist-shm", 16) == 0 && fstat(fd, &st) == 0 &&
            st.st_size > 4096)
            fds[n++] = fd;
    }
    if (d)
        closedir(d);
    return n;
}

static bool wait_accepted(int peer)
{
    int64_t end = world_now_ms() + world_scaled_ms(60000);
    while (zd__shm_peer_state(peer) != 1) {
        if (world_now_ms() > end)
            return false;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return true;
}

static int call_int(const char *fn, zd_value_t *args, int64_t *out)
{
    zd_value_t *r;
    if (zd_rpc_sync(0, fn, args, -1, &r) < 0)
        return -1;
    int rc = zd_value_get_int(r, out);
    zd_value_unref(r);
    return rc;
}

/*  Calls "hold" until the targets went through a segment (the first call
    goes the ZeroMQ way while its segment is announced). */
static bool hold_through_segment(zd_value_t *args)
{
    int64_t end = world_now_ms() + world_scaled_ms(10000);
    while (world_now_ms() < end) {
        long sent0, sent1;
        int64_t ok;
        zd__shm_stats(&sent0, NULL, NULL, NULL, NULL);
        if (call_int("hold", args, &ok) < 0 || ok != 1)
            return false;
        zd__shm_stats(&sent1, NULL, NULL, NULL, NULL);
        if (sent1 == sent0 + 1)
            return true;
    }
    return false;
}

static int attacker(const world_t *w)
{
    if (w->rank != 1)
        return 0;
    WCHECK(wait_accepted(0));
    int64_t n = N_TARGETS;
    zd_tensor_t *t = zd_tensor_new(ZD_INT64, &n, 1);
    WCHECK(t);
    for (int64_t i = 0; i < n; i++)
        zd_tensor_data_i64(t)[i] = i % CLASSES;
    zd_value_t *args = zd__rpc_args("t", t);
    WCHECK(hold_through_segment(args));
    zd_value_unref(args);
    zd_tensor_unref(t);

    /* Now reach into every segment this process sent through. */
    bool shrink = *(const bool *)w->arg;
    int fds[RPC_SHM_MAX_SEGS];
    int nseg = own_segments(fds, RPC_SHM_MAX_SEGS);
    WCHECK(nseg >= 1);
    for (int k = 0; k < nseg; k++) {
        struct stat st;
        WCHECK(fstat(fds[k], &st) == 0);
        if (shrink) {
            /* under the receiver's mapping: its next read would be SIGBUS */
            errno = 0;
            if (ftruncate(fds[k], 4096) == 0 || errno != EPERM)
                return world_fail(w, "segment %d could be shrunk (%s)", k, strerror(errno));
            int seals = fcntl(fds[k], F_GET_SEALS);
            WCHECK(seals >= 0 &&
                   (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) ==
                       (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
            continue;
        }
        uint8_t *map =
            mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[k], 0);
        WCHECK(map != MAP_FAILED);
        /* every target out of range: -1 */
        memset(map + 4096, 0xff, (size_t)st.st_size - 4096);
        munmap(map, (size_t)st.st_size);
    }
    int64_t same;
    WCHECK(call_int("use", NULL, &same) == 0);
    if (!same)
        return world_fail(w, "the receiver's checked targets changed after the check");
    return 0;
}

static void test_rewrite_after_check(void **state)
{
    (void)state;
    unsetenv("ZDIST_SHM");
    static const bool shrink = false;
    assert_int_equal(world_run(&(world_options_t){.world_size = 2,
                                                  .setup = setup,
                                                  .fn = attacker,
                                                  .arg = (void *)&shrink,
                                                  .timeout_s = 120}),
                     0);
}

static void test_shrink_refused(void **state)
{
    (void)state;
    unsetenv("ZDIST_SHM");
    static const bool shrink = true;
    assert_int_equal(world_run(&(world_options_t){.world_size = 2,
                                                  .setup = setup,
                                                  .fn = attacker,
                                                  .arg = (void *)&shrink,
                                                  .timeout_s = 120}),
                     0);
}

/*  Rank 1 announces a segment of its own making, a look-alike memfd (same
    name, header and size) without seals: rank 0 must refuse to map it,
    saying why, and go on serving, shared memory included. */
static int unsealed(const world_t *w)
{
    if (w->rank != 1)
        return 0;
    WCHECK(wait_accepted(0));
    const uint64_t cap = 1 << 20, token = 0x5eed5eed5eedULL;
    int fake = memfd_create("zdist-shm", MFD_CLOEXEC);
    WCHECK(fake >= 0 && ftruncate(fake, (off_t)(4096 + cap)) == 0);
    uint8_t header[4096] = "ZDSHMSG1"; /* the segment header (shm.c) */
    memcpy(header + 8, &token, 8);
    memcpy(header + 16, &cap, 8);
    uint32_t src = 1, dst = 0;
    memcpy(header + 24, &src, 4);
    memcpy(header + 28, &dst, 4);
    WCHECK(pwrite(fake, header, sizeof header, 0) == (ssize_t)sizeof header);
    uint8_t extra[16] = {0};
    uint32_t fd = (uint32_t)fake;
    memcpy(extra, &fd, 4);
    memcpy(extra + 8, &cap, 8);
    agent_t *a = zd__agent_acquire();
    WCHECK(a);
    rpc_wire_header_t h = {.type = RPC_MSG_SHM_SEGMENT,
                           .flags = RPC_WIRE_F_INTERNAL,
                           .id = zd__agent_new_id(a),
                           .a = RPC_SHM_MAX_SEGS - 1,
                           .b = token,
                           .extra = extra,
                           .extra_len = sizeof extra};
    int rc = zd__transport_send(&a->net, 0, &h, NULL, 0);
    zd__agent_release(a);
    WCHECK(rc == 0);
    int64_t refused;
    const char *why;
    zd_value_t *r;
    WCHECK(zd_rpc_sync(0, "refused", NULL, -1, &r) == 0 && zd_rpc_arg_int(r, 0, &refused) == 0 &&
           zd_rpc_arg_string(r, 1, &why) == 0);
    if (refused != 1 || !strstr(why, "not sealed against resizing"))
        return world_fail(w, "rank 0 did not refuse the segment for its seals: %lld refused (%s)",
                          (long long)refused, why);
    zd_value_unref(r);
    close(fake);
    /* and the shared memory of the library's own segments still serves */
    int64_t n = N_TARGETS;
    zd_tensor_t *t = zd_tensor_new(ZD_INT64, &n, 1);
    WCHECK(t);
    for (int64_t i = 0; i < n; i++)
        zd_tensor_data_i64(t)[i] = i % CLASSES;
    zd_value_t *args = zd__rpc_args("t", t);
    WCHECK(hold_through_segment(args));
    int64_t same;
    WCHECK(call_int("use", NULL, &same) == 0 && same == 1);
    zd_value_unref(args);
    zd_tensor_unref(t);
    return 0;
}

static void test_unsealed_segment_refused(void **state)
{
    (void)state;
    unsetenv("ZDIST_SHM");
    assert_int_equal(world_run(&(world_options_t){
                         .world_size = 2, .setup = setup, .fn = unsealed, .timeout_s = 120}),
                     0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rewrite_after_check),
        cmocka_unit_test(test_shrink_refused),
        cmocka_unit_test(test_unsealed_segment_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
