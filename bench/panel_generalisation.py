"""Issue 29's generalisation experiment: one policy trained on 16 of the bundled 20 US stocks,
judged out of sample in time on those 16 and on the 4 it never saw, by walk-forward.

    python bench/panel_generalisation.py --runs runs/g            # H200: configs/panel_gpu.yaml
    python bench/panel_generalisation.py --runs runs/g --resume   # continue a stopped run
    python bench/panel_generalisation.py --runs runs/g --budget 560   # stop in time (resume)
    python bench/panel_generalisation.py --read runs/g            # the tables of a finished run
    python bench/panel_generalisation.py --runs DIR --config C [key=value ...]   # other sizes

1. ``python -m jaxdqn.walkforward --config C data.instruments=[the 16]``: every fold trains one
   population (its seeds) on the 16 stocks' train dates, selects its checkpoint on their mean
   val Sharpe, and walks its test dates; the folds' test segments are stitched per stock.
2. ``python -m jaxdqn.evaluate RUN/wf data.instruments=[the 4]``: every fold's selected
   checkpoint walks the 4 held-out stocks on that fold's own test dates (features normalised on
   each stock's own train rows), stitched the same way.

The held-out four (:data:`HELD_OUT`) were drawn once, before any run, by
``numpy.random.default_rng(29).choice(20, 4)`` over the alphabetical names; nothing here is
chosen or tuned on a test result. Per group the table gives each stock's stitched test Sharpe
(mean over seeds) against buy-and-hold's, the cross-sectional mean and median with their 95 %
bootstrap intervals (stocks and seeds resampled), the fraction of stocks where the agent beats
buy-and-hold, and the equal-weight portfolio of the per-stock agents against the equal-weight
buy-and-hold portfolio.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = [
    "AAPL",
    "AMD",
    "BAC",
    "BBY",
    "CVX",
    "GE",
    "HD",
    "JNJ",
    "JPM",
    "KO",
    "LLY",
    "MRK",
    "MSFT",
    "PEP",
    "PFE",
    "PG",
    "RRC",
    "UNH",
    "WMT",
    "XOM",
]
HELD_OUT = ("AAPL", "LLY", "MRK", "PG")
TRAINED = tuple(n for n in NAMES if n not in HELD_OUT)


def _run(cmd: list[str], timeout: float | None = None) -> int:
    """Run ``cmd`` from the repository; after ``timeout`` seconds it gets SIGINT (a fold saves
    its checkpoint and the walk-forward exits, to be resumed). Returns its exit code."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"time budget reached after {timeout:.0f} s: interrupting", flush=True)
        proc.send_signal(signal.SIGINT)
        return proc.wait()


def _fmt(x) -> str:
    return "nan" if x is None else f"{float(x):.3f}"


def _table(title: str, instruments: dict, cross: dict, portfolio: dict) -> list[str]:
    lines = [f"### {title}", "", "| stock | agent test Sharpe | buy-and-hold | agent − B&H |"]
    lines.append("| --- | ---: | ---: | ---: |")
    for name, entry in instruments.items():
        a = entry["test"]["sharpe"]
        b = entry["baselines"]["buy_and_hold"]["test"]["sharpe"]
        diff = None if a is None or b is None else a - b
        lines.append(f"| {name} | {_fmt(a)} | {_fmt(b)} | {_fmt(diff)} |")
    m, md, bh = cross["mean"], cross["median"], cross["buy_and_hold"]
    beats = cross.get("beats_buy_and_hold")
    agent_pf = portfolio["agent"]
    bh_pf = portfolio["baselines"].get("buy_and_hold", {})
    lines += [
        "",
        f"- cross-sectional mean Sharpe {_fmt(m['sharpe'])} [{_fmt(m['low'])}, "
        f"{_fmt(m['high'])}] vs buy-and-hold {_fmt(bh['mean'])}; median {_fmt(md['sharpe'])} "
        f"[{_fmt(md['low'])}, {_fmt(md['high'])}] vs {_fmt(bh['median'])} "
        f"({cross['instruments']} stocks x {cross['seeds']} seeds, 95 % bootstrap)",
        "- beats buy-and-hold on "
        + ("nan" if beats is None else f"{100 * beats:.0f} %")
        + " of the stocks",
        f"- equal-weight portfolio: agent Sharpe {_fmt(agent_pf.get('sharpe'))} (annual return "
        f"{_fmt(agent_pf.get('annual_return'))}, turnover {_fmt(agent_pf.get('annual_turnover'))}"
        f"/yr) vs buy-and-hold {_fmt(bh_pf.get('sharpe'))} (annual return "
        f"{_fmt(bh_pf.get('annual_return'))})",
        "",
    ]
    return lines


def read(runs: Path) -> list[str]:
    """The two tables of a finished experiment in ``runs``."""
    wf = json.loads((runs / "wf" / "walkforward.json").read_text())
    unseen = json.loads((runs / "unseen" / "metrics_test.json").read_text())
    folds = wf["folds"]
    spans = ", ".join(f"{f['dates']['test'][0]}..{f['dates']['test'][1]}" for f in folds)
    lines = [
        f"{len(folds)} folds, test segments {spans}; {wf['num_seeds']} seeds; folds trained in "
        f"{wf['folds_wall_time_s']:.0f} s",
        "",
    ]
    groups = [
        (f"In time: the {len(wf['instruments'])} trained stocks", wf),
        (f"Never seen: the {len(unseen['instruments'])} held-out stocks", unseen),
    ]
    for title, result in groups:
        panel = result["panel"]
        lines += _table(
            title,
            result["instruments"],
            panel["cross_section"]["test"],
            panel["portfolio"]["test"],
        )
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, help="the experiment's directory")
    p.add_argument("--read", type=Path, help="print the tables of a finished experiment")
    p.add_argument("--config", default="configs/panel_gpu.yaml")
    p.add_argument("--resume", action="store_true", help="continue the walk-forward in --runs")
    p.add_argument(
        "--budget",
        type=float,
        help="seconds for the whole call: the walk-forward is "
        "interrupted in time for the held-out evaluation of its finished folds",
    )
    p.add_argument("--reserve", type=float, default=100.0, help="seconds kept for evaluation")
    p.add_argument("overrides", nargs="*", metavar="key=value")
    args = p.parse_args(argv)
    if args.read:
        print("\n".join(read(args.read)))
        return 0
    if args.runs is None:
        p.error("--runs or --read is required")
    start = time.time()
    wf = args.runs / "wf"
    trained = f"data.instruments=[{', '.join(TRAINED)}]"
    py = [sys.executable, "-m"]
    if args.resume:
        cmd = [*py, "jaxdqn.walkforward", "--no-progress", "--resume", str(wf)]
    else:
        cmd = [*py, "jaxdqn.walkforward", "--no-progress", "--config", args.config]
        cmd += ["--run-dir", str(wf), trained, *args.overrides]
    left = None if args.budget is None else args.budget - args.reserve
    code = _run(cmd, timeout=left)
    held = f"data.instruments=[{', '.join(HELD_OUT)}]"
    # evaluates the finished folds (reusing those evaluated earlier); stops at an unfinished one
    _run([*py, "jaxdqn.evaluate", str(wf), "--out", str(args.runs / "unseen"), held])
    print(f"wall time {time.time() - start:.0f} s", flush=True)
    if code or not (wf / "walkforward.json").exists():
        print(f"the walk-forward stopped before its end (exit {code}); continue with --resume")
        return 3
    print("\n".join(read(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
