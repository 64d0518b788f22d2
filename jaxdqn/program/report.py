"""The run's closing report: ``summary.json``, baseline equity files, ``report.md`` with plots.

Files of a run directory read here (every one optional; what is missing is noted in the
report instead of plotted):

* ``config.yaml`` — the resolved config (header: data, sizes, switched-off components).
* ``metrics.jsonl`` — one record per epoch (:mod:`jaxdqn.program.logger`); training curves.
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
      },
      "seeds": [                    # optional; one entry per seed of a population run
        {"seed": int, "best_epoch": int|null, "best_step": int|null,
         "val": {...}, "test": {...}}, ...
      ],
      ...                           # any further keys (e.g. "jax_version", "device") are kept
    }                               # and shown in the report's header when scalar

Metric names are those of :func:`jaxdqn.evaluation.metrics.performance` (sharpe, sortino, max_drawdown,
annual_return, annual_volatility, calmar, hit_rate, turnover, exposure, ...).

Seeds in ``metrics.jsonl``: with S > 1 seeds (``len(summary["seeds"])``, else the length of the
``val_sharpe`` list) a per-seed value carries the seed axis first (``loss`` ``[S]``, ``q_gap``
``[S, 4]``); curves then show the mean over seeds with a ±1 std band (std over seeds, ddof 0),
and the metrics table shows mean ± std (ddof 1) over the seeds beside each seed's row.
Drawdown is ``W_t / max(1, max_{s≤t} W_s) − 1`` (the peak anchored at the initial wealth 1, as
in :mod:`jaxdqn.evaluation.metrics`).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure
from numpy.typing import ArrayLike

from jaxdqn.evaluation.metrics import RETURN_KEYS
from jaxdqn.program.logger import read_metrics, to_jsonable

__all__ = [
    "BRANCHES",
    "REPORT_FILE",
    "SUMMARY_FILE",
    "TABLE_METRICS",
    "drawdown",
    "read_baseline_equity",
    "read_eval_log",
    "read_summary",
    "write_baseline_equity",
    "write_eval_log",
    "write_report",
    "write_summary",
]

REPORT_FILE = "report.md"
SUMMARY_FILE = "summary.json"
BRANCHES = ("direction", "magnitude", "order", "urgency")
TABLE_METRICS = (*RETURN_KEYS, "turnover", "exposure")
"""Metric columns of the report's tables, in this order (other metrics follow, sorted)."""

_SPLITS = ("val", "test")


# ---------------------------------------------------------------------------------------------
# summary.json
# ---------------------------------------------------------------------------------------------


def _atomic_write_text(path: Path, text: str) -> None:
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
        for split in _SPLITS:
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
            for split in _SPLITS:
                if entry.get(split) is not None:
                    _check_metrics(f"seeds[{i}].{split}", entry[split])


def write_summary(run_dir: str | os.PathLike, summary: Mapping[str, Any]) -> Path:
    """Validate ``summary`` against the schema (module docstring) and write ``summary.json``
    atomically (NaN and ±inf → ``null``; numpy and jax values converted). Returns its path.

    Raises:
      ValueError: a required key is missing or a value has the wrong type.
    """
    _validate_summary(summary)
    path = Path(run_dir) / SUMMARY_FILE
    text = json.dumps(to_jsonable(dict(summary), "summary"), indent=2, allow_nan=False)
    _atomic_write_text(path, text + "\n")
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


# ---------------------------------------------------------------------------------------------
# Series from metrics.jsonl
# ---------------------------------------------------------------------------------------------


def _series(records: Sequence[Mapping[str, Any]], key: str) -> np.ndarray | None:
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
        value = r.get("action")
        items = value if isinstance(value, (list, tuple)) else [value]
        if action in items:
            out.append(r["epoch"])
    return out


def _rewind_epochs(records: Sequence[Mapping[str, Any]]) -> list[int]:
    if any("action" in r for r in records):
        return _action_epochs(records, "rewind")
    counts = _series(records, "rewinds")
    if counts is None:
        return []
    total = np.nan_to_num(counts.reshape(len(records), -1)).sum(axis=1)
    return [records[i]["epoch"] for i in range(1, len(records)) if total[i] > total[i - 1]]


class _Markers:
    """Epochs of SGDR restarts, branch resets (O4) and rewinds (O6), drawn as vertical lines."""

    def __init__(self, records: Sequence[Mapping[str, Any]]):
        self.restarts = [r["epoch"] for r in records if _any_flag(r.get("restart"))]
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


def _plot_equity(
    run_dir: Path, split: str, agent: pd.DataFrame, baselines: pd.DataFrame | None
) -> tuple[str, str]:
    """Equity and drawdown PNGs of the agent (per-seed mean ± std) against the baselines."""
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
        _plot_line(ax, x, y, label, color="black", linewidth=2)
        ax.set_title(f"{split}: agent {kind} vs baselines")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax)
        fig.autofmt_xdate()
        figs.append(_save(fig, run_dir / f"{kind}_{split}.png"))
    return figs[0], figs[1]


def _loss_keys(records: Sequence[Mapping[str, Any]]) -> list[str]:
    keys = {k for r in records for k in r if k == "loss" or k.startswith("loss_")}
    return sorted(keys, key=lambda k: (k != "loss", k != "loss_c51", k))


def _plot_losses(path: Path, records, epochs, seeds: int, markers: _Markers) -> str | None:
    keys = [k for k in _loss_keys(records) if _series(records, k) is not None]
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(4 * ncols, 2.8 * nrows))
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for idx, y in _components(_series(records, key), seeds):
            _plot_line(ax, epochs, y, f"{key}{list(idx)}" if idx else None)
        markers.draw(ax)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    return _save(fig, path)


def _plot_keys(
    path: Path,
    records,
    epochs,
    seeds: int,
    keys: Sequence[str],
    title: str,
    markers: _Markers,
    *,
    component_names: Sequence[str] | None = None,
    hlines: Mapping[str, float] | None = None,
    best_epoch: int | None = None,
    restarts: bool = False,
    logy: bool = False,
) -> str | None:
    """One panel of ``keys`` (first present one) with its components as separate lines."""
    key = next((k for k in keys if _series(records, k) is not None), None)
    if key is None:
        return None
    fig = Figure(figsize=(9, 4))
    ax = fig.add_subplot()
    comps = _components(_series(records, key), seeds)
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
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.set_xlabel("epoch")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _save(fig, path)


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def _num(v: Any) -> str:
    if v is None:
        return "nan"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return "nan" if math.isnan(f) else f"{f:.3f}"


def _as_float(v: Any) -> float:
    try:
        return float("nan") if v is None else float(v)
    except (TypeError, ValueError):
        return float("nan")


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _table(rows: Sequence[tuple[str, Mapping[str, str]]], columns: Sequence[str]) -> str:
    head = "| strategy | " + " | ".join(columns) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in columns) + " |"
    body = [
        f"| {name} | " + " | ".join(cells.get(c, "") for c in columns) + " |"
        for name, cells in rows
    ]
    return "\n".join([head, rule, *body])


def _metric_columns(dicts: Sequence[Mapping[str, Any]]) -> list[str]:
    present = {k for d in dicts for k in d}
    extra = sorted(present - set(TABLE_METRICS))
    return [m for m in TABLE_METRICS if m in present] + extra


def _results_section(summary: Mapping[str, Any]) -> list[str]:
    seeds = [s for s in (summary.get("seeds") or []) if isinstance(s, Mapping)]
    baselines = summary.get("baselines") or {}
    lines = ["## Results (best checkpoint by validation Sharpe)", ""]
    for split in _SPLITS:
        agent = summary.get(split)
        seed_dicts = [s.get(split) or {} for s in seeds]
        if agent is None and not any(seed_dicts):
            lines += [f"### {split}", "", f"_The agent has not been evaluated on {split}._", ""]
            continue
        base_dicts = {name: (b.get(split) or {}) for name, b in baselines.items()}
        columns = _metric_columns([agent or {}, *seed_dicts, *base_dicts.values()])
        rows: list[tuple[str, dict[str, str]]] = []
        if len(seeds) > 1:
            cells = {}
            for m in columns:
                vals = np.array([_as_float(d.get(m)) for d in seed_dicts])
                vals = vals[np.isfinite(vals)]
                if vals.size == 0:
                    cells[m] = "nan"
                elif vals.size == 1:
                    cells[m] = _num(vals[0])
                else:
                    cells[m] = f"{vals.mean():.3f} ± {vals.std(ddof=1):.3f}"
            rows.append((f"**agent** (mean ± std, {len(seeds)} seeds)", cells))
            for i, (entry, d) in enumerate(zip(seeds, seed_dicts, strict=True)):
                name = f"agent seed {entry.get('seed', i)}"
                if entry.get("best_epoch") is not None:
                    name += f" (epoch {entry['best_epoch']})"
                rows.append((name, {m: _num(d.get(m)) for m in columns}))
        else:
            d = agent if agent is not None else seed_dicts[0]
            rows.append(("**agent**", {m: _num(d.get(m)) for m in columns}))
        for name, d in base_dicts.items():
            rows.append((name, {m: _num(d.get(m)) if d else "" for m in columns}))
        lines += [f"### {split}", "", _table(rows, columns), ""]
    return lines


def _config_rows(cfg: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    if not cfg:
        return [("config", "config.yaml not found")]

    def get(path: str, default: Any = "?") -> Any:
        node: Any = cfg
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    src = get("data.source")
    data = f"{src}" + (f" ({get('data.path')})" if get("data.path", None) else "")
    if get("data.split", None) == "date":
        data += f"; train ≤ {get('data.train_end')}, val ≤ {get('data.val_end')}, test after"
    elif get("data.split", None) == "fraction":
        data += f"; train {get('data.train_frac')}, val {get('data.val_frac')} of the bars"
    off = sorted(
        f"{section}.{k}"
        for section in ("model", "acting", "replay", "loss", "dynamics", "train")
        for k, v in (get(section, {}) or {}).items()
        if v is False
    )
    return [
        ("data", data),
        ("seed / seeds", f"{get('seed')} / {get('train.num_seeds', 1)}"),
        (
            "schedule",
            f"{get('train.epochs')} epochs × {get('train.iterations_per_epoch')} iterations; "
            f"SGDR period {get('optim.sgdr_period')} epochs, base lr {get('optim.lr')}",
        ),
        (
            "iteration",
            f"{get('acting.num_envs')} envs × {get('acting.steps')} steps, "
            f"{get('optim.updates')} updates × batch {get('replay.batch_size')}",
        ),
        (
            "model",
            f"SH1 {get('model.sh1')}, SH2 {get('model.sh2')}, AH {get('model.ah')}, "
            f"{get('model.num_atoms')} atoms",
        ),
        ("components off", ", ".join(off) if off else "none (all on)"),
        (
            "costs",
            f"half-spread {get('env.half_spread_bps')} bps, commission "
            f"{get('env.commission_bps')} bps, max leverage {get('env.max_leverage')}",
        ),
    ]


def _throughput(records: Sequence[Mapping[str, Any]]) -> str | None:
    parts = []
    for key, label in (("env_steps_per_s", "env steps/s"), ("updates_per_s", "updates/s")):
        y = _series(records, key)
        if y is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                med = float(np.nanmedian(y.reshape(len(records), -1).sum(axis=1)))
            if math.isfinite(med):
                parts.append(f"{label} {med:.3g}")
    return "median " + ", ".join(parts) if parts else None


def _load_yaml(path: Path) -> Mapping[str, Any] | None:
    if not path.exists():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, Mapping) else None


def _num_seeds(summary: Mapping[str, Any] | None, records: Sequence[Mapping[str, Any]]) -> int:
    if summary and isinstance(summary.get("seeds"), list) and summary["seeds"]:
        return len(summary["seeds"])
    for r in records:
        v = r.get("val_sharpe", r.get("loss"))
        if isinstance(v, list):
            return len(v)
    return 1


def write_report(run_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` and its PNG plots into ``run_dir``; returns the report's path.

    Sections: run header (config essentials, epochs, wall time, best checkpoint, throughput),
    metrics tables (agent vs every baseline on val and test, from ``summary.json``), equity
    and drawdown against the baselines per split, training curves (loss parts, val Sharpe
    with the best epoch, learning rate with SGDR restarts / branch resets / rewinds, per-branch
    Q-gaps, atom utilisation). A missing input skips its part with a note in the report.

    Raises:
      FileNotFoundError: ``run_dir`` does not exist.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir}: no such run directory")
    records = read_metrics(run_dir)
    summary = read_summary(run_dir)
    cfg = _load_yaml(run_dir / "config.yaml")
    seeds = _num_seeds(summary, records)

    lines = [f"# jaxdqn run report: {run_dir.name}", "", "## Run", "", "| | |", "| --- | --- |"]
    rows = _config_rows(cfg)
    if summary is not None:
        wall = summary.get("wall_time_s")
        wall_text = f"{_clock(wall)} ({wall:.0f} s)" if isinstance(wall, (int, float)) else "?"
        rows.append(("epochs / wall time", f"{summary.get('epochs', '?')} / {wall_text}"))
        best = summary.get("best_epoch")
        if best is not None:
            step = summary.get("best_step")
            rows.append(
                (
                    "best checkpoint",
                    f"epoch {best}" + (f", step {step}" if step is not None else ""),
                )
            )
        known = {"best_epoch", "best_step", "epochs", "wall_time_s", "val", "test"}
        known |= {"baselines", "seeds"}
        for k, v in summary.items():
            if k not in known and isinstance(v, (str, int, float, bool)):
                rows.append((k, str(v)))
    elif records:
        wall = records[-1].get("wall_time")
        rows.append(
            (
                "epochs / wall time",
                f"{records[-1]['epoch']} logged"
                + (f" / {_clock(wall)}" if isinstance(wall, (int, float)) else "")
                + " (no summary.json: the run has not finished)",
            )
        )
    throughput = _throughput(records)
    if throughput:
        rows.append(("throughput", throughput))
    lines += [f"| {k} | {v} |" for k, v in rows] + [""]

    if summary is not None:
        lines += _results_section(summary)
    else:
        lines += ["## Results", "", "_No summary.json: the run has not finished._", ""]

    for split in _SPLITS:
        eval_path = run_dir / f"eval_{split}.csv"
        if split == "val" and not eval_path.exists():
            continue  # the val curve is optional; the test curve is always reported
        lines += [f"## {split.capitalize()} equity", ""]
        if not eval_path.exists():
            lines += [f"_No {eval_path.name}: the agent has not been evaluated on {split}._", ""]
            continue
        agent = read_eval_log(eval_path)
        base_path = run_dir / f"baselines_{split}.csv"
        baselines = read_baseline_equity(base_path) if base_path.exists() else None
        eq_png, dd_png = _plot_equity(run_dir, split, agent, baselines)
        if baselines is None:
            lines += [f"_No {base_path.name}: baselines are not drawn._", ""]
        lines += [f"![{split} equity]({eq_png})", "", f"![{split} drawdown]({dd_png})", ""]

    lines += ["## Training", ""]
    if not records:
        lines += ["_No metrics.jsonl records._", ""]
    else:
        epochs = np.array([r["epoch"] for r in records])
        markers = _Markers(records)
        bh = ((summary or {}).get("baselines") or {}).get("buy_and_hold") or {}
        plots = [
            ("loss parts", _plot_losses(run_dir / "losses.png", records, epochs, seeds, markers)),
            (
                "validation Sharpe",
                _plot_keys(
                    run_dir / "val_sharpe.png",
                    records,
                    epochs,
                    seeds,
                    ["val_sharpe"],
                    "validation Sharpe (A1 walk, fixed key)",
                    markers,
                    hlines={"buy_and_hold val": _as_float((bh.get("val") or {}).get("sharpe"))},
                    best_epoch=(summary or {}).get("best_epoch"),
                ),
            ),
            (
                "learning rate",
                _plot_keys(
                    run_dir / "learning_rate.png",
                    records,
                    epochs,
                    seeds,
                    ["lr", "learning_rate"],
                    "learning rate (SGDR) with restarts, branch resets and rewinds",
                    markers,
                    restarts=True,
                ),
            ),
            (
                "per-branch Q-gap",
                _plot_keys(
                    run_dir / "q_gap.png",
                    records,
                    epochs,
                    seeds,
                    ["q_gap"],
                    "per-branch Q-gap",
                    markers,
                    component_names=BRANCHES,
                ),
            ),
            (
                "atom utilisation",
                _plot_keys(
                    run_dir / "atom_utilisation.png",
                    records,
                    epochs,
                    seeds,
                    ["atom_utilisation"],
                    "atom utilisation",
                    markers,
                ),
            ),
        ]
        for title, png in plots:
            if png is None:
                lines += [f"_{title}: not in metrics.jsonl._", ""]
            else:
                lines += [f"![{title}]({png})", ""]
        lines += [
            f"{len(records)} epochs logged (epochs {records[0]['epoch']}–{records[-1]['epoch']});"
            f" {len(markers.restarts)} SGDR restarts, {len(markers.resets)} branch resets,"
            f" {len(markers.rewinds)} rewinds.",
            "",
        ]

    path = run_dir / REPORT_FILE
    _atomic_write_text(path, "\n".join(lines))
    return path
