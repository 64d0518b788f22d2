"""A run's greedy policy as files that run without jaxdqn (what ``python -m jaxdqn.export``
writes).

``OUT_DIR`` holds:

- ``policy.jax``: the serialised ``jax.export`` artifact (StableHLO) of
  ``policy(obs [b, obs_dim] float32, *leaves) -> (actions int32 [b, 4], target_position float32
  [b], scale float32 [b], q_mean float32 [b, 4, 3])``, with a symbolic batch size ``b`` and
  lowered for the CPU and CUDA platforms. ``actions`` are the executed branch actions
  (direction, magnitude, order, urgency: ``eval_*.csv``'s indices), ``target_position`` the
  target fraction of equity (E1), ``scale`` the A3 size factor and ``q_mean`` E[Q] per branch
  and action. The policy is the walks' (:func:`jaxdqn.evaluation.walk.decision` of the run's
  greedy evaluation policy) with the network's KAN gate (M4) in its jnp form, so no Pallas
  kernel is inside.
- ``params.npz``: the policy's array arguments ``leaf_000 …`` in order, each with a leading
  seed axis ``[S, ...]`` (seed ``s``'s arguments are ``[p[k][s] for k in sorted(p)]``).
- ``normaliser.json``: per instrument, the feature names and the train mean and std the
  features are normalised with (``clip((raw − mean) / std, −clip, clip)``).
- ``manifest.json``: the observation's layout (window × features, row-major, oldest first,
  then position fraction, last filled, last expired), the feature names, the window, the bar
  clock, the action names, the environment's leverage and levels, the checkpoint step, the
  config's SHA-256 and the provenance (commit, JAX version).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from jaxdqn.branches import ACTION_NAMES, BRANCHES
from jaxdqn.config import ConfigError, KernelsConfig
from jaxdqn.config.members import population_size

__all__ = ["FILES", "export_run", "load_exported"]

FILES = ("policy.jax", "params.npz", "normaliser.json", "manifest.json")
PLATFORMS = ("cpu", "cuda")


def _policy(agent: Any, env_params: Any, treedef: Any):
    """``policy(obs [b, D], *leaves)``: the run's greedy evaluation policy, batched."""
    import jax

    from jaxdqn.evaluation import walk as walk_lib
    from jaxdqn.market import env

    policy_fn = agent.acting.eval_policy
    model = agent.model

    def policy(obs, *leaves):
        params, v_min, dz, readiness = jax.tree.unflatten(treedef, leaves)
        pp = (params, v_min, dz, readiness)
        key = jax.random.PRNGKey(0)  # the greedy policy draws nothing

        def one(o):
            action, scale = walk_lib.decision(env_params, policy_fn, pp, o, 0, key)
            return action, env.target_position(env_params, action, scale), scale

        actions, target, scale = jax.vmap(one)(obs)
        q_mean = model.apply(params, obs, v_min, dz).q_mean
        return actions, target, scale, q_mean

    return policy


def jnp_kernels(kernels: KernelsConfig) -> KernelsConfig:
    """``kernels`` with every Pallas kernel in its jnp form, the same functions to float
    rounding: an artifact for the CPU and CUDA holds no Triton kernel (the KAN gate's
    reference, the heads one product per branch, M7's jnp statistics, M3 + M4's XLA products
    and gate, acting's statistics from the logits)."""
    heads = "split" if kernels.heads in ("pallas", "interpret") else kernels.heads
    return dataclasses.replace(
        kernels,
        kan="reference",
        heads=heads,
        statistics="reference",
        gated="reference",
        acting="reference",
    )


def export_run(run_dir: Path, out_dir: Path, which: str | int = "best") -> dict[str, Any]:
    """Write :data:`FILES` for checkpoint ``which`` of ``run_dir`` into ``out_dir`` (created;
    refused if it already holds any of them). Returns the manifest.

    Raises:
      ConfigError: not a run directory, no checkpoint, a sampled (boltzmann) evaluation
        policy, or ``out_dir`` holding an earlier export.
      DataError, CheckpointError: as :func:`jaxdqn.program.trained.predict.load_run`.
    """
    import jax
    from jax import export

    from jaxdqn import config as config_lib
    from jaxdqn.agent.build import build_agent
    from jaxdqn.market import env
    from jaxdqn.program.records import provenance
    from jaxdqn.program.run.walks import seed_policy_params
    from jaxdqn.program.trained import load

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    clash = [f for f in FILES if (out_dir / f).exists()]
    if clash:
        raise ConfigError(f"{out_dir}: already holds {clash[0]}; export into a new folder")
    run = load.load_run(run_dir, which)
    cfg = run.cfg
    if cfg.eval.policy != "greedy":
        raise ConfigError(
            f"eval.policy is {cfg.eval.policy} in {run_dir}: export writes the greedy policy only"
        )
    cfg_ref = dataclasses.replace(cfg, kernels=jnp_kernels(cfg.kernels))
    agent = build_agent(cfg_ref, run.prepared)
    seeds = range(population_size(cfg))  # every agent: members × seeds
    per_seed = [jax.tree.leaves(seed_policy_params(run.agent, run.state, s)) for s in seeds]
    treedef = jax.tree.structure(seed_policy_params(run.agent, run.state, 0))
    env_params = run.prepared.env_params
    obs_dim = env.obs_dim(env_params, run.prepared.num_features)
    (b,) = export.symbolic_shape("b")
    obs_spec = jax.ShapeDtypeStruct((b, obs_dim), np.float32)
    leaf_specs = [jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype) for x in per_seed[0]]
    exported = export.export(jax.jit(_policy(agent, env_params, treedef)), platforms=PLATFORMS)(
        obs_spec, *leaf_specs
    )
    blob = exported.serialize()
    stacked = {
        f"leaf_{k:03d}": np.stack([np.asarray(leaves[k]) for leaves in per_seed])
        for k in range(len(per_seed[0]))
    }
    normaliser = {
        v.name: {
            "features": list(v.features.names),
            "mean": [float(x) for x in v.features.mean],
            "std": [float(x) for x in v.features.std],
            "clip": float(cfg.features.clip),
            "warmup": int(v.features.warmup),
        }
        for v in run.views
    }
    prov = provenance.provenance(cfg, run_dir)
    manifest = {
        "format": "jaxdqn policy export 1",
        "run_dir": str(run_dir),
        "checkpoint_step": int(run.step),
        "seeds": population_size(cfg),
        "instruments": [v.name for v in run.views],
        "obs_dim": int(obs_dim),
        "window": int(cfg.features.window),
        "features": list(run.views[0].features.names),
        "observation": (
            "window x features, row-major, oldest bar first (the features of bars t-W+1..t), "
            "then the position fraction, last_filled and last_expired"
        ),
        "outputs": ["actions int32 [b, 4]", "target_position [b]", "scale [b]", "q_mean [b,4,3]"],
        "branches": {b: list(ACTION_NAMES[b]) for b in BRANCHES},
        "env": {
            "max_leverage": env_params.max_leverage,
            "magnitude_levels": list(env_params.magnitude_levels),
            "hold_orders": env_params.hold_orders,
        },
        "bar_clock": run.prepared.bar_clock.to_json(),
        "platforms": list(PLATFORMS),
        "config_sha256": prov["config_sha256"],
        "provenance": {k: prov[k] for k in ("git_commit", "jax", "jaxlib", "platform")},
        "config": config_lib.to_dict(cfg),
    }
    # everything computed before the first file is written: a failure leaves no partial export
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "policy.jax").write_bytes(blob)
    np.savez(out_dir / "params.npz", **stacked)
    (out_dir / "normaliser.json").write_text(json.dumps(normaliser, indent=1))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, default=str))
    return manifest


def load_exported(out_dir: Path, seed: int = 0):
    """``policy(obs [b, obs_dim]) -> (actions, target_position, scale, q_mean)`` from the files
    of :func:`export_run` (the README's loader: only ``jax`` and ``numpy``)."""
    import jax
    from jax import export

    exported = export.deserialize(bytearray(Path(out_dir, "policy.jax").read_bytes()))
    with np.load(Path(out_dir, "params.npz")) as p:
        leaves = [p[k][seed] for k in sorted(p.files)]
    return lambda obs: jax.device_get(exported.call(np.asarray(obs, np.float32), *leaves))
