"""Learner targets: the sampled next action and target distribution (L2), reward ranks (L5).

Shapes: ``B`` batch, 4 branches, 3 actions, ``N`` atoms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp

import pallas_kernels
from jaxdqn.agent.resolve import Projection
from jaxdqn.shards import ONE_DEVICE, Shards
from pallas_kernels.c51_target import TEMPERATURE_REL_FLOOR, c51_target

AUTO_PROJECTION = Projection("auto", "reference")
"""P1 as ``kernels.projection: auto`` runs without ``train.deterministic``."""


def next_action_temperature(q_next: chex.Array, floor=1e-6) -> chex.Array:
    """L2 temperature per branch: τ = max(Q'_gap, max(|mean Q'|·0.01, floor)), ``floor`` in Q
    units (``acting.tau_floor`` × the reward unit).

    With τ equal to the gap, adjacent values keep a constant e:1 weight ratio whatever their
    scale (τ = gap/3 made the target effectively argmax and froze learning in the seed system).

    Args:
      q_next: ``[..., 3]`` target-network E[Q'] of one branch.
    Returns:
      ``[...]`` temperatures.
    """
    gap = q_next.max(axis=-1) - q_next.min(axis=-1)
    rel = jnp.maximum(jnp.abs(q_next.mean(axis=-1)) * TEMPERATURE_REL_FLOOR, floor)
    return jnp.maximum(gap, rel)


def sample_next_actions(key: chex.PRNGKey, q_next: chex.Array, floor=1e-6) -> chex.Array:
    """L2: per sample and branch, a' ~ softmax(E[Q']/τ).

    A fresh key every update keeps the target stochastic; a fixed key (or the deterministic
    softmax mixture) makes the target a fixed point with zero gradient.

    Args:
      key: PRNG key, fresh each update.
      q_next: ``[B, 4, 3]`` target-network expected values at s'.
      floor: temperature floor in Q units.
    Returns:
      int32 ``[B, 4]``.
    """
    chex.assert_rank(q_next, 3)
    temperature = next_action_temperature(q_next, floor)[..., None]
    return jax.random.categorical(key, q_next / temperature, axis=-1).astype(jnp.int32)


class Target(NamedTuple):
    """Projected target distributions and the scalar TD targets they imply."""

    probs: chex.Array  # [B, 4, N] on the current support
    td: chex.Array  # [B, 4] = r + γⁿ · E[Q'(s', a')]
    next_actions: chex.Array  # [B, 4]
    end_mass: chex.Array  # [] mean projected mass on the two end atoms (L7 coverage)


def target_distribution(
    key: chex.PRNGKey,
    probs_next: chex.Array,
    q_next: chex.Array,
    reward: chex.Array,
    discount: chex.Array,
    v_min: chex.Array,
    delta_z: chex.Array,
    *,
    projection: Projection = AUTO_PROJECTION,
    temperature_floor: float = 1e-6,
    sampled: bool = True,
    shards: Shards = ONE_DEVICE,
) -> Target:
    """L2 + projection: the categorical target r + γⁿ·Z(s', a') on the current support.

    The source atoms ``r + γⁿ z_j`` are projected onto ``v_min + i·Δz`` by ``c51_project``
    (P1; atoms outside the support clip to its ends). For a terminal transition
    ``discount = 0`` and all the mass lands at the projection of ``r``.

    Args:
      key: fresh PRNG key.
      probs_next: ``[B, 4, 3, N]`` target-network probabilities at s'.
      q_next: ``[B, 4, 3]`` their expectations.
      reward: ``[B]`` (n-step, possibly rank-normalised) returns.
      discount: ``[B]`` γⁿ, or 0 where the episode ended inside the n steps.
      v_min, delta_z: scalars of the current support.
      projection: P1's backend and fallback; temperature_floor: L2's, in Q units.
      sampled: L2 on (sample a′); off: a′ = argmax E[Q′] (the plain DQN target).
      shards: the devices the batch is split over; a′ is drawn for the global batch (its
        ``[B·D, 4, 3]`` expectations gathered) and this device's rows kept, so the draws are
        those of one device holding the whole batch; ``end_mass`` is the global mean.
    """
    chex.assert_rank([probs_next, q_next, reward, discount], [4, 3, 1, 1])
    b, nb, _, n = probs_next.shape
    if sampled:
        a_next = shards.rows(sample_next_actions(key, shards.gather(q_next), temperature_floor), b)
    else:
        a_next = jnp.argmax(q_next, axis=-1).astype(jnp.int32)
    p = jnp.take_along_axis(probs_next, a_next[:, :, None, None], axis=2)[:, :, 0]  # [B,4,N]
    z = v_min + delta_z * jnp.arange(n, dtype=probs_next.dtype)
    atoms = reward[:, None, None] + discount[:, None, None] * z  # [B,1,N]
    atoms = jnp.broadcast_to(atoms, (b, nb, n))
    projected = pallas_kernels.c51_project(
        jax.lax.stop_gradient(p).reshape(b * nb, n),
        atoms.reshape(b * nb, n),
        v_min,
        delta_z,
        backend=projection.backend,
        fallback=projection.fallback,
    ).reshape(b, nb, n)
    q_sel = jnp.take_along_axis(q_next, a_next[:, :, None], axis=2)[:, :, 0]
    td = reward[:, None] + discount[:, None] * q_sel
    end_mass = shards.mean(jnp.mean(projected[..., 0] + projected[..., -1]))
    return Target(
        jax.lax.stop_gradient(projected),
        jax.lax.stop_gradient(td),
        a_next,
        jax.lax.stop_gradient(end_mass),
    )


def per_group(x: Any, rows: int, branches: int) -> chex.Array:
    """A scalar or per-sample ``[rows]`` value as float32 ``[rows · branches]``, one entry per
    (sample, branch) group in row-major order (the kernels' groups)."""
    return jnp.repeat(jnp.broadcast_to(jnp.asarray(x, jnp.float32), (rows,)), branches)


TARGET_HEADS = ("pallas", "interpret")
"""The resolved ``kernels.target_head`` settings that run :func:`target_from_network`."""


def target_from_network(
    key: chex.PRNGKey,
    out: Any,
    reward: chex.Array,
    discount: chex.Array,
    v_min: chex.Array,
    delta_z: chex.Array,
    *,
    backend: str,
    temperature_floor: Any = 1e-6,
    sampled: bool = True,
    shards: Shards = ONE_DEVICE,
) -> Target:
    """L2 + P1 as :func:`target_distribution`, from the target network's output ``out`` at s′
    (its logits ``[B, 4, 3, N]``, or its heads ``[B, 4, 4, W]`` where the model gives them) by
    one kernel (:func:`pallas_kernels.c51_target.c51_target`; ``backend`` ``pallas`` or
    ``interpret``): M6, M7's E[Q′], the draw of a′, the TD target and P1 per (sample, branch),
    nothing of ``[B, 4, 3, N]`` written. a′ = argmax(E[Q′]/τ + ε) with ε the Gumbel noise
    ``jax.random.categorical`` draws from ``key`` for the global batch's ``[B·D, 4, 3]``
    (this device's rows kept), so the draws are :func:`target_distribution`'s up to the
    rounding of E[Q′]; ``sampled`` off: ε = 0, the greedy a′."""
    if backend not in TARGET_HEADS:
        raise ValueError(f"kernels.target_head: {backend!r} is not one of {TARGET_HEADS}")
    b, nb, na, n = out.logits.shape
    dueling = out.heads is not None
    x = out.heads if dueling else out.logits
    if sampled:
        shape = (b * shards.count, nb, na)
        noise = shards.rows(jax.random.gumbel(key, shape, jnp.float32), b)
    else:
        noise = jnp.zeros((b, nb, na), jnp.float32)
    projected, td, a_next, _ = c51_target(
        x.reshape(b * nb, x.shape[2], x.shape[3]),
        noise.reshape(b * nb, na),
        per_group(reward, b, nb),
        per_group(discount, b, nb),
        per_group(v_min, b, nb),
        per_group(delta_z, b, nb),
        temperature_floor,
        num_atoms=n,
        dueling=dueling,
        backend=backend,
    )
    projected = projected.reshape(b, nb, n)
    end_mass = shards.mean(jnp.mean(projected[..., 0] + projected[..., -1]))
    return Target(
        jax.lax.stop_gradient(projected),
        jax.lax.stop_gradient(td.reshape(b, nb)),
        a_next.reshape(b, nb),
        jax.lax.stop_gradient(end_mass),
    )


def average_ranks(x: chex.Array) -> chex.Array:
    """0-based ranks of ``x`` ``[B]`` with ties given their average rank.

    rank_i = #{j : x_j < x_i} + (#{j : x_j = x_i} − 1) / 2, counted by comparing all pairs:
    one fused compare-and-count pass of O(B²) comparisons and O(B) memory (XLA does not
    materialise the ``[B, B]`` comparisons). Integer counts, so the result is exact and equal
    bit for bit to the sort + binary-search formulation it replaced (which cost a sort and a
    ~50-kernel search loop per learner update on the GPU: 34 + ~50 µs at B = 4,096, issue 12).
    """
    less = jnp.sum(x[None, :] < x[:, None], axis=1, dtype=jnp.int32)
    less_equal = jnp.sum(x[None, :] <= x[:, None], axis=1, dtype=jnp.int32)
    return 0.5 * (less + less_equal - 1).astype(x.dtype)


def rank_normalise(reward: chex.Array, reward_std_ema: chex.Array, eps: float = 1e-8):
    """L5: replace batch rewards by centred ranks with the scale of the observed reward std.

    r̃_i = (rank_i − (B−1)/2) / std(rank) · σ_ema, ties averaged. Ranks make the learner
    insensitive to fat-tailed rewards while σ_ema keeps their scale. While σ_ema ≈ 0 (before any
    reward was observed) the raw rewards pass through, since scaling by ≈0 would erase them.

    Args:
      reward: ``[B]``.
      reward_std_ema: scalar.
    Returns:
      ``[B]`` normalised rewards.
    """
    chex.assert_rank(reward, 1)
    ranks = average_ranks(reward)
    centred = ranks - ranks.mean()
    scale = jnp.sqrt(jnp.mean(centred**2))
    normalised = jnp.where(scale > 0, centred / jnp.maximum(scale, eps), 0.0) * reward_std_ema
    return jnp.where(reward_std_ema > eps, normalised, reward)
