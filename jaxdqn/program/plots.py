"""The report's figures (PNG, matplotlib's object API, no pyplot state): equity and drawdown
against the baselines, and the training curves of ``metrics.jsonl``.

Seeds: with S > 1 seeds a per-seed value of ``metrics.jsonl`` carries the seed axis first
(``loss`` ``[S]``, ``q_gap`` ``[S, 4]``); curves then show the mean over seeds with a ±1 std
band (std over seeds, ddof 0). Drawdown is ``W_t / max(1, max_{s≤t} W_s) − 1`` (the peak
anchored at the initial wealth 1, as in :mod:`jaxdqn.evaluation.metrics`). Vertical lines mark
SGDR restarts (O2), branch resets (O4) and rewinds (O6).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from jaxdqn.branches import BRANCHES
from jaxdqn.program import metric_names

__all__ = [
    "Markers",
    "drawdown",
    "plot_cost_stress",
    "plot_equity",
    "plot_fold_sharpe",
    "plot_training",
    "series",
]

_RESTART, _ACTION, _REWINDS = metric_names.require("restart", "action", "rewinds")
_VAL_SHARPE, _LR, _Q_GAP, _UTILISATION = metric_names.require(
    "val_sharpe", "lr", "q_gap", "atom_utilisation"
)
_LOSSES = sorted(metric_names.LOSS_PARTS, key=lambda k: (k != "loss", k != "loss_c51", k))
"""Panels of the loss plot: the total, L1, then the other terms by name."""


# ---------------------------------------------------------------------------------------------
# Series from metrics.jsonl
# ---------------------------------------------------------------------------------------------


def series(records: Sequence[Mapping[str, Any]], key: str) -> np.ndarray | None:
    """``[N, *shape]`` float64 of ``key`` over the records (NaN where missing), or None when
    never present, not numeric, or of inconsistent shape."""
    arrays: list[np.ndarray | None] = []
    for r in records:
        v = r.get(key)
        if v is None:
            arrays.append(None)
            continue
        try:
            arrays.append(np.array(v, dtype=np.float64))
        except (TypeError, ValueError):
            return None
    shapes = {a.shape for a in arrays if a is not None}
    if len(shapes) != 1:
        return None
    (shape,) = shapes
    out = np.full((len(records), *shape), np.nan)
    for i, a in enumerate(arrays):
        if a is not None:
            out[i] = a
    return out


def _components(arr: np.ndarray, seeds: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Split ``[N, (S,) *comp]`` into ``(comp_index, y)`` with ``y`` ``[N]`` or ``[N, S]``."""
    seeded = seeds > 1 and arr.ndim >= 2 and arr.shape[1] == seeds
    comp_shape = arr.shape[2:] if seeded else arr.shape[1:]
    lead = (slice(None), slice(None)) if seeded else (slice(None),)
    return [(idx, arr[(*lead, *idx)]) for idx in np.ndindex(comp_shape)]


def _mean_std(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
        return np.nanmean(y, axis=1), np.nanstd(y, axis=1)


def _plot_line(ax, x, y: np.ndarray, label: str | None, **kw) -> None:
    """``y`` ``[N]``: a line; ``[N, S]``: the seed mean with a ±std band."""
    if y.ndim == 1:
        ax.plot(x, y, label=label, **kw)
        return
    mean, std = _mean_std(y)
    (line,) = ax.plot(x, mean, label=label, **kw)
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def _any_flag(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, str):
        return value not in ("", "none", "false", "False")
    try:
        return bool(np.any(np.asarray(value, dtype=bool)))
    except (TypeError, ValueError):
        return False


def _action_epochs(records: Sequence[Mapping[str, Any]], action: str) -> list[int]:
    out = []
    for r in records:
        value = r.get(_ACTION)
        items = value if isinstance(value, (list, tuple)) else [value]
        if action in items:
            out.append(r["epoch"])
    return out


def _rewind_epochs(records: Sequence[Mapping[str, Any]]) -> list[int]:
    if any(_ACTION in r for r in records):
        return _action_epochs(records, "rewind")
    counts = series(records, _REWINDS)
    if counts is None:
        return []
    total = np.nan_to_num(counts.reshape(len(records), -1)).sum(axis=1)
    return [records[i]["epoch"] for i in range(1, len(records)) if total[i] > total[i - 1]]


class Markers:
    """Epochs of SGDR restarts, branch resets (O4) and rewinds (O6), drawn as vertical lines."""

    def __init__(self, records: Sequence[Mapping[str, Any]]):
        self.restarts = [r["epoch"] for r in records if _any_flag(r.get(_RESTART))]
        self.resets = _action_epochs(records, "reset_branches")
        self.rewinds = _rewind_epochs(records)

    def draw(self, ax, *, restarts: bool = False, resets: bool = False) -> None:
        groups = [(self.rewinds, "rewind", "tab:red", "--")]
        if restarts:
            groups.append((self.restarts, "SGDR restart", "0.4", ":"))
        if resets:
            groups.append((self.resets, "branch reset", "tab:orange", "-."))
        for epochs, label, color, style in groups:
            for i, e in enumerate(epochs):
                ax.axvline(
                    e, color=color, linestyle=style, linewidth=1, label=label if i == 0 else None
                )


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def _save(fig: Figure, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    return path.name


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")


def drawdown(equity: ArrayLike) -> np.ndarray:
    """``W_t / max(1, max_{s≤t} W_s) − 1`` along axis 0 (``[n]`` or ``[n, S]``); ≤ 0."""
    w = np.asarray(equity, dtype=np.float64)
    peak = np.maximum.accumulate(np.maximum(w, 1.0), axis=0)
    return w / peak - 1.0


def plot_equity(
    run_dir: Path,
    split: str,
    agent: pd.DataFrame,
    baselines: pd.DataFrame | None,
    marks: Sequence[Any] = (),
) -> tuple[str, str]:
    """Equity and drawdown PNGs of the agent against the baselines; with several seeds each
    seed's curve (thin), their mean with a ±1 std band and the across-seed min–max band.
    ``marks``: dates drawn as dotted vertical lines (e.g. where a walk-forward fold starts).

    Returns:
      The file names written in ``run_dir``: ``equity_{split}.png``, ``drawdown_{split}.png``.
    """
    if "seed" in agent.columns:
        wide = agent.pivot(index="date", columns="seed", values="equity").sort_index()
        x, eq = wide.index, wide.to_numpy()
        label = f"agent (mean ± std, {eq.shape[1]} seeds)"
    else:
        x, eq = agent["date"].to_numpy(), agent["equity"].to_numpy(dtype=np.float64)
        label = "agent"

    figs = []
    for kind, fn, ylabel in (
        ("equity", lambda w: w, "equity (start 1)"),
        ("drawdown", drawdown, "drawdown"),
    ):
        fig = Figure(figsize=(9, 4.5))
        ax = fig.add_subplot()
        if baselines is not None:
            for name in baselines.columns:
                ax.plot(
                    baselines.index,
                    fn(baselines[name].to_numpy(dtype=np.float64)),
                    linewidth=1,
                    alpha=0.8,
                    label=name,
                )
        y = fn(eq)
        if y.ndim == 2:
            for s in range(y.shape[1]):
                ax.plot(x, y[:, s], color="black", linewidth=0.5, alpha=0.25)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                lo, hi = np.nanmin(y, axis=1), np.nanmax(y, axis=1)
            ax.fill_between(
                x, lo, hi, color="black", alpha=0.08, linewidth=0, label="agent seeds min–max"
            )
        _plot_line(ax, x, y, label, color="black", linewidth=2)
        for i, m in enumerate(marks):
            mark = "next fold" if i == 0 else None
            ax.axvline(m, color="0.5", linestyle=":", linewidth=1, label=mark)
        ax.set_title(f"{split}: agent {kind} vs baselines")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax)
        fig.autofmt_xdate()
        figs.append(_save(fig, run_dir / f"{kind}_{split}.png"))
    return figs[0], figs[1]


def plot_cost_stress(
    run_dir: Path,
    multiples: Sequence[float],
    sharpe: np.ndarray,
    split: str,
    reference: Mapping[str, float] | None = None,
) -> str:
    """``cost_stress.png``: the agent's ``split`` Sharpe against the cost multiple, one thin line
    per seed and the seed mean (``sharpe`` ``[M, S]``); ``reference`` label → level lines (e.g.
    buy-and-hold at 1×). Returns the file name."""
    x = np.asarray(multiples, dtype=np.float64)
    y = np.asarray(sharpe, dtype=np.float64).reshape(len(x), -1)
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    if y.shape[1] > 1:
        for s in range(y.shape[1]):
            ax.plot(x, y[:, s], color="black", linewidth=0.7, alpha=0.3, marker=".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(y, axis=1)
    label = f"agent (mean of {y.shape[1]} seeds)" if y.shape[1] > 1 else "agent"
    ax.plot(x, mean, color="black", linewidth=2, marker="o", label=label)
    for name, value in (reference or {}).items():
        if value is not None and math.isfinite(value):
            ax.axhline(value, color="tab:blue", linewidth=1, linestyle="-.", label=name)
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{k:g}×" for k in x])
    ax.set_xlabel("cost multiple (half-spread, commission, impact)")
    ax.set_ylabel(f"{split} Sharpe")
    ax.set_title(f"cost stress: {split} Sharpe of the best checkpoint")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, run_dir / "cost_stress.png")


def plot_fold_sharpe(
    run_dir: Path,
    labels: Sequence[str],
    agent: ArrayLike,
    reference: Mapping[str, ArrayLike],
    name: str = "walkforward_folds.png",
) -> str:
    """Walk-forward fold bars: the agent's test Sharpe per fold (``agent`` ``[K, S]``: the
    seed-mean bar with every seed as a dot) beside each ``reference`` (label → ``[K]``, e.g.
    buy-and-hold's test Sharpe in the same folds). Returns the file name."""
    y = np.asarray(agent, dtype=np.float64).reshape(len(labels), -1)
    x = np.arange(len(labels), dtype=np.float64)
    groups = 1 + len(reference)
    width = 0.8 / groups
    fig = Figure(figsize=(max(6.0, 1.3 * len(labels) + 2), 4))
    ax = fig.add_subplot()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(y, axis=1)
    offset = -0.4 + width / 2
    label = f"agent (mean of {y.shape[1]} seeds)" if y.shape[1] > 1 else "agent"
    ax.bar(x + offset, np.nan_to_num(mean), width, color="0.25", label=label)
    if y.shape[1] > 1:
        for s in range(y.shape[1]):
            ax.plot(
                x + offset,
                y[:, s],
                linestyle="none",
                marker="o",
                markersize=3,
                color="black",
                alpha=0.6,
                label="seeds" if s == 0 else None,
            )
    for i, (ref_name, values) in enumerate(reference.items(), start=1):
        v = np.asarray(values, dtype=np.float64)
        ax.bar(x + offset + i * width, np.nan_to_num(v), width, label=ref_name, alpha=0.85)
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(list(labels), fontsize=8)
    ax.set_ylabel("test Sharpe (annualised)")
    ax.set_title("walk-forward: out-of-sample test Sharpe per fold")
    ax.grid(alpha=0.3, axis="y")
    _legend(ax)
    return _save(fig, Path(run_dir) / name)


def _plot_losses(path: Path, records, epochs, seeds: int, markers: Markers) -> str | None:
    keys = [k for k in _LOSSES if series(records, k) is not None]
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(4 * ncols, 2.8 * nrows))
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for idx, y in _components(series(records, key), seeds):
            _plot_line(ax, epochs, y, f"{key}{list(idx)}" if idx else None)
        markers.draw(ax)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def _plot_metric(
    path: Path,
    records,
    epochs,
    seeds: int,
    key: str,
    title: str,
    markers: Markers,
    *,
    component_names: Sequence[str] | None = None,
    hlines: Mapping[str, float] | None = None,
    best_epoch: int | None = None,
    restarts: bool = False,
) -> str | None:
    """One panel of ``key`` with its components as separate lines (None when not logged)."""
    values = series(records, key)
    if values is None:
        return None
    fig = Figure(figsize=(9, 4))
    ax = fig.add_subplot()
    comps = _components(values, seeds)
    for idx, y in comps:
        if not idx:
            label = key + (f" (mean ± std, {seeds} seeds)" if y.ndim == 2 else "")
        elif component_names is not None and len(idx) == 1 and idx[0] < len(component_names):
            label = component_names[idx[0]]
        else:
            label = f"{key}{list(idx)}"
        _plot_line(ax, epochs, y, label)
    for name, value in (hlines or {}).items():
        if value is not None and math.isfinite(value):
            ax.axhline(value, color="0.5", linewidth=1, linestyle="-.", label=name)
    if best_epoch is not None:
        ax.axvline(best_epoch, color="tab:green", linewidth=1, label=f"best epoch {best_epoch}")
    markers.draw(ax, restarts=restarts, resets=restarts)
    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


def plot_training(
    run_dir: Path,
    records: Sequence[Mapping[str, Any]],
    seeds: int,
    markers: Markers,
    *,
    best_epoch: int | None,
    val_sharpe_lines: Mapping[str, float],
) -> list[tuple[str, str | None]]:
    """The training curves of ``records`` as PNGs in ``run_dir``: ``(title, file name)`` per
    plot, the name None when its metric is not in the records.

    Plots: loss parts; validation Sharpe with ``val_sharpe_lines`` (label → level, e.g. a
    baseline's) and the best epoch; the learning rate with SGDR restarts, branch resets and
    rewinds; the per-branch Q-gap; the atom utilisation.
    """
    epochs = np.array([r["epoch"] for r in records])
    return [
        ("loss parts", _plot_losses(run_dir / "losses.png", records, epochs, seeds, markers)),
        (
            "validation Sharpe",
            _plot_metric(
                run_dir / "val_sharpe.png",
                records,
                epochs,
                seeds,
                _VAL_SHARPE,
                "validation Sharpe (A1 walk, fixed key)",
                markers,
                hlines=val_sharpe_lines,
                best_epoch=best_epoch,
            ),
        ),
        (
            "learning rate",
            _plot_metric(
                run_dir / "learning_rate.png",
                records,
                epochs,
                seeds,
                _LR,
                "learning rate (SGDR) with restarts, branch resets and rewinds",
                markers,
                restarts=True,
            ),
        ),
        (
            "per-branch Q-gap",
            _plot_metric(
                run_dir / "q_gap.png",
                records,
                epochs,
                seeds,
                _Q_GAP,
                "per-branch Q-gap",
                markers,
                component_names=BRANCHES,
            ),
        ),
        (
            "atom utilisation",
            _plot_metric(
                run_dir / "atom_utilisation.png",
                records,
                epochs,
                seeds,
                _UTILISATION,
                "atom utilisation",
                markers,
            ),
        ),
    ]
