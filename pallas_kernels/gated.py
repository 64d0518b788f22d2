"""M3 + M4 in one kernel: the gated value path as a GEMM with the gate in its epilogue
(forward only; the caller differentiates through its jnp reference).

Math. For ``x [B, K]``, the value and gate matrices ``W_u, W_g [K, F]`` and biases
``b_u, b_g [F]``:

    u = x W_u + b_u,   g = x W_g + b_g,   a = u ⊙ gate(g)            → a [B, F]

with ``gate`` the KAN spline gate of :mod:`pallas_kernels.kan` (``coeffs [F, 8]``,
``w_res [F]``: :func:`pallas_kernels.kan.kan_gate_reference`) or, with ``coeffs=None``, the
sigmoid (GLU's gate). Several branches side by side are one call: their value matrices
concatenated along F, their gate matrices likewise, one gate parameter row per column.

Why a kernel. Computed by XLA, the product writes ``[u | g]`` (``[B, 2F]`` float32: 537 MB for
acting's 65,536 rows at F = 1,024), the gate reads ``g`` and writes its values, and the product
``u ⊙ gate`` reads both again; at acting's sizes those passes cost more than the GEMM (the
acting trace of bench/RESULTS.md, issue 33). Here each program computes a ``[bm, bn]`` tile of
``u`` and of ``g`` in registers (a loop over K in ``bk`` steps), applies the gate there and
writes only ``a``: ``[B, F]`` once. The grid's first axis runs over column tiles, so the
programs that share a row tile of ``x`` run together and find it in L2.

Products use JAX's float32 default (TF32 tensor-core passes on an H100/H200, as XLA's own GEMMs
there) or, with ``bf16=True``, bfloat16 operands with float32 accumulation. Masked loads and
stores: neither B, K nor F has to divide a block.
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
from pallas_kernels._backend import tile_dot
from pallas_kernels.kan import NUM_BASES, kan_gate_reference, load_gate_params, spline_gate_tile

__all__ = [
    "DEFAULT_GATED_BLOCKS",
    "GatedBlocks",
    "gated_kernel_available",
    "gated_value_pallas",
    "gated_value_reference",
]


class GatedBlocks(tuple):
    """Static tiling: (bm rows, bn columns, bk contraction step, warps).

    Chosen on paper: two float32 accumulators ``[bm, bn]`` (u and g) are 64 registers per
    thread at 64 × 64 and 4 warps, and acting's 65,536 rows × F = 768 give 12,288 programs."""

    def __new__(cls, bm=64, bn=64, bk=32, warps=4):
        for v in (bm, bn, bk):
            if v & (v - 1) or v < 16:
                raise ValueError(f"gated_value: block sizes must be powers of two >= 16, got {v}")
        return super().__new__(cls, (bm, bn, bk, warps))


DEFAULT_GATED_BLOCKS = GatedBlocks()


def _check(x, w_u, w_g, b_u, b_g, coeffs, w_res) -> tuple[int, int]:
    k, f = w_u.shape
    shapes_ok = (
        x.ndim == 2
        and x.shape[1] == k
        and w_g.shape == (k, f)
        and b_u.shape == (f,)
        and b_g.shape == (f,)
        and (coeffs is None) == (w_res is None)
        and (coeffs is None or (coeffs.shape == (f, NUM_BASES) and w_res.shape == (f,)))
    )
    if not shapes_ok:
        shapes = [None if v is None else v.shape for v in (x, w_u, w_g, b_u, b_g, coeffs, w_res)]
        raise ValueError(
            "gated_value: x [B, K], w_u and w_g [K, F], b_u and b_g [F], coeffs [F, 8] and "
            f"w_res [F] (or both None) disagree: {shapes}"
        )
    return k, f


def gated_value_reference(
    x, w_u, w_g, b_u, b_g, coeffs=None, w_res=None, *, grid_min=-3.0, grid_max=3.0
):
    """``(x W_u + b_u) ⊙ gate(x W_g + b_g)`` in jnp (math in the module docstring); the
    products at the precision in effect where it is traced."""
    _check(x, w_u, w_g, b_u, b_g, coeffs, w_res)
    u = x @ w_u + b_u
    g = x @ w_g + b_g
    if coeffs is None:
        return u * jax.nn.sigmoid(g)
    return u * kan_gate_reference(g, coeffs, w_res, grid_min=grid_min, grid_max=grid_max)


def _kernel(x_ref, wu_ref, wg_ref, bu_ref, bg_ref, *rest, bm, bn, bk, kan, lo, hi, bf16):
    o_ref = rest[-1]
    num_rows, num_k = x_ref.shape
    num_cols = wu_ref.shape[1]
    rows = pl.program_id(1) * bm + jnp.arange(bm, dtype=jnp.int32)
    cols = pl.program_id(0) * bn + jnp.arange(bn, dtype=jnp.int32)
    row_ok, col_ok = rows < num_rows, cols < num_cols

    def body(step, accs):
        ks = step * bk + jnp.arange(bk, dtype=jnp.int32)
        k_ok = ks < num_k
        xt = pl_triton.load(
            x_ref.at[rows[:, None], ks[None, :]], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        w_idx, w_mask = (ks[:, None], cols[None, :]), k_ok[:, None] & col_ok[None, :]
        wu = pl_triton.load(wu_ref.at[w_idx], mask=w_mask, other=0.0)
        wg = pl_triton.load(wg_ref.at[w_idx], mask=w_mask, other=0.0)
        dot = lambda w: tile_dot(xt, w, ((1,), (0,)), bf16)
        return accs[0] + dot(wu), accs[1] + dot(wg)

    zeros = jnp.zeros((bm, bn), jnp.float32)
    u, g = lax.fori_loop(0, pl.cdiv(num_k, bk), body, (zeros, zeros))
    u = u + pl_triton.load(bu_ref.at[cols], mask=col_ok, other=0.0)[None, :]
    g = g + pl_triton.load(bg_ref.at[cols], mask=col_ok, other=0.0)[None, :]
    if kan:
        c_ref, w_ref = rest[0], rest[1]
        gate = spline_gate_tile(g, load_gate_params(c_ref, w_ref, cols, col_ok), lo, hi)
    else:
        gate = jax.nn.sigmoid(g)
    mask = row_ok[:, None] & col_ok[None, :]
    pl_triton.store(o_ref.at[rows[:, None], cols[None, :]], u * gate, mask=mask)


def gated_value_pallas(
    x,
    w_u,
    w_g,
    b_u,
    b_g,
    coeffs=None,
    w_res=None,
    *,
    grid_min=-3.0,
    grid_max=3.0,
    blocks=DEFAULT_GATED_BLOCKS,
    bf16=False,
    interpret=False,
):
    """The kernel on float32 operands (shapes as :func:`gated_value_reference`) → ``[B, F]``.
    Forward only: not differentiable (the model differentiates through its reference)."""
    f = _check(x, w_u, w_g, b_u, b_g, coeffs, w_res)[1]
    bm, bn, bk, warps = GatedBlocks(*blocks)
    kan = coeffs is not None
    kernel = functools.partial(
        _kernel,
        bm=bm,
        bn=bn,
        bk=bk,
        kan=kan,
        lo=float(grid_min),
        hi=float(grid_max),
        bf16=bf16,
    )
    f32 = jnp.float32
    args = [v.astype(f32) for v in (x, w_u, w_g, b_u, b_g)]
    if kan:
        args += [coeffs.T.astype(f32), w_res.astype(f32)]  # [8, F]: contiguous c_k rows
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((x.shape[0], f), f32),
        grid=(pl.cdiv(f, bn), pl.cdiv(x.shape[0], bm)),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="gated_value_fwd",
    )(*args)


def gated_kernel_available(
    k: int, f: int, kan: bool, bf16: bool = False, blocks=DEFAULT_GATED_BLOCKS
) -> bool:
    """Whether the Triton kernel builds here for ``K``, ``F`` and the gate kind (probed once per
    process; one warning and False where it cannot, :func:`pallas_kernels._backend`)."""

    def build():
        rows = 2 * blocks[0] + 3  # ragged rows
        x = np.linspace(-1.0, 1.0, rows * k, dtype=np.float32).reshape(rows, k)
        w = np.linspace(-0.1, 0.1, k * f, dtype=np.float32).reshape(k, f)
        b = np.zeros((f,), np.float32)
        gate = (np.full((f, NUM_BASES), 0.5, np.float32), b) if kan else (None, None)
        fwd = jax.jit(functools.partial(gated_value_pallas, blocks=blocks, bf16=bf16))
        jax.block_until_ready(fwd(x, w, w, b, b, *gate))

    key = ("gated_value", k, f, kan, bf16, tuple(blocks))
    return _backend.kernel_available(key, build)
