"""A population run's members in ``summary.json`` and ``report.md`` (issue 32).

``summary.json`` of a run with a ``population`` section adds

    "members": [{"member": m, "overrides": {key: value}, "agents": [p, ...],
                 "best_epoch": e, "best_step": k, "val": metrics, "test": metrics}, ...],
    "winner": {"member": m, "overrides": {...}, "selected_on": "..."}

where ``metrics`` are keyed as the run's ``val``/``test`` and averaged over the member's seeds
(agents ``m·S … m·S + S − 1``) walked at the member's own best checkpoint (``best_epoch``: the
epoch with the member's best mean val Sharpe; every member's is kept), and the winner is the
member with the highest mean val Sharpe (test plays no part). The run's top-level
``val``/``test``, best epoch and statistics are then the winner's. Every agent is also a trial
of the run's Deflated Sharpe Ratio (members × seeds × checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn.config import Config
from jaxdqn.config.members import members, population_grid
from jaxdqn.program.records.formats import as_float, cell, markdown_table
from jaxdqn.program.report.plots import add_legend, figure, save_png

__all__ = ["MEMBERS_PNG", "SELECTED_ON", "member_entries", "plot_members", "population_section"]

MEMBERS_PNG = "members.png"
SELECTED_ON = "the highest mean val Sharpe over the member's seeds"
BEST = ("best_epoch", "best_step")


def member_entries(
    cfg: Config, per_agent: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """``(members, winner)`` of ``cfg``'s population from every agent's ``{"val", "test"}``
    metrics (member-major, as the run's agents; ``"test"`` absent when the run did not walk
    test, ``eval.walk_test``); None without a population."""
    if not population_grid(cfg.population):
        return None
    s = cfg.train.num_seeds
    splits = [split for split in ("val", "test") if split in per_agent[0]]
    out = []
    for i, m in enumerate(members(cfg)):
        agents = list(range(i * s, (i + 1) * s))
        mean = lambda split, agents=agents: {
            k: float(np.nanmean([per_agent[p][split][k] for p in agents]))
            for k in per_agent[agents[0]][split]
        }
        entry = {"member": i, "overrides": m.overrides, "agents": agents}
        # the member's own best checkpoint, where the run recorded it (each agent's entry)
        entry |= {k: per_agent[agents[0]][k] for k in BEST if k in per_agent[agents[0]]}
        out.append(entry | {split: mean(split) for split in splits})
    score = lambda e: e["val"]["sharpe"] if math.isfinite(e["val"]["sharpe"]) else -math.inf
    best = max(out, key=score)
    winner = {"member": best["member"], "overrides": best["overrides"], "selected_on": SELECTED_ON}
    return out, winner


def plot_members(run_dir: Path, entries: Sequence[Mapping[str, Any]], winner: Any) -> str:
    """``members.png``: every member's val and test Sharpe side by side, the winner's label
    starred; returns the file name."""
    names = [("★ " if e["member"] == winner else "") + str(e["member"]) for e in entries]
    x = np.arange(len(entries))
    fig = figure(figsize=(max(6.0, 0.5 * len(entries) + 2), 3.5))
    ax = fig.add_subplot()
    for i, split in enumerate(("val", "test")):
        values = [as_float((e.get(split) or {}).get("sharpe")) for e in entries]
        ax.bar(x + (i - 0.5) * 0.4, np.nan_to_num(values), 0.4, label=f"{split} Sharpe")
    ax.axhline(0.0, color="0.6", linewidth=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_xlabel("member (★ the winner, selected on val)")
    ax.set_ylabel("Sharpe (annualised)")
    ax.grid(alpha=0.3, axis="y")
    add_legend(ax)
    return save_png(fig, Path(run_dir) / MEMBERS_PNG)


def population_section(summary: Mapping[str, Any], run_dir: Path | None = None) -> list[str]:
    """The report's "Population" section: one row per member (its values, val and test
    Sharpe and return), the winner marked, and with ``run_dir`` the plot of
    :func:`plot_members`; nothing for an ordinary run."""
    entries = summary.get("members")
    if not entries:
        return []
    winner = (summary.get("winner") or {}).get("member")
    keys = list(entries[0]["overrides"])
    head = ["member", *keys, "val Sharpe", "test Sharpe", "val return", "test return"]
    rows = []
    for e in entries:
        name = f"**{e['member']}** (winner)" if e["member"] == winner else str(e["member"])
        values = [f"{e['overrides'][k]:g}" for k in keys]
        got = lambda split, key, e=e: cell((e.get(split) or {}).get(key))
        metrics = [got(s, k) for k in ("sharpe", "annual_return") for s in ("val", "test")]
        rows.append([name, *values, metrics[0], metrics[1], metrics[2], metrics[3]])
    return [
        "## Population",
        "",
        f"{len(entries)} members trained in one program; the winner has {SELECTED_ON} (test "
        "plays no part). The results above are the winner's; every agent counts as a trial of "
        "the Deflated Sharpe Ratio.",
        "",
        *markdown_table(head, rows),
        "",
        *([f"![members]({plot_members(run_dir, entries, winner)})", ""] if run_dir else []),
    ]
