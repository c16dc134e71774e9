/*  state.c: an optimizer's state as named tensors, to checkpoint and resume. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/error.h"
#include "optim/optim_private.h"

void optim_state_free(int n, char **names, tensor_t **tensors)
{
    for (int i = 0; i < n; i++) {
        if (names)
            free(names[i]);
        if (tensors)
            tensor_unref(tensors[i]);
    }
    free(names);
    free(tensors);
}

static int count_entries(const optim_t *o)
{
    int k = 0;
    for (int i = 0; i < o->n; i++) {
        if (!o->state[i].started)
            continue;
        for (int s = 0; s < OPTIM_SLOTS; s++)
            k += o->state[i].slot[s] != NULL;
        k += optim_counts_steps(o->cfg.kind);
    }
    return k;
}

static int add_entry(char **names, tensor_t **tensors, int *k, int i, const char *slot,
                     tensor_t *t)
{
    char name[64];
    snprintf(name, sizeof name, "%d.%s", i, slot);
    names[*k] = strdup(name);
    tensors[*k] = t;
    (*k)++;
    if (!names[*k - 1] || !t)
        return error_set("optimizer state: out of memory");
    return 0;
}

static int export_locked(optim_t *o, int *n, char ***names_out, tensor_t ***tensors_out)
{
    int total = count_entries(o), k = 0;
    char **names = calloc(total ? (size_t)total : 1, sizeof *names);
    tensor_t **tensors = calloc(total ? (size_t)total : 1, sizeof *tensors);
    int rc = names && tensors ? 0 : error_set("optimizer state: out of memory");
    for (int i = 0; rc == 0 && i < o->n; i++) {
        const optim_pstate_t *st = &o->state[i];
        if (!st->started)
            continue;
        for (int s = 0; rc == 0 && s < OPTIM_SLOTS; s++)
            if (st->slot[s])
                rc = add_entry(names, tensors, &k, i, optim_slot_name(o->cfg.kind, s),
                               tensor_clone(st->slot[s]));
        if (rc == 0 && optim_counts_steps(o->cfg.kind)) {
            int64_t one = 1;
            rc = add_entry(names, tensors, &k, i, "step",
                           tensor_from_data(TENSOR_I64, 1, &one, &st->step));
        }
    }
    if (rc < 0) {
        optim_state_free(k, names, tensors);
        return -1;
    }
    *n = k;
    *names_out = names;
    *tensors_out = tensors;
    return 0;
}

int optim_state_export(optim_t *o, int *n, char ***names, tensor_t ***tensors)
{
    *n = 0;
    *names = NULL;
    *tensors = NULL;
    pthread_mutex_lock(&o->lock);
    int rc = export_locked(o, n, names, tensors);
    pthread_mutex_unlock(&o->lock);
    return rc;
}

/*  Splits "<i>.<slot>" into the parameter index and the slot number
    (OPTIM_SLOTS for "step"). */
static int parse_name(const optim_t *o, const char *name, int *index, int *slot_out)
{
    char *end;
    errno = 0;
    long i = strtol(name, &end, 10);
    if (end == name || *end != '.' || errno || i < 0 || i >= o->n)
        return error_set("optimizer state: entry '%s' is not '<parameter index>.<slot>' with "
                         "an index below %d", name, o->n);
    const char *slot = end + 1;
    *index = (int)i;
    if (strcmp(slot, "step") == 0 && optim_counts_steps(o->cfg.kind)) {
        *slot_out = OPTIM_SLOTS;
        return 0;
    }
    for (int s = 0; s < OPTIM_SLOTS; s++)
        if (optim_slot_used(&o->cfg, s) && strcmp(slot, optim_slot_name(o->cfg.kind, s)) == 0) {
            *slot_out = s;
            return 0;
        }
    return error_set("optimizer state: entry '%s': %s with these flags has no state '%s'",
                     name, optim_kind_name(o->cfg.kind), slot);
}

/*  Fills fresh[] from the entries; checks shapes, duplicates, completeness. */
static int import_into(const optim_t *o, optim_pstate_t *fresh, int n, const char *const *names,
                       tensor_t *const *tensors)
{
    char a[96], b[96];
    bool *seen = calloc((size_t)o->n * (OPTIM_SLOTS + 1), sizeof *seen);
    if (!seen)
        return error_set("optimizer state: out of memory");
    int rc = 0;
    for (int e = 0; rc == 0 && e < n; e++) {
        int i = 0, s = 0;
        if (parse_name(o, names[e], &i, &s) < 0) {
            rc = -1;
            break;
        }
        const tensor_t *t = tensors[e], *p = o->params[i];
        if (seen[i * (OPTIM_SLOTS + 1) + s]) {
            rc = error_set("optimizer state: entry '%s' given twice", names[e]);
            break;
        }
        seen[i * (OPTIM_SLOTS + 1) + s] = true;
        fresh[i].started = true;
        if (s == OPTIM_SLOTS) {
            if (tensor_dtype(t) != TENSOR_I64 || tensor_numel(t) != 1
                || tensor_data_i64(t)[0] < 1)
                rc = error_set("optimizer state: '%s' must be one int64 >= 1", names[e]);
            else
                fresh[i].step = tensor_data_i64(t)[0];
            continue;
        }
        if (tensor_dtype(t) != TENSOR_F32 || !tensor_same_shape(t, p)) {
            rc = error_set("optimizer state: '%s' is %s %s, the parameter float32 %s",
                           names[e], tensor_dtype_name(tensor_dtype(t)),
                           tensor_shape_str(t, a, sizeof a), tensor_shape_str(p, b, sizeof b));
            break;
        }
        fresh[i].slot[s] = tensor_clone(t);
        if (!fresh[i].slot[s])
            rc = -1;
    }
    for (int i = 0; rc == 0 && i < o->n; i++) {
        if (!fresh[i].started)
            continue;
        for (int s = 0; rc == 0 && s <= OPTIM_SLOTS; s++) {
            bool needed = s == OPTIM_SLOTS ? optim_counts_steps(o->cfg.kind)
                                           : optim_slot_used(&o->cfg, s);
            if (needed && !seen[i * (OPTIM_SLOTS + 1) + s])
                rc = error_set("optimizer state: parameter %d has some state but no '%d.%s'",
                               i, i, s == OPTIM_SLOTS ? "step" : optim_slot_name(o->cfg.kind, s));
        }
    }
    free(seen);
    return rc;
}

int optim_state_import(optim_t *o, int n, const char *const *names, tensor_t *const *tensors)
{
    if (n < 0)
        return error_set("optimizer state: %d entries", n);
    optim_pstate_t *fresh = calloc((size_t)o->n, sizeof *fresh);
    if (!fresh)
        return error_set("optimizer state: out of memory");
    pthread_mutex_lock(&o->lock);
    int rc = import_into(o, fresh, n, names, tensors);
    optim_pstate_t *drop = rc == 0 ? o->state : fresh;
    if (rc == 0)
        o->state = fresh;
    pthread_mutex_unlock(&o->lock);
    for (int i = 0; i < o->n; i++)
        for (int s = 0; s < OPTIM_SLOTS; s++)
            tensor_unref(drop[i].slot[s]);
    free(drop);
    return rc;
}
