"""L1, L3, L4, L6 loss pieces against hand computations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxdqn.agent import losses as L
from jaxdqn.agent.targets import Target
from jaxdqn.config import LossConfig, ModelConfig
from jaxdqn.model.network import make_model


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


# ---------------------------------------------------------------------------------------------
# The composed loss of one batch (losses.make_loss, formerly learner.loss_fn)
# ---------------------------------------------------------------------------------------------

_OBS_DIM, _B, _N = 6, 5, 11
_MODEL_CFG = ModelConfig(
    bottleneck_dim=0, sh1=8, sh2=8, ah=4, vsn_hidden=4, num_atoms=_N, denoise_hidden=4,
    xlstm_hidden=4,
)  # fmt: skip


def _loss_inputs(model):
    keys = jax.random.split(jax.random.PRNGKey(7), 6)
    params = model.init(keys[0])
    obs = jax.random.normal(keys[1], (_B, _OBS_DIM))
    actions = jax.random.randint(keys[2], (_B, 4), 0, 3)
    weights = jax.random.uniform(keys[3], (_B,), minval=0.5, maxval=1.0)
    probs = jax.nn.softmax(jax.random.normal(keys[4], (_B, 4, _N)))
    target = Target(probs=probs, td=jax.random.normal(keys[5], (_B, 4)), next_actions=actions)
    q_target_s = jnp.ones((_B, 4, 3))
    v_min, dz = jnp.float32(-1.0), jnp.float32(0.2)
    liquid_mod = jnp.array([1.0, 2.0, 0.5, 1.0])
    xlstm_state = model.xlstm.init_state()
    last_stats = jnp.ones((4, 3))
    return (params, obs, actions, weights, target, q_target_s, v_min, dz, jnp.float32(0.02),
            liquid_mod, xlstm_state, last_stats)  # fmt: skip


def test_l1_make_loss_total_is_the_sum_of_its_hand_computed_parts():
    model = make_model(_MODEL_CFG, _OBS_DIM, kan_backend="reference")
    loss = L.make_loss(LossConfig(), _MODEL_CFG, model)
    assert loss.needs_target_q_s  # aux training with the denoiser regresses on Q_target(s)
    args = _loss_inputs(model)
    params, obs, actions, weights, target, _, v_min, dz, coef, liquid_mod = args[:10]
    total, parts = jax.jit(loss.loss)(*args)
    out = model.apply(params, obs, v_min, dz)
    # L1: IS-weighted mean over the batch of the per-branch cross-entropies' sum
    ce = jax.vmap(L.c51_cross_entropy)(out.logits, actions, target.probs).sum(-1)
    np.testing.assert_allclose(parts.c51, np.mean(np.asarray(weights * ce)), rtol=1e-5)
    np.testing.assert_allclose(parts.per_sample, ce, rtol=1e-5)
    # L3: branch scale = weight × liquid_mod × Δz / B
    z = v_min + dz * jnp.arange(_N)
    scale = jnp.asarray(LossConfig().spread_branch_scale) * liquid_mod * dz / _B
    spread = sum(L.spread_surrogate(out.logits[i], actions[i], z, scale) for i in range(_B))
    np.testing.assert_allclose(parts.spread, spread, rtol=1e-5, atol=1e-7)
    # L4: −coef × mean entropy
    np.testing.assert_allclose(parts.entropy, -coef * jnp.mean(L.entropy(out.logits)), rtol=1e-5)
    assert float(parts.denoise) > 0 and float(parts.select) > 0 and float(parts.coord) > 0
    terms = (parts.c51, parts.spread, parts.entropy, parts.denoise, parts.coord, parts.select,
             parts.xlstm)  # fmt: skip
    np.testing.assert_allclose(total, sum(terms), rtol=1e-6)
    np.testing.assert_allclose(parts.total, total)
    np.testing.assert_allclose(parts.q_mean, out.q_mean, rtol=1e-5, atol=1e-6)


def test_l1_make_loss_with_every_extra_off_is_the_c51_loss():
    model = make_model(_MODEL_CFG, _OBS_DIM, kan_backend="reference")
    cfg = LossConfig(spread=False, entropy=False, aux_training=False)
    loss = L.make_loss(cfg, _MODEL_CFG, model)
    assert not loss.needs_target_q_s
    args = _loss_inputs(model)
    total, parts = jax.jit(loss.loss)(*args)
    np.testing.assert_allclose(total, parts.c51)
    for name in ("spread", "entropy", "denoise", "coord", "select", "xlstm"):
        assert float(getattr(parts, name)) == 0.0, name
    # the xLSTM state passes through untouched when L6 is off
    for a, b in zip(jax.tree.leaves(parts.xlstm_state), jax.tree.leaves(args[10]), strict=True):
        np.testing.assert_array_equal(a, b)
