"""A1–A3: Boltzmann sampling (κ, floor in reward units), IQN blend, position sizing, and the
evaluation policy (greedy on E[Q] after M8–M11, or the seed's Boltzmann with a fixed key)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn import config as C
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


@pytest.mark.parametrize("kappa", [1.0, 0.5, 0.25])
def test_a1_kappa_sharpens_the_best_to_worst_ratio_to_e_to_the_one_over_kappa(kappa):
    q0 = jnp.array([[0.0, 0.5, 1.0], [2.0, -1.0, 0.5], [0.3, 0.3, 0.9]])
    for scale in (0.05, 1.0, 40.0):
        q = q0 * scale
        np.testing.assert_allclose(
            acting.boltzmann_temperature(q, kappa), kappa * (q.max(-1) - q.min(-1)), rtol=1e-6
        )
        p = np.asarray(acting.boltzmann_probs(q, kappa))
        qn = np.asarray(q)
        rows = np.arange(3)
        best, worst = p[rows, qn.argmax(-1)], p[rows, qn.argmin(-1)]
        np.testing.assert_allclose(best / worst, np.exp(1.0 / kappa), rtol=1e-4)


def test_a1_sampling_at_kappa_follows_the_sharpened_softmax():
    q = jnp.tile(jnp.array([[0.0, 0.5, 1.0]]), (4, 1))  # τ = 0.25 · 1
    keys = jax.random.split(jax.random.PRNGKey(1), 20000)
    acts = jax.vmap(acting.boltzmann_sample, in_axes=(0, None, None))(keys, q, 0.25)
    freq = np.bincount(np.asarray(acts[:, 0]), minlength=3) / 20000
    expected = np.exp([0.0, 2.0, 4.0]) / np.exp([0.0, 2.0, 4.0]).sum()
    np.testing.assert_allclose(freq, expected, atol=0.01)


def test_a1_floor_is_in_q_units_so_exploration_is_invariant_to_the_reward_unit():
    # gaps 0.004 and 0.02: below and above the floor 0.01 of reward unit 1
    q = jnp.array([[0.0, 0.004, 0.001], [0.0, 0.01, 0.02]])
    np.testing.assert_allclose(acting.boltzmann_temperature(q, 1.0, 0.01), [0.01, 0.02])
    np.testing.assert_allclose(acting.boltzmann_temperature(q, 0.5, 0.01), [0.005, 0.01])
    np.testing.assert_allclose(acting.boltzmann_temperature(q, 1.0, 0.001), [0.004, 0.02])
    # Q expressed in a reward unit u (Q·u) with the floor 0.01·u: the same probabilities
    base = acting.boltzmann_probs(q, 1.0, 0.01)
    for u in (1e-3, 0.37, 250.0):
        np.testing.assert_allclose(acting.boltzmann_probs(q * u, 1.0, 0.01 * u), base, rtol=1e-5)
    # ... whereas an absolute floor 0.01 makes small-unit Q uniform (the seed's failure)
    np.testing.assert_allclose(acting.boltzmann_probs(q * 1e-3, 1.0, 0.01), 1 / 3, atol=1e-3)


def test_a3_scale_is_in_reward_units():
    var = jnp.zeros((4, 3)).at[0].set(jnp.array([0.25, 4.0, 9.0]))
    for u in (1e-3, 2.0, 100.0):
        for d in range(3):
            np.testing.assert_allclose(
                acting.position_scale(var * u**2, d, u), acting.position_scale(var, d), rtol=1e-5
            )
    np.testing.assert_allclose(acting.position_scale(var, 1, 4.0), 1 / 1.5, rtol=1e-6)


def test_eval_greedy_actions_are_argmax_lowest_index_on_ties():
    q = jnp.array([[[0.0, 2.0, 1.0], [3.0, 3.0, 1.0], [0.0, 0.0, 0.0], [-1.0, -2.0, -0.5]]])
    out = acting.greedy_actions(q)
    assert out.dtype == jnp.int32
    np.testing.assert_array_equal(out, [[1, 0, 0, 2]])


# ---------------------------------------------------------------------------------------------
# The pipeline on a real (small) model: training decide and the evaluation policies
# ---------------------------------------------------------------------------------------------

_E, _D = 32, 5
KEY = jax.random.PRNGKey(11)


@pytest.fixture(scope="module")
def small():
    mcfg = ModelConfig(bottleneck_dim=0, sh1=8, sh2=8, ah=4, vsn_hidden=4, num_atoms=11)
    model = make_model(mcfg, _D, kan_backend="reference")
    params = model.init(jax.random.PRNGKey(0))
    obs = jax.random.normal(jax.random.PRNGKey(1), (_E, _D))
    return model, params, obs


def _values(model, params, obs, v_min, dz, readiness=None):
    """Network output and the coordinated (M8–M11) values, on the A2 blend when ``readiness``
    is given, on E[Q] otherwise."""
    out = model.apply(params, obs, v_min, dz)
    values = out.q_mean
    if readiness is not None:
        values = acting.iqn_blend(out.quantiles[..., 0], out.quantiles[..., 2], readiness)
    return out, model.coordinate(params, values).q


def _hand_boltzmann(values, key, kappa, floor):
    """A1 by hand: one key per environment, softmax(Q/τ), τ = κ·max(Q_max − Q_min, floor)."""
    keys = jax.random.split(key, values.shape[0])
    rows = []
    for e in range(values.shape[0]):
        v = values[e]
        tau = kappa * jnp.maximum(v.max(-1) - v.min(-1), floor)
        rows.append(jax.random.categorical(keys[e], v / tau[:, None], axis=-1))
    return np.stack([np.asarray(r) for r in rows])


@pytest.mark.slow
def test_a3_make_acting_decides_a_typed_action_per_environment(small):
    """The acting pipeline returns ``Decision(action=Action(choice, scale), selectivity,
    q_mean)``; A3 sizing scales by the taken direction's Var[Q], off gives scale 1."""
    model, params, obs = small
    obs = obs[:6]
    v_min, dz, readiness = jnp.float32(-1.0), jnp.float32(0.2), jnp.float32(0.3)
    kappa, key = jnp.float32(1.0), jax.random.PRNGKey(2)
    on = acting.make_acting(ActingConfig(num_envs=6, steps=2), model)
    assert (on.num_envs, on.steps, on.kappa_start) == (6, 2, ActingConfig().kappa_start)
    d = jax.jit(on.decide)(params, obs, v_min, dz, readiness, kappa, key)
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
    d_off = jax.jit(off.decide)(params, obs, v_min, dz, readiness, kappa, key)
    np.testing.assert_array_equal(d_off.action.scale, 1.0)
    np.testing.assert_array_equal(d_off.action.choice, d.action.choice)  # same key, same draw
    # the boltzmann evaluation policy is the same pipeline (κ = 1) for one observation
    seed = acting.make_acting(ActingConfig(), model, eval_policy="boltzmann")
    choice, scale = seed.eval_policy((params, v_min, dz, readiness), obs[0], 0, key)
    one = on.decide(params, obs[:1], v_min, dz, readiness, kappa, key)
    np.testing.assert_array_equal(choice, one.action.choice[0])
    np.testing.assert_allclose(scale, one.action.scale[0], rtol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(("tau_floor", "unit"), [(0.01, 1.0), (0.01, 1e-3), (0.05, 0.1)])
def test_a1_training_decide_samples_at_kappa_with_the_floor_in_reward_units(small, tau_floor, unit):
    """decide = network → A2 blend → M8–M11 → A1 at κ with floor ``tau_floor · unit`` → A3 with
    the unit; checked against the pipeline by hand on a support narrow enough (±0.01, Q-gaps
    ≈ 1e-4) that the floor binds everywhere at unit 1 and mostly not at unit 1e-3."""
    model, params, obs = small
    v_min, dz, readiness = jnp.float32(-0.01), jnp.float32(0.002), jnp.float32(0.4)
    key = jax.random.PRNGKey(5)
    out, values = _values(model, params, obs, v_min, dz, readiness)
    gaps = np.asarray(values.max(-1) - values.min(-1))
    assert gaps.max() < 0.005 and (gaps > 1e-5).mean() > 0.8  # the floor matters here
    act = acting.make_acting(ActingConfig(tau_floor=tau_floor), model, reward_unit=unit)
    decide = jax.jit(act.decide)
    for kappa in (1.0, 0.25):
        d = decide(params, obs, v_min, dz, readiness, jnp.float32(kappa), key)
        expect = _hand_boltzmann(values, key, kappa, tau_floor * unit)
        np.testing.assert_array_equal(d.action.choice, expect)
        scale = jax.vmap(lambda v, a: acting.position_scale(v, a, unit))(out.q_var, expect[:, 0])
        np.testing.assert_allclose(d.action.scale, scale, rtol=1e-6)
    # the floor is not the absolute 0.01 when the unit is not 1: a different draw
    if unit != 1.0:
        d = decide(params, obs, v_min, dz, readiness, jnp.float32(1.0), key)
        wrong = _hand_boltzmann(values, key, 1.0, tau_floor)
        assert not np.array_equal(np.asarray(d.action.choice), wrong)


@pytest.mark.slow
def test_eval_greedy_is_argmax_of_coordinated_expected_q(small):
    """The default evaluation policy: argmax of E[Q] after M8–M11 (no A2 blend, no sampling)
    in every branch, A3 sizing kept — against model.apply + model.coordinate by hand."""
    model, params, obs = small
    v_min, dz = jnp.float32(-1.0), jnp.float32(0.2)
    out, q = _values(model, params, obs, v_min, dz)
    assert not np.allclose(q, out.q_mean)  # coordination does change the values
    expect = np.argmax(np.asarray(q), axis=-1)
    for unit in (1.0, 0.5):
        act = acting.make_acting(ActingConfig(), model, reward_unit=unit)
        policy = jax.jit(act.eval_policy)
        for readiness in (0.0, 1.0):  # no A2 blend: readiness does not matter
            for e in range(_E):
                choice, scale = policy((params, v_min, dz, jnp.float32(readiness)), obs[e], 0, KEY)
                np.testing.assert_array_equal(choice, expect[e])
                want = acting.position_scale(out.q_var[e], expect[e, 0], unit)
                np.testing.assert_allclose(scale, want, rtol=1e-6)
    # the same through decide(greedy=True) on the whole batch
    d = acting.decide(
        model, params, obs, v_min, dz, jnp.float32(0.3), jnp.float32(1.0), KEY, greedy=True
    )
    np.testing.assert_array_equal(d.action.choice, expect)


@pytest.mark.slow
def test_eval_greedy_ignores_the_key_and_kappa(small):
    model, params, obs = small
    v_min, dz, r = jnp.float32(-1.0), jnp.float32(0.2), jnp.float32(0.5)
    run = jax.jit(
        lambda kappa, k, greedy: acting.decide(
            model, params, obs, v_min, dz, r, kappa, k, greedy=greedy
        ),
        static_argnums=2,
    )
    first = run(jnp.float32(1.0), jax.random.PRNGKey(0), True)
    sampled = []
    for i, kappa in enumerate((1.0, 0.25, 3.0)):
        k = jax.random.PRNGKey(100 + i)
        d = run(jnp.float32(kappa), k, True)
        np.testing.assert_array_equal(d.action.choice, first.action.choice)
        np.testing.assert_array_equal(d.action.scale, first.action.scale)
        sampled.append(np.asarray(run(jnp.float32(kappa), k, False).action.choice))
    # the Boltzmann pipeline on the same inputs does depend on the key
    assert not all(np.array_equal(s, sampled[0]) for s in sampled[1:])


@pytest.mark.slow
def test_eval_boltzmann_reproduces_the_seed_sampling_with_a_fixed_key(small):
    """``eval.policy=boltzmann``: the seed system's evaluation — A2 blend, M8–M11, A1 at κ = 1
    with the absolute floor 0.01 (reward unit 1), sampled with the walk's fixed key."""
    model, params, obs = small
    v_min, dz, readiness = jnp.float32(-1.0), jnp.float32(0.2), jnp.float32(0.3)
    out, values = _values(model, params, obs, v_min, dz, readiness)
    for policy in (
        acting.make_acting(ActingConfig(), model, eval_policy="boltzmann").eval_policy,
        acting.make_eval_policy(model, policy="boltzmann"),
    ):
        policy = jax.jit(policy)
        for e in range(8):
            k = jax.random.fold_in(KEY, e)
            choice, scale = policy((params, v_min, dz, readiness), obs[e], 0, k)
            expect = _hand_boltzmann(values[e : e + 1], k, 1.0, 0.01)[0]
            np.testing.assert_array_equal(choice, expect)
            want = acting.position_scale(out.q_var[e], expect[0])
            np.testing.assert_allclose(scale, want, rtol=1e-6)
            again, _ = policy((params, v_min, dz, readiness), obs[e], 0, k)
            np.testing.assert_array_equal(again, choice)  # fixed key: deterministic


def test_eval_policy_choice_is_validated(small):
    model = small[0]
    with pytest.raises(ValueError, match="greedy or boltzmann"):
        acting.make_eval_policy(model, policy="argmax")
    with pytest.raises(ValueError, match="greedy or boltzmann"):
        acting.make_acting(ActingConfig(), model, eval_policy="softmax")
    assert C.Config().eval.policy == "greedy"
    assert C.load(None, ["eval.policy=boltzmann"]).eval.policy == "boltzmann"
    with pytest.raises(C.ConfigError, match=r"eval.policy: 'argmax' is not one of"):
        C.load(None, ["eval.policy=argmax"])
