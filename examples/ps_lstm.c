/* SPDX-License-Identifier: MIT */
/*  ps_lstm: rnn_rpc's language model (an embedding, an LSTM and a linear
    decoder over the characters of a text) trained by several trainers on
    sharded parameter servers, in push/pull asynchronous mode (<zdist/ps.h>).

        tools/launch --nproc=5 -- ps_lstm            # 2 shards, 3 trainers

    Ranks 0 .. shards-1 serve the model's parameters, split between them by
    size, each shard stepping its part with Adam; the other ranks are
    trainers, each with a replica: pull the parameters, a forward and a
    backward on its own stretch of the text, push the gradients. A push
    computed on parameters more than --max_staleness steps behind a shard
    is refused as stale: the trainer pulls and computes again. With
    --checkpoint the shards write checkpoints in generations; a shard
    killed and started again with --resume (the same rank) serves from its
    last one, while the trainers wait --server_wait_s for it. The layer
    was not written for this model: the model code below is plain nn. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "examples/corpus.h"
#include "examples/flags.h"
#include <zdist/zdist.h>

#define DEFAULT_TEXT "/usr/share/common-licenses/GPL-3"

/*  ---- the model and the text (rnn_rpc's, as one local module) ---- */

typedef struct {
    const char *data, *checkpoint;
    int64_t iterations, batch, bptt, ninp, nhid, nlayers, seed, shards, max_staleness;
    double lr;
    int64_t checkpoint_every, server_wait_s;
    bool resume;
} options_t;

/*  RNNModel: encoder (Embedding), rnn (LSTM), decoder (Linear), under
    PyTorch's word_language_model names. Seeded: every process builds the
    same initial weights. */
static zd_nn_module_t *model_new(const options_t *o, int64_t ntoken)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)o->seed);
    zd_nn_module_t *m = zd_nn_module_new("RNNModel", NULL, NULL, NULL);
    if (!m ||
        zd_nn_module_register_module(
            m, "encoder",
            zd_nn_embedding_new(ntoken, o->ninp, ZD_NN_NO_PADDING, (uint64_t)o->seed)) < 0 ||
        zd_nn_module_register_module(
            m, "rnn",
            zd_nn_lstm_new(o->ninp, o->nhid, (int)o->nlayers, 0, (uint64_t)o->seed + 10)) < 0 ||
        zd_nn_module_register_module(m, "decoder", zd_nn_linear_new(o->nhid, ntoken, true, &rng)) <
            0) {
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

/*  RNNModel.forward: logits (bptt * batch, ntoken) and the new hidden
    state, all handed to the caller's scope. */
static int model_forward(zd_nn_module_t *m, zd_tensor_t *x, zd_tensor_t *h, zd_tensor_t *c,
                         zd_tensor_t **logits, zd_tensor_t **h_n, zd_tensor_t **c_n)
{
    zd_tensor_t *emb, *out, *dec, *lstm_out[3];
    if (zd_nn_module_forward(zd_nn_module_child(m, "encoder"), &x, 1, &emb, 1) < 0 ||
        !zd_scope_add(emb) ||
        zd_nn_module_forward(zd_nn_module_child(m, "rnn"), (zd_tensor_t *[]){emb, h, c}, 3,
                             lstm_out, 3) < 0 ||
        !zd_scope_add(out = lstm_out[0]) || !zd_scope_add(*h_n = lstm_out[1]) ||
        !zd_scope_add(*c_n = lstm_out[2]) ||
        zd_nn_module_forward(zd_nn_module_child(m, "decoder"), &out, 1, &dec, 1) < 0 ||
        !zd_scope_add(dec))
        return -1;
    int64_t shape[2] = {zd_tensor_size(dec, 0) * zd_tensor_size(dec, 1), zd_tensor_size(dec, 2)};
    return zd_tensor_reshape(dec, shape, 2, logits) < 0 || !zd_scope_add(*logits) ? -1 : 0;
}

/*  ---- the parameter server ---- */

/*  A trainer's step between pull and push: the forward from the hidden
    state (h, c) and the backward; the loss and the new state wait in
    loss, h_n, c_n until the push is taken (a stale push computes again
    from the same state). */
typedef struct {
    zd_nn_module_t *m;
    zd_tensor_t *x, *y, *h, *c, *h_n, *c_n;
    double loss;
} step_t;

static int compute(void *arg)
{
    step_t *st = arg;
    zd_scope_t *s = zd_scope_begin();
    zd_tensor_t *logits, *hn, *cn, *loss;
    int rc = model_forward(st->m, st->x, st->h, st->c, &logits, &hn, &cn) == 0 &&
            zd_nn_cross_entropy(logits, st->y, &loss) == 0 && zd_scope_add(loss) &&
            zd_autograd_backward(loss, NULL, false) == 0
        ? 0
        : -1;
    if (rc == 0) {
        st->loss = zd_tensor_data(loss)[0];
        /* the next step starts from these values, without their history */
        zd_tensor_unref(st->h_n);
        zd_tensor_unref(st->c_n);
        st->h_n = zd_tensor_detach(hn);
        st->c_n = zd_tensor_detach(cn);
    }
    zd_scope_end(s);
    return rc;
}

static int run_trainer(const options_t *o, const zd_ps_options_t *po, zd_nn_module_t *m,
                       const corpus_t *text, int index, const char *me)
{
    zd_ps_client_t *ps = zd_ps_client_new_module(m, NULL, (int)o->shards, po); /* ranks 0.. */
    int64_t hs[3] = {o->nlayers, o->batch, o->nhid}, xs[2] = {o->bptt, o->batch},
            ys[1] = {o->bptt * o->batch};
    step_t st = {.m = m,
                 .x = zd_tensor_new(ZD_INT64, xs, 2),
                 .y = zd_tensor_new(ZD_INT64, ys, 1),
                 .h = zd_tensor_new(ZD_FLOAT32, hs, 3),
                 .c = zd_tensor_new(ZD_FLOAT32, hs, 3)};
    double first = 0, last = 0;
    int64_t done = 0;
    while (ps && st.h && st.c && st.x && st.y && done < o->iterations) {
        /* each trainer on its own stretch of the streams */
        corpus_batch(text, done + 997 * index, o->bptt, o->batch, st.x, st.y);
        if (zd_ps_client_step(ps, compute, &st, ZD_TIMEOUT_DEFAULT) < 0)
            break;
        zd_tensor_unref(st.h);
        zd_tensor_unref(st.c);
        st.h = st.h_n, st.c = st.c_n;
        st.h_n = st.c_n = NULL;
        first += done < 10 ? st.loss : 0;
        last += done >= o->iterations - 10 ? st.loss : 0;
        if (++done % 25 == 0)
            printf("%s: step %lld  loss %.4f\n", me, (long long)done, st.loss);
    }
    int status = done == o->iterations ? 0 : 1;
    if (status)
        fprintf(stderr, "ps_lstm: %s: step %lld: %s\n", me, (long long)done + 1, zd_error_last());
    else
        printf("%s: loss went from %.4f (mean of the first 10 steps) to %.4f (mean of the last "
               "10); %lld pushes refused as stale\n",
               me, first / 10, last / 10, (long long)zd_ps_client_stale_pushes(ps));
    zd_tensor_t *ts[] = {st.h, st.c, st.x, st.y, st.h_n, st.c_n};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        zd_tensor_unref(ts[i]);
    zd_ps_client_free(ps);
    return status;
}

int main(int argc, char **argv)
{
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* data, checkpoint, iterations, batch, bptt, ninp, nhid, nlayers, seed, shards,
       max_staleness, lr, checkpoint_every, server_wait_s, resume */
    options_t o = {DEFAULT_TEXT, NULL, 100, 16, 20, 32, 64, 1, 1, 2, 8, 0.005, 50, 0, false};
    flags_world_t w = flags_world_default();
    const flag_t flags[] = {
        {"data", FLAG_STRING, &o.data, "the text to model (default: base-files' GPL-3)"},
        {"iterations", FLAG_INT, &o.iterations, "training steps of each trainer"},
        {"batch", FLAG_INT, &o.batch, "character streams per step"},
        {"bptt", FLAG_INT, &o.bptt, "characters per stream and step"},
        {"ninp", FLAG_INT, &o.ninp, "embedding size"},
        {"nhid", FLAG_INT, &o.nhid, "LSTM hidden size"},
        {"nlayers", FLAG_INT, &o.nlayers, "LSTM layers"},
        {"lr", FLAG_DOUBLE, &o.lr, "Adam's learning rate, on the shards"},
        {"seed", FLAG_INT, &o.seed, "initial weights"},
        {"shards", FLAG_INT, &o.shards, "parameter server shards: ranks 0 .. shards-1"},
        {"max_staleness", FLAG_INT, &o.max_staleness, "versions a push may be behind (-1: any)"},
        {"checkpoint", FLAG_STRING, &o.checkpoint, "shards: checkpoints to PREFIX.shard<K>"},
        {"checkpoint_every", FLAG_INT, &o.checkpoint_every, "shards: steps between checkpoints"},
        {"resume", FLAG_BOOL, &o.resume, "shards: start from the last checkpoint, if any"},
        {"server_wait_s", FLAG_INT, &o.server_wait_s, "trainers: wait for a lost shard (0: no)"},
        FLAGS_WORLD(w),
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "An LSTM language model trained on sharded parameter servers.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (o.iterations < 10 || o.batch < 1 || o.bptt < 1 || o.ninp < 1 || o.nhid < 1 ||
        o.nlayers < 1 || o.lr <= 0 || o.shards < 1 || o.shards > 64 || o.checkpoint_every < 1 ||
        o.server_wait_s < 0 || (o.resume && !o.checkpoint)) {
        fprintf(stderr,
                "ps_lstm: --iterations >= 10; --shards from 1 to 64; the sizes, --lr and "
                "--checkpoint_every positive; --resume needs --checkpoint\n");
        return 2;
    }
    if (flags_world_resolve(&w, o.shards + 3, "ps_lstm") < 0)
        return 2;
    if (w.world_size <= o.shards) {
        fprintf(stderr, "ps_lstm: %lld shards leave no trainer in a world of %lld\n",
                (long long)o.shards, (long long)w.world_size);
        return 2;
    }
    corpus_t text;
    zd_nn_module_t *m = NULL;
    zd_ps_server_t *srv = NULL;
    bool shard = w.rank < o.shards;
    char name[32];
    snprintf(name, sizeof name, shard ? "ps%lld" : "trainer%lld",
             (long long)(shard ? w.rank : w.rank - o.shards));
    if (corpus_load(o.data, &text) < 0 || !(m = model_new(&o, text.ntoken))) {
        fprintf(stderr, "ps_lstm: %s: %s\n", name, zd_error_last());
        corpus_free(&text);
        return 1;
    }
    zd_optim_config_t adam = zd_optim_adam_defaults();
    adam.lr = o.lr;
    zd_ps_options_t po = zd_ps_options_default();
    po.max_staleness = o.max_staleness;
    po.checkpoint_path = o.checkpoint;
    po.checkpoint_every = o.checkpoint ? o.checkpoint_every : 0;
    po.resume = o.resume;
    po.server_wait_ms = o.server_wait_s > 0 ? o.server_wait_s * 1000 : ZD_TIMEOUT_DEFAULT;
    if (shard && !(srv = zd_ps_server_new_module(m, (int)w.rank, (int)o.shards, &adam, &po))) {
        fprintf(stderr, "ps_lstm: %s: %s\n", name, zd_error_last());
        return 1;
    }
    if (srv)
        printf("%s: starting at step %lld\n", name, (long long)zd_ps_server_version(srv));
    if (flags_world_init(&w, name, -1, "ps_lstm") < 0)
        return 1;
    printf("%s: %lld characters, %d distinct; a guess scores ln(%d) = %.3f\n", name,
           (long long)text.n, text.ntoken, text.ntoken, log(text.ntoken));
    /* A shard serves until every trainer is done: it waits without a limit. */
    int status = shard ? 0 : run_trainer(&o, &po, m, &text, (int)(w.rank - o.shards), name);
    if (zd_rpc_shutdown(true, shard ? ZD_TIMEOUT_NONE : ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, "ps_lstm: %s: shutdown: %s\n", name, zd_error_last());
        status = 1;
    }
    zd_ps_server_stats_t st;
    if (srv && zd_ps_server_stats(srv, &st, sizeof st) == 0)
        printf("%s: %lld steps taken; in this process %lld pushes taken, %lld refused as stale, "
               "%lld refused, %lld steps refused as diverged, %lld pulls\n",
               name, (long long)st.version, (long long)st.pushes, (long long)st.stale,
               (long long)st.refused, (long long)st.diverged, (long long)st.pulls);
    zd_ps_server_free(srv);
    zd_nn_module_free(m);
    corpus_free(&text);
    return status;
}
