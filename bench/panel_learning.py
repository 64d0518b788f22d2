"""Issue 29's learning acceptance on the planted-signal panel: one table per run, instrument by
instrument.

    python bench/panel_learning.py P               # CPU: configs/panel_synthetic.yaml, 3 seeds
    python bench/panel_learning.py Q               # H200: panel_synthetic_gpu.yaml, 5 seeds
    python bench/panel_learning.py --read RUN_DIR    # the table of a finished run
    python bench/panel_learning.py P --runs DIR [key=value ...]   # keep the run, add overrides
    python bench/panel_learning.py Q --fresh 60000  # then bench/panel_expected.py on the run

Trains with ``python -m jaxdqn.train`` and reads back ``summary.json``; nothing is recomputed
but the ratios. Signal instruments are those whose planted AR(1) coefficient is not 0 (the
run's ``data.synthetic.panel``); the others have no planted signal. Per instrument: the
agent's test Sharpe (mean over seeds), the
oracle's (its execution chosen on that instrument's val walk), their ratio, the agent's and the
random baseline's turnover, and the Sharpe's standard error over the instrument's test bars
(``metrics.sharpe_se``, of the seed mean's Sharpe). The acceptance lines follow:

- mean test Sharpe over the signal instruments / the mean of their oracles' (CPU ≥ 80 %, H200
  ≥ 95 %), and the worst signal instrument's own ratio (CPU ≥ 50 %, H200 ≥ 80 %);
- on each no-signal instrument: turnover below the random baseline's, and |Sharpe| ≤ 2 SE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.panel_runs import instrument_phis, test_decisions  # noqa: E402
from jaxdqn.evaluation.metrics import sharpe_se  # noqa: E402

CASES = {
    "P": ("configs/panel_synthetic.yaml", 0.80, 0.50),
    "Q": ("configs/panel_synthetic_gpu.yaml", 0.95, 0.80),
}


def _test_bars(run: Path, config_path: str) -> dict[str, int]:
    """Each instrument's test decisions: from ``eval_test.csv``, else from the config."""
    if (run / "eval_test.csv").exists():
        return test_decisions(run / "eval_test.csv")
    from jaxdqn import config
    from jaxdqn.market import market

    saved = run / "config.yaml"
    p = market.prepare(config.load(saved if saved.exists() else ROOT / config_path))
    r = p.ranges("test", walk=True)
    return {n: int(hi - lo - 1) for n, (lo, hi) in zip(p.names, r, strict=True)}


def _phis(run: Path, config_path: str) -> dict[str, float]:
    saved = run / "config.yaml"
    return instrument_phis(saved if saved.exists() else ROOT / config_path)


def table(run: Path, mean_goal: float, worst_goal: float, config_path: str) -> list[str]:
    s = json.loads((run / "summary.json").read_text())
    ppy = s["bar_clock"]["bars_per_year"]
    lines = [
        f"run {run}: {len(s['instruments'])} instruments, seeds "
        f"{len(s.get('seeds') or [None])}, best epoch {s['best_epoch']}, "
        f"wall {s['wall_time_s']:.0f} s",
        "",
        "| instrument | agent test Sharpe | oracle | % oracle | agent turnover | random "
        "turnover | SE | test bars |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    signal, noise = [], []
    bars = _test_bars(run, config_path)
    phi = _phis(run, config_path)
    for name, e in s["instruments"].items():
        agent, base = e["test"], e["baselines"]
        oracle = base.get("oracle", {}).get("test", {})
        ratio = agent["sharpe"] / oracle["sharpe"] if phi[name] != 0 else None
        se = sharpe_se(agent["sharpe"], int(bars[name]), ppy)
        row = (
            name,
            agent["sharpe"],
            oracle.get("sharpe"),
            ratio,
            agent["annual_turnover"],
            base["random"]["test"]["annual_turnover"],
            se,
            int(bars[name]),
        )
        (signal if ratio is not None else noise).append(row)
        pct = f"{100 * ratio:.1f} %" if ratio is not None else "no signal"
        ora = "nan" if row[2] is None else f"{row[2]:.3f}"
        lines.append(
            f"| {name} | {row[1]:.3f} | {ora} | {pct} | {row[4]:.1f} | {row[5]:.1f} | "
            f"{se:.3f} | {row[7]} |"
        )
    lines.append("")
    if signal:
        mean_ratio = np.mean([r[1] for r in signal]) / np.mean([r[2] for r in signal])
        worst = min(signal, key=lambda r: r[3])
        lines.append(
            f"signal instruments ({len(signal)}): mean test Sharpe / mean oracle = "
            f"{100 * mean_ratio:.1f} % (goal ≥ {100 * mean_goal:.0f} %: "
            f"{'met' if mean_ratio >= mean_goal else 'NOT met'}); worst {worst[0]} "
            f"{100 * worst[3]:.1f} % (goal ≥ {100 * worst_goal:.0f} %: "
            f"{'met' if worst[3] >= worst_goal else 'NOT met'})"
        )
    for r in noise:
        ok_turn, ok_sharpe = r[4] < r[5], abs(r[1]) <= 2 * r[6]
        lines.append(
            f"no-signal {r[0]}: turnover {r[4]:.1f} vs random {r[5]:.1f} "
            f"({'met' if ok_turn else 'NOT met'}); |Sharpe| {abs(r[1]):.3f} vs 2 SE "
            f"{2 * r[6]:.3f} ({'met' if ok_sharpe else 'NOT met'})"
        )
    gate = s["panel"].get("gate")
    if gate:  # eval.gate_t: the validation-gated portfolio (reported beside, never instead)
        traded = gate["traded"]
        ungated = s["panel"]["portfolio"]["test"]["agent"]
        lines += [
            "",
            f"validation gate t = {gate['t']}: agents trading each instrument "
            + ", ".join(f"{n} {100 * f:.0f} %" for n, f in traded.items()),
            f"equal-weight test portfolio: gated Sharpe {gate['test']['sharpe']:.3f} "
            f"(turnover {gate['test']['annual_turnover']:.1f}) vs every instrument "
            f"{ungated['sharpe']:.3f} (turnover {ungated['annual_turnover']:.1f})",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", nargs="?", choices=sorted(CASES))
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--runs", default=None, help="keep the run directory under DIR")
    parser.add_argument("--read", default=None, help="only print the table of RUN_DIR")
    parser.add_argument(
        "--fresh",
        type=int,
        default=0,
        metavar="BARS",
        help="after the table, walk the run's checkpoint over fresh BARS-bar draws of every "
        "instrument (bench/panel_expected.py) and print that table last",
    )
    args = parser.parse_intermixed_args()  # overrides may follow --runs (the docstring's form)
    if args.read:
        case = CASES[args.case or "P"]
        print("\n".join(table(Path(args.read), case[1], case[2], case[0])))
        return
    cfg, mean_goal, worst_goal = CASES[args.case]
    runs = Path(args.runs) if args.runs else Path(tempfile.mkdtemp())
    run = runs / f"panel_{args.case}"
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", "--config", str(ROOT / cfg)]
    cmd += ["--run-dir", str(run), *args.overrides]
    t = time.time()
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True)
    wall = time.time() - t
    if res.returncode != 0:
        print(res.stderr[-3000:])
        raise SystemExit(res.returncode)
    print("\n".join(line for line in res.stdout.splitlines() if not line.startswith("epoch")))
    print(f"process wall time {wall:.0f} s")
    print("\n".join(table(run, mean_goal, worst_goal, cfg)))
    if args.fresh:
        from bench import panel_expected

        print("")
        print("\n".join(panel_expected.expected(run, bars=args.fresh)))


if __name__ == "__main__":
    main()
