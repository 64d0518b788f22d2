"""The report's figures of the walks (PNG, matplotlib's object API, no pyplot state): equity and
drawdown against the baselines, the cost stress and the walk-forward's per-fold Sharpe; and the
drawing helpers the training curves share (:mod:`jaxdqn.program.report.training_plots`).

Seeds: a ``[N, S]`` series is drawn as the mean over seeds with a ±1 std band (std over seeds,
ddof 0). Drawdown is ``W_t / max(1, max_{s≤t} W_s) − 1`` (the peak anchored at the initial
wealth 1, as in :mod:`jaxdqn.evaluation.metrics`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "add_legend",
    "drawdown",
    "figure",
    "plot_cost_stress",
    "plot_equity",
    "plot_fold_sharpe",
    "plot_seed_line",
    "save_png",
]


def _mean_std(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN rows stay NaN
        return np.nanmean(y, axis=1), np.nanstd(y, axis=1)


def plot_seed_line(ax, x, y: np.ndarray, label: str | None, **kw) -> None:
    """``y`` ``[N]``: a line; ``[N, S]``: the seed mean with a ±std band."""
    if y.ndim == 1:
        ax.plot(x, y, label=label, **kw)
        return
    mean, std = _mean_std(y)
    (line,) = ax.plot(x, mean, label=label, **kw)
    ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)


def figure(**kw: Any) -> Figure:
    """A matplotlib ``Figure`` (no pyplot, no global state). matplotlib is imported here, by the
    first figure a report draws: a run without plots (``eval.plots: false``) and every command
    that draws none start ~0.3 s sooner."""
    from matplotlib.figure import Figure

    return Figure(**kw)


def save_png(fig: Figure, path: Path) -> str:
    """Write ``fig`` to ``path`` (PNG, 100 dpi); return the file's name for the report's link."""
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    return path.name


def add_legend(ax) -> None:
    """A legend, only when something on ``ax`` is labelled (an empty one draws a warning)."""
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
        fig = figure(figsize=(9, 4.5))
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
        plot_seed_line(ax, x, y, label, color="black", linewidth=2)
        for i, m in enumerate(marks):
            mark = "next fold" if i == 0 else None
            ax.axvline(m, color="0.5", linestyle=":", linewidth=1, label=mark)
        ax.set_title(f"{split}: agent {kind} vs baselines")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        add_legend(ax)
        fig.autofmt_xdate()
        figs.append(save_png(fig, run_dir / f"{kind}_{split}.png"))
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
    fig = figure(figsize=(7, 4))
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
    add_legend(ax)
    return save_png(fig, run_dir / "cost_stress.png")


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
    fig = figure(figsize=(max(6.0, 1.3 * len(labels) + 2), 4))
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
    add_legend(ax)
    return save_png(fig, Path(run_dir) / name)
