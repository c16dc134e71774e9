/* SPDX-License-Identifier: MIT */
#include "examples/train_log.h"

#include <stdio.h>
#include <unistd.h>

#include "examples/train_common.h"

int train_log_open(train_log_t *l, const train_log_config_t *c, double now)
{
    *l = (train_log_t){.batch_size = c->batch_size, .t0 = now};
    if (c->curves && !(l->curves = curves_open(c->curves, c->title, c->per_epoch)))
        return -1;
    progress_init(&l->progress, stdout, isatty(STDOUT_FILENO),
                  &(progress_config_t){.label = c->label,
                                       .first = c->first,
                                       .total = c->total,
                                       .per_epoch = c->per_epoch,
                                       .epochs = c->epochs,
                                       .samples_per_step = c->batch_size,
                                       .every_s = c->progress_every_s},
                  now);
    curves_points_init(&l->points, c->points_every, now);
    return 0;
}

int train_log_batch(train_log_t *l, int64_t done, float loss, double now)
{
    progress_step(&l->progress, now, loss);
    return curves_batch(l->curves, &l->points, done, loss, l->batch_size, now);
}

void train_log_clear(train_log_t *l)
{
    progress_clear(&l->progress);
}

int train_log_accuracy(train_log_t *l, int64_t done, double accuracy, double since)
{
    if (l->curves && curves_add_accuracy(l->curves, done, accuracy) < 0)
        return -1;
    /* the plot's redrawing counts as the evaluation's time too */
    double spent = train_now() - since;
    l->eval_secs += spent;
    curves_points_skip(&l->points, spent);
    progress_skip(&l->progress, spent);
    return 0;
}

double train_log_end(train_log_t *l, double now)
{
    progress_end(&l->progress, now);
    return now - l->t0 - l->eval_secs;
}

void train_log_close(train_log_t *l, bool failed)
{
    if (failed && l->curves)
        curves_draw(l->curves);
    curves_close(l->curves);
    l->curves = NULL;
}
