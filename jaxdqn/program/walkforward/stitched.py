"""The walk-forward's results: every fold's out-of-sample test segment stitched into one series.

Fold k's run directory holds its best checkpoint's test walk of every seed (``eval_test.csv``)
and the baselines' equity on the same bars (``baselines_test.csv``). Seed s of the stitched
series is seed s of every fold (each fold trains its population from scratch with the same run
seed), one fold's test segment after the other; each segment starts flat with equity 1 (a fold
is a new agent), so the stitched equity at a bar of fold k's segment is

    W_t = (∏_{j<k} G_j) · W^k_t,    G_j = fold j's final test equity (its growth),

and the stitched returns are the segments' returns, in order. The baselines are stitched the
same way from their own walks through each fold (their returns recovered from their equity:
``r_t = W_t / W_{t−1} − 1``, ``W_{−1} = 1``).

``walkforward.json`` (numbers are ``null`` when not finite)::

    {
      "settings": {mode, unit, folds, train, val, test, purge, embargo},
      "num_bars": int, "first_decision": int, "num_seeds": int,
      "bar_clock": {"bars_per_year", "inferred", "rule"},   # of every annualised number
      "folds": [{"fold": k, "dir": "fold_<k>",
                 "bars": {"train"|"val"|"test": [start, stop)},     # rows, as trained
                 "dates": {"train"|"val"|"test": [first, last]},    # train: first decidable
                 "best_epoch", "epochs", "val_sharpe", "test_sharpe",   # seed means
                 "val_sharpe_seeds": [...], "test_sharpe_seeds": [...],
                 "test_growth_seeds": [...],                        # G_k of every seed
                 "baselines_test_sharpe": {name: float},
                 "wall_time_s": float}, ...],
      "stitched": {"bars": int, "dates": [first, last],
                   "seeds": [{"seed": s, metric: float, ...}], "mean": {metric: seed mean},
                   "baselines": {name: {metric: float}},
                   "statistics": {...}},     # population_statistics, as summary.json's
      "folds_wall_time_s": float,            # the folds' training, summed
      "wall_time_s": float                   # this (last) session of the walk-forward
    }

Metrics are :func:`jaxdqn.evaluation.metrics.performance`'s; the statistics are
:func:`jaxdqn.program.report.run_statistics.split_statistics` of the stitched returns against the
stitched baselines, the DSR's trials being every (seed, epoch) val Sharpe of every fold.

``stitched_test.csv``: ``date``, ``fold``, then ``seed_<s>_return``, ``seed_<s>_equity`` for
every seed and ``<baseline>_return``, ``<baseline>_equity`` for every baseline.

**Panels.** Each fold's walk is its equal-weight portfolio of the per-instrument agents
(``portfolio_test.csv``) against the baselines' equal-weight portfolios (``baselines_test.csv``),
so ``stitched`` is the stitched portfolio. ``walkforward.json`` adds, as a panel run's
``summary.json`` does, ``instruments`` (each instrument's stitched series over the folds that
trade it: :func:`jaxdqn.program.walkforward.panel.stitch_instruments`) and ``panel``
(``cross_section.test``, ``portfolio.test``), and the fold entries list their ``instruments``;
``stitched_instruments_test.csv`` holds every instrument's stitched series.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.config import Config
from jaxdqn.evaluation import metrics as metrics_lib
from jaxdqn.program.records.formats import to_jsonable
from jaxdqn.program.records.results import (
    read_baseline_equity,
    read_eval_log,
    read_summary,
    write_text_atomic,
)
from jaxdqn.program.report import run_statistics
from jaxdqn.program.report.panel_results import seed_mean
from jaxdqn.program.walkforward import document
from jaxdqn.program.walkforward import panel as walkforward_panel

__all__ = ["RESULT_FILE", "STITCHED_FILE", "Stitched", "stitch", "write_results"]

RESULT_FILE = "walkforward.json"
STITCHED_FILE = "stitched_test.csv"


class Stitched(NamedTuple):
    """``result``: the ``walkforward.json`` content; ``frame``: ``stitched_test.csv``;
    ``instruments``: a panel's ``stitched_instruments_test.csv`` (None for one instrument)."""

    result: dict[str, Any]
    frame: pd.DataFrame
    instruments: pd.DataFrame | None = None


def _seed_values(summary: Mapping[str, Any], split: str, key: str = "sharpe") -> list[Any]:
    seeds = summary.get("seeds")
    if seeds:
        return [(s.get(split) or {}).get(key) for s in seeds]
    return [(summary.get(split) or {}).get(key)]


def _read_fold(entry: Mapping[str, Any], fdir: Path):
    """Fold ``fdir``'s summary, test walks (every seed's; a panel's: its equal-weight portfolio)
    and baselines' equity, checked against the planned test segment."""
    summary = read_summary(fdir)
    if summary is None:
        raise FileNotFoundError(f"{fdir}: no summary.json (the fold has not finished)")
    panel = "instruments" in entry
    name = "portfolio_test.csv" if panel else "eval_test.csv"
    log = read_eval_log(fdir / name)
    log = log.sort_values(["seed", "date" if panel else "t"], kind="stable")
    base = read_baseline_equity(fdir / "baselines_test.csv")
    lo, hi = entry["bars"]["test"]
    first, last = (pd.Timestamp(d) for d in entry["dates"]["test"])
    if panel and list((summary.get("panel") or {}).get("instruments") or []) != list(
        entry["instruments"]
    ):
        raise ValueError(f"{fdir}/summary.json: its instruments are not the fold's planned ones")
    for s, seg in log.groupby("seed"):
        dates = pd.DatetimeIndex(seg["date"])
        # a panel's portfolio has a row for each calendar bar that some instrument trades
        planned = dates.is_monotonic_increasing and dates[0] >= first and dates[-1] <= last
        if not panel:
            planned = len(seg) == hi - lo and dates[0] == first and dates[-1] == last
        if not planned:
            raise ValueError(
                f"{fdir}/{name}: seed {s}'s walk is not the planned test segment "
                f"({len(seg)} bars {dates[0]}..{dates[-1]}, planned {hi - lo} {first}..{last})"
            )
        if not np.array_equal(base.index.to_numpy(), dates.to_numpy()):
            raise ValueError(f"{fdir}/baselines_test.csv: its bars differ from the agent's")
    return summary, log, base


def _fold_row(entry: Mapping[str, Any], fdir: Path, summary, base, growth) -> dict[str, Any]:
    """Fold ``entry``'s line of ``walkforward.json`` (``folds``)."""
    baselines = summary.get("baselines") or {}
    return {
        "fold": entry["fold"],
        "dir": fdir.name,
        "bars": entry["bars"],
        "dates": entry["dates"],
        **({"instruments": entry["instruments"]} if "instruments" in entry else {}),
        "best_epoch": summary.get("best_epoch"),
        "epochs": summary.get("epochs"),
        "val_sharpe": (summary.get("val") or {}).get("sharpe"),
        "test_sharpe": (summary.get("test") or {}).get("sharpe"),
        "val_sharpe_seeds": _seed_values(summary, "val"),
        "test_sharpe_seeds": _seed_values(summary, "test"),
        "test_growth_seeds": growth.tolist(),
        "baselines_test_sharpe": {
            n: ((baselines.get(n) or {}).get("test") or {}).get("sharpe") for n in base.columns
        },
        "wall_time_s": summary.get("wall_time_s"),
    }


def _stitch_agent(plan: Mapping[str, Any], fold_dirs: Sequence[Path]):
    """Every seed's test segments one after the other, ``W_t = (∏_{j<k} G_j) · W^k_t``:
    ``(frame, fold rows, baseline equity per fold, baseline names, final growth per seed)``."""
    rows, parts, base_parts = [], [], []
    growth_before: np.ndarray | None = None
    names: list[str] | None = None
    for entry, fdir in zip(plan["folds"], fold_dirs, strict=True):
        summary, log, base = _read_fold(entry, fdir)
        names = list(base.columns) if names is None else [n for n in names if n in base.columns]
        seeds = sorted(log["seed"].unique())
        segs = [log[log["seed"] == s] for s in seeds]
        growth = np.array([seg["equity"].iloc[-1] for seg in segs], dtype=np.float64)
        before = np.ones(len(seeds)) if growth_before is None else growth_before
        frame = {"date": pd.DatetimeIndex(segs[0]["date"]), "fold": entry["fold"]}
        for s, seg in zip(seeds, segs, strict=True):
            frame[f"seed_{s}_return"] = seg["return"].to_numpy(dtype=np.float64)
            frame[f"seed_{s}_equity"] = before[s] * seg["equity"].to_numpy(dtype=np.float64)
            frame[f"seed_{s}_position"] = seg["position"].to_numpy(dtype=np.float64)
            frame[f"seed_{s}_traded"] = seg["traded"].to_numpy(dtype=np.float64)
        parts.append(pd.DataFrame(frame))
        base_parts.append(base)
        growth_before = before * growth
        rows.append(_fold_row(entry, fdir, summary, base, growth))
    assert names is not None and growth_before is not None  # at least one fold
    return pd.concat(parts, ignore_index=True), rows, base_parts, names, growth_before


def _stitch_baselines(frame: pd.DataFrame, names: Sequence[str], base_parts) -> None:
    """Each baseline through each fold into ``frame``: equity within the fold → returns →
    stitched equity (``<name>_return``, ``<name>_equity``)."""
    for name in names:
        rets, eqs, before = [], [], 1.0
        for base in base_parts:
            eq = base[name].to_numpy(dtype=np.float64)
            rets.append(walkforward_panel.returns_from_equity(eq))
            eqs.append(before * eq)
            before *= eq[-1]
        frame[f"{name}_return"] = np.concatenate(rets)
        frame[f"{name}_equity"] = np.concatenate(eqs)


def _panel_sections(cfg: Config, plan, fold_dirs, result: dict[str, Any]) -> pd.DataFrame:
    """A panel's ``instruments`` and ``panel`` sections added to ``result``; returns
    ``stitched_instruments_test.csv``."""
    walks = [
        walkforward_panel.read_fold_walks(entry["fold"], fdir)
        for entry, fdir in zip(plan["folds"], fold_dirs, strict=True)
    ]
    ppy = float(plan["bar_clock"]["bars_per_year"])
    per_instrument, cross, instruments_frame = walkforward_panel.stitch_instruments(
        walks, ppy, reps=cfg.eval.bootstrap_reps, seed=cfg.eval.key
    )
    stitched = result["stitched"]
    result["instruments"] = per_instrument
    result["panel"] = {
        "instruments": list(per_instrument),
        "select_on": cfg.eval.select_on,
        "cross_section": {"test": cross},
        "portfolio": {
            "test": {
                "agent": stitched["mean"],
                "baselines": {n: m for n, m in stitched["baselines"].items() if n != "flat"},
            }
        },
    }
    return instruments_frame


def stitch(
    cfg: Config,
    plan: Mapping[str, Any],
    fold_dirs: Sequence[Path],
    *,
    session_start: float | None = None,
) -> Stitched:
    """Stitch the finished folds ``fold_dirs`` of the plan record ``plan``
    (:func:`jaxdqn.program.walkforward.driver.plan_record`) into the results (module docstring).

    Raises:
      FileNotFoundError: a fold has not finished.
      ValueError: a fold's walks are not its planned test segment.
    """
    ppy = float(plan["bar_clock"]["bars_per_year"])
    frame, rows, base_parts, names, growth = _stitch_agent(plan, fold_dirs)
    _stitch_baselines(frame, names, base_parts)
    seeds = range(len(growth))
    seed_metrics = [
        {
            "seed": s,
            **metrics_lib.performance(
                frame[f"seed_{s}_return"],
                ppy,
                positions=frame[f"seed_{s}_position"],
                traded=frame[f"seed_{s}_traded"],
            ),
        }
        for s in seeds
    ]
    dates = frame["date"]
    seed_logs = [pd.DataFrame({"date": dates, "return": frame[f"seed_{s}_return"]}) for s in seeds]
    base_logs = {
        (n, "test"): pd.DataFrame({"date": dates, "return": frame[f"{n}_return"]}) for n in names
    }
    trials = run_statistics.fold_trials(fold_dirs)
    stats = run_statistics.split_statistics(
        cfg, seed_logs, base_logs, "test", trials, bars_per_year=ppy
    )
    result = {
        "settings": dict(plan["settings"]),
        "num_bars": plan["num_bars"],
        "first_decision": plan["first_decision"],
        "bar_clock": dict(plan["bar_clock"]),
        "num_seeds": len(growth),
        "folds": rows,
        "stitched": {
            "bars": len(frame),
            "dates": [rows[0]["dates"]["test"][0], rows[-1]["dates"]["test"][1]],
            "seeds": seed_metrics,
            "mean": seed_mean([{k: v for k, v in m.items() if k != "seed"} for m in seed_metrics]),
            "baselines": {n: metrics_lib.performance(frame[f"{n}_return"], ppy) for n in names},
            "statistics": stats,
        },
        "folds_wall_time_s": float(sum(r["wall_time_s"] or 0.0 for r in rows)),
        "wall_time_s": time.time() - session_start if session_start is not None else None,
    }
    instruments_frame = None
    if all("instruments" in entry for entry in plan["folds"]):
        instruments_frame = _panel_sections(cfg, plan, fold_dirs, result)
    keep = ["date", "fold"]
    for s in seeds:
        keep += [f"seed_{s}_return", f"seed_{s}_equity"]
    for n in names:
        keep += [f"{n}_return", f"{n}_equity"]
    return Stitched(result, frame[keep], instruments_frame)


def write_results(run_dir: Path, stitched: Stitched) -> None:
    """``walkforward.json``, ``stitched_test.csv`` and ``walkforward.md`` with its plots."""
    run_dir = Path(run_dir)
    stitched.frame.to_csv(run_dir / STITCHED_FILE, index=False)
    if stitched.instruments is not None:
        stitched.instruments.to_csv(run_dir / walkforward_panel.INSTRUMENTS_FILE, index=False)
    text = json.dumps(to_jsonable(stitched.result, "walkforward"), indent=2, allow_nan=False)
    write_text_atomic(run_dir / RESULT_FILE, text + "\n")
    document.write_walkforward_report(run_dir, stitched.result, stitched.frame)
