"""Resampling statistics from arch (docs/DESIGN.md, S1): stationary-bootstrap
confidence intervals of the Sharpe ratio and Hansen's SPA test.

* **Intervals** (``arch.bootstrap.StationaryBootstrap``, Politis & Romano 1994): blocks of
  geometric length with mean b, b the ``stationary`` column of
  ``arch.bootstrap.optimal_block_length`` (Politis & White 2004, Patton et al. 2009) of the
  series itself; the interval is the percentile interval of the resampled Sharpes (NaN
  resamples, e.g. all-zero ones, are dropped), annualised. For a **population** of seeds
  walked on the same bars the rows ``[T, S]`` are resampled jointly (the same indices for every
  seed, so the seeds' correlation is kept) and the statistic is the mean of the seeds' Sharpes;
  b is the mean of the seeds' block lengths.
* **SPA** (Hansen 2005, ``arch.bootstrap.SPA``): arch tests H0 "no model has a lower expected
  loss than the benchmark" (small p: some model beats the benchmark). Losses are −returns, so it
  compares **mean per-bar return**, not risk-adjusted return. We want evidence that the agent
  beats a baseline, so for each baseline the **baseline is arch's benchmark** and the agent's
  seeds are its models: a small p says that the best seed beats that baseline, corrected for
  having tried S seeds. "The agent beats every baseline" is the intersection of those claims,
  an intersection–union test whose p-value is the largest of the per-baseline p-values (valid
  without a multiplicity correction). The reverse test (the agent's seed-mean return as arch's
  benchmark, the baselines as models) asks whether *some baseline* beats the agent.

arch is imported inside the functions (:func:`arch_bootstrap`): it is optional where training
runs, and a missing arch raises ImportError only here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from jaxdqn.evaluation.sharpe import annualised_sharpe, clean_returns, sharpe_ratio

__all__ = [
    "arch_bootstrap",
    "population_sharpe_interval",
    "sharpe_confidence_interval",
    "spa_pvalue",
    "stationary_block_length",
]

_NAN = float("nan")
_P_KINDS = ("consistent", "lower", "upper")


def arch_bootstrap():
    """``arch.bootstrap`` (imported here: arch is optional where training runs)."""
    from arch import bootstrap

    return bootstrap


def stationary_block_length(returns: ArrayLike) -> float:
    """Mean block length of the stationary bootstrap: the ``stationary`` column of
    ``arch.bootstrap.optimal_block_length`` (``[T]``, or ``[T, S]``: the mean over columns),
    at least 1; 1 when undefined (a constant series)."""
    x = np.asarray(returns, dtype=np.float64)
    x = x[~np.isnan(x).any(axis=-1)] if x.ndim == 2 else x[~np.isnan(x)]
    cols = x.reshape(x.shape[0], -1)
    keep = cols.max(axis=0) > cols.min(axis=0) if cols.shape[0] else np.zeros(0, bool)
    if cols.shape[0] < 3 or not keep.any():
        return 1.0
    with np.errstate(all="ignore"):
        b = arch_bootstrap().optimal_block_length(cols[:, keep])["stationary"].to_numpy()
    b = b[np.isfinite(b)]
    return max(1.0, float(np.mean(b))) if b.size else 1.0


def _column_sharpes(x: np.ndarray) -> np.ndarray:
    """Per-period Sharpe of each column of ``x`` ``[T, k]`` (NaN without dispersion)."""
    sd = np.std(x, axis=0, ddof=1)
    ok = x.max(axis=0) > x.min(axis=0)
    return np.where(ok, x.mean(axis=0) / np.where(ok, sd, 1.0), np.nan)


def _percentile_interval(draws: np.ndarray, size: float, ppy: float) -> tuple[float, float]:
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return _NAN, _NAN
    lo, hi = np.percentile(draws, [50 * (1 - size), 50 * (1 + size)])
    return annualised_sharpe(lo, ppy), annualised_sharpe(hi, ppy)


def sharpe_confidence_interval(
    returns: ArrayLike,
    *,
    periods_per_year: float = 252,
    size: float = 0.95,
    reps: int = 1000,
    seed: int = 0,
    block_length: float | None = None,
) -> dict[str, float]:
    """``size`` confidence interval of the **annualised** Sharpe of ``returns`` ``[T]``: the
    percentile interval of ``reps`` stationary-bootstrap resamples (arch; mean block length
    ``block_length``, default :func:`stationary_block_length`), reproducible in ``seed``.

    Returns:
      ``{"sharpe", "low", "high", "block_length"}`` (floats; NaN bounds when the Sharpe is
      undefined).
    """
    r = clean_returns("returns", returns)
    sr = sharpe_ratio(r)
    if not math.isfinite(sr) or r.shape[0] < 3:
        return {"sharpe": _NAN, "low": _NAN, "high": _NAN, "block_length": _NAN}
    b = stationary_block_length(r) if block_length is None else float(block_length)
    bs = arch_bootstrap().StationaryBootstrap(b, r[:, None], seed=seed)
    with np.errstate(all="ignore"):
        draws = bs.apply(_column_sharpes, reps)[:, 0]
    low, high = _percentile_interval(draws, size, periods_per_year)
    return {
        "sharpe": annualised_sharpe(sr, periods_per_year),
        "low": low,
        "high": high,
        "block_length": b,
    }


def population_sharpe_interval(
    returns: ArrayLike,
    *,
    periods_per_year: float = 252,
    size: float = 0.95,
    reps: int = 1000,
    seed: int = 0,
) -> dict[str, float]:
    """``size`` confidence interval of the population's mean annualised Sharpe: ``returns``
    ``[T, S]`` (one column per seed, the same bars) resampled jointly by rows (stationary
    bootstrap, mean block length = the mean of the seeds' :func:`stationary_block_length`); the
    statistic is the mean over seeds of their Sharpes (seeds without dispersion left out).

    Returns:
      ``{"sharpe", "low", "high", "block_length"}``; ``sharpe`` the mean of the seeds'
      annualised Sharpes.
    """
    x = np.asarray(returns, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"returns: expected [T, S], got shape {x.shape}")
    x = x[~np.isnan(x).any(axis=1)]
    with np.errstate(all="ignore"):
        sharpes = _column_sharpes(x) if x.shape[0] >= 2 else np.full(x.shape[1], np.nan)
    if x.shape[0] < 3 or not np.isfinite(sharpes).any():
        return {"sharpe": _NAN, "low": _NAN, "high": _NAN, "block_length": _NAN}
    b = float(np.mean([stationary_block_length(x[:, s]) for s in range(x.shape[1])]))
    bs = arch_bootstrap().StationaryBootstrap(b, x, seed=seed)

    def mean_sharpe(y: np.ndarray) -> float:
        s = _column_sharpes(y)
        s = s[np.isfinite(s)]
        return float(s.mean()) if s.size else _NAN

    with np.errstate(all="ignore"):
        draws = bs.apply(mean_sharpe, reps)[:, 0]
    low, high = _percentile_interval(draws, size, periods_per_year)
    mean = float(np.mean(sharpes[np.isfinite(sharpes)]))
    return {
        "sharpe": annualised_sharpe(mean, periods_per_year),
        "low": low,
        "high": high,
        "block_length": b,
    }


def _spa_groups(
    differentials: np.ndarray, groups: Sequence[np.ndarray], reps: int, seed: int
) -> tuple[list[dict[str, float]], float]:
    """arch's SPA p-values ``{consistent, lower, upper}`` of H0 "no model of the group beats
    its benchmark", for each group of columns of the loss differentials ``d = L_benchmark −
    L_model`` ``[T, k]`` (> 0: the model lost less), and the mean block length used.

    One ``arch.bootstrap.SPA`` with a zero benchmark and models ``−d`` resamples every column
    with the same indices (block length: :func:`stationary_block_length` of the differentials);
    each group's p-values come from ``SPA.subset`` (its columns' maximum only), which equals a
    separate SPA of that group with these indices. A differential without dispersion (a model
    equal to its benchmark up to a constant c) cannot be resampled: a group with such a model
    better on every bar (c > 0) gives p = 0; one with c ≤ 0 leaves it out (it is no evidence),
    and a group left empty gives p = 1.
    """
    varies = differentials.max(axis=0) > differentials.min(axis=0)
    better = ~varies & (differentials.mean(axis=0) > 0)
    out: list[dict[str, float] | None] = []
    for g in groups:
        if better[g].any() or not varies[g].any():
            out.append(dict.fromkeys(_P_KINDS, 0.0 if better[g].any() else 1.0))
        else:
            out.append(None)
    if not varies.any():
        return out, 1.0
    d = differentials[:, varies]
    column = np.cumsum(varies) - 1  # original column → column of d
    b = stationary_block_length(d)
    with np.errstate(all="ignore"):
        test = arch_bootstrap().SPA(
            np.zeros(d.shape[0]), -d, block_size=max(1, round(b)), reps=reps, seed=seed
        )
        for i, g in enumerate(groups):
            if out[i] is not None:
                continue
            selector = np.zeros(d.shape[1], dtype=bool)
            selector[column[g[varies[g]]]] = True
            test.subset(selector)
            test.compute()
            out[i] = {k: float(test.pvalues[k]) for k in _P_KINDS}
    return out, b


def spa_pvalue(
    agent_returns: ArrayLike,
    baseline_returns: Mapping[str, ArrayLike],
    *,
    reps: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Hansen's SPA p-values of the agent against the baselines (orientation in the module
    docstring; losses = −returns, so the comparison is of mean per-bar return).

    Args:
      agent_returns: ``[T]`` or ``[T, S]`` (one column per seed) per-bar returns.
      baseline_returns: name → ``[T]`` returns on the same bars.
      reps: bootstrap replications of each test; seed: their seed.

    Returns:
      ``{"baselines": {name: {"consistent", "lower", "upper"}}`` — H0 "no seed beats this
      baseline", small p = the agent beats it; ``"agent_beats_all"``: the largest of those per
      kind (intersection–union test of "the agent beats every baseline");
      ``"some_baseline_beats_agent"``: arch's SPA with the agent's seed-mean return as the
      benchmark and every baseline as a model (small p = some baseline beats the agent);
      ``"block_length"``: the mean block length of the two bootstraps.

    Raises:
      ValueError: no baseline, or a series whose length differs from the agent's.
    """
    a = np.asarray(agent_returns, dtype=np.float64)
    a = a[:, None] if a.ndim == 1 else a
    if a.ndim != 2 or not baseline_returns:
        raise ValueError("spa_pvalue: expected agent returns [T] or [T, S] and some baselines")
    names = list(baseline_returns)
    base = np.stack([np.asarray(baseline_returns[n], dtype=np.float64) for n in names], axis=1)
    if base.shape[0] != a.shape[0]:
        raise ValueError(f"spa_pvalue: baselines have {base.shape[0]} bars, agent {a.shape[0]}")
    ok = ~(np.isnan(a).any(axis=1) | np.isnan(base).any(axis=1))
    a, base = a[ok], base[ok]
    num_seeds = a.shape[1]
    # baseline j is the benchmark of the seeds' columns j·S .. j·S + S − 1: d = r_seed − r_base
    forward = np.concatenate([a - base[:, j : j + 1] for j in range(len(names))], axis=1)
    groups = [np.arange(j * num_seeds, (j + 1) * num_seeds) for j in range(len(names))]
    per_base, b_forward = _spa_groups(forward, groups, reps, seed)
    # the agent (seed mean) is the benchmark of every baseline: d = r_base − r_agent
    reverse = base - a.mean(axis=1, keepdims=True)
    (beaten,), b_reverse = _spa_groups(reverse, [np.arange(len(names))], reps, seed)
    per_base_named = dict(zip(names, per_base, strict=True))
    return {
        "baselines": per_base_named,
        "agent_beats_all": {k: max(p[k] for p in per_base) for k in _P_KINDS},
        "some_baseline_beats_agent": beaten,
        "block_length": (b_forward + b_reverse) / 2,
    }
