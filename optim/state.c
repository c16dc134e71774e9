/* SPDX-License-Identifier: MIT */
/*  state.c: an optimizer's state as named tensors, to checkpoint and resume. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "optim/optim_private.h"

/*  Adds t (taken over: dropped whatever happens) as "<i>.<slot>". */
static int add_entry(zd_named_tensors_t *nt, int i, const char *slot, zd_tensor_t *t)
{
    char name[64];
    snprintf(name, sizeof name, "%d.%s", i, slot);
    int rc = !t ? zd_error_set_code(ZD_ERR_NO_MEMORY, "optimizer state: out of memory")
        : zd_named_tensors_add(nt, name, t) < 0 ? zd_error_wrap("optimizer state")
                                                : 0;
    zd_tensor_unref(t);
    return rc;
}

static int export_locked(zd_optim_t *o, zd_named_tensors_t *nt)
{
    int rc = 0;
    for (int i = 0; rc == 0 && i < o->n; i++) {
        const optim_pstate_t *st = &o->state[i];
        if (!st->started)
            continue;
        for (int s = 0; rc == 0 && s < OPTIM_SLOTS; s++)
            if (st->slot[s])
                rc = add_entry(nt, i, zd__optim_slot_name(o->cfg.kind, s),
                               zd_tensor_detach_copy(st->slot[s]));
        if (rc == 0 && zd__optim_counts_steps(o->cfg.kind)) {
            int64_t one = 1;
            rc = add_entry(nt, i, "step", zd_tensor_from_data(ZD_INT64, &one, 1, &st->step));
        }
    }
    return rc;
}

zd_named_tensors_t *zd_optim_state_export(zd_optim_t *o)
{
    if (!o) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_state_export: NULL optimizer");
        return NULL;
    }
    zd_named_tensors_t *nt = zd_named_tensors_new();
    if (!nt)
        return NULL;
    pthread_mutex_lock(&o->lock);
    int rc = export_locked(o, nt);
    pthread_mutex_unlock(&o->lock);
    if (rc < 0) {
        zd_named_tensors_free(nt);
        return NULL;
    }
    return nt;
}

/*  Splits "<i>.<slot>" into the parameter index and the slot number
    (OPTIM_SLOTS for "step"). */
static int parse_name(const zd_optim_t *o, const char *name, int *index, int *slot_out)
{
    char *end;
    errno = 0;
    long i = strtol(name, &end, 10);
    if (end == name || *end != '.' || errno || i < 0 || i >= o->n)
        return zd_error_set_code(
            ZD_ERR_ARGUMENT,
            "optimizer state: entry '%s' is not '<parameter index>.<slot>' with "
            "an index below %d",
            name, o->n);
    const char *slot = end + 1;
    *index = (int)i;
    if (strcmp(slot, "step") == 0 && zd__optim_counts_steps(o->cfg.kind)) {
        *slot_out = OPTIM_SLOTS;
        return 0;
    }
    for (int s = 0; s < OPTIM_SLOTS; s++)
        if (zd__optim_slot_used(&o->cfg, s) &&
            strcmp(slot, zd__optim_slot_name(o->cfg.kind, s)) == 0) {
            *slot_out = s;
            return 0;
        }
    return zd_error_set_code(ZD_ERR_ARGUMENT,
                             "optimizer state: entry '%s': %s with these flags has no state '%s'",
                             name, zd_optim_kind_name(o->cfg.kind), slot);
}

/*  Fills fresh[] from the entries; checks shapes, duplicates, completeness. */
static int import_into(const zd_optim_t *o, optim_pstate_t *fresh, const zd_named_tensors_t *state)
{
    char a[96], b[96];
    bool *seen = calloc((size_t)o->n * (OPTIM_SLOTS + 1), sizeof *seen);
    if (!seen)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "optimizer state: out of memory");
    int rc = 0;
    for (int e = 0; rc == 0 && e < zd_named_tensors_len(state); e++) {
        const char *name = zd_named_tensors_name(state, e);
        int i = 0, s = 0;
        if (parse_name(o, name, &i, &s) < 0) {
            rc = -1;
            break;
        }
        const zd_tensor_t *t = zd_named_tensors_tensor(state, e), *p = o->params[i];
        if (seen[i * (OPTIM_SLOTS + 1) + s]) {
            rc =
                zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer state: entry '%s' given twice", name);
            break;
        }
        seen[i * (OPTIM_SLOTS + 1) + s] = true;
        fresh[i].started = true;
        if (s == OPTIM_SLOTS) {
            if (zd_tensor_dtype(t) != ZD_INT64 || zd_tensor_numel(t) != 1 ||
                zd_tensor_data_i64(t)[0] < 1)
                rc = zd_error_set_code(ZD_ERR_ARGUMENT,
                                       "optimizer state: '%s' must be one int64 >= 1", name);
            else
                fresh[i].step = zd_tensor_data_i64(t)[0];
            continue;
        }
        if (zd_tensor_dtype(t) != ZD_FLOAT32 || !zd_tensor_same_shape(t, p)) {
            rc = zd_error_set_code(
                ZD_ERR_ARGUMENT, "optimizer state: '%s' is %s %s, the parameter float32 %s", name,
                zd_tensor_dtype_name(zd_tensor_dtype(t)), zd_tensor_shape_str(t, a, sizeof a),
                zd_tensor_shape_str(p, b, sizeof b));
            break;
        }
        fresh[i].slot[s] = zd_tensor_detach_copy(t);
        if (!fresh[i].slot[s])
            rc = -1;
    }
    for (int i = 0; rc == 0 && i < o->n; i++) {
        if (!fresh[i].started)
            continue;
        for (int s = 0; rc == 0 && s <= OPTIM_SLOTS; s++) {
            bool needed = s == OPTIM_SLOTS ? zd__optim_counts_steps(o->cfg.kind)
                                           : zd__optim_slot_used(&o->cfg, s);
            if (needed && !seen[i * (OPTIM_SLOTS + 1) + s])
                rc = zd_error_set_code(
                    ZD_ERR_ARGUMENT, "optimizer state: parameter %d has some state but no '%d.%s'",
                    i, i, s == OPTIM_SLOTS ? "step" : zd__optim_slot_name(o->cfg.kind, s));
        }
    }
    free(seen);
    return rc;
}

int zd_optim_state_import(zd_optim_t *o, const zd_named_tensors_t *state)
{
    if (!o)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_optim_state_import: NULL optimizer");
    if (!state)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "optimizer state: no entries given (NULL)");
    optim_pstate_t *fresh = calloc((size_t)o->n, sizeof *fresh);
    if (!fresh)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "optimizer state: out of memory");
    pthread_mutex_lock(&o->lock);
    int rc = import_into(o, fresh, state);
    optim_pstate_t *drop = rc == 0 ? o->state : fresh;
    if (rc == 0)
        o->state = fresh;
    pthread_mutex_unlock(&o->lock);
    for (int i = 0; i < o->n; i++)
        for (int s = 0; s < OPTIM_SLOTS; s++)
            zd_tensor_unref(drop[i].slot[s]);
    free(drop);
    return rc;
}
