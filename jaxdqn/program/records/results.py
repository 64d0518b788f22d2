"""The result files of a finished run: ``summary.json``, per-bar walks, baseline equity.

* ``summary.json`` — the final numbers, schema below (:func:`write_summary`).
* ``eval_{split}.csv`` — the agent's per-bar walk of the split
  (:data:`jaxdqn.evaluation.walk.LOG_COLUMNS`; with S seeds the S walks stacked with an int column
  ``seed`` first, see :func:`write_eval_log`).
* ``baselines_{split}.csv`` — baseline equity curves on the same bars: a ``date`` column, then
  one column per baseline holding its equity after each bar (the ``equity`` column of the
  baseline's per-bar log), written by :func:`write_baseline_equity`.

``summary.json`` schema (JSON; every metric value is a number or ``null`` for NaN)::

    {
      "best_epoch":  int | null,    # epoch of the best checkpoint by val Sharpe (1-based)
      "best_step":   int | null,    # learner updates done at that checkpoint (optional)
      "epochs":      int,           # epochs completed
      "wall_time_s": float,         # wall time of the whole run, seconds
      "val":  {metric: float|null}, # the best checkpoint's val metrics (seed mean when S > 1)
      "test": {metric: float|null}, # its test metrics (optional: absent until evaluated)
      "baselines": {                # optional; every baseline through the same environment
        name: {"val": {metric: float|null}, "test": {metric: float|null}}, ...
        # on the synthetic market also "oracle_<order>_<urgency>" (each execution of the
        # oracle's direction), and "oracle" carries "execution": the name of the one it copies
        # (best val Sharpe; jaxdqn.evaluation.baselines.run_baselines)
      },
      "seeds": [                    # optional; one entry per seed of a population run
        {"seed": int, "best_epoch": int|null, "best_step": int|null,
         "val": {...}, "test": {...}}, ...
      ],
      "statistics": {               # optional; per split (jaxdqn.program.report.run_statistics)
        split: {
          "bars": int, "confidence": 0.95,
          "seeds": [{"seed": int, "sharpe", "sharpe_low", "sharpe_high", "block_length",
                     "psr_zero", "psr_reference", "dsr": float|null}, ...],
          "mean": {"sharpe", "sharpe_low", "sharpe_high", "block_length": float|null},
          "reference": {"name": str|null, "sharpe": float|null},   # PSR's 2nd benchmark
          "dsr": {"trials": str, "num_trials": int, "sharpe_std", "sr0": float|null},
          "bootstrap": {"method": str, "reps": int, "seed": int},
          "spa": {"baselines": {name: {"consistent", "lower", "upper"}},  # absent
                  "agent_beats_all": {...}, "some_baseline_beats_agent": {...},
                  "block_length": float|null},
          "unavailable": str        # only when arch is missing (then no intervals, no spa)
        }
      },                            # Sharpes annualised; formulas in jaxdqn.evaluation.statistics
      "cost_stress": {              # optional; the test walk at multiples of the costs
        "split": "test", "metrics": [metric, ...],
        "rows": [{"multiple": float, "half_spread_bps": float, "commission_bps": float,
                  "impact_eta": float, "seeds": [{metric: float|null}, ...],
                  "mean": {metric: float|null}}, ...]
      },
      "provenance": {name: scalar}, # optional; what a rerun needs: git_commit, python, jax,
                                    # jaxlib, platform, device_kind, devices, processes,
                                    # xla_flags, seed, deterministic, config_sha256
                                    # (jaxdqn.program.records.provenance)
      ...                           # any further keys (e.g. "jax_version", "device") are kept
    }                               # and shown in the report's header when scalar

Metric names are those of :func:`jaxdqn.evaluation.metrics.performance` (sharpe, sortino,
max_drawdown, annual_return, annual_volatility, calmar, hit_rate, turnover, exposure, ...).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from jaxdqn.program.records.formats import to_jsonable

__all__ = [
    "INSTRUMENT_BASELINES",
    "SPLITS",
    "SUMMARY_FILE",
    "read_baseline_equity",
    "read_eval_log",
    "read_instrument_baselines",
    "read_summary",
    "write_baseline_equity",
    "write_eval_log",
    "write_instrument_baselines",
    "write_summary",
    "write_text_atomic",
]

SUMMARY_FILE = "summary.json"
SPLITS = ("val", "test")
"""The evaluated splits, in report order."""


# ---------------------------------------------------------------------------------------------
# summary.json
# ---------------------------------------------------------------------------------------------


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a fsync'ed temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_metrics(where: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(f"summary.{where}: expected a mapping of metric -> number")
    for k, v in value.items():
        if v is not None and not isinstance(v, (int, float, np.number)):
            raise ValueError(f"summary.{where}.{k}: expected a number, got {v!r}")


def _check_opt_int(where: str, value: Any) -> None:
    if value is not None and not isinstance(value, (int, np.integer)):
        raise ValueError(f"summary.{where}: expected an integer or None, got {value!r}")


def _check_mapping(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"summary.{where}: expected a mapping")
    return value


def _check_list(where: str, value: Any) -> Sequence[Any]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"summary.{where}: expected a list")
    return value


def _check_statistics(stats: Any) -> None:
    for split, entry in _check_mapping("statistics", stats).items():
        where = f"statistics.{split}"
        entry = _check_mapping(where, entry)
        for key in ("seeds", "mean", "dsr"):
            if key not in entry:
                raise ValueError(f"summary.{where}: missing key {key!r}")
        for i, row in enumerate(_check_list(f"{where}.seeds", entry["seeds"])):
            row = _check_mapping(f"{where}.seeds[{i}]", row)
            _check_opt_int(f"{where}.seeds[{i}].seed", row.get("seed"))
            _check_metrics(f"{where}.seeds[{i}]", {k: v for k, v in row.items() if k != "seed"})
        _check_metrics(f"{where}.mean", entry["mean"])
        dsr = _check_mapping(f"{where}.dsr", entry["dsr"])
        if not isinstance(dsr.get("trials"), str):
            raise ValueError(f"summary.{where}.dsr.trials: expected a description of the trials")
        _check_opt_int(f"{where}.dsr.num_trials", dsr.get("num_trials"))
        _check_metrics(f"{where}.dsr", {k: dsr.get(k) for k in ("sharpe_std", "sr0")})
        if "spa" in entry:
            spa = _check_mapping(f"{where}.spa", entry["spa"])
            for name, p in _check_mapping(f"{where}.spa.baselines", spa.get("baselines")).items():
                _check_metrics(f"{where}.spa.baselines.{name}", p)
            for key in ("agent_beats_all", "some_baseline_beats_agent"):
                _check_metrics(f"{where}.spa.{key}", spa.get(key))
        if entry.get("unavailable") is not None and not isinstance(entry["unavailable"], str):
            raise ValueError(f"summary.{where}.unavailable: expected a reason")


def _check_cost_stress(stress: Any) -> None:
    stress = _check_mapping("cost_stress", stress)
    for i, row in enumerate(_check_list("cost_stress.rows", stress.get("rows"))):
        where = f"cost_stress.rows[{i}]"
        row = _check_mapping(where, row)
        scalars = ("multiple", "half_spread_bps", "commission_bps", "impact_eta")
        _check_metrics(where, {k: row.get(k) for k in scalars})
        if row.get("multiple") is None:
            raise ValueError(f"summary.{where}.multiple: expected a number")
        for j, seed in enumerate(_check_list(f"{where}.seeds", row.get("seeds"))):
            _check_metrics(f"{where}.seeds[{j}]", seed)
        _check_metrics(f"{where}.mean", row.get("mean"))


def _validate_summary(s: Mapping[str, Any]) -> None:
    for key in ("best_epoch", "epochs", "wall_time_s", "val"):
        if key not in s:
            raise ValueError(f"summary: missing key {key!r}")
    _check_opt_int("best_epoch", s["best_epoch"])
    _check_opt_int("best_step", s.get("best_step"))
    if not isinstance(s["epochs"], (int, np.integer)):
        raise ValueError(f"summary.epochs: expected an integer, got {s['epochs']!r}")
    if not isinstance(s["wall_time_s"], (int, float, np.number)):
        raise ValueError(f"summary.wall_time_s: expected a number, got {s['wall_time_s']!r}")
    _check_metrics("val", s["val"])
    if s.get("test") is not None:
        _check_metrics("test", s["test"])
    for name, b in (s.get("baselines") or {}).items():
        if not isinstance(b, Mapping):
            raise ValueError(f"summary.baselines.{name}: expected {{'val': ..., 'test': ...}}")
        if b.get("execution") is not None and not isinstance(b["execution"], str):
            raise ValueError(f"summary.baselines.{name}.execution: expected a baseline name")
        for split in SPLITS:
            if b.get(split) is not None:
                _check_metrics(f"baselines.{name}.{split}", b[split])
    seeds = s.get("seeds")
    if seeds is not None:
        if not isinstance(seeds, Sequence) or isinstance(seeds, str):
            raise ValueError("summary.seeds: expected a list of per-seed mappings")
        for i, entry in enumerate(seeds):
            if not isinstance(entry, Mapping):
                raise ValueError(f"summary.seeds[{i}]: expected a mapping")
            _check_opt_int(f"seeds[{i}].best_epoch", entry.get("best_epoch"))
            _check_opt_int(f"seeds[{i}].best_step", entry.get("best_step"))
            for split in SPLITS:
                if entry.get(split) is not None:
                    _check_metrics(f"seeds[{i}].{split}", entry[split])
    if s.get("statistics") is not None:
        _check_statistics(s["statistics"])
    if s.get("cost_stress") is not None:
        _check_cost_stress(s["cost_stress"])
    prov = s.get("provenance")
    if prov is not None and (
        not isinstance(prov, Mapping)
        or not all(v is None or isinstance(v, (str, int, float, bool)) for v in prov.values())
    ):
        raise ValueError("summary.provenance: expected a mapping of scalar values")


def write_summary(run_dir: str | os.PathLike, summary: Mapping[str, Any]) -> Path:
    """Validate ``summary`` against the schema (module docstring) and write ``summary.json``
    atomically (NaN and ±inf → ``null``; numpy and jax values converted). Returns its path.

    Raises:
      ValueError: a required key is missing or a value has the wrong type.
    """
    _validate_summary(summary)
    path = Path(run_dir) / SUMMARY_FILE
    text = json.dumps(to_jsonable(dict(summary), "summary"), indent=2, allow_nan=False)
    write_text_atomic(path, text + "\n")
    return path


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``summary.json`` of the run (``null`` metrics stay None), or None when absent."""
    path = Path(run_dir) / SUMMARY_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------------------------
# Per-bar logs and baseline equity
# ---------------------------------------------------------------------------------------------


def write_eval_log(path: str | os.PathLike, logs: pd.DataFrame | Sequence[pd.DataFrame]) -> Path:
    """Write an agent's per-bar evaluation log (``EvalResult.log``) as CSV.

    One DataFrame is written as is; a sequence of S DataFrames (one walk per seed) is stacked
    with an int column ``seed`` (0..S−1) in front.
    """
    path = Path(path)
    if isinstance(logs, pd.DataFrame):
        frame = logs
    else:
        frame = pd.concat(
            [log.assign(seed=s)[["seed", *log.columns]] for s, log in enumerate(logs)],
            ignore_index=True,
        )
    frame.to_csv(path, index=False)
    return path


def _parse_dates(col: pd.Series) -> pd.Series:
    if col.dtype.kind in "iuf":
        return col
    try:
        return pd.to_datetime(col)
    except (ValueError, TypeError):
        return col


def read_eval_log(path: str | os.PathLike) -> pd.DataFrame:
    """A per-bar log written by :func:`write_eval_log` (``date`` parsed when it is a date)."""
    frame = pd.read_csv(path)
    if "date" in frame.columns:
        frame["date"] = _parse_dates(frame["date"])
    return frame


def write_baseline_equity(
    path: str | os.PathLike, dates: ArrayLike, equity: Mapping[str, ArrayLike]
) -> Path:
    """Write ``baselines_{split}.csv``: column ``date`` then one equity column per baseline.

    Args:
      path: the file (e.g. ``run_dir / "baselines_test.csv"``).
      dates: ``[n]`` the bars (the ``date`` column of the baselines' per-bar logs).
      equity: name → ``[n]`` equity after each bar (each log's ``equity`` column).

    Raises:
      ValueError: a series whose length differs from ``dates``, or no baseline.
    """
    dates = pd.Index(dates)
    if not equity:
        raise ValueError("write_baseline_equity: no baseline given")
    columns = {"date": dates}
    for name, values in equity.items():
        arr = np.asarray(values, dtype=np.float64)
        if arr.shape != (len(dates),):
            raise ValueError(
                f"write_baseline_equity: {name} has shape {arr.shape}, expected ({len(dates)},)"
            )
        if name == "date":
            raise ValueError("write_baseline_equity: 'date' is not a baseline name")
        columns[str(name)] = arr
    path = Path(path)
    pd.DataFrame(columns).to_csv(path, index=False)
    return path


def read_baseline_equity(path: str | os.PathLike) -> pd.DataFrame:
    """``baselines_{split}.csv`` as a DataFrame indexed by ``date``, one column per baseline."""
    frame = pd.read_csv(path)
    frame["date"] = _parse_dates(frame["date"])
    return frame.set_index("date")


INSTRUMENT_BASELINES = "baselines_instruments_{split}.csv"
"""A panel run's file of each baseline's equity on each instrument's walk of a split."""


def write_instrument_baselines(path: str | os.PathLike, logs: Mapping[str, pd.DataFrame]) -> Path:
    """Write a panel's ``baselines_instruments_{split}.csv``: columns ``instrument``, ``date``,
    then one equity column per baseline (each instrument's walk starts at equity 1).

    Args:
      path: the file.
      logs: baseline name → its panel walk log (columns ``instrument``, ``date``, ``equity``,
        in the same instrument and date order for every baseline).

    Raises:
      ValueError: no baseline, or two baselines walked on different bars.
    """
    if not logs:
        raise ValueError("write_instrument_baselines: no baseline given")
    first = next(iter(logs.values()))
    frame = first[["instrument", "date"]].reset_index(drop=True)
    for name, log in logs.items():
        if name in ("instrument", "date"):
            raise ValueError(f"write_instrument_baselines: {name!r} is not a baseline name")
        keys = log[["instrument", "date"]].reset_index(drop=True)
        if not keys.equals(frame[["instrument", "date"]]):
            raise ValueError(f"write_instrument_baselines: {name} walked other bars")
        frame[str(name)] = log["equity"].to_numpy(dtype=np.float64)
    path = Path(path)
    frame.to_csv(path, index=False)
    return path


def read_instrument_baselines(path: str | os.PathLike) -> pd.DataFrame:
    """``baselines_instruments_{split}.csv`` (``date`` parsed)."""
    frame = pd.read_csv(path)
    frame["date"] = _parse_dates(frame["date"])
    return frame
