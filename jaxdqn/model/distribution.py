"""M7: statistics of categorical (C51) return distributions on a uniform support.

The support is given per call, because the learner's adaptive support (L7) moves it:
atom ``i`` sits at ``z_i = v_min + i · Δz`` for ``i = 0 .. N-1``. Every function here is a pure
function of the probabilities and the support; ``v_min`` and ``delta_z`` broadcast against
``probs.shape[:-1]`` (a scalar, or one value per row with trailing singleton axes added by the
caller).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import Array

from pallas_kernels.statistics import c51_statistics_pallas, statistics_kernel_available

__all__ = [
    "QUANTILE_LEVELS",
    "STATISTICS",
    "atoms",
    "expectation",
    "quantiles",
    "statistics",
    "statistics_by_scan",
    "statistics_of_logits",
    "variance",
]

#: The quantile levels reported by the network (Q10, Q50, Q90; used by A2's IQN-style blend).
QUANTILE_LEVELS: tuple[float, float, float] = (0.1, 0.5, 0.9)


def atoms(num_atoms: int, v_min: Array | float, delta_z: Array | float) -> Array:
    """The support ``z_i = v_min + i · Δz``; shape ``broadcast(v_min, delta_z).shape + [N]``."""
    i = jnp.arange(num_atoms, dtype=jnp.result_type(v_min, delta_z, jnp.float32))
    return jnp.asarray(v_min)[..., None] + jnp.asarray(delta_z)[..., None] * i


def _index_moments(probs: Array) -> tuple[Array, Array]:
    """``(E[i], E[i²])`` of the atom index under ``probs`` ``[..., N]``."""
    i = jnp.arange(probs.shape[-1], dtype=probs.dtype)
    return jnp.sum(probs * i, axis=-1), jnp.sum(probs * i * i, axis=-1)


def expectation(probs: Array, v_min: Array | float, delta_z: Array | float) -> Array:
    """E[Z] = Σ_i p_i z_i = v_min + Δz · E[i].

    Args:
      probs: ``[..., N]`` probabilities (each row sums to one).
      v_min, delta_z: support, broadcastable to ``probs.shape[:-1]``.
    Returns:
      ``probs.shape[:-1]``.
    """
    mean_i, _ = _index_moments(probs)
    return v_min + delta_z * mean_i


def variance(probs: Array, v_min: Array | float, delta_z: Array | float) -> Array:
    """Var[Z] = E[Z²] − E[Z]², computed in atom-index units and scaled by Δz².

    Shifting the support does not change the variance, so working with the index
    (``Var[Z] = Δz² · (E[i²] − E[i]²)``) is the same identity without the catastrophic
    cancellation that ``E[Z²] − E[Z]²`` suffers when |v_min| is large compared with the spread.
    Clamped at zero against rounding. ``v_min`` is accepted for a uniform signature.

    Returns:
      ``probs.shape[:-1]``.
    """
    del v_min
    return _index_variance(*_index_moments(probs), delta_z)


def _index_variance(mean_i: Array, mean_i2: Array, delta_z: Array | float) -> Array:
    """``Δz² · max(E[i²] − E[i]², 0)`` (see :func:`variance`)."""
    return jnp.square(delta_z) * jnp.maximum(mean_i2 - jnp.square(mean_i), 0.0)


def _position(k: Array, f_prev: Array, f_k: Array, taus: Array) -> Array:
    """The quantile's fractional atom index from its bracketing CDF values (see
    :func:`quantiles`): ``k − 1 + clip((τ − F_{k−1}) / (F_k − F_{k−1}), 0, 1)``, 0 where k = 0."""
    frac = (taus - f_prev) / jnp.maximum(f_k - f_prev, jnp.finfo(taus.dtype).tiny)
    return jnp.where(k > 0, k - 1 + jnp.clip(frac, 0.0, 1.0), 0.0)


def quantiles(
    probs: Array,
    v_min: Array | float,
    delta_z: Array | float,
    levels: Sequence[float] = QUANTILE_LEVELS,
) -> Array:
    """Quantiles by linear interpolation of each distribution's CDF.

    The CDF is taken as the piecewise-linear curve through the points ``(z_i, F_i)`` with
    ``F_i = Σ_{j≤i} p_j``. For a level τ let ``k`` be the first atom with ``F_k ≥ τ``; then

        Q(τ) = z_0                                            if k = 0,
        Q(τ) = z_{k-1} + Δz · (τ − F_{k-1}) / (F_k − F_{k-1})  otherwise,

    which is ``numpy.interp(τ, F, z)`` for strictly positive probabilities.

    Args:
      probs: ``[..., N]``.
      v_min, delta_z: broadcastable to ``probs.shape[:-1]``.
      levels: quantile levels in (0, 1), length L.
    Returns:
      ``probs.shape[:-1] + [L]``.
    """
    n = probs.shape[-1]
    cdf = jnp.cumsum(probs, axis=-1)
    taus = jnp.asarray(levels, dtype=probs.dtype)
    # k = number of atoms whose CDF is still below τ = index of the first atom with F_k ≥ τ.
    k = jnp.sum(cdf[..., None, :] < taus[:, None], axis=-1)
    k = jnp.minimum(k, n - 1)
    f_k = jnp.take_along_axis(cdf, k, axis=-1)
    f_prev = jnp.where(k > 0, jnp.take_along_axis(cdf, jnp.maximum(k - 1, 0), axis=-1), 0.0)
    pos = _position(k, f_prev, f_k, taus)
    return jnp.asarray(v_min)[..., None] + jnp.asarray(delta_z)[..., None] * pos


def statistics(
    probs: Array, v_min: Array | float, delta_z: Array | float
) -> tuple[Array, Array, Array]:
    """``(E[Z], Var[Z], quantiles at QUANTILE_LEVELS)`` with shapes ``[...], [...], [..., 3]``."""
    return (
        expectation(probs, v_min, delta_z),
        variance(probs, v_min, delta_z),
        quantiles(probs, v_min, delta_z),
    )


STATISTICS = ("reference", "scan", "pallas", "interpret")
"""Implementations of :func:`statistics_of_logits` (``kernels.statistics`` resolved)."""


def statistics_by_scan(
    logits: Array,
    v_min: Array | float,
    delta_z: Array | float,
    levels: Sequence[float] = QUANTILE_LEVELS,
    *,
    atoms_major: bool = True,
) -> tuple[Array, Array, Array]:
    """``(E[Z], Var[Z], quantiles)`` of ``softmax(logits)`` as one sequential pass over the
    atoms: every quantity is a running value over ``i = 0 .. N-1`` of ``[...]``-shaped arrays,

        m = max_i x_i,  e_i = exp(x_i − m),  p_i = e_i / Σ_j e_j,
        E[i] = Σ p_i i,  E[i²] = Σ p_i i²,  F_i = F_{i−1} + p_i,
        k(τ) += [F_i < τ],  F_{k−1} = the last F_i < τ (0 if none),  F_k = the first F_i ≥ τ,

    then :func:`expectation`, :func:`variance` and :func:`quantiles`' interpolation from them.
    The same math as :func:`statistics` of :func:`jax.nn.softmax` (equal to float rounding:
    the CDF is summed left to right, where ``jnp.cumsum`` uses a parallel scan); it is what
    XLA fuses into one elementwise kernel that reads each row's logits once, where the
    reference's row reductions over the short atom axis, its cumulative sum, level counts and
    gathers each pass over the ``[..., N]`` tensor. No reduction, no gather: only slices.

    Args:
      logits: ``[..., N]``.
      v_min, delta_z: broadcastable to ``logits.shape[:-1]``.
      levels: quantile levels in (0, 1), length L.
      atoms_major: first write the logits atoms-major (``[N, ...]``, behind an optimisation
        barrier), so that each atom's slice is one contiguous read across rows and XLA does
        not fuse the logits' producers into the pass (in the acting program it did, and the
        fused pass took 1.04 ms against 0.30 ms on materialised logits; H200, E = 65,536).
        False: slice the ``[..., N]`` logits in place.
    Returns:
      ``logits.shape[:-1]``, the same, and ``logits.shape[:-1] + [L]``.
    """
    n = logits.shape[-1]
    if atoms_major:
        major = jax.lax.optimization_barrier(jnp.moveaxis(logits, -1, 0))
        xs = [major[i] for i in range(n)]
    else:
        xs = [logits[..., i] for i in range(n)]
    top = functools.reduce(jnp.maximum, xs)
    es = [jnp.exp(x - top) for x in xs]
    total = functools.reduce(jnp.add, es)
    ps = [e / total for e in es]
    mean_i = functools.reduce(jnp.add, [p * float(i) for i, p in enumerate(ps)])
    mean_i2 = functools.reduce(jnp.add, [p * float(i * i) for i, p in enumerate(ps)])
    zero = jnp.zeros_like(top)
    taus = [jnp.asarray(t, logits.dtype) for t in levels]
    count = [zero] * len(taus)  # k, as a float
    f_prev = [zero] * len(taus)
    f_next = [jnp.full_like(top, jnp.inf)] * len(taus)
    cdf = zero
    for p in ps:
        cdf = cdf + p
        for j, tau in enumerate(taus):
            below = cdf < tau
            count[j] = count[j] + below.astype(logits.dtype)
            f_prev[j] = jnp.where(below, cdf, f_prev[j])
            f_next[j] = jnp.where(below, f_next[j], jnp.minimum(f_next[j], cdf))
    # Every F_i < τ (a CDF that rounds below τ) leaves F_k = ∞: position N − 1, which is where
    # the reference's clamp k = N − 1 with its fraction clipped to 1 lands too.
    positions = [_position(*picks) for picks in zip(count, f_prev, f_next, taus, strict=True)]
    v_min, delta_z = jnp.asarray(v_min), jnp.asarray(delta_z)
    mean = v_min + delta_z * mean_i
    var = _index_variance(mean_i, mean_i2, delta_z)
    quant = v_min[..., None] + delta_z[..., None] * jnp.stack(positions, axis=-1)
    return mean, var, quant


def _reference_of_logits(logits: Array, v_min: Array, delta_z: Array):
    return statistics(jax.nn.softmax(logits, axis=-1), v_min, delta_z)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _forward_statistics(logits: Array, v_min: Array, delta_z: Array, backend: str):
    """M7 by ``backend`` (``scan``, ``pallas`` or ``interpret``), differentiated through the
    jnp reference (custom VJP): the three compute the same function, and the reference's
    gradient is the one the tests pin down."""
    if backend == "scan":
        return statistics_by_scan(logits, v_min, delta_z)
    lead, n = logits.shape[:-1], logits.shape[-1]
    flat = lambda x: jnp.broadcast_to(x, lead).reshape(-1).astype(jnp.float32)
    mean, var, quant = c51_statistics_pallas(
        logits.reshape(-1, n).astype(jnp.float32),
        flat(v_min),
        flat(delta_z),
        levels=QUANTILE_LEVELS,
        interpret=backend == "interpret",
    )
    return mean.reshape(lead), var.reshape(lead), quant.reshape(*lead, len(QUANTILE_LEVELS))


def _forward_statistics_fwd(logits, v_min, delta_z, backend):
    return _forward_statistics(logits, v_min, delta_z, backend), (logits, v_min, delta_z)


def _forward_statistics_bwd(backend, res, g):
    # Forward only: gradients are the jnp reference's, recomputed here.
    return jax.vjp(_reference_of_logits, *res)[1](g)


_forward_statistics.defvjp(_forward_statistics_fwd, _forward_statistics_bwd)


def statistics_of_logits(
    logits: Array, v_min: Array | float, delta_z: Array | float, backend: str = "reference"
) -> tuple[Array, Array, Array, Array]:
    """``(probs, E[Z], Var[Z], quantiles)`` of logits ``[..., N]``: ``probs = softmax(logits)``
    and :func:`statistics` of it. ``backend`` (``kernels.statistics`` resolved, one of
    :data:`STATISTICS`): ``reference`` computes them with jnp; ``scan`` with
    :func:`statistics_by_scan` (jnp, one pass over the atoms); ``pallas`` reads the logits once
    in the Triton kernel of :mod:`pallas_kernels.statistics` (the jnp reference where it cannot
    be built), ``interpret`` runs that kernel under the Pallas interpreter (CPU tests). The
    scan's and the kernel's results equal the reference to float rounding and are
    differentiated through the reference (a custom VJP); ``probs`` is always the jnp softmax
    (unused, XLA drops it).
    """
    if backend not in STATISTICS:
        raise ValueError(f"kernels.statistics: {backend!r} is not one of {STATISTICS}")
    probs = jax.nn.softmax(logits, axis=-1)
    forward_only = backend in ("scan", "interpret") or (
        backend == "pallas" and statistics_kernel_available(logits.shape[-1], QUANTILE_LEVELS)
    )
    if not forward_only:
        return (probs, *statistics(probs, v_min, delta_z))
    v_min, delta_z = jnp.asarray(v_min, logits.dtype), jnp.asarray(delta_z, logits.dtype)
    return (probs, *_forward_statistics(logits, v_min, delta_z, backend))
