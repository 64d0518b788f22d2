"""M3 + M4's gate and product in one kernel that reads XLA's value/gate product in place
(forward only; the caller differentiates through its jnp reference).

Math. For ``u_src [B, Cu]`` and ``g_src [B, Cg]`` (often one array: the fused branches'
``[u | g]`` product), column offsets ``u0``, ``g0`` and a width ``F``:

    u = u_src[:, u0 : u0 + F] + b_u + c W_cu,   g = g_src[:, g0 : g0 + F] + b_g + c W_cg
    a = u ⊙ gate(g)                                                          → a [B, F]

with the biases ``b_u``, ``b_g [F]`` optional (both or neither; zero without), the low-rank
term optional (``c [B, r]``, ``W_cu``, ``W_cg [r, F]``, all or none; M5's conditioning of the
magnitude branch on the direction's E[Q], r = 3) and ``gate`` the KAN spline gate of
:mod:`pallas_kernels.kan` (``coeffs [F, 8]``, ``w_res [F]``) or, with ``coeffs=None``, the
sigmoid (GLU's gate).

Why a kernel. XLA computes ``a`` from the product ``[u | g]`` in three passes over ``[B, F]``:
a copy of the gate columns (a custom call needs its operand in a buffer of its own), the gate
kernel (reads ``g``, writes the gate) and the product (reads ``u`` and the gate, writes ``a``):
seven ``[B, F]`` transfers, 1.4 GB at acting's 65,536 rows × F = 768 (the acting trace of
bench/RESULTS.md, issue 33: the copies 94 µs, the product 139 µs, besides the gate). Here each
program loads its ``[bm, bn]`` tiles of ``u`` and ``g`` where the product wrote them (raw
offsets under the masks: contiguous, vectorised loads), applies the gate in registers and
writes ``a`` once: three transfers. The biases are added here, in registers, so that XLA's
product can be a bare GEMM: with the bias added by XLA, the sum ``[u | g] + b`` is one more
pass over the whole product that the kernel's custom call cannot fuse (356 µs per acting step
at 65,536 rows on an H100; bench/RESULTS.md); the rank-r term likewise (r FMAs per element)
replaces M5's two small GEMMs and two ``[B, F]`` passes that add them to the slices. Unlike
:mod:`pallas_kernels.gated`, XLA keeps the product (cuBLAS's TF32 GEMM, faster than a Triton
GEMM at these shapes, bench/RESULTS.md).
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
    "DEFAULT_GATE_PRODUCT_BF16_BLOCKS",
    "DEFAULT_GATE_PRODUCT_BLOCKS",
    "GateProductBlocks",
    "check_gate_product_args",
    "default_gate_product_blocks",
    "gate_product_available",
    "gate_product_inputs",
    "gate_product_pallas",
    "gate_product_reference",
]


class GateProductBlocks(tuple):
    """Static tiling: (bm rows, bn columns, warps). The default is the best of six tilings
    for the sum of acting's two calls (65,536 rows; XLA's product plus this kernel with the
    biases, ``python bench/gated.py``, H100, 2026-12-05): F = 768: 497 µs (16 × 256: 621,
    32 × 128: 484); F = 256: 190 µs (16 × 256: 221). Not measured on the H200."""

    def __new__(cls, bm=32, bn=64, warps=4):
        for v in (bm, bn):
            if v & (v - 1) or v <= 0:
                raise ValueError(f"gate_product: block sizes must be powers of two, got {v}")
        return super().__new__(cls, (bm, bn, warps))


DEFAULT_GATE_PRODUCT_BLOCKS = GateProductBlocks()
# Both sources bfloat16 (acting's bfloat16 path): a tiling of its own. (32, 64, 4) again: of
# thirteen tilings at 65,536 rows on an H100 (bench/RESULTS.md, 2026-12-06) the fastest or within
# the runs' spread at F = 768 (318.8 / 320.9 µs; (64, 128, 8) 301.2 / 356.0 / 374.1); at F = 256
# with M5's term (16, 128, 4) was faster in both runs that had both (115.5 vs 175.7, 170.1 vs
# 192.3 µs), a per-width tiling not yet measured in acting.
DEFAULT_GATE_PRODUCT_BF16_BLOCKS = GateProductBlocks(32, 64, 4)


def default_gate_product_blocks(dtype) -> GateProductBlocks:
    """The default tiling for sources of ``dtype``: :data:`DEFAULT_GATE_PRODUCT_BF16_BLOCKS` for
    bfloat16, else :data:`DEFAULT_GATE_PRODUCT_BLOCKS` (the kernel reads others as float32)."""
    if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16):
        return DEFAULT_GATE_PRODUCT_BF16_BLOCKS
    return DEFAULT_GATE_PRODUCT_BLOCKS


def check_gate_product_args(
    u_src, g_src, coeffs, w_res, u0, g0, f, u_bias=None, g_bias=None, cond=None
):
    """ValueError unless the arguments' shapes agree (module docstring's math)."""
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
        and (u_bias is None) == (g_bias is None)
        and (u_bias is None or (u_bias.shape == (f,) and g_bias.shape == (f,)))
        and (cond is None or _cond_ok(cond, u_src.shape[0], f))
    )
    if not ok:
        arrays = (u_src, g_src, coeffs, w_res, u_bias, g_bias, *(cond or ()))
        shapes = [None if v is None else v.shape for v in arrays]
        raise ValueError(
            "gate_product: u_src [B, Cu], g_src [B, Cg], columns u0 + F <= Cu and g0 + F <= Cg, "
            "coeffs [F, 8] and w_res [F] (or both None), u_bias and g_bias [F] (or both None), "
            f"cond = (c [B, r], W_cu [r, F], W_cg [r, F]) (or None) disagree: shapes {shapes}, "
            f"u0={u0}, g0={g0}, F={f}"
        )


def _cond_ok(cond, rows: int, f: int) -> bool:
    if not (isinstance(cond, tuple) and len(cond) == 3) or any(v is None for v in cond):
        return False
    c, w_cu, w_cg = cond
    return c.ndim == 2 and c.shape[0] == rows and w_cu.shape == w_cg.shape == (c.shape[1], f)


def gate_product_inputs(u_src, g_src, u_cols, g_cols, u_bias=None, g_bias=None, cond=None):
    """The kernel's ``u``, ``g [B, F]`` in jnp: the column ranges ``u_cols``, ``g_cols`` =
    ``(start, stop)`` of the sources plus the biases and ``c W_cu``, ``c W_cg`` where given
    (module docstring; no shape checks)."""
    u, g = u_src[:, u_cols[0] : u_cols[1]], g_src[:, g_cols[0] : g_cols[1]]
    if u_bias is not None:
        u, g = u + u_bias, g + g_bias
    if cond is not None:
        c, w_cu, w_cg = cond
        u, g = u + c @ w_cu, g + c @ w_cg
    return u, g


def gate_product_reference(
    u_src,
    g_src,
    coeffs=None,
    w_res=None,
    *,
    u0=0,
    g0=0,
    width,
    u_bias=None,
    g_bias=None,
    cond=None,
    grid_min=-3.0,
    grid_max=3.0,
):
    """``u ⊙ gate(g)`` with ``u = u_src[:, u0:u0+F] + b_u + c W_cu`` and likewise ``g`` in jnp
    (module docstring)."""
    check_gate_product_args(u_src, g_src, coeffs, w_res, u0, g0, width, u_bias, g_bias, cond)
    u, g = gate_product_inputs(
        u_src, g_src, (u0, u0 + width), (g0, g0 + width), u_bias, g_bias, cond
    )
    if coeffs is None:
        return u * jax.nn.sigmoid(g)
    return u * kan_gate_reference(g, coeffs, w_res, grid_min=grid_min, grid_max=grid_max)


def _kernel(*refs, bm, bn, u0, g0, width, kan, bias, rank, lo, hi):
    refs = iter(refs)
    u_ref, g_ref = next(refs), next(refs)
    gate_refs = (next(refs), next(refs)) if kan else None
    bu_ref, bg_ref = (next(refs), next(refs)) if bias else (None, None)
    c_ref, wcu_ref, wcg_ref = (next(refs), next(refs), next(refs)) if rank else (None,) * 3
    o_ref = next(refs)
    rows = pl.program_id(0) * bm + jnp.arange(bm, dtype=jnp.int32)
    cols = pl.program_id(1) * bn + jnp.arange(bn, dtype=jnp.int32)
    row_ok, col_ok = rows < u_ref.shape[0], cols < width
    mask = row_ok[:, None] & col_ok[None, :]
    # A bfloat16 product is widened here, in registers: the sums and the gate run in float32.
    u = pl_triton.load(u_ref.at[rows[:, None], (u0 + cols)[None, :]], mask=mask, other=0.0)
    g = pl_triton.load(g_ref.at[rows[:, None], (g0 + cols)[None, :]], mask=mask, other=0.0)
    u, g = u.astype(jnp.float32), g.astype(jnp.float32)
    if bias:
        u = u + pl_triton.load(bu_ref.at[cols], mask=col_ok, other=0.0)[None, :]
        g = g + pl_triton.load(bg_ref.at[cols], mask=col_ok, other=0.0)[None, :]
    for j in range(rank):  # c W_c as r outer products: r FMAs per element, no GEMM
        at_j = jnp.full((1, 1), j, jnp.int32)
        c_j = pl_triton.load(c_ref.at[rows[:, None], at_j], mask=row_ok[:, None], other=0.0)
        w_at = (at_j, cols[None, :])
        u = u + c_j * pl_triton.load(wcu_ref.at[w_at], mask=col_ok[None, :], other=0.0)
        g = g + c_j * pl_triton.load(wcg_ref.at[w_at], mask=col_ok[None, :], other=0.0)
    if kan:
        gate = spline_gate_tile(g, load_gate_params(*gate_refs, cols, col_ok), lo, hi)
    else:
        gate = jax.nn.sigmoid(g)
    out = (u * gate).astype(o_ref.dtype)
    pl_triton.store(o_ref.at[rows[:, None], cols[None, :]], out, mask=mask)


def gate_product_pallas(
    u_src,
    g_src,
    coeffs=None,
    w_res=None,
    *,
    u0=0,
    g0=0,
    width,
    u_bias=None,
    g_bias=None,
    cond=None,
    grid_min=-3.0,
    grid_max=3.0,
    blocks=None,
    out_dtype=jnp.float32,
    interpret=False,
):
    """The kernel (arguments as :func:`gate_product_reference`) → ``[B, F]`` of ``out_dtype``
    (float32, or bfloat16: the float32 result rounded to nearest even as it is stored, for a
    consumer whose product rounds it so anyway). The sources are read as they are when both
    are float32 or both bfloat16 (a bfloat16 product: half the bytes read, widened in
    registers), else as float32; everything else is computed in float32.
    ``blocks``: the tiling; None: :func:`default_gate_product_blocks` of the sources' dtype.
    Forward only: not differentiable (the model differentiates through its reference)."""
    check_gate_product_args(u_src, g_src, coeffs, w_res, u0, g0, width, u_bias, g_bias, cond)
    if jnp.dtype(out_dtype) not in (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)):
        raise ValueError(f"gate_product: out_dtype must be float32 or bfloat16, got {out_dtype}")
    f32 = jnp.float32
    src = jnp.bfloat16 if u_src.dtype == g_src.dtype == jnp.bfloat16 else f32
    bm, bn, warps = GateProductBlocks(*(blocks or default_gate_product_blocks(src)))
    kan = coeffs is not None
    kernel = functools.partial(
        _kernel,
        bm=bm,
        bn=bn,
        u0=int(u0),
        g0=int(g0),
        width=int(width),
        kan=kan,
        bias=u_bias is not None,
        rank=0 if cond is None else int(cond[0].shape[1]),
        lo=float(grid_min),
        hi=float(grid_max),
    )
    args = [u_src.astype(src), g_src.astype(src)]
    if kan:
        args += [coeffs.T.astype(f32), w_res.astype(f32)]  # [8, F]: contiguous c_k rows
    if u_bias is not None:
        args += [u_bias.astype(f32), g_bias.astype(f32)]
    if cond is not None:
        args += [v.astype(f32) for v in cond]
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((u_src.shape[0], width), out_dtype),
        grid=(pl.cdiv(u_src.shape[0], bm), pl.cdiv(width, bn)),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="gate_product_fwd",
    )(*args)


def gate_product_available(
    width: int,
    kan: bool,
    blocks=None,
    *,
    u0: int = 0,
    g0: int = 0,
    bias: bool = False,
    rank: int = 0,
    dtype=jnp.float32,
    out_dtype=jnp.float32,
) -> bool:
    """Whether the Triton kernel builds here for ``F`` columns at the offsets ``u0``, ``g0`` of
    one source of ``dtype`` (float32 or bfloat16) into ``out_dtype``, the gate kind, with or
    without the biases and with a rank-``rank`` term (0: none) (probed once per process; one
    warning and False where it cannot, :func:`pallas_kernels._backend`)."""

    blocks = tuple(blocks or default_gate_product_blocks(dtype))

    def build():
        rows, cols = 2 * blocks[0] + 3, max(u0, g0) + width  # ragged rows
        src = np.linspace(-4.0, 4.0, rows * cols, dtype=np.float32).reshape(rows, cols)
        gate = (np.full((width, NUM_BASES), 0.5, np.float32), np.zeros(width, np.float32))
        b = np.linspace(-1.0, 1.0, width, dtype=np.float32) if bias else None
        w = np.ones((rank, width), np.float32)
        cond = (src[:, :rank], w, w) if rank else None
        kw = dict(u0=u0, g0=g0, width=width, u_bias=b, g_bias=b, cond=cond, blocks=blocks)
        kw["out_dtype"] = out_dtype
        fwd = functools.partial(gate_product_pallas, **kw)
        src = jnp.asarray(src, dtype)
        jax.block_until_ready(jax.jit(fwd)(src, src, *(gate if kan else (None, None))))

    dtypes = jnp.dtype(dtype).name, jnp.dtype(out_dtype).name
    key = ("gate_product", width, kan, u0, g0, bias, rank, tuple(blocks), *dtypes)
    return _backend.kernel_available(key, build)
