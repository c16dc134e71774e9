/* SPDX-License-Identifier: MIT */
/*  rl_rpc: distributed reinforcement learning with RPC and RRefs, the first
    part of PyTorch's "Getting Started with Distributed RPC Framework"
    (pytorch/examples distributed/rpc/rl) on zdist.

        tools/launch --nproc=3 -- rl_rpc [--seed=543] [--max_episodes=N] [--max_seconds=S]

    Rank 0 is the agent: it holds the policy network and learns with
    REINFORCE. Ranks 1..world_size-1 are observers, each with its own
    CartPole-v1 environment (examples/cartpole.h). For every episode the
    agent starts "Observer.run_episode" on all observers at once
    (zd_rref_rpc_async), handing each an RRef to itself; each observer steps
    its environment and calls back through that RRef to choose every action
    ("Agent.select_action") and to report every reward
    ("Agent.report_reward"). When all observers are done, the agent updates
    the policy from the log-probabilities and rewards it recorded. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/zdist.h>

#include "examples/cartpole.h"
#include "examples/flags.h"

#define PROG          "rl_rpc"
#define HIDDEN        128
#define DROPOUT       0.6f
#define RUNNING_ALPHA 0.05 /* running reward = 0.05 episode + 0.95 running */

typedef struct {
    int64_t seed;
    double gamma;
    double lr;
    int64_t log_interval;
    int64_t max_episodes;
    int64_t total_episode_steps; /* shared among the observers, as TOTAL_EPISODE_STEP */
    double max_seconds;
} options_t;

/*  ==== the observer: ranks 1.. ==== */

typedef struct {
    int64_t id; /* this worker's rank, as rpc.get_worker_info().id */
    cartpole_t env;
} observer_t;

/*  "Observer"(seed): an observer with its own environment, kept on this
    worker (the agent creates it with zd_rpc_remote). */
static zd_value_t *observer_new(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    int64_t seed;
    if (ZD_UNPACK(args, &seed) < 0)
        return NULL;
    observer_t *ob = calloc(1, sizeof *ob);
    if (!ob) {
        zd_error_set("Observer: out of memory");
        return NULL;
    }
    ob->id = zd_rpc_rank();
    /* The tutorial seeds every observer's environment with the same seed;
       here each gets a stream of its own, so that their episodes differ. */
    cartpole_seed(&ob->env, (uint64_t)seed * 1000 + (uint64_t)ob->id);
    return zd_value_object(ob, free, "Observer");
}

/*  agent.select_action(id, state) through the agent's RRef: the action. */
static int remote_select_action(zd_rref_t *agent, int64_t id, const float obs[CARTPOLE_OBS],
                                int64_t *action)
{
    const int64_t shape[2] = {1, CARTPOLE_OBS};
    zd_tensor_t *state = zd_tensor_from_data(ZD_FLOAT32, shape, 2, obs);
    zd_value_t *reply = NULL;
    int rc = state ? zd_rref_rpc_sync_take(agent, "Agent.select_action", ZD_ARGS(id, state),
                                           ZD_TIMEOUT_DEFAULT, &reply)
                   : -1;
    zd_tensor_unref(state); /* the list took its own reference */
    if (rc == 0)
        rc = zd_value_get_int(reply, action);
    zd_value_unref(reply);
    return rc;
}

/*  "Observer.run_episode"(observer, agent_rref, n_steps): one episode of at
    most n_steps, each action chosen by the agent, each reward reported to
    it. Returns the number of steps run. */
static zd_value_t *observer_run_episode(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self;
    zd_rref_t *agent;
    int64_t n_steps, step = 0;
    void *obj;
    if (ZD_UNPACK(args, &self, &agent, &n_steps) < 0 ||
        zd_value_get_object(self, "Observer", &obj) < 0)
        return NULL;
    observer_t *ob = obj; /* the agent runs one episode at a time per observer */
    float state[CARTPOLE_OBS];
    cartpole_reset(&ob->env, state);
    while (step < n_steps) {
        int64_t action;
        cartpole_step_t r;
        zd_value_t *ack = NULL;
        if (remote_select_action(agent, ob->id, state, &action) < 0 ||
            cartpole_step(&ob->env, action, state, &r) < 0 ||
            zd_rref_rpc_sync_take(agent, "Agent.report_reward", ZD_ARGS(ob->id, r.reward),
                                  ZD_TIMEOUT_DEFAULT, &ack) < 0)
            return NULL;
        zd_value_unref(ack);
        step++;
        if (r.terminated || r.truncated)
            break;
    }
    return zd_value_int(step);
}

/*  ==== the agent: rank 0 ==== */

/*  The tutorial's Policy: Linear(4, 128) -> Dropout(0.6) -> ReLU ->
    Linear(128, 2) -> softmax, here log_softmax (see policy_forward). */
typedef struct {
    zd_tensor_t *w1, *b1, *w2, *b2;
} policy_t;

/*  What the agent recorded of one observer's episode. */
typedef struct {
    pthread_mutex_t lock;    /* uncontended: one observer's calls come one at a time */
    zd_rng_t rng;            /* its dropout masks and actions: a stream per observer, so a
                                  run does not depend on how the observers' calls interleave */
    zd_tensor_t **log_probs; /* one (1, 1) tensor with history per step */
    double *rewards;
    int64_t n_log_probs, n_rewards, cap_log_probs, cap_rewards;
} record_t;

typedef struct {
    pthread_mutex_t lock; /* the policy, for the observers' select_action */
    policy_t policy;
    zd_optim_t *optimizer;
    int n_observers;
    record_t *records; /* [id - 1] */
    double gamma;
    double running_reward;
} agent_t;

static int policy_init(policy_t *p, uint64_t seed)
{
    zd_rng_t rng;
    zd_rng_seed(&rng, seed);
    p->w1 = zd_tensor_zeros2(HIDDEN, CARTPOLE_OBS);
    p->b1 = zd_tensor_zeros1(HIDDEN);
    p->w2 = zd_tensor_zeros2(CARTPOLE_ACTIONS, HIDDEN);
    p->b2 = zd_tensor_zeros1(CARTPOLE_ACTIONS);
    zd_tensor_t *params[4] = {p->w1, p->b1, p->w2, p->b2};
    if (!p->w1 || !p->b1 || !p->w2 || !p->b2 || zd_nn_init_default(p->w1, p->b1, &rng) < 0 ||
        zd_nn_init_default(p->w2, p->b2, &rng) < 0)
        return -1;
    for (int i = 0; i < 4; i++)
        if (zd_tensor_set_requires_grad(params[i], true) < 0)
            return -1;
    return 0;
}

static void policy_free(policy_t *p)
{
    zd_tensor_unref(p->w1);
    zd_tensor_unref(p->b1);
    zd_tensor_unref(p->w2);
    zd_tensor_unref(p->b2);
}

/*  log(policy(x)) for x (1, 4): log-probabilities (1, 2), recorded by
    autograd. The tutorial's softmax followed by Categorical's log is the
    same function; log_softmax computes it without rounding small
    probabilities to 0. Dropout is on: the tutorial never calls eval(). */
static int policy_forward(policy_t *p, zd_tensor_t *x, zd_rng_t *rng, zd_tensor_t **out)
{
    zd_tensor_t *h = NULL, *d = NULL, *r = NULL, *scores = NULL;
    int rc = -1;
    if (zd_nn_linear(x, p->w1, p->b1, &h) == 0 && zd_nn_dropout(h, DROPOUT, true, rng, &d) == 0 &&
        zd_nn_relu(d, &r) == 0 && zd_nn_linear(r, p->w2, p->b2, &scores) == 0 &&
        zd_nn_log_softmax(scores, 1, out) == 0)
        rc = 0;
    /* the graph keeps what the backward pass needs */
    zd_tensor_unref(h);
    zd_tensor_unref(d);
    zd_tensor_unref(r);
    zd_tensor_unref(scores);
    return rc;
}

static int grow(void **items, int64_t *cap, int64_t n, size_t size)
{
    if (n < *cap)
        return 0;
    int64_t c = *cap ? *cap * 2 : 512;
    void *p = realloc(*items, (size_t)c * size);
    if (!p) {
        zd_error_set("agent: out of memory");
        return -1;
    }
    *items = p;
    *cap = c;
    return 0;
}

static void record_clear(record_t *r)
{
    for (int64_t i = 0; i < r->n_log_probs; i++)
        zd_tensor_unref(r->log_probs[i]);
    r->n_log_probs = r->n_rewards = 0;
}

static void agent_free(agent_t *a)
{
    if (!a)
        return;
    for (int i = 0; a->records && i < a->n_observers; i++) {
        record_clear(&a->records[i]);
        free(a->records[i].log_probs);
        free(a->records[i].rewards);
        pthread_mutex_destroy(&a->records[i].lock);
    }
    free(a->records);
    zd_optim_free(a->optimizer);
    policy_free(&a->policy);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

static agent_t *agent_new(const options_t *o, int n_observers)
{
    agent_t *a = calloc(1, sizeof *a);
    if (!a) {
        zd_error_set("agent: out of memory");
        return NULL;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->n_observers = n_observers;
    a->gamma = o->gamma;
    a->records = calloc((size_t)n_observers, sizeof *a->records);
    if (!a->records)
        zd_error_set("agent: out of memory");
    for (int i = 0; a->records && i < n_observers; i++) {
        pthread_mutex_init(&a->records[i].lock, NULL);
        zd_rng_seed(&a->records[i].rng, (uint64_t)o->seed * 1000 + 500 + (uint64_t)i + 1);
    }
    if (!a->records || policy_init(&a->policy, (uint64_t)o->seed) < 0)
        goto fail;
    zd_optim_config_t cfg = zd_optim_adam_defaults();
    cfg.lr = o->lr;
    zd_tensor_t *params[4] = {a->policy.w1, a->policy.b1, a->policy.w2, a->policy.b2};
    if (!(a->optimizer = zd_optim_new(&cfg, params, 4)))
        goto fail;
    return a;
fail:
    agent_free(a);
    return NULL;
}

/*  The observer id's record, or NULL (error set). */
static record_t *agent_record(agent_t *a, int64_t id)
{
    if (id < 1 || id > a->n_observers) {
        zd_error_set("agent: no observer with id %lld", (long long)id);
        return NULL;
    }
    return &a->records[id - 1];
}

/*  One action for state x (1, 4), drawn from the policy's probabilities;
    its log-probability (with history) goes into the observer's record. */
static int agent_select_action_in(agent_t *a, record_t *rec, zd_tensor_t *x, int64_t *action)
{
    zd_tensor_t *logp = NULL, *chosen = NULL;
    pthread_mutex_lock(&a->lock);
    int rc = policy_forward(&a->policy, x, &rec->rng, &logp);
    /* Categorical(probs).sample(): action 0 with probability exp(logp[0]) */
    if (rc == 0) {
        double p0 = exp((double)zd_tensor_data(logp)[0]);
        *action = (double)zd_rng_uniform(&rec->rng) < p0 ? 0 : 1;
    }
    pthread_mutex_unlock(&a->lock);
    /* m.log_prob(action) = logp[0, action], whose gradient flows back into logp */
    if (rc == 0)
        rc = zd_tensor_narrow(logp, 1, *action, 1, &chosen);
    zd_tensor_unref(logp);
    pthread_mutex_lock(&rec->lock);
    if (rc == 0 &&
        (rc = grow((void **)&rec->log_probs, &rec->cap_log_probs, rec->n_log_probs,
                   sizeof *rec->log_probs)) == 0)
        rec->log_probs[rec->n_log_probs++] = zd_tensor_ref(chosen);
    pthread_mutex_unlock(&rec->lock);
    zd_tensor_unref(chosen);
    return rc;
}

/*  "Agent.select_action"(agent, observer id, state (1, 4)): the action. */
static zd_value_t *agent_select_action(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self;
    zd_tensor_t *state;
    int64_t id, action;
    void *obj;
    record_t *rec;
    if (ZD_UNPACK(args, &self, &id, &state) < 0 || zd_value_get_object(self, "Agent", &obj) < 0 ||
        !(rec = agent_record(obj, id)) || agent_select_action_in(obj, rec, state, &action) < 0)
        return NULL;
    return zd_value_int(action);
}

/*  "Agent.report_reward"(agent, observer id, reward). */
static zd_value_t *agent_report_reward(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    zd_value_t *self;
    int64_t id;
    double reward;
    void *obj;
    record_t *rec;
    if (ZD_UNPACK(args, &self, &id, &reward) < 0 || zd_value_get_object(self, "Agent", &obj) < 0 ||
        !(rec = agent_record(obj, id)))
        return NULL;
    pthread_mutex_lock(&rec->lock);
    int rc = grow((void **)&rec->rewards, &rec->cap_rewards, rec->n_rewards, sizeof *rec->rewards);
    if (rc == 0)
        rec->rewards[rec->n_rewards++] = reward;
    pthread_mutex_unlock(&rec->lock);
    return rc < 0 ? NULL : zd_value_none();
}

/*  Agent.run_episode: every observer runs an episode at once; returns when
    all are done. */
static int agent_run_episode(zd_rref_t *agent_rref, zd_rref_t *const *ob_rrefs, int n,
                             int64_t n_steps)
{
    zd_future_t **futs = calloc((size_t)n, sizeof *futs);
    int rc = futs ? 0 : -1;
    for (int i = 0; i < n && rc == 0; i++)
        if (!(futs[i] = zd_rref_rpc_async_take(ob_rrefs[i], "Observer.run_episode",
                                               ZD_ARGS(agent_rref, n_steps), ZD_TIMEOUT_DEFAULT)))
            rc = -1;
    if (rc == 0)
        rc = zd_future_wait_all(futs, n, ZD_TIMEOUT_DEFAULT);
    for (int i = 0; futs && i < n; i++)
        zd_future_unref(futs[i]);
    free(futs);
    return rc;
}

/*  Agent.finish_episode: one REINFORCE step of Adam on the episode's
    records, which it then clears; *episode_reward gets the smallest of the
    observers' total rewards, which moves the running reward. */
static int agent_finish_episode(agent_t *a, double *episode_reward)
{
    int64_t total = 0;
    double min_reward = INFINITY;
    for (int i = 0; i < a->n_observers; i++) {
        const record_t *r = &a->records[i];
        if (r->n_log_probs != r->n_rewards || r->n_rewards == 0) {
            zd_error_set("agent: observer %d reported %lld rewards for %lld actions", i + 1,
                         (long long)r->n_rewards, (long long)r->n_log_probs);
            return -1;
        }
        double sum = 0;
        for (int64_t t = 0; t < r->n_rewards; t++)
            sum += r->rewards[t];
        min_reward = fmin(min_reward, sum);
        total += r->n_rewards;
    }
    *episode_reward = min_reward;
    a->running_reward = RUNNING_ALPHA * min_reward + (1 - RUNNING_ALPHA) * a->running_reward;

    /* Discounted returns, observer after observer. The tutorial discounts
       over the concatenation of all observers' rewards, so that one
       observer's last steps also get the next observer's first rewards;
       here each observer's returns stop at the end of its own episode. */
    zd_tensor_t *returns = zd_tensor_zeros2(total, 1), *lp = NULL, *prod = NULL, *sum = NULL,
                *loss = NULL;
    zd_tensor_t **log_probs = malloc((size_t)total * sizeof *log_probs);
    int rc = -1;
    if (!returns || !log_probs) {
        zd_error_set("agent: out of memory");
        goto out;
    }
    float *ret = zd_tensor_data(returns);
    int64_t k = 0;
    for (int i = 0; i < a->n_observers; i++) {
        const record_t *r = &a->records[i];
        double R = 0;
        for (int64_t t = r->n_rewards - 1; t >= 0; t--) {
            R = r->rewards[t] + a->gamma * R;
            ret[k + t] = (float)R;
        }
        memcpy(log_probs + k, r->log_probs, (size_t)r->n_log_probs * sizeof *log_probs);
        k += r->n_rewards;
    }
    /* (returns - mean) / (std + eps): the unbiased std, float32's eps */
    double mean = 0, var = 0;
    for (int64_t t = 0; t < total; t++)
        mean += ret[t];
    mean /= (double)total;
    for (int64_t t = 0; t < total; t++)
        var += (ret[t] - mean) * (ret[t] - mean);
    double sd = total > 1 ? sqrt(var / (double)(total - 1)) : 0;
    for (int64_t t = 0; t < total; t++)
        ret[t] = (float)((ret[t] - mean) / (sd + 1.1920928955078125e-07));

    /* loss = sum(-log_prob * return) */
    zd_optim_zero_grad(a->optimizer, true);
    if (zd_tensor_cat(log_probs, (int)total, 0, &lp) < 0 || zd_tensor_mul(lp, returns, &prod) < 0 ||
        zd_tensor_sum(prod, &sum) < 0 || zd_tensor_scale(sum, -1.0f, &loss) < 0 ||
        zd_autograd_backward(loss, NULL, false) < 0 || zd_optim_step_grad(a->optimizer) < 0)
        goto out;
    rc = 0;
out:
    for (int i = 0; i < a->n_observers; i++)
        record_clear(&a->records[i]);
    free(log_probs);
    zd_tensor_unref(returns);
    zd_tensor_unref(lp);
    zd_tensor_unref(prod);
    zd_tensor_unref(sum);
    zd_tensor_unref(loss);
    return rc;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/*  The agent's training loop (the tutorial's run_worker for rank 0). */
static int run_agent(const options_t *o, int world_size)
{
    const int n_obs = world_size - 1;
    int rc = -1;
    agent_t *agent = agent_new(o, n_obs);
    zd_rref_t *agent_rref = NULL, **ob_rrefs = calloc((size_t)n_obs, sizeof *ob_rrefs);
    if (!agent || !ob_rrefs)
        goto out;
    /* RRef(self): the value does not own the agent, which outlives RPC */
    zd_value_t *self = zd_value_object(agent, NULL, "Agent");
    agent_rref = self ? zd_rref_new(self) : NULL;
    zd_value_unref(self);
    if (!agent_rref)
        goto out;
    for (int i = 0; i < n_obs; i++) {
        char name[32];
        snprintf(name, sizeof name, "observer%d", i + 1);
        if (!(ob_rrefs[i] = zd_rpc_remote_take(zd_rpc_worker(name), "Observer", ZD_ARGS(o->seed),
                                               ZD_TIMEOUT_DEFAULT)))
            goto out;
    }
    const int64_t n_steps = o->total_episode_steps / n_obs;
    const double start = now_s();
    int64_t steps = 0;
    for (int64_t episode = 1;; episode++) {
        double last_reward;
        if (agent_run_episode(agent_rref, ob_rrefs, n_obs, n_steps) < 0) {
            fprintf(stderr, PROG ": episode %lld: %s\n", (long long)episode, zd_error_last());
            goto reported;
        }
        for (int i = 0; i < n_obs; i++)
            steps += agent->records[i].n_rewards;
        if (agent_finish_episode(agent, &last_reward) < 0) {
            fprintf(stderr, PROG ": episode %lld: %s\n", (long long)episode, zd_error_last());
            goto reported;
        }
        if (o->log_interval > 0 && episode % o->log_interval == 0)
            printf("Episode %lld\tLast reward: %.2f\tAverage reward: %.2f\n", (long long)episode,
                   last_reward, agent->running_reward);
        double secs = now_s() - start;
        if (agent->running_reward > CARTPOLE_REWARD_THRESHOLD)
            printf("Solved! Running reward is now %.2f!\n", agent->running_reward);
        else if ((o->max_episodes > 0 && episode >= o->max_episodes) ||
                 (o->max_seconds > 0 && secs >= o->max_seconds))
            printf("Not solved after %lld episodes (%s): running reward %.2f, threshold %.0f\n",
                   (long long)episode,
                   o->max_episodes > 0 && episode >= o->max_episodes ? "--max_episodes"
                                                                     : "--max_seconds",
                   agent->running_reward, CARTPOLE_REWARD_THRESHOLD);
        else
            continue;
        printf("%lld episodes, %lld steps in %.1f s (%.0f steps/s)\n", (long long)episode,
               (long long)steps, secs, (double)steps / secs);
        break;
    }
    rc = 0;
out:
    if (rc < 0)
        fprintf(stderr, PROG ": agent: %s\n", zd_error_last());
reported:
    for (int i = 0; ob_rrefs && i < n_obs; i++)
        zd_rref_unref(ob_rrefs[i]);
    free(ob_rrefs);
    zd_rref_unref(agent_rref);
    /* Each observer releases its handle to the agent's RRef after its
       last run_episode, by a message that may still be on its way: the
       graceful shutdown waits for it, and only then can the agent go. */
    if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, PROG ": agent: shutdown: %s\n", zd_error_last());
        rc = -1;
    }
    agent_free(agent);
    return rc;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines as they come, under launch too */
    zd_nn_process_setup(ZD_NN_SETUP_ALL);
    options_t o = {.seed = 543,
                   .gamma = 0.99,
                   .lr = 1e-2,
                   .log_interval = 10,
                   .max_episodes = 1000,
                   .total_episode_steps = 5000,
                   .max_seconds = 100};
    flags_world_t w = flags_world_default();
    const flag_t flags[] = {
        {"seed", FLAG_INT, &o.seed, "random seed: policy weights, dropout, actions, environments"},
        {"gamma", FLAG_DOUBLE, &o.gamma, "discount factor"},
        {"lr", FLAG_DOUBLE, &o.lr, "Adam's learning rate"},
        {"log_interval", FLAG_INT, &o.log_interval,
         "print the rewards every N episodes (0: never)"},
        {"max_episodes", FLAG_INT, &o.max_episodes,
         "stop after N episodes if not solved (0: never)"},
        {"total_episode_steps", FLAG_INT, &o.total_episode_steps,
         "steps of an episode shared among the observers (each runs at most "
         "total / (world_size - 1); CartPole-v1 ends episodes at 500)"},
        {"max_seconds", FLAG_DOUBLE, &o.max_seconds,
         "stop after the episode that passes N seconds if not solved (0: never)"},
        FLAGS_WORLD(w),
    };
    int pr = flags_parse(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]),
                         "Distributed REINFORCE on CartPole: rank 0 is the agent, the others "
                         "observers.");
    if (pr != 0)
        return pr > 0 ? 0 : 2;
    if (flags_world_resolve(&w, 2, PROG) < 0)
        return 2;
    if (w.world_size < 2) {
        fprintf(stderr,
                PROG ": needs a world of at least 2 processes: an agent and an "
                     "observer\n");
        return 2;
    }
    if (o.total_episode_steps < w.world_size - 1 || o.max_episodes < 0 || o.log_interval < 0 ||
        !(o.max_seconds >= 0) || !(o.gamma >= 0 && o.gamma <= 1) || !(o.lr > 0)) {
        fprintf(stderr,
                PROG ": --total_episode_steps must give each observer a step, "
                     "--gamma be in [0, 1], --lr positive, the counts not negative\n");
        return 2;
    }
    /* Several small processes on one machine: one BLAS thread each. */
    zd_nn_set_num_threads(1);

    char name[32];
    if (w.rank == 0)
        snprintf(name, sizeof name, "agent");
    else
        snprintf(name, sizeof name, "observer%lld", (long long)w.rank);
    if (zd_rpc_register("Observer", observer_new, NULL) < 0 ||
        zd_rpc_register("Observer.run_episode", observer_run_episode, NULL) < 0 ||
        zd_rpc_register("Agent.select_action", agent_select_action, NULL) < 0 ||
        zd_rpc_register("Agent.report_reward", agent_report_reward, NULL) < 0) {
        fprintf(stderr, PROG ": %s\n", zd_error_last());
        return 1;
    }
    if (flags_world_init(&w, name, -1, PROG) < 0)
        return 1;
    if (w.rank == 0)
        return run_agent(&o, (int)w.world_size) < 0 ? 1 : 0;
    /* Observers wait for the agent's calls until it is done. */
    if (zd_rpc_shutdown(true, ZD_TIMEOUT_DEFAULT) < 0) {
        fprintf(stderr, PROG ": %s: shutdown: %s\n", name, zd_error_last());
        return 1;
    }
    return 0;
}
