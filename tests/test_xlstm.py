"""M13: the mLSTM-style xLSTM context over per-branch batch statistics."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdqn.config import ModelConfig
from jaxdqn.model import xlstm as X

CFG = ModelConfig(xlstm_hidden=6)


def _np(x):
    return np.asarray(x, np.float64)


def _perturb(tree, seed, scale=0.5):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: x + jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype), tree
    )


def np_mlstm(params, state, x):
    """The stabilised mLSTM step of the module docstring, in float64 numpy."""

    def dense(name, v):
        return v @ _np(params[name]["kernel"]) + _np(params[name]["bias"])

    s = np.sign(x) * np.log1p(np.abs(x))
    d = params["query"]["kernel"].shape[1]
    q, k, v = dense("query", s), dense("key", s) / np.sqrt(d), dense("value", x)
    i_pre, f_pre = dense("input_gate", s)[0], dense("forget_gate", s)[0]
    o = 1 / (1 + np.exp(-dense("output_gate", s)))
    log_f = -np.log1p(np.exp(-f_pre))
    c, n, m_prev = state
    m = max(log_f + m_prev, i_pre)
    ig, fg = np.exp(i_pre - m), np.exp(log_f + m_prev - m)
    c = fg * c + ig * np.outer(v, k)
    n = fg * n + ig * k
    h = o * (c @ q) / max(abs(n @ q), np.exp(-m), 1e-6)
    return (c, n, m), h


@pytest.mark.slow
class XLSTMTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_m13_step_matches_numpy_mlstm(self):
        cell = X.make_xlstm(CFG)
        params = _perturb(cell.init(jax.random.PRNGKey(0)), 1)
        state = cell.init_state()
        ref_state = (np.zeros((6, 6)), np.zeros(6), 0.0)
        xs = np.random.default_rng(2).normal(size=(5, 4, 3)) * np.array([1.0, 0.2, 0.5])
        step = self.variant(cell.step)
        for x in xs:
            state, ctx = step(params, state, jnp.asarray(x, jnp.float32))
            ref_state, ref_ctx = np_mlstm(params, ref_state, x.reshape(12))
            np.testing.assert_allclose(ctx, ref_ctx, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state.c, ref_state[0], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(state.m, ref_state[2], rtol=1e-5, atol=1e-6)
        chex.assert_shape(ctx, (6,))
        assert np.abs(np.asarray(ctx)).max() > 1e-3


def test_m13_state_finite_over_1000_steps_of_random_input():
    cell = X.make_xlstm(CFG)
    params = _perturb(cell.init(jax.random.PRNGKey(3)), 4, 0.3)
    # Heavy-tailed inputs over several orders of magnitude (Q statistics have no fixed scale).
    key_n, key_s = jax.random.split(jax.random.PRNGKey(5))
    scale = 10.0 ** jax.random.uniform(key_s, (1000, 1, 1), minval=-3, maxval=3)
    xs = jax.random.cauchy(key_n, (1000, 4, 3)) * scale

    def body(state, x):
        state, ctx = cell.step(params, state, x)
        return state, (ctx, state.m)

    state, (ctxs, ms) = jax.jit(lambda s: jax.lax.scan(body, s, xs))(cell.init_state())
    chex.assert_tree_all_finite((state, ctxs, ms))
    assert np.abs(np.asarray(ctxs)).max() > 0
    assert np.std(np.asarray(ctxs)[-100:]) > 0  # still responding to its input at the end


def test_m13_batch_statistics_match_numpy():
    q = np.random.default_rng(6).normal(size=(9, 4, 3)).astype(np.float32)
    stats = np.asarray(X.batch_statistics(jnp.asarray(q)))
    chex.assert_shape(stats, (4, 3))
    qd = _np(q)
    np.testing.assert_allclose(stats[:, 0], qd.mean(axis=(0, 2)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats[:, 1], (qd.max(2) - qd.min(2)).mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        stats[:, 2], qd.transpose(1, 0, 2).reshape(4, -1).std(1), rtol=1e-5, atol=1e-6
    )


def test_m13_prediction_loss_trains_context_zero_through_this_step_only():
    cell = X.make_xlstm(CFG)
    params = cell.init(jax.random.PRNGKey(7))
    stats = jnp.asarray(np.random.default_rng(8).normal(size=(4, 3)), jnp.float32)
    state, _ = cell.step(params, cell.init_state(), stats)  # a non-empty memory
    target = jnp.float32(0.8)
    grad_fn = jax.jit(jax.grad(cell.prediction_loss, argnums=(0, 1), has_aux=True))
    (g_params, g_state), _ = grad_fn(params, state, stats, target)
    chex.assert_tree_all_finite(g_params)
    for leaf in jax.tree_util.tree_leaves(g_state):
        np.testing.assert_array_equal(leaf, 0.0)  # the carried memory is a constant
    assert np.abs(np.asarray(g_params["output_gate"]["kernel"])).max() > 0
    assert np.abs(np.asarray(g_params["query"]["kernel"])).max() > 0
    # SGD on the loss moves context[0] toward the target.
    loss = lambda p: cell.prediction_loss(p, state, stats, target)[0]
    first = float(loss(params))
    step = jax.jit(
        lambda p: jax.tree_util.tree_map(lambda a, g: a - 0.05 * g, p, jax.grad(loss)(p))
    )
    for _ in range(100):
        params = step(params)
    assert float(loss(params)) < 0.1 * first


def test_m13_off_gives_zero_context_and_no_parameters():
    cell = X.make_xlstm(dataclasses.replace(CFG, xlstm=False))
    assert cell.init(jax.random.PRNGKey(0)) == {}
    state = cell.init_state()
    new, ctx = cell.step({}, state, jnp.ones((4, 3)))
    np.testing.assert_array_equal(ctx, 0.0)
    chex.assert_trees_all_equal(new, state)


@pytest.mark.slow
def test_m13_vmaps_over_a_seed_axis():
    cell = X.make_xlstm(CFG)
    keys = jax.random.split(jax.random.PRNGKey(9), 3)
    params = jax.vmap(cell.init)(keys)
    states = jax.vmap(lambda _: cell.init_state())(keys)
    stats = jnp.ones((4, 3)) * 0.5
    _, ctx = jax.jit(jax.vmap(cell.step, in_axes=(0, 0, None)))(params, states, stats)
    chex.assert_shape(ctx, (3, 6))
    single = cell.step(jax.tree_util.tree_map(lambda x: x[2], params), cell.init_state(), stats)[1]
    np.testing.assert_allclose(ctx[2], single, rtol=1e-5, atol=1e-6)
