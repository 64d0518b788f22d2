"""Issue 12 levers, before against after in one run: learner µs per update and trace summary.

    python bench/levers.py --before DIR                  # learner and cache parts
    python bench/levers.py --parts acting,cache          # any of learner, acting, cache
    python bench/levers.py --before DIR --parts learner,acting --also "kernels.fused=reference"

``learner`` (with ``--before DIR``, a checkout of the code before the levers; without it, this
checkout alone, e.g. to compare switches with ``--also``): each variant runs
``bench/trace_update.py`` (configs/gpu.yaml sizes, B = 4,096, every component on, 10 updates per
call) in its own process, because XLA reads ``XLA_FLAGS`` once per process:

- ``before`` / ``after``: the code in ``--before`` and this checkout;
- ``flags off`` / ``flags on``: without and with :data:`jaxdqn.program.launch.runtime.GPU_XLA_FLAGS`
  (command buffers with concurrent regions); ``--flags on`` runs the second alone;
- ``--also "k=v ..."`` (repeatable): this checkout with those config overrides, flags on;
  a ``--xla_...`` token in it is an XLA flag added to that variant's process (after the GPU
  flags), e.g. ``--also "kernels.matmul=bf16 --xla_gpu_enable_triton_gemm=false"`` (a variant
  of XLA flags alone: ``"--also=--xla_…"``, else the shell word reads as an option).
  The "GPU busy" column is ``trace_update.py``'s: of the traced program, which XLA runs without
  command buffers unless the variant's flags hold
  ``--xla_enable_command_buffers_during_profiling=true``.

``--components off``: every component off (``config.ALL_OFF``) instead of on, in every part.

``acting``: acting env steps/s at E = 65,536 (``--envs``: others, e.g. ``4096,65536`` for a
single run's and a 16-member population's rows a step), every component on: with ``--before``,
before / after / each ``--also`` variant with the flags on; without, this checkout with each
``--flags`` setting and each ``--also`` variant (flags on); each variant at each E.

``cache``: the same short training run (gpu.yaml, 1 epoch × 2 iterations)
twice with one fresh cache folder; the time from the process start to the end of epoch 1 (the
``elapsed`` of the epoch line) of the cold and of the warm run. Prints a table last.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn.program.launch.runtime import GPU_XLA_FLAGS  # noqa: E402


def variant(also: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """An ``--also`` string as (config overrides, extra XLA flags: its ``--xla_`` tokens)."""
    tokens = also.split()
    return (
        tuple(t for t in tokens if not t.startswith("--xla_")),
        tuple(t for t in tokens if t.startswith("--xla_")),
    )


def xla_env(flags: bool, xla: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment with ``XLA_FLAGS`` = the GPU flags (when ``flags``) + ``xla``."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = " ".join((*(GPU_XLA_FLAGS if flags else ()), *xla))
    return env


def trace_variant(
    root: Path,
    flags: bool,
    updates: int,
    overrides: tuple[str, ...] = (),
    top: int = 40,
    components: str = "on",
    xla: tuple[str, ...] = (),
) -> dict[str, str]:
    env = xla_env(flags, xla)
    cmd = [sys.executable, str(root / "bench" / "trace_update.py"), "--calls", "2"]
    cmd += ["--updates", str(updates), "--top", str(top), *overrides]
    if components != "on":  # (a --before checkout may predate --components)
        cmd += ["--components", components]
    res = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    out = res.stdout
    if res.returncode != 0:
        print(res.stderr[-3000:], file=sys.stderr)
        return {"µs/update": f"failed ({res.returncode})"}
    print(out, flush=True)
    timed = re.search(r"timed \(untraced\): (\d+) µs per update", out)
    traced = re.search(r"traced: (\d+) kernels per update.*GPU busy ([\d.]+%)", out)
    return {
        "µs/update": timed.group(1) if timed else "?",
        "kernels/update": traced.group(1) if traced else "?",
        "GPU busy": traced.group(2) if traced else "?",
    }


ACTING = """
import sys
sys.path.insert(0, {root!r})
from bench.iteration import bench_acting
from jaxdqn import config
from jaxdqn.market import market
base = {root!r} + "/configs/gpu.yaml"
extra = [*config.{switches}, *{overrides!r}]
row = bench_acting(base, extra, {envs}, 16, market.prepare(config.load(base)), 5)
print(f"ACTING {{row['env_steps_s']:.4e}}")
"""


def acting_variant(
    root: Path,
    flags: bool,
    overrides: tuple[str, ...] = (),
    xla: tuple[str, ...] = (),
    components: str = "on",
    envs: int = 65536,
) -> str:
    """Acting env steps/s at E = ``envs`` (16 steps per call, every component on or off)."""
    env = xla_env(flags, xla)
    switches = "ALL_ON" if components == "on" else "ALL_OFF"
    code = ACTING.format(
        root=str(root), overrides=list(overrides), switches=switches, envs=int(envs)
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    m = re.search(r"ACTING (\S+)", res.stdout)
    if not m:
        print(res.stderr[-3000:], file=sys.stderr)
    return m.group(1) if m else "failed"


def first_epoch_seconds(cache: Path, run_dir: Path) -> tuple[float, float]:
    """(process start → end of epoch 1 as the log's elapsed + startup, total wall) of one
    short gpu.yaml run with the cache folder ``cache``."""
    cmd = [sys.executable, "-m", "jaxdqn.train", "--config", "configs/gpu.yaml", "--no-progress"]
    cmd += ["--compile-cache", str(cache), "--run-dir", str(run_dir)]
    cmd += ["train.epochs=1", "train.iterations_per_epoch=2", "replay.capacity=262144"]
    t0 = time.perf_counter()
    # the epoch lines go to stderr (the progress stream)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    epoch_end = float("nan")
    for line in proc.stdout:
        if line.startswith("epoch 1/") and epoch_end != epoch_end:
            epoch_end = time.perf_counter() - t0
            print(line.rstrip(), flush=True)
    proc.wait()
    return epoch_end, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default=None, help="checkout of the code before the levers")
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--parts", default="learner,cache", help="any of learner, acting, cache")
    ap.add_argument("--flags", default="off,on", help="XLA flag settings of the learner rows")
    ap.add_argument(
        "--components",
        choices=("on", "off"),
        default="on",
        help="every component on (config.ALL_ON) or off (config.ALL_OFF)",
    )
    ap.add_argument(
        "--envs",
        default="65536",
        help="acting: environments, comma-separated (each variant is measured at each)",
    )
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        help="extra variant of this checkout (flags on): space-separated key=value overrides",
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts - {"learner", "acting", "cache"}:
        ap.error(f"--parts: unknown {sorted(parts - {'learner', 'acting', 'cache'})}")
    settings = args.flags.split(",")
    try:
        envs = [int(e) for e in args.envs.split(",")]
    except ValueError:
        ap.error(f"--envs: {args.envs!r} is not a list of integers")
    if set(settings) - {"off", "on"}:
        ap.error(f"--flags: {args.flags!r} is not a list of off, on")
    rows = []
    if "learner" in parts:
        # resolved: each variant runs with its own checkout as the working directory
        roots = [("this", ROOT)]
        if args.before:
            roots = [("before", Path(args.before).resolve()), ("after", ROOT)]
        for label, root in roots:
            for flags in (s == "on" for s in settings):
                r = trace_variant(root, flags, args.updates, components=args.components)
                rows.append((label, "on" if flags else "off", r))
        for extra in args.also:
            overrides, xla = variant(extra)
            r = trace_variant(
                ROOT, True, args.updates, overrides, top=0, components=args.components, xla=xla
            )
            rows.append((f"{roots[-1][0]} {extra}", "on", r))
    acting_rows = []
    if "acting" in parts:
        # with --before: before and after (flags on); without: this checkout, flags off and on
        for n in envs:
            act = functools.partial(acting_variant, components=args.components, envs=n)
            if args.before:
                before = Path(args.before).resolve()
                rows_n = [("before", "on", act(before, True)), ("after", "on", act(ROOT, True))]
                rows_n += [(f"after {e}", "on", act(ROOT, True, *variant(e))) for e in args.also]
            else:
                rows_n = [("this", f, act(ROOT, f == "on")) for f in settings]
                rows_n += [(f"this {e}", "on", act(ROOT, True, *variant(e))) for e in args.also]
            acting_rows += [(n, *r) for r in rows_n]
    cache_rows = []
    if "cache" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(tmp) / "cache"
            for which in ("cold", "warm"):
                cache_rows.append((which, *first_epoch_seconds(cache, Path(tmp) / which)))
    import jax

    print()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; learner B = 4,096, "
          f"gpu.yaml sizes, every component {args.components}; {args.updates} updates per "
          f"call")  # fmt: skip
    width = max([8] + [len(r[0]) for r in rows])
    print(f"{'code':<{width}} {'XLA flags':<10} {'µs/update':>10} {'updates/s':>10} "
          f"{'kernels/upd':>12} {'GPU busy':>9}")  # fmt: skip
    for label, flags, r in rows:
        us = r.get("µs/update", "?")
        ups = f"{1e6 / float(us):,.0f}" if us.isdigit() else "?"
        print(f"{label:<{width}} {flags:<10} {us:>10} {ups:>10} "
              f"{r.get('kernels/update', '?'):>12} {r.get('GPU busy', '?'):>9}")  # fmt: skip
    for n, label, flags, sps in acting_rows:
        print(f"acting E = {n:,}, every component {args.components}, {label}, XLA flags {flags}: "
              f"{sps} env steps/s")  # fmt: skip
    for which, epoch_end, total in cache_rows:
        print(f"compile cache {which}: end of epoch 1 after {epoch_end:.1f} s, "
              f"run {total:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
