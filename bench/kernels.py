"""Benchmark of the Pallas kernels (P1 C51 projection, P2 KAN gate, M7 statistics) against their
alternatives.

    PYTHONPATH=. python bench/kernels.py            # on the GPU; prints a markdown table last
    PYTHONPATH=. python bench/kernels.py --smoke    # tiny shapes, interpret mode, any machine
    PYTHONPATH=. python bench/kernels.py --only-m7  # the copy bandwidth and the M7 rows

Method. Each timed op runs on `n` distinct input sets chained by optimization barriers inside one
jitted program (so XLA can neither merge nor reorder them, and small inputs do not sit in L2),
and the time per op is (T(2n ops) − T(n ops)) / n with medians over repetitions: the fixed
dispatch and launch overhead of one call cancels. Bandwidth counts the fewest bytes the op must
move (each input read once, each output written once), so "of copy" is the fraction of the
elementwise-copy bandwidth measured in the same run: 1.0 would be a perfect memory-bound kernel.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent))

from pallas_kernels import (
    KanBlocks,
    c51_project,
    c51_project_dense,
    c51_project_reference,
    fallbacks,
    kan_gate,
    kan_gate_reference,
)

N_ATOMS = 51


def _chain(fn, count):
    def run(sets):
        outs, prev = [], None
        for args in sets[:count]:
            if prev is not None:
                args, prev = lax.optimization_barrier((args, prev))
            prev = fn(*args)
            outs.append(prev)
        return outs

    return jax.jit(run)


def time_op(fn, sets, reps):
    """Median seconds per call of fn over the distinct argument tuples in `sets` (even count)."""
    n = len(sets) // 2
    small, large = _chain(fn, n), _chain(fn, 2 * n)
    for f in (small, large):
        jax.block_until_ready(f(sets))
    samples = {small: [], large: []}
    for _ in range(reps):
        for f in (small, large):
            t0 = time.perf_counter()
            jax.block_until_ready(f(sets))
            samples[f].append(time.perf_counter() - t0)
    t_small, t_large = statistics.median(samples[small]), statistics.median(samples[large])
    per_op = (t_large - t_small) / n
    if per_op < 0.25 * t_large / (2 * n):  # noise swamped the difference: report the bound
        print(f"    (noisy: difference {per_op * 1e6:.1f} us, bound {t_large / (2 * n) * 1e6:.1f})")
        per_op = t_large / (2 * n)
    return per_op


def n_sets(bytes_per_set, target=256 << 20, lo=2, hi=16):
    """Enough input sets that one chain streams well past the 60 MB L2."""
    return int(np.clip(target // max(bytes_per_set, 1), lo, hi))


# ----------------------------------------------------------------------------------------- P1
def rlax_style_projection(probs, atoms, v_min, delta_z):
    """The published hat-function form (as in rlax's categorical_l2_project), one row at a time:
    an [N, N] matrix of clip(1 − |x_j − z_i| / Δz_i±, 0, 1) weights per row, vmapped."""

    def one_row(p, x):
        n = p.shape[0]
        z = v_min + delta_z * jnp.arange(n, dtype=p.dtype)
        x = jnp.clip(x, z[0], z[-1])
        gap_up = jnp.concatenate([z[1:] - z[:-1], jnp.zeros(1, p.dtype)])[:, None]
        gap_down = jnp.concatenate([jnp.zeros(1, p.dtype), z[1:] - z[:-1]])[:, None]
        inv_up = jnp.where(gap_up > 0, 1.0 / jnp.where(gap_up > 0, gap_up, 1.0), 0.0)
        inv_down = jnp.where(gap_down > 0, 1.0 / jnp.where(gap_down > 0, gap_down, 1.0), 0.0)
        delta = x[None, :] - z[:, None]  # [N dest, N src]
        scaled = jnp.where(delta >= 0.0, delta * inv_up, -delta * inv_down)
        return jnp.sum(jnp.clip(1.0 - scaled, 0.0, 1.0) * p[None, :], axis=-1)

    return jax.vmap(one_row)(probs, atoms)


def dense_src_major(probs, atoms, v_min, delta_z):
    """The dense pull with the destination atoms on the minor axis: ``[R, N_src, N_dst]``
    reduced over the sources (a column reduction), the alternative layout to
    ``c51_project_dense``'s ``[R, N_dst, N_src]`` row reduction."""
    n = probs.shape[-1]
    b = jnp.clip((atoms - v_min) * (1.0 / delta_z), 0.0, n - 1)
    low = jnp.floor(b)
    frac = (b - low)[..., None]
    low = low.astype(jnp.int32)[..., None]
    dest = jnp.arange(n, dtype=jnp.int32)
    p = probs[..., None]
    w = jnp.where(dest == low, p * (1.0 - frac), jnp.where(dest == low + 1, p * frac, 0.0))
    return jnp.sum(w, axis=-2)


def p1_inputs(key, rows, n=N_ATOMS):
    kl, kr, kg = jax.random.split(key, 3)
    probs = jax.nn.softmax(2.0 * jax.random.normal(kl, (rows, n)), axis=-1)
    support = jnp.linspace(-10.0, 10.0, n)
    reward = 3.0 * jax.random.normal(kr, (rows, 1))
    # γⁿ = 0.99 with 1 row in 64 terminal (γ = 0): the mix a learner projects
    gamma = jnp.where(jax.random.uniform(kg, (rows, 1)) < 1 / 64, 0.0, 0.99)
    return probs, reward + gamma * support, jnp.float32(-10.0), jnp.float32(20.0 / (n - 1))


# ----------------------------------------------------------------------------------------- P2
def kan_inputs(key, rows, feats):
    kx, kc, kw, kg = jax.random.split(key, 4)
    return (
        2.0 * jax.random.normal(kx, (rows, feats)),
        jax.random.normal(kc, (feats, 8)),
        jax.random.normal(kw, (feats,)),
        jax.random.normal(kg, (rows, feats)),
    )


def fwd_bwd(gate):
    def run(x, c, w, g):
        y, vjp = jax.vjp(gate, x, c, w)
        return (y, *vjp(g))

    return run


def _m7_tiled(logits, v_min, delta_z, *, block_rows, warps):
    """M7's Pallas kernel at one tiling, on ``[rows, 4, 3, N]`` logits (forward only)."""
    from jaxdqn.model.distribution import QUANTILE_LEVELS
    from pallas_kernels.statistics import c51_statistics_pallas

    lead, n = logits.shape[:-1], logits.shape[-1]
    flat = lambda x: jnp.broadcast_to(x, lead).reshape(-1)
    return c51_statistics_pallas(
        logits.reshape(-1, n),
        flat(v_min),
        flat(delta_z),
        levels=QUANTILE_LEVELS,
        block_rows=block_rows,
        num_warps=warps,
    )


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def int_tuples(text: str) -> list[tuple[int, ...]]:
    """``"64x32x4,128x32x8"`` → ``[(64, 32, 4), (128, 32, 8)]`` (shapes and tilings given on the
    command line; an empty string gives none)."""
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]


def print_speed_table(table, size_header: str, error_header: str = "rel. error") -> None:
    """The kernels that fell back, then rows ``(size, implementation, µs, speed-up, error)``
    as a markdown table."""
    if fallbacks():
        print("fallbacks:", fallbacks())
    print(f"\n| {size_header} | implementation | µs | speed-up | {error_header} |")
    print("|---|---|---:|---:|---:|")
    for size, name, us, speed, err in table:
        print(f"| {size} | {name} | {us:.1f} | {speed:.2f}× | {err:.1e} |")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, interpret mode")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--sweep-p2", action="store_true", help="also sweep KAN tilings")
    ap.add_argument("--only-p1", action="store_true", help="copy bandwidth and P1 rows only")
    ap.add_argument("--only-m7", action="store_true", help="copy bandwidth and M7 rows only")
    ap.add_argument("--p1-rows", default=None, help="P1 sizes, comma list (4096,...,262144)")
    args = ap.parse_args(argv)
    smoke = args.smoke
    backend = "interpret" if smoke else "pallas"
    reps = 2 if smoke else args.reps
    dev = jax.devices()[0]
    print(
        f"# {datetime.date.today()}  jax {jax.__version__}  device {dev.device_kind} "
        f"({dev.platform})",
        flush=True,
    )
    rows_out = []

    def record(group, name, size, sec, nbytes, ref_sec=None, err=None):
        rows_out.append(
            dict(
                group=group,
                name=name,
                size=size,
                us=sec * 1e6,
                gbs=nbytes / sec / 1e9,
                of_copy=nbytes / sec / copy_bw,
                speedup=(ref_sec / sec) if ref_sec else None,
                err=err,
            )
        )
        r = rows_out[-1]
        print(
            f"  {group:5s} {name:34s} {size:>16s} {r['us']:10.1f} us {r['gbs']:8.1f} GB/s "
            f"{r['of_copy']:6.2f} of copy" + (f"  err {err:.1e}" if err is not None else ""),
            flush=True,
        )

    key = jax.random.key(0)

    # -- copy bandwidth (elementwise read + write, XLA) and the D2D copy, same run
    elems = (1 << 14) if smoke else (256 << 20)  # 1 GiB of float32
    sets = [(jax.random.normal(k, (elems,)),) for k in jax.random.split(key, 4)]
    copy_sec = time_op(lambda x: x * 1.5, sets, reps)
    copy_bw = 8 * elems / copy_sec
    d2d_sec = time_op(lambda x: jnp.copy(x), sets, reps)
    print(
        f"elementwise copy {copy_bw / 1e12:.2f} TB/s, jnp.copy {8 * elems / d2d_sec / 1e12:.2f}"
        f" TB/s (bytes read + written)",
        flush=True,
    )
    record("copy", "elementwise x*1.5 (XLA)", f"{elems * 4 >> 20} MiB", copy_sec, 8 * elems)
    del sets

    # -- P1
    # 16,384 rows = the learner's B·4 at B = 4,096
    p1_sizes = [] if args.only_m7 else [40] if smoke else [4096, 16384, 65536, 262144]
    if args.p1_rows and not args.only_m7:
        p1_sizes = [int(r) for r in args.p1_rows.split(",")]
    p1_configs = [(16, 4)] if smoke else [(32, 4), (16, 2), (64, 4)]
    # the windowed pull (the pallas backend's kernel until 2026-12-06; wider supports' now)
    window = f"window{'_interpret' * smoke}"
    best_p1 = p1_configs[0]
    # the dense pull in registers (c51_project(backend='hat')): rows x warps
    p1_hat_configs = [(2, 2)] if smoke else [(2, 2), (4, 4), (8, 4), (8, 8), (16, 8)]
    for rows in p1_sizes:
        nbytes = 3 * rows * N_ATOMS * 4
        k_sets = n_sets(nbytes)
        sets = [
            p1_inputs(k, rows) for k in jax.random.split(jax.random.fold_in(key, rows), 2 * k_sets)
        ]
        want = np.asarray(c51_project_reference(*sets[0]))
        if rows == p1_sizes[-1] and len(p1_configs) > 1:
            timings = {}
            for br, nw in p1_configs:
                fn = lambda p, z, vm, dz, br=br, nw=nw: c51_project(
                    p, z, vm, dz, backend=window, block_rows=br, num_warps=nw
                )
                timings[(br, nw)] = time_op(fn, sets, reps)
                print(
                    f"  sweep P1 block_rows={br} warps={nw}: {timings[(br, nw)] * 1e6:.1f} us",
                    flush=True,
                )
            best_p1 = min(timings, key=timings.get)
        rlax_sec = time_op(rlax_style_projection, sets, reps)
        record(
            "P1",
            "rlax-style hat matrix (vmap)",
            f"R={rows}",
            rlax_sec,
            nbytes,
            err=rel(rlax_style_projection(*sets[0]), want),
        )
        scat_sec = time_op(c51_project_reference, sets, reps)
        record("P1", "jnp scatter reference", f"R={rows}", scat_sec, nbytes, rlax_sec)
        major_sec = time_op(dense_src_major, sets, reps)
        record(
            "P1",
            "jnp dense pull, sources major",
            f"R={rows}",
            major_sec,
            nbytes,
            rlax_sec,
            err=rel(dense_src_major(*sets[0]), want),
        )
        dense_sec = time_op(c51_project_dense, sets, reps)
        record(
            "P1",
            "jnp dense pull (deterministic)",
            f"R={rows}",
            dense_sec,
            nbytes,
            rlax_sec,
            err=rel(c51_project_dense(*sets[0]), want),
        )
        fn = functools.partial(
            c51_project, backend=window, block_rows=best_p1[0], num_warps=best_p1[1]
        )
        sec = time_op(fn, sets, reps)
        record(
            "P1",
            f"Pallas window pull (rows={best_p1[0]}, warps={best_p1[1]})",
            f"R={rows}",
            sec,
            nbytes,
            rlax_sec,
            err=rel(fn(*sets[0]), want),
        )
        for br, nw in p1_hat_configs:
            hat = functools.partial(
                c51_project, backend=f"hat{'_interpret' * smoke}", block_rows=br, num_warps=nw
            )
            record(
                "P1",
                f"Pallas hat (rows={br}, warps={nw})",
                f"R={rows}",
                time_op(hat, sets, reps),
                nbytes,
                rlax_sec,
                err=rel(hat(*sets[0]), want),
            )
        del sets

    best = None
    if not (args.only_p1 or args.only_m7):
        # -- P2
        feats = 40 if smoke else 1024
        p2_sizes = [37] if smoke else [4096, 65536]
        fwd_configs = (
            [KanBlocks(16, 16, 4, 8, 16, 4, 8)]
            if smoke
            else [
                KanBlocks(32, 128, 4),
                KanBlocks(16, 256, 4),
                KanBlocks(64, 128, 8),
                KanBlocks(8, 512, 4),
            ]
        )
        bwd_configs = (
            [(8, 16, 4, 8)]
            if smoke
            else [
                (8, 128, 4, 1024),
                (16, 128, 8, 1024),
                (8, 256, 8, 1024),
                (4, 256, 4, 2048),
                (8, 128, 4, 4096),
            ]
        )
        best = fwd_configs[0] if smoke else KanBlocks()  # the defaults, unless swept
        for rows in p2_sizes:
            elems = rows * feats
            k_sets = n_sets(16 * elems)
            sets = [
                kan_inputs(k, rows, feats)
                for k in jax.random.split(jax.random.fold_in(key, rows), 2 * k_sets)
            ]
            fwd_sets = [s[:3] for s in sets]
            x, c, w, g = sets[0]
            if rows == p2_sizes[-1] and args.sweep_p2 and not smoke:
                ft = {}
                for cfg in fwd_configs:
                    fn = lambda x, c, w, cfg=cfg: kan_gate(x, c, w, backend=backend, blocks=cfg)
                    ft[cfg] = time_op(fn, fwd_sets, reps)
                    print(f"  sweep P2 fwd {tuple(cfg[:3])}: {ft[cfg] * 1e6:.1f} us", flush=True)
                fwd_best = min(ft, key=ft.get)
                bt = {}
                for bcfg in bwd_configs:
                    cfg = KanBlocks(*fwd_best[:3], *bcfg)
                    fn = fwd_bwd(
                        lambda x, c, w, cfg=cfg: kan_gate(x, c, w, backend=backend, blocks=cfg)
                    )
                    bt[cfg] = time_op(fn, sets, reps)
                    print(f"  sweep P2 fwd+bwd {bcfg}: {bt[cfg] * 1e6:.1f} us", flush=True)
                best = min(bt, key=bt.get)
            ref_fwd = jax.jit(kan_gate_reference)
            ref_sec = time_op(ref_fwd, fwd_sets, reps)
            record("P2", "fwd: XLA-fused jnp reference", f"B={rows},F={feats}", ref_sec, 8 * elems)
            gate = functools.partial(kan_gate, backend=backend, blocks=best)
            fn = jax.jit(gate)
            sec = time_op(fn, fwd_sets, reps)
            record(
                "P2",
                "fwd: Pallas",
                f"B={rows},F={feats}",
                sec,
                8 * elems,
                ref_sec,
                err=rel(fn(x, c, w), ref_fwd(x, c, w)),
            )
            ref_fb = jax.jit(fwd_bwd(kan_gate_reference))
            ref_sec = time_op(ref_fb, sets, reps)
            record(
                "P2", "fwd+bwd: XLA-fused jnp reference", f"B={rows},F={feats}", ref_sec, 16 * elems
            )
            fn = jax.jit(fwd_bwd(gate))
            sec = time_op(fn, sets, reps)
            errs = [rel(a, b) for a, b in zip(fn(x, c, w, g), ref_fb(x, c, w, g), strict=True)]
            record(
                "P2",
                "fwd+bwd: Pallas",
                f"B={rows},F={feats}",
                sec,
                16 * elems,
                ref_sec,
                err=max(errs),
            )
            del sets, fwd_sets

    if not args.only_p1:
        # -- M7: softmax + E + Var + quantiles of [rows, 4, 3, N] logits; rows = the learner's B
        # and acting's E (kernels.statistics)
        from jaxdqn.model import distribution

        m7_sizes = [8] if smoke else [4096, 65536]
        m7_backend = "interpret" if smoke else "pallas"
        for rows in m7_sizes:
            nbytes = rows * 12 * (N_ATOMS + 5) * 4  # logits read once, 5 statistics written
            k_sets = n_sets(nbytes)
            sets = [
                (
                    3.0 * jax.random.normal(k, (rows, 4, 3, N_ATOMS)),
                    jnp.full((rows, 1, 1), -1.0),
                    jnp.full((rows, 1, 1), 0.1),
                )
                for k in jax.random.split(jax.random.fold_in(key, 7 * rows), 2 * k_sets)
            ]
            ref = lambda x, vm, dz: distribution.statistics_of_logits(x, vm, dz, "reference")[1:]
            ker = lambda x, vm, dz: distribution.statistics_of_logits(x, vm, dz, m7_backend)[1:]
            ref_sec = time_op(ref, sets, reps)
            record("M7", "jnp softmax + statistics (XLA)", f"B={rows}×12", ref_sec, nbytes)
            errs = [rel(a, b) for a, b in zip(ker(*sets[0]), ref(*sets[0]), strict=True)]
            sec = time_op(ker, sets, reps)
            record("M7", "Pallas statistics", f"B={rows}×12", sec, nbytes, ref_sec, max(errs))
            scan = lambda x, vm, dz: distribution.statistics_of_logits(x, vm, dz, "scan")[1:]
            errs = [rel(a, b) for a, b in zip(scan(*sets[0]), ref(*sets[0]), strict=True)]
            sec = time_op(scan, sets, reps)
            record(
                "M7", "jnp scan, atoms-major (XLA)", f"B={rows}×12", sec, nbytes, ref_sec, max(errs)
            )
            in_place = lambda x, vm, dz: distribution.statistics_by_scan(
                x, vm, dz, atoms_major=False
            )
            sec = time_op(in_place, sets, reps)
            record("M7", "jnp scan, in place (XLA)", f"B={rows}×12", sec, nbytes, ref_sec)
            if not smoke:  # the kernel's other tilings: is it its 64 × 64 tile that loses?
                for block_rows, warps in ((16, 1), (16, 2), (32, 2), (32, 4), (64, 8)):
                    tiled = functools.partial(_m7_tiled, block_rows=block_rows, warps=warps)
                    sec = time_op(tiled, sets, reps)
                    label = f"Pallas statistics {block_rows} rows, {warps} warps"
                    record("M7", label, f"B={rows}×12", sec, nbytes, ref_sec)
            del sets

    if fallbacks():
        print(f"WARNING: kernels fell back to the reference: {fallbacks()}", flush=True)
    print(
        f"\nP1 config: block_rows={best_p1[0]}, num_warps={best_p1[1]}; "
        f"P2 config: {tuple(best) if best else 'not measured'} (KanBlocks)"
    )
    print(f"copy bandwidth (elementwise, read+write): {copy_bw / 1e9:.0f} GB/s\n")
    print("| kernel | op | size | median µs | GB/s | of copy bw | speed-up vs baseline | rel err |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows_out:
        sp = f"{r['speedup']:.1f}×" if r["speedup"] else ""
        err = f"{r['err']:.1e}" if r["err"] is not None else ""
        print(
            f"| {r['group']} | {r['name']} | {r['size']} | {r['us']:.1f} | {r['gbs']:.0f} | "
            f"{r['of_copy']:.2f} | {sp} | {err} |"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                dict(
                    jax=jax.__version__,
                    device=dev.device_kind,
                    rows=rows_out,
                    p1=best_p1,
                    p2=list(best) if best else None,
                    copy_bw=copy_bw,
                ),
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
