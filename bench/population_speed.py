"""Issue 32: a hyperparameter population in one program against its members run one after
another.

    python bench/population_speed.py                 # 4 lr x 4 gamma at configs/gpu.yaml sizes
    python bench/population_speed.py --tiny          # smoke sizes (a CPU check)

Everything runs the program ``python -m jaxdqn.train`` runs (``program.placement.place``,
state donated), every component on, at the sizes of ``bench/scale.py`` (E = B = 4,096, replay
2^20, ``learning_starts`` 65,536). The population row trains the 16 members (one seed each) in
one vmapped program; the sequential rows train each member alone, one after another, as 16
ordinary runs would. Each configuration is built, initialised, given its learning rates
(``apply_schedule``) and run twice (compilation, then the first learning iteration; the
replay passes ``learning_starts`` in the first), then ``--iters`` iterations are timed one by
one (each blocks on its result) and the median is quoted. One iteration of the population
advances all 16 members; the 16 sequential runs need the sum of their medians for the same
work. Goal (issue 32): the population's iterations/s >= 8x the sequential runs'. Compile
times (the first call) are quoted beside; the programs' XLA flags and persistent compilation
cache are on, as in ``python -m jaxdqn.train``. Prints a table last.
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
from jaxdqn.config.members import agent_base_lrs, members  # noqa: E402
from jaxdqn.market import market as market_lib  # noqa: E402
from jaxdqn.program.launch import runtime  # noqa: E402
from jaxdqn.program.run.placement import place  # noqa: E402
from jaxdqn.program.run.schedule import apply_schedule, schedule  # noqa: E402


def overrides(tiny: bool) -> list[str]:
    if tiny:
        return [*config.ALL_ON]
    return [
        *config.ALL_ON,
        "acting.num_envs=4096",
        "replay.batch_size=4096",
        "replay.capacity=1048576",
        "replay.learning_starts=65536",
    ]


def measure(cfg: config.Config, prepared, iters: int) -> dict:
    """Median seconds per iteration and the first call's seconds of ``cfg``'s program."""
    agent = build_agent(cfg, prepared)
    placed = place(cfg, prepared, agent)
    state = placed.fresh(cfg.seed, cfg.train.num_seeds)
    sched = schedule(0, 0, 0, cfg.optim, cfg.acting, agent_base_lrs(cfg))
    state = placed.put(apply_schedule(state, sched, agent.dynamics, 1.0, None))
    first = None
    for i in range(2):
        t = time.perf_counter()
        state, metrics = placed.iterate(state, placed.market)
        jax.block_until_ready((state, metrics))
        first = time.perf_counter() - t if i == 0 else first
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        state, metrics = placed.iterate(state, placed.market)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - t)
    learning = float(jax.device_get(metrics["learning"]).min())
    return {"s": statistics.median(times), "first_s": first, "learning": learning}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lrs", default="1e-4,2e-4,3e-4,5e-4", help="population.optim.lr values")
    ap.add_argument("--gammas", default="0.9,0.95,0.97,0.99", help="population.loss.gamma")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per configuration")
    ap.add_argument("--tiny", action="store_true", help="smoke sizes (a CPU check)")
    ap.add_argument("--compile-cache", default=None, help="persistent compilation cache folder")
    args = ap.parse_args()
    # The programs' own XLA flags and compilation cache: sixteen ordinary runs would share the
    # cache (members with the same γ compile the same program; the learning rate is state).
    runtime.configure(args.compile_cache)
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    grid = [f"population.optim.lr=[{args.lrs}]", f"population.loss.gamma=[{args.gammas}]"]
    cfg = config.load(base, [*overrides(args.tiny), *grid])
    prepared = market_lib.prepare(cfg)
    ms = members(cfg)
    dev = jax.devices()[0]
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {dev.device_kind}  {len(ms)} members")
    pop = measure(cfg, prepared, args.iters)
    print(f"population: {pop['s'] * 1e3:.1f} ms/iteration, first call {pop['first_s']:.1f} s")
    seq = []
    for m in ms:
        row = measure(m.cfg, prepared, args.iters)
        seq.append(row)
        print(
            f"member {m.overrides}: {row['s'] * 1e3:.1f} ms/iteration, first {row['first_s']:.1f} s"
        )
    assert pop["learning"] == 1.0 and all(r["learning"] == 1.0 for r in seq), "not learning"
    seq_s = sum(r["s"] for r in seq)
    seq_first = sum(r["first_s"] for r in seq)
    print()
    print("| program | ms per iteration of all members | iterations/s | first calls (s) |")
    print("|---|---:|---:|---:|")
    print(f"| population, {len(ms)} members, one program | {pop['s'] * 1e3:.1f} | "
          f"{1 / pop['s']:.2f} | {pop['first_s']:.1f} |")  # fmt: skip
    print(f"| {len(ms)} runs one after another | {seq_s * 1e3:.1f} | {1 / seq_s:.3f} | "
          f"{seq_first:.1f} |")  # fmt: skip
    print(f"| ratio (goal >= 8) | | {seq_s / pop['s']:.2f}x | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
