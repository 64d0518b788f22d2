"""M6 + M7 for acting: the dueling C51 heads with the return distribution's statistics in the
epilogue, as one Pallas Triton kernel that writes E[Z], Var[Z] and the quantiles of every
(branch, action), and never the logits (forward only).

Math. For branch k's features ``a_k [B, K]`` (the columns ``k·K … (k+1)·K − 1`` of ``a``), head
matrix ``W_k [K, (1+A)·N]`` and bias ``b_k``: ``o = a_k W_k + b_k = [v | A_0 | …]``, logits
``x_j = v + A_j − (1/A) Σ_i A_i`` (:mod:`pallas_kernels.heads`), then per row and action, on
the support ``z_i = v_min + i·Δz`` of that row (:mod:`pallas_kernels.statistics`):

    p = softmax(x_j),  E[Z] = v_min + Δz·E[i],  Var[Z] = Δz²·(E[i²] − E[i]²),
    Q(τ) = v_min + Δz·Σ_{i≥1} clip((τ − F_{i−1}) / p_i, 0, 1),   F_i = Σ_{l≤i} p_l.

Why. Acting (A1–A3) and the M5 conditioning read only these statistics, yet computed as the
heads' product and then M7 the ``[E, 4, 3, N]`` logits (160 MB at E = 65,536) are written,
stacked, read by the softmax and by each of M7's reductions (on the H200 trace of acting, the
logits stack, the softmax and M7 took ~1 ms of a 3.3 ms step). Here each program keeps its
logits tiles in registers and writes ``(2 + L)`` numbers per (row, branch, action).

Grid ``(⌈B/bm⌉, m)``, like the heads' forward kernel (its product code is shared:
:func:`pallas_kernels.heads.head_tiles`); the statistics are those of the M7 kernel
(:func:`pallas_kernels.statistics.row_statistics`).

``per_action=True``: the dueling combination is linear in the head outputs, so it is folded
into the weights before the call, ``W'_j = W_v + W_{A_j} − (1/A) Σ_i W_{A_i}`` (and ``b'_j``
alike; :func:`fold_dueling`, each action's columns padded to NP atoms), and each program
computes one action's logits ``a_k W'_j + b'_j`` and its statistics. Grid ``(A, ⌈B/bm⌉, m)``,
the action fastest, so the A programs of a row tile run together and read its ``a`` tile from
L2 after the first. A of the 1 + A products (the value head's multiply-adds fold into the
others) and one ``[bm, NP]`` accumulator in registers instead of 1 + A: the fused schedule
keeps four ``[128, 64]`` float32 accumulators over 256 threads, 128 registers a thread before
its epilogue. Same math; the logits differ by rounding (the sums of weights are formed before
the product). No gradient: the learner's differentiated
pass keeps the logits. Its jnp reference is :func:`pallas_kernels.heads.dueling_heads_reference`
followed by jaxdqn's M7 (``jaxdqn.model.distribution.statistics_of_logits``), as the tests use
it; the model's ``kernels.acting=reference`` computes exactly that.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend
from pallas_kernels.heads import _check, _pad_atoms, group_tiles, head_tiles
from pallas_kernels.statistics import row_statistics

__all__ = [
    "DEFAULT_HEAD_STAT_BLOCKS",
    "DEFAULT_PER_ACTION_BF16_BLOCKS",
    "DEFAULT_PER_ACTION_BLOCKS",
    "HeadStatBlocks",
    "HeadStatistics",
    "fold_dueling",
    "head_statistics_available",
    "head_statistics_pallas",
    "pad_groups",
]


class HeadStatBlocks(NamedTuple):
    """Static tiling: ``bm`` rows and ``bk`` inputs per step of the product, ``warps``. The
    1 + A accumulators ``[bm, NP]`` of a program are those of the heads' forward kernel; the
    epilogue's statistics add the same number of live ``[bm, NP]`` values once per action.
    Default (128, 32, 8): the fastest of six tilings at 65,536 rows × 3 branches on an H200
    (568 µs; (64, 32, 4) 733, (32, 32, 4) 983, (128, 32, 4) 1,347; bench/RESULTS.md,
    2026-12-05)."""

    bm: int = 128
    bk: int = 32
    warps: int = 8


DEFAULT_HEAD_STAT_BLOCKS = HeadStatBlocks()
# per_action=True: (128, 32, 4) the fastest of four tilings at 65,536 rows × 3 and × 1 on an H100
# (281 / 105 µs; (128, 64, 4) 287 / 109, (256, 32, 8) 323 / 112, (64, 32, 4) 414 / 139;
# bench/RESULTS.md, 2026-12-06).
DEFAULT_PER_ACTION_BLOCKS = HeadStatBlocks(128, 32, 4)
# per_action=True with a bfloat16 ``a`` (acting's bfloat16 path): (128, 32, 4) again, the
# fastest of seven tilings at 65,536 rows × 3 and × 1 on an H100 within the spread (179.5 / 65.3
# µs; (128, 64, 4) 178.0 / 84.8, (64, 32, 4) 195.1 / 73.5; bench/RESULTS.md, 2026-12-06).
DEFAULT_PER_ACTION_BF16_BLOCKS = HeadStatBlocks(128, 32, 4)


class HeadStatistics(NamedTuple):
    """E[Z] ``[B, m, A]``, Var[Z] ``[B, m, A]`` and quantiles ``[B, m, A, L]``."""

    mean: jax.Array
    var: jax.Array
    quantiles: jax.Array


def _store_statistics(refs, rows, row_ok, col, v_min, dz, stats):
    """Write one (branch, action) column's E[Z], Var[Z] and quantiles (``stats`` in atom-index
    units, :func:`pallas_kernels.statistics.row_statistics`) on each row's support."""
    mean_ref, var_ref, q_ref = refs
    mean_i, var_i, positions = stats
    pl_triton.store(mean_ref.at[rows, col], v_min + dz * mean_i, mask=row_ok)
    pl_triton.store(var_ref.at[rows, col], dz * dz * var_i, mask=row_ok)
    for level, pos in enumerate(positions):
        at = q_ref.at[rows, col * len(positions) + level]
        pl_triton.store(at, v_min + dz * pos, mask=row_ok)


def _kernel(a_ref, w_ref, b_ref, vmin_ref, dz_ref, *out_refs, **kw):
    bm, n, actions, levels = kw.pop("bm"), kw["n"], kw["actions"], kw.pop("levels")
    cdf = kw.pop("cdf")
    num_rows = a_ref.shape[0]
    pid_r, branch = pl.program_id(0), pl.program_id(1)
    rows = pid_r * bm + jnp.arange(bm, dtype=jnp.int32)
    row_ok = rows < num_rows
    logits = head_tiles(a_ref, w_ref, b_ref, rows, row_ok, branch, **kw)
    lane_ok = (jnp.arange(_pad_atoms(n), dtype=jnp.int32) < n)[None, :]
    v_min = pl_triton.load(vmin_ref.at[rows], mask=row_ok, other=0.0)
    dz = pl_triton.load(dz_ref.at[rows], mask=row_ok, other=0.0)
    for j in range(actions):
        # Rows past B load zeros: finite logits, statistics discarded by the store masks.
        stats = row_statistics(logits[j], lane_ok, levels, cdf)
        _store_statistics(out_refs, rows, row_ok, branch * actions + j, v_min, dz, stats)


def _per_action_kernel(a_ref, w_ref, b_ref, vmin_ref, dz_ref, *out_refs, **kw):
    bm, n, actions = kw.pop("bm"), kw["n"], kw.pop("actions")
    levels, cdf = kw.pop("levels"), kw.pop("cdf")
    num_rows = a_ref.shape[0]
    action, pid_r, branch = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = pid_r * bm + jnp.arange(bm, dtype=jnp.int32)
    row_ok = rows < num_rows
    # Folded columns are zero past N in memory (aligned): the loads mask only K.
    start = action * _pad_atoms(n)
    (logits,) = group_tiles(a_ref, w_ref, b_ref, rows, row_ok, branch, [start], aligned=True, **kw)
    lane_ok = (jnp.arange(_pad_atoms(n), dtype=jnp.int32) < n)[None, :]
    v_min = pl_triton.load(vmin_ref.at[rows], mask=row_ok, other=0.0)
    dz = pl_triton.load(dz_ref.at[rows], mask=row_ok, other=0.0)
    stats = row_statistics(logits, lane_ok, levels, cdf)
    _store_statistics(out_refs, rows, row_ok, branch * actions + action, v_min, dz, stats)


def head_statistics_pallas(
    a: jax.Array,
    w: jax.Array,
    b: jax.Array,
    v_min: jax.Array,
    delta_z: jax.Array,
    *,
    actions: int,
    levels: tuple[float, ...],
    blocks: HeadStatBlocks | None = None,
    bf16: bool = False,
    aligned: bool = False,
    cdf: str = "scan",
    per_action: bool = False,
    interpret: bool = False,
) -> HeadStatistics:
    """The statistics of the m dueling heads' distributions: ``a [B, m·K]`` (float32, or
    bfloat16 read as it is with ``bf16``: half the bytes, the same products),
    ``w [m, K, (1+A)·N]``, ``b [m, (1+A)·N]``, per-row supports ``v_min [B]``, ``delta_z [B]``,
    static quantile ``levels`` → :class:`HeadStatistics` (math in the module docstring).
    ``bf16``: bfloat16 operands, float32 accumulation in the product (TF32 otherwise).
    ``aligned``: the kernel reads ``w`` and ``b`` with each of the 1 + A column groups padded
    with zeros to NP atoms (one small pad of the weights per call), so its weight tiles start
    on 16-float boundaries and load unmasked; the same products, the same numbers. ``cdf``:
    how the epilogue forms each row's CDF (:func:`pallas_kernels.statistics.row_statistics`).
    ``per_action``: the dueling combination folded into the weights, one program per (action,
    row tile, branch) (module docstring; ``aligned`` is implied). ``blocks``: the tiling, by
    default the fastest measured for the schedule (and, per action, for ``a``'s dtype)."""
    m, k, n = _check(a, w, b, actions)
    num_rows = a.shape[0]
    if v_min.shape != (num_rows,) or delta_z.shape != (num_rows,):
        raise ValueError(
            f"head_statistics: v_min and delta_z must be [B] = [{num_rows}], got "
            f"{v_min.shape} and {delta_z.shape}"
        )
    if blocks is None:
        if not per_action:
            blocks = DEFAULT_HEAD_STAT_BLOCKS
        elif a.dtype == jnp.bfloat16:
            blocks = DEFAULT_PER_ACTION_BF16_BLOCKS
        else:
            blocks = DEFAULT_PER_ACTION_BLOCKS
    bm, bk, warps = HeadStatBlocks(*blocks)
    for v in (bm, bk):
        if v & (v - 1) or v < 16:
            raise ValueError(f"head_statistics: block sizes must be powers of two >= 16, got {v}")
    levels = tuple(float(t) for t in levels)
    kw = dict(bm=bm, bk=bk, n=n, num_k=k, actions=actions, bf16=bf16, levels=levels, cdf=cdf)
    if per_action:
        kernel = functools.partial(_per_action_kernel, **kw)
        w, b = fold_dueling(w, b, actions)
        grid = (actions, pl.cdiv(num_rows, bm), m)
    else:
        kernel = functools.partial(_kernel, aligned=aligned, **kw)
        if aligned:
            w, b = pad_groups(w, actions), pad_groups(b, actions)
        grid = (pl.cdiv(num_rows, bm), m)
    f32 = jnp.float32
    per_row = jax.ShapeDtypeStruct((num_rows, m * actions), f32)
    mean, var, quant = pl.pallas_call(
        kernel,
        out_shape=(
            per_row,
            per_row,
            jax.ShapeDtypeStruct((num_rows, m * actions * len(levels)), f32),
        ),
        grid=grid,
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="head_statistics",
    )(a.astype(_a_dtype(a, bf16)), *(x.astype(f32) for x in (w, b, v_min, delta_z)))
    shape = (num_rows, m, actions)
    return HeadStatistics(
        mean.reshape(shape), var.reshape(shape), quant.reshape(*shape, len(levels))
    )


def _a_dtype(a: jax.Array, bf16: bool):
    """The dtype the kernel reads ``a`` in: bfloat16 as it is when the products take bfloat16
    operands anyway (``bf16``; the tiles are widened after loading and rounded back to the same
    values by the product), float32 otherwise."""
    return jnp.bfloat16 if bf16 and a.dtype == jnp.bfloat16 else jnp.float32


def pad_groups(x: jax.Array, actions: int) -> jax.Array:
    """``x [..., (1+A)·N] → [..., (1+A)·NP]``: each column group zero-padded to NP atoms (the
    ``aligned`` layout of :func:`pallas_kernels.heads.head_tiles`)."""
    groups = actions + 1
    n = x.shape[-1] // groups
    grouped = x.reshape(*x.shape[:-1], groups, n)
    pad = [(0, 0)] * (grouped.ndim - 1) + [(0, _pad_atoms(n) - n)]
    return jnp.pad(grouped, pad).reshape(*x.shape[:-1], groups * _pad_atoms(n))


def fold_dueling(
    w: jax.Array, b: jax.Array, actions: int, pad: bool = True
) -> tuple[jax.Array, jax.Array]:
    """The dueling combination folded into the head's weights: ``w [m, K, (1+A)·N]``, ``b [m,
    (1+A)·N]`` (groups ``[v | A_0 | …]``) → ``w' [m, K, A·NP]``, ``b' [m, A·NP]`` with group j
    ``= v + A_j − (1/A) Σ_i A_i`` (of the weight columns; of the biases), zero-padded from N to
    NP atoms (``pad``; else ``A·N`` columns), so that ``a_k w'_j + b'_j`` are action j's
    logits (M6 is linear in the head outputs). Differentiable: jaxdqn's ``kernels.heads=folded``
    trains through it."""
    groups = actions + 1

    def fold(x):
        n = x.shape[-1] // groups
        g = x.reshape(*x.shape[:-1], groups, n)
        adv = g[..., 1:, :]
        folded = g[..., :1, :] + adv - jnp.mean(adv, axis=-2, keepdims=True)
        width = _pad_atoms(n) if pad else n
        widths = [(0, 0)] * (folded.ndim - 1) + [(0, width - n)]
        return jnp.pad(folded, widths).reshape(*x.shape[:-1], actions * width)

    return fold(w), fold(b)


def head_statistics_available(
    m: int,
    k: int,
    n: int,
    actions: int,
    levels: tuple[float, ...],
    bf16: bool = False,
    per_action: bool = False,
) -> bool:
    """Whether the kernel (the ``per_action`` schedule or not) builds and runs here for these
    sizes (once per process; one warning and False where it does not, so the caller computes
    the logits and M7 instead)."""

    def build():
        rows, f = 2 * DEFAULT_HEAD_STAT_BLOCKS.bm + 3, (actions + 1) * n  # ragged rows
        a = np.linspace(-1.0, 1.0, rows * m * k, dtype=np.float32).reshape(rows, m * k)
        w = np.linspace(-0.1, 0.1, m * k * f, dtype=np.float32).reshape(m, k, f)
        ones = np.ones((rows,), np.float32)
        fn = functools.partial(
            head_statistics_pallas, actions=actions, levels=levels, bf16=bf16, per_action=per_action
        )
        for a_in in (a, jnp.asarray(a, jnp.bfloat16)) if bf16 else (a,):  # both reads of a
            jax.block_until_ready(jax.jit(fn)(a_in, w, np.zeros((m, f), np.float32), -ones, ones))

    key = ("head_statistics", m, k, n, actions, tuple(levels), bf16, per_action)
    return _backend.kernel_available(key, build)
