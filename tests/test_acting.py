"""A1–A3: Boltzmann sampling, IQN blend, position sizing."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.agent import acting
from jaxdqn.branches import Action
from jaxdqn.config import ActingConfig, ModelConfig
from jaxdqn.model.network import make_model


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


def test_a3_make_acting_decides_a_typed_action_per_environment():
    """The acting pipeline returns ``Decision(action=Action(choice, scale), selectivity,
    q_mean)``; A3 sizing scales by the taken direction's Var[Q], off gives scale 1."""
    mcfg = ModelConfig(bottleneck_dim=0, sh1=8, sh2=8, ah=4, vsn_hidden=4, num_atoms=11)
    model = make_model(mcfg, 5, kan_backend="reference")
    params = model.init(jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (6, 5))
    v_min, dz, readiness = jnp.float32(-1.0), jnp.float32(0.2), jnp.float32(0.3)
    key = jax.random.PRNGKey(2)
    on = acting.make_acting(ActingConfig(num_envs=6, steps=2), model)
    assert (on.num_envs, on.steps) == (6, 2)
    d = jax.jit(on.decide)(params, obs, v_min, dz, readiness, key)
    assert isinstance(d.action, Action)
    chex.assert_shape(d.action.choice, (6, 4))
    assert d.action.choice.dtype == jnp.int32
    assert np.all((np.asarray(d.action.choice) >= 0) & (np.asarray(d.action.choice) <= 2))
    chex.assert_shape([d.action.scale, d.selectivity], [(6,), (6,)])
    chex.assert_shape(d.q_mean, (6, 4, 3))
    out = model.apply(params, obs, v_min, dz)
    expect = jax.vmap(acting.position_scale)(out.q_var, d.action.choice[:, 0])
    np.testing.assert_allclose(d.action.scale, expect, rtol=1e-6)
    assert np.all(np.asarray(d.action.scale) < 1.0)
    off = acting.make_acting(ActingConfig(position_sizing=False), model)
    d_off = jax.jit(off.decide)(params, obs, v_min, dz, readiness, key)
    np.testing.assert_array_equal(d_off.action.scale, 1.0)
    np.testing.assert_array_equal(d_off.action.choice, d.action.choice)  # same key, same draw
    # the evaluation policy is the same pipeline for one observation
    choice, scale = on.eval_policy((params, v_min, dz, readiness), obs[0], 0, key)
    one = on.decide(params, obs[:1], v_min, dz, readiness, key)
    np.testing.assert_array_equal(choice, one.action.choice[0])
    np.testing.assert_allclose(scale, one.action.scale[0], rtol=1e-6)
