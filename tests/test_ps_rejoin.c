/* SPDX-License-Identifier: MIT */
/*  rpc_ps with processes that die and come back (issue 12 points 3 and
    4). Every rank is a process of its own, started as a user would (no
    launcher, which stops the world at the first death); the fault is
    pinned with ZDIST_FAULT (the library's fault points), and the test
    starts the process again with the same flags:
      - a trainer killed before its 25th batch and started again rejoins
        the running world, goes on from the position the server kept
        (that of its last forward), finishes, and the server counts it
        again;
      - the server killed in its third checkpoint (before writing it) and
        started again with --resume: the trainers wait for it, take their
        RRefs again, go back to the last checkpoint and finish; the final
        accuracy is close to that of a run that never stopped;
      - the server killed and not started again: after --server_wait_s
        the trainers fail, naming it;
      - with two server shards, shard 1 killed mid-training and started
        again with --resume: the trainers wait for it, take their RRefs
        again, every shard goes back to one checkpoint generation, and
        they finish; both shards' last files are of one generation;
      - the same with one trainer and no dropout: the batch after the
        rollback computes with the checkpoint's weights (its loss is that
        of a run that never stopped).
    Each case is bounded in time. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/checkpoint.h>
#include <zdist/tensor.h>
#include "tests/support/program.h"
#include "tests/support/world.h"

#define RANKS     3 /* one server, two trainers */
#define MAX_RANKS 4 /* two server shards, two trainers */

typedef struct {
    int n;
    program_t p[MAX_RANKS];
    int rc[MAX_RANKS];
    char a_world[32], a_port[32], ck[96];
    char dir[32];
} world_procs_t;

/*  Starts rank r with the world's flags and extra (NULL-terminated). */
static void start_rank(world_procs_t *w, int r, const char *const *extra)
{
    char a_rank[32];
    snprintf(a_rank, sizeof a_rank, "--rank=%d", r);
    char *argv[32] = {(char *)program_path("examples/rpc_ps"),
                      a_rank,
                      w->a_world,
                      "--master_addr=127.0.0.1",
                      w->a_port,
                      w->ck,
                      "--eval_samples=1000",
                      "--progress_s=0",
                      "--checkpoint_every=10"};
    int k = 9;
    for (int i = 0; extra && extra[i]; i++)
        argv[k++] = (char *)extra[i];
    argv[k] = NULL;
    assert_int_equal(program_start(&w->p[r], argv), 0);
}

static void world_init_n(world_procs_t *w, int n)
{
    memset(w, 0, sizeof *w);
    w->n = n;
    snprintf(w->dir, sizeof w->dir, "/tmp/zdist_rejoinXXXXXX");
    assert_non_null(mkdtemp(w->dir));
    int port = world_free_port();
    assert_true(port > 0);
    snprintf(w->a_world, sizeof w->a_world, "--world_size=%d", n);
    snprintf(w->a_port, sizeof w->a_port, "--master_port=%d", port);
    snprintf(w->ck, sizeof w->ck, "--checkpoint=%s/c", w->dir);
}

static void world_init(world_procs_t *w)
{
    world_init_n(w, RANKS);
}

static const char *out(const world_procs_t *w, int r)
{
    return w->p[r].out ? w->p[r].out : "";
}

static void world_wait(world_procs_t *w, double deadline)
{
    for (int r = 0; r < w->n; r++) {
        w->rc[r] = program_wait(&w->p[r], deadline);
        printf("---- rank %d exited with %d:\n%s\n", r, w->rc[r], out(w, r));
    }
}

static void world_free(world_procs_t *w)
{
    for (int r = 0; r < w->n; r++)
        free(w->p[r].out);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", w->dir);
    assert_int_equal(system(cmd), 0);
}

static double accuracy(const char *text, int rank)
{
    char key[64];
    snprintf(key, sizeof key, "Rank %d test accuracy ", rank);
    const char *p = strstr(text, key);
    assert_non_null(p);
    return strtod(p + strlen(key), NULL);
}

static void test_trainer_killed_and_restarted_rejoins(void **state)
{
    (void)state;
    world_procs_t w;
    world_init(&w);
    static const char *const flags[] = {"--max_batches=60", NULL};
    double t0 = program_now_s(), deadline = t0 + 300;
    start_rank(&w, 0, flags);
    start_rank(&w, 1, flags);
    setenv("ZDIST_FAULT", "2:forward:kill:25", 1); /* before its 25th batch */
    start_rank(&w, 2, flags);
    unsetenv("ZDIST_FAULT");
    int rc = program_wait(&w.p[2], deadline);
    printf("---- rank 2 (first life) exited with %d:\n%s\n", rc, out(&w, 2));
    assert_int_equal(rc, 128 + SIGKILL);
    free(w.p[2].out);
    double restarted = program_now_s();
    start_rank(&w, 2, flags); /* the same flags: no --resume */
    assert_int_equal(program_read(&w.p[2], "resuming at batch", deadline), 1);
    printf("restarted trainer resumed %.2f s after its start\n", program_now_s() - restarted);
    world_wait(&w, deadline);
    for (int r = 0; r < RANKS; r++)
        assert_int_equal(w.rc[r], 0);
    /* The server kept the position its last forward carried (its 24th
       batch's: 23 batches done), not only that of its last checkpoint at
       batch 20: it goes on from there. */
    assert_non_null(strstr(out(&w, 2),
                           "Rank 2 rejoined the world; resuming at batch 23 (23 "
                           "batches done)"));
    assert_non_null(strstr(out(&w, 2), "Rank 2 test accuracy "));
    assert_non_null(strstr(out(&w, 1), "Rank 1 test accuracy "));
    assert_non_null(strstr(out(&w, 0), "(rank 2), lost at batch"));
    assert_non_null(strstr(out(&w, 0), "rejoined; counted again"));
    assert_non_null(strstr(out(&w, 0), "2 of 2 trainers finished"));
    world_free(&w);
}

static void test_server_killed_and_restarted_with_resume(void **state)
{
    (void)state;
    static const char *const flags[] = {"--max_batches=60", NULL};
    static const char *const resume[] = {"--max_batches=60", "--resume", NULL};
    world_procs_t whole, w;

    /* The run that never stops. */
    world_init(&whole);
    double t0 = program_now_s();
    for (int r = 0; r < RANKS; r++)
        start_rank(&whole, r, flags);
    world_wait(&whole, t0 + 300);
    for (int r = 0; r < RANKS; r++)
        assert_int_equal(whole.rc[r], 0);
    double acc_whole = accuracy(out(&whole, 1), 1);

    world_init(&w);
    t0 = program_now_s();
    double deadline = t0 + 300;
    /* The third checkpoint of the world is not written: the last one the
       server holds is the second. */
    setenv("ZDIST_FAULT", "0:checkpoint:kill:3", 1);
    start_rank(&w, 0, flags);
    unsetenv("ZDIST_FAULT");
    start_rank(&w, 1, flags);
    start_rank(&w, 2, flags);
    int rc = program_wait(&w.p[0], deadline);
    printf("---- rank 0 (first life) exited with %d:\n%s\n", rc, out(&w, 0));
    assert_int_equal(rc, 128 + SIGKILL);
    free(w.p[0].out);
    double restarted = program_now_s();
    start_rank(&w, 0, resume);
    /* Time from the restart to a trainer's first batch on it. */
    int back = -1;
    while (back < 0 && program_now_s() < deadline) {
        for (int r = 1; r < RANKS && back < 0; r++)
            if (program_read(&w.p[r], "going on from batch", program_now_s() + 0.2) == 1 &&
                strstr(out(&w, r), "going on from batch"))
                back = r;
    }
    assert_true(back > 0);
    double took = program_now_s() - restarted;
    world_wait(&w, deadline);
    for (int r = 0; r < RANKS; r++)
        assert_int_equal(w.rc[r], 0);
    printf("server restarted: trainer rank %d back in service %.2f s after the restart\n", back,
           took);
    for (int r = 1; r < RANKS; r++) {
        const char *p = strstr(out(&w, r), "going on from batch ");
        assert_non_null(p);
        printf("rank %d: %s", r, p);
    }
    double acc = accuracy(out(&w, 1), 1);
    printf("final accuracy: %.2f %% (never stopped: %.2f %%)\n", acc, acc_whole);
    /* Two single runs of 60 asynchronous batches per trainer, evaluated on
       1000 images, differ by chance: 18 runs that never stopped gave 69.8 to
       77.2 %, 18 resumed ones 71.2 to 77.3 % (with the code of before and
       after 2026-11-26 alike), and one pair 5.5 points apart. This guards
       against parameters spoilt on the way back (chance is 10 %); that the
       server resumed from its checkpoint is checked below. */
    assert_true(acc > acc_whole - 8);
    assert_non_null(strstr(out(&w, 0), "parameter server shard 0: resumed from "));
    /* The registrations the trainers sent again while it was away, queued
       until it listened, are not taken for those of processes that
       declared it lost. */
    assert_null(strstr(out(&w, 0), "was not restarted"));
    world_free(&whole);
    world_free(&w);
}

static void test_server_killed_and_not_back_trainers_fail(void **state)
{
    (void)state;
    static const char *const flags[] = {"--max_batches=60", "--server_wait_s=3", NULL};
    world_procs_t w;
    world_init(&w);
    double t0 = program_now_s();
    setenv("ZDIST_FAULT", "0:checkpoint:kill:1", 1);
    start_rank(&w, 0, flags);
    unsetenv("ZDIST_FAULT");
    start_rank(&w, 1, flags);
    start_rank(&w, 2, flags);
    world_wait(&w, t0 + 120);
    assert_int_equal(w.rc[0], 128 + SIGKILL);
    for (int r = 1; r < RANKS; r++) {
        assert_int_equal(w.rc[r], 1);
        assert_non_null(strstr(out(&w, r), "server shard 0 (rank 0) lost ("));
        assert_non_null(strstr(out(&w, r), "not back within 3 s"));
    }
    printf("world done in %.1f s\n", program_now_s() - t0);
    world_free(&w);
}

/*  The generation recorded in the checkpoint file dir/c.shardS (ps.meta:
    format, shard, shards, version, generation). */
static int64_t file_generation(const world_procs_t *w, int shard)
{
    char path[128];
    snprintf(path, sizeof path, "%s/c.shard%d", w->dir, shard);
    zd_named_tensors_t *nt = zd_checkpoint_read(path);
    assert_non_null(nt);
    zd_tensor_t *m = zd_named_tensors_find(nt, "ps.meta");
    int64_t gen = m && zd_tensor_numel(m) == 5 ? zd_tensor_data_i64(m)[4] : -1;
    zd_named_tensors_free(nt);
    printf("%s: generation %lld\n", path, (long long)gen);
    return gen;
}

/*  The number after `key` in text (the first occurrence), or -1. */
static long long number_after(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

static void test_shard_1_killed_and_restarted_with_resume(void **state)
{
    (void)state;
    enum { SHARDS = 2, N = 4 };
    static const char *const flags[] = {"--max_batches=60", "--num_servers=2", NULL};
    static const char *const resume[] = {"--max_batches=60", "--num_servers=2", "--resume", NULL};
    world_procs_t w;
    world_init_n(&w, N);
    double t0 = program_now_s(), deadline = t0 + 300;
    /* (the layer says at level info how a stage goes back) */
    setenv("ZDIST_LOG_LEVEL", "info", 1);
    start_rank(&w, 0, flags);
    unsetenv("ZDIST_LOG_LEVEL");
    /* Shard 1 serves a stage of every forward: its 50th is about the 25th
       batch of each trainer, after their checkpoints at batches 10 and
       20, between two checkpoints. */
    setenv("ZDIST_FAULT", "1:forward:kill:50", 1);
    start_rank(&w, 1, flags);
    unsetenv("ZDIST_FAULT");
    for (int r = SHARDS; r < N; r++)
        start_rank(&w, r, flags);
    int rc = program_wait(&w.p[1], deadline);
    printf("---- rank 1 (first life) exited with %d:\n%s\n", rc, out(&w, 1));
    assert_int_equal(rc, 128 + SIGKILL);
    assert_non_null(strstr(out(&w, 1), "ZDIST_FAULT: rank 1: kill at forward #50"));
    free(w.p[1].out);
    w.p[1].out = NULL;
    double restarted = program_now_s();
    start_rank(&w, 1, resume);
    int back = -1;
    while (back < 0 && program_now_s() < deadline) {
        for (int r = SHARDS; r < N && back < 0; r++)
            if (program_read(&w.p[r], "going on from batch", program_now_s() + 0.2) == 1 &&
                strstr(out(&w, r), "going on from batch"))
                back = r;
    }
    assert_true(back >= SHARDS);
    printf("shard 1 restarted: trainer rank %d back in service %.2f s after the restart\n", back,
           program_now_s() - restarted);
    world_wait(&w, deadline);
    for (int r = 0; r < N; r++)
        assert_int_equal(w.rc[r], 0);

    for (int r = SHARDS; r < N; r++) {
        char key[96];
        snprintf(key, sizeof key, "Rank %d: server shard 1 lost at batch ", r);
        assert_non_null(strstr(out(&w, r), key));
        const char *p = strstr(out(&w, r), "the servers are back after ");
        assert_non_null(p);
        printf("rank %d: %.*s\n", r, (int)strcspn(p, "\n"), p);
        double acc = accuracy(out(&w, r), r);
        printf("rank %d: final accuracy %.2f %%\n", r, acc);
        assert_true(acc > 40); /* chance is 10 % */
    }
    /* Shard 1 came back from its file; the trainers brought shard 0, which
       ran on, back to that generation: not the run's start (generation
       0), since each trainer had checkpointed at batches 10 and 20 (two
       calls at once may complete one generation, so how many there are
       depends on timing). */
    const char *went = strstr(out(&w, 0), "ps: stage 0 went back from version ");
    long long back_to = went ? number_after(went, "(generation ") : -1;
    printf("shard 0 went back to generation %lld\n", back_to);
    assert_non_null(strstr(out(&w, 1), "parameter server shard 1: resumed from "));
    assert_true(back_to >= 1);
    assert_non_null(strstr(out(&w, 0), "2 of 2 trainers finished"));
    /* The checkpoints written since are of one generation on both shards,
       past the one they went back to. */
    int64_t g0 = file_generation(&w, 0), g1 = file_generation(&w, 1);
    assert_true(g0 == g1);
    assert_true(g0 > back_to);
    world_free(&w);
}

/*  The line trainer rank r printed for batch b after `after` in text
    ("Rank r training batch b loss X"), into line (of size), or fails. */
static void batch_line(const char *text, const char *after, int r, int b, char *line, size_t size)
{
    const char *from = after ? strstr(text, after) : text;
    assert_non_null(from);
    char key[64];
    snprintf(key, sizeof key, "Rank %d training batch %d loss ", r, b);
    const char *p = strstr(from, key);
    assert_non_null(p);
    snprintf(line, size, "%.*s", (int)strcspn(p, "\n"), p);
}

/*  One trainer, two shards, no dropout: the run is deterministic. Shard
    1 killed after the checkpoint of batch 20 and started again with
    --resume; shard 0, which ran on, loads that generation back, and the
    trainer goes on from batch 20. Batch 20's loss must then be the one
    a run that never stopped computed for it, to the printed digit:
    shard 0's forwards work on a shared copy of its parameters, which
    must be taken again after the load (it was not: the step count does
    not move in a rollback, and the copy of before served on). */
static void test_rollback_serves_the_checkpoint_weights(void **state)
{
    (void)state;
    enum { SHARDS = 2, N = 3 };
    static const char *const flags[] = {"--max_batches=30", "--num_servers=2", "--no_dropout",
                                        "--log_interval=1", NULL};
    static const char *const resume[] = {"--max_batches=30", "--num_servers=2", "--no_dropout",
                                         "--log_interval=1", "--resume",        NULL};
    char want[128], got[128];
    world_procs_t w;
    world_init_n(&w, N);
    double deadline = program_now_s() + 300;
    for (int r = 0; r < N; r++)
        start_rank(&w, r, flags);
    world_wait(&w, deadline);
    for (int r = 0; r < N; r++)
        assert_int_equal(w.rc[r], 0);
    batch_line(out(&w, 2), NULL, 2, 20, want, sizeof want);
    world_free(&w);

    world_init_n(&w, N);
    deadline = program_now_s() + 300;
    start_rank(&w, 0, flags);
    /* shard 1's 25th forward is the trainer's 25th batch */
    setenv("ZDIST_FAULT", "1:forward:kill:25", 1);
    start_rank(&w, 1, flags);
    unsetenv("ZDIST_FAULT");
    start_rank(&w, 2, flags);
    assert_int_equal(program_wait(&w.p[1], deadline), 128 + SIGKILL);
    free(w.p[1].out);
    w.p[1].out = NULL;
    start_rank(&w, 1, resume);
    world_wait(&w, deadline);
    for (int r = 0; r < N; r++)
        assert_int_equal(w.rc[r], 0);
    assert_non_null(strstr(out(&w, 2), "going on from batch 20 "));
    batch_line(out(&w, 2), "going on from batch 20 ", 2, 20, got, sizeof got);
    printf("never stopped: %s\nrolled back:   %s\n", want, got);
    assert_string_equal(got, want);
    world_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_trainer_killed_and_restarted_rejoins),
        cmocka_unit_test(test_server_killed_and_restarted_with_resume),
        cmocka_unit_test(test_server_killed_and_not_back_trainers_fail),
        cmocka_unit_test(test_shard_1_killed_and_restarted_with_resume),
        cmocka_unit_test(test_rollback_serves_the_checkpoint_weights),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
