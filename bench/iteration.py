"""Throughput of the jitted training iteration (issue 5): learner updates/s, acting env steps/s,
compile time, FLOPs per update and the achieved fraction of the measured matmul rate.

    python bench/iteration.py            # configs/gpu.yaml sizes (run on the H200)
    python bench/iteration.py --tiny     # smoke sizes, to check the script on a CPU

Prints a table last. Medians over repeats; every timed call blocks on its result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn import config  # noqa: E402
from jaxdqn.agent import iteration  # noqa: E402
from jaxdqn.agent.build import build_agent, make_init  # noqa: E402
from jaxdqn.market import market as market_setup  # noqa: E402

ALL_OFF = list(config.ALL_OFF)
ALL_ON = list(config.ALL_ON)  # L3 is off by default


def timed(fn, *args, repeats: int = 5):
    out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def time_calls(compiled, state, repeats: int = 5):
    """Median wall time (s) of ``repeats`` calls ``state, _ = compiled(state)`` (a donated,
    compiled scan of learner updates) after one warm-up call; returns it and the last state."""
    state, _ = compiled(state)
    jax.block_until_ready(state)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        state, _ = compiled(state)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
    return statistics.median(times), state


def matmul_rate(n: int) -> float:
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    t, _ = timed(f, a)
    return 2 * n**3 / t


def build(base: str, overrides: list[str], prepared=None):
    cfg = config.load(base, overrides)
    p = prepared or market_setup.prepare(cfg)
    return p, cfg, build_agent(cfg, p)


def fill_replay(cfg, agent, state, market):
    """Acting until the replay holds enough transitions to sample a batch."""
    step = jax.jit(
        lambda s, m: iteration.store(agent, *iteration.act(agent, s, m)), donate_argnums=0
    )
    need = max(cfg.replay.batch_size, cfg.replay.learning_starts)
    while int(state.replay.size) < need:
        state = step(state, market)
    return state


def update_flops(agent, state) -> float:
    """XLA's FLOP count of ONE learner update, compiled on its own.

    Not the scan's ``cost_analysis()`` divided by U: XLA counts a loop body once, whatever the
    trip count, so that division under-reported the work U-fold (issue 12: 499 MFLOP reported
    for ≈ 38 GFLOP per update at gpu.yaml sizes)."""
    cost = jax.jit(agent.learner.update).lower(state).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost.get("flops", float("nan")))


def bench_learner(base, extra, batch, updates, prepared, envs):
    p, cfg, agent = build(
        base,
        [*extra, f"replay.batch_size={batch}", f"acting.num_envs={envs}",
         f"replay.learning_starts={batch}", "acting.steps=16",
         "replay.capacity=1048576"],
        prepared,
    )  # fmt: skip
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    state = fill_replay(cfg, agent, state, p.market)
    run = lambda s: jax.lax.scan(lambda c, _: agent.learner.update(c), s, None, updates)
    f = jax.jit(run, donate_argnums=0)
    t0 = time.perf_counter()
    compiled = f.lower(state).compile()
    compile_s = time.perf_counter() - t0
    flops = update_flops(agent, state)
    median_s, _ = time_calls(compiled, state)
    return updates / median_s, flops, compile_s


def bench_acting(base, extra, envs, steps, prepared):
    p, _, agent = build(
        base,
        [*extra, f"acting.num_envs={envs}", f"acting.steps={steps}",
         "replay.learning_starts=1048576", "replay.capacity=1048576"],
        prepared,
    )  # fmt: skip
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    f = jax.jit(lambda s, m: iteration.store(agent, *iteration.act(agent, s, m)), donate_argnums=0)
    state = f(state, p.market)
    jax.block_until_ready(state)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        state = f(state, p.market)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
    return envs * steps / statistics.median(times)


def bench_compile(base, extra, prepared):
    p, _, agent = build(base, extra, prepared)
    state = make_init(agent)(p.market, jax.random.PRNGKey(0))
    it = jax.jit(lambda s, m: iteration.iteration(agent, s, m), donate_argnums=0)
    t0 = time.perf_counter()
    it.lower(state, p.market).compile()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    if args.tiny:
        base = str(ROOT / "configs/smoke.yaml")
        batches, envs, updates, steps, mm = [64, 128], [64, 256], 8, 4, 512
        learner_envs = 64
    else:
        base = str(ROOT / "configs/gpu.yaml")
        batches, envs, updates, steps, mm = [1024, 4096, 16384], [4096, 65536], 50, 16, 8192
        learner_envs = 4096
    prepared = market_setup.prepare(config.load(base))
    rate = matmul_rate(mm)
    rows = []
    for label, extra in (("all on", ALL_ON), ("all off", ALL_OFF)):
        compile_s = bench_compile(base, extra, prepared)
        for b in batches:
            ups, flops, lc = bench_learner(base, extra, b, updates, prepared, learner_envs)
            rows.append(
                (label, f"learner B={b}", f"{ups:,.0f} updates/s", f"{flops / 1e6:.1f} MFLOP/upd",
                 f"{ups * flops / rate:.1%} of matmul", f"compile {lc:.1f}s")
            )  # fmt: skip
            print(rows[-1], flush=True)
        for e in envs:
            sps = bench_acting(base, extra, e, steps, prepared)
            rows.append((label, f"acting E={e}", f"{sps:.3e} env steps/s", "", "", ""))
            print(rows[-1], flush=True)
        rows.append((label, "full iteration", "", "", "", f"compile {compile_s:.1f}s"))
    print()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; "
          f"f32 matmul {mm}^3 default precision: {rate / 1e12:.1f} TFLOP/s")  # fmt: skip
    print(f"{'components':<9} {'measurement':<17} {'throughput':<24} {'FLOPs':<18} "
          f"{'efficiency':<18} compile")  # fmt: skip
    for r in rows:
        print(f"{r[0]:<9} {r[1]:<17} {r[2]:<24} {r[3]:<18} {r[4]:<18} {r[5]}")


if __name__ == "__main__":
    main()
