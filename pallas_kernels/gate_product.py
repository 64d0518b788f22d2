"""M3 + M4's gate and product in one kernel that reads XLA's value/gate product in place
(forward only; the caller differentiates through its jnp reference).

Math. For ``u_src [B, Cu]`` and ``g_src [B, Cg]`` (often one array: the fused branches'
``[u | g]`` product), column offsets ``u0``, ``g0`` and a width ``F``:

    a = u_src[:, u0 : u0 + F] ⊙ gate(g_src[:, g0 : g0 + F])            → a [B, F]

with ``gate`` the KAN spline gate of :mod:`pallas_kernels.kan` (``coeffs [F, 8]``, ``w_res
[F]``) or, with ``coeffs=None``, the sigmoid (GLU's gate).

Why a kernel. XLA computes ``a`` from the product ``[u | g]`` in three passes over ``[B, F]``:
a copy of the gate columns (a custom call needs its operand in a buffer of its own), the gate
kernel (reads ``g``, writes the gate) and the product (reads ``u`` and the gate, writes ``a``):
seven ``[B, F]`` transfers, 1.4 GB at acting's 65,536 rows × F = 768 (the acting trace of
bench/RESULTS.md, issue 33: the copies 94 µs, the product 139 µs, besides the gate). Here each
program loads its ``[bm, bn]`` tiles of ``u`` and ``g`` where the product wrote them (raw
offsets under the masks: contiguous, vectorised loads), applies the gate in registers and
writes ``a`` once: three transfers. Unlike :mod:`pallas_kernels.gated`, XLA keeps the product
(cuBLAS's TF32 GEMM, faster than a Triton GEMM at these shapes, bench/RESULTS.md).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend
from pallas_kernels.kan import NUM_BASES, kan_gate_reference, load_gate_params, spline_gate_tile

__all__ = [
    "DEFAULT_GATE_PRODUCT_BLOCKS",
    "GateProductBlocks",
    "gate_product_available",
    "gate_product_pallas",
    "gate_product_reference",
]


class GateProductBlocks(tuple):
    """Static tiling: (bm rows, bn columns, warps). Chosen on paper, not measured: 4,096
    elements per program as P2's forward kernel (8 × 512), with ``bn`` dividing one branch's
    AH = 256 columns so that no column tile is half masked at F = 768."""

    def __new__(cls, bm=16, bn=256, warps=4):
        for v in (bm, bn):
            if v & (v - 1) or v <= 0:
                raise ValueError(f"gate_product: block sizes must be powers of two, got {v}")
        return super().__new__(cls, (bm, bn, warps))


DEFAULT_GATE_PRODUCT_BLOCKS = GateProductBlocks()


def _check(u_src, g_src, coeffs, w_res, u0: int, g0: int, f: int) -> None:
    ok = (
        u_src.ndim == 2
        and g_src.ndim == 2
        and u_src.shape[0] == g_src.shape[0]
        and f > 0
        and u0 >= 0
        and u0 + f <= u_src.shape[1]
        and g0 >= 0
        and g0 + f <= g_src.shape[1]
        and (coeffs is None) == (w_res is None)
        and (coeffs is None or (coeffs.shape == (f, NUM_BASES) and w_res.shape == (f,)))
    )
    if not ok:
        shapes = [None if v is None else v.shape for v in (u_src, g_src, coeffs, w_res)]
        raise ValueError(
            "gate_product: u_src [B, Cu], g_src [B, Cg], columns u0 + F <= Cu and g0 + F <= Cg, "
            f"coeffs [F, 8] and w_res [F] (or both None) disagree: shapes {shapes}, "
            f"u0={u0}, g0={g0}, F={f}"
        )


def gate_product_reference(
    u_src, g_src, coeffs=None, w_res=None, *, u0=0, g0=0, width, grid_min=-3.0, grid_max=3.0
):
    """``u_src[:, u0:u0+F] ⊙ gate(g_src[:, g0:g0+F])`` in jnp (module docstring)."""
    _check(u_src, g_src, coeffs, w_res, u0, g0, width)
    u, g = u_src[:, u0 : u0 + width], g_src[:, g0 : g0 + width]
    if coeffs is None:
        return u * jax.nn.sigmoid(g)
    return u * kan_gate_reference(g, coeffs, w_res, grid_min=grid_min, grid_max=grid_max)


def _kernel(u_ref, g_ref, *rest, bm, bn, u0, g0, width, kan, lo, hi):
    o_ref = rest[-1]
    rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)
    cols = pl.program_id(1) * bn + jnp.arange(bn, dtype=jnp.int32)
    col_ok = cols < width
    mask = (rows < u_ref.shape[0])[:, None] & col_ok[None, :]
    u = pl_triton.load(u_ref.at[rows[:, None], (u0 + cols)[None, :]], mask=mask, other=0.0)
    g = pl_triton.load(g_ref.at[rows[:, None], (g0 + cols)[None, :]], mask=mask, other=0.0)
    if kan:
        gate = spline_gate_tile(g, load_gate_params(rest[0], rest[1], cols, col_ok), lo, hi)
    else:
        gate = jax.nn.sigmoid(g)
    pl_triton.store(o_ref.at[rows[:, None], cols[None, :]], u * gate, mask=mask)


def gate_product_pallas(
    u_src,
    g_src,
    coeffs=None,
    w_res=None,
    *,
    u0=0,
    g0=0,
    width,
    grid_min=-3.0,
    grid_max=3.0,
    blocks=DEFAULT_GATE_PRODUCT_BLOCKS,
    interpret=False,
):
    """The kernel on float32 operands (arguments as :func:`gate_product_reference`) → ``[B, F]``.
    Forward only: not differentiable (the model differentiates through its reference)."""
    _check(u_src, g_src, coeffs, w_res, u0, g0, width)
    bm, bn, warps = GateProductBlocks(*blocks)
    kan = coeffs is not None
    kernel = functools.partial(
        _kernel,
        bm=bm,
        bn=bn,
        u0=int(u0),
        g0=int(g0),
        width=int(width),
        kan=kan,
        lo=float(grid_min),
        hi=float(grid_max),
    )
    f32 = jnp.float32
    args = [u_src.astype(f32), g_src.astype(f32)]
    if kan:
        args += [coeffs.T.astype(f32), w_res.astype(f32)]  # [8, F]: contiguous c_k rows
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((u_src.shape[0], width), f32),
        grid=(pl.cdiv(u_src.shape[0], bm), pl.cdiv(width, bn)),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="gate_product_fwd",
    )(*args)


def gate_product_available(
    width: int, kan: bool, blocks=DEFAULT_GATE_PRODUCT_BLOCKS, *, u0: int = 0, g0: int = 0
) -> bool:
    """Whether the Triton kernel builds here for ``F`` columns at the offsets ``u0``, ``g0`` of
    one source and the gate kind (probed once per process; one warning and False where it
    cannot, :func:`pallas_kernels._backend`)."""

    def build():
        rows, cols = 2 * blocks[0] + 3, max(u0, g0) + width  # ragged rows
        src = np.linspace(-4.0, 4.0, rows * cols, dtype=np.float32).reshape(rows, cols)
        gate = (np.full((width, NUM_BASES), 0.5, np.float32), np.zeros(width, np.float32))
        fwd = functools.partial(gate_product_pallas, u0=u0, g0=g0, width=width, blocks=blocks)
        jax.block_until_ready(jax.jit(fwd)(src, src, *(gate if kan else (None, None))))

    key = ("gate_product", width, kan, u0, g0, tuple(blocks))
    return _backend.kernel_available(key, build)
