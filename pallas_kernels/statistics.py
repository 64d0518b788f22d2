"""M7 in one pass: softmax, E[Z], Var[Z] and CDF quantiles of C51 logits as a Pallas Triton
kernel (forward only; the caller differentiates through its jnp reference).

Math, per row of N logits ``x`` on the support ``z_i = v_min + i·Δz`` (the jnp reference is
``jaxdqn.model.distribution.statistics(softmax(x), v_min, Δz)``):

    p = softmax(x),  E[i] = Σ p_i i,  E[i²] = Σ p_i i²,
    E[Z] = v_min + Δz·E[i],   Var[Z] = Δz²·max(E[i²] − E[i]², 0),
    F_i = Σ_{j≤i} p_j,  k(τ) = min(#{i : F_i < τ}, N − 1),
    Q(τ) = v_min + Δz·(k − 1 + clip((τ − F_{k−1}) / max(F_k − F_{k−1}, tiny), 0, 1))  (k > 0),
    Q(τ) = v_min                                                                   (k = 0).

Why a kernel. For acting at E = 65,536 environments the [E, 4, 3, 51] logits are 160 MB, and
the jnp chain (max, exp-sum, normalise, the index moments, the cumulative sum, the level
counts and the two gathers of the quantiles) passes over that size several times; the kernel
reads the logits once and writes five numbers per row. ``F_k`` and ``F_{k−1}`` are picked by
masked lane sums (no gathers); atoms are padded to a power of two (≥ 16) by masked loads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend

__all__ = ["DEFAULT_STAT_ROWS", "c51_statistics_pallas", "statistics_kernel_available"]

DEFAULT_STAT_ROWS = 64
DEFAULT_STAT_WARPS = 4


def _pad(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _kernel(x_ref, vmin_ref, dz_ref, mean_ref, var_ref, q_ref, *, block_rows, n, levels):
    num_rows = x_ref.shape[0]
    rows = pl.program_id(0) * block_rows + jnp.arange(block_rows, dtype=jnp.int32)
    row_ok = rows < num_rows
    lanes = jnp.arange(_pad(n), dtype=jnp.int32)
    lane_ok = (lanes < n)[None, :]
    mask = row_ok[:, None] & lane_ok
    x = pl_triton.load(x_ref.at[rows[:, None], lanes[None, :]], mask=mask, other=-jnp.inf)
    x = jnp.where(lane_ok, x, -jnp.inf)  # padded lanes of valid rows
    top = jnp.max(x, axis=1, keepdims=True)
    top = jnp.where(row_ok[:, None], top, 0.0)  # rows past the end: no inf − inf
    e = jnp.where(lane_ok, jnp.exp(x - top), 0.0)
    p = e / jnp.sum(e, axis=1, keepdims=True)
    idx = lanes.astype(jnp.float32)[None, :]
    mean_i = jnp.sum(p * idx, axis=1)
    mean_i2 = jnp.sum(p * idx * idx, axis=1)
    v_min = pl_triton.load(vmin_ref.at[rows], mask=row_ok, other=0.0)
    dz = pl_triton.load(dz_ref.at[rows], mask=row_ok, other=0.0)
    pl_triton.store(mean_ref.at[rows], v_min + dz * mean_i, mask=row_ok)
    var = dz * dz * jnp.maximum(mean_i2 - mean_i * mean_i, 0.0)
    pl_triton.store(var_ref.at[rows], var, mask=row_ok)
    cdf = jnp.cumsum(p, axis=1)
    tiny = float(np.finfo(np.float32).tiny)
    for j, tau in enumerate(levels):
        below = jnp.where(lane_ok & (cdf < tau), 1, 0)
        k = jnp.minimum(jnp.sum(below, axis=1), n - 1)[:, None]
        f_k = jnp.sum(jnp.where(lanes[None, :] == k, cdf, 0.0), axis=1)
        f_prev = jnp.sum(jnp.where(lanes[None, :] == k - 1, cdf, 0.0), axis=1)
        frac = (tau - f_prev) / jnp.maximum(f_k - f_prev, tiny)
        kk = k[:, 0]
        pos = jnp.where(kk > 0, (kk - 1).astype(jnp.float32) + jnp.clip(frac, 0.0, 1.0), 0.0)
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
