"""The dueling heads of several branches, three ways (issue 33, ``kernels.heads``): one
block-diagonal GEMM (``blockdiag``), one GEMM per branch (``split``) and the Pallas Triton
kernels (``pallas``, at several tilings), timed alone at the learner's and acting's sizes.

Each case times, in one jitted program, the forward ``a [B, m·AH] → logits [B, m, 3, N]`` and
the forward + backward (``jax.vjp`` with a fixed cotangent: da, dW, db), at the precision of
the model's products (JAX's float32 default, TF32 on an H200). Medians of ``--repeats`` calls
of ``--inner`` applications each (a ``fori_loop`` whose carry feeds the next call, so XLA can
neither hoist nor drop them). The head FLOPs (``2·B·AH·4N·m`` forward, 3× that for forward +
backward; blockdiag executes m times as many) give the achieved rate. Prints a table last.

    python bench/heads.py                    # configs/gpu.yaml sizes (on the H200)
    python bench/heads.py --tiny             # small sizes, interpret mode: checks the script
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxdqn.branches import NUM_ACTIONS  # noqa: E402
from jaxdqn.model.heads import branch_heads  # noqa: E402
from pallas_kernels import fallbacks  # noqa: E402
from pallas_kernels.heads import HeadBlocks, dueling_heads  # noqa: E402

#: Tilings of the Pallas kernels to compare (fwd_bm, fwd_bk, da_bm, da_bn, dw_ba, dw_br).
TILINGS = {
    "default": HeadBlocks(),
    "bm64": HeadBlocks(fwd_bm=64, da_bm=64, dw_ba=64),
    "bk64": HeadBlocks(fwd_bk=64, dw_br=64),
    "w8": HeadBlocks(fwd_warps=8, da_warps=8, dw_warps=8),
}


def heads_fn(impl: str, blocks: HeadBlocks, interpret: bool):
    """``(a, w, bias) -> logits`` of one implementation; w ``[m, AH, 4N]``, bias ``[m, 4N]``."""
    if impl == "pallas":
        backend = "interpret" if interpret else "pallas"
        return lambda a, w, b: dueling_heads(
            a, w, b, actions=NUM_ACTIONS, backend=backend, blocks=blocks
        )
    return lambda a, w, b: branch_heads(a, list(w), list(b), impl)


def time_case(fn, a, w, b, g, inner: int, repeats: int, backward: bool) -> float:
    """Median µs of one application (forward, or forward + backward)."""

    def once(a):
        if not backward:
            return fn(a, w, b)
        out, vjp = jax.vjp(fn, a, w, b)
        da, dw, db = vjp(g)
        return out + 1e-30 * (da.sum() + dw.sum() + db.sum())

    def loop(a):
        def body(_, carry):
            a, acc = carry
            out = once(a)
            return a + 1e-30 * out[:, :1, 0, :1].sum(), acc + out.sum()

        return jax.lax.fori_loop(0, inner, body, (a, jnp.zeros((), jnp.float32)))

    f = jax.jit(loop)
    jax.block_until_ready(f(a))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f(a))
        times.append(time.perf_counter() - t)
    return statistics.median(times) / inner * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--rows", default=None, help="comma list (default 4096,65536; tiny 64)")
    ap.add_argument("--branches", default="4,3", help="m, comma list (4 all off, 3 with M5)")
    ap.add_argument("--inner", type=int, default=None, help="applications per call (20; 2)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tilings", default=",".join(TILINGS))
    args = ap.parse_args(argv)
    interpret = args.tiny
    ah, n = (16, 51) if args.tiny else (256, 51)
    rows = [int(r) for r in (args.rows or ("64" if args.tiny else "4096,65536")).split(",")]
    inner = args.inner or (2 if args.tiny else 20)
    tilings = [t for t in args.tilings.split(",") if t]
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; AH = {ah}, N = {n}; "
          f"{inner} applications per call, median of {args.repeats}", flush=True)  # fmt: skip
    table = []
    for m in (int(x) for x in args.branches.split(",")):
        key = jax.random.PRNGKey(m)
        kw, kb = jax.random.split(key)
        w = 0.05 * jax.random.normal(kw, (m, ah, (1 + NUM_ACTIONS) * n))
        b = 0.1 * jax.random.normal(kb, (m, (1 + NUM_ACTIONS) * n))
        for r in rows:
            a = jax.random.normal(jax.random.PRNGKey(r), (r, m * ah))
            g = jax.random.normal(jax.random.PRNGKey(r + 1), (r, m, NUM_ACTIONS, n))
            flops = 2 * r * ah * (1 + NUM_ACTIONS) * n * m
            cases = [("blockdiag", HeadBlocks()), ("split", HeadBlocks())]
            cases += [(f"pallas {t}", TILINGS[t]) for t in tilings]
            for name, blocks in cases:
                fn = heads_fn(name.split()[0], blocks, interpret)
                fwd = time_case(fn, a, w, b, g, inner, args.repeats, backward=False)
                both = time_case(fn, a, w, b, g, inner, args.repeats, backward=True)
                table.append((m, r, name, fwd, both, flops))
                print(f"m={m} B={r} {name}: forward {fwd:.1f} µs, forward+backward {both:.1f} µs",
                      flush=True)  # fmt: skip
    if fallbacks():
        print(f"Pallas fallbacks (these rows ran the jnp reference): {fallbacks()}")
    print()
    print(
        "| m | rows | heads | forward µs | TFLOP/s | fwd + bwd µs | TFLOP/s | vs blockdiag (f+b) |"
    )
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    base = {(m, r): both for m, r, name, _, both, _ in table if name == "blockdiag"}
    for m, r, name, fwd, both, flops in table:
        print(f"| {m} | {r:,} | {name} | {fwd:.1f} | {flops / fwd / 1e6:.1f} | {both:.1f} | "
              f"{3 * flops / both / 1e6:.1f} | {base[m, r] / both:.2f}× |")  # fmt: skip


if __name__ == "__main__":
    main()
