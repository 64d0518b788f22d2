"""M7: statistics of categorical (C51) return distributions on a uniform support.

The support is given per call, because the learner's adaptive support (L7) moves it:
atom ``i`` sits at ``z_i = v_min + i · Δz`` for ``i = 0 .. N-1``. Every function here is a pure
function of the probabilities and the support; ``v_min`` and ``delta_z`` broadcast against
``probs.shape[:-1]`` (a scalar, or one value per row with trailing singleton axes added by the
caller).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
from jax import Array

__all__ = ["QUANTILE_LEVELS", "atoms", "expectation", "quantiles", "statistics", "variance"]

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
    mean_i, mean_i2 = _index_moments(probs)
    return jnp.square(delta_z) * jnp.maximum(mean_i2 - jnp.square(mean_i), 0.0)


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
    frac = (taus - f_prev) / jnp.maximum(f_k - f_prev, jnp.finfo(probs.dtype).tiny)
    pos = jnp.where(k > 0, k - 1 + jnp.clip(frac, 0.0, 1.0), 0.0)
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
