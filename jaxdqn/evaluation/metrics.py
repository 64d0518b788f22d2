"""Performance metrics of a return series (E3), following empyrical's conventions.

All statistics are computed in float64 numpy on the host from *simple* (not log) per-bar
returns ``r[0..n-1]``; ``ppy`` is the number of bars per year (252 for daily bars). With the
risk-free rate fixed at 0 (empyrical's conventions, checked against ``empyrical`` to 1e-6 by the
tests):

* ``sharpe``            = mean(r) / std(r, ddof=1) · sqrt(ppy)
* ``sortino``           = mean(r) · ppy / (sqrt(mean(min(r, 0)²)) · sqrt(ppy)); the downside
  deviation averages over *all* bars (bars above the threshold contribute 0), not over the
  losing bars only.
* ``max_drawdown``      = min_t (W_t − max_{s≤t} W_s) / max_{s≤t} W_s with W_t = Π_{i≤t}(1 + r_i)
  and the running peak anchored at the initial wealth W_{-1} = 1; it is ≤ 0.
* ``annual_return``     = CAGR = W_{n-1} ^ (ppy / n) − 1.
* ``annual_volatility`` = std(r, ddof=1) · sqrt(ppy).
* ``calmar``            = annual_return / |max_drawdown|.
* ``hit_rate``          = #{r_t > 0} / #{r_t ≠ 0}: the fraction of *non-zero* bars that gained.
  Bars with exactly zero return (flat and not trading) are neither wins nor losses, so a
  strategy that is mostly flat is not diluted towards 0.

From the position path (optional):

* ``turnover``          = mean_t |traded_t|, the notional traded per bar as a fraction of equity
  (a full flip long → short is 2); ``annual_turnover`` = turnover · ppy.
* ``exposure``          = mean_t |position_t|, the average gross position fraction.

Degenerate inputs never raise and never warn. Rule: **a ratio whose denominator is zero is
NaN** — ``sharpe`` when every return is equal (zero dispersion, e.g. a flat strategy's all-zero
returns), ``sortino`` when no bar lost, ``calmar`` when there was no drawdown, ``hit_rate`` when
every return is zero. (empyrical returns ±inf for the first two when the mean is non-zero; the
rule here keeps every undefined ratio NaN.) Well-defined quantities keep their value: all-zero
returns give ``max_drawdown = 0``, ``annual_return = 0``, ``annual_volatility = 0``. Fewer than
two bars carry no statistics: every return metric is NaN (turnover and exposure are still the
means of what was given; NaN when empty). A total loss (wealth ≤ 0, possible with leverage)
gives ``annual_return = −1`` where empyrical's fractional power of a non-positive number gives
NaN. NaN entries in ``returns`` are treated as missing, as empyrical does (ignored by means and
deviations, a zero return in the wealth path).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["RETURN_KEYS", "performance", "sharpe_se"]

RETURN_KEYS = (
    "sharpe",
    "sortino",
    "max_drawdown",
    "annual_return",
    "annual_volatility",
    "calmar",
    "hit_rate",
)


def _as_1d(name: str, x: ArrayLike) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D series, got shape {a.shape}")
    return a


def _safe_div(num: float, den: float) -> float:
    """num / den, NaN when den is zero or either is NaN (no warnings)."""
    if not np.isfinite(den) or den == 0.0 or not np.isfinite(num):
        return float("nan")
    return float(num / den)


def _return_metrics(r: np.ndarray, ppy: float) -> dict[str, float]:
    nan = float("nan")
    valid = r[~np.isnan(r)]
    if r.shape[0] < 2 or valid.shape[0] < 2:
        return dict.fromkeys(RETURN_KEYS, nan)

    mean = float(np.mean(valid))
    # Zero dispersion is decided by equality, not by the computed std: the mean of identical
    # values can differ from them in the last bit and leave a ~1e-18 residue.
    std = 0.0 if valid.max() == valid.min() else float(np.std(valid, ddof=1))
    downside = float(np.sqrt(np.mean(np.minimum(valid, 0.0) ** 2)))

    # Wealth path anchored at 1 before the first bar; NaN bars leave wealth unchanged.
    wealth = np.cumprod(1.0 + np.where(np.isnan(r), 0.0, r))
    peak = np.maximum.accumulate(np.concatenate(([1.0], wealth)))[1:]
    max_dd = float(np.min((wealth - peak) / peak))

    n = r.shape[0]
    final = float(wealth[-1])
    # A total loss (wealth ≤ 0, possible with leverage) has no real CAGR root: -100%.
    annual_return = final ** (ppy / n) - 1.0 if final > 0 else -1.0

    nonzero = valid[valid != 0.0]
    return {
        "sharpe": _safe_div(mean, std) * math.sqrt(ppy),
        "sortino": _safe_div(mean * ppy, downside * math.sqrt(ppy)),
        "max_drawdown": max_dd,
        "annual_return": float(annual_return),
        "annual_volatility": std * math.sqrt(ppy),
        "calmar": _safe_div(annual_return, abs(max_dd)),
        "hit_rate": _safe_div(float(np.sum(nonzero > 0.0)), float(nonzero.shape[0])),
    }


def _mean_abs(x: np.ndarray) -> float:
    return float(np.mean(np.abs(x))) if x.shape[0] else float("nan")


def performance(
    returns: ArrayLike,
    periods_per_year: float = 252,
    positions: ArrayLike | None = None,
    traded: ArrayLike | None = None,
) -> dict[str, float]:
    """Performance statistics of one strategy (formulas and edge cases in the module docstring).

    Args:
      returns: simple per-bar returns ``[n]`` (equity_t / equity_{t-1} − 1), not log returns.
      periods_per_year: bars per year used to annualise (252 for daily bars).
      positions: optional position fraction held over each bar ``[n]`` (signed).
      traded: optional notional traded on each bar as a fraction of equity ``[n]``.

    Returns:
      dict of Python floats with keys ``sharpe, sortino, max_drawdown, annual_return,
      annual_volatility, calmar, hit_rate``; plus ``exposure`` when ``positions`` is given and
      ``turnover, annual_turnover`` when ``traded`` is given.
    """
    if periods_per_year <= 0:
        raise ValueError(f"periods_per_year: must be > 0, got {periods_per_year}")
    r = _as_1d("returns", returns)
    out = _return_metrics(r, float(periods_per_year))
    if traded is not None:
        tr = _as_1d("traded", traded)
        out["turnover"] = _mean_abs(tr)
        out["annual_turnover"] = out["turnover"] * float(periods_per_year)
    if positions is not None:
        out["exposure"] = _mean_abs(_as_1d("positions", positions))
    return out


def sharpe_se(sharpe: float, num_periods: int, periods_per_year: float) -> float:
    """Standard error of an annualised Sharpe ratio estimated from ``num_periods`` returns
    (Lo 2002, i.i.d. returns): with the per-period ratio s = sharpe / sqrt(ppy),

        SE = sqrt((1 + s²/2) / n) · sqrt(ppy).

    ≈ 0.65 for 600 daily bars, ≈ 0.2 for 6,000. A non-finite ``sharpe`` counts as 0.
    """
    if num_periods < 2:
        return math.inf
    s = sharpe / math.sqrt(periods_per_year) if math.isfinite(sharpe) else 0.0
    return math.sqrt((1.0 + 0.5 * s * s) / num_periods) * math.sqrt(periods_per_year)
