"""The report's "Statistics" and "Cost stress" sections, from ``summary.json``'s
``statistics`` and ``cost_stress`` entries (:mod:`jaxdqn.program.records.results` defines them;
:mod:`jaxdqn.evaluation.statistics` their formulas)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn.program.records.formats import as_float, fixed, markdown_table
from jaxdqn.program.report import plots

__all__ = ["cost_stress_section", "statistics_section", "statistics_table"]


def _ci(low: Any, high: Any) -> str:
    return "n/a" if low is None or high is None else f"[{fixed(low)}, {fixed(high)}]"


def _mean_label(seeds: int) -> str:
    return f"**mean of {seeds} seeds**" if seeds != 1 else "**mean (1 seed)**"


def statistics_table(stats: Mapping[str, Any]) -> list[str]:
    """Markdown lines of one split's statistics: the per-seed and mean Sharpe with intervals,
    PSR and DSR, the DSR's trials, and the SPA p-values."""
    ref = stats.get("reference") or {}
    ref_name = ref.get("name") or "reference"
    level = round(100 * float(stats.get("confidence", 0.95)))
    head = [
        "",
        "Sharpe",
        f"{level} % CI",
        "PSR (> 0)",
        f"PSR (> {ref_name} {fixed(ref.get('sharpe'))})",
    ]
    head += ["DSR", "block"]
    rows = [
        [
            f"seed {r.get('seed')}",
            fixed(r.get("sharpe")),
            _ci(r.get("sharpe_low"), r.get("sharpe_high")),
            fixed(r.get("psr_zero")),
            fixed(r.get("psr_reference")),
            fixed(r.get("dsr")),
            fixed(r.get("block_length"), 1),
        ]
        for r in stats.get("seeds") or []
    ]
    mean = stats.get("mean") or {}
    rows.append(
        [
            _mean_label(len(stats.get("seeds") or [])),
            fixed(mean.get("sharpe")),
            _ci(mean.get("sharpe_low"), mean.get("sharpe_high")),
            "",
            "",
            "",
            fixed(mean.get("block_length"), 1),
        ]
    )
    lines = markdown_table(head, rows)
    dsr = stats.get("dsr") or {}
    lines += [
        "",
        f"DSR: N = {dsr.get('num_trials')} trials ({dsr.get('trials')}); std of their Sharpe "
        f"{fixed(dsr.get('sharpe_std'))}, expected best of N under no skill SR0 = "
        f"{fixed(dsr.get('sr0'))} (annualised). {stats.get('bars')} bars.",
        "",
    ]
    if stats.get("unavailable"):
        return [*lines, f"_{stats['unavailable']}._", ""]
    spa = stats.get("spa")
    if not spa:
        return lines
    kinds = ("consistent", "lower", "upper")
    spa_rows = [
        [name, *(fixed(p.get(k)) for k in kinds)]
        for name, p in (spa.get("baselines") or {}).items()
    ]
    all_p = spa.get("agent_beats_all") or {}
    some = spa.get("some_baseline_beats_agent") or {}
    spa_rows.append(
        ["**agent beats every baseline** (largest p)", *(fixed(all_p.get(k)) for k in kinds)]
    )
    spa_rows.append(
        ["some baseline beats the agent (reverse)", *(fixed(some.get(k)) for k in kinds)]
    )
    lines += [
        "Hansen's SPA (arch; mean return per bar; per baseline H0: no seed beats it, so a small p "
        "says the agent beats that baseline):",
        "",
        *markdown_table(["baseline", "p consistent", "p lower", "p upper"], spa_rows),
        "",
    ]
    return lines


def statistics_section(summary: Mapping[str, Any], splits: Sequence[str]) -> list[str]:
    """The "Statistics" section (empty when the summary has none)."""
    stats = summary.get("statistics")
    if not isinstance(stats, Mapping) or not stats:
        return []
    first = next(iter(stats.values()))
    boot = first.get("bootstrap") or {}
    lines = [
        "## Statistics",
        "",
        "Sharpe annualised; intervals: "
        f"{boot.get('method', 'stationary bootstrap')} of the bars' returns, {boot.get('reps')} "
        f"resamples (seed {boot.get('seed')}), mean block length from optimal_block_length "
        "(the mean's interval resamples the seeds jointly). PSR = P(true Sharpe > benchmark) "
        "with skewness and raw kurtosis; DSR = PSR against the best of N no-skill trials.",
        "",
    ]
    for split in splits:
        if isinstance(stats.get(split), Mapping):
            lines += [f"### {split}", "", *statistics_table(stats[split])]
    return lines


def cost_stress_section(summary: Mapping[str, Any], run_dir: Path | None) -> list[str]:
    """The "Cost stress" section with its table and ``cost_stress.png`` (empty when the summary
    has no ``cost_stress``; no figure when ``run_dir`` is None: ``eval.plots=false``)."""
    stress = summary.get("cost_stress")
    if not isinstance(stress, Mapping) or not stress.get("rows"):
        return []
    split = stress.get("split", "test")
    rows = stress["rows"]
    metrics = list(stress.get("metrics") or (rows[0].get("mean") or {}).keys())
    seeds = max(len(r.get("seeds") or []) for r in rows)
    head = ["cost", "half-spread bps", "commission bps", "impact η", *metrics]
    if seeds > 1:
        head.append("sharpe per seed")
    body = []
    for r in rows:
        mean = r.get("mean") or {}
        cells = [f"{fixed(r.get('multiple'), 1)}×", fixed(r.get("half_spread_bps"), 2)]
        cells += [fixed(r.get("commission_bps"), 2), fixed(r.get("impact_eta"), 2)]
        cells += [fixed(mean.get(m)) for m in metrics]
        if seeds > 1:
            cells.append(" / ".join(fixed(s.get("sharpe")) for s in r.get("seeds") or []))
        body.append(cells)
    sharpe = np.full((len(rows), max(seeds, 1)), np.nan)  # [M, S]
    for i, r in enumerate(rows):
        for j, s in enumerate(r.get("seeds") or []):
            sharpe[i, j] = as_float(s.get("sharpe"))
    bh = ((summary.get("baselines") or {}).get("buy_and_hold") or {}).get(split) or {}
    figure = []
    if run_dir is not None:
        png = plots.plot_cost_stress(
            run_dir,
            [float(r["multiple"]) for r in rows],
            sharpe,
            split,
            {"buy_and_hold at 1×": as_float(bh.get("sharpe"))},
        )
        figure = [f"![cost stress]({png})", ""]
    label = "seed mean" if seeds > 1 else "one seed"
    return [
        f"## Cost stress ({split})",
        "",
        f"The best checkpoint's {split} walk with every cost rate (half-spread, commission, "
        f"impact) multiplied; the same policy, bars and key ({label}; 1× is the {split} "
        "walk above).",
        "",
        *markdown_table(head, body),
        "",
        *figure,
    ]
