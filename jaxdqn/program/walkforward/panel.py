"""A panel's walk-forward, instrument by instrument (issue 29): every instrument's test segments
of the folds that trade it stitched into one out-of-sample series, and the cross-section.

Fold k of a panel's walk-forward is a panel run (:mod:`jaxdqn.program.report.panel_results`): its
``eval_test.csv`` holds every seed's walk of every instrument of the fold, and
``baselines_instruments_test.csv`` every baseline's equity on the same bars. Instrument ``i``'s
stitched series is its test segments in fold order, each starting flat at equity 1 (a fold is a
new agent), so as for the whole walk-forward (:mod:`jaxdqn.program.walkforward.stitched`)

    W^i_t = (∏_{j<k} G^i_j) · W^{i,k}_t,     G^i_j = instrument i's final test equity in fold j,

over the folds j that trade i; the baselines' returns are recovered from their equity per segment
(``r_t = W_t / W_{t−1} − 1``, ``W_{−1} = 1``). Each instrument's metrics per seed are
:func:`jaxdqn.evaluation.metrics.performance` of its stitched returns; the cross-section is
:func:`jaxdqn.evaluation.panel_statistics.cross_section_statistics` of the ``[S, N]`` stitched
Sharpe ratios against each instrument's stitched buy-and-hold.

The same stitching serves a held-out universe: each fold's checkpoint evaluated on instruments
it never trained on (``python -m jaxdqn.evaluate fold_<k> data.instruments=[...] --out ...``
writes the same two files), :func:`read_fold_walks` on those directories.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from jaxdqn.evaluation import metrics as metrics_lib
from jaxdqn.evaluation import panel_statistics
from jaxdqn.program.records.results import (
    INSTRUMENT_BASELINES,
    read_eval_log,
    read_instrument_baselines,
)
from jaxdqn.program.report.panel_results import seed_mean

__all__ = [
    "INSTRUMENTS_FILE",
    "FoldWalks",
    "read_fold_walks",
    "returns_from_equity",
    "stitch_instruments",
]

INSTRUMENTS_FILE = "stitched_instruments_test.csv"
REFERENCE = "buy_and_hold"


class FoldWalks(NamedTuple):
    """One fold's test walks of a panel: ``log`` the agent's (``seed, instrument, date, return,
    position, traded, equity, ...``), ``baselines`` each baseline's equity per instrument and
    date (``instrument, date, <baseline>...``)."""

    fold: int
    log: pd.DataFrame
    baselines: pd.DataFrame


def read_fold_walks(fold: int, directory: Path, split: str = "test") -> FoldWalks:
    """Fold ``fold``'s walks of ``split`` from ``directory`` (a fold's run directory, or the
    ``--out`` of ``python -m jaxdqn.evaluate`` on it).

    Raises:
      FileNotFoundError: a file is missing.
      ValueError: the walks are not a panel's, or the baselines walked other bars.
    """
    directory = Path(directory)
    log = read_eval_log(directory / f"eval_{split}.csv")
    if "instrument" not in log.columns:
        raise ValueError(f"{directory}/eval_{split}.csv: not a panel's walks (no instrument)")
    base = read_instrument_baselines(directory / INSTRUMENT_BASELINES.format(split=split))
    for s, seg in log.groupby("seed"):
        keys = seg[["instrument", "date"]].reset_index(drop=True)
        if not keys.equals(base[["instrument", "date"]].reset_index(drop=True)):
            raise ValueError(
                f"{directory}: seed {s}'s walks and the baselines' are not on the same bars"
            )
    return FoldWalks(fold, log, base)


def returns_from_equity(equity: np.ndarray) -> np.ndarray:
    """Simple returns ``r_t = W_t / W_{t−1} − 1`` of an equity curve that starts from 1."""
    return equity / np.concatenate([[1.0], equity[:-1]]) - 1.0


def stitch_instruments(
    folds: Sequence[FoldWalks], periods_per_year: float, *, reps: int = 1000, seed: int = 0
) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    """Stitch every instrument's test segments over ``folds`` (module docstring).

    Returns:
      ``(instruments, cross_section, frame)``: ``instruments[name] = {"folds": [k, ...],
      "bars": n, "test": seed-mean metrics, "test_seeds": [metrics per seed], "baselines":
      {baseline: {"test": metrics}}}``; the cross-section of the stitched Sharpe ratios
      (:func:`~jaxdqn.evaluation.panel_statistics.cross_section_statistics`); and the stitched
      series (``instrument, date, fold``; ``seed_<s>_return``, ``_equity``, ``_position`` and
      ``_traded`` per seed; ``<baseline>_return`` and ``<baseline>_equity`` per baseline).

    Raises:
      ValueError: no fold, or folds with different seeds or baselines.
    """
    if not folds:
        raise ValueError("stitch_instruments: no fold")
    seeds = sorted(folds[0].log["seed"].unique())
    names_b = [c for c in folds[0].baselines.columns if c not in ("instrument", "date")]
    for f in folds:
        if sorted(f.log["seed"].unique()) != seeds:
            raise ValueError(f"fold {f.fold}: its seeds differ from fold {folds[0].fold}'s")
        if [c for c in f.baselines.columns if c not in ("instrument", "date")] != names_b:
            raise ValueError(f"fold {f.fold}: its baselines differ from fold {folds[0].fold}'s")
    order = sorted({n for f in folds for n in f.log["instrument"].unique()})
    instruments, parts = {}, []
    for name in order:
        segs = []
        for f in folds:
            log = f.log[f.log["instrument"] == name]
            if not len(log):
                continue
            base = f.baselines[f.baselines["instrument"] == name].reset_index(drop=True)
            segs.append((f.fold, log, base))
        columns: dict[str, Any] = {
            "instrument": name,
            "date": np.concatenate([b["date"].to_numpy() for _, _, b in segs]),
            "fold": np.concatenate([np.full(len(b), k) for k, _, b in segs]),
        }
        per_seed = []
        for s in seeds:
            rets, eqs, pos, traded, before = [], [], [], [], 1.0
            for _, log, _ in segs:
                w = log[log["seed"] == s].sort_values("date", kind="stable")
                eq = w["equity"].to_numpy(dtype=np.float64)
                rets.append(w["return"].to_numpy(dtype=np.float64))
                eqs.append(before * eq)
                pos.append(w["position"].to_numpy(dtype=np.float64))
                traded.append(w["traded"].to_numpy(dtype=np.float64))
                before *= eq[-1]
            columns[f"seed_{s}_return"] = np.concatenate(rets)
            columns[f"seed_{s}_equity"] = np.concatenate(eqs)
            columns[f"seed_{s}_position"] = np.concatenate(pos)
            columns[f"seed_{s}_traded"] = np.concatenate(traded)
            per_seed.append(
                metrics_lib.performance(
                    columns[f"seed_{s}_return"],
                    periods_per_year,
                    positions=columns[f"seed_{s}_position"],
                    traded=columns[f"seed_{s}_traded"],
                )
            )
        base_metrics = {}
        for b in names_b:
            rets, eqs, before = [], [], 1.0
            for _, _, base in segs:
                eq = base[b].to_numpy(dtype=np.float64)
                rets.append(returns_from_equity(eq))
                eqs.append(before * eq)
                before *= eq[-1]
            columns[f"{b}_return"] = np.concatenate(rets)
            columns[f"{b}_equity"] = np.concatenate(eqs)
            stitched = metrics_lib.performance(columns[f"{b}_return"], periods_per_year)
            base_metrics[b] = {"test": stitched}
        parts.append(pd.DataFrame(columns))
        instruments[name] = {
            "folds": [k for k, _, _ in segs],
            "bars": len(columns["date"]),
            "test": seed_mean(per_seed),
            "test_seeds": per_seed,
            "baselines": base_metrics,
        }
    sharpe = np.asarray([[m["sharpe"] for m in instruments[n]["test_seeds"]] for n in order]).T
    if REFERENCE in names_b:
        ref = np.asarray([instruments[n]["baselines"][REFERENCE]["test"]["sharpe"] for n in order])
    else:
        ref = np.full(len(order), np.nan)
    cross = panel_statistics.cross_section_statistics(sharpe, ref, reps=reps, seed=seed)
    return instruments, cross, pd.concat(parts, ignore_index=True)
