/* SPDX-License-Identifier: MIT */
/*  Faults in the example programs (issue 12 points 1 and 2): every rank
    is a process of its own, started as a user would (no launcher, which
    stops the world at the first death), and the fault is pinned to a
    phase with the ZDIST_FAULT hook (examples/fault.h), not with sleeps.
      - rpc_ps, a trainer killed mid-training: the other trainer finishes
        and exits 0, the server exits 0 naming the lost trainer and its
        batch, releases what the trainer held, and counts its batches in
        the aggregate throughput;
      - rpc_ps, a trainer frozen (SIGSTOP) with a 1 s heartbeat: the server
        declares it lost, the others finish; woken up, it is told it was
        declared lost and exits 1; --min_trainers=2 makes the server fail;
      - ps_sync_async in sync mode, a worker killed: the driver goes on
        with the worker it has, says so, and everyone else exits 0;
      - pipeline, a stage killed: the driver fails at once, naming it.
    Each case is bounded in time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/program.h"
#include "tests/support/world.h"

#define MAX_RANKS 4

typedef struct {
    program_t p[MAX_RANKS];
    int rc[MAX_RANKS];
    int n;
} ranks_t;

/*  Starts ranks 0..n-1 of bin on a fresh port, each with the flags in
    extra (NULL-terminated) and, for rank 0 only, those in extra0. */
static void start_world(ranks_t *w, const char *bin, int n, const char *const *extra,
                        const char *const *extra0)
{
    int port = world_free_port();
    assert_true(port > 0);
    w->n = n;
    for (int r = 0; r < n; r++) {
        char a_rank[32], a_world[32], a_port[32];
        snprintf(a_rank, sizeof a_rank, "--rank=%d", r);
        snprintf(a_world, sizeof a_world, "--world_size=%d", n);
        snprintf(a_port, sizeof a_port, "--master_port=%d", port);
        char *argv[32] = {(char *)bin, a_rank, a_world, "--master_addr=127.0.0.1", a_port};
        int k = 5;
        for (int i = 0; extra && extra[i]; i++)
            argv[k++] = (char *)extra[i];
        for (int i = 0; r == 0 && extra0 && extra0[i]; i++)
            argv[k++] = (char *)extra0[i];
        argv[k] = NULL;
        assert_int_equal(program_start(&w->p[r], argv), 0);
    }
}

static void wait_world(ranks_t *w, double deadline)
{
    for (int r = 0; r < w->n; r++) {
        w->rc[r] = program_wait(&w->p[r], deadline);
        printf("---- rank %d exited with %d:\n%s\n", r, w->rc[r], w->p[r].out ? w->p[r].out : "");
    }
}

static const char *out(const ranks_t *w, int r)
{
    return w->p[r].out ? w->p[r].out : "";
}

static void free_world(ranks_t *w)
{
    for (int r = 0; r < w->n; r++)
        free(w->p[r].out);
}

static const char *const ps_flags[] = {"--max_batches=60", "--eval_samples=500", "--progress_s=0",
                                       NULL};

static void test_rpc_ps_trainer_killed_others_finish(void **state)
{
    (void)state;
    ranks_t w;
    setenv("ZDIST_FAULT", "2:forward:kill:20", 1); /* before its 20th batch */
    double t0 = program_now_s();
    start_world(&w, program_path("examples/rpc_ps"), 3, ps_flags, NULL);
    unsetenv("ZDIST_FAULT");
    wait_world(&w, t0 + 240);
    printf("world done in %.1f s\n", program_now_s() - t0);
    assert_int_equal(w.rc[2], 128 + SIGKILL);
    assert_int_equal(w.rc[1], 0);
    assert_non_null(strstr(out(&w, 1), "Rank 1 test accuracy "));
    assert_int_equal(w.rc[0], 0);
    /* The server names the lost trainer and the batch it was at (the
       trainer died before sending its 20th). */
    assert_non_null(strstr(out(&w, 0), "trainer rank 2 was lost at batch 19"));
    assert_non_null(strstr(out(&w, 0), "1 of 2 trainers finished"));
    /* The aggregate throughput counts the lost trainer's 19 batches too
       (issue 24 point 12): (60 + 19) x 32 samples. */
    assert_non_null(strstr(out(&w, 0), "(2528 samples in "));
    /* What the trainer held on the server was released while the world
       ran, and nothing is left at shutdown. */
    const char *rel = strstr(out(&w, 0), "released what lost \"trainer_2\" (rank 2) held: ");
    assert_non_null(rel);
    assert_true(atoi(rel + strlen("released what lost \"trainer_2\" (rank 2) held: ")) > 0);
    assert_non_null(strstr(out(&w, 0), "context(s) of lost rank 2"));
    assert_null(strstr(out(&w, 0), "still referenced"));
    assert_non_null(strstr(out(&w, 0), "going on without \"trainer_2\" (rank 2), lost"));
    free_world(&w);
}

static void test_rpc_ps_trainer_frozen_is_declared_lost(void **state)
{
    (void)state;
    ranks_t w;
    static const char *const server_flags[] = {"--min_trainers=2", NULL};
    setenv("ZDIST_FAULT", "2:forward:stop:20", 1);
    setenv("ZDIST_HEARTBEAT_S", "1", 1);
    double t0 = program_now_s();
    start_world(&w, program_path("examples/rpc_ps"), 3, ps_flags, server_flags);
    unsetenv("ZDIST_FAULT");
    unsetenv("ZDIST_HEARTBEAT_S");
    double deadline = t0 + 240;
    assert_int_equal(program_read(&w.p[2], "ZDIST_FAULT: rank 2: stop", deadline), 1);
    double stopped = program_now_s();
    assert_int_equal(program_read(&w.p[0], "the others go on", deadline), 1);
    double took = program_now_s() - stopped;
    printf("frozen trainer declared lost %.2f s after it stopped (heartbeat 1 s)\n", took);
    assert_true(took < 10);
    assert_int_equal(kill(w.p[2].pid, SIGCONT), 0);
    wait_world(&w, deadline);
    assert_int_equal(w.rc[1], 0);
    assert_non_null(strstr(out(&w, 1), "Rank 1 test accuracy "));
    /* Woken up, the frozen one learns that it was let go. */
    assert_int_equal(w.rc[2], 1);
    assert_non_null(strstr(out(&w, 2), "declared you lost"));
    /* The server finished, named it, and fails only for --min_trainers=2. */
    assert_int_equal(w.rc[0], 1);
    assert_non_null(strstr(out(&w, 0), "trainer rank 2 was lost at batch 19"));
    assert_non_null(strstr(out(&w, 0), "fewer than --min_trainers=2"));
    free_world(&w);
}

static void test_ps_sync_worker_killed_driver_goes_on(void **state)
{
    (void)state;
    ranks_t w;
    static const char *const flags[] = {"--mode=sync",
                                        "--num_workers=2",
                                        "--iterations=40",
                                        "--eval_interval=0",
                                        "--test_size=500",
                                        "--progress_s=0",
                                        NULL};
    setenv("ZDIST_FAULT", "3:backward:kill:10", 1); /* worker 1, its 10th gradient */
    double t0 = program_now_s();
    start_world(&w, program_path("examples/ps_sync_async"), 4, flags, NULL);
    unsetenv("ZDIST_FAULT");
    wait_world(&w, t0 + 180);
    assert_int_equal(w.rc[3], 128 + SIGKILL);
    for (int r = 0; r < 3; r++)
        assert_int_equal(w.rc[r], 0);
    assert_non_null(strstr(out(&w, 0), "worker 1 (rank 3) lost at iteration 9"));
    assert_non_null(strstr(out(&w, 0), "going on with the 1 worker(s) left"));
    assert_non_null(strstr(out(&w, 0), "Final accuracy is "));
    free_world(&w);
}

static void test_pipeline_stage_killed_fails_fast(void **state)
{
    (void)state;
    ranks_t w;
    static const char *const flags[] = {"--iterations=40", "--test_size=0", NULL};
    setenv("ZDIST_FAULT", "2:forward:kill:3", 1);
    double t0 = program_now_s();
    start_world(&w, program_path("examples/pipeline"), 3, flags, NULL);
    unsetenv("ZDIST_FAULT");
    wait_world(&w, t0 + 120);
    double took = program_now_s() - t0;
    printf("pipeline world ended %.1f s after start\n", took);
    assert_int_equal(w.rc[2], 128 + SIGKILL);
    assert_int_not_equal(w.rc[0], 0);
    assert_non_null(strstr(out(&w, 0), "peer \"shard2\" (rank 2) lost"));
    assert_true(w.rc[1] >= 0 && w.rc[1] < 128); /* left by itself, not killed */
    free_world(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rpc_ps_trainer_killed_others_finish),
        cmocka_unit_test(test_rpc_ps_trainer_frozen_is_declared_lost),
        cmocka_unit_test(test_ps_sync_worker_killed_driver_goes_on),
        cmocka_unit_test(test_pipeline_stage_killed_fails_fast),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
