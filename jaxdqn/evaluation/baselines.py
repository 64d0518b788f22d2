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
vol_target     long with position fraction w_t = min(V / (σ̂_t · sqrt(ppy)), L): V the annual
               volatility target ``baselines.vol_target``, σ̂_t the environment's causal daily
               volatility (``MarketData.sigma``), passed through the position-scale input as
               scale_t = V / (σ̂_t · sqrt(ppy)) / (level_high · L) (the environment caps at L);
               flat where σ̂_t is 0 (before its warm-up).
oracle         synthetic market only: d_t = the ``oracle`` column, the sign of the best one-bar
               forecast of the planted AR(1) signal.
=============  =================================================================================

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
from jaxdqn.evaluation import walk as evaluate
from jaxdqn.market import env
from jaxdqn.market import market as market_setup

__all__ = [
    "BASELINE_NAMES",
    "TABLE_METRICS",
    "Signal",
    "buy_and_hold_signal",
    "flat_signal",
    "follow_signal",
    "macd_signal",
    "momentum_signal",
    "oracle_signal",
    "policies",
    "random_policy",
    "run_baselines",
    "signal_policy",
    "signals",
    "vol_target_signal",
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
"""Every baseline, in table order (``oracle`` only on the synthetic market)."""

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


class Signal(NamedTuple):
    """A per-bar decision of a signal-following baseline, indexed by decision bar t.

    direction: int32 [T] in {0, 1, 2} (short, flat, long) = d_t + 1.
    scale: float32 [T] position scale (1.0 when the baseline does not size).
    """

    direction: np.ndarray
    scale: np.ndarray


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


def signals(market: env.MarketData, params: env.EnvParams, cfg: config.Config) -> dict[str, Signal]:
    """The signal-following baselines' signals over the whole market, by name.

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
            cfg.eval.periods_per_year,
            params.magnitude_levels[_MAGNITUDE_FULL],
            params.max_leverage,
        ),
    }
    if cfg.data.source == "synthetic":
        out["oracle"] = oracle_signal(np.asarray(market.oracle, dtype=np.float64))
    return out


def follow_signal(signal: Signal, obs: jax.Array, t: jax.Array, key: jax.Array):
    """Policy with parameters: trade ``signal`` at bar t with a full-size market order at the
    next open. Walk it with ``policy_params=signal`` (one compilation for every signal)."""
    del obs, key
    action = jnp.stack(
        [
            jnp.asarray(signal.direction)[t],
            jnp.int32(_MAGNITUDE_FULL),
            jnp.int32(_ORDER_MARKET),
            jnp.int32(_URGENCY_OPEN),
        ]
    )
    return action, jnp.asarray(signal.scale)[t]


def signal_policy(signal: Signal) -> evaluate.PolicyFn:
    """``policy_fn(obs, t, key)`` closure following ``signal`` (see :func:`follow_signal`)."""
    arrays = Signal(jnp.asarray(signal.direction), jnp.asarray(signal.scale))
    return lambda obs, t, key: follow_signal(arrays, obs, t, key)


def random_policy(obs: jax.Array, t: jax.Array, key: jax.Array):
    """Each branch action uniform in {0, 1, 2} from ``key``; scale 1."""
    del obs, t
    return jax.random.randint(key, (4,), 0, 3, dtype=jnp.int32), jnp.float32(1.0)


def policies(
    market: env.MarketData, params: env.EnvParams, cfg: config.Config
) -> dict[str, evaluate.PolicyFn]:
    """Every applicable baseline as a ``policy_fn(obs, t, key)``, in :data:`BASELINE_NAMES`
    order."""
    sigs = signals(market, params, cfg)
    out: dict[str, evaluate.PolicyFn] = {}
    for name in BASELINE_NAMES:
        if name == "random":
            out[name] = random_policy
        elif name in sigs:
            out[name] = signal_policy(sigs[name])
    return out


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
      DataFrame, one row per baseline (index ``baseline``), columns a MultiIndex
      ``(split, metric)`` with every key of :func:`jaxdqn.evaluation.metrics.performance`.
    """
    p = prepared if prepared is not None else market_setup.prepare(cfg)
    key = jax.random.PRNGKey(cfg.eval.key)
    ppy = cfg.eval.periods_per_year
    sigs = signals(p.market, p.env_params, cfg)
    rows: dict[str, dict[tuple[str, str], float]] = {}
    for name in BASELINE_NAMES:
        if name != "random" and name not in sigs:
            continue
        row: dict[tuple[str, str], float] = {}
        for split in splits:
            lo, hi = p.eval_range(split)
            if name == "random":
                res = evaluate.walk(
                    p.market,
                    p.env_params,
                    lo,
                    hi,
                    random_policy,
                    key,
                    p.dates,
                    periods_per_year=ppy,
                )
            else:
                arrays = Signal(jnp.asarray(sigs[name].direction), jnp.asarray(sigs[name].scale))
                res = evaluate.walk(
                    p.market,
                    p.env_params,
                    lo,
                    hi,
                    follow_signal,
                    key,
                    p.dates,
                    periods_per_year=ppy,
                    policy_params=arrays,
                )
            row.update({(split, k): v for k, v in res.metrics.items()})
            if logs is not None:
                logs[(name, split)] = res.log
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.columns = pd.MultiIndex.from_tuples(table.columns, names=["split", "metric"])
    table.index.name = "baseline"
    return table
