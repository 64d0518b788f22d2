"""How much acting's bfloat16 paths change what a trained agent does (issue 33).

    python bench/acting_precision.py RUN_DIR [--rows 20000] [--seed 0]

Restores the run's best checkpoint (:func:`jaxdqn.program.trained.load.load_run`), takes up to
``--rows`` observations from its replay (the states its training visited), and computes acting's
statistics with the per-action acting path (``kernels.acting`` + ``kernels.gated=gate``:
``pallas`` on a GPU, the interpreter on a CPU) at float32 and at each bfloat16 setting
(``kernels.acting_product=bf16``, then with ``kernels.acting_activations=bf16``, then with
``kernels.matmul=bf16`` as well: the fastest acting measured; on a CPU only the acting
kernels' head products take it, rounding their operands themselves), the same
parameters, supports (the checkpoint's) and observations, and the default acting path (XLA's
heads and M7, float32) against it too: the scale of float rounding alone. Per branch it
reports against the
float32 path: the median and largest ``|ΔE[Q]|``, the median gap between the best and second
action's E[Q] (what a greedy decision turns on), the share of observations whose greedy
action changes, and the mean total-variation distance between the A1 Boltzmann policies
(:func:`jaxdqn.agent.acting.boltzmann_probs` at the checkpoint's κ and the run's temperature
floor). On a CPU the bfloat16 products are computed in float32 and rounded (the GPU sums in
another order), so the numbers there describe the rounding, not a GPU's exact results.
Prints a table last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn.agent.acting import boltzmann_probs  # noqa: E402
from jaxdqn.agent.resolve import in_q_units  # noqa: E402
from jaxdqn.branches import BRANCHES  # noqa: E402
from jaxdqn.model import network  # noqa: E402
from jaxdqn.program.trained.load import load_run  # noqa: E402

VARIANTS = {
    # float32 both: what float rounding alone changes (XLA's path against the kernels')
    "default path, f32": {"acting": "reference", "gated": "reference"},
    "acting_product=bf16": {"acting_product": "bf16"},
    "+ acting_activations=bf16": {"acting_product": "bf16", "acting_activations": "bf16"},
    "+ matmul=bf16": {"acting_product": "bf16", "acting_activations": "bf16", "matmul": "bf16"},
}


def replay_observations(state, obs_dim: int, seed: int, rows: int) -> np.ndarray:
    """Up to ``rows`` filled replay observations ``[n, D]`` of agent ``seed``."""
    stored = [x for x in jax.tree.leaves(state.replay) if x.ndim == 3 and x.shape[-1] == obs_dim]
    if not stored:
        raise SystemExit("the checkpoint's replay holds no observations")
    obs = np.asarray(stored[0][seed])
    return obs[np.abs(obs).sum(axis=1) > 0][:rows]


def policy(q, kappa: float, floor: float) -> np.ndarray:
    """A1's Boltzmann probabilities ``[n, 4, 3]`` of E[Q] ``q`` (float64)."""
    return np.asarray(boltzmann_probs(jnp.asarray(q, jnp.float32), kappa, floor), np.float64)


def compare(q, p, other, kappa: float, floor: float) -> dict[str, np.ndarray]:
    """Per-branch differences of ``other``'s E[Q] ``[n, 4, 3]`` from the float32 path's ``q``
    (float64) and its policy ``p``."""
    qb = np.asarray(other, np.float64)
    err = np.abs(qb - q)
    return {
        "abs dQ median": np.median(err, axis=(0, 2)),
        "abs dQ max": err.max(axis=(0, 2)),
        "greedy changed": (qb.argmax(-1) != q.argmax(-1)).mean(axis=0),
        "policy TV mean": 0.5 * np.abs(policy(qb, kappa, floor) - p).sum(-1).mean(axis=0),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--rows", type=int, default=20000, help="replay observations compared")
    ap.add_argument("--seed", type=int, default=0, help="which of the run's agents")
    args = ap.parse_args(argv)
    run = load_run(Path(args.run_dir))
    state, cfg = run.state, run.cfg
    params = jax.tree.map(lambda x: x[args.seed], state.params)
    obs = jnp.asarray(replay_observations(state, run.agent.obs_dim, args.seed, args.rows))
    support = state.dynamics.support
    centre, half = float(support.centre[args.seed]), float(support.half_width[args.seed])
    atoms = cfg.model.num_atoms
    v_min = jnp.full((obs.shape[0],), centre - half)
    delta_z = jnp.full((obs.shape[0],), 2.0 * half / (atoms - 1))
    kappa = float(state.dynamics.kappa[args.seed])
    floor = in_q_units(cfg.acting.tau_floor, run.agent.reward_unit)
    gpu = jax.default_backend() != "cpu"
    kernels = {"acting": "pallas" if gpu else "interpret"}
    kernels["gated"] = "gate" if gpu else "gate_interpret"

    def statistics(**kw):
        model = network.make_model(cfg.model, run.agent.obs_dim, fused=True, **{**kernels, **kw})
        return jax.jit(model.act)(params, obs, v_min, delta_z).q_mean

    q = np.asarray(statistics(), np.float64)
    p = policy(q, kappa, floor)
    ordered = np.sort(q, axis=-1)
    rows = [
        ("per action, f32", {"top-2 gap median": np.median(ordered[..., -1] - ordered[..., -2], 0)})
    ]
    rows += [(name, compare(q, p, statistics(**kw), kappa, floor)) for name, kw in VARIANTS.items()]
    print(f"\n{args.run_dir}: agent {args.seed}, {obs.shape[0]:,} replay observations, "
          f"{jax.devices()[0].device_kind}, jax {jax.__version__}; κ {kappa:.3g}, temperature "
          f"floor {floor:.3g}, support [{centre - half:.3g}, {centre + half:.3g}]")  # fmt: skip
    print("\n| variant | measure | " + " | ".join(BRANCHES) + " |")
    print("|---|---|" + "---:|" * len(BRANCHES))
    for name, measures in rows:
        for measure, values in measures.items():
            fmt = "{:.2%}" if measure in ("greedy changed", "policy TV mean") else "{:.3g}"
            cells = " | ".join(fmt.format(v) for v in values)
            print(f"| {name} | {measure} | {cells} |")


if __name__ == "__main__":
    main()
