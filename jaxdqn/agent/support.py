"""Adaptive C51 support (L7): centre and half-width tracked by an EMA whose rate grows only for
abnormal shifts.

The support is ``z_i = v_min + i·Δz``, ``v_min = centre − half``, ``Δz = 2·half / (N − 1)``.
"""

from __future__ import annotations

import chex
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class SupportState:
    """On-device support statistics (float32 scalars)."""

    centre: chex.Array
    half_width: chex.Array
    q_std_ema: chex.Array
    alpha: chex.Array  # the rate used by the last update (monitoring)


def init_support(centre: float = 0.0, half_width: float = 0.1) -> SupportState:
    f = lambda v: jnp.asarray(v, jnp.float32)
    return SupportState(f(centre), f(half_width), f(0.0), f(0.0))


def support_grid(state: SupportState, num_atoms: int) -> tuple[chex.Array, chex.Array]:
    """``(v_min, Δz)`` of the current support."""
    v_min = state.centre - state.half_width
    delta_z = 2.0 * state.half_width / (num_atoms - 1)
    return v_min, delta_z


def support_atoms(state: SupportState, num_atoms: int) -> chex.Array:
    """``[N]`` atom positions."""
    v_min, dz = support_grid(state, num_atoms)
    return v_min + dz * jnp.arange(num_atoms, dtype=jnp.float32)


def target_half_width(q_gap, q_std, min_half: float = 0.1):
    """half = max(10·q_gap, 3·q_std, min_half): about five atoms between adjacent actions'
    values (with 51 atoms), and room for the natural spread of Q."""
    return jnp.maximum(jnp.maximum(10.0 * q_gap, 3.0 * q_std), min_half)


def update_support(
    state: SupportState,
    q_mean: chex.Array,
    q_gap: chex.Array,
    q_std: chex.Array,
    *,
    base_alpha: float = 0.01,
    max_alpha: float = 0.5,
    abnormal_k: float = 3.0,
    min_half: float = 0.1,
) -> SupportState:
    """One L7 step from the batch's Q statistics.

    α = base + (max − base) · clip(|q_mean − centre| / (k·q_std_ema) − 1, 0, 1):
    a shift within k standard deviations of the natural Q oscillation keeps the slow base rate;
    only abnormal shifts (beyond k·q_std_ema) speed the EMA up, linearly up to ``max_alpha`` at
    2k. Centre and half-width then move by α toward q_mean and
    max(10·q_gap, 3·q_std, min_half).

    Args:
      q_mean, q_gap, q_std: scalars from the current batch (mean E[Q]; mean over branches of
        max − min; std of E[Q]).
    """
    # The first observation seeds the EMA: starting it at 0 would make every early shift
    # look abnormal.
    seeded = state.q_std_ema > 0
    q_std_ema = jnp.where(seeded, state.q_std_ema + base_alpha * (q_std - state.q_std_ema), q_std)
    baseline = jnp.maximum(jnp.where(seeded, state.q_std_ema, q_std), 1e-8)
    shift = jnp.abs(q_mean - state.centre)
    excess = jnp.clip(shift / (abnormal_k * baseline) - 1.0, 0.0, 1.0)
    alpha = base_alpha + (max_alpha - base_alpha) * excess
    centre = state.centre + alpha * (q_mean - state.centre)
    half = state.half_width + alpha * (target_half_width(q_gap, q_std, min_half) - state.half_width)
    return SupportState(
        centre.astype(jnp.float32),
        half.astype(jnp.float32),
        q_std_ema.astype(jnp.float32),
        jnp.asarray(alpha, jnp.float32),
    )
