"""M6 for m branches at once: the dueling C51 heads as Pallas Triton kernels, forward and
backward under a ``custom_vjp``, and their jnp reference.

Math. The input holds m branches side by side, ``a [B, m·K]`` (branch k's features are the
columns ``k·K … (k+1)·K − 1``). With A actions, branch k has the head matrix
``W_k = [W_V | W_A0 | … | W_A(A−1)]`` ``[K, (1+A)·N]`` and bias ``b_k [(1+A)·N]``; with
``o_k = a_k W_k + b_k = [v | A_0 | … ]`` (``N`` columns each) its logits are the dueling
combination

    logits[b, k, j, :] = v + A_j − (1/A) Σ_i A_i,        j = 0 … A−1.

Backward, for the cotangent ``g [B, m, A, N]`` and ``ḡ = Σ_j g_j``:

    dv = ḡ,  dA_j = g_j − ḡ / A         (the head-output cotangent d_k = [dv | dA_0 | …])
    da_k = d_k W_kᵀ,   dW_k = a_kᵀ d_k,   db_k = Σ_rows d_k.

Why kernels. Computed as one GEMM, the m heads need the block-diagonal ``[m·K, m·4N]`` matrix,
m times the multiply-adds of the m products (at configs/gpu.yaml sizes the head products are
more than half the learner update's executed FLOPs: ``bench/flops.py``); computed as a batched
product over a middle branch axis, XLA transposes operands and results. These kernels read
``a`` and write ``logits`` in their row-major layouts, do each branch's product alone, and fold
the dueling combination into the forward's epilogue and its transpose into the backward's
prologue. Atoms are padded to a power of two (``NP ≥ 16``, Triton's block rule) by masked
loads, never by copies; K need not be a power of two.

The three kernels:

- forward, grid ``(⌈B/bm⌉, m)``: ``[bm, bk] × [bk, NP]`` products over K for each of the 1 + A
  column groups, then bias and the dueling combination, stored as ``[B, m·A·N]``;
- ``da``, grid ``(⌈B/bm⌉, m, ⌈K/bn⌉)``: ``Σ_s d_s [bm, NP] × W_{k,s}[bn, NP]ᵀ``, ``d`` formed
  from ``g`` in registers;
- ``dW`` and ``db``, grid ``(m, ⌈K/ba⌉, S)``: each program sums ``a_tileᵀ d`` over its share of
  the rows into one partial; the S partials are added by a jnp sum in a fixed order
  (deterministic, no atomics).

Products use JAX's float32 default (TF32 tensor-core passes on an H100/H200, as XLA's own
GEMMs there) or, with ``bf16=True``, bfloat16 operands with float32 accumulation.
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

__all__ = [
    "DEFAULT_HEAD_BLOCKS",
    "HeadBlocks",
    "dueling_heads",
    "dueling_heads_bwd_pallas",
    "dueling_heads_fwd_pallas",
    "dueling_heads_reference",
]


class HeadBlocks(tuple):
    """Static tiling: (fwd_bm, fwd_bk, fwd_warps, da_bm, da_bn, da_warps, dw_ba, dw_br,
    dw_programs, dw_warps). ``dw_programs`` is the target number of programs of the dW kernel;
    the rows are split into ``S`` shares so that ``m · ⌈K/ba⌉ · S`` comes near it.

    The defaults are chosen on paper, not measured: the float32 accumulators of a program (the
    forward's 1 + A tiles ``[bm, NP]``, the dW kernel's 1 + A tiles ``[ba, NP]``) stay near
    64 registers per thread at 4 warps (32 × 64 × 4 groups × 4 B = 32 KB), and B = 4,096 gives
    the forward 128 row tiles × m branches of programs."""

    def __new__(
        cls,
        fwd_bm=32,
        fwd_bk=32,
        fwd_warps=4,
        da_bm=32,
        da_bn=64,
        da_warps=4,
        dw_ba=32,
        dw_br=32,
        dw_programs=256,
        dw_warps=4,
    ):
        for v in (fwd_bm, fwd_bk, da_bm, da_bn, dw_ba, dw_br):
            if v & (v - 1) or v < 16:
                raise ValueError(f"dueling_heads: block sizes must be powers of two >= 16, got {v}")
        return super().__new__(
            cls,
            (
                fwd_bm,
                fwd_bk,
                fwd_warps,
                da_bm,
                da_bn,
                da_warps,
                dw_ba,
                dw_br,
                dw_programs,
                dw_warps,
            ),
        )


DEFAULT_HEAD_BLOCKS = HeadBlocks()


def _check(a: jax.Array, w: jax.Array, b: jax.Array, actions: int) -> tuple[int, int, int]:
    groups = actions + 1
    if actions < 1 or w.ndim != 3 or w.shape[2] % groups or b.shape != (w.shape[0], w.shape[2]):
        raise ValueError(
            f"dueling_heads: w must be [m, K, (1+A)·N] and b [m, (1+A)·N] with A = {actions} "
            f"actions, got {w.shape} and {b.shape}"
        )
    m, k, f = w.shape
    if a.ndim != 2 or a.shape[1] != m * k:
        raise ValueError(f"dueling_heads: a must be [B, m·K] = [B, {m * k}], got {a.shape}")
    return m, k, f // groups


def _dueling(o: jax.Array, actions: int) -> jax.Array:
    """``o [..., (1+A)·N] -> [..., A, N]``: v + A_j − mean_j A_j."""
    n = o.shape[-1] // (actions + 1)
    v, adv = o[..., :n], o[..., n:].reshape(*o.shape[:-1], actions, n)
    return v[..., None, :] + adv - jnp.mean(adv, axis=-2, keepdims=True)


def dueling_heads_reference(a: jax.Array, w: jax.Array, b: jax.Array, actions: int) -> jax.Array:
    """The m heads as m separate products (jnp): ``a [B, m·K]``, ``w [m, K, (1+A)·N]``,
    ``b [m, (1+A)·N]`` → logits ``[B, m, A, N]``. Products at the precision in effect where it
    is traced."""
    m, k, _ = _check(a, w, b, actions)
    outs = [a[:, i * k : (i + 1) * k] @ w[i] + b[i] for i in range(m)]
    return _dueling(jnp.stack(outs, axis=1), actions)


# ----------------------------------------------------------------------------------------------
# Kernels. Loads and stores use explicit index arrays under masks (ragged B, K and N).


def _pad_atoms(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _load_cotangent(g_ref, rows, row_ok, branch, atoms, n, actions):
    """The head-output cotangent ``[dv, dA_0, …]`` of rows × padded atoms from ``g`` (zero
    outside ``rows < B``, ``atoms < N``)."""
    atom_ok = atoms < n
    mask = row_ok[:, None] & atom_ok[None, :]
    gs = [
        pl_triton.load(
            g_ref.at[rows[:, None], ((branch * actions + j) * n + atoms)[None, :]],
            mask=mask,
            other=0.0,
        )
        for j in range(actions)
    ]
    total = functools.reduce(jnp.add, gs)
    return [total] + [gj - total * (1.0 / actions) for gj in gs]


def group_tiles(
    a_ref, w_ref, b_ref, rows, row_ok, branch, starts, *, bk, n, num_k, bf16, aligned=False
):
    """One branch's ``[bm, bk] × [bk, NP]`` products over K plus bias for a tile of rows, one
    ``[bm, NP]`` tile per column group of ``w``/``b`` starting at ``starts`` (ints or traced
    scalars; padded atoms hold garbage). ``aligned``: the groups are zero past N in memory, so
    their loads mask only K; otherwise the atoms past N are masked too."""
    atoms = jnp.arange(_pad_atoms(n), dtype=jnp.int32)
    atom_ok = atoms < n

    def body(step, accs):
        ks = step * bk + jnp.arange(bk, dtype=jnp.int32)
        k_ok = ks < num_k
        x = pl_triton.load(
            a_ref.at[rows[:, None], (branch * num_k + ks)[None, :]],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        ).astype(jnp.float32)  # a bfloat16 `a` (acting's under bf16): the product rounds back
        w_ok = jnp.broadcast_to(k_ok[:, None], (bk, atoms.shape[0]))
        if not aligned:
            w_ok = w_ok & atom_ok[None, :]
        new = []
        for start, acc in zip(starts, accs, strict=True):
            wt = pl_triton.load(
                w_ref.at[branch, ks[:, None], (start + atoms)[None, :]], mask=w_ok, other=0.0
            )
            new.append(acc + tile_dot(x, wt, ((1,), (0,)), bf16))
        return tuple(new)

    zeros = jnp.zeros((rows.shape[0], _pad_atoms(n)), jnp.float32)
    accs = lax.fori_loop(0, pl.cdiv(num_k, bk), body, (zeros,) * len(starts))
    return [
        acc
        + pl_triton.load(
            b_ref.at[branch, start + atoms],
            mask=None if aligned else atom_ok,
            other=None if aligned else 0.0,
        )[None, :]
        for start, acc in zip(starts, accs, strict=True)
    ]


def head_tiles(
    a_ref, w_ref, b_ref, rows, row_ok, branch, *, bk, n, num_k, actions, bf16, aligned=False
):
    """The dueling logits of one branch for a tile of rows: ``A`` tiles ``[bm, NP]``
    (``v + A_j − mean_i A_i``, padded atoms hold garbage), from the 1 + A column groups'
    :func:`group_tiles`. Shared by the forward kernel here and the acting kernel of
    :mod:`pallas_kernels.head_statistics`.

    ``aligned``: ``w``/``b`` hold each column group padded to NP atoms with zeros (``[m, K,
    (1+A)·NP]``), so group ``s`` starts at column ``s·NP`` (16-float aligned) and its tiles load
    without an atom mask; otherwise groups are packed at ``s·N``."""
    stride = _pad_atoms(n) if aligned else n
    starts = [s * stride for s in range(actions + 1)]
    kw = dict(bk=bk, n=n, num_k=num_k, bf16=bf16, aligned=aligned)
    outs = group_tiles(a_ref, w_ref, b_ref, rows, row_ok, branch, starts, **kw)
    mean = functools.reduce(jnp.add, outs[1:]) * (1.0 / actions)
    return [outs[0] + outs[j + 1] - mean for j in range(actions)]


def _fwd_kernel(a_ref, w_ref, b_ref, o_ref, *, bm, bk, n, num_k, actions, bf16):
    num_rows = a_ref.shape[0]
    pid_r, branch = pl.program_id(0), pl.program_id(1)
    rows = pid_r * bm + jnp.arange(bm, dtype=jnp.int32)
    row_ok = rows < num_rows
    atoms = jnp.arange(_pad_atoms(n), dtype=jnp.int32)
    logits = head_tiles(
        a_ref, w_ref, b_ref, rows, row_ok, branch,
        bk=bk, n=n, num_k=num_k, actions=actions, bf16=bf16,
    )  # fmt: skip
    mask = row_ok[:, None] & (atoms < n)[None, :]
    for j in range(actions):
        cols = (branch * actions + j) * n + atoms
        pl_triton.store(o_ref.at[rows[:, None], cols[None, :]], logits[j], mask=mask)


def _da_kernel(g_ref, w_ref, da_ref, *, bm, bn, n, num_k, actions, bf16):
    num_rows = g_ref.shape[0]
    pid_r, branch, pid_c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    rows = pid_r * bm + jnp.arange(bm, dtype=jnp.int32)
    row_ok = rows < num_rows
    atoms = jnp.arange(_pad_atoms(n), dtype=jnp.int32)
    ks = pid_c * bn + jnp.arange(bn, dtype=jnp.int32)
    k_ok = ks < num_k
    d = _load_cotangent(g_ref, rows, row_ok, branch, atoms, n, actions)
    acc = jnp.zeros((bm, bn), jnp.float32)
    for s in range(actions + 1):
        wt = pl_triton.load(
            w_ref.at[branch, ks[:, None], (s * n + atoms)[None, :]],
            mask=k_ok[:, None] & (atoms < n)[None, :],
            other=0.0,
        )
        acc = acc + tile_dot(d[s], wt, ((1,), (1,)), bf16)  # d_s W_sᵀ
    cols = branch * num_k + ks
    pl_triton.store(
        da_ref.at[rows[:, None], cols[None, :]], acc, mask=row_ok[:, None] & k_ok[None, :]
    )


def _dw_kernel(a_ref, g_ref, dw_ref, db_ref, *, ba, br, steps, n, num_k, actions, bf16):
    groups = actions + 1
    num_rows = a_ref.shape[0]
    branch, pid_c, share = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    atoms = jnp.arange(_pad_atoms(n), dtype=jnp.int32)
    atom_ok = atoms < n
    ks = pid_c * ba + jnp.arange(ba, dtype=jnp.int32)
    k_ok = ks < num_k

    def body(step, accs):
        rows = (share * steps + step) * br + jnp.arange(br, dtype=jnp.int32)
        row_ok = rows < num_rows
        x = pl_triton.load(
            a_ref.at[rows[:, None], (branch * num_k + ks)[None, :]],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        d = _load_cotangent(g_ref, rows, row_ok, branch, atoms, n, actions)
        dw = [accs[s] + tile_dot(x, d[s], ((0,), (0,)), bf16) for s in range(groups)]  # xᵀ d_s
        db = [accs[groups + s] + jnp.sum(d[s], axis=0) for s in range(groups)]
        return (*dw, *db)

    zw = jnp.zeros((ba, _pad_atoms(n)), jnp.float32)
    zb = jnp.zeros((_pad_atoms(n),), jnp.float32)
    accs = lax.fori_loop(0, steps, body, (zw,) * groups + (zb,) * groups)
    for s in range(groups):
        cols = s * n + atoms
        pl_triton.store(
            dw_ref.at[share, branch, ks[:, None], cols[None, :]],
            accs[s],
            mask=k_ok[:, None] & atom_ok[None, :],
        )
        # Every K tile of the branch holds the same bias sum; the first one writes it.
        pl_triton.store(
            db_ref.at[share, branch, cols],
            accs[groups + s],
            mask=atom_ok & (pid_c == 0),
        )


def dueling_heads_fwd_pallas(
    a, w, b, *, actions, blocks=DEFAULT_HEAD_BLOCKS, bf16=False, interpret=False
):
    """Forward kernel: float32 ``a [B, m·K]``, ``w [m, K, (1+A)·N]``, ``b [m, (1+A)·N]`` →
    logits ``[B, m·A·N]`` (row-major ``[B, m, A, N]``)."""
    m, k, n = _check(a, w, b, actions)
    bm, bk, warps = blocks[0], blocks[1], blocks[2]
    kernel = functools.partial(_fwd_kernel, bm=bm, bk=bk, n=n, num_k=k, actions=actions, bf16=bf16)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((a.shape[0], m * actions * n), jnp.float32),
        grid=(pl.cdiv(a.shape[0], bm), m),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="dueling_heads_fwd",
    )(a, w, b)


def _dw_grid(num_rows: int, m: int, k: int, blocks) -> tuple[int, int, int]:
    ba, br, programs = blocks[6], blocks[7], blocks[8]
    k_tiles = pl.cdiv(k, ba)
    row_tiles = pl.cdiv(num_rows, br)
    shares = max(1, min(row_tiles, programs // (m * k_tiles)))
    steps = pl.cdiv(row_tiles, shares)
    return k_tiles, pl.cdiv(row_tiles, steps), steps


def dueling_heads_bwd_pallas(
    a, w, g, *, actions, blocks=DEFAULT_HEAD_BLOCKS, bf16=False, interpret=False
):
    """Backward kernels: ``(da [B, m·K], dw [m, K, (1+A)·N], db [m, (1+A)·N])`` for the
    cotangent ``g [B, m·A·N]`` of the forward's output."""
    m, k, f = w.shape
    n = f // (actions + 1)
    num_rows = a.shape[0]
    da = pl.pallas_call(
        functools.partial(
            _da_kernel, bm=blocks[3], bn=blocks[4], n=n, num_k=k, actions=actions, bf16=bf16
        ),
        out_shape=jax.ShapeDtypeStruct((num_rows, m * k), jnp.float32),
        grid=(pl.cdiv(num_rows, blocks[3]), m, pl.cdiv(k, blocks[4])),
        compiler_params=_backend.compiler_params(blocks[5]),
        interpret=interpret,
        name="dueling_heads_da",
    )(g, w)
    k_tiles, shares, steps = _dw_grid(num_rows, m, k, blocks)
    dw, db = pl.pallas_call(
        functools.partial(
            _dw_kernel,
            ba=blocks[6],
            br=blocks[7],
            steps=steps,
            n=n,
            num_k=k,
            actions=actions,
            bf16=bf16,
        ),
        out_shape=(
            jax.ShapeDtypeStruct((shares, m, k, f), jnp.float32),
            jax.ShapeDtypeStruct((shares, m, f), jnp.float32),
        ),
        grid=(m, k_tiles, shares),
        compiler_params=_backend.compiler_params(blocks[9]),
        interpret=interpret,
        name="dueling_heads_dw",
    )(a, g)
    return da, jnp.sum(dw, axis=0), jnp.sum(db, axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6))
def _heads(a, w, b, actions, blocks, bf16, interpret):
    return dueling_heads_fwd_pallas(
        a, w, b, actions=actions, blocks=blocks, bf16=bf16, interpret=interpret
    )


def _heads_fwd(a, w, b, actions, blocks, bf16, interpret):
    return _heads(a, w, b, actions, blocks, bf16, interpret), (a, w)


def _heads_bwd(actions, blocks, bf16, interpret, res, g):
    a, w = res
    return dueling_heads_bwd_pallas(
        a, w, g, actions=actions, blocks=blocks, bf16=bf16, interpret=interpret
    )


_heads.defvjp(_heads_fwd, _heads_bwd)


def _build_probe(m, k, n, actions, blocks, bf16):
    def build():
        rows, f = 2 * blocks[0] + 3, (actions + 1) * n  # ragged rows
        a = np.linspace(-1.0, 1.0, rows * m * k, dtype=np.float32).reshape(rows, m * k)
        w = np.linspace(-0.1, 0.1, m * k * f, dtype=np.float32).reshape(m, k, f)
        b = np.zeros((m, f), np.float32)
        g = np.ones((rows, m * actions * n), np.float32)
        kw = dict(actions=actions, blocks=blocks, bf16=bf16)
        fwd = jax.jit(functools.partial(dueling_heads_fwd_pallas, **kw))
        bwd = jax.jit(functools.partial(dueling_heads_bwd_pallas, **kw))
        jax.block_until_ready((fwd(a, w, b), bwd(a, w, g)))

    return build


def dueling_heads(
    a: jax.Array,
    w: jax.Array,
    b: jax.Array,
    *,
    actions: int,
    backend: str = "pallas",
    bf16: bool = False,
    blocks: HeadBlocks = DEFAULT_HEAD_BLOCKS,
) -> jax.Array:
    """The m dueling C51 heads of ``actions`` = A actions: ``a [B, m·K]``,
    ``w [m, K, (1+A)·N]``, ``b [m, (1+A)·N]`` → logits ``[B, m, A, N]`` (math in the module
    docstring).

    backend: "pallas" (the Triton kernels; where they cannot be built, one warning and the
    reference), "interpret" (the kernels under the Pallas interpreter, for CPU tests),
    "reference" (:func:`dueling_heads_reference`) or "auto" (pallas on GPU, else reference).
    bf16: bfloat16 operands, float32 accumulation, in the kernels' products. Differentiable in
    a, w and b (the Pallas paths through a custom_vjp with Pallas backward kernels).
    """
    mode = _backend.resolve(backend, "dueling_heads")
    m, k, n = _check(a, w, b, actions)
    if mode == "pallas":
        key = ("dueling_heads", m, k, n, actions, tuple(blocks), bf16)
        if not _backend.kernel_available(key, _build_probe(m, k, n, actions, blocks, bf16)):
            mode = "reference"
    if mode == "reference":
        return dueling_heads_reference(a, w, b, actions)
    f32 = jnp.float32
    out = _heads(
        a.astype(f32),
        w.astype(f32),
        b.astype(f32),
        actions,
        HeadBlocks(*blocks),
        bf16,
        mode == "interpret",
    )
    return out.reshape(a.shape[0], m, actions, n).astype(a.dtype)
