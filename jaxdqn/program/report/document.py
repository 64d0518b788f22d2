"""The run's closing report: ``report.md`` with its plots, assembled from the run directory.

Files of a run directory read here (every one optional; what is missing is noted in the
report instead of plotted):

* ``config.yaml`` — the resolved config (header: data, sizes, switched-off components).
* ``metrics.jsonl`` — one record per epoch (:mod:`jaxdqn.program.records.logger`); training curves.
* ``summary.json``, ``eval_{split}.csv``, ``baselines_{split}.csv`` — the result files
  (:mod:`jaxdqn.program.records.results`, which defines their formats); a panel's equity plots draw
  its equal-weight portfolio, ``portfolio_{split}.csv``, and the panel section
  (:mod:`jaxdqn.program.report.panel_section`) follows the results.

Seeds: S is ``len(summary["seeds"])``, else the length of the ``val_sharpe`` list of
``metrics.jsonl``. With S > 1 the curves show the seed mean with a ±1 std band
(:mod:`jaxdqn.program.report.plots`) and the metrics table shows mean ± std (ddof 1) over the seeds
beside each seed's row.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from jaxdqn.branches import ACTION_NAMES
from jaxdqn.evaluation.baselines import ORACLE_EXECUTIONS, describe_execution
from jaxdqn.evaluation.metrics import RETURN_KEYS
from jaxdqn.program.records import metric_names
from jaxdqn.program.records.formats import as_float, bar_clock_text, cell, clock, markdown_table
from jaxdqn.program.records.logger import read_metrics
from jaxdqn.program.records.results import (
    SPLITS,
    read_baseline_equity,
    read_eval_log,
    read_summary,
    write_text_atomic,
)
from jaxdqn.program.report import panel_section, plots, statistics_section, training_plots
from jaxdqn.program.report.population_results import population_section

__all__ = ["REPORT_FILE", "TABLE_METRICS", "write_report"]

REPORT_FILE = "report.md"
TABLE_METRICS = (*RETURN_KEYS, "turnover", "exposure")
"""Metric columns of the report's tables, in this order (other metrics follow, sorted)."""

_THROUGHPUT = tuple(
    zip(
        metric_names.require("env_steps_per_s", "updates_per_s"),
        ("env steps/s", "updates/s"),
        strict=True,
    )
)
"""(metric, label) of the header's median throughput."""
_VAL_SHARPE, _LOSS, _WALL_TIME = metric_names.require("val_sharpe", "loss", "wall_time")


def _table(
    rows: Sequence[tuple[str, Mapping[str, str]]], columns: Sequence[str], first: str = "strategy"
) -> str:
    """A Markdown table of named rows of ``{column: cell}`` (:func:`markdown_table`)."""
    body = [[name, *(cells.get(c, "") for c in columns)] for name, cells in rows]
    return "\n".join(markdown_table([first, *columns], body))


def _metric_columns(dicts: Sequence[Mapping[str, Any]]) -> list[str]:
    present = {k for d in dicts for k in d}
    extra = sorted(present - set(TABLE_METRICS))
    return [m for m in TABLE_METRICS if m in present] + extra


def _results_section(summary: Mapping[str, Any]) -> list[str]:
    seeds = [s for s in (summary.get("seeds") or []) if isinstance(s, Mapping)]
    baselines = summary.get("baselines") or {}
    lines = ["## Results (best checkpoint by validation Sharpe)", ""]
    for split in SPLITS:
        agent = summary.get(split)
        seed_dicts = [s.get(split) or {} for s in seeds]
        if agent is None and not any(seed_dicts):
            lines += [f"### {split}", "", f"_The agent has not been evaluated on {split}._", ""]
            continue
        base_dicts = {
            _baseline_label(name, b): (b.get(split) or {})
            for name, b in baselines.items()
            if name not in ORACLE_EXECUTIONS
        }
        columns = _metric_columns([agent or {}, *seed_dicts, *base_dicts.values()])
        rows: list[tuple[str, dict[str, str]]] = []
        if len(seeds) > 1:
            cells = {}
            for m in columns:
                vals = np.array([as_float(d.get(m)) for d in seed_dicts])
                vals = vals[np.isfinite(vals)]
                if vals.size == 0:
                    cells[m] = "nan"
                elif vals.size == 1:
                    cells[m] = cell(vals[0])
                else:
                    cells[m] = f"{vals.mean():.3f} ± {vals.std(ddof=1):.3f}"
            rows.append((f"**agent** (mean ± std, {len(seeds)} seeds)", cells))
            for i, (entry, d) in enumerate(zip(seeds, seed_dicts, strict=True)):
                name = f"agent seed {entry.get('seed', i)}"
                if entry.get("best_epoch") is not None:
                    name += f" (epoch {entry['best_epoch']})"
                rows.append((name, {m: cell(d.get(m)) for m in columns}))
        else:
            d = agent if agent is not None else seed_dicts[0]
            rows.append(("**agent**", {m: cell(d.get(m)) for m in columns}))
        for name, d in base_dicts.items():
            rows.append((name, {m: cell(d.get(m)) if d else "" for m in columns}))
        lines += [f"### {split}", "", _table(rows, columns), ""]
    return lines + _oracle_executions(baselines)


def _baseline_label(name: str, entry: Mapping[str, Any]) -> str:
    """``oracle (best execution on val: limit, low urgency)`` for the oracle, else ``name``."""
    execution = entry.get("execution")
    if name != "oracle" or not isinstance(execution, str):
        return name
    words = describe_execution(execution) if execution in ORACLE_EXECUTIONS else execution
    return f"oracle (best execution on val: {words})"


def _oracle_executions(baselines: Mapping[str, Any]) -> list[str]:
    """The oracle's Sharpe per order type (rows) and urgency (columns), ``val / test``; the
    execution chosen on val in bold. Empty when the summary has no execution rows."""
    if not any(name in baselines for name in ORACLE_EXECUTIONS):
        return []
    chosen = (baselines.get("oracle") or {}).get("execution")
    urgencies = ACTION_NAMES["urgency"]
    cells: dict[str, dict[str, str]] = {}
    for name, (order, urgency) in ORACLE_EXECUTIONS.items():
        entry = baselines.get(name) or {}
        text = " / ".join(cell((entry.get(split) or {}).get("sharpe")) for split in SPLITS)
        row = cells.setdefault(ACTION_NAMES["order"][order].replace("_", "-"), {})
        row[urgencies[urgency]] = f"**{text}**" if name == chosen else text
    return [
        f"### Oracle by execution (Sharpe, {' / '.join(SPLITS)})",
        "",
        "The oracle's direction at full size through every execution; the **oracle** row above "
        "is the one with the best val Sharpe (in bold; never chosen on test).",
        "",
        _table(list(cells.items()), urgencies, first="order \\ urgency"),
        "",
    ]


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
            "learning",
            f"γ {get('loss.gamma')}, n-step {get('loss.n_step')}, reward scale "
            f"{get('loss.reward_scale')}, target {get('loss.target_update')}, evaluation "
            f"{get('eval.policy')}",
        ),
        (
            "costs",
            f"half-spread {get('env.half_spread_bps')} bps, commission "
            f"{get('env.commission_bps')} bps, max leverage {get('env.max_leverage')}",
        ),
    ]


def _throughput(records: Sequence[Mapping[str, Any]]) -> str | None:
    parts = []
    for key, label in _THROUGHPUT:
        y = training_plots.series(records, key)
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
        v = r.get(_VAL_SHARPE, r.get(_LOSS))
        if isinstance(v, list):
            return len(v)
    return 1


def _run_section(
    run_dir: Path,
    summary: Mapping[str, Any] | None,
    records: Sequence[Mapping[str, Any]],
    cfg: Mapping[str, Any] | None,
) -> list[str]:
    """The header: config essentials, epochs, wall time, best checkpoint, bar clock, data
    notes, provenance and throughput."""
    lines = [f"# jaxdqn run report: {run_dir.name}", "", "## Run", "", "| | |", "| --- | --- |"]
    rows = _config_rows(cfg)
    if summary is not None:
        wall = summary.get("wall_time_s")
        wall_text = f"{clock(wall)} ({wall:.0f} s)" if isinstance(wall, (int, float)) else "?"
        rows.append(("epochs / wall time", f"{summary.get('epochs', '?')} / {wall_text}"))
        best = summary.get("best_epoch")
        if best is not None:
            step = summary.get("best_step")
            at = f"epoch {best}" + (f", step {step}" if step is not None else "")
            rows.append(("best checkpoint", at))
        bar_clock = summary.get("bar_clock")
        if isinstance(bar_clock, dict):
            rows.append(("bar clock", bar_clock_text(bar_clock)))
        data = summary.get("data") or {}
        held = data.get("held_branches") or {}
        if held:
            rows.append(
                (
                    "held branches",
                    ", ".join(f"{b} = {v}" for b, v in held.items())
                    + " on every bar: close-only bars have no intrabar range to fill a limit "
                    "order against (their Q-values are still learned)",
                )
            )
        if data.get("volume") is False:
            rows.append(("volume", "none in the data: the volume feature is left out"))
        known = {"best_epoch", "best_step", "epochs", "wall_time_s", "val", "test"}
        known |= {"baselines", "seeds", "statistics", "cost_stress", "provenance"}
        known |= {"bar_clock", "data", "instruments", "panel"}
        for k, v in summary.items():
            if k not in known and isinstance(v, (str, int, float, bool)):
                rows.append((k, str(v)))
        # what a rerun needs (program/records/provenance.py)
        for k, v in (summary.get("provenance") or {}).items():
            rows.append((k, f"`{v}`" if k in ("xla_flags", "git_commit") and v else str(v)))
    elif records:
        wall = records[-1].get(_WALL_TIME)
        rows.append(
            (
                "epochs / wall time",
                f"{records[-1]['epoch']} logged"
                + (f" / {clock(wall)}" if isinstance(wall, (int, float)) else "")
                + " (no summary.json: the run has not finished)",
            )
        )
    throughput = _throughput(records)
    if throughput:
        rows.append(("throughput", throughput))
    return lines + [f"| {k} | {v} |" for k, v in rows] + [""]


def _equity_sections(run_dir: Path, figures: bool = True) -> list[str]:
    """Equity and drawdown against the baselines per split (a panel: its equal-weight
    portfolio; val only when walked); ``figures`` False (``eval.plots``): a line saying so."""
    if not figures:
        return ["## Figures", "", "_Off (`eval.plots=false`): no equity or training plots._", ""]
    lines: list[str] = []
    for split in SPLITS:
        eval_path = run_dir / f"eval_{split}.csv"
        if (run_dir / f"portfolio_{split}.csv").exists():  # a panel: its equal-weight portfolio
            eval_path = run_dir / f"portfolio_{split}.csv"
        if split == "val" and not eval_path.exists():
            continue  # the val curve is optional; the test curve is always reported
        lines += [f"## {split.capitalize()} equity", ""]
        if not eval_path.exists():
            lines += [f"_No {eval_path.name}: the agent has not been evaluated on {split}._", ""]
            continue
        agent = read_eval_log(eval_path)
        base_path = run_dir / f"baselines_{split}.csv"
        baselines = read_baseline_equity(base_path) if base_path.exists() else None
        eq_png, dd_png = plots.plot_equity(run_dir, split, agent, baselines)
        if baselines is None:
            lines += [f"_No {base_path.name}: baselines are not drawn._", ""]
        lines += [f"![{split} equity]({eq_png})", "", f"![{split} drawdown]({dd_png})", ""]
    return lines


def _training_section(
    run_dir: Path,
    records: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any] | None,
    seeds: int,
    figures: bool = True,
) -> list[str]:
    """The training curves of ``metrics.jsonl`` (``figures``) and a line of what the loop did."""
    if not records:
        return ["## Training", "", "_No metrics.jsonl records._", ""]
    lines = ["## Training", ""]
    markers = training_plots.Markers(records)
    bh = ((summary or {}).get("baselines") or {}).get("buy_and_hold") or {}
    best, bh_val = (summary or {}).get("best_epoch"), as_float((bh.get("val") or {}).get("sharpe"))
    plot = training_plots.plot_training
    kw = {"best_epoch": best, "val_sharpe_lines": {"buy_and_hold val": bh_val}}
    drawn = plot(run_dir, records, seeds, markers, **kw) if figures else []
    for title, png in drawn:
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
    return lines


def write_report(run_dir: str | os.PathLike) -> Path:
    """Write ``report.md`` and its PNG plots into ``run_dir``; returns the report's path.

    Sections: run header (config essentials, epochs, wall time, best checkpoint, throughput),
    metrics tables (agent vs every baseline on val and test, from ``summary.json``; the oracle
    is named with its execution chosen on val and, in a small table, listed per order type and
    urgency), statistics per split (Sharpe with its bootstrap interval per seed and for the
    mean, PSR, DSR with its trials, SPA p-values against the baselines), the cost stress (table
    and ``cost_stress.png``; :mod:`jaxdqn.program.report.statistics_section`), equity
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
    figures = bool(((cfg or {}).get("eval") or {}).get("plots", True))
    fig_dir = run_dir if figures else None

    lines = _run_section(run_dir, summary, records, cfg)
    if summary is not None:
        lines += _results_section(summary) + population_section(summary, fig_dir)
        lines += panel_section.panel_section(summary, fig_dir, SPLITS)
        lines += statistics_section.statistics_section(summary, SPLITS)
        lines += statistics_section.cost_stress_section(summary, fig_dir)
    else:
        lines += ["## Results", "", "_No summary.json: the run has not finished._", ""]

    lines += _equity_sections(run_dir, figures)
    lines += _training_section(run_dir, records, summary, seeds, figures)
    path = run_dir / REPORT_FILE
    write_text_atomic(path, "\n".join(lines))
    return path
