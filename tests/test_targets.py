"""L2 sampled target distribution and L5 rank normalisation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jaxdqn.agent import targets as T
from jaxdqn.agent.resolve import Projection

REFERENCE = Projection("reference", "reference")


def test_l2_tau_floor():
    q = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [5.0, 5.2, 5.1], [-200.0, -200.0, -200.0]])
    np.testing.assert_allclose(T.next_action_temperature(q), [0.01, 1e-6, 0.2, 2.0], rtol=1e-5)
    # the absolute floor is in Q units (acting.tau_floor × the reward unit)
    np.testing.assert_allclose(
        T.next_action_temperature(q, 0.05), [0.05, 0.05, 0.2, 2.0], rtol=1e-5
    )


@pytest.mark.slow
def test_l2_target_samples_next_actions_at_the_given_floor():
    # gaps 1e-4: the floor decides how sharp the next-action distribution is
    q = jnp.broadcast_to(jnp.array([0.0, 5e-5, 1e-4]), (64, 4, 3))
    probs = jnp.full((64, 4, 3, 5), 0.2)
    r, disc = jnp.zeros((64,)), jnp.full((64,), 0.9)
    key = jax.random.PRNGKey(4)
    drawn = {}
    for floor in (1e-6, 1.0):
        tgt = T.target_distribution(
            key, probs, q, r, disc, jnp.float32(-2.0), jnp.float32(1.0), projection=REFERENCE,
            temperature_floor=floor,
        )  # fmt: skip
        np.testing.assert_array_equal(tgt.next_actions, T.sample_next_actions(key, q, floor))
        drawn[floor] = np.bincount(np.asarray(tgt.next_actions).ravel(), minlength=3) / 256
    # τ = gap (e:1 between extremes) vs τ = 1 (uniform to 1e-4)
    assert drawn[1e-6][2] > drawn[1e-6][0]
    np.testing.assert_allclose(drawn[1.0], 1 / 3, atol=0.1)


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


@pytest.mark.slow
def test_l2_target_projects_reward_plus_discounted_atoms():
    n = 5
    v_min, dz = jnp.float32(-2.0), jnp.float32(1.0)  # support -2..2
    probs = jnp.zeros((2, 4, 3, n)).at[..., 2].set(1.0)  # all mass at z=0
    q = jnp.zeros((2, 4, 3))
    reward = jnp.array([0.5, 1.0])
    discount = jnp.array([0.9, 0.0])
    tgt = T.target_distribution(
        jax.random.PRNGKey(0), probs, q, reward, discount, v_min, dz, projection=REFERENCE
    )
    # row 0: atom 0.5 → half on z=0, half on z=1; row 1 (terminal): atom 1.0 → all on z=1
    np.testing.assert_allclose(tgt.probs[0, 0], [0, 0, 0.5, 0.5, 0], atol=1e-6)
    np.testing.assert_allclose(tgt.probs[1, 3], [0, 0, 0, 1.0, 0], atol=1e-6)
    np.testing.assert_allclose(tgt.td, [[0.5] * 4, [1.0] * 4], rtol=1e-6)
    assert float(tgt.end_mass) == 0.0  # nothing reached the end atoms


@pytest.mark.slow
def test_l7_end_mass_is_the_mean_projected_mass_on_the_two_end_atoms():
    """Targets beyond the support are clipped onto its end atoms: their mass is what L7's
    coverage metric (``end_atom_mass``) counts. Support −2..2 (5 atoms), by hand:

    row 0: all mass at z=0, r=0.5, γⁿ=0.9 → 0.5: half on 0, half on 1 — end mass 0;
    row 1: half at z=−2, half at z=2, r=1.5, γⁿ=0.5 → 0.5 and 2.5 (clipped to 2) — 0.5;
    row 2: all mass at z=0, r=−5 (terminal) → −5, clipped to −2 — 1;
    row 3: all mass at z=2, r=0, γⁿ=0.9 → 1.8: 0.2 on 1, 0.8 on 2 — 0.8.
    """
    n = 5
    one = lambda i: jnp.zeros((n,)).at[i].set(1.0)
    rows = jnp.stack([one(2), 0.5 * one(0) + 0.5 * one(4), one(2), one(4)])  # [4, N]
    probs = jnp.broadcast_to(rows[:, None, None, :], (4, 4, 3, n))
    q = jnp.zeros((4, 4, 3))
    reward = jnp.array([0.5, 1.5, -5.0, 0.0])
    discount = jnp.array([0.9, 0.5, 0.0, 0.9])
    tgt = T.target_distribution(
        jax.random.PRNGKey(0), probs, q, reward, discount, jnp.float32(-2.0), jnp.float32(1.0),
        projection=REFERENCE,
    )  # fmt: skip
    np.testing.assert_allclose(tgt.probs[1, 0], [0, 0, 0.25, 0.25, 0.5], atol=1e-6)
    np.testing.assert_allclose(tgt.probs[2, 0], [1, 0, 0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(tgt.probs[3, 0], [0, 0, 0, 0.2, 0.8], atol=1e-6)
    np.testing.assert_allclose(tgt.end_mass, (0 + 0.5 + 1 + 0.8) / 4, rtol=1e-6)
    p = np.asarray(tgt.probs)
    np.testing.assert_allclose(tgt.end_mass, (p[..., 0] + p[..., -1]).mean(), rtol=1e-6)
    assert tgt.end_mass.shape == ()


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


@pytest.mark.slow
def test_l2_switched_off_takes_the_argmax_next_action():
    """``loss.sampled_target=false``: a′ = argmax E[Q′] (the plain DQN target), whatever the
    key."""
    q = jax.random.normal(jax.random.PRNGKey(2), (16, 4, 3))
    probs = jnp.full((16, 4, 3, 5), 0.2)
    r, disc = jnp.zeros((16,)), jnp.full((16,), 0.9)
    for k in range(3):
        tgt = T.target_distribution(
            jax.random.PRNGKey(k), probs, q, r, disc, jnp.float32(-2.0), jnp.float32(1.0),
            projection=REFERENCE, sampled=False,
        )  # fmt: skip
        np.testing.assert_array_equal(tgt.next_actions, np.argmax(np.asarray(q), axis=-1))
        q_sel = np.take_along_axis(np.asarray(q), np.asarray(tgt.next_actions)[..., None], -1)
        np.testing.assert_allclose(tgt.td, 0.9 * q_sel[..., 0], rtol=1e-6)


def test_l5_pairwise_ranks_equal_scipy_average_ranks_exactly():
    """The O(B²) compare-and-count ranks equal scipy's average ranks (0-based) bit for bit,
    with many ties, at a batch size of the GPU configs."""
    from scipy.stats import rankdata

    rng = np.random.default_rng(5)
    x = np.round(rng.normal(size=4096), 2).astype(np.float32)  # ~600 distinct values
    got = np.asarray(jax.jit(T.average_ranks)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, (rankdata(x, method="average") - 1).astype(np.float32))
