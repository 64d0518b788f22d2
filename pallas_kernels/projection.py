"""P1: the C51 categorical projection as Pallas Triton "pull" kernels, and its jnp reference.

Math (per row, N atoms). The destination support is z_i = v_min + i·Δz, i = 0 … N−1. Source
atom j (value x_j, probability p_j) sits at the fractional position
b_j = clip((x_j − v_min)/Δz, 0, N−1) and is split between its two neighbouring support points:

    out_i = Σ_j p_j · max(0, 1 − |b_j − i|)

i.e. p_j·(1 − f_j) to ⌊b_j⌋ and p_j·f_j to ⌊b_j⌋ + 1 with f_j = b_j − ⌊b_j⌋ (all of it to ⌊b_j⌋
when b_j is a support point). Source atoms outside the support are clipped to its ends. The map
is linear in p, so d out_i / d p_j = max(0, 1 − |b_j − i|) exactly.

Two kernels, both pulls (one writer per output: no atomics, deterministic):

* the hat kernel (:func:`_c51_hat_kernel`), the ``pallas`` backend's up to 64 padded atoms (the
  C51 learner's 51): every source against every destination lane in a register tile, reduced
  over the sources; two contiguous loads and one store a row, one path for every row;
* the window kernel (:func:`_c51_kernel`), wider supports' (its work a row grows as N, the hat
  kernel's as N²), below.

The window kernel (nothing of size [R, N, N] anywhere, O(N) work per row for the inputs a C51
learner produces):
  * a row block of `block_rows` rows × 64 lanes (N padded to a power of two, masked);
  * sources clipped at v_min (b ≤ 0) or v_max (b ≥ N−1) all land on one end lane: their masses
    are summed by a row reduction, not pulled one by one (clipping makes long runs there);
  * if the interior sources of a row all share one position (terminal transitions: r + γ·0·z),
    their total mass is split between the two lanes around it, again by reductions;
  * otherwise each destination lane i pulls the sources with i − 1 < b_j < i + 1. For r + γ·z
    the positions b_j are non-decreasing in j, so those sources are a short run (about 2/γ)
    whose start an affine fit through the first and last interior positions predicts to ±1.
    Each lane reads a fixed window of WINDOW = 7 sources (gathers that hit L1/L2, not HBM):
    two guards and five candidates. The window is *proved* complete when each guard is
    outside the interior or on the far side of lane i ± 1 (sortedness then excludes every
    source outside it); unproved rows (non-affine interiors, γ below about 1/2) and rows
    whose atoms are not sorted (the API allows any order) take an exact fallback loop over
    all N sources (N·64 work), only in row blocks that contain such a row.
  * positions are (x − v_min)·(1/Δz), one division per row; the reference does the same.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend

__all__ = [
    "c51_project",
    "c51_project_dense",
    "c51_project_pallas",
    "c51_project_reference",
    "default_method",
]

DEFAULT_BLOCK_ROWS = 32
DEFAULT_NUM_WARPS = 4
# (block_rows, num_warps) by method. The hat kernel's tile is block_rows x 64 x 64: 2 rows x
# 2 warps was the fastest of five tilings at 16,384 and 65,536 rows (H100, 2026-12-06).
TILINGS = {"window": (DEFAULT_BLOCK_ROWS, DEFAULT_NUM_WARPS), "hat": (2, 2)}
# The widest padded support the pallas / interpret backends give the hat kernel: its work and
# registers grow as lanes² a row (measured at 51 atoms, 64 lanes: 1.8x the window kernel's
# speed); wider supports take the window kernel, whose work a row grows as lanes.
HAT_MAX_LANES = 64
# c51_project backends that are not _backend's: (mode, method)
_NAMED_BACKENDS = {
    "dense": ("dense", "window"),
    "hat": ("pallas", "hat"),
    "hat_interpret": ("interpret", "hat"),
    "window": ("pallas", "window"),
    "window_interpret": ("interpret", "window"),
}


def _lanes(n: int) -> int:
    """The lanes a row of ``n`` atoms is padded to (a power of two, Triton's block rule)."""
    return max(16, int(pl.next_power_of_2(n)))


def default_method(n: int) -> str:
    """The kernel the pallas / interpret backends run for ``n`` atoms: ``hat`` up to
    :data:`HAT_MAX_LANES` padded lanes, ``window`` above."""
    return "hat" if _lanes(n) <= HAT_MAX_LANES else "window"


WINDOW = 7  # sources a lane reads: 2 guards + 5 candidates (≤ 4 sources at γ ≥ 1/2, ±1 slack)


def _check(probs: jax.Array, src_atoms: jax.Array, v_min, delta_z, name: str):
    probs = jnp.asarray(probs)
    src_atoms = jnp.asarray(src_atoms)
    if probs.ndim < 1 or probs.shape != src_atoms.shape or probs.shape[-1] < 2:
        raise ValueError(
            f"{name}: probs and src_atoms must share a shape [..., N] with N >= 2, "
            f"got {probs.shape} and {src_atoms.shape}"
        )
    lead = probs.shape[:-1]
    v_min = jnp.asarray(v_min, probs.dtype)
    delta_z = jnp.asarray(delta_z, probs.dtype)
    for arg, label in ((v_min, "v_min"), (delta_z, "delta_z")):
        if arg.shape not in ((), lead):
            raise ValueError(f"{name}: {label} must be a scalar or {lead}, got {arg.shape}")
    return probs, src_atoms, v_min, delta_z


def _split(probs, src_atoms, v_min, delta_z):
    """Rows ``[R, N]`` of ``(p_j, ⌊b_j⌋ int32, f_j)``: where each source atom lands."""
    n = probs.shape[-1]
    # times the reciprocal, exactly as the kernel does (on-support atoms stay on support alike)
    b = (src_atoms - v_min[..., None]) * (1.0 / delta_z[..., None])
    b = jnp.clip(b, 0.0, n - 1).reshape(-1, n)
    low = jnp.floor(b)
    return probs.reshape(-1, n), low.astype(jnp.int32), b - low


def c51_project_reference(
    probs: jax.Array, src_atoms: jax.Array, v_min: jax.Array | float, delta_z: jax.Array | float
) -> jax.Array:
    """Categorical projection by a jnp scatter-add (see the module docstring for the math).

    Args:
      probs: [..., N] probabilities of the source atoms.
      src_atoms: [..., N] source atom values (e.g. r + γⁿ·z'), any order.
      v_min: scalar or [...] lowest support value of the destination support.
      delta_z: scalar or [...] spacing of the destination support (> 0).

    Returns:
      [..., N] projected probabilities on v_min + i·delta_z, dtype of probs.
    """
    probs, src_atoms, v_min, delta_z = _check(probs, src_atoms, v_min, delta_z, "c51_project")
    shape = probs.shape
    p, low, frac = _split(probs, src_atoms, v_min, delta_z)
    rows = jnp.arange(p.shape[0])[:, None]
    out = jnp.zeros_like(p).at[rows, low].add(p * (1.0 - frac))
    out = out.at[rows, low + 1].add(p * frac, mode="drop")  # low + 1 = N only with frac = 0
    return out.reshape(shape)


def c51_project_dense(
    probs: jax.Array, src_atoms: jax.Array, v_min: jax.Array | float, delta_z: jax.Array | float
) -> jax.Array:
    """Categorical projection as a "pull" in jnp: every destination atom sums its weighted
    sources, out_i = Σ_j p_j · w_ij with w_ij = 1 − f_j if i = ⌊b_j⌋, f_j if i = ⌊b_j⌋ + 1,
    else 0 (the reference's two terms, computed identically; only the order of the sum
    differs). One writer per output and no scatter: the result does not depend on the order
    in which a GPU runs threads (``train.deterministic``). Written as a reduction over j of an
    elementwise ``[R, N, N]`` expression, which XLA fuses (nothing of that size is stored).
    Arguments and result as :func:`c51_project_reference`.
    """
    probs, src_atoms, v_min, delta_z = _check(probs, src_atoms, v_min, delta_z, "c51_project")
    shape = probs.shape
    n = shape[-1]
    p, low, frac = (x[:, None, :] for x in _split(probs, src_atoms, v_min, delta_z))  # [R,1,N]
    dest = jnp.arange(n, dtype=jnp.int32)[None, :, None]  # [1, N_dst, 1]
    w = jnp.where(dest == low, p * (1.0 - frac), jnp.where(dest == low + 1, p * frac, 0.0))
    return jnp.sum(w, axis=-1).reshape(shape)


class _RowBlock(NamedTuple):
    """One program's rows: ``rows_out`` ``[BR]`` (raw, for the store), ``rows`` (clamped in
    bounds, for gathers), ``row_ok`` ``[BR]``, ``lane`` ``[1, L]``, ``valid`` ``[BR, L]``, and
    the rows' ``v_min`` and ``1/Δz`` (``[BR, 1]`` per row, else scalars)."""

    rows_out: jax.Array
    rows: jax.Array
    row_ok: jax.Array
    lane: jax.Array
    valid: jax.Array
    vmin: jax.Array
    inv_dz: jax.Array


def _row_block(p_ref, vmin_ref, dz_ref, *, n, block_rows, lanes, per_row) -> _RowBlock:
    """What both P1 kernels start from (see :class:`_RowBlock`)."""
    num_rows = p_ref.shape[0]
    rows_out = pl.program_id(0) * block_rows + jnp.arange(block_rows, dtype=jnp.int32)
    row_ok = rows_out < num_rows
    # Gathers use clamped (in-bounds) row addresses; the store must not: the interpreter
    # writes masked-off duplicates of an address too, so they must fall outside the array.
    rows = jnp.minimum(rows_out, num_rows - 1)
    lane = jnp.arange(lanes, dtype=jnp.int32)[None, :]
    valid = row_ok[:, None] & (lane < n)
    if per_row:
        vmin = pl_triton.load(vmin_ref.at[rows], mask=row_ok, other=0.0)[:, None]
        inv_dz = 1.0 / pl_triton.load(dz_ref.at[rows], mask=row_ok, other=1.0)[:, None]
    else:
        vmin, inv_dz = vmin_ref[0], 1.0 / dz_ref[0]
    return _RowBlock(rows_out, rows, row_ok, lane, valid, vmin, inv_dz)


def _c51_kernel(p_ref, z_ref, vmin_ref, dz_ref, *rest, n, block_rows, lanes, per_row):
    o_ref = rest[-1]  # rest = (o_ref,) or (aliased poison input, o_ref)
    i32 = jnp.int32
    blk = _row_block(
        p_ref, vmin_ref, dz_ref, n=n, block_rows=block_rows, lanes=lanes, per_row=per_row
    )
    rows_out, rows, row_ok, lane, valid, vmin, inv_dz = blk
    r2 = rows[:, None]
    lane_f = lane.astype(jnp.float32)
    in_row = lane < n

    def any_(mask):
        return jnp.max(mask.astype(i32)) > 0

    def gather(ref, j, mask):
        """ref[row, j] for a [BR, L] tile of atom indices j (masked; L1/L2 hits)."""
        return pl_triton.load(ref.at[r2, jnp.clip(j, 0, n - 1)], mask=mask, other=0.0)

    tile = (rows_out[:, None], lane)  # raw indices under the mask: contiguous along lanes
    p = pl_triton.load(p_ref.at[tile], mask=valid, other=0.0)
    b = (pl_triton.load(z_ref.at[tile], mask=valid, other=0.0) - vmin) * inv_dz
    top = float(n - 1)
    low = valid & (b <= 0.0)
    high = valid & (b >= top)
    mid = valid & ~low & ~high

    # Unsorted rows go to the exact fallback loop at the end.
    nxt = valid & (lane + 1 < n)
    b_next = (gather(z_ref, lane + 1, nxt) - vmin) * inv_dz
    naive = jnp.max(jnp.where(nxt & (b_next < b), 1, 0), axis=1) > 0
    n_low = jnp.sum(low.astype(i32), axis=1)
    n_high = jnp.sum(high.astype(i32), axis=1)
    n_mid = jnp.sum(mid.astype(i32), axis=1)
    b_first = jnp.min(jnp.where(mid, b, jnp.inf), axis=1)
    b_last = jnp.max(jnp.where(mid, b, -jnp.inf), axis=1)
    flat = (n_mid > 0) & (b_first == b_last)
    pull = ~naive & (n_mid > 1) & ~flat

    # Window pull. For sorted rows the interior sources (0 < b < N−1) are j_lo … j_hi−1 and
    # lane i needs those with i − 1 < b_j < i + 1, a run starting at s_i = first j with
    # b_j > i − 1. An affine fit through the first and last interior positions gives s_i to
    # ±1 (rounding); lane i reads the WINDOW sources w_i … w_i + WINDOW − 1, w_i = est − 2.
    # The window is proved complete when its first source is not interior or lies at or below
    # i − 1, and its last is not interior or lies at or above i + 1 (b is sorted, so nothing
    # outside can reach lane i; the two guards themselves contribute nothing). Rows where
    # some lane fails (non-affine interiors, γ < ~2/3 with 4+ sources per lane) take the exact
    # fallback instead. One division per row, none per gather.
    j_lo = jnp.where(pull, n_low, 0)[:, None]
    j_hi = jnp.where(pull, n - n_high, 0)[:, None]
    span = jnp.maximum(j_hi - 1 - j_lo, 1).astype(jnp.float32)
    inv_slope = jnp.where(pull[:, None], span / (b_last - b_first)[:, None], 1.0)
    est = jnp.floor((lane_f - 1.0 - b_first[:, None]) * inv_slope) + 1.0
    est = jnp.where(pull[:, None], jnp.clip(est, 0.0, float(n)), 0.0)
    first = jnp.clip(j_lo + est.astype(i32), j_lo, j_hi) - 2
    acc = jnp.zeros((block_rows, lanes), jnp.float32)
    complete = None
    for k in range(WINDOW):
        j = first + k
        inner = (j >= j_lo) & (j < j_hi)
        bj = (gather(z_ref, j, inner) - vmin) * inv_dz
        if k == 0:
            complete = ~inner & (j < j_lo) | inner & (bj <= lane_f - 1.0)
        elif k == WINDOW - 1:
            complete = complete & (~inner & (j >= j_hi) | inner & (bj >= lane_f + 1.0))
        else:
            acc = acc + gather(p_ref, j, inner) * jnp.maximum(1.0 - jnp.abs(bj - lane_f), 0.0)
    naive = naive | pull & (jnp.max(jnp.where(in_row & ~complete, 1, 0), axis=1) > 0)
    fast = ~naive[:, None]
    acc = jnp.where(fast, acc, 0.0)

    # Exact fallback (unsorted or unproved rows): every source against every lane.
    def naive_body(j, acc):
        m = row_ok & naive
        pj = pl_triton.load(p_ref.at[rows, j], mask=m, other=0.0)[:, None]
        zj = pl_triton.load(z_ref.at[rows, j], mask=m, other=0.0)[:, None]
        bj = jnp.clip((zj - vmin) * inv_dz, 0.0, top)
        return acc + pj * jnp.maximum(1.0 - jnp.abs(bj - lane_f), 0.0)

    # an explicit while loop: fori_loop with a traced bound mixes index types in scf.for
    trips = jnp.where(any_(naive), jnp.int32(n), jnp.int32(0))
    acc = lax.while_loop(
        lambda c: c[0] < trips, lambda c: (c[0] + 1, naive_body(c[0], c[1])), (jnp.int32(0), acc)
    )[1]

    # Clipped sources land on the end lanes; all-equal interiors (terminal rows) on two lanes.
    p_low = jnp.sum(jnp.where(low, p, 0.0), axis=1)[:, None]
    p_high = jnp.sum(jnp.where(high, p, 0.0), axis=1)[:, None]
    p_mid = jnp.sum(jnp.where(mid, p, 0.0), axis=1)[:, None]
    out = acc + jnp.where(fast & (lane == 0), p_low, 0.0)
    out = out + jnp.where(fast & (lane == n - 1), p_high, 0.0)
    flat_pos = jnp.where(flat & ~naive, b_first, -4.0)  # -4: no lane matches
    flat_low = jnp.floor(flat_pos)
    frac = (flat_pos - flat_low)[:, None]
    flat_low = flat_low.astype(i32)[:, None]
    out = out + jnp.where(lane == flat_low, p_mid * (1.0 - frac), 0.0)
    out = out + jnp.where(lane == flat_low + 1, p_mid * frac, 0.0)
    pl_triton.store(o_ref.at[tile], out, mask=valid)


def _c51_hat_kernel(p_ref, z_ref, vmin_ref, dz_ref, *rest, n, block_rows, lanes, per_row):
    """P1 as a dense pull in registers: out_i = Σ_j p_j·max(0, 1 − |b_j − i|) over a
    ``[block_rows, lanes (sources), lanes (destinations)]`` tile, reduced over the sources.
    N·64 hat weights a row (~4k FMAs-worth) instead of the window's 13 masked gathers a lane:
    arithmetic the GPU has plenty of, two contiguous loads and one store a row, any source
    order (clipping, terminal and unsorted rows need no path of their own)."""
    o_ref = rest[-1]
    blk = _row_block(
        p_ref, vmin_ref, dz_ref, n=n, block_rows=block_rows, lanes=lanes, per_row=per_row
    )
    tile, valid = (blk.rows_out[:, None], blk.lane), blk.valid
    p = pl_triton.load(p_ref.at[tile], mask=valid, other=0.0)  # padded sources carry 0
    z = pl_triton.load(z_ref.at[tile], mask=valid, other=0.0)
    b = jnp.clip((z - blk.vmin) * blk.inv_dz, 0.0, float(n - 1))
    dest = blk.lane.astype(jnp.float32)[:, None, :]  # [1, 1, L]
    hat = jnp.maximum(1.0 - jnp.abs(b[:, :, None] - dest), 0.0)  # [BR, L_src, L_dst]
    out = jnp.sum(p[:, :, None] * hat, axis=1)
    pl_triton.store(o_ref.at[tile], out, mask=valid)


def c51_project_pallas(
    probs: jax.Array,
    src_atoms: jax.Array,
    v_min: jax.Array,
    delta_z: jax.Array,
    *,
    interpret: bool = False,
    block_rows: int = DEFAULT_BLOCK_ROWS,
    num_warps: int = DEFAULT_NUM_WARPS,
    out: jax.Array | None = None,
    method: str = "window",
) -> jax.Array:
    """The raw kernel on 2-D float32 inputs: probs, src_atoms [R, N]; v_min, delta_z [1] or [R].
    ``method``: ``window`` (the module docstring's pull) or ``hat`` (:func:`_c51_hat_kernel`).

    `out` (optional, [R, N] float32) is aliased as the output buffer, so a test can poison it
    and check that every entry is written. No custom_vjp here; use `c51_project`.
    """
    num_rows, n = probs.shape
    lanes = _lanes(n)
    if block_rows & (block_rows - 1):
        raise ValueError(f"c51_project: block_rows must be a power of two, got {block_rows}")
    per_row = v_min.shape != (1,)
    bodies = {"window": _c51_kernel, "hat": _c51_hat_kernel}
    if method not in bodies:
        raise ValueError(f"c51_project: method must be one of {tuple(bodies)}, got {method!r}")
    body = bodies[method]
    kernel = functools.partial(body, n=n, block_rows=block_rows, lanes=lanes, per_row=per_row)
    args = [probs, src_atoms, v_min, delta_z]
    aliases = {}
    if out is not None:
        aliases = {4: 0}
        args.append(out)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_rows, n), jnp.float32),
        grid=(pl.cdiv(num_rows, block_rows),),
        input_output_aliases=aliases,
        compiler_params=_backend.compiler_params(num_warps),
        interpret=interpret,
        name="c51_project",
    )(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _project(p, z, v_min, delta_z, mode, block_rows, num_warps, method):
    if mode in ("reference", "dense"):
        fn = c51_project_reference if mode == "reference" else c51_project_dense
        return fn(
            p, z, v_min if v_min.size > 1 else v_min[0], delta_z if delta_z.size > 1 else delta_z[0]
        )
    out = c51_project_pallas(
        p.astype(jnp.float32),
        z.astype(jnp.float32),
        v_min.astype(jnp.float32),
        delta_z.astype(jnp.float32),
        interpret=mode == "interpret",
        block_rows=block_rows,
        num_warps=num_warps,
        method=method,
    )
    return out.astype(p.dtype)


def _project_fwd(p, z, v_min, delta_z, mode, block_rows, num_warps, method):
    out = _project(p, z, v_min, delta_z, mode, block_rows, num_warps, method)
    return out, (z, v_min, delta_z)


def _project_bwd(mode, block_rows, num_warps, method, res, g):
    """d/dp_j = Σ_i g_i·max(0, 1 − |b_j − i|) = (1 − f_j)·g[⌊b_j⌋] + f_j·g[⌊b_j⌋ + 1]."""
    del mode, block_rows, num_warps, method
    z, v_min, delta_z = res
    n = z.shape[-1]
    vm = v_min[:, None] if v_min.size > 1 else v_min[0]
    dz = delta_z[:, None] if delta_z.size > 1 else delta_z[0]
    b = jnp.clip((z - vm) * (1.0 / dz), 0.0, n - 1)
    low = jnp.floor(b)
    frac = (b - low).astype(g.dtype)
    low = low.astype(jnp.int32)
    g_low = jnp.take_along_axis(g, low, axis=-1)
    g_up = jnp.take_along_axis(g, jnp.minimum(low + 1, n - 1), axis=-1)
    dp = (1.0 - frac) * g_low + frac * g_up
    return dp, jnp.zeros_like(z), jnp.zeros_like(v_min), jnp.zeros_like(delta_z)


_project.defvjp(_project_fwd, _project_bwd)


def _build_probe(n: int, per_row: bool, block_rows: int, num_warps: int, method: str):
    rows = 2 * block_rows + 3  # two full blocks and a ragged one

    def build():
        f32 = jax.ShapeDtypeStruct
        vshape = (rows,) if per_row else (1,)
        fn = jax.jit(
            functools.partial(
                c51_project_pallas, block_rows=block_rows, num_warps=num_warps, method=method
            )
        )
        compiled = fn.lower(
            f32((rows, n), jnp.float32),
            f32((rows, n), jnp.float32),
            f32(vshape, jnp.float32),
            f32(vshape, jnp.float32),
        ).compile()
        jax.block_until_ready(
            compiled(
                np.zeros((rows, n), np.float32),
                np.zeros((rows, n), np.float32),
                np.zeros(vshape, np.float32),
                np.ones(vshape, np.float32),
            )
        )

    return build


def c51_project(
    probs: jax.Array,
    src_atoms: jax.Array,
    v_min: jax.Array | float,
    delta_z: jax.Array | float,
    *,
    backend: str = "auto",
    block_rows: int | None = None,
    num_warps: int | None = None,
    fallback: str = "reference",
) -> jax.Array:
    """Categorical (C51) projection; arguments and result as `c51_project_reference`.

    backend: "auto" (Pallas on GPU, reference elsewhere), "pallas" / "interpret" (the Pallas
    kernel compiled / under the Pallas interpreter, for CPU tests: :func:`default_method`'s,
    the hat kernel at ≤ 64 padded atoms, else the window kernel), "hat" / "hat_interpret" (the
    dense pull in registers, :func:`_c51_hat_kernel`), "window" / "window_interpret" (the
    windowed pull of the module docstring, :func:`_c51_kernel`), "reference" (jnp scatter-add)
    or "dense" (:func:`c51_project_dense`, a jnp pull: no scatter, deterministic on GPUs).
    block_rows, num_warps: the Pallas tiling (None: the method's default, :data:`TILINGS`).
    The Pallas paths compute in float32. Differentiable through a custom_vjp: the exact
    gradient w.r.t. probs (the projection is linear in it) and zeros w.r.t. src_atoms, v_min
    and delta_z, so a stray jax.grad through a target works instead of failing to linearise
    the kernel.
    fallback: what runs when the Pallas kernel cannot be built here ("reference" or "dense";
    a deterministic caller asks for "dense").
    """
    probs, src_atoms, v_min, delta_z = _check(probs, src_atoms, v_min, delta_z, "c51_project")
    if fallback not in ("reference", "dense"):
        raise ValueError(f"c51_project: fallback must be reference or dense, got {fallback!r}")
    if backend not in _NAMED_BACKENDS and backend not in _backend.BACKENDS:
        raise ValueError(
            "c51_project: backend must be one of "
            f"{_backend.BACKENDS + tuple(_NAMED_BACKENDS)}, got {backend!r}"
        )
    mode, method = _NAMED_BACKENDS.get(backend) or (
        _backend.resolve(backend, "c51_project"),
        default_method(probs.shape[-1]),
    )
    rows0, warps0 = TILINGS[method]
    block_rows = rows0 if block_rows is None else block_rows
    num_warps = warps0 if num_warps is None else num_warps
    shape = probs.shape
    n = shape[-1]
    p = probs.reshape(-1, n)
    z = src_atoms.reshape(-1, n)
    per_row = v_min.ndim > 0 or delta_z.ndim > 0
    if per_row:
        v_min = jnp.broadcast_to(v_min, shape[:-1]).reshape(-1)
        delta_z = jnp.broadcast_to(delta_z, shape[:-1]).reshape(-1)
    else:
        v_min, delta_z = v_min.reshape(1), delta_z.reshape(1)
    if mode == "pallas":
        key = ("c51_project", n, per_row, block_rows, num_warps, method)
        probe = _build_probe(n, per_row, block_rows, num_warps, method)
        if not _backend.kernel_available(key, probe):
            mode = fallback
    return _project(p, z, v_min, delta_z, mode, block_rows, num_warps, method).reshape(shape)
