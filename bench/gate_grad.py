"""The gate product's backward alone: XLA's VJP of the reference (what ``kernels.gated=gate``
differentiates) against the Triton backward kernel of ``kernels.gated=gate_grad``
(pallas_kernels/gate_grad.py) at several tilings, at the learner's rows (B = 4,096 of
configs/gpu.yaml's bias-free product ``[u | g]``, 2,048 columns).

    PYTHONPATH=. python bench/gate_grad.py            # on the GPU; a markdown table last
    PYTHONPATH=. python bench/gate_grad.py --smoke    # tiny shapes, interpret mode, any machine

Cases: the all-off learner's one call (F = 1,024 covering the product, the sigmoid gate), M5's
first call with M4 (F = 768 at 0 and 1,024, the KAN gate: `[du | dg]` placed among zero columns) and
all four branches with M4 (F = 1,024, KAN). Each row computes every gradient (the product's
cotangent, both biases, and M4's coefficients and residual weights). Timing: ``bench/kernels.py``'s
chained-difference method (medians); error: the largest difference to the reference's VJP
relative to its largest value, over all outputs.
"""

from __future__ import annotations

import argparse
import datetime
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from bench.kernels import int_tuples, n_sets, time_op
from pallas_kernels.gate_grad import GateGradBlocks, gate_grad_pallas
from pallas_kernels.gate_product import gate_product_reference

TILINGS = (
    "8x128x4x1024,4x128x4x1024,8x64x4x1024,16x128x8x1024,8x128x4x256,8x128x4x4096,"
    "2x256x4x1024,4x64x2x1024,8x128x4x1024x1,16x128x4x1024x1,32x64x4x1024x1"
)
CASES = ((1024, 1024, False), (768, 1024, True), (1024, 1024, True))


def problem(key, rows, columns, f, kan):
    k = jax.random.split(key, 6)
    src = 2.0 * jax.random.normal(k[0], (rows, columns))
    da = jax.random.normal(k[1], (rows, f))
    gate = (0.5 + 0.1 * jax.random.normal(k[2], (f, 8)), 0.3 * jax.random.normal(k[3], (f,)))
    biases = 0.1 * jax.random.normal(k[4], (f,)), 0.1 * jax.random.normal(k[5], (f,))
    return (src, da, *(gate if kan else (None, None)), *biases)


def reference_vjp(g0, f):
    def grads(src, da, c, w, bu, bg):
        def forward(s, c, w, bu, bg):
            kw = dict(u0=0, g0=g0, width=f, u_bias=bu, g_bias=bg)
            return gate_product_reference(s, s, c, w, **kw)

        d_src, d_c, d_w, d_bu, d_bg = jax.vjp(forward, src, c, w, bu, bg)[1](da)
        return d_src, d_bu, d_bg, d_c, d_w

    return grads


def kernel_vjp(g0, f, blocks, interpret):
    def grads(src, da, c, w, bu, bg):
        kw = dict(u0=0, g0=g0, width=f, u_bias=bu, g_bias=bg, blocks=blocks, interpret=interpret)
        return gate_grad_pallas(src, da, c, w, **kw)

    return grads


def error(got, want) -> float:
    pairs = [(g, w) for g, w in zip(got, want, strict=True) if w is not None]
    return max(float(jnp.max(jnp.abs(g - w)) / (jnp.max(jnp.abs(w)) + 1e-30)) for g, w in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, interpret mode")
    tiling_help = "bm x bn x warps x programs [x row_sums], ..."
    parser.add_argument("--tilings", default=TILINGS, help=tiling_help)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    rows, columns, scale = (4096, 2048, 1) if not args.smoke else (40, 64, 32)
    tilings = [GateGradBlocks(*t) for t in int_tuples(args.tilings)]
    if args.smoke:
        tilings = [GateGradBlocks(8, 16, 4, 4)]
    dev = jax.devices()[0]
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {dev.device_kind}  B = {rows}")
    table = []
    for f, g0, kan in CASES:
        f, g0 = f // scale, g0 // scale
        per_set = 4 * rows * (columns + f)
        count = n_sets(per_set) if not args.smoke else 2
        sets = [problem(jax.random.PRNGKey(i), rows, columns, f, kan) for i in range(count)]
        case = f"F = {f}, {'KAN' if kan else 'sigmoid'}"
        ref = jax.jit(reference_vjp(g0, f))
        want = ref(*sets[0])
        t_ref = time_op(ref, sets, args.reps) if not args.smoke else float("nan")
        table.append((case, "XLA's VJP of the reference", t_ref, 0.0))
        for blocks in tilings:
            fn = jax.jit(kernel_vjp(g0, f, blocks, args.smoke))
            err = error(fn(*sets[0]), want)
            t = time_op(fn, sets, args.reps) if not args.smoke else float("nan")
            table.append((case, "kernel " + "x".join(map(str, blocks)), t, err))
            print(f"  {case}: {table[-1][1]}: {t * 1e6:.1f} us, err {err:.1e}", flush=True)
    print("\n| case | implementation | µs | rel err |\n|---|---|---:|---:|")
    for case, name, t, err in table:
        print(f"| {case} | {name} | {t * 1e6:.1f} | {err:.1e} |")


if __name__ == "__main__":
    main()
