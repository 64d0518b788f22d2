"""Where the test suite's worker-seconds go (issue 27): run ``pytest`` with a measurement hook
in every process and print, for the slowest tests, their wall time split into JAX tracing,
lowering, backend compilation, persistent-cache loads, orbax saves/restores, the report (with
its plots) and the programs they start (count, wall, start-up until their first trace).

    python bench/suite_costs.py [--top 20] [--out DIR] [-- PYTEST_ARGS...]
    python bench/suite_costs.py --analyse DIR      # the table of an earlier measurement

Every Python process of the run gets ``bench/suite_costs`` first on ``PYTHONPATH``, whose
``sitecustomize.py`` records JAX's duration events (``jax.monitoring``) and times the wrapped
functions; ``suite_costs_plugin.py`` records each test's setup/call/teardown window. A
program a test starts is charged to that test (its parent is the test's worker and it starts
inside the test's window). Nested events of one kind (a jit traced inside another's trace)
are counted once (the union of their intervals). Columns are seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("trace", "lower", "compile", "cache_load", "orbax_save", "orbax_restore", "report")


def _union(intervals):
    total, end = 0.0, -1e300
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _clip(intervals, windows):
    out = []
    for a, b in intervals:
        for lo, hi in windows:
            x, y = max(a, lo), min(b, hi)
            if y > x:
                out.append((x, y))
    return out


def analyse(folder: Path, top: int) -> str:
    events = collections.defaultdict(list)  # pid -> events
    tests = collections.defaultdict(list)  # nodeid -> [(pid, t, t+dur)]
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # a process killed mid-line
            if path.name.startswith("tests-"):
                tests[e["test"]].append((e["pid"], e["t"], e["t"] + e["dur"]))
            else:
                events[e["pid"]].append(e)
    procs = {}
    for pid, evs in events.items():
        start = next((e for e in evs if e["kind"] == "start"), None)
        if start is None:
            continue
        last = max(e["t"] + (0.0 if e["kind"] == "end" else e["dur"]) for e in evs)
        traces = [e["t"] for e in evs if e["kind"] == "trace"]
        procs[pid] = {
            "ppid": json.loads(start["name"])["ppid"],
            "t0": start["t"],
            "t1": last,
            "startup": (min(traces) - start["t"]) if traces else last - start["t"],
            "killed": not any(e["kind"] == "end" for e in evs),
        }
    children = collections.defaultdict(list)
    for pid, p in procs.items():
        children[p["ppid"]].append(pid)

    def descendants(pid):
        out = []
        for c in children.get(pid, []):
            out += [c, *descendants(c)]
        return out

    rows = []
    for test, spans in tests.items():
        wall = sum(b - a for _, a, b in spans)
        pid = spans[0][0]
        windows = [(a, b) for _, a, b in spans]
        row = {"test": test, "wall": wall}
        sub = [c for c in descendants(pid) if any(lo <= procs[c]["t0"] <= hi for lo, hi in windows)]
        for kind in KINDS:
            mine = [(e["t"], e["t"] + e["dur"]) for e in events[pid] if e["kind"] == kind]
            total = _union(_clip(mine, windows))
            for c in sub:
                total += _union(
                    [(e["t"], e["t"] + e["dur"]) for e in events[c] if e["kind"] == kind]
                )
            row[kind] = total
        row["procs"] = len(sub)
        row["proc_wall"] = sum(procs[c]["t1"] - procs[c]["t0"] for c in sub)
        row["proc_startup"] = sum(procs[c]["startup"] for c in sub)
        rows.append(row)
    rows.sort(key=lambda r: -r["wall"])
    total_wall = sum(r["wall"] for r in rows)
    head = ["test", "wall", *KINDS, "procs", "proc_wall", "proc_startup"]
    lines = [
        f"{len(rows)} tests, {total_wall:.0f} worker-s in tests "
        f"(setup + call + teardown, summed over workers)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    fmt = lambda v: f"{v:.1f}" if isinstance(v, float) else str(v)
    for r in rows[:top]:
        lines.append("| " + " | ".join(fmt(r[h]) for h in head) + " |")
    sums = {k: sum(r[k] for r in rows) for k in head[1:]}
    lines.append("| all tests | " + " | ".join(fmt(sums[k]) for k in head[1:]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="folder for the raw events")
    p.add_argument("--analyse", type=Path, default=None, help="only print an earlier run's table")
    p.add_argument("pytest_args", nargs="*")
    args = p.parse_args(argv)
    if args.analyse:
        print(analyse(args.analyse, args.top))
        return 0
    folder = args.out or Path(tempfile.mkdtemp(prefix="suite_costs_"))
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["SUITE_COSTS_DIR"] = str(folder)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE / "suite_costs"), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "-p", "suite_costs_plugin", "--durations=0"]
    code = subprocess.call([*cmd, *args.pytest_args], env=env, cwd=HERE.parent)
    print(f"raw events: {folder}")
    print(analyse(folder, args.top))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
