/* SPDX-License-Identifier: MIT */
/*  ps_net_eval.c: shard 0's book of the trainers (the layer's registry,
    zd_ps_trainers_*: start, finish, failure, loss, the staleness gate, the
    aggregate throughput) and the final evaluation they all share. */
#include "examples/fault.h"
#include "examples/ps_net.h"
#include "examples/ps_net_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/dataset.h>
#include <zdist/error.h>
#include <zdist/nn.h>
#include <zdist/ps.h>
#include <zdist/rpc.h>

static zd_ps_trainers_t *trainers;
static char data_dir[1024];

/*  Test images per forward. The activations of a forward are what the
    evaluation holds, per thread: 1000 images made conv1's output alone
    86 MB, the server's peak at the end of every run; 128 keep the layers'
    matrix products as fast. */
#define EVAL_CHUNK 128

/*  One evaluation thread's share of the test set. */
typedef struct {
    const zd_dataset_t *test;
    int64_t start, end, correct;
    int rc;
    char error[256];
} eval_part_t;

static void *evaluate_part(void *arg)
{
    eval_part_t *e = arg;
    bool prev = zd_autograd_set_grad_enabled(false);
    for (int64_t at = e->start; at < e->end && e->rc == 0; at += EVAL_CHUNK) {
        zd_tensor_t *x, *y, *out = NULL;
        int64_t n = e->end - at < EVAL_CHUNK ? e->end - at : EVAL_CHUNK;
        e->rc = zd_dataset_batch(e->test, NULL, at, n, &x, &y);
        if (e->rc == 0 && (e->rc = ps_net_forward(x, false, &out)) == 0) {
            int64_t c = zd_nn_accuracy(out, y);
            e->rc = c < 0 ? -1 : 0;
            e->correct += c;
        }
        zd_tensor_unref(out);
        zd_tensor_unref(x);
        zd_tensor_unref(y);
    }
    zd_autograd_set_grad_enabled(prev);
    if (e->rc < 0)
        snprintf(e->error, sizeof e->error, "%s", zd_error_last());
    return NULL;
}

/*  Accuracy of the current weights on the first `limit` test images (0: all),
    in evaluation mode, split over the cores: with several trainers the
    layers run on one thread per pass, and the evaluation is one pass. */
static int evaluate(int64_t limit, double *acc, int64_t *images)
{
    const char *dir = data_dir[0] ? data_dir : NULL;
    zd_dataset_t *test = zd_dataset_load(dir, ZD_DATASET_TEST);
    if (!test)
        return -1;
    int64_t n = zd_dataset_len(test), correct = 0;
    if (limit > 0 && limit < n)
        n = limit;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int parts = zd_nn_get_num_threads() > 1 || cores < 2 ? 1 : cores > 8 ? 8 : (int)cores;
    eval_part_t e[8];
    pthread_t th[8];
    bool started[8] = {false};
    int rc = 0;
    for (int i = 0; i < parts; i++) {
        e[i] = (eval_part_t){test, n * i / parts, n * (i + 1) / parts, 0, 0, ""};
        if (i > 0)
            started[i] = pthread_create(&th[i], NULL, evaluate_part, &e[i]) == 0;
        if (i > 0 && !started[i])
            evaluate_part(&e[i]); /* no thread: do it here */
    }
    evaluate_part(&e[0]);
    for (int i = 1; i < parts; i++)
        if (started[i])
            pthread_join(th[i], NULL);
    for (int i = 0; i < parts; i++) {
        if (e[i].rc < 0 && rc == 0)
            rc = zd_error_set("%s", e[i].error);
        correct += e[i].correct;
    }
    zd_dataset_free(test);
    *acc = n ? (double)correct / (double)n : 0;
    *images = n;
    return rc;
}

/*  The shared result of every trainer's ps_net_client_shared_accuracy:
    the accuracy of the final weights on `request` test images, once every
    trainer has finished, failed or was lost (a trainer whose call times
    out evaluates by itself). */
static zd_value_t *shared_accuracy(void *arg, const zd_value_t *request)
{
    (void)arg;
    int64_t samples, step = 0; /* training batches served: the optimizer's steps */
    if (zd_value_get_int(request, &samples) < 0)
        return NULL;
    zd_ps_trainer_info_t info;
    for (int r = ps_shard.num_shards; zd_ps_trainers_get(trainers, r, &info) == 0; r++)
        step += info.batches;
    double acc;
    int64_t images;
    if (evaluate(samples, &acc, &images) < 0) {
        zd_error_wrap("evaluation failed");
        return NULL;
    }
    /* before the trainers hear the accuracy: the file is there when they
       finish */
    if (ps_net_save_model_wanted())
        ps_net_save_model(step, acc, images);
    return zd_value_float(acc);
}

/*  The registry's news, on this server's terminal. */
static void on_trainer(void *arg, const zd_ps_trainer_info_t *t, const char *name,
                       zd_ps_trainer_event_t event)
{
    (void)arg;
    switch (event) {
    case ZD_PS_TRAINER_FAILED:
        printf("trainer \"%s\" (rank %d) failed at batch %lld: %s\n", name, t->rank,
               (long long)t->failed_at, t->why);
        break;
    case ZD_PS_TRAINER_LOST:
        printf("trainer \"%s\" (rank %d) lost at batch %lld%s; the others go on\n", name, t->rank,
               (long long)t->batches, t->finished ? ", having finished" : "");
        break;
    case ZD_PS_TRAINER_REJOINED:
        printf("trainer \"%s\" (rank %d), lost at batch %lld, rejoined; counted again\n", name,
               t->rank, (long long)t->batches);
        break;
    default:
        break;
    }
    fflush(stdout);
}

void ps_net_eval_note_batch(int rank, int64_t samples)
{
    zd_ps_trainers_note_batch(trainers, rank, samples);
}

void ps_net_throughput(int64_t *samples, double *seconds)
{
    zd_ps_trainers_throughput(trainers, samples, seconds);
}

void ps_net_wait_trainers(double wait_s)
{
    /* Another shard lost for longer than the wait ends it too: the
       trainers gave up on it. */
    zd_ps_trainers_wait(trainers, (int64_t)(wait_s * 1000), ZD_TIMEOUT_NONE);
}

int ps_net_trainers_report(FILE *out)
{
    int finished = 0;
    zd_ps_trainer_info_t t;
    for (int r = ps_shard.num_shards; zd_ps_trainers_get(trainers, r, &t) == 0; r++) {
        if (t.finished)
            finished++;
        if (t.failed)
            fprintf(out, "trainer rank %d failed at batch %lld: %s\n", r, (long long)t.failed_at,
                    t.why);
        else if (t.lost)
            fprintf(out, "trainer rank %d was lost at batch %lld%s\n", r, (long long)t.batches,
                    t.finished ? " (after finishing its batches)" : "");
        else if (t.rejoined)
            fprintf(out, "trainer rank %d was lost and rejoined%s\n", r,
                    t.finished ? "; it finished its batches" : "");
    }
    return finished;
}

int ps_net_trainers_failed(char *first, size_t size)
{
    int failed = 0;
    if (size)
        first[0] = 0;
    zd_ps_trainer_info_t t;
    for (int r = ps_shard.num_shards; zd_ps_trainers_get(trainers, r, &t) == 0; r++)
        if (t.failed && failed++ == 0 && size)
            snprintf(first, size, "trainer rank %d failed at batch %lld: %s", r,
                     (long long)t.failed_at, t.why);
    return failed;
}

int ps_net_eval_register(const char *dir)
{
    snprintf(data_dir, sizeof data_dir, "%s", dir ? dir : "");
    zd_ps_trainers_options_t o = zd_ps_trainers_options_default();
    o.first_trainer = ps_shard.num_shards;
    o.on_event = on_trainer;
    o.shared_result = shared_accuracy;
    trainers = zd_ps_trainers_new(&o);
    return trainers ? 0 : -1;
}

void ps_net_eval_free(void)
{
    zd_ps_trainers_free(trainers);
    trainers = NULL;
}
