"""Benchmark of the network (issue 3): forward and forward+backward time, all-on vs all-off.

``forward`` = ``model.apply`` (M1–M7, M12: logits, probabilities, E[Q], Var, quantiles,
selectivity) + ``model.coordinate`` (M8–M11) on ``[B, obs_dim]`` observations.
``forward+backward`` = the gradient w.r.t. all parameters of a loss touching every output:
C51 cross-entropy of all 12 distributions against fixed targets + mean square of the
coordinated Q + mean selectivity + the xLSTM (M13) prediction loss on the batch statistics.
Each is run ``--iters`` times inside one jitted ``lax.fori_loop`` (observations rescaled by
``1 + 1e-6·i`` each iteration so nothing is hoisted; the loop carries a scalar reduction of
the outputs or the gradient norm, so every output is computed); time per call is the median
over ``--repeats`` timed loops after a warm-up (compile) call.

    python bench/network.py          # gpu sizes (SH1 512, SH2 256, AH 256), B 4,096 and 65,536
    python bench/network.py --tiny   # quick CPU check

Prints one table last; with ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pallas_kernels
from jaxdqn.config import SWITCHES, KernelsConfig, ModelConfig
from jaxdqn.config.fields import BACKENDS
from jaxdqn.model import network as N
from jaxdqn.model.xlstm import batch_statistics

OFF = dict.fromkeys(SWITCHES["model"], False)


def make_fns(model: N.Model, batch: int, iters: int):
    """Jitted ``fwd(params, obs, target)`` and ``fwd_bwd(...)`` loops of ``iters`` calls."""
    v_min, dz = jnp.float32(-2.0), jnp.float32(4.0 / (model.cfg.num_atoms - 1))
    state = model.xlstm.init_state()

    def forward(params, obs):
        out = model.apply(params, obs, v_min, dz)
        coord = model.coordinate(params, out.q_mean)
        return out, coord

    def loss(params, obs, target):
        out, coord = forward(params, obs)
        ce = -jnp.mean(jnp.sum(target * jax.nn.log_softmax(out.logits), -1))
        xl, _ = model.xlstm.prediction_loss(
            params["xlstm"], state, batch_statistics(out.q_mean), jnp.float32(0.1)
        )
        return ce + jnp.mean(coord.q**2) + jnp.mean(out.selectivity) + xl

    def fwd_loop(params, obs, target):
        def body(i, acc):
            out, coord = forward(params, obs * (1.0 + 1e-6 * i.astype(jnp.float32)))
            return (
                acc
                + jnp.mean(out.probs[..., 0])
                + jnp.mean(out.q_var)
                + jnp.mean(out.quantiles)
                + jnp.mean(coord.q)
                + jnp.mean(out.selectivity)
                + jnp.mean(out.features)
            )

        return jax.lax.fori_loop(0, iters, body, jnp.float32(0.0))

    grad = jax.grad(loss)

    def bwd_loop(params, obs, target):
        def body(i, acc):
            g = grad(params, obs * (1.0 + 1e-6 * i.astype(jnp.float32)), target)
            return acc + sum(jnp.sum(x * x) for x in jax.tree_util.tree_leaves(g))

        return jax.lax.fori_loop(0, iters, body, jnp.float32(0.0))

    return jax.jit(fwd_loop), jax.jit(bwd_loop)


def median_ms(fn, args, iters: int, repeats: int) -> tuple[float, float]:
    """(compile+first call seconds, median ms per iteration)."""
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - start) / iters * 1e3)
    return first, statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="small sizes and batches (CPU check)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes")
    ap.add_argument("--obs-dim", type=int, default=259, help="observation width (32×8 + 3)")
    ap.add_argument("--iters", type=int, default=None, help="calls per timed loop")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--kan-backend",
        default=KernelsConfig().kan,
        choices=BACKENDS,
        help="M4 gate implementation (config key kernels.kan)",
    )
    args = ap.parse_args(argv)

    if args.tiny:
        base = ModelConfig(sh1=32, sh2=16, ah=16, vsn_hidden=8, bottleneck_dim=32)
        batches = [64, 256]
    else:
        base = ModelConfig(sh1=512, sh2=256, ah=256)
        batches = [4096, 65536]
    if args.batches:
        batches = [int(b) for b in args.batches.split(",")]
    dev = jax.devices()[0]
    print(
        f"jax {jax.__version__} on {dev.platform}:{dev.device_kind}; obs_dim {args.obs_dim}; "
        f"SH1 {base.sh1} SH2 {base.sh2} AH {base.ah} R {base.vsn_hidden} N {base.num_atoms}; "
        f"kernels.kan {args.kan_backend}",
        flush=True,
    )

    rows = []
    for name, cfg in (("all-on", base), ("all-off", dataclasses.replace(base, **OFF))):
        params, model = N.init(
            jax.random.PRNGKey(0), cfg, args.obs_dim, kan_backend=args.kan_backend
        )
        count = N.param_count(params)
        groups = {k: N.param_count(v) for k, v in params.items()}
        print(f"{name}: {count:,} parameters {groups}", flush=True)
        for b in batches:
            iters = args.iters or (3 if args.tiny else (50 if b <= 8192 else 10))
            key_o, key_t = jax.random.split(jax.random.PRNGKey(b))
            obs = jax.random.normal(key_o, (b, args.obs_dim), jnp.float32)
            target = jax.nn.softmax(jax.random.normal(key_t, (b, 4, 3, cfg.num_atoms)), -1)
            fwd, fwd_bwd = make_fns(model, b, iters)
            c_f, t_f = median_ms(fwd, (params, obs, target), iters, args.repeats)
            c_b, t_b = median_ms(fwd_bwd, (params, obs, target), iters, args.repeats)
            row = dict(
                config=name,
                batch=b,
                params=count,
                fwd_ms=t_f,
                fwd_bwd_ms=t_b,
                fwd_samples_per_s=b / t_f * 1e3,
                fwd_bwd_samples_per_s=b / t_b * 1e3,
                compile_s=(c_f, c_b),
                iters=iters,
            )
            rows.append(row)
            print(
                f"  B={b}: fwd {t_f:.3f} ms, fwd+bwd {t_b:.3f} ms "
                f"(first calls {c_f:.1f} s / {c_b:.1f} s)",
                flush=True,
            )

    print(f"Pallas fallbacks to the jnp reference: {pallas_kernels.fallbacks() or 'none'}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"jax": jax.__version__, "device": dev.device_kind, "rows": rows}, indent=1)
        )
    print()
    print(
        "| config | params | B | forward ms | fwd+bwd ms | forward samples/s | fwd+bwd samples/s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['config']} | {r['params']:,} | {r['batch']:,} | {r['fwd_ms']:.3f} | "
            f"{r['fwd_bwd_ms']:.3f} | {r['fwd_samples_per_s']:.3g} | "
            f"{r['fwd_bwd_samples_per_s']:.3g} |"
        )


if __name__ == "__main__":
    main()
