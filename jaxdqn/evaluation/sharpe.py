"""Closed-form Sharpe statistics (docs/DESIGN.md, S1): the per-period Sharpe, the
Probabilistic and the Deflated Sharpe Ratio.

Every input is a series of *simple* per-bar returns ``r[0..T-1]`` (NaN = missing, dropped);
``ppy`` is the number of bars per year. Per-period quantities carry no annualisation; the
annualised Sharpe is ``SR · sqrt(ppy)`` (:mod:`jaxdqn.evaluation.metrics`, rf = 0).

* Per-period Sharpe ``SR = mean(r) / std(r, ddof=1)``; NaN with fewer than two bars or no
  dispersion.
* **PSR** (Bailey & López de Prado 2012, "The Sharpe Ratio Efficient Frontier"): the probability
  that the true Sharpe exceeds a benchmark ``SR*`` given T bars and the non-normality of r,

      PSR(SR*) = Φ( (SR − SR*) · sqrt(T − 1) / sqrt(1 − γ3 · SR + (γ4 − 1)/4 · SR²) ),

  γ3 the skewness and γ4 the **raw** (non-excess, 3 for a normal) kurtosis, both population
  moments (ddof 0) of r. NaN when T < 3, SR is undefined, or the variance term is ≤ 0.
* **DSR** (Bailey & López de Prado 2014, "The Deflated Sharpe Ratio"): the PSR against the
  Sharpe one expects of the best of N independent trials whose true Sharpe is 0,

      SR0 = sqrt(V[SR_n]) · ((1 − γ) · Φ⁻¹(1 − 1/N) + γ · Φ⁻¹(1 − 1/(N·e))),

  γ ≈ 0.5772 the Euler–Mascheroni constant, V[SR_n] the sample variance (ddof 1) of the N trial
  Sharpes (per period); SR0 = 0 when N = 1 or V = 0. ``DSR = PSR(SR0)``.

These match skfolio's ``probabilistic_sharpe_ratio`` / ``deflated_sharpe_ratio`` (tested).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import special  # Φ = ndtr, Φ⁻¹ = ndtri (the normal's cdf and ppf in scipy)

__all__ = [
    "annualised_sharpe",
    "clean_returns",
    "deflated_sharpe_ratio",
    "expected_max_sharpe",
    "per_period_sharpe",
    "probabilistic_sharpe_ratio",
    "sharpe_ratio",
    "trial_moments",
]

_NAN = float("nan")


def clean_returns(name: str, returns: ArrayLike) -> np.ndarray:
    """``returns`` as a float64 ``[T]`` array without its NaN entries (``name`` for errors)."""
    r = np.asarray(returns, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D series, got shape {r.shape}")
    return r[~np.isnan(r)]


def per_period_sharpe(annual_sharpe: float, periods_per_year: float = 252) -> float:
    """An annualised Sharpe ratio as a per-period one: ``SR_annual / sqrt(ppy)``."""
    return float(annual_sharpe) / math.sqrt(periods_per_year)


def annualised_sharpe(sharpe: float, periods_per_year: float = 252) -> float:
    """A per-period Sharpe ratio annualised: ``SR · sqrt(ppy)``."""
    return float(sharpe) * math.sqrt(periods_per_year)


def sharpe_ratio(returns: ArrayLike) -> float:
    """Per-period Sharpe ``mean(r) / std(r, ddof=1)`` of ``returns`` ``[T]`` (NaN dropped); NaN
    with fewer than two bars or when every return is equal."""
    r = clean_returns("returns", returns)
    if r.shape[0] < 2 or r.max() == r.min():
        return _NAN
    return float(np.mean(r) / np.std(r, ddof=1))


def _moments(r: np.ndarray) -> tuple[float, float]:
    """Skewness γ3 and raw kurtosis γ4 (population moments, ddof 0) of ``r``."""
    d = r - r.mean()
    d = d - d.mean()  # the residue of rounding the mean
    m2 = float(np.mean(d**2))
    return float(np.mean(d**3)) / m2**1.5, float(np.mean(d**4)) / m2**2


def probabilistic_sharpe_ratio(returns: ArrayLike, benchmark_sharpe: float = 0.0) -> float:
    """PSR of ``returns`` ``[T]`` against the **per-period** Sharpe ``benchmark_sharpe``
    (module docstring: Φ((SR − SR*)·sqrt(T−1) / sqrt(1 − γ3·SR + (γ4−1)/4·SR²)), γ4 raw).

    Convert an annualised benchmark with :func:`per_period_sharpe`. Returns a probability in
    [0, 1], NaN when T < 3, SR is undefined or the variance term is not positive.
    """
    r = clean_returns("returns", returns)
    n = r.shape[0]
    sr = sharpe_ratio(r)
    if n < 3 or not math.isfinite(sr) or not math.isfinite(benchmark_sharpe):
        return _NAN
    g3, g4 = _moments(r)
    var = 1.0 - g3 * sr + (g4 - 1.0) / 4.0 * sr * sr
    if not var > 0:
        return _NAN
    return float(special.ndtr((sr - benchmark_sharpe) * math.sqrt(n - 1) / math.sqrt(var)))


def expected_max_sharpe(num_trials: float, sharpe_variance: float) -> float:
    """SR0, the expected maximum of ``num_trials`` independent per-period Sharpes with true value
    0 and variance ``sharpe_variance``: ``sqrt(V)·((1−γ)Φ⁻¹(1−1/N) + γΦ⁻¹(1−1/(N e)))``; 0 when
    N = 1 or V = 0.

    Raises:
      ValueError: N < 1 or V < 0 (or either not finite).
    """
    if not math.isfinite(num_trials) or num_trials < 1:
        raise ValueError(f"num_trials: expected a number ≥ 1, got {num_trials}")
    if not math.isfinite(sharpe_variance) or sharpe_variance < 0:
        raise ValueError(f"sharpe_variance: expected a number ≥ 0, got {sharpe_variance}")
    if num_trials == 1 or sharpe_variance == 0:
        return 0.0
    g = float(np.euler_gamma)
    z = (1 - g) * special.ndtri(1 - 1 / num_trials) + g * special.ndtri(
        1 - 1 / (num_trials * math.e)
    )
    return float(math.sqrt(sharpe_variance) * z)


def trial_moments(trial_sharpes: ArrayLike) -> tuple[int, float]:
    """``(N, V)``: the count and the sample variance (ddof 1; 0 when N = 1) of the finite
    entries of ``trial_sharpes``.

    Raises:
      ValueError: no finite entry.
    """
    t = np.asarray(trial_sharpes, dtype=np.float64).ravel()
    t = t[np.isfinite(t)]
    if t.shape[0] == 0:
        raise ValueError("trial_sharpes: no finite trial Sharpe ratio")
    return int(t.shape[0]), float(np.var(t, ddof=1)) if t.shape[0] > 1 else 0.0


def deflated_sharpe_ratio(
    returns: ArrayLike,
    trial_sharpes: ArrayLike | None = None,
    *,
    num_trials: float | None = None,
    sharpe_variance: float | None = None,
) -> float:
    """DSR of ``returns`` ``[T]``: :func:`probabilistic_sharpe_ratio` against
    :func:`expected_max_sharpe` of the trials.

    Give either ``trial_sharpes`` (the **per-period** Sharpe of every trial the selection saw,
    the selected one included; non-finite entries dropped: N = their count, V = their variance,
    ddof 1) or ``num_trials`` and ``sharpe_variance`` (per period²).
    """
    if trial_sharpes is not None:
        if num_trials is not None or sharpe_variance is not None:
            raise ValueError("give trial_sharpes or (num_trials, sharpe_variance), not both")
        num_trials, sharpe_variance = trial_moments(trial_sharpes)
    elif num_trials is None or sharpe_variance is None:
        raise ValueError("give trial_sharpes or both num_trials and sharpe_variance")
    return probabilistic_sharpe_ratio(returns, expected_max_sharpe(num_trials, sharpe_variance))
