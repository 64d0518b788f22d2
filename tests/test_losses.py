"""L1, L3, L4, L6 loss pieces against hand computations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdqn.agent import losses as L


def test_l1_cross_entropy_matches_hand_computation():
    logits = jax.random.normal(jax.random.PRNGKey(0), (4, 3, 5))
    actions = jnp.array([0, 2, 1, 1])
    target = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (4, 5)))
    out = L.c51_cross_entropy(logits, actions, target)
    lp = np.asarray(jax.nn.log_softmax(logits))
    expected = [-(np.asarray(target[b]) * lp[b, int(actions[b])]).sum() for b in range(4)]
    np.testing.assert_allclose(out, expected, rtol=1e-5)


def test_l1_loss_decreases_when_overfitting_a_fixed_batch():
    key = jax.random.PRNGKey(2)
    logits = jax.random.normal(key, (8, 4, 3, 11)) * 0.1
    actions = jax.random.randint(jax.random.PRNGKey(3), (8, 4), 0, 3)
    target = jax.nn.softmax(3 * jax.random.normal(jax.random.PRNGKey(4), (8, 4, 11)))
    loss_fn = lambda lg: jax.vmap(L.c51_cross_entropy)(lg, actions, target).sum(-1).mean()
    opt = optax.adam(0.1)
    st = opt.init(logits)
    first = loss_fn(logits)
    for _ in range(100):
        g = jax.grad(loss_fn)(logits)
        upd, st = opt.update(g, st)
        logits = optax.apply_updates(logits, upd)
    last = loss_fn(logits)
    entropy_floor = float(-(target * jnp.log(target)).sum(-1).sum(-1).mean())
    assert last < first
    np.testing.assert_allclose(last, entropy_floor, rtol=2e-2)  # CE → H(target)


def test_l3_challenger_is_the_better_adjacent_action():
    q = jnp.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [3.0, 1.0, 2.0], [0.0, 1.0, 2.0]])
    np.testing.assert_array_equal(L.challenger(jnp.array([0, 1, 1, 2]), q), [1, 2, 0, 1])
    c = L.spread_coefficients(jnp.array([0, 1, 1, 2]), q)
    np.testing.assert_allclose(c, [[1, 0.5, -1], [-1, 1, 0.5], [0.5, 1, -1], [-1, 0.5, 1]])


def test_l3_surrogate_gradient_equals_hand_formula():
    n = 7
    logits = jax.random.normal(jax.random.PRNGKey(5), (4, 3, n))
    z = jnp.linspace(-1.0, 2.0, n)
    actions = jnp.array([2, 0, 1, 1])
    scale = jnp.array([1.0, 0.5, 0.25, 0.125]) * 0.3
    g = jax.grad(L.spread_surrogate)(logits, actions, z, scale)
    p = np.asarray(jax.nn.softmax(logits))
    q = (p * np.asarray(z)).sum(-1)
    coef = np.asarray(L.spread_coefficients(actions, jnp.asarray(q))) * np.asarray(scale)[:, None]
    expected = -coef[..., None] * p * (np.asarray(z) - q[..., None])
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-7)


def test_l3_descent_raises_taken_and_lowers_others():
    logits = jnp.zeros((4, 3, 9))
    z = jnp.linspace(-1.0, 1.0, 9)
    actions = jnp.array([0, 0, 0, 0])
    g = jax.grad(L.spread_surrogate)(logits, actions, z, jnp.ones(4))
    new = logits - 1.0 * g
    q = (jax.nn.softmax(new) * z).sum(-1)
    assert bool(jnp.all(q[:, 0] > 0)) and bool(jnp.all(q[:, 1] > 0)) and bool(jnp.all(q[:, 2] < 0))
    assert bool(jnp.all(q[:, 0] > q[:, 1]))  # challenger pushed at half strength


def test_l4_entropy_ramp():
    np.testing.assert_allclose(L.entropy_coefficient(0.01, 0.8), 0.01)
    np.testing.assert_allclose(L.entropy_coefficient(0.01, 0.5), 0.01)
    np.testing.assert_allclose(L.entropy_coefficient(0.01, 0.25), 0.015)
    np.testing.assert_allclose(L.entropy_coefficient(0.01, 0.0), 0.02)


def test_l4_atom_utilisation_bounds():
    n = 51
    np.testing.assert_allclose(L.atom_utilisation(jnp.full((2, n), 1.0 / n)), 1.0, rtol=1e-5)
    point = jnp.zeros((1, n)).at[0, 3].set(1.0)
    np.testing.assert_allclose(L.atom_utilisation(point), 1.0 / n, rtol=1e-4)
    np.testing.assert_allclose(L.entropy(jnp.zeros((n,))), np.log(n), rtol=1e-6)


def test_l6_selectivity_target_and_bce():
    t = L.selectivity_target(jnp.array([1.0, 2.0, 3.0, 10.0]))
    np.testing.assert_allclose(t, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(L.binary_cross_entropy(jnp.float32(0.5), 0.3), np.log(2), rtol=1e-6)
    np.testing.assert_allclose(L.huber(jnp.array([0.5, -3.0])), [0.125, 2.5])
