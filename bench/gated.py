"""M3 + M4 alone: the gated value path as XLA computes it (``kernels.gated=reference``) against
the Pallas GEMM with the gate in its epilogue (``pallas``) and XLA's product followed by the
Pallas gate-and-product kernel that reads it in place (``gate``), at acting's and the learner's
rows.

    PYTHONPATH=. python bench/gated.py            # on the GPU; a markdown table last
    PYTHONPATH=. python bench/gated.py --smoke    # tiny shapes, interpret mode, any machine
    PYTHONPATH=. python bench/gated.py --bf16 --gate-tilings "32x64x4,64x64x4,..."

``--bf16``: acting's bfloat16 path (``kernels.acting_product=bf16`` with
``kernels.acting_activations=bf16``): ``x`` bfloat16, the product with bfloat16 operands and
result (``dense.bf16_linear``), the gate kernel reading it as it is and writing ``a`` in
bfloat16 (what ``head_statistics`` reads under ``kernels.matmul=bf16``), to sweep the gate
kernel's tilings for those dtypes (the defaults were chosen on float32 sources); the Pallas
GEMM rows (``--tilings``) are left out there.

Both compute ``a = (x W_u + b_u) ⊙ gate(x W_g + b_g)`` for the three branches the fused model
computes together (K = SH2 = 256 inputs, F = 3·AH = 768 columns) and for magnitude's call under
M5 (K = 256, F = 256, and M5's rank-3 conditioning ``c W_c``: a shape's fourth number r); the
reference is the model's own formulation (one ``affine`` of ``[W_u | W_g]`` over the K + r
inputs, then the KAN gate kernel P2 and the product); the gate path, as the model calls it,
takes XLA's product over the K inputs and adds ``c W_c`` (the last r inputs and weight rows) in
the kernel. Timing: ``bench/kernels.py``'s
chained-difference method (medians). TFLOP/s counts the two products' multiply-adds.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from bench.kernels import int_tuples, n_sets, print_speed_table, rel, time_op
from jaxdqn.model.dense import bf16_linear, linear
from jaxdqn.model.gated import GateSpec, gated_reference
from pallas_kernels.gate_product import GateProductBlocks, gate_product_pallas
from pallas_kernels.gated import GatedBlocks, gated_value_pallas


def inputs(key, rows, k, f):
    kx, ku, kg, kc, kw = jax.random.split(key, 5)
    x = jax.random.normal(kx, (rows, k))
    w_u = jax.random.normal(ku, (k, f)) / np.sqrt(k)
    w_g = 2.0 * jax.random.normal(kg, (k, f)) / np.sqrt(k)
    zeros = jnp.zeros((f,))
    coeffs = 0.5 + 0.1 * jax.random.normal(kc, (f, 8))
    return x, w_u, w_g, zeros, zeros + 0.1, coeffs, 0.3 * jax.random.normal(kw, (f,))


def gate_path(blocks, interpret, bf16=False, rank=0):
    """``kernels.gated=gate``: XLA's bias-free product, then the in-place kernel that adds the
    biases (and, with ``rank``, M5's ``c W_c``: the last ``rank`` inputs and weight rows),
    applies the gate and writes ``u ⊙ gate``; with ``bf16`` the product in bfloat16 (operands
    and result) and ``a`` written in bfloat16 (acting's bfloat16 path)."""

    def fn(x, w_u, w_g, b_u, b_g, coeffs, w_res):
        f, k = w_u.shape[1], x.shape[1] - rank
        w = jnp.concatenate([w_u[:k], w_g[:k]], 1)
        pre = bf16_linear(x[:, :k], w) if bf16 else linear(x[:, :k], w)
        cond = (x[:, k:].astype(jnp.float32), w_u[k:], w_g[k:]) if rank else None
        return gate_product_pallas(
            pre, pre, coeffs, w_res, g0=f, width=f, u_bias=b_u, g_bias=b_g, cond=cond,
            blocks=blocks, out_dtype=jnp.bfloat16 if bf16 else jnp.float32, interpret=interpret,
        )  # fmt: skip

    return fn


def _as_bf16_x(arrays, bf16):
    """The inputs with ``x`` in bfloat16 under ``--bf16`` (acting's activations are), for every
    path alike (the reference widens it: the same values)."""
    return (arrays[0].astype(jnp.bfloat16), *arrays[1:]) if bf16 else arrays


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument(
        "--shapes",
        default="65536x256x768,65536x256x256x3,8192x256x768",
        help="rows x K x F [x r: M5's rank], comma-separated",
    )
    ap.add_argument(
        "--tilings",
        default="64x64x32x4,128x64x32x4,128x64x32x8,64x128x32x4,128x128x32x8,64x64x64x4",
        help="the GEMM kernel's bm x bn x bk x warps (empty: none)",
    )
    ap.add_argument(
        "--gate-tilings",
        default="32x64x4,32x128x4,16x128x4,16x256x4,8x256x4",
        help="the gate kernel's bm x bn x warps (empty: none)",
    )
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="acting's bfloat16 path: x, the product and the gate kernel's output in bfloat16",
    )
    args = ap.parse_args(argv)
    smoke, reps = args.smoke, 2 if args.smoke else args.reps
    dev = jax.devices()[0]
    mode = "  acting bf16 path" if args.bf16 else ""
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {dev.device_kind}{mode}", flush=True)
    spec = GateSpec(True, -3.0, 3.0, "interpret" if smoke else "pallas")
    shapes = [(40, 24, 48), (40, 24, 48, 3)] if smoke else int_tuples(args.shapes)
    candidates = [
        (f"Pallas bm={b[0]} bn={b[1]} bk={b[2]} w={b[3]}", b,
         lambda r, b=b: functools.partial(
             gated_value_pallas, blocks=GatedBlocks(*b), interpret=smoke))
        for b in ([] if args.bf16 else [(16, 16, 16, 4)] if smoke else int_tuples(args.tilings))
    ] + [
        (f"XLA product + Pallas bias·gate·product bm={b[0]} bn={b[1]} w={b[2]}", b,
         lambda r, b=b: gate_path(GateProductBlocks(*b), smoke, args.bf16, r))
        for b in ([(8, 16, 4)] if smoke else int_tuples(args.gate_tilings))
    ]  # fmt: skip
    table = []
    for rows, k, f, *rank in shapes:
        r = rank[0] if rank else 0
        sets = [
            _as_bf16_x(inputs(kk, rows, k + r, f), args.bf16)
            for kk in jax.random.split(jax.random.key(rows + k), 2 * n_sets(4 * rows * (k + f)))
        ]
        ref = functools.partial(gated_reference, spec=spec)
        want = np.asarray(ref(*sets[0]))
        ref_us = time_op(ref, sets, reps) * 1e6
        flops = 4.0 * rows * (k + r) * f
        size = f"{rows}×{k}{f' + c[{r}]' if r else ''}→{f}"
        table.append((size, "XLA affine + P2 gate + product", ref_us, 1.0, 0.0))
        print(table[-1], flush=True)
        for name, blocks, make in candidates:
            fn = make(r)
            try:
                us = time_op(fn, sets, reps) * 1e6
                err = rel(fn(*sets[0]), want)
            except Exception as e:  # a tiling Triton refuses: report it, go on
                print(f"  {blocks}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                continue
            table.append((size, name, us, ref_us / us, err))
            print(table[-1], f"{flops / us / 1e6:.0f} TFLOP/s", flush=True)
        del sets
    print_speed_table(table, "rows × K → F")


if __name__ == "__main__":
    main()
