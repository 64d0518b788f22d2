"""The training iteration: one pure function, compiled once by ``jax.jit``.

    iteration(agent, state, market) -> (state, metrics)

reads like its table of contents:

1. :func:`act` — ``K`` steps of ``E`` vmapped environments (acting scan): network → A2 blend →
   M8–M11 coordination → A1 Boltzmann → A3 position scale → environment step.
2. :func:`store` — n-step transitions (γⁿ bootstrap, stopped at episode ends) into the
   prioritised replay with priority = max priority × selectivity (L8, M12); the reward-std EMA
   observes the n-step rewards written.
3. :func:`learn` — ``U`` learner updates (:mod:`jaxdqn.agent.learner`), once the replay holds
   ``learning_starts`` transitions.

Metrics are device arrays (means over the scans); nothing synchronises with the host. The market
is an argument (not a baked constant), and the state is donated by :func:`make_iteration`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxdqn.agent import nstep as nstep_lib
from jaxdqn.agent import pipeline
from jaxdqn.agent import replay as replay_lib
from jaxdqn.agent.build import Agent
from jaxdqn.agent.state import TrainState
from jaxdqn.market import env as env_lib

__all__ = [
    "Rollout",
    "act",
    "all_finite",
    "iteration",
    "learn",
    "make_iteration",
    "scan_updates",
    "store",
]


class Rollout(NamedTuple):
    """``K`` acting steps, leaves ``[K, E, ...]``."""

    obs: chex.Array
    actions: chex.Array
    selectivity: chex.Array
    reward: chex.Array
    done: chex.Array
    episode_return: chex.Array
    position: chex.Array
    traded: chex.Array


def act(agent: Agent, state: TrainState, market: env_lib.MarketData):
    """Acting scan: ``K`` decisions in each of the ``E`` environments."""
    v_min, delta_z = agent.dynamics.grid(state.dynamics)
    step_env = jax.vmap(env_lib.step_autoreset, in_axes=(None, None, 0, 0, 0))

    def body(carry, key):
        env_state, obs = carry
        dyn = state.dynamics
        d = agent.acting.decide(
            state.params, obs, v_min, delta_z, dyn.iqn_readiness, dyn.kappa, key
        )
        env_state, next_obs, reward, done, info = step_env(
            agent.env_params, market, env_state, d.action.choice, d.action.scale
        )
        row = Rollout(
            obs=obs,
            # what was executed: close-only bars hold the order branches (E1)
            actions=env_lib.executed_action(agent.env_params, d.action.choice),
            selectivity=d.selectivity,
            reward=reward,
            done=done,
            episode_return=info["episode_return"],
            position=info["position"],
            traded=info["traded"],
        )
        return (env_state, next_obs), row

    key, sub = jax.random.split(state.key)
    # Split over devices each device acts in its own environments with its own draws.
    (env_state, obs), rollout = jax.lax.scan(
        body, (state.env, state.obs), jax.random.split(agent.shards.fold(sub), agent.acting.steps)
    )
    return state.replace(env=env_state, obs=obs, key=key), rollout


def store(
    agent: Agent, state: TrainState, rollout: Rollout, market: env_lib.MarketData
) -> TrainState:
    """n-step transitions of the rollout into replay; the dynamics observe its rewards (L5).

    Learning rewards are ``reward_scale × log equity return``, the scale read from
    ``market.reward_scale`` where the placement set it (an input, so that markets differing
    only in data, e.g. walk-forward folds, share one compiled program), else the agent's
    constant (the same float32 value)."""
    scale = agent.reward_scale if market.reward_scale is None else market.reward_scale
    reward = rollout.reward * scale
    gamma = agent.nstep.gamma if state.members is None else state.members.gamma  # its own γ
    nstep_state, trans, valid = nstep_lib.update(
        state.nstep,
        rollout.obs,
        rollout.actions,
        reward,
        rollout.done,
        state.obs,
        rollout.selectivity,
        n=agent.nstep.n,
        gamma=gamma,
    )
    flat = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), trans)
    scale = flat.selectivity if agent.selectivity else jnp.ones_like(flat.reward)
    alpha = agent.replay.alpha if state.members is None else state.members.alpha  # its own α
    replay_state = replay_lib.add_scaled(
        state.replay, flat, scale, valid.reshape(-1), alpha=alpha, eps=agent.replay.eps
    )
    shards = agent.shards  # the reward std is over every device's transitions
    rate = {} if state.members is None else {"alpha": state.members.stats_alpha}  # its own
    observed = agent.dynamics.observe_rollout(
        state.dynamics, shards.gather(flat.reward), shards.gather(valid.reshape(-1)), **rate
    )
    return state.replace(replay=replay_state, nstep=nstep_state, dynamics=observed)


def scan_updates(agent: Agent, state: TrainState, count: int | None = None):
    """``count`` learner updates (default ``U``, ``optim.updates``) under one ``lax.scan``
    unrolled as ``optim.unroll`` says, pipelined as ``optim.pipeline`` says
    (:func:`jaxdqn.agent.pipeline.pipelined_updates`): ``(state, metrics)``, each metric
    ``[count, ...]``. The iteration's learner and the benches' timed learner programs."""
    n = agent.updates if count is None else count
    if agent.pipeline:
        return pipeline.pipelined_updates(agent.learner, state, n, unroll=agent.unroll)
    update = lambda c, _: agent.learner.update(c)
    return jax.lax.scan(update, state, None, n, unroll=agent.unroll)


def learn(agent: Agent, state: TrainState):
    """``U`` learner updates under ``lax.scan`` (skipped until the replay is warm)."""
    # Split over devices: the transitions stored on all of them (the same on every device).
    ready = agent.shards.sum(state.replay.size) >= agent.learning_starts

    # The skipped branch's NaN metrics take their shapes from the learning branch's trace:
    # ``lax.cond`` traces its true branch first. (``jax.eval_shape(run, state)`` would trace
    # the U updates a second time: a third of the iteration's tracing.)
    traced = []

    def run(s):
        s, metrics = scan_updates(agent, s)
        metrics = jax.tree.map(lambda m: m.mean(axis=0), metrics)
        traced.append(jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metrics))
        return s, metrics

    def skip(s):
        if not traced:
            raise RuntimeError("learn: lax.cond traced the skipped branch first")
        return s, jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan, x.dtype), traced[-1])

    state, metrics = jax.lax.cond(ready, run, skip, state)
    metrics["learning"] = ready.astype(jnp.float32)
    return state, metrics


def all_finite(tree: Any) -> chex.Array:
    """Whether every element of every leaf is finite (bool scalar)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def iteration(
    agent: Agent, state: TrainState, market: env_lib.MarketData
) -> tuple[TrainState, dict[str, Any]]:
    """act → store → learn; see the module docstring."""
    state, rollout = act(agent, state, market)
    state = store(agent, state, rollout, market)
    state, metrics = learn(agent, state)
    finished = rollout.done.astype(jnp.float32)
    shards = agent.shards  # means and sums over every device's environments
    metrics.update(
        reward_mean=shards.mean(rollout.reward.mean()),
        reward_std_ema=state.dynamics.reward_std_ema,
        episodes_done=shards.sum(finished.sum()),
        episode_return_sum=shards.sum(jnp.sum(rollout.episode_return * finished)),
        position_abs_mean=shards.mean(jnp.abs(rollout.position).mean()),
        traded_mean=shards.mean(rollout.traded.mean()),
        selectivity_mean=shards.mean(rollout.selectivity.mean()),
        replay_size=shards.sum(state.replay.size).astype(jnp.float32),
        finite=all_finite(state.params)
        & ((metrics["learning"] == 0) | jnp.isfinite(metrics["loss"])),
    )
    return state.replace(iteration=state.iteration + 1), metrics


def make_iteration(
    agent: Agent,
    *,
    num_seeds: int | None = None,
    compiler_options: dict[str, Any] | None = None,
):
    """``jit(iteration)`` with the state donated; with ``num_seeds`` the state carries a leading
    seed axis and the iteration is vmapped over it (the market is shared). ``compiler_options``
    are XLA options of this program alone (the training passes
    ``program.launch.runtime.iteration_compiler_options()``)."""
    fn = lambda state, market: iteration(agent, state, market)
    if num_seeds is not None:
        fn = jax.vmap(fn, in_axes=(0, None))
    return jax.jit(fn, donate_argnums=0, compiler_options=compiler_options or None)
