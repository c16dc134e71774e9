/* SPDX-License-Identifier: MIT */
/*  rnn_rpc: PyTorch's "Getting Started with Distributed RPC Framework",
    part 2 (a distributed RNN with RRefs, RemoteModule, distributed autograd
    and the DistributedOptimizer), on zdist.

        tools/launch --nproc=2 -- rnn_rpc

    Rank 0 is the parameter server "ps"; ranks 1.. are trainers. Each
    trainer builds the tutorial's RNNModel: its EmbeddingTable and Decoder
    are RemoteModules living on "ps", its LSTM is local. One step: indices go
    to the embedding on ps, the embeddings come back through the local LSTM,
    its output goes to the decoder on ps, and the logits come back for the
    loss; distributed autograd carries the gradients back over both hops,
    and one DistributedOptimizer steps the parameters where they live.

    The tutorial trains on uninitialised LongTensors, which teaches nothing.
    Here the task is a character-level language model of a text Debian
    always has: the GNU GPL version 3 from base-files
    (/usr/share/common-licenses/GPL-3; --data=FILE takes any text). ln(V)
    is the loss of a guess; the loss falls well below it within a few
    hundred steps.

    --save_model=FILE.safetensors has the first trainer write its model at
    the end, under the names PyTorch's state_dict() gives the tutorial's
    RNNModel written as one module (the word_language_model example's):
    encoder.weight, rnn.weight_ih_l0 ... rnn.bias_hh_l<n-1>, decoder.weight,
    decoder.bias; the embedding and decoder fetched from "ps". The metadata
    hold the sizes, the steps, the last loss and the vocabulary (token id
    -> byte). --init_from=FILE.safetensors starts every trainer from such
    a file (strictly: those tensors, their shapes): the trainer reads it
    and sends the embedding and decoder to "ps", which copies them into
    its modules. --iterations=0 only loads, samples and saves. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "examples/corpus.h"
#include "examples/flags.h"
#include "examples/train_common.h"
#include <zdist/zdist.h>

#define DEFAULT_TEXT "/usr/share/common-licenses/GPL-3"

typedef struct {
    const char *data;
    const char *save_model, *init_from; /* safetensors files, or NULL */
    int64_t iterations, batch, bptt, ninp, nhid, nlayers, seed, log_interval;
    double dropout, lr;
    const char *optimizer;
    bool sample;
} options_t;

/*  ---- the two modules that live on the parameter server ---- */

/*  What the EmbeddingTable and the Decoder keep beside their parameters:
    the dropout of their forward and its mask generator. */
typedef struct {
    float dropout;
    zd_rng_t rng;
} drop_state_t;

static drop_state_t *drop_state_new(double p, int64_t seed)
{
    drop_state_t *s = malloc(sizeof *s);
    if (!s)
        return NULL;
    s->dropout = (float)p;
    zd_rng_seed(&s->rng, (uint64_t)seed);
    return s;
}

/*  EmbeddingTable.forward: drop(encoder(input)). */
static int embedding_table_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in,
                                   zd_tensor_t **out, int n_out)
{
    if (n_in != 1 || n_out != 1)
        return zd_error_set("EmbeddingTable takes 1 input and gives 1 output");
    drop_state_t *s = zd_nn_module_state(m);
    zd_tensor_t *e;
    if (zd_nn_module_forward(zd_nn_module_child(m, "encoder"), in, 1, &e, 1) < 0)
        return -1;
    int rc = zd_nn_dropout(e, s->dropout, zd_nn_module_is_training(m), &s->rng, out);
    zd_tensor_unref(e);
    return rc;
}

/*  Decoder.forward: decoder(drop(output)). */
static int decoder_forward(zd_nn_module_t *m, zd_tensor_t *const *in, int n_in, zd_tensor_t **out,
                           int n_out)
{
    if (n_in != 1 || n_out != 1)
        return zd_error_set("Decoder takes 1 input and gives 1 output");
    drop_state_t *s = zd_nn_module_state(m);
    zd_tensor_t *d;
    if (zd_nn_dropout(in[0], s->dropout, zd_nn_module_is_training(m), &s->rng, &d) < 0)
        return -1;
    int rc = zd_nn_module_forward(zd_nn_module_child(m, "decoder"), &d, 1, out, 1);
    zd_tensor_unref(d);
    return rc;
}

/*  A parent module with its forward and dropout, and one child (the
    tutorial's self.encoder / self.decoder) whose weight is uniform in
    +-0.1 as the tutorial's init_weights draws it. */
static zd_nn_module_t *module_with_child(const char *type, zd_nn_module_forward_fn *forward,
                                         double dropout, int64_t seed, const char *child_name,
                                         zd_nn_module_t *child)
{
    drop_state_t *s = child ? drop_state_new(dropout, seed) : NULL;
    zd_nn_module_t *m = s ? zd_nn_module_new(type, forward, s, free) : NULL;
    if (!m) {
        free(s);
        zd_nn_module_free(child);
        return NULL;
    }
    if (zd_nn_module_register_module(m, child_name, child) < 0) {
        zd_nn_module_free(child);
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

/*  "EmbeddingTable"(ntoken, ninp, dropout, seed). */
static zd_nn_module_t *make_embedding_table(zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t ntoken, ninp, seed;
    double dropout;
    if (ZD_UNPACK(args, &ntoken, &ninp, &dropout, &seed) < 0)
        return NULL;
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)seed);
    zd_nn_module_t *enc = zd_nn_embedding_new(ntoken, ninp, ZD_NN_NO_PADDING, (uint64_t)seed);
    zd_tensor_t *w = enc ? zd_nn_module_find(enc, "weight") : NULL;
    if (!w || zd_nn_init_uniform(w, -0.1f, 0.1f, &rng) < 0) {
        zd_nn_module_free(enc);
        return NULL;
    }
    return module_with_child("EmbeddingTable", embedding_table_forward, dropout, seed + 1,
                             "encoder", enc);
}

/*  "Decoder"(ntoken, nhid, dropout, seed). */
static zd_nn_module_t *make_decoder(zd_value_t *args, void *arg)
{
    (void)arg;
    int64_t ntoken, nhid, seed;
    double dropout;
    if (ZD_UNPACK(args, &ntoken, &nhid, &dropout, &seed) < 0)
        return NULL;
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)seed);
    zd_nn_module_t *lin = zd_nn_linear_new(nhid, ntoken, true, &rng);
    if (!lin || zd_nn_init_uniform(zd_nn_module_find(lin, "weight"), -0.1f, 0.1f, &rng) < 0) {
        zd_nn_module_free(lin);
        return NULL;
    }
    zd_tensor_zero_(zd_nn_module_find(lin, "bias"));
    return module_with_child("Decoder", decoder_forward, dropout, seed + 1, "decoder", lin);
}

/*  ---- the trainer ---- */

typedef struct {
    zd_remote_module_t *emb, *dec;
    zd_nn_module_t *lstm;
} rnn_model_t;

static void model_free(rnn_model_t *m)
{
    zd_remote_module_free(m->emb);
    zd_remote_module_free(m->dec);
    zd_nn_module_free(m->lstm);
}

static int model_new(const options_t *o, int ntoken, int ps, rnn_model_t *m)
{
    memset(m, 0, sizeof *m);
    m->emb = zd_remote_module_new(ps, "EmbeddingTable",
                                  ZD_ARGS((int64_t)ntoken, o->ninp, o->dropout, o->seed));
    m->lstm = m->emb ? zd_nn_lstm_new(o->ninp, o->nhid, (int)o->nlayers, (float)o->dropout,
                                      (uint64_t)o->seed + 10)
                     : NULL;
    m->dec = m->lstm
        ? zd_remote_module_new(ps, "Decoder",
                               ZD_ARGS((int64_t)ntoken, o->nhid, o->dropout, o->seed + 20))
        : NULL;
    if (!m->dec) {
        model_free(m);
        return -1;
    }
    return 0;
}

/*  The tutorial's RNNModel.parameter_rrefs(): the embedding's (remote),
    the LSTM's (local, wrapped in local RRefs), the decoder's (remote), in
    one list. A new list, or NULL. */
static zd_rref_list_t *model_parameter_rrefs(rnn_model_t *m)
{
    zd_rref_list_t *all = zd_rref_list_new();
    zd_rref_list_t *e = zd_remote_module_remote_parameters(m->emb);
    zd_rref_list_t *l = zd_dist_nn_parameter_rrefs(m->lstm);
    zd_rref_list_t *d = zd_remote_module_remote_parameters(m->dec);
    if (!all || !e || !l || !d || zd_rref_list_extend(all, e) < 0 ||
        zd_rref_list_extend(all, l) < 0 || zd_rref_list_extend(all, d) < 0) {
        zd_rref_list_free(all);
        all = NULL;
    }
    zd_rref_list_free(e);
    zd_rref_list_free(l);
    zd_rref_list_free(d);
    return all;
}

/*  RNNModel.forward: logits (bptt * batch, ntoken) and the new hidden
    state, all handed to the caller's scope. */
static int model_forward(rnn_model_t *m, zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *c,
                         zd_tensor_t **logits, zd_tensor_t **h_n, zd_tensor_t **c_n)
{
    zd_tensor_t *emb, *out, *dec, *flat, *lstm_out[3];
    if (zd_remote_module_forward(m->emb, &x, 1, &emb, 1) < 0 || !zd_scope_add(emb) ||
        zd_nn_module_forward(m->lstm, (zd_tensor_t *[]){emb, h, c}, 3, lstm_out, 3) < 0 ||
        !zd_scope_add(out = lstm_out[0]) || !zd_scope_add(*h_n = lstm_out[1]) ||
        !zd_scope_add(*c_n = lstm_out[2]) ||
        zd_remote_module_forward(m->dec, &out, 1, &dec, 1) < 0 || !zd_scope_add(dec))
        return -1;
    int64_t shape[2] = {zd_tensor_size(dec, 0) * zd_tensor_size(dec, 1), zd_tensor_size(dec, 2)};
    if (zd_tensor_reshape(dec, shape, 2, &flat) < 0 || !zd_scope_add(flat))
        return -1;
    *logits = flat;
    return 0;
}

/*  The model writes: n characters after a prompt, each drawn from its
    softmax (evaluation mode, no gradients). */
static int model_sample(rnn_model_t *m, const options_t *o, const corpus_t *c, int ps_rank, int n,
                        char *text)
{
    (void)ps_rank;
    zd_nn_module_train(m->lstm, false);
    bool grad = zd_autograd_set_grad_enabled(false);
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)o->seed + 99);
    int rc = -1;
    zd_scope_t *s = zd_scope_begin();
    int64_t hs[3] = {o->nlayers, 1, o->nhid}, xs[2] = {1, 1};
    zd_tensor_t *h = zd_scope_add(zd_tensor_new(ZD_FLOAT32, hs, 3));
    zd_tensor_t *cc = zd_scope_add(zd_tensor_new(ZD_FLOAT32, hs, 3));
    if (!h || !cc)
        goto out;
    int64_t tok = c->tokens[0];
    for (int i = 0; i < n; i++) {
        zd_tensor_t *x = zd_scope_add(zd_tensor_from_data(ZD_INT64, xs, 2, &tok)), *logits, *hn,
                    *cn, *p;
        if (!x || model_forward(m, x, h, cc, &logits, &hn, &cn) < 0 ||
            zd_nn_softmax(logits, 1, &p) < 0 || !zd_scope_add(p))
            goto out;
        float u = zd_rng_uniform(&rng), acc = 0;
        int64_t pick = c->ntoken - 1;
        for (int64_t k = 0; k < c->ntoken; k++)
            if ((acc += zd_tensor_data(p)[k]) > u) {
                pick = k;
                break;
            }
        text[i] = (char)c->chars[pick];
        tok = pick;
        h = hn;
        cc = cn;
    }
    text[n] = '\0';
    rc = 0;
out:
    zd_scope_end(s);
    zd_autograd_set_grad_enabled(grad);
    zd_nn_module_train(m->lstm, true);
    return rc;
}

/*  ---- weights in and out: --save_model, --init_from ---- */

/*  The remote modules' parameters under PyTorch's names, in their
    zd_nn_module_param order (the module's own child "encoder" / "decoder"). */
static const char *const emb_names[] = {"encoder.weight"};
static const char *const dec_names[] = {"decoder.weight", "decoder.bias"};

/*  rnn_copy_(param, src), called through a parameter's RRef on its owner
    (param is the parameter itself there): copies src into it. src comes
    from a peer, so its dtype and shape must be the parameter's. */
static zd_value_t *fn_copy_param(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_tensor_t *param, *src;
    if (ZD_UNPACK(args, &param, &src) < 0)
        return NULL;
    if (zd_tensor_dtype(src) != zd_tensor_dtype(param) || !zd_tensor_same_shape(src, param)) {
        char a[96], b[96];
        zd_error_set("rnn_copy_: a tensor of shape %s for a parameter of shape %s",
                     zd_tensor_shape_str(src, a, sizeof a),
                     zd_tensor_shape_str(param, b, sizeof b));
        return NULL;
    }
    return zd_tensor_copy_(param, src) < 0 ? NULL : zd_value_none();
}

/*  rm's parameter RRefs, which must be n: a new list, or NULL. */
static zd_rref_list_t *remote_params(zd_remote_module_t *rm, int n)
{
    zd_rref_list_t *l = zd_remote_module_remote_parameters(rm);
    if (l && zd_rref_list_len(l) != n) {
        zd_error_set("the remote module has %d parameters, expected %d", zd_rref_list_len(l), n);
        zd_rref_list_free(l);
        return NULL;
    }
    return l;
}

/*  Adds copies of rm's n parameters, fetched from its owner, to nt under
    names. 0, or -1. */
static int add_remote(zd_named_tensors_t *nt, zd_remote_module_t *rm, const char *const *names,
                      int n)
{
    zd_rref_list_t *l = remote_params(rm, n);
    if (!l)
        return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        zd_value_t *v = NULL;
        zd_tensor_t *t;
        rc = zd_rref_to_here(zd_rref_list_get(l, i), ZD_TIMEOUT_DEFAULT, &v);
        if (rc == 0)
            rc = zd_value_get_tensor(v, &t);
        if (rc == 0)
            rc = zd_named_tensors_add(nt, names[i], t);
        zd_value_unref(v);
    }
    zd_rref_list_free(l);
    return rc;
}

/*  Sends nt's tensors called names into rm's parameters on its owner. */
static int push_remote(const zd_named_tensors_t *nt, zd_remote_module_t *rm,
                       const char *const *names, int n)
{
    zd_rref_list_t *l = remote_params(rm, n);
    if (!l)
        return -1;
    int rc = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        zd_value_t *r = NULL;
        rc = zd_rref_rpc_sync_take(zd_rref_list_get(l, i), "rnn_copy_",
                                   ZD_ARGS(zd_named_tensors_find(nt, names[i])), ZD_TIMEOUT_DEFAULT,
                                   &r);
        zd_value_unref(r);
    }
    zd_rref_list_free(l);
    return rc;
}

/*  The whole model under the names of PyTorch's state_dict() for the
    RNNModel as one module: the embedding's and decoder's tensors are
    copies fetched from their owner, the LSTM's its own. A new list, or
    NULL. */
static zd_named_tensors_t *model_state_dict(rnn_model_t *m)
{
    zd_named_tensors_t *nt = zd_named_tensors_new();
    int rc = nt ? add_remote(nt, m->emb, emb_names, 1) : -1;
    for (int i = 0; rc == 0 && i < zd_nn_module_n_params(m->lstm); i++) {
        char name[128];
        snprintf(name, sizeof name, "rnn.%s", zd_nn_module_param_name(m->lstm, i));
        rc = zd_named_tensors_add(nt, name, zd_nn_module_param(m->lstm, i));
    }
    if (rc == 0)
        rc = add_remote(nt, m->dec, dec_names, 2);
    if (rc < 0) { /* the error is set (zd_named_tensors_new's too) */
        zd_named_tensors_free(nt);
        return NULL;
    }
    return nt;
}

/*  --init_from: the file checked whole against the model (strictly) and
    copied into it; the embedding and decoder then go to their owner. */
static int model_load(rnn_model_t *m, const char *path)
{
    zd_named_tensors_t *nt = model_state_dict(m);
    int rc = nt ? zd_safetensors_load(nt, path, true, NULL) : -1;
    if (rc == 0)
        rc = push_remote(nt, m->emb, emb_names, 1);
    if (rc == 0)
        rc = push_remote(nt, m->dec, dec_names, 2);
    zd_named_tensors_free(nt);
    return rc;
}

/*  --save_model: the model with what it takes to use it in metadata: the
    sizes, the steps and last loss, the vocabulary as a JSON list of the
    bytes of token ids 0, 1, ... */
static int model_save(rnn_model_t *m, const options_t *o, const corpus_t *c, int64_t steps,
                      double loss)
{
    char ntoken[24], ninp[24], nhid[24], nlayers[24], step[24], sloss[32], vocab[1100];
    snprintf(ntoken, sizeof ntoken, "%d", c->ntoken);
    snprintf(ninp, sizeof ninp, "%lld", (long long)o->ninp);
    snprintf(nhid, sizeof nhid, "%lld", (long long)o->nhid);
    snprintf(nlayers, sizeof nlayers, "%lld", (long long)o->nlayers);
    snprintf(step, sizeof step, "%lld", (long long)steps);
    snprintf(sloss, sizeof sloss, "%.6f", loss);
    size_t at = 0;
    vocab[at++] = '[';
    for (int k = 0; k < c->ntoken; k++)
        at += (size_t)snprintf(vocab + at, sizeof vocab - at, "%s%d", k ? "," : "", c->chars[k]);
    snprintf(vocab + at, sizeof vocab - at, "]");
    const char *meta[] = {
        "format", "pt",      "model", "RNNModel(LSTM)", "ntoken", ntoken, "ninp", ninp,   "nhid",
        nhid,     "nlayers", nlayers, "vocab",          vocab,    "step", step,   "loss", sloss};
    zd_strings_t *kv = zd_strings_from(meta, steps > 0 ? 18 : 14);
    zd_named_tensors_t *nt = kv ? model_state_dict(m) : NULL;
    int rc = nt ? zd_safetensors_write(nt, o->save_model, kv) : -1;
    zd_named_tensors_free(nt);
    zd_strings_free(kv);
    return rc;
}

static int run_trainer(options_t o_in, int rank, const char *me)
{
    /* each trainer its own initial weights and dropout masks */
    options_t opts = o_in;
    opts.seed += 1000 * (rank - 1);
    const options_t *o = &opts;
    corpus_t c;
    if (corpus_load(o->data, &c) < 0) {
        fprintf(stderr, "rnn_rpc: %s: %s\n", me, zd_error_last());
        return 1;
    }
    if ((c.n - 1) / o->batch < o->bptt) {
        fprintf(stderr, "rnn_rpc: %s: %lld streams of %lld characters do not fit in %lld\n", me,
                (long long)o->batch, (long long)o->bptt, (long long)c.n);
        corpus_free(&c);
        return 1;
    }
    int ps = zd_rpc_worker("ps");
    rnn_model_t m;
    zd_rref_list_t *params = NULL;
    zd_dist_optim_t *opt = NULL;
    zd_optim_config_t cfg;
    if (strcmp(o->optimizer, "sgd") == 0) {
        cfg = zd_optim_sgd_defaults(o->lr);
    } else {
        cfg = zd_optim_adam_defaults();
        cfg.lr = o->lr;
    }
    int status = 1;
    if (model_new(o, c.ntoken, ps, &m) < 0) {
        fprintf(stderr, "rnn_rpc: %s: building the model: %s\n", me, zd_error_last());
        corpus_free(&c);
        return 1;
    }
    if (o->init_from) {
        if (model_load(&m, o->init_from) < 0) {
            fprintf(stderr, "rnn_rpc: %s: --init_from=%s: %s\n", me, o->init_from, zd_error_last());
            goto out;
        }
        printf("%s: initial weights from %s\n", me, o->init_from);
    }
    if (!(params = model_parameter_rrefs(&m)) || !(opt = zd_dist_optim_new(&cfg, params))) {
        fprintf(stderr, "rnn_rpc: %s: %s\n", me, zd_error_last());
        goto out;
    }
    printf("%s: %lld characters of %s, %d distinct; %d parameter tensors on %d owners; "
           "%s lr %g\n",
           me, (long long)c.n, o->data, c.ntoken, zd_rref_list_len(params),
           zd_dist_optim_num_owners(opt), o->optimizer, o->lr);
    printf("%s: a guess scores ln(%d) = %.3f\n", me, c.ntoken, log((double)c.ntoken));
    fflush(stdout);

    int64_t hs[3] = {o->nlayers, o->batch, o->nhid}, xs[2] = {o->bptt, o->batch},
            ys[1] = {o->bptt * o->batch};
    zd_tensor_t *h = zd_tensor_new(ZD_FLOAT32, hs, 3), *cc = zd_tensor_new(ZD_FLOAT32, hs, 3);
    zd_tensor_t *x = zd_tensor_new(ZD_INT64, xs, 2), *y = zd_tensor_new(ZD_INT64, ys, 1);
    double first = 0, recent = 0, last_loss = NAN;
    int64_t n_first = 0, n_recent = 0, done = 0;
    double t0 = train_now();
    for (int64_t it = 0; h && cc && x && y && it < o->iterations; it++) {
        corpus_batch(&c, it, o->bptt, o->batch, x, y);
        double loss_value = NAN;
        zd_tensor_t *h_next = NULL, *c_next = NULL;
        ZD_DIST_AUTOGRAD_CONTEXT(ctx)
        {
            zd_scope_t *s = zd_scope_begin();
            zd_tensor_t *logits, *hn, *cn, *loss;
            if (model_forward(&m, x, h, cc, &logits, &hn, &cn) == 0 &&
                zd_nn_cross_entropy(logits, y, &loss) == 0 && zd_scope_add(loss) &&
                zd_dist_autograd_backward(ctx, &loss, 1, false) == 0 &&
                zd_dist_optim_step(opt, ctx) == 0) {
                loss_value = zd_tensor_data(loss)[0];
                /* the tutorial's hidden[k].detach_(): the next step starts
                   from these values, without their history */
                h_next = zd_tensor_detach(hn);
                c_next = zd_tensor_detach(cn);
            }
            zd_scope_end(s);
        }
        if (!h_next || !c_next) {
            fprintf(stderr, "rnn_rpc: %s: step %lld: %s\n", me, (long long)it + 1, zd_error_last());
            zd_tensor_unref(h_next);
            zd_tensor_unref(c_next);
            goto steps_done;
        }
        zd_tensor_unref(h);
        zd_tensor_unref(cc);
        h = h_next;
        cc = c_next;
        done++;
        last_loss = loss_value;
        if (it < 10) {
            first += loss_value;
            n_first++;
        }
        recent += loss_value;
        n_recent++;
        if ((it + 1) % o->log_interval == 0 || it + 1 == o->iterations) {
            double dt = train_now() - t0;
            printf("%s: step %5lld/%lld  loss %.4f  (mean of last %lld: %.4f)  %.1f ms/step\n", me,
                   (long long)it + 1, (long long)o->iterations, loss_value, (long long)n_recent,
                   recent / (double)n_recent, 1e3 * dt / (double)(it + 1));
            fflush(stdout);
            if (it + 1 < o->iterations) {
                recent = 0;
                n_recent = 0;
            }
        }
    }
    if (n_recent > 0) {
        printf("%s: loss went from %.4f (mean of the first %lld steps) to %.4f (mean of the "
               "last %lld)\n",
               me, first / (double)n_first, (long long)n_first, recent / (double)n_recent,
               (long long)n_recent);
    }
    if (h && cc && x && y && done == o->iterations)
        status = 0;
    /* the first trainer's model: each trainer has its own */
    if (status == 0 && o->save_model && rank == 1) {
        if (model_save(&m, o, &c, done, last_loss) < 0) {
            fprintf(stderr, "rnn_rpc: %s: --save_model=%s: %s\n", me, o->save_model,
                    zd_error_last());
            status = 1;
        } else {
            printf("%s: saved model %s (safetensors, PyTorch's names)\n", me, o->save_model);
        }
    }
    if (status == 0 && o->sample) {
        char text[121];
        if (model_sample(&m, o, &c, ps, 120, text) < 0) {
            fprintf(stderr, "rnn_rpc: %s: sampling: %s\n", me, zd_error_last());
            status = 1;
        } else {
            for (char *p = text; *p; p++)
                if (*p == '\n')
                    *p = ' ';
            printf("%s: the model writes: \"%s\"\n", me, text);
        }
    }
steps_done:
    zd_tensor_unref(h);
    zd_tensor_unref(cc);
    zd_tensor_unref(x);
    zd_tensor_unref(y);
out:
    zd_dist_optim_free(opt);
    zd_rref_list_free(params);
    model_free(&m);
    corpus_free(&c);
    return status;
}

int main(int argc, char **argv)
{
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    /* Line by line even into a pipe (the launcher labels lines as they come). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *prog = "rnn_rpc";
    options_t o = {
        .data = DEFAULT_TEXT,
        .iterations = 300,
        .batch = 16,
        .bptt = 35,
        .ninp = 32,
        .nhid = 128,
        .nlayers = 2,
        .seed = 1,
        .log_interval = 25,
        .dropout = 0.2,
        .lr = 0.005,
        .optimizer = "adam",
        .sample = true,
    };
    flags_world_t w = flags_world_default();
    const flag_t flags[] = {
        {"data", FLAG_STRING, &o.data, "the text to model (default: base-files' GPL-3)"},
        {"iterations", FLAG_INT, &o.iterations, "training steps of each trainer (0: none)"},
        {"batch", FLAG_INT, &o.batch, "character streams per step"},
        {"bptt", FLAG_INT, &o.bptt, "characters per stream and step"},
        {"ninp", FLAG_INT, &o.ninp, "embedding size"},
        {"nhid", FLAG_INT, &o.nhid, "LSTM hidden size"},
        {"nlayers", FLAG_INT, &o.nlayers, "LSTM layers"},
        {"dropout", FLAG_DOUBLE, &o.dropout,
         "dropout of the embedding, between the LSTM's "
         "layers and before the decoder"},
        {"optimizer", FLAG_STRING, &o.optimizer, "adam, or sgd (the tutorial's, at lr 0.05)"},
        {"lr", FLAG_DOUBLE, &o.lr, "learning rate"},
        {"seed", FLAG_INT, &o.seed, "initial weights and dropout masks"},
        {"log_interval", FLAG_INT, &o.log_interval, "print the loss every N steps"},
        {"sample", FLAG_BOOL, &o.sample, "let the trained model write a line"},
        {"save_model", FLAG_STRING, &o.save_model,
         "at the end the first trainer writes its model to this safetensors file under the "
         "names of PyTorch's state_dict() (encoder.weight, rnn.weight_ih_l0, ..., "
         "decoder.bias), with the sizes and vocabulary in the metadata"},
        {"init_from", FLAG_STRING, &o.init_from,
         "every trainer starts from the model in this safetensors file (those names, e.g. "
         "saved by --save_model or by PyTorch) instead of the seed's weights"},
        FLAGS_WORLD(w),
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "Distributed RNN: embedding and decoder on a parameter server, "
                         "LSTM on the trainers.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (o.iterations < 0 || o.batch < 1 || o.bptt < 1 || o.ninp < 1 || o.nhid < 1 ||
        o.nlayers < 1 || o.log_interval < 1 || o.lr <= 0 || o.dropout < 0 || o.dropout >= 1 ||
        (strcmp(o.optimizer, "adam") != 0 && strcmp(o.optimizer, "sgd") != 0)) {
        fprintf(stderr,
                "%s: --batch, --bptt, --ninp, --nhid, --nlayers, --log_interval and "
                "--lr must be positive, --iterations >= 0, --dropout in [0, 1), "
                "--optimizer adam or sgd\n",
                prog);
        return 2;
    }
    if ((o.save_model && !o.save_model[0]) || (o.init_from && !o.init_from[0])) {
        fprintf(stderr, "%s: --save_model and --init_from take a file name\n", prog);
        return 2;
    }
    if (flags_world_resolve(&w, 2, prog) < 0)
        return 2;
    if (w.world_size < 2) {
        fprintf(stderr, "%s: needs a world of 2 processes at least (a ps and a trainer)\n", prog);
        return 2;
    }
    /* Refused now rather than after the training: a file the first
       trainer cannot write, one a trainer cannot read. */
    if (o.save_model && w.rank == 1) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o.save_model);
        char *slash = strrchr(dir, '/');
        if (slash)
            slash[slash == dir ? 1 : 0] = 0;
        if (access(slash ? dir : ".", W_OK) < 0) {
            fprintf(stderr, "%s: --save_model=%s: cannot write in %s (%s)\n", prog, o.save_model,
                    slash ? dir : ".", strerror(errno));
            return 2;
        }
    }
    if (o.init_from && w.rank >= 1 && access(o.init_from, R_OK) < 0) {
        fprintf(stderr, "%s: --init_from=%s: %s\n", prog, o.init_from, strerror(errno));
        return 2;
    }
    char name[32];
    if (w.rank == 0)
        snprintf(name, sizeof name, "ps");
    else
        snprintf(name, sizeof name, "trainer%lld", (long long)w.rank);
    if (zd_dist_autograd_init() < 0 || zd_dist_optim_init() < 0 || zd_dist_nn_init() < 0 ||
        zd_dist_nn_register_module("EmbeddingTable", make_embedding_table, NULL) < 0 ||
        zd_dist_nn_register_module("Decoder", make_decoder, NULL) < 0 ||
        zd_rpc_register("rnn_copy_", fn_copy_param, NULL) < 0) {
        fprintf(stderr, "%s: %s\n", prog, zd_error_last());
        return 1;
    }
    if (flags_world_init(&w, name, -1, prog) < 0)
        return 1;
    /* the parameter server does nothing of its own: it serves the modules
       until every trainer is done, so it waits without a time limit */
    int status = w.rank == 0 ? 0 : run_trainer(o, (int)w.rank, name);
    if (zd_rpc_shutdown(true, w.rank == 0 ? ZD_TIMEOUT_NONE : ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, "%s: %s: shutdown: %s\n", prog, name, zd_error_last());
        status = 1;
    }
    return status;
}
