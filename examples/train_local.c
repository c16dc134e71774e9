/* SPDX-License-Identifier: MIT */
/*  train_local: the parameter-server tutorial's Net (or the small ConvNet)
    trained in one process: the baseline that rpc_ps is compared against.

        train_local [--data_dir=DIR] [--epochs=1] [--batch_size=32] [--lr=0.03]
                    [--seed=1] [--max_batches=0] [--log_interval=0] [--progress_s=5]
                    [--curves=PREFIX] [--eval_every=0]
                    [--model=net|convnet] [--save=CKPT] [--load=CKPT]
                    [--save_model=FILE.safetensors] [--init_from=FILE.safetensors]

    Prints a progress line every --progress_s seconds (progress.h), the
    loss every --log_interval batches, then the test accuracy (dropout off)
    and the time taken. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/autograd.h>
#include <zdist/error.h>
#include "examples/flags.h"
#include "examples/train_common.h"
#include "examples/train_log.h"
#include <zdist/dataset.h>
#include <zdist/model.h>
#include <zdist/nn.h>
#include <zdist/optim.h>

typedef struct {
    const char *data_dir;
    int64_t epochs, batch_size, seed, max_batches, log_interval, eval_every;
    double lr, progress_s;
    const char *model, *save, *load, *curves;
    const char *save_model, *init_from; /* safetensors files under PyTorch's names, or NULL */
    bool no_dropout;
} options_t;

static int train_batch(zd_nn_module_t *m, zd_optim_t *opt, zd_tensor_t *x, zd_tensor_t *y,
                       float *loss_out)
{
    zd_tensor_t *logprobs = NULL, *loss = NULL;
    int rc = -1;
    if (zd_nn_module_forward(m, &x, 1, &logprobs, 1) < 0 || zd_nn_nll_loss(logprobs, y, &loss) < 0)
        goto out;
    zd_optim_zero_grad(opt, true);
    if (zd_autograd_backward(loss, NULL, false) < 0 || zd_optim_step_grad(opt) < 0)
        goto out;
    *loss_out = zd_tensor_data(loss)[0];
    rc = 0;
out:
    zd_tensor_unref(loss);
    zd_tensor_unref(logprobs);
    return rc;
}

static int run(const options_t *o)
{
    char dir[1024];
    zd_dataset_t *train = NULL, *test = NULL;
    zd_nn_module_t *m = NULL;
    zd_optim_t *opt = NULL;
    train_log_t log = {0};
    int64_t *order = NULL;
    int rc = -1;

    if (o->data_dir) {
        snprintf(dir, sizeof dir, "%s", o->data_dir);
    } else if (zd_dataset_find_dir(dir, sizeof dir) < 0) {
        goto out;
    }
    if (!(train = zd_dataset_load(dir, ZD_DATASET_TRAIN)) ||
        !(test = zd_dataset_load(dir, ZD_DATASET_TEST)))
        goto out;
    printf("data: %s (%lld training, %lld test images)\n", dir, (long long)zd_dataset_len(train),
           (long long)zd_dataset_len(test));
    if (!(m = zd_nn_tutorial_model_new(o->model, (uint64_t)o->seed)))
        goto out;
    if (o->load && zd_nn_module_load(m, o->load) < 0)
        goto out;
    if (o->init_from) {
        if (zd_nn_module_load_safetensors(m, o->init_from, true, NULL) < 0)
            goto out;
        printf("initial weights from %s\n", o->init_from);
    }
    zd_optim_config_t cfg = zd_optim_sgd_defaults(o->lr);
    zd_tensor_t *params[16];
    int np = zd_nn_module_n_params(m);
    if (np > (int)(sizeof params / sizeof *params)) {
        zd_error_set("%s has %d parameters, more than the %zu this program holds",
                     zd_nn_module_type(m), np, sizeof params / sizeof *params);
        goto out;
    }
    for (int i = 0; i < np; i++)
        params[i] = zd_nn_module_param(m, i);
    if (!(opt = zd_optim_new(&cfg, params, np)))
        goto out;
    zd_nn_module_train(m, !o->no_dropout);

    int64_t nb = zd_dataset_num_batches(train, o->batch_size), done = 0, total = o->epochs * nb;
    if (o->max_batches > 0 && o->max_batches < total)
        total = o->max_batches;
    /* a curve point every --log_interval batches, or 10 without loss lines */
    if (train_log_open(&log,
                       &(train_log_config_t){
                           NULL, o->curves, "train_local", 0, total, nb, o->epochs, o->batch_size,
                           o->log_interval > 0 ? o->log_interval : 10, o->progress_s},
                       train_now()) < 0)
        goto out;
    for (int64_t epoch = 0; epoch < o->epochs; epoch++) {
        free(order);
        if (!(order = zd_dataset_order(train, (uint64_t)(o->seed + epoch)))) {
            zd_error_set("out of memory");
            goto out;
        }
        for (int64_t b = 0; b < nb; b++) {
            if (o->max_batches > 0 && done >= o->max_batches)
                break;
            zd_tensor_t *x, *y;
            float loss;
            if (zd_dataset_batch(train, order, b * o->batch_size, o->batch_size, &x, &y) < 0)
                goto out;
            int brc = train_batch(m, opt, x, y, &loss);
            zd_tensor_unref(x);
            zd_tensor_unref(y);
            if (brc < 0)
                goto out;
            done++;
            double now = train_now();
            if (train_log_batch(&log, done, loss, now) < 0)
                goto out;
            if (o->log_interval > 0 && b % o->log_interval == 0) {
                train_log_clear(&log);
                printf("epoch %lld batch %lld loss %.6f\n", (long long)epoch + 1, (long long)b,
                       loss);
            }
            /* (the last batch's evaluation is the final one, below) */
            if (o->eval_every > 0 && done % o->eval_every == 0 && done < total) {
                double acc;
                if (train_evaluate(m, test, &acc) < 0)
                    goto out;
                train_log_clear(&log);
                printf("after batch %lld (epoch %lld): accuracy %.2f %%\n", (long long)done,
                       (long long)epoch + 1, 100.0 * acc);
                if (train_log_accuracy(&log, done, acc, now) < 0)
                    goto out;
            }
        }
    }
    double secs = train_log_end(&log, train_now());
    printf("trained %lld batches in %.1f s (%.0f samples/s)\n", (long long)done, secs,
           (double)done * (double)o->batch_size / secs);
    if (o->save) {
        if (zd_nn_module_save(m, o->save) < 0)
            goto out;
        printf("saved checkpoint %s\n", o->save);
    }
    double acc;
    if (train_evaluate(m, test, &acc) < 0)
        goto out;
    printf("Test accuracy: %.2f %%\n", 100.0 * acc);
    if (o->save_model) {
        char step[32], accuracy[32];
        snprintf(step, sizeof step, "%lld", (long long)done);
        snprintf(accuracy, sizeof accuracy, "%.6f", acc);
        const char *meta[] = {"step", step, "test_accuracy", accuracy};
        zd_strings_t *kv = zd_strings_from(meta, 4);
        int saved = kv ? zd_nn_module_save_safetensors(m, o->save_model, kv) : -1;
        zd_strings_free(kv);
        if (saved < 0)
            goto out;
        printf("saved model %s (safetensors)\n", o->save_model);
    }
    if (log.curves) {
        if (train_log_accuracy(&log, done, acc, train_now()) < 0)
            goto out;
        printf("curves in %s.csv and %s\n", o->curves, curves_png_path(log.curves));
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, "train_local: %s\n", zd_error_last());
    train_log_close(&log, rc < 0); /* (a failed run's plot: what there is) */
    free(order);
    zd_optim_free(opt);
    zd_nn_module_free(m);
    zd_dataset_free(train);
    zd_dataset_free(test);
    return rc;
}

int main(int argc, char **argv)
{
    /* first, before any thread or BLAS call: the allocator and OpenBLAS
       set-up the layers' speed relies on (zdist/nn.h) */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    /* Line by line even into a pipe (the launcher labels lines as they come). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    options_t o = {.data_dir = NULL,
                   .epochs = 1,
                   .batch_size = 32,
                   .seed = 1,
                   .max_batches = 0,
                   .log_interval = 0,
                   .lr = 0.03,
                   .model = "net",
                   .progress_s = 5};
    const flag_t flags[] = {
        {"data_dir", FLAG_STRING, &o.data_dir,
         "MNIST-format files (default: ./data if it has them, else Debian's Fashion-MNIST)"},
        {"epochs", FLAG_INT, &o.epochs, "passes over the training set"},
        {"batch_size", FLAG_INT, &o.batch_size, "samples per batch"},
        {"lr", FLAG_DOUBLE, &o.lr, "SGD learning rate"},
        {"seed", FLAG_INT, &o.seed, "seed of the initial weights, shuffling and dropout"},
        {"max_batches", FLAG_INT, &o.max_batches, "stop after this many batches (0: no limit)"},
        {"log_interval", FLAG_INT, &o.log_interval,
         "print the loss every N batches of an epoch (0: none)"},
        {"progress_s", FLAG_DOUBLE, &o.progress_s,
         "print a progress line (batch, samples/s, mean loss, time left) every N seconds "
         "(0: none)"},
        {"curves", FLAG_STRING, &o.curves,
         "write the loss, throughput and accuracy curves to PREFIX.csv (as they come) and "
         "PREFIX.png (at each evaluation)"},
        {"eval_every", FLAG_INT, &o.eval_every,
         "evaluate on the test set every N batches (0: only at the end)"},
        {"model", FLAG_STRING, &o.model, "net (the tutorial's) or convnet"},
        {"no_dropout", FLAG_BOOL, &o.no_dropout, "train with dropout off"},
        {"save", FLAG_STRING, &o.save, "write the trained parameters to this checkpoint"},
        {"load", FLAG_STRING, &o.load, "start from the parameters in this checkpoint"},
        {"save_model", FLAG_STRING, &o.save_model,
         "write the trained weights to this safetensors file, under PyTorch's state_dict() "
         "names (metadata: step, test_accuracy)"},
        {"init_from", FLAG_STRING, &o.init_from,
         "start from the weights in this safetensors file (PyTorch's state_dict() names; "
         "every parameter, nothing else)"},
    };
    int n = (int)(sizeof flags / sizeof flags[0]);
    int pr = flags_parse(argc, argv, flags, n, "Trains a model in one process.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (o.epochs < 1 || o.batch_size < 1 || o.lr <= 0 || o.max_batches < 0 || o.log_interval < 0 ||
        o.eval_every < 0 || o.progress_s < 0) {
        fprintf(stderr,
                "train_local: --epochs and --batch_size must be >= 1, --lr > 0, "
                "--max_batches, --log_interval, --eval_every and --progress_s >= 0\n");
        return 2;
    }
    if ((o.save_model && !o.save_model[0]) || (o.init_from && !o.init_from[0])) {
        fprintf(stderr, "train_local: --save_model and --init_from take a file name\n");
        return 2;
    }
    if (o.init_from && o.load) {
        fprintf(stderr,
                "train_local: --init_from and --load both give the initial weights: "
                "use one\n");
        return 2;
    }
    return run(&o) == 0 ? 0 : 1;
}
