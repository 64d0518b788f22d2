"""Do the learner's kernel switches compute the reference's update on this machine? From one
state, one training iteration (acting, then ``optim.updates`` learner updates, every seed of a
vmapped population: ``bench/learning.py B``'s 5 by default, so the kernels run batched as in the
learning runs, and under the XLA flags ``python -m jaxdqn.train`` sets) with the reference
program and with each variant; prints how far each variant's metrics and parameters are from
the reference's (issue 33: the learning check of ``kernels.loss_head`` and
``kernels.target_head``, 2026-12-07, fell below the reference's on a GPU while the CPU tests,
interpreted, agree to float rounding — this compares the compiled kernels at the programs'
sizes).

    python bench/kernel_agreement.py                   # configs/synthetic_gpu.yaml, GPU
    python bench/kernel_agreement.py --tiny            # configs/smoke.yaml sizes, CPU (interpreted)
    python bench/kernel_agreement.py --variant kernels.target_head=pallas \
        --set kernels.learner_activations=f32   # one variant, float32 activations everywhere

A variant equal to the reference up to rounding differs by ~1e-6 (float32) to ~1e-3 (bfloat16
activations: one rounding changes later ones) relative; a wrong kernel by far more, and in the
metrics it feeds (``td_target_mean``, ``end_atom_mass`` for the target; ``loss_c51``,
``entropy``, ``atom_utilisation``, ``q_mean`` for the loss head). Prints a table last.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn import config  # noqa: E402
from jaxdqn.agent.build import build_agent  # noqa: E402
from jaxdqn.market import market as market_setup  # noqa: E402
from jaxdqn.program.launch import runtime  # noqa: E402
from jaxdqn.program.run.placement import place  # noqa: E402

METRICS = ("loss", "loss_c51", "td_target_mean", "end_atom_mass", "entropy", "atom_utilisation",
           "q_mean", "grad_norm", "priority_mean")  # fmt: skip
DEFAULT_VARIANTS = (
    "",  # the reference built again: the floor (a nondeterministic program differs from itself)
    "kernels.loss_head=dueling_padded",
    "kernels.target_head=pallas",
    "kernels.loss_head=dueling_padded kernels.target_head=pallas",
)
TINY = ("kernels.fused=fused",)
INTERPRETED = {"pallas": "interpret", "dueling": "dueling_interpret",
               "dueling_padded": "dueling_padded_interpret"}  # fmt: skip


def program(cfg):
    """The placed program of ``python -m jaxdqn.train`` for the loaded config."""
    prepared = market_setup.prepare(cfg)
    return place(cfg, prepared, build_agent(cfg, prepared))


def initial_state(placed, cfg):
    """The population's initial state on the devices, as ``python -m jaxdqn.train`` makes it."""
    keys = jax.random.split(jax.random.PRNGKey(cfg.seed), cfg.train.num_seeds)
    return placed.put(placed.init(placed.market, keys))


def relative(a, b) -> float:
    """max |a − b| / max(max |b|, 1e-12) over the arrays' elements."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12))


def one_iteration(placed, snapshot):
    """One iteration of ``placed``'s program from the host copy ``snapshot`` (the program
    donates its state, so each run starts from a fresh device copy)."""
    new, metrics = placed.iterate(placed.put(snapshot), placed.market)
    return jax.device_get(new.params), jax.device_get(metrics)


def interpreted(variant: str) -> str:
    """A variant's kernels under the Pallas interpreter (for the CPU)."""
    out = []
    for item in variant.split():
        key, value = item.split("=", 1)
        if key in ("kernels.loss_head", "kernels.target_head"):
            value = INTERPRETED.get(value, value)
        out.append(f"{key}={value}")
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "configs" / "synthetic_gpu.yaml"))
    ap.add_argument("--tiny", action="store_true", help="smoke.yaml, kernels interpreted (CPU)")
    ap.add_argument("--warm", type=int, default=3, help="reference iterations before the state")
    ap.add_argument("--seeds", type=int, default=None,
                    help="the population vmapped in every program (default: bench/learning.py "
                         "B's 5; --tiny: 2)")  # fmt: skip
    ap.add_argument("--variant", action="append", default=None,
                    help="space-separated overrides of one variant (repeatable)")  # fmt: skip
    ap.add_argument("--set", action="append", default=[], metavar="K=V",
                    help="an override of every program, the reference's too")  # fmt: skip
    ap.add_argument("--no-xla-flags", action="store_true",
                    help="without jaxdqn's XLA flags (the GPU's command buffers and their "
                         "concurrent regions), which python -m jaxdqn.train sets")  # fmt: skip
    args = ap.parse_args()
    # the process as the learning runs' (python -m jaxdqn.train): jaxdqn's XLA flags, and with
    # them the iteration's own compiler options; nothing read from or written to a cache
    runtime.configure(None, cache=False, xla_flags=not args.no_xla_flags)
    variants = list(args.variant or DEFAULT_VARIANTS)
    path = Path(args.config)
    seeds = args.seeds if args.seeds is not None else (2 if args.tiny else 5)
    common = [f"train.num_seeds={seeds}", *args.set]  # the learning runs vmap their seeds
    if args.tiny:
        path = ROOT / "configs" / "smoke.yaml"
        common = [*TINY, *common]
        variants = [interpreted(v) for v in variants]
    cfg = config.load(path, common)
    ref = program(cfg)
    # one state for every program: the variants start from the reference's snapshot below
    state = initial_state(ref, cfg)
    for _ in range(args.warm):  # past learning_starts: every iteration below learns
        state, _ = ref.iterate(state, ref.market)
    snapshot = jax.device_get(state)
    base_params, base = one_iteration(ref, snapshot)
    rows = []
    for variant in variants:
        placed = program(config.load(path, [*common, *variant.split()]))
        params, metrics = one_iteration(placed, snapshot)
        diffs = {m: relative(metrics[m], base[m]) for m in METRICS if m in metrics}
        leaves = zip(jax.tree.leaves(params), jax.tree.leaves(base_params), strict=True)
        rows.append((variant, max(relative(a, b) for a, b in leaves), diffs))
    learning = float(np.min(np.asarray(base["learning"])))
    flags = "without jaxdqn's XLA flags" if args.no_xla_flags else "jaxdqn's XLA flags"
    print(f"\njax {jax.__version__} on {jax.devices()[0].device_kind}; {path.name} {common}; "
          f"{flags}; one iteration after {args.warm} (learning {learning:.0f})")  # fmt: skip
    print("relative difference to the reference (max |variant − reference| / max |reference|)")
    print(f"{'variant':<72} {'params':>9} " + " ".join(f"{m[:12]:>12}" for m in METRICS))
    for variant, p, diffs in rows:
        cells = " ".join(f"{diffs.get(m, float('nan')):12.2e}" for m in METRICS)
        print(f"{variant or '(the reference, built again)':<72} {p:9.2e} {cells}")


if __name__ == "__main__":
    main()
