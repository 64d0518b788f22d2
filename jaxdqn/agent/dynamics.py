"""Training statistics: the one owner of the state that drives the training dynamics.

Everything the learner and the acting policy adapt to, and nothing else, lives in
:class:`DynamicsState` and is written only by this module's functions (bound by
:func:`make_dynamics`):

====================== =========================================== ===========================
state                  meaning                                     written by
====================== =========================================== ===========================
support                L7 adaptive support (centre, half-width)    ``observe_batch``
reward_std_ema         EMA of the std of the n-step rewards        ``observe_rollout``
                       written to replay (L5 scale)
utilisation_ema        EMA of the atom utilisation (L4 ramp)       ``observe_batch``
q_mean, q_gap, q_std   ``[4]`` EMAs of the batch Q statistics      ``observe_batch``
                       (O5 reads the Q-gap EMA once per epoch)
last_stats             ``[4, 3]`` the previous batch's (mean Q,    ``observe_batch``
                       Q-gap, Q-std), M13's input
xlstm                  M13 recurrent state                         ``observe_batch``
liquid                 M14 state; ``liquid.mod`` scales L3         ``observe_batch``
eval_q_std_ema         EMA of the validation Q spread (M14 target) ``set_host_inputs``
iqn_readiness          A2 blend weight                             ``set_host_inputs``
kappa                  A1 temperature factor κ                     ``set_host_inputs``
====================== =========================================== ===========================

Every EMA ``x ← x + α (new − x)``; the reward-std EMA is seeded by its first observation (an
EMA started at 0 would make the early scale meaningless). Rates come from
:class:`~jaxdqn.config.DynamicsConfig`. The support (:mod:`jaxdqn.agent.support`) and liquid
(:mod:`jaxdqn.agent.liquid`) math live in their own modules; this one is their only caller.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import chex
import jax.numpy as jnp
import numpy as np
from flax import struct

from jaxdqn.agent.liquid import Liquid, LiquidInputs, LiquidState, make_liquid
from jaxdqn.agent.support import SupportState, init_support, support_grid, update_support
from jaxdqn.branches import NUM_BRANCHES
from jaxdqn.config import DynamicsConfig
from jaxdqn.model.xlstm import XLSTMState, batch_statistics

__all__ = [
    "BatchObservation",
    "Dynamics",
    "DynamicsState",
    "Rates",
    "init",
    "make_dynamics",
    "next_eval_q_std",
    "observe_batch",
    "observe_rollout",
    "set_host_inputs",
]


@struct.dataclass
class DynamicsState:
    """Training statistics of one agent, on device (float32 unless noted); see the module
    docstring for the meaning and the writer of each field."""

    support: SupportState
    reward_std_ema: chex.Array
    utilisation_ema: chex.Array
    q_mean: chex.Array
    q_gap: chex.Array
    q_std: chex.Array
    last_stats: chex.Array
    xlstm: XLSTMState
    liquid: LiquidState
    eval_q_std_ema: chex.Array
    iqn_readiness: chex.Array
    kappa: chex.Array


class BatchObservation(NamedTuple):
    """What one learner update saw (no gradient).

    Attributes:
      q_mean: ``[B, 4, 3]`` E[Q] of the online network on the batch.
      td: ``[B, 4]`` scalar TD targets r + γⁿ E[Q′(s′, a′)] (L7 centre).
      reward: ``[B]`` the batch's n-step rewards as the targets used them (L7 width).
      utilisation: scalar atom utilisation of its distributions.
      xlstm: the M13 state after this update's step (from the L6 prediction loss).
      context: ``[d]`` the M13 context vector of that step.
    """

    q_mean: chex.Array
    td: chex.Array
    reward: chex.Array
    utilisation: chex.Array
    xlstm: XLSTMState
    context: chex.Array


class Rates(NamedTuple):
    """The numbers :func:`observe_batch` adapts with (from :class:`DynamicsConfig`, thresholds
    already in Q units)."""

    ema: float  # α of every batch-statistics EMA
    adaptive: bool  # L7 on
    gamma_n: float  # the bootstrap discount γⁿ
    sigmas: float  # L7 half-width in TD stds
    min_half: float  # L7 smallest half-width (Q units)
    base_alpha: float  # L7 rates
    max_alpha: float


@dataclasses.dataclass(frozen=True)
class Dynamics:
    """Pure functions over :class:`DynamicsState` (from :func:`make_dynamics`).

    - ``init(xlstm_state, iqn_readiness, kappa) -> DynamicsState``
    - ``grid(state) -> (v_min, Δz)`` of the current support (scalars, or ``[S]`` for a
      population's stacked state)
    - ``observe_rollout(state, reward [M], valid [M]) -> state``: the reward-std EMA of the
      n-step rewards written to replay (``valid`` masks the slots that hold one)
    - ``observe_batch(state, BatchObservation) -> (state, metrics)``: L7, the Q EMAs, M13, M14
    - ``set_host_inputs(state, iqn_readiness=, kappa=, eval_q_std_ema=) -> state`` (host)
    - ``next_eval_q_std(previous, spread) -> list[float]`` the host EMA of the validation Q
      spread (seeded by the first spread)

    ``rates`` and ``liquid`` are what ``observe_batch`` is bound to (a population member
    rebinds the rates with its own γⁿ: :func:`jaxdqn.agent.learner.step`).
    """

    num_atoms: int
    rates: Rates
    liquid: Liquid
    init: Callable[[XLSTMState, float, float], DynamicsState]
    grid: Callable[[DynamicsState], tuple[chex.Array, chex.Array]]
    observe_rollout: Callable[[DynamicsState, chex.Array, chex.Array], DynamicsState]
    observe_batch: Callable[
        [DynamicsState, BatchObservation], tuple[DynamicsState, dict[str, chex.Array]]
    ]
    set_host_inputs: Callable[..., DynamicsState]
    next_eval_q_std: Callable[[Sequence[float] | None, Any], list[float]]


def init(
    xlstm: XLSTMState,
    iqn_readiness: float,
    kappa: float = 1.0,
    *,
    half_width0: float,
    liquid: Liquid,
) -> DynamicsState:
    """The statistics before any update: the support at ``±half_width0`` around 0, every EMA at
    its start, M13's state ``xlstm`` and the host inputs given."""
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    z4 = jnp.zeros((NUM_BRANCHES,), jnp.float32)
    return DynamicsState(
        support=init_support(0.0, half_width0),
        reward_std_ema=f32(0.0),
        utilisation_ema=f32(1.0),
        q_mean=z4,
        q_gap=z4,
        q_std=z4,
        last_stats=jnp.zeros((NUM_BRANCHES, 3), jnp.float32),
        xlstm=xlstm,
        liquid=liquid.init_state(),
        eval_q_std_ema=f32(0.0),
        iqn_readiness=f32(iqn_readiness),
        kappa=f32(kappa),
    )


def observe_rollout(
    state: DynamicsState, reward: chex.Array, valid: chex.Array, *, alpha: Any
) -> DynamicsState:
    """The reward-std EMA (rate ``alpha``) of the n-step rewards ``[M]`` written to replay
    (``valid`` masks the slots that hold one; seeded by its first observation)."""
    w = valid.astype(jnp.float32)
    count = w.sum()
    mean = jnp.sum(w * reward) / jnp.maximum(count, 1.0)
    std = jnp.sqrt(jnp.sum(w * (reward - mean) ** 2) / jnp.maximum(count, 1.0))
    old = state.reward_std_ema
    new = jnp.where(old > 0, old + alpha * (std - old), std)
    # Before n steps have been taken no slot holds a transition: nothing observed.
    return state.replace(reward_std_ema=jnp.where(count > 1, new, old))


def observe_batch(
    state: DynamicsState, seen: BatchObservation, *, rates: Rates, liquid: Liquid
) -> tuple[DynamicsState, dict[str, chex.Array]]:
    """L7, the Q EMAs, M13 and M14 from what one learner update saw; and their metrics."""
    stats = batch_statistics(seen.q_mean)  # [4, 3]: mean Q, Q-gap, Q-std per branch
    support = state.support
    if rates.adaptive:
        support = update_support(
            support,
            seen.td.mean(),
            seen.td.std(),
            seen.reward.std(),
            gamma_n=rates.gamma_n,
            sigmas=rates.sigmas,
            min_half=rates.min_half,
            base_alpha=rates.base_alpha,
            max_alpha=rates.max_alpha,
        )
    ema = lambda old, new: old + rates.ema * (new - old)
    gap = stats[:, 1]
    inputs = LiquidInputs(gap, state.eval_q_std_ema, jnp.linalg.norm(seen.context))
    liquid_state, liquid_mod = liquid.step(state.liquid, inputs)
    new = state.replace(
        support=support,
        utilisation_ema=ema(state.utilisation_ema, seen.utilisation),
        q_mean=ema(state.q_mean, stats[:, 0]),
        q_gap=ema(state.q_gap, gap),
        q_std=ema(state.q_std, stats[:, 2]),
        last_stats=stats,
        xlstm=seen.xlstm,
        liquid=liquid_state,
    )
    metrics = {
        "q_mean": stats[:, 0],
        "q_gap": gap,
        "q_std": stats[:, 2],
        "support_centre": support.centre,
        "support_half_width": support.half_width,
        "liquid_mod": liquid_mod,
        "liquid_tau": liquid_state.tau,
        "liquid_rk4": liquid_state.used_rk4.astype(jnp.float32),
    }
    return new, metrics


def set_host_inputs(state: DynamicsState, **values: Any) -> DynamicsState:
    """Write ``iqn_readiness`` / ``kappa`` / ``eval_q_std_ema`` as float32 arrays of the
    existing shape, so the jitted iteration sees the same avals and never recompiles."""
    unknown = set(values) - {"iqn_readiness", "kappa", "eval_q_std_ema"}
    if unknown:
        raise TypeError(f"set_host_inputs: not host inputs: {sorted(unknown)}")
    updates = {}
    for name, v in values.items():
        old = getattr(state, name)
        updates[name] = jnp.broadcast_to(jnp.asarray(v, jnp.float32), old.shape)
    return state.replace(**updates)


def next_eval_q_std(
    previous: Sequence[float] | None, spread: Any, *, alpha: float | Sequence[float]
) -> list[float]:
    """The host EMA (rate ``alpha``; a population: one rate per agent) of the validation Q
    spread ``[S]``, seeded by the first spread."""
    # numpy scalars on purpose: the result is float32 arithmetic, as recorded runs expect.
    spread = np.asarray(spread).reshape(-1)
    prev = list(previous) if previous else list(spread)
    rates = [alpha] * len(spread) if isinstance(alpha, int | float) else list(alpha)
    triples = zip(prev, spread, rates, strict=True)
    return [float(p + a * (s - p)) for p, s, a in triples]


def make_dynamics(
    cfg: DynamicsConfig,
    *,
    num_atoms: int,
    gamma_n: float,
    reward_unit: float = 1.0,
    gap_cap: float = float("inf"),
) -> Dynamics:
    """The training-statistics functions for ``cfg``, ``num_atoms`` atoms, the bootstrap
    discount ``γⁿ``, the reward unit (Q value of one bar's return std: every threshold in reward
    units is multiplied by it) and M14's target-gap cap in Q units (L3's bound), bound to the
    module's functions."""
    liquid = make_liquid(cfg, reward_unit=reward_unit, gap_cap=gap_cap)
    rates = Rates(
        ema=cfg.stats_alpha,
        adaptive=cfg.adaptive_support,
        gamma_n=gamma_n,
        sigmas=cfg.support_sigmas,
        min_half=cfg.support_min_half_width * reward_unit,
        base_alpha=cfg.support_alpha,
        max_alpha=cfg.support_max_alpha,
    )
    half_width0 = cfg.support_half_width * reward_unit
    return Dynamics(
        num_atoms=num_atoms,
        rates=rates,
        liquid=liquid,
        init=functools.partial(init, half_width0=half_width0, liquid=liquid),
        grid=lambda state: support_grid(state.support, num_atoms),
        observe_rollout=functools.partial(observe_rollout, alpha=cfg.stats_alpha),
        observe_batch=functools.partial(observe_batch, rates=rates, liquid=liquid),
        set_host_inputs=set_host_inputs,
        next_eval_q_std=functools.partial(next_eval_q_std, alpha=cfg.eval_q_std_alpha),
    )
