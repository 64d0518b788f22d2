"""Statistics a quant trusts (docs/DESIGN.md, S1): is a result skill or luck?

One entry point for a split of a population run, :func:`population_statistics`, and the
functions it is made of, re-exported here:

* :mod:`jaxdqn.evaluation.sharpe` — the per-period Sharpe, the Probabilistic Sharpe Ratio
  ``PSR(SR*) = Φ((SR − SR*)·sqrt(T−1) / sqrt(1 − γ3·SR + (γ4−1)/4·SR²))`` (γ4 the raw kurtosis)
  and the Deflated Sharpe Ratio ``PSR(SR0)``, ``SR0 = sqrt(V[SR_n])·((1−γ)Φ⁻¹(1−1/N) +
  γΦ⁻¹(1−1/(N e)))``.
* :mod:`jaxdqn.evaluation.bootstrap` — stationary-bootstrap intervals of a seed's and of the
  population mean's Sharpe and Hansen's SPA p-values against the baselines (arch; each
  baseline is the benchmark of the agent's seeds, so a small p says the agent beats it).

arch is optional: without it :func:`population_statistics` still returns the PSR and DSR and
says in ``"unavailable"`` why the intervals and the SPA are missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from jaxdqn.evaluation.bootstrap import (
    arch_bootstrap,
    population_sharpe_interval,
    sharpe_confidence_interval,
    spa_pvalue,
    stationary_block_length,
)
from jaxdqn.evaluation.sharpe import (
    annualised_sharpe,
    deflated_sharpe_ratio,
    expected_max_sharpe,
    per_period_sharpe,
    probabilistic_sharpe_ratio,
    sharpe_ratio,
    trial_moments,
)

__all__ = [
    "REFERENCE_BASELINE",
    "annualised_sharpe",
    "deflated_sharpe_ratio",
    "expected_max_sharpe",
    "per_period_sharpe",
    "population_sharpe_interval",
    "population_statistics",
    "probabilistic_sharpe_ratio",
    "sharpe_confidence_interval",
    "sharpe_ratio",
    "spa_pvalue",
    "stationary_block_length",
]

REFERENCE_BASELINE = "buy_and_hold"
"""The baseline whose Sharpe is the second PSR benchmark."""

_NAN = float("nan")


def _finite(x: Any) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _seed_rows(x, ppy, ref_sr, sr0, size, reps, seed, *, bootstrap: bool):
    """Each seed's row of :func:`population_statistics` (``seeds``) and its Sharpe interval
    (with ``bootstrap`` False: the Sharpe alone, no bounds)."""
    rows, cis = [], []
    for s in range(x.shape[1]):
        r = x[:, s]
        if bootstrap:
            ci = sharpe_confidence_interval(
                r, periods_per_year=ppy, size=size, reps=reps, seed=seed
            )
        else:
            sr = annualised_sharpe(sharpe_ratio(r), ppy)
            ci = {"sharpe": sr, "low": _NAN, "high": _NAN, "block_length": _NAN}
        cis.append(ci)
        rows.append(
            {
                "seed": s,
                "sharpe": _finite(ci["sharpe"]),
                "sharpe_low": _finite(ci["low"]),
                "sharpe_high": _finite(ci["high"]),
                "block_length": _finite(ci["block_length"]),
                "psr_zero": _finite(probabilistic_sharpe_ratio(r, 0.0)),
                "psr_reference": _finite(probabilistic_sharpe_ratio(r, ref_sr)),
                "dsr": _finite(probabilistic_sharpe_ratio(r, sr0)),
            }
        )
    return rows, cis


def _spa_section(x, baseline_returns, reps: int, seed: int) -> dict[str, Any]:
    """The ``spa`` entry of :func:`population_statistics` (:func:`spa_pvalue`, finite or None)."""
    spa = spa_pvalue(x, baseline_returns, reps=reps, seed=seed)
    finite = lambda d: {k: _finite(v) for k, v in d.items()}
    return {
        "baselines": {n: finite(p) for n, p in spa["baselines"].items()},
        "agent_beats_all": finite(spa["agent_beats_all"]),
        "some_baseline_beats_agent": finite(spa["some_baseline_beats_agent"]),
        "block_length": _finite(spa["block_length"]),
    }


def population_statistics(
    seed_returns: ArrayLike | Sequence[ArrayLike],
    baseline_returns: Mapping[str, ArrayLike],
    *,
    trial_sharpes: ArrayLike | None = None,
    trials: str | None = None,
    periods_per_year: float = 252,
    size: float = 0.95,
    reps: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The statistics of one split of a population run, as a JSON-ready dict (None for
    undefined numbers).

    Args:
      seed_returns: ``[T, S]`` (or S series of T bars) per-bar returns of each seed's walk.
      baseline_returns: name → ``[T]`` the baselines' returns on the same bars (every one enters
        the SPA; :data:`REFERENCE_BASELINE`'s Sharpe is the second PSR benchmark).
      trial_sharpes: the **annualised** Sharpe of every trial the selection saw (e.g. each
        seed's val Sharpe at every epoch's checkpoint); None: the seeds' Sharpes here.
      trials: what the trials are (e.g. ``"seeds × checkpoints compared on val"``).
      periods_per_year, size, reps, seed: annualisation, confidence level, bootstrap
        replications and seed.

    Returns:
      ``{"bars", "confidence", "seeds": [{"seed", "sharpe", "sharpe_low", "sharpe_high",
      "block_length", "psr_zero", "psr_reference", "dsr"}], "mean": {"sharpe", "sharpe_low",
      "sharpe_high", "block_length"}, "reference": {"name", "sharpe"}, "dsr": {"trials",
      "num_trials", "sharpe_std", "sr0"}, "bootstrap": {...}, "spa": {...}}`` — Sharpes and
      SR0 annualised, ``sharpe_std`` the trials' annualised Sharpe std; without arch the
      interval bounds are None, ``spa`` is absent and ``"unavailable"`` says why.
    """
    x = np.asarray(seed_returns, dtype=np.float64)
    x = x.T if not isinstance(seed_returns, np.ndarray) else x  # S series → [T, S]
    x = x[:, None] if x.ndim == 1 else x
    if x.ndim != 2:
        raise ValueError(f"seed_returns: expected [T, S], got shape {x.shape}")
    ppy = periods_per_year
    ref = baseline_returns.get(REFERENCE_BASELINE)
    ref_sr = sharpe_ratio(ref) if ref is not None else _NAN
    if trial_sharpes is None:
        trial_pp = [sharpe_ratio(x[:, s]) for s in range(x.shape[1])]
        trials = trials or "seeds evaluated here (no selection history given)"
    else:
        trial_pp = np.asarray(trial_sharpes, dtype=np.float64).ravel() / math.sqrt(ppy)
    try:
        num_trials, variance = trial_moments(trial_pp)
        sr0 = expected_max_sharpe(num_trials, variance)
    except ValueError:
        num_trials, variance, sr0 = 0, _NAN, _NAN

    try:
        arch_bootstrap()
        missing = None
    except ImportError as e:
        missing = f"arch not installed: {e}; bootstrap intervals and SPA skipped"

    rows, cis = _seed_rows(x, ppy, ref_sr, sr0, size, reps, seed, bootstrap=missing is None)
    if missing is None and x.shape[1] == 1:
        mean = cis[0]  # one seed: the joint bootstrap is that seed's (same block, same seed)
    elif missing is None:
        mean = population_sharpe_interval(x, periods_per_year=ppy, size=size, reps=reps, seed=seed)
    else:
        sharpes = [r["sharpe"] for r in rows if r["sharpe"] is not None]
        mean = {
            "sharpe": float(np.mean(sharpes)) if sharpes else _NAN,
            "low": _NAN,
            "high": _NAN,
            "block_length": _NAN,
        }
    out: dict[str, Any] = {
        "bars": int(x.shape[0]),
        "confidence": float(size),
        "seeds": rows,
        "mean": {
            "sharpe": _finite(mean["sharpe"]),
            "sharpe_low": _finite(mean["low"]),
            "sharpe_high": _finite(mean["high"]),
            "block_length": _finite(mean["block_length"]),
        },
        "reference": {
            "name": REFERENCE_BASELINE if ref is not None else None,
            "sharpe": _finite(annualised_sharpe(ref_sr, ppy)),
        },
        "dsr": {
            "trials": trials or "trials given by the caller",
            "num_trials": int(num_trials),
            "sharpe_std": _finite(math.sqrt(variance) * math.sqrt(ppy)),
            "sr0": _finite(annualised_sharpe(sr0, ppy)),
        },
        "bootstrap": {
            "method": "stationary bootstrap (arch), percentile interval",
            "reps": int(reps),
            "seed": int(seed),
        },
    }
    if missing is not None:
        out["unavailable"] = missing
    elif baseline_returns:
        out["spa"] = _spa_section(x, baseline_returns, reps, seed)
    return out
