"""Tilings of the loss-head kernels (pallas_kernels/c51_loss.py) at the learner's size: the
forward and the backward call alone, for each (groups a program, warps), with the jnp
reference's forward and VJP as the baseline (issue 33). Prints a table last.

Each number is a call's share of one program that chains 50 calls (:func:`chained_us`): timed
one call at a time, the dispatch and the host's wait (~100 µs on an H100) hid the kernels'
own ~10–40 µs (2026-12-07: every tiling and the reference measured 85–170 µs).

    python bench/loss_head_tiles.py            # on the GPU
    python bench/loss_head_tiles.py --tiny     # a CPU check that it runs (interpreted)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.iteration import median_time
from pallas_kernels.c51_loss import _backward_call, _forward_call, c51_loss_head, padded_width


def chained_us(fn, x, c, calls: int = 50):
    """µs a call of ``fn(x, c)``: ``calls`` calls in one unrolled program, each call's ``c``
    (a ``[G]`` input) moved by 1e-30 × the sum of every output of the call before, so XLA can
    neither hoist, overlap nor slice away any of them and the dispatch is paid once (the
    chain's sums — one more read of the outputs — and its ``[G]`` add are in every row alike);
    :func:`bench.iteration.median_time` of 10 programs / calls."""

    def program(x, c):
        def body(_, c):
            total = sum(jnp.sum(y.astype(jnp.float32)) for y in jax.tree.leaves(fn(x, c)))
            return c + 1e-30 * total

        return jax.lax.fori_loop(0, calls, body, c, unroll=True)

    return median_time(jax.jit(program), x, c, repeats=10) * 1e6 / calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--groups", default="16,32,64,128", help="groups a program to try")
    ap.add_argument("--warps", default="1,2,4,8", help="warps a program to try")
    args = ap.parse_args()
    g, n = (64, 51) if args.tiny else (4096 * 4, 51)
    interpret = args.tiny
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    acts = jax.random.randint(k[1], (g,), 0, 3)
    m = jax.nn.softmax(jax.random.normal(k[2], (g, n)))
    vm, dz = -jnp.ones((g,)), jnp.full((g,), 0.1)
    gce, gh = jnp.ones((g,)), jnp.ones((g, 3))
    rows = []
    for dueling, width in ((False, n), (True, n), (True, padded_width(n))):
        x = jax.random.normal(k[0], (g, 4 if dueling else 3, width))

        def ref_fwd_bwd(x, v, du=dueling):
            f = lambda y: c51_loss_head(y, acts, m, v, dz, dueling=du, backend="reference")
            _, vjp = jax.vjp(f, x)
            return vjp((gce, gh, jnp.zeros_like(gh)))

        ref = chained_us(ref_fwd_bwd, x, vm)
        mode = "padded" if width > n else "dueling" if dueling else "logits"
        rows.append((mode, "jnp reference (fwd + vjp)", "-", ref, None))
        for bg in [int(v) for v in args.groups.split(",")]:
            for warps in [int(v) for v in args.warps.split(",")]:
                fwd = lambda x, v, bg=bg, w=warps, du=dueling: _forward_call(
                    x, acts, m, v, dz, du, interpret, bg, w)  # fmt: skip
                bwd = lambda x, g, bg=bg, w=warps, du=dueling: _backward_call(
                    x, acts, m, g, gh, du, interpret, bg, w)  # fmt: skip
                try:
                    rows.append((mode, f"groups {bg}", warps, chained_us(fwd, x, vm),
                                 chained_us(bwd, x, gce)))  # fmt: skip
                except Exception as err:  # a tiling Triton cannot build: say so, go on
                    print(f"{mode} bg={bg} warps={warps}: {type(err).__name__}")
            if args.tiny:
                break
    for mode in ("logits", "dueling", "padded"):
        tiled = [r for r in rows if r[0] == mode and r[4] is not None]
        if tiled:
            best = min(tiled, key=lambda r: r[3] + r[4])
            print(f"best {mode}: {best[1].split()[1]} {best[2]} "
                  f"({best[3] + best[4]:.1f} µs fwd + bwd)")  # fmt: skip
    print(f"\njax {jax.__version__} on {jax.devices()[0].device_kind}; G = {g} groups x {n} atoms")
    print(f"{'input':<8} {'tiling':<28} {'warps':>5} {'fwd µs':>8} {'bwd µs':>8}")
    for mode, name, warps, f, b in rows:
        bs = "" if b is None else f"{b:8.1f}"
        print(f"{mode:<8} {name:<28} {warps!s:>5} {f:8.1f} {bs}")


if __name__ == "__main__":
    main()
