"""Issues 13 and 15: how the training iteration scales over the GPUs of one host.

    python bench/scale.py                                  # every device count 1, 2, 4, 8 seen
    python bench/scale.py --devices 1,2 --seeds 8          # issue 13's two-GPU rows
    python bench/scale.py --trace DIR                      # + a trace of the widest data row
    python bench/scale.py --tiny                           # smoke sizes (a CPU check, with
        XLA_FLAGS=--xla_force_host_platform_device_count=4)

Everything runs the program ``python -m jaxdqn.train`` runs (``program.placement.place``: the
iteration under ``shard_map`` over the ``("seed", "data")`` mesh, state donated), at
``configs/gpu.yaml`` sizes with every component on:

- **population**: S seeds (``--seeds``) over d devices, ``train.mesh=seed`` (S/d seeds per
  device, no communication but the metrics): iterations/s, and the speed-up over the smallest
  device count of the run (goal, issue 13: 8 seeds ≥ 1.9× on 2 GPUs; issue 15: ≥ 7× on 8);
- **data**: one agent over d devices, ``train.mesh=data``, with the environments, the global
  batch, the replay capacity and ``learning_starts`` scaled by d (each device keeps the
  one-GPU share): learner rows/s (updates/s × global batch), updates/s and env steps/s, and the
  speed-up of rows/s (goal: ≥ 1.7× on 2 GPUs, ≥ 6× on 8).

Each configuration is built, initialised and run twice (compilation; the replay passes
``learning_starts`` in the first iteration, so the second and every timed one learn), then
``--iters`` iterations are timed one by one (each blocks on its result); the median is quoted.
``--trace DIR`` records a ``jax.profiler`` trace of two iterations of the widest data-parallel
row and prints, per device, the kernel time, the all-reduce kernels' time (NCCL) and their share.
Prints a table last.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn import config  # noqa: E402
from jaxdqn.agent.build import build_agent  # noqa: E402
from jaxdqn.market import market as market_lib  # noqa: E402
from jaxdqn.program.run.placement import place  # noqa: E402


def sizes(tiny: bool) -> dict[str, int]:
    if tiny:
        return {"envs": 16, "batch": 32, "capacity": 4096, "starts": 256}
    return {"envs": 4096, "batch": 4096, "capacity": 1_048_576, "starts": 65_536}


def overrides(kind: str, devices: int, seeds: int, tiny: bool) -> list[str]:
    s = sizes(tiny)
    k = devices if kind == "data" else 1  # data-parallel: every size per device kept
    return [
        *config.ALL_ON,
        f"train.num_seeds={seeds}",
        f"train.devices={devices}",
        f"train.mesh={'data' if kind == 'data' else 'seed'}",
        f"acting.num_envs={s['envs'] * k}",
        f"replay.batch_size={s['batch'] * k}",
        f"replay.capacity={s['capacity'] * k}",
        f"replay.learning_starts={s['starts'] * k}",
    ]


def measure(base: str, kind: str, devices: int, seeds: int, args) -> dict:
    cfg = config.load(base, overrides(kind, devices, seeds, args.tiny))
    prepared = market_lib.prepare(cfg)
    placed = place(cfg, prepared, build_agent(cfg, prepared))
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), seeds)
    state = placed.init(placed.market, keys)
    t0 = time.perf_counter()
    for _ in range(2):  # compilation, then the first learning iteration
        state, metrics = placed.iterate(state, placed.market)
        jax.block_until_ready((state, metrics))
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        state, metrics = placed.iterate(state, placed.market)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t)
    trace = None
    if args.trace and kind == "data" and devices == max(args.device_counts) and devices > 1:
        trace = trace_all_reduce(placed, state, Path(args.trace))
    sec = statistics.median(times)
    updates = cfg.optim.updates
    steps = cfg.acting.num_envs * cfg.acting.steps * seeds
    return {
        "kind": kind,
        "devices": devices,
        "seeds": seeds,
        "s_per_iter": sec,
        "spread": (min(times), max(times)),
        "iters_per_s": 1.0 / sec,
        "updates_per_s": updates * seeds / sec,
        "rows_per_s": updates * seeds * cfg.replay.batch_size / sec,
        "env_steps_per_s": steps / sec,
        "warm_s": warm_s,
        "batch": cfg.replay.batch_size,  # global (data: the d devices' rows together)
        "envs": cfg.acting.num_envs,
        "trace": trace,
    }


def trace_all_reduce(placed, state, out: Path) -> list[tuple[str, float, float, int]]:
    """(device line, kernel µs per iteration, all-reduce µs per iteration, all-reduce kernels
    per iteration) per GPU of two traced iterations; the raw trace stays under ``out``."""
    from bench.trace_update import gpu_events

    out.mkdir(parents=True, exist_ok=True)
    calls = 2
    with jax.profiler.trace(str(out), create_perfetto_trace=True):
        for _ in range(calls):
            state, metrics = placed.iterate(state, placed.market)
            jax.block_until_ready((state, metrics))
    kernels, _ = gpu_events(out)
    per: dict[int, list[float]] = {}
    for e in kernels:
        name = e.get("name", "").lower()
        row = per.setdefault(e["pid"], [0.0, 0.0, 0])
        row[0] += float(e["dur"])
        if "nccl" in name or "all-reduce" in name or "allreduce" in name:
            row[1] += float(e["dur"])
            row[2] += 1
    return [
        (f"pid {pid}", tot / calls, ar / calls, n // calls)
        for pid, (tot, ar, n) in sorted(per.items())
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", default=None, help="device counts (default: 1, 2, 4, 8 seen)")
    ap.add_argument("--seeds", default="8,16,32", help="population sizes")
    ap.add_argument("--parts", default="population,data", help="population and/or data")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per configuration")
    ap.add_argument("--trace", default=None, help="trace the widest data-parallel row here")
    ap.add_argument("--tiny", action="store_true", help="smoke sizes (a CPU check)")
    args = ap.parse_args()
    seen = jax.device_count()
    counts = [int(x) for x in args.devices.split(",")] if args.devices else [1, 2, 4, 8]
    args.device_counts = [d for d in counts if d <= seen]
    if not args.device_counts:
        raise SystemExit(f"--devices {counts}: only {seen} device(s) visible")
    skipped = sorted(set(counts) - set(args.device_counts))
    parts = args.parts.split(",")
    if set(parts) - {"population", "data"}:
        raise SystemExit(f"--parts: {args.parts!r} is not a list of population, data")
    seeds = [int(x) for x in args.seeds.split(",")]
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    dev = jax.devices()[0]
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {seen} x {dev.device_kind}")
    rows = []
    for kind in parts:
        for d in args.device_counts:
            for s in seeds if kind == "population" else [1]:
                if kind == "population" and s % d:
                    print(f"population {s} seeds on {d} devices: not divisible, skipped")
                    continue
                r = measure(base, kind, d, s, args)
                rows.append(r)
                print(
                    f"{kind} d={d} S={s}: {r['s_per_iter'] * 1e3:.1f} ms/iteration "
                    f"(min {r['spread'][0] * 1e3:.1f}, max {r['spread'][1] * 1e3:.1f}; "
                    f"first two {r['warm_s']:.1f} s), {r['rows_per_s']:.3g} rows/s",
                    flush=True,
                )
    if skipped:
        print(f"device counts not run (only {seen} visible): {skipped}")
    for r in rows:
        if r["trace"]:
            print(f"\ntrace of data-parallel d={r['devices']} (µs per iteration, per GPU):")
            print("| device | kernel time | all-reduce | all-reduce kernels | share |")
            print("|---|---:|---:|---:|---:|")
            for line, tot, ar, n in r["trace"]:
                share = ar / tot if tot else float("nan")
                print(f"| {line} | {tot:,.0f} | {ar:,.0f} | {n} | {share:.1%} |")
    print(
        "\n| part | devices | seeds | global batch | envs | ms / iteration | iterations/s | "
        "updates/s | rows/s | env steps/s | speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ref = next(
            x for x in rows if x["kind"] == r["kind"] and x["seeds"] == r["seeds"]
        )  # the smallest device count of this part and population
        metric = "iters_per_s" if r["kind"] == "population" else "rows_per_s"
        speed = r[metric] / ref[metric]
        print(
            f"| {r['kind']} | {r['devices']} | {r['seeds']} | {r['batch']:,} | {r['envs']:,} "
            f"| {r['s_per_iter'] * 1e3:,.1f} | {r['iters_per_s']:.2f} "
            f"| {r['updates_per_s']:,.0f} | {r['rows_per_s']:.3g} | {r['env_steps_per_s']:.3g} "
            f"| {speed:.2f}x (vs {ref['devices']}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
