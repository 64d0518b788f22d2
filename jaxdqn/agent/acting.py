"""Acting (A1–A3): Boltzmann action selection, the IQN-style value blend, position sizing, and
:func:`make_acting`, the acting pipeline closed over its config section.

The A1–A3 functions act on one observation's per-branch values ``[4, 3]`` (branches
direction, magnitude, order, urgency × three actions); batch them with ``jax.vmap``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

from jaxdqn.branches import Action
from jaxdqn.config import ActingConfig

TAU_FLOOR = 0.01


def boltzmann_temperature(q: chex.Array) -> chex.Array:
    """A1 temperature per branch: τ = max(max_a Q − min_a Q, 0.01).

    Args:
      q: ``[..., 3]`` action values of one branch (or ``[4, 3]`` for all branches).
    Returns:
      ``[...]`` temperatures.
    """
    return jnp.maximum(q.max(axis=-1) - q.min(axis=-1), TAU_FLOOR)


def boltzmann_probs(q: chex.Array) -> chex.Array:
    """A1 action probabilities softmax(Q/τ) per branch, ``[..., 3]``.

    With τ equal to the spread of the values the best action gets e¹ ≈ 2.72 times the weight of
    the worst: scale-invariant exploration that sharpens only as far as Q differentiates.
    """
    tau = boltzmann_temperature(q)[..., None]
    return jax.nn.softmax(q / tau, axis=-1)


def boltzmann_sample(key: chex.PRNGKey, q: chex.Array) -> chex.Array:
    """A1: sample one action per branch from softmax(Q/τ).

    Used in training and evaluation alike; evaluation passes a fixed key, so it is
    deterministic but not argmax (argmax of softmax(Q/τ) is argmax Q whatever τ is, and made
    every state trade identically in the seed system).

    Args:
      key: PRNG key.
      q: ``[4, 3]`` acting values.
    Returns:
      int32 ``[4]`` actions.
    """
    chex.assert_rank(q, 2)
    tau = boltzmann_temperature(q)[:, None]
    return jax.random.categorical(key, q / tau, axis=-1).astype(jnp.int32)


def iqn_blend(q10: chex.Array, q90: chex.Array, readiness: chex.Array) -> chex.Array:
    """A2: acting values Q_90 + readiness · (Q_10 − Q_90).

    readiness = 0 acts on the optimistic 90th percentile (uncertain actions look attractive:
    exploration), readiness = 1 on the pessimistic 10th (exploitation). E[Q] still drives the
    loss and monitoring.

    Args:
      q10, q90: ``[..., 4, 3]`` percentiles from the action CDFs (M7).
      readiness: scalar in [0, 1].
    """
    r = jnp.clip(readiness, 0.0, 1.0)
    return q90 + r * (q10 - q90)


def position_scale(q_var: chex.Array, direction: chex.Array) -> chex.Array:
    """A3: position scale 1 / (1 + sqrt(Var[Q] of the taken direction action)).

    High return-distribution uncertainty → smaller position (a Kelly-like shrink).

    Args:
      q_var: ``[4, 3]`` variances (M7) of one observation; row 0 is the direction branch.
      direction: int scalar, the taken direction action.
    Returns:
      float32 scalar in (0, 1].
    """
    var = jnp.maximum(q_var[0, direction], 0.0)
    return (1.0 / (1.0 + jnp.sqrt(var))).astype(jnp.float32)


class Decision(NamedTuple):
    """What the agent does for a batch of observations ``[E]``."""

    action: Action  # choice int32 [E, 4], A3 scale float32 [E] (1 when sizing is off)
    selectivity: chex.Array  # float32 [E] M12 prediction at o_t
    q_mean: chex.Array  # float32 [E, 4, 3] E[Q] (monitoring)


def decide(
    model: Any,
    params: Any,
    obs: chex.Array,
    v_min: chex.Array,
    delta_z: chex.Array,
    readiness: chex.Array,
    key: chex.PRNGKey,
    *,
    iqn: bool = True,
    sizing: bool = True,
) -> Decision:
    """The acting pipeline: network → A2 blend → M8–M11 coordination → A1 → A3.

    Args:
      model: :class:`jaxdqn.model.network.Model`.
      params: its parameters.
      obs: ``[E, D]`` observations.
      v_min, delta_z: the current support.
      readiness: A2 blend weight (float32 scalar).
      key: PRNG key, split once per environment.
      iqn: A2 switch (off: act on E[Q]); sizing: A3 switch (off: scale 1).
    """
    out = model.apply(params, obs, v_min, delta_z)
    values = out.q_mean
    if iqn:
        values = iqn_blend(out.quantiles[..., 0], out.quantiles[..., 2], readiness)
    values = model.coordinate(params, values).q
    keys = jax.random.split(key, obs.shape[0])
    actions = jax.vmap(boltzmann_sample)(keys, values)
    if sizing:
        scale = jax.vmap(position_scale)(out.q_var, actions[:, 0])
    else:
        scale = jnp.ones((obs.shape[0],), jnp.float32)
    return Decision(Action(actions, scale), out.selectivity, out.q_mean)


def make_eval_policy(model: Any, *, iqn: bool = True, sizing: bool = True):
    """A policy for :func:`jaxdqn.evaluation.walk.walk` with traced ``policy_params =
    (params, v_min, delta_z, readiness)``: one compile serves every parameter set."""

    def policy(policy_params, obs, t, key):
        del t
        params, v_min, delta_z, readiness = policy_params
        d = decide(model, params, obs[None], v_min, delta_z, readiness, key, iqn=iqn, sizing=sizing)
        return d.action.choice[0], d.action.scale[0]

    return policy


@dataclasses.dataclass(frozen=True)
class Acting:
    """The acting pipeline for one config (from :func:`make_acting`).

    Attributes:
      num_envs: ``E`` environments acting in parallel.
      steps: ``K`` environment steps per iteration.
      iqn_readiness: A2's initial readiness (the epoch loop ramps it).
      decide: ``(params, obs [E, D], v_min, delta_z, readiness, key) -> Decision``.
      eval_policy: the same pipeline as a policy for the evaluation walk (fixed key, traced
        ``policy_params = (params, v_min, delta_z, readiness)``).
    """

    num_envs: int
    steps: int
    iqn_readiness: float
    decide: Callable[..., Decision]
    eval_policy: Callable[..., tuple[chex.Array, chex.Array]]


def make_acting(cfg: ActingConfig, model: Any) -> Acting:
    """Factory of the acting pipeline for ``cfg`` (A2 and A3 switches) and ``model``."""
    iqn, sizing = cfg.iqn_blend, cfg.position_sizing

    def decide_fn(params, obs, v_min, delta_z, readiness, key) -> Decision:
        return decide(model, params, obs, v_min, delta_z, readiness, key, iqn=iqn, sizing=sizing)

    return Acting(
        num_envs=cfg.num_envs,
        steps=cfg.steps,
        iqn_readiness=cfg.iqn_readiness,
        decide=decide_fn,
        eval_policy=make_eval_policy(model, iqn=iqn, sizing=sizing),
    )
