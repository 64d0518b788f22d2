"""Issue 16: where does a GPU run stop being repeatable? One compiled executable run twice on
the same input: the leaves of the iteration's output state, the learner step's gradients and
the loss forward that differ between the two executions (runtime non-determinism: atomics,
order-dependent reductions). Run once per XLA flag set (``--flags``): a difference that
vanishes with ``--xla_gpu_deterministic_ops=true`` is XLA's; one that persists is ours.

    python bench/determinism_probe.py [--flags "..."] [key=value ...]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flags", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    from jaxdqn.program.launch.runtime import GPU_XLA_FLAGS

    os.environ["XLA_FLAGS"] = " ".join([*GPU_XLA_FLAGS, *args.flags.split()])
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxdqn import config
    from jaxdqn.agent import iteration
    from jaxdqn.agent.build import build_agent, make_init
    from jaxdqn.market import market as market_setup

    cfg = config.load(
        ROOT / "configs" / "synthetic_gpu.yaml",
        ["train.deterministic=true", "replay.learning_starts=8192", *args.overrides],
    )
    prepared = market_setup.prepare(cfg)
    agent = build_agent(cfg, prepared)
    print(f"XLA_FLAGS extra: {args.flags or '(none)'}; projection -> {cfg.kernels.projection}")
    state = make_init(agent)(prepared.market, jax.random.PRNGKey(0))
    step = jax.jit(lambda s, m: iteration.iteration(agent, s, m))
    for _ in range(3):
        state, m = step(state, prepared.market)
    print("warm: learning", float(m["learning"]), "loss", float(m["loss"]))
    copy = lambda t: jax.tree.map(jnp.copy, t)

    def diff(a, b):
        flat_a = jax.tree_util.tree_flatten_with_path(a)[0]
        flat_b = jax.tree.leaves(b)
        bad = []
        for (path, x), y in zip(flat_a, flat_b, strict=True):
            x, y = np.asarray(x), np.asarray(y)
            if not np.array_equal(x, y, equal_nan=True):
                bad.append(jax.tree_util.keystr(path))
        return bad

    first = jax.device_get(step(copy(state), prepared.market))
    for r in range(args.repeats - 1):
        again = jax.device_get(step(copy(state), prepared.market))
        bad = diff(first, again)
        print(f"iteration repeat {r + 1}: {len(bad)} differing leaves; first: {bad[:8]}")

    batch = jax.jit(agent.learner.sample)(state, jax.random.PRNGKey(1))
    v_min, dz = agent.dynamics.grid(state.dynamics)
    fwd = jax.jit(lambda p, obs: agent.model.apply(p, obs, v_min, dz))
    o1 = jax.device_get(fwd(state.params, batch.obs))
    o2 = jax.device_get(fwd(state.params, batch.obs))
    print("model forward:", diff(o1, o2)[:8] or "identical")
    lstep = jax.jit(agent.learner.step)
    s1 = jax.device_get(lstep(copy(state), batch, jax.random.PRNGKey(2)))
    s2 = jax.device_get(lstep(copy(state), batch, jax.random.PRNGKey(2)))
    print("learner step:", diff(s1, s2)[:12] or "identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
