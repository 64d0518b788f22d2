"""Issue 30's acceptance on this machine: ``predict --at D`` for every test date of a smoke run
against its ``eval_test.csv``, the exported policy's actions on the walk's observations, and
the wall time of ``python -m jaxdqn.predict`` (cold, then with a warm compilation cache).

    python bench/predict_check.py [--run RUN_DIR]    # default: trains configs/smoke.yaml
                                                      # (1 epoch, 2 seeds) into a temp folder

Prints a table last.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BRANCHES = ["direction", "magnitude", "order", "urgency"]


def _cli(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp())
    run_dir = Path(args.run) if args.run else tmp / "smoke"
    rows = []
    if args.run is None:
        wall = _cli(
            "jaxdqn.train",
            "--config",
            str(ROOT / "configs/smoke.yaml"),
            "--run-dir",
            str(run_dir),
            "train.epochs=1",
            "train.num_seeds=2",
        )
        rows.append(("train the smoke run (1 epoch, 2 seeds)", f"{wall:.1f} s"))
    cli = ("jaxdqn.predict", str(run_dir), "--json", "--compile-cache", str(tmp / "cache"))
    rows.append(("predict CLI, cold compilation cache", f"{_cli(*cli):.2f} s"))
    warm = [_cli(*cli) for _ in range(3)]
    rows.append(("predict CLI, warm cache (median of 3)", f"{np.median(warm):.2f} s"))

    import jax

    from jaxdqn.program.trained import export as export_policy
    from jaxdqn.program.trained import load
    from jaxdqn.program.trained import predict as predict_run

    run = load.load_run(run_dir)
    predictor = predict_run.make_run_predictor(run)
    log = pd.read_csv(run_dir / "eval_test.csv")
    bars = load.read_bars(run, None)
    view = run.views[0]
    dates = pd.DatetimeIndex(view.bars.index)
    start = time.perf_counter()
    got = {}
    for t in sorted(log.t.unique()):
        for r in predict_run.predict(
            run, bars, predict_run.parse_at(str(dates[t])), None, predictor
        ):
            got[(r["seed"], t)] = ([*r["actions"].values()], np.float32(r["target_position"]))
    each = (time.perf_counter() - start) / log.t.nunique()
    act_bad = sum(
        got[(s, t)][0] != [int(x) for x in row]
        for s, t, *row in log[["seed", "t", *BRANCHES]].values
    )
    tgt_bad = sum(
        got[(int(s), int(t))][1] != np.float32(p)
        for s, t, p in log[["seed", "t", "target_position"]].values
    )
    mine = np.array([got[(int(s), int(t))][1] for s, t in log[["seed", "t"]].values], np.float32)
    theirs = log.target_position.to_numpy(np.float32)
    ulps = np.abs(mine.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
    rows.append(("test decisions checked (seeds x dates)", str(len(log))))
    rows.append(("predict --at D: actions differing from eval_test.csv", str(act_bad)))
    rows.append(("predict --at D: float32 target positions differing", str(tgt_bad)))
    rows.append(("predict --at D: max target difference", f"{np.abs(mine - theirs).max():.2e}"))
    rows.append(("predict --at D: max target difference in float32 ulps", str(int(ulps.max()))))
    rows.append(("predict in process, per date (both seeds)", f"{1e3 * each:.1f} ms"))
    again = tmp / "evaluate_again"
    _cli(
        "jaxdqn.evaluate",
        str(run_dir),
        "--split",
        "test",
        "--out",
        str(again),
        "--no-compile-cache",
    )
    redo = pd.read_csv(again / "eval_test.csv")
    same = redo.target_position.to_numpy(np.float32) != theirs
    rows.append(
        (
            "evaluate, walk recompiled (no cache): targets differing from eval_test",
            str(int(same.sum())),
        )
    )

    out = tmp / "export"
    export_policy.export_run(run_dir, out)
    ts = sorted(log.t.unique())[::10]
    bad, diff = 0, 0.0
    for seed in range(run.cfg.train.num_seeds):
        obs = [
            predict_run.decide(run, {view.name: view.bars.iloc[: t + 1]}, None, (seed,), predictor)[
                0
            ][0]
            .by_seed[seed]
            .obs
            for t in ts
        ]
        actions, target, _, _ = export_policy.load_exported(out, seed)(np.stack(obs))
        want = log[log.seed == seed].set_index("t").loc[ts]
        bad += int((np.asarray(actions) != want[BRANCHES].to_numpy()).any(axis=1).sum())
        diff = max(diff, float(np.abs(np.asarray(target) - want.target_position.to_numpy()).max()))
    checked = len(ts) * run.cfg.train.num_seeds
    rows.append(("export: decisions checked (every 10th test date x seeds)", str(checked)))
    rows.append(("export: actions differing from eval_test.csv", str(bad)))
    rows.append(("export: max |target position difference|", f"{diff:.2e}"))
    dev = jax.devices()[0]
    print(f"\n{dev.device_kind} ({dev.platform}), jax {jax.__version__}")
    print("| check | value |\n| --- | ---: |")
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
