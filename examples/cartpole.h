/* SPDX-License-Identifier: MIT */
/*  cartpole.h: Gym's CartPole-v1 in C, for the reinforcement-learning
    example (rl_rpc).

    A pole hinged on a cart that moves along a frictionless track; each step
    pushes the cart left (action 0) or right (action 1) with a force of 10 N
    and earns a reward of 1. The classic dynamics of Barto, Sutton and
    Anderson (1983) as Gym writes them: gravity 9.8, cart 1.0 kg, pole 0.1 kg,
    half the pole's length 0.5 m, Euler integration with tau = 0.02 s. The
    episode terminates when |x| > 2.4 or |theta| > 12 degrees, and Gym's
    TimeLimit wrapper truncates it at 500 steps. reset() draws each of the
    four state variables uniformly in [-0.05, 0.05).

    The state is kept in double precision, as Gym's (Python floats); the
    observation handed to the policy is float32, as Gym's. */
#ifndef ZDIST_EXAMPLES_CARTPOLE_H
#define ZDIST_EXAMPLES_CARTPOLE_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/rng.h>

#define CARTPOLE_OBS              4     /* x, x_dot, theta, theta_dot */
#define CARTPOLE_ACTIONS          2     /* push left, push right */
#define CARTPOLE_MAX_STEPS        500   /* CartPole-v1's max_episode_steps */
#define CARTPOLE_REWARD_THRESHOLD 475.0 /* CartPole-v1's reward_threshold */
#define CARTPOLE_X_THRESHOLD      2.4
#define CARTPOLE_THETA_THRESHOLD  (12.0 * 2.0 * 3.14159265358979323846 / 360.0)

typedef struct {
    double state[CARTPOLE_OBS]; /* x, x_dot, theta, theta_dot */
    int steps;                  /* steps since the last reset */
    bool done;                  /* terminated or truncated: reset first */
    zd_rng_t rng;               /* reset's draws */
} cartpole_t;

/*  The result of one step. */
typedef struct {
    double reward;   /* 1 for every step, the last one included */
    bool terminated; /* the pole fell or the cart left the track */
    bool truncated;  /* the 500th step, not terminated */
} cartpole_step_t;

/*  Seeds env's generator (Gym's env.seed / reset(seed=...)); the episode
    starts at the next reset. */
void cartpole_seed(cartpole_t *env, uint64_t seed);

/*  Starts an episode: a random state near upright; writes the observation. */
void cartpole_reset(cartpole_t *env, float obs[CARTPOLE_OBS]);

/*  Starts an episode from a given state (for tests). */
void cartpole_set_state(cartpole_t *env, const double state[CARTPOLE_OBS]);

/*  Applies action (0: left, 1: right) for one step of 0.02 s and writes the
    new observation. 0, or -1 (error set) for an action other than 0 and 1
    or a step after the episode ended (reset first). */
int cartpole_step(cartpole_t *env, int64_t action, float obs[CARTPOLE_OBS], cartpole_step_t *out);

#endif
