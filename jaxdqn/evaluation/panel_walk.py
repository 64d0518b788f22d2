"""E3 on a panel (issue 29): every instrument's walk of one policy in one compiled program, and
the cross-sectional score of a set of walks.

Instrument ``i`` walks its decision range ``[t0_i, hi_i)`` (global rows of the concatenated
market, :meth:`jaxdqn.market.panel_market.PanelPrepared.ranges` with ``walk=True``) exactly as
:func:`jaxdqn.evaluation.walk.walk` walks one instrument: flat at ``t0_i``, one step per decision
bar, the same key ``key`` for every instrument (as each would get walked alone). The walks are
one ``jax.vmap`` over instruments of :func:`~jaxdqn.evaluation.walk.rollout` with ``n = max_i
n_i`` steps, ``n_i = hi_i − 1 − t0_i``: instrument ``i``'s rows past ``n_i`` step into bars that
are not its own and are dropped before anything reads them (the mask is the slice ``[:n_i]``),
so a shorter instrument costs the compute of the longest and nothing else. One compilation
serves every instrument, seed and checkpoint (the policy's arrays are traced arguments).

The cost stress is the same walk with the half-spread and commission traced
(:mod:`jaxdqn.evaluation.cost_stress`); with square-root impact each multiple has its own static
parameters.

A panel walk's score is cross-sectional: :func:`cross_section` takes, for every metric, the
mean (or median, ``eval.select_on``) over instruments of each instrument's value (NaN ignored).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxdqn.evaluation import cost_stress
from jaxdqn.evaluation import walk as walk_lib
from jaxdqn.market import env

__all__ = ["PanelResult", "cross_section", "stress_walk_panel", "value_spread_rows"]


class PanelResult(NamedTuple):
    """The walks of one policy over every instrument of a panel.

    Attributes:
      log: every instrument's per-bar log (:data:`~jaxdqn.evaluation.walk.LOG_COLUMNS`, ``t``
        the instrument's own bar number) after an ``instrument`` column, instruments in order.
      metrics: per metric, the ``eval.select_on`` statistic over instruments
        (:func:`cross_section`).
      instruments: each instrument's :class:`~jaxdqn.evaluation.walk.EvalResult`, by name.
    """

    log: pd.DataFrame
    metrics: dict[str, float]
    instruments: dict[str, walk_lib.EvalResult]


def cross_section(
    results: Sequence[walk_lib.EvalResult], names: Sequence[str], select_on: str = "mean"
) -> PanelResult:
    """The :class:`PanelResult` of instrument walks ``results`` (named ``names``): its metrics
    are, per key, the NaN-ignoring mean or median over instruments (NaN where every instrument
    is NaN)."""
    if select_on not in ("mean", "median"):
        raise ValueError(f"select_on: {select_on!r} is not mean or median")
    stat = np.mean if select_on == "mean" else np.median
    metrics = {}
    for k in results[0].metrics:
        vals = np.asarray([r.metrics[k] for r in results], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        metrics[k] = float(stat(vals)) if vals.size else float("nan")
    log = pd.concat(
        [r.log.assign(instrument=n) for r, n in zip(results, names, strict=True)],
        ignore_index=True,
    )
    log = log[["instrument", *walk_lib.LOG_COLUMNS]]
    return PanelResult(log, metrics, dict(zip(names, results, strict=True)))


def _rollouts(env_params, market, t0s, his, n, policy_fn, key, policy_params, rate):
    """:func:`walk.rollout` (``rate`` None) or the traced-cost rollout, vmapped over ``t0s,
    his`` ``[I]``."""

    def one(t0, hi):
        if rate is None:
            return walk_lib.rollout(env_params, market, t0, hi, n, policy_fn, key, policy_params)
        return cost_stress.rollout_at_rate(
            env_params, market, t0, hi, n, policy_fn, key, policy_params, rate
        )

    return jax.vmap(one)(t0s, his)


_rollouts_jit = jax.jit(_rollouts, static_argnames=("env_params", "n", "policy_fn"))


def stress_walk_panel(
    market: env.MarketData,
    env_params: env.EnvParams,
    ranges: np.ndarray,
    offsets: Sequence[int],
    dates: Sequence[pd.DatetimeIndex],
    policy_fn: walk_lib.PolicyFn,
    key: jax.Array,
    multiples: Sequence[float] = (1.0,),
    *,
    periods_per_year: float = 252,
    policy_params: Any = None,
) -> list[list[walk_lib.EvalResult]]:
    """Every instrument's walk at each cost multiple: ``out[m][i]`` is instrument ``i``'s
    :class:`~jaxdqn.evaluation.walk.EvalResult` at ``multiples[m]``.

    Args:
      market, env_params: the panel's concatenated market and its static parameters.
      ranges: int ``[I, 2]`` global ``[lo, hi)`` walk ranges.
      offsets: each instrument's first global row (its log's ``t`` counts from there).
      dates: each instrument's timestamps ``[T_i]``.
      policy_fn, key, periods_per_year, policy_params: as :func:`jaxdqn.evaluation.walk.walk`.

    Raises:
      ValueError: a range without a decision bar, or a negative multiple.
    """
    spans = [walk_lib.decision_range(env_params, market, lo, hi) for lo, hi in ranges]
    n = max(s[2] for s in spans)
    t0s = jnp.asarray([s[0] for s in spans], jnp.int32)
    his = jnp.asarray([s[1] for s in spans], jnp.int32)
    for k in multiples:
        cost_stress.scale_costs(env_params, k)  # validates k
    out = []
    for k in multiples:
        params, rate = cost_stress.traced_costs(env_params, k)
        traj = jax.device_get(
            _rollouts_jit(params, market, t0s, his, n, policy_fn, key, policy_params, rate)
        )
        walks = []
        for i, (_t0, _hi, n_i) in enumerate(spans):
            own = jax.tree.map(lambda x, n_i=n_i, i=i: np.asarray(x[i, :n_i]), traj)
            own = own._replace(t=own.t - np.int32(offsets[i]))
            walks.append(walk_lib.evaluation_result(own, dates[i], periods_per_year))
        out.append(walks)
    return out


def value_spread_rows(
    model: Any,
    net_params: Any,
    market: env.MarketData,
    env_params: env.EnvParams,
    rows: jax.Array,
    v_min: jax.Array,
    delta_z: jax.Array,
) -> jax.Array:
    """:func:`jaxdqn.evaluation.walk.value_spread` over the bars ``rows`` (int32 ``[N]``, e.g.
    every instrument's val bars): the std of E[Q] seen flat at each of them."""
    key = jax.random.PRNGKey(0)  # unused by reset_at's state; observations are deterministic
    obs = jax.vmap(lambda t: env.reset_at(env_params, market, t, t, t + 1, key)[1])(rows)
    return jnp.std(model.apply(net_params, obs, v_min, delta_z).q_mean)
