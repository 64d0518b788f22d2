"""Benchmark of the prioritised replay (L8): add, sample, set_priorities per call, in µs.

Each operation runs ``--iters`` times inside one jitted ``lax.fori_loop`` (so dispatch overhead
does not dominate) and the per-operation time is the median over ``--repeats`` timed loops after
a warm-up. ``learner`` = sample + set_priorities (what one learner update costs the replay);
``iteration`` = add + sample + set_priorities. ``dispatched`` times one jitted, state-donating
call of sample + set_priorities from the host (median of 30), the protocol of the flashbax
measurement quoted in issue 5 (1.5 ms at B = 4,096, capacity 1M on an H200).

    python bench/replay.py                       # capacity 2^20, B = 4,096, fan-outs 2,4,16,32
    python bench/replay.py --capacity 16384 --obs-dim 16 --iters 20   # quick CPU check

Prints one table last; with ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxdqn.agent.nstep import Transition
from jaxdqn.agent.replay import make_prioritised_replay
from jaxdqn.branches import NUM_BRANCHES


def item_spec(obs_dim: int) -> Transition:
    """The agent's replay item (as :func:`jaxdqn.agent.build.make_replay` stores it): an n-step
    transition with one int32 choice per branch and the M12 selectivity."""
    f32 = jnp.float32
    return Transition(
        obs=jax.ShapeDtypeStruct((obs_dim,), f32),
        action=jax.ShapeDtypeStruct((NUM_BRANCHES,), jnp.int32),
        reward=jax.ShapeDtypeStruct((), f32),
        discount=jax.ShapeDtypeStruct((), f32),
        next_obs=jax.ShapeDtypeStruct((obs_dim,), f32),
        selectivity=jax.ShapeDtypeStruct((), f32),
    )


def make_items(spec: Transition, num: int, key: jax.Array) -> Transition:
    leaves, treedef = jax.tree.flatten(spec)
    keys = jax.random.split(key, len(leaves))
    out = [
        jax.random.normal(k, (num, *s.shape)).astype(s.dtype)
        for k, s in zip(keys, leaves, strict=True)
    ]
    return jax.tree.unflatten(treedef, out)


def median_us(fn, args, iters: int, repeats: int) -> float:
    """Median over ``repeats`` of the wall time of ``fn(*args)`` divided by ``iters``, in µs."""
    jax.block_until_ready(fn(*args))  # compile + warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(times)


def bench_fanout(args, fanout: int) -> dict:
    spec = item_spec(args.obs_dim)
    replay = make_prioritised_replay(args.capacity, spec, alpha=0.6, fanout=fanout)
    batch, num_add, iters = args.batch, args.add, args.iters
    key = jax.random.PRNGKey(0)
    new_items = make_items(spec, num_add, key)

    # A full buffer with random priorities (the steady state of training).
    @jax.jit
    def fill(key):
        state = replay.init()
        chunks = -(-args.capacity // num_add)

        def body(i, state):
            p = jax.random.uniform(jax.random.fold_in(key, i), (num_add,)) * 3.0
            return replay.add(state, new_items, p)

        return jax.lax.fori_loop(0, chunks, body, state)

    state = jax.block_until_ready(fill(key))

    def priorities(k, n):
        return jax.random.exponential(k, (n,)) + 0.01

    @jax.jit
    def loop_sample(state, key):
        def body(i, acc):
            s = replay.sample(state, jax.random.fold_in(key, i), batch, 0.4)
            return acc + s.is_weights[0] + s.items.obs[-1, 0] + s.indices[0]

        return jax.lax.fori_loop(0, iters, body, jnp.float32(0))

    def donated_loop(step):
        @jax.jit
        def run(state, key):
            return jax.lax.fori_loop(
                0, iters, lambda i, s: step(s, jax.random.fold_in(key, i)), state
            )

        return jax.jit(run, donate_argnums=0)

    def add_step(s, k):
        return replay.add(s, new_items, priorities(k, num_add))

    def set_step(s, k):
        k1, k2 = jax.random.split(k)
        idx = jax.random.randint(k1, (batch,), 0, args.capacity)
        return replay.set_priorities(s, idx, priorities(k2, batch))

    def learner_step(s, k):
        k1, k2 = jax.random.split(k)
        sample = replay.sample(s, k1, batch, 0.4)
        loss = priorities(k2, batch) * sample.is_weights + sample.items.reward
        return replay.set_priorities(s, sample.indices, loss)

    def iteration_step(s, k):
        k1, k2 = jax.random.split(k)
        return learner_step(add_step(s, k1), k2)

    large_items = make_items(spec, args.add_large, key)

    def add_large_step(s, k):
        return replay.add(s, large_items, priorities(k, args.add_large))

    out = {"fanout": fanout}
    out["sample"] = median_us(loop_sample, (state, key), iters, args.repeats)
    for name, step in (
        ("add", add_step),
        ("add_large", add_large_step),
        ("set_priorities", set_step),
        ("learner", learner_step),
        ("iteration", iteration_step),
    ):
        run = donated_loop(step)
        jax.block_until_ready(state)
        state = run(state, key)  # compile + warm-up
        times = []
        for r in range(args.repeats):
            jax.block_until_ready(state)
            start = time.perf_counter()
            state = jax.block_until_ready(run(state, jax.random.fold_in(key, r)))
            times.append((time.perf_counter() - start) / iters * 1e6)
        out[name] = statistics.median(times)

    @jax.jit
    def one_call(s, k):
        return learner_step(s, k)

    one_call = jax.jit(one_call, donate_argnums=0)
    state = one_call(state, key)
    times = []
    for r in range(30):
        jax.block_until_ready(state)
        start = time.perf_counter()
        state = jax.block_until_ready(one_call(state, jax.random.fold_in(key, r)))
        times.append((time.perf_counter() - start) * 1e6)
    out["dispatched"] = statistics.median(times)
    del state
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=1 << 20)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--add", type=int, default=4096, help="items per add call")
    parser.add_argument(
        "--add-large", type=int, default=65536, help="items per add call of the add_large column"
    )
    parser.add_argument("--obs-dim", type=int, default=256)
    parser.add_argument("--fanouts", default="2,4,16,32")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.device_kind} ({device.platform})", flush=True)
    print(
        f"capacity {args.capacity:,}  batch {args.batch:,}  add {args.add:,}  "
        f"obs_dim {args.obs_dim}  iters {args.iters}  repeats {args.repeats}",
        flush=True,
    )
    rows = []
    for fanout in (int(f) for f in args.fanouts.split(",")):
        start = time.perf_counter()
        rows.append(bench_fanout(args, fanout))
        print(f"fanout {fanout}: {rows[-1]}  ({time.perf_counter() - start:.1f} s)", flush=True)
    cols = ("add", "add_large", "sample", "set_priorities", "learner", "iteration", "dispatched")
    print(
        f"\nmedian µs per call (add: {args.add:,} items, add_large: {args.add_large:,}; "
        "learner = sample + set_priorities; iteration = add + learner)"
    )
    print(f"{'fanout':>6} " + " ".join(f"{c:>14}" for c in cols))
    for row in rows:
        print(f"{row['fanout']:>6} " + " ".join(f"{row[c]:>14.1f}" for c in cols))
    if args.json:
        meta = {
            "jax": jax.__version__,
            "device": device.device_kind,
            **{k: v for k, v in vars(args).items() if k != "json"},
        }
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
