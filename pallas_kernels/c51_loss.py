"""L1 + L4 + M7's E[Q] from the learner's online logits in one pass, forward and backward, as
two Pallas Triton kernels under a custom_vjp (jaxdqn's ``kernels.loss_head=pallas``).

Math, per group ``g`` (one sample's branch: ``A`` action rows of ``N`` logits ``x_{g,j}``, the
taken action ``a_g``, the projected target ``m_g [N]``, the support ``z_i = v_min_g + i·Δz_g``):

    log p_{g,j} = x_{g,j} − max x_{g,j} − log Σ exp(x_{g,j} − max x_{g,j})      (log-softmax)
    ce_g      = −Σ_i m_{g,i} log p_{g,a_g,i}                                     (L1)
    H_{g,j}   = −Σ_i p_{g,j,i} log p_{g,j,i}                                     (L4, metrics)
    Q_{g,j}   = v_min_g + Δz_g Σ_i p_{g,j,i} i                                   (M7's E[Z])

and their vector-Jacobian product for the cotangents ``ḡ_ce [G]`` and ``ḡ_H [G, A]``:

    ∂L/∂x_{g,j,i} = ḡ_ce_g [j = a_g] (p_{g,j,i} Σ_l m_{g,l} − m_{g,i})
                    − ḡ_H_{g,j} p_{g,j,i} (log p_{g,j,i} + H_{g,j}).

``Q`` is returned without gradient (its cotangent is ignored): the learner reads the online E[Q]
only under ``stop_gradient`` (dynamics, the L6 inputs, L3's gate).

Why. The learner's jnp loss passes over the ``[B, 4, 3, N]`` logits several times — the
softmax of M7's statistics and E[Q], the cross-entropy's log-softmax, the entropy's, the atom
utilisation's logarithm, then the backward of the cross-entropy and the entropy — each an XLA
reduction over rows of 51 atoms (the all-off bf16 update's trace on an H100: the cross-entropy
21 + 15 + 12 µs, the statistics' softmax 21 µs, the entropy 22.6 µs; bench/RESULTS.md). Here
the forward reads the logits and the targets once and writes ``1 + 2A`` numbers a group; the
backward reads them once more and writes the logits' cotangent. Atoms are padded to a power of
two (≥ 16) by masked loads; ``bg`` groups a program, the ``A`` actions' tiles one after another.

The jnp reference (:func:`c51_loss_head_reference`) is the same math; the tests hold the kernels
(interpreted on the CPU) to it and its autodiff to float rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend
from pallas_kernels.heads import _pad_atoms

__all__ = [
    "DEFAULT_LOSS_GROUPS",
    "c51_loss_head",
    "c51_loss_head_reference",
    "check_options",
    "dueling_reference",
    "logit_tiles",
    "loss_head_available",
    "padded_width",
    "tile_log_softmax",
]

#: groups (sample × branch) a program: 3 actions × [64, 64] float32 tiles, 4 warps
DEFAULT_LOSS_GROUPS = 64
DEFAULT_LOSS_WARPS = 4


def padded_width(n: int) -> int:
    """The lanes a row of ``n`` atoms takes in the kernels' tiles (N rounded up to a power of two
    ≥ 16, the rule of every kernel here): the width of ``dueling_padded``'s whole segments."""
    return _pad_atoms(n)


def c51_loss_head_reference(logits, actions, target, v_min, delta_z):
    """``(ce [G], H [G, A], Q [G, A])`` of ``logits [G, A, N]``, int ``actions [G]``,
    ``target [G, N]`` on the supports ``v_min``, ``delta_z [G]`` (module docstring's math, jnp;
    differentiable through ``ce`` and ``H``; ``Q`` under stop_gradient)."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(log_p)
    taken = jnp.arange(logits.shape[1], dtype=actions.dtype)[None, :] == actions[:, None]
    log_p_taken = jnp.sum(jnp.where(taken[..., None], log_p, 0.0), axis=1)  # [G, N]
    ce = -jnp.sum(jax.lax.stop_gradient(target) * log_p_taken, axis=-1)
    h = -jnp.sum(p * log_p, axis=-1)
    idx = jnp.arange(logits.shape[-1], dtype=logits.dtype)
    q = v_min[:, None] + delta_z[:, None] * jnp.sum(jax.lax.stop_gradient(p) * idx, axis=-1)
    return ce, h, q


def _segment_mask(row_ok, n, w):
    """``(lanes [NP], lane_ok [1, NP], mask [bg, NP])`` of rows whose segments are ``w`` wide
    (``w = N``: packed, the lanes past N masked; ``w = NP``: padded, every lane in bounds and
    read or written whole — aligned, unmasked along the lanes)."""
    lanes = jnp.arange(padded_width(n), dtype=jnp.int32)
    lane_ok = (lanes < n)[None, :]
    mask = row_ok[:, None] & (lane_ok if w != padded_width(n) else (lanes >= 0)[None, :])
    return lanes, lane_ok, mask


def logit_tiles(x_ref, rows, row_ok, n, w, a, dueling):
    """The ``a`` actions' logits tiles ``[bg, NP]`` of ``bg`` groups (float32, −inf off the
    lanes) and ``lane_ok [1, NP]``: read from ``[G, A·w]`` logits, or with ``dueling`` from
    ``[G, (1+A)·w]`` heads ``[v | A_0 | …]`` as ``v + A_j − mean_i A_i`` (M6's combination);
    each segment ``w`` wide, its first N lanes the atoms."""
    lanes, lane_ok, mask = _segment_mask(row_ok, n, w)
    load = lambda k: pl_triton.load(
        x_ref.at[rows[:, None], k * w + lanes[None, :]], mask=mask, other=0.0
    ).astype(jnp.float32)
    if dueling:
        v = load(0)
        adv = [load(1 + j) for j in range(a)]
        mean = sum(adv[1:], adv[0]) * (1.0 / a)
        xs = [v + adv_j - mean for adv_j in adv]
    else:
        xs = [load(j) for j in range(a)]
    return [jnp.where(lane_ok, x, -jnp.inf) for x in xs], lane_ok, mask


def tile_log_softmax(x, lane_ok):
    """``(p, log p)`` of a tile's rows, ``log p`` 0 off the lanes (so ``p · log p`` is 0 there)."""
    top = jnp.max(x, axis=1, keepdims=True)
    e = jnp.where(lane_ok, jnp.exp(x - top), 0.0)
    s = jnp.sum(e, axis=1, keepdims=True)
    return e / s, jnp.where(lane_ok, x - top - jnp.log(s), 0.0)


def _targets(m_ref, rows, row_ok, n):
    lanes = jnp.arange(padded_width(n), dtype=jnp.int32)
    mask = row_ok[:, None] & (lanes < n)[None, :]
    return pl_triton.load(m_ref.at[rows[:, None], lanes[None, :]], mask=mask, other=0.0)


def _forward_kernel(
    x_ref, m_ref, act_ref, vmin_ref, dz_ref, ce_ref, h_ref, q_ref, *, bg, n, w, a, dueling
):
    rows = pl.program_id(0) * bg + jnp.arange(bg, dtype=jnp.int32)
    row_ok = rows < x_ref.shape[0]
    m = _targets(m_ref, rows, row_ok, n)
    taken = pl_triton.load(act_ref.at[rows], mask=row_ok, other=-1)
    v_min = pl_triton.load(vmin_ref.at[rows], mask=row_ok, other=0.0)
    dz = pl_triton.load(dz_ref.at[rows], mask=row_ok, other=0.0)
    idx = jnp.arange(padded_width(n), dtype=jnp.int32).astype(jnp.float32)[None, :]
    xs, lane_ok, _ = logit_tiles(x_ref, rows, row_ok, n, w, a, dueling)
    ce = jnp.zeros((bg,), jnp.float32)
    for j, x in enumerate(xs):
        p, log_p = tile_log_softmax(x, lane_ok)
        ce = ce + jnp.where(taken == j, -jnp.sum(m * log_p, axis=1), 0.0)
        pl_triton.store(h_ref.at[rows, j], -jnp.sum(p * log_p, axis=1), mask=row_ok)
        pl_triton.store(q_ref.at[rows, j], v_min + dz * jnp.sum(p * idx, axis=1), mask=row_ok)
    pl_triton.store(ce_ref.at[rows], ce, mask=row_ok)


def _backward_kernel(x_ref, m_ref, act_ref, gce_ref, gh_ref, dx_ref, *, bg, n, w, a, dueling):
    rows = pl.program_id(0) * bg + jnp.arange(bg, dtype=jnp.int32)
    row_ok = rows < x_ref.shape[0]
    lanes = jnp.arange(padded_width(n), dtype=jnp.int32)
    m = _targets(m_ref, rows, row_ok, n)
    mass = jnp.sum(m, axis=1, keepdims=True)
    taken = pl_triton.load(act_ref.at[rows], mask=row_ok, other=-1)
    g_ce = pl_triton.load(gce_ref.at[rows], mask=row_ok, other=0.0)[:, None]
    xs, lane_ok, mask = logit_tiles(x_ref, rows, row_ok, n, w, a, dueling)
    store = lambda k, d: pl_triton.store(
        dx_ref.at[rows[:, None], k * w + lanes[None, :]], d, mask=mask
    )
    dxs = []
    for j, x in enumerate(xs):
        p, log_p = tile_log_softmax(x, lane_ok)
        h = -jnp.sum(p * log_p, axis=1, keepdims=True)
        g_h = pl_triton.load(gh_ref.at[rows, j], mask=row_ok, other=0.0)[:, None]
        dx = jnp.where((taken == j)[:, None], g_ce * (p * mass - m), 0.0) - g_h * p * (log_p + h)
        if dueling:
            dxs.append(dx)
        else:
            store(j, dx)
    if dueling:  # x_j = v + A_j − mean A: dv = Σ_j dx_j, dA_j = dx_j − (1/A) Σ_k dx_k
        total = sum(dxs[1:], dxs[0])
        store(0, total)
        for j, dx in enumerate(dxs):
            store(1 + j, dx - total * (1.0 / a))


def check_options(name: str, backend: str, groups: int, *, least: int) -> None:
    """Refuse a ``backend`` other than pallas, interpret, reference and a ``groups`` that is not
    a power of two ≥ ``least`` (one ValueError naming the kernel ``name``)."""
    if backend not in ("pallas", "interpret", "reference"):
        raise ValueError(f"{name}: backend must be pallas, interpret or reference, "
                         f"got {backend!r}")  # fmt: skip
    if groups & (groups - 1) or groups < least:
        raise ValueError(f"{name}: groups must be a power of two >= {least}, got {groups}")


def _check(x, actions, target, v_min, delta_z, dueling):
    g, k, w = x.shape
    n = target.shape[-1]
    what = "heads [G, 1+A, W]" if dueling else "logits [G, A, W]"
    if (
        actions.shape != (g,)
        or target.shape != (g, n)
        or w not in (n, padded_width(n))
        or v_min.shape != (g,)
        or delta_z.shape != (g,)
        or k < (2 if dueling else 1)
    ):
        raise ValueError(
            f"c51_loss_head: {what} (W = N or {padded_width(n)}), actions [G], target [G, N], "
            f"v_min [G], delta_z [G] disagree: {x.shape}, {actions.shape}, {target.shape}, "
            f"{v_min.shape}, {delta_z.shape}"
        )
    return g, k - 1 if dueling else k, n


def _forward_call(x, actions, target, v_min, delta_z, dueling, interpret, bg, warps):
    g, k, w = x.shape
    a, n = k - 1 if dueling else k, target.shape[-1]
    f32 = jnp.float32
    return pl.pallas_call(
        functools.partial(_forward_kernel, bg=bg, n=n, w=w, a=a, dueling=dueling),
        out_shape=(
            jax.ShapeDtypeStruct((g,), f32),
            jax.ShapeDtypeStruct((g, a), f32),
            jax.ShapeDtypeStruct((g, a), f32),
        ),
        grid=(pl.cdiv(g, bg),),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="c51_loss_head",
    )(x.reshape(g, k * w), target, actions, v_min, delta_z)


def _backward_call(x, actions, target, g_ce, g_h, dueling, interpret, bg, warps):
    g, k, w = x.shape
    a, n = k - 1 if dueling else k, target.shape[-1]
    dx = pl.pallas_call(
        functools.partial(_backward_kernel, bg=bg, n=n, w=w, a=a, dueling=dueling),
        out_shape=jax.ShapeDtypeStruct((g, k * w), jnp.float32),
        grid=(pl.cdiv(g, bg),),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="c51_loss_head_grad",
    )(x.reshape(g, k * w), target, actions, g_ce, g_h)
    return dx.reshape(g, k, w).astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def _loss_head(x, actions, target, v_min, delta_z, dueling, interpret, bg, warps):
    return _forward_call(x, actions, target, v_min, delta_z, dueling, interpret, bg, warps)


def _loss_head_fwd(x, actions, target, v_min, delta_z, dueling, interpret, bg, warps):
    out = _forward_call(x, actions, target, v_min, delta_z, dueling, interpret, bg, warps)
    return out, (x, actions, target, v_min, delta_z)


def _loss_head_bwd(dueling, interpret, bg, warps, res, cot):
    x, actions, target, v_min, delta_z = res
    g_ce, g_h, _ = cot  # Q has no gradient (module docstring)
    f32 = jnp.float32
    dx = _backward_call(
        x, actions, target, g_ce.astype(f32), g_h.astype(f32), dueling, interpret, bg, warps
    )
    zero = lambda y: (
        np.zeros(y.shape, jax.dtypes.float0) if jnp.issubdtype(y.dtype, jnp.integer)
        else jnp.zeros_like(y)
    )  # fmt: skip
    # The target enters under stop_gradient (a projected Bellman target, L1).
    return dx, zero(actions), jnp.zeros_like(target), zero(v_min), zero(delta_z)


_loss_head.defvjp(_loss_head_fwd, _loss_head_bwd)


def dueling_reference(heads: jax.Array) -> jax.Array:
    """M6's combination of ``heads [..., 1+A, N]`` = ``[v | A_0 | …]``: logits ``[..., A, N]``
    = ``v + A_j − mean_i A_i`` (jnp)."""
    v, adv = heads[..., :1, :], heads[..., 1:, :]
    return v + adv - jnp.mean(adv, axis=-2, keepdims=True)


def c51_loss_head(
    x: jax.Array,
    actions: jax.Array,
    target: jax.Array,
    v_min: jax.Array,
    delta_z: jax.Array,
    *,
    dueling: bool = False,
    backend: str = "pallas",
    groups: int = DEFAULT_LOSS_GROUPS,
    num_warps: int = DEFAULT_LOSS_WARPS,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(ce [G], H [G, A], Q [G, A])`` (module docstring) of ``x`` = ``logits [G, A, N]``, or
    with ``dueling`` the heads' outputs ``[G, 1+A, N]`` = ``[v | A_0 | …]`` whose logits are
    ``v + A_j − mean_i A_i`` (M6's combination, then done inside the kernels: the logits are
    never written, and the backward writes the heads' cotangent ``dv = Σ_j dx_j``,
    ``dA_j = dx_j − (1/A) Σ_k dx_k``); int32 ``actions [G]``, ``target [G, N]``, ``v_min``,
    ``delta_z [G]``. ``backend``: ``pallas`` (the Triton kernels; the jnp reference where they
    cannot be built here), ``interpret`` (the kernels under the Pallas interpreter: CPU tests)
    or ``reference`` (jnp). Gradients flow to ``x`` through ``ce`` and ``H``; ``target`` and
    ``Q`` carry none. ``x``'s last axis may be padded: ``W = NP`` (N rounded up to a power of
    two ≥ 16) with the atoms in the first N lanes, so each segment is a whole, aligned tile
    (the lanes past N are ignored forward and get a zero cotangent)."""
    _, a, n = _check(x, actions, target, v_min, delta_z, dueling)
    check_options("c51_loss_head", backend, groups, least=16)
    f32 = jnp.float32
    x, target, v_min, delta_z = (
        x.astype(f32),
        target.astype(f32),
        v_min.astype(f32),
        delta_z.astype(f32),
    )
    actions = actions.astype(jnp.int32)
    if backend == "reference" or (
        backend == "pallas" and not loss_head_available(a, n, dueling, x.shape[-1])
    ):
        x = x[..., :n]  # padded segments: the atoms are the first N lanes
        logits = dueling_reference(x) if dueling else x
        return c51_loss_head_reference(logits, actions, target, v_min, delta_z)
    args = (dueling, backend == "interpret", groups, num_warps)
    return _loss_head(x, actions, target, v_min, delta_z, *args)


def loss_head_available(a: int, n: int, dueling: bool = False, width: int | None = None) -> bool:
    """Whether both kernels build and run here for ``a`` actions of ``n`` atoms (read from the
    heads' outputs with ``dueling``; segments ``width`` wide, default ``n``; once per process;
    one warning and False where they do not, so the caller uses the reference)."""
    w = width or n

    def build():
        g, k = 2 * DEFAULT_LOSS_GROUPS + 3, a + 1 if dueling else a  # ragged
        x = np.linspace(-3.0, 3.0, g * k * w, dtype=np.float32).reshape(g, k, w)
        acts = np.arange(g, dtype=np.int32) % a
        m = np.full((g, n), 1.0 / n, np.float32)
        ones = np.ones((g,), np.float32)

        def loss(x):
            args = (dueling, False, DEFAULT_LOSS_GROUPS, DEFAULT_LOSS_WARPS)
            ce, h, _ = _loss_head(x, acts, m, -ones, ones, *args)
            return jnp.sum(ce) + jnp.sum(h)

        jax.block_until_ready(jax.jit(jax.grad(loss))(x))

    return _backend.kernel_available(("c51_loss_head", a, n, dueling, w), build)
