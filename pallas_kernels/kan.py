"""M4 / P2: the KAN spline gate's Pallas Triton kernels, forward and backward, under a
``custom_vjp``; the math and the pure-jnp reference are in :mod:`pallas_kernels.kan_reference`
(re-exported here).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend
from pallas_kernels.kan_reference import (
    NUM_BASES,
    NUM_INTERVALS,
    kan_gate_init,
    kan_gate_reference,
    spline_weights,
    tail_weights,
)

__all__ = [
    "NUM_BASES",
    "NUM_INTERVALS",
    "KanBlocks",
    "kan_gate",
    "kan_gate_bwd_pallas",
    "kan_gate_fwd_pallas",
    "kan_gate_init",
    "kan_gate_reference",
    "row_loop_grid",
    "spline_basis_sums",
    "spline_gate_slope_tile",
    "spline_weights",
    "tail_weights",
]


# ----------------------------------------------------------------------------------------------
# P2: Pallas Triton kernels. Tiles of [block_b, block_f] elements with masks on both edges, so
# neither B nor F has to divide the block. Coefficients are passed transposed, [8, F], so each
# c_m row is a contiguous load shared by all rows of the tile.


class KanBlocks(tuple):
    """Static tiling: (fwd_block_b, fwd_block_f, fwd_warps, bwd_block_b, bwd_block_f,
    bwd_warps, bwd_programs). bwd_programs is the target number of programs of the backward
    kernel; each loops over ⌈B / (block_b · row_programs)⌉ row tiles and writes one partial
    coefficient gradient, so the batch reduction is a deterministic jnp sum of few partials."""

    def __new__(
        cls,
        fwd_block_b=8,
        fwd_block_f=512,
        fwd_warps=4,
        bwd_block_b=8,
        bwd_block_f=128,
        bwd_warps=4,
        bwd_programs=1024,
    ):
        for v in (fwd_block_b, fwd_block_f, bwd_block_b, bwd_block_f):
            if v & (v - 1) or v <= 0:
                raise ValueError(f"kan_gate: block sizes must be powers of two, got {v}")
        return super().__new__(
            cls,
            (
                fwd_block_b,
                fwd_block_f,
                fwd_warps,
                bwd_block_b,
                bwd_block_f,
                bwd_warps,
                bwd_programs,
            ),
        )


DEFAULT_BLOCKS = KanBlocks()


def _tile(block_b, block_f, num_rows, num_cols, row_tile, col_tile):
    rows = row_tile * block_b + jnp.arange(block_b, dtype=jnp.int32)
    cols = col_tile * block_f + jnp.arange(block_f, dtype=jnp.int32)
    col_ok = cols < num_cols
    mask = (rows < num_rows)[:, None] & col_ok[None, :]
    # Raw (unclamped) indices under the mask: clamping would hide from Triton that a tile row
    # is contiguous, and the loads would no longer be vectorised.
    return rows, cols, col_ok, mask, (rows[:, None], cols[None])


def _local(x, grid_min, grid_max):
    """Interval masks for i = 0 … 4, local coordinate t and the in-grid indicator."""
    h = (grid_max - grid_min) / NUM_INTERVALS
    u = (jnp.minimum(jnp.maximum(x, grid_min), grid_max) - grid_min) * (1.0 / h)
    fi = jnp.minimum(jnp.floor(u), NUM_INTERVALS - 1)
    t = u - fi
    at = [fi == m for m in range(NUM_INTERVALS)]
    inside = (x >= grid_min) & (x <= grid_max)
    return at, t, inside


def _select(at, values, shift):
    """values[i + shift] per element, values a list of [1, block_f] rows."""
    out = values[shift]
    for m in range(1, NUM_INTERVALS):
        out = jnp.where(at[m], values[m + shift], out)
    return out


def load_gate_params(c_ref, w_ref, cols, col_ok):
    """The gate parameters of the columns ``cols`` inside a kernel: the 8 coefficient rows
    ``c_k [1, cols]`` of the transposed ``c_ref [8, F]``, their differences ``d_k = c_{k+1} −
    c_k`` and the residual weights ``w [1, cols]`` (zero where ``col_ok`` is false)."""
    c = [
        pl_triton.load(c_ref.at[k, cols], mask=col_ok, other=0.0)[None, :] for k in range(NUM_BASES)
    ]
    w = pl_triton.load(w_ref.at[cols], mask=col_ok, other=0.0)[None, :]
    d = [c[k + 1] - c[k] for k in range(NUM_BASES - 1)]  # difference form coefficients
    return c, d, w


def _kan_fwd_kernel(x_ref, c_ref, w_ref, *rest, block_b, block_f, grid_min, grid_max):
    o_ref = rest[-1]
    num_rows, num_cols = x_ref.shape
    rows, cols, col_ok, mask, load_idx = _tile(
        block_b, block_f, num_rows, num_cols, pl.program_id(0), pl.program_id(1)
    )
    params = load_gate_params(c_ref, w_ref, cols, col_ok)
    x = pl_triton.load(x_ref.at[load_idx], mask=mask, other=0.0)
    out = spline_gate_tile(x, params, grid_min, grid_max)
    pl_triton.store(o_ref.at[rows[:, None], cols[None]], out, mask=mask)


def spline_gate_tile(x, params, grid_min, grid_max):
    """The gate's value on a tile ``x [rows, cols]`` inside a kernel, with ``params`` the
    ``(c, d, w)`` rows of :func:`load_gate_params` for those columns (the difference form:
    ``c_i + Σ_j d_{i+j}·T_{j+1}(t)`` plus the residual ``w·(sigmoid(x) − ½)``)."""
    c, d, w = params
    at, t, _ = _local(x, grid_min, grid_max)
    s = 1.0 - t
    t2 = t * t
    t3 = t2 * t
    sixth = 1.0 / 6.0
    tail1 = 1.0 - s * s * s * sixth
    tail2 = (-2.0 * t3 + 3.0 * t2 + 3.0 * t + 1.0) * sixth
    tail3 = t3 * sixth
    spline = (
        _select(at, c, 0)
        + _select(at, d, 0) * tail1
        + _select(at, d, 1) * tail2
        + _select(at, d, 2) * tail3
    )
    return spline + w * (jax.nn.sigmoid(x) - 0.5)


def spline_gate_slope_tile(x, d_over_h, w, grid_min, grid_max):
    """The gate's derivative on a tile ``x [rows, cols]`` inside a kernel, with ``d_over_h``
    the difference rows ``d_k / h`` and ``w`` the residual weights of :func:`load_gate_params`:
    ``Σ_j d_{i+j}·T_{j+1}'(t) / h`` inside the grid (0 outside: the spline is flat there) plus
    ``w·σ(x)(1 − σ(x))``. Returns ``(slope, (at, t, sig))``, the interval masks, the local
    coordinate and ``σ(x)`` for :func:`spline_basis_sums`."""
    at, t, inside = _local(x, grid_min, grid_max)
    s = 1.0 - t
    t2 = t * t
    dspline = (
        _select(at, d_over_h, 0) * (0.5 * s * s)
        + _select(at, d_over_h, 1) * (0.5 + t - t2)
        + _select(at, d_over_h, 2) * (0.5 * t2)
    )
    sig = jax.nn.sigmoid(x)
    return jnp.where(inside, dspline, 0.0) + w * (sig * (1.0 - sig)), (at, t, sig)


def spline_basis_sums(accs, g, local):
    """``accs`` (9 tiles: the 8 coefficients' and the residual weight's running gradients)
    plus this tile's terms for the cotangent ``g`` of the gate (zero where masked):
    ``g·B_k(x)`` for k = 0 … 7 and ``g·(σ(x) − ½)``; ``local`` from
    :func:`spline_gate_slope_tile`."""
    at, t, sig = local
    s = 1.0 - t
    t2 = t * t
    t3 = t2 * t
    sixth = 1.0 / 6.0
    # basis values B_{i+j} = w_j; B_k is w_{k−i} when 0 <= k − i <= 3
    basis = (
        s * s * s * sixth,
        (3.0 * t3 - 6.0 * t2 + 4.0) * sixth,
        (-3.0 * t3 + 3.0 * t2 + 3.0 * t + 1.0) * sixth,
        t3 * sixth,
    )
    new = []
    for k in range(NUM_BASES):
        bk = jnp.zeros_like(t)
        for j in range(4):
            if 0 <= k - j < NUM_INTERVALS:
                bk = jnp.where(at[k - j], basis[j], bk)
        new.append(accs[k] + g * bk)
    new.append(accs[NUM_BASES] + g * (sig - 0.5))
    return tuple(new)


def _kan_bwd_kernel(x_ref, g_ref, c_ref, w_ref, *rest, block_b, block_f, steps, grid_min, grid_max):
    dx_ref, dc_ref, dw_ref = rest[-3:]
    num_rows, num_cols = x_ref.shape
    h = (grid_max - grid_min) / NUM_INTERVALS
    pid_b = pl.program_id(0)  # program ids outside the loop: the interpreter needs that
    pid_f = pl.program_id(1)
    cols = pid_f * block_f + jnp.arange(block_f, dtype=jnp.int32)
    col_ok = cols < num_cols
    _, d, w = load_gate_params(c_ref, w_ref, cols, col_ok)
    d = [dk * (1.0 / h) for dk in d]  # d spline / dx = Σ d_{i+j}·T_{j+1}'(t) / h

    def body(step, accs):
        rows, _, _, mask, load_idx = _tile(
            block_b, block_f, num_rows, num_cols, pid_b * steps + step, pid_f
        )
        x = pl_triton.load(x_ref.at[load_idx], mask=mask, other=0.0)
        g = pl_triton.load(g_ref.at[load_idx], mask=mask, other=0.0)
        slope, local = spline_gate_slope_tile(x, d, w, grid_min, grid_max)
        pl_triton.store(dx_ref.at[rows[:, None], cols[None]], g * slope, mask=mask)
        return spline_basis_sums(accs, jnp.where(mask, g, 0.0), local)

    zeros = jnp.zeros((block_b, block_f), jnp.float32)
    accs = lax.fori_loop(0, steps, body, (zeros,) * (NUM_BASES + 1))
    for k in range(NUM_BASES):
        pl_triton.store(dc_ref.at[pid_b, k, cols], jnp.sum(accs[k], axis=0), mask=col_ok)
    pl_triton.store(dw_ref.at[pid_b, cols], jnp.sum(accs[NUM_BASES], axis=0), mask=col_ok)


def kan_gate_fwd_pallas(
    x,
    coeffs_t,
    w_res,
    *,
    grid_min=-3.0,
    grid_max=3.0,
    blocks=DEFAULT_BLOCKS,
    interpret=False,
    out=None,
):
    """Forward kernel on float32 x [B, F], coeffs_t [8, F] (transposed), w_res [F] -> [B, F].

    `out` ([B, F] float32, optional) is aliased as the output buffer (poisoning in tests)."""
    num_rows, num_cols = x.shape
    bb, bf, warps = blocks[0], blocks[1], blocks[2]
    kernel = functools.partial(
        _kan_fwd_kernel, block_b=bb, block_f=bf, grid_min=float(grid_min), grid_max=float(grid_max)
    )
    args, aliases = [x, coeffs_t, w_res], {}
    if out is not None:
        args, aliases = [*args, out], {3: 0}
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((num_rows, num_cols), jnp.float32),
        grid=(pl.cdiv(num_rows, bb), pl.cdiv(num_cols, bf)),
        input_output_aliases=aliases,
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="kan_gate_fwd",
    )(*args)


def row_loop_grid(num_rows, num_cols, block_rows, block_cols, programs):
    """The grid of a kernel whose programs loop over row tiles to sum over the rows: about
    ``programs`` programs, ``(row programs, column tiles, steps)`` with each program looping
    over ``steps`` row tiles of ``block_rows``."""
    row_tiles = pl.cdiv(num_rows, block_rows)
    col_tiles = pl.cdiv(num_cols, block_cols)
    row_programs = max(1, min(row_tiles, programs // col_tiles))
    steps = pl.cdiv(row_tiles, row_programs)
    return pl.cdiv(row_tiles, steps), col_tiles, steps


def kan_gate_bwd_pallas(
    x,
    g,
    coeffs_t,
    w_res,
    *,
    grid_min=-3.0,
    grid_max=3.0,
    blocks=DEFAULT_BLOCKS,
    interpret=False,
    out=None,
):
    """Backward kernel: (dx [B, F], dcoeffs [F, 8], dw_res [F]) for the cotangent g [B, F].

    Coefficient gradients are reduced over the batch without atomics: each program sums its
    rows into registers and writes one partial [8, block_f]; the partials are added by a jnp
    sum in a fixed order, so the result is deterministic. `out` optionally aliases dx."""
    num_rows, num_cols = x.shape
    row_programs, col_tiles, steps = row_loop_grid(num_rows, num_cols, *blocks[3:5], blocks[6])
    kernel = functools.partial(
        _kan_bwd_kernel,
        block_b=blocks[3],
        block_f=blocks[4],
        steps=steps,
        grid_min=float(grid_min),
        grid_max=float(grid_max),
    )
    args, aliases = [x, g, coeffs_t, w_res], {}
    if out is not None:
        args, aliases = [*args, out], {4: 0}
    dx, dc, dw = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((num_rows, num_cols), jnp.float32),
            jax.ShapeDtypeStruct((row_programs, NUM_BASES, num_cols), jnp.float32),
            jax.ShapeDtypeStruct((row_programs, num_cols), jnp.float32),
        ),
        grid=(row_programs, col_tiles),
        input_output_aliases=aliases,
        compiler_params=_backend.compiler_params(blocks[5]),
        interpret=interpret,
        name="kan_gate_bwd",
    )(*args)
    return dx, jnp.sum(dc, axis=0).T, jnp.sum(dw, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _kan(x, coeffs, w_res, grid_min, grid_max, interpret, blocks):
    out = kan_gate_fwd_pallas(
        x.astype(jnp.float32),
        coeffs.T.astype(jnp.float32),
        w_res.astype(jnp.float32),
        grid_min=grid_min,
        grid_max=grid_max,
        blocks=blocks,
        interpret=interpret,
    )
    return out.astype(x.dtype)


def _kan_fwd(x, coeffs, w_res, grid_min, grid_max, interpret, blocks):
    return _kan(x, coeffs, w_res, grid_min, grid_max, interpret, blocks), (x, coeffs, w_res)


def _kan_bwd(grid_min, grid_max, interpret, blocks, res, g):
    x, coeffs, w_res = res
    dx, dc, dw = kan_gate_bwd_pallas(
        x.astype(jnp.float32),
        g.astype(jnp.float32),
        coeffs.T.astype(jnp.float32),
        w_res.astype(jnp.float32),
        grid_min=grid_min,
        grid_max=grid_max,
        blocks=blocks,
        interpret=interpret,
    )
    return dx.astype(x.dtype), dc.astype(coeffs.dtype), dw.astype(w_res.dtype)


_kan.defvjp(_kan_fwd, _kan_bwd)


def _build_probe(grid_min, grid_max, blocks):
    def build():
        rows, cols = 2 * blocks[0] + 3, blocks[1] + 5  # ragged in both directions
        x = np.linspace(-4.0, 4.0, rows * cols, dtype=np.float32).reshape(rows, cols)
        c = np.full((NUM_BASES, cols), 0.5, np.float32)
        w = np.zeros((cols,), np.float32)
        fwd = jax.jit(
            functools.partial(
                kan_gate_fwd_pallas, grid_min=grid_min, grid_max=grid_max, blocks=blocks
            )
        )
        bwd = jax.jit(
            functools.partial(
                kan_gate_bwd_pallas, grid_min=grid_min, grid_max=grid_max, blocks=blocks
            )
        )
        jax.block_until_ready((fwd(x, c, w), bwd(x, x, c, w)))

    return build


def kan_gate(
    x: jax.Array,
    coeffs: jax.Array,
    w_res: jax.Array,
    *,
    grid_min: float = -3.0,
    grid_max: float = 3.0,
    backend: str = "auto",
    blocks: KanBlocks = DEFAULT_BLOCKS,
) -> jax.Array:
    """KAN gate [..., F] -> [..., F]; math and arguments as `kan_gate_reference`, plus:

    backend: "auto" (Pallas on GPU, reference elsewhere), "pallas", "interpret" (the Pallas
    kernels under the interpreter, for CPU tests) or "reference". The Pallas paths compute in
    float32 and are differentiable through a custom_vjp with a Pallas backward kernel
    (gradients for x, coeffs and w_res). If the kernels cannot be built here, one warning and
    the reference is used.
    blocks: static tiling (`KanBlocks`), for tuning.
    """
    mode = _backend.resolve(backend, "kan_gate")
    if mode == "pallas":
        key = ("kan_gate", float(grid_min), float(grid_max), tuple(blocks))
        if not _backend.kernel_available(key, _build_probe(grid_min, grid_max, blocks)):
            mode = "reference"
    if mode == "reference":
        return kan_gate_reference(x, coeffs, w_res, grid_min=grid_min, grid_max=grid_max)
    if (
        coeffs.ndim != 2
        or coeffs.shape[1] != NUM_BASES
        or x.shape[-1] != coeffs.shape[0]
        or w_res.shape != (coeffs.shape[0],)
    ):
        raise ValueError(
            f"kan_gate: x [..., F], coeffs [F, 8], w_res [F] disagree: "
            f"{x.shape}, {coeffs.shape}, {w_res.shape}"
        )
    shape = x.shape
    out = _kan(
        x.reshape(-1, shape[-1]),
        coeffs,
        w_res,
        float(grid_min),
        float(grid_max),
        mode == "interpret",
        KanBlocks(*blocks),
    )
    return out.reshape(shape)
