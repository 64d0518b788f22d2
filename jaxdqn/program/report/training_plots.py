"""The training curves of ``metrics.jsonl`` as the report's PNGs (:func:`plot_training`).

Seeds: with S > 1 seeds a per-seed value of ``metrics.jsonl`` carries the seed axis first
(``loss`` ``[S]``, ``q_gap`` ``[S, 4]``); curves then show the mean over seeds with a ±1 std
band (:func:`jaxdqn.program.report.plots.plot_seed_line`). Vertical lines mark SGDR restarts
(O2), branch resets (O4) and rewinds (O6) (:class:`Markers`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn.branches import BRANCHES
from jaxdqn.program.records import metric_names
from jaxdqn.program.report.plots import add_legend, figure, plot_seed_line, save_png

__all__ = ["Markers", "plot_training", "series"]

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


def _plot_losses(path: Path, records, epochs, seeds: int, markers: Markers) -> str | None:
    keys = [k for k in _LOSSES if series(records, k) is not None]
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig = figure(figsize=(4 * ncols, 2.8 * nrows))
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for idx, y in _components(series(records, key), seeds):
            plot_seed_line(ax, epochs, y, f"{key}{list(idx)}" if idx else None)
        markers.draw(ax)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    return save_png(fig, path)


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
    fig = figure(figsize=(9, 4))
    ax = fig.add_subplot()
    comps = _components(values, seeds)
    for idx, y in comps:
        if not idx:
            label = key + (f" (mean ± std, {seeds} seeds)" if y.ndim == 2 else "")
        elif component_names is not None and len(idx) == 1 and idx[0] < len(component_names):
            label = component_names[idx[0]]
        else:
            label = f"{key}{list(idx)}"
        plot_seed_line(ax, epochs, y, label)
    for name, value in (hlines or {}).items():
        if value is not None and math.isfinite(value):
            ax.axhline(value, color="0.5", linewidth=1, linestyle="-.", label=name)
    if best_epoch is not None:
        ax.axvline(best_epoch, color="tab:green", linewidth=1, label=f"best epoch {best_epoch}")
    markers.draw(ax, restarts=restarts, resets=restarts)
    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.grid(alpha=0.3)
    add_legend(ax)
    return save_png(fig, path)


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
