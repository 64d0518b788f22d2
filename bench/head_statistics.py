"""M6 + M7 for acting, alone: the heads' product, logits and M7 as the model computes them
(``kernels.heads`` × ``kernels.statistics``) against one Pallas kernel that keeps the logits in
registers and writes only E[Z], Var[Z] and the quantiles (pallas_kernels/head_statistics.py).

    PYTHONPATH=. python bench/head_statistics.py            # on the GPU; a markdown table last
    PYTHONPATH=. python bench/head_statistics.py --smoke    # tiny shapes, interpret mode
    PYTHONPATH=. python bench/head_statistics.py --bf16 --tilings "128x32x4,128x64x4,..."

``--bf16``: acting's path under ``kernels.matmul=bf16`` with the bfloat16 ``a`` the gate kernel
writes there: ``a`` bfloat16 for every row (the XLA reference widens it: the same values), and
the candidates are the per-action kernel (``kernels.acting=pallas``) with bfloat16 products at
each ``--tilings`` tiling (the default per-action tiling was chosen on TF32 products and float32
``a``); the error column is then the bfloat16 products' against the reference's float32.

Shapes: the three branches the fused model computes together (m = 3, K = AH = 256, N = 51) and
magnitude's call under M5 (m = 1) at acting's E = 65,536 rows (configs/gpu.yaml's population of
16 × 4,096 environments, and issue 33's acting size), and m = 3 at 4,096 rows (one run's acting).
Every variant returns (E[Z], Var[Z], quantiles) only, so XLA drops what they do not need.
Timing: ``bench/kernels.py``'s chained-difference method (medians); rel. error of the
quantiles against the first row (XLA, reference M7) in float32 at the default precision.
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

from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from bench.kernels import int_tuples, n_sets, print_speed_table, rel, time_op
from jaxdqn.model import distribution
from jaxdqn.model.heads import branch_heads
from pallas_kernels import _backend
from pallas_kernels.head_statistics import (
    DEFAULT_HEAD_STAT_BLOCKS,
    HeadStatBlocks,
    head_statistics_pallas,
)
from pallas_kernels.heads import _pad_atoms, head_tiles
from pallas_kernels.statistics import row_statistics

ACTIONS, ATOMS = 3, 51
# --parts: tilings of the per-action schedule (one [bm, 64] accumulator a program; the first
# for --smoke)
PER_ACTION_TILINGS = [
    HeadStatBlocks(*t) for t in ((16, 16, 4), (128, 32, 4), (64, 32, 4), (128, 64, 4), (256, 32, 8))
]
LEVELS = tuple(distribution.QUANTILE_LEVELS)


def inputs(key, rows, m, k):
    ka, kw, kb, kv = jax.random.split(key, 4)
    a = jax.random.normal(ka, (rows, m * k))
    w = jax.random.normal(kw, (m, k, (1 + ACTIONS) * ATOMS)) / np.sqrt(k)
    b = 0.1 * jax.random.normal(kb, (m, (1 + ACTIONS) * ATOMS))
    v_min = jax.random.uniform(kv, (rows,), minval=-2.0, maxval=-1.0)
    return a, w, b, v_min, 4.0 / (ATOMS - 1) + 0.0 * v_min


def model_path(heads: str, statistics: str):
    """The model's path: ``branch_heads`` → logits ``[B, m, 3, N]`` → M7."""

    def fn(a, w, b, v_min, delta_z):
        logits = branch_heads(a, list(w), list(b), heads)
        vm, dz = v_min[:, None, None], delta_z[:, None, None]
        _, mean, var, quant = distribution.statistics_of_logits(logits, vm, dz, statistics)
        return mean, var, quant

    return fn


def _part_kernel(a_ref, w_ref, b_ref, mean_ref, var_ref, *, upto, bm, n, actions, **kw):
    rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)
    row_ok = rows < a_ref.shape[0]
    branch = pl.program_id(1)
    logits = head_tiles(a_ref, w_ref, b_ref, rows, row_ok, branch, n=n, actions=actions, **kw)
    lane_ok = (jnp.arange(_pad_atoms(n), dtype=jnp.int32) < n)[None, :]
    for j in range(actions):
        col = branch * actions + j
        if upto == "gemm":
            # One lane sum keeps the product live; no softmax, no statistics.
            s = jnp.sum(jnp.where(lane_ok, logits[j], 0.0), axis=1)
            pl_triton.store(mean_ref.at[rows, col], s, mask=row_ok)
        else:
            mean_i, var_i, _ = row_statistics(logits[j], lane_ok, ())
            pl_triton.store(mean_ref.at[rows, col], mean_i, mask=row_ok)
            pl_triton.store(var_ref.at[rows, col], var_i, mask=row_ok)


def part_path(upto: str, interpret: bool):
    """A measurement aid, not a model path: the fused kernel cut after its product and the
    dueling combination (``upto="gemm"``: one lane sum stored per row and action) or after the
    softmax and moments (``"moments"``: no CDF, no quantiles). The difference of its time to
    the next row's says what that part of the epilogue costs."""
    bm, bk, warps = DEFAULT_HEAD_STAT_BLOCKS

    def fn(a, w, b, v_min, delta_z):
        m, k = w.shape[0], w.shape[1]
        n = w.shape[2] // (ACTIONS + 1)
        kernel = functools.partial(
            _part_kernel, upto=upto, bm=bm, bk=bk, n=n, num_k=k, actions=ACTIONS, bf16=False
        )
        per_row = jax.ShapeDtypeStruct((a.shape[0], m * ACTIONS), jnp.float32)
        mean, var = pl.pallas_call(
            kernel,
            out_shape=(per_row, per_row),
            grid=(pl.cdiv(a.shape[0], bm), m),
            compiler_params=_backend.compiler_params(warps),
            interpret=interpret,
            name=f"head_part_{upto}",
        )(a, w, b)
        shape = (a.shape[0], m, ACTIONS)
        return mean.reshape(shape), var.reshape(shape), jnp.zeros((*shape, len(LEVELS)))

    return fn


def _as_bf16_a(arrays, bf16):
    """The inputs with ``a`` in bfloat16 under ``--bf16`` (what the gate kernel writes there)."""
    return (arrays[0].astype(jnp.bfloat16), *arrays[1:]) if bf16 else arrays


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--shapes", default="65536x3,65536x1,4096x3", help="rows x m, comma-separated")
    ap.add_argument(
        "--tilings",
        default="64x32x4,128x32x4,128x32x8,64x16x4,64x64x4,32x32x4",
        help="bm x bk x warps of the fused kernel, comma-separated",
    )
    ap.add_argument(
        "--kernel-only", action="store_true", help="skip the model's paths but the first"
    )
    ap.add_argument(
        "--parts",
        action="store_true",
        help="also the default tiling with aligned weights, with the CDF as products, the "
        "per-action schedule (folded dueling) at four tilings, and "
        "(measurement aids, error not meaningful) the kernel cut after its product and after "
        "the moments",
    )
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="a in bfloat16, the per-action kernel with bfloat16 products at each --tilings",
    )
    args = ap.parse_args(argv)
    smoke, reps = args.smoke, 2 if args.smoke else args.reps
    dev = jax.devices()[0]
    mode = "  acting bf16 path" if args.bf16 else ""
    print(f"# {datetime.date.today()}  jax {jax.__version__}  {dev.device_kind}{mode}", flush=True)
    shapes = [(40, 3, 24)] if smoke else [(*s, 256) for s in int_tuples(args.shapes)]
    paths = [("XLA heads (blockdiag) + M7 reference", model_path("blockdiag", "reference"))]
    if not (smoke or args.kernel_only or args.bf16):
        paths += [
            ("XLA heads (blockdiag) + M7 scan", model_path("blockdiag", "scan")),
            ("XLA heads (split) + M7 reference", model_path("split", "reference")),
            ("Pallas heads + Pallas M7", model_path("pallas", "pallas")),
        ]
    tilings = [HeadStatBlocks(*t) for t in ([(16, 16, 4)] if smoke else int_tuples(args.tilings))]
    table = []
    for rows, m, k in shapes:
        size = f"{rows}×{m}×{k}"
        sets = [
            _as_bf16_a(inputs(kk, rows, m, k), args.bf16)
            for kk in jax.random.split(jax.random.key(rows + m), 2 * n_sets(4 * rows * m * k))
        ]
        want, ref_us = None, None
        kind = "per action, bf16 products," if args.bf16 else "fused kernel"
        candidates = list(paths) + [
            (
                f"{kind} bm={t.bm} bk={t.bk} w={t.warps}",
                functools.partial(
                    head_statistics_pallas,
                    actions=ACTIONS,
                    levels=LEVELS,
                    blocks=t,
                    interpret=smoke,
                    **({"per_action": True, "bf16": True} if args.bf16 else {}),
                ),
            )
            for t in tilings
        ]
        if args.parts:
            candidates += (
                [
                    (
                        "fused kernel, aligned weights (default tiling)",
                        functools.partial(
                            head_statistics_pallas,
                            actions=ACTIONS,
                            levels=LEVELS,
                            aligned=True,
                            interpret=smoke,
                        ),
                    ),
                    (
                        "fused kernel, CDF as products (default tiling)",
                        functools.partial(
                            head_statistics_pallas,
                            actions=ACTIONS,
                            levels=LEVELS,
                            cdf="products",
                            interpret=smoke,
                        ),
                    ),
                ]
                + [
                    (
                        f"per action (folded dueling) bm={t.bm} bk={t.bk} w={t.warps}",
                        functools.partial(
                            head_statistics_pallas,
                            actions=ACTIONS,
                            levels=LEVELS,
                            blocks=t,
                            per_action=True,
                            interpret=smoke,
                        ),
                    )
                    for t in (PER_ACTION_TILINGS[:1] if smoke else PER_ACTION_TILINGS[1:])
                ]
                + [
                    ("part: product + dueling only", part_path("gemm", smoke)),
                    ("part: + softmax and moments, no quantiles", part_path("moments", smoke)),
                ]
            )
        for name, fn in candidates:
            try:
                us = time_op(fn, sets, reps) * 1e6
                out = jax.jit(fn)(*sets[0])
            except Exception as e:  # a tiling Triton refuses: report it, go on
                print(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                continue
            if want is None:
                want, ref_us = [np.asarray(x) for x in out], us
            errs = [rel(jnp.reshape(g, w.shape), w) for g, w in zip(out, want, strict=True)]
            table.append((size, name, us, ref_us / us, max(errs)))
            print(table[-1], flush=True)
        del sets
    print_speed_table(table, "rows × m × K", "max rel. error (E, Var, Q)")


if __name__ == "__main__":
    main()
