/* SPDX-License-Identifier: MIT */
/*  optim_private.h: what optim.c, config.c and update.c share. */
#ifndef ZDIST_OPTIM_PRIVATE_H
#define ZDIST_OPTIM_PRIVATE_H

#include <pthread.h>
#include <stdint.h>

#include <zdist/optim.h>

#define OPTIM_SLOTS 3

/*  One parameter's state. slot[s] is a float32 tensor of the parameter's
    shape when the kind uses slot s (zd__optim_slot_used), NULL otherwise or
    before the first step. */
typedef struct {
    bool started; /* stepped at least once */
    int64_t step; /* number of steps taken */
    zd_tensor_t *slot[OPTIM_SLOTS];
} optim_pstate_t;

struct zd_optim {
    zd_optim_config_t cfg;
    int n;
    zd_tensor_t **params;
    optim_pstate_t *state; /* n entries */
    pthread_mutex_t lock;  /* held by every public function */
};

/*  The caller's config in, as far as its size reaches, over the defaults
    of its kind into *out: 0, or -1 with ZD_ERR_ARGUMENT naming the struct
    when in is NULL or its size was not set by a *_defaults() function. */
int zd__optim_config_read(zd_optim_config_t *out, const zd_optim_config_t *in);

/*  Writes c into the caller's out of size bytes, no further, and sets
    out's size to what was written: 0, or -1 (ZD_ERR_ARGUMENT naming who). */
int zd__optim_config_write(zd_optim_config_t *out, size_t size, const zd_optim_config_t *c,
                           const char *who);

/*  The PyTorch state name of slot s of a kind ("exp_avg"), NULL when the
    kind has no such slot. */
const char *zd__optim_slot_name(zd_optim_kind_t kind, int s);

/*  Whether a config with these flags keeps slot s. */
bool zd__optim_slot_used(const zd_optim_config_t *cfg, int s);

/*  Whether the kind keeps a "step" count in its state. */
bool zd__optim_counts_steps(zd_optim_kind_t kind);

/*  Updates p[0..n) in place with gradient g. st->step already counts this
    step; the used slots exist (zero, or the initial accumulator value for
    Adagrad) and st->started says whether an earlier step ran. */
void zd__optim_update(const zd_optim_config_t *cfg, float *p, const float *g, int64_t n,
                      optim_pstate_t *st);

#endif
