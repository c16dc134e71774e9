/* SPDX-License-Identifier: MIT */
/*  ps_batch: PyTorch's tutorial "Implementing Batch RPC Processing Using
    Asynchronous Executions" on zdist, both of its parts.

        tools/launch --nproc=3 -- ps_batch --mode=ps    # a server, 2 trainers
        tools/launch --nproc=3 -- ps_batch --mode=rl    # an agent, 2 observers

    --mode=ps, the batch-updating parameter server: rank 0 holds the model;
    each trainer computes gradients on a batch and hands them over; the
    server steps its optimizer once, with their mean, when every trainer's
    have arrived, and only then answers them all with the new model. The
    push/pull parameter server in synchronous rounds (<zdist/ps.h>,
    ZD_PS_SYNC) is that pattern; its push is an async handler.

    --mode=rl, the batch-processing agent: observers step CartPole in
    lockstep and ask rank 0 for every action; the agent's async handler
    keeps each caller's future until the states of all observers are in,
    runs ONE policy forward on them all, and completes every future. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/zdist.h>

#include "examples/cartpole.h"
#include "examples/flags.h"

#define PROG   "ps_batch"
#define HIDDEN 128
/*  the tutorial's constants, but 16 x 16 images for its 64 x 64 (model_new) */
#define NUM_CLASSES 30
#define BATCH_SIZE  20
#define IMAGE_W     16
#define LR          0.001 /* SGD's, with momentum 0.9 */
#define GAMMA       0.99

typedef struct {
    const char *mode;
    int64_t seed, num_batches, episodes, steps;
} options_t;

/*  ==== part 1: the batch-updating parameter server (--mode=ps) ==== */

/*  The tutorial trains resnet50 on 3x64x64 images; here a small MLP on
    the flattened 3x16x16 image (768 -> 128 -> 30 classes):
    the pattern, not the model, is the point. Every process builds the
    same initial weights. */
static zd_nn_module_t *model_new(const options_t *o)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)o->seed);
    zd_nn_module_t *m = zd_nn_module_new("Net", NULL, NULL, NULL);
    if (!m ||
        zd_nn_module_register_module(
            m, "fc1", zd_nn_linear_new(3 * IMAGE_W * IMAGE_W, HIDDEN, true, &rng)) < 0 ||
        zd_nn_module_register_module(m, "fc2", zd_nn_linear_new(HIDDEN, NUM_CLASSES, true, &rng)) <
            0) {
        zd_nn_module_free(m);
        return NULL;
    }
    return m;
}

/*  MSELoss(m(x), labels), backward: the replica's .grad. The loss, or NAN. */
static double forward_backward(zd_nn_module_t *m, zd_tensor_t *x, zd_tensor_t *labels)
{
    double value = NAN;
    zd_scope_t *s = zd_scope_begin();
    zd_tensor_t *h, *r, *out, *loss;
    if (zd_nn_module_forward(zd_nn_module_child(m, "fc1"), &x, 1, &h, 1) == 0 && zd_scope_add(h) &&
        zd_nn_relu(h, &r) == 0 && zd_scope_add(r) &&
        zd_nn_module_forward(zd_nn_module_child(m, "fc2"), &r, 1, &out, 1) == 0 &&
        zd_scope_add(out) && zd_nn_mse_loss(out, labels, &loss) == 0 && zd_scope_add(loss) &&
        zd_autograd_backward(loss, NULL, false) == 0)
        value = zd_tensor_data(loss)[0];
    zd_scope_end(s);
    return value;
}

/*  Trainer.train: fetch the model, then for every batch a forward and a
    backward, and update_and_fetch_model: the push_pull returns when the
    round of all trainers is stepped, with the model it made. */
static int run_trainer(const options_t *o, zd_nn_module_t *m, const zd_ps_options_t *po, int index,
                       const char *me)
{
    const int ps_rank = 0;
    zd_ps_client_t *ps = zd_ps_client_new_module(m, &ps_rank, 1, po);
    zd_tensor_t *x = zd_tensor_zeros2(BATCH_SIZE, 3 * IMAGE_W * IMAGE_W);
    zd_tensor_t *labels = zd_tensor_zeros2(BATCH_SIZE, NUM_CLASSES);
    float *y = labels ? zd_tensor_data(labels) : NULL;
    zd_rng_t rng;
    zd_rng_seed(&rng, (uint64_t)o->seed * 1000 + (uint64_t)index + 1);
    int64_t done = 0;
    /* one_hot_indices: a fixed random class per row, as the tutorial's */
    for (int64_t i = 0; y && i < BATCH_SIZE; i++)
        y[i * NUM_CLASSES + (int64_t)zd_rng_below(&rng, NUM_CLASSES)] = 1;
    if (ps && x && labels && zd_ps_client_pull(ps, ZD_TIMEOUT_DEFAULT) == 0) {
        for (; done < o->num_batches; done++) {
            for (int64_t i = 0; i < zd_tensor_numel(x); i++)
                zd_tensor_data(x)[i] = zd_rng_normal(&rng, 0, 1);
            zd_nn_module_zero_grad(m);
            double loss = forward_backward(m, x, labels);
            /* the tutorial's update_and_fetch_model: answered when the
               round is stepped, with the new model */
            if (isnan(loss) || zd_ps_client_push_pull(ps, ZD_TIMEOUT_DEFAULT) < 0)
                break;
            printf("%s: batch %lld  loss %.4f  model version %lld\n", me, (long long)done + 1, loss,
                   (long long)zd_ps_client_version(ps, 0));
        }
    }
    int status = done == o->num_batches ? 0 : 1;
    if (status)
        fprintf(stderr, PROG ": %s: batch %lld: %s\n", me, (long long)done + 1, zd_error_last());
    else
        printf("%s: finished %lld batches\n", me, (long long)done);
    zd_tensor_unref(x);
    zd_tensor_unref(labels);
    zd_ps_client_free(ps);
    return status;
}

static int main_ps(const options_t *o, const flags_world_t *w)
{
    char me[32];
    snprintf(me, sizeof me, w->rank == 0 ? "ps" : "trainer%lld", (long long)w->rank);
    /* batch_update_size = the number of trainers */
    zd_ps_options_t po = zd_ps_options_default();
    po.mode = ZD_PS_SYNC;
    po.num_trainers = (int)w->world_size - 1;
    zd_optim_config_t sgd = zd_optim_sgd_defaults(LR);
    sgd.momentum = 0.9;
    zd_ps_server_t *srv = NULL;
    zd_nn_module_t *m = model_new(o);
    if (!m || (w->rank == 0 && !(srv = zd_ps_server_new_module(m, 0, 1, &sgd, &po)))) {
        fprintf(stderr, PROG ": %s: %s\n", me, zd_error_last());
        zd_nn_module_free(m);
        return 1;
    }
    if (flags_world_init(w, me, -1, PROG) < 0)
        return 1;
    int status = w->rank == 0 ? 0 : run_trainer(o, m, &po, (int)w->rank, me);
    /* The server serves until every trainer is done: it waits without a limit. */
    if (zd_rpc_shutdown(true, w->rank == 0 ? ZD_TIMEOUT_NONE : ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, PROG ": %s: shutdown: %s\n", me, zd_error_last());
        status = 1;
    }
    if (srv)
        printf("ps: %lld optimizer steps, one per round of %d trainers\n",
               (long long)zd_ps_server_version(srv), po.num_trainers);
    zd_ps_server_free(srv);
    zd_nn_module_free(m);
    return status;
}

/*  ==== part 2: the batch-processing agent (--mode=rl) ==== */

typedef struct {
    int64_t id; /* rank - 1: the row of its state in the agent's batch */
    cartpole_t env;
} observer_t;

/*  Observer(seed), created by the agent on this worker. */
static zd_value_t *observer_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t seed;
    observer_t *ob;
    if (ZD_UNPACK(args, &seed) < 0)
        return NULL;
    if (!(ob = calloc(1, sizeof *ob))) {
        zd_error_set("Observer: out of memory");
        return NULL;
    }
    ob->id = zd_rpc_rank() - 1;
    /* the tutorial seeds every environment alike; here each its own stream */
    cartpole_seed(&ob->env, (uint64_t)seed * 1000 + (uint64_t)zd_rpc_rank());
    return zd_value_object(ob, free, "Observer");
}

/*  Observer.run_episode(agent_rref, n_steps): exactly n_steps steps (a
    finished game starts again), each action asked of the agent; returns
    [the discounted returns (n_steps), the length of the first game]. */
static zd_value_t *observer_run_episode(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self, *reply = NULL;
    zd_rref_t *agent;
    int64_t n_steps, start = 0, action;
    void *obj;
    if (ZD_UNPACK(args, &self, &agent, &n_steps) < 0 ||
        zd_value_get_object(self, "Observer", &obj) < 0)
        return NULL;
    observer_t *ob = obj;
    zd_tensor_t *rewards = n_steps > 0 ? zd_tensor_zeros1(n_steps) : NULL;
    float state[CARTPOLE_OBS], *R = rewards ? zd_tensor_data(rewards) : NULL;
    double ep_reward = (double)n_steps;
    cartpole_reset(&ob->env, state);
    for (int64_t step = 0; R && step < n_steps; step++) {
        const int64_t shape[2] = {1, CARTPOLE_OBS};
        cartpole_step_t r;
        zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, shape, 2, state);
        int rc = x ? zd_rref_rpc_sync_take(agent, "Agent.select_action_batch", ZD_ARGS(ob->id, x),
                                           ZD_TIMEOUT_DEFAULT, &reply)
                   : -1;
        zd_tensor_unref(x); /* the arguments took a reference of their own */
        if (rc < 0 || zd_value_get_int(reply, &action) < 0 ||
            cartpole_step(&ob->env, action, state, &r) < 0) {
            zd_value_unref(reply);
            zd_tensor_unref(rewards);
            return NULL;
        }
        zd_value_unref(reply);
        R[step] = (float)r.reward;
        if (r.terminated || r.truncated || step + 1 == n_steps) {
            double ret = 0; /* returns of this game, discounted back to its start */
            for (int64_t i = step; i >= start; i--)
                R[i] = (float)(ret = R[i] + GAMMA * ret);
            ep_reward = start == 0 ? fmin(ep_reward, (double)(step + 1)) : ep_reward;
            start = step + 1;
            cartpole_reset(&ob->env, state);
        }
    }
    zd_value_t *v = R ? ZD_ARGS(rewards, ep_reward) : NULL;
    zd_tensor_unref(rewards);
    return v;
}

typedef struct {
    pthread_mutex_t lock;           /* everything below */
    zd_tensor_t *w1, *b1, *w2, *b2; /* Policy: Linear(4, 128), Dropout, ReLU, Linear(128, 2) */
    zd_optim_t *optimizer;
    zd_rng_t rng;            /* dropout and the actions drawn */
    int n_obs, pending;      /* observers; their states still missing this step */
    float *states;           /* (n_obs, 4): this step's */
    zd_future_t **answers;   /* [n_obs]: each caller's, completed with the batch */
    zd_tensor_t **log_probs; /* one (n_obs, 2) per step: log p(action), 0 elsewhere */
    int64_t *actions;        /* [n_obs]: the batch's */
    int64_t n_log_probs, cap, forwards, calls;
} agent_t;

/*  The batch's forward (under the lock): one for all observers, the
    actions drawn into a->actions, their log-probabilities kept. 0 or -1. */
static int agent_forward(agent_t *a)
{
    if (a->n_log_probs == a->cap)
        return zd_error_set("agent: more steps than the episode's %lld", (long long)a->cap);
    const int64_t shape[2] = {a->n_obs, CARTPOLE_OBS};
    zd_scope_t *s = zd_scope_begin();
    zd_tensor_t *x = zd_tensor_from_data(ZD_FLOAT32, shape, 2, a->states), *mask = NULL;
    zd_tensor_t *h, *d, *r, *scores, *logp, *chosen;
    int rc = -1;
    if (zd_scope_add(x) && zd_nn_linear(x, a->w1, a->b1, &h) == 0 && zd_scope_add(h) &&
        zd_nn_dropout(h, 0.6f, true, &a->rng, &d) == 0 && zd_scope_add(d) &&
        zd_nn_relu(d, &r) == 0 && zd_scope_add(r) && zd_nn_linear(r, a->w2, a->b2, &scores) == 0 &&
        zd_scope_add(scores) && zd_nn_log_softmax(scores, 1, &logp) == 0 && zd_scope_add(logp) &&
        zd_scope_add(mask = zd_tensor_zeros2(a->n_obs, CARTPOLE_ACTIONS))) {
        /* Categorical(probs).sample(), then log_prob(actions) as a mask */
        for (int i = 0; i < a->n_obs; i++) {
            double p0 = exp((double)zd_tensor_data(logp)[i * CARTPOLE_ACTIONS]);
            a->actions[i] = (double)zd_rng_uniform(&a->rng) < p0 ? 0 : 1;
            zd_tensor_data(mask)[i * CARTPOLE_ACTIONS + a->actions[i]] = 1;
        }
        if (zd_tensor_mul(logp, mask, &chosen) == 0) {
            a->log_probs[a->n_log_probs++] = chosen; /* the episode's, with history */
            a->forwards++;
            rc = 0;
        }
    }
    zd_scope_end(s);
    return rc;
}

/*  Agent.select_action_batch(agent, ob_id, state), an async handler: the
    caller's future waits for the batch; the last state in runs it. */
static zd_future_t *agent_select_action_batch(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self;
    zd_tensor_t *state;
    int64_t id;
    void *obj;
    if (ZD_UNPACK(args, &self, &id, &state) < 0 || zd_value_get_object(self, "Agent", &obj) < 0)
        return NULL;
    agent_t *a = obj;
    struct answer {
        zd_future_t *f;
        int64_t action;
    } *batch = NULL;
    zd_future_t *f;
    if (id < 0 || id >= a->n_obs || zd_tensor_dtype(state) != ZD_FLOAT32 ||
        zd_tensor_numel(state) != CARTPOLE_OBS) {
        zd_error_set("agent: observer id %lld or its state is bad", (long long)id);
        return NULL;
    }
    if (!(f = zd_future_new()))
        return NULL;
    pthread_mutex_lock(&a->lock);
    if (a->answers[id]) {
        pthread_mutex_unlock(&a->lock);
        zd_future_unref(f);
        zd_error_set("agent: observer %lld called twice in a step", (long long)id);
        return NULL;
    }
    memcpy(a->states + id * CARTPOLE_OBS, zd_tensor_data(state), sizeof(float) * CARTPOLE_OBS);
    a->answers[id] = zd_future_ref(f);
    a->calls++;
    int rc = 0;
    if (--a->pending == 0) {
        /* The batch is in: one forward for all. The answers leave once the
           lock is let go (completing a future sends its reply). */
        a->pending = a->n_obs;
        rc = (batch = malloc((size_t)a->n_obs * sizeof *batch)) ? agent_forward(a)
                                                                : zd_error_set("out of memory");
        for (int i = 0; i < a->n_obs; i++) {
            if (batch)
                batch[i] = (struct answer){a->answers[i], a->actions[i]};
            else /* nowhere to keep them: answered here */
                zd_future_set_error(a->answers[i], "agent: out of memory"),
                    zd_future_unref(a->answers[i]);
            a->answers[i] = NULL;
        }
    }
    pthread_mutex_unlock(&a->lock);
    char why[256];
    snprintf(why, sizeof why, "%s", rc < 0 ? zd_error_last() : "");
    for (int i = 0; batch && i < a->n_obs; i++) {
        zd_value_t *v = rc == 0 ? zd_value_int(batch[i].action) : NULL;
        if (v)
            zd_future_set_value(batch[i].f, v);
        else
            zd_future_set_error(batch[i].f, "agent: %s", rc < 0 ? why : "out of memory");
        zd_value_unref(v);
        zd_future_unref(batch[i].f);
    }
    free(batch);
    return f;
}

static void agent_free(agent_t *a)
{
    for (int64_t i = 0; i < a->n_log_probs; i++)
        zd_tensor_unref(a->log_probs[i]);
    free(a->log_probs);
    for (int i = 0; a->answers && i < a->n_obs; i++)
        zd_future_unref(a->answers[i]); /* a step left incomplete by a failure */
    free(a->answers);
    free(a->actions);
    free(a->states);
    zd_optim_free(a->optimizer);
    zd_tensor_unref(a->w1), zd_tensor_unref(a->b1), zd_tensor_unref(a->w2), zd_tensor_unref(a->b2);
    pthread_mutex_destroy(&a->lock);
}

static int agent_init(agent_t *a, const options_t *o, int n_obs)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    zd_rng_seed(&a->rng, (uint64_t)o->seed);
    a->n_obs = a->pending = n_obs;
    a->states = calloc((size_t)n_obs * CARTPOLE_OBS, sizeof *a->states);
    a->answers = calloc((size_t)n_obs, sizeof *a->answers);
    a->actions = calloc((size_t)n_obs, sizeof *a->actions);
    a->log_probs = calloc((size_t)(a->cap = o->steps), sizeof *a->log_probs);
    a->w1 = zd_tensor_zeros2(HIDDEN, CARTPOLE_OBS), a->b1 = zd_tensor_zeros1(HIDDEN);
    a->w2 = zd_tensor_zeros2(CARTPOLE_ACTIONS, HIDDEN), a->b2 = zd_tensor_zeros1(CARTPOLE_ACTIONS);
    zd_tensor_t *params[4] = {a->w1, a->b1, a->w2, a->b2};
    if (!a->states || !a->answers || !a->actions || !a->log_probs)
        return zd_error_set("agent: out of memory");
    if (!a->w1 || !a->b1 || !a->w2 || !a->b2 || zd_nn_init_default(a->w1, a->b1, &a->rng) < 0 ||
        zd_nn_init_default(a->w2, a->b2, &a->rng) < 0)
        return -1;
    for (int i = 0; i < 4; i++)
        if (zd_tensor_set_requires_grad(params[i], true) < 0)
            return -1;
    zd_optim_config_t adam = zd_optim_adam_defaults();
    adam.lr = 1e-2;
    return (a->optimizer = zd_optim_new(&adam, params, 4)) ? 0 : -1;
}

/*  Agent.run_episode: every observer plays n_steps at once; then the loss
    -sum(log_probs * returns) / n_obs, one Adam step. *ep_reward: the
    mean over observers of their first game's length. */
static int agent_run_episode(agent_t *a, zd_rref_t *self, zd_rref_t *const *obs, int64_t n_steps,
                             double *ep_reward)
{
    zd_future_t **futs = calloc((size_t)a->n_obs, sizeof *futs);
    zd_tensor_t *R = zd_tensor_zeros2(n_steps * a->n_obs, CARTPOLE_ACTIONS), *lp, *prod, *sum,
                *loss;
    int rc = futs && R ? 0 : zd_error_set("agent: out of memory");
    for (int i = 0; i < a->n_obs && rc == 0; i++)
        if (!(futs[i] = zd_rref_rpc_async_take(obs[i], "Observer.run_episode",
                                               ZD_ARGS(self, n_steps), ZD_TIMEOUT_DEFAULT)))
            rc = -1;
    if (rc == 0)
        rc = zd_future_wait_all(futs, a->n_obs, ZD_TIMEOUT_DEFAULT);
    *ep_reward = 0;
    for (int i = 0; i < a->n_obs && rc == 0; i++) {
        zd_tensor_t *rewards;
        double ep;
        if ((rc = ZD_UNPACK(zd_future_value(futs[i]), &rewards, &ep)) == 0 &&
            (zd_tensor_dtype(rewards) != ZD_FLOAT32 || zd_tensor_numel(rewards) != n_steps))
            rc = zd_error_set("agent: observer %d sent %lld rewards", i + 1,
                              (long long)zd_tensor_numel(rewards));
        /* rewards stacked (n_steps, n_obs) as log_probs are, in both columns */
        for (int64_t t = 0; rc == 0 && t < n_steps; t++)
            for (int k = 0; k < CARTPOLE_ACTIONS; k++)
                zd_tensor_data(R)[(t * a->n_obs + i) * CARTPOLE_ACTIONS + k] =
                    zd_tensor_data(rewards)[t];
        *ep_reward += ep / a->n_obs;
    }
    if (rc == 0 && a->n_log_probs != n_steps)
        rc = zd_error_set("agent: %lld forwards for %lld steps", (long long)a->n_log_probs,
                          (long long)n_steps);
    zd_scope_t *s = zd_scope_begin();
    if (rc == 0 &&
        (zd_tensor_cat(a->log_probs, (int)n_steps, 0, &lp) < 0 || !zd_scope_add(lp) ||
         zd_tensor_mul(lp, R, &prod) < 0 || !zd_scope_add(prod) || zd_tensor_sum(prod, &sum) < 0 ||
         !zd_scope_add(sum) || zd_tensor_scale(sum, -1.0f / (float)a->n_obs, &loss) < 0 ||
         !zd_scope_add(loss) || zd_autograd_backward(loss, NULL, false) < 0 ||
         zd_optim_step_grad(a->optimizer) < 0))
        rc = -1;
    zd_scope_end(s);
    zd_optim_zero_grad(a->optimizer, true);
    for (int64_t i = 0; i < a->n_log_probs; i++)
        zd_tensor_unref(a->log_probs[i]);
    a->n_log_probs = 0;
    for (int i = 0; futs && i < a->n_obs; i++)
        zd_future_unref(futs[i]);
    free(futs);
    zd_tensor_unref(R);
    return rc;
}

/*  The agent's run_worker: the observers made remote, the episodes. */
static int run_agent(const options_t *o, int n_obs)
{
    agent_t a;
    zd_rref_t *self = NULL, **obs = calloc((size_t)n_obs, sizeof *obs);
    int rc = agent_init(&a, o, n_obs);
    zd_value_t *v = rc == 0 ? zd_value_object(&a, NULL, "Agent") : NULL;
    if (rc == 0 && (!obs || !v || !(self = zd_rref_new(v))))
        rc = -1;
    zd_value_unref(v);
    for (int i = 0; i < n_obs && rc == 0; i++)
        if (!(obs[i] = zd_rpc_remote_take(i + 1, "Observer", ZD_ARGS(o->seed), ZD_TIMEOUT_DEFAULT)))
            rc = -1;
    double running = 0, last;
    for (int64_t e = 0; e < o->episodes && rc == 0; e++) {
        if ((rc = agent_run_episode(&a, self, obs, o->steps, &last)) == 0) {
            running = 0.5 * last + 0.5 * running;
            printf("Episode %lld\tLast reward: %.2f\tAverage reward: %.2f\n", (long long)e, last,
                   running);
        }
    }
    if (rc < 0)
        fprintf(stderr, PROG ": agent: %s\n", zd_error_last());
    else
        printf("agent: %lld policy forwards for %lld select_action calls of %d observers, "
               "%lld episodes of %lld steps\n",
               (long long)a.forwards, (long long)a.calls, n_obs, (long long)o->episodes,
               (long long)o->steps);
    for (int i = 0; obs && i < n_obs; i++)
        zd_rref_unref(obs[i]);
    free(obs);
    zd_rref_unref(self);
    /* the observers' releases of the agent's RRef may still be on their way */
    if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, PROG ": agent: shutdown: %s\n", zd_error_last());
        rc = -1;
    }
    agent_free(&a);
    return rc < 0 ? 1 : 0;
}

static int main_rl(const options_t *o, const flags_world_t *w)
{
    char me[32];
    snprintf(me, sizeof me, w->rank == 0 ? "agent" : "observer%lld", (long long)w->rank);
    if (zd_rpc_register("Observer", observer_new, NULL) < 0 ||
        zd_rpc_register("Observer.run_episode", observer_run_episode, NULL) < 0 ||
        zd_rpc_register_async("Agent.select_action_batch", agent_select_action_batch, NULL) < 0) {
        fprintf(stderr, PROG ": %s: %s\n", me, zd_error_last());
        return 1;
    }
    if (flags_world_init(w, me, -1, PROG) < 0)
        return 1;
    if (w->rank == 0)
        return run_agent(o, (int)w->world_size - 1);
    /* observers serve the agent's calls until it is done */
    if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, PROG ": %s: shutdown: %s\n", me, zd_error_last());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    options_t o = {.mode = "ps", .seed = 1, .num_batches = 6, .episodes = 10, .steps = 500};
    flags_world_t w = flags_world_default();
    const flag_t flags[] = {
        {"mode", FLAG_STRING, &o.mode,
         "ps (batch-updating parameter server) or rl (batching agent)"},
        {"seed", FLAG_INT, &o.seed, "initial weights, data, dropout, actions, environments"},
        {"num_batches", FLAG_INT, &o.num_batches, "ps: batches of each trainer"},
        {"episodes", FLAG_INT, &o.episodes, "rl: episodes"},
        {"steps", FLAG_INT, &o.steps, "rl: steps of every observer per episode (NUM_STEPS)"},
        FLAGS_WORLD(w),
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "Batch RPC processing with async handlers: a batch-updating parameter "
                         "server (--mode=ps) or a batching RL agent (--mode=rl).");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    bool ps = strcmp(o.mode, "ps") == 0;
    const char *bad = !ps && strcmp(o.mode, "rl") != 0 ? "--mode is ps or rl"
        : o.num_batches < 1                            ? "--num_batches must be at least 1"
        : o.episodes < 1                               ? "--episodes must be at least 1"
        : o.steps < 1                                  ? "--steps must be at least 1"
                                                       : NULL;
    if (bad) {
        fprintf(stderr, PROG ": %s (--mode=%s --num_batches=%lld --episodes=%lld --steps=%lld)\n",
                bad, o.mode, (long long)o.num_batches, (long long)o.episodes, (long long)o.steps);
        return 2;
    }
    if (flags_world_resolve(&w, 3, PROG) < 0)
        return 2;
    if (w.world_size < 2) {
        fprintf(stderr, PROG ": a world of 2 processes at least: rank 0 and a %s\n",
                ps ? "trainer" : "observer");
        return 2;
    }
    zd_nn_set_num_threads(1); /* several small processes on one machine */
    return ps ? main_ps(&o, &w) : main_rl(&o, &w);
}
