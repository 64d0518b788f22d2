"""Behaviour check for refactors: the smoke runs must reproduce recorded numbers bit for bit.

    python bench/same_numbers.py                 # run both commands, compare with bench/reference
    python bench/same_numbers.py --runs DIR      # keep the run directories in DIR
    python bench/same_numbers.py --record        # re-record bench/reference from this code
    python bench/same_numbers.py kernels.fused=reference   # extra overrides for both runs
    python bench/same_numbers.py --reference DIR [--record]   # compare with / record into DIR

Runs, on the CPU (JAX_PLATFORMS=cpu):

1. ``python -m jaxdqn.train --config configs/smoke.yaml seed=3``
2. ``python -m jaxdqn.train --config configs/smoke.yaml seed=3 train.num_seeds=2``

and compares ``metrics.jsonl``, ``summary.json``, ``eval_val.csv`` and ``eval_test.csv`` with
the files recorded in ``bench/reference/`` (re-recorded with ``--record`` after a deliberate
change of numerics; the current recording: 2026-12-05, jax 0.10.2, numpy 2.4.6 and arch 8.0.0
on the CPU, commit b2889f6: every number equal to the 2026-12-03 recording of issue 28's bar
clock (itself bit-identical to commit b2d1c09's numbers) but the stationary bootstrap's
``block_length``, which these arch / numpy versions move in the 16th digit, before and after
that commit's code changes alike). Every number must be identical (floats compared exactly,
NaN equal to NaN), except wall-clock quantities (:data:`TIMING_KEYS`) and the provenance
(:data:`SKIPPED_KEYS`). Metric keys renamed since the recording are mapped by :data:`RENAMED`;
a key that exists on one side only is a difference. Prints one table row per file and exits 1
on any difference.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "bench" / "reference"
RUNS = {
    "smoke_seed3": ["--config", "configs/smoke.yaml", "seed=3"],
    "smoke_2seeds": ["--config", "configs/smoke.yaml", "seed=3", "train.num_seeds=2"],
}
FILES = ("metrics.jsonl", "summary.json", "eval_val.csv", "eval_test.csv")
TIMING_KEYS = {"wall_time", "wall_time_s", "env_steps_per_s", "updates_per_s"}
#: Keys that describe the run rather than its numbers (the commit and config hash change with
#: every commit and every new config key); skipped like the timing keys.
SKIPPED_KEYS = {"provenance"}
#: old key -> new key (None: the old key was a duplicate of another and is gone).
RENAMED: dict[str, str | None] = {"learning_rate": None}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return diff_dicts(a, b) == []
    return a == b


def diff_dicts(ref: dict, new: dict, where: str = "") -> list[str]:
    """Keys whose values differ (timing keys skipped, renamed keys mapped)."""
    out = []
    mapped = {}
    for k, v in ref.items():
        k2 = RENAMED.get(k, k)
        if k2 is not None:
            mapped[k2] = v
    for k in sorted(set(mapped) | set(new)):
        if k in TIMING_KEYS or k in SKIPPED_KEYS:
            continue
        if k not in mapped or k not in new:
            out.append(f"{where}{k}: only in {'new' if k in new else 'reference'}")
        elif not _same(mapped[k], new[k]):
            out.append(f"{where}{k}: {mapped[k]!r} != {new[k]!r}")
    return out


def compare(ref_dir: Path, run_dir: Path) -> dict[str, list[str]]:
    result = {}
    for name in FILES:
        a, b = ref_dir / name, run_dir / name
        if not b.exists():
            result[name] = ["missing in the new run"]
            continue
        if name.endswith(".jsonl"):
            ra = [json.loads(x) for x in a.read_text().splitlines() if x.strip()]
            rb = [json.loads(x) for x in b.read_text().splitlines() if x.strip()]
            diffs = [] if len(ra) == len(rb) else [f"{len(ra)} vs {len(rb)} records"]
            for i, (x, y) in enumerate(zip(ra, rb, strict=False)):
                diffs += diff_dicts(x, y, f"record {i}: ")
        elif name.endswith(".json"):
            diffs = diff_dicts(json.loads(a.read_text()), json.loads(b.read_text()))
        else:
            fa, fb = pd.read_csv(a), pd.read_csv(b)
            try:
                pd.testing.assert_frame_equal(fa, fb, check_exact=True)
                diffs = []
            except AssertionError as e:
                diffs = [" ".join(str(e).split())[:300]]
        result[name] = diffs
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=None, help="directory for the run directories")
    parser.add_argument(
        "--record", action="store_true", help="write this code's files into bench/reference"
    )
    parser.add_argument(
        "--reference",
        default=str(REFERENCE),
        help="recorded files to compare with (default bench/reference; e.g. a folder that "
        "another checkout's --record --reference DIR wrote, to compare two versions of the "
        "code on one machine)",
    )
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for both runs")
    args = parser.parse_args()
    base = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="same_numbers_"))
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    reference = Path(args.reference).resolve()
    rows, failed = [], False
    for name, argv in RUNS.items():
        run_dir = base / name
        cmd = [sys.executable, "-m", "jaxdqn.train", *argv, *args.overrides]
        cmd += ["--run-dir", str(run_dir)]
        proc = subprocess.run([*cmd, "--no-progress"], cwd=ROOT, env=env, capture_output=True)
        if proc.returncode != 0:
            print(proc.stderr.decode()[-2000:], file=sys.stderr)
            rows.append((name, "(run)", f"exit code {proc.returncode}"))
            failed = True
            continue
        if args.record:
            (reference / name).mkdir(parents=True, exist_ok=True)
            for file in FILES:
                (reference / name / file).write_bytes((run_dir / file).read_bytes())
            rows.append((name, "(all)", "recorded"))
            continue
        for file, diffs in compare(reference / name, run_dir).items():
            failed |= bool(diffs)
            rows.append((name, file, "identical" if not diffs else f"{len(diffs)} differences"))
            for d in diffs[:10]:
                print(f"  {name}/{file}: {d}")
    print(f"\n{'run':<14} {'file':<15} result")
    for r in rows:
        print(f"{r[0]:<14} {r[1]:<15} {r[2]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
