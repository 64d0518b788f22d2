"""Issue 16: are two runs of the same command bit-identical, and what does it cost?

Runs ``python -m jaxdqn.train`` several times per variant in fresh processes, each with
``--no-compile-cache`` (every run compiles and autotunes afresh: the strict case), and compares
``metrics.jsonl`` (minus wall-clock fields), ``summary.json`` (minus wall times and the
run-specific provenance) and the CRC-32 of every leaf of every checkpoint (recorded by the
checkpointer at save time). Variants:

* ``off``   — ``train.deterministic=false`` (scatter-add C51 projection);
* ``on``    — ``train.deterministic=true`` (the deterministic formulations);
* ``xla``   — ``train.deterministic=false`` with ``--xla_gpu_deterministic_ops=true`` (XLA's
  global switch; the cost reference of the issue);
* ``on_cached`` — ``on`` with one fresh compilation cache: the first run compiles, the others
  load its executables (what a user's repeated command does, the cache being on by default);
* ``on_untuned`` — ``on`` with ``--xla_gpu_autotune_level=0`` (no timing-based choices).

Throughput: the median over epochs 2.. of ``updates_per_s`` and ``env_steps_per_s`` of each run
(epoch 1 holds the compilation). Prints a table last.

    python bench/determinism.py [--runs 2] [--xla-runs 1] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VOLATILE = ("wall_time", "env_steps_per_s", "updates_per_s")
BASE = [
    "--config",
    str(ROOT / "configs" / "synthetic_gpu.yaml"),
    "train.epochs=3",
    "train.iterations_per_epoch=8",
    "train.num_seeds=1",
]


def run(out: Path, name: str, overrides: list[str], xla_flags: str = "", cache=None) -> dict:
    env = dict(os.environ)
    if xla_flags:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    cached = ["--compile-cache", str(cache)] if cache else ["--no-compile-cache"]
    cmd = [sys.executable, "-m", "jaxdqn.train", "--no-progress", *cached]
    cmd += [*BASE, *overrides, "--run-dir", str(out / name)]
    t0 = time.time()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        raise SystemExit(f"{name}: exit {res.returncode}")
    return {"dir": out / name, "wall_s": wall}


def fingerprint(run_dir: Path) -> dict:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in lines]
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("wall_time_s", "provenance"):
        summary.pop(key, None)
    crcs = {}
    for meta in sorted((run_dir / "checkpoints").glob("*/meta/metadata")):
        crcs[meta.parent.parent.name] = [leaf[3] for leaf in json.loads(meta.read_text())["leaves"]]
    full = [json.loads(x) for x in lines]
    return {
        "records": json.dumps(records, sort_keys=True),
        "summary": json.dumps(summary, sort_keys=True),
        "crcs": crcs,
        "updates_per_s": float(np.median([r["updates_per_s"] for r in full[1:]])),
        "env_steps_per_s": float(np.median([r["env_steps_per_s"] for r in full[1:]])),
        "test_sharpe": summary["test"]["sharpe"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2, help="runs of the off and on variants")
    ap.add_argument("--xla-runs", type=int, default=1, help="runs with XLA's global flag")
    ap.add_argument("--out", default="/tmp/jaxdqn_determinism")
    ap.add_argument(
        "--variants",
        default="off,on,xla",
        help="any of off, on, xla, on_cached, on_untuned, on_tuned_cache",
    )
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import jax

    dev = jax.devices()[0]
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {dev.device_kind}", flush=True)
    on, off = ["train.deterministic=true"], ["train.deterministic=false"]
    variants = {  # overrides, extra XLA flags, runs, compile cache shared by the runs
        "off": (off, "", args.runs, None),
        "on": (on, "", args.runs, None),
        "xla": (off, "--xla_gpu_deterministic_ops=true", args.xla_runs, None),
        # the first run compiles and fills a fresh cache folder, the others load from it
        "on_cached": (on, "", args.runs, out / "cache_on"),
        # no autotuning: XLA's default GEMM/fusion configurations, the same at every compile
        "on_untuned": (on, "--xla_gpu_autotune_level=0", args.runs, None),
        # fresh compiles that share XLA's per-fusion autotuning results (first run writes them)
        "on_tuned_cache": (
            on,
            f"--xla_gpu_per_fusion_autotune_cache_dir={out / 'autotune'}",
            args.runs,
            None,
        ),
    }
    variants = {k: variants[k] for k in args.variants.split(",")}
    rows = []
    for name, (ov, flags, count, cache) in variants.items():
        prints = []
        for k in range(count):
            r = run(out, f"{name}_{k}", [*ov, *args.overrides], flags, cache)
            fp = fingerprint(r["dir"])
            prints.append(fp)
            print(
                f"{name} run {k}: {r['wall_s']:.0f} s, updates/s {fp['updates_per_s']:.0f}, "
                f"env steps/s {fp['env_steps_per_s']:.3g}, test Sharpe {fp['test_sharpe']!r}",
                flush=True,
            )
        same = lambda key, prints=prints: all(p[key] == prints[0][key] for p in prints[1:])
        rows.append(
            (
                name,
                count,
                same("records") if count > 1 else None,
                same("summary") if count > 1 else None,
                same("crcs") if count > 1 else None,
                float(np.median([p["updates_per_s"] for p in prints])),
                float(np.median([p["env_steps_per_s"] for p in prints])),
                [p["test_sharpe"] for p in prints],
            )
        )
    off_ups = rows[0][5]  # the first variant is the reference of the ratios
    print(
        "\n| variant | runs | metrics.jsonl equal | summary equal | checkpoints equal | "
        "updates/s | env steps/s | vs off | test Sharpe per run |"
    )
    print("|---|---:|---|---|---|---:|---:|---:|---|")
    for name, count, rec, summ, ck, ups, eps, sharpes in rows:
        fmt = lambda b: "–" if b is None else ("yes" if b else "**no**")
        print(
            f"| {name} | {count} | {fmt(rec)} | {fmt(summ)} | {fmt(ck)} | {ups:.0f} | {eps:.3g} "
            f"| {ups / off_ups:.3f} | {', '.join(repr(s) for s in sharpes)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
