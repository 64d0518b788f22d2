"""The VJP of M3 + M4's gate and product (:mod:`pallas_kernels.gate_product`) as one Triton
kernel: the learner's differentiated pass of ``kernels.gated=gate_grad``, where u and g are
disjoint column ranges of one source (the fused branches' bias-free ``[u | g]`` product).

Math (``a = u ⊙ gate(g)``, ``u = src[:, u0:u0+F] + b_u``, ``g = src[:, g0:g0+F] + b_g``, the
cotangent ``da [B, F]``):

    du = da ⊙ gate(g),   dg = (da ⊙ u) ⊙ gate'(g),   d src = du at u's columns, dg at g's, else 0
    d b_u = Σ_rows du,   d b_g = Σ_rows dg
    d coeffs[f, k] = Σ_rows (da ⊙ u)·B_k(g),   d w_res[f] = Σ_rows (da ⊙ u)·(σ(g) − ½)   (M4)

Why a kernel: autodiff of the reference writes ``du`` and ``dg`` as two arrays, pads each to the
source's width and adds them (one more pass over ``[B, 2F]``), then reads them again for the bias
sums (bench/RESULTS.md, issue 33: ~74 µs of the all-off update's kernel time at B = 4,096 on an
H100). Here ``da`` and the source are read once and ``d src`` written once; the column sums stay
in registers, one partial per program, added by a jnp sum in a fixed order (deterministic, no
atomics; as P2's backward, :mod:`pallas_kernels.kan`).
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
from pallas_kernels.gate_product import check_gate_product_args
from pallas_kernels.kan import (
    NUM_BASES,
    NUM_INTERVALS,
    load_gate_params,
    row_loop_grid,
    spline_basis_sums,
    spline_gate_slope_tile,
    spline_gate_tile,
)

__all__ = [
    "GateGradBlocks",
    "default_gate_grad_blocks",
    "gate_grad_available",
    "gate_grad_pallas",
]


class GateGradBlocks(tuple):
    """Static tiling of :func:`gate_grad_pallas`: (bm rows, bn columns, warps, programs,
    row_sums). ``programs`` is the target number of programs: each loops over
    ⌈B / (bm · row programs)⌉ row tiles and writes one partial of the column sums (biases, M4's
    parameters), added by a jnp sum in a fixed order (deterministic, no atomics).
    ``row_sums``: 0 keeps each sum as a ``[bm, bn]`` tile in registers (summed over its rows
    once, at the end), 1 sums every step's tile over its rows into a ``[bn]`` row (a reduction
    a step, ``bm``× fewer registers: eleven sums with M4). The defaults by gate kind:
    :func:`default_gate_grad_blocks`."""

    def __new__(cls, bm=8, bn=128, warps=4, programs=1024, row_sums=0):
        for v in (bm, bn):
            if v & (v - 1) or v <= 0:
                raise ValueError(f"gate_grad: block sizes must be powers of two, got {v}")
        if programs < 1:
            raise ValueError(f"gate_grad: programs must be >= 1, got {programs}")
        if row_sums not in (0, 1):
            raise ValueError(f"gate_grad: row_sums must be 0 or 1, got {row_sums}")
        return super().__new__(cls, (bm, bn, warps, programs, row_sums))


def default_gate_grad_blocks(kan: bool) -> GateGradBlocks:
    """The tiling measured fastest for the gate kind at the learner's 4,096 rows and F = 1,024
    (``bench/gate_grad.py``, one H100, 2026-12-07, eleven tilings, medians of 7): the sigmoid
    8 × 128, 4 warps, per-step row sums (26.7 µs against 35.9 for the tile sums); M4's KAN
    gate 8 × 64, 4 warps, tile sums (79.4 µs against 102.8 at 8 × 128; also the fastest at
    M5's F = 768: 84.7 against 136.6)."""
    return GateGradBlocks(8, 64, 4, 1024, 0) if kan else GateGradBlocks(8, 128, 4, 1024, 1)


def _placed(d_ug, columns: int, u0: int, g0: int, width: int):
    """``d src [B, columns]`` from the kernel's ``[du | dg]`` (``[B, 2F]``): du at u's columns,
    dg at g's, zeros elsewhere, as one concatenation (nothing to do when ``[u | g]`` is the
    source; otherwise XLA fuses the zeros into the cotangent's consumer, e.g. the add of M5's
    magnitude call's cotangent, instead of a kernel writing them)."""
    if (u0, g0, columns) == (0, width, 2 * width):
        return d_ug
    pieces = sorted([(u0, d_ug[:, :width]), (g0, d_ug[:, width:])], key=lambda p: p[0])
    zeros = lambda n: jnp.zeros((d_ug.shape[0], n), d_ug.dtype)
    out, at = [], 0
    for start, piece in pieces:
        out += [zeros(start - at), piece] if start > at else [piece]
        at = start + width
    return jnp.concatenate(out + ([zeros(columns - at)] if columns > at else []), axis=1)


def _grad_kernel(*refs, bm, bn, steps, row_sums, u0, g0, width, kan, bias, lo, hi):
    refs = iter(refs)
    src_ref, da_ref = next(refs), next(refs)
    gate_refs = (next(refs), next(refs)) if kan else None
    bu_ref, bg_ref = (next(refs), next(refs)) if bias else (None, None)
    dug_ref = next(refs)  # [B, 2F]: du, then dg
    dbu_ref, dbg_ref = (next(refs), next(refs)) if bias else (None, None)
    dc_ref, dw_ref = (next(refs), next(refs)) if kan else (None, None)
    num_rows = src_ref.shape[0]
    pid_b = pl.program_id(0)  # program ids outside the loop: the interpreter needs that
    cols = pl.program_id(1) * bn + jnp.arange(bn, dtype=jnp.int32)
    col_ok = cols < width
    if kan:
        c, d, w = load_gate_params(*gate_refs, cols, col_ok)
        d_over_h = [dk * (NUM_INTERVALS / (hi - lo)) for dk in d]
    if bias:
        b_u = pl_triton.load(bu_ref.at[cols], mask=col_ok, other=0.0)[None, :]
        b_g = pl_triton.load(bg_ref.at[cols], mask=col_ok, other=0.0)[None, :]

    def body(step, accs):
        rows = (pid_b * steps + step) * bm + jnp.arange(bm, dtype=jnp.int32)
        mask = (rows < num_rows)[:, None] & col_ok[None, :]
        at = lambda c0: src_ref.at[rows[:, None], (c0 + cols)[None, :]]
        u = pl_triton.load(at(u0), mask=mask, other=0.0)
        g = pl_triton.load(at(g0), mask=mask, other=0.0)
        da = pl_triton.load(da_ref.at[rows[:, None], cols[None, :]], mask=mask, other=0.0)
        if bias:
            u, g = u + b_u, g + b_g
        if kan:
            gate = spline_gate_tile(g, (c, d, w), lo, hi)
            slope, local = spline_gate_slope_tile(g, d_over_h, w, lo, hi)
        else:
            gate = jax.nn.sigmoid(g)
            slope = gate * (1.0 - gate)
        # da is 0 outside the mask (and u, g finite there), so every term below is 0 there
        du = da * gate
        d_gate = da * u
        dg = d_gate * slope
        pl_triton.store(dug_ref.at[rows[:, None], cols[None, :]], du, mask=mask)
        pl_triton.store(dug_ref.at[rows[:, None], (width + cols)[None, :]], dg, mask=mask)
        terms = ()
        if bias:
            terms += (du, dg)
        if kan:
            terms += spline_basis_sums((0.0,) * (NUM_BASES + 1), d_gate, local)
        if row_sums:
            terms = tuple(jnp.sum(t, axis=0, keepdims=True) for t in terms)
        return tuple(a + t for a, t in zip(accs, terms, strict=True))

    count = (2 if bias else 0) + (NUM_BASES + 1 if kan else 0)
    zeros = jnp.zeros((1 if row_sums else bm, bn), jnp.float32)
    accs = lax.fori_loop(0, steps, body, (zeros,) * count)
    store = lambda ref, v: pl_triton.store(ref.at[pid_b, cols], jnp.sum(v, axis=0), mask=col_ok)
    if bias:
        store(dbu_ref, accs[0])
        store(dbg_ref, accs[1])
        accs = accs[2:]
    if kan:
        for k in range(NUM_BASES):
            pl_triton.store(dc_ref.at[pid_b, k, cols], jnp.sum(accs[k], axis=0), mask=col_ok)
        store(dw_ref, accs[NUM_BASES])


def gate_grad_pallas(
    src,
    da,
    coeffs=None,
    w_res=None,
    *,
    u0,
    g0,
    width,
    u_bias=None,
    g_bias=None,
    grid_min=-3.0,
    grid_max=3.0,
    blocks=None,
    interpret=False,
):
    """The VJP of :func:`pallas_kernels.gate_product.gate_product_pallas` with ``u_src = g_src =
    src`` and no rank term, for the cotangent ``da [B, F]``, in one pass over the rows (module
    docstring; the last two sums with M4's KAN gate, ``gate'`` its spline's slope plus
    ``w_res·σ'``; with ``coeffs=None`` the sigmoid, ``gate' = σ(1 − σ)``).

    Args:
      src: ``[B, C]`` float32, the bias-free value/gate product; the ranges ``[u0, u0 + F)`` and
        ``[g0, g0 + F)`` disjoint inside it.
      da: ``[B, F]`` float32.
      coeffs, w_res: M4's ``[F, 8]`` and ``[F]``, or both None (the sigmoid).
      u_bias, g_bias: ``[F]`` each, or both None.
      blocks: a :class:`GateGradBlocks` tiling; None: :func:`default_gate_grad_blocks`'s.
    Returns:
      ``(d_src [B, C], d_u_bias, d_g_bias, d_coeffs, d_w_res)``, float32, None for an
      argument that was None.
    """
    check_gate_product_args(src, src, coeffs, w_res, u0, g0, width, u_bias, g_bias)
    if src.dtype != jnp.float32 or da.dtype != jnp.float32 or da.shape != (src.shape[0], width):
        raise ValueError(
            f"gate_grad: src [B, C] and da [B, {width}] float32, got {src.dtype}{src.shape}, "
            f"{da.dtype}{da.shape}"
        )
    if u0 < g0 + width and g0 < u0 + width:
        raise ValueError(
            f"gate_grad: the ranges [{u0}, {u0 + width}) and [{g0}, {g0 + width}) overlap"
        )
    blocks = GateGradBlocks(*(blocks or default_gate_grad_blocks(coeffs is not None)))
    num_rows, columns = src.shape
    row_programs, col_tiles, steps = row_loop_grid(num_rows, width, *blocks[:2], blocks[3])
    kan, bias = coeffs is not None, u_bias is not None
    kernel = functools.partial(
        _grad_kernel,
        bm=blocks[0],
        bn=blocks[1],
        steps=steps,
        row_sums=blocks[4],
        u0=int(u0),
        g0=int(g0),
        width=int(width),
        kan=kan,
        bias=bias,
        lo=float(grid_min),
        hi=float(grid_max),
    )
    f32 = jnp.float32
    args = [src, da]
    if kan:
        args += [coeffs.T.astype(f32), w_res.astype(f32)]  # [8, F]: contiguous c_k rows
    if bias:
        args += [u_bias.astype(f32), g_bias.astype(f32)]
    partial = lambda *shape: jax.ShapeDtypeStruct((row_programs, *shape), f32)
    out_shape = [jax.ShapeDtypeStruct((num_rows, 2 * width), f32)]
    if bias:
        out_shape += [partial(width), partial(width)]
    if kan:
        out_shape += [partial(NUM_BASES, width), partial(width)]
    outs = pl.pallas_call(
        kernel,
        out_shape=tuple(out_shape),
        grid=(row_programs, col_tiles),
        compiler_params=_backend.compiler_params(blocks[2]),
        interpret=interpret,
        name="gate_grad",
    )(*args)
    d_src, outs = _placed(outs[0], columns, u0, g0, width), list(outs[1:])
    d_bu = d_bg = d_c = d_w = None
    if bias:
        d_bu, d_bg = jnp.sum(outs.pop(0), axis=0), jnp.sum(outs.pop(0), axis=0)
    if kan:
        d_c, d_w = jnp.sum(outs[0], axis=0).T, jnp.sum(outs[1], axis=0)
    return d_src, d_bu, d_bg, d_c, d_w


def gate_grad_available(
    columns: int, width: int, kan: bool, *, u0: int, g0: int, bias: bool, blocks=None
) -> bool:
    """Whether :func:`gate_grad_pallas` builds here for a ``[B, columns]`` source, the gate
    kind, the offsets and the biases (probed once per process; one warning and False where
    it cannot, :func:`pallas_kernels._backend`)."""
    blocks = tuple(blocks or default_gate_grad_blocks(kan))

    def build():
        rows = 2 * blocks[0] + 3  # ragged rows
        src = np.linspace(-4.0, 4.0, rows * columns, dtype=np.float32).reshape(rows, columns)
        gate = (np.full((width, NUM_BASES), 0.5, np.float32), np.zeros(width, np.float32))
        b = np.linspace(-1.0, 1.0, width, dtype=np.float32) if bias else None
        kw = dict(u0=u0, g0=g0, width=width, u_bias=b, g_bias=b, blocks=blocks)
        grad = functools.partial(gate_grad_pallas, **kw)
        jax.block_until_ready(jax.jit(grad)(src, src[:, :width], *(gate if kan else (None, None))))

    key = ("gate_grad", columns, width, kan, u0, g0, bias, blocks)
    return _backend.kernel_available(key, build)
