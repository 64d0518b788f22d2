"""What a trained panel agent is worth per instrument in expectation, not on one test path.

    python bench/panel_expected.py RUN_DIR                 # 60,000 fresh bars per instrument
    python bench/panel_expected.py RUN_DIR --bars 100000 --seed-offset 1000

Issue 29 judges each instrument of the planted-signal panel on its own test split: 800-1,600
bars, where the agent's and the oracle's realised Sharpe ratios each have a standard error of
0.4-0.56. The test path is fixed by the config, so every run meets the same luck of that path: a
ratio that is low in every run may still be the path, not the agent. This script separates the
two. It walks the run's selected checkpoint (``python -m jaxdqn.evaluate RUN_DIR --split test``,
unchanged weights) over a *fresh* draw of every instrument from the same generator (same phi,
vol, drift; a different seed, ``--seed-offset`` added to the run's), ``--bars`` long, split
``--train-frac`` / ``--val-frac`` / rest so that the test split is long: the agent's features are
normalised on the fresh path's own train rows (as in every evaluation), the oracle's execution
is chosen on the fresh val rows. The ratio agent / oracle on that long test split is the
expected ratio of this checkpoint up to the printed standard error.

SE of the ratio a / o: the delta method over the two Sharpe standard errors (Lo 2002) as if
independent, sqrt(SE_a² + (a/o)² SE_o²) / |o|. The agent and the oracle trade the same bars,
so their errors are positively correlated and the printed SE is an upper bound.

The dates: every fresh instrument starts on 1700-01-01 (pandas timestamps end in 2262; 150,000
business days fit). The run's bar clock is unchanged (business days, 252 a year).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.panel_runs import instrument_phis, test_decisions  # noqa: E402
from jaxdqn.evaluation.metrics import sharpe_se  # noqa: E402
from jaxdqn.market.panel import instrument_settings  # noqa: E402

MAX_BARS = 150_000


def fresh_panel_overrides(
    run: Path, bars: int, seed_offset: int, train_frac: float, val_frac: float
) -> list[str]:
    """``key=value`` overrides that redraw every instrument of ``run``'s synthetic panel.

    Each instrument keeps its phi, vol and drift (as resolved in the run's config.yaml) and
    gets ``bars`` bars from 1700-01-01 with the seed ``run seed + seed_offset + 1 + i``.
    """
    from jaxdqn import config

    cfg = config.load(run / "config.yaml")
    syn = cfg.data.synthetic
    if cfg.data.source != "synthetic" or not syn.panel:
        raise SystemExit(f"{run}: not a synthetic panel run (data.source {cfg.data.source!r})")
    if not 1_000 <= bars <= MAX_BARS:
        raise SystemExit(f"--bars {bars}: must be in 1,000..{MAX_BARS:,} (pandas dates end 2262)")
    entries = []
    for i, inst in enumerate(syn.panel):
        own = instrument_settings(syn, i)
        entries.append(
            f"{{name: {inst.name}, phi: {own.phi!r}, vol: {own.vol!r}, drift: {own.drift!r}, "
            f"num_bars: {bars}, seed: {syn.seed + seed_offset + 1 + i}, "
            "start_date: '1700-01-01'}"
        )
    return [
        "data.split=fraction",
        f"data.train_frac={train_frac}",
        f"data.val_frac={val_frac}",
        "data.synthetic.panel=[" + ", ".join(entries) + "]",
    ]


def table(metrics: dict, phis: dict[str, float], bars: dict[str, int], ppy: float) -> list[str]:
    """One row per instrument and the signal instruments' mean and worst ratio, on the fresh
    test split (``bars``: each instrument's test decisions)."""
    lines = [
        "| instrument | phi | agent test Sharpe | oracle | % oracle | SE of % (upper) | "
        "agent turnover | random turnover |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    signal = []
    for name, e in metrics["instruments"].items():
        agent = e["test"]["sharpe"]
        oracle = e["baselines"]["oracle"]["test"]["sharpe"]
        n = bars[name]
        se_a, se_o = sharpe_se(agent, n, ppy), sharpe_se(oracle, n, ppy)
        if phis[name] != 0:
            ratio = agent / oracle
            se = math.hypot(se_a, ratio * se_o) / abs(oracle)
            signal.append((name, agent, oracle, ratio, se))
            pct = f"{100 * ratio:.1f} %"
            spct = f"{100 * se:.1f}"
        else:
            pct, spct = "no signal", "-"
        lines.append(
            f"| {name} | {phis[name]:.2f} | {agent:.3f} | {oracle:.3f} | {pct} | {spct} | "
            f"{e['test']['annual_turnover']:.1f} | "
            f"{e['baselines']['random']['test']['annual_turnover']:.1f} |"
        )
    if signal:
        mean = sum(r[1] for r in signal) / sum(r[2] for r in signal)
        worst = min(signal, key=lambda r: r[3])
        lines += [
            "",
            f"signal instruments ({len(signal)}): mean agent / mean oracle {100 * mean:.1f} %; "
            f"worst {worst[0]} {100 * worst[3]:.1f} % (SE ≤ {100 * worst[4]:.1f}); "
            f"{min(bars.values()):,} test bars each (one Sharpe's SE ≈ "
            f"{sharpe_se(0.0, min(bars.values()), ppy):.3f})",
        ]
    return lines


def expected(
    run: Path,
    bars: int = 60_000,
    seed_offset: int = 1000,
    train_frac: float = 0.15,
    val_frac: float = 0.05,
    out: Path | None = None,
) -> list[str]:
    """Evaluate ``run``'s selected checkpoint on the fresh panel and return the table's lines
    (the evaluation's files go to ``out``, default ``RUN_DIR/expected``)."""
    out = out or run / "expected"
    overrides = fresh_panel_overrides(run, bars, seed_offset, train_frac, val_frac)
    cmd = [sys.executable, "-m", "jaxdqn.evaluate", str(run), "--split", "test"]
    cmd += ["--out", str(out), *overrides]
    t = time.time()
    res = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ), capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-3000:])
        raise SystemExit(res.returncode)
    wall = time.time() - t
    metrics = json.loads((out / "metrics_test.json").read_text())
    phis = instrument_phis(run / "config.yaml")
    ppy = json.loads((run / "summary.json").read_text())["bar_clock"]["bars_per_year"]
    counts = test_decisions(out / "eval_test.csv")
    head = (
        f"run {run}: checkpoint {metrics.get('checkpoint_step')}; fresh paths of {bars:,} "
        f"bars (seed offset {seed_offset}), evaluate took {wall:.0f} s"
    )
    return [head, *table(metrics, phis, counts, ppy)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--bars", type=int, default=60_000)
    parser.add_argument("--seed-offset", type=int, default=1000)
    parser.add_argument("--train-frac", type=float, default=0.15)
    parser.add_argument("--val-frac", type=float, default=0.05)
    parser.add_argument("--out", type=Path, default=None, help="default RUN_DIR/expected")
    a = parser.parse_args()
    lines = expected(a.run_dir, a.bars, a.seed_offset, a.train_frac, a.val_frac, a.out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
