/* SPDX-License-Identifier: MIT */
#include "examples/cartpole.h"

#include <math.h>

#include <zdist/error.h>

#define GRAVITY         9.8
#define MASSCART        1.0
#define MASSPOLE        0.1
#define TOTAL_MASS      (MASSCART + MASSPOLE)
#define LENGTH          0.5 /* half the pole's length */
#define POLEMASS_LENGTH (MASSPOLE * LENGTH)
#define FORCE_MAG       10.0
#define TAU             0.02

static void observe(const cartpole_t *env, float obs[CARTPOLE_OBS])
{
    for (int i = 0; i < CARTPOLE_OBS; i++)
        obs[i] = (float)env->state[i];
}

void cartpole_seed(cartpole_t *env, uint64_t seed)
{
    zd_rng_seed(&env->rng, seed);
    env->done = true;
    env->steps = 0;
}

void cartpole_reset(cartpole_t *env, float obs[CARTPOLE_OBS])
{
    for (int i = 0; i < CARTPOLE_OBS; i++)
        env->state[i] = zd_rng_uniform_range(&env->rng, -0.05f, 0.05f);
    env->steps = 0;
    env->done = false;
    observe(env, obs);
}

void cartpole_set_state(cartpole_t *env, const double state[CARTPOLE_OBS])
{
    for (int i = 0; i < CARTPOLE_OBS; i++)
        env->state[i] = state[i];
    env->steps = 0;
    env->done = false;
}

int cartpole_step(cartpole_t *env, int64_t action, float obs[CARTPOLE_OBS], cartpole_step_t *out)
{
    if (action != 0 && action != 1) {
        zd_error_set("cartpole: action %lld is neither 0 (left) nor 1 (right)", (long long)action);
        return -1;
    }
    if (env->done) {
        zd_error_set("cartpole: the episode is over after %d steps: reset first", env->steps);
        return -1;
    }
    double x = env->state[0], x_dot = env->state[1];
    double theta = env->state[2], theta_dot = env->state[3];
    double force = action == 1 ? FORCE_MAG : -FORCE_MAG;
    double costheta = cos(theta), sintheta = sin(theta);
    /* Gym's equations (from Florian's "Correct equations for the dynamics
       of the cart-pole system"), then one explicit Euler step. */
    double temp = (force + POLEMASS_LENGTH * theta_dot * theta_dot * sintheta) / TOTAL_MASS;
    double thetaacc = (GRAVITY * sintheta - costheta * temp) /
        (LENGTH * (4.0 / 3.0 - MASSPOLE * costheta * costheta / TOTAL_MASS));
    double xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS;
    x += TAU * x_dot;
    x_dot += TAU * xacc;
    theta += TAU * theta_dot;
    theta_dot += TAU * thetaacc;
    env->state[0] = x;
    env->state[1] = x_dot;
    env->state[2] = theta;
    env->state[3] = theta_dot;
    env->steps++;
    out->reward = 1.0;
    out->terminated = x < -CARTPOLE_X_THRESHOLD || x > CARTPOLE_X_THRESHOLD ||
        theta < -CARTPOLE_THETA_THRESHOLD || theta > CARTPOLE_THETA_THRESHOLD;
    out->truncated = !out->terminated && env->steps >= CARTPOLE_MAX_STEPS;
    env->done = out->terminated || out->truncated;
    observe(env, obs);
    return 0;
}
