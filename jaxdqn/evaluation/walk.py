"""E3: one deterministic walk of a policy over a whole split, its per-bar log and metrics.

A policy is a function ``policy_fn(obs, t, key) -> (action, scale)``: ``obs`` float32
``[obs_dim]`` is the environment's observation after bar ``t`` closed, ``t`` the int32 bar,
``key`` a PRNG key for this decision; it returns the int32 ``[4]`` branch actions (direction,
magnitude, order, urgency) and the float32 scalar position scale (A3; 1.0 when not sizing).
A policy whose behaviour depends on arrays that change between calls (network parameters)
takes them explicitly instead, ``policy_fn(policy_params, obs, t, key)``, and is walked with
``policy_params=...``: the arrays are then traced arguments, so one compilation serves every
parameter value.

The walk starts flat at bar ``lo`` (``env.reset_at``) and steps the environment **without
auto-reset** once for every decision bar ``t = lo, …, hi − 2``; the order made after bar t
executes in bar t+1, where its return is realised. Per-step keys are ``split(key, n)``, so
the walk is a pure function of its arguments: the same key gives the identical log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
from jax import lax

from jaxdqn.evaluation import metrics
from jaxdqn.market import env

__all__ = [
    "LOG_COLUMNS",
    "EvalResult",
    "PolicyFn",
    "Replayed",
    "Trajectory",
    "decision",
    "decision_keys",
    "decision_range",
    "evaluation_result",
    "replay",
    "rollout",
    "walk",
    "walk_step",
]

PolicyFn = Callable[..., tuple[jax.Array, jax.Array]]

LOG_COLUMNS = (
    "t",
    "date",
    "direction",
    "magnitude",
    "order",
    "urgency",
    "scale",
    "target_position",
    "position",
    "filled",
    "expired",
    "price",
    "traded",
    "cost",
    "equity",
    "return",
)
"""Columns of the per-bar log, one row per decision bar ``t`` (see :func:`walk`)."""


class Trajectory(NamedTuple):
    """Arrays ``[n]`` (``action`` ``[n, 4]``) of one walk, row i = decision bar ``t0 + i``."""

    t: jax.Array
    action: jax.Array
    scale: jax.Array
    target_position: jax.Array
    position: jax.Array
    filled: jax.Array
    expired: jax.Array
    fill_price: jax.Array
    traded: jax.Array
    cost: jax.Array
    equity: jax.Array
    reward: jax.Array


class EvalResult(NamedTuple):
    """``log``: per-bar DataFrame (:data:`LOG_COLUMNS`); ``metrics``: ``metrics.performance``."""

    log: pd.DataFrame
    metrics: dict[str, float]


def rollout(
    env_params: env.EnvParams,
    market: env.MarketData,
    t0: jax.Array | int,
    hi: jax.Array | int,
    n: int,
    policy_fn: PolicyFn,
    key: jax.Array,
    policy_params: Any = None,
) -> Trajectory:
    """Walk ``policy_fn`` for ``n`` decisions from bar ``t0`` (pure; jit it with ``params``,
    ``n`` and ``policy_fn`` static, or call it inside a larger jitted function).

    Args:
      env_params: static environment parameters.
      market: the bars.
      t0: first decision bar (``≥ env_params.window − 1``); int32 scalar.
      hi: stop of the split (``t0 + n < hi`` must hold); int32 scalar.
      n: number of decisions (static).
      policy_fn: ``(obs, t, key) -> (action int32 [4], scale float32 [])``, or with
        ``policy_params`` given ``(policy_params, obs, t, key) -> ...``.
      key: PRNG key; ``split(key, n + 1)``: the first for the env state, one per decision.
      policy_params: optional pytree passed first to ``policy_fn``.

    Returns:
      :class:`Trajectory` of ``n`` rows.
    """
    keys = jax.random.split(key, n + 1)
    state, obs = env.reset_at(env_params, market, t0, t0, hi, keys[0])

    def body(carry, step_key):
        state, obs = carry
        t = state.t
        action, scale, (state, obs, reward, info) = walk_step(
            env_params, market, policy_fn, policy_params, state, obs, step_key
        )
        row = Trajectory(
            t=t,
            action=action,
            scale=scale,
            target_position=info["target_position"],
            position=info["position"],
            filled=info["filled"],
            expired=info["expired"],
            fill_price=info["fill_price"],
            traded=info["traded"],
            cost=info["cost"],
            equity=info["equity"],
            reward=reward,
        )
        return (state, obs), row

    _, traj = lax.scan(body, (state, obs), keys[1:])
    return traj


def decision(
    env_params: env.EnvParams,
    policy_fn: PolicyFn,
    policy_params: Any,
    obs: jax.Array,
    t: jax.Array,
    key: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Features → decision, the one path the walk and ``python -m jaxdqn.predict`` share:
    ``policy_fn`` at observation ``obs`` (float32 ``[obs_dim]``) after bar ``t`` with the
    decision's ``key``, then the executed action (:func:`jaxdqn.market.env.executed_action`).
    Returns ``(action int32 [4], scale float32 [])``."""
    if policy_params is None:
        action, scale = policy_fn(obs, t, key)
    else:
        action, scale = policy_fn(policy_params, obs, t, key)
    action = env.executed_action(env_params, jnp.asarray(action, jnp.int32))
    return action, jnp.asarray(scale, jnp.float32)


def walk_step(
    env_params: env.EnvParams,
    market: env.MarketData,
    policy_fn: PolicyFn,
    policy_params: Any,
    state: env.EnvState,
    obs: jax.Array,
    key: jax.Array,
):
    """One step of the walk: :func:`decision` at ``obs`` after bar ``state.t``, then
    :func:`jaxdqn.market.env.step` (no auto-reset). Returns ``(action, scale, (state', obs',
    reward, info))``."""
    action, scale = decision(env_params, policy_fn, policy_params, obs, state.t, key)
    state, obs, reward, _done, info = env.step(env_params, market, state, action, scale)
    return action, scale, (state, obs, reward, info)


def decision_keys(key: jax.Array, num_bars: int) -> jax.Array:
    """``[num_bars + 1]`` keys: ``[0]`` the walk's env state, ``[1 + i]`` the i-th decision's.

    :func:`rollout` splits its key into ``n + 1``; JAX's partitionable Threefry
    (``jax_threefry_partitionable``, the default since 0.5) makes key i of ``split(key, m)`` the
    same for every ``m > i``, so a replay with any bound meets the walk's keys exactly."""
    return jax.random.split(key, num_bars + 1)


class Replayed(NamedTuple):
    """The walk's decision after bar ``t`` (:func:`replay`): the account and observation it
    was taken at, the executed action, the A3 scale and the target position."""

    state: env.EnvState
    obs: jax.Array
    action: jax.Array
    scale: jax.Array
    target_position: jax.Array


def replay(
    env_params: env.EnvParams,
    market: env.MarketData,
    t0: jax.Array | int,
    t: jax.Array | int,
    policy_fn: PolicyFn,
    key: jax.Array,
    policy_params: Any = None,
) -> Replayed:
    """The walk of :func:`rollout` that started flat at bar ``t0``, replayed through its
    decision at bar ``t``: every decision ``t0 … t`` is taken by :func:`walk_step`, the walk's
    own step, with the walk's keys. ``t0`` and ``t`` may be traced (one compilation serves
    every date; jit with ``env_params`` and ``policy_fn`` static).

    The decision at ``t`` is stepped into bar ``t + 1`` like every other (so it is computed by
    the same loop body as the walk's); that step's result is dropped, and the market needs a
    row ``t + 1`` (any bar: ``python -m jaxdqn.predict`` repeats bar ``t``). Nothing else reads
    a bar after ``t``. Requires ``window − 1 ≤ t0 ≤ t < market.num_bars − 1`` (``t0`` is raised
    to ``window − 1`` as the walk's start is)."""
    t0 = jnp.maximum(jnp.asarray(t0, jnp.int32), env_params.window - 1)
    t = jnp.asarray(t, jnp.int32)
    keys = decision_keys(key, market.num_bars)
    state, obs = env.reset_at(env_params, market, t0, t0, t + 2, keys[0])
    zero = jnp.zeros((), jnp.float32)
    first = Replayed(state, obs, jnp.zeros((4,), jnp.int32), zero, zero)

    def body(i, carry):
        state, obs, _ = carry
        action, scale, (nxt, nxt_obs, _reward, info) = walk_step(
            env_params, market, policy_fn, policy_params, state, obs, keys[1 + i]
        )
        return nxt, nxt_obs, Replayed(state, obs, action, scale, info["target_position"])

    return lax.fori_loop(0, t - t0 + 1, body, (state, obs, first))[2]


_rollout_jit = jax.jit(rollout, static_argnames=("env_params", "n", "policy_fn"))


def walk(
    market: env.MarketData,
    env_params: env.EnvParams,
    lo: int,
    hi: int,
    policy_fn: PolicyFn,
    key: jax.Array,
    dates: pd.DatetimeIndex | None = None,
    *,
    periods_per_year: float = 252,
    policy_params: Any = None,
) -> EvalResult:
    """Evaluate a policy over the bar range ``[lo, hi)`` of one split, deterministically.

    One jitted ``lax.scan`` of ``env.step`` (no auto-reset) over every decision bar
    ``t ∈ [t0, hi − 1)`` with ``t0 = max(lo, env_params.window − 1)``, starting flat with equity 1.

    Log columns (one row per decision bar t; float64 unless noted):
      ``t`` (int) the decision bar; ``date`` the timestamp of bar t+1, when the order executes
      and the return is realised (the bar index t+1 when ``dates`` is None);
      ``direction, magnitude, order, urgency`` (int) the branch actions; ``scale`` the position
      scale; ``target_position`` the target fraction of equity; ``position`` the actual
      fraction after the trade, at close[t+1]; ``filled``, ``expired`` (bool) the order's
      fill flags; ``price`` the fill price (NaN when nothing filled); ``traded`` and ``cost``
      the traded notional and all costs as fractions of equity at close[t]; ``equity`` at
      close[t+1] (starts from 1); ``return`` the simple return of bar t+1,
      ``exp(reward) − 1`` (the reward is the log equity change after costs).

    Metrics: :func:`jaxdqn.evaluation.metrics.performance` of ``return`` with
    ``positions=position`` and ``traded=traded``.

    Args:
      market, env_params: the environment (see :func:`jaxdqn.market.market.prepare`).
      lo, hi: the split's half-open bar range (Python ints).
      policy_fn: see the module docstring.
      key: PRNG key for the policy's sampling (and the env state); same key → same log.
      dates: the bars' timestamps ``[T]`` (e.g. ``Prepared.dates``), or None.
      periods_per_year: annualisation of the metrics (``cfg.eval.periods_per_year``).
      policy_params: optional traced arguments of ``policy_fn`` (module docstring).

    Raises:
      ValueError: the range holds no decision bar.
    """
    t0, hi, n = decision_range(env_params, market, lo, hi)
    traj = _rollout_jit(
        env_params, market, jnp.int32(t0), jnp.int32(hi), n, policy_fn, key, policy_params
    )
    return evaluation_result(traj, dates, periods_per_year)


def decision_range(
    env_params: env.EnvParams, market: env.MarketData, lo: int, hi: int
) -> tuple[int, int, int]:
    """``(t0, hi, n)`` of a walk over ``[lo, hi)``: first decision bar, stop, decisions.

    Raises:
      ValueError: the range holds no decision bar.
    """
    t0 = max(int(lo), env_params.window - 1)
    hi = int(hi)
    n = hi - 1 - t0
    if n < 1 or hi > market.num_bars:
        raise ValueError(
            f"walk: bar range [{lo}, {hi}) has no decision bar within {market.num_bars} bars "
            f"(window {env_params.window})"
        )
    return t0, hi, n


def evaluation_result(
    traj: Trajectory, dates: pd.DatetimeIndex | None, periods_per_year: float
) -> EvalResult:
    """The per-bar log and metrics (:func:`walk`'s) of one walk's :class:`Trajectory`."""
    traj = jax.device_get(traj)
    t = np.asarray(traj.t, dtype=np.int64)
    action = np.asarray(traj.action, dtype=np.int64)
    filled = np.asarray(traj.filled) > 0.5
    fill_price = np.asarray(traj.fill_price, dtype=np.float64)
    ret = np.expm1(np.asarray(traj.reward, dtype=np.float64))
    position = np.asarray(traj.position, dtype=np.float64)
    traded = np.asarray(traj.traded, dtype=np.float64)
    log = pd.DataFrame(
        {
            "t": t,
            "date": (pd.DatetimeIndex(dates)[t + 1] if dates is not None else t + 1),
            "direction": action[:, 0],
            "magnitude": action[:, 1],
            "order": action[:, 2],
            "urgency": action[:, 3],
            "scale": np.asarray(traj.scale, dtype=np.float64),
            "target_position": np.asarray(traj.target_position, dtype=np.float64),
            "position": position,
            "filled": filled,
            "expired": np.asarray(traj.expired) > 0.5,
            "price": np.where(filled, fill_price, np.nan),
            "traded": traded,
            "cost": np.asarray(traj.cost, dtype=np.float64),
            "equity": np.asarray(traj.equity, dtype=np.float64),
            "return": ret,
        },
        columns=list(LOG_COLUMNS),
    )
    perf = metrics.performance(ret, periods_per_year, positions=position, traded=traded)
    return EvalResult(log=log, metrics=perf)


def value_spread(
    model: Any,
    net_params: Any,
    market: env.MarketData,
    env_params: env.EnvParams,
    lo: int,
    hi: int,
    v_min: jax.Array,
    delta_z: jax.Array,
) -> jax.Array:
    """Std of the agent's E[Q] over every bar of ``[lo, hi)`` seen flat (position 0, no fill):
    the evaluation Q-spread that M14's amplifier target ``10·eval_q_std_ema`` uses.

    Returns a float32 scalar (traceable; jit it with ``model``/``env_params``/``lo``/``hi``
    static)."""
    ts = jnp.arange(lo, hi, dtype=jnp.int32)
    key = jax.random.PRNGKey(0)  # unused by reset_at's state; observations are deterministic
    obs = jax.vmap(lambda t: env.reset_at(env_params, market, t, lo, hi, key)[1])(ts)
    return jnp.std(model.apply(net_params, obs, v_min, delta_z).q_mean)
