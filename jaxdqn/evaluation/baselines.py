"""E3 baselines: simple strategies walked through the same environment, costs and evaluator.

Every baseline is a policy ``policy_fn(obs, t, key) -> (action, scale)`` (see
:mod:`jaxdqn.evaluation.walk`). All but ``random`` follow a precomputed per-bar :class:`Signal`
(direction and position scale for the decision after bar t closes, computed causally in numpy
from bars ≤ t) and trade it with a **full-size market order at the open of bar t+1**
(magnitude = the largest level, urgency high), so the fraction of equity they hold is
``clip(d_t · level_high · scale_t · L, −L, L)`` with ``L = env.max_leverage``:

=============  =================================================================================
flat           d = 0 always: never trades, equity stays 1.
buy_and_hold   d = +1, scale 1: long L from the first bar. The order is sized at close[t] and
               filled at open[t+1] after costs, so the fraction lands a hair off target and the
               next bar's order trims it (a trade of the size of the overnight gap plus the
               costs, ~2e-4 of equity); once the account holds no cash the fraction stays at the
               target as prices move and the environment's dead band sends no further order.
random         each of the four branch actions uniform in {0, 1, 2}, scale 1, drawn from the
               walk's key (``cfg.eval.key``): reproducible, different under another key.
momentum       d_t = sign(log(close[t] / close[t − N])), N = ``baselines.momentum_lookback``
               (252: the 12-month time-series momentum); flat while t < N.
macd           MACD line m_t = EMA_fast(close)_t − EMA_slow(close)_t, signal line
               s_t = EMA_signal(m)_t (EMAs with α = 2/(span + 1), started at the first bar:
               pandas ``ewm(span, adjust=False)``); d_t = +1 when m_t > s_t, −1 when m_t < s_t
               (``macd_mode=long_short``; ``long_flat``: 0 instead of −1), 0 when equal and
               while t < slow + signal (the EMAs' warm-up).
vol_target     long with position fraction w_t = min(V / (σ̂_t · sqrt(ppy)), L), ppy the bar clock
               (bars per year, :mod:`jaxdqn.market.clock`): V the annual
               volatility target ``baselines.vol_target``, σ̂_t the environment's causal per-bar
               volatility (``MarketData.sigma``), passed through the position-scale input as
               scale_t = V / (σ̂_t · sqrt(ppy)) / (level_high · L) (the environment caps at L);
               flat where σ̂_t is 0 (before its warm-up).
oracle         synthetic market only: d_t = the ``oracle`` column, the sign of the best one-bar
               forecast of the planted AR(1) signal, traded with its **best execution** (below).
=============  =================================================================================

Oracle with best execution. The oracle's direction (full size, scale 1) is walked with every
execution the agent has, order type {market, limit, limit-then-market} × urgency {low, mid,
high} (:data:`ORACLE_EXECUTIONS`; rows ``oracle_<order>_<urgency>``, e.g. ``oracle_market_high``
= market at the next open, ``oracle_limit_low`` = the deepest limit). The ``oracle`` row is a
copy of the execution with the highest **val** Sharpe (ties: the first in table order; the
choice is never made on test, whose numbers are only reported), named in
``table.attrs["oracle_execution"]`` (:func:`oracle_execution`). So the agent is compared with the
best the known direction achieves through the same environment, fills included.
:func:`policies` returns ``oracle`` with the fixed market-at-open execution (it walks nothing, so
it cannot choose) and every ``oracle_<order>_<urgency>`` policy.

``python -m jaxdqn.baselines [--config PATH] [key=value ...]`` prints their val and test
metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from jaxdqn import config
from jaxdqn.branches import ACTION_NAMES
from jaxdqn.evaluation import walk as evaluate
from jaxdqn.market import env
from jaxdqn.market import market as market_setup

__all__ = [
    "BASELINE_NAMES",
    "ORACLE_EXECUTIONS",
    "TABLE_METRICS",
    "Signal",
    "best_execution",
    "buy_and_hold_signal",
    "describe_execution",
    "device_signal",
    "flat_signal",
    "follow_signal",
    "macd_signal",
    "momentum_signal",
    "oracle_execution",
    "oracle_signal",
    "policies",
    "random_policy",
    "run_baselines",
    "signal_policy",
    "signals",
    "vol_target_signal",
    "walk_jobs",
]

BASELINE_NAMES = (
    "flat",
    "buy_and_hold",
    "random",
    "momentum",
    "macd",
    "vol_target",
    "oracle",
)
"""Every baseline, in table order (``oracle`` only on the synthetic market, where the rows of
:data:`ORACLE_EXECUTIONS` follow)."""

TABLE_METRICS = (
    "sharpe",
    "sortino",
    "max_drawdown",
    "annual_return",
    "annual_turnover",
    "exposure",
)
"""Columns the command-line table prints for each split."""

# Branch action indices (see jaxdqn.market.env): direction 0 short / 1 flat / 2 long; the largest
# magnitude level; market order; high urgency = fill at the next open.
_MAGNITUDE_FULL = 2
_ORDER_MARKET = 0
_URGENCY_OPEN = 2

ORACLE_EXECUTIONS: dict[str, tuple[int, int]] = {
    f"oracle_{order}_{urgency}": (o, u)
    for o, order in enumerate(ACTION_NAMES["order"])
    for u, urgency in enumerate(ACTION_NAMES["urgency"])
}
"""Row name → (order, urgency) action indices of every execution of the oracle's direction,
in table order (order type market, limit, limit_then_market; urgency low, mid, high)."""


def describe_execution(name: str) -> str:
    """``"oracle_limit_then_market_low"`` → ``"limit-then-market, low urgency"``."""
    order, urgency = ORACLE_EXECUTIONS[name]
    words = ACTION_NAMES["order"][order].replace("_", "-")
    return f"{words}, {ACTION_NAMES['urgency'][urgency]} urgency"


def oracle_execution(table: pd.DataFrame) -> str | None:
    """The :data:`ORACLE_EXECUTIONS` name that :func:`run_baselines` copied into its ``oracle``
    row (chosen on val), or None when the table has no oracle."""
    return table.attrs.get("oracle_execution")


class Signal(NamedTuple):
    """A per-bar decision of a signal-following baseline, indexed by decision bar t.

    direction: int32 [T] in {0, 1, 2} (short, flat, long) = d_t + 1.
    scale: float32 [T] position scale (1.0 when the baseline does not size).
    order, urgency: int32 scalars, the execution of every order (default: market at the
      next open).
    """

    direction: np.ndarray
    scale: np.ndarray
    order: int | np.ndarray = _ORDER_MARKET
    urgency: int | np.ndarray = _URGENCY_OPEN


def _signal(d: np.ndarray, scale: np.ndarray | None = None) -> Signal:
    d = np.asarray(d)
    s = np.ones(d.shape[0]) if scale is None else scale
    return Signal(direction=(d + 1).astype(np.int32), scale=np.asarray(s, dtype=np.float32))


def flat_signal(num_bars: int) -> Signal:
    """Always flat."""
    return _signal(np.zeros(num_bars))


def buy_and_hold_signal(num_bars: int) -> Signal:
    """Always long at full size."""
    return _signal(np.ones(num_bars))


def momentum_signal(close: np.ndarray, lookback: int) -> Signal:
    """d_t = sign(log(close[t] / close[t − lookback])), 0 while t < lookback."""
    close = np.asarray(close, dtype=np.float64)
    d = np.zeros(close.shape[0])
    d[lookback:] = np.sign(np.log(close[lookback:] / close[:-lookback]))
    return _signal(d)


def macd_signal(
    close: np.ndarray, fast: int, slow: int, signal: int, long_short: bool = True
) -> Signal:
    """MACD trend: long when the MACD line is above its signal line, short (or flat) below.

    Causal: the EMAs at t use closes ≤ t only (recursive, ``adjust=False``).
    """
    c = pd.Series(np.asarray(close, dtype=np.float64))
    line = c.ewm(span=fast, adjust=False).mean() - c.ewm(span=slow, adjust=False).mean()
    sig = line.ewm(span=signal, adjust=False).mean()
    d = np.sign((line - sig).to_numpy())
    if not long_short:
        d = np.maximum(d, 0.0)
    d[: slow + signal] = 0.0
    return _signal(d)


def vol_target_signal(
    sigma: np.ndarray,
    vol_target: float,
    periods_per_year: float,
    level_high: float,
    max_leverage: float,
) -> Signal:
    """Long with scale V / (σ̂_t sqrt(ppy)) / (level_high · L), so the env's target fraction
    is min(V / (σ̂_t sqrt(ppy)), L); flat where σ̂_t ≤ 0."""
    sigma = np.asarray(sigma, dtype=np.float64)
    ok = sigma > 0
    w = np.where(ok, vol_target / (np.where(ok, sigma, 1.0) * math.sqrt(periods_per_year)), 0.0)
    denom = level_high * max_leverage
    scale = w / denom if denom > 0 else np.zeros_like(w)
    return _signal(ok.astype(np.float64), scale)


def oracle_signal(oracle: np.ndarray) -> Signal:
    """d_t = oracle[t] ∈ {−1, 0, 1} (the synthetic market's known optimal direction)."""
    return _signal(np.asarray(oracle, dtype=np.float64))


def signals(
    market: env.MarketData, params: env.EnvParams, cfg: config.Config, *, bars_per_year: float
) -> dict[str, Signal]:
    """The signal-following baselines' signals over the whole market, by name
    (``bars_per_year``: the bar clock, which annualises the volatility target's σ̂).

    Includes ``oracle`` only when ``cfg.data.source == "synthetic"``.
    """
    b = cfg.baselines
    close = np.asarray(market.close, dtype=np.float64)
    num_bars = close.shape[0]
    out = {
        "flat": flat_signal(num_bars),
        "buy_and_hold": buy_and_hold_signal(num_bars),
        "momentum": momentum_signal(close, b.momentum_lookback),
        "macd": macd_signal(
            close, b.macd_fast, b.macd_slow, b.macd_signal, b.macd_mode == "long_short"
        ),
        "vol_target": vol_target_signal(
            np.asarray(market.sigma, dtype=np.float64),
            b.vol_target,
            bars_per_year,
            params.magnitude_levels[_MAGNITUDE_FULL],
            params.max_leverage,
        ),
    }
    if cfg.data.source == "synthetic":
        out["oracle"] = oracle_signal(np.asarray(market.oracle, dtype=np.float64))
    return out


def follow_signal(signal: Signal, obs: jax.Array, t: jax.Array, key: jax.Array):
    """Policy with parameters: trade ``signal`` at bar t at full size with the signal's
    execution (order, urgency; default a market order at the next open). Walk it with
    ``policy_params=device_signal(signal)`` (one compilation for every signal and execution)."""
    del obs, key
    action = jnp.stack(
        [
            jnp.asarray(signal.direction, jnp.int32)[t],
            jnp.int32(_MAGNITUDE_FULL),
            jnp.asarray(signal.order, jnp.int32),
            jnp.asarray(signal.urgency, jnp.int32),
        ]
    )
    return action, jnp.asarray(signal.scale)[t]


def device_signal(signal: Signal, execution: tuple[int, int] | None = None) -> Signal:
    """``signal`` as device arrays (order and urgency int32 scalars, so that every execution
    shares one compilation), with ``execution = (order, urgency)`` replacing its own."""
    order, urgency = (signal.order, signal.urgency) if execution is None else execution
    return Signal(
        jnp.asarray(signal.direction),
        jnp.asarray(signal.scale),
        jnp.asarray(order, jnp.int32),
        jnp.asarray(urgency, jnp.int32),
    )


def signal_policy(signal: Signal) -> evaluate.PolicyFn:
    """``policy_fn(obs, t, key)`` closure following ``signal`` (see :func:`follow_signal`)."""
    arrays = device_signal(signal)
    return lambda obs, t, key: follow_signal(arrays, obs, t, key)


def random_policy(obs: jax.Array, t: jax.Array, key: jax.Array):
    """Each branch action uniform in {0, 1, 2} from ``key``; scale 1."""
    del obs, t
    return jax.random.randint(key, (4,), 0, 3, dtype=jnp.int32), jnp.float32(1.0)


def policies(
    market: env.MarketData, params: env.EnvParams, cfg: config.Config, *, bars_per_year: float
) -> dict[str, evaluate.PolicyFn]:
    """Every applicable baseline as a ``policy_fn(obs, t, key)``, in :data:`BASELINE_NAMES`
    order, then (synthetic market) every :data:`ORACLE_EXECUTIONS` policy. ``oracle`` here
    trades at the next open: choosing its best execution needs the val walks of
    :func:`run_baselines`."""
    sigs = signals(market, params, cfg, bars_per_year=bars_per_year)
    out: dict[str, evaluate.PolicyFn] = {}
    for name in BASELINE_NAMES:
        if name == "random":
            out[name] = random_policy
        elif name in sigs:
            out[name] = signal_policy(sigs[name])
    if "oracle" in sigs:
        for name, (order, urgency) in ORACLE_EXECUTIONS.items():
            out[name] = signal_policy(sigs["oracle"]._replace(order=order, urgency=urgency))
    return out


def walk_jobs(sigs: dict[str, Signal]) -> dict[str, tuple[evaluate.PolicyFn, Signal | None]]:
    """Every baseline walk of :func:`run_baselines`, in table order: name → ``(policy_fn,
    policy_params)`` (``random`` without parameters; on the synthetic market every
    :data:`ORACLE_EXECUTIONS` row instead of ``oracle``, which copies the best of them)."""
    jobs: dict[str, tuple[evaluate.PolicyFn, Signal | None]] = {}
    for name in BASELINE_NAMES:
        if name == "random":
            jobs[name] = (random_policy, None)
        elif name in sigs and name != "oracle":
            jobs[name] = (follow_signal, device_signal(sigs[name]))
    if "oracle" in sigs:
        for name, execution in ORACLE_EXECUTIONS.items():
            jobs[name] = (follow_signal, device_signal(sigs["oracle"], execution))
    return jobs


def best_execution(val_sharpe: Sequence[float]) -> str:
    """The :data:`ORACLE_EXECUTIONS` name with the highest val Sharpe (``val_sharpe`` in their
    order; NaN counts as worst, ties go to the first)."""
    score = np.nan_to_num(np.asarray(val_sharpe, dtype=np.float64), nan=-np.inf)
    return list(ORACLE_EXECUTIONS)[int(np.argmax(score))]


def run_baselines(
    cfg: config.Config,
    prepared: market_setup.Prepared | None = None,
    splits: Sequence[str] = ("val", "test"),
    logs: dict[tuple[str, str], pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """Walk every baseline over each split and collect the metrics.

    Args:
      cfg: the run's config (data, features, env costs, eval, baselines sections).
      prepared: the market from :func:`jaxdqn.market.market.prepare` (built from ``cfg`` if
        None).
      splits: which splits to walk.
      logs: if given, filled with the per-bar log of every walk, keyed ``(name, split)``.

    Returns:
      DataFrame, one row per baseline (index ``baseline``): :data:`BASELINE_NAMES` in order, then
      on the synthetic market one row per :data:`ORACLE_EXECUTIONS`; columns a MultiIndex
      ``(split, metric)`` with every key of :func:`jaxdqn.evaluation.metrics.performance`. The
      ``oracle`` row (and its logs) is the execution with the best val Sharpe (NaN counts as
      worst), named in ``attrs["oracle_execution"]``; the executions are walked on val for this
      choice even when ``splits`` leaves val out (their val numbers are then not in the table).
    """
    p = prepared if prepared is not None else market_setup.prepare(cfg)
    key = jax.random.PRNGKey(cfg.eval.key)
    ppy = p.bars_per_year
    sigs = signals(p.market, p.env_params, cfg, bars_per_year=ppy)

    def walk(policy_fn, split, params=None):
        lo, hi = p.eval_range(split)
        return evaluate.walk(
            p.market,
            p.env_params,
            lo,
            hi,
            policy_fn,
            key,
            p.dates,
            periods_per_year=ppy,
            policy_params=params,
        )

    jobs = walk_jobs(sigs)

    rows: dict[str, dict[tuple[str, str], float]] = {}
    walked: dict[tuple[str, str], evaluate.EvalResult] = {}
    for name, (policy_fn, params) in jobs.items():
        need = [*splits, "val"] if name in ORACLE_EXECUTIONS else splits
        for split in dict.fromkeys(need):
            walked[(name, split)] = walk(policy_fn, split, params)
        rows[name] = {
            (split, k): v for split in splits for k, v in walked[(name, split)].metrics.items()
        }

    best = None
    if "oracle" in sigs:
        best = best_execution(
            [walked[(name, "val")].metrics["sharpe"] for name in ORACLE_EXECUTIONS]
        )
        rows["oracle"] = rows[best]
        for split in splits:
            walked[("oracle", split)] = walked[(best, split)]

    order = [n for n in BASELINE_NAMES if n in rows] + [n for n in ORACLE_EXECUTIONS if n in rows]
    if logs is not None:
        for name in order:
            for split in splits:
                logs[(name, split)] = walked[(name, split)].log
    table = pd.DataFrame.from_dict({n: rows[n] for n in order}, orient="index")
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["split", "metric"])
    table.index.name = "baseline"
    if best is not None:
        table.attrs["oracle_execution"] = best
    return table
