"""The report's panel section (issue 29), from ``summary.json``'s ``panel`` and ``instruments``
(:mod:`jaxdqn.program.panel_results`): the cross-section of the agent's Sharpe over instruments
with its bootstrap intervals and the fraction that beats buy-and-hold, the equal-weight
portfolio of the per-instrument agents against each baseline's, one row per instrument (the
agent and every baseline: Sharpe, return, drawdown, turnover), and ``instrument_sharpe.png``:
each instrument's test Sharpe, the agent's against buy-and-hold's."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from jaxdqn.evaluation.baselines import ORACLE_EXECUTIONS
from jaxdqn.program.formats import as_float

__all__ = ["INSTRUMENT_METRICS", "panel_section", "plot_instrument_sharpe"]

INSTRUMENT_METRICS = ("sharpe", "annual_return", "max_drawdown", "annual_turnover")
"""The per-instrument table's metrics, for the agent and each baseline."""


def _n(v: Any) -> str:
    f = as_float(v)
    return "nan" if not np.isfinite(f) else f"{f:.3f}"


def _interval(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "nan"
    return f"{_n(d.get('sharpe'))} [{_n(d.get('low'))}, {_n(d.get('high'))}]"


def plot_instrument_sharpe(run_dir: Path, instruments: Mapping[str, Any], split: str) -> str:
    """``instrument_sharpe.png``: each instrument's ``split`` Sharpe, agent (y) against
    buy-and-hold (x), with the diagonal (above it: the agent beats buy-and-hold)."""
    names = list(instruments)
    agent = [as_float((instruments[n].get(split) or {}).get("sharpe")) for n in names]
    bh = [
        as_float(
            ((instruments[n].get("baselines") or {}).get("buy_and_hold") or {})
            .get(split, {})
            .get("sharpe")
        )
        for n in names
    ]
    fig = Figure(figsize=(6, 6))
    ax = fig.add_subplot()
    ax.scatter(bh, agent, color="black", s=18)
    for name, x, y in zip(names, bh, agent, strict=True):
        if np.isfinite(x) and np.isfinite(y):
            ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    finite = [v for v in (*agent, *bh) if np.isfinite(v)] or [0.0, 1.0]
    lo, hi = min(finite) - 0.2, max(finite) + 0.2
    ax.plot(
        [lo, hi], [lo, hi], color="0.5", linestyle=":", linewidth=1, label="agent = buy-and-hold"
    )
    ax.axhline(0, color="0.8", linewidth=0.8)
    ax.axvline(0, color="0.8", linewidth=0.8)
    ax.set_xlabel(f"buy-and-hold {split} Sharpe")
    ax.set_ylabel(f"agent {split} Sharpe (seed mean)")
    ax.set_title(f"{split}: Sharpe per instrument")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = run_dir / "instrument_sharpe.png"
    fig.savefig(path, dpi=100, format="png")
    return path.name


def panel_section(summary: Mapping[str, Any], run_dir: Path, splits=("val", "test")) -> list[str]:
    """The Markdown lines of the panel section (none when the run is not a panel's)."""
    panel, instruments = summary.get("panel"), summary.get("instruments")
    if not isinstance(panel, Mapping) or not isinstance(instruments, Mapping):
        return []
    stat = panel.get("select_on", "mean")
    lines = [
        f"## Panel: {len(instruments)} instruments",
        "",
        f"The results above are the {stat} over instruments of each instrument's metric; the "
        "statistics are those of the equal-weight portfolio of the per-instrument agents "
        "(rebalanced every bar over the instruments that have it) against each baseline's "
        "equal-weight portfolio.",
        "",
        "| split | mean Sharpe [CI] | median Sharpe [CI] | buy-and-hold mean / median | "
        "beats buy-and-hold |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    level = None
    for split in splits:
        c = (panel.get("cross_section") or {}).get(split) or {}
        level = c.get("confidence", level)
        bh = c.get("buy_and_hold") or {}
        frac = as_float(c.get("beats_buy_and_hold"))
        lines.append(
            f"| {split} | {_interval(c.get('mean'))} | {_interval(c.get('median'))} | "
            f"{_n(bh.get('mean'))} / {_n(bh.get('median'))} | "
            + ("nan" if not np.isfinite(frac) else f"{100 * frac:.0f} %")
            + " |"
        )
    if level is not None:
        lines += [
            "",
            f"Intervals: {round(100 * float(level))} % percentile bootstrap, instruments and "
            "seeds resampled.",
        ]
    lines += ["", "### Equal-weight portfolios", ""]
    cols = INSTRUMENT_METRICS
    lines += [
        "| split | strategy | " + " | ".join(cols) + " |",
        "| --- | --- |" + " ---: |" * len(cols),
    ]
    for split in splits:
        pf = (panel.get("portfolio") or {}).get(split) or {}
        rows = [("**agent**", pf.get("agent") or {})]
        rows += list((pf.get("baselines") or {}).items())
        for name, m in rows:
            lines.append(f"| {split} | {name} | " + " | ".join(_n(m.get(k)) for k in cols) + " |")
    lines += ["", "### Per instrument", ""]
    for split in splits:
        base_names = [
            b
            for b in (next(iter(instruments.values())).get("baselines") or {})
            if b not in ORACLE_EXECUTIONS and b != "flat"
        ]
        head = ["agent " + k for k in cols] + [f"{b} sharpe" for b in base_names]
        lines += [f"#### {split}", "", "| instrument | " + " | ".join(head) + " |"]
        lines.append("| --- |" + " ---: |" * len(head))
        for name, entry in instruments.items():
            agent = entry.get(split) or {}
            base = entry.get("baselines") or {}
            cells = [_n(agent.get(k)) for k in cols]
            cells += [_n(((base.get(b) or {}).get(split) or {}).get("sharpe")) for b in base_names]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    png = plot_instrument_sharpe(run_dir, instruments, splits[-1])
    lines += [f"![Sharpe per instrument]({png})", ""]
    return lines
