"""L2 + M7 + P1 from the target network's heads in one pass: E[Q′] of every action, the
sampled (or greedy) next action a′, the TD target and the projected target distribution, as
one Pallas Triton kernel (jaxdqn's ``kernels.target_head=pallas``; forward only).

Math, per group ``g`` (one sample's branch: ``A`` action rows of ``N`` logits ``x_{g,j}`` of
the target network at s′ — or, with ``dueling``, its heads ``[v | A_0 | …]`` with
``x_j = v + A_j − mean_i A_i`` (M6) — the Gumbel noise ``ε_{g,j}``, the n-step return ``r_g``,
the discount ``γ_g`` (γⁿ, 0 where the episode ended) and the support ``z_i = v_min + i·Δz``):

    p_{g,j} = softmax(x_{g,j}),   Q_{g,j} = v_min + Δz Σ_i i·p_{g,j,i}                (M7)
    τ_g     = max(max_j Q − min_j Q, max(|mean_j Q|·0.01, floor))                    (L2)
    a′_g    = argmax_j (Q_{g,j}/τ_g + ε_{g,j})     (the first on ties)               (L2)
    td_g    = r_g + γ_g Q_{g,a′}
    b_i     = clip((r_g + γ_g z_i − v_min)·(1/Δz), 0, N−1)
    m_{g,k} = Σ_i p_{g,a′,i} · max(0, 1 − |b_i − k|)                                 (P1)

``ε`` is ``jax.random.gumbel(key, [G, A])``: ``argmax(Q/τ + ε)`` is exactly how
``jax.random.categorical(key, Q/τ)`` draws, so with the same key the kernel draws the same a′
as jaxdqn's ``sample_next_actions`` up to the rounding of Q; zero noise gives the greedy a′
(``loss.sampled_target=false``).

Why. Computed by XLA, the target pass writes the ``[B, 4, 3, N]`` logits (the dueling
combination), reads them for M7's softmax and moments, writes the probabilities, draws a′ from
E[Q′], gathers a′'s probabilities and hands them to P1's kernel: on the all-off bf16 update's
trace (H100) the target's dueling combination took 10.5 + 9.3 µs, its softmax 14.6 µs, P1
23 µs. Here one kernel reads each group's heads once and writes ``N + 2 + A`` numbers: the
target, its TD value, a′ and E[Q′] (the end-atom mass is read from the target by the caller).

Tiles: ``bg`` groups a program, each action's ``[bg, NP]`` logits in registers (atoms padded
to a power of two ≥ 16 by masked loads), and P1's dense pull as ``[bg, NP, NP]`` hat weights
reduced over the sources (:func:`pallas_kernels.projection._c51_hat_kernel`'s form: two
groups, two warps). No gradient: the target is a constant of the loss (L1).

The jnp reference (:func:`c51_target_reference`) is the same math with P1's scatter-add
reference; the tests hold the kernel (interpreted on the CPU) to it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from pallas_kernels import _backend
from pallas_kernels.c51_loss import (
    check_options,
    dueling_reference,
    logit_tiles,
    padded_width,
    tile_log_softmax,
)
from pallas_kernels.projection import c51_project_reference

__all__ = [
    "DEFAULT_TARGET_GROUPS",
    "DEFAULT_TARGET_WARPS",
    "TEMPERATURE_REL_FLOOR",
    "c51_target",
    "c51_target_available",
    "c51_target_reference",
]

#: groups a program and warps: P1's hat tile is bg × 64 × 64 floats (the hat kernel's 2 × 2)
DEFAULT_TARGET_GROUPS = 2
DEFAULT_TARGET_WARPS = 2
#: L2's relative temperature floor: τ ≥ |mean E[Q′]| × this (jaxdqn's L2 reads it from here)
TEMPERATURE_REL_FLOOR = 0.01


def c51_target_reference(x, noise, reward, discount, v_min, delta_z, floor, *, n, dueling):
    """``(target [G, N], td [G], a′ [G] int32, Q [G, A])`` (module docstring) in jnp:
    ``x`` logits ``[G, A, W]`` or with ``dueling`` heads ``[G, 1+A, W]`` (the ``n`` atoms in
    the first lanes of each segment), ``noise [G, A]``, ``reward``, ``discount``, ``v_min``,
    ``delta_z [G]``, ``floor`` scalar."""
    x = x[..., :n].astype(jnp.float32)
    logits = dueling_reference(x) if dueling else x
    p = jax.nn.softmax(logits, axis=-1)
    idx = jnp.arange(n, dtype=jnp.float32)
    q = v_min[:, None] + delta_z[:, None] * jnp.sum(p * idx, axis=-1)
    gap = q.max(axis=-1) - q.min(axis=-1)
    rel = jnp.maximum(jnp.abs(q.mean(axis=-1)) * TEMPERATURE_REL_FLOOR, floor)
    tau = jnp.maximum(gap, rel)
    a_next = jnp.argmax(q / tau[:, None] + noise, axis=-1).astype(jnp.int32)
    p_next = jnp.take_along_axis(p, a_next[:, None, None], axis=1)[:, 0]
    q_next = jnp.take_along_axis(q, a_next[:, None], axis=1)[:, 0]
    atoms = reward[:, None] + discount[:, None] * (v_min[:, None] + delta_z[:, None] * idx)
    target = c51_project_reference(p_next, atoms, v_min, delta_z)
    return target, reward + discount * q_next, a_next, q


def _target_kernel(
    x_ref, e_ref, r_ref, d_ref, vmin_ref, dz_ref, floor_ref, m_ref, td_ref, act_ref, q_ref,
    *, bg, n, w, a, dueling,
):  # fmt: skip
    rows = pl.program_id(0) * bg + jnp.arange(bg, dtype=jnp.int32)
    row_ok = rows < x_ref.shape[0]
    load = lambda ref, other=0.0: pl_triton.load(ref.at[rows], mask=row_ok, other=other)
    v_min, dz, r, gamma = load(vmin_ref), load(dz_ref, 1.0), load(r_ref), load(d_ref)
    lanes = jnp.arange(padded_width(n), dtype=jnp.int32)
    idx = lanes.astype(jnp.float32)[None, :]
    xs, lane_ok, _ = logit_tiles(x_ref, rows, row_ok, n, w, a, dueling)
    ps, qs = [], []
    for j, x in enumerate(xs):
        p, _ = tile_log_softmax(x, lane_ok)
        q = v_min + dz * jnp.sum(p * idx, axis=1)
        pl_triton.store(q_ref.at[rows, j], q, mask=row_ok)
        ps.append(p)
        qs.append(q)
    top, low, total = qs[0], qs[0], qs[0]
    for q in qs[1:]:
        top, low, total = jnp.maximum(top, q), jnp.minimum(low, q), total + q
    rel = jnp.maximum(jnp.abs(total * (1.0 / a)) * TEMPERATURE_REL_FLOOR, floor_ref[0])
    tau = jnp.maximum(top - low, rel)
    best_j = jnp.zeros((bg,), jnp.int32)
    best = qs[0] / tau + pl_triton.load(e_ref.at[rows, 0], mask=row_ok, other=0.0)
    p_next, q_next = ps[0], qs[0]
    for j in range(1, a):
        score = qs[j] / tau + pl_triton.load(e_ref.at[rows, j], mask=row_ok, other=0.0)
        take = score > best  # strictly: the first maximum wins, as jnp.argmax
        best_j = jnp.where(take, j, best_j)
        best = jnp.where(take, score, best)
        p_next = jnp.where(take[:, None], ps[j], p_next)
        q_next = jnp.where(take, qs[j], q_next)
    # P1 as a dense pull: sources r + γ z_i, destinations the support's lanes
    z = v_min[:, None] + dz[:, None] * idx
    b = jnp.clip((r[:, None] + gamma[:, None] * z - v_min[:, None]) * (1.0 / dz)[:, None],
                 0.0, float(n - 1))  # fmt: skip
    hat = jnp.maximum(1.0 - jnp.abs(b[:, :, None] - idx[:, None, :]), 0.0)  # [bg, src, dst]
    target = jnp.sum(p_next[:, :, None] * hat, axis=1)
    mask = row_ok[:, None] & lane_ok
    pl_triton.store(m_ref.at[rows[:, None], lanes[None, :]], target, mask=mask)
    pl_triton.store(td_ref.at[rows], r + gamma * q_next, mask=row_ok)
    pl_triton.store(act_ref.at[rows], best_j, mask=row_ok)


def _target_call(x, noise, reward, discount, v_min, delta_z, floor, n, dueling, interpret, bg,
                 warps):  # fmt: skip
    g, k, w = x.shape
    a = k - 1 if dueling else k
    f32 = jnp.float32
    return pl.pallas_call(
        functools.partial(_target_kernel, bg=bg, n=n, w=w, a=a, dueling=dueling),
        out_shape=(
            jax.ShapeDtypeStruct((g, n), f32),
            jax.ShapeDtypeStruct((g,), f32),
            jax.ShapeDtypeStruct((g,), jnp.int32),
            jax.ShapeDtypeStruct((g, a), f32),
        ),
        grid=(pl.cdiv(g, bg),),
        compiler_params=_backend.compiler_params(warps),
        interpret=interpret,
        name="c51_target",
    )(x.reshape(g, k * w), noise, reward, discount, v_min, delta_z, floor.reshape(1))


def _check(x, noise, reward, discount, v_min, delta_z, n, dueling):
    g, k, w = x.shape
    a = k - 1 if dueling else k
    what = "heads [G, 1+A, W]" if dueling else "logits [G, A, W]"
    if (
        noise.shape != (g, a)
        or any(y.shape != (g,) for y in (reward, discount, v_min, delta_z))
        or w not in (n, padded_width(n))
        or n < 2
        or a < 1
    ):
        raise ValueError(
            f"c51_target: {what} (W = N = {n} or {padded_width(n)}), noise [G, A], reward, "
            f"discount, v_min, delta_z [G] disagree: {x.shape}, {noise.shape}, "
            f"{[y.shape for y in (reward, discount, v_min, delta_z)]}"
        )
    return a


def c51_target(
    x: jax.Array,
    noise: jax.Array,
    reward: jax.Array,
    discount: jax.Array,
    v_min: jax.Array,
    delta_z: jax.Array,
    floor: jax.Array | float,
    *,
    num_atoms: int,
    dueling: bool = False,
    backend: str = "pallas",
    groups: int = DEFAULT_TARGET_GROUPS,
    num_warps: int = DEFAULT_TARGET_WARPS,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(target [G, N], td [G], a′ [G] int32, Q [G, A])`` (module docstring) of the target
    network's ``x`` = logits ``[G, A, W]`` or, with ``dueling``, heads ``[G, 1+A, W]`` =
    ``[v | A_0 | …]``, each segment ``W`` = N (``num_atoms``) or N padded to a power of two ≥ 16
    wide with the atoms in its first N lanes; Gumbel ``noise [G, A]`` (zeros: the greedy a′),
    ``reward``, ``discount`` (γⁿ or 0), ``v_min``, ``delta_z [G]`` and L2's temperature
    ``floor`` (Q units). ``backend``: ``pallas`` (the Triton kernel; the jnp reference where it
    cannot be built here), ``interpret`` (the kernel under the Pallas interpreter: CPU tests)
    or ``reference`` (jnp). Everything is read under stop_gradient (a target, L1)."""
    a = _check(x, noise, reward, discount, v_min, delta_z, num_atoms, dueling)
    check_options("c51_target", backend, groups, least=1)
    f32 = jnp.float32
    x = jax.lax.stop_gradient(x)
    noise, reward, discount, v_min, delta_z = (
        jax.lax.stop_gradient(y).astype(f32) for y in (noise, reward, discount, v_min, delta_z)
    )
    floor = jnp.asarray(floor, f32)
    args = (noise, reward, discount, v_min, delta_z, floor)
    if backend == "reference" or (
        backend == "pallas" and not c51_target_available(a, num_atoms, dueling, x.shape[-1])
    ):
        return c51_target_reference(x, *args, n=num_atoms, dueling=dueling)
    x = x if x.dtype in (jnp.float32, jnp.bfloat16) else x.astype(f32)
    return _target_call(x, *args, num_atoms, dueling, backend == "interpret", groups, num_warps)


def c51_target_available(a: int, n: int, dueling: bool = False, width: int | None = None) -> bool:
    """Whether the kernel builds and runs here for ``a`` actions of ``n`` atoms (from heads with
    ``dueling``; segments ``width`` wide, default ``n``; once per process; one warning and
    False where it does not, so the caller uses the reference)."""
    w = width or n

    def build():
        g, k = 2 * DEFAULT_TARGET_GROUPS + 1, a + 1 if dueling else a  # ragged
        x = np.linspace(-3.0, 3.0, g * k * w, dtype=np.float32).reshape(g, k, w)
        ones = np.ones((g,), np.float32)
        out = jax.jit(_target_call, static_argnums=tuple(range(7, 12)))(
            x, np.zeros((g, a), np.float32), ones, ones, -ones, ones, np.float32(1e-6),
            n, dueling, False, DEFAULT_TARGET_GROUPS, DEFAULT_TARGET_WARPS,
        )  # fmt: skip
        jax.block_until_ready(out)

    return _backend.kernel_available(("c51_target", a, n, dueling, w), build)
