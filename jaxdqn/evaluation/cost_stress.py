"""Cost stress (docs/DESIGN.md, E3 and S1): one policy walked at k× the configured costs.

A result that lives only at the configured costs is fragile: the walk of
:func:`jaxdqn.evaluation.walk.walk` is repeated with every cost rate of the environment multiplied
by k (:func:`scale_costs`: half-spread, commission and the square-root impact coefficient η; the
limit trade-through margin is a fill rule, not a cost, and is kept), for k in
:data:`COST_MULTIPLES` = 0×, 1×, 2×, 3×. Nothing else changes: the same policy, bars and key.

``EnvParams`` is static, so each multiple would be a new compilation of the walk. Without impact
(``impact_eta = 0``, the default) the half-spread and commission enter the step only as
arithmetic, so :func:`stress_walk` traces them instead: the static parameters carry zero costs
and the rates are arguments, so one compiled walk serves every multiple (and every cost
configuration). The agent's walks (:func:`jaxdqn.program.run.walks.walk_seed`) go through it at 1×,
so the cost stress of a finished run reuses the test walk's compilation. With impact on it walks
each multiple with its own static parameters. At 1× either path gives the plain walk's log.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import pandas as pd

from jaxdqn.evaluation import walk as walk_lib
from jaxdqn.market import env

__all__ = [
    "COST_MULTIPLES",
    "at_rate",
    "cost_bps",
    "rollout_at_rate",
    "scale_costs",
    "stress_walk",
    "traced_costs",
]

COST_MULTIPLES = (0.0, 1.0, 2.0, 3.0)
"""The cost multiples of the report's stress table."""


def scale_costs(params: env.EnvParams, multiple: float) -> env.EnvParams:
    """``params`` with ``half_spread``, ``commission`` and ``impact_eta`` multiplied by
    ``multiple`` (≥ 0)."""
    if not multiple >= 0:
        raise ValueError(f"cost multiple: expected a number ≥ 0, got {multiple}")
    return dataclasses.replace(
        params,
        half_spread=params.half_spread * multiple,
        commission=params.commission * multiple,
        impact_eta=params.impact_eta * multiple,
    )


def cost_bps(params: env.EnvParams) -> dict[str, float]:
    """The cost rates of ``params`` in the config's units: ``half_spread_bps``,
    ``commission_bps`` and ``impact_eta``."""
    return {
        "half_spread_bps": params.half_spread * 1e4,
        "commission_bps": params.commission * 1e4,
        "impact_eta": params.impact_eta,
    }


def traced_costs(
    params: env.EnvParams, multiple: float = 1.0
) -> tuple[env.EnvParams, jax.Array | None]:
    """``(static parameters, rate)`` of a walk at ``multiple`` × the costs: without impact the
    static part carries zero costs and ``rate`` = float32 ``[half_spread, commission] ·
    multiple`` is a traced argument (:func:`at_rate`); with impact each multiple is its own
    static parameters and ``rate`` is None."""
    if params.impact_eta > 0:
        return scale_costs(params, multiple), None
    free = dataclasses.replace(params, half_spread=0.0, commission=0.0)
    rate = jnp.asarray([params.half_spread * multiple, params.commission * multiple], jnp.float32)
    return free, rate


def at_rate(params: env.EnvParams, rate: jax.Array) -> env.EnvParams:
    """``params`` with the (half-spread, commission) fractions ``rate`` ``[2]`` traced in (no
    impact: only arithmetic reads them)."""
    return dataclasses.replace(params, half_spread=rate[0], commission=rate[1])


def rollout_at_rate(
    env_params, market, t0, hi, n, policy_fn, key, policy_params, rate
) -> walk_lib.Trajectory:
    """:func:`walk.rollout` with the costs ``rate`` traced into ``env_params`` (:func:`at_rate`)."""
    params = at_rate(env_params, rate)
    return walk_lib.rollout(params, market, t0, hi, n, policy_fn, key, policy_params)


_rollout_at_rate_jit = jax.jit(rollout_at_rate, static_argnames=("env_params", "n", "policy_fn"))


def stress_walk(
    market: env.MarketData,
    env_params: env.EnvParams,
    lo: int,
    hi: int,
    policy_fn: walk_lib.PolicyFn,
    key: jax.Array,
    dates: pd.DatetimeIndex | None = None,
    multiples: Sequence[float] = COST_MULTIPLES,
    *,
    periods_per_year: float = 252,
    policy_params: Any = None,
) -> list[walk_lib.EvalResult]:
    """:func:`jaxdqn.evaluation.walk.walk` of ``policy_fn`` over ``[lo, hi)`` at each cost
    multiple (arguments as there; ``multiples`` ≥ 0): one :class:`~walk.EvalResult` per
    multiple, in order."""
    for k in multiples:
        scale_costs(env_params, k)  # validates k
    if env_params.impact_eta > 0:
        return [
            walk_lib.walk(
                market,
                scale_costs(env_params, k),
                lo,
                hi,
                policy_fn,
                key,
                dates,
                periods_per_year=periods_per_year,
                policy_params=policy_params,
            )
            for k in multiples
        ]
    t0, hi, n = walk_lib.decision_range(env_params, market, lo, hi)
    out = []
    for k in multiples:
        free, rate = traced_costs(env_params, k)
        traj = _rollout_at_rate_jit(
            free, market, jnp.int32(t0), jnp.int32(hi), n, policy_fn, key, policy_params, rate
        )
        out.append(walk_lib.evaluation_result(traj, dates, periods_per_year))
    return out
