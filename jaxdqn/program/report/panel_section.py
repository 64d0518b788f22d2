"""The report's panel section (issue 29), from ``summary.json``'s ``panel`` and ``instruments``
(:mod:`jaxdqn.program.report.panel_results`): the cross-section of the agent's Sharpe over
instruments with its bootstrap intervals and the fraction that beats buy-and-hold, the equal-weight
portfolio of the per-instrument agents against each baseline's, one row per instrument (the agent
and every baseline: Sharpe, return, drawdown, turnover), and ``instrument_sharpe.png``: each
instrument's test Sharpe, the agent's against buy-and-hold's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn.evaluation.baselines import ORACLE_EXECUTIONS
from jaxdqn.program.records.formats import as_float, fixed, markdown_table
from jaxdqn.program.report.plots import figure

__all__ = ["INSTRUMENT_METRICS", "panel_section", "plot_instrument_sharpe"]

INSTRUMENT_METRICS = ("sharpe", "annual_return", "max_drawdown", "annual_turnover")
"""The per-instrument table's metrics, for the agent and each baseline."""


def _interval(d: Mapping[str, Any] | None) -> str:
    if not d:
        return "nan"
    return f"{fixed(d.get('sharpe'))} [{fixed(d.get('low'))}, {fixed(d.get('high'))}]"


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
    fig = figure(figsize=(6, 6))
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


def gate_lines(panel: Mapping[str, Any], cols: Sequence[str]) -> list[str]:
    """The validation gate's subsection (``eval.gate_t``; none without it): the gated test
    portfolio beside the ungated one, and how often each instrument passed."""
    gate = panel.get("gate")
    if not isinstance(gate, Mapping):
        return []
    ungated = ((panel.get("portfolio") or {}).get("test") or {}).get("agent") or {}
    rows = [
        ["test: **agent, gated**", *(fixed((gate.get("test") or {}).get(k)) for k in cols)],
        ["test: agent, every instrument", *(fixed(ungated.get(k)) for k in cols)],
    ]
    traded = gate.get("traded") or {}
    passed = ", ".join(f"{n} {100 * float(f):.0f} %" for n, f in traded.items())
    return [
        "",
        f"### Validation gate (eval.gate_t = {fixed(gate.get('t'))})",
        "",
        "Each agent trades on test only the instruments where its own val walk's Sharpe is at "
        f"least {fixed(gate.get('t'))} standard errors, equal-weighted among them, and holds the "
        "others flat (chosen on val only; the tables above and below are ungated).",
        "",
        *markdown_table(["strategy", *cols], rows),
        "",
        f"Agents trading each instrument: {passed}.",
    ]


def panel_section(
    summary: Mapping[str, Any],
    run_dir: Path | None,
    splits: tuple[str, ...] = ("val", "test"),
    intro: str | None = None,
) -> list[str]:
    """The Markdown lines of the panel section (none when the run is not a panel's); ``intro``
    replaces its first paragraph (what the numbers above it are). ``run_dir`` None: no
    figure (``eval.plots=false``)."""
    panel, instruments = summary.get("panel"), summary.get("instruments")
    if not isinstance(panel, Mapping) or not isinstance(instruments, Mapping):
        return []
    stat = panel.get("select_on", "mean")
    if intro is None:
        intro = (
            f"The results above are the {stat} over instruments of each instrument's metric; "
            "the statistics are those of the equal-weight portfolio of the per-instrument agents "
            "(rebalanced every bar over the instruments that have it) against each baseline's "
            "equal-weight portfolio."
        )
    lines = [f"## Panel: {len(instruments)} instruments", "", intro, ""]
    level, rows = None, []
    for split in splits:
        c = (panel.get("cross_section") or {}).get(split) or {}
        level = c.get("confidence", level)
        bh = c.get("buy_and_hold") or {}
        frac = as_float(c.get("beats_buy_and_hold"))
        rows.append(
            [
                split,
                _interval(c.get("mean")),
                _interval(c.get("median")),
                f"{fixed(bh.get('mean'))} / {fixed(bh.get('median'))}",
                "nan" if not np.isfinite(frac) else f"{100 * frac:.0f} %",
            ]
        )
    head = ["split", "mean Sharpe [CI]", "median Sharpe [CI]", "buy-and-hold mean / median"]
    lines += markdown_table([*head, "beats buy-and-hold"], rows)
    if level is not None:
        lines += [
            "",
            f"Intervals: {round(100 * float(level))} % percentile bootstrap, instruments and "
            "seeds resampled.",
        ]
    cols = INSTRUMENT_METRICS
    rows = []
    for split in splits:
        pf = (panel.get("portfolio") or {}).get(split) or {}
        strategies = [("**agent**", pf.get("agent") or {}), *(pf.get("baselines") or {}).items()]
        for name, m in strategies:
            rows.append([f"{split}: {name}", *(fixed(m.get(k)) for k in cols)])
    lines += ["", "### Equal-weight portfolios", "", *markdown_table(["strategy", *cols], rows)]
    lines += gate_lines(panel, cols)
    lines += ["", "### Per instrument", ""]
    first = next(iter(instruments.values())).get("baselines") or {}
    base_names = [b for b in first if b not in ORACLE_EXECUTIONS and b != "flat"]
    head = ["instrument", *("agent " + k for k in cols), *(f"{b} sharpe" for b in base_names)]
    for split in splits:
        rows = []
        for name, entry in instruments.items():
            agent, base = entry.get(split) or {}, entry.get("baselines") or {}
            cells = [fixed(agent.get(k)) for k in cols]
            cells += [
                fixed(((base.get(b) or {}).get(split) or {}).get("sharpe")) for b in base_names
            ]
            rows.append([name, *cells])
        lines += [f"#### {split}", "", *markdown_table(head, rows), ""]
    if run_dir is not None:
        png = plot_instrument_sharpe(run_dir, instruments, splits[-1])
        lines += [f"![Sharpe per instrument]({png})", ""]
    return lines
