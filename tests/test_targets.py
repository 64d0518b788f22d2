"""L2 sampled target distribution and L5 rank normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from jaxdqn.agent import targets as T


def test_l2_tau_floor():
    q = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [5.0, 5.2, 5.1], [-200.0, -200.0, -200.0]])
    np.testing.assert_allclose(T.next_action_temperature(q), [0.01, 1e-6, 0.2, 2.0], rtol=1e-5)


def test_l2_samples_follow_softmax_and_change_between_updates():
    q = jnp.broadcast_to(jnp.array([0.0, 0.5, 1.0]), (4000, 4, 3))  # τ = gap = 1
    a1 = T.sample_next_actions(jax.random.PRNGKey(0), q)
    a2 = T.sample_next_actions(jax.random.PRNGKey(1), q)
    assert a1.shape == (4000, 4) and a1.dtype == jnp.int32
    assert float(jnp.mean(a1 != a2)) > 0.3  # a fresh key changes the target
    counts = np.bincount(np.asarray(a1).ravel(), minlength=3)
    p = np.exp([0.0, 0.5, 1.0]) / np.exp([0.0, 0.5, 1.0]).sum()
    _, pval = scipy.stats.chisquare(counts, p * counts.sum())
    assert pval > 1e-3
    # an argmax target would put every sample on action 2
    assert counts[0] / counts.sum() > 0.15


def test_l2_target_projects_reward_plus_discounted_atoms():
    n = 5
    v_min, dz = jnp.float32(-2.0), jnp.float32(1.0)  # support -2..2
    probs = jnp.zeros((2, 4, 3, n)).at[..., 2].set(1.0)  # all mass at z=0
    q = jnp.zeros((2, 4, 3))
    reward = jnp.array([0.5, 1.0])
    discount = jnp.array([0.9, 0.0])
    tgt = T.target_distribution(
        jax.random.PRNGKey(0), probs, q, reward, discount, v_min, dz, backend="reference"
    )
    # row 0: atom 0.5 → half on z=0, half on z=1; row 1 (terminal): atom 1.0 → all on z=1
    np.testing.assert_allclose(tgt.probs[0, 0], [0, 0, 0.5, 0.5, 0], atol=1e-6)
    np.testing.assert_allclose(tgt.probs[1, 3], [0, 0, 0, 1.0, 0], atol=1e-6)
    np.testing.assert_allclose(tgt.td, [[0.5] * 4, [1.0] * 4], rtol=1e-6)


def test_l5_ranks_average_ties():
    x = jnp.array([3.0, 1.0, 3.0, 2.0, 3.0])
    np.testing.assert_allclose(T.average_ranks(x), [3.0, 0.0, 3.0, 1.0, 3.0])


def test_l5_rank_normalisation_scales_by_std_ema():
    r = jnp.array([0.0, 10.0, -5.0, 0.0, 100.0])
    out = T.rank_normalise(r, jnp.float32(0.02))
    ranks = np.array([1.5, 3.0, 0.0, 1.5, 4.0])
    c = ranks - ranks.mean()
    np.testing.assert_allclose(out, c / np.sqrt((c**2).mean()) * 0.02, rtol=1e-5)
    np.testing.assert_allclose(float(jnp.std(out)), 0.02, rtol=1e-5)


def test_l5_std_guard_passes_raw_rewards():
    r = jnp.array([0.1, -0.2, 0.3])
    np.testing.assert_allclose(T.rank_normalise(r, jnp.float32(0.0)), r)
