"""Multi-device checks of issue 13, run in a subprocess with 4 forced CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``; the flag must be set before JAX starts,
so ``tests/test_scale.py`` runs this file once and reads the JSON it prints last).

Each check compares the sharded program with the one-device program and reports the largest
absolute differences; the tests hold them to float tolerance.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    )

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec
from model_overrides import PER_SAMPLE_MODEL_OFF

from jaxdqn import config
from jaxdqn.agent import mesh
from jaxdqn.agent.build import build_agent, make_init
from jaxdqn.agent.nstep import Transition
from jaxdqn.agent.replay import make_prioritised_replay
from jaxdqn.market import market as market_setup
from jaxdqn.program.launch import runtime
from jaxdqn.program.run import placement
from jaxdqn.program.run.schedule import apply_schedule, schedule
from jaxdqn.shards import Shards

SMOKE = Path(__file__).resolve().parent.parent / "configs" / "smoke.yaml"


def _leaf_diff(x, y) -> float:
    """Largest |x − y| relative to max(1, |x|), NaN = NaN (metrics before learning are NaN)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if x.shape != y.shape or not np.array_equal(np.isnan(x), np.isnan(y)):
        return float("inf")
    ok = ~np.isnan(x)
    if not ok.any():
        return 0.0
    return float(np.max(np.abs(x[ok] - y[ok]) / np.maximum(1.0, np.abs(x[ok]))))


def max_diff(a, b) -> float:
    leaves = jax.tree.leaves(jax.tree.map(_leaf_diff, a, b))
    return max(leaves) if leaves else 0.0


def run_layout(agent, layout, prepared, keys, iterations):
    """``iterations`` sharded iterations from a fresh state: ``(state, [metrics])``."""
    market = prepared.market
    if layout.mesh is not None:
        market = jax.device_put(market, mesh.replicated(layout))
    state = mesh.make_init(agent, layout)(market, keys)
    step = mesh.make_iteration(agent, layout)
    history = []
    for _ in range(iterations):
        state, m = step(state, market)
        history.append(jax.device_get(m))
    return state, history


def population(cfg, prepared, iterations=3):
    """4 seeds on 1 device vs the seed axis over 4 devices: every leaf of the state.

    ``main`` runs it with every component off: nothing on the seed axis mixes seeds (each
    device holds whole agents), so the check is about the placement, the keys and the state's
    layout, and a small program compiles several times faster. The components' reductions
    across devices are checked on the data axis: one update with every component on
    (``data_parallel_step``), the iteration with every component that has batch-wide statistics
    or state on (``data_parallel_iteration``; :data:`model_overrides.PER_SAMPLE_MODEL_OFF`)."""
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), 4)
    agent = build_agent(cfg, prepared)
    out = {}
    for devices in (1, 4):
        layout = mesh.make_layout(4, "seed", devices)
        state, history = run_layout(agent, layout, prepared, keys, iterations)
        out[devices] = (jax.device_get(state), history)
    (s1, h1), (s4, h4) = out[1], out[4]
    return {
        "state_max_diff": max_diff(s1, s4),
        "params_max_abs": max(float(np.max(np.abs(x))) for x in jax.tree.leaves(s1.params)),
        "metrics_max_diff": max_diff(h1, h4),
        "learning": float(np.mean([h["learning"].mean() for h in h4])),
        "replay_size": np.asarray(s4.replay.size).tolist(),
    }


def data_parallel_step(cfg, prepared):
    """One learner update on the same global batch: one device vs split over 2 devices."""
    agent1 = build_agent(cfg, prepared)
    state = make_init(agent1)(prepared.market, jax.random.PRNGKey(3))
    # A replay of random transitions with random priorities and a seeded reward std (so L5
    # ranks instead of passing the rewards through): no acting needed.
    n, d = 512, agent1.obs_dim
    ks = jax.random.split(jax.random.PRNGKey(5), 5)
    items = Transition(
        obs=jax.random.normal(ks[0], (n, d)),
        action=jax.random.randint(ks[1], (n, 4), 0, 3),
        reward=jax.random.normal(ks[2], (n,)),
        discount=jnp.where(jax.random.uniform(ks[3], (n,)) < 0.1, 0.0, 0.9),
        next_obs=jax.random.normal(ks[4], (n, d)),
        selectivity=jnp.ones((n,)),
    )
    prios = jax.random.uniform(jax.random.PRNGKey(6), (n,), minval=0.1, maxval=2.0)
    state = state.replace(
        replay=agent1.replay.add(state.replay, items, prios),
        dynamics=state.dynamics.replace(reward_std_ema=jnp.float32(0.7)),
    )
    batch = jax.jit(agent1.learner.sample)(state, jax.random.PRNGKey(11))
    k_target = jax.random.PRNGKey(12)
    ref_state, ref_metrics = jax.jit(agent1.learner.step)(state, batch, k_target)

    shards = Shards("data", 2)
    agent2 = build_agent(cfg, prepared, shards)
    grid = Mesh(np.asarray(jax.devices()[:2], dtype=object), ("data",))
    # The replay is per device (and not compared): each device gets an empty shard of its size.
    local = state.replace(replay=agent2.replay.init())
    fn = jax.shard_map(
        agent2.learner.step,
        mesh=grid,
        in_specs=(PartitionSpec(), PartitionSpec("data"), PartitionSpec()),
        out_specs=(PartitionSpec(), PartitionSpec()),
        check_vma=False,
    )
    dp_state, dp_metrics = jax.jit(fn)(local, batch, k_target)
    fields = ("params", "target_params", "opt_state", "dynamics", "updates")
    diffs = {f: max_diff(getattr(ref_state, f), getattr(dp_state, f)) for f in fields}
    moved = max_diff(ref_state.params, state.params)
    return {
        "field_max_diff": diffs,
        "metrics_max_diff": max_diff(ref_metrics, dp_metrics),
        "params_moved": moved,
        "rank_rewards": bool(cfg.loss.rank_rewards),
        "sampled_target": bool(cfg.loss.sampled_target),
    }


def per_shard_sampling():
    """Two replay shards with known priorities: each device samples its own shard, and the IS
    weights are (min over the global batch of P / P_i)^β with P_i = q_i / (D · total_d)."""
    item = jax.ShapeDtypeStruct((), jnp.float32)
    replay = make_prioritised_replay(8, item, alpha=1.0)
    shards = Shards("data", 2)
    prios = [np.array([1, 2, 3, 4, 5, 6, 7, 8], np.float32), np.array([9, 1, 1, 1], np.float32)]
    states = []
    for d, p in enumerate(prios):
        s = replay.add(replay.init(), 100.0 * d + jnp.arange(len(p), dtype=jnp.float32), p)
        states.append(s)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    grid = Mesh(np.asarray(jax.devices()[:2], dtype=object), ("data",))
    beta = 0.6

    def local(state, key):
        state = jax.tree.map(lambda x: x[0], state)
        out = replay.sample(state, jax.random.fold_in(key[0], shards.index()), 4, beta, shards)
        return jax.tree.map(lambda x: x[None], out)

    fn = jax.shard_map(
        local,
        mesh=grid,
        in_specs=(PartitionSpec("data"), PartitionSpec()),
        out_specs=PartitionSpec("data"),
        check_vma=False,
    )
    sample = jax.device_get(jax.jit(fn)(stacked, jax.random.PRNGKey(0)[None]))
    probs = []
    for d, p in enumerate(prios):
        idx = sample.indices[d]
        probs.append(p[idx] / p.sum() / 2)
    low = min(float(x.min()) for x in probs)
    expected = [(low / x) ** beta for x in probs]
    return {
        "indices": np.asarray(sample.indices).tolist(),
        "in_shard": all(bool(np.all(sample.indices[d] < len(p))) for d, p in enumerate(prios)),
        "items_from_own_shard": all(
            bool(np.allclose(sample.items[d], 100.0 * d + sample.indices[d])) for d in range(2)
        ),
        "weights_max_diff": max(
            float(np.max(np.abs(sample.is_weights[d] - expected[d]))) for d in range(2)
        ),
        "max_weight": float(np.max(sample.is_weights)),
    }


def data_parallel_iteration(prepared, iterations=3):
    """The sharded iteration, 2 seeds × 2 data devices: the per-device copies of every
    replicated field stay identical, and the metrics are finite.

    Placed as a training places it (``placement.place``, the host schedule written and the
    state put on the layout before each epoch): the same program, with the same argument
    shardings, as ``python -m jaxdqn.train`` with ``train.mesh=2x2`` and 2 seeds, so that the
    sharded kill −9 and resume of ``tests/test_scale.py`` (same module, run after this check)
    loads it from the session's compilation cache instead of compiling it again."""
    cfg2 = config.load(SMOKE, ["train.num_seeds=2", "train.mesh=2x2", *PER_SAMPLE_MODEL_OFF])
    placed = placement.place(cfg2, prepared, build_agent(cfg2, prepared))
    assert placed.layout.seed == 2 and placed.layout.data == 2
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    state = placed.init(placed.market, keys)
    sched = schedule(0, 0, 0, cfg2.optim, cfg2.acting)
    state = placed.put(apply_schedule(state, sched, placed.agent.dynamics, None))
    history = []
    for _ in range(iterations):
        state, m = placed.iterate(state, placed.market)
        history.append(jax.device_get(m))
    spread = 0.0
    for leaf in jax.tree.leaves((state.params, state.opt_state, state.dynamics)):
        by_seed = {}
        for shard in leaf.addressable_shards:
            by_seed.setdefault(str(shard.index), []).append(np.asarray(shard.data))
        for copies in by_seed.values():
            ref = copies[0].astype(np.float64)
            spread = max(spread, max(float(np.max(np.abs(c - ref))) for c in copies))
    finite = all(bool(np.all(h["finite"])) for h in history)
    return {
        "replica_spread": spread,
        "finite": bool(finite),
        "learning": float(np.mean([h["learning"].mean() for h in history])),
        "env_shape": list(state.obs.shape),
        "replay_size": np.asarray(jax.device_get(state.replay.size)).tolist(),
        "replay_size_metric": np.asarray(history[-1]["replay_size"]).tolist(),
    }


def main() -> int:
    runtime.configure(None)  # the test session's compilation cache ($JAXDQN_COMPILE_CACHE)
    cfg = config.load(SMOKE, ["train.num_seeds=4"])
    prepared = market_setup.prepare(cfg)
    seeds_only = config.load(SMOKE, ["train.num_seeds=4", *config.ALL_OFF])
    checks = {
        "population": lambda: population(seeds_only, prepared),
        "data_parallel_step": lambda: data_parallel_step(cfg, prepared),
        "per_shard_sampling": per_shard_sampling,
        "data_parallel_iteration": lambda: data_parallel_iteration(prepared),
    }
    only = sys.argv[1:] or list(checks)
    result = {"devices": len(jax.devices())}
    for name in only:
        t0 = time.time()
        result[name] = checks[name]()
        print(f"{name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
