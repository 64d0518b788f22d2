"""A1–A3: Boltzmann sampling, IQN blend, position sizing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent import acting


def test_a1_temperature_is_spread_with_floor():
    q = jnp.array([[0.0, 1.0, 3.0], [0.2, 0.2, 0.2], [0.0, 0.004, 0.001], [-1.0, 1.0, 0.0]])
    np.testing.assert_allclose(acting.boltzmann_temperature(q), [3.0, 0.01, 0.01, 2.0])


def test_a1_probs_have_constant_e_ratio_between_extremes():
    for scale in (0.05, 1.0, 40.0):
        q = jnp.array([[0.0, 0.5, 1.0]]) * scale
        p = acting.boltzmann_probs(q)
        np.testing.assert_allclose(p[0, 2] / p[0, 0], np.e, rtol=1e-5)


def test_a1_sampling_follows_softmax_not_argmax():
    q = jnp.tile(jnp.array([[0.0, 0.5, 1.0]]), (4, 1))
    keys = jax.random.split(jax.random.PRNGKey(0), 20000)
    acts = jax.vmap(acting.boltzmann_sample, in_axes=(0, None))(keys, q)
    chex.assert_shape(acts, (20000, 4))
    assert acts.dtype == jnp.int32
    freq = np.bincount(np.asarray(acts[:, 0]), minlength=3) / 20000
    expected = np.exp([0.0, 0.5, 1.0]) / np.exp([0.0, 0.5, 1.0]).sum()  # τ = 1
    np.testing.assert_allclose(freq, expected, atol=0.015)
    assert freq[0] > 0.15  # argmax would never pick action 0


def test_a1_fixed_key_is_deterministic():
    q = jax.random.normal(jax.random.PRNGKey(3), (4, 3))
    k = jax.random.PRNGKey(7)
    np.testing.assert_array_equal(acting.boltzmann_sample(k, q), acting.boltzmann_sample(k, q))


@pytest.mark.parametrize("r", [0.0, 0.3, 1.0])
def test_a2_blend_endpoints(r):
    q10 = jnp.full((4, 3), -1.0)
    q90 = jnp.full((4, 3), 2.0)
    out = acting.iqn_blend(q10, q90, jnp.float32(r))
    np.testing.assert_allclose(out, 2.0 + r * (-3.0), rtol=1e-6)


def test_a2_readiness_is_clipped():
    q10, q90 = jnp.zeros((4, 3)), jnp.ones((4, 3))
    np.testing.assert_allclose(acting.iqn_blend(q10, q90, jnp.float32(2.0)), q10)


def test_a3_scale_uses_the_taken_direction_variance():
    var = jnp.zeros((4, 3)).at[0].set(jnp.array([0.25, 4.0, 9.0])).at[1].set(100.0)
    np.testing.assert_allclose(acting.position_scale(var, 0), 1 / 1.5, rtol=1e-6)
    np.testing.assert_allclose(acting.position_scale(var, 1), 1 / 3.0, rtol=1e-6)
    np.testing.assert_allclose(acting.position_scale(var, 2), 1 / 4.0, rtol=1e-6)
    # a tiny negative variance from round-off must not produce NaN
    assert np.isfinite(acting.position_scale(var.at[0, 0].set(-1e-9), 0))
