"""Statistics of a panel's walks across instruments (issue 29).

* :func:`portfolio_log` — the equal-weight portfolio of a panel walk's instruments: on each date
  the mean of the returns of the instruments that have that bar (rebalanced to equal weights
  every bar), so an instrument counts from its first to its last bar and a gap leaves it out of
  that bar's mean. Its position and traded columns are the means too (each instrument a sleeve
  of 1/N_t of the capital). Its log goes through the single-instrument statistics (bootstrap
  interval, PSR, DSR, SPA) unchanged.
* :func:`cross_section_statistics` — the cross-sectional mean and median of the instruments'
  Sharpe ratios (each instrument's seed mean) with percentile bootstrap intervals, instruments
  and seeds resampled: a replication draws N instruments and S seeds with replacement (the same
  seeds for every instrument, since a seed is one agent trading all of them) and takes the
  statistic over the drawn instruments of each one's mean over the drawn seeds. The fraction of
  instruments where the agent's seed-mean Sharpe beats buy-and-hold's comes with it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from jaxdqn.evaluation import metrics

__all__ = [
    "cross_section_statistics",
    "gate_instruments",
    "portfolio_log",
    "portfolio_metrics",
    "seed_mean",
    "validation_gate",
]


def portfolio_log(log: pd.DataFrame) -> pd.DataFrame:
    """The equal-weight portfolio of a panel walk's log (columns ``instrument, date, return,
    position, traded``): one row per date, ``date, return, position, traded, equity``."""
    by_date = log.groupby("date", sort=True)
    out = pd.DataFrame(
        {
            "return": by_date["return"].mean(),
            "position": by_date["position"].mean(),
            "traded": by_date["traded"].mean(),
        }
    ).reset_index()
    out["equity"] = np.cumprod(1.0 + out["return"].to_numpy(dtype=np.float64))
    return out


def portfolio_metrics(log: pd.DataFrame, periods_per_year: float) -> dict[str, float]:
    """:func:`jaxdqn.evaluation.metrics.performance` of a :func:`portfolio_log`."""
    return metrics.performance(
        log["return"].to_numpy(dtype=np.float64),
        periods_per_year,
        positions=log["position"].to_numpy(dtype=np.float64),
        traded=log["traded"].to_numpy(dtype=np.float64),
    )


def seed_mean(per_seed: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the NaN-ignoring mean over seeds (NaN when every seed's is NaN)."""
    out = {}
    for k in per_seed[0]:
        vals = np.asarray([m[k] for m in per_seed], dtype=np.float64)
        vals = vals[np.isfinite(vals)]
        out[k] = float(vals.mean()) if vals.size else float("nan")
    return out


def gate_instruments(
    sharpe: dict[str, float], bars: dict[str, int], periods_per_year: float, t: float
) -> list[str]:
    """The instruments an agent trades under the validation gate: those whose val Sharpe is at
    least ``t`` standard errors, ``sharpe_i ≥ t · SE(sharpe_i, bars_i)``
    (:func:`jaxdqn.evaluation.metrics.sharpe_se`); a NaN Sharpe (a flat val walk) is not
    traded. Names in the order of ``sharpe``."""
    return [
        name
        for name, s in sharpe.items()
        if math.isfinite(s) and s >= t * metrics.sharpe_se(s, bars[name], periods_per_year)
    ]


def validation_gate(val, test, periods_per_year: float, t: float) -> dict[str, Any]:
    """The validation-gated portfolio of a panel run's agents.

    ``val[s]``, ``test[s]``: agent s's :class:`~jaxdqn.evaluation.panel_walk.PanelResult` on
    each split (the same checkpoint). Agent s trades on test the instruments
    :func:`gate_instruments` picks from its own val walk, equal-weighted among them
    (:func:`portfolio_log` of their rows), and holds the rest flat; with none picked it is flat
    (return 0 every bar, Sharpe NaN).

    Returns ``{"t", "traded": {name: fraction of agents trading it}, "agents": [[names] per
    agent], "test": metrics (the NaN-ignoring mean over agents, keyed as
    :func:`portfolio_metrics`)}``.
    """
    chosen, per_agent = [], []
    for v, te in zip(val, test, strict=True):
        sharpe = {n: float(r.metrics["sharpe"]) for n, r in v.instruments.items()}
        bars = {n: len(r.log) for n, r in v.instruments.items()}
        names = gate_instruments(sharpe, bars, periods_per_year, t)
        chosen.append(names)
        log = te.log[te.log["instrument"].isin(names)] if names else te.log
        pf = portfolio_log(log)
        if not names:  # flat: the dates of the walk, nothing held
            pf[["return", "position", "traded"]] = 0.0
            pf["equity"] = 1.0
        per_agent.append(portfolio_metrics(pf, periods_per_year))
    names = list(val[0].instruments)
    return {
        "t": float(t),
        "traded": {n: sum(n in c for c in chosen) / len(chosen) for n in names},
        "agents": chosen,
        "test": seed_mean(per_agent),
    }


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def cross_section_statistics(
    sharpe: np.ndarray,
    reference: np.ndarray,
    *,
    reps: int = 1000,
    size: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """The cross-section of the agent's Sharpe ratios over instruments.

    Args:
      sharpe: ``[S, N]`` the agent's (annualised) Sharpe of seed s on instrument i.
      reference: ``[N]`` buy-and-hold's Sharpe on each instrument.
      reps, size, seed: bootstrap replications, interval level and seed.

    Returns:
      ``{"instruments": N, "seeds": S, "confidence", "mean": {"sharpe", "low", "high"},
      "median": {...}, "beats_buy_and_hold": fraction, "buy_and_hold": {"mean", "median"}}``
      (None for undefined numbers; instruments whose Sharpe is NaN in every seed are left out).
    """
    sharpe = np.atleast_2d(np.asarray(sharpe, dtype=np.float64))
    reference = np.asarray(reference, dtype=np.float64)
    keep = np.isfinite(sharpe).any(axis=0)
    sharpe, reference = sharpe[:, keep], reference[keep]
    num_seeds, num = sharpe.shape
    out: dict[str, Any] = {"instruments": int(num), "seeds": int(num_seeds), "confidence": size}
    if num == 0:
        out.update(mean=None, median=None, beats_buy_and_hold=None, buy_and_hold=None)
        return out
    per = np.nanmean(sharpe, axis=0)  # [N]
    rng = np.random.default_rng(seed)
    draws = {"mean": np.empty(reps), "median": np.empty(reps)}
    for r in range(reps):
        seeds = rng.integers(0, num_seeds, num_seeds)
        inst = rng.integers(0, num, num)
        values = np.nanmean(sharpe[np.ix_(seeds, inst)], axis=0)
        draws["mean"][r] = np.nanmean(values)
        draws["median"][r] = np.nanmedian(values)
    alpha = (1.0 - size) / 2.0
    for name, stat in (("mean", np.mean), ("median", np.median)):
        d = draws[name][np.isfinite(draws[name])]
        low, high = np.quantile(d, [alpha, 1 - alpha]) if d.size else (math.nan, math.nan)
        out[name] = {"sharpe": _finite(stat(per)), "low": _finite(low), "high": _finite(high)}
    beats = np.isfinite(reference) & (per > reference)
    known = np.isfinite(reference)
    out["beats_buy_and_hold"] = _finite(beats.sum() / known.sum()) if known.any() else None
    ref = reference[known]
    out["buy_and_hold"] = {
        "mean": _finite(ref.mean()) if ref.size else None,
        "median": _finite(np.median(ref)) if ref.size else None,
    }
    return out
