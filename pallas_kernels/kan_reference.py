"""M4 / P2: the KAN spline gate — the math, its initialiser and the pure-jnp reference.

The Pallas kernels with the same signature are in :mod:`pallas_kernels.kan`.

Math (per feature f, for a pre-activation x):

    h      = (grid_max - grid_min) / 5                     (5 uniform grid intervals)
    knots  t_m = grid_min + (m - 3)·h,  m = 0 … 11         (3 extended knots on each side)
    B_k    = the cubic B-spline on knots t_k … t_{k+4},  k = 0 … 7
    gate(x) = Σ_k c[f, k]·B_k(clamp(x, grid_min, grid_max)) + w_res[f]·(sigmoid(x) − 1/2)

Normalisation: the B_k are the standard (Cox–de Boor) B-splines, which form a partition of
unity on [grid_min, grid_max]: Σ_k B_k(x) = 1 there. So c[f, k] = 1/2 for all k with
w_res[f] = 0 gives a gate that is exactly 0.5 everywhere (inside the grid by partition of unity,
outside it because the pre-activation is clamped). The seed's coefficient 0.125 corresponds to
bases that sum to 4; ours sum to 1, hence 0.5.

Closed form. With the local coordinate u = (clamp(x) − grid_min)/h ∈ [0, 5], the interval
i = min(⌊u⌋, 4) and t = u − i ∈ [0, 1], only B_i … B_{i+3} are non-zero:

    B_i     = (1 − t)³ / 6
    B_{i+1} = (3t³ − 6t² + 4) / 6
    B_{i+2} = (−3t³ + 3t² + 3t + 1) / 6
    B_{i+3} = t³ / 6

so the gate needs four coefficients per element and no [B, F, 8] intermediate. It is evaluated
in the equivalent difference form

    Σ_j c_{i+j} B_{i+j} = c_i + Σ_{j=1..3} (c_{i+j} − c_{i+j−1})·T_j,   T_j = Σ_{m≥j} B_{i+m}
    T_1 = 1 − (1 − t)³/6,   T_2 = (−2t³ + 3t² + 3t + 1)/6,   T_3 = t³/6

which uses partition of unity analytically, so equal coefficients give exactly c (0.5 at init,
bit for bit in float32) instead of 0.5·(rounded sum of four weights).

Residual r(x) = sigmoid(x) − 1/2. Why this one: (i) with c = 1/2 and w_res = 1 the gate is
exactly sigmoid(x), the GLU gate M4 replaces, so the KAN gate strictly contains it; (ii) r is
not clamped, so pre-activations outside the grid — where the spline part is flat — still get a
gradient; (iii) r(0) = 0 and r is bounded, so the residual cannot blow the gate up; (iv)
w_res = 0 removes it, leaving the flat 0.5 gate at initialisation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

NUM_BASES = 8
NUM_INTERVALS = NUM_BASES - 3  # cubic: bases = intervals + degree

__all__ = [
    "NUM_BASES",
    "NUM_INTERVALS",
    "kan_gate_autodiff",
    "kan_gate_init",
    "kan_gate_reference",
    "spline_weights",
    "tail_weights",
]


def kan_gate_init(num_features: int) -> tuple[jax.Array, jax.Array]:
    """The flat-gate initialisation: coeffs = 0.5 ([F, 8] float32), w_res = 0 ([F] float32).

    With partition-of-unity bases (see the module docstring) this makes kan_gate(x) = 0.5 for
    every x, inside or outside the grid.
    """
    coeffs = jnp.full((num_features, NUM_BASES), 0.5, dtype=jnp.float32)
    w_res = jnp.zeros((num_features,), dtype=jnp.float32)
    return coeffs, w_res


def _clamp(x: jax.Array, lo: float, hi: float) -> jax.Array:
    """clamp with d/dx = 1 on the closed grid [lo, hi] (jnp.clip gives 1/2 at the ends)."""
    return jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))


def _local_coordinate(x: jax.Array, grid_min: float, grid_max: float):
    """(float interval index ⌊u⌋ capped at 4, t = u − that index) with
    u = (clamp(x) − grid_min)/h: the module docstring's local coordinate."""
    h = (grid_max - grid_min) / NUM_INTERVALS
    u = (_clamp(x, grid_min, grid_max) - grid_min) * (1.0 / h)
    fi = jnp.minimum(jnp.floor(u), NUM_INTERVALS - 1)
    return fi, u - fi


def spline_weights(
    x: jax.Array, grid_min: float, grid_max: float
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]:
    """Interval index, the four non-zero basis values and the in-grid indicator at x.

    Args:
      x: pre-activations, any shape.
      grid_min, grid_max: grid ends (python floats).

    Returns:
      (i, (w0, w1, w2, w3), inside): i int32 in [0, 4] (same shape as x) such that
      B_{i+j}(clamp(x)) = w_j; inside is x in the closed grid (where d clamp/dx = 1).
    """
    fi, t = _local_coordinate(x, grid_min, grid_max)
    s = 1.0 - t
    t2 = t * t
    t3 = t2 * t
    sixth = 1.0 / 6.0
    w0 = s * s * s * sixth
    w1 = (3.0 * t3 - 6.0 * t2 + 4.0) * sixth
    w2 = (-3.0 * t3 + 3.0 * t2 + 3.0 * t + 1.0) * sixth
    w3 = t3 * sixth
    inside = (x >= grid_min) & (x <= grid_max)
    return fi.astype(jnp.int32), (w0, w1, w2, w3), inside


def tail_weights(x: jax.Array, grid_min: float, grid_max: float) -> tuple[jax.Array, ...]:
    """(i, T_1, T_2, T_3): interval index and the basis tail sums of the difference form."""
    fi, t = _local_coordinate(x, grid_min, grid_max)
    s = 1.0 - t
    t2 = t * t
    t3 = t2 * t
    sixth = 1.0 / 6.0
    tail1 = 1.0 - s * s * s * sixth
    tail2 = (-2.0 * t3 + 3.0 * t2 + 3.0 * t + 1.0) * sixth
    tail3 = t3 * sixth
    return fi.astype(jnp.int32), tail1, tail2, tail3


def _pick(i: jax.Array, coeffs: jax.Array, j: int) -> jax.Array:
    """c[f, i + j] for every element, by a select chain over the 5 intervals ([B, F])."""
    out = jnp.broadcast_to(coeffs[:, j], i.shape)
    for m in range(1, NUM_INTERVALS):
        out = jnp.where(i == m, coeffs[:, m + j], out)
    return out


def _gate_expression(x, coeffs, w_res, grid_min, grid_max):
    """The forward expression of the module docstring (difference form) and what the
    closed-form backward reuses: ``(gate, (i, T_1, T_2, T_3, d_1, d_2, d_3, sigmoid(x)))``
    with ``d_j = c_{i+j} − c_{i+j−1}``."""
    i, tail1, tail2, tail3 = tail_weights(x, grid_min, grid_max)
    coeffs = coeffs.astype(x.dtype)
    c0, c1, c2, c3 = (_pick(i, coeffs, j) for j in range(4))
    d1, d2, d3 = c1 - c0, c2 - c1, c3 - c2
    spline = c0 + d1 * tail1 + d2 * tail2 + d3 * tail3
    sig = jax.nn.sigmoid(x)
    return spline + w_res.astype(x.dtype) * (sig - 0.5), (i, tail1, tail2, tail3, d1, d2, d3, sig)


def _check_shapes(x, coeffs, w_res):
    if coeffs.ndim != 2 or coeffs.shape[1] != NUM_BASES:
        raise ValueError(f"kan_gate: coeffs must be [F, {NUM_BASES}], got {coeffs.shape}")
    if x.shape[-1] != coeffs.shape[0] or w_res.shape != (coeffs.shape[0],):
        raise ValueError(
            f"kan_gate: x [..., F], coeffs [F, 8], w_res [F] disagree: "
            f"{x.shape}, {coeffs.shape}, {w_res.shape}"
        )


def kan_gate_autodiff(x, coeffs, w_res, *, grid_min: float = -3.0, grid_max: float = 3.0):
    """The same gate as :func:`kan_gate_reference`, differentiated by plain autodiff through
    the select chains (the check on the reference's closed-form backward)."""
    _check_shapes(x, coeffs, w_res)
    return _gate_expression(x, coeffs, w_res, grid_min, grid_max)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gate(x, coeffs, w_res, grid_min, grid_max):
    return _gate_expression(x, coeffs, w_res, grid_min, grid_max)[0]


def _gate_fwd(x, coeffs, w_res, grid_min, grid_max):
    out, saved = _gate_expression(x, coeffs, w_res, grid_min, grid_max)
    return out, (x, coeffs, w_res, saved)


def _gate_bwd(grid_min, grid_max, res, g):
    """Closed-form VJP. With t the local coordinate and h the interval width,

        ∂gate/∂x      = [x in grid]·(d_1·T_1' + d_2·T_2' + d_3·T_3')/h + w_res·σ'(x),
                        T_1' = (1 − t)²/2,  T_2' = 1/2 + t − t²,  T_3' = t²/2
        ∂gate/∂c[f,k] = B_k(clamp(x))  (non-zero for k = i … i+3: the weights
                        B_{i+j} = T_j − T_{j+1}, T_0 = 1, T_4 = 0)
        ∂gate/∂w_res  = σ(x) − 1/2

    The coefficient gradient sums ``g·B_k`` over the leading axes as one [..., F, 8] array
    (a select per basis): autodiff's transpose of the four select chains reduces 20 masked
    [..., F] arrays instead, ≈ 5× slower on a CPU (bench: 3 × 256 × 64, 0.70 → 0.15 ms)."""
    x, coeffs, w_res, (i, tail1, tail2, tail3, d1, d2, d3, sig) = res
    h = (grid_max - grid_min) / NUM_INTERVALS
    _, t = _local_coordinate(x, grid_min, grid_max)
    s = 1.0 - t
    slope = d1 * (0.5 * s * s) + d2 * (0.5 + t - t * t) + d3 * (0.5 * t * t)
    inside = (x >= grid_min) & (x <= grid_max)
    w = w_res.astype(x.dtype)
    dx = g * (jnp.where(inside, slope * (1.0 / h), 0.0) + w * (sig * (1.0 - sig)))
    lead = tuple(range(x.ndim - 1))
    dw = jnp.sum(g * (sig - 0.5), axis=lead)
    basis = (1.0 - tail1, tail1 - tail2, tail2 - tail3, tail3)  # B_{i+j}, j = 0 … 3
    k = jnp.arange(NUM_BASES, dtype=jnp.int32)
    gb = sum(
        jnp.where((i + j)[..., None] == k, (g * b)[..., None], 0.0) for j, b in enumerate(basis)
    )  # [..., F, 8]
    dc = jnp.sum(gb, axis=lead)
    return dx.astype(x.dtype), dc.astype(coeffs.dtype), dw.astype(w_res.dtype)


_gate.defvjp(_gate_fwd, _gate_bwd)


def kan_gate_reference(
    x: jax.Array,
    coeffs: jax.Array,
    w_res: jax.Array,
    *,
    grid_min: float = -3.0,
    grid_max: float = 3.0,
) -> jax.Array:
    """Pure-jnp KAN gate (see the module docstring for the math), differentiable through a
    closed-form VJP (``_gate_bwd``; checked against finite differences and against
    :func:`kan_gate_autodiff`).

    Args:
      x: pre-activations [B, F] (any leading shape [..., F] works).
      coeffs: spline coefficients [F, 8].
      w_res: residual weights [F].
      grid_min, grid_max: grid ends; x is clamped to them for the spline part.

    Returns:
      gate [..., F], dtype of x.
    """
    _check_shapes(x, coeffs, w_res)
    return _gate(x, coeffs, w_res, float(grid_min), float(grid_max))
