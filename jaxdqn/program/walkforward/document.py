"""``walkforward.md``: the walk-forward's report, from its results (``walkforward.json``'s
content, :mod:`jaxdqn.program.walkforward.stitched` defines it) and the stitched series.

Sections: the settings and the fold arithmetic; the per-fold table (dates, best epoch, val and
test Sharpe of the seed mean, every baseline's test Sharpe) with ``walkforward_folds.png`` (the
agent's test Sharpe per fold against buy-and-hold's); the stitched out-of-sample metrics per
seed, their mean and every baseline's; the statistics of the stitched returns (bootstrap
intervals, PSR, DSR, SPA: :func:`jaxdqn.program.report.statistics_section.statistics_table`); the
stitched equity and drawdown (``equity_stitched.png``, ``drawdown_stitched.png``); on a panel,
the panel section of :mod:`jaxdqn.program.report.panel_section` on the instruments' stitched series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jaxdqn.program.records.formats import clock, fixed, markdown_table
from jaxdqn.program.records.results import write_text_atomic
from jaxdqn.program.report import panel_section, plots, statistics_section

__all__ = ["REPORT_FILE", "STITCHED_METRICS", "write_walkforward_report"]

REPORT_FILE = "walkforward.md"
STITCHED_METRICS = (
    "sharpe",
    "sortino",
    "annual_return",
    "annual_volatility",
    "max_drawdown",
    "calmar",
    "hit_rate",
    "annual_turnover",
    "exposure",
)
"""Columns of the stitched-metrics table (those a strategy has)."""
REFERENCE = "buy_and_hold"


def _span(dates: Sequence[str]) -> str:
    return f"{dates[0]} – {dates[1]}"


def _settings(result: Mapping[str, Any]) -> list[str]:
    w = result["settings"]
    size = lambda v: f"{v:g} {w['unit'] if v != 1 else w['unit'].removesuffix('s')}"
    train = f"rolling window of {size(w['train'])}" if w["mode"] == "rolling" else "anchored"
    return [
        f"{w['folds']} folds, {train}; val {size(w['val'])}, test {size(w['test'])}, "
        f"purge {w['purge']} bars (between train and val and between val and test), embargo "
        f"{w['embargo']} bars; {result['num_seeds']} seed(s) per fold; "
        f"{result['num_bars']} bars"
        + (
            " of the panel's calendar (every instrument cut at the same dates)."
            if "panel" in result
            else "."
        ),
        "",
        "Every fold is trained from scratch by the population program (`python -m "
        "jaxdqn.train`'s) on its own ranges, its features normalised on its own train rows; "
        "the best checkpoint by val Sharpe is walked once on its test segment. The test "
        "segments follow each other up to the last bar and are stitched into one "
        "out-of-sample series: each segment starts flat, so the stitched equity is the "
        "product of the folds' test growth. Fold k's run directory is `fold_<k>/` (with its "
        "own `report.md`).",
        "",
    ]


def _fold_section(result: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    folds = result["folds"]
    names = list(folds[0]["baselines_test_sharpe"]) if folds else []
    panel = all("instruments" in f for f in folds)
    head = ["fold", *(["instruments"] if panel else []), "train", "val", "test", "best epoch"]
    head += ["val Sharpe", "test Sharpe", *(f"{n} test" for n in names)]
    body = []
    for f in folds:
        d = f["dates"]
        cells = [f"[{f['fold']}](fold_{f['fold']}/report.md)"]
        cells += [str(len(f["instruments"]))] if panel else []
        cells += [_span(d["train"])]
        cells += [_span(d["val"]), _span(d["test"])]
        cells += [str(f.get("best_epoch")), fixed(f.get("val_sharpe")), fixed(f.get("test_sharpe"))]
        cells += [fixed(f["baselines_test_sharpe"].get(n)) for n in names]
        body.append(cells)
    seeds = result.get("num_seeds", 1)
    note = "seed means; " if seeds > 1 else ""
    lines = [
        "## Folds",
        "",
        *markdown_table(head, body),
        "",
        f"Sharpe annualised ({note}val: the selected checkpoint's val walk).",
        "",
    ]
    return lines, names


def _stitched_section(result: Mapping[str, Any]) -> list[str]:
    st = result["stitched"]
    present = {k for m in [st["mean"], *st["baselines"].values()] for k in m}
    columns = [m for m in STITCHED_METRICS if m in present]
    rows = []
    seeds = st["seeds"]
    label = f"**agent** (mean of {len(seeds)} seeds)" if len(seeds) > 1 else "**agent**"
    rows.append([label, *(fixed(st["mean"].get(m)) for m in columns)])
    if len(seeds) > 1:
        rows += [[f"agent seed {s['seed']}", *(fixed(s.get(m)) for m in columns)] for s in seeds]
    rows += [[n, *(fixed(b.get(m)) for m in columns)] for n, b in st["baselines"].items()]
    return [
        f"## Stitched out-of-sample test ({_span(st['dates'])}, {st['bars']} bars)",
        "",
        *markdown_table(["strategy", *columns], rows),
        "",
        "### Statistics of the stitched returns",
        "",
        *statistics_section.statistics_table(st["statistics"]),
    ]


def write_walkforward_report(run_dir: Path, result: Mapping[str, Any], frame: pd.DataFrame) -> Path:
    """Write ``walkforward.md`` and its plots into ``run_dir``; returns its path. ``frame``
    is the stitched series (``stitched_test.csv``)."""
    run_dir = Path(run_dir)
    wall = result.get("wall_time_s")
    folds_wall = result.get("folds_wall_time_s") or 0.0
    lines = [f"# jaxdqn walk-forward report: {run_dir.name}", ""]
    lines += _settings(result)
    lines += [
        f"Training time of the folds {clock(folds_wall)}"
        + (f"; this session {clock(wall)}." if isinstance(wall, (int, float)) else "."),
        "",
    ]
    fold_lines, names = _fold_section(result)
    folds = result["folds"]
    agent = np.array(
        [[np.nan if v is None else v for v in f["test_sharpe_seeds"]] for f in folds],
        dtype=np.float64,
    )
    refs = {}
    if REFERENCE in names:
        refs[REFERENCE] = [f["baselines_test_sharpe"].get(REFERENCE) for f in folds]
        refs[REFERENCE] = [np.nan if v is None else v for v in refs[REFERENCE]]
    labels = [f"fold {f['fold']}\n{_span(f['dates']['test'])}" for f in folds]
    bars_png = plots.plot_fold_sharpe(run_dir, labels, agent, refs)
    lines += [*fold_lines, f"![test Sharpe per fold]({bars_png})", ""]
    lines += _stitched_section(result)
    lines += panel_section.panel_section(
        result,
        run_dir,
        splits=("test",),
        intro=(
            "The fold table holds each fold's "
            f"{(result.get('panel') or {}).get('select_on', 'mean')} over its instruments; the "
            "stitched series above is the equal-weight portfolio of the per-instrument agents "
            "against each baseline's. Below, each instrument's test segments of the folds that "
            "trade it are stitched as the portfolio's are (`stitched_instruments_test.csv`)."
        ),
    )

    seeds = range(result["num_seeds"])
    agent_log = pd.concat(
        [
            pd.DataFrame({"seed": s, "date": frame["date"], "equity": frame[f"seed_{s}_equity"]})
            for s in seeds
        ],
        ignore_index=True,
    )
    if len(seeds) == 1:
        agent_log = agent_log.drop(columns="seed")
    base = pd.DataFrame(
        {n: frame[f"{n}_equity"].to_numpy() for n in names if f"{n}_equity" in frame},
        index=pd.DatetimeIndex(frame["date"], name="date"),
    )
    starts = frame["date"][frame["fold"].ne(frame["fold"].shift())].iloc[1:]
    eq_png, dd_png = plots.plot_equity(
        run_dir, "stitched", agent_log, base if names else None, marks=list(starts)
    )
    lines += [
        "## Stitched equity",
        "",
        f"![stitched equity]({eq_png})",
        "",
        f"![stitched drawdown]({dd_png})",
        "",
    ]
    path = run_dir / REPORT_FILE
    write_text_atomic(path, "\n".join(lines))
    return path
