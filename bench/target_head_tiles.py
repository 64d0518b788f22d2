"""The learner's target kernel (pallas_kernels/c51_target.py, ``kernels.target_head``) at the
learner's size, alone (a call's share of 50 chained in one program,
:func:`bench.loss_head_tiles.chained_us`) for each (groups a program, warps), from logits,
heads and padded heads, with the jnp path as the baseline (M6, M7's softmax and E[Q′], the
draw, the pick and P1's scatter-add reference, XLA-fused; issue 33). Prints a table last.

    python bench/target_head_tiles.py            # on the GPU
    python bench/target_head_tiles.py --tiny     # a CPU check that it runs (interpreted)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.loss_head_tiles import chained_us
from pallas_kernels.c51_loss import padded_width
from pallas_kernels.c51_target import _target_call, c51_target


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--groups", default="1,2,4,8", help="groups a program to try")
    ap.add_argument("--warps", default="1,2,4", help="warps a program to try")
    args = ap.parse_args()
    g, n = (64, 51) if args.tiny else (4096 * 4, 51)
    interpret = args.tiny
    k = jax.random.split(jax.random.PRNGKey(0), 4)
    noise = jax.random.gumbel(k[1], (g, 3))
    r = jax.random.normal(k[2], (g,)) * 0.5
    d = jnp.where(jnp.arange(g) % 50 == 0, 0.0, 0.97)
    vm, dz = jnp.full((g,), -5.0), jnp.full((g,), 0.2)
    floor = jnp.float32(1e-6)
    rows = []
    for dueling, width in ((False, n), (True, n), (True, padded_width(n))):
        x = jax.random.normal(k[0], (g, 4 if dueling else 3, width))
        mode = "padded" if width > n else "dueling" if dueling else "logits"
        ref = lambda x, v, du=dueling: c51_target(
            x, noise, r, d, v, dz, floor, num_atoms=n, dueling=du, backend="reference"
        )  # fmt: skip
        rows.append((mode, "jnp reference", "-", chained_us(ref, x, vm)))
        for bg in [int(v) for v in args.groups.split(",")]:
            for warps in [int(v) for v in args.warps.split(",")]:
                fn = lambda x, v, bg=bg, w=warps, du=dueling: _target_call(
                    x, noise, r, d, v, dz, floor, n, du, interpret, bg, w)  # fmt: skip
                try:
                    rows.append((mode, f"groups {bg}", warps, chained_us(fn, x, vm)))
                except Exception as err:  # a tiling Triton cannot build: say so, go on
                    print(f"{mode} bg={bg} warps={warps}: {type(err).__name__}")
            if args.tiny:
                break
    for mode in ("logits", "dueling", "padded"):
        tiled = [r for r in rows if r[0] == mode and r[2] != "-"]
        if tiled:
            best = min(tiled, key=lambda r: r[3])
            print(f"best {mode}: {best[1].split()[1]} {best[2]} ({best[3]:.1f} µs)")
    print(f"\njax {jax.__version__} on {jax.devices()[0].device_kind}; G = {g} groups x {n} atoms")
    print(f"{'input':<8} {'tiling':<16} {'warps':>5} {'µs':>8}")
    for mode, name, warps, t in rows:
        print(f"{mode:<8} {name:<16} {warps!s:>5} {t:8.1f}")


if __name__ == "__main__":
    main()
