/* SPDX-License-Identifier: MIT */
/*  ps.c: what both ends of the push/pull parameter server (ps.h) share:
    the options, the split of the tensors over the shards, the checks of
    the tensors a process gives or a peer sends, and the wait for shards
    to be back. The shard is shard.c, the trainer's client client.c. */
#include <zdist/ps.h>

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/finite.h"
#include "core/sized.h"
#include "ps/ps_private.h"

int zd__ps_options_read(zd_ps_options_t *o, const zd_ps_options_t *in)
{
    *o = zd_ps_options_default();
    if (in &&
        zd__sized_read(o, sizeof *o, in, ZD__SIZE_THROUGH(zd_ps_options_t, max_staleness),
                       "zd_ps_options_t", "zd_ps_options_default()") < 0)
        return -1;
    if (o->mode != ZD_PS_ASYNC && o->mode != ZD_PS_SYNC)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: unknown mode %d", (int)o->mode);
    if (o->mode == ZD_PS_SYNC && o->num_trainers < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: num_trainers must be >= 1, got %d",
                                 o->num_trainers);
    if (o->checkpoint_every < 0 || ((o->resume || o->checkpoint_every) && !o->checkpoint_path))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: checkpoint_every (%" PRId64 ") must be >= 0, and it and "
                                 "resume need a checkpoint_path",
                                 o->checkpoint_every);
    if (o->mode == ZD_PS_SYNC && (o->min_trainers < 1 || o->min_trainers > o->num_trainers))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: min_trainers must be in [1, num_trainers = %d], got %d",
                                 o->num_trainers, o->min_trainers);
    if (o->stage_outputs < 1 || o->stage_outputs > ZD__PS_MAX_TENSORS || o->max_input_numel < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "ps: stage_outputs must be in [1, %d] and max_input_numel >= 1, "
                                 "got %d and %" PRId64,
                                 ZD__PS_MAX_TENSORS, o->stage_outputs, o->max_input_numel);
    if (o->max_inflight < 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: max_inflight must be >= 0, got %d",
                                 o->max_inflight);
    if (o->run_tag && strlen(o->run_tag) > ZD__PS_MAX_TAG)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "ps: run_tag of %zu bytes (at most %d)",
                                 strlen(o->run_tag), ZD__PS_MAX_TAG);
    return 0;
}

/*  ---- the split ---- */

typedef struct {
    const char *name;
    int64_t numel;
    int index;
} split_item_t;

static int by_size_then_name(const void *a, const void *b)
{
    const split_item_t *x = a, *y = b;
    if (x->numel != y->numel)
        return x->numel > y->numel ? -1 : 1;
    return strcmp(x->name, y->name);
}

int zd_ps_split(const zd_named_tensors_t *params, int n_shards, int *shard_of, int n)
{
    if (!params || !shard_of || n_shards < 1 || n != zd_named_tensors_len(params))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "zd_ps_split: give the tensors, n_shards >= 1 (got %d) and an "
                                 "array of their number (%d, got %d)",
                                 n_shards, params ? zd_named_tensors_len(params) : 0, n);
    if (n == 0)
        return 0;
    split_item_t *items = malloc((size_t)n * sizeof *items);
    int64_t *load = calloc((size_t)n_shards, sizeof *load);
    if (!items || !load) {
        free(items);
        free(load);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_ps_split: out of memory");
    }
    for (int i = 0; i < n; i++)
        items[i] = (split_item_t){zd_named_tensors_name(params, i),
                                  zd_tensor_numel(zd_named_tensors_tensor(params, i)), i};
    /* Largest first onto the lightest shard: sorted by size and name, so
       that the order the process listed them in does not matter. */
    qsort(items, (size_t)n, sizeof *items, by_size_then_name);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int s = 1; s < n_shards; s++)
            if (load[s] < load[best])
                best = s;
        load[best] += items[i].numel;
        shard_of[items[i].index] = best;
    }
    free(items);
    free(load);
    return 0;
}

/*  The tensors a process gives must be float32, and each tensor once:
    a tied tensor under two names would be stepped twice. */
int zd__ps_check_params(const zd_named_tensors_t *params, const char *who)
{
    int n = zd_named_tensors_len(params);
    if (n < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: no tensors to serve", who);
    for (int i = 0; i < n; i++) {
        zd_tensor_t *t = zd_named_tensors_tensor(params, i);
        if (zd_tensor_dtype(t) != ZD_FLOAT32)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: \"%s\" is %s, not float32", who,
                                     zd_named_tensors_name(params, i),
                                     zd_tensor_dtype_name(zd_tensor_dtype(t)));
        for (int j = 0; j < i; j++)
            if (zd_named_tensors_tensor(params, j) == t)
                return zd_error_set_code(ZD_ERR_ARGUMENT,
                                         "%s: \"%s\" and \"%s\" are the same tensor (tied): give "
                                         "it once",
                                         who, zd_named_tensors_name(params, j),
                                         zd_named_tensors_name(params, i));
    }
    return 0;
}

/*  The split of params, checked to leave no shard empty: caller frees. */
int *zd__ps_split_checked(const zd_named_tensors_t *params, int n_shards, const char *who)
{
    int n = zd_named_tensors_len(params);
    int *shard_of = malloc((size_t)n * sizeof *shard_of);
    int *count = calloc((size_t)(n_shards > 0 ? n_shards : 1), sizeof *count);
    if (!shard_of || !count) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", who);
        goto fail;
    }
    if (zd_ps_split(params, n_shards, shard_of, n) < 0) {
        zd_error_wrap("%s", who);
        goto fail;
    }
    for (int i = 0; i < n; i++)
        count[shard_of[i]]++;
    for (int s = 0; s < n_shards; s++)
        if (count[s] == 0) {
            zd_error_set_code(ZD_ERR_ARGUMENT, "%s: %d tensors leave shard %d of %d empty", who, n,
                              s, n_shards);
            goto fail;
        }
    free(count);
    return shard_of;
fail:
    free(shard_of);
    free(count);
    return NULL;
}

/*  A module's parameters, each tensor once: a new object. */
zd_named_tensors_t *zd__ps_module_params(const zd_nn_module_t *m)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    for (int i = 0; nt && m && i < zd_nn_module_n_params(m); i++)
        if (zd_named_tensors_add(nt, zd_nn_module_param_name(m, i), zd_nn_module_param(m, i)) < 0) {
            zd_named_tensors_free(nt);
            return NULL;
        }
    if (!m) {
        zd_named_tensors_free(nt);
        zd_error_set_code(ZD_ERR_ARGUMENT, "ps: the module is NULL");
        return NULL;
    }
    return nt;
}

/*  The first element of t that is not finite, or -1. */
int64_t zd__ps_first_not_finite(const zd_tensor_t *t)
{
    return zd__first_not_finite(zd_tensor_data(t), zd_tensor_numel(t));
}

/*  t, checked against the served tensor like: dtype, shape, finite. */
static int check_tensor(const zd_tensor_t *t, const zd_tensor_t *like, const char *name)
{
    char want[96], got[96];
    if (zd_tensor_dtype(t) != ZD_FLOAT32)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" is %s, not float32", name,
                                 zd_tensor_dtype_name(zd_tensor_dtype(t)));
    if (!zd_tensor_same_shape(t, like))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" has shape %s, not %s", name,
                                 zd_tensor_shape_str(t, got, sizeof got),
                                 zd_tensor_shape_str(like, want, sizeof want));
    int64_t bad = zd__ps_first_not_finite(t);
    if (bad >= 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" element %" PRId64 " is %g, not finite",
                                 name, bad, (double)zd_tensor_data(t)[bad]);
    return 0;
}

/*  Reads the (name, tensor) pairs of list from item `from` on, for the
    n tensors `names`/`like` (want[i] false: not expected here, as an
    unknown name): got[i] borrowed from list. Each expected name exactly
    once. */
int zd__ps_read_pairs(const zd_value_t *list, size_t from, char *const *names,
                      zd_tensor_t *const *like, const bool *want, int n, zd_tensor_t **got)
{
    size_t len = zd_list_len(list);
    if (len < from || (len - from) % 2 != 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "expected (name, tensor) pairs, got %zu items",
                                 len - from);
    for (int i = 0; i < n; i++)
        got[i] = NULL;
    for (size_t k = from; k < len; k += 2) {
        const char *name;
        zd_tensor_t *t;
        if (zd_value_get_string(zd_list_get(list, k), &name) < 0 ||
            zd_value_get_tensor(zd_list_get(list, k + 1), &t) < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "item %zu: %s", k, zd_error_last());
        int i = 0;
        while (i < n && !(want[i] && strcmp(names[i], name) == 0))
            i++;
        if (i == n)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "no tensor \"%.80s\" here", name);
        if (got[i])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" given twice", names[i]);
        if (check_tensor(t, like[i], names[i]) < 0)
            return -1;
        got[i] = t;
    }
    for (int i = 0; i < n; i++)
        if (want[i] && !got[i])
            return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" missing", names[i]);
    return 0;
}

int zd__ps_wait_ranks(const int *ranks, int n, int64_t timeout_ms)
{
    int64_t deadline = zd__deadline_after(zd__now_ns(), timeout_ms);
    for (int s = 0; s < n; s++) {
        int64_t left = ZD_TIMEOUT_NONE;
        if (deadline != ZD__NEVER) {
            left = zd__ms_left(zd__now_ns(), deadline);
            if (left < 1)
                left = 1;
        }
        if (zd_rpc_wait_peer(ranks[s], left) < 0)
            return zd_error_wrap("ps: shard %d (rank %d) not back", s, ranks[s]);
    }
    return 0;
}

int zd__ps_wait_shards(const int *ranks, int n, int64_t timeout_ms, int (*agree)(void *), void *arg)
{
    int64_t deadline = zd__deadline_after(zd__now_ns(), timeout_ms);
    for (;;) {
        int64_t left =
            deadline == ZD__NEVER ? ZD_TIMEOUT_NONE : zd__ms_left(zd__now_ns(), deadline);
        if (zd__ps_wait_ranks(ranks, n, left > 0 || deadline == ZD__NEVER ? left : 1) < 0)
            return -1;
        if (agree(arg) == 0)
            return 0;
        /* A shard just back may not take calls from everyone yet (its
           connections are being made), or was lost again: wait again
           while the time lasts. */
        if (zd_error_code() != ZD_ERR_PEER ||
            (deadline != ZD__NEVER && zd__ms_left(zd__now_ns(), deadline) <= 0))
            return -1;
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}
