"""A fixed per-kernel cost or a cache effect? The clip's per-leaf sums traced on their own
(issue 33, twenty-seventh session's open question).

Inside the all-off learner update the gradient clip's 37 per-leaf ``sum(g²)`` reductions over the
network's ~0.9 M parameters took ~2.3 µs a kernel in one schedule and ~4.5 µs in another (the
pipelined learner), far above what 3.6 MB of float32 costs at HBM bandwidth (~1 µs in all). This
script runs the same reductions over a parameter tree of the same shapes (the agent's own
``TrainState.params`` at configs/gpu.yaml sizes, all components off) in three programs, each a
``lax.scan`` of ``U`` steps whose step is ``g ← g · c / (c + ‖g‖)`` (the clip's global norm and its
scale):

* ``warm``: only that step: every leaf was written by the step before it and sits in L2;
* ``cold``: each step first streams a ``--flush`` MB buffer (``b ← b + 1``, read and written),
  which evicts the leaves from the 50 MB L2 before the reductions read them;
* ``flat``: the leaves raveled into one vector first (one reduction, ``optim.flat``'s form).

Each program is timed untraced (median of 5 calls, the process's ``XLA_FLAGS``) and traced op by
op (``jax.profiler``); from the trace it prints the reduction kernels' count and median duration
per step. If ``warm``'s reductions take ~2.3 µs each, their time is a fixed per-kernel cost (the
launch and tail of a small grid); if they take far less warm and about that much cold, it is
where the operands live.

    python bench/kernel_cost.py              # on the GPU
    python bench/kernel_cost.py --tiny       # smoke sizes on a CPU (no kernels: checks it runs)
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.iteration import COMPONENTS, build, jit_program, time_calls  # noqa: E402
from bench.trace_update import gpu_events, kernel_class  # noqa: E402
from jaxdqn.agent.build import make_init  # noqa: E402


def clip_step(tree, clip: float = 10.0):
    """One global-norm clip of ``tree`` onto itself: ``‖g‖ = sqrt(Σ_leaves Σ g²)``, then
    ``g · clip / (clip + ‖g‖)`` (a scale that never reaches 0, so ``U`` steps stay finite)."""
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(tree)))
    scale = clip / (clip + norm)
    return jax.tree_util.tree_map(lambda x: (x * scale).astype(x.dtype), tree)


def flat_step(tree, clip: float = 10.0):
    """:func:`clip_step` with the leaves raveled into one vector for the norm."""
    flat = jnp.concatenate([x.reshape(-1) for x in jax.tree_util.tree_leaves(tree)])
    scale = clip / (clip + jnp.sqrt(jnp.sum(jnp.square(flat))))
    return jax.tree_util.tree_map(lambda x: (x * scale).astype(x.dtype), tree)


def program(step, updates: int, flush: bool):
    def body(carry, _):
        tree, buf = carry
        if flush:
            buf = buf + 1.0
        return (step(tree), buf), None

    def run(carry):
        carry, _ = jax.lax.scan(body, carry, None, length=updates)
        return carry, None

    return run


def measure(name, step, carry, updates, flush, calls):
    compiled = jit_program(program(step, updates, flush), donate_argnums=0).lower(carry).compile()
    median_s, carry = time_calls(compiled, carry)
    trace_dir = Path(tempfile.mkdtemp(prefix="jaxdqn_kc_"))
    with jax.profiler.trace(str(trace_dir)):
        for _ in range(calls):
            carry, _ = compiled(carry)
            jax.block_until_ready(carry)
    try:
        kernels, _ = gpu_events(trace_dir)
    except SystemExit:
        kernels = []
    by_class = collections.defaultdict(list)
    for e in kernels:
        by_class[kernel_class(e["name"])].append(float(e["dur"]))
    n = updates * calls
    red = by_class.get("reduction", [])
    row = {
        "program": name,
        "step_us": median_s / updates * 1e6,
        "kernels": len(kernels) / n,
        "kernel_us": sum(float(e["dur"]) for e in kernels) / n,
        "reductions": len(red) / n,
        "red_median_us": statistics.median(red) if red else float("nan"),
        "red_us": sum(red) / n,
        "classes": {k: (len(v) / n, sum(v) / n) for k, v in by_class.items()},
    }
    return row, carry


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--flush", type=float, default=128.0, help="MB streamed before each step")
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()
    base = str(ROOT / ("configs/smoke.yaml" if args.tiny else "configs/gpu.yaml"))
    _, switches = COMPONENTS["off"]
    batch = 64 if args.tiny else 4096
    p, _, agent = build(base, [*switches, f"replay.batch_size={batch}", "replay.capacity=65536"])
    params = make_init(agent)(p.market, jax.random.PRNGKey(0)).params
    leaves = jax.tree_util.tree_leaves(params)
    n_par = sum(x.size for x in leaves)
    # Gradients are float32 whatever the activations: the clip sees float32 leaves.
    params = jax.tree_util.tree_map(lambda x: x.astype(jnp.float32) * 1e-3, params)
    buf = jnp.zeros((int(args.flush * 2**20 / 4),), jnp.float32)
    rows = []
    for name, step, flush in (("warm", clip_step, False), ("cold", clip_step, True),
                              ("flat", flat_step, False), ("flat cold", flat_step, True),
                              ("flush only", lambda t: t, True)):  # fmt: skip
        carry = (jax.tree_util.tree_map(jnp.copy, params), jnp.copy(buf))
        row, _ = measure(name, step, carry, args.updates, flush, args.calls)
        rows.append(row)
        print(name, {k: v for k, v in row["classes"].items()})
    print()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; {len(leaves)} leaves, "
          f"{n_par:,} parameters ({n_par * 4 / 2**20:.2f} MB float32); flush {args.flush:.0f} MB; "
          f"{args.updates} steps x {args.calls} traced calls (op by op)")  # fmt: skip
    print(f"{'program':<12} {'µs/step':>9} {'kernels':>8} {'kernel µs':>10} {'reductions':>11} "
          f"{'µs each (med)':>14} {'red. µs':>8}")  # fmt: skip
    for r in rows:
        print(f"{r['program']:<12} {r['step_us']:>9.1f} {r['kernels']:>8.1f} "
              f"{r['kernel_us']:>10.1f} {r['reductions']:>11.1f} {r['red_median_us']:>14.2f} "
              f"{r['red_us']:>8.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
