/* SPDX-License-Identifier: MIT */
/*  module.c: the parameter container: named parameters,
    submodules, mode, forward, checkpoints. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/checkpoint.h>
#include <zdist/error.h>
#include <zdist/module.h>
#include <zdist/nn.h>
#include "core/fault_inject.h"
#include "nn/nn_private.h"

typedef struct {
    char *name;
    zd_tensor_t *t;
} own_param_t;

typedef struct {
    char *name;
    zd_nn_module_t *m;
} child_t;

struct zd_nn_module {
    char *type;
    zd_nn_module_forward_fn *forward;
    void *state;
    zd_nn_module_free_fn *free_state;
    atomic_bool training;
    zd_nn_module_t *parent;
    own_param_t *params;
    int n_params, cap_params;
    child_t *children;
    int n_children, cap_children;

    /* Every parameter with its dotted name, submodules included: built on
       first use after a registration, so that lookups by index are O(1).
       all/all_names hold every name (state_dict()); flat/flat_names each
       tensor once, under the name it was first seen with (parameters()),
       pointing into all_names. */
    pthread_mutex_t lock;
    bool flat_valid;
    int n_flat, n_all;
    zd_tensor_t **flat, **all;
    char **flat_names, **all_names;
};

zd_nn_module_t *zd_nn_module_new(const char *type_name, zd_nn_module_forward_fn *forward,
                                 void *state, zd_nn_module_free_fn *free_state)
{
    zd_nn_module_t *m = calloc(1, sizeof *m);
    if (m)
        m->type = strdup(type_name ? type_name : "Module");
    if (!m || !m->type) {
        free(m);
        if (free_state)
            free_state(state);
        zd_error_set_code(ZD_ERR_NO_MEMORY, "zd_nn_module_new: out of memory");
        return NULL;
    }
    m->forward = forward;
    m->state = state;
    m->free_state = free_state;
    atomic_init(&m->training, true);
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

static void flat_clear(zd_nn_module_t *m)
{
    for (int i = 0; i < m->n_all; i++)
        free(m->all_names[i]);
    free(m->all);
    free(m->all_names);
    free(m->flat);
    free(m->flat_names);
    m->all = m->flat = NULL;
    m->all_names = m->flat_names = NULL;
    m->n_all = m->n_flat = 0;
    m->flat_valid = false;
}

void zd_nn_module_free(zd_nn_module_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_params; i++) {
        free(m->params[i].name);
        zd_tensor_unref(m->params[i].t);
    }
    for (int i = 0; i < m->n_children; i++) {
        free(m->children[i].name);
        zd_nn_module_free(m->children[i].m);
    }
    free(m->params);
    free(m->children);
    flat_clear(m);
    pthread_mutex_destroy(&m->lock);
    if (m->free_state)
        m->free_state(m->state);
    free(m->type);
    free(m);
}

const char *zd_nn_module_type(const zd_nn_module_t *m)
{
    return m->type;
}
void *zd_nn_module_state(const zd_nn_module_t *m)
{
    return m->state;
}
zd_nn_module_forward_fn *zd__nn_module_forward_of(const zd_nn_module_t *m)
{
    return m->forward;
}

static zd_nn_module_t *flat(const zd_nn_module_t *cm);

/*  A registration changes the dotted list of the module and its ancestors. */
static void invalidate(zd_nn_module_t *m)
{
    for (; m; m = m->parent) {
        pthread_mutex_lock(&m->lock);
        flat_clear(m);
        pthread_mutex_unlock(&m->lock);
    }
}

static int check_name(const zd_nn_module_t *m, const char *name, const char *api)
{
    if (!name || !name[0] || strchr(name, '.'))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: module %s: bad name \"%s\" (non-empty, "
                                 "no dots)",
                                 api, m->type, name ? name : "(null)");
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "%s: module %s already has a parameter "
                                     "\"%s\"",
                                     api, m->type, name);
    for (int i = 0; i < m->n_children; i++)
        if (strcmp(m->children[i].name, name) == 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "%s: module %s already has a submodule "
                                     "\"%s\"",
                                     api, m->type, name);
    return 0;
}

/*  The dotted name name would have, from the root down. */
static void dotted_name(const zd_nn_module_t *m, const char *name, char *buf, size_t size)
{
    const char *parts[64];
    int n = 0;
    parts[n++] = name;
    for (const zd_nn_module_t *c = m; c->parent && n < 64; c = c->parent)
        for (int i = 0; i < c->parent->n_children; i++)
            if (c->parent->children[i].m == c && n < 64)
                parts[n++] = c->parent->children[i].name;
    size_t len = 0;
    buf[0] = '\0';
    for (int i = n - 1; i >= 0 && len < size; i--)
        len += (size_t)snprintf(buf + len, size - len, "%s%s", parts[i], i ? "." : "");
}

int zd_nn_module_register_parameter(zd_nn_module_t *m, const char *name, zd_tensor_t *t)
{
    const char *api = "zd_nn_module_register_parameter";
    if (!m || !t)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL %s", api, m ? "tensor" : "module");
    if (check_name(m, name, api) < 0)
        return -1;
    if (zd_tensor_dtype(t) != ZD_FLOAT32 || !zd_tensor_is_leaf(t))
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s: parameter \"%s\" of %s must be a float32 "
                                 "leaf tensor",
                                 api, name, m->type);
    if (m->n_params == m->cap_params) {
        int cap = m->cap_params ? 2 * m->cap_params : 4;
        own_param_t *p = realloc(m->params, (size_t)cap * sizeof *p);
        if (!p)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", api);
        m->params = p;
        m->cap_params = cap;
    }
    char *copy = strdup(name);
    if (!copy)
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", api);
    if (zd_tensor_set_requires_grad(t, true) < 0) {
        free(copy);
        return -1;
    }
    if (!zd_tensor_name(t) || !zd_tensor_name(t)[0]) {
        char full[1024];
        dotted_name(m, name, full, sizeof full);
        zd_tensor_set_name(t, full);
    }
    m->params[m->n_params++] = (own_param_t){copy, zd_tensor_ref(t)};
    invalidate(m);
    return 0;
}

zd_tensor_t *zd_nn_module_add_parameter(zd_nn_module_t *m, const char *name, const int64_t *shape,
                                        int ndim)
{
    if (!shape && ndim > 0) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_add_parameter: NULL shape");
        return NULL;
    }
    zd_tensor_t *t = zd_tensor_new(ZD_FLOAT32, shape, ndim);
    if (!t)
        return NULL;
    int rc = zd_nn_module_register_parameter(m, name, t);
    zd_tensor_unref(t);
    return rc < 0 ? NULL : t;
}

int zd_nn_module_register_module(zd_nn_module_t *m, const char *name, zd_nn_module_t *child)
{
    const char *api = "zd_nn_module_register_module";
    int rc = -1;
    if (!m || !child)
        zd_error_set_code(ZD_ERR_ARGUMENT, "%s: NULL module", api);
    else if (child->parent || child == m)
        zd_error_set_code(ZD_ERR_ARGUMENT, "%s: %s \"%s\" already has a parent", api, child->type,
                          name ? name : "(null)");
    else if (check_name(m, name, api) == 0)
        rc = 0;
    if (rc == 0 && m->n_children == m->cap_children) {
        int cap = m->cap_children ? 2 * m->cap_children : 4;
        child_t *c = realloc(m->children, (size_t)cap * sizeof *c);
        if (c) {
            m->children = c;
            m->cap_children = cap;
        } else {
            rc = zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", api);
        }
    }
    char *copy = rc == 0 ? strdup(name) : NULL;
    if (!copy) {
        if (rc == 0)
            zd_error_set_code(ZD_ERR_NO_MEMORY, "%s: out of memory", api);
        if (child && child != m && !child->parent)
            zd_nn_module_free(child);
        return -1;
    }
    m->children[m->n_children++] = (child_t){copy, child};
    child->parent = m;
    invalidate(m);
    /* Tensors still named as the child named them ("weight") take their
       full dotted names, which the gradient maps and errors show (out of
       memory, they keep their names). */
    char prefix[1024];
    dotted_name(m, name, prefix, sizeof prefix);
    ZD_FAULT_BENIGN(true);
    zd_nn_module_t *f = flat(child);
    ZD_FAULT_BENIGN(false);
    for (int i = 0; f && i < f->n_flat; i++) {
        const char *tn = zd_tensor_name(f->flat[i]);
        if (tn && strcmp(tn, f->flat_names[i]) == 0) {
            char full[2048];
            snprintf(full, sizeof full, "%s.%s", prefix, f->flat_names[i]);
            zd_tensor_set_name(f->flat[i], full);
        }
    }
    return 0;
}

zd_nn_module_t *zd_nn_module_child(const zd_nn_module_t *m, const char *name)
{
    for (int i = 0; m && name && i < m->n_children; i++)
        if (strcmp(m->children[i].name, name) == 0)
            return m->children[i].m;
    zd_error_set_code(ZD_ERR_ARGUMENT, "module %s has no submodule \"%s\"", m ? m->type : "?",
                      name ? name : "(null)");
    return NULL;
}

static int flat_push(zd_nn_module_t *m, int *cap, zd_tensor_t *t, const char *prefix,
                     const char *name)
{
    if (m->n_all == *cap) {
        int c = *cap ? 2 * *cap : 8;
        zd_tensor_t **f = realloc(m->all, (size_t)c * sizeof *f);
        if (f)
            m->all = f;
        char **n = f ? realloc(m->all_names, (size_t)c * sizeof *n) : NULL;
        if (n)
            m->all_names = n;
        if (!f || !n)
            return -1;
        *cap = c;
    }
    size_t len = strlen(prefix) + strlen(name) + 2;
    char *s = malloc(len);
    if (!s)
        return -1;
    snprintf(s, len, "%s%s%s", prefix, prefix[0] ? "." : "", name);
    m->all[m->n_all] = t;
    m->all_names[m->n_all++] = s;
    return 0;
}

/*  parameters() from named state: a tied tensor once, where first seen
    (quadratic, but only when the list is rebuilt after a registration). */
static int flat_dedup(zd_nn_module_t *m)
{
    size_t n = m->n_all ? (size_t)m->n_all : 1;
    m->flat = malloc(n * sizeof *m->flat);
    m->flat_names = malloc(n * sizeof *m->flat_names);
    if (!m->flat || !m->flat_names)
        return -1;
    for (int i = 0; i < m->n_all; i++) {
        bool seen = false;
        for (int j = 0; j < m->n_flat && !seen; j++)
            seen = m->flat[j] == m->all[i];
        if (!seen) {
            m->flat[m->n_flat] = m->all[i];
            m->flat_names[m->n_flat++] = m->all_names[i];
        }
    }
    return 0;
}

static int flat_build(zd_nn_module_t *m, int *cap, zd_nn_module_t *sub, const char *prefix)
{
    for (int i = 0; i < sub->n_params; i++)
        if (flat_push(m, cap, sub->params[i].t, prefix, sub->params[i].name) < 0)
            return -1;
    for (int i = 0; i < sub->n_children; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s%s%s", prefix, prefix[0] ? "." : "", sub->children[i].name);
        if (flat_build(m, cap, sub->children[i].m, p) < 0)
            return -1;
    }
    return 0;
}

/*  The dotted list, built when stale. The module is logically const: the
    list is a cache. */
static zd_nn_module_t *flat(const zd_nn_module_t *cm)
{
    zd_nn_module_t *m = (zd_nn_module_t *)cm;
    pthread_mutex_lock(&m->lock);
    if (!m->flat_valid) {
        flat_clear(m);
        int cap = 0;
        if (flat_build(m, &cap, m, "") < 0 || flat_dedup(m) < 0) {
            flat_clear(m);
            pthread_mutex_unlock(&m->lock);
            zd_error_set_code(ZD_ERR_NO_MEMORY, "module %s: out of memory", m->type);
            return NULL;
        }
        m->flat_valid = true;
    }
    pthread_mutex_unlock(&m->lock);
    return m;
}

int zd_nn_module_n_params(const zd_nn_module_t *m)
{
    zd_nn_module_t *f = m ? flat(m) : NULL;
    return f ? f->n_flat : 0;
}

zd_tensor_t *zd_nn_module_param(const zd_nn_module_t *m, int i)
{
    zd_nn_module_t *f = m ? flat(m) : NULL;
    if (f && i >= 0 && i < f->n_flat)
        return f->flat[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "module %s: no parameter %d (it has %d)", m ? m->type : "?",
                      i, f ? f->n_flat : 0);
    return NULL;
}

const char *zd_nn_module_param_name(const zd_nn_module_t *m, int i)
{
    zd_nn_module_t *f = m ? flat(m) : NULL;
    if (f && i >= 0 && i < f->n_flat)
        return f->flat_names[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "module %s: no parameter %d (it has %d)", m ? m->type : "?",
                      i, f ? f->n_flat : 0);
    return NULL;
}

zd_tensor_t *zd_nn_module_find(const zd_nn_module_t *m, const char *name)
{
    zd_nn_module_t *f = m && name ? flat(m) : NULL;
    for (int i = 0; f && i < f->n_all; i++)
        if (strcmp(f->all_names[i], name) == 0)
            return f->all[i];
    zd_error_set_code(ZD_ERR_ARGUMENT, "module %s has no parameter \"%s\"", m ? m->type : "?",
                      name ? name : "(null)");
    return NULL;
}

int zd_nn_module_param_index(const zd_nn_module_t *m, const char *name)
{
    zd_nn_module_t *f = m && name ? flat(m) : NULL;
    for (int i = 0; f && i < f->n_flat; i++)
        if (strcmp(f->flat_names[i], name) == 0)
            return i;
    return zd_error_set_code(ZD_ERR_ARGUMENT, "module %s has no parameter \"%s\"",
                             m ? m->type : "?", name ? name : "(null)");
}

zd_named_tensors_t *zd_nn_module_state_dict(const zd_nn_module_t *m)
{
    if (!m) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_state_dict: NULL module");
        return NULL;
    }
    zd_nn_module_t *f = flat(m);
    if (!f)
        return NULL;
    zd_named_tensors_t *nt = zd_named_tensors_new();
    int rc = nt ? 0 : zd_error_set_code(ZD_ERR_NO_MEMORY, "module %s: out of memory", m->type);
    pthread_mutex_lock(&f->lock);
    /* A tied weight appears under each of its names, as in PyTorch's
       state_dict() (its parameters() lists it once). */
    for (int i = 0; rc == 0 && i < f->n_all; i++)
        rc = zd_named_tensors_add(nt, f->all_names[i], f->all[i]);
    pthread_mutex_unlock(&f->lock);
    if (rc < 0) {
        zd_named_tensors_free(nt);
        return NULL;
    }
    return nt;
}

int64_t zd_nn_module_numel(const zd_nn_module_t *m)
{
    zd_nn_module_t *f = m ? flat(m) : NULL;
    int64_t n = 0;
    for (int i = 0; f && i < f->n_flat; i++)
        n += zd_tensor_numel(f->flat[i]);
    return n;
}

void zd_nn_module_zero_grad(zd_nn_module_t *m)
{
    zd_nn_module_t *f = m ? flat(m) : NULL;
    for (int i = 0; f && i < f->n_flat; i++)
        zd_tensor_clear_grad(f->flat[i]);
}

bool zd_nn_module_train(zd_nn_module_t *m, bool training)
{
    for (int i = 0; i < m->n_children; i++)
        zd_nn_module_train(m->children[i].m, training);
    return atomic_exchange(&m->training, training);
}

bool zd_nn_module_is_training(const zd_nn_module_t *m)
{
    return atomic_load(&m->training);
}

int zd_nn_module_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                         int n_out)
{
    if (!in && n_in > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_forward: NULL in");
    if (!out && n_out > 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_forward: NULL out");
    for (int i = 0; out && i < n_out; i++)
        out[i] = NULL;
    if (!m || !out || n_out < 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_forward: %s",
                                 !m         ? "NULL module"
                                     : !out ? "NULL out"
                                            : "n_out < 1");
    if (!m->forward)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "module %s has no forward function", m->type);
    if (m->forward(m, in, n_in, out, n_out) < 0) {
        for (int i = 0; i < n_out; i++)
            zd_tensor_unref_p(&out[i]);
        return zd_error_wrap("%s forward", m->type);
    }
    for (int i = 0; i < n_out; i++)
        if (!out[i]) {
            for (int j = 0; j < n_out; j++)
                zd_tensor_unref_p(&out[j]);
            return zd_error_set("%s forward gave no output %d (asked for %d)", m->type, i, n_out);
        }
    return 0;
}

int zd_nn_module_save(const zd_nn_module_t *m, const char *path)
{
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_save: NULL path");
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_save: NULL module");
    zd_named_tensors_t *sd = zd_nn_module_state_dict(m);
    int rc = sd ? zd_checkpoint_save(sd, path) : -1;
    zd_named_tensors_free(sd);
    return rc;
}

int zd_nn_module_load(zd_nn_module_t *m, const char *path)
{
    if (!path)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_load: NULL path");
    if (!m)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "zd_nn_module_load: NULL module");
    zd_named_tensors_t *sd = zd_nn_module_state_dict(m);
    int rc = sd ? zd_checkpoint_load(sd, path) : -1;
    zd_named_tensors_free(sd);
    return rc;
}

/*  ---- nn.Linear ---- */

typedef struct {
    zd_tensor_t *weight, *bias; /* borrowed from the module */
} linear_t;

static int linear_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                          int n_out)
{
    linear_t *l = zd_nn_module_state(m);
    if (n_in != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes 1 input, got %d", n_in);
    if (n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "gives 1 output, asked for %d", n_out);
    return zd_nn_linear(in[0], l->weight, l->bias, out);
}

zd_nn_module_t *zd_nn_linear_new(int64_t in_features, int64_t out_features, bool bias,
                                 zd_rng_t *rng)
{
    if (in_features <= 0 || out_features <= 0 || !rng) {
        zd_error_set_code(ZD_ERR_ARGUMENT, "Linear(%lld, %lld): %s", (long long)in_features,
                          (long long)out_features, rng ? "sizes must be positive" : "NULL rng");
        return NULL;
    }
    linear_t *l = calloc(1, sizeof *l);
    if (!l) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "Linear: out of memory");
        return NULL;
    }
    zd_nn_module_t *m = zd_nn_module_new("Linear", linear_forward, l, free);
    if (!m)
        return NULL;
    int64_t ws[2] = {out_features, in_features};
    l->weight = zd_nn_module_add_parameter(m, "weight", ws, 2);
    if (bias)
        l->bias = zd_nn_module_add_parameter(m, "bias", &out_features, 1);
    if (!l->weight || (bias && !l->bias) || zd_nn_init_default(l->weight, l->bias, rng) < 0) {
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

/*  ---- nn.Embedding ---- */

typedef struct {
    int64_t padding_idx;
    zd_tensor_t *weight; /* borrowed from the module */
} embedding_t;

static int embedding_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                             int n_out)
{
    embedding_t *e = zd_nn_module_state(m);
    if (n_in != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "takes 1 input, got %d", n_in);
    if (n_out != 1)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "gives 1 output, asked for %d", n_out);
    return zd_nn_embedding(in[0], e->weight, e->padding_idx, out);
}

zd_nn_module_t *zd_nn_embedding_new(int64_t num_embeddings, int64_t embedding_dim,
                                    int64_t padding_idx, uint64_t seed)
{
    if (num_embeddings <= 0 || embedding_dim <= 0 || padding_idx < ZD_NN_NO_PADDING ||
        padding_idx >= num_embeddings) {
        zd_error_set_code(ZD_ERR_ARGUMENT,
                          "Embedding(%lld, %lld, padding_idx %lld): sizes must "
                          "be positive, padding_idx -1 or a row",
                          (long long)num_embeddings, (long long)embedding_dim,
                          (long long)padding_idx);
        return NULL;
    }
    embedding_t *e = calloc(1, sizeof *e);
    if (!e) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "Embedding: out of memory");
        return NULL;
    }
    e->padding_idx = padding_idx;
    zd_nn_module_t *m = zd_nn_module_new("Embedding", embedding_forward, e, free);
    if (!m)
        return NULL;
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    e->weight =
        zd_nn_module_add_parameter(m, "weight", (int64_t[]){num_embeddings, embedding_dim}, 2);
    if (!e->weight || zd_nn_init_normal(e->weight, 0.0f, 1.0f, &rng) < 0) {
        zd_nn_module_free(m);
        return NULL;
    }
    /* PyTorch's reset_parameters: normal_, then the padding row filled with 0 */
    if (padding_idx != ZD_NN_NO_PADDING) {
        float *w = zd_tensor_data(e->weight);
        for (int64_t k = 0; k < embedding_dim; k++)
            w[padding_idx * embedding_dim + k] = 0.0f;
    }
    return m;
}
