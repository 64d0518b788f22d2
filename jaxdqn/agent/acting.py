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

from jaxdqn.agent.resolve import in_q_units
from jaxdqn.branches import Action
from jaxdqn.config import ActingConfig


def boltzmann_temperature(q: chex.Array, kappa=1.0, floor=0.01) -> chex.Array:
    """A1 temperature per branch: τ = κ · max(max_a Q − min_a Q, floor).

    Args:
      q: ``[..., 3]`` action values of one branch (or ``[4, 3]`` for all branches).
      kappa: the temperature factor κ (scheduled by the host; 1 in the seed system).
      floor: the temperature floor in Q units (``acting.tau_floor`` × the reward unit).
    Returns:
      ``[...]`` temperatures.
    """
    return kappa * jnp.maximum(q.max(axis=-1) - q.min(axis=-1), floor)


def boltzmann_probs(q: chex.Array, kappa=1.0, floor=0.01) -> chex.Array:
    """A1 action probabilities softmax(Q/τ) per branch, ``[..., 3]``.

    With τ = κ · spread the best action gets e^{1/κ} times the weight of the worst: exploration
    that is invariant to the scale of Q and sharpens as κ falls (κ = 1: e ≈ 2.72, κ = 0.25: 55).
    """
    temperature = boltzmann_temperature(q, kappa, floor)[..., None]
    return jax.nn.softmax(q / temperature, axis=-1)


def boltzmann_sample(key: chex.PRNGKey, q: chex.Array, kappa=1.0, floor=0.01) -> chex.Array:
    """A1: sample one action per branch from softmax(Q/τ) (training exploration; the
    ``boltzmann`` evaluation policy samples it with a fixed key).

    Args:
      key: PRNG key.
      q: ``[4, 3]`` acting values.
      kappa, floor: see :func:`boltzmann_temperature`.
    Returns:
      int32 ``[4]`` actions.
    """
    chex.assert_rank(q, 2)
    temperature = boltzmann_temperature(q, kappa, floor)[:, None]
    return jax.random.categorical(key, q / temperature, axis=-1).astype(jnp.int32)


def greedy_actions(q: chex.Array) -> chex.Array:
    """The evaluation policy's choice: argmax_a Q per branch, int32 ``[..., 4]`` from
    ``[..., 4, 3]`` (ties → the lowest index)."""
    return jnp.argmax(q, axis=-1).astype(jnp.int32)


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


def position_scale(q_var: chex.Array, direction: chex.Array, unit=1.0) -> chex.Array:
    """A3: position scale 1 / (1 + sqrt(Var[Q] of the taken direction action) / unit).

    High return-distribution uncertainty → smaller position (a Kelly-like shrink). ``unit`` is
    the reward unit (1 with ``reward_scale: auto``), so the shrink does not depend on the units
    Q is expressed in.

    Args:
      q_var: ``[4, 3]`` variances (M7) of one observation; row 0 is the direction branch.
      direction: int scalar, the taken direction action.
      unit: the reward unit in Q units.
    Returns:
      float32 scalar in (0, 1].
    """
    var = jnp.maximum(q_var[0, direction], 0.0)
    return (1.0 / (1.0 + jnp.sqrt(var) / unit)).astype(jnp.float32)


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
    kappa: chex.Array,
    key: chex.PRNGKey,
    *,
    iqn: bool = True,
    sizing: bool = True,
    greedy: bool = False,
    temperature_floor: float = 0.01,
    unit: float = 1.0,
) -> Decision:
    """The acting pipeline: network → A2 blend → M8–M11 coordination → A1 → A3.

    With ``greedy`` (the evaluation policy) it is network → M8–M11 on E[Q] → argmax → A3: no
    A2 blend (Q10/Q90 carry no direction information) and no sampling (with τ = Q_max − Q_min
    even a perfect Q picks the best of three evenly spaced actions only 51 % of the time).

    Args:
      model: :class:`jaxdqn.model.network.Model`.
      params: its parameters.
      obs: ``[E, D]`` observations.
      v_min, delta_z: the current support.
      readiness: A2 blend weight (float32 scalar).
      kappa: A1 temperature factor (float32 scalar).
      key: PRNG key, split once per environment (unused when greedy).
      iqn: A2 switch (off: act on E[Q]); sizing: A3 switch (off: scale 1).
      temperature_floor: A1 temperature floor in Q units; unit: the reward unit (A3).
    """
    out = model.act(params, obs, v_min, delta_z)
    values = out.q_mean
    if iqn and not greedy:
        values = iqn_blend(out.quantiles[..., 0], out.quantiles[..., 2], readiness)
    values = model.coordinate(params, values).q
    if greedy:
        actions = greedy_actions(values)
    else:
        keys = jax.random.split(key, obs.shape[0])
        sample = lambda k, q: boltzmann_sample(k, q, kappa, temperature_floor)
        actions = jax.vmap(sample)(keys, values)
    if sizing:
        scale = jax.vmap(lambda v, d: position_scale(v, d, unit))(out.q_var, actions[:, 0])
    else:
        scale = jnp.ones((obs.shape[0],), jnp.float32)
    return Decision(Action(actions, scale), out.selectivity, out.q_mean)


def make_eval_policy(
    model: Any,
    *,
    policy: str = "greedy",
    iqn: bool = True,
    sizing: bool = True,
    temperature_floor: float = 0.01,
    unit: float = 1.0,
):
    """The evaluation policy (``eval.policy``) for :func:`jaxdqn.evaluation.walk.walk` with
    traced ``policy_params = (params, v_min, delta_z, readiness)``: one compile serves every
    parameter set. ``greedy``: argmax of E[Q] after M8–M11 with A3 sizing; ``boltzmann``: the
    seed system's evaluation, A2 blend + A1 at κ = 1 sampled with the walk's fixed key."""
    if policy not in ("greedy", "boltzmann"):
        raise ValueError(f"eval policy must be greedy or boltzmann, got {policy!r}")
    greedy = policy == "greedy"

    def policy_fn(policy_params, obs, t, key):
        del t
        params, v_min, delta_z, readiness = policy_params
        d = decide(
            model,
            params,
            obs[None],
            v_min,
            delta_z,
            readiness,
            jnp.float32(1.0),
            key,
            iqn=iqn,
            sizing=sizing,
            greedy=greedy,
            temperature_floor=temperature_floor,
            unit=unit,
        )
        return d.action.choice[0], d.action.scale[0]

    return policy_fn


@dataclasses.dataclass(frozen=True)
class Acting:
    """The acting pipeline for one config (from :func:`make_acting`).

    Attributes:
      num_envs: ``E`` environments acting in parallel.
      steps: ``K`` environment steps per iteration.
      iqn_readiness: A2's initial readiness (the epoch loop ramps it).
      kappa_start: A1's initial temperature factor (the epoch loop schedules it).
      decide: ``(params, obs [E, D], v_min, delta_z, readiness, kappa, key) -> Decision``
        (training: A2 blend, A1 Boltzmann sample at temperature factor κ).
      eval_policy: the evaluation policy (``eval.policy``) for the evaluation walk (traced
        ``policy_params = (params, v_min, delta_z, readiness)``).
    """

    num_envs: int
    steps: int
    iqn_readiness: float
    kappa_start: float
    decide: Callable[..., Decision]
    eval_policy: Callable[..., tuple[chex.Array, chex.Array]]


def make_acting(
    cfg: ActingConfig, model: Any, *, eval_policy: str = "greedy", reward_unit: float = 1.0
) -> Acting:
    """Factory of the acting pipeline for ``cfg`` (A1 floor, A2 and A3 switches), ``model``,
    the evaluation policy's name and the reward unit (Q value of one bar's return std)."""
    iqn, sizing = cfg.iqn_blend, cfg.position_sizing
    temperature_floor = in_q_units(cfg.tau_floor, reward_unit)

    def decide_fn(params, obs, v_min, delta_z, readiness, kappa, key) -> Decision:
        return decide(
            model,
            params,
            obs,
            v_min,
            delta_z,
            readiness,
            kappa,
            key,
            iqn=iqn,
            sizing=sizing,
            temperature_floor=temperature_floor,
            unit=reward_unit,
        )

    return Acting(
        num_envs=cfg.num_envs,
        steps=cfg.steps,
        iqn_readiness=cfg.iqn_readiness,
        kappa_start=cfg.kappa_start,
        decide=decide_fn,
        eval_policy=make_eval_policy(
            model,
            policy=eval_policy,
            iqn=iqn,
            sizing=sizing,
            temperature_floor=temperature_floor,
            unit=reward_unit,
        ),
    )
