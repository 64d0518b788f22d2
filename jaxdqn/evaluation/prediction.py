"""The agent's decision after a given bar, as its walk takes it (``python -m jaxdqn.predict``).

The evaluation walk (:func:`jaxdqn.evaluation.walk.rollout`) starts flat at the first bar of a
split and carries the account from decision to decision; the observation after bar ``t`` holds
the position that account has then (E1). So the decision at bar ``t`` is only the walk's if the
walk is replayed up to ``t``: :func:`decide_after` replays it
(:func:`jaxdqn.evaluation.walk.replay`: every decision ``t0 … t`` taken by the walk's own step,
:func:`jaxdqn.evaluation.walk.walk_step`, the one features → decision path the walk uses). It
reads bars ``≤ t`` only (the market needs a row ``t + 1``, which the caller fills with a copy).

What it returns for that decision (:class:`Prediction`): the executed branch actions and A3
scale, the order they imply (:func:`jaxdqn.market.env.order_of`: target position, shares to
trade, side, limit price), the account going in, and the network's E[Q] and Q10/Q50/Q90 per
branch and action at that observation.

The costs enter the replayed steps as the walk's do (:mod:`jaxdqn.evaluation.cost_stress`:
without impact the half-spread and commission are traced arguments ``rate``), so the replay
computes the walk's arithmetic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from jaxdqn.evaluation import cost_stress
from jaxdqn.evaluation import walk as walk_lib
from jaxdqn.market import env

__all__ = ["Prediction", "decide_after", "make_predictor"]


class Prediction(NamedTuple):
    """The decision after bar ``t`` (leading axes allowed: e.g. seeds ``[S]``).

    Attributes:
      action: int32 ``[4]`` executed branch actions (direction, magnitude, order, urgency).
      scale: float32 the A3 position scale.
      target_position: float32 the target position, as the walk's step computes it.
      order: :class:`jaxdqn.market.env.Order` (target, delta, wants, buy, limit).
      position: float32 the position fraction held going in (the observation's).
      equity: float32 the walk's equity after bar ``t`` (it started at 1).
      last_filled, last_expired: float32 {0, 1} flags of the previous order.
      q_mean: float32 ``[4, 3]`` E[Q] per branch and action.
      quantiles: float32 ``[4, 3, 3]`` Q10, Q50, Q90 per branch and action.
      q_acted: float32 ``[4, 3]`` the values the greedy policy takes the argmax of: E[Q] after
        the M8–M11 coordination.
      obs: float32 ``[obs_dim]`` the observation after bar ``t``.
    """

    action: jax.Array
    scale: jax.Array
    target_position: jax.Array
    order: env.Order
    position: jax.Array
    equity: jax.Array
    last_filled: jax.Array
    last_expired: jax.Array
    q_mean: jax.Array
    quantiles: jax.Array
    q_acted: jax.Array
    obs: jax.Array


def decide_after(
    model: Any,
    env_params: env.EnvParams,
    policy_fn: walk_lib.PolicyFn,
    market: env.MarketData,
    t0: jax.Array,
    t: jax.Array,
    key: jax.Array,
    policy_params: tuple[Any, Any, Any, Any],
    rate: jax.Array | None,
) -> Prediction:
    """The walk from ``t0`` (flat) replayed to bar ``t`` and its decision there (pure).

    Args:
      model: the agent's model (:func:`jaxdqn.model.network.make_model`).
      env_params: static parameters (:func:`jaxdqn.evaluation.cost_stress.traced_costs`).
      policy_fn: the evaluation policy (``agent.acting.eval_policy``).
      market: one instrument's bars (``t < market.num_bars``).
      t0, t: int32 the walk's first decision bar and the decision bar.
      key: the walk's key (``eval.key``).
      policy_params: ``(params, v_min, delta_z, readiness)`` of one seed.
      rate: the traced costs of ``traced_costs``, or None.
    """
    if rate is not None:
        env_params = cost_stress.at_rate(env_params, rate)
    rec = walk_lib.replay(env_params, market, t0, t, policy_fn, key, policy_params)
    params, v_min, delta_z, _ = policy_params
    out = model.apply(params, rec.obs[None], v_min, delta_z)
    width = rec.obs.shape[0] - env.NUM_STATE_ENTRIES
    return Prediction(
        action=rec.action,
        scale=rec.scale,
        target_position=rec.target_position,
        order=env.order_of(env_params, market, rec.state, rec.action, rec.scale),
        position=rec.obs[width],
        equity=rec.state.equity,
        last_filled=rec.state.last_filled,
        last_expired=rec.state.last_expired,
        q_mean=out.q_mean[0],
        quantiles=out.quantiles[0],
        q_acted=model.coordinate(params, out.q_mean).q[0],
        obs=rec.obs,
    )


def make_predictor(
    model: Any, env_params: env.EnvParams, policy_fn: walk_lib.PolicyFn, *, jit: bool = True
):
    """``predict(market, t0, t, key, policy_params, rate) -> Prediction``: :func:`decide_after`
    for one seed, jitted unless ``jit`` is False (``t0``, ``t`` and the seed's arrays traced: one
    compilation per market length serves every date and seed). Not vmapped over seeds, as the
    walks are not: the same program shapes give the walks' bits."""
    static, _ = cost_stress.traced_costs(env_params)

    def one(market, t0, t, key, policy_params, rate):
        return decide_after(model, static, policy_fn, market, t0, t, key, policy_params, rate)

    return jax.jit(one) if jit else one
