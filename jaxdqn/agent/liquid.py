"""M14: liquid time constants — a per-branch multiplier ``liquid_mod`` on the spread term (L3).

One update per learner step, all on device (a pure ``(state, inputs) -> (state, liquid_mod)``).
For each branch b, given its current batch Q-gap ``g_b``:

1. **Q-gap EMA with adaptive alpha.** Relative surprise ``s = |g − ē| / max(ē, ε)``;
   ``α = α_min + (α_max − α_min) · s / (1 + s)`` (a gap that moves as expected updates slowly,
   an abnormal jump quickly); ``ē ← ē + α (g − ē)`` (the first update sets ``ē = g``).
2. **Velocity → time constant.** ``v = ē_t − ē_{t−1}``, relative speed ``ρ = |v| / max(ē, ε)``,
   ``τ = τ_min + (τ_max − τ_min) · tanh(ρ / ρ_ref)``: a branch that is learning fast gets a
   large τ (slow adaptation, no overshoot); a stuck branch gets a small τ (it reacts at once).
3. **Relaxation ODE.** ``d mod/dt = (1 − mod) / τ`` over one step ``dt``, integrated by explicit
   Euler, or by classical RK4 when the xLSTM context norm exceeds ``liquid_rk4_threshold``
   (chosen inside jit with ``lax.cond``). For constant τ the exact solution is
   ``mod(t) = 1 + (mod(0) − 1) · exp(−t/τ)``; Euler multiplies the deviation by ``1 − h``,
   RK4 by ``1 − h + h²/2 − h³/6 + h⁴/24`` per step (``h = dt/τ``).
4. **Spread amplifier.** ``target_gap = min(max(gap_mult · eval_q_std_ema, gap_floor · u),
   cap)`` with ``u`` the reward unit and ``cap`` L3's bound ``loss.spread_max_gap · u`` (L3
   fades out at that gap, so a larger target could only pin ``mod`` at its clip),
   ``A = min(target_gap / max(g, ε), liquid_max)``, ``mod ← min(mod · A, liquid_max)``.

So ``mod`` is a leaky multiplicative integrator of the amplifier: while a branch's gap stays
below target, its spread push grows (up to ``liquid_max``); once the gap reaches target
(A = 1) it relaxes back to 1 with the branch's own time constant. With M14 off, ``mod ≡ 1``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax import Array

from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config import DynamicsConfig

__all__ = [
    "Liquid",
    "LiquidInputs",
    "LiquidState",
    "euler_step",
    "make_liquid",
    "relax",
    "rk4_step",
]

_EPS = 1e-8


@struct.dataclass
class LiquidState:
    """Per-branch liquid state (all ``[4]`` unless noted), kept in the train state."""

    gap_ema: Array  # Q-gap EMA ē
    velocity: Array  # ē_t − ē_{t−1}
    alpha: Array  # EMA rate of the last update (monitoring)
    tau: Array  # time constant of the last update
    mod: Array  # liquid_mod: the spread-term multiplier
    used_rk4: Array  # [] bool: the last update integrated with RK4
    initialized: Array  # [] bool: ē holds a gap


class LiquidInputs(NamedTuple):
    """Per-update inputs: ``q_gap [4]`` (current batch, per branch), ``eval_q_std_ema []``
    and ``context_norm []`` (‖xLSTM context‖; 0 when M13 is off)."""

    q_gap: Array
    eval_q_std_ema: Array
    context_norm: Array


def _rate(m: Array, tau: Array) -> Array:
    return (1.0 - m) / tau


def euler_step(m: Array, tau: Array, dt: float) -> Array:
    """One explicit Euler step of ``dm/dt = (1 − m)/τ``."""
    return m + dt * _rate(m, tau)


def rk4_step(m: Array, tau: Array, dt: float) -> Array:
    """One classical Runge–Kutta-4 step of ``dm/dt = (1 − m)/τ``."""
    k1 = _rate(m, tau)
    k2 = _rate(m + 0.5 * dt * k1, tau)
    k3 = _rate(m + 0.5 * dt * k2, tau)
    k4 = _rate(m + dt * k3, tau)
    return m + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


def relax(m: Array, tau: Array, dt: float, use_rk4: Array) -> Array:
    """``rk4_step`` if ``use_rk4`` (a traced bool) else ``euler_step``, via ``lax.cond``."""
    return jax.lax.cond(
        use_rk4, lambda a: rk4_step(a, tau, dt), lambda a: euler_step(a, tau, dt), m
    )


@dataclasses.dataclass(frozen=True)
class Liquid:
    """Pure functions of M14 (from :func:`make_liquid`).

    - ``init_state() -> LiquidState`` (``mod = 1``, uninitialised EMA)
    - ``step(state, inputs: LiquidInputs) -> (state, liquid_mod [4])``
    """

    init_state: Callable[[], LiquidState]
    step: Callable[[LiquidState, LiquidInputs], tuple[LiquidState, Array]]


def make_liquid(
    cfg: DynamicsConfig, *, reward_unit: float = 1.0, gap_cap: float = float("inf")
) -> Liquid:
    """Factory of the M14 pure functions for ``cfg`` (``cfg.liquid`` switches it; the ordering
    of the alpha and tau bounds is checked with the rest of the config), the reward unit and
    the target-gap cap in Q units."""
    a_min, a_max = cfg.liquid_alpha_min, cfg.liquid_alpha_max
    t_min, t_max = cfg.liquid_tau_min, cfg.liquid_tau_max
    dt, cap = cfg.liquid_dt, cfg.liquid_max
    enabled, velocity_ref = cfg.liquid, cfg.liquid_velocity_ref
    rk4_threshold = cfg.liquid_rk4_threshold
    gap_mult, gap_floor = cfg.liquid_gap_mult, cfg.liquid_gap_floor * reward_unit

    def init_state() -> LiquidState:
        z = jnp.zeros((NUM_BRANCHES,), jnp.float32)
        return LiquidState(
            gap_ema=z,
            velocity=z,
            alpha=z,
            tau=jnp.full((NUM_BRANCHES,), t_min, jnp.float32),
            mod=jnp.ones((NUM_BRANCHES,), jnp.float32),
            used_rk4=jnp.zeros((), bool),
            initialized=jnp.zeros((), bool),
        )

    def step(state: LiquidState, inputs: LiquidInputs) -> tuple[LiquidState, Array]:
        if not enabled:
            return state, jnp.ones_like(state.mod)
        gap = jnp.asarray(inputs.q_gap, state.gap_ema.dtype)
        ema = state.gap_ema
        surprise = jnp.abs(gap - ema) / jnp.maximum(jnp.abs(ema), _EPS)
        alpha = jnp.where(
            state.initialized, a_min + (a_max - a_min) * surprise / (1.0 + surprise), 1.0
        )
        new_ema = ema + alpha * (gap - ema)
        velocity = jnp.where(state.initialized, new_ema - ema, 0.0)
        speed = jnp.abs(velocity) / jnp.maximum(jnp.abs(new_ema), _EPS)
        tau = t_min + (t_max - t_min) * jnp.tanh(speed / velocity_ref)

        use_rk4 = inputs.context_norm > rk4_threshold
        relaxed = relax(state.mod, tau, dt, use_rk4)

        target_gap = jnp.minimum(jnp.maximum(gap_mult * inputs.eval_q_std_ema, gap_floor), gap_cap)
        amp = jnp.minimum(target_gap / jnp.maximum(gap, _EPS), cap)
        mod = jnp.clip(relaxed * amp, 0.0, cap)
        new = LiquidState(
            gap_ema=new_ema,
            velocity=velocity,
            alpha=alpha,
            tau=tau,
            mod=mod,
            used_rk4=jnp.asarray(use_rk4, bool),
            initialized=jnp.ones((), bool),
        )
        return new, mod

    return Liquid(init_state=init_state, step=step)
