"""M7 in one pass: softmax, E[Z], Var[Z] and CDF quantiles of C51 logits as a Pallas Triton
kernel (forward only; the caller differentiates through its jnp reference).

Math, per row of N logits ``x`` on the support ``z_i = v_min + i·Δz`` (the jnp reference is
``jaxdqn.model.distribution.statistics(softmax(x), v_min, Δz)``):

    p = softmax(x),  E[i] = Σ p_i i,  E[i²] = Σ p_i i²,
    E[Z] = v_min + Δz·E[i],   Var[Z] = Δz²·max(E[i²] − E[i]², 0),
    F_i = Σ_{j≤i} p_j,  k(τ) = min(#{i : F_i < τ}, N − 1),
    Q(τ) = v_min + Δz·(k − 1 + clip((τ − F_{k−1}) / max(F_k − F_{k−1}, tiny), 0, 1))  (k > 0),
    Q(τ) = v_min                                                                   (k = 0).

The kernel computes the atom position of Q(τ) as ``Σ_{i=1}^{N−1} clip((τ − F_{i−1}) / p_i, 0,
1)`` (``p_i`` floored at the smallest normal float): every term below ``k`` is 1 (there
``F_i < τ``, so ``τ − F_{i−1} > p_i``), the term at ``k`` is the interpolation fraction, every
term above it is 0 (``F_{i−1} ≥ F_k ≥ τ``); with no ``F_i ≥ τ`` (rounding) all N − 1 terms are
1, the reference's ``k = N − 1`` with fraction 1. One elementwise pass and one lane sum per
level, where the count and the picks of ``F_k``, ``F_{k−1}`` took three.

Why a kernel. For acting at E = 65,536 environments the [E, 4, 3, 51] logits are 160 MB, and
the jnp chain (max, exp-sum, normalise, the index moments, the cumulative sum, the level
counts and the two gathers of the quantiles) passes over that size several times; the kernel
reads the logits once and writes five numbers per row (no gathers); atoms are padded to a
power of two (≥ 16) by masked loads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend

__all__ = [
    "DEFAULT_STAT_ROWS",
    "c51_statistics_pallas",
    "cumsum_by_products",
    "row_statistics",
    "statistics_kernel_available",
]

DEFAULT_STAT_ROWS = 64
DEFAULT_STAT_WARPS = 4


def _pad(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def cumsum_by_products(p):
    """``F = cumsum(p, axis=1)`` for ``p [R, NP]`` as products with the upper-triangular ones
    matrix ``U [NP, NP]`` (``U[l, i] = 1`` for ``l ≤ i``) on the tensor cores: ``p`` split into
    three bfloat16 parts ``p = h + m + l`` (each part exact in bfloat16, the remainder of the
    split below float32's rounding of ``p``), ``F = hU + mU + lU`` with float32 accumulation.
    ``U`` is exact in bfloat16, so every product term is exact; only the order of the sums
    differs from a sequential scan (float rounding)."""
    lanes = jnp.arange(p.shape[1], dtype=jnp.int32)
    upper = (lanes[:, None] <= lanes[None, :]).astype(jnp.float32)
    bf16 = jax.lax.DotAlgorithmPreset.BF16_BF16_F32
    total, rest = None, p
    for _ in range(3):
        # float32 operands that bfloat16 holds exactly: the algorithm's cast loses nothing.
        part = rest.astype(jnp.bfloat16).astype(jnp.float32)
        rest = rest - part
        term = jax.lax.dot_general(part, upper, (((1,), (0,)), ((), ())), precision=bf16)
        total = term if total is None else total + term
    return total


def row_statistics(x, lane_ok, levels: tuple[float, ...], cdf: str = "scan"):
    """The statistics of ``softmax(x)`` per row of a tile, in atom-index units: ``(E[i] [R],
    E[i²] − E[i]² [R] (≥ 0), [position of Q(τ) [R] for τ in levels])`` for ``x [R, NP]`` whose
    lanes outside ``lane_ok [1, NP]`` are ignored (math in the module docstring). Rows of
    ``−inf`` give NaN; callers mask their stores. Shared by this kernel and the heads' (M6 + M7)
    acting kernel of :mod:`pallas_kernels.head_statistics`. ``cdf``: ``"scan"`` (a cumulative
    sum across the lanes) or ``"products"`` (:func:`cumsum_by_products`)."""
    lanes = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
    x = jnp.where(lane_ok, x, -jnp.inf)
    top = jnp.max(x, axis=1, keepdims=True)
    e = jnp.where(lane_ok, jnp.exp(x - top), 0.0)
    p = e / jnp.sum(e, axis=1, keepdims=True)
    idx = lanes.astype(jnp.float32)
    mean_i = jnp.sum(p * idx, axis=1)
    var_i = jnp.maximum(jnp.sum(p * idx * idx, axis=1) - mean_i * mean_i, 0.0)
    if cdf not in ("scan", "products"):
        raise ValueError(f"row_statistics: cdf must be scan or products, got {cdf!r}")
    cdf = jnp.cumsum(p, axis=1) if cdf == "scan" else cumsum_by_products(p)
    # Q(τ)'s atom position as one masked lane sum per level (no count, no picks of F_k and
    # F_{k−1}): Σ_{i≥1} clip((τ − F_{i−1}) / p_i, 0, 1) is 1 for every atom below k, the
    # interpolation fraction at k and 0 above it (module docstring).
    inv = 1.0 / jnp.maximum(p, float(np.finfo(np.float32).tiny))
    prev = cdf - p
    interior = lane_ok & (lanes >= 1)
    positions = [
        jnp.sum(jnp.where(interior, jnp.clip((tau - prev) * inv, 0.0, 1.0), 0.0), axis=1)
        for tau in levels
    ]
    return mean_i, var_i, positions


def _kernel(x_ref, vmin_ref, dz_ref, mean_ref, var_ref, q_ref, *, block_rows, n, levels):
    num_rows = x_ref.shape[0]
    rows = pl.program_id(0) * block_rows + jnp.arange(block_rows, dtype=jnp.int32)
    row_ok = rows < num_rows
    lanes = jnp.arange(_pad(n), dtype=jnp.int32)
    lane_ok = (lanes < n)[None, :]
    x = pl_triton.load(
        x_ref.at[rows[:, None], lanes[None, :]], mask=row_ok[:, None] & lane_ok, other=0.0
    )
    mean_i, var_i, positions = row_statistics(x, lane_ok, levels)
    v_min = pl_triton.load(vmin_ref.at[rows], mask=row_ok, other=0.0)
    dz = pl_triton.load(dz_ref.at[rows], mask=row_ok, other=0.0)
    pl_triton.store(mean_ref.at[rows], v_min + dz * mean_i, mask=row_ok)
    pl_triton.store(var_ref.at[rows], dz * dz * var_i, mask=row_ok)
    for j, pos in enumerate(positions):
        pl_triton.store(q_ref.at[rows, j], v_min + dz * pos, mask=row_ok)


def c51_statistics_pallas(
    logits: jax.Array,
    v_min: jax.Array,
    delta_z: jax.Array,
    *,
    levels: tuple[float, ...],
    block_rows: int = DEFAULT_STAT_ROWS,
    num_warps: int = DEFAULT_STAT_WARPS,
    interpret: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(E[Z] [R], Var[Z] [R], quantiles [R, L])`` of float32 ``logits [R, N]`` on the
    per-row supports ``v_min [R]``, ``delta_z [R]`` at the quantile ``levels`` (static)."""
    if logits.ndim != 2 or v_min.shape != logits.shape[:1] or delta_z.shape != v_min.shape:
        raise ValueError(
            f"c51_statistics: logits [R, N], v_min [R], delta_z [R] disagree: "
            f"{logits.shape}, {v_min.shape}, {delta_z.shape}"
        )
    if block_rows & (block_rows - 1) or block_rows < 16:
        raise ValueError(
            f"c51_statistics: block_rows must be a power of two >= 16, got {block_rows}"
        )
    num_rows, n = logits.shape
    levels = tuple(float(t) for t in levels)
    f32 = jax.ShapeDtypeStruct((num_rows,), jnp.float32)
    return pl.pallas_call(
        functools.partial(_kernel, block_rows=block_rows, n=n, levels=levels),
        out_shape=(f32, f32, jax.ShapeDtypeStruct((num_rows, len(levels)), jnp.float32)),
        grid=(pl.cdiv(num_rows, block_rows),),
        compiler_params=_backend.compiler_params(num_warps),
        interpret=interpret,
        name="c51_statistics",
    )(logits, v_min, delta_z)


def statistics_kernel_available(n: int, levels: tuple[float, ...]) -> bool:
    """Whether the kernel builds and runs here for N = ``n`` atoms (once per process; one
    warning and False where it does not, so the caller uses its jnp reference)."""

    def build():
        rows = 2 * DEFAULT_STAT_ROWS + 3  # ragged
        x = np.linspace(-3.0, 3.0, rows * n, dtype=np.float32).reshape(rows, n)
        ones = np.ones((rows,), np.float32)
        fn = jax.jit(functools.partial(c51_statistics_pallas, levels=levels))
        jax.block_until_ready(fn(x, -ones, ones))

    return _backend.kernel_available(("c51_statistics", n, tuple(levels)), build)
