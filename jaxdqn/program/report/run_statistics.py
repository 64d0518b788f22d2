"""The statistics of a finished run's walks (docs/DESIGN.md, S1), as written to
``summary.json`` (``"statistics"``, ``"cost_stress"``) and ``metrics_<split>.json``.

* :func:`selection_trials` — the trials behind the best checkpoint: every seed's val Sharpe at
  every epoch's checkpoint in ``metrics.jsonl`` (the best checkpoint is the best of them by
  the seed-mean val Sharpe), the N and V[SR] of the Deflated Sharpe Ratio.
* :func:`split_statistics` — :func:`jaxdqn.evaluation.statistics.population_statistics` of the
  seeds' per-bar returns on one split against the baselines' returns on the same bars.
* :func:`cost_stress_table` — the rows of the cost-stress table (``eval.cost_multiples``).

The bootstrap's seed is ``eval.key`` (the evaluation's fixed key), so the intervals are
reproducible; its replications are ``eval.bootstrap_reps``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from jaxdqn.config import Config
from jaxdqn.evaluation import cost_stress, statistics
from jaxdqn.evaluation.baselines import ORACLE_EXECUTIONS
from jaxdqn.evaluation.walk import EvalResult
from jaxdqn.market.env import EnvParams
from jaxdqn.program.records import metric_names
from jaxdqn.program.records.formats import fixed
from jaxdqn.program.records.logger import read_metrics

__all__ = [
    "cost_stress_table",
    "selection_trials",
    "split_statistics",
    "summary_lines",
]

_VAL_SHARPE, _VAL_SHARPE_SEEDS = metric_names.require("val_sharpe", "val_sharpe_seeds")
STRESS_METRICS = ("sharpe", "annual_return", "max_drawdown", "annual_turnover")
"""Metrics of each cost-stress row (per seed and the seed mean)."""


def selection_trials(run_dir: str | os.PathLike, members: int = 1) -> tuple[np.ndarray | None, str]:
    """``(annualised val Sharpes [N], description)`` of every (epoch, agent) in the run's
    ``metrics.jsonl`` (``val_sharpe_seeds``, or ``val_sharpe`` with one seed; non-finite values
    dropped); ``(None, ...)`` when there is none. ``members``: a population's member count (its
    agents are members × seeds, every one a trial)."""
    records = []
    for r in read_metrics(run_dir):
        v = r.get(_VAL_SHARPE_SEEDS, r.get(_VAL_SHARPE))
        if v is not None:
            records.append(v)
    values = []
    width = 1
    for r in records:
        v = np.atleast_1d(np.asarray(r, dtype=np.float64)).ravel()
        width = max(width, v.size)
        values.append(v)
    if not values:
        return None, "seeds evaluated (no metrics.jsonl: the selection history is unknown)"
    flat = np.concatenate(values)
    flat = flat[np.isfinite(flat)]
    what = (
        f"seeds × checkpoints compared on val: {width} × {len(records)}, each seed's val Sharpe "
        "at each epoch"
    )
    if members > 1:
        what = (
            f"members × seeds × checkpoints compared on val: {members} × {width // members} × "
            f"{len(records)}, each agent's val Sharpe at each epoch"
        )
    return (flat if flat.size else None), what


def fold_trials(fold_dirs: Sequence[str | os.PathLike]) -> tuple[np.ndarray | None, str]:
    """:func:`selection_trials` of a walk-forward: every (epoch, seed) val Sharpe of every
    fold in ``fold_dirs`` (each fold selects its own checkpoint on its own val)."""
    values = [v for v, _ in map(selection_trials, fold_dirs) if v is not None]
    what = (
        f"every seed's val Sharpe at every epoch of each of the {len(fold_dirs)} folds (each fold "
        "selects its own best checkpoint on its own val)"
    )
    return (np.concatenate(values) if values else None), what


def _baseline_returns(
    base_logs: Mapping[tuple[str, str], pd.DataFrame], split: str, dates: pd.Series
) -> dict[str, np.ndarray]:
    out = {}
    for (name, s), log in base_logs.items():
        if s != split or name in ORACLE_EXECUTIONS:
            continue
        if not np.array_equal(log["date"].to_numpy(), dates.to_numpy()):
            raise ValueError(f"baseline {name} on {split}: its bars differ from the agent's")
        out[name] = log["return"].to_numpy(dtype=np.float64)
    return out


def split_statistics(
    cfg: Config,
    seed_logs: Sequence[pd.DataFrame],
    base_logs: Mapping[tuple[str, str], pd.DataFrame],
    split: str,
    trials: tuple[np.ndarray | None, str],
    *,
    bars_per_year: float,
    reps: int | None = None,
) -> dict[str, Any]:
    """The ``"statistics"`` entry of one split: the seeds' per-bar walks ``seed_logs`` (their
    ``return`` column, the same bars) against every baseline of ``base_logs`` (keyed ``(name,
    split)``, as :func:`jaxdqn.evaluation.baselines.run_baselines` fills it; the oracle's
    execution rows left out), with the DSR's ``trials`` from :func:`selection_trials`,
    annualised with ``bars_per_year`` (the run's bar clock); ``reps`` (default
    ``cfg.eval.bootstrap_reps``) replications seeded with ``cfg.eval.key``."""
    dates = seed_logs[0]["date"]
    returns = np.stack([log["return"].to_numpy(dtype=np.float64) for log in seed_logs], axis=1)
    trial_sharpes, what = trials
    return statistics.population_statistics(
        returns,
        _baseline_returns(base_logs, split, dates),
        trial_sharpes=trial_sharpes,
        trials=what,
        periods_per_year=bars_per_year,
        reps=cfg.eval.bootstrap_reps if reps is None else reps,
        seed=cfg.eval.key,
    )


def cost_stress_table(
    env_params: EnvParams,
    multiples: Sequence[float],
    walks: Sequence[Sequence[EvalResult]],
    split: str = "test",
) -> dict[str, Any]:
    """The ``"cost_stress"`` entry: ``walks[s][i]`` is seed s's walk at ``multiples[i]``.

    Returns:
      ``{"split", "metrics", "rows": [{"multiple", "half_spread_bps", "commission_bps",
      "impact_eta", "seeds": [{metric: value}], "mean": {metric: seed mean}}]}`` with the
      metrics of :data:`STRESS_METRICS`.
    """
    rows = []
    for i, k in enumerate(multiples):
        seeds = [{m: float(w[i].metrics.get(m, math.nan)) for m in STRESS_METRICS} for w in walks]
        mean = {}
        for m in STRESS_METRICS:
            vals = np.array([s[m] for s in seeds])
            vals = vals[np.isfinite(vals)]
            mean[m] = float(vals.mean()) if vals.size else math.nan
        costs = cost_stress.cost_bps(cost_stress.scale_costs(env_params, k))
        rows.append({"multiple": float(k), **costs, "seeds": seeds, "mean": mean})
    return {"split": split, "metrics": list(STRESS_METRICS), "rows": rows}


def summary_lines(stats: Mapping[str, Any]) -> list[str]:
    """The plain-text table of :func:`split_statistics`'s entry that ``python -m
    jaxdqn.evaluate`` prints."""
    level = round(100 * float(stats.get("confidence", 0.95)))
    ref = stats.get("reference") or {}
    lines = [f"statistics ({stats.get('bars')} bars; Sharpe annualised, {level} % bootstrap CI):"]
    for r in stats.get("seeds") or []:
        lines.append(
            f"  seed {r['seed']}: sharpe {fixed(r['sharpe'])} "
            f"[{fixed(r['sharpe_low'])}, {fixed(r['sharpe_high'])}]  PSR>0 {fixed(r['psr_zero'])}  "
            f"PSR>{ref.get('name')} {fixed(r['psr_reference'])}  DSR {fixed(r['dsr'])}"
        )
    m = stats.get("mean") or {}
    lines.append(
        f"  mean: sharpe {fixed(m.get('sharpe'))} "
        f"[{fixed(m.get('sharpe_low'))}, {fixed(m.get('sharpe_high'))}]"
    )
    dsr = stats.get("dsr") or {}
    lines.append(f"  DSR trials: N = {dsr.get('num_trials')} ({dsr.get('trials')})")
    if stats.get("unavailable"):
        lines.append(f"  {stats['unavailable']}")
    elif stats.get("spa"):
        spa = stats["spa"]
        per = ", ".join(f"{n} {fixed(p['consistent'])}" for n, p in spa["baselines"].items())
        lines.append(
            f"  SPA p (consistent): {per}; agent beats every baseline "
            f"{fixed(spa['agent_beats_all']['consistent'])}; some baseline beats the agent "
            f"{fixed(spa['some_baseline_beats_agent']['consistent'])}"
        )
    return lines
