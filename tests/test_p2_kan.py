"""M4 / P2: KAN spline gate — reference against Cox–de Boor, flat init, Pallas kernel vs reference.

The Pallas kernel runs in interpret mode on CPU; set JAXDQN_KERNEL_BACKEND=pallas on a GPU to run
the same checks against the compiled Triton kernel.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import KanBlocks, fallbacks, kan_gate, kan_gate_init, kan_gate_reference
from pallas_kernels.kan import kan_gate_bwd_pallas, kan_gate_fwd_pallas
from pallas_kernels.kan_reference import kan_gate_autodiff

BACKEND = os.environ.get("JAXDQN_KERNEL_BACKEND", "interpret")
GRID = (-3.0, 3.0)


def _fresh_key() -> jax.Array:
    """A new key every run: agreement must hold on inputs nobody has tuned for."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return jax.random.key(seed)


def cox_de_boor(x: np.ndarray, grid_min: float, grid_max: float) -> np.ndarray:
    """All 8 cubic B-splines at x (float64, [..., 8]) by the Cox–de Boor recursion.

    Knots t_m = grid_min + (m − 3)·h, m = 0 … 11, h = (grid_max − grid_min)/5; x is clamped to
    the grid first (as the gate does).
    """
    h = (grid_max - grid_min) / 5
    knots = grid_min + (np.arange(12) - 3) * h
    x = np.clip(np.asarray(x, np.float64), grid_min, grid_max)[..., None]
    basis = ((knots[:-1] <= x) & (x < knots[1:])).astype(np.float64)  # degree 0: [..., 11]
    for p in range(1, 4):
        left = (x - knots[: -p - 1]) / (knots[p:-1] - knots[: -p - 1]) * basis[..., :-1]
        right = (knots[p + 1 :] - x) / (knots[p + 1 :] - knots[1:-p]) * basis[..., 1:]
        basis = left + right
    return basis  # [..., 8]


def _random_params(key, num_features):
    kc, kw = jax.random.split(key)
    coeffs = jax.random.normal(kc, (num_features, 8), jnp.float32)
    w_res = jax.random.normal(kw, (num_features,), jnp.float32)
    return coeffs, w_res


def test_m4_cox_de_boor_partition_of_unity():
    x = np.linspace(-3.0, 3.0, 601)
    np.testing.assert_allclose(cox_de_boor(x, *GRID).sum(-1), 1.0, atol=1e-14)


@pytest.mark.slow
def test_m4_reference_matches_cox_de_boor_float64():
    key = _fresh_key()
    kx, kp = jax.random.split(key)
    with jax.enable_x64(True):
        x = 4.0 * jax.random.normal(kx, (64, 7), jnp.float64)  # inside and outside the grid
        x = x.at[0, :3].set(jnp.array([-3.0, 3.0, 0.0]))  # both ends and an interior knot
        coeffs, w_res = (a.astype(jnp.float64) for a in _random_params(kp, 7))
        got = np.asarray(kan_gate_reference(x, coeffs, w_res))
        xn = np.asarray(x)
        want = np.einsum("bfk,fk->bf", cox_de_boor(xn, *GRID), np.asarray(coeffs))
        want += np.asarray(w_res) * (1.0 / (1.0 + np.exp(-xn)) - 0.5)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_m4_reference_other_grid():
    x = np.linspace(-2.0, 6.0, 97)[:, None]
    coeffs = np.arange(8, dtype=np.float32)[None] * 0.25
    got = kan_gate_reference(
        jnp.asarray(x, jnp.float32), jnp.asarray(coeffs), jnp.zeros(1), grid_min=-1.0, grid_max=5.0
    )
    want = cox_de_boor(x, -1.0, 5.0) @ coeffs[0]
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-6)


def test_m4_init_is_flat_half():
    coeffs, w_res = kan_gate_init(256)
    assert coeffs.shape == (256, 8) and w_res.shape == (256,)
    assert coeffs.dtype == jnp.float32 and w_res.dtype == jnp.float32
    assert coeffs.size + w_res.size == 9 * 256  # 9 parameters per gate neuron
    x = jnp.linspace(-5.0, 5.0, 1001)[:, None] * jnp.linspace(0.1, 1.0, 256)[None]
    gate = kan_gate_reference(x, coeffs, w_res)
    assert bool(jnp.all(gate == 0.5)), "KAN gate must be exactly 0.5 at init"


def test_m4_glu_special_case():
    """c = 1/2 and w_res = 1 reproduce sigmoid(x), the gate M4 replaces."""
    x = jnp.linspace(-8.0, 8.0, 321)[:, None]
    gate = kan_gate_reference(x, jnp.full((1, 8), 0.5), jnp.ones(1))
    np.testing.assert_allclose(np.asarray(gate), np.asarray(jax.nn.sigmoid(x)), atol=1e-7)


def _central_difference(f, args, direction, eps=1e-6):
    plus = [a + eps * d for a, d in zip(args, direction, strict=True)]
    minus = [a - eps * d for a, d in zip(args, direction, strict=True)]
    return (f(*plus) - f(*minus)) / (2 * eps)


@pytest.mark.slow
def test_m4_reference_gradient_matches_finite_differences_float64():
    key = _fresh_key()
    kx, kp, kd, kg = jax.random.split(key, 4)
    with jax.enable_x64(True):
        x = 4.0 * jax.random.normal(kx, (16, 5), jnp.float64)
        # stay away from the clamp's kinks at the grid ends, where the derivative jumps
        x = jnp.where(jnp.abs(jnp.abs(x) - 3.0) < 1e-3, x + 1e-2, x)
        params = tuple(a.astype(jnp.float64) for a in _random_params(kp, 5))
        cot = jax.random.normal(kg, x.shape, jnp.float64)
        loss = jax.jit(lambda x, c, w: jnp.sum(cot * kan_gate_reference(x, c, w)))
        args = (x, *params)
        grads = jax.grad(loss, argnums=(0, 1, 2))(*args)
        for d_key in jax.random.split(kd, 3):
            direction = [
                jax.random.normal(k, a.shape, jnp.float64)
                for k, a in zip(jax.random.split(d_key, 3), args, strict=True)
            ]
            want = _central_difference(loss, args, direction)
            got = sum(jnp.vdot(g, d) for g, d in zip(grads, direction, strict=True))
            np.testing.assert_allclose(float(got), float(want), rtol=1e-7, atol=1e-8)


@pytest.mark.slow
def test_m4_reference_closed_form_vjp_equals_autodiff_float64():
    """The reference's hand-written backward against autodiff through its own select chains,
    at random points, on the grid ends, on interior knots and outside the grid, with a
    leading batch shape and under vmap (how the model calls it)."""
    key = _fresh_key()
    kx, kp, kg = jax.random.split(key, 3)
    with jax.enable_x64(True):
        x = 3.0 * jax.random.normal(kx, (2, 9, 6), jnp.float64)
        special = jnp.array([-3.0, 3.0, -1.8, 0.6, -9.0, 9.0], jnp.float64)
        x = x.at[0, 0].set(special)
        coeffs, w_res = (a.astype(jnp.float64) for a in _random_params(kp, 6))
        cot = jax.random.normal(kg, x.shape, jnp.float64)

        def vjp(fn):
            return lambda x, c, w: jax.vjp(fn, x, c, w)[1](cot)

        got = jax.jit(vjp(kan_gate_reference))(x, coeffs, w_res)
        want = jax.jit(vjp(kan_gate_autodiff))(x, coeffs, w_res)
        for name, a, b in zip(("x", "coeffs", "w_res"), got, want, strict=True):
            np.testing.assert_allclose(
                np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-12, err_msg=name
            )
        batched = jax.vmap(
            lambda x, c, w: jax.grad(lambda c: jnp.sum(kan_gate_reference(x, c, w) ** 2))(c),
            in_axes=(0, None, None),
        )
        per_row = [jax.grad(lambda c, r=r: jnp.sum(kan_gate_autodiff(x[r], c, w_res) ** 2))(coeffs)
                   for r in range(2)]  # fmt: skip
        np.testing.assert_allclose(
            np.asarray(batched(x, coeffs, w_res)), np.stack(per_row), rtol=1e-12, atol=1e-12
        )


# ------------------------------------------------------------------------------------------
# P2: the Pallas kernels (interpret mode on CPU) against the reference.

# Small power-of-two tiles so that the test shapes (37 × 45) are ragged in both directions;
# the backward kernel gets 3 row programs of 2 row tiles each (last one partly empty).
BLOCKS = KanBlocks(16, 16, 4, 8, 16, 4, 9)
SHAPE = (37, 45)


def kernel_gate(x, coeffs, w_res, **kw):
    out = kan_gate(x, coeffs, w_res, backend=BACKEND, blocks=BLOCKS, **kw)
    if BACKEND == "pallas":
        failed = {k: v for k, v in fallbacks().items() if k[0] == "kan_gate"}
        assert not failed, f"the Pallas kernel fell back to the reference: {failed}"
    return out


def rel_err(got, want) -> float:
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert np.all(np.isfinite(got))
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _inputs(key, shape=SHAPE):
    kx, kp, kg = jax.random.split(key, 3)
    x = 2.5 * jax.random.normal(kx, shape, jnp.float32)  # ~25% outside the grid
    coeffs, w_res = _random_params(kp, shape[-1])
    cot = jax.random.normal(kg, shape, jnp.float32)
    return x, coeffs, w_res, cot


def _reference64(fn, *args):
    with jax.enable_x64(True):
        out = fn(*(jnp.asarray(np.asarray(a, np.float64)) for a in args))
        return jax.tree.map(np.asarray, out)


@pytest.mark.slow
def test_p2_forward_matches_float64_reference():
    x, coeffs, w_res, _ = _inputs(_fresh_key())
    got = kernel_gate(x, coeffs, w_res)
    assert got.shape == SHAPE and got.dtype == jnp.float32
    want = _reference64(kan_gate_reference, x, coeffs, w_res)
    assert rel_err(got, want) <= 1e-5


@pytest.mark.slow
def test_p2_gradients_match_float64_reference_autodiff():
    """The reference's closed-form VJP is itself checked against finite differences and against
    autodiff in the test_m4_... tests."""
    x, coeffs, w_res, cot = _inputs(_fresh_key())
    x = x.at[0, :4].set(jnp.array([-3.0, 3.0, -7.0, 7.0]))  # grid ends and outside

    def vjp(fn):
        return lambda x, c, w, g: jax.vjp(fn, x, c, w)[1](g)

    got = vjp(kernel_gate)(x, coeffs, w_res, cot)
    want = _reference64(vjp(kan_gate_reference), x, coeffs, w_res, cot)
    for name, g, w in zip(("x", "coeffs", "w_res"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == jnp.float32, name
        assert rel_err(g, w) <= 1e-5, name


@pytest.mark.slow
def test_p2_backward_is_deterministic_and_fully_written():
    x, coeffs, w_res, cot = _inputs(_fresh_key())
    interpret = BACKEND != "pallas"
    ct, w = coeffs.T, w_res
    poison = jnp.full(SHAPE, jnp.nan, jnp.float32)
    y = kan_gate_fwd_pallas(x, ct, w, blocks=BLOCKS, interpret=interpret, out=poison)
    assert bool(jnp.all(jnp.isfinite(y)))
    first = kan_gate_bwd_pallas(x, cot, ct, w, blocks=BLOCKS, interpret=interpret, out=poison)
    second = kan_gate_bwd_pallas(x, cot, ct, w, blocks=BLOCKS, interpret=interpret)
    for a, b in zip(first, second, strict=True):
        assert bool(jnp.all(jnp.isfinite(a)))
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit for bit


@pytest.mark.slow
def test_p2_init_flat_half_and_other_grid_with_leading_shape():
    coeffs, w_res = kan_gate_init(SHAPE[1])
    x = jnp.linspace(-6.0, 6.0, SHAPE[0] * SHAPE[1]).reshape(SHAPE)
    assert bool(jnp.all(kernel_gate(x, coeffs, w_res) == 0.5))
    x, coeffs, w_res, _ = _inputs(_fresh_key(), (2, 3, 45))
    got = kernel_gate(x, coeffs, w_res, grid_min=-1.0, grid_max=2.0)
    assert got.shape == (2, 3, 45)
    want = _reference64(
        lambda x, c, w: kan_gate_reference(x, c, w, grid_min=-1.0, grid_max=2.0), x, coeffs, w_res
    )
    assert rel_err(got, want) <= 1e-5


def test_p2_backends_and_errors():
    x, coeffs, w_res, _ = _inputs(_fresh_key(), (5, 7))
    auto = kan_gate(x, coeffs, w_res, backend="auto")
    np.testing.assert_allclose(auto, kan_gate_reference(x, coeffs, w_res), atol=1e-6)
    with pytest.raises(ValueError, match="backend"):
        kan_gate(x, coeffs, w_res, backend="triton")
    with pytest.raises(ValueError, match="disagree"):
        kan_gate(x, coeffs[:-1], w_res, backend=BACKEND)
    with pytest.raises(ValueError, match="power"):
        KanBlocks(fwd_block_b=24)
